//! Golden vectors: fixed records whose encodings are checked in under
//! `tests/golden/NAME.hex`, one lowercase hex line each.
//!
//! A mismatch means the wire or on-disk format changed: stores written and
//! peers built before the change would no longer read these bytes. If the
//! change is intended, bump the affected version and re-bless with
//! `LAZARET_BLESS_GOLDEN=1 cargo test -p lazaret-proto --test golden`.

use std::fmt::Debug;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;

use lazaret_proto::catalog::{ArtifactState, ImageSourceIdentity, PreparedArtifact};
use lazaret_proto::codec::{self, WireRecord};
use lazaret_proto::common::{HostPath, ProtocolVersion, UnixTimeNs};
use lazaret_proto::ids::{
    CapabilityId, CliId, ConfigurationFingerprint, CredentialId, DomainId, GenerationId,
    GenerationNonce, ManifestDigest, NetworkSidecarId, PreparedArtifactId, RequestId, SessionId,
};
use lazaret_proto::mailbox::{MailboxRecord, MailboxRequest};
use lazaret_proto::network::{
    DeniedDestinationObservation, DerivedNetworkPolicy, DnsObservation, DnsOutcome, IpPrefix,
    NamespaceIdentity, NetworkObservation, NetworkReadinessAttestation,
    NetworkReadinessAttestationSchemaId, PermittedDestinationObservation, PolicyDelivery,
};
use lazaret_proto::ownership::{MountIdentity, ParticipantOwnership, StateAnchorOwnership};
use lazaret_proto::process::{
    BootId, HostProcessIdentity, HostProcessOwnershipSlot, PersistedHostProcessOwnership,
    PidfsProcessAuthorityV1, PidfsProcessIdentityV1, ProcessOwnershipMessageVersion,
    StagedProcessOwnership,
};
use lazaret_proto::store::{
    Generation, GenerationState, Participant, ParticipantRole, ParticipantState,
};
use lazaret_proto::terminal::{
    SessionExit, SessionExitOutcome, SessionTerminalEvent, SessionTerminalMessage, TerminalResize,
};
use lazaret_proto::trust::{GenerationIdentity, SessionBinding};

const DOMAIN: DomainId = DomainId([0xd0; 32]);
const SESSION: SessionId = SessionId([0x5e; 16]);
const T0: UnixTimeNs = UnixTimeNs(1_700_000_000_000_000_000);

fn authority() -> PidfsProcessAuthorityV1 {
    PidfsProcessAuthorityV1 {
        boot_id: BootId([0xb0; 16]),
        pidfs_st_dev: 0x0f,
        pidfs_st_ino: 4242,
    }
}

fn generation() -> Generation {
    Generation {
        domain_id: DOMAIN,
        generation_id: GenerationId(3),
        configuration_fingerprint: ConfigurationFingerprint([0xcf; 32]),
        state: GenerationState::Running,
        host_coordinator: PersistedHostProcessOwnership::Committed(HostProcessIdentity::PidfsV1 {
            authority: authority(),
            identity: PidfsProcessIdentityV1 {
                host_pid: 1000,
                start_time_ticks: 123_456,
            },
        }),
        started_at: T0,
        closed_at: None,
    }
}

fn participant_state_anchor() -> Participant {
    Participant {
        generation_id: GenerationId(3),
        role: ParticipantRole::StateAnchor,
        state: ParticipantState::Active,
        ownership: ParticipantOwnership::StateAnchor(StateAnchorOwnership {
            lower_artifact_id: Some(PreparedArtifactId([0xa1; 16])),
            upper_path: Some(HostPath::from("/s/domains/d0/anchor/root/upper")),
            work_path: Some(HostPath::from("/s/domains/d0/anchor/root/work")),
            sandbox_path: Some("/root".into()),
            mount_path: None,
            mount_identity: Some(MountIdentity {
                mount_id: 0x1_0000_0042,
                device: 0x2b,
                inode: 2,
            }),
        }),
    }
}

