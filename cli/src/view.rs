//! What `lazaret status` shows of a Domain, as typed views: `--json` is
//! their serialization, and the text is made from the same fields, so the
//! two never disagree. Trusts the `DomainStatus` it is given (it comes from
//! the user's own coordinator); command lines that came from a session are
//! escaped where the text prints them.

use serde::Serialize;

use lazaret_proto::common::UnixTimeNs;
use lazaret_proto::control::{DomainStatus, NetworkRecheck, NetworkStatus, SessionSummary};
use lazaret_proto::ids::to_hex;
use lazaret_proto::names::DnsMode;
use lazaret_proto::network::{DnsObservation, DnsOutcome, IpPrefix, PolicyAction};
use lazaret_proto::process::PidfsProcessIdentityV1;
use lazaret_proto::router::RelativePath;

/// `lazaret status --json`: the Domains that answered and those that hold
/// their socket but did not.
#[derive(Serialize)]
pub struct StatusList {
    pub domains: Vec<StatusView>,
    pub not_answering: Vec<SilentView>,
}

/// A Domain whose coordinator holds the socket but does not answer.
#[derive(Serialize)]
pub struct SilentView {
    pub domain_id: String,
    pub error: String,
}

/// One running Domain.
#[derive(Serialize)]
pub struct StatusView {
    pub profile: String,
    pub domain_id: String,
    pub workspace: String,
    /// `running`, or `degraded` when `problems` is not empty.
    pub state: String,
    pub problems: Vec<String>,
    pub generation: u64,
    pub uptime_seconds: u64,
    pub configuration_fingerprint: String,
    pub image: String,
    pub manifest_digest: String,
    pub container_id: String,
    pub runsc_root: String,
    pub persistent_dirs: Vec<String>,
    pub coordinator: ProcessView,
    pub supervisor: ProcessView,
    pub namespace_holder: ProcessView,
    pub sandbox: ProcessView,
    pub sessions: Vec<SessionView>,
    pub network: NetworkView,
    pub storage: StorageView,
    pub workspace_routing: RoutingView,
}

/// A participant process, by its proven identity.
#[derive(Serialize)]
pub struct ProcessView {
    pub pid: u32,
    pub start_time_ticks: u64,
}

impl From<&PidfsProcessIdentityV1> for ProcessView {
    fn from(p: &PidfsProcessIdentityV1) -> Self {
        ProcessView {
            pid: p.host_pid,
            start_time_ticks: p.start_time_ticks,
        }
    }
}

/// An attached session.
#[derive(Serialize)]
pub struct SessionView {
    pub session_id: String,
    pub command: Vec<String>,
    pub terminal: bool,
    pub opened_at_unix: u64,
    /// The session leader's pid inside the sandbox, once known.
    pub guest_pid: Option<u32>,
}

impl From<&SessionSummary> for SessionView {
    fn from(s: &SessionSummary) -> Self {
        SessionView {
            session_id: s.session_id.to_hex(),
            command: s.command.clone(),
            terminal: s.terminal,
            opened_at_unix: s.opened_at.as_secs(),
            guest_pid: s.guest.as_ref().map(|g| g.leader_pid),
        }
    }
}

/// What the sandbox's writable layers hold.
#[derive(Serialize)]
pub struct StorageView {
    pub ephemeral_upper: Option<TmpfsView>,
    pub persistent_uppers: Vec<UpperView>,
}

/// The tmpfs that holds the root's changes until `down`.
#[derive(Serialize)]
pub struct TmpfsView {
    pub used_bytes: u64,
    pub size_bytes: u64,
}

/// One persistent dir's upper.
#[derive(Serialize)]
pub struct UpperView {
    pub sandbox_path: String,
    pub bytes: u64,
    /// False when the walk stopped early: `bytes` is a lower bound.
    pub complete: bool,
}

/// How the workspace is routed.
#[derive(Serialize)]
pub struct RoutingView {
    pub isolate_gitignored: bool,
    pub repository: Option<String>,
    pub workspace_ignored: bool,
    pub isolated_root: String,
    pub scopes: u32,
    pub ignore_files: u32,
    pub tracked_ignored: u32,
    pub configured_read_only: u32,
    /// Host paths kept isolated although the rules share them, until the
    /// developer accepts (as many as the coordinator names).
    pub kept_isolated: Vec<String>,
    /// How many there are in all.
    pub kept_isolated_count: u32,
    pub router: RouterView,
}

/// The Workspace Router and whether it still runs.
#[derive(Serialize)]
pub struct RouterView {
    pub pid: u32,
    pub start_time_ticks: u64,
    pub running: bool,
}

