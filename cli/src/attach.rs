//! `lazaret attach PROFILE [-- COMMAND...]`: a Client Session.
//!
//! Connects to the Domain's Session Coordinator socket, proves itself with
//! the generation's client certificate and checks the coordinator against
//! the trust manifest, then moves bytes: the local terminal (raw, and its
//! modes and the standard streams' file status flags restored on every
//! exit path) or plain standard input and output, window-size changes, and
//! the exit code of the process inside. Only pipes and `/dev/null` are
//! handed to the process inside; a terminal, socket or file is relayed.
//! Trusts the coordinator only through the TLS handshake pinned to the
//! generation's CA.

use std::io::{IsTerminal, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use lazaret_proto::ids::SessionId;
use lazaret_proto::mailbox::DeveloperDecisionKind;
use lazaret_proto::session::{OpenSession, SessionOpened};
use lazaret_proto::terminal::{
    EscalationAnswer, EscalationPrompt, MAX_TERMINAL_CHUNK, SessionClose, SessionExitOutcome,
    SessionTerminalEvent, SessionTerminalMessage, TerminalInput, TerminalResize, TerminalSignal,
    TerminalSignalKind,
};
use rustix::event::{PollFd, PollFlags, poll};
use rustix::termios::{OptionalActions, Termios};

use super::screen::Screen;
use super::{Failure, Globals, failure, prompt};
use crate::config::HostEnvironment;
use crate::lifecycle::{DomainPaths, chain};
use crate::session::link::TlsLink;
use crate::session::tls::{ClientCredential, read_publication, server_name};
use crate::session::{CREDENTIAL_DIR, SESSION_SOCKET};

/// Puts the terminal back as it was, whatever ends the session.
struct RawMode {
    fd: OwnedFd,
    saved: Termios,
}

impl RawMode {
    fn enter(fd: BorrowedFd<'_>) -> std::io::Result<Self> {
        let saved = rustix::termios::tcgetattr(fd)?;
        let mut raw = saved.clone();
        raw.make_raw();
        rustix::termios::tcsetattr(fd, OptionalActions::Flush, &raw)?;
        Ok(Self {
            fd: fd.try_clone_to_owned()?,
            saved,
        })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = rustix::termios::tcsetattr(&self.fd, OptionalActions::Flush, &self.saved);
    }
}

/// Puts the file status flags (`O_NONBLOCK`, `O_APPEND`, ...) of the
/// standard streams back as they were, whatever ends the session: a
/// process inside that is handed a pipe shares its open file, and the
/// runtime makes it non-blocking.
struct StatusFlags(Vec<(BorrowedFd<'static>, rustix::fs::OFlags)>);

impl StatusFlags {
    fn save() -> Self {
        let streams = [
            rustix::stdio::stdin(),
            rustix::stdio::stdout(),
            rustix::stdio::stderr(),
        ];
        Self(
            streams
                .into_iter()
                .filter_map(|fd| Some((fd, rustix::fs::fcntl_getfl(fd).ok()?)))
                .collect(),
        )
    }
}

impl Drop for StatusFlags {
    fn drop(&mut self) {
        for (fd, saved) in &self.0 {
            if rustix::fs::fcntl_getfl(fd).is_ok_and(|now| now != *saved) {
                let _ = rustix::fs::fcntl_setfl(fd, *saved);
            }
        }
    }
}

fn window_size() -> (u16, u16) {
    rustix::termios::tcgetwinsize(std::io::stdout())
        .or_else(|_| rustix::termios::tcgetwinsize(std::io::stdin()))
        .map(|w| (w.ws_row, w.ws_col))
        .unwrap_or((24, 80))
}

/// `lazaret attach PROFILE [-- COMMAND...]`: returns the exit code.
pub fn attach(globals: &Globals, profile: &str, command: Vec<String>) -> Result<u8, Failure> {
    let _flags = StatusFlags::save();
    // The configuration is loaded on a thread of its own while the
    // connection is made, which mostly waits on the coordinator.
    std::thread::scope(|scope| {
        let loaded = scope.spawn(|| globals.load_with(profile, crate::config::EnvValues::Skip));
        connect_and_run(globals, profile, command, loaded)
    })
}

/// The rest of [`attach`], with the configuration being loaded by `loaded`.
fn connect_and_run(
    globals: &Globals,
    profile: &str,
    command: Vec<String>,
    loaded: std::thread::ScopedJoinHandle<
        '_,
        Result<crate::config::ResolvedDomainConfiguration, Failure>,
    >,
) -> Result<u8, Failure> {
    let workspace = globals.workspace_dir()?;
    let paths = DomainPaths::locate(profile, &workspace, &HostEnvironment::capture())?;
    // A Domain that is not running has no runtime dir or no listener.
    let absent = |e: &std::io::Error| {
        matches!(
            e.kind(),
            std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
        )
    };
    let dir = rustix::fs::open(
        &paths.runtime_dir,
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| match std::io::Error::from(e) {
        e if absent(&e) => not_running(profile),
        e => failure(format!("cannot open {}: {e}", paths.runtime_dir.display())),
    })?;
    let credential_path = paths.runtime_dir.join(CREDENTIAL_DIR);
    let credential_dir =
        crate::config::RetainedDir::open_ambient(&credential_path).map_err(|e| match &e {
            crate::config::ConfinedError::Missing { .. } => not_running(profile),
            crate::config::ConfinedError::Io { source, .. } if absent(source) => {
                not_running(profile)
            }
            e => failure(format!(
                "cannot open the session credential directory: {}",
                chain(e)
            )),
        })?;
    let credential = ClientCredential::load(&credential_dir)
        .map_err(|e| failure(format!("cannot load the session credential: {}", chain(&e))))?;
    let socket = lazaret_proto::channel::socket_path_at(dir.as_fd(), SESSION_SOCKET);
    let stream = UnixStream::connect(&socket).map_err(|e| {
        if absent(&e) {
            not_running(profile)
        } else {
            failure(format!(
                "cannot connect to {}: {e}",
                paths.runtime_dir.join(SESSION_SOCKET).display()
            ))
        }
    })?;
    let conn = rustls::ClientConnection::new(credential.client_config(), server_name())
        .map_err(|e| failure(format!("cannot start TLS: {e}")))?;
    let mut link = TlsLink::handshake(conn, stream, Duration::from_secs(60)).map_err(|e| {
        failure(format!(
            "the Domain's Session Coordinator was refused: {}",
            chain(&e)
        ))
    })?;

    let manifest = credential.manifest();
    // The publication beside the credential must name the same generation
    // (checked after the handshake, so that a credential of another
    // generation is refused by TLS itself first).
    let publication = read_publication(&credential_dir).map_err(|e| {
        failure(format!(
            "cannot read the session publication: {}",
            chain(&e)
        ))
    })?;
    if publication.generation_identity != manifest.generation_identity
        || manifest.generation_identity.domain_id != paths.domain_id
    {
        return Err(failure(format!(
            "the session credential in {} does not belong to the Domain's running generation \
             (it was left by another run); run `lazaret down {profile}` and `lazaret up {profile}` \
             to renew it",
            paths.runtime_dir.display()
        )));
    }
    // The generation must run the profile as configured now: a session
    // under an older configuration (another network policy, other volumes)
    // is refused rather than entered unawares. The `env:` values are not
    // needed for that, and this shell need not export them.
    let loaded = loaded
        .join()
        .map_err(|_| failure("loading the configuration failed unexpectedly"))?
        .map_err(|f| {
            failure(format!(
                "cannot check the running Domain against the configuration: {}",
                f.message
            ))
        })?;
    let running = manifest.generation_identity.configuration_fingerprint;
    if loaded.fingerprint() != running {
        return Err(failure(format!(
            "profile `{profile}` runs under another configuration than the one it has now \
             (fingerprint {} running, {} configured); run `lazaret up {profile}` to see what \
             differs, then `lazaret down {profile}` and `lazaret up {profile}` to apply it",
            &running.to_hex()[..16],
            &loaded.fingerprint().to_hex()[..16],
        )));
    }

    let terminal = std::io::stdin().is_terminal();
    let (rows, columns) = window_size();
    let open = OpenSession {
        command: (!command.is_empty()).then_some(command),
        terminal,
        prompts: terminal && std::io::stdout().is_terminal(),
        rows,
        columns,
        term: terminal.then(|| std::env::var("TERM").ok()).flatten(),
        // Without a terminal, the process reads and writes this CLI's own
        // standard input and output when both are pipes or /dev/null:
        // nothing is relayed. A terminal (on standard output), a socket or
        // a file is never handed in.
        direct_stdio: !terminal
            && crate::session::donatable(rustix::stdio::stdin())
            && crate::session::donatable(rustix::stdio::stdout()),
    };
    let lost =
        |e: &dyn std::error::Error| failure(format!("the session connection failed: {}", chain(e)));
    if open.direct_stdio {
        let stdio = [rustix::stdio::stdin(), rustix::stdio::stdout()];
        link.send_with_fds(&open, &stdio).map_err(|e| lost(&e))?;
    } else {
        link.send(&open).map_err(|e| lost(&e))?;
    }
    let opened = link.recv::<SessionOpened>().map_err(|e| lost(&e))?;
    link.without_timeouts().map_err(|e| lost(&e))?;
    let session_id = match opened {
        SessionOpened::Opened { session_id } => session_id,
        SessionOpened::Refused { reason } => {
            return Err(failure(format!("the session was refused: {reason}")));
        }
    };

    // Signals arrive through pipes the poll loop watches: a window change
    // becomes a resize, SIGINT and SIGQUIT are passed to the process
    // inside, SIGTERM and SIGHUP end the session. Raw mode is undone by
    // `RawMode`'s drop on every path out.
    let mut registered = Vec::new();
    let mut signal_pipes = Vec::new();
    for (signal, raised) in [
        (signal_hook::consts::SIGWINCH, Raised::Resize),
        (
            signal_hook::consts::SIGINT,
            Raised::Forward(TerminalSignalKind::Interrupt),
        ),
        (
            signal_hook::consts::SIGQUIT,
            Raised::Forward(TerminalSignalKind::Quit),
        ),
        (
            signal_hook::consts::SIGTERM,
            Raised::End(EndedHere::Terminated),
        ),
        (signal_hook::consts::SIGHUP, Raised::End(EndedHere::HungUp)),
    ] {
        let (read, write) = rustix::pipe::pipe_with(
            rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK,
        )
        .map_err(|e| failure(e.to_string()))?;
        registered.push(
            signal_hook::low_level::pipe::register(signal, UnixStream::from(write))
                .map_err(|e| failure(e.to_string()))?,
        );
        signal_pipes.push((read, raised));
    }
    let raw = if terminal {
        Some(
            RawMode::enter(std::io::stdin().as_fd())
                .map_err(|e| failure(format!("cannot set the terminal raw: {e}")))?,
        )
    } else {
        None
    };
    let mut screen = Screen::default();
    let result = relay(
        &mut link,
        session_id,
        &signal_pipes,
        !open.direct_stdio,
        terminal.then_some(&mut screen),
    );
    if terminal {
        // What the program inside left set (the alternate screen, a
        // scrolling region, origin or insert mode, colours, keyboard
        // modes) is undone before the shell is back.
        let mut stdout = std::io::stdout().lock();
        let _ = stdout
            .write_all(&screen.reset())
            .and_then(|()| stdout.flush());
    }
    drop(raw);
    for id in registered {
        signal_hook::low_level::unregister(id);
    }
    link.close();
    match result {
        Ok(Ended::Session(SessionExitOutcome::Exited | SessionExitOutcome::Terminated, code)) => {
            Ok(code)
        }
        Ok(Ended::Session(SessionExitOutcome::DomainDown, _)) => Err(failure(format!(
            "the Domain went down (`lazaret down {profile}`); the session ended"
        ))),
        Ok(Ended::Session(SessionExitOutcome::Lost, _)) => {
            Err(failure("the session's process was lost"))
        }
        Ok(Ended::Here(why)) => Err(Failure {
            message: format!("{why}; the session ended"),
            status: 128 + u8::try_from(why.signal()).unwrap_or(0),
        }),
        Err(message) => Err(failure(message)),
    }
}

/// What a signal to this CLI does.
#[derive(Debug, Clone, Copy)]
enum Raised {
    /// The window changed size.
    Resize,
    /// Passed to the session's process.
    Forward(TerminalSignalKind),
    /// The session ends: at once if its process ends within
    /// [`ENDING_GRACE`] of being told, else when that is over.
    End(EndedHere),
}

/// How long a session's process has to end after this CLI was asked to
/// stop or lost its terminal; then the connection is closed, and the Host
/// Coordinator kills what is left.
const ENDING_GRACE: Duration = Duration::from_secs(2);

/// Why this side ended a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EndedHere {
    /// SIGTERM.
    Terminated,
    /// SIGHUP.
    HungUp,
    /// The terminal went away (its input ended or failed, or its output
    /// could not be written).
    TerminalLost,
    /// Standard output, not a terminal, was closed (a broken pipe).
    OutputClosed,
}

impl EndedHere {
    /// The signal the exit status names.
    fn signal(self) -> i32 {
        match self {
            Self::Terminated => signal_hook::consts::SIGTERM,
            Self::HungUp | Self::TerminalLost => signal_hook::consts::SIGHUP,
            Self::OutputClosed => signal_hook::consts::SIGPIPE,
        }
    }

    /// What the session's process is told: a hangup where the terminal
    /// went, as a terminal's hangup tells it.
    fn told(self) -> TerminalSignalKind {
        match self {
            Self::Terminated | Self::OutputClosed => TerminalSignalKind::Terminate,
            Self::HungUp | Self::TerminalLost => TerminalSignalKind::Hangup,
        }
    }
}

impl std::fmt::Display for EndedHere {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Terminated => "lazaret attach was asked to stop (SIGTERM)",
            Self::HungUp => "the terminal hung up (SIGHUP)",
            Self::TerminalLost => "the terminal went away",
            Self::OutputClosed => "standard output was closed",
        })
    }
}

