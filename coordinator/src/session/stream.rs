//! A session connection's socket as tokio sees it, at either end: a Unix
//! stream socket whose reads keep the descriptors the peer attaches
//! (`SCM_RIGHTS`), and whose next write can attach descriptors of its own,
//! under `tokio-rustls`.
//!
//! Owns the reading and writing of ancillary data on the event loop.
//! Trusts nothing it receives: at most three descriptors in all are kept
//! (more close the connection), and the session decides whether it takes
//! them. The Host Coordinator reads descriptors; `lazaret attach` attaches
//! its standard input and output to the frame that asks for its session.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use lazaret_proto::channel::control_space;
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::UnixStream;

/// The most descriptors one connection passes; more are closed and
/// refused.
const MAX_PASSED_FDS: usize = 3;

/// A session socket that keeps the descriptors attached to what it reads,
/// and attaches descriptors to the next bytes it writes when asked to.
#[derive(Debug)]
pub struct FdStream {
    socket: UnixStream,
    fds: Vec<OwnedFd>,
    /// Descriptors to attach to the next write.
    attached: Vec<OwnedFd>,
}

impl FdStream {
    /// Wraps a connected or accepted socket.
    pub fn new(socket: UnixStream) -> Self {
        Self {
            socket,
            fds: Vec::new(),
            attached: Vec::new(),
        }
    }

    /// Takes the descriptors received so far.
    pub fn take_fds(&mut self) -> Vec<OwnedFd> {
        std::mem::take(&mut self.fds)
    }

    /// Attaches `fds` to the first bytes the next write sends
    /// (`sendmsg(2)` with `SCM_RIGHTS`); they are closed here once sent.
    pub fn attach(&mut self, fds: Vec<OwnedFd>) {
        self.attached = fds;
    }

    /// Sends `bufs` with the attached descriptors, once the socket has
    /// room.
    fn poll_send_attached(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.socket.poll_write_ready(cx))?;
            let (socket, attached) = (&self.socket, &self.attached);
            let borrowed: Vec<BorrowedFd<'_>> = attached.iter().map(AsFd::as_fd).collect();
            match socket.try_io(Interest::WRITABLE, || {
                send_with_fds(socket.as_fd(), bufs, &borrowed)
            }) {
                Ok(n) => {
                    self.attached.clear();
                    return Poll::Ready(Ok(n));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsFd for FdStream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
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
        let this = self.get_mut();
        if !this.attached.is_empty() {
            return this.poll_send_attached(cx, &[io::IoSlice::new(buf)]);
        }
        Pin::new(&mut this.socket).poll_write(cx, buf)
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
        let this = self.get_mut();
        if !this.attached.is_empty() {
            return this.poll_send_attached(cx, bufs);
        }
        Pin::new(&mut this.socket).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.socket.is_write_vectored()
    }
}

/// Reads bytes from a Unix stream socket with `recvmsg(2)` into `buf`,
/// adding the descriptors they carry to `fds`. `flags` adds to
/// `MSG_CMSG_CLOEXEC` (`MSG_DONTWAIT` for an event loop). More than
/// [`MAX_PASSED_FDS`] in all is refused, and every descriptor is closed.
pub fn recv_with_fds(
    socket: BorrowedFd<'_>,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
    flags: RecvFlags,
) -> io::Result<usize> {
    let space = rustix::cmsg_space!(ScmRights(MAX_PASSED_FDS));
    let mut storage = Vec::new();
    let mut control = RecvAncillaryBuffer::new(control_space(&mut storage, space));
    let received = rustix::net::recvmsg(
        socket,
        &mut [io::IoSliceMut::new(buf)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC | flags,
    )?;
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = message {
            fds.extend(rights);
        }
    }
    if received.flags.contains(ReturnFlags::CTRUNC) || fds.len() > MAX_PASSED_FDS {
        fds.clear();
        return Err(io::Error::other(
            "the peer passed more descriptors than a session takes",
        ));
    }
    Ok(received.bytes)
}

/// Writes `bufs` to a Unix stream socket with `sendmsg(2)`, without
/// waiting (`MSG_DONTWAIT`) and without `SIGPIPE`, with `fds` attached to
/// the first byte (`SCM_RIGHTS`). At most [`MAX_PASSED_FDS`].
pub fn send_with_fds(
    socket: BorrowedFd<'_>,
    bufs: &[io::IoSlice<'_>],
    fds: &[BorrowedFd<'_>],
) -> io::Result<usize> {
    if fds.len() > MAX_PASSED_FDS {
        return Err(io::Error::other(
            "more descriptors than a session passes were attached",
        ));
    }
    let rights = SendAncillaryMessage::ScmRights(fds);
    let mut storage = Vec::new();
    let len = rights.size();
    let mut control = SendAncillaryBuffer::new(control_space(&mut storage, len));
    if !control.push(rights) {
        return Err(io::Error::other("too many descriptors to pass"));
    }
    Ok(rustix::net::sendmsg(
        socket,
        bufs,
        &mut control,
        SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
    )?)
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::FdStream;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn attached_descriptors_arrive_with_the_bytes() {
        runtime().block_on(async {
            let (a, b) = tokio::net::UnixStream::pair().unwrap();
            let (mut a, mut b) = (FdStream::new(a), FdStream::new(b));
            let (read, write) = rustix::pipe::pipe().unwrap();
            let (read_ino, write_ino) = (
                rustix::fs::fstat(&read).unwrap().st_ino,
                rustix::fs::fstat(&write).unwrap().st_ino,
            );
            a.attach(vec![read, write]);
            a.write_all(b"with").await.unwrap();
            a.write_all(b"out").await.unwrap();
            let mut got = [0u8; 7];
            b.read_exact(&mut got).await.unwrap();
            assert_eq!(&got, b"without");
            let fds = b.take_fds();
            assert_eq!(fds.len(), 2, "the descriptors came once");
            let inodes: Vec<u64> = fds
                .iter()
                .map(|fd| rustix::fs::fstat(fd.as_fd()).unwrap().st_ino)
                .collect();
            assert_eq!(inodes, [read_ino, write_ino]);
            assert!(b.take_fds().is_empty());
        });
    }

    #[test]
    fn more_than_three_descriptors_are_refused() {
        runtime().block_on(async {
            let (a, b) = tokio::net::UnixStream::pair().unwrap();
            let (mut a, mut b) = (FdStream::new(a), FdStream::new(b));
            let pipes: Vec<_> = (0..2).map(|_| rustix::pipe::pipe().unwrap()).collect();
            a.attach(pipes.into_iter().flat_map(|(r, w)| [r, w]).collect());
            assert!(a.write_all(b"x").await.is_err(), "four are never sent");
            // Three, then one more: the reader refuses the fourth.
            let (r1, w1) = rustix::pipe::pipe().unwrap();
            let (r2, w2) = rustix::pipe::pipe().unwrap();
            a.attach(vec![r1, w1, r2]);
            a.write_all(b"y").await.unwrap();
            a.attach(vec![w2]);
            a.write_all(b"z").await.unwrap();
            let mut got = [0u8; 2];
            assert!(b.read_exact(&mut got).await.is_err());
            assert!(b.take_fds().is_empty(), "every descriptor is closed");
        });
    }
}
