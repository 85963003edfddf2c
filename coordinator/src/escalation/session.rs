//! One session's escalation: its mailbox read as it changes, each record
//! verified, each request classified and carried through the
//! [`Requests`] machine, prompts handed to the session's terminal, and the
//! host commands it approved run as tasks of their own.
//!
//! Owns the session's requests from the first verified record to their
//! removal. Driven by the session's task: [`SessionEscalation::next`] is
//! one branch of its `select!` (cancel-safe: every change happens between
//! awaits), [`SessionEscalation::answer`] takes the developer's answers
//! from the session's own connection only. Nothing a record says is
//! believed before its signature verified under this session's key, and
//! nothing that fails is answered beyond a log line, unless it is a
//! correctly signed new request, which is told why it was refused.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lazaret_proto::codec::EncodeError;
use lazaret_proto::common::{ProtocolVersion, UnixTimeNs};
use lazaret_proto::error_chain;
use lazaret_proto::ids::{RequestId, Sha256Digest};
use lazaret_proto::mailbox::{
    DeveloperDecision, DeveloperDecisionKind, EscalationOutcome, MAX_RESULT_DETAIL, MailboxRecord,
    MailboxRequest, MailboxResult, RecordFile, record_file_name,
};
use lazaret_proto::signing::SignError;
use lazaret_proto::terminal::{
    EscalationAnswer, EscalationPrompt, EscalationSettled, MAX_PROMPT_ARGS, MAX_PROMPT_ARGV_BYTES,
    MAX_PROMPT_REASON,
};
use lazaret_proto::trust::{ProtocolPublicKey, SessionRequestCapability};
use sha2::Digest;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;

use super::audit;
use super::classify::{Classification, classify, shown};
use super::launch::{Checked, LaunchError, ReapError};
use super::machine::{Admission, Effect, Rejection, Requests};
use super::mailbox::{GuestClaim, SessionMailbox, Taken};
use super::record::{stale, stale_request, verify};
use super::report::Ended;
use super::running::{Output, Ran, run};
use super::{Escalation, Watch};

/// How long the session's end waits for its commands to be ended.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// What the session must pass on.
#[derive(Debug)]
pub enum Event {
    /// Ask the developer, in the session's terminal.
    Prompt(EscalationPrompt),
    /// Take a prompt down unanswered.
    Settled(EscalationSettled),
    /// The session's leader wrote its identity inside the sandbox: the
    /// sandbox's claim, to record with the session.
    Guest(GuestClaim),
}

/// What is kept of a request between its admission and its result.
#[derive(Debug)]
struct Request {
    argv: Vec<String>,
    issued_at: UnixTimeNs,
    expires_at: UnixTimeNs,
    /// The rule that approves it, if one does.
    rule: Option<usize>,
    /// The executable as checked at admission, held open until it runs:
    /// what runs is the object the rule names or the developer was shown.
    executable: Option<Checked>,
    /// Why no rule did, for the prompt and the log.
    reason: String,
    /// Whether its request and end are logged (a request that ended at
    /// once may be only counted: [`audit::Refusals`]).
    logged: bool,
    /// Why its executable cannot run, for the developer's prompt and the
    /// log only: what goes back into the sandbox never depends on it.
    cannot_run: Option<String>,
    /// Who decided, for the log.
    decided_by: &'static str,
    /// What the result says beyond its outcome.
    detail: String,
    started: Option<Instant>,
    ran: Option<Ran>,
}

/// One session's escalation.
#[derive(Debug)]
pub struct SessionEscalation {
    shared: Arc<Escalation>,
    capability: SessionRequestCapability,
    sandbox_key: ProtocolPublicKey,
    prompts: bool,
    mailbox: Arc<SessionMailbox>,
    watch: Watch,
    requests: Requests,
    known: HashMap<RequestId, Request>,
    cancels: HashMap<RequestId, oneshot::Sender<()>>,
    done_tx: mpsc::UnboundedSender<(RequestId, Result<Ran, ReapError>)>,
    done_rx: mpsc::UnboundedReceiver<(RequestId, Result<Ran, ReapError>)>,
    events: VecDeque<Event>,
    complained: HashSet<Vec<u8>>,
    /// Whether the leader's identity was found (it is written once).
    guest_seen: bool,
    /// What each result written says, to check the sandbox's
    /// acknowledgement against: its payload's digest and chunk count.
    results: HashMap<RequestId, (Sha256Digest, u64)>,
    tasks: JoinSet<()>,
    /// Whether the watch still reports the mailbox's changes.
    watched: bool,
    /// The refusals of the current period, logged or counted.
    refusals: audit::Refusals,
}

