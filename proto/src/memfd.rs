//! Sealed memfds: how one role hands another bytes that no one can change
//! afterwards (the sandbox environment, the network policy, a session's
//! process specification).
//!
//! This module owns the seal set both ends agree on and the bounded read.
//! The writer trusts its own bytes; the reader trusts nothing: it refuses a
//! descriptor that is not a memfd sealed against writing, shrinking,
//! growing and further sealing, and one larger than its caller allows.

use std::fs::File;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};

use rustix::fs::{MemfdFlags, SealFlags};

/// The seals every handed-over memfd carries.
const SEALS: SealFlags = SealFlags::WRITE
    .union(SealFlags::SHRINK)
    .union(SealFlags::GROW)
    .union(SealFlags::SEAL);

/// Why a sealed memfd could not be read.
#[derive(Debug, thiserror::Error)]
pub enum MemfdError {
    /// The descriptor is not a sealable memfd.
    #[error("the descriptor is not a sealable memfd")]
    NotMemfd(#[source] io::Error),
    /// Some seal is missing: its writer could still change it.
    #[error("the memfd is not sealed against change (seals {0:?})")]
    Unsealed(SealFlags),
    /// Reading failed.
    #[error("cannot read the memfd")]
    Read(#[source] io::Error),
    /// It holds more than the reader accepts.
    #[error("the memfd holds more than {0} bytes")]
    TooLarge(usize),
}

/// A memfd named `name`, filled by `fill`, then sealed. The bytes go
/// straight into the memfd, so secrets need no other buffer.
pub fn sealed(name: &str, fill: impl FnOnce(&mut File) -> io::Result<()>) -> io::Result<OwnedFd> {
    let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
    let mut file = File::from(fd);
    fill(&mut file)?;
    rustix::fs::fcntl_add_seals(&file, SEALS)?;
    Ok(OwnedFd::from(file))
}

/// A memfd holding exactly `bytes`, sealed.
pub fn sealed_bytes(name: &str, bytes: &[u8]) -> io::Result<OwnedFd> {
    sealed(name, |file| io::Write::write_all(file, bytes))
}

/// The whole content of a sealed memfd of at most `max_len` bytes, read
/// from offset 0 whatever the shared file offset (the writer left it at the
/// end).
pub fn read_sealed(fd: BorrowedFd<'_>, max_len: usize) -> Result<Vec<u8>, MemfdError> {
    let seals = rustix::fs::fcntl_get_seals(fd).map_err(|e| MemfdError::NotMemfd(e.into()))?;
    if !seals.contains(SEALS) {
        return Err(MemfdError::Unsealed(seals));
    }
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let offset = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
        let n =
            rustix::io::pread(fd, &mut chunk, offset).map_err(|e| MemfdError::Read(e.into()))?;
        if n == 0 {
            return Ok(bytes);
        }
        bytes.extend_from_slice(&chunk[..n]);
        if bytes.len() > max_len {
            return Err(MemfdError::TooLarge(max_len));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    #[test]
    fn a_sealed_memfd_cannot_change_and_reads_whole() {
        let fd = sealed_bytes("test", b"abc").unwrap();
        assert!(rustix::io::pwrite(&fd, b"x", 0).is_err());
        assert!(rustix::fs::ftruncate(&fd, 0).is_err());
        assert_eq!(read_sealed(fd.as_fd(), 3).unwrap(), b"abc");
        assert!(matches!(
            read_sealed(fd.as_fd(), 2),
            Err(MemfdError::TooLarge(2))
        ));
    }

    #[test]
    fn an_unsealed_memfd_or_another_file_is_refused() {
        let open = rustix::fs::memfd_create("open", MemfdFlags::ALLOW_SEALING).unwrap();
        assert!(matches!(
            read_sealed(open.as_fd(), 10),
            Err(MemfdError::Unsealed(_))
        ));
        let file = File::open("/proc/self/status").unwrap();
        assert!(matches!(
            read_sealed(file.as_fd(), 10),
            Err(MemfdError::NotMemfd(_))
        ));
    }
}
