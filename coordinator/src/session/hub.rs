//! The Session Coordinator's server side: one task per Client Session on
//! the Host Coordinator's event loop, each holding its TLS connection
//! (`tokio-rustls`), its host PTY master (or pipes), its `runsc exec` pidfd
//! and its CLI's pidfd, and a hub that routes the supervisor's reports to
//! the session they name.
//!
//! Owns each session from the TLS handshake to its recorded end. Nothing a
//! session does blocks the loop: input a process does not read waits in a
//! bounded buffer and the session stops reading its connection
//! (backpressure); output waits for the client; a Domain going down ends
//! every session within a bound. Trusts a peer only after the TLS
//! handshake proved a client certificate of this generation's CA and the
//! socket's peer uid equals the coordinator's; the `session_id` an event
//! carries must be the connection's own.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lazaret_proto::channel::Received;
use lazaret_proto::codec::WireRecord;
use lazaret_proto::common::UnixTimeNs;
use lazaret_proto::control::SessionSummary;
use lazaret_proto::ids::{CliId, ContainerId, GenerationId, RequestId, SessionId};
use lazaret_proto::session::{OpenSession, SessionOpened};
use lazaret_proto::store::{Session, SessionTerminal, SessionTerminalState};
use lazaret_proto::supervisor::{
    ExecRequest, ExecSignal, ExecStdio, FdList, SupervisorReport, SupervisorRequest,
};
use lazaret_proto::terminal::{
    GuestProcessIdentity, MAX_TERMINAL_CHUNK, PtyIdentity, SessionExit, SessionExitOutcome,
    SessionTerminalEvent, SessionTerminalMessage, TerminalOutput,
};
use rustix::process::{Signal, pidfd_send_signal};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, watch};

use super::stream::FdStream;
use super::tls::{FrameBuffer, FrameError, write_frame};
use crate::aio::{AsyncChannel, Exit, Stream, exited};
use crate::escalation::Escalation;
use crate::escalation::mailbox::GuestClaim;
use crate::escalation::session::{Event, SessionEscalation};
use crate::store::DomainStore;

/// The supervisor link, shared by the sessions that send `Exec` on it.
pub type SupervisorLink = AsyncChannel<SupervisorRequest, SupervisorReport>;

/// The most sessions a Domain serves at once.
pub const MAX_SESSIONS: usize = 128;

/// The most connections still proving who they are at once; more are
/// closed unanswered.
const MAX_HANDSHAKES: usize = 32;

/// How long a client has to complete TLS and ask for its session.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the sandbox has to start a session's process.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How long one write to a client may wait: a client that stops reading
/// (a stopped CLI) ends its session instead of holding it.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long after a window's change its programs are told, so that a burst
/// of changes (a window dragged to a new size) is told once. A resize to
/// the size the window has already is a request to draw again: the runtime
/// passes no change of size on by itself.
const WINDOW_CHANGE_DELAY: Duration = Duration::from_millis(40);

/// How long a killed session process has to report its exit before its
/// `runsc exec` is killed.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// How long a session's last message may take when the Domain goes down.
const FAREWELL_TIMEOUT: Duration = Duration::from_millis(200);

/// Input a session holds for a process that does not read it; past this it
/// stops reading its connection.
const INPUT_BOUND: usize = 256 * 1024;

/// The output pipe's capacity for sessions without a terminal.
const OUTPUT_PIPE_SIZE: usize = 1 << 20;

/// How many output chunks one wakeup relays at most: enough to spare
/// system calls, few enough that ten sessions relaying at once hold a
/// megabyte between them.
const READS_PER_WAKEUP: usize = 4;

/// What the hub tells one session.
#[derive(Debug)]
enum HubEvent {
    /// Its process started; here is the pidfd of its `runsc exec`.
    Started(OwnedFd),
    /// Its process could not start.
    Failed(String),
    /// Its process exited.
    Exited { code: u8, signaled: bool },
}

/// A session's entry in the hub.
#[derive(Debug)]
struct Route {
    events: mpsc::UnboundedSender<HubEvent>,
    summary: SessionSummary,
}

/// Routes supervisor reports to sessions, and holds what sessions share.
pub struct Hub {
    supervisor: Arc<SupervisorLink>,
    escalation: Arc<Escalation>,
    /// The gVisor container sessions run in.
    container: ContainerId,
    environment: OwnedFd,
    store: Arc<DomainStore>,
    generation: GenerationId,
    acceptor: tokio_rustls::TlsAcceptor,
    routes: Mutex<HashMap<SessionId, Route>>,
    handshakes: Arc<tokio::sync::Semaphore>,
    /// Set once the Domain goes down; every session ends on it.
    down: watch::Sender<bool>,
    tasks: Mutex<tokio::task::JoinSet<()>>,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub")
            .field("generation", &self.generation)
            .field("sessions", &self.routes().len())
            .finish_non_exhaustive()
    }
}

