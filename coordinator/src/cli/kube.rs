//! `lazaret export kube PROFILE`: the same profile as Kubernetes manifests
//! for a cluster whose nodes run gVisor: a Pod with `runtimeClassName:
//! gvisor`, a PersistentVolumeClaim per persistent dir, profile volume and
//! the workspace, the `env:` references as Secret references, and a
//! NetworkPolicy whose egress `ipBlock`s decide every IPv4 destination as
//! the profile's policy does.
//!
//! Owns the mapping and its YAML. Trusts the loaded configuration; reads no
//! secret value (the Secret is named, never written).

use std::fmt::Write as _;
use std::os::unix::ffi::OsStrExt as _;

use lazaret_proto::layout::{SANDBOX_CAPABILITIES, WORKSPACE};
use lazaret_proto::network::{DerivedNetworkPolicy, IpPrefix, PolicyAction};
use serde_json::{Value, json};

use super::{Failure, failure};
use crate::config::ResolvedDomainConfiguration;
use crate::image::reference::{ImageSource, parse_reference};

/// The storage each claim asks for.
const CLAIM_SIZE: &str = "10Gi";

/// The pod's process: it waits, as the Domain's init does, for sessions
/// that `kubectl exec` starts, and ends on SIGTERM.
const WAIT: &str = "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done";

/// `lazaret export kube PROFILE [--image REF]`: the manifests on standard
/// output. A local image (`oci:`, `oci-archive:`) cannot be pulled by a
/// cluster: `image` names where it was pushed.
pub(super) fn export(
    resolved: &ResolvedDomainConfiguration,
    image: Option<&str>,
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
    .map_err(failure)?;
    let manifests = Manifests::new(resolved, &image, &policy);
    super::print(&manifests.to_yaml())
}

/// The objects of one profile, and what could not be mapped.
struct Manifests {
    header: Vec<String>,
    objects: Vec<Value>,
}

