//! The lifecycle links between the `lazaret` CLI and a Domain's Host
//! Coordinator: the startup channel a starting coordinator reports on (and
//! asks the developer one question on), and the control socket a running
//! one answers `status` and `down` on.
//!
//! This module owns those messages only; sessions have their own TLS link.
//! The coordinator trusts a control peer only after checking its uid equals
//! its own; the CLI trusts what the coordinator reports as the view of the
//! Domain's owner, and shows it.

use serde::{Deserialize, Serialize};

use crate::codec::WireRecord;
use crate::common::{HostPath, UnixTimeNs};
use crate::config::ConfigurationRecord;
use crate::failure::Failure;
use crate::ids::{
    ConfigurationFingerprint, ContainerId, DomainId, GenerationId, ManifestDigest, SessionId,
};
use crate::network::{DerivedNetworkPolicy, IpPrefix, NetworkReadinessAttestation};
use crate::process::PidfsProcessIdentityV1;
use crate::router::{RelativePath, RoutingSummary, WorkspaceChanges};
use crate::store::GenerationState;

/// A step of `lazaret up`, in the order the coordinator takes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StartupStep {
    /// Loading the configuration.
    Configuration,
    /// Taking Domain ownership and recovering a stale generation.
    Ownership,
    /// Resolving and preparing the image.
    Image,
    /// Recording the generation and preparing the State Anchor.
    State,
    /// Taking the workspace's routing rules and starting its router.
    Workspace,
    /// Attaching the network and attesting its policy.
    Network,
    /// Starting the sandbox.
    Sandbox,
}

impl StartupStep {
    /// The step's name as the CLI prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            StartupStep::Configuration => "configuration",
            StartupStep::Ownership => "ownership",
            StartupStep::Image => "image",
            StartupStep::State => "state",
            StartupStep::Workspace => "workspace",
            StartupStep::Network => "network",
            StartupStep::Sandbox => "sandbox",
        }
    }
}

/// What a starting coordinator reports to the CLI that started it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StartupEvent {
    /// A step began or made progress.
    Progress {
        /// The step.
        step: StartupStep,
        /// What is happening, for the user.
        detail: String,
        /// Done and total units (bytes, layers) when the step can tell.
        fraction: Option<(u64, u64)>,
    },
    /// Host paths the Domain's last generation kept from the sandbox that
    /// the rules taken now would share, and what becomes of them. When it
    /// asks, the coordinator waits for the CLI's [`StartupReply`].
    IgnoreChanges(IgnoreChanges),
    /// The sandbox runs.
    Ready(Box<DomainStatus>),
    /// Another coordinator runs the Domain already.
    AlreadyRunning {
        /// What it reports.
        status: Box<DomainStatus>,
        /// The configuration fields that differ from the one just loaded;
        /// empty when the fingerprints are equal.
        differences: Vec<String>,
    },
    /// Starting failed at `step`; nothing of the generation is left running.
    Failed {
        /// The step that failed.
        step: StartupStep,
        /// Whose the failure is.
        kind: FailureKind,
        /// What failed (the coordinator's account, then the errno, path or
        /// program output beneath), and what to do.
        failure: Failure,
    },
}

/// Whose a start-up failure is; it decides the CLI's exit code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailureKind {
    /// The configuration, or something it names (an image reference, a
    /// network policy, a profile that asks for what is not built), cannot
    /// be used as written: the user edits it (exit 2).
    InvalidConfiguration,
    /// The host or a participant failed while the step ran (exit 1).
    Failed,
}

impl FailureKind {
    /// The CLI's exit code for a failure of this kind.
    #[must_use]
    pub fn exit_code(self) -> u8 {
        match self {
            FailureKind::InvalidConfiguration => 2,
            FailureKind::Failed => 1,
        }
    }
}

impl WireRecord for StartupEvent {
    const NAME: &'static str = "StartupEvent";
}

/// The most bytes of paths an [`IgnoreChanges`] event or a
/// [`WorkspaceStatus`] names, encoded; the rest are counted.
pub const MAX_NAMED_PATHS_LEN: usize = 16 * 1024;

