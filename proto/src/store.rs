//! The Domain Store's records: one redb database per Domain under its
//! Storage Root directory, written only by that Domain's Host Coordinator
//! while it holds the Domain flock.
//!
//! This module owns the row shapes: store metadata, the Domain, its
//! generations, their participants, sessions, session terminals and
//! mailboxes. The schema's `DomainStore` class is the database itself and
//! has no row of its own beyond [`StoreMetadata`]; table definitions live
//! with the store's owner. The records are durable intent: each is written
//! before the effect it describes, so recovery can finish or undo it.
//! Nothing here is trusted on decode beyond its shape; recovery re-proves
//! every identity a row names.

use serde::{Deserialize, Serialize};

use crate::codec::WireRecord;
use crate::common::{HostPath, UnixTimeNs, closed_version, schema_id};
use crate::ids::{CliId, ConfigurationFingerprint, DomainId, GenerationId, SessionId};
use crate::ownership::ParticipantOwnership;
pub use crate::ownership::ParticipantRole;
use crate::process::PersistedHostProcessOwnership;
use crate::terminal::{GuestProcessIdentity, PtyIdentity};

schema_id!(
    /// The Domain Store's schema identifier, `lazaret-domain-store-v1`.
    DomainStoreSchemaId = "lazaret-domain-store-v1"
);

closed_version!(
    /// The Domain Store's schema version. v1 is the only one.
    DomainStoreSchemaVersion {
        /// Schema version 1.
        V1 = 1,
    }
);

/// The metadata row of a Domain Store: which schema the database holds. A
/// store whose metadata does not decode is not opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreMetadata {
    /// Always `lazaret-domain-store-v1`.
    pub schema_id: DomainStoreSchemaId,
    /// Always 1.
    pub schema_version: DomainStoreSchemaVersion,
}

impl StoreMetadata {
    /// The metadata this build writes and reads.
    pub const CURRENT: Self = Self {
        schema_id: DomainStoreSchemaId,
        schema_version: DomainStoreSchemaVersion::V1,
    };
}

impl WireRecord for StoreMetadata {
    const NAME: &'static str = "DomainStoreMetadata";
    const MAX_ENCODED_LEN: usize = 64;
}

/// The Domain a store belongs to: one (profile, canonical workspace) pair.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Domain {
    /// `DomainIdV1` of the pair.
    pub domain_id: DomainId,
    /// The selected profile's name.
    pub profile_name: String,
    /// The canonical Agent Workspace path, as raw bytes.
    pub canonical_workspace: HostPath,
}

impl WireRecord for Domain {
    const NAME: &'static str = "Domain";
    const MAX_ENCODED_LEN: usize = 8 * 1024;
}

/// Where a generation stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum GenerationState {
    /// Recorded; participants are being acquired.
    Starting,
    /// The sandbox runs and sessions are accepted.
    Running,
    /// `down` or recovery is releasing participants.
    Stopping,
    /// Every participant is released; nothing of the generation remains.
    Closed,
}

/// One run of a Domain from `up` to `down` or crash.
///
/// The seed's field list is partial after `configuration_fingerprint`; the
/// state, the Host Coordinator's process slot and the two timestamps are
/// what the design brief implies a generation row holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Generation {
    /// The Domain.
    pub domain_id: DomainId,
    /// The generation's number.
    pub generation_id: GenerationId,
    /// The configuration the generation was started with; joining requires
    /// the same fingerprint.
    pub configuration_fingerprint: ConfigurationFingerprint,
    /// Where the generation stands.
    pub state: GenerationState,
    /// The Host Coordinator process that owns the generation.
    pub host_coordinator: PersistedHostProcessOwnership,
    /// When the generation was recorded.
    pub started_at: UnixTimeNs,
    /// When the generation reached `Closed`.
    pub closed_at: Option<UnixTimeNs>,
}

impl WireRecord for Generation {
    const NAME: &'static str = "Generation";
    const MAX_ENCODED_LEN: usize = 256;
}

/// Where a participant stands between intent and release.
///
/// The seed's variant list is partial after `LeaseHeld`; the rest follow the
/// lifecycle the specification describes (release intent recorded before
/// release, and a record that fails closed is retained).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ParticipantState {
    /// Recorded before the resource is created; it may or may not exist.
    Intent,
    /// The resource's lease or claim is held but it is not yet in use.
    LeaseHeld,
    /// The resource exists and serves the generation.
    Active,
    /// Release was decided and recorded; the resource may still exist.
    ReleaseIntent,
    /// The resource is gone.
    Released,
    /// The resource could not be proven or released; the record stays for
    /// inspection and is never acted on again without proof.
    Retained,
}

