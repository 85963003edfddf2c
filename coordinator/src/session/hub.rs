//! The Session Coordinator's server side: one thread per Client Session,
//! each holding its TLS link, its host PTY master (or pipes) and its
//! `runsc exec` pidfd, and a hub that routes the supervisor's reports to
//! the session they name.
//!
//! Owns each session from the TLS handshake to its recorded end. Trusts a
//! peer only after the TLS handshake proved a client certificate of this
//! generation's CA and the socket's peer uid equals the coordinator's; the
//! `session_id` an event carries must be the connection's own.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lazaret_proto::channel::{Endpoint, Received};
use lazaret_proto::common::UnixTimeNs;
use lazaret_proto::control::SessionSummary;
use lazaret_proto::ids::{CliId, GenerationId, SessionId};
use lazaret_proto::session::{OpenSession, SessionOpened};
use lazaret_proto::store::{Session, SessionTerminal, SessionTerminalState};
use lazaret_proto::supervisor::{
    ExecRequest, ExecSignal, ExecStdio, FdIndex, SupervisorReport, SupervisorRequest,
};
use lazaret_proto::terminal::{
    MAX_TERMINAL_CHUNK, PtyIdentity, SessionExit, SessionExitOutcome, SessionTerminalEvent,
    SessionTerminalMessage, TerminalOutput,
};
use rustix::event::{PollFd, PollFlags, poll};
use rustix::process::{Signal, pidfd_send_signal};

use super::link::{LinkError, TlsLink};
use crate::process::readable;
use crate::store::DomainStore;

/// The supervisor link, shared by the sessions that send `Exec` on it.
pub type SupervisorLink = Endpoint<SupervisorRequest, SupervisorReport>;

/// What the hub tells one session.
#[derive(Debug)]
enum HubEvent {
    /// Its process started; here is the pidfd of its `runsc exec`.
    Started(OwnedFd),
    /// Its process could not start.
    Failed(String),
    /// Its process exited.
    Exited { code: u8, signaled: bool },
    /// The Domain is going down.
    DomainDown,
}

/// A session's mailbox in the hub: events, and a pipe that wakes its
/// `poll(2)`.
#[derive(Debug)]
struct Route {
    events: Sender<HubEvent>,
    wake: OwnedFd,
    summary: SessionSummary,
}

impl Route {
    fn send(&self, event: HubEvent) {
        let _ = self.events.send(event);
        let _ = rustix::io::write(&self.wake, &[1]);
    }
}