fn staged_process_ownership() -> StagedProcessOwnership {
    StagedProcessOwnership {
        version: ProcessOwnershipMessageVersion::V1,
        domain_id: DOMAIN,
        generation_id: GenerationId(3),
        slot: HostProcessOwnershipSlot::SandboxNetworkSidecar,
        authority: authority(),
        identity: PidfsProcessIdentityV1 {
            host_pid: 2001,
            start_time_ticks: 130_000,
        },
    }
}

fn terminal_resize() -> SessionTerminalEvent {
    SessionTerminalEvent::Resize(TerminalResize {
        session_id: SESSION,
        rows: 50,
        columns: 132,
        width_pixels: 0,
        height_pixels: 0,
    })
}

fn session_exit() -> SessionTerminalMessage {
    SessionTerminalMessage::Exit(SessionExit {
        session_id: SESSION,
        outcome: SessionExitOutcome::Terminated,
        exit_code: 130,
    })
}

fn mailbox_request() -> MailboxRecord {
    MailboxRecord::Request(MailboxRequest {
        protocol_version: ProtocolVersion::V1,
        session_binding: SessionBinding {
            generation_identity: GenerationIdentity {
                agent_profile: "default".into(),
                domain_id: DOMAIN,
                generation_id: GenerationId(3),
                configuration_fingerprint: ConfigurationFingerprint([0xcf; 32]),
                generation_nonce: GenerationNonce([0x4e; 16]),
                created_at: T0,
            },
            cli_id: CliId([0xc1; 16]),
            session_id: SESSION,
            credential_id: CredentialId([0xa5; 16]),
        },
        request_id: RequestId([0x7e; 16]),
        capability_id: CapabilityId([0xcc; 16]),
        command_argv: vec!["/usr/bin/gh".into(), "pr".into(), "create".into()],
        issued_at: T0,
        expires_at: UnixTimeNs(T0.0 + 60_000_000_000),
    })
}

fn derived_network_policy() -> DerivedNetworkPolicy {
    DerivedNetworkPolicy::ipv4_only(
        [IpPrefix::ipv4([203, 0, 113, 10], 32).unwrap()],
        [
            IpPrefix::ipv4([10, 0, 0, 0], 8).unwrap(),
            IpPrefix::ipv4([172, 16, 0, 0], 12).unwrap(),
            IpPrefix::ipv4([192, 168, 0, 0], 16).unwrap(),
        ],
        [Ipv4Addr::new(10, 0, 2, 3)],
    )
}

/// Its golden bytes also pin the policy digest, which durable records use
/// to name the policy.
fn network_readiness_attestation() -> NetworkReadinessAttestation {
    let policy = derived_network_policy();
    NetworkReadinessAttestation {
        schema_id: NetworkReadinessAttestationSchemaId,
        domain_id: DOMAIN,
        generation_id: GenerationId(3),
        network_sidecar_id: NetworkSidecarId([0x5d; 16]),
        derived_policy_digest: policy.digest().unwrap(),
        enforcement_namespace: NamespaceIdentity {
            device: 4,
            inode: 4_026_532_100,
        },
        observation: NetworkObservation {
            policy_delivery: PolicyDelivery::SealedMemfd,
            helper_ready: true,
            observed_filter: policy.expected_filter(None),
            observed_routes: policy.prefix_rules,
            ipv6_disabled: true,
        },
        denied_destinations: vec![DeniedDestinationObservation {
            destination: IpAddr::V4(Ipv4Addr::new(192, 168, 1, 1)),
            unreachable: true,
        }],
        permitted_destinations: vec![PermittedDestinationObservation {
            destination: IpAddr::V4(Ipv4Addr::new(203, 0, 113, 10)),
            reachable: true,
        }],
        dns_observations: vec![DnsObservation {
            resolver: IpAddr::V4(Ipv4Addr::new(10, 0, 2, 3)),
            query_name: "example.test".into(),
            resolved_addresses: vec![IpAddr::V4(Ipv4Addr::new(198, 18, 0, 10))],
            outcome: DnsOutcome::Answered { response_code: 0 },
        }],
        observed_at: UnixTimeNs(T0.0 + 5_000_000),
    }
}