impl SessionEscalation {
    pub(super) fn new(
        shared: Arc<Escalation>,
        capability: SessionRequestCapability,
        sandbox_key: ProtocolPublicKey,
        prompts: bool,
        mailbox: SessionMailbox,
        watch: Watch,
    ) -> Self {
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        Self {
            shared,
            capability,
            sandbox_key,
            prompts,
            mailbox: Arc::new(mailbox),
            watch,
            requests: Requests::new(),
            known: HashMap::new(),
            cancels: HashMap::new(),
            done_tx,
            done_rx,
            events: VecDeque::new(),
            complained: HashSet::new(),
            guest_seen: false,
            results: HashMap::new(),
            tasks: JoinSet::new(),
            watched: true,
            refusals: audit::Refusals::default(),
        }
    }

    /// The next thing the session must pass on, once there is one.
    /// Meanwhile: reads the mailbox as it changes, expires requests, and
    /// finishes the commands that ended. Cancel-safe.
    pub async fn next(&mut self) -> Event {
        loop {
            if let Some(event) = self.events.pop_front() {
                return event;
            }
            let deadline = self.requests.next_deadline();
            let until_deadline = async {
                match deadline {
                    Some(at) => tokio::time::sleep(at.since(UnixTimeNs::now())).await,
                    None => std::future::pending().await,
                }
            };
            let summary_due = self.refusals.due();
            let until_summary = async {
                match summary_due {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                changed = self.watch.requests.changed(), if self.watched => {
                    match changed {
                        Ok(()) => self.read_mailbox(),
                        Err(_) => self.watched = false,
                    }
                }
                Some((id, ran)) = self.done_rx.recv() => self.command_ended(id, ran),
                () = until_deadline => {
                    let effects = self.requests.expire(UnixTimeNs::now());
                    self.apply(effects);
                }
                () = until_summary => self.sum_up_refusals(false),
                Some(_) = self.tasks.join_next(), if !self.tasks.is_empty() => {}
            }
        }
    }

    /// The developer answered a prompt in this session's terminal.
    pub fn answer(&mut self, mut answer: EscalationAnswer) {
        // A command that cannot run is only ever denied, so that its
        // answer reads as any other denial.
        let runnable = self
            .known
            .get(&answer.request_id)
            .is_none_or(|r| r.cannot_run.is_none());
        if !runnable {
            answer.decision = DeveloperDecisionKind::Deny;
        }
        let effects = self
            .requests
            .answer(answer.request_id, answer.decision, UnixTimeNs::now());
        if effects.is_empty() {
            tracing::warn!(
                request = %answer.request_id,
                "an answer named no prompt this session shows, or came after it expired; ignored"
            );
            return;
        }
        if let Some(request) = self.known.get_mut(&answer.request_id) {
            request.decided_by = "the developer";
            tracing::info!(
                request = %answer.request_id,
                decision = ?answer.decision,
                decided_by = "developer",
                "escalation decided"
            );
            if answer.decision == DeveloperDecisionKind::Deny {
                request.detail = "the developer denied it".into();
            }
        }
        if answer.decision == DeveloperDecisionKind::Deny {
            self.put_decision(answer.request_id, DeveloperDecisionKind::Deny);
        }
        self.apply(effects);
    }

    /// The session ends: its waiting requests are cancelled, its commands
    /// ended (within a bound); its watch and mailbox go as it is dropped.
    pub async fn close(mut self) {
        let effects = self.requests.close();
        self.apply(effects);
        self.sum_up_refusals(true);
        let _ = tokio::time::timeout(CLOSE_WAIT, async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
    }

    /// Takes what arrived in `requests/`, and the leader's identity once
    /// it is there.
    fn read_mailbox(&mut self) {
        if !self.guest_seen
            && let Some(guest) = self.mailbox.guest()
        {
            self.guest_seen = true;
            self.events.push_back(Event::Guest(guest));
        }
        let taken = match self.mailbox.take(&mut self.complained) {
            Ok(taken) => taken,
            Err(e) => {
                tracing::warn!("cannot read this session's mailbox: {e}");
                return;
            }
        };
        for item in taken {
            match item {
                Taken::File { name, bytes } => self.record(&name, &bytes),
                Taken::Refused { name, why } => {
                    if self.refusal(audit::Refused::File) {
                        tracing::warn!(
                            file = %audit::field(&name),
                            "escalation mailbox file refused: {}",
                            audit::field(&error_chain(&why))
                        );
                    }
                }
            }
        }
    }

    /// Whether a refusal now is logged: the first ones of each period
    /// are, the rest are counted ([`audit::Refusals`]).
    fn refusal(&mut self, kind: audit::Refused) -> bool {
        let now = Instant::now();
        self.sum_up_refusals(false);
        self.refusals.admit(kind, now)
    }

    /// Logs how many refusals went unlogged in a period that ended (or,
    /// `closing`, in the current one).
    fn sum_up_refusals(&mut self, closing: bool) {
        let Some(unlogged) = self.refusals.summary(Instant::now(), closing) else {
            return;
        };
        tracing::warn!(
            files = unlogged.files,
            records = unlogged.records,
            requests = unlogged.requests,
            "{} escalation refusals of this session were not logged (at most {} are in {} s): \
             {} mailbox files, {} records, {} requests refused or denied at once",
            unlogged.total(),
            audit::REFUSALS_PER_PERIOD,
            audit::REFUSAL_PERIOD.as_secs(),
            unlogged.files,
            unlogged.records,
            unlogged.requests,
        );
    }

    /// Logs a record refused (within the rate of [`Self::refusal`]).
    fn refused_record(&mut self, name: &str, request: Option<RequestId>, why: &str) {
        if self.refusal(audit::Refused::Record) {
            tracing::warn!(
                file = %audit::field(name),
                request = request.map(tracing::field::display),
                "escalation record refused: {}",
                audit::field(why)
            );
        }
    }

    /// Verifies and acts on one record file.
    fn record(&mut self, name: &str, bytes: &[u8]) {
        let now = UnixTimeNs::now();
        let record = match verify(name, bytes, &self.sandbox_key, &self.capability, now) {
            Ok(record) => record,
            Err(why) => return self.refused_record(name, None, &error_chain(&why)),
        };
        match record {
            MailboxRecord::Request(request) => self.request(name, request, now),
            MailboxRecord::Cancellation(cancel) => {
                let id = Some(cancel.request_id);
                if let Some(why) = stale(cancel.issued_at, now) {
                    let why = format!("the cancellation is stale: {why}");
                    return self.refused_record(name, id, &why);
                }
                if !self.requests.is_open(cancel.request_id) {
                    let why = "it cancels no open request of this session";
                    return self.refused_record(name, id, why);
                }
                tracing::info!(request = %cancel.request_id, "escalation cancelled by the sandbox");
                if let Some(request) = self.known.get_mut(&cancel.request_id) {
                    request.detail = "cancelled from inside the sandbox".into();
                }
                let effects = self.requests.cancel(cancel.request_id);
                self.apply(effects);
            }
            MailboxRecord::ResultAck(ack) => {
                let effects = self.requests.acknowledged(ack.request_id);
                if !effects.is_empty()
                    && let Some((digest, chunks)) = self.results.remove(&ack.request_id)
                    && (digest != ack.result_sha256 || chunks != ack.chunks_received)
                {
                    tracing::warn!(
                        request = %ack.request_id,
                        chunks_written = chunks,
                        chunks_received = ack.chunks_received,
                        "the sandbox acknowledged another result than the one written, or \
                         missed some of its output"
                    );
                }
                self.apply(effects);
            }
            _ => {}
        }
    }

    /// Checks, classifies and admits a verified request.
    fn request(&mut self, name: &str, request: MailboxRequest, now: UnixTimeNs) {
        let id = request.request_id;
        if self.requests.has_seen(id) {
            let why = "its request id was used before (a replay)";
            return self.refused_record(name, Some(id), why);
        }
        let stale = stale_request(&request, now);
        let mut entry = Request {
            argv: request.command_argv,
            issued_at: request.issued_at,
            expires_at: request.expires_at,
            rule: None,
            executable: None,
            reason: String::new(),
            logged: true,
            cannot_run: None,
            decided_by: "policy",
            detail: String::new(),
            started: None,
            ran: None,
        };
        let (classification, admission) = match stale {
            Some(why) => (
                "stale",
                Admission::End(self.refuse(&mut entry, why.to_string())),
            ),
            None => self.admit(&mut entry),
        };
        match self.requests.admit(id, admission) {
            Err(Rejection::Replayed) => {}
            Err(Rejection::Busy) => {
                let why = format!(
                    "this session used all its {} request ids; further requests need a new \
                     session",
                    super::machine::MAX_REQUESTS_PER_SESSION
                );
                self.refused_record(name, Some(id), &why);
            }
            Ok(effects) => {
                // A request that ends at once (refused, or denied without
                // asking) is a refusal, logged at its rate.
                let at_once = matches!(admission, Admission::End(_))
                    || matches!(effects.as_slice(), [Effect::Busy(_)]);
                entry.logged = !at_once || self.refusal(audit::Refused::Request);
                if entry.logged {
                    tracing::info!(
                        request = %id,
                        argv = %audit::argv(&entry.argv),
                        classification,
                        rule = entry.rule,
                        reason = %audit::field(&entry.reason),
                        cannot_run = entry.cannot_run.as_deref().map(audit::field).as_deref(),
                        "escalation requested"
                    );
                }
                self.known.insert(id, entry);
                self.apply(effects);
            }
        }
    }

    /// Records why a request is refused, and the outcome.
    fn refuse(&self, entry: &mut Request, why: String) -> EscalationOutcome {
        entry.detail = why;
        EscalationOutcome::Refused
    }

    /// The classification and admission of a fresh request.
    fn admit(&self, entry: &mut Request) -> (&'static str, Admission) {
        let shared = &self.shared;
        if !shared.enabled {
            let why = format!(
                "escalation is off for profile `{0}`; set [profiles.{0}.escalation] \
                 enabled = true to allow requests",
                shared.profile
            );
            return ("disabled", Admission::End(self.refuse(entry, why)));
        }
        match classify(&entry.argv, &shared.rules) {
            Classification::AutoApproved { rule } => {
                entry.rule = Some(rule);
                entry.decided_by = "an auto-approval rule";
                match shared.launcher.rule_executable(rule) {
                    Ok(checked) => {
                        entry.executable = Some(checked);
                        ("auto-approved", Admission::Approved)
                    }
                    Err(why) => {
                        let why = format!("auto_approve[{rule}]: {}", error_chain(&why));
                        ("auto-approved", Admission::End(self.refuse(entry, why)))
                    }
                }
            }
            Classification::AskDeveloper { reason } => {
                entry.reason = reason;
                if !self.prompts {
                    entry.detail = format!(
                        "{}; this session has no terminal to ask the developer in, so only \
                         auto-approval rules apply",
                        entry.reason
                    );
                    return ("no rule", Admission::End(EscalationOutcome::Denied));
                }
                let bytes: usize = entry.argv.iter().map(String::len).sum();
                if entry.argv.len() > MAX_PROMPT_ARGS || bytes > MAX_PROMPT_ARGV_BYTES {
                    let why = format!(
                        "no rule approves it, and it is too long to show the developer \
                         (at most {MAX_PROMPT_ARGS} words and {MAX_PROMPT_ARGV_BYTES} bytes)"
                    );
                    return ("no rule", Admission::End(self.refuse(entry, why)));
                }
                // Whether the executable can run is said on the prompt
                // only: a request the developer may be asked about is
                // asked about, whatever is (or is not) at that path, so
                // the sandbox cannot probe the host's files with it.
                match shared.launcher.requested_executable(&entry.argv[0]) {
                    Ok(checked) => {
                        if checked.canonical.as_os_str() != entry.argv[0].as_str() {
                            entry.reason.push_str(&format!(
                                "; it runs {}",
                                shown(&[checked.canonical.display().to_string()])
                            ));
                        }
                        entry.executable = Some(checked);
                    }
                    Err(why) => entry.cannot_run = Some(error_chain(&why)),
                }
                (
                    "ask the developer",
                    Admission::Ask {
                        deadline: entry.expires_at,
                    },
                )
            }
            Classification::RequiresShell { reason } => (
                "requires a shell",
                Admission::End(self.refuse(entry, reason)),
            ),
            Classification::Invalid { reason } => {
                ("invalid", Admission::End(self.refuse(entry, reason)))
            }
        }
    }

    /// Carries out what the machine decided.
    fn apply(&mut self, effects: Vec<Effect>) {
        for effect in effects {
            match effect {
                Effect::Prompt(id) => {
                    if let Some(request) = self.known.get(&id) {
                        let mut reason = request.reason.clone();
                        truncate(&mut reason, MAX_PROMPT_REASON);
                        let cannot_run = request.cannot_run.clone().map(|mut why| {
                            truncate(&mut why, MAX_PROMPT_REASON);
                            why
                        });
                        self.events.push_back(Event::Prompt(EscalationPrompt {
                            session_id: self.capability.session_binding.session_id,
                            request_id: id,
                            command_argv: request.argv.clone(),
                            requested_at: request.issued_at,
                            expires_at: request.expires_at,
                            reason,
                            cannot_run,
                        }));
                    }
                }
                Effect::Withdraw(id, outcome) => {
                    self.events.push_back(Event::Settled(EscalationSettled {
                        session_id: self.capability.session_binding.session_id,
                        request_id: id,
                        outcome,
                    }));
                }
                Effect::Launch(id) => self.launch(id),
                Effect::Kill(id) => {
                    if let Some(cancel) = self.cancels.remove(&id) {
                        let _ = cancel.send(());
                    }
                }
                Effect::Finish(id, outcome) => self.finish(id, outcome),
                Effect::Busy(id) => {
                    if let Some(request) = self.known.get_mut(&id) {
                        request.detail = format!(
                            "too many of this session's requests wait or run at once (at most \
                             {} waiting for the developer, {} running); retry once one ended",
                            super::machine::MAX_WAITING,
                            super::machine::MAX_RUNNING
                        );
                    }
                    self.finish(id, EscalationOutcome::Refused);
                }
                Effect::Forget(id) => self.forget(id),
            }
        }
    }

    /// Approves and starts request `id`'s command.
    fn launch(&mut self, id: RequestId) {
        let Some(request) = self.known.get_mut(&id) else {
            return;
        };
        // The object checked at admission runs, checked once more now:
        // its mode or owner may have changed while the developer decided.
        let launcher = &self.shared.launcher;
        let spawned = match request.executable.take() {
            Some(exe) => launcher
                .recheck(&exe)
                .map_err(LaunchError::from)
                .and_then(|()| launcher.spawn(&exe, &request.argv)),
            None => Err(LaunchError::Unchecked),
        };
        let command = match spawned {
            Ok(command) => command,
            Err(why) => {
                let why = error_chain(&why);
                tracing::warn!(request = %id, "escalation not launched: {why}");
                request.detail = why;
                let effects = self.requests.ended(id, EscalationOutcome::LaunchFailed);
                self.apply(effects);
                return;
            }
        };
        request.started = Some(Instant::now());
        tracing::info!(request = %id, decided_by = request.decided_by, "escalation launched");
        self.put_decision(id, DeveloperDecisionKind::Approve);
        let (cancel, cancelled) = oneshot::channel();
        self.cancels.insert(id, cancel);
        let output = Output {
            shared: Arc::clone(&self.shared),
            mailbox: Arc::clone(&self.mailbox),
            binding: self.capability.session_binding.clone(),
            request_id: id,
            changes: self.watch.results.clone(),
        };
        let done = self.done_tx.clone();
        self.tasks.spawn(async move {
            let ran = run(command, output, cancelled).await;
            let _ = done.send((id, ran));
        });
    }

    /// A command's task ended.
    fn command_ended(&mut self, id: RequestId, ran: Result<Ran, ReapError>) {
        self.cancels.remove(&id);
        let outcome = match ran {
            Ok(ran) => {
                let outcome = if ran.stopped.is_some() {
                    EscalationOutcome::Cancelled
                } else {
                    EscalationOutcome::Completed
                };
                if let Some(request) = self.known.get_mut(&id) {
                    if let Some(why) = &ran.stopped {
                        request.detail = error_chain(why);
                    }
                    request.ran = Some(ran);
                }
                outcome
            }
            Err(why) => {
                if let Some(request) = self.known.get_mut(&id) {
                    request.detail = error_chain(&why);
                }
                EscalationOutcome::LaunchFailed
            }
        };
        let effects = self.requests.ended(id, outcome);
        self.apply(effects);
    }

    /// Writes the host's decision record for `id`.
    fn put_decision(&self, id: RequestId, decision: DeveloperDecisionKind) {
        let Some(request) = self.known.get(&id) else {
            return;
        };
        let digest = lazaret_proto::mailbox::argv_digest(&request.argv);
        let record = MailboxRecord::Decision(DeveloperDecision {
            protocol_version: ProtocolVersion::V1,
            session_binding: self.capability.session_binding.clone(),
            request_id: id,
            decision,
            command_argv_sha256: digest,
            decided_at: UnixTimeNs::now(),
        });
        self.put(id, RecordFile::Decision, &record);
    }

    fn put(&self, id: RequestId, kind: RecordFile, record: &MailboxRecord) {
        let payload = lazaret_proto::codec::encode(record).map_err(PutError::Encode);
        self.put_payload(id, kind, payload);
    }

    /// Signs and writes an encoded record.
    fn put_payload(&self, id: RequestId, kind: RecordFile, payload: Result<Vec<u8>, PutError>) {
        let written = payload.and_then(|payload| {
            let bytes = self.shared.signer.seal_payload(payload)?;
            self.mailbox
                .put_result(&record_file_name(id, kind), &bytes)
                .map_err(PutError::Write)
        });
        if let Err(e) = written {
            tracing::warn!(
                request = %id,
                "cannot write to this session's mailbox: {}",
                error_chain(&e)
            );
        }
    }

    /// Writes request `id`'s result and logs how it ended.
    fn finish(&mut self, id: RequestId, outcome: EscalationOutcome) {
        let Some(mut request) = self.known.remove(&id) else {
            return;
        };
        let ran = request.ran.take().unwrap_or(Ran {
            ended: None,
            chunks: 0,
            truncated: false,
            stopped: None,
        });
        let (exit_code, terminating_signal) = match ran.ended {
            Some(Ended::Exited(code)) if outcome == EscalationOutcome::Completed => {
                (Some(code), None)
            }
            Some(Ended::Signaled(signal)) if outcome == EscalationOutcome::Completed => {
                (None, Some(signal))
            }
            _ => (None, None),
        };
        if request.detail.is_empty() {
            request.detail = match outcome {
                EscalationOutcome::Expired => "nobody answered the prompt in time".into(),
                EscalationOutcome::Cancelled => "cancelled".into(),
                _ => String::new(),
            };
        }
        truncate(&mut request.detail, MAX_RESULT_DETAIL);
        if request.logged {
            tracing::info!(
                request = %id,
                argv = %audit::argv(&request.argv),
                outcome = ?outcome,
                decided_by = request.decided_by,
                exit_code,
                signal = terminating_signal,
                duration_ms = request.started.map(|s| s.elapsed().as_millis() as u64),
                output_chunks = ran.chunks,
                output_truncated = ran.truncated,
                detail = %audit::field(&request.detail),
                "escalation finished"
            );
        }
        let record = MailboxRecord::Result(MailboxResult {
            protocol_version: ProtocolVersion::V1,
            session_binding: self.capability.session_binding.clone(),
            request_id: id,
            outcome,
            exit_code,
            terminating_signal,
            chunk_count: ran.chunks,
            output_truncated: ran.truncated,
            detail: request.detail,
            finished_at: UnixTimeNs::now(),
        });
        // Its digest is what the sandbox's acknowledgement must name.
        let payload = lazaret_proto::codec::encode(&record).map_err(PutError::Encode);
        if let Ok(bytes) = &payload {
            let digest = Sha256Digest(sha2::Sha256::digest(bytes).into());
            self.results.insert(id, (digest, ran.chunks));
        }
        self.put_payload(id, RecordFile::Result, payload);
    }

    /// Removes what is left of request `id` in `results/`.
    fn forget(&mut self, id: RequestId) {
        for kind in [RecordFile::Decision, RecordFile::Result] {
            self.mailbox.remove_result(&record_file_name(id, kind));
        }
    }
}

/// Cuts `text` to at most `max` bytes, on a character boundary.
fn truncate(text: &mut String, max: usize) {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
}

/// Why a record for the sandbox was not written to the mailbox.
#[derive(Debug, thiserror::Error)]
enum PutError {
    /// The record does not encode.
    #[error("cannot encode the record")]
    Encode(#[source] EncodeError),
    /// The encoded record could not be signed.
    #[error(transparent)]
    Seal(#[from] SignError),
    /// The signed record could not be written.
    #[error("cannot write the record")]
    Write(#[source] std::io::Error),
}