/// Routes supervisor reports to sessions, and holds what sessions share.
#[derive(Debug)]
pub struct Hub {
    supervisor: Arc<SupervisorLink>,
    environment: OwnedFd,
    store: Arc<DomainStore>,
    generation: GenerationId,
    server: Arc<rustls::ServerConfig>,
    routes: Mutex<HashMap<SessionId, Route>>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl Hub {
    /// A hub for one generation.
    pub fn new(
        supervisor: Arc<SupervisorLink>,
        environment: OwnedFd,
        store: Arc<DomainStore>,
        generation: GenerationId,
        server: Arc<rustls::ServerConfig>,
    ) -> Arc<Self> {
        Arc::new(Self {
            supervisor,
            environment,
            store,
            generation,
            server,
            routes: Mutex::new(HashMap::new()),
            threads: Mutex::new(Vec::new()),
        })
    }

    /// The sessions attached now.
    pub fn sessions(&self) -> Vec<SessionSummary> {
        let routes = self.routes.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<SessionSummary> = routes.values().map(|r| r.summary.clone()).collect();
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
            SupervisorReport::ExecFailed { session_id, detail } => {
                (session_id, HubEvent::Failed(detail))
            }
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
        let routes = self.routes.lock().unwrap_or_else(|e| e.into_inner());
        match (routes.get(&session_id), event) {
            (Some(route), event) => route.send(event),
            // A process whose session already gave up waiting has no owner:
            // it must not run on.
            (None, HubEvent::Started(pidfd)) => {
                let _ = pidfd_send_signal(&pidfd, Signal::KILL);
            }
            (None, _) => {}
        }
        None
    }

    /// Tells every session the Domain is going down, and waits for their
    /// threads to end.
    pub fn domain_down(&self) {
        for route in self
            .routes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
        {
            route.send(HubEvent::DomainDown);
        }
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for thread in threads {
            let _ = thread.join();
        }
    }

    /// Serves one accepted connection on its own thread.
    pub fn spawn_session(self: &Arc<Self>, stream: UnixStream) {
        let hub = Arc::clone(self);
        let thread = std::thread::spawn(move || {
            if let Err(e) = hub.serve(stream) {
                crate::lifecycle::journal::log(format_args!(
                    "session refused or failed: {}",
                    crate::lifecycle::chain(&e)
                ));
            }
        });
        let mut threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        threads.retain(|t| !t.is_finished());
        threads.push(thread);
    }

    fn serve(self: &Arc<Self>, stream: UnixStream) -> Result<(), SessionError> {
        use lazaret_proto::channel::{ChannelError, require_peer_uid};
        require_peer_uid(stream.as_fd(), rustix::process::getuid()).map_err(|e| match e {
            ChannelError::PeerUidMismatch { found, .. } => {
                SessionError::Peer(format!("uid {found} is not this Domain's owner"))
            }
            e => SessionError::Peer(crate::lifecycle::chain(&e)),
        })?;
        let conn = rustls::ServerConnection::new(Arc::clone(&self.server))?;
        let mut link = TlsLink::handshake(conn, stream, Duration::from_secs(10))?;
        let open: OpenSession = link.recv()?;
        link.without_timeouts()?;
        let session_id = SessionId(super::random_bytes());
        let (events, inbox) = mpsc::channel();
        let (wake_read, wake_write) = rustix::pipe::pipe_with(
            rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK,
        )
        .map_err(|e| SessionError::Io(e.into()))?;
        self.routes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                session_id,
                Route {
                    events,
                    wake: wake_write,
                    summary: SessionSummary {
                        session_id,
                        command: open.command.clone().unwrap_or_default(),
                        terminal: open.terminal,
                        opened_at: UnixTimeNs::now(),
                    },
                },
            );
        let result = self.run(&mut link, session_id, &open, &inbox, wake_read.as_fd());
        self.routes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&session_id);
        link.close();
        result
    }

    fn record(&self, session_id: SessionId, state: SessionTerminalState, closed: bool) {
        self.record_with_pty(session_id, state, closed, None);
    }

    fn record_with_pty(
        &self,
        session_id: SessionId,
        state: SessionTerminalState,
        closed: bool,
        pty: Option<PtyIdentity>,
    ) {
        let now = UnixTimeNs::now();
        let opened_at = self
            .routes
            .lock()
            .ok()
            .and_then(|r| r.get(&session_id).map(|r| r.summary.opened_at))
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

    /// Tells the client its session will not open, and records it closed.
    fn refuse(
        &self,
        link: &mut TlsLink,
        session_id: SessionId,
        reason: String,
    ) -> Result<(), SessionError> {
        let sent = link.send(&SessionOpened::Refused { reason });
        self.record(session_id, SessionTerminalState::Closed, true);
        sent.map_err(Into::into)
    }

    fn run(
        &self,
        link: &mut TlsLink,
        session_id: SessionId,
        open: &OpenSession,
        inbox: &Receiver<HubEvent>,
        wake: BorrowedFd<'_>,
    ) -> Result<(), SessionError> {
        self.record(session_id, SessionTerminalState::Intent, false);
        let mut io = match SessionIo::open(open, link.take_received_fds()) {
            Ok(io) => io,
            Err(e) => {
                let reason = format!("cannot open the session's terminal: {e}");
                return self.refuse(link, session_id, reason);
            }
        };
        let args = open
            .command
            .clone()
            .unwrap_or_else(|| vec!["/bin/sh".into(), "-l".into()]);
        let (stdio, passed) = io.take_process_ends(open);
        let mut fds: Vec<BorrowedFd<'_>> = vec![self.environment.as_fd()];
        fds.extend(passed.iter().map(AsFd::as_fd));
        let request = SupervisorRequest::Exec(ExecRequest {
            session_id,
            args,
            cwd: lazaret_proto::layout::WORKSPACE.into(),
            term: open.term.clone(),
            environment: FdIndex(0),
            stdio,
        });
        self.supervisor
            .send(&request, &fds)
            .map_err(|e| SessionError::Supervisor(crate::lifecycle::chain(&e)))?;
        // The child's ends now live in the supervisor; only ours remain here.
        drop(fds);
        drop(passed);

        let process = loop {
            if !readable(wake, Duration::from_secs(30)) {
                let reason = "the sandbox did not start the session within 30 s".into();
                return self.refuse(link, session_id, reason);
            }
            drain(wake);
            match inbox.try_recv() {
                Ok(HubEvent::Started(pidfd)) => break pidfd,
                Ok(HubEvent::Failed(reason)) => return self.refuse(link, session_id, reason),
                Ok(HubEvent::DomainDown) => {
                    let reason = "the Domain is going down".into();
                    return self.refuse(link, session_id, reason);
                }
                Ok(HubEvent::Exited { .. }) | Err(_) => {}
            }
        };
        link.send(&SessionOpened::Opened { session_id })?;
        self.record_with_pty(
            session_id,
            SessionTerminalState::Running,
            false,
            io.pty_identity(),
        );

        let outcome = pump(
            link,
            &mut io,
            session_id,
            inbox,
            wake,
            &Signaller {
                supervisor: &self.supervisor,
                session_id,
            },
        );
        match outcome {
            Ok(exit) => {
                let _ = link.send(&SessionTerminalMessage::Exit(exit));
                self.record(session_id, SessionTerminalState::Exited, true);
                Ok(())
            }
            Err(error) => {
                // The CLI is gone, or the session broke: its process must
                // not outlive it. Kill it inside the sandbox (the sandbox's
                // pid 1 ends the rest of its session), then its `runsc exec`.
                Signaller {
                    supervisor: &self.supervisor,
                    session_id,
                }
                .send(ExecSignal::Kill);
                if !wait_exited(inbox, wake) {
                    let _ = pidfd_send_signal(&process, Signal::KILL);
                }
                self.record(session_id, SessionTerminalState::Closed, true);
                match error {
                    SessionError::Link(LinkError::Closed) => Ok(()),
                    other => Err(other),
                }
            }
        }
    }
}

