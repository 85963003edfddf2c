//! Fuzz targets of the Host Coordinator's decoders of bytes it does not
//! choose: the mailbox files a session's sandbox writes, the frames of the
//! Session Coordinator's link, and the configuration document.
//!
//! - `fuzz_mailbox_request_file`: a file taken from a session's
//!   `requests/`, through [`record::verify`] (envelope, signature,
//!   payload, kind, session, capability, file name), then what the host
//!   does with a verified request before anyone decides: freshness,
//!   classification against rules, and how the argv is shown at a prompt
//!   and in the log. Most inputs are payloads signed with the session's
//!   own key, as a sandbox that took its key can; the verdict must be the
//!   one an independent model of the checks gives, and what is shown must
//!   hold no control character.
//! - `fuzz_mailbox_guest_file`: the leader identity the sandbox writes in
//!   its mailbox ([`SessionMailbox::guest`]): read only when it is three
//!   numbers within the bound.
//! - `fuzz_session_frames`: a byte stream read as frames of one of the
//!   link's record types, by [`tls::take_frame`] as the stream arrives in
//!   pieces and by [`tls::read_frame`] at once: both must read the same
//!   records and end the same way, and each record must survive
//!   [`tls::write_frame`].
//! - `fuzz_config_decode`: a document through
//!   [`config::decode_configuration`]: bytes that are not UTF-8 are a
//!   syntax error, no error message carries a control character from the
//!   document, and an accepted v1 document written out again decodes to
//!   the same document.
//!
//! Seeds live in `tests/__fuzz__/NAME/corpus/` (the input format is
//! `build-support/fuzz_input.rs`'s); rewrite them with
//! `cargo test -p lazaret-coordinator --test fuzz -- --ignored write_seed_corpus`.
//! The default run (`cargo test`) replays the seeds and then tries random
//! inputs for one second per target; a long run:
//! `BOLERO_RANDOM_TEST_TIME_MS=600000 cargo test --release -p lazaret-coordinator --test fuzz fuzz_ -- --test-threads=1`.
//! A failure prints `BOLERO_RANDOM_SEED=…`, which replays it.

#[allow(dead_code)]
#[path = "../../build-support/fuzz_input.rs"]
mod fuzz_input;

use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use fuzz_input::{Fields, Framer, Tally};
use lazaret_coordinator::config::{self, ConfigError, ConfigSchema};
use lazaret_coordinator::escalation::audit;
use lazaret_coordinator::escalation::classify::{self, Classification};
use lazaret_coordinator::escalation::mailbox::SessionMailbox;
use lazaret_coordinator::escalation::record::{
    self, FUTURE_SKEW, MAX_AGE, MAX_WAIT, RecordError, Stale,
};
use lazaret_coordinator::session::tls::{self, FrameError};
use lazaret_proto::codec::{self, WireRecord};
use lazaret_proto::common::{ProtocolVersion, UnixTimeNs};
use lazaret_proto::config::ResolvedAutoApprovalRule;
use lazaret_proto::ids::{
    CapabilityId, CliId, ConfigurationFingerprint, CredentialId, DomainId, GenerationId,
    GenerationNonce, RequestId, SessionId,
};
use lazaret_proto::mailbox::{
    GUEST_FILE, MailboxCancellation, MailboxRecord, MailboxRequest, MailboxResultAck, RecordFile,
    SignedProtocolRecord, record_file_name,
};
use lazaret_proto::session::{OpenSession, SessionOpened};
use lazaret_proto::signing::OpenError;
use lazaret_proto::terminal::{SessionTerminalEvent, SessionTerminalMessage};
use lazaret_proto::trust::{
    GenerationIdentity, ProtocolCredentialRole, ProtocolSigningKey, SessionBinding,
    SessionRequestCapability,
};

const MAILBOX_REQUEST_FILE: &str = "mailbox_request_file";
const MAILBOX_GUEST_FILE: &str = "mailbox_guest_file";
const SESSION_FRAMES: &str = "session_frames";
const CONFIG_DECODE: &str = "config_decode";

fn seeds(name: &str) -> Vec<Vec<u8>> {
    fuzz_input::seeds(env!("CARGO_MANIFEST_DIR"), name)
}

fn write_seed(name: &str, file: &str, input: &[u8]) {
    fuzz_input::write_seed(env!("CARGO_MANIFEST_DIR"), name, file, input);
}

