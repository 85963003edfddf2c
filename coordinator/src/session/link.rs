//! One TLS link of the Session Coordinator, either end: a rustls connection
//! over a Unix stream socket, carrying length-prefixed postcard frames.
//!
//! Owns the driving of rustls for a poll-based loop: the socket stays
//! blocking, [`TlsLink::on_readable`] is called only when `poll(2)` says the
//! socket has bytes, and every send flushes what rustls has to write.
//! Trusts nothing it decodes: frames go through the versioned codec with
//! their size limits.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use lazaret_proto::channel::control_space;
use lazaret_proto::codec::{MAX_RECORD_LEN, WireRecord};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

use super::tls::{FRAME_PREFIX_LEN, FrameError, read_frame, write_frame};

/// How many socket reads one [`TlsLink::fill`] makes at most.
const READS_PER_FILL: usize = 16;

/// How long a write may wait for the peer to read.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a link failed.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The socket failed.
    #[error("the session connection failed")]
    Io(#[from] io::Error),
    /// TLS refused the peer or a record.
    #[error("TLS refused the session connection")]
    Tls(#[from] rustls::Error),
    /// A frame was malformed.
    #[error("a session frame was malformed")]
    Frame(#[from] FrameError),
    /// The peer closed the connection.
    #[error("the other end closed the session connection")]
    Closed,
}

/// A TLS session link.
#[derive(Debug)]
pub struct TlsLink {
    conn: rustls::Connection,
    stream: UnixStream,
    /// Descriptors the peer attached to the bytes read so far.
    received_fds: Vec<OwnedFd>,
    /// Plaintext received and not yet taken as frames.
    pending: Vec<u8>,
}

impl TlsLink {
    /// Completes the TLS handshake on `stream` within `timeout`; reads and
    /// writes keep that timeout until [`TlsLink::without_timeouts`].
    pub fn handshake(
        conn: impl Into<rustls::Connection>,
        stream: UnixStream,
        timeout: Duration,
    ) -> Result<Self, LinkError> {
        let mut link = Self {
            conn: conn.into(),
            stream,
            pending: Vec::new(),
            received_fds: Vec::new(),
        };
        link.stream.set_read_timeout(Some(timeout))?;
        link.stream.set_write_timeout(Some(timeout))?;
        // Every read goes through `recvmsg(2)`: bytes that carry descriptors
        // may arrive in the same read as the handshake's last flight.
        while link.conn.is_handshaking() {
            if link.conn.wants_write() {
                link.conn.write_tls(&mut link.stream)?;
            } else if link.conn.wants_read() {
                let n = link.read_tls()?;
                if let Err(error) = link.conn.process_new_packets() {
                    // Tell the peer why (the alert rustls queued) before
                    // giving up.
                    let _ = link.flush();
                    return Err(error.into());
                }
                if n == 0 {
                    return Err(LinkError::Closed);
                }
            }
        }
        // Records that came in one read with the peer's last handshake
        // flight are already decrypted inside rustls, and the socket will
        // not signal them again: take them now.
        link.take_plaintext()?;
        Ok(link)
    }

    /// Reads TLS bytes from the socket with `recvmsg(2)`, keeping any
    /// descriptors attached to them.
    fn read_tls(&mut self) -> io::Result<usize> {
        let mut reader = FdReader {
            stream: &self.stream,
            fds: &mut self.received_fds,
        };
        self.conn.read_tls(&mut reader)
    }

    /// Takes the descriptors the peer has attached so far.
    pub fn take_received_fds(&mut self) -> Vec<OwnedFd> {
        std::mem::take(&mut self.received_fds)
    }

    /// Sends one frame with descriptors attached to its first bytes on the
    /// socket (`SCM_RIGHTS`).
    pub fn send_with_fds<T: WireRecord>(
        &mut self,
        record: &T,
        fds: &[BorrowedFd<'_>],
    ) -> Result<(), LinkError> {
        write_frame(&mut self.conn.writer(), record)?;
        let mut writer = FdWriter {
            stream: &self.stream,
            fds: Some(fds),
        };
        while self.conn.wants_write() {
            if let Err(error) = self.conn.write_tls(&mut writer) {
                return Err(self.alert_instead_of(error));
            }
        }
        Ok(())
    }

    /// Lifts the handshake's read timeout: from now on the link is read
    /// only when `poll(2)` says it is readable. Writes keep a timeout, so a
    /// peer that stops reading (a stopped CLI) ends its session instead of
    /// holding it, and `down`, forever.
    pub fn without_timeouts(&self) -> Result<(), LinkError> {
        self.stream.set_read_timeout(None)?;
        self.stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
        Ok(())
    }

    /// The socket, for `poll(2)`.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.stream.as_fd()
    }

    /// Sends one frame and flushes it to the socket.
    pub fn send<T: WireRecord>(&mut self, record: &T) -> Result<(), LinkError> {
        write_frame(&mut self.conn.writer(), record)?;
        self.flush()
    }

    fn flush(&mut self) -> Result<(), LinkError> {
        while self.conn.wants_write() {
            if let Err(error) = self.conn.write_tls(&mut self.stream) {
                return Err(self.alert_instead_of(error));
            }
        }
        Ok(())
    }

    /// A peer that refuses us (a TLS 1.3 server refusing our client
    /// certificate after our handshake ended) sends an alert and closes, so
    /// our next write fails: the alert, which says why, rather than the
    /// write's broken pipe. Reads only when the peer has closed, so the read
    /// cannot block.
    fn alert_instead_of(&mut self, error: io::Error) -> LinkError {
        let closed = matches!(
            error.kind(),
            io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
        );
        if !closed || self.read_tls().is_err() {
            return LinkError::Io(error);
        }
        match self.conn.process_new_packets() {
            Err(alert) => LinkError::Tls(alert),
            Ok(_) => LinkError::Io(error),
        }
    }

    /// Reads what the socket holds into the frame buffer; call it when
    /// `poll(2)` says the socket is readable. `Err(Closed)` at end of
    /// stream.
    pub fn fill(&mut self) -> Result<(), LinkError> {
        let mut taken_total = 0;
        // Read what the socket holds now, a few TLS records at a time, so a
        // fast stream is not paced by one poll(2) per record.
        for _ in 0..READS_PER_FILL {
            let n = self.read_tls()?;
            let (state, taken) = self.take_plaintext()?;
            taken_total += taken;
            if taken_total == 0 && (n == 0 || state.peer_has_closed()) {
                return Err(LinkError::Closed);
            }
            if n == 0
                || state.peer_has_closed()
                || !crate::process::readable(self.stream.as_fd(), Duration::ZERO)
            {
                break;
            }
        }
        // Answer whatever TLS needs (key updates, alerts).
        self.flush()
    }

    /// Processes the TLS records read so far and moves their plaintext into
    /// the frame buffer: the connection's state, and how many bytes moved.
    fn take_plaintext(&mut self) -> Result<(rustls::IoState, usize), LinkError> {
        let state = self.conn.process_new_packets()?;
        let mut buf = vec![0u8; state.plaintext_bytes_to_read()];
        if !buf.is_empty() {
            self.conn.reader().read_exact(&mut buf)?;
            self.pending.extend_from_slice(&buf);
        }
        Ok((state, buf.len()))
    }

    /// The next complete frame already read, if any.
    pub fn next_frame<T: WireRecord>(&mut self) -> Result<Option<T>, LinkError> {
        let Some(prefix) = self.pending.first_chunk::<FRAME_PREFIX_LEN>() else {
            return Ok(None);
        };
        let len = u32::from_be_bytes(*prefix) as usize;
        let max = T::MAX_ENCODED_LEN.min(MAX_RECORD_LEN);
        if len > max {
            // An oversize frame is refused as soon as its length is known.
            return Err(FrameError::Oversize {
                record: T::NAME,
                len,
                max,
            }
            .into());
        }
        let end = FRAME_PREFIX_LEN + len;
        if self.pending.len() < end {
            return Ok(None);
        }
        let record = read_frame::<_, T>(&mut &self.pending[..end])?;
        self.pending.drain(..end);
        Ok(record)
    }

    /// Whether a whole frame is already buffered, so `poll(2)` must not wait.
    pub fn has_frame(&self) -> bool {
        self.pending
            .first_chunk::<FRAME_PREFIX_LEN>()
            .is_some_and(|prefix| {
                self.pending.len() - FRAME_PREFIX_LEN >= u32::from_be_bytes(*prefix) as usize
            })
    }

    /// Reads until one frame arrives (blocking).
    pub fn recv<T: WireRecord>(&mut self) -> Result<T, LinkError> {
        loop {
            if let Some(record) = self.next_frame::<T>()? {
                return Ok(record);
            }
            self.fill()?;
        }
    }

    /// Says goodbye: a TLS close_notify, flushed.
    pub fn close(&mut self) {
        self.conn.send_close_notify();
        let _ = self.flush();
    }
}

/// The most descriptors one read accepts; more are closed and refused.
const MAX_PASSED_FDS: usize = 3;

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

/// Reads bytes with `recvmsg(2)` and keeps the descriptors they carry.
struct FdReader<'a> {
    stream: &'a UnixStream,
    fds: &'a mut Vec<OwnedFd>,
}

impl Read for FdReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        recv_with_fds(self.stream.as_fd(), buf, self.fds, RecvFlags::empty())
    }
}

/// Writes bytes, attaching descriptors to the first `sendmsg(2)`.
struct FdWriter<'a, 'b> {
    stream: &'a UnixStream,
    fds: Option<&'a [BorrowedFd<'b>]>,
}

impl Write for FdWriter<'_, '_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let Some(fds) = self.fds.take().filter(|f| !f.is_empty()) else {
            return (&*self.stream).write(buf);
        };
        let rights = SendAncillaryMessage::ScmRights(fds);
        let mut storage = Vec::new();
        let len = rights.size();
        let mut control = SendAncillaryBuffer::new(control_space(&mut storage, len));
        if !control.push(rights) {
            return Err(io::Error::other("too many descriptors to pass"));
        }
        Ok(rustix::net::sendmsg(
            self.stream,
            &[io::IoSlice::new(buf)],
            &mut control,
            SendFlags::NOSIGNAL,
        )?)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
