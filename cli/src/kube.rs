//! `lazaret export kube PROFILE`: the same profile as Kubernetes manifests
//! for a cluster whose nodes run gVisor: a Pod with `runtimeClassName:
//! gvisor`, a PersistentVolumeClaim per persistent dir, profile volume and
//! the workspace, the `env:` references as Secret references, and a
//! NetworkPolicy whose egress `ipBlock`s decide every IPv4 destination as
//! the profile's policy does. A NetworkPolicy allows addresses only: the
//! profile's host names are named as not exported, unless `--fqdn-policy
//! cilium` writes a CiliumNetworkPolicy instead, whose `toFQDNs` allow them
//! (with the same address rules, and the DNS rule Cilium's proxy needs).
//!
//! Owns the mapping and its YAML. Trusts the loaded configuration; reads no
//! secret value (the Secret is named, never written).

use std::ffi::OsStr;
use std::fmt::Write as _;
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;

use lazaret_proto::config::{
    ConfigurationFingerprintRecordV1, EnvironmentReference, ResolvedVolume, VolumeAccess,
    VolumeKind,
};
use lazaret_proto::layout::{SANDBOX_CAPABILITIES, WORKSPACE};
use lazaret_proto::network::{DerivedNetworkPolicy, IpPrefix, PolicyAction};
use serde_json::{Value, json};

use super::{Failure, failure};
use crate::config::{EffectiveNetworkPolicy, ResolvedDomainConfiguration};
use crate::image::reference::{ImageSource, parse_reference};
use lazaret_proto::names::{DnsMode, HostPattern};

/// The storage each claim asks for.
const CLAIM_SIZE: &str = "10Gi";

/// The pod's process: it waits, as the Domain's init does, for sessions
/// that `kubectl exec` starts, and ends on SIGTERM.
const WAIT: &str = "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done";

/// A network policy that can allow host names, beside the NetworkPolicy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FqdnPolicy {
    /// A CiliumNetworkPolicy (`cilium.io/v2`) with `toFQDNs`.
    Cilium,
}

/// `lazaret export kube PROFILE [--image REF] [--fqdn-policy cilium]`: the
/// manifests on standard output, and on standard error what the policy
/// cannot say. A local image (`oci:`, `oci-archive:`) cannot be pulled by
/// a cluster: `image` names where it was pushed.
pub(super) fn export(
    resolved: &ResolvedDomainConfiguration,
    image: Option<&str>,
    fqdn: Option<FqdnPolicy>,
) -> Result<(), Failure> {
    let record = resolved.record();
    let invalid = |message: String| Failure {
        message,
        status: super::EXIT_INVALID,
    };
    let image = match image {
        Some(image) => match parse_reference(image) {
            Ok(ImageSource::Registry { reference }) => reference.to_string(),
            Ok(_) => {
                return Err(invalid(format!(
                    "--image {image} is local; name the registry image the cluster pulls"
                )));
            }
            Err(e) => return Err(invalid(format!("--image: {e}"))),
        },
        None => match parse_reference(&record.image) {
            Ok(ImageSource::Registry { reference }) => reference.to_string(),
            Ok(_) => {
                let name = dns_label(resolved.profile().as_str());
                return Err(invalid(format!(
                    "the profile's image {} is local, which a cluster cannot pull; push it \
                     (e.g. `skopeo copy {} docker://registry.example/{name}:1`) and pass \
                     --image registry.example/{name}:1",
                    record.image, record.image,
                )));
            }
            Err(e) => return Err(failure(format!("the profile's image: {e}"))),
        },
    };
    let policy = crate::network::derive_policy(
        resolved.network(),
        &crate::network::platform_deny(&crate::network::HostNetwork::default(), &[]),
    )
    .map_err(|e| failure(lazaret_proto::error_chain(&e)))?;
    let manifests = Manifests::new(resolved, &image, &policy, fqdn);
    for note in &manifests.network_notes {
        eprintln!("lazaret: {}", super::printable(note));
    }
    super::print(&manifests.to_yaml())
}

/// The objects of one profile, and what could not be mapped.
struct Manifests {
    header: Vec<String>,
    /// What the network policy written cannot say of the profile's (also
    /// in `header`), for standard error.
    network_notes: Vec<String>,
    objects: Vec<Value>,
}

impl Manifests {
    /// The claims, the pod and the network policy of the profile, in that
    /// order, with a header naming what they leave out.
    fn new(
        resolved: &ResolvedDomainConfiguration,
        image: &str,
        policy: &DerivedNetworkPolicy,
        fqdn: Option<FqdnPolicy>,
    ) -> Self {
        let record = resolved.record();
        let profile = resolved.profile().as_str();
        let name = format!("lazaret-{}", dns_label(profile));
        let labels = json!({
            "app.kubernetes.io/name": "lazaret",
            "app.kubernetes.io/instance": dns_label(profile),
        });
        let mut header = vec![
            format!("Kubernetes manifests for Lazaret profile `{profile}`, from `lazaret export kube`."),
            "Apply with `kubectl apply -f`; the nodes need gVisor as RuntimeClass `gvisor`.".into(),
            "Sessions: `kubectl exec -it POD -- COMMAND` (no escalation to a developer's terminal).".into(),
        ];
        let profile_dir = resolved.authorities().profile_dir.label();
        let (claims, unexported) = Claims::of(&name, record, profile_dir);
        header.extend(unexported);
        let secret = format!("{name}-env");
        header.extend(secret_note(&secret, &record.environment_references));
        if record.escalation_enabled {
            header
                .push("Not exported: escalation (there is no developer's terminal to ask).".into());
        }

        let mut objects: Vec<Value> = claims
            .0
            .iter()
            .map(|claim| claim_object(claim, &labels))
            .collect();
        let sandbox = Sandbox {
            name: &name,
            labels: &labels,
            image,
            secret: &secret,
        };
        objects.push(sandbox.pod(&claims, record));

        let (network_policy, network_notes) =
            network_objects(&name, &labels, policy, resolved.network(), fqdn);
        header.extend(network_notes.iter().cloned());
        objects.push(network_policy);
        Self {
            header,
            network_notes,
            objects,
        }
    }

