//! Why a served session fails, and the bound on how long one write to its
//! client may wait.
//!
//! Owns only that account; the hub serves sessions on
//! [`ServerLink`](super::link::ServerLink)s and reports their ends with it.
//! Trusts nothing: what a client sent reaches here only as the link's
//! refusal of it.

use std::time::Duration;

use super::link::LinkError;

/// How long one write to a client may wait: a client that stops reading
/// (a stopped CLI) ends its session instead of holding it.
pub(super) const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a session failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The peer is not this Domain's owner, or broke the protocol.
    #[error("refused a session connection: {0}")]
    Peer(String),
    /// The client closed the connection, or its process is gone.
    #[error("the client went away")]
    Closed,
    /// The link failed: TLS, a malformed frame, a client that stopped
    /// reading.
    #[error(transparent)]
    Link(LinkError),
    /// The supervisor could not be asked.
    #[error("cannot ask the supervisor for the session process: {0}")]
    Supervisor(String),
    /// The TLS handshake or a host descriptor failed.
    #[error("the session connection failed")]
    Io(#[from] std::io::Error),
}

impl From<LinkError> for SessionError {
    /// A link the client closed is a client gone; any other failure is the
    /// link's.
    fn from(error: LinkError) -> Self {
        match error {
            LinkError::Closed => Self::Closed,
            other => Self::Link(other),
        }
    }
}
