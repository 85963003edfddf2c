//! One TLS link of the Session Coordinator, on tokio: a `tokio-rustls`
//! stream over the session socket ([`FdStream`]), carrying the
//! length-prefixed postcard frames of [`super::tls`] both ways, and the
//! client's connection ([`ClientLink::connect`]) that `lazaret attach`
//! makes with a generation's [`ClientCredential`](super::tls::ClientCredential).
//!
//! Owns the buffering of frames: what was read and not yet taken, what was
//! queued and not yet written, so that one task can wait for the peer's
//! next bytes while its own are still being written ([`Link::exchange`]):
//! backpressure, never a write that blocks the loop. Trusts nothing it
//! decodes: frames go through the versioned codec with their size limits;
//! a peer's refusal is reported as its TLS alert where there is one.

use std::future::poll_fn;
use std::io;
use std::os::fd::OwnedFd;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use lazaret_proto::codec::WireRecord;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};

use super::stream::FdStream;
use super::tls::{FrameError, server_name, take_frame, write_frame};

/// The most bytes one read takes from the connection.
const READ_CHUNK: usize = 64 * 1024;

/// How long, after a write found the peer gone, its last words (a TLS
/// alert) may take to read.
const REFUSAL_WAIT: Duration = Duration::from_secs(1);

/// Why a link failed.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The TLS client could not be set up (before any byte was sent).
    #[error("cannot start TLS")]
    Start(#[source] rustls::Error),
    /// The socket failed.
    #[error("the session connection failed")]
    Io(#[source] io::Error),
    /// TLS refused the peer or a record, or the peer refused us.
    #[error("TLS refused the session connection")]
    Tls(#[source] rustls::Error),
    /// A frame was malformed.
    #[error("a session frame was malformed")]
    Frame(#[from] FrameError),
    /// The peer closed the connection.
    #[error("the other end closed the session connection")]
    Closed,
    /// The peer did not answer in time.
    #[error("the other end did not answer within {} s", .0.as_secs())]
    TimedOut(Duration),
}

impl From<io::Error> for LinkError {
    /// A transport error, as `tokio-rustls` reports them: TLS errors (an
    /// alert received or a certificate refused) inside `io::Error`, and a
    /// peer gone without a `close_notify` as an unexpected end.
    fn from(error: io::Error) -> Self {
        if error.kind() == io::ErrorKind::UnexpectedEof {
            return Self::Closed;
        }
        let tls = error
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            .cloned();
        match tls {
            Some(tls) if error.kind() == io::ErrorKind::Other => Self::Start(tls),
            Some(tls) => Self::Tls(tls),
            None => Self::Io(error),
        }
    }
}

/// What [`Link::exchange`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exchanged {
    /// Bytes arrived; take the frames they complete with
    /// [`Link::next_frame`].
    Read,
    /// Everything queued was written.
    Sent,
}

/// A TLS session link over `S`: frames in, frames out.
pub struct Link<S> {
    stream: S,
    /// Plaintext received and not yet taken as frames.
    incoming: Vec<u8>,
    /// Frames queued and not yet handed to TLS.
    outgoing: Vec<u8>,
    /// Bytes handed to TLS and not yet flushed to the socket.
    unflushed: bool,
    scratch: Box<[u8]>,
}

impl<S> std::fmt::Debug for Link<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("incoming", &self.incoming.len())
            .field("outgoing", &self.outgoing.len())
            .field("unflushed", &self.unflushed)
            .finish_non_exhaustive()
    }
}

/// The client's end: `lazaret attach`.
pub type ClientLink = Link<tokio_rustls::client::TlsStream<FdStream>>;

impl ClientLink {
    /// Completes the TLS handshake on `socket` as a client of `config`,
    /// asking for the Session Coordinator by its name.
    pub async fn connect(
        socket: tokio::net::UnixStream,
        config: Arc<rustls::ClientConfig>,
    ) -> Result<Self, LinkError> {
        let stream = tokio_rustls::TlsConnector::from(config)
            .connect(server_name(), FdStream::new(socket))
            .await?;
        Ok(Self::new(stream))
    }

    /// Sends one frame with `fds` attached to its first bytes on the socket
    /// (`SCM_RIGHTS`).
    pub async fn send_with_fds<T: WireRecord>(
        &mut self,
        record: &T,
        fds: Vec<OwnedFd>,
    ) -> Result<(), LinkError> {
        self.stream.get_mut().0.attach(fds);
        self.send(record).await
    }