    fn to_yaml(&self) -> String {
        let mut out = String::new();
        for line in &self.header {
            // A comment line ends only where it should: controls, and
            // every character beyond ASCII, escaped.
            let shown = super::printable(line).replace('\n', " ");
            let _ = writeln!(out, "# {}", ascii_only(&shown));
        }
        for object in &self.objects {
            out.push_str("---\n");
            yaml_block(object, 0, &mut out);
        }
        out
    }
}

/// A PersistentVolumeClaim the pod mounts.
#[derive(Debug, PartialEq, Eq)]
struct Claim {
    /// The claim's name, unique among the profile's.
    name: String,
    /// Where the pod mounts it.
    mount: String,
    read_only: bool,
}

/// The profile's claims, in the pod's volume order: the workspace, each
/// persistent dir, then each directory volume beneath the profile
/// directory.
#[derive(Debug, Default)]
struct Claims(Vec<Claim>);

impl Claims {
    /// The claims of `record` for the objects named `name`, and a header
    /// note for each volume a claim cannot carry (a file, or a host path
    /// outside `profile_dir`).
    fn of(
        name: &str,
        record: &ConfigurationFingerprintRecordV1,
        profile_dir: &Path,
    ) -> (Self, Vec<String>) {
        let mut claims = Self::default();
        let mut unexported = Vec::new();
        claims.add(name, "workspace", WORKSPACE, false);
        for dir in &record.persistent_dirs {
            claims.add(name, &dns_label(dir), dir, false);
        }
        for volume in &record.volumes {
            let source = Path::new(OsStr::from_bytes(&volume.canonical_host_source));
            if source.starts_with(profile_dir) && volume.kind == VolumeKind::Directory {
                claims.add(
                    name,
                    &format!("volume-{}", dns_label(&volume.container_path)),
                    &volume.container_path,
                    volume.access == VolumeAccess::ReadOnly,
                );
            } else {
                unexported.push(volume_note(volume));
            }
        }
        (claims, unexported)
    }

    /// Adds the claim `NAME-SLUG` (`NAME-SLUG-2`, `-3`… when taken)
    /// mounted at `mount`.
    fn add(&mut self, name: &str, slug: &str, mount: &str, read_only: bool) {
        let mut claim_name = format!("{name}-{slug}");
        let mut n = 2;
        while self.0.iter().any(|c| c.name == claim_name) {
            claim_name = format!("{name}-{slug}-{n}");
            n += 1;
        }
        self.0.push(Claim {
            name: claim_name,
            mount: mount.to_owned(),
            read_only,
        });
    }

    /// The claims that back a persistent dir of `record`, by their index
    /// in the pod's volumes: each is filled from the image once.
    fn seeded<'a>(&'a self, record: &ConfigurationFingerprintRecordV1) -> Vec<(usize, &'a str)> {
        self.0
            .iter()
            .enumerate()
            .filter(|(_, claim)| record.persistent_dirs.contains(&claim.mount))
            .map(|(i, claim)| (i, claim.mount.as_str()))
            .collect()
    }
}

/// The header note for a volume no claim carries.
fn volume_note(volume: &ResolvedVolume) -> String {
    format!(
        "Not exported: the host {} {} at {} (provide it as a ConfigMap or Secret).",
        match volume.kind {
            VolumeKind::File => "file",
            VolumeKind::Directory => "directory",
        },
        OsStr::from_bytes(&volume.canonical_host_source).to_string_lossy(),
        volume.container_path
    )
}

/// The header line that says how to create the Secret named `secret` that
/// the `env:` references read, if there are any.
fn secret_note(secret: &str, references: &[EnvironmentReference]) -> Option<String> {
    if references.is_empty() {
        return None;
    }
    let literals: Vec<String> = references
        .iter()
        .map(|r| format!("--from-literal={}=\"${}\"", r.sandbox_name, r.host_name))
        .collect();
    Some(format!(
        "Create the Secret first: kubectl create secret generic {secret} {}",
        literals.join(" ")
    ))
}

/// The PersistentVolumeClaim object of `claim`.
fn claim_object(claim: &Claim, labels: &Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim.name, "labels": labels},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": CLAIM_SIZE}},
        },
    })
}

/// A pod's name for its volume `i`. A pod's volume names are DNS labels
/// (63 characters at most); the claims' may be longer.
fn volume_name(i: usize) -> String {
    format!("v{i}")
}

/// The sandbox's security context: root in the sandbox, with the
/// capabilities a Domain's sandbox keeps and nothing more.
fn security_context() -> Value {
    let capabilities: Vec<&str> = SANDBOX_CAPABILITIES
        .iter()
        .map(|c| c.trim_start_matches("CAP_"))
        .collect();
    json!({
        "runAsUser": 0,
        "runAsGroup": 0,
        "privileged": false,
        "allowPrivilegeEscalation": false,
        "capabilities": {"drop": ["ALL"], "add": capabilities},
    })
}