/// The network policy in force and its attestation.
#[derive(Serialize)]
pub struct NetworkView {
    pub state: &'static str,
    pub policy_digest: String,
    pub readiness_fingerprint: String,
    /// The profile's allowed prefixes.
    pub allow: Vec<String>,
    /// The profile's denied prefixes (RFC 1918 and its own).
    pub deny: Vec<String>,
    /// What the platform denies whatever the profile allows.
    pub platform_deny: Vec<String>,
    pub unlisted: &'static str,
    pub ipv6: &'static str,
    pub resolvers: Vec<String>,
    pub connectivity_helper: HelperView,
    pub enforcement_namespace: NamespaceView,
    pub attested_at_unix: u64,
    pub recheck: RecheckView,
    pub observed_routes: usize,
    pub denied_probes: Vec<DeniedProbeView>,
    pub permitted_probes: Vec<PermittedProbeView>,
    pub dns: Vec<DnsView>,
    /// The names the sandbox may reach and Lazaret's resolver, when the
    /// policy has names.
    pub names: Option<NamesView>,
}

/// The names a policy allows, and the resolver that answers them.
#[derive(Serialize)]
pub struct NamesView {
    pub allow_hosts: Vec<String>,
    /// `lazaret` (only allowed names answered) or `host` (others forwarded).
    pub dns: &'static str,
    pub resolver: ResolverView,
    /// The addresses admitted for allowed names, as read back for this
    /// status, with the seconds each has left (at most 256, by name).
    pub admitted: Vec<AdmittedView>,
    /// How many addresses are admitted.
    pub admitted_total: u64,
    /// The Credential Proxy, for a profile with credentials.
    pub credential_proxy: Option<ProxyView>,
}

/// The Credential Proxy, the hosts it serves and whether it still runs.
#[derive(Serialize)]
pub struct ProxyView {
    pub listen: String,
    pub hosts: Vec<String>,
    pub pid: u32,
    pub start_time_ticks: u64,
    pub running: bool,
}

/// Lazaret's resolver and whether it still runs.
#[derive(Serialize)]
pub struct ResolverView {
    pub listen: String,
    pub pid: u32,
    pub start_time_ticks: u64,
    pub running: bool,
}

/// An address in the set of admitted addresses.
#[derive(Serialize)]
pub struct AdmittedView {
    pub name: String,
    pub address: String,
    pub expires_in_s: u64,
}

/// The connectivity helper.
#[derive(Serialize)]
pub struct HelperView {
    pub program: &'static str,
    pub pid: u32,
    pub start_time_ticks: u64,
}

/// The enforcement namespace, by device and inode.
#[derive(Serialize)]
pub struct NamespaceView {
    pub device: u64,
    pub inode: u64,
}

/// The network read back for this status.
#[derive(Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum RecheckView {
    NotChecked,
    Holds { at_unix: u64 },
    Differs { at_unix: u64, drift: Vec<String> },
    Failed { detail: String },
}

/// A destination probed as denied.
#[derive(Serialize)]
pub struct DeniedProbeView {
    pub destination: String,
    pub unreachable: bool,
}

/// A destination probed as permitted.
#[derive(Serialize)]
pub struct PermittedProbeView {
    pub destination: String,
    pub reachable: bool,
}

/// A resolver's answer during attestation.
#[derive(Serialize)]
pub struct DnsView {
    pub resolver: String,
    pub query: String,
    pub outcome: String,
    pub addresses: Vec<String>,
}

impl From<&DnsObservation> for DnsView {
    fn from(d: &DnsObservation) -> Self {
        DnsView {
            resolver: d.resolver.to_string(),
            query: d.query_name.clone(),
            outcome: match d.outcome {
                DnsOutcome::Answered { response_code } => format!("answered rcode {response_code}"),
                DnsOutcome::TimedOut => "timed out".into(),
                DnsOutcome::Unreachable => "unreachable".into(),
            },
            addresses: d
                .resolved_addresses
                .iter()
                .map(ToString::to_string)
                .collect(),
        }
    }
}

/// What a stopped process of the generation holds up, and how to go on.
fn stopped_problem(stopped: &lazaret_proto::control::StoppedProcess) -> String {
    use lazaret_proto::control::GenerationProcess as P;
    let (what, holds) = match stopped.process {
        P::Supervisor => ("the Runtime Supervisor", "no session can start"),
        P::NamespaceHolder => (
            "the Domain's namespace holder",
            "the Domain cannot go down cleanly",
        ),
        P::Sandbox => (
            "the runsc sandbox",
            "nothing inside runs and no session can start",
        ),
        P::Gofer => ("the runsc gofer", "the sandbox's files do not answer"),
        P::WorkspaceRouter => (
            "the Workspace Router",
            "/workspace does not answer and no session can start",
        ),
        P::ConnectivityHelper => ("slirp4netns", "the sandbox's network does not answer"),
        P::Resolver => ("Lazaret's resolver", "names do not resolve in the sandbox"),
        P::CredentialProxy => (
            "the Credential Proxy",
            "requests to the credential hosts do not answer",
        ),
    };
    let pid = stopped.identity.host_pid;
    format!(
        "{what} (pid {pid}) is stopped and answers nothing: {holds}; `kill -CONT {pid}` lets it \
         run again"
    )
}