impl Hub {
    /// A hub for one generation.
    pub fn new(
        supervisor: Arc<SupervisorLink>,
        escalation: Arc<Escalation>,
        container: ContainerId,
        environment: OwnedFd,
        store: Arc<DomainStore>,
        generation: GenerationId,
        server: Arc<rustls::ServerConfig>,
    ) -> Arc<Self> {
        Arc::new(Self {
            supervisor,
            escalation,
            container,
            environment,
            store,
            generation,
            acceptor: tokio_rustls::TlsAcceptor::from(server),
            routes: Mutex::new(HashMap::new()),
            handshakes: Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES)),
            down: watch::Sender::new(false),
            tasks: Mutex::new(tokio::task::JoinSet::new()),
        })
    }

    /// The supervisor link the sessions share.
    pub fn supervisor(&self) -> Arc<SupervisorLink> {
        Arc::clone(&self.supervisor)
    }

    fn routes(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, Route>> {
        self.routes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The sessions attached now.
    pub fn sessions(&self) -> Vec<SessionSummary> {
        let mut out: Vec<SessionSummary> =
            self.routes().values().map(|r| r.summary.clone()).collect();
        out.sort_by_key(|s| s.opened_at);
        out
    }

    /// Passes one supervisor report to the session it names. Returns the
    /// report back when it names no session.
    pub fn dispatch(&self, received: Received<SupervisorReport>) -> Option<SupervisorReport> {
        let Received { message, fds } = received;
        let (session_id, event) = match message {
            SupervisorReport::ExecStarted {
                session_id,
                process,
            } => match process.pick(fds) {
                Some(pidfd) => (session_id, HubEvent::Started(pidfd)),
                None => (
                    session_id,
                    HubEvent::Failed("no pidfd for runsc exec".into()),
                ),
            },
            SupervisorReport::ExecFailed {
                session_id,
                failure,
            } => (session_id, HubEvent::Failed(failure.to_string())),
            SupervisorReport::ExecExited {
                session_id,
                exit_code,
                signaled,
            } => (
                session_id,
                HubEvent::Exited {
                    code: exit_code,
                    signaled,
                },
            ),
            other => return Some(other),
        };
        let unrouted = match self.routes().get(&session_id) {
            Some(route) => route.events.send(event).err().map(|e| e.0),
            None => Some(event),
        };
        // A process whose session already gave up waiting (its client went,
        // or the start took too long) has no owner: it must not run on,
        // inside the sandbox (its pid 1 then ends the rest of its session)
        // or as its `runsc exec`.
        if let Some(HubEvent::Started(pidfd)) = unrouted {
            let supervisor = Arc::clone(&self.supervisor);
            tokio::spawn(async move {
                let kill = SupervisorRequest::SignalExec {
                    session_id,
                    signal: ExecSignal::Kill,
                };
                let _ = supervisor.send(&kill, &[]).await;
                let _ = pidfd_send_signal(&pidfd, Signal::KILL);
            });
        }
        None
    }

    /// Ends every session: each is told the Domain goes down and gets
    /// `within` to say goodbye; what is left then is cut off and recorded
    /// closed.
    pub async fn domain_down(&self, within: Duration) {
        self.down.send_replace(true);
        let mut tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|e| e.into_inner()));
        let all_ended =
            tokio::time::timeout(within, async { while tasks.join_next().await.is_some() {} })
                .await;
        if all_ended.is_err() {
            tasks.abort_all();
            while tasks.join_next().await.is_some() {}
        }
        let left: Vec<SessionId> = self.routes().drain().map(|(id, _)| id).collect();
        for session_id in left {
            self.record(session_id, SessionTerminalState::Closed, true, None);
        }
    }

    /// Serves one accepted connection on its own task. A connection past
    /// the bound on handshakes in progress is closed at once.
    pub fn spawn_session(self: &Arc<Self>, socket: tokio::net::UnixStream) {
        let Ok(permit) = Arc::clone(&self.handshakes).try_acquire_owned() else {
            tracing::warn!("too many session handshakes at once; closed one");
            return;
        };
        let hub = Arc::clone(self);
        let mut tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        // Reap finished tasks so the set holds only live sessions.
        while tasks.try_join_next().is_some() {}
        let session_id = SessionId(super::random_bytes());
        let span = tracing::info_span!("session", lazaret_session = %session_id.to_hex());
        tasks.spawn(tracing::Instrument::instrument(
            async move {
                if let Err(e) = hub.serve(socket, permit, session_id).await {
                    tracing::warn!("session refused or failed: {}", crate::lifecycle::chain(&e));
                }
            },
            span,
        ));
    }

    async fn serve(
        self: &Arc<Self>,
        socket: tokio::net::UnixStream,
        handshake: tokio::sync::OwnedSemaphorePermit,
        session_id: SessionId,
    ) -> Result<(), SessionError> {
        use lazaret_proto::channel::{ChannelError, require_peer_uid};
        require_peer_uid(socket.as_fd(), rustix::process::getuid()).map_err(|e| match e {
            ChannelError::PeerUidMismatch { found, .. } => {
                SessionError::Peer(format!("uid {found} is not this Domain's owner"))
            }
            e => SessionError::Peer(crate::lifecycle::chain(&e)),
        })?;
        // The CLI, watched so that a session whose client died never looks
        // alive, even while its input is held back.
        let client = crate::sys::peer_pidfd(socket.as_fd())
            .and_then(|pidfd| Exit::watch(pidfd.as_fd()))
            .ok();
        let (mut link, open) = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
            let mut link = Link::new(self.acceptor.accept(FdStream::new(socket)).await?);
            let open = link.recv::<OpenSession>().await?;
            Ok::<_, SessionError>((link, open))
        })
        .await
        .map_err(|_| SessionError::Peer("no session request within 10 s".into()))??;
        drop(handshake);
        let passed = link.take_fds();

        let (events, inbox) = mpsc::unbounded_channel();
        let summary = SessionSummary {
            session_id,
            command: open.command.clone().unwrap_or_default(),
            terminal: open.terminal,
            opened_at: UnixTimeNs::now(),
            guest: None,
        };
        let opened_at = summary.opened_at;
        let full = {
            let mut routes = self.routes();
            let full = routes.len() >= MAX_SESSIONS;
            if !full {
                routes.insert(session_id, Route { events, summary });
            }
            full
        };
        if full {
            let reason = format!(
                "the Domain serves {MAX_SESSIONS} sessions at once, its most; end one first"
            );
            return link.send(&SessionOpened::Refused { reason }).await;
        }
        let mut down = self.down.subscribe();
        let mut session = Running {
            hub: self,
            session_id,
            opened_at,
            inbox,
            client,
            opened: false,
            guest: None,
        };
        let result = tokio::select! {
            result = session.run(&mut link, &open, passed) => result,
            () = async { let _ = down.wait_for(|down| *down).await; } => {
                // The whole sandbox stops next; nothing to kill here. A
                // client still waiting for its session hears a refusal, one
                // whose session runs hears its end.
                let farewell = async {
                    if session.opened {
                        let exit = SessionExit {
                            session_id,
                            outcome: SessionExitOutcome::DomainDown,
                            exit_code: 255,
                        };
                        link.send(&SessionTerminalMessage::Exit(exit)).await
                    } else {
                        let reason = "the Domain is going down".to_owned();
                        link.send(&SessionOpened::Refused { reason }).await
                    }
                };
                let _ = tokio::time::timeout(FAREWELL_TIMEOUT, farewell).await;
                session.record(SessionTerminalState::Closed, true, None);
                tracing::info!("session ended: the Domain went down");
                Ok(())
            }
        };
        self.routes().remove(&session_id);
        let _ = tokio::time::timeout(FAREWELL_TIMEOUT, link.close()).await;
        result
    }

    fn record(
        &self,
        session_id: SessionId,
        state: SessionTerminalState,
        closed: bool,
        pty: Option<PtyIdentity>,
    ) {
        let now = UnixTimeNs::now();
        let opened_at = self
            .routes()
            .get(&session_id)
            .map(|r| r.summary.opened_at)
            .unwrap_or(now);
        let session = Session {
            generation_id: self.generation,
            session_id,
            cli_id: CliId(session_id.0),
            opened_at,
            closed_at: closed.then_some(now),
        };
        let terminal = SessionTerminal {
            generation_id: self.generation,
            session_id,
            state,
            pty,
            guest_process: None,
        };
        let _ = self.store.put_session_state(&session, &terminal);
    }
}