/// How a relay ended.
#[derive(Debug)]
enum Ended {
    /// The Host Coordinator reported the session's end: its outcome and
    /// exit code.
    Session(SessionExitOutcome, u8),
    /// This side ended it, and its process did not end within the grace.
    Here(EndedHere),
}

/// Whether the connection has room to send now.
fn writable(fd: BorrowedFd<'_>) -> bool {
    let mut fds = [PollFd::new(&fd, PollFlags::OUT)];
    matches!(poll(&mut fds, Some(&rustix::event::Timespec::default())), Ok(n) if n > 0)
}

fn not_running(profile: &str) -> Failure {
    failure(format!(
        "profile `{profile}` is not running in this workspace; start it with `lazaret up {profile}`"
    ))
}

/// Moves bytes and signals until the coordinator reports the session's end,
/// or this side ends it (SIGTERM, SIGHUP, a lost terminal) and the grace is
/// over.
fn relay(
    link: &mut TlsLink,
    session_id: SessionId,
    signal_pipes: &[(OwnedFd, Raised)],
    forward_stdin: bool,
    screen: Option<&mut Screen>,
) -> Result<Ended, String> {
    let stdin = std::io::stdin();
    let stdin = stdin.as_fd();
    let link_fd = link.fd().try_clone_to_owned().map_err(|e| e.to_string())?;
    let terminal = screen.is_some();
    let mut unfollowed = Screen::default();
    let mut relay = Relay {
        link,
        session_id,
        stdout: std::io::stdout().lock(),
        screen: screen.unwrap_or(&mut unfollowed),
        terminal,
        // Prompts are shown only where a developer can see and answer them.
        can_prompt: terminal && std::io::stdout().is_terminal(),
        prompter: prompt::Prompter::default(),
        ending: None,
        stdout_open: true,
    };
    let mut stdin_open = forward_stdin;
    let mut buf = vec![0u8; MAX_TERMINAL_CHUNK];
    loop {
        // Frames already read (some may have come with the previous ones)
        // are handled before waiting for more.
        while let Some(message) = relay
            .link
            .next_frame::<SessionTerminalMessage>()
            .map_err(|e| lost(&e))?
        {
            if let Some(ended) = relay.message(message)? {
                return Ok(ended);
            }
        }
        if let Some((why, until)) = relay.ending {
            if Instant::now() >= until {
                let _ = relay.prompter.abandon(&mut relay.stdout, relay.screen);
                return Ok(Ended::Here(why));
            }
        }
        // Input is read only while the connection has room for it: a
        // process that does not read its input holds this CLI back
        // (backpressure) instead of a write that blocks or times out, and
        // output and signals still flow meanwhile.
        let room = !stdin_open || writable(link_fd.as_fd());
        // While a prompt holds output back and the held output is full,
        // the connection is not read (its sender waits) until the answer.
        let reading = if relay.prompter.full() {
            PollFlags::empty()
        } else {
            PollFlags::IN
        };
        let link_events = if room {
            reading
        } else {
            reading | PollFlags::OUT
        };
        let mut fds = vec![PollFd::new(&link_fd, link_events)];
        fds.extend(
            signal_pipes
                .iter()
                .map(|(fd, _)| PollFd::new(fd, PollFlags::IN)),
        );
        let read_stdin = stdin_open && room;
        if read_stdin {
            fds.push(PollFd::new(&stdin, PollFlags::IN));
        }
        let timeout = relay
            .deadline()
            .map(|left| rustix::event::Timespec::try_from(left).unwrap_or_default());
        match poll(&mut fds, timeout.as_ref()) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.to_string()),
        }
        let link_revents = fds[0].revents();
        let ready: Vec<bool> = fds.iter().map(|f| !f.revents().is_empty()).collect();
        drop(fds);
        relay.expire_prompt()?;
        // A connection that hung up or failed is read even while held
        // output is full (poll reports that whatever was asked): the read
        // tells that it ended, where skipping it would poll again at once.
        let link_ready = link_revents.intersects(PollFlags::HUP | PollFlags::ERR)
            || (!relay.prompter.full() && link_revents.contains(PollFlags::IN));
        for ((fd, raised), _) in signal_pipes.iter().zip(&ready[1..]).filter(|(_, r)| **r) {
            let mut bytes = [0u8; 16];
            while matches!(rustix::io::read(fd, &mut bytes), Ok(n) if n > 0) {}
            relay.raised(*raised)?;
        }
        if read_stdin && ready[1 + signal_pipes.len()] {
            match rustix::io::read(stdin, &mut buf) {
                Ok(n) if n > 0 => relay.typed(&buf[..n])?,
                Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => {}
                // A terminal in raw mode never ends its input (Ctrl-D is a
                // key): an end or a failure is the terminal going away.
                _ if terminal => {
                    stdin_open = false;
                    relay.end_here(EndedHere::TerminalLost)?;
                }
                Ok(_) => {
                    stdin_open = false;
                    relay.send(&SessionTerminalEvent::Close(SessionClose { session_id }))?;
                }
                Err(_) => stdin_open = false,
            }
        }
        if link_ready {
            relay.link.fill().map_err(|e| lost(&e))?;
        }
    }
}