fn prepared_artifact() -> PreparedArtifact {
    PreparedArtifact {
        prepared_artifact_id: PreparedArtifactId([0xa1; 16]),
        source_identity: ImageSourceIdentity::Registry {
            reference: "docker.io/library/debian:trixie".into(),
        },
        selected_manifest_digest: ManifestDigest([0x3d; 32]),
        state: ArtifactState::Available,
        artifact_dir: HostPath::from("a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1"),
        unpacked_bytes: 123_456_789,
        prepared_at: T0,
    }
}

fn golden_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("{name}.hex"))
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(text: &str) -> Vec<u8> {
    assert!(text.len() % 2 == 0, "odd number of hex digits");
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("lowercase hex"))
        .collect()
}

fn blessing() -> bool {
    std::env::var_os("LAZARET_BLESS_GOLDEN").is_some_and(|v| v == "1")
}

/// Checks one record against its golden file, or rewrites the file when
/// blessing. Returns a description of the mismatch, if any.
fn check<T: WireRecord + PartialEq + Debug>(name: &str, record: &T) -> Option<String> {
    let bytes = codec::encode(record).expect("golden record encodes");
    let hex = to_hex(&bytes);
    let path = golden_path(name);
    if blessing() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, format!("{hex}\n")).unwrap();
    }
    let stored = match std::fs::read_to_string(&path) {
        Ok(text) => text.trim_end_matches('\n').to_owned(),
        Err(e) => {
            return Some(format!(
                "{name}: cannot read {}: {e}; run with LAZARET_BLESS_GOLDEN=1 to create it",
                path.display()
            ));
        }
    };
    if stored != hex {
        let golden_decodes_as = match codec::decode::<T>(&from_hex(&stored)) {
            Ok(old) => format!("{old:?}"),
            Err(e) => format!("<does not decode: {e}>"),
        };
        return Some(format!(
            "{name} ({}): the wire format changed.\n  golden:  {stored}\n  encoded: {hex}\n  \
             golden decodes as: {golden_decodes_as}\n  record:            {record:?}\n\
             Stores and peers built before this change wrote the golden bytes. If the change \
             is intended, bump the record's version and re-bless with LAZARET_BLESS_GOLDEN=1.",
            T::NAME
        ));
    }
    // The stored bytes must decode back to exactly the record.
    let decoded: T = codec::decode(&from_hex(&stored))
        .unwrap_or_else(|e| panic!("{name}: the golden bytes do not decode: {e}"));
    assert_eq!(
        &decoded, record,
        "{name}: golden bytes decode to another record"
    );
    None
}

#[test]
fn golden_vectors_are_unchanged() {
    let failures: Vec<String> = [
        check("generation", &generation()),
        check("participant_state_anchor", &participant_state_anchor()),
        check("staged_process_ownership", &staged_process_ownership()),
        check("terminal_resize", &terminal_resize()),
        check("session_exit", &session_exit()),
        check("mailbox_request", &mailbox_request()),
        check("derived_network_policy", &derived_network_policy()),
        check(
            "network_readiness_attestation",
            &network_readiness_attestation(),
        ),
        check("prepared_artifact", &prepared_artifact()),
    ]
    .into_iter()
    .flatten()
    .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    // Checked after the vectors, so a bless run never reads a file while
    // it is being rewritten.
    assert_golden_files_are_single_lowercase_hex_lines();
}

fn assert_golden_files_are_single_lowercase_hex_lines() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    for entry in std::fs::read_dir(&dir).expect("golden directory exists") {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let line = text.strip_suffix('\n').unwrap_or(&text);
        assert!(
            !line.is_empty()
                && !line.contains('\n')
                && line.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
            "{} is not one line of lowercase hex",
            path.display()
        );
    }
}