    /// The socket.
    pub fn socket(&self) -> &FdStream {
        self.stream.get_ref().0
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Link<S> {
    /// A link over an established TLS stream.
    pub fn new(stream: S) -> Self {
        Self {
            stream,
            incoming: Vec::new(),
            outgoing: Vec::new(),
            unflushed: false,
            scratch: vec![0; READ_CHUNK].into_boxed_slice(),
        }
    }

    /// The TLS stream (for its socket and the descriptors it received).
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.stream
    }

    /// Queues one frame; it is written by [`Link::flush`],
    /// [`Link::exchange`] or [`Link::send`].
    pub fn queue<T: WireRecord>(&mut self, record: &T) -> Result<(), LinkError> {
        write_frame(&mut self.outgoing, record)?;
        Ok(())
    }

    /// Whether something queued is not yet on the socket.
    pub fn sending(&self) -> bool {
        !self.outgoing.is_empty() || self.unflushed
    }

    /// The next complete frame already read, if any.
    pub fn next_frame<T: WireRecord>(&mut self) -> Result<Option<T>, LinkError> {
        Ok(take_frame(&mut self.incoming)?)
    }

    /// Sends one frame, with what was queued before it.
    pub async fn send<T: WireRecord>(&mut self, record: &T) -> Result<(), LinkError> {
        self.queue(record)?;
        self.flush().await
    }

    /// Writes everything queued to the socket.
    pub async fn flush(&mut self) -> Result<(), LinkError> {
        let sent = poll_fn(|cx| self.poll_send(cx)).await;
        self.refusal_instead_of(sent).await
    }

    /// Reads until one frame of `T` is complete.
    pub async fn recv<T: WireRecord>(&mut self) -> Result<T, LinkError> {
        loop {
            if let Some(record) = self.next_frame()? {
                return Ok(record);
            }
            poll_fn(|cx| self.poll_fill(cx)).await?;
        }
    }

    /// Writes what is queued and, when `read`, reads what the peer sends,
    /// whichever comes first: [`Exchanged::Read`] once bytes arrive,
    /// [`Exchanged::Sent`] once everything queued is written. Never
    /// returns with nothing to write and `read` false. Cancel-safe.
    /// `Err(Closed)` at end of stream.
    pub async fn exchange(&mut self, read: bool) -> Result<Exchanged, LinkError> {
        let exchanged = poll_fn(|cx| {
            if self.sending() {
                if let Poll::Ready(sent) = self.poll_send(cx) {
                    return Poll::Ready(sent.map(|()| Exchanged::Sent));
                }
            }
            if read {
                if let Poll::Ready(read) = self.poll_fill(cx) {
                    return Poll::Ready(read.map(|()| Exchanged::Read));
                }
            }
            Poll::Pending
        })
        .await;
        let unread = self.incoming.len();
        match self.refusal_instead_of(exchanged).await {
            // The peer closed while we wrote, after sending what we had not
            // read yet (why the session ended, say): that is read first,
            // and the next exchange meets the closed connection.
            Err(LinkError::Io(_)) if self.incoming.len() > unread => Ok(Exchanged::Read),
            other => other,
        }
    }

    /// Says goodbye: what is queued, then a TLS close_notify.
    pub async fn close(&mut self) {
        if self.flush().await.is_ok() {
            let _ = self.stream.shutdown().await;
        }
    }

    /// Hands what is queued to TLS and flushes it to the socket.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        while !self.outgoing.is_empty() {
            match Pin::new(&mut self.stream).poll_write(cx, &self.outgoing) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(LinkError::Io(io::ErrorKind::WriteZero.into())));
                }
                Poll::Ready(Ok(n)) => {
                    self.outgoing.drain(..n);
                    self.unflushed = true;
                }
                Poll::Ready(Err(error)) => return Poll::Ready(Err(error.into())),
                Poll::Pending => return Poll::Pending,
            }
        }
        if self.unflushed {
            match Pin::new(&mut self.stream).poll_flush(cx) {
                Poll::Ready(Ok(())) => self.unflushed = false,
                Poll::Ready(Err(error)) => return Poll::Ready(Err(error.into())),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Reads what the connection has into the frame buffer.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        let mut buf = ReadBuf::new(&mut self.scratch);
        match Pin::new(&mut self.stream).poll_read(cx, &mut buf) {
            Poll::Ready(Ok(())) if buf.filled().is_empty() => Poll::Ready(Err(LinkError::Closed)),
            Poll::Ready(Ok(())) => {
                self.incoming.extend_from_slice(buf.filled());
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(error)) => Poll::Ready(Err(error.into())),
            Poll::Pending => Poll::Pending,
        }
    }

    /// A peer that refuses us (a TLS 1.3 server refusing our client
    /// certificate after our handshake ended) sends an alert and closes, so
    /// our next write fails: the alert, which says why, rather than the
    /// write's broken pipe. The peer has closed, so what it sent before is
    /// read at once; [`REFUSAL_WAIT`] bounds it all the same.
    async fn refusal_instead_of<T>(
        &mut self,
        result: Result<T, LinkError>,
    ) -> Result<T, LinkError> {
        let error = match result {
            Err(LinkError::Io(error))
                if matches!(
                    error.kind(),
                    io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
                ) =>
            {
                error
            }
            other => return other,
        };
        let alert = tokio::time::timeout(REFUSAL_WAIT, async {
            loop {
                match poll_fn(|cx| self.poll_fill(cx)).await {
                    Ok(()) => continue,
                    Err(refusal @ LinkError::Tls(_)) => return Some(refusal),
                    Err(_) => return None,
                }
            }
        })
        .await;
        Err(alert.ok().flatten().unwrap_or(LinkError::Io(error)))
    }
}
