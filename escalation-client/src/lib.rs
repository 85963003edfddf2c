//! `lazaret-escalate`: the Escalation Client, run inside the sandbox to ask
//! the host to run one command.
//!
//! It finds its session's mailbox from `LAZARET_SESSION` (set by Lazaret on
//! every session process), reads the session's credential bundle there,
//! writes one signed [`MailboxRequest`] by atomic rename, then waits for the
//! host's records: it polls for the next result chunk and for the result
//! by name, writes each chunk to its own standard output or error in
//! sequence order, acknowledges the result, and exits with the command's
//! status. Ctrl-C, SIGTERM or SIGHUP sends a signed cancellation; the host
//! ends the command and answers `Cancelled`.
//!
//! Trusts only records signed by the Session Coordinator key that its
//! bundle's trust manifest pins, bound to its own session and request; a
//! file that fails any check is treated as absent. The mailbox itself is
//! the sandbox's own, so this client defends its output, not the host.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

use std::ffi::OsString;
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use lazaret_proto::codec::{self, WireRecord};
use lazaret_proto::common::{ProtocolVersion, UnixTimeNs};
use lazaret_proto::ids::{RequestId, SessionId};
use lazaret_proto::mailbox::{
    CREDENTIAL_FILE, EscalationOutcome, MAILBOX_AREA, MailboxCancellation, MailboxRecord,
    MailboxRequest, MailboxResult, MailboxResultAck, REQUESTS_DIR, RESULTS_DIR, RecordFile,
    ResultStream, SESSION_ENV, SignedProtocolRecord, record_file_name,
};
use lazaret_proto::signing;
use lazaret_proto::trust::{ProtocolCredentialRole, SandboxCredentialBundle};
use sha2::{Digest, Sha256};

/// Exit status: the command line was not understood.
pub const EXIT_USAGE: u8 = 64;
/// Exit status: no host to ask (not in a session, no mailbox, the host did
/// not answer in time, a protocol failure).
pub const EXIT_UNAVAILABLE: u8 = 69;
/// Exit status: the host could not start the approved command.
pub const EXIT_LAUNCH_FAILED: u8 = 126;
/// Exit status: nobody decided before the request expired.
pub const EXIT_EXPIRED: u8 = 75;
/// Exit status: the developer (or, without a terminal to ask in, the
/// policy) denied the request.
pub const EXIT_DENIED: u8 = 77;
/// Exit status: the request was refused without asking (escalation is off,
/// the command needs a shell or a `PATH` lookup, the executable fails its
/// checks).
pub const EXIT_REFUSED: u8 = 78;
/// Exit status: the request was cancelled (Ctrl-C), as a shell reports an
/// interrupted command.
pub const EXIT_CANCELLED: u8 = 130;

/// How long a request waits for a decision unless `--timeout` says.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// The longest `--timeout` (the host's own bound).
const MAX_TIMEOUT: Duration = Duration::from_secs(600);
/// How long past its expiry the client still waits for the host's first
/// answer before it gives up: the host answers an expired request itself.
const ANSWER_GRACE: Duration = Duration::from_secs(10);
/// How long a cancelled request waits for the host's `Cancelled` result.
const CANCEL_WAIT: Duration = Duration::from_secs(5);

const USAGE: &str = "\
usage: lazaret-escalate [--timeout SECONDS] [--] /ABSOLUTE/PATH [ARGUMENT...]

Asks the host, through this session's Escalation Mailbox, to run one
command: the executable's absolute path and its arguments, exactly as
given. No shell and no PATH lookup ever interpret them. A configured
auto-approval rule runs it at once; otherwise the developer is asked in
this session's terminal. Output arrives on standard output and error.

  --timeout SECONDS   how long to wait for a decision (default 300, at most 600)

Exit status: the command's own, or 128+N if signal N ended it;
  64 usage, 69 no host to ask, 75 expired unanswered, 77 denied,
  78 refused without asking, 126 could not be started, 130 cancelled.
";

/// A failure, with the exit status it ends the client with.
#[derive(Debug)]
pub struct Failure {
    /// What to print after `lazaret-escalate: `.
    pub message: String,
    /// The exit status.
    pub status: u8,
}

fn unavailable(message: impl Into<String>) -> Failure {
    Failure {
        message: message.into(),
        status: EXIT_UNAVAILABLE,
    }
}

/// What the command line asked for.
#[derive(Debug, PartialEq, Eq)]
pub struct Invocation {
    /// How long to wait for a decision.
    pub timeout: Duration,
    /// The command: the executable's path and its arguments.
    pub argv: Vec<String>,
}