/// Sends signals to one session's process inside the sandbox, through the
/// supervisor (`runsc kill --pid`).
struct Signaller<'a> {
    supervisor: &'a SupervisorLink,
    session_id: SessionId,
}

impl Signaller<'_> {
    fn send(&self, signal: ExecSignal) {
        let _ = self.supervisor.send(
            &SupervisorRequest::SignalExec {
                session_id: self.session_id,
                signal,
            },
            &[],
        );
    }
}

/// Waits for the exit report of a killed session process.
fn wait_exited(inbox: &Receiver<HubEvent>, wake: BorrowedFd<'_>) -> bool {
    for _ in 0..100 {
        if readable(wake, Duration::from_millis(100)) {
            drain(wake);
            while let Ok(event) = inbox.try_recv() {
                if matches!(event, HubEvent::Exited { .. } | HubEvent::DomainDown) {
                    return true;
                }
            }
        }
    }
    false
}

/// The host side of a session's standard streams.
#[derive(Debug)]
enum SessionIo {
    /// A PTY: our master, and the slave until it is passed to the process.
    Terminal {
        master: OwnedFd,
        slave: Option<OwnedFd>,
    },
    /// Pipes: we write `input` and read `output`; the other ends go to the
    /// process. A direct session has only the process's ends: the CLI's own
    /// descriptors.
    Pipes {
        input: Option<OwnedFd>,
        output: Option<OwnedFd>,
        child_input: Option<OwnedFd>,
        child_output: Option<OwnedFd>,
    },
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
            return Ok(Self::Pipes {
                input: None,
                output: None,
                child_input: Some(input),
                child_output: Some(output),
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
            Ok(Self::Terminal {
                master,
                slave: Some(slave),
            })
        } else {
            let flags = rustix::pipe::PipeFlags::CLOEXEC;
            let (child_input, input) = rustix::pipe::pipe_with(flags)?;
            let (output, child_output) = rustix::pipe::pipe_with(flags)?;
            // A large output pipe, read without blocking, lets the process
            // write on while the coordinator relays.
            let _ = rustix::pipe::fcntl_setpipe_size(&output, OUTPUT_PIPE_SIZE);
            rustix::fs::fcntl_setfl(&output, rustix::fs::OFlags::NONBLOCK)?;
            Ok(Self::Pipes {
                input: Some(input),
                output: Some(output),
                child_input: Some(child_input),
                child_output: Some(child_output),
            })
        }
    }