/// One session being served.
struct Running<'a> {
    hub: &'a Hub,
    session_id: SessionId,
    opened_at: UnixTimeNs,
    inbox: mpsc::UnboundedReceiver<HubEvent>,
    client: Option<Exit>,
    /// Whether the client was told its session opened.
    opened: bool,
    /// The session leader inside the sandbox, once known.
    guest: Option<GuestProcessIdentity>,
}

impl Running<'_> {
    fn record(&self, state: SessionTerminalState, closed: bool, pty: Option<PtyIdentity>) {
        let now = UnixTimeNs::now();
        let session = Session {
            generation_id: self.hub.generation,
            session_id: self.session_id,
            cli_id: CliId(self.session_id.0),
            opened_at: self.opened_at,
            closed_at: closed.then_some(now),
        };
        let terminal = SessionTerminal {
            generation_id: self.hub.generation,
            session_id: self.session_id,
            state,
            pty,
            guest_process: self.guest.clone(),
        };
        let _ = self.hub.store.put_session_state(&session, &terminal);
    }

    /// Records the identity the session's leader claims inside the
    /// sandbox, with the session and in `status`.
    fn record_guest(&mut self, guest: GuestClaim, io: &SessionIo) {
        self.guest = Some(GuestProcessIdentity {
            container_id: self.hub.container,
            leader_pid: guest.pid,
            leader_start_time: guest.start_time,
            process_group_id: guest.process_group,
        });
        self.record(SessionTerminalState::Running, false, io.pty_identity());
        if let Some(route) = self.hub.routes().get_mut(&self.session_id) {
            route.summary.guest = self.guest.clone();
        }
    }

    /// Tells the client its session will not open, and records it closed.
    async fn refuse(&self, link: &mut Link, reason: String) -> Result<(), SessionError> {
        let sent = link.send(&SessionOpened::Refused { reason }).await;
        self.record(SessionTerminalState::Closed, true, None);
        sent
    }

    /// Sends a signal to the session's process inside the sandbox, through
    /// the supervisor (`runsc kill --pid`).
    async fn signal(&self, signal: ExecSignal) {
        let _ = self
            .hub
            .supervisor
            .send(
                &SupervisorRequest::SignalExec {
                    session_id: self.session_id,
                    signal,
                },
                &[],
            )
            .await;
    }

    async fn run(
        &mut self,
        link: &mut Link,
        open: &OpenSession,
        passed: Vec<OwnedFd>,
    ) -> Result<(), SessionError> {
        self.record(SessionTerminalState::Intent, false, None);
        let io = match SessionIo::open(open, passed) {
            Ok(io) => io,
            Err(e) => {
                let reason = format!("cannot open the session's terminal: {e}");
                return self.refuse(link, reason).await;
            }
        };
        // The session's mailbox exists before its process does.
        let mut escalation = match self
            .hub
            .escalation
            .open_session(self.session_id, open.prompts)
        {
            Ok(escalation) => escalation,
            Err(e) => {
                let reason = format!("cannot make the session's escalation mailbox: {e}");
                return self.refuse(link, reason).await;
            }
        };
        let served = self.run_with(link, open, io, &mut escalation).await;
        escalation.close().await;
        served
    }

    async fn run_with(
        &mut self,
        link: &mut Link,
        open: &OpenSession,
        mut io: SessionIo,
        escalation: &mut SessionEscalation,
    ) -> Result<(), SessionError> {
        let args = open
            .command
            .clone()
            .unwrap_or_else(|| vec!["/bin/sh".into(), "-l".into()]);
        let passed = io.take_process_ends();
        {
            let mut fds = FdList::new();
            let environment = fds.push(self.hub.environment.as_fd());
            let stdio = match &passed {
                ProcessEnds::Terminal(slave) => ExecStdio::Terminal {
                    slave: fds.push(slave.as_fd()),
                    rows: open.rows,
                    columns: open.columns,
                },
                ProcessEnds::Pipes { input, output } => ExecStdio::Pipes {
                    input: fds.push(input.as_fd()),
                    output: fds.push(output.as_fd()),
                },
                ProcessEnds::Passed => {
                    return Err(SessionError::Peer(
                        "the session's streams were already handed on".into(),
                    ));
                }
            };
            let request = SupervisorRequest::Exec(ExecRequest {
                session_id: self.session_id,
                args,
                cwd: lazaret_proto::layout::WORKSPACE.into(),
                term: open.term.clone(),
                environment,
                stdio,
            });
            self.hub
                .supervisor
                .send(&request, fds.as_slice())
                .await
                .map_err(|e| SessionError::Supervisor(crate::lifecycle::chain(&e)))?;
        }
        // The child's ends now live in the supervisor; only ours remain here.
        drop(passed);

        // The client may go while its process starts: then nothing waits
        // for the start, and the process is killed once it is reported
        // (it has no route by then).
        let (inbox, client) = (&mut self.inbox, self.client.as_ref());
        let started = tokio::time::timeout(START_TIMEOUT, async {
            loop {
                tokio::select! {
                    event = inbox.recv() => match event {
                        Some(HubEvent::Started(pidfd)) => return Ok(Ok(pidfd)),
                        Some(HubEvent::Failed(reason)) => return Ok(Err(reason)),
                        Some(HubEvent::Exited { .. }) => {}
                        None => return Ok(Err("the Domain is going down".to_owned())),
                    },
                    () = exited(client) => return Err(SessionError::Closed),
                }
            }
        })
        .await;
        let process = match started {
            Ok(Ok(Ok(pidfd))) => pidfd,
            Ok(Ok(Err(reason))) => return self.refuse(link, reason).await,
            Ok(Err(gone)) => {
                tracing::info!("session ended before its process started: {gone}");
                self.record(SessionTerminalState::Closed, true, None);
                return Ok(());
            }
            Err(_) => {
                let reason = format!(
                    "the sandbox did not start the session's process within {} s: the sandbox \
                     or the Workspace Router does not answer (`lazaret status` names a stopped \
                     one)",
                    START_TIMEOUT.as_secs()
                );
                return self.refuse(link, reason).await;
            }
        };
        let opened = link
            .send(&SessionOpened::Opened {
                session_id: self.session_id,
            })
            .await;
        let served = match opened {
            Ok(()) => {
                self.opened = true;
                self.record(SessionTerminalState::Running, false, io.pty_identity());
                tracing::info!(
                    terminal = open.terminal,
                    direct = open.direct_stdio,
                    "session opened"
                );
                self.pump(link, &mut io, escalation).await
            }
            Err(error) => Err(error),
        };
        match served {
            Ok(exit) => {
                tracing::info!(
                    exit_code = exit.exit_code,
                    "session ended: its process {}",
                    match exit.outcome {
                        SessionExitOutcome::Terminated => "was ended by a signal",
                        _ => "exited",
                    }
                );
                let _ = link.send(&SessionTerminalMessage::Exit(exit)).await;
                self.record(SessionTerminalState::Exited, true, None);
                Ok(())
            }
            Err(error) => {
                // The CLI is gone, or the session broke: its process must
                // not outlive it. Kill it inside the sandbox (the sandbox's
                // pid 1 ends the rest of its session), then its `runsc exec`.
                self.signal(ExecSignal::Kill).await;
                let reported = tokio::time::timeout(KILL_WAIT, async {
                    while let Some(event) = self.inbox.recv().await {
                        if matches!(event, HubEvent::Exited { .. }) {
                            break;
                        }
                    }
                })
                .await;
                if reported.is_err() {
                    let _ = pidfd_send_signal(&process, Signal::KILL);
                }
                tracing::info!("session ended: {error}; its process was killed");
                self.record(SessionTerminalState::Closed, true, None);
                match error {
                    SessionError::Closed => Ok(()),
                    other => Err(other),
                }
            }
        }
    }

    /// Moves bytes between the link and the session's streams until the
    /// process exits (`Ok`) or the link ends (`Err`).
    async fn pump(
        &mut self,
        link: &mut Link,
        io: &mut SessionIo,
        escalation: &mut SessionEscalation,
    ) -> Result<SessionExit, SessionError> {
        let session_id = self.session_id;
        let mut input = Input::default();
        let mut frames = FrameBuffer::<SessionTerminalEvent>::new();
        let mut read_buf = vec![0u8; MAX_TERMINAL_CHUNK];
        let mut out_buf = vec![0u8; MAX_TERMINAL_CHUNK];
        let mut output_open = io.output.is_some();
        // While the client shows an escalation prompt, the process's output
        // stays unread (it waits in the terminal, then the process waits):
        // nothing can land on the prompt, and the client, which reads on,
        // is never taken for one that stopped reading.
        let mut prompting: Option<RequestId> = None;
        // When the sandbox's programs are told the window changed: a burst
        // of resizes is told once.
        let mut window_changed: Option<tokio::time::Instant> = None;
        let exit = loop {
            let output = io
                .output
                .as_deref()
                .filter(|_| output_open && prompting.is_none());
            let input_target = io.input.as_deref().filter(|_| !input.bytes.is_empty());
            tokio::select! {
                event = self.inbox.recv() => match event {
                    Some(HubEvent::Exited { code, signaled }) => {
                        break SessionExit {
                            session_id,
                            outcome: if signaled {
                                SessionExitOutcome::Terminated
                            } else {
                                SessionExitOutcome::Exited
                            },
                            exit_code: code,
                        };
                    }
                    Some(_) => {}
                    None => return Err(SessionError::Closed),
                },
                () = exited(self.client.as_ref()) => return Err(SessionError::Closed),
                () = sleep_until(window_changed), if window_changed.is_some() => {
                    window_changed = None;
                    self.signal(ExecSignal::WindowChanged).await;
                }
                event = escalation.next() => {
                    let message = match event {
                        Event::Prompt(prompt) => {
                            prompting = Some(prompt.request_id);
                            SessionTerminalMessage::EscalationPrompt(prompt)
                        }
                        Event::Settled(settled) => {
                            if prompting == Some(settled.request_id) {
                                prompting = None;
                            }
                            SessionTerminalMessage::EscalationSettled(settled)
                        }
                        Event::Guest(guest) => {
                            self.record_guest(guest, io);
                            continue;
                        }
                    };
                    link.send(&message).await?;
                }
                read = link.read(&mut read_buf), if input.bytes.len() < INPUT_BOUND => {
                    let n = read?;
                    if n == 0 {
                        return Err(SessionError::Closed);
                    }
                    frames.push(&read_buf[..n]);
                    while let Some(event) = frames.next_frame()? {
                        if event.session_id() != session_id {
                            return Err(SessionError::Peer(
                                "an event named another session".into(),
                            ));
                        }
                        match &event {
                            SessionTerminalEvent::EscalationAnswer(answer)
                                if prompting == Some(answer.request_id) =>
                            {
                                prompting = None;
                            }
                            SessionTerminalEvent::Resize(_) if window_changed.is_none() => {
                                window_changed =
                                    Some(tokio::time::Instant::now() + WINDOW_CHANGE_DELAY);
                            }
                            _ => {}
                        }
                        self.handle(event, io, &mut input, escalation).await;
                    }
                }
                written = write_some(input_target, &input.bytes), if input_target.is_some() => {
                    match written {
                        Ok(n) => {
                            input.bytes.drain(..n);
                        }
                        // The process closed its input: what it did not
                        // read is dropped, as a pipe would.
                        Err(_) => {
                            input.bytes.clear();
                            input.close = true;
                        }
                    }
                    if input.bytes.is_empty() && input.close {
                        io.close_input();
                    }
                }
                read = read_some(output, &mut out_buf), if output.is_some() => {
                    match read? {
                        None => output_open = false,
                        Some(n) => {
                            let output = io.output.as_ref().expect("checked above");
                            relay(link, session_id, output, &mut out_buf, n, io.is_pipe()).await?;
                        }
                    }
                }
            }
        };
        // The process exited: relay what it left, until its output ends or
        // stays quiet for a moment.
        if let Some(output) = io.output.as_ref().filter(|_| output_open) {
            while let Ok(read) =
                tokio::time::timeout(Duration::from_millis(200), output.read(&mut out_buf)).await
            {
                match read? {
                    None => break,
                    Some(n) => {
                        relay(link, session_id, output, &mut out_buf, n, io.is_pipe()).await?
                    }
                }
            }
        }
        Ok(exit)
    }

    /// Acts on one event from the client.
    async fn handle(
        &self,
        event: SessionTerminalEvent,
        io: &mut SessionIo,
        input: &mut Input,
        escalation: &mut SessionEscalation,
    ) {
        match event {
            SessionTerminalEvent::EscalationAnswer(answer) => escalation.answer(answer),
            SessionTerminalEvent::Input(bytes) => {
                if io.input.is_some() && !input.close {
                    input.bytes.extend_from_slice(&bytes.bytes);
                }
            }
            SessionTerminalEvent::Resize(size) => {
                if let Some(master) = io.terminal() {
                    resize(master, size.rows, size.columns);
                }
            }
            SessionTerminalEvent::Signal(signal) => self.signal(signal.signal.into()).await,
            SessionTerminalEvent::Close(_) => {
                // End of input: once what is held is written, closing our
                // end of the input pipe gives the process end of file.
                input.close = true;
                if input.bytes.is_empty() {
                    io.close_input();
                }
            }
        }
    }
}