// ---------------------------------------------------------------------------
// Mailbox request files.
// ---------------------------------------------------------------------------

/// When the host reads the files, give or take an input's offset.
const NOW: UnixTimeNs = UnixTimeNs(1_700_000_000_000_000_000);

/// The session's `AgentSandbox` key: the sandbox holds it.
const SANDBOX_KEY: ProtocolSigningKey = ProtocolSigningKey([0x5a; 32]);

fn capability() -> SessionRequestCapability {
    SessionRequestCapability {
        protocol_version: ProtocolVersion::V1,
        capability_id: CapabilityId([0xcc; 16]),
        session_binding: SessionBinding {
            generation_identity: GenerationIdentity {
                agent_profile: "default".into(),
                domain_id: DomainId([1; 32]),
                generation_id: GenerationId(3),
                configuration_fingerprint: ConfigurationFingerprint([2; 32]),
                generation_nonce: GenerationNonce([3; 16]),
                created_at: UnixTimeNs(1),
            },
            cli_id: CliId([4; 16]),
            session_id: SessionId([5; 16]),
            credential_id: CredentialId([6; 16]),
        },
        expires_at: NOW.after(Duration::from_secs(3600)),
    }
}

fn rules() -> Vec<ResolvedAutoApprovalRule> {
    vec![
        ResolvedAutoApprovalRule {
            canonical_executable: b"/usr/bin/id".to_vec(),
            args: vec!["-u".into()],
            allow_extra_args: false,
        },
        ResolvedAutoApprovalRule {
            canonical_executable: b"/usr/bin/gh".to_vec(),
            args: vec!["pr".into(), "view".into()],
            allow_extra_args: true,
        },
    ]
}

/// The file name a record's kind and request id make, if the sandbox may
/// sign its kind.
fn own_name(record: &MailboxRecord) -> Option<String> {
    let kind = match record {
        MailboxRecord::Request(_) => RecordFile::Request,
        MailboxRecord::Cancellation(_) => RecordFile::Cancellation,
        MailboxRecord::ResultAck(_) => RecordFile::ResultAck,
        _ => return None,
    };
    Some(record_file_name(record.request_id(), kind))
}

/// What [`record::verify`] must say of a correctly signed `payload` in
/// file `name` at `now`, as a name for the verdict.
fn verdict_model(
    payload: &[u8],
    name: &str,
    capability: &SessionRequestCapability,
    now: UnixTimeNs,
) -> &'static str {
    let Ok(record) = codec::decode::<MailboxRecord>(payload) else {
        return "payload";
    };
    let Some(own) = own_name(&record) else {
        return "wrong signer";
    };
    let capability_id = match &record {
        MailboxRecord::Request(r) => r.capability_id,
        MailboxRecord::Cancellation(r) => r.capability_id,
        MailboxRecord::ResultAck(r) => r.capability_id,
        _ => unreachable!("a kind the sandbox signs"),
    };
    if *record.session_binding() != capability.session_binding {
        "other session"
    } else if capability_id != capability.capability_id {
        "other capability"
    } else if now >= capability.expires_at {
        "capability expired"
    } else if name != own {
        "misnamed"
    } else {
        "ok"
    }
}

fn verdict(result: &Result<MailboxRecord, RecordError>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(RecordError::Open(OpenError::Envelope(_))) => "envelope",
        Err(RecordError::Open(OpenError::Signature)) => "signature",
        Err(RecordError::Open(OpenError::Payload(_))) => "payload",
        Err(RecordError::Open(OpenError::WrongSigner { .. })) => "wrong signer",
        Err(RecordError::OtherSession) => "other session",
        Err(RecordError::HostKind) => "host kind",
        Err(RecordError::OtherCapability) => "other capability",
        Err(RecordError::CapabilityExpired) => "capability expired",
        Err(RecordError::Misnamed) => "misnamed",
    }
}

/// What [`record::stale`] must say of a record made at `issued` and read
/// at `now`.
fn stale_model(issued: UnixTimeNs, now: UnixTimeNs) -> Option<Stale> {
    let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap();
    if u128::from(issued.0) > u128::from(now.0) + u128::from(nanos(FUTURE_SKEW)) {
        Some(Stale::Future)
    } else if now.0.saturating_sub(issued.0) > nanos(MAX_AGE) {
        Some(Stale::Old)
    } else {
        None
    }
}