/// The shell script that fills each `seeded` claim (mounted at
/// `/lazaret-seed/INDEX`) from the image's directory, once.
fn seed_script(seeded: &[(usize, &str)]) -> String {
    seeded
        .iter()
        .map(|(i, dir)| {
            let dir = shell_quote(dir);
            format!(
                "if [ -d {dir} ] && [ ! -e /lazaret-seed/{i}/.lazaret-seeded ]; then \
                 cp -a {dir}/. /lazaret-seed/{i}/ && touch /lazaret-seed/{i}/.lazaret-seeded; fi"
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The pod's parts that do not depend on its claims.
struct Sandbox<'a> {
    name: &'a str,
    labels: &'a Value,
    image: &'a str,
    /// The Secret the `env:` references read.
    secret: &'a str,
}

impl Sandbox<'_> {
    /// The Pod: the sandbox container on gVisor, waiting for sessions,
    /// with every claim mounted, and the seeding init container when a
    /// persistent dir needs it.
    fn pod(&self, claims: &Claims, record: &ConfigurationFingerprintRecordV1) -> Value {
        let env: Vec<Value> = record
            .environment_references
            .iter()
            .map(|r| {
                json!({
                    "name": r.sandbox_name,
                    "valueFrom": {"secretKeyRef": {"name": self.secret, "key": r.sandbox_name}},
                })
            })
            .collect();
        let mounts: Vec<Value> = claims
            .0
            .iter()
            .enumerate()
            .map(|(i, claim)| {
                json!({"name": volume_name(i), "mountPath": claim.mount, "readOnly": claim.read_only})
            })
            .collect();
        let volumes: Vec<Value> = claims
            .0
            .iter()
            .enumerate()
            .map(|(i, claim)| {
                json!({"name": volume_name(i), "persistentVolumeClaim": {"claimName": claim.name}})
            })
            .collect();
        let init_containers: Vec<Value> = self
            .seed_container(&claims.seeded(record))
            .into_iter()
            .collect();
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": self.name, "labels": self.labels},
            "spec": {
                "runtimeClassName": "gvisor",
                "automountServiceAccountToken": false,
                "enableServiceLinks": false,
                "terminationGracePeriodSeconds": 5,
                "initContainers": init_containers,
                "containers": [{
                    "name": "sandbox",
                    "image": self.image,
                    "command": ["/bin/sh", "-c", WAIT],
                    "workingDir": WORKSPACE,
                    "env": env,
                    "stdin": true,
                    "tty": true,
                    "securityContext": security_context(),
                    "volumeMounts": mounts,
                }],
                "volumes": volumes,
            },
        })
    }

    /// A persistent dir starts as the image's directory, as a Domain's
    /// overlay does: an empty claim would hide it. Once, before the
    /// sandbox, this container fills the `seeded` claims from the image;
    /// none when there are none.
    fn seed_container(&self, seeded: &[(usize, &str)]) -> Option<Value> {
        if seeded.is_empty() {
            return None;
        }
        let seed_mounts: Vec<Value> = seeded
            .iter()
            .map(|(i, _)| json!({"name": volume_name(*i), "mountPath": format!("/lazaret-seed/{i}")}))
            .collect();
        Some(json!({
            "name": "seed",
            "image": self.image,
            "command": ["/bin/sh", "-c", seed_script(seeded)],
            "securityContext": security_context(),
            "volumeMounts": seed_mounts,
        }))
    }
}

/// The network policy object `fqdn` chooses, and what it cannot say of
/// the profile's `network`.
fn network_objects(
    name: &str,
    labels: &Value,
    policy: &DerivedNetworkPolicy,
    network: &EffectiveNetworkPolicy,
    fqdn: Option<FqdnPolicy>,
) -> (Value, Vec<String>) {
    let (object, notes) = match fqdn {
        None => (
            network_policy(name, labels, policy),
            name_notes(&network.hosts),
        ),
        Some(FqdnPolicy::Cilium) => (
            cilium_policy(name, labels, policy, &network.hosts),
            cilium_notes(&network.hosts),
        ),
    };
    let notes = notes.into_iter().chain(dns_note(network.dns)).collect();
    (object, notes)
}

/// The names of `hosts`, for a message: each in backquotes.
fn quoted_names<'a>(hosts: impl IntoIterator<Item = &'a HostPattern>) -> String {
    hosts
        .into_iter()
        .map(|h| format!("`{h}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What a NetworkPolicy cannot say of the profile's host names.
fn name_notes(hosts: &[HostPattern]) -> Vec<String> {
    if hosts.is_empty() {
        return Vec::new();
    }
    vec![format!(
        "Not exported: the host names {}: a Kubernetes NetworkPolicy allows addresses only, so \
         the one below allows the profile's prefixes and no name. Pass --fqdn-policy cilium for \
         a CiliumNetworkPolicy that allows the names, or allow their addresses in the profile's \
         allow_egress.",
        quoted_names(hosts)
    )]
}

/// What the CiliumNetworkPolicy says differently of the profile's names:
/// Cilium's `*` stands for one label, the profile's `*.` for any number.
fn cilium_notes(hosts: &[HostPattern]) -> Vec<String> {
    let wildcards: Vec<&HostPattern> = hosts.iter().filter(|h| h.is_wildcard()).collect();
    if wildcards.is_empty() {
        return Vec::new();
    }
    vec![format!(
        "Narrower than the profile: in a CiliumNetworkPolicy `*` matches one label, so for {} \
         only names one label deeper are allowed (`a.example.org` for `*.example.org`, not \
         `a.b.example.org`, which the profile allows). On Cilium 1.19 or later, write `**.` \
         instead of `*.` in these matchPatterns to allow every depth.",
        quoted_names(wildcards)
    )]
}

/// What the cluster's DNS does that the profile's does not.
fn dns_note(dns: DnsMode) -> Option<String> {
    match dns {
        DnsMode::Host => None,
        DnsMode::Lazaret => Some(
            "Not exported: dns = \"lazaret\" (only the allowed names resolve). The pod asks the \
             cluster's DNS, which answers every name: DNS is a way out of the pod."
                .into(),
        ),
    }
}

/// The NetworkPolicy whose `ipBlock`s allow exactly the addresses `policy`
/// allows, and the cluster's DNS.
fn network_policy(name: &str, labels: &Value, policy: &DerivedNetworkPolicy) -> Value {
    let mut egress = Vec::new();
    let blocks = ip_blocks(policy);
    if !blocks.is_empty() {
        // An empty `to` would allow every destination: the rule is
        // written only when it has blocks.
        let to: Vec<Value> = blocks
            .iter()
            .map(|(cidr, except)| {
                let mut block = json!({"cidr": cidr_text(cidr)});
                if !except.is_empty() {
                    block["except"] = Value::from(except.iter().map(cidr_text).collect::<Vec<_>>());
                }
                json!({"ipBlock": block})
            })
            .collect();
        egress.push(json!({"to": to}));
    }
    // The resolver: the cluster's DNS, as slirp4netns's forwarder is
    // the one resolver of a Domain.
    egress.push(json!({
        "to": [{
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
        }],
        "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
    }));
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "podSelector": {"matchLabels": labels},
            "policyTypes": ["Ingress", "Egress"],
            "egress": egress,
        },
    })
}

