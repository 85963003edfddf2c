//! The Host Coordinator ↔ Runtime Supervisor link: what the coordinator asks
//! of the supervisor of one generation, and what the supervisor reports.
//!
//! This module owns the messages of that one channel; no other link can
//! speak them. Descriptors travel beside a message with SCM_RIGHTS and are
//! named here by their index in the packet. The supervisor trusts only the
//! coordinator that spawned it (its inherited channel); the coordinator
//! trusts no field of a report until it has re-proven the identities the
//! descriptors carry.

use serde::{Deserialize, Serialize};

use crate::channel::Limits;

use crate::codec::WireRecord;
use crate::common::HostPath;
use crate::config::{VolumeAccess, VolumeKind};
use crate::failure::Failure;
use crate::ids::{ContainerId, DomainId, GenerationId, SessionId};
use crate::network::NetworkReadinessAttestation;
use crate::ownership::NamespaceIdentity;
use crate::router::RoutingSummary;
use crate::sidecar::AttestParameters;

pub use crate::channel::{FdIndex, FdList};

/// The limits of the coordinator ↔ supervisor channel, the same at both
/// ends: enough descriptors for every State Anchor and volume of one plan.
pub const PLAN_LIMITS: Limits = Limits {
    max_bytes: 64 * 1024,
    max_fds: 253,
};

/// One persistent directory of the State Anchor: an overlay of the prepared
/// lower's directory and the Domain's upper, shown at `sandbox_path`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnchorMount {
    /// The sandbox path, e.g. `/root`.
    pub sandbox_path: String,
    /// The Domain-owned directory holding `upper/` and `work/` for it.
    pub state_dir: FdIndex,
}

/// One configured volume, its source opened by the coordinator.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeMount {
    /// The sandbox path.
    pub sandbox_path: String,
    /// The opened source.
    pub source: FdIndex,
    /// File or directory.
    pub kind: VolumeKind,
    /// Read-only or read-write.
    pub access: VolumeAccess,
}

/// Everything the supervisor needs to start one generation's sandbox.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxPlan {
    /// The Domain.
    pub domain_id: DomainId,
    /// The generation.
    pub generation_id: GenerationId,
    /// The runsc container ID; fixed length, so never a prefix of another.
    pub container_id: ContainerId,
    /// The generation's private runtime directory, created by the
    /// coordinator (mode 0700). The bundle and runsc state live beneath it.
    pub runtime_dir: HostPath,
    /// The `runsc` executable.
    pub runsc: HostPath,
    /// The prepared lower's root filesystem directory.
    pub rootfs: FdIndex,
    /// The Agent Workspace directory.
    pub workspace: FdIndex,
    /// The Domain's isolated directory: where the Workspace Router keeps
    /// git-ignored paths and the git metadata the sandbox makes.
    pub isolated: FdIndex,
    /// A sealed memfd holding the encoded
    /// [`WorkspaceRules`](crate::router::WorkspaceRules), passed to the
    /// Workspace Router unread.
    pub workspace_rules: FdIndex,
    /// A sealed memfd holding the sandbox environment the configuration
    /// resolved, as `NAME=value` entries each ended by a NUL byte. Values
    /// never travel in a message or a file.
    pub environment: FdIndex,
    /// The persistent directories.
    pub anchors: Vec<AnchorMount>,
    /// The volumes.
    pub volumes: Vec<VolumeMount>,
    /// The resolvers the sandbox's `/etc/resolv.conf` names.
    pub resolvers: Vec<std::net::Ipv4Addr>,
}

/// How a session process's standard streams are connected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExecStdio {
    /// One host PTY slave as stdin, stdout and stderr; it becomes the
    /// process's controlling terminal.
    Terminal {
        /// The PTY slave.
        slave: FdIndex,
        /// The window's rows.
        rows: u16,
        /// The window's columns.
        columns: u16,
    },
    /// A pipe for standard input and one pipe for standard output and
    /// standard error together, in the order written.
    Pipes {
        /// The read end of the input pipe.
        input: FdIndex,
        /// The write end of the output pipe.
        output: FdIndex,
    },
}

/// One client session's process, run in the sandbox with `runsc exec`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecRequest {
    /// The session the process belongs to.
    pub session_id: SessionId,
    /// The command and its arguments.
    pub args: Vec<String>,
    /// The working directory inside the sandbox.
    pub cwd: String,
    /// `TERM` for terminal sessions.
    pub term: Option<String>,
    /// A sealed memfd with the profile's environment (`NAME=value\0`).
    pub environment: FdIndex,
    /// The process's standard streams.
    pub stdio: ExecStdio,
}

