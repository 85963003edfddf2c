//! What a Participant owns outside the Host Coordinator's memory: the
//! physical facts recovery needs to find, prove and release each resource
//! a generation created.
//!
//! Each ownership record is written before its resource exists, so almost
//! every field is optional: a field is filled in as the fact becomes known,
//! and an absent field means the step that would have produced it has not
//! been recorded. This module owns the shapes only. It trusts nothing it
//! decodes: recovery re-proves every identity here against the live system
//! before acting on it.

use serde::{Deserialize, Serialize};

use crate::catalog::ImageSourceIdentity;
use crate::common::HostPath;
use crate::ids::{ContainerId, ManifestDigest, NetworkSidecarId, PreparedArtifactId, Sha256Digest};
use crate::network::NetworkReadinessEvidence;
use crate::process::PersistedHostProcessOwnership;

pub use crate::ids::NamespaceIdentity;

/// A mount as the kernel names it: its mount ID and the device and inode of
/// its root.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MountIdentity {
    /// The unique mount ID (`statx` `STATX_MNT_ID_UNIQUE` where available).
    pub mount_id: u64,
    /// `st_dev` of the mount's root.
    pub device: u64,
    /// `st_ino` of the mount's root.
    pub inode: u64,
}

/// Where a generation's lease on a prepared artifact stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LeasePhase {
    /// The lease is about to be written to the Storage Catalog.
    Requested,
    /// The Storage Catalog holds the lease.
    Held,
    /// The lease is being removed from the Storage Catalog.
    Releasing,
}

/// The generation's lease on the prepared lower (the unpacked base image).
///
/// The seed's field list is partial after `lease_state`; the manifest digest
/// and root directory are what recovery needs to match the catalog row.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedLowerOwnership {
    /// The Storage Catalog artifact leased.
    pub prepared_artifact_id: Option<PreparedArtifactId>,
    /// The image source the artifact was prepared from.
    pub source_identity: Option<ImageSourceIdentity>,
    /// Where the lease stands; absent before any lease phase began.
    pub lease_state: Option<LeasePhase>,
    /// The manifest the artifact was unpacked from.
    pub selected_manifest_digest: Option<ManifestDigest>,
    /// The artifact's root filesystem directory.
    pub rootfs_path: Option<HostPath>,
}

/// One State Anchor overlay: the prepared lower's directory joined with the
/// Domain's upper for one `persistent_dirs` entry.
///
/// The seed's field list is partial after `work_path`; the sandbox path,
/// mount point and mount identity are what recovery needs to find and
/// unmount the overlay.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateAnchorOwnership {
    /// The prepared artifact providing the lower.
    pub lower_artifact_id: Option<PreparedArtifactId>,
    /// The Domain-owned upper directory.
    pub upper_path: Option<HostPath>,
    /// The overlay work directory beside the upper.
    pub work_path: Option<HostPath>,
    /// The `persistent_dirs` entry this overlay serves, as a sandbox path.
    pub sandbox_path: Option<String>,
    /// Where the overlay is mounted in the supervisor's mount namespace.
    pub mount_path: Option<HostPath>,
    /// The overlay mount, once made.
    pub mount_identity: Option<MountIdentity>,
}

/// The workspace routing that sends git-ignored paths to Domain-scoped
/// storage and keeps the host Git configuration and hooks read-only.
///
/// The seed's field list is partial after `isolated_root`; the mount
/// identity, the digest of the rules and the router process are added so
/// recovery can prove what it finds and stop the router.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GitRoutingOwnership {
    /// Where the routed workspace is mounted.
    pub mountpoint: Option<HostPath>,
    /// The canonical Agent Workspace on the host.
    pub host_root: Option<HostPath>,
    /// The Domain-scoped directory receiving git-ignored paths.
    pub isolated_root: Option<HostPath>,
    /// The routed workspace mount, once made.
    pub mount_identity: Option<MountIdentity>,
    /// SHA-256 of the encoded [`WorkspaceRules`](crate::router::WorkspaceRules)
    /// the router was given.
    pub routing_digest: Option<Sha256Digest>,
    /// The Workspace Router process, which serves the mount.
    pub router: PersistedHostProcessOwnership,
}

/// The generation's enforcement network namespace and its attested policy.
///
/// The seed's field list is partial after `readiness_evidence`; the two
/// namespaces are what recovery needs to find and prove the network.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkOwnership {
    /// Digest of the [`DerivedNetworkPolicy`](crate::network::DerivedNetworkPolicy)
    /// delivered to the sidecar.
    pub derived_policy_digest: Option<Sha256Digest>,
    /// Digest of the [`NetworkReadinessIdentity`](crate::network::NetworkReadinessIdentity)
    /// that was attested.
    pub readiness_fingerprint: Option<Sha256Digest>,
    /// What the sidecar's attestation established.
    pub readiness_evidence: Option<NetworkReadinessEvidence>,
    /// The enforcement network namespace.
    pub enforcement_namespace: Option<NamespaceIdentity>,
    /// The Domain user namespace that owns it.
    pub owning_user_namespace: Option<NamespaceIdentity>,
}