/// The CiliumNetworkPolicy that allows what the NetworkPolicy would (the
/// same blocks, as `toCIDR`, or `toCIDRSet` where a block has exceptions)
/// and the profile's host names (`toFQDNs`: `matchName` for a name,
/// `matchPattern` for a `*.` entry), with the DNS rule through which
/// Cilium's proxy learns the names' addresses. No ingress is allowed.
fn cilium_policy(
    name: &str,
    labels: &Value,
    policy: &DerivedNetworkPolicy,
    hosts: &[HostPattern],
) -> Value {
    let mut egress = Vec::new();
    let blocks = ip_blocks(policy);
    let plain: Vec<String> = blocks
        .iter()
        .filter(|(_, except)| except.is_empty())
        .map(|(cidr, _)| cidr_text(cidr))
        .collect();
    if !plain.is_empty() {
        egress.push(json!({"toCIDR": plain}));
    }
    let sets: Vec<Value> = blocks
        .iter()
        .filter(|(_, except)| !except.is_empty())
        .map(|(cidr, except)| {
            json!({
                "cidr": cidr_text(cidr),
                "except": except.iter().map(cidr_text).collect::<Vec<_>>(),
            })
        })
        .collect();
    if !sets.is_empty() {
        egress.push(json!({"toCIDRSet": sets}));
    }
    if !hosts.is_empty() {
        let fqdns: Vec<Value> = hosts
            .iter()
            .map(|h| {
                if h.is_wildcard() {
                    json!({"matchPattern": h.as_str()})
                } else {
                    json!({"matchName": h.as_str()})
                }
            })
            .collect();
        egress.push(json!({"toFQDNs": fqdns}));
    }
    // The cluster's DNS, through Cilium's DNS proxy: a policy with
    // `toFQDNs` needs its lookups seen to learn their addresses.
    egress.push(json!({
        "toEndpoints": [{"matchLabels": {
            "k8s:io.kubernetes.pod.namespace": "kube-system",
            "k8s:k8s-app": "kube-dns",
        }}],
        "toPorts": [{
            "ports": [{"port": "53", "protocol": "ANY"}],
            "rules": {"dns": [{"matchPattern": "*"}]},
        }],
    }));
    json!({
        "apiVersion": "cilium.io/v2",
        "kind": "CiliumNetworkPolicy",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "endpointSelector": {"matchLabels": labels},
            // An empty rule selects the pod for ingress and allows nothing.
            "ingress": [{}],
            "egress": egress,
        },
    })
}

/// The egress `ipBlock`s that allow exactly what `policy` allows: one per
/// allow rule (but one a deny of the same network overrides), excepting
/// every deny strictly inside it. A destination's longest matching rule is
/// an allow exactly when it lies in that allow's block, so the union of the
/// blocks is the policy's decision.
fn ip_blocks(policy: &DerivedNetworkPolicy) -> Vec<(IpPrefix, Vec<IpPrefix>)> {
    let rules = &policy.prefix_rules;
    let of = |action| {
        rules
            .iter()
            .filter(move |r| r.action == action)
            .map(|r| r.network)
    };
    let denied: Vec<IpPrefix> = of(PolicyAction::Deny).collect();
    let mut blocks: Vec<(IpPrefix, Vec<IpPrefix>)> = of(PolicyAction::Allow)
        .filter(|allow| !denied.contains(allow))
        .map(|allow| {
            let mut except: Vec<IpPrefix> = denied
                .iter()
                .copied()
                .filter(|d| d.prefix_len > allow.prefix_len && contains(&allow, d))
                .collect();
            except.sort();
            except.dedup();
            (allow, except)
        })
        .collect();
    blocks.sort();
    blocks.dedup();
    blocks
}

/// `text` as one shell word.
fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "'\\''"))
}

/// `prefix` as CIDR text.
fn cidr_text(prefix: &IpPrefix) -> String {
    format!("{}/{}", prefix.address, prefix.prefix_len)
}

/// Whether `outer` holds every address of `inner`.
fn contains(outer: &IpPrefix, inner: &IpPrefix) -> bool {
    inner.prefix_len >= outer.prefix_len && outer.contains(inner.address)
}

