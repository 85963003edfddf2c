//! One TLS link of the Session Coordinator, on tokio: a `tokio-rustls`
//! stream over the session socket ([`FdStream`]), carrying the
//! length-prefixed postcard frames of [`super::tls`] both ways. Both ends
//! use it: the client's connection ([`ClientLink::connect`]) that
//! `lazaret attach` makes with a generation's
//! [`ClientCredential`](super::tls::ClientCredential), and the hub's end of
//! each session it serves ([`ServerLink`]).
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
    /// The peer did not read what was written for the link's write bound.
    #[error("the other end did not read for {} s", .0.as_secs())]
    Stalled(Duration),
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
    /// How long one [`Link::flush`] may wait for the peer to read.
    write_bound: Option<Duration>,
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

/// The coordinator's end of one served session.
pub type ServerLink = Link<tokio_rustls::server::TlsStream<FdStream>>;

impl ServerLink {
    /// The descriptors the client attached so far.
    pub fn take_fds(&mut self) -> Vec<OwnedFd> {
        self.stream.get_mut().0.take_fds()
    }
}

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
            write_bound: None,
            scratch: vec![0; READ_CHUNK].into_boxed_slice(),
        }
    }

    /// The link, each [`Link::flush`] (and [`Link::send`]) failing with
    /// [`LinkError::Stalled`] once the peer has not read for `bound`: a
    /// peer that stops reading cannot hold its writer.
    pub fn with_write_bound(self, bound: Duration) -> Self {
        Self {
            write_bound: Some(bound),
            ..self
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

    /// Writes everything queued to the socket, within the write bound.
    pub async fn flush(&mut self) -> Result<(), LinkError> {
        let bound = self.write_bound;
        let sending = poll_fn(|cx| self.poll_send(cx));
        let sent = match bound {
            Some(bound) => tokio::time::timeout(bound, sending)
                .await
                .unwrap_or(Err(LinkError::Stalled(bound))),
            None => sending.await,
        };
        self.refusal_instead_of(sent).await
    }

    /// Reads what the connection has into the frame buffer; take the
    /// frames with [`Link::next_frame`]. Cancel-safe. `Err(Closed)` at end
    /// of stream.
    pub async fn fill(&mut self) -> Result<(), LinkError> {
        poll_fn(|cx| self.poll_fill(cx)).await
    }

    /// Reads until one frame of `T` is complete.
    pub async fn recv<T: WireRecord>(&mut self) -> Result<T, LinkError> {
        loop {
            if let Some(record) = self.next_frame()? {
                return Ok(record);
            }
            self.fill().await?;
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

#[cfg(test)]
mod tests {
    //! The link's frames over an in-memory stream: what a peer that sends
    //! in pieces, breaks off or stops reading does to it.

    use std::time::Duration;

    use lazaret_proto::ids::SessionId;
    use lazaret_proto::session::{SessionOpened, SessionRefusal};
    use lazaret_proto::terminal::{SessionTerminalMessage, TerminalOutput};
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    use super::{Link, LinkError};
    use crate::session::tls::write_frame;

    const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

    fn frame(record: &SessionOpened) -> Vec<u8> {
        let mut bytes = Vec::new();
        write_frame(&mut bytes, record).unwrap();
        bytes
    }

    fn refused() -> SessionOpened {
        SessionOpened::Refused(SessionRefusal::GoingDown)
    }

    /// The coordinator's link and the client's end.
    fn link(buffer: usize) -> (Link<DuplexStream>, DuplexStream) {
        let (ours, theirs) = tokio::io::duplex(buffer);
        (Link::new(ours).with_write_bound(WRITE_TIMEOUT), theirs)
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_frame_sent_in_pieces_is_taken_whole() {
        let (mut link, mut client) = link(4096);
        let bytes = frame(&refused());
        let (first, rest) = bytes.split_at(3);
        let (first, rest) = (first.to_vec(), rest.to_vec());
        let sending = tokio::spawn(async move {
            client.write_all(&first).await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
            client.write_all(&rest).await.unwrap();
            client
        });
        let record: SessionOpened = link.recv().await.unwrap();
        assert_eq!(record, refused());
        drop(sending.await.unwrap());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_client_that_goes_in_the_middle_of_a_frame_is_gone() {
        let (mut link, mut client) = link(4096);
        let bytes = frame(&refused());
        client.write_all(&bytes[..bytes.len() - 1]).await.unwrap();
        drop(client);
        let gone = link.recv::<SessionOpened>().await.unwrap_err();
        assert!(matches!(gone, LinkError::Closed), "{gone:?}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_garbled_frame_is_refused() {
        let (mut link, mut client) = link(4096);
        let mut bytes = frame(&refused());
        bytes[4] = 0xff;
        client.write_all(&bytes).await.unwrap();
        let refused = link.recv::<SessionOpened>().await.unwrap_err();
        assert!(matches!(refused, LinkError::Frame(_)), "{refused:?}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn what_is_queued_goes_in_one_flush_in_order() {
        let (mut link, mut client) = link(1 << 16);
        let output = |byte: u8| {
            SessionTerminalMessage::Output(TerminalOutput {
                session_id: SessionId([1; 16]),
                bytes: vec![byte; 8],
            })
        };
        link.queue(&output(1)).unwrap();
        link.queue(&output(2)).unwrap();
        let mut expected = Vec::new();
        write_frame(&mut expected, &output(1)).unwrap();
        write_frame(&mut expected, &output(2)).unwrap();
        link.flush().await.unwrap();
        let mut got = vec![0u8; expected.len()];
        client.read_exact(&mut got).await.unwrap();
        assert_eq!(got, expected);
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_client_that_stops_reading_stalls_its_session_within_the_write_bound() {
        let (mut link, _client) = link(64);
        let output = SessionTerminalMessage::Output(TerminalOutput {
            session_id: SessionId([1; 16]),
            bytes: vec![0; 4096],
        });
        let started = tokio::time::Instant::now();
        let stalled = link.send(&output).await.unwrap_err();
        assert!(
            matches!(stalled, LinkError::Stalled(WRITE_TIMEOUT)),
            "{stalled:?}"
        );
        assert!(started.elapsed() >= WRITE_TIMEOUT);
        assert!(started.elapsed() < WRITE_TIMEOUT * 2);
    }
}