/// Input held for the process.
#[derive(Default)]
struct Input {
    bytes: Vec<u8>,
    /// The client ended its input: close the process's once `bytes` is
    /// written.
    close: bool,
}

/// Sleeps until `at`, or forever without one.
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

async fn write_some(target: Option<&Stream>, bytes: &[u8]) -> std::io::Result<usize> {
    match target {
        Some(stream) => stream.write(bytes).await,
        None => std::future::pending().await,
    }
}

async fn read_some(source: Option<&Stream>, buf: &mut [u8]) -> std::io::Result<Option<usize>> {
    match source {
        Some(stream) => stream.read(buf).await,
        None => std::future::pending().await,
    }
}

/// Relays `n` bytes already read into `buf`, then whatever more the output
/// holds now (up to [`READS_PER_WAKEUP`] chunks; a PTY master gives one),
/// in one flush.
async fn relay(
    link: &mut Link,
    session_id: SessionId,
    output: &Stream,
    buf: &mut [u8],
    mut n: usize,
    more: bool,
) -> Result<(), SessionError> {
    for chunk in 1..=READS_PER_WAKEUP {
        link.queue(&SessionTerminalMessage::Output(TerminalOutput {
            session_id,
            bytes: buf[..n].to_vec(),
        }))?;
        if !more || chunk == READS_PER_WAKEUP {
            break;
        }
        match output.try_read(buf)? {
            Some(read) if read > 0 => n = read,
            _ => break,
        }
    }
    link.flush().await
}

