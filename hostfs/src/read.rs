//! The bounded read of a small host file by path: git's configuration and
//! hooks, ignore files, the user's own files, read as data.
//!
//! Owns the one way such a file is read: opened once without blocking
//! (a FIFO put in its place cannot hang the reader), checked to be a
//! regular file and read through that one descriptor, never more than its
//! bound. Trusts nothing about the file.

use rustix::fd::BorrowedFd;
use rustix::fs::{Mode, OFlags};

/// Why a small file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// It is larger than the reader takes.
    #[error("it is larger than {max} bytes")]
    TooLarge {
        /// The limit.
        max: u64,
    },
    /// The kernel refused.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// The content of the regular file at `path` (relative to `dir`, or to the
/// working directory without one), of at most `max` bytes; `None` when
/// there is no regular file there: nothing, a FIFO, a device, a directory,
/// or, unless `follow`, a symbolic link. The file is opened once, without
/// blocking (a FIFO put in its place cannot hang the reader), checked and
/// read through that one descriptor, never more than `max + 1` bytes (a
/// file whose size says 0, as in `/proc`, is bounded too).
pub fn read_small(
    dir: Option<BorrowedFd<'_>>,
    path: &std::path::Path,
    follow: bool,
    max: u64,
) -> Result<Option<Vec<u8>>, ReadError> {
    use std::io::Read;
    let mut flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    if !follow {
        flags |= OFlags::NOFOLLOW;
    }
    let fd = match rustix::fs::openat(dir.unwrap_or(rustix::fs::CWD), path, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT | rustix::io::Errno::LOOP) => return Ok(None),
        Err(e) => return Err(ReadError::Io(e.into())),
    };
    let file = std::fs::File::from(fd);
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Ok(None);
    }
    if meta.len() > max {
        return Err(ReadError::TooLarge { max });
    }
    let mut content = Vec::new();
    file.take(max + 1).read_to_end(&mut content)?;
    if content.len() as u64 > max {
        return Err(ReadError::TooLarge { max });
    }
    Ok(Some(content))
}

#[cfg(test)]
mod tests {
    use rustix::fs::FileType;

    use super::*;

    #[test]
    fn only_small_regular_files_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let read = |path: &std::path::Path, follow: bool, max: u64| {
            read_small(None, path, follow, max).map_err(|e| e.to_string())
        };
        let file = dir.path().join("file");
        std::fs::write(&file, "12345").unwrap();
        assert_eq!(read(&file, true, 5), Ok(Some(b"12345".to_vec())));
        assert_eq!(
            read(&file, true, 4),
            Err("it is larger than 4 bytes".to_owned())
        );
        // A FIFO with no writer: passed over at once, not waited on.
        let fifo = dir.path().join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        assert_eq!(read(&fifo, true, 100), Ok(None));
        // A file whose size says 0 but reads on.
        assert!(read(std::path::Path::new("/proc/self/maps"), true, 10).is_err());
        assert_eq!(read(dir.path(), true, 100), Ok(None));
        assert_eq!(read(&dir.path().join("absent"), true, 100), Ok(None));
        // A link, unless followed.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("file", &link).unwrap();
        assert_eq!(read(&link, false, 100), Ok(None));
        assert_eq!(read(&link, true, 100), Ok(Some(b"12345".to_vec())));
    }
}