/// Lazaret's resolver, for a policy with names: a participant of its own
/// (a variant added after the seed's), so rows written before it existed
/// still decode. It lives in the Domain pid namespace and ends with it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResolverOwnership {
    /// Digest of the [`NamedEgress`](crate::network::NamedEgress) it
    /// serves.
    pub names_digest: Option<Sha256Digest>,
    /// The resolver process.
    pub process: PersistedHostProcessOwnership,
}

/// The Credential Proxy of a generation whose profile has credentials.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CredentialProxyOwnership {
    /// The hosts it serves, sorted.
    pub hosts: Vec<String>,
    /// The proxy process.
    pub process: PersistedHostProcessOwnership,
}

/// The generation's helper processes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HelperOwnership {
    /// The Network Sidecar instance, once started.
    pub network_sidecar_id: Option<NetworkSidecarId>,
    /// The `slirp4netns` process.
    pub connectivity_helper: PersistedHostProcessOwnership,
    /// The Runtime Supervisor process.
    pub runtime_supervisor: PersistedHostProcessOwnership,
}

/// The gVisor container of the generation.
///
/// The seed's field list is partial after `bundle_digest`; the bundle path,
/// the sandbox process and the user namespace are what recovery needs to
/// stop and delete the container.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxOwnership {
    /// The container's ID as given to `runsc`.
    pub container_id: Option<ContainerId>,
    /// The `runsc --root` state directory.
    pub runtime_root: Option<HostPath>,
    /// SHA-256 of the OCI bundle's `config.json`.
    pub bundle_digest: Option<Sha256Digest>,
    /// The OCI bundle directory.
    pub bundle_path: Option<HostPath>,
    /// The gVisor sandbox process.
    pub container_process: PersistedHostProcessOwnership,
    /// The Domain user namespace the container runs in.
    pub user_namespace: Option<NamespaceIdentity>,
}

/// The published Session Coordinator endpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublicationOwnership {
    /// The Session Coordinator socket.
    pub socket_path: Option<HostPath>,
    /// The file holding the published
    /// [`ProtocolPublicationIdentity`](crate::trust::ProtocolPublicationIdentity).
    pub identity_path: Option<HostPath>,
}

/// The kind of resource a participant is; it matches its ownership variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ParticipantRole {
    /// The prepared-lower lease.
    PreparedLower,
    /// One State Anchor overlay.
    StateAnchor,
    /// The workspace git routing.
    GitRouting,
    /// The enforcement network.
    Network,
    /// The helper processes.
    Helper,
    /// The gVisor container.
    Sandbox,
    /// The published endpoint.
    Publication,
    /// Lazaret's resolver.
    Resolver,
    /// The Credential Proxy.
    CredentialProxy,
}

/// What one Participant owns; the variant is the kind of resource.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ParticipantOwnership {
    /// The prepared-lower lease.
    PreparedLower(PreparedLowerOwnership),
    /// One State Anchor overlay.
    StateAnchor(StateAnchorOwnership),
    /// The workspace git routing.
    GitRouting(GitRoutingOwnership),
    /// The enforcement network.
    Network(NetworkOwnership),
    /// The helper processes.
    Helper(HelperOwnership),
    /// The gVisor container.
    Sandbox(SandboxOwnership),
    /// The published endpoint.
    Publication(PublicationOwnership),
    /// Lazaret's resolver.
    Resolver(ResolverOwnership),
    /// The Credential Proxy.
    CredentialProxy(CredentialProxyOwnership),
}

impl ParticipantOwnership {
    /// The participant role this ownership belongs to.
    pub fn role(&self) -> ParticipantRole {
        match self {
            Self::PreparedLower(_) => ParticipantRole::PreparedLower,
            Self::StateAnchor(_) => ParticipantRole::StateAnchor,
            Self::GitRouting(_) => ParticipantRole::GitRouting,
            Self::Network(_) => ParticipantRole::Network,
            Self::Helper(_) => ParticipantRole::Helper,
            Self::Sandbox(_) => ParticipantRole::Sandbox,
            Self::Publication(_) => ParticipantRole::Publication,
            Self::Resolver(_) => ParticipantRole::Resolver,
            Self::CredentialProxy(_) => ParticipantRole::CredentialProxy,
        }
    }
}