/// `text` as a DNS label: lowercase letters, digits and `-`, at most 40
/// characters (room for the prefixes and suffixes beside it).
fn dns_label(text: &str) -> String {
    let mapped: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    let trimmed: String = mapped
        .split('-')
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("-");
    let cut: String = trimmed.chars().take(40).collect();
    let cut = cut.trim_end_matches('-').to_owned();
    if cut.is_empty() { "root".into() } else { cut }
}

/// A YAML scalar: strings double-quoted with JSON's escapes (which YAML's
/// double-quoted style shares) and every character beyond ASCII escaped
/// too (YAML 1.1 readers take U+0085, U+2028 and U+2029 for line breaks),
/// so no value can become YAML syntax or change on the way.
fn scalar(value: &Value) -> String {
    ascii_only(&value.to_string())
}

/// `text` with each character beyond ASCII as a YAML escape: `\uXXXX`, or
/// `\UXXXXXXXX` beyond the first plane.
fn ascii_only(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match u32::from(c) {
            0..=0x7f => out.push(c),
            n @ 0x80..=0xffff => {
                let _ = write!(out, "\\u{n:04x}");
            }
            n => {
                let _ = write!(out, "\\U{n:08x}");
            }
        }
    }
    out
}

/// A mapping key: bare when it is only letters, digits and `.`, `_`, `/`,
/// `-` (as Kubernetes keys are), else quoted.
fn key(text: &str) -> String {
    let bare = text.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '/' | '-'));
    if bare {
        text.to_owned()
    } else {
        ascii_only(&Value::from(text).to_string())
    }
}