/// The first of `paths` (in their order) whose encodings (each path's
/// bytes and its length, at most 4 bytes more) add up to at most
/// [`MAX_NAMED_PATHS_LEN`].
pub fn named_paths(paths: &[RelativePath]) -> Vec<RelativePath> {
    let mut left = MAX_NAMED_PATHS_LEN;
    paths
        .iter()
        .take_while(|p| match left.checked_sub(p.0.len() + 4) {
            Some(rest) => {
                left = rest;
                true
            }
            None => false,
        })
        .cloned()
        .collect()
}

/// What `up` found when it compared the rules it took from the host with
/// those the Domain's last generation routed by.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IgnoreChanges {
    /// The host paths the last generation isolated that the new rules
    /// would share, relative to the workspace (the top-most of each; the
    /// empty path is the whole workspace), as many as fit in
    /// [`MAX_NAMED_PATHS_LEN`].
    pub paths: Vec<RelativePath>,
    /// How many there are in all.
    pub count: u64,
    /// What becomes of them.
    pub outcome: IgnoreChangesOutcome,
}

/// What becomes of host paths the new rules would share.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum IgnoreChangesOutcome {
    /// The coordinator asks the developer, through the CLI, and waits.
    Asking,
    /// They stay isolated for this generation: the developer did not
    /// agree, or could not be asked.
    Kept,
    /// They are shared from this generation on: the developer agreed, or
    /// ran `up --accept-ignore-changes`.
    Accepted,
}

/// What the CLI sends a starting coordinator on the startup channel: the
/// answer to the one question it asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StartupReply {
    /// Whether the developer agreed to share the paths an
    /// [`IgnoreChanges`] event asked about.
    ShareIgnoreChanges(bool),
}

impl WireRecord for StartupReply {
    const NAME: &'static str = "StartupReply";
    const MAX_ENCODED_LEN: usize = 16;
}

/// What the CLI asks a running coordinator.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ControlRequest {
    /// Describe the Domain.
    Status,
    /// Stop the generation and exit.
    Down,
}

impl WireRecord for ControlRequest {
    const NAME: &'static str = "ControlRequest";
}

/// A running coordinator's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ControlResponse {
    /// The Domain as it is now.
    Status(Box<DomainStatus>),
    /// The generation is stopped and recorded closed; the coordinator exits.
    Stopped {
        /// The generation that ended.
        generation_id: GenerationId,
        /// What changed during it below the directories holding scripts
        /// the host's git runs, compared once the sandbox was gone.
        workspace_changes: WorkspaceChanges,
    },
    /// The request failed.
    Failed {
        /// What failed and why.
        failure: Failure,
    },
}

impl WireRecord for ControlResponse {
    const NAME: &'static str = "ControlResponse";
}

/// One running Domain as `lazaret status` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DomainStatus {
    /// The Domain.
    pub domain_id: DomainId,
    /// Its profile.
    pub profile: String,
    /// Its canonical workspace.
    pub workspace: HostPath,
    /// The running generation.
    pub generation_id: GenerationId,
    /// Its state.
    pub state: GenerationState,
    /// When it started.
    pub started_at: UnixTimeNs,
    /// The configuration it runs with.
    pub configuration_fingerprint: ConfigurationFingerprint,
    /// The resolved configuration behind that fingerprint, of its
    /// document's schema (names only, no environment values), so a
    /// mismatch can be named field by field.
    pub configuration: ConfigurationRecord,
    /// The manifest digest the reference resolved to.
    pub manifest_digest: ManifestDigest,
    /// The runsc container.
    pub container_id: ContainerId,
    /// The runsc state directory.
    pub runtime_root: HostPath,
    /// The coordinator's identity.
    pub coordinator: PidfsProcessIdentityV1,
    /// The Runtime Supervisor's identity.
    pub supervisor: PidfsProcessIdentityV1,
    /// The identity of the Domain namespaces' holder: the init of the Domain
    /// pid namespace, and the process to enter the namespaces through.
    pub namespace_holder: PidfsProcessIdentityV1,
    /// The runsc sandbox process's identity.
    pub sandbox: PidfsProcessIdentityV1,
    /// The client sessions attached now.
    pub sessions: Vec<SessionSummary>,
    /// The network the sandbox runs under and the evidence it is in force.
    pub network: NetworkStatus,
    /// How the workspace is routed.
    pub workspace_routing: WorkspaceStatus,
    /// What the uppers hold now.
    pub storage: StorageUsage,
    /// The generation's processes that are stopped now, and so answer
    /// nothing.
    pub stopped: Vec<StoppedProcess>,
}

