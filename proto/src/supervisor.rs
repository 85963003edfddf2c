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

use crate::codec::WireRecord;
use crate::common::HostPath;
use crate::config::{VolumeAccess, VolumeKind};
use crate::ids::{ContainerId, DomainId, GenerationId};
use crate::ownership::NamespaceIdentity;

/// The index of a descriptor in the packet that carries a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FdIndex(pub u16);

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
    /// A sealed memfd holding the sandbox environment the configuration
    /// resolved, as `NAME=value` entries each ended by a NUL byte. Values
    /// never travel in a message or a file.
    pub environment: FdIndex,
    /// The persistent directories.
    pub anchors: Vec<AnchorMount>,
    /// The volumes.
    pub volumes: Vec<VolumeMount>,
}

/// What the coordinator asks of the supervisor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SupervisorRequest {
    /// Build the namespaces, mounts and bundle, and start the sandbox.
    Start(SandboxPlan),
    /// Stop the sandbox and exit, releasing every mount with the namespace.
    Stop,
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
    /// The request itself was malformed (missing descriptor, bad path).
    Request,
}

/// A failure the supervisor reports before exiting.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SupervisorError {
    /// The step that failed.
    pub step: SupervisorStep,
    /// What failed and why, for the user; never holds secrets.
    pub detail: String,
}

/// What the supervisor reports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SupervisorReport {
    /// The namespaces exist; the packet carries the pidfd of the process
    /// that holds them (the supervisor's pid 1).
    NamespacesReady {
        /// The Domain user namespace.
        user_namespace: NamespaceIdentity,
        /// The enforcement network namespace.
        network_namespace: NamespaceIdentity,
        /// The pidfd of the namespace holder.
        holder: FdIndex,
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
    },
    /// Starting failed; the supervisor exits after sending this.
    Failed(SupervisorError),
    /// The sandbox is stopped; the supervisor exits after sending this.
    Stopped,
}

impl WireRecord for SupervisorReport {
    const NAME: &'static str = "SupervisorReport";
}
