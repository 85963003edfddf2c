//! Attributes: `getattr`, `setattr` and `readlink`.
//!
//! Owns what the sandbox may change of an object: its mode (masked with
//! [`MODE_MASK`]; a directory keeps a setgid bit it has), owner and group
//! (the kernel of the Domain user namespace decides), size and times. A
//! protected path changes nothing (`EROFS`); a removed file changes only
//! through an open handle. Each change acts on the object itself (its
//! descriptor, or its last component not followed), so a name swapped
//! for a link meanwhile redirects nothing. Trusts nothing in a request.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::{AtFlags, Mode, OFlags, Stat, Timestamps};
use rustix::io::Errno;

use super::path::os;
use super::{MODE_MASK, PROTECTED, Result, Tree, kind_of};
use crate::nodes::Kind;

impl Tree {
    /// `getattr`; an open file (a removed one too) answers from its
    /// handle.
    pub fn getattr(&self, ino: u64, handle: Option<u64>) -> Result<Stat> {
        // An open file answers from its descriptor: no path to resolve.
        if let Some(handle) = handle {
            return rustix::fs::fstat(&*self.file(handle)?);
        }
        let node = self.node(ino)?;
        if node.removed {
            return Err(Errno::STALE);
        }
        let entry = self.entry(&node)?;
        rustix::fs::statat(&entry.dir, os(&entry.name), AtFlags::SYMLINK_NOFOLLOW)
    }

    /// `setattr`: what the sandbox may change, with its mode bits masked.
    pub fn setattr(&self, ino: u64, set: SetAttr, handle: Option<u64>) -> Result<Stat> {
        let node = self.node(ino)?;
        if node.protection.is_pinned() {
            return Err(PROTECTED);
        }
        if node.removed {
            // A removed file still open (a temporary file): only through
            // its handle.
            let fd = self.file(handle.ok_or(Errno::STALE)?)?;
            return set_through(&fd, set);
        }
        let entry = self.entry(&node)?;
        let name = os(&entry.name);
        if let Some(mode) = set.mode {
            // fchmod on a descriptor of the object itself: a name replaced
            // by a link in between cannot redirect it.
            let fd = self.open_file(&entry, OFlags::RDONLY).map_err(|e| {
                if e == Errno::LOOP {
                    Errno::OPNOTSUPP
                } else {
                    e
                }
            })?;
            rustix::fs::fchmod(&fd, masked(fd.as_fd(), mode)?)?;
        }
        if set.uid.is_some() || set.gid.is_some() {
            rustix::fs::chownat(
                &entry.dir,
                name,
                set.uid.map(rustix::fs::Uid::from_raw),
                set.gid.map(rustix::fs::Gid::from_raw),
                AtFlags::SYMLINK_NOFOLLOW,
            )?;
        }
        if let Some(size) = set.size {
            match handle.and_then(|h| self.file(h).ok()) {
                Some(fd) => rustix::fs::ftruncate(&*fd, size)?,
                None => {
                    let fd = self.open_file(&entry, OFlags::WRONLY)?;
                    if kind_of(&rustix::fs::fstat(&fd)?) != Kind::File {
                        return Err(Errno::INVAL);
                    }
                    rustix::fs::ftruncate(&fd, size)?;
                }
            }
        }
        if set.atime.is_some() || set.mtime.is_some() {
            rustix::fs::utimensat(
                &entry.dir,
                name,
                &timestamps(set),
                AtFlags::SYMLINK_NOFOLLOW,
            )?;
        }
        rustix::fs::statat(&entry.dir, name, AtFlags::SYMLINK_NOFOLLOW)
    }

    /// `readlink`.
    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        let node = self.node(ino)?;
        let entry = self.entry(&node)?;
        Ok(rustix::fs::readlinkat(&entry.dir, os(&entry.name), Vec::new())?.into_bytes())
    }
}

/// Times to set.
#[derive(Clone, Copy, Debug)]
pub enum SetTime {
    /// This time.
    At(std::time::SystemTime),
    /// Now.
    Now,
}

/// What `setattr` changes.
#[derive(Clone, Copy, Debug, Default)]
pub struct SetAttr {
    /// New permission bits.
    pub mode: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New size.
    pub size: Option<u64>,
    /// New access time.
    pub atime: Option<SetTime>,
    /// New modification time.
    pub mtime: Option<SetTime>,
}

/// The setgid bit, which a directory keeps (see [`masked`]).
const SETGID: u32 = 0o2000;

/// The mode a `chmod` of the object `fd` to `mode` sets: `mode` masked
/// with [`MODE_MASK`], except that a directory keeps the setgid bit it has.
/// That bit gives what is made in the directory the directory's group, as
/// in a shared project tree; the host's kernel puts it on every directory
/// made in a setgid one, and a `mkdir -m 755` or `install -d` inside must
/// not take it off. The sandbox never adds it.
fn masked(fd: BorrowedFd<'_>, mode: u32) -> Result<Mode> {
    let current = rustix::fs::fstat(fd)?;
    let kept = match kind_of(&current) {
        Kind::Dir => current.st_mode & SETGID,
        _ => 0,
    };
    Ok(Mode::from_raw_mode((mode & MODE_MASK) | kept))
}

/// Applies `set` to an open file through its descriptor.
fn set_through(fd: &OwnedFd, set: SetAttr) -> Result<Stat> {
    if let Some(mode) = set.mode {
        rustix::fs::fchmod(fd, masked(fd.as_fd(), mode)?)?;
    }
    if set.uid.is_some() || set.gid.is_some() {
        rustix::fs::fchown(
            fd,
            set.uid.map(rustix::fs::Uid::from_raw),
            set.gid.map(rustix::fs::Gid::from_raw),
        )?;
    }
    if let Some(size) = set.size {
        rustix::fs::ftruncate(fd, size)?;
    }
    if set.atime.is_some() || set.mtime.is_some() {
        rustix::fs::futimens(fd, &timestamps(set))?;
    }
    rustix::fs::fstat(fd)
}

/// The timestamps `set` asks for, the others left as they are.
fn timestamps(set: SetAttr) -> Timestamps {
    let spec = |t: Option<SetTime>| match t {
        None => rustix::fs::Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_OMIT,
        },
        Some(SetTime::Now) => rustix::fs::Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_NOW,
        },
        Some(SetTime::At(time)) => {
            let since = time
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            rustix::fs::Timespec {
                tv_sec: i64::try_from(since.as_secs()).unwrap_or(i64::MAX),
                tv_nsec: i64::from(since.subsec_nanos()),
            }
        }
    };
    Timestamps {
        last_access: spec(set.atime),
        last_modification: spec(set.mtime),
    }
}