/// The TLS connection of one session, with its frames.
struct Link {
    stream: tokio_rustls::server::TlsStream<FdStream>,
    /// Frames queued and not yet written.
    outgoing: Vec<u8>,
}

impl Link {
    fn new(stream: tokio_rustls::server::TlsStream<FdStream>) -> Self {
        Self {
            stream,
            outgoing: Vec::new(),
        }
    }

    /// The descriptors the client attached so far.
    fn take_fds(&mut self) -> Vec<OwnedFd> {
        self.stream.get_mut().0.take_fds()
    }

    /// Reads what the connection has. Cancel-safe.
    async fn read(&mut self, buf: &mut [u8]) -> Result<usize, SessionError> {
        read_into(&mut self.stream, buf).await
    }

    /// Reads one frame of `T` (used before the session runs, when nothing
    /// else is read).
    async fn recv<T: WireRecord>(&mut self) -> Result<T, SessionError> {
        let mut frames = FrameBuffer::<T>::new();
        let mut buf = vec![0u8; 4096];
        loop {
            if let Some(record) = frames.next_frame()? {
                return Ok(record);
            }
            let n = self.read(&mut buf).await?;
            if n == 0 {
                return Err(SessionError::Closed);
            }
            frames.push(&buf[..n]);
        }
    }

