//! Durable host process identity and the staged ownership handshake.
//!
//! This module owns how a host process is named on disk and on a channel:
//! by its pidfs inode under a boot (`PidfsV1`), which may be acted on once it
//! is re-proven against a live pidfd, or by pid and start time
//! (`LegacyUnverifiedV1`), which is for display and for refusing only. It
//! also owns the two messages that move a process slot from Unassigned
//! through Staged to Committed.
//!
//! It trusts nothing it decodes. A recorded identity is a claim, not a
//! handle: whoever signals must first open a pidfd and prove the claim.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::codec::WireRecord;
use crate::common::closed_version;
use crate::ids::{DomainId, GenerationId};

/// The kernel boot a pidfs identity belongs to, as the 16 bytes of
/// `/proc/sys/kernel/random/boot_id`. An identity from another boot names
/// no living process.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct BootId(pub [u8; 16]);

impl BootId {
    /// Parses the kernel's text form, a lowercase UUID such as
    /// `0f6c1d1e-8c1b-4f3e-9a7d-2b1c3d4e5f60` with an optional trailing
    /// newline.
    pub fn parse_kernel_text(text: &str) -> Option<Self> {
        let text = text.strip_suffix('\n').unwrap_or(text);
        let bytes = text.as_bytes();
        if bytes.len() != 36 || [8, 13, 18, 23].iter().any(|&i| bytes[i] != b'-') {
            return None;
        }
        let digits: String = text.chars().filter(|&c| c != '-').collect();
        crate::ids::parse_hex::<16>(&digits).map(Self)
    }
}

impl fmt::Debug for BootId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BootId({})", crate::ids::to_hex(&self.0))
    }
}

/// The authority a pidfs identity is valid under: the boot, and the device
/// and inode of the process's pidfd on pidfs. Two pidfds of one process
/// share the inode; no other process of that boot has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PidfsProcessAuthorityV1 {
    /// The boot the process ran in.
    pub boot_id: BootId,
    /// `st_dev` of the pidfd.
    pub pidfs_st_dev: u64,
    /// `st_ino` of the pidfd.
    pub pidfs_st_ino: u64,
}

/// The pid and start time of a process named under a
/// [`PidfsProcessAuthorityV1`], kept to cross-check a re-opened pidfd and
/// for display.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PidfsProcessIdentityV1 {
    /// The pid in the host's pid namespace.
    pub host_pid: u32,
    /// Field 22 (`starttime`) of `/proc/<pid>/stat`, in clock ticks since
    /// boot.
    pub start_time_ticks: u64,
}

/// A process known only by pid and start time. It cannot be proven against
/// a pidfd, so it is shown and used to refuse, never signalled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LegacyUnverifiedProcessIdentityV1 {
    /// The pid in the host's pid namespace.
    pub host_pid: u32,
    /// Field 22 (`starttime`) of `/proc/<pid>/stat`, in clock ticks since
    /// boot.
    pub start_time_ticks: u64,
}

/// How a host process is named in a durable record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum HostProcessIdentity {
    /// Named by its pidfs inode; may be acted on after re-proof.
    PidfsV1 {
        /// The boot and pidfs inode.
        authority: PidfsProcessAuthorityV1,
        /// The pid and start time seen when the pidfd was opened.
        identity: PidfsProcessIdentityV1,
    },
    /// Named by pid and start time only; never acted on.
    LegacyUnverifiedV1(LegacyUnverifiedProcessIdentityV1),
}

impl HostProcessIdentity {
    /// Whether this identity may ever justify a signal (after re-proof).
    pub fn is_actionable(&self) -> bool {
        matches!(self, Self::PidfsV1 { .. })
    }
}

/// The durable state of one process slot. Moves only forward: Unassigned,
/// then Staged once the spawner reports the child, then Committed once the
/// Host Coordinator has recorded it and acknowledged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PersistedHostProcessOwnership {
    /// No process has been reported for the slot.
    #[default]
    Unassigned,
    /// A process was reported and recorded, but the commit was not yet
    /// acknowledged; recovery must prove and stop it.
    Staged(HostProcessIdentity),
    /// The process is owned by the generation.
    Committed(HostProcessIdentity),
}

impl WireRecord for PersistedHostProcessOwnership {
    const NAME: &'static str = "PersistedHostProcessOwnership";
    const MAX_ENCODED_LEN: usize = 128;
}

/// Which process of a generation a slot holds.
///
/// The seed's variant list is partial: it shows the first two variants.
/// The rest are the long-lived host processes the design brief names for a
/// generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum HostProcessOwnershipSlot {
    /// The Host Coordinator daemon of the generation.
    SandboxHostCoordinator,
    /// The Runtime Supervisor that holds the Domain namespaces.
    SandboxRuntimeSupervisor,
    /// The Network Sidecar that installs and attests the network policy.
    SandboxNetworkSidecar,
    /// `slirp4netns`, the only way out of the enforcement namespace.
    SandboxConnectivityHelper,
    /// The gVisor sandbox process started by `runsc run -detach`.
    SandboxContainer,
    /// The gVisor gofer process serving the sandbox's filesystems.
    SandboxGofer,
}