/// A signal for a session's process inside the sandbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExecSignal {
    /// SIGINT.
    Interrupt,
    /// SIGQUIT.
    Quit,
    /// SIGTERM.
    Terminate,
    /// SIGKILL: the session's client is gone (the sandbox's pid 1 then ends
    /// the rest of the session).
    Kill,
    /// SIGHUP.
    Hangup,
    /// SIGWINCH, to every process of the sandbox: the runtime passes a
    /// window's change of size to none of them, and cannot name a
    /// session's foreground process group. A program that does not redraw
    /// ignores it.
    WindowChanged,
}

impl ExecSignal {
    /// The signal's name as `runsc kill` takes it.
    pub fn name(self) -> &'static str {
        match self {
            ExecSignal::Interrupt => "INT",
            ExecSignal::Quit => "QUIT",
            ExecSignal::Terminate => "TERM",
            ExecSignal::Kill => "KILL",
            ExecSignal::Hangup => "HUP",
            ExecSignal::WindowChanged => "WINCH",
        }
    }
}

impl From<crate::terminal::TerminalSignalKind> for ExecSignal {
    fn from(kind: crate::terminal::TerminalSignalKind) -> Self {
        use crate::terminal::TerminalSignalKind as Kind;
        match kind {
            Kind::Interrupt => Self::Interrupt,
            Kind::Quit => Self::Quit,
            Kind::Terminate => Self::Terminate,
            Kind::Hangup => Self::Hangup,
        }
    }
}

/// What the coordinator asks of the supervisor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SupervisorRequest {
    /// Build the namespaces, mounts and bundle; the sandbox starts only on
    /// `RunSandbox`, after the network is attested.
    Start(SandboxPlan),
    /// Start the Network Sidecar in the enforcement namespace with the
    /// policy memfd the packet carries, and report its attestation.
    AttestNetwork {
        /// What to attest.
        parameters: AttestParameters,
        /// The sealed policy memfd.
        policy: FdIndex,
        /// The read end of the connectivity helper's ready pipe: the
        /// sidecar installs the filter while the helper attaches, and
        /// configures the helper's device once it reads `1` there.
        helper_ready: FdIndex,
        /// For a profile with credentials, the Credential Proxy to start
        /// once names are served.
        proxy: Option<ProxyPlan>,
    },
    /// Run the sandbox: the Host Coordinator accepted the attestation.
    RunSandbox,
    /// Start a session process in the running sandbox.
    Exec(ExecRequest),
    /// Send a signal to a session's process inside the sandbox.
    SignalExec {
        /// The session.
        session_id: SessionId,
        /// The signal.
        signal: ExecSignal,
    },
    /// Stop the sandbox and exit, releasing every mount with the namespace.
    Stop,
    /// Start the Network Sidecar to read the enforcement namespace back
    /// (routes, rules, filter; nothing installed, nothing probed) and
    /// report what it found: `lazaret status` re-verifies the policy.
    ObserveNetwork(crate::sidecar::ObserveParameters),
}

impl WireRecord for SupervisorRequest {
    const NAME: &'static str = "SupervisorRequest";
}

/// Which step of starting a sandbox failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SupervisorStep {
    /// Creating the user, mount, network or pid namespace.
    Namespaces,
    /// Mounting the root filesystem, State Anchor, workspace or volumes.
    Mounts,
    /// Writing the OCI bundle.
    Bundle,
    /// Running `runsc`.
    Runtime,
    /// Reporting process identities.
    Identities,
    /// Installing and attesting the network policy.
    Network,
    /// Mounting the routed workspace and starting its Workspace Router.
    Workspace,
    /// The request itself was malformed (missing descriptor, bad path).
    Request,
}

/// A failure the supervisor reports before exiting. It renders as the
/// failure's sentence, for the user; it never holds secrets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{failure}")]
pub struct SupervisorError {
    /// The step that failed.
    pub step: SupervisorStep,
    /// What failed and why.
    pub failure: Failure,
}

/// The Credential Proxy a profile with credentials asks for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProxyPlan {
    /// The sealed memfd of
    /// [`ProxyCredentials`](crate::credproxy::ProxyCredentials), passed to
    /// the proxy unread.
    pub credentials: FdIndex,
    /// The hosts it serves, sorted: Lazaret's resolver answers them with
    /// the proxy's address.
    pub hosts: Vec<String>,
}