    /// Queues one frame.
    fn queue<T: WireRecord>(&mut self, record: &T) -> Result<(), SessionError> {
        write_frame(&mut self.outgoing, record).map_err(SessionError::Frame)
    }

    /// Writes what is queued, within [`WRITE_TIMEOUT`].
    async fn flush(&mut self) -> Result<(), SessionError> {
        let bytes = std::mem::take(&mut self.outgoing);
        tokio::time::timeout(WRITE_TIMEOUT, async {
            self.stream.write_all(&bytes).await?;
            self.stream.flush().await
        })
        .await
        .map_err(|_| SessionError::Stalled)?
        .map_err(SessionError::Io)
    }

    /// Sends one frame.
    async fn send<T: WireRecord>(&mut self, record: &T) -> Result<(), SessionError> {
        self.queue(record)?;
        self.flush().await
    }

    /// Says goodbye: a TLS close_notify.
    async fn close(&mut self) {
        let _ = self.stream.shutdown().await;
    }
}

async fn read_into<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut [u8],
) -> Result<usize, SessionError> {
    match stream.read(buf).await {
        Ok(n) => Ok(n),
        // A client that went away without a close_notify has still gone.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(0),
        Err(e) => Err(SessionError::Io(e)),
    }
}

/// The host side of a session's standard streams.
#[derive(Debug)]
struct SessionIo {
    /// Where input goes: the PTY master, or our end of the input pipe.
    input: Option<Arc<Stream>>,
    /// Where output comes from: the PTY master, or our end of the output
    /// pipe. `None` when the process writes to the CLI directly.
    output: Option<Arc<Stream>>,
    /// Whether the streams are a PTY.
    terminal: bool,
    /// The process's ends, until they are passed to the supervisor.
    process_ends: ProcessEnds,
}