/// Whether `text` holds a character a terminal or a log line would act on.
fn has_control(text: &str) -> bool {
    text.chars().any(char::is_control)
}

/// What the host does with a verified request before anyone decides.
fn check_request(request: &MailboxRequest, now: UnixTimeNs) {
    let stale = record::stale_request(request, now);
    let expected = stale_model(request.issued_at, now).or_else(|| {
        let wait = request.expires_at.0.saturating_sub(request.issued_at.0);
        if request.expires_at <= now {
            Some(Stale::Expired)
        } else if u128::from(wait) > (MAX_WAIT + FUTURE_SKEW).as_nanos() {
            Some(Stale::WaitTooLong)
        } else {
            None
        }
    });
    assert_eq!(stale, expected, "freshness of {request:?}");

    let argv = &request.command_argv;
    let structural = MailboxRequest::validate_argv(argv);
    let rules = rules();
    match classify::classify(argv, &rules) {
        Classification::AutoApproved { rule } => {
            assert!(structural.is_ok(), "{argv:?} approved yet invalid");
            let rule = &rules[rule];
            assert_eq!(argv[0].as_bytes(), rule.canonical_executable.as_slice());
            if rule.allow_extra_args {
                assert!(argv[1..].starts_with(&rule.args));
            } else {
                assert_eq!(argv[1..], rule.args[..]);
            }
        }
        Classification::AskDeveloper { reason } => {
            assert!(structural.is_ok(), "{argv:?} asked about yet invalid");
            assert!(!has_control(&reason), "{reason:?}");
        }
        Classification::RequiresShell { reason } => {
            assert!(argv.len() == 1 && !argv[0].starts_with('/'));
            assert!(!has_control(&reason), "{reason:?}");
        }
        Classification::Invalid { .. } => assert!(structural.is_err()),
    }
    // What the developer reads at a prompt: printable ASCII alone.
    let prompt = classify::shown_ascii(argv);
    assert!(
        prompt.bytes().all(|b| b == b' ' || b.is_ascii_graphic()),
        "{prompt:?}"
    );
    assert!(!has_control(&classify::shown(argv)));
    let logged = audit::argv(argv);
    assert!(!has_control(&logged), "{logged:?}");
    assert!(
        logged.len() <= audit::MAX_ARGV_SHOWN + 128,
        "{}",
        logged.len()
    );
}

/// The input: a byte choosing the form of the file, two bytes moving the
/// host's clock, then the file (or the payload to sign).
fn mailbox_request_file(input: &[u8], capability: &SessionRequestCapability) -> bool {
    let mut fields = Fields::new(input);
    let form = fields.byte();
    let now = UnixTimeNs(
        NOW.0
            .wrapping_add_signed(i64::from(fields.u16() as i16) * 1_000_000_000),
    );
    let rest = fields.rest();
    let public = lazaret_proto::signing::public_key(&SANDBOX_KEY);
    if form % 4 == 0 {
        // The file as it is: only the key's own signature passes (its
        // signatures are deterministic), and nothing unsigned.
        let result = record::verify("x.request", rest, &public, capability, now);
        let expected = match codec::decode::<SignedProtocolRecord>(rest) {
            Err(_) => "envelope",
            Ok(signed) => {
                let own = lazaret_proto::signing::seal_payload(&SANDBOX_KEY, signed.payload_bytes)
                    .expect("signs");
                let own: SignedProtocolRecord = codec::decode(&own).expect("decodes");
                if own.signature == signed.signature {
                    verdict_model(&own.payload_bytes, "x.request", capability, now)
                } else {
                    "signature"
                }
            }
        };
        assert_eq!(verdict(&result), expected);
        return false;
    }
    let payload = rest.to_vec();
    let bytes = lazaret_proto::signing::seal_payload(&SANDBOX_KEY, payload.clone())
        .expect("a payload within the bound is signed");
    let decoded = codec::decode::<MailboxRecord>(&payload).ok();
    let name = match (form % 4, decoded.as_ref().and_then(own_name)) {
        (1 | 2, Some(name)) => name,
        (_, Some(name)) => format!("{name}.part"),
        (_, None) => "x.request".to_owned(),
    };
    let result = record::verify(&name, &bytes, &public, capability, now);
    let expected = verdict_model(&payload, &name, capability, now);
    assert_eq!(verdict(&result), expected, "{name} at {now:?}");
    let Ok(record) = result else {
        return false;
    };
    assert_eq!(Some(&record), decoded.as_ref());
    assert_eq!(record.signer_role(), ProtocolCredentialRole::AgentSandbox);
    match &record {
        MailboxRecord::Request(request) => check_request(request, now),
        MailboxRecord::Cancellation(cancel) => {
            assert_eq!(
                record::stale(cancel.issued_at, now),
                stale_model(cancel.issued_at, now)
            );
        }
        _ => {}
    }
    true
}