/// Writes `value` (an object or array) in YAML's block style at `indent`.
fn yaml_block(value: &Value, indent: usize, out: &mut String) {
    let pad = " ".repeat(indent);
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                match v {
                    Value::Object(m) if !m.is_empty() => {
                        let _ = writeln!(out, "{pad}{}:", key(k));
                        yaml_block(v, indent + 2, out);
                    }
                    Value::Array(a) if !a.is_empty() => {
                        let _ = writeln!(out, "{pad}{}:", key(k));
                        yaml_block(v, indent + 2, out);
                    }
                    Value::Object(_) => {
                        let _ = writeln!(out, "{pad}{}: {{}}", key(k));
                    }
                    Value::Array(_) => {
                        let _ = writeln!(out, "{pad}{}: []", key(k));
                    }
                    _ => {
                        let _ = writeln!(out, "{pad}{}: {}", key(k), scalar(v));
                    }
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                match item {
                    Value::Object(m) if !m.is_empty() => {
                        // The item's first key on the dash's line, the rest
                        // beneath it.
                        let mut inner = String::new();
                        yaml_block(item, indent + 2, &mut inner);
                        let _ = write!(out, "{pad}- {}", &inner[indent + 2..]);
                    }
                    Value::Array(a) if !a.is_empty() => {
                        let _ = writeln!(out, "{pad}-");
                        yaml_block(item, indent + 2, out);
                    }
                    _ => {
                        let _ = writeln!(out, "{pad}- {}", scalar(item));
                    }
                }
            }
        }
        _ => {
            let _ = writeln!(out, "{pad}{}", scalar(value));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use super::*;

    fn prefix(text: &str) -> IpPrefix {
        let (address, len) = text.split_once('/').unwrap();
        let address: Ipv4Addr = address.parse().unwrap();
        IpPrefix::ipv4(address.octets(), len.parse().unwrap()).unwrap()
    }

    fn policy(allow: &[&str], deny: &[&str]) -> DerivedNetworkPolicy {
        DerivedNetworkPolicy::ipv4_only(
            allow.iter().map(|p| prefix(p)),
            deny.iter()
                .map(|p| prefix(p))
                .chain(crate::network::platform_deny(
                    &crate::network::HostNetwork::default(),
                    &[],
                )),
            [],
        )
    }

    /// What a NetworkPolicy with these blocks allows.
    fn blocks_allow(blocks: &[(IpPrefix, Vec<IpPrefix>)], address: Ipv4Addr) -> bool {
        let address = IpAddr::V4(address);
        blocks.iter().any(|(cidr, except)| {
            cidr.contains(address) && !except.iter().any(|e| e.contains(address))
        })
    }

    /// Every boundary address of every rule, and a pseudo-random sample.
    fn addresses(policy: &DerivedNetworkPolicy) -> Vec<Ipv4Addr> {
        let mut out = Vec::new();
        for rule in &policy.prefix_rules {
            let IpAddr::V4(network) = rule.network.address else {
                continue;
            };
            let first = u32::from(network);
            let size = 1u64 << (32 - u32::from(rule.network.prefix_len));
            let last = u32::try_from(u64::from(first) + size - 1).unwrap();
            for a in [
                first.wrapping_sub(1),
                first,
                first.wrapping_add(1),
                last.wrapping_sub(1),
                last,
                last.wrapping_add(1),
            ] {
                out.push(Ipv4Addr::from(a));
            }
        }
        let mut x: u32 = 0x9e37_79b9;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            out.push(Ipv4Addr::from(x));
        }
        out
    }

    #[test]
    fn blocks_decide_as_the_policy_does() {
        let cases: &[(&[&str], &[&str])] = &[
            (&[], &[]),
            (&["0.0.0.0/0"], &[]),
            (&["160.79.104.0/23"], &[]),
            (&["0.0.0.0/0"], &["8.8.8.0/24", "1.0.0.0/8"]),
            // An allow inside a deny inside an allow, and a deny inside that.
            (
                &["0.0.0.0/0", "10.1.0.0/16", "169.254.169.254/32"],
                &["10.1.2.0/24"],
            ),
            (&["1.2.3.4/32", "5.0.0.0/8"], &["5.5.0.0/16", "5.5.5.0/24"]),
            // The same network allowed and denied: denied.
            (&["9.9.0.0/16", "1.1.1.0/24"], &["9.9.0.0/16"]),
        ];
        for (allow, deny) in cases {
            let policy = policy(allow, deny);
            let blocks = ip_blocks(&policy);
            for address in addresses(&policy) {
                let expected = policy.action_for(IpAddr::V4(address)) == PolicyAction::Allow;
                assert_eq!(
                    blocks_allow(&blocks, address),
                    expected,
                    "{address} with allow {allow:?} deny {deny:?}: {blocks:?}"
                );
            }
        }
        assert!(ip_blocks(&policy(&[], &[])).is_empty());
    }

    #[test]
    fn yaml_is_block_style_with_quoted_strings() {
        let mut out = String::new();
        yaml_block(
            &json!({
                "a": "x: y # z",
                "list": [{"name": "n", "v": 1}, "s"],
                "empty": [],
                "app.kubernetes.io/name": true,
                "9weird key": "\n",
            }),
            0,
            &mut out,
        );
        // serde_json's objects keep their keys sorted.
        assert_eq!(
            out,
            "\"9weird key\": \"\\n\"\na: \"x: y # z\"\napp.kubernetes.io/name: true\n\
             empty: []\nlist:\n  - name: \"n\"\n    v: 1\n  - \"s\"\n"
        );
    }

    #[test]
    fn non_ascii_is_escaped() {
        let mut out = String::new();
        yaml_block(&json!({"p": "a\u{2028}b\u{85}é😀"}), 0, &mut out);
        assert_eq!(out, "p: \"a\\u2028b\\u0085\\u00e9\\U0001f600\"\n");
        assert_eq!(shell_quote("/it's"), "'/it'\\''s'");
    }

    /// The manifests of profile `p` of `text`, exported as `export` does.
    fn manifests(text: &str, fqdn: Option<FqdnPolicy>) -> Manifests {
        let (_dir, resolved) = crate::tests::scratch_load(text);
        let policy = crate::network::derive_policy(
            resolved.network(),
            &crate::network::platform_deny(&crate::network::HostNetwork::default(), &[]),
        )
        .unwrap();
        Manifests::new(&resolved, "registry.example/agent:1", &policy, fqdn)
    }

    const NAMED: &str = "schema = \"lazaret-trusted-host-config-v2\"\n\
        [network]\ndefault_allow = [\"0.0.0.0/0\"]\ndefault_deny = [\"8.8.8.0/24\"]\n\
        [profiles.p]\nimage = \"docker.io/library/debian:trixie\"\n\
        allow_egress = [\"203.0.113.10/32\"]\n\
        allow_hosts = [\"api.anthropic.com\", \"*.pkgs.example.org\"]\n";

    fn network_object(m: &Manifests) -> &Value {
        m.objects.last().unwrap()
    }

    #[test]
    fn a_networkpolicy_says_which_names_it_cannot_allow() {
        let m = manifests(NAMED, None);
        let policy = network_object(&m);
        assert_eq!(policy["kind"], "NetworkPolicy");
        let names = "the host names `*.pkgs.example.org`, `api.anthropic.com`";
        assert!(
            m.network_notes[0].starts_with(&format!("Not exported: {names}")),
            "{:?}",
            m.network_notes
        );
        assert!(m.network_notes[0].contains("--fqdn-policy cilium"));
        let yaml = m.to_yaml();
        assert!(yaml.contains(&format!("# Not exported: {names}")), "{yaml}");
        // The prefixes it can express are still there.
        assert!(yaml.contains("cidr: \"203.0.113.10/32\""), "{yaml}");
        assert!(!yaml.contains("api.anthropic.com\"\n"), "{yaml}");
        // And the cluster's DNS answers every name.
        assert!(
            m.network_notes
                .iter()
                .any(|n| n.contains("DNS is a way out")),
            "{:?}",
            m.network_notes
        );
    }

    #[test]
    fn a_v1_profile_exports_as_before() {
        let text = NAMED.replace("config-v2", "config-v1").replace(
            "allow_hosts = [\"api.anthropic.com\", \"*.pkgs.example.org\"]\n",
            "",
        );
        let m = manifests(&text, None);
        assert!(m.network_notes.is_empty(), "{:?}", m.network_notes);
        assert_eq!(network_object(&m)["kind"], "NetworkPolicy");
        let host_dns = NAMED.to_owned() + "dns = \"host\"\n";
        let m = manifests(&host_dns, None);
        assert_eq!(m.network_notes.len(), 1, "{:?}", m.network_notes);
    }

    /// What a CiliumNetworkPolicy's CIDR rules allow for `address`.
    fn cidr_rules_allow(policy: &Value, address: Ipv4Addr) -> bool {
        let inside = |cidr: &Value| {
            let (net, len) = cidr.as_str().unwrap().split_once('/').unwrap();
            let net: Ipv4Addr = net.parse().unwrap();
            IpPrefix::ipv4(net.octets(), len.parse().unwrap())
                .unwrap()
                .contains(IpAddr::V4(address))
        };
        let egress = policy["spec"]["egress"].as_array().unwrap();
        egress.iter().any(|rule| {
            rule["toCIDR"]
                .as_array()
                .is_some_and(|c| c.iter().any(inside))
                || rule["toCIDRSet"].as_array().is_some_and(|sets| {
                    sets.iter().any(|set| {
                        inside(&set["cidr"])
                            && !set["except"].as_array().unwrap().iter().any(inside)
                    })
                })
        })
    }

    #[test]
    fn a_cilium_policy_allows_the_names_the_prefixes_and_its_dns() {
        let m = manifests(NAMED, Some(FqdnPolicy::Cilium));
        assert_eq!(
            m.objects
                .iter()
                .filter(|o| o["kind"] == "NetworkPolicy")
                .count(),
            0,
            "the Cilium policy replaces the NetworkPolicy"
        );
        let cnp = network_object(&m);
        assert_eq!(cnp["apiVersion"], "cilium.io/v2");
        assert_eq!(cnp["kind"], "CiliumNetworkPolicy");
        assert_eq!(
            cnp["spec"]["endpointSelector"]["matchLabels"]["app.kubernetes.io/instance"],
            "p"
        );
        assert_eq!(cnp["spec"]["ingress"], json!([{}]));
        let egress = cnp["spec"]["egress"].as_array().unwrap();
        let fqdns = egress.iter().find_map(|r| r.get("toFQDNs")).unwrap();
        assert_eq!(
            fqdns,
            &json!([
                {"matchPattern": "*.pkgs.example.org"},
                {"matchName": "api.anthropic.com"},
            ])
        );
        let dns = egress
            .iter()
            .find(|r| r.get("toEndpoints").is_some())
            .unwrap();
        assert_eq!(
            dns["toEndpoints"][0]["matchLabels"],
            json!({"k8s:io.kubernetes.pod.namespace": "kube-system", "k8s:k8s-app": "kube-dns"})
        );
        assert_eq!(
            dns["toPorts"][0]["ports"][0],
            json!({"port": "53", "protocol": "ANY"})
        );
        assert_eq!(
            dns["toPorts"][0]["rules"]["dns"],
            json!([{"matchPattern": "*"}])
        );
        assert!(
            egress.iter().any(|r| r.get("toCIDR").is_some()),
            "{egress:?}"
        );
        assert!(
            egress.iter().any(|r| r.get("toCIDRSet").is_some()),
            "{egress:?}"
        );

        // Its CIDR rules decide every address as the profile's policy does.
        let (_dir, resolved) = crate::tests::scratch_load(NAMED);
        let derived = crate::network::derive_policy(
            resolved.network(),
            &crate::network::platform_deny(&crate::network::HostNetwork::default(), &[]),
        )
        .unwrap();
        for address in addresses(&derived) {
            let expected = derived.action_for(IpAddr::V4(address)) == PolicyAction::Allow;
            assert_eq!(cidr_rules_allow(cnp, address), expected, "{address}");
        }

        // The wildcard's depth is named, in the YAML and for standard error.
        assert!(
            m.network_notes
                .iter()
                .any(|n| n.contains("`*.pkgs.example.org`") && n.contains("`**.`")),
            "{:?}",
            m.network_notes
        );
        let yaml = m.to_yaml();
        assert!(yaml.contains("# Narrower than the profile"), "{yaml}");
        assert!(yaml.contains("kind: \"CiliumNetworkPolicy\""), "{yaml}");
        assert!(
            yaml.contains("- matchName: \"api.anthropic.com\""),
            "{yaml}"
        );
        assert!(
            yaml.contains("- matchPattern: \"*.pkgs.example.org\""),
            "{yaml}"
        );
        assert!(yaml.contains("  ingress:\n    - {}\n"), "{yaml}");
        assert!(!yaml.contains("Not exported: the host names"), "{yaml}");
    }

    #[test]
    fn a_cilium_policy_without_names_has_no_fqdn_rule() {
        let text = NAMED.replace(
            "allow_hosts = [\"api.anthropic.com\", \"*.pkgs.example.org\"]\n",
            "dns = \"host\"\n",
        );
        let m = manifests(&text, Some(FqdnPolicy::Cilium));
        let egress = network_object(&m)["spec"]["egress"]
            .as_array()
            .unwrap()
            .clone();
        assert!(
            egress.iter().all(|r| r.get("toFQDNs").is_none()),
            "{egress:?}"
        );
        assert!(m.network_notes.is_empty(), "{:?}", m.network_notes);
    }

    /// A record with `persistent_dirs`, `volumes` (host path, container
    /// path, kind) and `env` references.
    fn record(
        persistent_dirs: &[&str],
        volumes: &[(&str, &str, VolumeKind)],
        env: &[(&str, &str)],
    ) -> ConfigurationFingerprintRecordV1 {
        ConfigurationFingerprintRecordV1 {
            selected_profile: "p".into(),
            storage_root: b"/s".to_vec(),
            runtime_root: b"/r".to_vec(),
            image: "x".into(),
            isolate_gitignored: true,
            persistent_dirs: persistent_dirs.iter().map(|d| (*d).to_owned()).collect(),
            environment_references: env
                .iter()
                .map(|(sandbox, host)| EnvironmentReference {
                    sandbox_name: (*sandbox).to_owned(),
                    host_name: (*host).to_owned(),
                })
                .collect(),
            volumes: volumes
                .iter()
                .map(|(host, container, kind)| ResolvedVolume {
                    canonical_host_source: host.as_bytes().to_vec(),
                    container_path: (*container).to_owned(),
                    kind: *kind,
                    access: VolumeAccess::ReadOnly,
                    create: false,
                })
                .collect(),
            effective_allow_prefixes: Vec::new(),
            effective_deny_prefixes: Vec::new(),
            escalation_enabled: false,
            auto_approval_rules: Vec::new(),
        }
    }

    #[test]
    fn claims_are_the_workspace_the_persistent_dirs_and_profile_directories() {
        let record = record(
            &["/root", "/var/lib/x", "/var_lib/x", "/var.lib/x"],
            &[
                ("/s/profiles/p/state", "/root/state", VolumeKind::Directory),
                ("/s/profiles/p/cfg", "/root/cfg", VolumeKind::File),
                ("/home/u/src", "/root/src", VolumeKind::Directory),
            ],
            &[],
        );
        let (claims, unexported) = Claims::of("lazaret-p", &record, Path::new("/s/profiles/p"));
        let names: Vec<(&str, &str, bool)> = claims
            .0
            .iter()
            .map(|c| (c.name.as_str(), c.mount.as_str(), c.read_only))
            .collect();
        // Names that map to the same label are numbered from 2.
        assert_eq!(
            names,
            [
                ("lazaret-p-workspace", WORKSPACE, false),
                ("lazaret-p-root", "/root", false),
                ("lazaret-p-var-lib-x", "/var/lib/x", false),
                ("lazaret-p-var-lib-x-2", "/var_lib/x", false),
                ("lazaret-p-var-lib-x-3", "/var.lib/x", false),
                ("lazaret-p-volume-root-state", "/root/state", true),
            ]
        );
        // A file, and a directory outside the profile directory, are named
        // as not exported.
        assert_eq!(
            unexported,
            [
                "Not exported: the host file /s/profiles/p/cfg at /root/cfg (provide it as a \
                 ConfigMap or Secret).",
                "Not exported: the host directory /home/u/src at /root/src (provide it as a \
                 ConfigMap or Secret).",
            ]
        );
        // Only the persistent dirs' claims are seeded, by their volume index.
        assert_eq!(
            claims.seeded(&record),
            [
                (1, "/root"),
                (2, "/var/lib/x"),
                (3, "/var_lib/x"),
                (4, "/var.lib/x")
            ]
        );
    }

    #[test]
    fn the_secret_is_named_with_a_command_to_create_it() {
        assert_eq!(secret_note("lazaret-p-env", &[]), None);
        let record = record(&[], &[], &[("GH_TOKEN", "TOKEN"), ("B", "OTHER")]);
        assert_eq!(
            secret_note("lazaret-p-env", &record.environment_references).as_deref(),
            Some(
                "Create the Secret first: kubectl create secret generic lazaret-p-env \
                 --from-literal=GH_TOKEN=\"$TOKEN\" --from-literal=B=\"$OTHER\""
            )
        );
    }

    #[test]
    fn the_pod_mounts_every_claim_and_reads_env_from_the_secret() {
        let record = record(&[], &[], &[("A", "HOST_A")]);
        let (claims, _) = Claims::of("lazaret-p", &record, Path::new("/s/profiles/p"));
        let labels = json!({"app": "l"});
        let sandbox = Sandbox {
            name: "lazaret-p",
            labels: &labels,
            image: "registry.example/a:1",
            secret: "lazaret-p-env",
        };
        let pod = sandbox.pod(&claims, &record);
        let spec = &pod["spec"];
        assert_eq!(spec["runtimeClassName"], "gvisor");
        // Nothing to seed: no init container.
        assert_eq!(spec["initContainers"], json!([]));
        let container = &spec["containers"][0];
        assert_eq!(container["image"], "registry.example/a:1");
        assert_eq!(
            container["env"],
            json!([{"name": "A", "valueFrom": {"secretKeyRef": {"name": "lazaret-p-env", "key": "A"}}}])
        );
        assert_eq!(
            container["volumeMounts"],
            json!([{"name": "v0", "mountPath": WORKSPACE, "readOnly": false}])
        );
        assert_eq!(
            spec["volumes"],
            json!([{"name": "v0", "persistentVolumeClaim": {"claimName": "lazaret-p-workspace"}}])
        );
        let security = &container["securityContext"];
        assert_eq!(security["privileged"], false);
        assert_eq!(security["capabilities"]["drop"], json!(["ALL"]));
        assert!(
            security["capabilities"]["add"]
                .as_array()
                .unwrap()
                .iter()
                .all(|c| !c.as_str().unwrap().starts_with("CAP_"))
        );
    }

    #[test]
    fn persistent_dirs_are_seeded_once_from_the_image_quoted() {
        let seeded = [(1, "/root"), (3, "/it's here")];
        assert_eq!(
            seed_script(&seeded),
            "if [ -d '/root' ] && [ ! -e /lazaret-seed/1/.lazaret-seeded ]; then cp -a \
             '/root'/. /lazaret-seed/1/ && touch /lazaret-seed/1/.lazaret-seeded; fi; \
             if [ -d '/it'\\''s here' ] && [ ! -e /lazaret-seed/3/.lazaret-seeded ]; then cp -a \
             '/it'\\''s here'/. /lazaret-seed/3/ && touch /lazaret-seed/3/.lazaret-seeded; fi"
        );
        let labels = json!({});
        let sandbox = Sandbox {
            name: "n",
            labels: &labels,
            image: "i",
            secret: "s",
        };
        assert_eq!(sandbox.seed_container(&[]), None);
        let seed = sandbox.seed_container(&seeded).unwrap();
        assert_eq!(seed["image"], "i");
        assert_eq!(seed["command"][2], seed_script(&seeded).as_str());
        assert_eq!(
            seed["volumeMounts"],
            json!([
                {"name": "v1", "mountPath": "/lazaret-seed/1"},
                {"name": "v3", "mountPath": "/lazaret-seed/3"},
            ])
        );
    }

    #[test]
    fn labels_are_dns_labels() {
        assert_eq!(dns_label("/root"), "root");
        assert_eq!(dns_label("/usr/local"), "usr-local");
        assert_eq!(dns_label("My_Profile"), "my-profile");
        assert_eq!(dns_label("/"), "root");
        assert!(dns_label(&"a".repeat(100)).len() <= 40);
    }
}
