//! The relay of one Client Session on the event loop: the process's output
//! to the terminal (or standard output), keys (or standard input) to the
//! process, window-size changes and signals, and the escalation prompts
//! shown on the terminal, until the Host Coordinator reports the session's
//! end or this side ends it.
//!
//! Owns the session from its opening to its end, not the terminal's modes
//! (`terminal.rs` puts them back). Trusts the Host Coordinator's messages
//! as far as the link checked them; output reaches the terminal as it
//! came, as a terminal session's would, while [`Screen`] follows it.

use std::io::{IsTerminal, Write};
use std::os::fd::AsFd;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use lazaret_coordinator::session::link::{ClientLink, LinkError};
use lazaret_proto::ids::SessionId;
use lazaret_proto::mailbox::DeveloperDecisionKind;
use lazaret_proto::terminal::{
    EscalationAnswer, EscalationPrompt, MAX_TERMINAL_CHUNK, SessionClose, SessionExitOutcome,
    SessionTerminalEvent, SessionTerminalMessage, TerminalInput, TerminalResize, TerminalSignal,
    TerminalSignalKind,
};
use tokio::signal::unix::{Signal, SignalKind, signal};

use super::terminal::{Keyboard, hung_up, window_size};
use crate::prompt;
use crate::screen::Screen;

/// How long a session's process has to end after this CLI was asked to
/// stop or lost its terminal; then the connection is closed, and the Host
/// Coordinator kills what is left.
const ENDING_GRACE: Duration = Duration::from_secs(2);

/// How often, while a prompt holds output back and the connection is not
/// read, the connection is checked for a peer that hung up.
const HANGUP_CHECK: Duration = Duration::from_millis(250);

