//! Fuzz target of the wire codec ([`lazaret_proto::codec::decode`]), the
//! envelope every channel, mailbox file, session frame and store record is
//! read through, for every record type that has one.
//!
//! `fuzz_codec`: the first input byte picks the record type; the rest is
//! decoded as it. A refusal must be the rule the bytes broke (oversize,
//! empty, version, body, trailing bytes), never a panic; an accepted record
//! must encode again, no longer than it came, to bytes that decode to the
//! same record and encode to the same bytes (one canonical encoding).
//!
//! Seeds (`tests/__fuzz__/codec/corpus/`, see `build-support/fuzz_input.rs`
//! for the input format): the golden vectors and a few more records;
//! rewrite them with
//! `cargo test -p lazaret-proto --test fuzz -- --ignored write_seed_corpus`.
//!
//! The default run (`cargo test`) replays the seeds and then tries random
//! inputs for one second; a long run:
//! `BOLERO_RANDOM_TEST_TIME_MS=600000 cargo test --release -p lazaret-proto --test fuzz fuzz_ -- --test-threads=1`.
//! A failure prints `BOLERO_RANDOM_SEED=…`, which replays it.

#[allow(dead_code)]
#[path = "../../build-support/fuzz_input.rs"]
mod fuzz_input;

use lazaret_proto::catalog::{ArtifactLease, PrepareOperation, PreparedArtifact};
use lazaret_proto::codec::{self, DecodeError, MAX_RECORD_LEN, WireRecord};
use lazaret_proto::control::{ControlRequest, ControlResponse, StartupEvent, StartupReply};
use lazaret_proto::credproxy::{Looked, Lookup, ProxyCredentials, ProxyReport, ProxyRequest};
use lazaret_proto::mailbox::{MailboxRecord, SignedProtocolRecord};
use lazaret_proto::network::{
    DerivedNetworkPolicy, NamedEgress, NetworkReachabilityProbe, NetworkReadinessAttestation,
    NetworkReadinessIdentity,
};
use lazaret_proto::process::{
    PersistedHostProcessOwnership, ProcessOwnershipCommitAck, StagedProcessOwnership,
};
use lazaret_proto::resolver::{ResolverReport, ResolverRequest};
use lazaret_proto::router::{RouterReport, RouterRequest, WorkspaceRules};
use lazaret_proto::session::{OpenSession, SessionOpened};
use lazaret_proto::sidecar::{SidecarReport, SidecarRequest};
use lazaret_proto::store::{Domain, Generation, Mailbox, Participant, Session, SessionTerminal};
use lazaret_proto::supervisor::{SupervisorReport, SupervisorRequest};
use lazaret_proto::terminal::{SessionTerminalEvent, SessionTerminalMessage};
use lazaret_proto::trust::{
    ClientTrustBundle, ProtocolCredential, ProtocolPublicationIdentity, SandboxCredentialBundle,
    SessionRequestCapability, TlsCredential, TrustManifest,
};

const CODEC: &str = "codec";