fn shown(p: &IpPrefix) -> String {
    format!("{}/{}", p.address, p.prefix_len)
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A workspace-relative path as `--json` shows it: `""` is the whole
/// workspace.
pub fn path_text(path: &RelativePath) -> String {
    lossy(path.as_bytes())
}

/// How many of a list of paths the text output names.
pub const NAMED_IN_TEXT: usize = 20;

/// Workspace-relative `paths` (as [`path_text`] gives them), of `count` in
/// all, as text names them: at most [`NAMED_IN_TEXT`], escaped, then how
/// many more.
pub fn paths_text(paths: &[String], count: u64, separator: &str) -> String {
    let mut named: Vec<String> = paths
        .iter()
        .take(NAMED_IN_TEXT)
        .map(|p| {
            if p.is_empty() {
                "the whole workspace".to_owned()
            } else {
                super::printable(p)
            }
        })
        .collect();
    let more = count.saturating_sub(named.len() as u64);
    if more > 0 {
        named.push(format!("and {more} more"));
    }
    named.join(separator)
}

impl StatusView {
    /// The view of `status`, as of now.
    pub fn of(status: &DomainStatus) -> Self {
        let routing = &status.workspace_routing;
        // A dead participant never looks alive: a generation whose router
        // exited serves no workspace, and a network that no longer shows
        // its policy is named.
        let mut problems: Vec<String> = routing.problem(&status.profile).into_iter().collect();
        problems.extend(recheck_problem(&status.network.recheck));
        problems.extend(resolver_problems(&status.network, &status.profile));
        problems.extend(status.stopped.iter().map(stopped_problem));
        let state = if problems.is_empty() {
            format!("{:?}", status.state).to_lowercase()
        } else {
            "degraded".to_owned()
        };
        StatusView {
            profile: status.profile.clone(),
            domain_id: status.domain_id.to_hex(),
            workspace: lossy(&status.workspace.0),
            state,
            problems,
            generation: status.generation_id.0,
            uptime_seconds: UnixTimeNs::now()
                .as_secs()
                .saturating_sub(status.started_at.as_secs()),
            configuration_fingerprint: status.configuration_fingerprint.to_hex(),
            image: status.configuration.base().image.clone(),
            manifest_digest: status.manifest_digest.to_oci_string(),
            container_id: to_hex(&status.container_id.0),
            runsc_root: lossy(&status.runtime_root.0),
            persistent_dirs: status.configuration.base().persistent_dirs.clone(),
            coordinator: (&status.coordinator).into(),
            supervisor: (&status.supervisor).into(),
            namespace_holder: (&status.namespace_holder).into(),
            sandbox: (&status.sandbox).into(),
            sessions: status.sessions.iter().map(SessionView::from).collect(),
            network: NetworkView::of(&status.network),
            storage: StorageView {
                ephemeral_upper: status.storage.ephemeral_upper.map(|t| TmpfsView {
                    used_bytes: t.used_bytes,
                    size_bytes: t.size_bytes,
                }),
                persistent_uppers: status
                    .storage
                    .persistent_uppers
                    .iter()
                    .map(|p| UpperView {
                        sandbox_path: p.sandbox_path.clone(),
                        bytes: p.bytes,
                        complete: p.complete,
                    })
                    .collect(),
            },
            workspace_routing: RoutingView {
                isolate_gitignored: routing.isolate_ignored,
                repository: routing.repository.as_ref().map(|r| lossy(&r.0)),
                workspace_ignored: routing.workspace_ignored,
                isolated_root: lossy(&routing.isolated_root.0),
                scopes: routing.summary.scopes,
                ignore_files: routing.summary.ignore_files,
                tracked_ignored: routing.summary.tracked_ignored,
                configured_read_only: routing.summary.read_only,
                kept_isolated: routing.kept_isolated.iter().map(path_text).collect(),
                kept_isolated_count: routing.summary.kept_isolated,
                router: RouterView {
                    pid: routing.router.host_pid,
                    start_time_ticks: routing.router.start_time_ticks,
                    running: routing.router_running,
                },
            },
        }
    }
}

impl NetworkView {
    fn of(network: &NetworkStatus) -> Self {
        let a = &network.attestation;
        // The profile's rules; the platform's denials are listed apart.
        let prefixes = |action| {
            network
                .policy
                .prefix_rules
                .iter()
                .filter(|r| r.action == action && !network.platform_deny.contains(&r.network))
                .map(|r| shown(&r.network))
                .collect()
        };
        NetworkView {
            state: "attested",
            policy_digest: a.derived_policy_digest.to_hex(),
            readiness_fingerprint: a
                .readiness_identity()
                .fingerprint()
                .map(|d| d.to_hex())
                .unwrap_or_default(),
            allow: prefixes(PolicyAction::Allow),
            deny: prefixes(PolicyAction::Deny),
            platform_deny: network.platform_deny.iter().map(shown).collect(),
            // With names, an unlisted address is reachable while it is
            // admitted for an allowed name.
            unlisted: match &network.names {
                Some(n) if !n.names.hosts.is_empty() => "unreachable unless admitted for a name",
                _ => "unreachable",
            },
            ipv6: "disabled",
            resolvers: network
                .policy
                .resolvers
                .iter()
                .map(|r| r.address.to_string())
                .collect(),
            connectivity_helper: HelperView {
                program: "slirp4netns",
                pid: network.connectivity_helper.host_pid,
                start_time_ticks: network.connectivity_helper.start_time_ticks,
            },
            enforcement_namespace: NamespaceView {
                device: a.enforcement_namespace.device,
                inode: a.enforcement_namespace.inode,
            },
            attested_at_unix: a.observed_at.as_secs(),
            recheck: match &network.recheck {
                NetworkRecheck::NotChecked => RecheckView::NotChecked,
                NetworkRecheck::Holds { at } => RecheckView::Holds {
                    at_unix: at.as_secs(),
                },
                NetworkRecheck::Differs { at, drift } => RecheckView::Differs {
                    at_unix: at.as_secs(),
                    drift: drift.iter().map(ToString::to_string).collect(),
                },
                NetworkRecheck::Failed(failure) => RecheckView::Failed {
                    detail: failure.to_string(),
                },
            },
            observed_routes: a.observation.observed_routes.len(),
            denied_probes: a
                .denied_destinations
                .iter()
                .map(|d| DeniedProbeView {
                    destination: d.destination.to_string(),
                    unreachable: d.unreachable,
                })
                .collect(),
            permitted_probes: a
                .permitted_destinations
                .iter()
                .map(|p| PermittedProbeView {
                    destination: p.destination.to_string(),
                    reachable: p.reachable,
                })
                .collect(),
            dns: a.dns_observations.iter().map(DnsView::from).collect(),
            names: network.names.as_ref().map(|n| NamesView {
                allow_hosts: n.names.hosts.iter().map(ToString::to_string).collect(),
                dns: match n.names.dns {
                    DnsMode::Lazaret => "lazaret",
                    DnsMode::Host => "host",
                },
                resolver: ResolverView {
                    listen: n.readiness.listen.to_string(),
                    pid: n.resolver.host_pid,
                    start_time_ticks: n.resolver.start_time_ticks,
                    running: n.resolver_running,
                },
                admitted: n
                    .admitted
                    .iter()
                    .map(|a| AdmittedView {
                        name: a.name.clone(),
                        address: a.address.to_string(),
                        expires_in_s: a.expires_in_ms.div_ceil(1000),
                    })
                    .collect(),
                admitted_total: n.admitted_total,
                credential_proxy: n.proxy.as_ref().map(|p| ProxyView {
                    listen: p.readiness.listen.to_string(),
                    hosts: p.readiness.hosts.clone(),
                    pid: p.process.host_pid,
                    start_time_ticks: p.process.start_time_ticks,
                    running: p.running,
                }),
            }),
        }
    }
}

/// What is wrong, if anything, with Lazaret's resolver or the Credential
/// Proxy.
fn resolver_problems(network: &NetworkStatus, profile: &str) -> Vec<String> {
    let Some(names) = network.names.as_ref() else {
        return Vec::new();
    };
    let resolver = (!names.resolver_running).then(|| {
        format!(
            "Lazaret's resolver (pid {}) exited: names do not resolve in the sandbox; run \
             `lazaret down {profile}` and `lazaret up {profile}`",
            names.resolver.host_pid
        )
    });
    let proxy = names.proxy.as_ref().filter(|p| !p.running).map(|p| {
        format!(
            "the Credential Proxy (pid {}) exited: requests to {} are refused; run \
             `lazaret down {profile}` and `lazaret up {profile}`",
            p.process.host_pid,
            p.readiness.hosts.join(", ")
        )
    });
    resolver.into_iter().chain(proxy).collect()
}

/// What is wrong, if anything, with the network read back for a status.
fn recheck_problem(recheck: &NetworkRecheck) -> Option<String> {
    match recheck {
        NetworkRecheck::NotChecked | NetworkRecheck::Holds { .. } => None,
        NetworkRecheck::Differs { drift, .. } => Some(format!(
            "the sandbox's network no longer shows its attested policy: {}; run `lazaret down` \
             and `lazaret up` to install it again",
            drift
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        )),
        NetworkRecheck::Failed(failure) => Some(format!(
            "the sandbox's network could not be read back: {failure}"
        )),
    }
}

/// The items, comma-separated, or `(none)`.
pub fn join_or_none(items: &[String]) -> String {
    if items.is_empty() {
        "(none)".into()
    } else {
        items.join(", ")
    }
}

impl StatusView {
    /// The status for people: one aligned line per part.
    pub fn text(&self) -> String {
        let mut rows = Rows(format!(
            "{profile}  {state}  generation {generation}  up {uptime}s  {workspace}\n",
            profile = self.profile,
            state = self.state,
            generation = self.generation,
            uptime = self.uptime_seconds,
            workspace = self.workspace,
        ));
        rows.row("domain id", self.domain_id.clone());
        rows.row(
            "image",
            format!("{} ({})", self.image, self.manifest_digest),
        );
        rows.row(
            "sandbox",
            format!("container {}, pid {}", self.container_id, self.sandbox.pid),
        );
        rows.row(
            "supervisor",
            format!(
                "pid {}; coordinator pid {}",
                self.supervisor.pid, self.coordinator.pid
            ),
        );
        rows.row("persistent dirs", self.persistent_text());
        rows.row("workspace", self.routing_text());
        rows.row(
            "  isolated in",
            self.workspace_routing.isolated_root.clone(),
        );
        if let Some(kept) = self.kept_text() {
            rows.row("  kept hidden", kept);
        }
        rows.row("sessions", self.sessions_text());
        self.network.rows(&mut rows);
        for problem in &self.problems {
            rows.row("PROBLEM", super::printable(problem));
        }
        rows.0
    }

    /// The attached sessions' commands (escaped: they came from a
    /// session), `shell` for a login shell, or `(none)`.
    fn sessions_text(&self) -> String {
        if self.sessions.is_empty() {
            return "(none)".to_owned();
        }
        self.sessions
            .iter()
            .map(|s| {
                if s.command.is_empty() {
                    "shell".to_owned()
                } else {
                    super::printable(&s.command.join(" "))
                }
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// The host paths kept isolated although the rules share them, and how
    /// to share them; `None` when there are none.
    fn kept_text(&self) -> Option<String> {
        let r = &self.workspace_routing;
        (r.kept_isolated_count > 0).then(|| {
            format!(
                "{} (the workspace's git rules now share them; after `lazaret down {1}`, \
                 `lazaret up {1} --accept-ignore-changes` shares them)",
                paths_text(&r.kept_isolated, u64::from(r.kept_isolated_count), ", "),
                self.profile
            )
        })
    }

    /// One line on how the workspace is routed, and whether it still is.
    fn routing_text(&self) -> String {
        let r = &self.workspace_routing;
        let router = if r.router.running {
            format!("router pid {}", r.router.pid)
        } else {
            "DEGRADED: the Workspace Router exited".to_owned()
        };
        let repository = match &r.repository {
            Some(root) => format!("git repository {root}"),
            None => "no git repository".to_owned(),
        };
        let ignored = match (r.isolate_gitignored, r.workspace_ignored) {
            (false, _) => "ignored paths shared (isolate_gitignored = false)".to_owned(),
            (true, true) => "the repository ignores the whole workspace: all isolated".to_owned(),
            (true, false) => format!(
                "ignored paths isolated ({} ignore files, {} tracked kept)",
                r.ignore_files, r.tracked_ignored
            ),
        };
        let configured = match r.configured_read_only {
            0 => String::new(),
            n => format!(" and {n} paths its configuration runs"),
        };
        format!("{repository}; {ignored}; git config and hooks{configured} read-only; {router}")
    }

    /// The persistent dirs with what each upper holds, and the root's
    /// ephemeral upper.
    fn persistent_text(&self) -> String {
        let mib = |bytes: u64| format!("{:.1} MiB", bytes as f64 / f64::from(1u32 << 20));
        let mut parts: Vec<String> = self
            .persistent_dirs
            .iter()
            .map(|dir| {
                match self
                    .storage
                    .persistent_uppers
                    .iter()
                    .find(|p| &p.sandbox_path == dir)
                {
                    Some(p) if p.complete => format!("{dir} ({} kept)", mib(p.bytes)),
                    Some(p) => format!("{dir} (at least {} kept)", mib(p.bytes)),
                    None => dir.clone(),
                }
            })
            .collect();
        if parts.is_empty() {
            parts.push("(none)".to_owned());
        }
        if let Some(t) = &self.storage.ephemeral_upper {
            parts.push(format!(
                "the rest of / {} of {} until down",
                mib(t.used_bytes),
                mib(t.size_bytes)
            ));
        }
        parts.join(", ")
    }
}

/// The aligned `key value` lines beneath a status's first line.
struct Rows(String);

impl Rows {
    fn row(&mut self, key: &str, value: String) {
        self.0.push_str(&format!("  {key:<17}{value}\n"));
    }
}

impl NetworkView {
    /// The network's rows: its attestation, the policy, the egress path
    /// and who answers DNS.
    fn rows(&self, rows: &mut Rows) {
        rows.row(
            "network",
            format!(
                "attested: {} routes read back, {} denied and {} permitted destinations \
                 probed (policy {})",
                self.observed_routes,
                self.denied_probes.len(),
                self.permitted_probes.len(),
                &self.policy_digest[..16.min(self.policy_digest.len())]
            ),
        );
        rows.row("  re-verified", self.recheck_text().into());
        rows.row("  allow", join_or_none(&self.allow));
        rows.row("  deny", self.deny_text());
        rows.row("  platform deny", join_or_none(&self.platform_deny));
        rows.row(
            "  egress",
            format!(
                "slirp4netns pid {}, host loopback disabled",
                self.connectivity_helper.pid
            ),
        );
        match &self.names {
            None => rows.row("  dns", self.host_dns_text()),
            Some(names) => names.rows(rows),
        }
    }

    /// Whether the network read back for this status still holds.
    fn recheck_text(&self) -> &'static str {
        match &self.recheck {
            RecheckView::Holds { .. } => "routes, rules and filter read back now: they hold",
            RecheckView::NotChecked => "not yet",
            RecheckView::Differs { .. } | RecheckView::Failed { .. } => "NO: see the problem below",
        }
    }

    /// The denied prefixes, and what else is denied.
    fn deny_text(&self) -> String {
        format!(
            "{}; anything unlisted{}; IPv6",
            join_or_none(&self.deny),
            if self.unlisted == "unreachable" {
                ""
            } else {
                " (but what allowed names resolve to)"
            }
        )
    }

    /// The resolvers attestation asked, when the host's resolver answers
    /// the sandbox.
    fn host_dns_text(&self) -> String {
        self.dns
            .iter()
            .map(|d| {
                format!(
                    "{} ({}); queries leave through the host's resolver",
                    d.resolver, d.outcome
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

impl NamesView {
    /// The allowed names' rows: the names, Lazaret's resolver, and the
    /// addresses admitted for them.
    fn rows(&self, rows: &mut Rows) {
        rows.row("  hosts", join_or_none(&self.allow_hosts));
        let resolver = if self.resolver.running {
            format!("resolver pid {}", self.resolver.pid)
        } else {
            "GONE: the resolver exited, nothing resolves".into()
        };
        let others = match self.dns {
            "host" => "other names leave through the host's resolver",
            _ => "other names refused, never sent out",
        };
        rows.row(
            "  dns",
            format!(
                "Lazaret's resolver on {} ({resolver}); {others}",
                self.resolver.listen
            ),
        );
        rows.row("  admitted", self.admitted_text());
        if let Some(proxy) = &self.credential_proxy {
            let state = if proxy.running {
                format!("pid {}", proxy.pid)
            } else {
                "GONE: the proxy exited, requests to these hosts are refused".into()
            };
            rows.row(
                "  credentials",
                format!(
                    "Credential Proxy on {} ({state}) for {}: the sandbox holds placeholders",
                    proxy.listen,
                    proxy.hosts.join(", ")
                ),
            );
        }
    }

    /// Each admitted address with its name (escaped: the name is the
    /// sandbox's, under a wildcard) and seconds left, and how many more
    /// there are than were named.
    fn admitted_text(&self) -> String {
        let mut admitted: Vec<String> = self
            .admitted
            .iter()
            .map(|a| {
                let name = super::printable(&a.name);
                format!("{name} {} ({}s)", a.address, a.expires_in_s)
            })
            .collect();
        let unlisted = self.admitted_total.saturating_sub(admitted.len() as u64);
        if unlisted > 0 {
            admitted.push(format!("and {unlisted} more"));
        }
        join_or_none(&admitted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A running Domain's status with a little of everything.
    fn status() -> StatusView {
        let process = |pid| ProcessView {
            pid,
            start_time_ticks: 7,
        };
        StatusView {
            profile: "p".into(),
            domain_id: "ab".repeat(16),
            workspace: "/home/u/w".into(),
            state: "running".into(),
            problems: Vec::new(),
            generation: 3,
            uptime_seconds: 42,
            configuration_fingerprint: "cd".repeat(32),
            image: "docker.io/library/debian:trixie".into(),
            manifest_digest: "sha256:ee".into(),
            container_id: "lazaret-ab".into(),
            runsc_root: "/run/user/1000/lazaret/runsc".into(),
            persistent_dirs: vec!["/root".into(), "/var/cache".into()],
            coordinator: process(10),
            supervisor: process(11),
            namespace_holder: process(12),
            sandbox: process(13),
            sessions: vec![
                SessionView {
                    session_id: "01".into(),
                    command: Vec::new(),
                    terminal: true,
                    opened_at_unix: 5,
                    guest_pid: Some(2),
                },
                SessionView {
                    session_id: "02".into(),
                    command: vec!["vim".into(), "a\x1bb".into()],
                    terminal: true,
                    opened_at_unix: 6,
                    guest_pid: None,
                },
            ],
            network: NetworkView {
                state: "attested",
                policy_digest: "0123456789abcdef0123".into(),
                readiness_fingerprint: "ff".into(),
                allow: vec!["0.0.0.0/0".into()],
                deny: vec!["10.0.0.0/8".into()],
                platform_deny: Vec::new(),
                unlisted: "unreachable",
                ipv6: "unreachable",
                resolvers: vec!["10.0.2.3".into()],
                connectivity_helper: HelperView {
                    program: "slirp4netns",
                    pid: 14,
                    start_time_ticks: 8,
                },
                enforcement_namespace: NamespaceView {
                    device: 4,
                    inode: 4026531840,
                },
                attested_at_unix: 9,
                recheck: RecheckView::Holds { at_unix: 10 },
                observed_routes: 2,
                denied_probes: Vec::new(),
                permitted_probes: Vec::new(),
                dns: vec![DnsView {
                    resolver: "10.0.2.3".into(),
                    query: "example.org".into(),
                    outcome: "answered rcode 0".into(),
                    addresses: Vec::new(),
                }],
                names: None,
            },
            storage: StorageView {
                ephemeral_upper: Some(TmpfsView {
                    used_bytes: 1 << 20,
                    size_bytes: 1 << 30,
                }),
                persistent_uppers: vec![UpperView {
                    sandbox_path: "/root".into(),
                    bytes: 3 << 19,
                    complete: false,
                }],
            },
            workspace_routing: RoutingView {
                isolate_gitignored: true,
                repository: Some("/home/u/w".into()),
                workspace_ignored: false,
                isolated_root: "/data/isolated".into(),
                scopes: 1,
                ignore_files: 2,
                tracked_ignored: 0,
                configured_read_only: 0,
                kept_isolated: Vec::new(),
                kept_isolated_count: 0,
                router: RouterView {
                    pid: 15,
                    start_time_ticks: 9,
                    running: true,
                },
            },
        }
    }

    /// The names part of a status whose policy allows `*.example.org`.
    fn names(running: bool, dns: &'static str) -> NamesView {
        NamesView {
            allow_hosts: vec!["*.example.org".into()],
            dns,
            resolver: ResolverView {
                listen: "10.0.2.3:53".into(),
                pid: 16,
                start_time_ticks: 1,
                running,
            },
            admitted: vec![AdmittedView {
                name: "a\x07.example.org".into(),
                address: "192.0.2.1".into(),
                expires_in_s: 30,
            }],
            admitted_total: 1,
            credential_proxy: None,
        }
    }

    /// The row of `text` whose key is `key`, without the key.
    fn row<'t>(text: &'t str, key: &str) -> &'t str {
        let prefix = format!("  {key:<17}");
        text.lines()
            .find_map(|line| line.strip_prefix(prefix.as_str()))
            .unwrap_or_else(|| panic!("no row `{key}` in:\n{text}"))
    }

    #[test]
    fn recheck_serializes_with_its_state_named() {
        let json = |v: &RecheckView| serde_json::to_value(v).unwrap();
        assert_eq!(
            json(&RecheckView::NotChecked),
            serde_json::json!({"state": "not_checked"})
        );
        assert_eq!(
            json(&RecheckView::Holds { at_unix: 5 }),
            serde_json::json!({"state": "holds", "at_unix": 5})
        );
        assert_eq!(
            json(&RecheckView::Differs {
                at_unix: 6,
                drift: vec!["route 10.0.0.0/8 missing".into()]
            }),
            serde_json::json!({"state": "differs", "at_unix": 6, "drift": ["route 10.0.0.0/8 missing"]})
        );
        assert_eq!(
            json(&RecheckView::Failed {
                detail: "gone".into()
            }),
            serde_json::json!({"state": "failed", "detail": "gone"})
        );
    }

    #[test]
    fn status_text_is_one_headline_and_aligned_rows() {
        let text = status().text();
        let mut lines = text.lines();
        assert_eq!(
            lines.next(),
            Some("p  running  generation 3  up 42s  /home/u/w")
        );
        assert!(lines.all(|l| l.starts_with("  ")), "{text}");
        assert_eq!(row(&text, "sandbox"), "container lazaret-ab, pid 13");
        assert_eq!(row(&text, "supervisor"), "pid 11; coordinator pid 10");
        assert_eq!(
            row(&text, "network"),
            "attested: 2 routes read back, 0 denied and 0 permitted destinations probed \
             (policy 0123456789abcdef)"
        );
        assert_eq!(
            row(&text, "  dns"),
            "10.0.2.3 (answered rcode 0); queries leave through the host's resolver"
        );
        assert!(!text.contains("  hosts"), "{text}");
        assert!(!text.contains("PROBLEM"), "{text}");
    }

    #[test]
    fn sessions_read_shell_or_their_command_escaped() {
        let mut s = status();
        assert_eq!(s.sessions_text(), "shell; vim a\\u{1b}b");
        s.sessions.clear();
        assert_eq!(row(&s.text(), "sessions"), "(none)");
    }

    #[test]
    fn problems_are_rows_of_their_own_escaped() {
        let mut s = status();
        s.state = "degraded".into();
        s.problems = vec!["one\x1b[2J".into(), "two".into()];
        let text = s.text();
        let key = format!("  {:<17}", "PROBLEM");
        let problems: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix(key.as_str()))
            .collect();
        assert_eq!(problems, ["one\\u{1b}[2J", "two"]);
        assert!(text.ends_with("two\n"), "{text}");
    }

    #[test]
    fn recheck_and_deny_say_what_holds() {
        let mut s = status();
        assert_eq!(
            s.network.recheck_text(),
            "routes, rules and filter read back now: they hold"
        );
        assert_eq!(s.network.deny_text(), "10.0.0.0/8; anything unlisted; IPv6");
        s.network.recheck = RecheckView::Differs {
            at_unix: 1,
            drift: vec!["route".into()],
        };
        s.network.unlisted = "names";
        s.network.deny.clear();
        assert_eq!(s.network.recheck_text(), "NO: see the problem below");
        assert_eq!(
            s.network.deny_text(),
            "(none); anything unlisted (but what allowed names resolve to); IPv6"
        );
        s.network.recheck = RecheckView::NotChecked;
        assert_eq!(row(&s.text(), "  re-verified"), "not yet");
    }

    #[test]
    fn credentials_show_the_proxy_and_say_when_it_is_gone() {
        let mut s = status();
        let mut n = names(true, "lazaret");
        n.credential_proxy = Some(ProxyView {
            listen: "127.0.0.54:443".into(),
            hosts: vec!["api.example.org".into()],
            pid: 17,
            start_time_ticks: 1,
            running: true,
        });
        s.network.names = Some(n);
        assert_eq!(
            row(&s.text(), "  credentials"),
            "Credential Proxy on 127.0.0.54:443 (pid 17) for api.example.org: the sandbox \
             holds placeholders"
        );
        if let Some(proxy) = s
            .network
            .names
            .as_mut()
            .and_then(|n| n.credential_proxy.as_mut())
        {
            proxy.running = false;
        }
        assert!(
            row(&s.text(), "  credentials").contains("GONE: the proxy exited"),
            "{}",
            s.text()
        );
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(
            json["network"]["names"]["credential_proxy"]["hosts"][0],
            "api.example.org"
        );
    }

    #[test]
    fn names_show_the_resolver_and_what_it_admitted() {
        let mut s = status();
        s.network.names = Some(names(true, "lazaret"));
        let text = s.text();
        assert_eq!(row(&text, "  hosts"), "*.example.org");
        assert_eq!(
            row(&text, "  dns"),
            "Lazaret's resolver on 10.0.2.3:53 (resolver pid 16); other names refused, never \
             sent out"
        );
        // The admitted name is the sandbox's: escaped.
        assert_eq!(
            row(&text, "  admitted"),
            "a\\u{7}.example.org 192.0.2.1 (30s)"
        );
        let mut gone = names(false, "host");
        gone.admitted_total = 5;
        assert_eq!(
            gone.admitted_text(),
            "a\\u{7}.example.org 192.0.2.1 (30s), and 4 more"
        );
        s.network.names = Some(gone);
        assert_eq!(
            row(&s.text(), "  dns"),
            "Lazaret's resolver on 10.0.2.3:53 (GONE: the resolver exited, nothing \
             resolves); other names leave through the host's resolver"
        );
        let mut none = names(true, "lazaret");
        none.admitted.clear();
        none.admitted_total = 0;
        assert_eq!(none.admitted_text(), "(none)");
    }

    #[test]
    fn empty_lists_read_none() {
        assert_eq!(join_or_none(&[]), "(none)");
        assert_eq!(join_or_none(&["a".into(), "b".into()]), "a, b");
    }
}