#[test]
fn fuzz_mailbox_request_file() {
    let seeds = seeds(MAILBOX_REQUEST_FILE);
    let capability = capability();
    let tally = Tally::new(MAILBOX_REQUEST_FILE);
    bolero::check!(name = MAILBOX_REQUEST_FILE).for_each(|data: &[u8]| {
        let input = fuzz_input::input(data, &seeds);
        tally.count(mailbox_request_file(&input, &capability));
    });
}

/// What [`SessionMailbox::guest`] must read of `bytes`.
fn guest_model(bytes: &[u8]) -> Option<(u32, u32, u64)> {
    if bytes.len() > 64 {
        return None;
    }
    let text = std::str::from_utf8(bytes).ok()?;
    let mut fields = text.split_ascii_whitespace();
    Some((
        fields.next()?.parse().ok()?,
        fields.next()?.parse().ok()?,
        fields.next()?.parse().ok()?,
    ))
}

#[test]
fn fuzz_mailbox_guest_file() {
    let seeds = seeds(MAILBOX_GUEST_FILE);
    let root = tempfile::tempdir().unwrap();
    let fd: OwnedFd = std::fs::File::open(root.path()).unwrap().into();
    let mailbox = SessionMailbox::create(fd.as_fd(), SessionId([5; 16]), b"bundle").unwrap();
    let guest = root
        .path()
        .join(SessionId([5; 16]).to_hex())
        .join(GUEST_FILE);
    let tally = Tally::new(MAILBOX_GUEST_FILE);
    bolero::check!(name = MAILBOX_GUEST_FILE).for_each(|data: &[u8]| {
        let input = fuzz_input::input(data, &seeds);
        std::fs::write(&guest, &input).unwrap();
        let claim = mailbox
            .guest()
            .map(|c| (c.pid, c.process_group, c.start_time));
        assert_eq!(claim, guest_model(&input), "{input:?}");
        tally.count(claim.is_some());
    });
}

// ---------------------------------------------------------------------------
// Session frames.
// ---------------------------------------------------------------------------

/// How a frame reader ended, by kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// Cleanly, between frames.
    Clean,
    /// Inside a frame.
    Truncated,
    /// At a length over the limit.
    Oversize,
    /// At a body that does not decode.
    Decode,
}

fn end_of(error: &FrameError) -> End {
    match error {
        FrameError::Truncated { .. } => End::Truncated,
        FrameError::Oversize { .. } => End::Oversize,
        FrameError::Decode { .. } => End::Decode,
        other => panic!("a reader of bytes in memory failed otherwise: {other}"),
    }
}

/// Reads `stream` as frames of `T` both ways; the records read (encoded
/// again), and whether there was any.
fn frames<T: WireRecord>(stream: &[u8], pieces: u8) -> bool {
    // At once, from a reader.
    let mut reader = stream;
    let mut read = Vec::new();
    let read_end = loop {
        match tls::read_frame::<_, T>(&mut reader) {
            Ok(Some(record)) => read.push(codec::encode(&record).expect("encodes")),
            Ok(None) => break End::Clean,
            Err(e) => break end_of(&e),
        }
    };
    // As it arrives, in pieces of varying size, as the link takes it.
    let mut buffer = Vec::new();
    let mut taken = Vec::new();
    let mut at = 0;
    let mut piece = 0usize;
    let take_end = 'stream: loop {
        loop {
            match tls::take_frame::<T>(&mut buffer) {
                Ok(Some(record)) => taken.push(codec::encode(&record).expect("encodes")),
                Ok(None) => break,
                Err(e) => break 'stream end_of(&e),
            }
        }
        if at == stream.len() {
            break if buffer.is_empty() {
                End::Clean
            } else {
                End::Truncated
            };
        }
        piece += 1;
        let len = 1 + (usize::from(pieces) * piece * 7919) % 300;
        let end = (at + len).min(stream.len());
        buffer.extend_from_slice(&stream[at..end]);
        at = end;
    };
    assert_eq!(read, taken, "{} records read differently", T::NAME);
    assert_eq!(read_end, take_end, "{} streams end differently", T::NAME);
    // Every record read is written as a frame that reads back the same.
    for bytes in &read {
        let record: T = codec::decode(bytes).expect("decodes");
        let mut frame = Vec::new();
        tls::write_frame(&mut frame, &record).expect("a record read is written");
        let mut reader = frame.as_slice();
        let again = tls::read_frame::<_, T>(&mut reader)
            .expect("reads")
            .expect("a frame");
        assert_eq!(&codec::encode(&again).unwrap(), bytes);
        assert!(reader.is_empty());
    }
    !read.is_empty()
}

