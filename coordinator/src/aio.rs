//! The Host Coordinator's descriptors on its tokio event loop: a channel
//! endpoint, a process's exit through its pidfd, and a non-blocking PTY
//! master or pipe; and for `lazaret attach`, a descriptor it does not own
//! (its standard input) watched for input.
//!
//! Owns the registration of those descriptors with the runtime's reactor
//! and the readiness rules each needs: a channel is read and written with
//! `MSG_DONTWAIT` so the socket's blocking mode does not matter, a pidfd is
//! readable once its process has exited and stays so, a PTY master or pipe
//! is switched to `O_NONBLOCK` here and reads `EIO` as the end of its
//! stream, a watched input keeps its blocking mode and is confirmed with
//! `poll(2)` before it is called readable. Trusts nothing it reads; callers
//! decode and judge it.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use lazaret_proto::channel::{ChannelError, Endpoint, Received};
use lazaret_proto::codec::WireRecord;
use tokio::io::unix::AsyncFd;

use crate::sys::{SharedEndpoint, register_endpoint, register_owned};

fn registration_error(error: io::Error) -> ChannelError {
    ChannelError::Receive {
        source: rustix::io::Errno::from_io_error(&error).unwrap_or(rustix::io::Errno::IO),
    }
}

/// A channel endpoint driven by the event loop. The endpoint stays shared
/// with synchronous code (the supervisor's stop, after the loop ends).
#[derive(Debug)]
pub struct AsyncChannel<S, R> {
    fd: AsyncFd<SharedEndpoint<S, R>>,
}

impl<S: WireRecord, R: WireRecord> AsyncChannel<S, R> {
    /// Registers `endpoint` with the current runtime.
    pub fn new(endpoint: Arc<Endpoint<S, R>>) -> io::Result<Self> {
        register_endpoint(endpoint).map(|fd| Self { fd })
    }

    /// Deregisters the endpoint and returns it, for synchronous use once
    /// the event loop has ended.
    pub fn into_endpoint(self) -> Arc<Endpoint<S, R>> {
        self.fd.into_inner().0
    }

    /// The endpoint.
    pub fn endpoint(&self) -> &Endpoint<S, R> {
        &self.fd.get_ref().0
    }

    /// Receives the next packet, waiting without blocking the loop.
    /// Cancel-safe: a packet is taken only by the call that returns it.
    pub async fn recv(&self) -> Result<Received<R>, ChannelError> {
        loop {
            let mut guard = self.fd.readable().await.map_err(registration_error)?;
            match self.endpoint().try_recv() {
                Ok(Some(received)) => return Ok(received),
                Ok(None) => guard.clear_ready(),
                Err(e) => return Err(e),
            }
        }
    }

    /// Sends one packet, waiting for room without blocking the loop.
    pub async fn send(&self, message: &S, fds: &[BorrowedFd<'_>]) -> Result<(), ChannelError> {
        loop {
            let mut guard = self.fd.writable().await.map_err(registration_error)?;
            match self.endpoint().try_send(message, fds) {
                Err(ChannelError::NotReady) => guard.clear_ready(),
                other => return other,
            }
        }
    }
}

/// A process watched through its pidfd.
#[derive(Debug)]
pub struct Exit {
    fd: AsyncFd<OwnedFd>,
}

impl Exit {
    /// Watches the process behind `pidfd` (a duplicate is registered).
    pub fn watch(pidfd: BorrowedFd<'_>) -> io::Result<Self> {
        Ok(Self {
            fd: register_owned(pidfd.try_clone_to_owned()?)?,
        })
    }

    /// Completes once the process has exited; at once if it already has.
    pub async fn exited(&self) {
        // A pidfd stays readable once its process has exited, so readiness
        // is never cleared. An error means the reactor is gone: the loop is
        // ending anyway.
        let _ = self.fd.readable().await;
    }
}

/// Completes when `exit` does, or never when there is none.
pub async fn exited(exit: Option<&Exit>) {
    match exit {
        Some(exit) => exit.exited().await,
        None => std::future::pending().await,
    }
}

/// A PTY master or a pipe end in non-blocking mode, driven by the event
/// loop.
#[derive(Debug)]
pub struct Stream {
    fd: AsyncFd<OwnedFd>,
}

impl Stream {
    /// Switches `fd` to non-blocking mode and registers it.
    pub fn new(fd: OwnedFd) -> io::Result<Self> {
        let flags = rustix::fs::fcntl_getfl(&fd)?;
        rustix::fs::fcntl_setfl(&fd, flags | rustix::fs::OFlags::NONBLOCK)?;
        Ok(Self {
            fd: register_owned(fd)?,
        })
    }

