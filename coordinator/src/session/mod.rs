//! The Session Coordinator: the Host Coordinator's endpoint for `lazaret
//! attach` clients.
//!
//! This module owns the link between a host CLI and its Domain's Host
//! Coordinator, both ends of it: [`tls`] holds the per-generation TLS
//! material and the frames carried inside the connection, [`stream`] the
//! socket with the descriptors it carries, [`link`] the frames over
//! `tokio-rustls` (and the client's connection), [`hub`] the server's
//! sessions. It trusts a peer only after the TLS handshake proved it holds
//! a credential of the current generation.

mod error;
pub mod hub;
pub mod link;
mod stdio;
pub mod stream;
pub mod tls;

use lazaret_proto::trust::{GenerationIdentity, ProtocolCredential, ProtocolCredentialRole};

/// The directory, beneath the Domain's runtime directory, holding the
/// invoking user's client credential.
pub const CREDENTIAL_DIR: &str = "session";

/// The Session Coordinator's socket in the Domain's runtime directory.
pub const SESSION_SOCKET: &str = "session.sock";

/// Whether a descriptor of the client may become a standard stream of a
/// process inside the sandbox: only a pipe or `/dev/null`. A terminal would
/// let a process inside read the developer's keystrokes and write to their
/// screen after the session; a socket or file reaches whatever it is
/// connected to. Everything else is relayed through the session.
pub fn donatable(fd: std::os::fd::BorrowedFd<'_>) -> bool {
    let Ok(stat) = rustix::fs::fstat(fd) else {
        return false;
    };
    match rustix::fs::FileType::from_raw_mode(stat.st_mode) {
        rustix::fs::FileType::Fifo => true,
        rustix::fs::FileType::CharacterDevice => stat.st_rdev == rustix::fs::makedev(1, 3),
        _ => false,
    }
}

/// `N` bytes from the system's secure random generator, for identifiers and
/// keys.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    lazaret_proto::signing::random_bytes()
}

/// The Session Coordinator's protocol signing credential of a generation:
/// a fresh Ed25519 key, held in memory only.
pub fn coordinator_protocol_credential(identity: &GenerationIdentity) -> ProtocolCredential {
    lazaret_proto::signing::credential(identity, ProtocolCredentialRole::SessionCoordinator)
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::donatable;

    #[test]
    fn only_pipes_and_dev_null_are_handed_in() {
        let (read, write) = rustix::pipe::pipe().unwrap();
        assert!(donatable(read.as_fd()) && donatable(write.as_fd()));
        let null = std::fs::File::open("/dev/null").unwrap();
        assert!(donatable(null.as_fd()));

        let zero = std::fs::File::open("/dev/zero").unwrap();
        let file = tempfile::tempfile().unwrap();
        let (socket, _) = std::os::unix::net::UnixStream::pair().unwrap();
        let terminal = rustix::pty::openpt(rustix::pty::OpenptFlags::RDWR).unwrap();
        for (what, fd) in [
            ("another device", zero.as_fd()),
            ("a regular file", file.as_fd()),
            ("a socket", socket.as_fd()),
            ("a terminal", terminal.as_fd()),
        ] {
            assert!(!donatable(fd), "{what} is relayed, never handed in");
        }
    }
}
