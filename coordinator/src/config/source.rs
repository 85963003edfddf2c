//! The secure read of the configuration source.
//!
//! This module owns the one read of the configuration file's bytes. It
//! trusts nothing about the file: it opens it `O_PATH` so checking its type
//! cannot activate a FIFO or device, requires a regular file owned by root or
//! the invoking user with one hard link and no group/other write, at most
//! 1,048,576 bytes, reopens that exact descriptor for a nonblocking read,
//! reads the recorded size twice and requires equal bytes and an unchanged
//! identity, size and change time. A changed source is refused, never retried.

use std::path::{Path, PathBuf};

use lazaret_proto::config::MAX_SOURCE_LEN;
use rustix::fd::{AsFd, OwnedFd};
use rustix::fs::{FileType, Mode, OFlags, Stat};

use lazaret_hostfs::beneath::proc_self_fd;
use lazaret_hostfs::plan::{
    ConfinedError, ConfinedPathPlan, canonicalize, identity, label, stat, type_name,
};

use super::ConfigError;

/// The bytes of a configuration source and the plan that reached it.
#[derive(Debug)]
pub struct ConfigSource {
    /// The plan to the canonical file.
    pub plan: ConfinedPathPlan,
    /// The retained `O_PATH` descriptor.
    pub fd: OwnedFd,
    /// The file's contents, read twice and compared.
    pub bytes: Vec<u8>,
}

fn refuse(path: &Path, reason: impl Into<String>) -> ConfigError {
    ConfigError::Source {
        path: label(path),
        reason: reason.into(),
    }
}

fn from_confined(path: &Path, error: ConfinedError) -> ConfigError {
    match error {
        ConfinedError::Missing { .. } => refuse(
            path,
            "does not exist; write one with `lazaret config init` or pass --config PATH",
        ),
        ConfinedError::Io {
            operation, source, ..
        } => refuse(
            path,
            format!("could not be read: cannot {operation} it: {source}"),
        ),
        other => refuse(path, other.to_string()),
    }
}

/// What must not change between the first check and the last read.
#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    device: u64,
    inode: u64,
    size: i64,
    ctime: (i64, u64),
}

impl Snapshot {
    fn of(stat: &Stat) -> Self {
        Self {
            device: stat.st_dev,
            inode: stat.st_ino,
            size: stat.st_size,
            ctime: (stat.st_ctime, stat.st_ctime_nsec),
        }
    }
}

/// Checks type, ownership, links, mode and size of the opened source.
fn check_metadata(path: &Path, stat: &Stat, uid: u32) -> Result<(), ConfigError> {
    let found = FileType::from_raw_mode(stat.st_mode);
    if found != FileType::RegularFile {
        return Err(refuse(
            path,
            format!(
                "is a {}; the configuration must be a regular file",
                type_name(found)
            ),
        ));
    }
    if stat.st_uid != 0 && stat.st_uid != uid {
        return Err(refuse(
            path,
            format!(
                "is owned by uid {}; the configuration must be owned by you (uid {uid}) or root",
                stat.st_uid
            ),
        ));
    }
    if stat.st_nlink != 1 {
        return Err(refuse(
            path,
            format!(
                "has {} hard links; the configuration must have exactly one (copy it instead of linking)",
                stat.st_nlink
            ),
        ));
    }
    let mode = stat.st_mode & 0o7777;
    if mode & 0o022 != 0 {
        return Err(refuse(
            path,
            format!(
                "is writable by its group or others (mode {mode:04o}); run `chmod go-w {}`",
                path.display()
            ),
        ));
    }
    if stat.st_size < 0 || stat.st_size as u64 > MAX_SOURCE_LEN {
        return Err(refuse(
            path,
            format!(
                "is {} bytes; the configuration may be at most {MAX_SOURCE_LEN} bytes",
                stat.st_size
            ),
        ));
    }
    Ok(())
}

/// Reads exactly `len` bytes from `offset`, then requires end of file.
fn read_exact_at(fd: &OwnedFd, path: &Path, len: usize) -> Result<Vec<u8>, ConfigError> {
    let mut buf = vec![0u8; len + 1];
    let mut filled = 0;
    loop {
        match rustix::io::pread(fd, &mut buf[filled..], filled as u64) {
            Ok(0) => break,
            Ok(n) => {
                filled += n;
                if filled > len {
                    return Err(refuse(
                        path,
                        "grew while it was read; run the command again",
                    ));
                }
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => {
                return Err(ConfigError::SourceIo {
                    path: label(path),
                    source: e.into(),
                });
            }
        }
    }
    if filled != len {
        return Err(refuse(
            path,
            "shrank while it was read; run the command again",
        ));
    }
    buf.truncate(len);
    Ok(buf)
}

/// Reads the configuration source at `path` under every rule of the secure
/// read. `path` is resolved once to its canonical target; every later open
/// follows no symbolic link.
pub fn read(path: &Path, uid: u32) -> Result<ConfigSource, ConfigError> {
    let canonical: PathBuf = canonicalize(path).map_err(|e| from_confined(path, e))?;
    let plan = ConfinedPathPlan::for_canonical(&canonical).map_err(|e| from_confined(path, e))?;
    let path_fd = plan
        .open(OFlags::PATH)
        .map_err(|e| from_confined(path, e))?;
    let first = stat(path_fd.as_fd(), &canonical).map_err(|e| from_confined(path, e))?;
    check_metadata(&canonical, &first, uid)?;

    // Reopen that exact descriptor (not the pathname) for a nonblocking read.
    let proc_path = proc_self_fd(path_fd.as_fd());
    let read_fd = rustix::fs::open(
        proc_path.as_bytes(),
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| ConfigError::SourceIo {
        path: label(&canonical),
        source: e.into(),
    })?;
    let opened = stat(read_fd.as_fd(), &canonical).map_err(|e| from_confined(path, e))?;
    let path_identity =
        identity(path_fd.as_fd(), &canonical).map_err(|e| from_confined(path, e))?;
    let read_identity =
        identity(read_fd.as_fd(), &canonical).map_err(|e| from_confined(path, e))?;
    if path_identity != read_identity || Snapshot::of(&first) != Snapshot::of(&opened) {
        return Err(refuse(
            &canonical,
            "changed while it was opened; run the command again",
        ));
    }
    check_metadata(&canonical, &opened, uid)?;

    let len = usize::try_from(first.st_size).unwrap_or(usize::MAX);
    let bytes = read_exact_at(&read_fd, &canonical, len)?;
    let again = read_exact_at(&read_fd, &canonical, len)?;
    let last = stat(read_fd.as_fd(), &canonical).map_err(|e| from_confined(path, e))?;
    if bytes != again || Snapshot::of(&first) != Snapshot::of(&last) {
        return Err(refuse(
            &canonical,
            "changed while it was read; run the command again",
        ));
    }
    Ok(ConfigSource {
        plan,
        fd: path_fd,
        bytes,
    })
}