    /// The stdio description and the process's ends of its streams, taken
    /// out of `self` so that only the process holds them (descriptors from
    /// index 1, after the environment).
    fn take_process_ends(&mut self, open: &OpenSession) -> (ExecStdio, Vec<OwnedFd>) {
        match self {
            Self::Terminal { slave, .. } => (
                ExecStdio::Terminal {
                    slave: FdIndex(1),
                    rows: open.rows,
                    columns: open.columns,
                },
                slave.take().into_iter().collect(),
            ),
            Self::Pipes {
                child_input,
                child_output,
                ..
            } => (
                ExecStdio::Pipes {
                    input: FdIndex(1),
                    output: FdIndex(2),
                },
                [child_input.take(), child_output.take()]
                    .into_iter()
                    .flatten()
                    .collect(),
            ),
        }
    }

    /// The identity of the PTY master, for the session's record.
    fn pty_identity(&self) -> Option<PtyIdentity> {
        let Self::Terminal { master, .. } = self else {
            return None;
        };
        let stat = rustix::fs::fstat(master).ok()?;
        Some(PtyIdentity {
            master_fd: u32::try_from(std::os::fd::AsRawFd::as_raw_fd(master)).ok()?,
            device: stat.st_rdev,
            inode: stat.st_ino,
        })
    }

