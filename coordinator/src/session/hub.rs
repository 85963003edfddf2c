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
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lazaret_proto::channel::Received;
use lazaret_proto::common::UnixTimeNs;
use lazaret_proto::control::SessionSummary;
use lazaret_proto::failure::Failure;
use lazaret_proto::ids::{CliId, ContainerId, GenerationId, RequestId, SessionId};
use lazaret_proto::session::{OpenSession, SessionOpened, SessionRefusal};
use lazaret_proto::store::{Session, SessionTerminal, SessionTerminalState};
use lazaret_proto::supervisor::{
    ExecRequest, ExecSignal, ExecStdio, FdList, SupervisorReport, SupervisorRequest,
};
use lazaret_proto::terminal::{
    GuestProcessIdentity, MAX_TERMINAL_CHUNK, PtyIdentity, SessionExit, SessionExitOutcome,
    SessionTerminalEvent, SessionTerminalMessage, TerminalOutput,
};
use lazaret_storage::store::DomainStore;
use rustix::process::{Signal, pidfd_send_signal};
use tokio::sync::{mpsc, watch};

pub use super::error::SessionError;
use super::error::WRITE_TIMEOUT;
use super::link::ServerLink as Link;
use super::stdio::{ProcessEnds, SessionIo, resize};
use super::stream::FdStream;
use crate::aio::{AsyncChannel, Exit, Stream, exited};
use crate::escalation::Escalation;
use crate::escalation::mailbox::GuestClaim;
use crate::escalation::session::{Event, SessionEscalation};

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

/// How many output chunks one wakeup relays at most: enough to spare
/// system calls, few enough that ten sessions relaying at once hold a
/// megabyte between them.
const READS_PER_WAKEUP: usize = 4;