/// Anything a generation owns outside its own memory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Participant {
    /// The owning generation.
    pub generation_id: GenerationId,
    /// The kind of resource.
    pub role: ParticipantRole,
    /// Where it stands.
    pub state: ParticipantState,
    /// What is owned.
    pub ownership: ParticipantOwnership,
}

impl Participant {
    /// Whether `role` matches the ownership variant. A row where it does not
    /// is corrupt.
    pub fn is_consistent(&self) -> bool {
        self.role == self.ownership.role()
    }
}

impl WireRecord for Participant {
    const NAME: &'static str = "Participant";
    const MAX_ENCODED_LEN: usize = 64 * 1024;
}

/// One Client Session: one `lazaret attach`.
///
/// The seed's field list is partial after `cli_id`; the open and close times
/// are added.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    /// The generation the session belongs to.
    pub generation_id: GenerationId,
    /// The session.
    pub session_id: SessionId,
    /// The client that opened it.
    pub cli_id: CliId,
    /// When it was opened.
    pub opened_at: UnixTimeNs,
    /// When it ended.
    pub closed_at: Option<UnixTimeNs>,
}

impl WireRecord for Session {
    const NAME: &'static str = "Session";
    const MAX_ENCODED_LEN: usize = 128;
}

/// Where a session terminal stands.
///
/// The seed's variant list is partial after `Running`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SessionTerminalState {
    /// Recorded before the PTY and exec process are created.
    Intent,
    /// The PTY is held and the guest process runs.
    Running,
    /// The guest process ended; its exit is being delivered.
    Exited,
    /// The PTY is released; the terminal is over.
    Closed,
}

/// The PTY and guest process of one session.
///
/// The seed's field list is partial after `state`; the PTY and guest process
/// identities are what the specification checks before acting on a session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionTerminal {
    /// The generation.
    pub generation_id: GenerationId,
    /// The session.
    pub session_id: SessionId,
    /// Where the terminal stands.
    pub state: SessionTerminalState,
    /// The host PTY, once opened.
    pub pty: Option<PtyIdentity>,
    /// The guest process, once started.
    pub guest_process: Option<GuestProcessIdentity>,
}

impl WireRecord for SessionTerminal {
    const NAME: &'static str = "SessionTerminal";
    const MAX_ENCODED_LEN: usize = 256;
}

/// The Escalation Mailbox directories of one session.
///
/// The seed's field list is partial after `inbox_path`; the session and
/// outbox are added (each session has its own mailbox).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mailbox {
    /// The generation.
    pub generation_id: GenerationId,
    /// The session the mailbox serves.
    pub session_id: SessionId,
    /// The file holding the session's sandbox credential bundle.
    pub identity_path: HostPath,
    /// Where the sandbox writes requests, cancellations and acks.
    pub inbox_path: HostPath,
    /// Where the host writes decisions, result chunks and results.
    pub outbox_path: HostPath,
}

impl WireRecord for Mailbox {
    const NAME: &'static str = "Mailbox";
    const MAX_ENCODED_LEN: usize = 16 * 1024;
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::codec;
    use crate::ids::{ContainerId, PreparedArtifactId, Sha256Digest};
    use crate::ownership::*;
    use crate::process::tests::pidfs_identity;
    use crate::test_support::{
        assert_rejects_bad_envelopes, assert_rejects_unknown_discriminant, round_trip,
    };

    fn path(text: &str) -> Option<HostPath> {
        Some(HostPath::from(text))
    }

    pub(crate) fn every_ownership() -> Vec<ParticipantOwnership> {
        let mount = MountIdentity {
            mount_id: 77,
            device: 0x2b,
            inode: 2,
        };
        vec![
            ParticipantOwnership::PreparedLower(PreparedLowerOwnership {
                prepared_artifact_id: Some(PreparedArtifactId([9; 16])),
                source_identity: None,
                lease_state: Some(LeasePhase::Held),
                selected_manifest_digest: None,
                rootfs_path: path("/s/catalog/a/rootfs"),
            }),
            ParticipantOwnership::StateAnchor(StateAnchorOwnership {
                lower_artifact_id: Some(PreparedArtifactId([9; 16])),
                upper_path: path("/s/domains/x/upper/root"),
                work_path: path("/s/domains/x/work/root"),
                sandbox_path: Some("/root".into()),
                mount_path: None,
                mount_identity: Some(mount),
            }),
            ParticipantOwnership::GitRouting(GitRoutingOwnership {
                mountpoint: path("/r/ws"),
                host_root: Some(HostPath(b"/home/dev/\xffproj".to_vec())),
                isolated_root: None,
                mount_identity: Some(mount),
                routing_digest: Some(Sha256Digest([4; 32])),
                router: PersistedHostProcessOwnership::Committed(pidfs_identity()),
            }),
            ParticipantOwnership::Network(NetworkOwnership::default()),
            ParticipantOwnership::Helper(HelperOwnership {
                network_sidecar_id: None,
                connectivity_helper: PersistedHostProcessOwnership::Staged(pidfs_identity()),
                runtime_supervisor: PersistedHostProcessOwnership::Unassigned,
            }),
            ParticipantOwnership::Sandbox(SandboxOwnership {
                container_id: Some(ContainerId([0xc0; 16])),
                runtime_root: path("/r/runsc"),
                bundle_digest: None,
                bundle_path: path("/r/bundle"),
                container_process: PersistedHostProcessOwnership::Committed(pidfs_identity()),
                user_namespace: Some(NamespaceIdentity {
                    device: 4,
                    inode: 4026531837,
                }),
            }),
            ParticipantOwnership::Publication(PublicationOwnership::default()),
        ]
    }