/// Why the relay failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum RelayError {
    /// A frame could not be sent or received.
    #[error("the connection to the Domain was lost")]
    Lost(#[source] LinkError),
    /// The terminal (or standard input or output) failed.
    #[error(transparent)]
    Terminal(#[from] std::io::Error),
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

/// The signals a session acts on: a window change becomes a resize,
/// SIGINT and SIGQUIT are passed to the process inside, SIGTERM and SIGHUP
/// end the session. Once registered, they no longer end this CLI by
/// themselves.
#[derive(Debug)]
pub(super) struct Signals(Vec<(Signal, Raised)>);

impl Signals {
    /// Registers the handlers (on the event loop).
    pub(super) fn register() -> std::io::Result<Self> {
        let kinds = [
            (SignalKind::window_change(), Raised::Resize),
            (
                SignalKind::interrupt(),
                Raised::Forward(TerminalSignalKind::Interrupt),
            ),
            (
                SignalKind::quit(),
                Raised::Forward(TerminalSignalKind::Quit),
            ),
            (SignalKind::terminate(), Raised::End(EndedHere::Terminated)),
            (SignalKind::hangup(), Raised::End(EndedHere::HungUp)),
        ];
        let mut signals = Vec::with_capacity(kinds.len());
        for (kind, raised) in kinds {
            signals.push((signal(kind)?, raised));
        }
        Ok(Self(signals))
    }

    /// The next signal raised.
    async fn next(&mut self) -> Raised {
        std::future::poll_fn(|cx: &mut Context<'_>| {
            for (signal, raised) in &mut self.0 {
                if let Poll::Ready(Some(())) = signal.poll_recv(cx) {
                    return Poll::Ready(*raised);
                }
            }
            Poll::Pending
        })
        .await
    }
}

/// Why this side ended a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum EndedHere {
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
    pub(super) fn signal(self) -> i32 {
        match self {
            Self::Terminated => rustix::process::Signal::TERM.as_raw(),
            Self::HungUp | Self::TerminalLost => rustix::process::Signal::HUP.as_raw(),
            Self::OutputClosed => rustix::process::Signal::PIPE.as_raw(),
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
pub(super) enum Ended {
    /// The Host Coordinator reported the session's end: its outcome and
    /// exit code.
    Session(SessionExitOutcome, u8),
    /// This side ended it, and its process did not end within the grace.
    Here(EndedHere),
}

/// Moves bytes and signals until the coordinator reports the session's end,
/// or this side ends it (SIGTERM, SIGHUP, a lost terminal) and the grace is
/// over. What is still queued for the coordinator is left on `link`.
pub(super) async fn relay(
    link: &mut ClientLink,
    session_id: SessionId,
    mut signals: Signals,
    forward_stdin: bool,
    screen: Option<&mut Screen>,
) -> Result<Ended, RelayError> {
    let terminal = screen.is_some();
    let mut unfollowed = Screen::default();
    let keyboard = forward_stdin.then(Keyboard::stdin);
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
        stdin_open: forward_stdin,
        peer_gone: false,
    };
    let mut buf = vec![0u8; MAX_TERMINAL_CHUNK];
    loop {
        if let Some(ended) = relay
            .turn(&mut signals, keyboard.as_ref(), &mut buf)
            .await?
        {
            return Ok(ended);
        }
    }
}

/// One session's relay: the connection, the terminal (or standard output)
/// and the prompt shown on it.
struct Relay<'a> {
    link: &'a mut ClientLink,
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
    stdin_open: bool,
    /// The connection hung up while it was not being read.
    peer_gone: bool,
}

impl Relay<'_> {
    /// Handles the frames already read, then waits for one event (bytes
    /// on the connection or standard input, a signal, a deadline) and
    /// handles it: the session's end, once there is one.
    async fn turn(
        &mut self,
        signals: &mut Signals,
        keyboard: Option<&Keyboard>,
        buf: &mut [u8],
    ) -> Result<Option<Ended>, RelayError> {
        // Frames already read (some may have come with the previous ones)
        // are handled before waiting for more.
        while let Some(message) = self
            .link
            .next_frame::<SessionTerminalMessage>()
            .map_err(RelayError::Lost)?
        {
            if let Some(ended) = self.message(message)? {
                return Ok(Some(ended));
            }
        }
        if let Some((why, until)) = self.ending {
            if Instant::now() >= until {
                let _ = self.prompter.abandon(&mut self.stdout, self.screen);
                return Ok(Some(Ended::Here(why)));
            }
        }
        // While a prompt holds output back and the held output is full,
        // the connection is not read (its sender waits) until the answer,
        // unless it hung up: the read tells that it ended.
        let read_link = !self.prompter.full() || self.peer_gone;
        // Input is read only once what was sent before is on the socket: a
        // process that does not read its input holds this CLI back
        // (backpressure) instead of a write that blocks or times out, and
        // output and signals still flow meanwhile.
        let read_stdin = self.stdin_open && !self.link.sending();
        let deadline = self.deadline();
        tokio::select! {
            exchanged = self.link.exchange(read_link) => {
                exchanged.map_err(RelayError::Lost)?;
            }
            raised = signals.next() => self.raised(raised)?,
            ready = readable(keyboard), if read_stdin => {
                ready?;
                if let Some(keyboard) = keyboard {
                    self.read_input(keyboard, buf)?;
                }
            }
            () = sleep(deadline), if deadline.is_some() => {}
            () = tokio::time::sleep(HANGUP_CHECK), if !read_link => {
                self.peer_gone = hung_up(self.link.socket().as_fd());
            }
        }
        self.expire_prompt()?;
        Ok(None)
    }

    /// Reads what standard input holds: keys, or its end.
    fn read_input(&mut self, keyboard: &Keyboard, buf: &mut [u8]) -> Result<(), RelayError> {
        match keyboard.read(buf) {
            Ok(n) if n > 0 => self.typed(&buf[..n])?,
            Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => {}
            // A terminal in raw mode never ends its input (Ctrl-D is a
            // key): an end or a failure is the terminal going away.
            _ if self.terminal => {
                self.stdin_open = false;
                self.end_here(EndedHere::TerminalLost)?;
            }
            Ok(_) => {
                self.stdin_open = false;
                self.send(&SessionTerminalEvent::Close(SessionClose {
                    session_id: self.session_id,
                }))?;
            }
            Err(_) => self.stdin_open = false,
        }
        Ok(())
    }

    /// Queues one event for the Host Coordinator; the relay writes it.
    fn send(&mut self, event: &SessionTerminalEvent) -> Result<(), RelayError> {
        self.link.queue(event).map_err(RelayError::Lost)
    }

    /// Acts on one message from the Host Coordinator: the session's end,
    /// when it is one.
    fn message(&mut self, message: SessionTerminalMessage) -> Result<Option<Ended>, RelayError> {
        match message {
            SessionTerminalMessage::Output(output) => self.output(&output.bytes)?,
            SessionTerminalMessage::Exit(exit) => {
                let _ = self.prompter.abandon(&mut self.stdout, self.screen);
                return Ok(Some(Ended::Session(exit.outcome, exit.exit_code)));
            }
            SessionTerminalMessage::EscalationPrompt(request) => self.prompt(&request)?,
            SessionTerminalMessage::EscalationSettled(settled) => {
                self.prompter
                    .settled(&mut self.stdout, &settled, self.screen)?;
            }
        }
        self.after_prompt()?;
        Ok(None)
    }

    /// Writes the process's output, or holds it while a prompt waits; a
    /// closed standard output ends the session.
    fn output(&mut self, bytes: &[u8]) -> Result<(), RelayError> {
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
    fn prompt(&mut self, request: &EscalationPrompt) -> Result<(), RelayError> {
        if self.can_prompt && self.ending.is_none() {
            let keyboard = std::io::stdin();
            self.prompter.show(
                &mut self.stdout,
                keyboard.as_fd(),
                request,
                self.screen,
                window_size(),
            )?;
            return Ok(());
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
    fn typed(&mut self, bytes: &[u8]) -> Result<(), RelayError> {
        if !self.prompter.waiting() {
            return self.send(&SessionTerminalEvent::Input(TerminalInput {
                session_id: self.session_id,
                bytes: bytes.to_vec(),
            }));
        }
        let answer = self
            .prompter
            .key(&mut self.stdout, self.session_id, bytes, self.screen)?;
        if let Some(answer) = answer {
            self.send(&SessionTerminalEvent::EscalationAnswer(answer))?;
        }
        self.after_prompt()
    }

    /// Acts on a signal this CLI got.
    fn raised(&mut self, raised: Raised) -> Result<(), RelayError> {
        match raised {
            Raised::Resize => {
                self.prompter.resized(&mut self.stdout, window_size())?;
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
    fn end_here(&mut self, why: EndedHere) -> Result<(), RelayError> {
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
    fn expire_prompt(&mut self) -> Result<(), RelayError> {
        self.prompter.expire(&mut self.stdout, self.screen)?;
        self.after_prompt()
    }

    /// The window's size, sent to the Host Coordinator.
    fn send_resize(&mut self) -> Result<(), RelayError> {
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
    fn after_prompt(&mut self) -> Result<(), RelayError> {
        if self.prompter.take_redraw() {
            self.send_resize()?;
        }
        Ok(())
    }
}

/// Waits until standard input can be read without blocking, or forever
/// when it is not relayed.
async fn readable(keyboard: Option<&Keyboard>) -> std::io::Result<()> {
    match keyboard {
        Some(keyboard) => keyboard.readable().await,
        None => std::future::pending().await,
    }
}

/// Sleeps for `left`, or forever without it.
async fn sleep(left: Option<Duration>) {
    match left {
        Some(left) => tokio::time::sleep(left).await,
        None => std::future::pending().await,
    }
}