/// What a failed send or receive on the session connection says.
fn lost(error: &dyn std::error::Error) -> String {
    format!("the connection to the Domain was lost: {}", chain(error))
}

/// One session's relay: the connection, the terminal (or standard output)
/// and the prompt shown on it.
struct Relay<'a> {
    link: &'a mut TlsLink,
    session_id: SessionId,
    stdout: std::io::StdoutLock<'static>,
    /// What the output has changed on the terminal (unused without one).
    screen: &'a mut Screen,
    terminal: bool,
    can_prompt: bool,
    prompter: prompt::Prompter,
    /// Once this side ends the session: why, and until when its process
    /// may still end by itself.
    ending: Option<(EndedHere, Instant)>,
    stdout_open: bool,
}

impl Relay<'_> {
    fn send(&mut self, event: &SessionTerminalEvent) -> Result<(), String> {
        self.link.send(event).map_err(|e| lost(&e))
    }

    /// Acts on one message from the Host Coordinator: the session's end,
    /// when it is one.
    fn message(&mut self, message: SessionTerminalMessage) -> Result<Option<Ended>, String> {
        match message {
            SessionTerminalMessage::Output(output) => self.output(&output.bytes)?,
            SessionTerminalMessage::Exit(exit) => {
                let _ = self.prompter.abandon(&mut self.stdout, self.screen);
                return Ok(Some(Ended::Session(exit.outcome, exit.exit_code)));
            }
            SessionTerminalMessage::EscalationPrompt(request) => self.prompt(&request)?,
            SessionTerminalMessage::EscalationSettled(settled) => self
                .prompter
                .settled(&mut self.stdout, &settled, self.screen)
                .map_err(|e| e.to_string())?,
        }
        self.after_prompt()?;
        Ok(None)
    }

    /// Writes the process's output, or holds it while a prompt waits; a
    /// closed standard output ends the session.
    fn output(&mut self, bytes: &[u8]) -> Result<(), String> {
        if self.prompter.waiting() {
            self.prompter.hold(bytes);
            return Ok(());
        }
        if !self.stdout_open {
            return Ok(());
        }
        if self.terminal {
            self.screen.observe(bytes);
        }
        if self
            .stdout
            .write_all(bytes)
            .and_then(|()| self.stdout.flush())
            .is_err()
        {
            self.stdout_open = false;
            let why = if self.terminal {
                EndedHere::TerminalLost
            } else {
                EndedHere::OutputClosed
            };
            self.end_here(why)?;
        }
        Ok(())
    }

    /// Shows an escalation prompt where a developer can answer it; denies
    /// it everywhere else.
    fn prompt(&mut self, request: &EscalationPrompt) -> Result<(), String> {
        if self.can_prompt && self.ending.is_none() {
            let keyboard = std::io::stdin();
            return self
                .prompter
                .show(
                    &mut self.stdout,
                    keyboard.as_fd(),
                    request,
                    self.screen,
                    window_size(),
                )
                .map_err(|e| e.to_string());
        }
        if self.ending.is_none() {
            eprint!(
                "lazaret: denied a host command the sandbox asked for, because this terminal \
                 cannot show the prompt: {}\r\n",
                crate::escalation::classify::shown_ascii(&request.command_argv)
            );
        }
        self.send(&SessionTerminalEvent::EscalationAnswer(EscalationAnswer {
            session_id: self.session_id,
            request_id: request.request_id,
            decision: DeveloperDecisionKind::Deny,
        }))
    }

    /// Keys typed: the prompt's while one waits, else the process's input.
    fn typed(&mut self, bytes: &[u8]) -> Result<(), String> {
        if !self.prompter.waiting() {
            return self.send(&SessionTerminalEvent::Input(TerminalInput {
                session_id: self.session_id,
                bytes: bytes.to_vec(),
            }));
        }
        let answer = self
            .prompter
            .key(&mut self.stdout, self.session_id, bytes, self.screen)
            .map_err(|e| e.to_string())?;
        if let Some(answer) = answer {
            self.send(&SessionTerminalEvent::EscalationAnswer(answer))?;
        }
        self.after_prompt()
    }

    /// Acts on a signal this CLI got.
    fn raised(&mut self, raised: Raised) -> Result<(), String> {
        match raised {
            Raised::Resize => {
                self.prompter
                    .resized(&mut self.stdout, window_size())
                    .map_err(|e| e.to_string())?;
                self.send_resize()
            }
            Raised::Forward(signal) => self.send(&SessionTerminalEvent::Signal(TerminalSignal {
                session_id: self.session_id,
                signal,
            })),
            Raised::End(why) => self.end_here(why),
        }
    }

    /// Ends the session from this side: its process is told (once), and
    /// has [`ENDING_GRACE`] to end; a prompt waiting is denied, since
    /// nobody is left to answer it.
    fn end_here(&mut self, why: EndedHere) -> Result<(), String> {
        if self.ending.is_none() {
            self.ending = Some((why, Instant::now() + ENDING_GRACE));
            self.send(&SessionTerminalEvent::Signal(TerminalSignal {
                session_id: self.session_id,
                signal: why.told(),
            }))?;
        }
        if let Ok(Some(answer)) = self
            .prompter
            .deny(&mut self.stdout, self.session_id, self.screen)
        {
            self.send(&SessionTerminalEvent::EscalationAnswer(answer))?;
        }
        Ok(())
    }

    /// How long the wait for the next event may last: a waiting prompt
    /// comes down past its expiry even if the Host Coordinator never says
    /// so, and a session this side ends has its grace.
    fn deadline(&self) -> Option<Duration> {
        let grace = self
            .ending
            .map(|(_, until)| until.saturating_duration_since(Instant::now()));
        [self.prompter.time_left(), grace]
            .into_iter()
            .flatten()
            .min()
    }

    /// Takes a prompt down past its expiry.
    fn expire_prompt(&mut self) -> Result<(), String> {
        self.prompter
            .expire(&mut self.stdout, self.screen)
            .map_err(|e| e.to_string())?;
        self.after_prompt()
    }

    /// The window's size, sent to the Host Coordinator.
    fn send_resize(&mut self) -> Result<(), String> {
        let (rows, columns) = window_size();
        self.send(&SessionTerminalEvent::Resize(TerminalResize {
            session_id: self.session_id,
            rows,
            columns,
            width_pixels: 0,
            height_pixels: 0,
        }))
    }

    /// After a prompt drawn over a program's own screen: the size again,
    /// which the Host Coordinator passes on as a window change, so the
    /// program draws its screen again.
    fn after_prompt(&mut self) -> Result<(), String> {
        if self.prompter.take_redraw() {
            self.send_resize()?;
        }
        Ok(())
    }
}