/// The record types of the link, both ways.
const FRAME_TYPES: [fn(&[u8], u8) -> bool; 4] = [
    frames::<OpenSession>,
    frames::<SessionOpened>,
    frames::<SessionTerminalEvent>,
    frames::<SessionTerminalMessage>,
];

#[test]
fn fuzz_session_frames() {
    let seeds = seeds(SESSION_FRAMES);
    let tally = Tally::new(SESSION_FRAMES);
    bolero::check!(name = SESSION_FRAMES).for_each(|data: &[u8]| {
        let input = fuzz_input::input(data, &seeds);
        let mut fields = Fields::new(&input);
        let kind = fields.byte();
        let pieces = fields.byte();
        let stream = fields.rest();
        tally.count(FRAME_TYPES[usize::from(kind) % FRAME_TYPES.len()](
            stream, pieces,
        ));
    });
}

// ---------------------------------------------------------------------------
// The configuration decoder.
// ---------------------------------------------------------------------------

fn config_decode(bytes: &[u8]) -> bool {
    let decoded = config::decode_configuration(bytes);
    let decoded = match decoded {
        Ok(decoded) => decoded,
        Err(error) => {
            if std::str::from_utf8(bytes).is_err() {
                assert!(matches!(error, ConfigError::Syntax { .. }), "{error:?}");
            }
            let message = lazaret_proto::error_chain(&error);
            assert!(
                !message.chars().any(|c| c.is_control() && c != '\n'),
                "a control character in {message:?}"
            );
            return false;
        }
    };
    assert!(!decoded.document.profiles.is_empty());
    if decoded.schema == ConfigSchema::V1 {
        let text = toml::to_string(&decoded.document).expect("a decoded document is written");
        let again = config::decode_configuration(text.as_bytes())
            .unwrap_or_else(|e| panic!("{text}\nwritten again is refused: {e}"));
        assert_eq!(again.document, decoded.document, "{text}");
    }
    true
}

#[test]
fn fuzz_config_decode() {
    let seeds = seeds(CONFIG_DECODE);
    let tally = Tally::new(CONFIG_DECODE);
    bolero::check!(name = CONFIG_DECODE).for_each(|data: &[u8]| {
        let input = fuzz_input::input(data, &seeds);
        tally.count(config_decode(&input));
    });
}

// ---------------------------------------------------------------------------
// Seeds.
// ---------------------------------------------------------------------------

fn request(argv: &[&str], issued: UnixTimeNs, wait: u64) -> MailboxRecord {
    MailboxRecord::Request(MailboxRequest {
        protocol_version: ProtocolVersion::V1,
        session_binding: capability().session_binding,
        request_id: RequestId([9; 16]),
        capability_id: capability().capability_id,
        command_argv: argv.iter().map(|a| (*a).to_owned()).collect(),
        issued_at: issued,
        expires_at: issued.after(Duration::from_secs(wait)),
    })
}