/// What the hub tells one session.
#[derive(Debug)]
enum HubEvent {
    /// Its process started; here is the pidfd of its `runsc exec`.
    Started(OwnedFd),
    /// Its process could not start: the supervisor's account.
    Failed(Failure),
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
                    HubEvent::Failed(Failure::check("no pidfd for runsc exec")),
                ),
            },
            SupervisorReport::ExecFailed {
                session_id,
                failure,
            } => (session_id, HubEvent::Failed(failure)),
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
        let left: Vec<(SessionId, UnixTimeNs)> = self
            .routes()
            .drain()
            .map(|(id, route)| (id, route.summary.opened_at))
            .collect();
        for (session_id, opened_at) in left {
            self.record_closed(session_id, opened_at);
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
                    tracing::warn!(
                        "session refused or failed: {}",
                        lazaret_proto::error_chain(&e)
                    );
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
            e => SessionError::Peer(lazaret_proto::error_chain(&e)),
        })?;
        // The CLI, watched so that a session whose client died never looks
        // alive, even while its input is held back.
        let client = crate::sys::peer_pidfd(socket.as_fd())
            .and_then(|pidfd| Exit::watch(pidfd.as_fd()))
            .ok();
        let (mut link, open) = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
            let stream = self.acceptor.accept(FdStream::new(socket)).await?;
            let mut link = Link::new(stream).with_write_bound(WRITE_TIMEOUT);
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
            let refusal = SessionRefusal::Full {
                max: MAX_SESSIONS as u32,
            };
            return Ok(link.send(&SessionOpened::Refused(refusal)).await?);
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
                        let refusal = SessionRefusal::GoingDown;
                        link.send(&SessionOpened::Refused(refusal)).await
                    }
                };
                let _ = tokio::time::timeout(FAREWELL_TIMEOUT, farewell).await;
                session.record(SessionTerminalState::Closed, None);
                tracing::info!("session ended: the Domain went down");
                Ok(())
            }
        };
        self.routes().remove(&session_id);
        let _ = tokio::time::timeout(FAREWELL_TIMEOUT, link.close()).await;
        result
    }

    /// Records a session whose task is gone as closed now, keeping the time
    /// it opened.
    fn record_closed(&self, session_id: SessionId, opened_at: UnixTimeNs) {
        self.record(
            session_id,
            opened_at,
            SessionTerminal {
                generation_id: self.generation,
                session_id,
                state: SessionTerminalState::Closed,
                pty: None,
                guest_process: None,
            },
        );
    }

    /// Records session `session_id`, opened at `opened_at`, in `terminal`'s
    /// state; closed now when that state is one a session ends in. Best
    /// effort: a store that fails is logged by the store, and the session
    /// goes on.
    fn record(&self, session_id: SessionId, opened_at: UnixTimeNs, terminal: SessionTerminal) {
        let closed = matches!(
            terminal.state,
            SessionTerminalState::Closed | SessionTerminalState::Exited
        );
        let session = Session {
            generation_id: self.generation,
            session_id,
            cli_id: CliId(session_id.0),
            opened_at,
            closed_at: closed.then(UnixTimeNs::now),
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
    fn record(&self, state: SessionTerminalState, pty: Option<PtyIdentity>) {
        let terminal = SessionTerminal {
            generation_id: self.hub.generation,
            session_id: self.session_id,
            state,
            pty,
            guest_process: self.guest.clone(),
        };
        self.hub.record(self.session_id, self.opened_at, terminal);
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
        self.record(SessionTerminalState::Running, io.pty_identity());
        if let Some(route) = self.hub.routes().get_mut(&self.session_id) {
            route.summary.guest = self.guest.clone();
        }
    }

    /// Tells the client its session will not open, and records it closed.
    async fn refuse(&self, link: &mut Link, refusal: SessionRefusal) -> Result<(), SessionError> {
        let sent = link.send(&SessionOpened::Refused(refusal)).await;
        self.record(SessionTerminalState::Closed, None);
        Ok(sent?)
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
        self.record(SessionTerminalState::Intent, None);
        let io = match SessionIo::open(open, passed) {
            Ok(io) => io,
            Err(e) => {
                let refusal = SessionRefusal::Terminal(Failure::of(&e));
                return self.refuse(link, refusal).await;
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
                let refusal = SessionRefusal::Mailbox(Failure::of(&e));
                return self.refuse(link, refusal).await;
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
        let passed = io.take_process_ends();
        self.exec(open, &passed).await?;
        // The child's ends now live in the supervisor; only ours remain here.
        drop(passed);
        let process = match self.await_start().await {
            Ok(Start::Started(pidfd)) => pidfd,
            Ok(Start::Refused(refusal)) => return self.refuse(link, refusal).await,
            Err(gone) => {
                tracing::info!("session ended before its process started: {gone}");
                self.record(SessionTerminalState::Closed, None);
                return Ok(());
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
                self.record(SessionTerminalState::Running, io.pty_identity());
                tracing::info!(
                    terminal = open.terminal,
                    direct = open.direct_stdio,
                    "session opened"
                );
                self.pump(link, &mut io, escalation).await
            }
            Err(error) => Err(error.into()),
        };
        self.end(link, served, process).await
    }

    /// Asks the supervisor to run the session's command (a login shell by
    /// default) in the sandbox, on the process's ends `passed`.
    async fn exec(&self, open: &OpenSession, passed: &ProcessEnds) -> Result<(), SessionError> {
        let args = open
            .command
            .clone()
            .unwrap_or_else(|| vec!["/bin/sh".into(), "-l".into()]);
        let mut fds = FdList::new();
        let environment = fds.push(self.hub.environment.as_fd());
        let stdio = match passed {
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
            .map_err(|e| SessionError::Supervisor(lazaret_proto::error_chain(&e)))
    }

    /// Waits, within [`START_TIMEOUT`], for the hub to say the session's
    /// process started (its `runsc exec` pidfd) or could not (why, to tell
    /// the client). The client may go while its process starts: then
    /// nothing waits for the start (`Err`), and the process is killed once
    /// it is reported (it has no route by then).
    async fn await_start(&mut self) -> Result<Start, SessionError> {
        let (inbox, client) = (&mut self.inbox, self.client.as_ref());
        let started = tokio::time::timeout(START_TIMEOUT, async {
            loop {
                tokio::select! {
                    event = inbox.recv() => match event {
                        Some(HubEvent::Started(pidfd)) => return Ok(Start::Started(pidfd)),
                        Some(HubEvent::Failed(failure)) => {
                            return Ok(Start::Refused(SessionRefusal::Exec(failure)));
                        }
                        Some(HubEvent::Exited { .. }) => {}
                        None => return Ok(Start::Refused(SessionRefusal::GoingDown)),
                    },
                    () = exited(client) => return Err(SessionError::Closed),
                }
            }
        })
        .await;
        started.unwrap_or_else(|_| {
            Ok(Start::Refused(SessionRefusal::NotStarted {
                seconds: START_TIMEOUT.as_secs(),
            }))
        })
    }

    /// Ends a session whose process started (`process`, its `runsc exec`):
    /// one served to its process's exit tells the client how it ended; one
    /// whose client went or that broke has its process killed.
    async fn end(
        &mut self,
        link: &mut Link,
        served: Result<SessionExit, SessionError>,
        process: OwnedFd,
    ) -> Result<(), SessionError> {
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
                self.record(SessionTerminalState::Exited, None);
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
                self.record(SessionTerminalState::Closed, None);
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
        let mut state = Pumping::default();
        let mut out_buf = vec![0u8; MAX_TERMINAL_CHUNK];
        let mut output_open = io.output.is_some();
        let exit = loop {
            let output = io
                .output
                .as_deref()
                .filter(|_| output_open && state.prompting.is_none());
            let input_target = io
                .input
                .as_deref()
                .filter(|_| !state.input.bytes.is_empty());
            tokio::select! {
                event = self.inbox.recv() => match event {
                    Some(HubEvent::Exited { code, signaled }) => {
                        break exit_of(session_id, code, signaled);
                    }
                    Some(_) => {}
                    None => return Err(SessionError::Closed),
                },
                () = exited(self.client.as_ref()) => return Err(SessionError::Closed),
                () = sleep_until(state.window_changed), if state.window_changed.is_some() => {
                    state.window_changed = None;
                    self.signal(ExecSignal::WindowChanged).await;
                }
                event = escalation.next() => {
                    if let Some(message) = self.on_escalation(event, &mut state, io) {
                        link.send(&message).await?;
                    }
                }
                read = link.fill(), if state.input.bytes.len() < INPUT_BOUND => {
                    read?;
                    self.on_client_frames(link, &mut state, io, escalation).await?;
                }
                written = write_some(input_target, &state.input.bytes), if input_target.is_some() => {
                    state.input.written(written, io);
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

    /// What the client is told of an escalation event: a prompt (its
    /// output held back until the prompt is settled) or its settling. A
    /// guest's claim is recorded, and the client told nothing.
    fn on_escalation(
        &mut self,
        event: Event,
        state: &mut Pumping,
        io: &SessionIo,
    ) -> Option<SessionTerminalMessage> {
        match event {
            Event::Prompt(prompt) => {
                state.prompting = Some(prompt.request_id);
                Some(SessionTerminalMessage::EscalationPrompt(prompt))
            }
            Event::Settled(settled) => {
                if state.prompting == Some(settled.request_id) {
                    state.prompting = None;
                }
                Some(SessionTerminalMessage::EscalationSettled(settled))
            }
            Event::Guest(guest) => {
                self.record_guest(guest, io);
                None
            }
        }
    }

    /// Takes the frames the client sent that the link holds, each of which must
    /// name this session, and acts on each.
    async fn on_client_frames(
        &self,
        link: &mut Link,
        state: &mut Pumping,
        io: &mut SessionIo,
        escalation: &mut SessionEscalation,
    ) -> Result<(), SessionError> {
        while let Some(event) = link.next_frame::<SessionTerminalEvent>()? {
            if event.session_id() != self.session_id {
                return Err(SessionError::Peer("an event named another session".into()));
            }
            match &event {
                SessionTerminalEvent::EscalationAnswer(answer)
                    if state.prompting == Some(answer.request_id) =>
                {
                    state.prompting = None;
                }
                SessionTerminalEvent::Resize(_) if state.window_changed.is_none() => {
                    state.window_changed = Some(tokio::time::Instant::now() + WINDOW_CHANGE_DELAY);
                }
                _ => {}
            }
            self.handle(event, io, &mut state.input, escalation).await;
        }
        Ok(())
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

/// How waiting for a session's process to start ended.
#[derive(Debug)]
enum Start {
    /// It started: its `runsc exec` pidfd.
    Started(OwnedFd),
    /// It could not start: why, to tell the client.
    Refused(SessionRefusal),
}

/// Input held for the process.
#[derive(Default)]
struct Input {
    bytes: Vec<u8>,
    /// The client ended its input: close the process's once `bytes` is
    /// written.
    close: bool,
}

impl Input {
    /// Drops what a write to the process took; a process that closed its
    /// input drops what it did not read, as a pipe would. Closes the
    /// process's input once all is written and the client ended it.
    fn written(&mut self, written: std::io::Result<usize>, io: &mut SessionIo) {
        match written {
            Ok(n) => {
                self.bytes.drain(..n);
            }
            Err(_) => {
                self.bytes.clear();
                self.close = true;
            }
        }
        if self.bytes.is_empty() && self.close {
            io.close_input();
        }
    }
}

/// What a session's pump keeps between wakeups.
#[derive(Default)]
struct Pumping {
    /// Input held for the process.
    input: Input,
    /// While the client shows an escalation prompt, the process's output
    /// stays unread (it waits in the terminal, then the process waits):
    /// nothing can land on the prompt, and the client, which reads on,
    /// is never taken for one that stopped reading.
    prompting: Option<RequestId>,
    /// When the sandbox's programs are told the window changed: a burst
    /// of resizes is told once.
    window_changed: Option<tokio::time::Instant>,
}

/// How a session's process ended, as its client is told.
fn exit_of(session_id: SessionId, code: u8, signaled: bool) -> SessionExit {
    SessionExit {
        session_id,
        outcome: if signaled {
            SessionExitOutcome::Terminated
        } else {
            SessionExitOutcome::Exited
        },
        exit_code: code,
    }
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
    Ok(link.flush().await?)
}

#[cfg(test)]
mod tests {
    //! The hub against a scripted supervisor on a socketpair, on a scratch
    //! host: no root, no runsc, no sandbox.

    use std::os::fd::OwnedFd;
    use std::sync::Arc;
    use std::time::Duration;

    use lazaret_proto::channel::{Endpoint, Received};
    use lazaret_proto::common::UnixTimeNs;
    use lazaret_proto::control::SessionSummary;
    use lazaret_proto::ids::{ContainerId, GenerationId, GenerationNonce, SessionId};
    use lazaret_proto::store::SessionTerminalState;
    use lazaret_proto::supervisor::{ExecSignal, FdIndex, SupervisorReport, SupervisorRequest};
    use lazaret_proto::trust::GenerationIdentity;
    use tokio::io::AsyncReadExt;
    use tokio::sync::mpsc;

    use super::{HANDSHAKE_TIMEOUT, Hub, HubEvent, MAX_HANDSHAKES, Route};
    use crate::aio::AsyncChannel;
    use crate::lifecycle::testing::{Scratch, store_of};
    use crate::session::tls::GenerationCredentials;
    use lazaret_storage::store::DomainStore;

    const GENERATION: GenerationId = GenerationId(1);

    /// A hub of generation 1 on a scratch host, and the scripted
    /// supervisor's end of its link.
    struct Fixture {
        _scratch: Scratch,
        _mailbox: tempfile::TempDir,
        hub: Arc<Hub>,
        supervisor: Endpoint<SupervisorReport, SupervisorRequest>,
        store: Arc<DomainStore>,
    }

    fn fixture() -> Fixture {
        let scratch = Scratch::new();
        let resolved = scratch.load("");
        let store = store_of(&resolved);
        let identity = GenerationIdentity {
            agent_profile: "p".into(),
            domain_id: resolved.domain_id(),
            generation_id: GENERATION,
            configuration_fingerprint: resolved.fingerprint(),
            generation_nonce: GenerationNonce(super::super::random_bytes()),
            created_at: UnixTimeNs::now(),
        };
        let protocol = super::super::coordinator_protocol_credential(&identity);
        let credentials = GenerationCredentials::create(identity, &protocol).unwrap();
        let mailbox = tempfile::tempdir().unwrap();
        let root = rustix::fs::open(
            mailbox.path(),
            rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .unwrap();
        let escalation = crate::escalation::Escalation::new(
            &resolved,
            protocol,
            credentials.trust_manifest(),
            root,
        )
        .unwrap();
        let (ours, theirs) =
            lazaret_proto::channel::pair::<SupervisorRequest, SupervisorReport>().unwrap();
        let link = Arc::new(AsyncChannel::new(Arc::new(ours)).unwrap());
        let environment = lazaret_proto::memfd::sealed_bytes("environment", b"").unwrap();
        let hub = Hub::new(
            link,
            escalation,
            ContainerId([3; 16]),
            environment,
            Arc::clone(&store),
            GENERATION,
            credentials.server_config(),
        );
        Fixture {
            _scratch: scratch,
            _mailbox: mailbox,
            hub,
            supervisor: theirs,
            store,
        }
    }

    /// Attaches session `id` to the hub, opened at `opened_at`; its inbox.
    fn attach(hub: &Hub, id: u8, opened_at: u64) -> mpsc::UnboundedReceiver<HubEvent> {
        let (events, inbox) = mpsc::unbounded_channel();
        let summary = SessionSummary {
            session_id: SessionId([id; 16]),
            command: Vec::new(),
            terminal: true,
            opened_at: UnixTimeNs(opened_at),
            guest: None,
        };
        hub.routes()
            .insert(SessionId([id; 16]), Route { events, summary });
        inbox
    }

    fn report(message: SupervisorReport, fds: Vec<OwnedFd>) -> Received<SupervisorReport> {
        Received { message, fds }
    }

    /// A child of this test, and its pidfd.
    fn sleeper() -> (std::process::Child, OwnedFd) {
        let child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let pidfd = crate::process::pidfd_of_child(&child).unwrap();
        (child, pidfd)
    }

    #[tokio::test(flavor = "current_thread")]
    async fn reports_naming_a_session_reach_it_and_others_come_back() {
        let f = fixture();
        let mut inbox = attach(&f.hub, 1, 1);
        let session_id = SessionId([1; 16]);
        let failed = SupervisorReport::ExecFailed {
            session_id,
            failure: lazaret_proto::failure::Failure::check("no such command"),
        };
        assert!(f.hub.dispatch(report(failed, Vec::new())).is_none());
        assert!(matches!(
            inbox.try_recv(),
            Ok(HubEvent::Failed(failure)) if failure.to_string() == "no such command"
        ));
        let exited = SupervisorReport::ExecExited {
            session_id,
            exit_code: 3,
            signaled: false,
        };
        assert!(f.hub.dispatch(report(exited, Vec::new())).is_none());
        assert!(matches!(
            inbox.try_recv(),
            Ok(HubEvent::Exited {
                code: 3,
                signaled: false
            })
        ));
        // A start without its pidfd cannot be a start.
        let started = SupervisorReport::ExecStarted {
            session_id,
            process: FdIndex(0),
        };
        assert!(f.hub.dispatch(report(started, Vec::new())).is_none());
        assert!(matches!(inbox.try_recv(), Ok(HubEvent::Failed(_))));
        let (mut child, pidfd) = sleeper();
        let started = SupervisorReport::ExecStarted {
            session_id,
            process: FdIndex(0),
        };
        assert!(f.hub.dispatch(report(started, vec![pidfd])).is_none());
        assert!(matches!(inbox.try_recv(), Ok(HubEvent::Started(_))));
        // What names no session is the loop's.
        let other = f
            .hub
            .dispatch(report(SupervisorReport::Stopped, Vec::new()));
        assert!(matches!(other, Some(SupervisorReport::Stopped)));
        let _ = child.kill();
        let _ = child.wait();
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_process_started_for_a_session_nobody_waits_for_is_killed() {
        let f = fixture();
        let (mut child, pidfd) = sleeper();
        let session_id = SessionId([9; 16]);
        let started = SupervisorReport::ExecStarted {
            session_id,
            process: FdIndex(0),
        };
        assert!(f.hub.dispatch(report(started, vec![pidfd])).is_none());
        let supervisor = f.supervisor;
        let asked = tokio::task::spawn_blocking(move || supervisor.recv().map(|r| r.message));
        let asked = tokio::time::timeout(Duration::from_secs(10), asked)
            .await
            .expect("the supervisor is asked within the bound")
            .unwrap()
            .unwrap();
        assert_eq!(
            asked,
            SupervisorRequest::SignalExec {
                session_id,
                signal: ExecSignal::Kill,
            }
        );
        // And its `runsc exec` (here, a child of the test) is killed.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            assert!(tokio::time::Instant::now() < deadline, "not killed");
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9)
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn attached_sessions_are_listed_in_the_order_they_opened() {
        let f = fixture();
        let _late = attach(&f.hub, 2, 20);
        let _early = attach(&f.hub, 1, 10);
        let _middle = attach(&f.hub, 3, 15);
        let order: Vec<u8> = f.hub.sessions().iter().map(|s| s.session_id.0[0]).collect();
        assert_eq!(order, [1, 3, 2]);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_domain_going_down_records_every_session_left_closed() {
        let f = fixture();
        let _one = attach(&f.hub, 1, 10);
        let _two = attach(&f.hub, 2, 11);
        let started = tokio::time::Instant::now();
        f.hub.domain_down(Duration::from_millis(200)).await;
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(f.hub.sessions().is_empty());
        let recorded = f.store.sessions(GENERATION).unwrap();
        assert_eq!(recorded.len(), 2);
        for (session, terminal) in recorded {
            assert!(session.closed_at.is_some());
            // Each keeps the time it opened, not the time it was closed.
            let opened = 9 + u64::from(session.session_id.0[0]);
            assert_eq!(session.opened_at, UnixTimeNs(opened));
            assert_eq!(
                terminal.map(|t| t.state),
                Some(SessionTerminalState::Closed)
            );
        }
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_connection_that_never_proves_itself_gives_up_its_place_within_the_bound() {
        let f = fixture();
        let (server, client) = tokio::net::UnixStream::pair().unwrap();
        f.hub.spawn_session(server);
        tokio::task::yield_now().await;
        assert_eq!(f.hub.handshakes.available_permits(), MAX_HANDSHAKES - 1);
        tokio::time::sleep(HANDSHAKE_TIMEOUT + Duration::from_secs(1)).await;
        assert_eq!(f.hub.handshakes.available_permits(), MAX_HANDSHAKES);
        // The hub's end is closed: a read sees the end of the stream. The
        // bound is on the real clock (the runtime's is paused, and would
        // run out before the close is seen), and the hub has nothing left
        // to do, so the read may block this thread.
        let mut client = client.into_std().unwrap();
        client.set_nonblocking(false).unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut buf = [0u8; 16];
        let read = std::io::Read::read(&mut client, &mut buf);
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
        assert!(f.hub.sessions().is_empty());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn connections_past_the_handshake_bound_are_closed_at_once() {
        let f = fixture();
        let mut clients = Vec::new();
        for _ in 0..MAX_HANDSHAKES {
            let (server, client) = tokio::net::UnixStream::pair().unwrap();
            f.hub.spawn_session(server);
            clients.push(client);
        }
        assert_eq!(f.hub.handshakes.available_permits(), 0);
        let (server, mut extra) = tokio::net::UnixStream::pair().unwrap();
        f.hub.spawn_session(server);
        let mut buf = [0u8; 16];
        let read = tokio::time::timeout(Duration::from_secs(5), extra.read(&mut buf))
            .await
            .expect("closed at once");
        assert!(matches!(read, Ok(0)), "{read:?}");
        // Those in progress are still waiting for their handshakes.
        assert_eq!(f.hub.handshakes.available_permits(), 0);
        drop(clients);
        f.hub.domain_down(Duration::from_millis(100)).await;
    }
}