    #[test]
    fn metadata_and_domain_round_trip() {
        let metadata = StoreMetadata::CURRENT;
        let bytes = round_trip(&metadata);
        assert_eq!(bytes.len(), 1 + 1 + "lazaret-domain-store-v1".len() + 1);
        assert_rejects_bad_envelopes(&metadata);
        // The catalog's metadata is not the store's.
        let catalog = codec::encode(&crate::catalog::StoreMetadata::CURRENT).unwrap();
        assert!(codec::decode::<StoreMetadata>(&catalog).is_err());

        let domain = Domain {
            domain_id: DomainId([7; 32]),
            profile_name: "default".into(),
            canonical_workspace: HostPath(b"/home/dev/\xfe".to_vec()),
        };
        round_trip(&domain);
        assert_rejects_bad_envelopes(&domain);
    }

    #[test]
    fn generation_round_trips_and_refuses_unknown_state() {
        let generation = Generation {
            domain_id: DomainId([7; 32]),
            generation_id: GenerationId(2),
            configuration_fingerprint: ConfigurationFingerprint([8; 32]),
            state: GenerationState::Running,
            host_coordinator: PersistedHostProcessOwnership::Committed(pidfs_identity()),
            started_at: UnixTimeNs(1_700_000_000_000_000_000),
            closed_at: None,
        };
        let bytes = round_trip(&generation);
        assert_rejects_bad_envelopes(&generation);
        // version, 32 domain bytes, generation varint, 32 fingerprint bytes,
        // then the state discriminant.
        assert_eq!(bytes[66], 1);
        assert_rejects_unknown_discriminant::<Generation>(bytes, 66);
    }

    #[test]
    fn participants_round_trip_for_every_ownership() {
        for ownership in every_ownership() {
            let participant = Participant {
                generation_id: GenerationId(1),
                role: ownership.role(),
                state: ParticipantState::Intent,
                ownership,
            };
            assert!(participant.is_consistent());
            round_trip(&participant);
        }
        let mismatched = Participant {
            generation_id: GenerationId(1),
            role: ParticipantRole::Network,
            state: ParticipantState::Retained,
            ownership: ParticipantOwnership::Publication(PublicationOwnership::default()),
        };
        assert!(!mismatched.is_consistent());
        let bytes = round_trip(&mismatched);
        assert_rejects_bad_envelopes(&mismatched);
        // version, generation varint, role, state, ownership variant.
        assert_rejects_unknown_discriminant::<Participant>(bytes.clone(), 2);
        assert_rejects_unknown_discriminant::<Participant>(bytes.clone(), 3);
        assert_rejects_unknown_discriminant::<Participant>(bytes, 4);
    }

    #[test]
    fn sessions_terminals_and_mailboxes_round_trip() {
        let session = Session {
            generation_id: GenerationId(1),
            session_id: SessionId([1; 16]),
            cli_id: CliId([2; 16]),
            opened_at: UnixTimeNs(5),
            closed_at: Some(UnixTimeNs(6)),
        };
        round_trip(&session);
        assert_rejects_bad_envelopes(&session);

        let terminal = SessionTerminal {
            generation_id: GenerationId(1),
            session_id: SessionId([1; 16]),
            state: SessionTerminalState::Running,
            pty: Some(PtyIdentity {
                master_fd: 12,
                device: 0x8803,
                inode: 6,
            }),
            guest_process: Some(GuestProcessIdentity {
                container_id: ContainerId([3; 16]),
                leader_pid: 1,
                leader_start_time: 0,
                process_group_id: 1,
            }),
        };
        round_trip(&terminal);
        assert_rejects_bad_envelopes(&terminal);

        let mailbox = Mailbox {
            generation_id: GenerationId(1),
            session_id: SessionId([1; 16]),
            identity_path: HostPath::from("/r/mailbox/s/identity"),
            inbox_path: HostPath::from("/r/mailbox/s/in"),
            outbox_path: HostPath::from("/r/mailbox/s/out"),
        };
        round_trip(&mailbox);
        assert_rejects_bad_envelopes(&mailbox);
    }
}