fn write_mailbox_seeds() {
    let file = |form: u8, payload: &[u8]| Framer::default().byte(form).u16(0).rest(payload).done();
    let records = [
        request(&["/usr/bin/id", "-u"], NOW, 60),
        request(&["/usr/bin/gh", "pr", "view", "12"], NOW, 600),
        request(&["/usr/bin/env", "a\u{1b}[2J", "é\u{202e}", ""], NOW, 30),
        request(&["ls -la | sh"], NOW, 30),
        request(&["/bin/echo"], NOW.after(Duration::from_secs(31)), 30),
        MailboxRecord::Cancellation(MailboxCancellation {
            protocol_version: ProtocolVersion::V1,
            session_binding: capability().session_binding,
            request_id: RequestId([9; 16]),
            capability_id: capability().capability_id,
            issued_at: NOW,
        }),
        MailboxRecord::ResultAck(MailboxResultAck {
            protocol_version: ProtocolVersion::V1,
            session_binding: capability().session_binding,
            request_id: RequestId([9; 16]),
            capability_id: capability().capability_id,
            chunks_received: 2,
            result_sha256: lazaret_proto::ids::Sha256Digest([7; 32]),
            acknowledged_at: NOW,
        }),
    ];
    for (i, record) in records.iter().enumerate() {
        let payload = codec::encode(record).unwrap();
        let input = file(1, &payload);
        assert!(mailbox_request_file(&input, &capability()), "seed {i}");
        write_seed(MAILBOX_REQUEST_FILE, &format!("signed-{i}"), &input);
    }
    // A whole file as written to the mailbox, for the unsigned form.
    let sealed = lazaret_proto::signing::seal(&SANDBOX_KEY, &records[0]).unwrap();
    write_seed(MAILBOX_REQUEST_FILE, "file-0", &file(0, &sealed));

    for (i, guest) in [
        &b"12 12 99887766\n"[..],
        b"1 1 0",
        b"4294967295 7 18446744073709551615",
    ]
    .iter()
    .enumerate()
    {
        assert!(guest_model(guest).is_some());
        write_seed(MAILBOX_GUEST_FILE, &format!("guest-{i}"), guest);
    }
}

fn write_frame_seeds() {
    use lazaret_proto::mailbox::{DeveloperDecisionKind, EscalationOutcome};
    use lazaret_proto::session::SessionRefusal;
    use lazaret_proto::terminal::{
        EscalationAnswer, EscalationPrompt, EscalationSettled, SessionClose, SessionExit,
        SessionExitOutcome, TerminalInput, TerminalOutput, TerminalResize, TerminalSignal,
        TerminalSignalKind,
    };
    fn stream<T: WireRecord>(records: &[T]) -> Vec<u8> {
        let mut out = Vec::new();
        for record in records {
            tls::write_frame(&mut out, record).unwrap();
        }
        out
    }
    let session = SessionId([0x5e; 16]);
    let request = RequestId([0x7e; 16]);
    let streams: [(u8, Vec<u8>); 4] = [
        (
            0,
            stream(&[OpenSession {
                command: Some(vec!["/bin/bash".into(), "-l".into()]),
                terminal: true,
                prompts: true,
                rows: 50,
                columns: 132,
                term: Some("xterm-256color".into()),
                direct_stdio: false,
            }]),
        ),
        (
            1,
            stream(&[
                SessionOpened::Opened {
                    session_id: session,
                },
                SessionOpened::Refused(SessionRefusal::Full { max: 128 }),
            ]),
        ),
        (
            2,
            stream(&[
                SessionTerminalEvent::Input(TerminalInput {
                    session_id: session,
                    bytes: b"echo hi\r".to_vec(),
                }),
                SessionTerminalEvent::Resize(TerminalResize {
                    session_id: session,
                    rows: 24,
                    columns: 80,
                    width_pixels: 0,
                    height_pixels: 0,
                }),
                SessionTerminalEvent::Signal(TerminalSignal {
                    session_id: session,
                    signal: TerminalSignalKind::Interrupt,
                }),
                SessionTerminalEvent::EscalationAnswer(EscalationAnswer {
                    session_id: session,
                    request_id: request,
                    decision: DeveloperDecisionKind::Approve,
                }),
                SessionTerminalEvent::Close(SessionClose {
                    session_id: session,
                }),
            ]),
        ),
        (
            3,
            stream(&[
                SessionTerminalMessage::Output(TerminalOutput {
                    session_id: session,
                    bytes: b"hi\r\n\x1b[0m$ ".to_vec(),
                }),
                SessionTerminalMessage::EscalationPrompt(EscalationPrompt {
                    session_id: session,
                    request_id: request,
                    command_argv: vec!["/usr/bin/gh".into(), "pr".into(), "create".into()],
                    requested_at: NOW,
                    expires_at: NOW.after(Duration::from_secs(60)),
                    reason: "no auto-approval rule names /usr/bin/gh".into(),
                    cannot_run: None,
                }),
                SessionTerminalMessage::EscalationSettled(EscalationSettled {
                    session_id: session,
                    request_id: request,
                    outcome: EscalationOutcome::Expired,
                }),
                SessionTerminalMessage::Exit(SessionExit {
                    session_id: session,
                    outcome: SessionExitOutcome::Exited,
                    exit_code: 0,
                }),
            ]),
        ),
    ];
    for (kind, bytes) in streams {
        let input = Framer::default().byte(kind).byte(3).rest(&bytes).done();
        let mut fields = Fields::new(&input);
        let (k, p) = (fields.byte(), fields.byte());
        assert!(FRAME_TYPES[usize::from(k)](fields.rest(), p));
        write_seed(SESSION_FRAMES, &format!("stream-{kind}"), &input);
    }
}