/// Parses the arguments after the program name. `Ok(None)` is `--help`.
pub fn parse(args: Vec<OsString>) -> Result<Option<Invocation>, Failure> {
    let usage = |message: String| Failure {
        message: format!("{message}\n{USAGE}"),
        status: EXIT_USAGE,
    };
    let mut timeout = DEFAULT_TIMEOUT;
    let mut rest = args.into_iter().peekable();
    while let Some(arg) = rest.peek().and_then(|a| a.to_str()) {
        match arg {
            "-h" | "--help" => return Ok(None),
            "--" => {
                rest.next();
                break;
            }
            "--timeout" => {
                rest.next();
                let value = rest.next().and_then(|v| v.into_string().ok());
                let seconds = value
                    .as_deref()
                    .and_then(|v| v.parse::<u64>().ok())
                    .filter(|s| (1..=MAX_TIMEOUT.as_secs()).contains(s))
                    .ok_or_else(|| {
                        usage(format!(
                            "--timeout takes a whole number of seconds from 1 to {}",
                            MAX_TIMEOUT.as_secs()
                        ))
                    })?;
                timeout = Duration::from_secs(seconds);
            }
            option if option.starts_with('-') && option.len() > 1 => {
                return Err(usage(format!("unknown option {option}")));
            }
            _ => break,
        }
    }
    let argv = rest
        .enumerate()
        .map(|(i, a)| {
            a.into_string()
                .map_err(|_| usage(format!("argument {i} of the command is not valid UTF-8")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if argv.is_empty() {
        return Err(usage("no command given".into()));
    }
    Ok(Some(Invocation { timeout, argv }))
}

/// Runs the client: the exit status to end with.
pub fn run(args: Vec<OsString>) -> u8 {
    let outcome = parse(args).and_then(|invocation| match invocation {
        None => {
            print!("{USAGE}");
            Ok(0)
        }
        Some(invocation) => escalate(&invocation),
    });
    match outcome {
        Ok(status) => status,
        Err(failure) => {
            eprintln!("lazaret-escalate: {}", failure.message);
            failure.status
        }
    }
}

/// The session's mailbox, as this client reaches it.
struct Mailbox {
    requests: PathBuf,
    results: PathBuf,
    bundle: SandboxCredentialBundle,
}

impl Mailbox {
    fn open() -> Result<Self, Failure> {
        let session = std::env::var(SESSION_ENV).map_err(|_| {
            unavailable(format!(
                "{SESSION_ENV} is not set: this is not a Lazaret session; run it in a shell \
                 from `lazaret attach`"
            ))
        })?;
        let session_id = SessionId::from_hex(&session)
            .ok_or_else(|| unavailable(format!("{SESSION_ENV} is not a session id")))?;
        let dir = Path::new(MAILBOX_AREA).join(session_id.to_hex());
        let bytes = read_bounded(
            &dir.join(CREDENTIAL_FILE),
            SandboxCredentialBundle::MAX_ENCODED_LEN,
        )
        .map_err(|e| {
            unavailable(format!(
                "cannot read this session's credential in {}: {e}; the session may have ended",
                dir.display()
            ))
        })?
        .ok_or_else(|| {
            unavailable(format!(
                "this session has no mailbox at {}; the session may have ended",
                dir.display()
            ))
        })?;
        let bundle: SandboxCredentialBundle = codec::decode(&bytes)
            .map_err(|e| unavailable(format!("this session's credential is unreadable: {e}")))?;
        let binding = &bundle.request_capability.session_binding;
        if binding.session_id != session_id
            || binding.generation_identity != bundle.generation_identity
            || bundle.trust_manifest.generation_identity != bundle.generation_identity
            || binding.credential_id != bundle.protocol_credential.credential_id
        {
            return Err(unavailable(
                "this session's credential names another session or generation",
            ));
        }
        Ok(Self {
            requests: dir.join(REQUESTS_DIR),
            results: dir.join(RESULTS_DIR),
            bundle,
        })
    }

    /// Signs `record` and places it in the requests directory under its
    /// final name by rename, so the host never reads half a file.
    fn send(&self, record: &MailboxRecord, kind: RecordFile) -> Result<(), Failure> {
        let bytes = signing::seal(&self.bundle.protocol_credential.signing_key, record)
            .map_err(|e| unavailable(format!("cannot sign the record: {e}")))?;
        let name = record_file_name(record.request_id(), kind);
        let temporary = self.requests.join(format!(".{name}.part"));
        let written = File::options()
            .write(true)
            .create_new(true)
            .open(&temporary)
            .and_then(|mut file| file.write_all(&bytes))
            .and_then(|()| std::fs::rename(&temporary, self.requests.join(&name)));
        written.map_err(|e| {
            let _ = std::fs::remove_file(&temporary);
            unavailable(format!(
                "cannot write to this session's mailbox {}: {e}",
                self.requests.display()
            ))
        })
    }

    /// The host's record in `name`, if that file holds one bound to this
    /// session and request; anything else reads as absent.
    fn receive(&self, name: &str, request_id: RequestId) -> Option<(MailboxRecord, Vec<u8>)> {
        let bytes = read_bounded(
            &self.results.join(name),
            SignedProtocolRecord::MAX_ENCODED_LEN,
        )
        .ok()
        .flatten()?;
        let manifest = &self.bundle.trust_manifest;
        let record = signing::open(
            &bytes,
            &manifest.session_coordinator_public_key,
            ProtocolCredentialRole::SessionCoordinator,
        )
        .ok()?;
        let bound = *record.session_binding() == self.bundle.request_capability.session_binding
            && record.request_id() == request_id;
        bound.then_some((record, bytes))
    }

    fn remove(&self, name: &str) {
        let _ = std::fs::remove_file(self.results.join(name));
    }
}

/// Reads a regular file of at most `max` bytes; `Ok(None)` when it does not
/// exist.
fn read_bounded(path: &Path, max: usize) -> std::io::Result<Option<Vec<u8>>> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut bytes = Vec::new();
    file.take(max as u64 + 1).read_to_end(&mut bytes)?;
    if bytes.len() > max {
        return Err(std::io::Error::other("larger than a record may be"));
    }
    Ok(Some(bytes))
}

/// The waits between looks at the mailbox: short at first, since most
/// answers come within milliseconds, then longer for a developer to decide
/// or a long command to finish.
struct Backoff {
    looks: u32,
}

impl Backoff {
    fn pause(&mut self) {
        self.looks = self.looks.saturating_add(1);
        let wait = match self.looks {
            0..=40 => Duration::from_micros(500),
            41..=500 => Duration::from_millis(2),
            501..=6_000 => Duration::from_millis(10),
            _ => Duration::from_millis(50),
        };
        std::thread::sleep(wait);
    }

    fn reset(&mut self) {
        self.looks = 0;
    }
}

/// Sends the request of `invocation` and waits for its result.
fn escalate(invocation: &Invocation) -> Result<u8, Failure> {
    let interrupted = watch_interrupts()?;
    let mailbox = Mailbox::open()?;
    let request_id = send_request(&mailbox, invocation)?;
    let mut stdout = std::io::stdout().lock();
    let mut stderr = std::io::stderr().lock();
    let mut wait = Wait::new(&mailbox, request_id, invocation.timeout);
    loop {
        if interrupted.swap(false, Ordering::Relaxed) {
            wait.cancel()?;
        }
        if wait.take_chunk(&mut stdout, &mut stderr) {
            continue;
        }
        match wait.take_result(&invocation.argv[0]) {
            Looked::Finished(status) => return Ok(status),
            Looked::Later => continue,
            Looked::Nothing => {}
        }
        wait.still_waiting()?;
        wait.backoff.pause();
    }
}

/// Ctrl-C, SIGTERM and SIGHUP, as a flag that the wait reads.
fn watch_interrupts() -> Result<Arc<AtomicBool>, Failure> {
    let interrupted = Arc::new(AtomicBool::new(false));
    for signal in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ] {
        signal_hook::flag::register(signal, Arc::clone(&interrupted))
            .map_err(|e| unavailable(format!("cannot watch for Ctrl-C: {e}")))?;
    }
    Ok(interrupted)
}

/// Writes the signed request for `invocation`'s command; its id.
fn send_request(mailbox: &Mailbox, invocation: &Invocation) -> Result<RequestId, Failure> {
    let capability = &mailbox.bundle.request_capability;
    let request_id = RequestId(signing::random_bytes());
    let issued_at = UnixTimeNs::now();
    let request = MailboxRequest {
        protocol_version: ProtocolVersion::V1,
        session_binding: capability.session_binding.clone(),
        request_id,
        capability_id: capability.capability_id,
        command_argv: invocation.argv.clone(),
        issued_at,
        expires_at: issued_at.after(invocation.timeout),
    };
    mailbox.send(&MailboxRecord::Request(request), RecordFile::Request)?;
    Ok(request_id)
}

/// What a look for the result found.
#[derive(Debug, PartialEq, Eq)]
enum Looked {
    /// No result yet.
    Nothing,
    /// A result whose last chunks have not come yet: look again.
    Later,
    /// The result, acknowledged: the status to exit with.
    Finished(u8),
}

/// The wait for the host's answer to one request: the output read so
/// far, and the deadlines.
struct Wait<'a> {
    mailbox: &'a Mailbox,
    request_id: RequestId,
    /// Whether standard output and error still take the command's.
    output_open: [bool; 2],
    next_chunk: u64,
    /// Whether the host took the request (a chunk or its decision came).
    answered: bool,
    cancelled_at: Option<Instant>,
    result_seen_at: Option<Instant>,
    answer_deadline: Instant,
    backoff: Backoff,
}

impl<'a> Wait<'a> {
    fn new(mailbox: &'a Mailbox, request_id: RequestId, timeout: Duration) -> Self {
        Self {
            mailbox,
            request_id,
            output_open: [true, true],
            next_chunk: 0,
            answered: false,
            cancelled_at: None,
            result_seen_at: None,
            answer_deadline: Instant::now() + timeout + ANSWER_GRACE,
            backoff: Backoff { looks: 0 },
        }
    }

    fn name(&self, kind: RecordFile) -> String {
        record_file_name(self.request_id, kind)
    }

    /// Sends the signed cancellation, once.
    fn cancel(&mut self) -> Result<(), Failure> {
        if self.cancelled_at.is_some() {
            return Ok(());
        }
        let capability = &self.mailbox.bundle.request_capability;
        let cancellation = MailboxCancellation {
            protocol_version: ProtocolVersion::V1,
            session_binding: capability.session_binding.clone(),
            request_id: self.request_id,
            capability_id: capability.capability_id,
            issued_at: UnixTimeNs::now(),
        };
        self.mailbox.send(
            &MailboxRecord::Cancellation(cancellation),
            RecordFile::Cancellation,
        )?;
        self.cancelled_at = Some(Instant::now());
        Ok(())
    }

    /// Writes the next chunk of output to `stdout` or `stderr`, if it has
    /// come; whether it had.
    fn take_chunk(&mut self, stdout: &mut impl Write, stderr: &mut impl Write) -> bool {
        let name = self.name(RecordFile::Chunk(self.next_chunk));
        let Some((MailboxRecord::ResultChunk(chunk), _)) =
            self.mailbox.receive(&name, self.request_id)
        else {
            return false;
        };
        if chunk.sequence != self.next_chunk {
            return false;
        }
        let (out, open): (&mut dyn Write, _) = match chunk.stream {
            ResultStream::Stdout => (stdout, &mut self.output_open[0]),
            ResultStream::Stderr => (stderr, &mut self.output_open[1]),
        };
        // A closed output (a pipe whose reader went) drops the rest of
        // that stream; the command itself is not ended by it.
        if *open
            && out
                .write_all(&chunk.bytes)
                .and_then(|()| out.flush())
                .is_err()
        {
            *open = false;
        }
        self.mailbox.remove(&name);
        self.next_chunk += 1;
        self.answered = true;
        self.backoff.reset();
        true
    }

    /// Takes the result, once its chunks have been read (or 2 s after it
    /// came, when some never do), and acknowledges it.
    fn take_result(&mut self, program: &str) -> Looked {
        let Some((MailboxRecord::Result(result), bytes)) = self
            .mailbox
            .receive(&self.name(RecordFile::Result), self.request_id)
        else {
            return Looked::Nothing;
        };
        // Its last chunks were written before it: read them first. A chunk
        // that does not come was removed by something else in the
        // sandbox; the status still counts.
        let missing = result.chunk_count > self.next_chunk;
        let waited = self
            .result_seen_at
            .get_or_insert_with(Instant::now)
            .elapsed();
        if missing && waited < Duration::from_secs(2) {
            self.backoff.pause();
            return Looked::Later;
        }
        if missing {
            eprintln!(
                "lazaret-escalate: {} of the command's output chunks were removed from the \
                 mailbox before they were read",
                result.chunk_count - self.next_chunk
            );
        }
        acknowledge(self.mailbox, &result, &bytes, self.next_chunk);
        Looked::Finished(finish(&result, program))
    }

    /// Whether to go on waiting: not past the cancellation's wait, the
    /// session's end, or, before the host took the request, its answer
    /// deadline.
    fn still_waiting(&mut self) -> Result<(), Failure> {
        // The decision only says the host took the request (so a long
        // command outlives the answer deadline): looked for now and then.
        if !self.answered && self.backoff.looks % 16 == 15 {
            let decision = self.name(RecordFile::Decision);
            self.answered = self.mailbox.receive(&decision, self.request_id).is_some();
        }
        if let Some(at) = self.cancelled_at
            && at.elapsed() > CANCEL_WAIT
        {
            return Err(Failure {
                message: "cancelled; the host did not confirm that the command ended".into(),
                status: EXIT_CANCELLED,
            });
        }
        // The host removes a session's mailbox when the session ends: a
        // client that outlived its session (it escaped to a session of its
        // own) stops waiting then.
        if self.backoff.looks % 64 == 63 && !self.mailbox.requests.is_dir() {
            return Err(unavailable(
                "this session's mailbox is gone: the session ended before the result came",
            ));
        }
        if !self.answered && Instant::now() > self.answer_deadline {
            return Err(unavailable(
                "the host did not answer the request; is the Domain still up?",
            ));
        }
        Ok(())
    }
}

/// Tells the host the result arrived, so it may remove the request's files.
fn acknowledge(mailbox: &Mailbox, result: &MailboxResult, bytes: &[u8], chunks: u64) {
    let capability = &mailbox.bundle.request_capability;
    let payload = codec::decode::<SignedProtocolRecord>(bytes)
        .map(|signed| signed.payload_bytes)
        .unwrap_or_default();
    let ack = MailboxResultAck {
        protocol_version: ProtocolVersion::V1,
        session_binding: capability.session_binding.clone(),
        request_id: result.request_id,
        capability_id: capability.capability_id,
        chunks_received: chunks,
        result_sha256: lazaret_proto::ids::Sha256Digest(Sha256::digest(&payload).into()),
        acknowledged_at: UnixTimeNs::now(),
    };
    // The result is in hand: an acknowledgement that cannot be written
    // only leaves the host's files until the session ends.
    let _ = mailbox.send(&MailboxRecord::ResultAck(ack), RecordFile::ResultAck);
}

/// Prints what the outcome means, and returns the exit status for it.
fn finish(result: &MailboxResult, program: &str) -> u8 {
    let say = |text: &str| {
        if !result.detail.is_empty() {
            eprintln!("lazaret-escalate: {text}: {}", result.detail);
        } else {
            eprintln!("lazaret-escalate: {text}");
        }
    };
    if result.output_truncated {
        eprintln!("lazaret-escalate: the host dropped output past its limit");
    }
    match result.outcome {
        EscalationOutcome::Completed => match (result.exit_code, result.terminating_signal) {
            (Some(code), _) => code,
            (None, Some(signal)) => 128u8.saturating_add(signal),
            (None, None) => EXIT_UNAVAILABLE,
        },
        EscalationOutcome::Denied => {
            say(&format!("{program} was denied"));
            EXIT_DENIED
        }
        EscalationOutcome::Refused => {
            say(&format!("{program} was refused"));
            EXIT_REFUSED
        }
        EscalationOutcome::Expired => {
            say("nobody decided in time");
            EXIT_EXPIRED
        }
        EscalationOutcome::Cancelled => EXIT_CANCELLED,
        EscalationOutcome::LaunchFailed => {
            say(&format!("the host could not start {program}"));
            EXIT_LAUNCH_FAILED
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<OsString> {
        list.iter().map(OsString::from).collect()
    }

    #[test]
    fn the_command_is_taken_as_given() {
        let parsed = parse(args(&["/usr/bin/id", "-u"])).unwrap().unwrap();
        assert_eq!(parsed.argv, ["/usr/bin/id", "-u"]);
        assert_eq!(parsed.timeout, DEFAULT_TIMEOUT);
        // Options end at the command: its own options are its arguments.
        let parsed = parse(args(&["--timeout", "5", "/bin/ls", "--timeout", "-l"]))
            .unwrap()
            .unwrap();
        assert_eq!(parsed.timeout, Duration::from_secs(5));
        assert_eq!(parsed.argv, ["/bin/ls", "--timeout", "-l"]);
        let parsed = parse(args(&["--", "-weird"])).unwrap().unwrap();
        assert_eq!(parsed.argv, ["-weird"]);
        // A relative path or a shell string goes to the host as given; the
        // host refuses it.
        let parsed = parse(args(&["id -u"])).unwrap().unwrap();
        assert_eq!(parsed.argv, ["id -u"]);
    }

    #[test]
    fn bad_command_lines_are_usage_errors() {
        for bad in [
            &[][..],
            &["--timeout"],
            &["--timeout", "0", "/bin/true"],
            &["--timeout", "601", "/bin/true"],
            &["--frobnicate", "/bin/true"],
        ] {
            let failure = parse(args(bad)).unwrap_err();
            assert_eq!(failure.status, EXIT_USAGE, "{bad:?}");
        }
        assert!(parse(args(&["--help"])).unwrap().is_none());
    }

    #[test]
    fn outcomes_have_distinct_statuses() {
        let result = |outcome, exit_code, terminating_signal| MailboxResult {
            protocol_version: ProtocolVersion::V1,
            session_binding: lazaret_proto::trust::SessionBinding {
                generation_identity: lazaret_proto::trust::GenerationIdentity {
                    agent_profile: "p".into(),
                    domain_id: lazaret_proto::ids::DomainId([0; 32]),
                    generation_id: lazaret_proto::ids::GenerationId(1),
                    configuration_fingerprint: lazaret_proto::ids::ConfigurationFingerprint(
                        [0; 32],
                    ),
                    generation_nonce: lazaret_proto::ids::GenerationNonce([0; 16]),
                    created_at: UnixTimeNs(0),
                },
                cli_id: lazaret_proto::ids::CliId([0; 16]),
                session_id: SessionId([0; 16]),
                credential_id: lazaret_proto::ids::CredentialId([0; 16]),
            },
            request_id: RequestId([0; 16]),
            outcome,
            exit_code,
            terminating_signal,
            chunk_count: 0,
            output_truncated: false,
            detail: String::new(),
            finished_at: UnixTimeNs(0),
        };
        use EscalationOutcome::*;
        assert_eq!(finish(&result(Completed, Some(3), None), "/x"), 3);
        assert_eq!(finish(&result(Completed, None, Some(9)), "/x"), 137);
        let statuses: Vec<u8> = [Denied, Refused, Expired, Cancelled, LaunchFailed]
            .into_iter()
            .map(|o| finish(&result(o, None, None), "/x"))
            .collect();
        assert_eq!(
            statuses,
            [
                EXIT_DENIED,
                EXIT_REFUSED,
                EXIT_EXPIRED,
                EXIT_CANCELLED,
                EXIT_LAUNCH_FAILED
            ]
        );
    }

    use lazaret_proto::ids::{
        CapabilityId, CliId, ConfigurationFingerprint, CredentialId, DomainId, GenerationId,
        GenerationNonce, Sha256Digest,
    };
    use lazaret_proto::mailbox::MailboxResultChunk;
    use lazaret_proto::trust::{
        GenerationIdentity, ProtocolCredential, ProtocolSigningKey, SessionBinding,
        SessionRequestCapability, TrustManifest,
    };

    fn binding() -> SessionBinding {
        SessionBinding {
            generation_identity: GenerationIdentity {
                agent_profile: "p".into(),
                domain_id: DomainId([1; 32]),
                generation_id: GenerationId(2),
                configuration_fingerprint: ConfigurationFingerprint([3; 32]),
                generation_nonce: GenerationNonce([4; 16]),
                created_at: UnixTimeNs(5),
            },
            cli_id: CliId([6; 16]),
            session_id: SessionId([6; 16]),
            credential_id: CredentialId([7; 16]),
        }
    }

    /// A scratch directory, removed when dropped.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new() -> Self {
            let name = format!(
                "lazaret-escalate-test-{}",
                lazaret_proto::ids::to_hex(&signing::random_bytes::<8>())
            );
            let path = std::env::temp_dir().join(name);
            std::fs::create_dir(&path).unwrap();
            Self(path)
        }

        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A mailbox in a scratch directory, with the host's signing key.
    fn scratch_mailbox() -> (Scratch, Mailbox, ProtocolSigningKey) {
        let dir = Scratch::new();
        let (requests, results) = (dir.path().join("requests"), dir.path().join("results"));
        std::fs::create_dir(&requests).unwrap();
        std::fs::create_dir(&results).unwrap();
        let (host_key, host_public) = signing::generate();
        let (sandbox_key, sandbox_public) = signing::generate();
        let binding = binding();
        let identity = binding.generation_identity.clone();
        let bundle = SandboxCredentialBundle {
            protocol_version: ProtocolVersion::V1,
            generation_identity: identity.clone(),
            trust_manifest: TrustManifest {
                protocol_version: ProtocolVersion::V1,
                generation_identity: identity.clone(),
                tls_ca_sha256: Sha256Digest([0; 32]),
                session_coordinator_credential_id: CredentialId([8; 16]),
                session_coordinator_public_key: host_public,
            },
            protocol_credential: ProtocolCredential {
                protocol_version: ProtocolVersion::V1,
                credential_id: binding.credential_id,
                generation_identity: identity,
                role: ProtocolCredentialRole::AgentSandbox,
                public_key: sandbox_public,
                signing_key: sandbox_key,
                issued_at: UnixTimeNs(5),
            },
            request_capability: SessionRequestCapability {
                protocol_version: ProtocolVersion::V1,
                capability_id: CapabilityId([9; 16]),
                session_binding: binding,
                expires_at: UnixTimeNs(u64::MAX),
            },
        };
        let mailbox = Mailbox {
            requests,
            results,
            bundle,
        };
        (dir, mailbox, host_key)
    }

    const REQUEST: RequestId = RequestId([0x42; 16]);

    fn chunk(sequence: u64, stream: ResultStream, bytes: &[u8]) -> MailboxRecord {
        MailboxRecord::ResultChunk(MailboxResultChunk {
            protocol_version: ProtocolVersion::V1,
            session_binding: binding(),
            request_id: REQUEST,
            sequence,
            stream,
            offset: 0,
            bytes: bytes.to_vec(),
        })
    }

    fn result(chunk_count: u64) -> MailboxRecord {
        MailboxRecord::Result(MailboxResult {
            protocol_version: ProtocolVersion::V1,
            session_binding: binding(),
            request_id: REQUEST,
            outcome: EscalationOutcome::Completed,
            exit_code: Some(4),
            terminating_signal: None,
            chunk_count,
            output_truncated: false,
            detail: String::new(),
            finished_at: UnixTimeNs(6),
        })
    }

    /// Puts `record`, signed with `key`, where the host puts a record of
    /// `kind`.
    fn put(mailbox: &Mailbox, key: &ProtocolSigningKey, record: &MailboxRecord, kind: RecordFile) {
        let bytes = signing::seal(key, record).unwrap();
        std::fs::write(mailbox.results.join(record_file_name(REQUEST, kind)), bytes).unwrap();
    }

    #[test]
    fn a_bounded_read_refuses_what_is_no_small_regular_file() {
        let dir = Scratch::new();
        let path = dir.path().join("f");
        assert!(read_bounded(&path, 4).unwrap().is_none());
        std::fs::write(&path, b"1234").unwrap();
        assert_eq!(read_bounded(&path, 4).unwrap().unwrap(), b"1234");
        std::fs::write(&path, b"12345").unwrap();
        assert!(read_bounded(&path, 4).is_err());
        assert!(read_bounded(dir.path(), 4).is_err());
    }

    #[test]
    fn only_the_hosts_records_for_this_request_are_received() {
        let (_dir, mailbox, host_key) = scratch_mailbox();
        let name = record_file_name(REQUEST, RecordFile::Result);
        assert!(mailbox.receive(&name, REQUEST).is_none());
        // Signed by the sandbox's own key: anyone in the sandbox could.
        let sandbox_key = mailbox.bundle.protocol_credential.signing_key.clone();
        put(&mailbox, &sandbox_key, &result(0), RecordFile::Result);
        assert!(mailbox.receive(&name, REQUEST).is_none());
        // Garbage, and a file too large to be a record.
        std::fs::write(mailbox.results.join(&name), b"garbage").unwrap();
        assert!(mailbox.receive(&name, REQUEST).is_none());
        let huge = vec![0u8; SignedProtocolRecord::MAX_ENCODED_LEN + 1];
        std::fs::write(mailbox.results.join(&name), huge).unwrap();
        assert!(mailbox.receive(&name, REQUEST).is_none());
        // The host's, but for another request.
        put(&mailbox, &host_key, &result(0), RecordFile::Result);
        assert!(mailbox.receive(&name, RequestId([1; 16])).is_none());
        let (record, _) = mailbox.receive(&name, REQUEST).unwrap();
        assert!(matches!(record, MailboxRecord::Result(r) if r.exit_code == Some(4)));
    }

    #[test]
    fn chunks_go_to_their_streams_in_order_and_are_removed() {
        let (_dir, mailbox, host_key) = scratch_mailbox();
        let mut wait = Wait::new(&mailbox, REQUEST, Duration::from_secs(60));
        let (mut out, mut err) = (Vec::new(), Vec::new());
        assert!(!wait.take_chunk(&mut out, &mut err));
        // Chunk 1 alone is not taken: 0 comes first.
        put(
            &mailbox,
            &host_key,
            &chunk(1, ResultStream::Stderr, b"two"),
            RecordFile::Chunk(1),
        );
        assert!(!wait.take_chunk(&mut out, &mut err));
        put(
            &mailbox,
            &host_key,
            &chunk(0, ResultStream::Stdout, b"one"),
            RecordFile::Chunk(0),
        );
        assert!(wait.take_chunk(&mut out, &mut err));
        assert!(wait.take_chunk(&mut out, &mut err));
        assert!(!wait.take_chunk(&mut out, &mut err));
        assert_eq!((&out[..], &err[..]), (&b"one"[..], &b"two"[..]));
        assert!(wait.answered);
        assert_eq!(wait.next_chunk, 2);
        assert_eq!(std::fs::read_dir(&mailbox.results).unwrap().count(), 0);
    }

    #[test]
    fn a_chunk_under_another_sequences_name_is_not_taken() {
        let (_dir, mailbox, host_key) = scratch_mailbox();
        let mut wait = Wait::new(&mailbox, REQUEST, Duration::from_secs(60));
        let (mut out, mut err) = (Vec::new(), Vec::new());
        // Chunk 5, renamed to where chunk 0 goes.
        put(
            &mailbox,
            &host_key,
            &chunk(5, ResultStream::Stdout, b"late"),
            RecordFile::Chunk(0),
        );
        assert!(!wait.take_chunk(&mut out, &mut err));
        assert!(out.is_empty());
        assert_eq!(wait.next_chunk, 0);
    }

    #[test]
    fn a_result_waits_for_its_chunks_then_is_acknowledged() {
        let (_dir, mailbox, host_key) = scratch_mailbox();
        let mut wait = Wait::new(&mailbox, REQUEST, Duration::from_secs(60));
        assert_eq!(wait.take_result("/x"), Looked::Nothing);
        put(&mailbox, &host_key, &result(1), RecordFile::Result);
        // Its one chunk has not been read: look again.
        assert_eq!(wait.take_result("/x"), Looked::Later);
        put(
            &mailbox,
            &host_key,
            &chunk(0, ResultStream::Stdout, b"x"),
            RecordFile::Chunk(0),
        );
        let (mut out, mut err) = (Vec::new(), Vec::new());
        assert!(wait.take_chunk(&mut out, &mut err));
        assert_eq!(wait.take_result("/x"), Looked::Finished(4));
        // The acknowledgement names the result's payload and the chunks.
        let ack_name = record_file_name(REQUEST, RecordFile::ResultAck);
        let bytes = std::fs::read(mailbox.requests.join(&ack_name)).unwrap();
        let record = signing::open(
            &bytes,
            &mailbox.bundle.protocol_credential.public_key,
            ProtocolCredentialRole::AgentSandbox,
        )
        .unwrap();
        let MailboxRecord::ResultAck(ack) = record else {
            panic!("{record:?}")
        };
        assert_eq!(ack.chunks_received, 1);
        let payload = codec::encode(&result(1)).unwrap();
        assert_eq!(
            ack.result_sha256.0,
            <[u8; 32]>::from(Sha256::digest(&payload))
        );
    }

    #[test]
    fn a_wait_ends_when_the_mailbox_is_gone_or_nobody_answers() {
        let (dir, mailbox, _) = scratch_mailbox();
        let mut wait = Wait::new(&mailbox, REQUEST, Duration::from_secs(60));
        assert!(wait.still_waiting().is_ok());
        std::fs::remove_dir(dir.path().join("requests")).unwrap();
        wait.backoff.looks = 63;
        let failure = wait.still_waiting().unwrap_err();
        assert_eq!(failure.status, EXIT_UNAVAILABLE);
        assert!(
            failure.message.contains("mailbox is gone"),
            "{}",
            failure.message
        );

        let (_dir, mailbox, _) = scratch_mailbox();
        let mut wait = Wait::new(&mailbox, REQUEST, Duration::ZERO);
        wait.answer_deadline = Instant::now() - Duration::from_secs(1);
        let failure = wait.still_waiting().unwrap_err();
        assert!(
            failure.message.contains("did not answer"),
            "{}",
            failure.message
        );
        // Once the host took it, a long command may outlive the deadline.
        wait.answered = true;
        assert!(wait.still_waiting().is_ok());
    }

    #[test]
    fn a_cancellation_is_sent_once_and_waited_for_a_while() {
        let (_dir, mailbox, _) = scratch_mailbox();
        let mut wait = Wait::new(&mailbox, REQUEST, Duration::from_secs(60));
        wait.cancel().unwrap();
        let name = record_file_name(REQUEST, RecordFile::Cancellation);
        let first = std::fs::read(mailbox.requests.join(&name)).unwrap();
        wait.cancel().unwrap();
        assert_eq!(std::fs::read(mailbox.requests.join(&name)).unwrap(), first);
        wait.cancelled_at = Some(Instant::now() - CANCEL_WAIT - Duration::from_secs(1));
        let failure = wait.still_waiting().unwrap_err();
        assert_eq!(failure.status, EXIT_CANCELLED);
    }
}
