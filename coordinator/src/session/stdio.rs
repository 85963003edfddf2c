//! The host side of a served session's standard streams: a PTY master, or
//! pipes, or nothing when the client's own streams are handed to the
//! process.
//!
//! Owns the streams' host ends and the rule for what a client may hand
//! on: only pipes or `/dev/null` ([`super::donatable`]). Trusts nothing the
//! client passes until it checks it.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use lazaret_proto::session::OpenSession;
use lazaret_proto::terminal::PtyIdentity;

use crate::aio::Stream;

/// The output pipe's capacity for sessions without a terminal.
const OUTPUT_PIPE_SIZE: usize = 1 << 20;

/// The host side of a session's standard streams.
#[derive(Debug)]
pub(super) struct SessionIo {
    /// Where input goes: the PTY master, or our end of the input pipe.
    pub(super) input: Option<Arc<Stream>>,
    /// Where output comes from: the PTY master, or our end of the output
    /// pipe. `None` when the process writes to the CLI directly.
    pub(super) output: Option<Arc<Stream>>,
    /// Whether the streams are a PTY.
    terminal: bool,
    /// The process's ends, until they are passed to the supervisor.
    process_ends: ProcessEnds,
}

/// The process's ends of a session's streams.
#[derive(Debug, Default)]
pub(super) enum ProcessEnds {
    /// The PTY slave, its input and output.
    Terminal(OwnedFd),
    /// Its input and output pipes (or the CLI's own, for a direct session).
    Pipes { input: OwnedFd, output: OwnedFd },
    /// Handed to the supervisor.
    #[default]
    Passed,
}

impl SessionIo {
    pub(super) fn open(open: &OpenSession, passed: Vec<OwnedFd>) -> std::io::Result<Self> {
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
    pub(super) fn take_process_ends(&mut self) -> ProcessEnds {
        std::mem::take(&mut self.process_ends)
    }

    /// Whether the output is a pipe, which may be read several times per
    /// wakeup (a PTY master gives one chunk).
    pub(super) fn is_pipe(&self) -> bool {
        !self.terminal
    }

    /// The PTY master, for resizing.
    pub(super) fn terminal(&self) -> Option<BorrowedFd<'_>> {
        self.output
            .as_ref()
            .filter(|_| self.terminal)
            .map(|master| master.fd())
    }

    /// Closes the process's input (a pipe: it reads end of file). A PTY
    /// stays open: its end of input is a byte the client sends.
    pub(super) fn close_input(&mut self) {
        if !self.terminal {
            self.input = None;
        }
    }

    /// The identity of the PTY master, for the session's record.
    pub(super) fn pty_identity(&self) -> Option<PtyIdentity> {
        let master = self.terminal()?;
        let stat = rustix::fs::fstat(master).ok()?;
        Some(PtyIdentity {
            master_fd: u32::try_from(std::os::fd::AsRawFd::as_raw_fd(&master)).ok()?,
            device: stat.st_rdev,
            inode: stat.st_ino,
        })
    }
}

/// Sets the window size of the PTY `master`.
pub(super) fn resize(master: BorrowedFd<'_>, rows: u16, columns: u16) {
    let size = rustix::termios::Winsize {
        ws_row: rows,
        ws_col: columns,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let _ = rustix::termios::tcsetwinsize(master, size);
}

#[cfg(test)]
mod tests {
    use std::os::fd::OwnedFd;

    use lazaret_proto::session::OpenSession;

    use super::{ProcessEnds, SessionIo};

    fn open(terminal: bool, direct_stdio: bool) -> OpenSession {
        OpenSession {
            command: None,
            terminal,
            prompts: false,
            rows: 30,
            columns: 100,
            term: None,
            direct_stdio,
        }
    }

    fn pipe() -> (OwnedFd, OwnedFd) {
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).unwrap()
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_session_without_a_terminal_gets_pipes_whose_input_closes_on_request() {
        let mut io = SessionIo::open(&open(false, false), Vec::new()).unwrap();
        assert!(io.is_pipe());
        assert!(io.terminal().is_none());
        assert!(io.pty_identity().is_none());
        assert!(io.input.is_some() && io.output.is_some());
        let ProcessEnds::Pipes { input, output } = io.take_process_ends() else {
            panic!("the process's pipes");
        };
        assert!(matches!(io.take_process_ends(), ProcessEnds::Passed));
        io.close_input();
        assert!(io.input.is_none());
        // The process reads end of file once our end is closed.
        let mut buf = [0u8; 1];
        assert_eq!(rustix::io::read(&input, &mut buf).unwrap(), 0);
        drop(output);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_terminal_session_gets_a_pty_of_the_size_asked_for() {
        let mut io = SessionIo::open(&open(true, false), Vec::new()).unwrap();
        assert!(!io.is_pipe());
        assert!(io.pty_identity().is_some());
        let ProcessEnds::Terminal(slave) = io.take_process_ends() else {
            panic!("the PTY slave");
        };
        let size = rustix::termios::tcgetwinsize(&slave).unwrap();
        assert_eq!((size.ws_row, size.ws_col), (30, 100));
        super::resize(io.terminal().unwrap(), 40, 120);
        let size = rustix::termios::tcgetwinsize(&slave).unwrap();
        assert_eq!((size.ws_row, size.ws_col), (40, 120));
        // A PTY's input is not closed: its end of input is a byte.
        io.close_input();
        assert!(io.input.is_some());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_client_may_hand_on_only_pipes_and_only_for_a_direct_session() {
        let (read, write) = pipe();
        let direct = SessionIo::open(&open(false, true), vec![read, write]).unwrap();
        assert!(direct.input.is_none() && direct.output.is_none());

        let (read, _write) = pipe();
        let one = SessionIo::open(&open(false, true), vec![read]).unwrap_err();
        assert!(one.to_string().contains("must pass"), "{one}");

        let (socket, _other) = std::os::unix::net::UnixStream::pair().unwrap();
        let (_read, write) = pipe();
        let refused =
            SessionIo::open(&open(false, true), vec![OwnedFd::from(socket), write]).unwrap_err();
        assert!(refused.to_string().contains("only pipes"), "{refused}");

        let (read, write) = pipe();
        let relayed = SessionIo::open(&open(true, false), vec![read, write]).unwrap_err();
        assert!(relayed.to_string().contains("takes none"), "{relayed}");
    }
}
