//! The local end of a Client Session: the terminal's modes and the standard
//! streams' file status flags, put back whatever ends the session, the
//! window's size, and standard input as the event loop waits for it.
//!
//! Owns nothing but this process's own standard streams; trusts them to be
//! what the kernel says they are (a terminal, a pipe, a file).

use std::os::fd::{BorrowedFd, OwnedFd};

use lazaret_coordinator::aio::Input;
use rustix::event::{PollFd, PollFlags, poll};
use rustix::termios::{OptionalActions, Termios};

/// Puts the terminal back as it was, whatever ends the session.
pub(super) struct RawMode {
    fd: OwnedFd,
    saved: Termios,
}

impl RawMode {
    /// Makes the terminal on `fd` raw; what was typed before is discarded.
    pub(super) fn enter(fd: BorrowedFd<'_>) -> std::io::Result<Self> {
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
pub(super) struct StatusFlags(Vec<(BorrowedFd<'static>, rustix::fs::OFlags)>);

impl StatusFlags {
    /// Notes the flags of standard input, output and error.
    pub(super) fn save() -> Self {
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

/// The window's size, rows and columns: of standard output's terminal,
/// else standard input's, else 24 by 80.
pub(super) fn window_size() -> (u16, u16) {
    rustix::termios::tcgetwinsize(std::io::stdout())
        .or_else(|_| rustix::termios::tcgetwinsize(std::io::stdin()))
        .map(|w| (w.ws_row, w.ws_col))
        .unwrap_or((24, 80))
}

/// Standard input as the relay reads it: the event loop waits until a
/// read will not block, then one plain `read(2)` takes what is there, as
/// `poll(2)` and `read(2)` would. Its file status flags are left alone (the
/// terminal is the shell's too).
#[derive(Debug)]
pub(super) enum Keyboard {
    /// A terminal, pipe or socket, watched by the event loop.
    Watched(Input),
    /// What the event loop cannot watch (a regular file, `/dev/null`): a
    /// read never waits.
    Always,
}

impl Keyboard {
    /// Standard input, watched where it can be.
    pub(super) fn stdin() -> Self {
        match Input::watch(rustix::stdio::stdin()) {
            Ok(watched) => Self::Watched(watched),
            // `epoll(7)` refuses files that are always ready (EPERM); a
            // closed standard input fails its read.
            Err(_) => Self::Always,
        }
    }

    /// Waits until a read of standard input will not block: there are
    /// bytes, its end, or an error to read.
    pub(super) async fn readable(&self) -> std::io::Result<()> {
        match self {
            Self::Watched(watched) => watched.readable().await,
            Self::Always => Ok(()),
        }
    }

    /// Reads what standard input holds.
    pub(super) fn read(&self, buf: &mut [u8]) -> rustix::io::Result<usize> {
        rustix::io::read(rustix::stdio::stdin(), buf)
    }
}

/// Whether the peer of the connected socket `fd` has hung up or failed.
pub(super) fn hung_up(fd: BorrowedFd<'_>) -> bool {
    let mut fds = [PollFd::new(&fd, PollFlags::RDHUP)];
    if !matches!(poll(&mut fds, Some(&rustix::event::Timespec::default())), Ok(n) if n > 0) {
        return false;
    }
    fds[0]
        .revents()
        .intersects(PollFlags::HUP | PollFlags::ERR | PollFlags::RDHUP)
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::hung_up;

    #[test]
    fn a_peer_that_closed_has_hung_up() {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        assert!(!hung_up(ours.as_fd()));
        std::io::Write::write_all(&mut &theirs, b"unread").unwrap();
        assert!(!hung_up(ours.as_fd()), "bytes waiting are no hangup");
        drop(theirs);
        assert!(hung_up(ours.as_fd()));
    }
}