/// The process's ends of a session's streams.
#[derive(Debug, Default)]
enum ProcessEnds {
    /// The PTY slave, its input and output.
    Terminal(OwnedFd),
    /// Its input and output pipes (or the CLI's own, for a direct session).
    Pipes { input: OwnedFd, output: OwnedFd },
    /// Handed to the supervisor.
    #[default]
    Passed,
}

impl SessionIo {
    fn open(open: &OpenSession, passed: Vec<OwnedFd>) -> std::io::Result<Self> {
        if open.direct_stdio {
            // The CLI's own standard input and output go to the process; the
            // coordinator keeps none of them.
            let [input, output]: [OwnedFd; 2] = passed.try_into().map_err(|_| {
                std::io::Error::other("a direct session must pass standard input and output")
            })?;
            if !super::donatable(input.as_fd()) || !super::donatable(output.as_fd()) {
                return Err(std::io::Error::other(
                    "a direct session may pass only pipes or /dev/null; \
                     a terminal, socket or file must be relayed",
                ));
            }
            return Ok(Self {
                input: None,
                output: None,
                terminal: false,
                process_ends: ProcessEnds::Pipes { input, output },
            });
        }
        if !passed.is_empty() {
            return Err(std::io::Error::other(
                "descriptors were passed with a session that takes none",
            ));
        }
        if open.terminal {
            let master = rustix::pty::openpt(
                rustix::pty::OpenptFlags::RDWR
                    | rustix::pty::OpenptFlags::NOCTTY
                    | rustix::pty::OpenptFlags::CLOEXEC,
            )?;
            rustix::pty::grantpt(&master)?;
            rustix::pty::unlockpt(&master)?;
            let name = rustix::pty::ptsname(&master, Vec::new())?;
            let slave = rustix::fs::open(
                name.as_c_str(),
                rustix::fs::OFlags::RDWR | rustix::fs::OFlags::NOCTTY | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )?;
            resize(master.as_fd(), open.rows, open.columns);
            let master = Arc::new(Stream::new(master)?);
            Ok(Self {
                input: Some(Arc::clone(&master)),
                output: Some(master),
                terminal: true,
                process_ends: ProcessEnds::Terminal(slave),
            })
        } else {
            let flags = rustix::pipe::PipeFlags::CLOEXEC;
            let (child_input, input) = rustix::pipe::pipe_with(flags)?;
            let (output, child_output) = rustix::pipe::pipe_with(flags)?;
            // A large output pipe lets the process write on while the
            // coordinator relays.
            let _ = rustix::pipe::fcntl_setpipe_size(&output, OUTPUT_PIPE_SIZE);
            Ok(Self {
                input: Some(Arc::new(Stream::new(input)?)),
                output: Some(Arc::new(Stream::new(output)?)),
                terminal: false,
                process_ends: ProcessEnds::Pipes {
                    input: child_input,
                    output: child_output,
                },
            })
        }
    }