/// Documents whose quoted keys hold a control character, each refused.
const ESCAPED_KEYS: &[(&str, &str)] = &[
    (
        "escaped-unknown-key",
        "schema = \"lazaret-trusted-host-config-v1\"\n[profiles.ok]\n\
         image = \"docker.io/library/debian:trixie\"\n\"bo\\u001bgus\" = 1\n",
    ),
    (
        "escaped-profile-name",
        "schema = \"lazaret-trusted-host-config-v2\"\n[profiles.\"a\\u001b[2J\"]\n\
         image = \"docker.io/library/debian:trixie\"\n",
    ),
    (
        "escaped-env-name",
        "schema = \"lazaret-trusted-host-config-v2\"\n[profiles.ok]\n\
         image = \"docker.io/library/debian:trixie\"\n[profiles.ok.env]\n\
         \"A\\u001b\" = \"$HOME\"\n",
    ),
    (
        "escaped-volume-path",
        "schema = \"lazaret-trusted-host-config-v1\"\n[profiles.ok]\n\
         image = \"docker.io/library/debian:trixie\"\npersistent_dirs = [\"/root\"]\n\
         [[profiles.ok.volumes]]\nhost = \"~/x\"\ncontainer = \"/ro\\u001b\\t/x\"\nkind = \"file\"\naccess = \"read-only\"\n",
    ),
];

/// A key or value of the document is named in an error with its control
/// characters escaped: serde's field path and message, and the rules' own
/// messages (a volume's path, found by this target), once carried them raw
/// to the terminal.
#[test]
fn config_errors_escape_control_characters_in_keys() {
    for (name, text) in ESCAPED_KEYS {
        let error = config::decode_configuration(text.as_bytes()).unwrap_err();
        let message = lazaret_proto::error_chain(&error);
        assert!(!message.contains('\u{1b}'), "{name}: {message:?}");
        assert!(message.contains("\\u{1b}"), "{name}: {message:?}");
    }
}

/// The TOML blocks of the documentation and the CLI's template.
fn write_config_seeds() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let mut documents = Vec::new();
    for doc in ["config", "credentials", "escalation", "network"] {
        let text = std::fs::read_to_string(format!("{root}/docs/{doc}.md")).unwrap();
        let mut rest = text.as_str();
        while let Some(start) = rest.find("```toml\n") {
            let block = &rest[start + 8..];
            let end = block.find("```").unwrap();
            documents.push((
                format!("{doc}-{}", documents.len()),
                block[..end].to_owned(),
            ));
            rest = &block[end..];
        }
    }
    let template = std::fs::read_to_string(format!("{root}/cli/src/template.toml")).unwrap();
    documents.push(("template".into(), template));
    // Quoted keys and strings with escapes, for edits to reach them.
    for (name, text) in ESCAPED_KEYS {
        documents.push(((*name).into(), (*text).into()));
    }
    let mut accepted = 0;
    for (name, text) in &documents {
        accepted += usize::from(config_decode(text.as_bytes()));
        write_seed(CONFIG_DECODE, name, text.as_bytes());
    }
    assert!(accepted > 0, "no seed is a whole valid document");
}

/// Writes the seed corpora of every target here.
#[test]
#[ignore = "writes the checked-in seed corpora"]
fn write_seed_corpus() {
    write_mailbox_seeds();
    write_frame_seeds();
    write_config_seeds();
}
