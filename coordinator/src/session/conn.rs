//! The TLS connection of one served session, with its frames, and why a
//! session fails.
//!
//! Owns the framing of what the coordinator writes to a client and the
//! bound on how long one write may wait. Trusts nothing it reads: frames
//! go through the versioned codec with their size limits.

use std::os::fd::OwnedFd;
use std::time::Duration;

use lazaret_proto::codec::WireRecord;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::stream::FdStream;
use super::tls::{FrameBuffer, FrameError, write_frame};

/// How long one write to a client may wait: a client that stops reading
/// (a stopped CLI) ends its session instead of holding it.
pub(super) const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// The TLS connection of one session, with its frames.
pub(super) struct Link<S = tokio_rustls::server::TlsStream<FdStream>> {
    stream: S,
    /// Frames queued and not yet written.
    outgoing: Vec<u8>,
}

impl Link {
    /// The descriptors the client attached so far.
    pub(super) fn take_fds(&mut self) -> Vec<OwnedFd> {
        self.stream.get_mut().0.take_fds()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Link<S> {
    /// The link over `stream`, nothing queued.
    pub(super) fn new(stream: S) -> Self {
        Self {
            stream,
            outgoing: Vec::new(),
        }
    }

    /// Reads what the connection has. Cancel-safe.
    pub(super) async fn read(&mut self, buf: &mut [u8]) -> Result<usize, SessionError> {
        read_into(&mut self.stream, buf).await
    }

    /// Reads one frame of `T` (used before the session runs, when nothing
    /// else is read).
    pub(super) async fn recv<T: WireRecord>(&mut self) -> Result<T, SessionError> {
        let mut frames = FrameBuffer::<T>::new();
        let mut buf = vec![0u8; 4096];
        loop {
            if let Some(record) = frames.next_frame()? {
                return Ok(record);
            }
            let n = self.read(&mut buf).await?;
            if n == 0 {
                return Err(SessionError::Closed);
            }
            frames.push(&buf[..n]);
        }
    }

    /// Queues one frame.
    pub(super) fn queue<T: WireRecord>(&mut self, record: &T) -> Result<(), SessionError> {
        write_frame(&mut self.outgoing, record).map_err(SessionError::Frame)
    }

    /// Writes what is queued, within [`WRITE_TIMEOUT`].
    pub(super) async fn flush(&mut self) -> Result<(), SessionError> {
        let bytes = std::mem::take(&mut self.outgoing);
        tokio::time::timeout(WRITE_TIMEOUT, async {
            self.stream.write_all(&bytes).await?;
            self.stream.flush().await
        })
        .await
        .map_err(|_| SessionError::Stalled)?
        .map_err(SessionError::Io)
    }

    /// Sends one frame.
    pub(super) async fn send<T: WireRecord>(&mut self, record: &T) -> Result<(), SessionError> {
        self.queue(record)?;
        self.flush().await
    }

    /// Says goodbye: a TLS close_notify.
    pub(super) async fn close(&mut self) {
        let _ = self.stream.shutdown().await;
    }
}

pub(super) async fn read_into<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut [u8],
) -> Result<usize, SessionError> {
    match stream.read(buf).await {
        Ok(n) => Ok(n),
        // A client that went away without a close_notify has still gone.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(0),
        Err(e) => Err(SessionError::Io(e)),
    }
}

/// Why a session failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The peer is not this Domain's owner, or broke the protocol.
    #[error("refused a session connection: {0}")]
    Peer(String),
    /// The client closed the connection, or its process is gone.
    #[error("the client went away")]
    Closed,
    /// The client stopped reading.
    #[error("the client did not read its output for {} s", WRITE_TIMEOUT.as_secs())]
    Stalled,
    /// A frame was malformed.
    #[error("a session frame was malformed")]
    Frame(#[from] FrameError),
    /// The supervisor could not be asked.
    #[error("cannot ask the supervisor for the session process: {0}")]
    Supervisor(String),
    /// The connection or a host descriptor failed (TLS refusals included).
    #[error("the session connection failed")]
    Io(#[from] std::io::Error),
}

#[cfg(test)]
mod tests {
    //! The link's frames over an in-memory stream: what a client that
    //! sends in pieces, breaks off or stops reading does to a session.

    use std::time::Duration;

    use lazaret_proto::ids::SessionId;
    use lazaret_proto::session::SessionOpened;
    use lazaret_proto::terminal::{SessionTerminalMessage, TerminalOutput};
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    use super::{Link, SessionError, WRITE_TIMEOUT};
    use crate::session::tls::write_frame;

    fn frame(record: &SessionOpened) -> Vec<u8> {
        let mut bytes = Vec::new();
        write_frame(&mut bytes, record).unwrap();
        bytes
    }

    fn refused() -> SessionOpened {
        SessionOpened::Refused {
            reason: "full".into(),
        }
    }

    /// The coordinator's link and the client's end.
    fn link(buffer: usize) -> (Link<DuplexStream>, DuplexStream) {
        let (ours, theirs) = tokio::io::duplex(buffer);
        (Link::new(ours), theirs)
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
        assert!(matches!(gone, SessionError::Closed), "{gone:?}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_garbled_frame_is_refused() {
        let (mut link, mut client) = link(4096);
        let mut bytes = frame(&refused());
        bytes[4] = 0xff;
        client.write_all(&bytes).await.unwrap();
        let refused = link.recv::<SessionOpened>().await.unwrap_err();
        assert!(matches!(refused, SessionError::Frame(_)), "{refused:?}");
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
        assert!(matches!(stalled, SessionError::Stalled), "{stalled:?}");
        assert!(started.elapsed() >= WRITE_TIMEOUT);
        assert!(started.elapsed() < WRITE_TIMEOUT * 2);
    }
}