/// One of a generation's processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum GenerationProcess {
    /// The Runtime Supervisor.
    Supervisor,
    /// The init of the Domain's namespaces.
    NamespaceHolder,
    /// The runsc sandbox.
    Sandbox,
    /// The runsc gofer.
    Gofer,
    /// The Workspace Router.
    WorkspaceRouter,
    /// `slirp4netns`, the connectivity helper.
    ConnectivityHelper,
    /// Lazaret's resolver.
    Resolver,
    /// The Credential Proxy.
    CredentialProxy,
}

/// A generation's process that is stopped (SIGSTOP, a tracer): it runs no
/// code, so whatever waits on it (a session starting, the workspace, the
/// network) waits until it is continued.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoppedProcess {
    /// Which process.
    pub process: GenerationProcess,
    /// Its pid and start time.
    pub identity: PidfsProcessIdentityV1,
}

/// What the sandbox's uppers hold, as `lazaret status` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StorageUsage {
    /// The root filesystem's ephemeral upper, in memory; `None` when it
    /// could not be read.
    pub ephemeral_upper: Option<TmpfsUsage>,
    /// Each persistent dir's upper on disk (one that could not be read is
    /// left out).
    pub persistent_uppers: Vec<PersistentUsage>,
}

/// A tmpfs's use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TmpfsUsage {
    /// Bytes in use.
    pub used_bytes: u64,
    /// Its size.
    pub size_bytes: u64,
}

/// One persistent dir's upper.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PersistentUsage {
    /// The sandbox path.
    pub sandbox_path: String,
    /// Bytes it occupies on disk, as far as counted.
    pub bytes: u64,
    /// Whether the whole upper was counted (`status` walks them for a
    /// bounded time; a larger one shows "at least").
    pub complete: bool,
}

/// The generation's workspace routing, as `lazaret status` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkspaceStatus {
    /// Whether git-ignored paths stay in Domain storage
    /// (`isolate_gitignored`).
    pub isolate_ignored: bool,
    /// The root of the git repository the workspace is, or is in, on the
    /// host.
    pub repository: Option<HostPath>,
    /// Whether that repository ignores the whole workspace, so that
    /// everything the sandbox writes stays in Domain storage.
    pub workspace_ignored: bool,
    /// The Domain's directory holding isolated paths: ignored paths and
    /// the git metadata the sandbox makes.
    pub isolated_root: HostPath,
    /// What the rules hold.
    pub summary: RoutingSummary,
    /// Host paths kept isolated although the rules share them, because the
    /// last generation isolated them and the developer has not agreed to
    /// share them (as many as fit in [`MAX_NAMED_PATHS_LEN`]; the summary
    /// counts them all).
    pub kept_isolated: Vec<RelativePath>,
    /// The Workspace Router.
    pub router: PidfsProcessIdentityV1,
    /// Whether the router still runs. When it does not, every workspace
    /// operation inside the sandbox fails until `lazaret down`.
    pub router_running: bool,
}

impl WorkspaceStatus {
    /// What is wrong with the routing of the Domain of `profile`, in the
    /// words `status` and the Domain log use; `None` while the router
    /// runs.
    pub fn problem(&self, profile: &str) -> Option<String> {
        (!self.router_running).then(|| {
            format!(
                "the Workspace Router exited: every workspace operation in the sandbox fails; \
                 `lazaret logs {profile}` says why; `lazaret down {profile}` then \
                 `lazaret up {profile}` routes it again"
            )
        })
    }
}