/// A record type's name, and the check of bytes decoded as it (whether
/// they were accepted).
type Record = (&'static str, fn(&[u8]) -> bool);

/// Every record type.
const RECORDS: &[Record] = &[
    record::<MailboxRecord>(),
    record::<SignedProtocolRecord>(),
    record::<SandboxCredentialBundle>(),
    record::<SessionRequestCapability>(),
    record::<OpenSession>(),
    record::<SessionOpened>(),
    record::<SessionTerminalEvent>(),
    record::<SessionTerminalMessage>(),
    record::<SupervisorRequest>(),
    record::<SupervisorReport>(),
    record::<RouterRequest>(),
    record::<RouterReport>(),
    record::<WorkspaceRules>(),
    record::<ResolverRequest>(),
    record::<ResolverReport>(),
    record::<SidecarRequest>(),
    record::<SidecarReport>(),
    record::<ProxyRequest>(),
    record::<ProxyReport>(),
    record::<ProxyCredentials>(),
    record::<Lookup>(),
    record::<Looked>(),
    record::<ControlRequest>(),
    record::<ControlResponse>(),
    record::<StartupEvent>(),
    record::<StartupReply>(),
    record::<NamedEgress>(),
    record::<DerivedNetworkPolicy>(),
    record::<NetworkReachabilityProbe>(),
    record::<NetworkReadinessIdentity>(),
    record::<NetworkReadinessAttestation>(),
    record::<PersistedHostProcessOwnership>(),
    record::<StagedProcessOwnership>(),
    record::<ProcessOwnershipCommitAck>(),
    record::<PreparedArtifact>(),
    record::<ArtifactLease>(),
    record::<PrepareOperation>(),
    record::<Domain>(),
    record::<Generation>(),
    record::<Participant>(),
    record::<Session>(),
    record::<SessionTerminal>(),
    record::<Mailbox>(),
    record::<TrustManifest>(),
    record::<ClientTrustBundle>(),
    record::<TlsCredential>(),
    record::<ProtocolPublicationIdentity>(),
    record::<ProtocolCredential>(),
];

const fn record<T: WireRecord>() -> Record {
    (T::NAME, check::<T>)
}

/// The properties of decoding `bytes` as a `T`; whether it was accepted.
fn check<T: WireRecord>(bytes: &[u8]) -> bool {
    let max = T::MAX_ENCODED_LEN.min(MAX_RECORD_LEN);
    let decoded = codec::decode::<T>(bytes);
    match &decoded {
        Ok(record) => {
            let canonical = codec::encode(record).expect("an accepted record encodes again");
            assert!(
                canonical.len() <= bytes.len(),
                "{}: grew from {} to {} bytes when encoded again",
                T::NAME,
                bytes.len(),
                canonical.len()
            );
            let again = codec::decode::<T>(&canonical).expect("its encoding decodes");
            assert_eq!(
                codec::encode(&again).expect("encodes"),
                canonical,
                "{}: decode and encode are not inverse",
                T::NAME
            );
        }
        Err(DecodeError::Oversize { len, max: m, .. }) => {
            assert!(*len == bytes.len() && *m == max && *len > max);
        }
        Err(DecodeError::Empty { .. }) => assert!(bytes.is_empty()),
        Err(DecodeError::UnknownVersion {
            found, expected, ..
        }) => {
            assert!(bytes.len() <= max && bytes[0] == *found && found != expected);
        }
        Err(DecodeError::Malformed { .. }) => {
            assert!(bytes.len() <= max && bytes[0] == T::VERSION);
        }
        Err(DecodeError::TrailingBytes { count, .. }) => {
            assert!(bytes.len() <= max && bytes[0] == T::VERSION);
            assert!(*count > 0 && *count < bytes.len());
        }
    }
    match decoded {
        Ok(_) => true,
        Err(e) => {
            assert!(e.to_string().starts_with(T::NAME));
            false
        }
    }
}

#[test]
fn fuzz_codec() {
    let seeds = fuzz_input::seeds(env!("CARGO_MANIFEST_DIR"), CODEC);
    let tally = fuzz_input::Tally::new(CODEC);
    bolero::check!(name = CODEC).for_each(|data: &[u8]| {
        let input = fuzz_input::input(data, &seeds);
        let Some((&pick, bytes)) = input.split_first() else {
            return;
        };
        tally.count((RECORDS[usize::from(pick) % RECORDS.len()].1)(bytes));
    });
}

/// The first byte of a seed of record `name`.
fn pick(name: &str) -> u8 {
    let index = RECORDS
        .iter()
        .position(|(n, _)| *n == name)
        .expect("a record type");
    u8::try_from(index).expect("fewer than 256 record types")
}

/// Writes the seed corpus: the golden vectors, and a few records made here.
#[test]
#[ignore = "writes the checked-in seed corpus"]
fn write_seed_corpus() {
    use lazaret_proto::common::ProtocolVersion;
    use lazaret_proto::ids::{RequestId, SessionId};
    use lazaret_proto::mailbox::{
        EscalationOutcome, MailboxCancellation, MailboxResult, MailboxResultChunk, ResultStream,
    };
    use lazaret_proto::terminal::{TerminalInput, TerminalSignal, TerminalSignalKind};
    use lazaret_proto::trust::ProtocolSigningKey;

    let dir = env!("CARGO_MANIFEST_DIR");
    let seed = |file: &str, name: &str, bytes: &[u8]| {
        let mut input = vec![pick(name)];
        input.extend_from_slice(bytes);
        assert!((RECORDS[usize::from(input[0])].1)(bytes), "{file} decodes");
        fuzz_input::write_seed(dir, CODEC, file, &input);
    };
    let golden = [
        ("generation", Generation::NAME),
        ("participant_state_anchor", Participant::NAME),
        ("staged_process_ownership", StagedProcessOwnership::NAME),
        ("terminal_resize", SessionTerminalEvent::NAME),
        ("session_exit", SessionTerminalMessage::NAME),
        ("mailbox_request", MailboxRecord::NAME),
        ("derived_network_policy", DerivedNetworkPolicy::NAME),
        (
            "network_readiness_attestation",
            NetworkReadinessAttestation::NAME,
        ),
        ("prepared_artifact", PreparedArtifact::NAME),
    ];
    let mut mailbox_request = Vec::new();
    for (file, name) in golden {
        let hex = std::fs::read_to_string(format!("{dir}/tests/golden/{file}.hex")).unwrap();
        let hex = hex.trim();
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        if file == "mailbox_request" {
            mailbox_request = bytes.clone();
        }
        seed(&format!("golden-{file}"), name, &bytes);
    }

    // The golden request, signed, as a mailbox file holds it.
    let key = ProtocolSigningKey([7; 32]);
    let signed = lazaret_proto::signing::seal_payload(&key, mailbox_request.clone()).unwrap();
    seed("signed-request", SignedProtocolRecord::NAME, &signed);
    let MailboxRecord::Request(request) = codec::decode(&mailbox_request).unwrap() else {
        panic!("the golden request");
    };
    let binding = request.session_binding;
    let others = [
        MailboxRecord::Cancellation(MailboxCancellation {
            protocol_version: ProtocolVersion::V1,
            session_binding: binding.clone(),
            request_id: RequestId([0x7e; 16]),
            capability_id: request.capability_id,
            issued_at: request.issued_at,
        }),
        MailboxRecord::ResultChunk(MailboxResultChunk {
            protocol_version: ProtocolVersion::V1,
            session_binding: binding.clone(),
            request_id: RequestId([0x7e; 16]),
            sequence: 3,
            stream: ResultStream::Stderr,
            offset: 4096,
            bytes: b"warning: \xff\n".to_vec(),
        }),
        MailboxRecord::Result(MailboxResult {
            protocol_version: ProtocolVersion::V1,
            session_binding: binding,
            request_id: RequestId([0x7e; 16]),
            outcome: EscalationOutcome::Denied,
            exit_code: None,
            terminating_signal: Some(9),
            chunk_count: 4,
            output_truncated: true,
            detail: "denied by the developer".into(),
            finished_at: request.expires_at,
        }),
    ];
    for (i, record) in others.iter().enumerate() {
        let file = format!("mailbox-{i}");
        seed(&file, MailboxRecord::NAME, &codec::encode(record).unwrap());
    }

    let session = SessionId([0x5e; 16]);
    let open = OpenSession {
        command: Some(vec!["/bin/sh".into(), "-c".into(), "echo hi".into()]),
        terminal: true,
        prompts: true,
        rows: 24,
        columns: 80,
        term: Some("xterm-256color".into()),
        direct_stdio: false,
    };
    seed(
        "open-session",
        OpenSession::NAME,
        &codec::encode(&open).unwrap(),
    );
    let opened = SessionOpened::Opened {
        session_id: session,
    };
    seed(
        "session-opened",
        SessionOpened::NAME,
        &codec::encode(&opened).unwrap(),
    );
    let events = [
        SessionTerminalEvent::Input(TerminalInput {
            session_id: session,
            bytes: b"ls -la\r\x1b[A".to_vec(),
        }),
        SessionTerminalEvent::Signal(TerminalSignal {
            session_id: session,
            signal: TerminalSignalKind::Interrupt,
        }),
    ];
    for (i, event) in events.iter().enumerate() {
        let file = format!("terminal-event-{i}");
        seed(
            &file,
            SessionTerminalEvent::NAME,
            &codec::encode(event).unwrap(),
        );
    }
}
