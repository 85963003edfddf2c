//! The server end of a session connection as tokio sees it: a Unix stream
//! socket whose reads keep the descriptors the client attaches
//! (`SCM_RIGHTS`), under `tokio-rustls`.
//!
//! Owns the reading of ancillary data on the event loop. Trusts nothing it
//! receives: at most three descriptors in all are kept (more close the
//! connection), and the session decides whether it takes them.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::UnixStream;

use super::link::recv_with_fds;

/// A session socket that keeps the descriptors attached to what it reads.
#[derive(Debug)]
pub struct FdStream {
    socket: UnixStream,
    fds: Vec<OwnedFd>,
}

impl FdStream {
    /// Wraps an accepted socket.
    pub fn new(socket: UnixStream) -> Self {
        Self {
            socket,
            fds: Vec::new(),
        }
    }

    /// Takes the descriptors received so far.
    pub fn take_fds(&mut self) -> Vec<OwnedFd> {
        std::mem::take(&mut self.fds)
    }
}

impl AsyncRead for FdStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            ready!(this.socket.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            let (socket, fds) = (&this.socket, &mut this.fds);
            match socket.try_io(Interest::READABLE, || {
                recv_with_fds(
                    socket.as_fd(),
                    unfilled,
                    fds,
                    rustix::net::RecvFlags::DONTWAIT,
                )
            }) {
                Ok(n) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncWrite for FdStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().socket).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().socket).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().socket).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().socket).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.socket.is_write_vectored()
    }
}