impl Manifests {
    fn new(
        resolved: &ResolvedDomainConfiguration,
        image: &str,
        policy: &DerivedNetworkPolicy,
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
        let mut objects = Vec::new();
        let mut claims: Vec<(String, String, bool)> = Vec::new();
        let mut claim = |slug: String, mount: &str, read_only: bool| {
            let mut claim_name = format!("{name}-{slug}");
            let mut n = 2;
            while claims.iter().any(|(c, _, _)| *c == claim_name) {
                claim_name = format!("{name}-{slug}-{n}");
                n += 1;
            }
            claims.push((claim_name, mount.to_owned(), read_only));
        };
        claim("workspace".into(), WORKSPACE, false);
        for dir in &record.persistent_dirs {
            claim(dns_label(dir), dir, false);
        }
        let profile_dir = resolved.authorities().profile_dir.label().as_os_str();
        for volume in &record.volumes {
            let source = std::ffi::OsStr::from_bytes(&volume.canonical_host_source);
            let beneath = std::path::Path::new(source).starts_with(profile_dir);
            if beneath && volume.kind == lazaret_proto::config::VolumeKind::Directory {
                claim(
                    format!("volume-{}", dns_label(&volume.container_path)),
                    &volume.container_path,
                    volume.access == lazaret_proto::config::VolumeAccess::ReadOnly,
                );
            } else {
                header.push(format!(
                    "Not exported: the host {} {} at {} (provide it as a ConfigMap or Secret).",
                    match volume.kind {
                        lazaret_proto::config::VolumeKind::File => "file",
                        lazaret_proto::config::VolumeKind::Directory => "directory",
                    },
                    source.to_string_lossy(),
                    volume.container_path
                ));
            }
        }
        let secret = format!("{name}-env");
        if !record.environment_references.is_empty() {
            let literals: Vec<String> = record
                .environment_references
                .iter()
                .map(|r| format!("--from-literal={}=\"${}\"", r.sandbox_name, r.host_name))
                .collect();
            header.push(format!(
                "Create the Secret first: kubectl create secret generic {secret} {}",
                literals.join(" ")
            ));
        }
        if record.escalation_enabled {
            header
                .push("Not exported: escalation (there is no developer's terminal to ask).".into());
        }

        for (claim_name, _, _) in &claims {
            objects.push(json!({
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": claim_name, "labels": labels},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": CLAIM_SIZE}},
                },
            }));
        }
        let env: Vec<Value> = record
            .environment_references
            .iter()
            .map(|r| {
                json!({
                    "name": r.sandbox_name,
                    "valueFrom": {"secretKeyRef": {"name": secret, "key": r.sandbox_name}},
                })
            })
            .collect();
        // A pod's volume names are DNS labels (63 characters at most); the
        // claims' may be longer.
        let volume_name = |i: usize| format!("v{i}");
        let mounts: Vec<Value> = claims
            .iter()
            .enumerate()
            .map(|(i, (_, mount, read_only))| {
                json!({"name": volume_name(i), "mountPath": mount, "readOnly": read_only})
            })
            .collect();
        let volumes: Vec<Value> = claims
            .iter()
            .enumerate()
            .map(|(i, (claim_name, _, _))| {
                json!({"name": volume_name(i), "persistentVolumeClaim": {"claimName": claim_name}})
            })
            .collect();
        let capabilities: Vec<&str> = SANDBOX_CAPABILITIES
            .iter()
            .map(|c| c.trim_start_matches("CAP_"))
            .collect();
        let security = json!({
            "runAsUser": 0,
            "runAsGroup": 0,
            "privileged": false,
            "allowPrivilegeEscalation": false,
            "capabilities": {"drop": ["ALL"], "add": capabilities},
        });
        // A persistent dir starts as the image's directory, as a Domain's
        // overlay does: an empty claim would hide it. Once, before the
        // sandbox, its claim is filled from the image.
        let seeded: Vec<(usize, &str)> = claims
            .iter()
            .enumerate()
            .filter(|(_, (_, mount, _))| record.persistent_dirs.iter().any(|d| d == mount))
            .map(|(i, (_, mount, _))| (i, mount.as_str()))
            .collect();
        let seed_script = seeded
            .iter()
            .map(|(i, dir)| {
                let dir = shell_quote(dir);
                format!(
                    "if [ -d {dir} ] && [ ! -e /lazaret-seed/{i}/.lazaret-seeded ]; then \
                     cp -a {dir}/. /lazaret-seed/{i}/ && touch /lazaret-seed/{i}/.lazaret-seeded; fi"
                )
            })
            .collect::<Vec<_>>()
            .join("; ");
        let seed_mounts: Vec<Value> = seeded
            .iter()
            .map(|(i, _)| json!({"name": volume_name(*i), "mountPath": format!("/lazaret-seed/{i}")}))
            .collect();
        let init_containers: Vec<Value> = if seeded.is_empty() {
            Vec::new()
        } else {
            vec![json!({
                "name": "seed",
                "image": image,
                "command": ["/bin/sh", "-c", seed_script],
                "securityContext": security,
                "volumeMounts": seed_mounts,
            })]
        };
        objects.push(json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "runtimeClassName": "gvisor",
                "automountServiceAccountToken": false,
                "enableServiceLinks": false,
                "terminationGracePeriodSeconds": 5,
                "initContainers": init_containers,
                "containers": [{
                    "name": "sandbox",
                    "image": image,
                    "command": ["/bin/sh", "-c", WAIT],
                    "workingDir": WORKSPACE,
                    "env": env,
                    "stdin": true,
                    "tty": true,
                    "securityContext": security,
                    "volumeMounts": mounts,
                }],
                "volumes": volumes,
            },
        }));

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
                        block["except"] =
                            Value::from(except.iter().map(cidr_text).collect::<Vec<_>>());
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
        objects.push(json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "podSelector": {"matchLabels": labels},
                "policyTypes": ["Ingress", "Egress"],
                "egress": egress,
            },
        }));
        Self { header, objects }
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

    #[test]
    fn labels_are_dns_labels() {
        assert_eq!(dns_label("/root"), "root");
        assert_eq!(dns_label("/usr/local"), "usr-local");
        assert_eq!(dns_label("My_Profile"), "my-profile");
        assert_eq!(dns_label("/"), "root");
        assert!(dns_label(&"a".repeat(100)).len() <= 40);
    }
}