    /// The process's ends of its streams (a PTY slave, or the input and
    /// output pipes), taken out of `self` so that only the process holds
    /// them.
    fn take_process_ends(&mut self) -> ProcessEnds {
        std::mem::take(&mut self.process_ends)
    }

    /// Whether the output is a pipe, which may be read several times per
    /// wakeup (a PTY master gives one chunk).
    fn is_pipe(&self) -> bool {
        !self.terminal
    }

    /// The PTY master, for resizing.
    fn terminal(&self) -> Option<BorrowedFd<'_>> {
        self.output
            .as_ref()
            .filter(|_| self.terminal)
            .map(|master| master.fd())
    }

    /// Closes the process's input (a pipe: it reads end of file). A PTY
    /// stays open: its end of input is a byte the client sends.
    fn close_input(&mut self) {
        if !self.terminal {
            self.input = None;
        }
    }

    /// The identity of the PTY master, for the session's record.
    fn pty_identity(&self) -> Option<PtyIdentity> {
        let master = self.terminal()?;
        let stat = rustix::fs::fstat(master).ok()?;
        Some(PtyIdentity {
            master_fd: u32::try_from(std::os::fd::AsRawFd::as_raw_fd(&master)).ok()?,
            device: stat.st_rdev,
            inode: stat.st_ino,
        })
    }
}

fn resize(master: BorrowedFd<'_>, rows: u16, columns: u16) {
    let size = rustix::termios::Winsize {
        ws_row: rows,
        ws_col: columns,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let _ = rustix::termios::tcsetwinsize(master, size);
}

/// Why a session failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The peer is not this Domain's owner, or broke the protocol.
    #[error("refused a session connection: {0}")]
    Peer(String),
    /// The client closed the connection, or its process is gone.
    #[error("the client went away")]
    Closed,
    /// The client stopped reading.
    #[error("the client did not read its output for {} s", WRITE_TIMEOUT.as_secs())]
    Stalled,
    /// A frame was malformed.
    #[error("a session frame was malformed")]
    Frame(#[from] FrameError),
    /// The supervisor could not be asked.
    #[error("cannot ask the supervisor for the session process: {0}")]
    Supervisor(String),
    /// The connection or a host descriptor failed (TLS refusals included).
    #[error("the session connection failed")]
    Io(#[from] std::io::Error),
}