    /// The descriptor.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.get_ref().as_fd()
    }

    /// Reads what is there into `buf`, waiting for something; `None` at
    /// the end of the stream (a PTY master reads `EIO` once the last slave
    /// closed). Cancel-safe.
    pub async fn read(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        loop {
            let mut guard = self.fd.readable().await?;
            match guard.try_io(|fd| rustix::io::read(fd, &mut *buf).map_err(io::Error::from)) {
                Ok(Ok(0)) => return Ok(None),
                Ok(Ok(n)) => return Ok(Some(n)),
                Ok(Err(e)) if e.raw_os_error() == Some(rustix::io::Errno::IO.raw_os_error()) => {
                    return Ok(None);
                }
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => {}
            }
        }
    }

    /// Reads what is there now without waiting: `Ok(Some(0))` when nothing
    /// is, `None` at the end of the stream.
    pub fn try_read(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        match rustix::io::read(self.fd(), buf) {
            Ok(0) | Err(rustix::io::Errno::IO) => Ok(None),
            Ok(n) => Ok(Some(n)),
            Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => Ok(Some(0)),
            Err(e) => Err(e.into()),
        }
    }

    /// Writes a prefix of `bytes`, waiting for room: how much was written.
    /// Cancel-safe.
    pub async fn write(&self, bytes: &[u8]) -> io::Result<usize> {
        loop {
            let mut guard = self.fd.writable().await?;
            match guard.try_io(|fd| rustix::io::write(fd, bytes).map_err(io::Error::from)) {
                Ok(Ok(n)) => return Ok(n),
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => {}
            }
        }
    }
}

/// A descriptor watched for input and left as it is: its file status flags
/// (shared with whoever else holds its open file, a shell's terminal) are
/// not touched, so the caller reads it with a plain `read(2)` once
/// [`Input::readable`] says that will not block.
#[derive(Debug)]
pub struct Input {
    fd: AsyncFd<OwnedFd>,
}

impl Input {
    /// Watches `fd` (a duplicate is registered). Fails for what `epoll(7)`
    /// cannot watch: a regular file or `/dev/null` (`EPERM`), which a read
    /// never waits for anyway.
    pub fn watch(fd: BorrowedFd<'_>) -> io::Result<Self> {
        Ok(Self {
            fd: register_owned(fd.try_clone_to_owned()?)?,
        })
    }

    /// Completes once a read returns at once: bytes, the end of the input
    /// or an error are there. Cancel-safe.
    pub async fn readable(&self) -> io::Result<()> {
        loop {
            let mut guard = self.fd.readable().await?;
            if has_input(self.fd.get_ref().as_fd()) {
                // Still ready: what one read leaves is read next time.
                guard.retain_ready();
                return Ok(());
            }
            guard.clear_ready();
        }
    }
}

/// Whether a read of `fd` returns at once (`poll(2)` without waiting).
fn has_input(fd: BorrowedFd<'_>) -> bool {
    let mut fds = [rustix::event::PollFd::new(
        &fd,
        rustix::event::PollFlags::IN,
    )];
    let now = rustix::event::Timespec::default();
    matches!(rustix::event::poll(&mut fds, Some(&now)), Ok(n) if n > 0)
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;
    use std::time::Duration;

    use super::Input;

    #[test]
    fn input_is_readable_once_written_or_ended_and_keeps_its_mode() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let (read, write) = rustix::pipe::pipe().unwrap();
            let input = Input::watch(read.as_fd()).unwrap();
            let waited = tokio::time::timeout(Duration::from_millis(50), input.readable()).await;
            assert!(waited.is_err(), "nothing written, nothing to read");
            rustix::io::write(&write, b"ab").unwrap();
            input.readable().await.unwrap();
            let mut byte = [0u8; 1];
            rustix::io::read(&read, &mut byte).unwrap();
            input.readable().await.unwrap();
            rustix::io::read(&read, &mut byte).unwrap();
            let waited = tokio::time::timeout(Duration::from_millis(50), input.readable()).await;
            assert!(waited.is_err(), "everything was read");
            drop(write);
            input.readable().await.unwrap();
            assert_eq!(rustix::io::read(&read, &mut byte), Ok(0));
            let flags = rustix::fs::fcntl_getfl(&read).unwrap();
            assert!(!flags.contains(rustix::fs::OFlags::NONBLOCK));
        });
        let file = tempfile::tempfile().unwrap();
        let _runtime = runtime.enter();
        assert!(Input::watch(file.as_fd()).is_err(), "epoll refuses files");
    }
}