/// The generation's network, as `lazaret status` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkStatus {
    /// The policy installed in the enforcement namespace (its digest is
    /// the attestation's `derived_policy_digest`).
    pub policy: DerivedNetworkPolicy,
    /// The platform's denials among the policy's deny rules: special-purpose
    /// ranges and the host's own addresses, whatever the profile allows.
    pub platform_deny: Vec<IpPrefix>,
    /// The accepted readiness attestation.
    pub attestation: NetworkReadinessAttestation,
    /// The connectivity helper (slirp4netns).
    pub connectivity_helper: PidfsProcessIdentityV1,
    /// What reading the namespace back found when this status was asked
    /// for.
    pub recheck: NetworkRecheck,
    /// The policy's names and Lazaret's resolver, when it serves them.
    pub names: Option<NamesStatus>,
}

/// The names a generation's sandbox may reach, and the resolver that
/// answers them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamesStatus {
    /// The names, and who answers the others.
    pub names: crate::network::NamedEgress,
    /// Lazaret's resolver.
    pub resolver: PidfsProcessIdentityV1,
    /// Whether it still runs.
    pub resolver_running: bool,
    /// What its readiness probes saw.
    pub readiness: crate::resolver::ResolverReadiness,
    /// The addresses its set holds now, with the time each has left (as
    /// many as a status carries); empty when the status was not read back.
    pub admitted: Vec<crate::network::AdmittedAddress>,
    /// How many addresses its set holds.
    pub admitted_total: u64,
    /// The Credential Proxy, for a profile with credentials.
    pub proxy: Option<ProxyStatus>,
}

/// The Credential Proxy, as `status` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProxyStatus {
    /// The process.
    pub process: PidfsProcessIdentityV1,
    /// Whether it still runs.
    pub running: bool,
    /// What it reported: where it listens and which hosts it serves.
    pub readiness: crate::credproxy::ProxyReadiness,
}

/// The policy re-verified: the enforcement namespace read back (routes,
/// rules, filter) and compared with the policy in force.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NetworkRecheck {
    /// Not read back (the status of a generation still starting).
    NotChecked,
    /// The namespace still shows the policy.
    Holds {
        /// When it was read.
        at: UnixTimeNs,
    },
    /// The namespace differs from the policy.
    Differs {
        /// When it was read.
        at: UnixTimeNs,
        /// How.
        drift: Vec<crate::network::NetworkDrift>,
    },
    /// It could not be read back: the Runtime Supervisor's account.
    Failed(Failure),
}

/// One attached client session, as `lazaret status` lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionSummary {
    /// The session.
    pub session_id: SessionId,
    /// Its command; empty for the login shell.
    pub command: Vec<String>,
    /// Whether it runs on a terminal.
    pub terminal: bool,
    /// When it opened.
    pub opened_at: UnixTimeNs,
    /// Its leader inside the sandbox, once the leader said who it is.
    pub guest: Option<crate::terminal::GuestProcessIdentity>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{assert_rejects_bad_envelopes, round_trip};

    #[test]
    fn named_paths_fit_their_bound_in_order() {
        let path = |n: usize| RelativePath(format!("{n:0>1000}").into_bytes());
        let paths: Vec<RelativePath> = (0..100).map(path).collect();
        let named = named_paths(&paths);
        assert_eq!(named.len(), MAX_NAMED_PATHS_LEN / 1004);
        assert_eq!(named[..], paths[..named.len()]);
        // The whole workspace (the empty path) counts, and fits.
        assert_eq!(
            named_paths(&[RelativePath::default()]),
            [RelativePath::default()]
        );
        // The most paths that fit still make an event that encodes.
        round_trip(&StartupEvent::IgnoreChanges(IgnoreChanges {
            paths: named,
            count: 100,
            outcome: IgnoreChangesOutcome::Kept,
        }));
        let short: Vec<RelativePath> = (0..50_000)
            .map(|n: u32| RelativePath(n.to_string().into_bytes()))
            .collect();
        let bytes = round_trip(&StartupEvent::IgnoreChanges(IgnoreChanges {
            paths: named_paths(&short),
            count: 50_000,
            outcome: IgnoreChangesOutcome::Asking,
        }));
        assert!(bytes.len() <= MAX_NAMED_PATHS_LEN + 32, "{}", bytes.len());
    }

    #[test]
    fn the_reply_round_trips() {
        for share in [true, false] {
            let reply = StartupReply::ShareIgnoreChanges(share);
            round_trip(&reply);
            assert_rejects_bad_envelopes(&reply);
        }
    }
}