/// The Credential Proxy, serving: its pidfd travels in the packet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProxyServed {
    /// The pidfd of the proxy.
    pub pidfd: FdIndex,
    /// What it reported.
    pub readiness: crate::credproxy::ProxyReadiness,
}

/// What the supervisor reports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SupervisorReport {
    /// The namespaces exist; the packet carries the pidfd of the process
    /// that holds them (the supervisor's pid 1) and descriptors of the user
    /// and network namespaces, for the connectivity helper to join.
    NamespacesReady {
        /// The Domain user namespace.
        user_namespace: NamespaceIdentity,
        /// The enforcement network namespace.
        network_namespace: NamespaceIdentity,
        /// The pidfd of the namespace holder.
        holder: FdIndex,
        /// The user namespace's descriptor.
        user_namespace_fd: FdIndex,
        /// The network namespace's descriptor.
        network_namespace_fd: FdIndex,
    },
    /// The workspace is mounted and its Workspace Router serves it; the
    /// packet carries the router's pidfd.
    WorkspaceRouted {
        /// The pidfd of the Workspace Router.
        router: FdIndex,
        /// What it routes by.
        summary: RoutingSummary,
    },
    /// The Network Sidecar installed the policy and attested it.
    NetworkAttested(Box<NetworkReadinessAttestation>),
    /// The Network Sidecar attested a policy with names, and Lazaret's
    /// resolver serves them; the packet carries the resolver's pidfd.
    NamesServed {
        /// The sidecar's attestation.
        attestation: Box<NetworkReadinessAttestation>,
        /// The pidfd of the resolver.
        resolver: FdIndex,
        /// What the resolver's readiness probes saw.
        readiness: crate::resolver::ResolverReadiness,
        /// The Credential Proxy, for a profile with credentials.
        proxy: Option<ProxyServed>,
    },
    /// The sandbox runs; the packet carries the pidfds of its host
    /// processes.
    SandboxRunning {
        /// The runsc sandbox process.
        sandbox: FdIndex,
        /// The runsc gofer process, when one was found.
        gofer: Option<FdIndex>,
        /// The runsc state directory (`--root`).
        runtime_root: HostPath,
        /// The bundle directory.
        bundle: HostPath,
        /// The Escalation Mailbox: a directory on a bounded tmpfs in the
        /// Domain mount namespace that the sandbox sees at
        /// [`crate::mailbox::MAILBOX_AREA`].
        mailbox: FdIndex,
    },
    /// Starting failed; the supervisor exits after sending this.
    Failed(SupervisorError),
    /// A session process started; the packet carries the pidfd of its
    /// `runsc exec`.
    ExecStarted {
        /// The session.
        session_id: SessionId,
        /// The pidfd of `runsc exec`.
        process: FdIndex,
    },
    /// A session process could not start.
    ExecFailed {
        /// The session.
        session_id: SessionId,
        /// What failed and why.
        failure: Failure,
    },
    /// A session process ended.
    ExecExited {
        /// The session.
        session_id: SessionId,
        /// Its exit code; `128 + N` when signal N ended it.
        exit_code: u8,
        /// Whether a signal ended it.
        signaled: bool,
    },
    /// The sandbox is stopped; the supervisor exits after sending this.
    Stopped,
    /// What the Network Sidecar read back from the enforcement namespace,
    /// or why it could not (a failure of the `Network` step).
    NetworkObserved(Result<Box<crate::network::Observed>, SupervisorError>),
}

impl WireRecord for SupervisorReport {
    const NAME: &'static str = "SupervisorReport";
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failure::{Errno, Failure};
    use crate::test_support::round_trip;

    #[test]
    fn failures_round_trip_with_their_cause() {
        let failure = Failure::os("cannot write /x", Errno(28), Some(HostPath::from("/x")));
        round_trip(&SupervisorReport::Failed(SupervisorError {
            step: SupervisorStep::Bundle,
            failure: failure.clone(),
        }));
        round_trip(&SupervisorReport::ExecFailed {
            session_id: SessionId(std::array::from_fn(|i| i as u8)),
            failure,
        });
        round_trip(&SupervisorReport::NetworkObserved(Err(SupervisorError {
            step: SupervisorStep::Network,
            failure: Failure::check("no sidecar"),
        })));
    }
}