closed_version!(
    /// The version of the process-ownership messages. v1 is the only one.
    ProcessOwnershipMessageVersion {
        /// Message version 1.
        V1 = 1,
    }
);

/// The spawner's report that a child now occupies a slot: sent to the Host
/// Coordinator, which records it as Staged before anything else happens.
///
/// The seed's field list is partial after `generation_id`; the slot and the
/// pidfs identity are what the handshake exists to carry. Only a pidfs
/// identity can be staged: a process that cannot be proven is not owned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StagedProcessOwnership {
    /// Message version.
    pub version: ProcessOwnershipMessageVersion,
    /// The Domain the process belongs to.
    pub domain_id: DomainId,
    /// The generation the process belongs to.
    pub generation_id: GenerationId,
    /// The slot it occupies.
    pub slot: HostProcessOwnershipSlot,
    /// The boot and pidfs inode of the child.
    pub authority: PidfsProcessAuthorityV1,
    /// The child's pid and start time.
    pub identity: PidfsProcessIdentityV1,
}

impl StagedProcessOwnership {
    /// The identity as it is persisted for the slot.
    pub fn host_identity(&self) -> HostProcessIdentity {
        HostProcessIdentity::PidfsV1 {
            authority: self.authority,
            identity: self.identity,
        }
    }
}

impl WireRecord for StagedProcessOwnership {
    const NAME: &'static str = "StagedProcessOwnership";
    const MAX_ENCODED_LEN: usize = 160;
}

/// The Host Coordinator's answer to a [`StagedProcessOwnership`]: whether
/// the slot is now durably Committed. On `false` the spawner stops the child
/// through its pidfd.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ProcessOwnershipCommitAck {
    /// Message version.
    pub version: ProcessOwnershipMessageVersion,
    /// Whether the ownership was committed.
    pub committed: bool,
}

impl WireRecord for ProcessOwnershipCommitAck {
    const NAME: &'static str = "ProcessOwnershipCommitAck";
    const MAX_ENCODED_LEN: usize = 8;
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::test_support::{assert_rejects_bad_envelopes, round_trip};

    pub(crate) fn authority() -> PidfsProcessAuthorityV1 {
        PidfsProcessAuthorityV1 {
            boot_id: BootId([0xb0; 16]),
            pidfs_st_dev: 0x0f,
            pidfs_st_ino: 4242,
        }
    }

    pub(crate) fn pidfs_identity() -> HostProcessIdentity {
        HostProcessIdentity::PidfsV1 {
            authority: authority(),
            identity: PidfsProcessIdentityV1 {
                host_pid: 1234,
                start_time_ticks: 98_765,
            },
        }
    }

    #[test]
    fn records_round_trip() {
        let staged = StagedProcessOwnership {
            version: ProcessOwnershipMessageVersion::V1,
            domain_id: DomainId([1; 32]),
            generation_id: GenerationId(3),
            slot: HostProcessOwnershipSlot::SandboxConnectivityHelper,
            authority: authority(),
            identity: PidfsProcessIdentityV1 {
                host_pid: 77,
                start_time_ticks: 5,
            },
        };
        round_trip(&staged);
        assert_rejects_bad_envelopes(&staged);
        assert!(staged.host_identity().is_actionable());
        for ack in [true, false] {
            round_trip(&ProcessOwnershipCommitAck {
                version: ProcessOwnershipMessageVersion::V1,
                committed: ack,
            });
        }
        round_trip(&PersistedHostProcessOwnership::Unassigned);
        round_trip(&PersistedHostProcessOwnership::Staged(pidfs_identity()));
        let legacy = HostProcessIdentity::LegacyUnverifiedV1(LegacyUnverifiedProcessIdentityV1 {
            host_pid: 9,
            start_time_ticks: 10,
        });
        assert!(!legacy.is_actionable());
        round_trip(&PersistedHostProcessOwnership::Committed(legacy));
    }

    #[test]
    fn ack_refuses_an_unknown_message_version() {
        let mut bytes = crate::codec::encode(&ProcessOwnershipCommitAck {
            version: ProcessOwnershipMessageVersion::V1,
            committed: true,
        })
        .unwrap();
        assert_eq!(bytes, [1, 1, 1]);
        bytes[1] = 2;
        assert!(matches!(
            crate::codec::decode::<ProcessOwnershipCommitAck>(&bytes),
            Err(crate::codec::DecodeError::Malformed { .. })
        ));
        // A boolean other than 0 or 1 is malformed too.
        assert!(crate::codec::decode::<ProcessOwnershipCommitAck>(&[1, 1, 2]).is_err());
    }

    #[test]
    fn boot_id_parses_the_kernel_text() {
        let id = BootId::parse_kernel_text("0f6c1d1e-8c1b-4f3e-9a7d-2b1c3d4e5f60\n").unwrap();
        assert_eq!(id.0[0], 0x0f);
        assert_eq!(id.0[15], 0x60);
        assert!(BootId::parse_kernel_text("0f6c1d1e8c1b4f3e9a7d2b1c3d4e5f60").is_none());
        assert!(BootId::parse_kernel_text("0F6C1D1E-8C1B-4F3E-9A7D-2B1C3D4E5F60").is_none());
    }
}