    /// What to read output from; `None` when the process writes to the
    /// CLI directly.
    fn output(&self) -> Option<BorrowedFd<'_>> {
        match self {
            Self::Terminal { master, .. } => Some(master.as_fd()),
            Self::Pipes { output, .. } => output.as_ref().map(AsFd::as_fd),
        }
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

fn drain(wake: BorrowedFd<'_>) {
    let mut buf = [0u8; 64];
    while matches!(rustix::io::read(wake, &mut buf), Ok(n) if n > 0) {}
}

/// Why a session failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The peer is not this Domain's owner.
    #[error("refused a session connection: {0}")]
    Peer(String),
    /// TLS refused the peer.
    #[error("refused a session connection")]
    Tls(#[from] rustls::Error),
    /// The link failed.
    #[error("the session link failed")]
    Link(#[from] LinkError),
    /// The supervisor could not be asked.
    #[error("cannot ask the supervisor for the session process: {0}")]
    Supervisor(String),
    /// A host descriptor failed.
    #[error("a session descriptor failed")]
    Io(#[from] std::io::Error),
}

/// The output pipe's capacity for sessions without a terminal.
const OUTPUT_PIPE_SIZE: usize = 1 << 20;

/// How many output chunks one wakeup relays at most.
const READS_PER_WAKEUP: usize = 16;

/// Moves bytes between the link and the session's streams until the
/// process exits (`Ok`), the Domain goes down (`Ok` with `DomainDown`), or
/// the link ends (`Err`).
fn pump(
    link: &mut TlsLink,
    io: &mut SessionIo,
    session_id: SessionId,
    inbox: &Receiver<HubEvent>,
    wake: BorrowedFd<'_>,
    signaller: &Signaller<'_>,
) -> Result<SessionExit, SessionError> {
    let mut input_open = true;
    let mut output_open = io.output().is_some();
    let mut exited: Option<SessionExit> = None;
    let mut buf = vec![0u8; MAX_TERMINAL_CHUNK];
    let link_fd = link.fd().try_clone_to_owned()?;
    let exit_of = |outcome, code| SessionExit {
        session_id,
        outcome,
        exit_code: code,
    };
    loop {
        // Once the process exited, wait only for its remaining output.
        if let Some(exit) = exited {
            let more = io
                .output()
                .is_some_and(|fd| readable(fd, Duration::from_millis(200)));
            if !output_open || !more {
                return Ok(exit);
            }
        }
        let mut fds = vec![
            PollFd::new(&link_fd, PollFlags::IN),
            PollFd::new(&wake, PollFlags::IN),
        ];
        let output = io.output().filter(|_| output_open);
        if let Some(output) = &output {
            fds.push(PollFd::new(output, PollFlags::IN));
        }
        // Frames already buffered (some arrive with the session's opening)
        // are handled without waiting.
        let timeout = link.has_frame().then_some(rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        });
        match poll(&mut fds, timeout.as_ref()) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(SessionError::Io(e.into())),
        }
        let link_ready = !fds[0].revents().is_empty();
        let wake_ready = !fds[1].revents().is_empty();
        let output_ready = fds.get(2).is_some_and(|f| !f.revents().is_empty());
        drop(fds);

        if let Some(output) = output.filter(|_| output_ready) {
            // Relay what is there now, a few chunks per wakeup.
            for _ in 0..READS_PER_WAKEUP {
                match rustix::io::read(output, &mut buf) {
                    Ok(0) | Err(rustix::io::Errno::IO) => {
                        output_open = false;
                        break;
                    }
                    Ok(n) => link.send(&SessionTerminalMessage::Output(TerminalOutput {
                        session_id,
                        bytes: buf[..n].to_vec(),
                    }))?,
                    Err(rustix::io::Errno::INTR) => {}
                    Err(rustix::io::Errno::AGAIN) => break,
                    Err(e) => return Err(SessionError::Io(e.into())),
                }
                if !matches!(io, SessionIo::Pipes { .. }) {
                    // A PTY master reads one chunk per wakeup: it blocks.
                    break;
                }
            }
        }
        if wake_ready {
            drain(wake);
            while let Ok(event) = inbox.try_recv() {
                match event {
                    HubEvent::Exited { code, signaled } => {
                        let outcome = if signaled {
                            SessionExitOutcome::Terminated
                        } else {
                            SessionExitOutcome::Exited
                        };
                        exited = Some(exit_of(outcome, code));
                    }
                    HubEvent::DomainDown => {
                        // The whole sandbox stops next; nothing to kill here.
                        return Ok(exit_of(SessionExitOutcome::DomainDown, 255));
                    }
                    HubEvent::Started(_) | HubEvent::Failed(_) => {}
                }
            }
        }
        if exited.is_none() {
            if link_ready {
                link.fill()?;
            }
            while let Some(event) = link.next_frame::<SessionTerminalEvent>()? {
                if event.session_id() != session_id {
                    return Err(SessionError::Peer("an event named another session".into()));
                }
                match event {
                    SessionTerminalEvent::Input(input) => {
                        let target = match &*io {
                            SessionIo::Terminal { master, .. } => Some(master.as_fd()),
                            SessionIo::Pipes {
                                input: Some(fd), ..
                            } if input_open => Some(fd.as_fd()),
                            SessionIo::Pipes { .. } => None,
                        };
                        if let Some(fd) = target {
                            let _ = write_all(fd, &input.bytes);
                        }
                    }
                    SessionTerminalEvent::Resize(size) => {
                        if let SessionIo::Terminal { master, .. } = &*io {
                            resize(master.as_fd(), size.rows, size.columns);
                        }
                    }
                    SessionTerminalEvent::Signal(signal) => {
                        signaller.send(signal.signal.into());
                    }
                    SessionTerminalEvent::Close(_) => {
                        // End of input: closing our end of the input pipe
                        // gives the process end of file.
                        input_open = false;
                        if let SessionIo::Pipes { input, .. } = io {
                            *input = None;
                        }
                    }
                }
            }
        }
    }
}

fn write_all(fd: BorrowedFd<'_>, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        match rustix::io::write(fd, bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
