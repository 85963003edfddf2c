//! Open files: `open`, reads, writes, `fsync`, `fallocate` and `release`.
//!
//! Owns the descriptors of the regular files the sandbox holds open and
//! the flags passed on when opening one (the access mode and how data is
//! written, never one that changes what is opened; no link followed, no
//! blocking). A protected file opens for reading only. Trusts nothing in
//! a request: a handle that names no open file is `EBADF`, and an offset
//! past the end reads nothing, as `pread` says.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use lazaret_routing::classify::Protection;
use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

use super::path::os;
use super::sides::Entry;
use super::{PROTECTED, Result, Tree, kind_of};
use crate::nodes::Kind;

impl Tree {
    /// `open`: a regular file, writable only if not protected.
    pub fn open(&self, ino: u64, flags: i32) -> Result<Opened> {
        let node = self.node(ino)?;
        let flags = open_flags(flags) & !(OFlags::EXCL);
        if writes(flags) && node.protection != Protection::None {
            return Err(PROTECTED);
        }
        let entry = self.entry(&node)?;
        let fd = self.open_file(&entry, flags)?;
        let stat = rustix::fs::fstat(&fd)?;
        if kind_of(&stat) != Kind::File {
            return Err(Errno::INVAL);
        }
        Ok(Opened {
            handle: self.keep_file(fd),
            size: u64::try_from(stat.st_size).unwrap_or(0),
        })
    }

    /// Opens `entry` with `flags` (no link followed, never blocking).
    ///
    /// The router's capabilities do not reach a file whose group the
    /// Domain user namespace cannot map (a file in a setgid directory of a
    /// shared group): for the user's own such file, only its owner bits
    /// apply. Where they refuse, the router adds the missing owner read or
    /// write bit for the moment of opening and puts the mode back, as the
    /// owner may, so the sandbox's root has over it what it has over the
    /// user's files of their own group. gVisor needs it: it makes a file
    /// with the descriptor it asked for read-only, then opens the file
    /// again for writing (git makes its objects with mode 0444). The file
    /// is reached through one `O_PATH` descriptor from the check to the
    /// reopening: a name swapped meanwhile changes nothing.
    pub(super) fn open_file(&self, entry: &Entry, flags: OFlags) -> Result<OwnedFd> {
        let name = os(&entry.name);
        match rustix::fs::openat(
            &entry.dir,
            name,
            flags | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Err(Errno::ACCESS) => {}
            other => return other,
        }
        let object = rustix::fs::openat(
            &entry.dir,
            name,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let stat = rustix::fs::fstat(&object)?;
        let needed = match flags & OFlags::RWMODE {
            OFlags::RDONLY => 0o400,
            OFlags::WRONLY => 0o200,
            _ => 0o600,
        };
        let mode = stat.st_mode & 0o7777;
        if kind_of(&stat) != Kind::File || stat.st_uid != self.owner || mode & needed == needed {
            return Err(Errno::ACCESS);
        }
        // The object itself, through its descriptor's magic link.
        let magic = format!("/proc/self/fd/{}", object.as_raw_fd());
        rustix::fs::chmod(&magic, Mode::from_raw_mode(mode | needed))?;
        let opened = rustix::fs::open(
            &magic,
            flags | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        );
        let restored = rustix::fs::chmod(&magic, Mode::from_raw_mode(mode));
        let fd = opened?;
        restored?;
        Ok(fd)
    }

    pub(super) fn keep_file(&self, fd: OwnedFd) -> u64 {
        self.files.insert(fd)
    }

    /// The descriptor of an open file.
    pub fn file(&self, handle: u64) -> Result<Arc<OwnedFd>> {
        self.files.get(handle)
    }

    /// `read`: up to `size` bytes at `offset` into `buf` (cleared first;
    /// its capacity is reused, and nothing is zeroed).
    pub fn read(&self, handle: u64, offset: u64, size: u32, buf: &mut Vec<u8>) -> Result<()> {
        let fd = self.file(handle)?;
        let size = size as usize;
        buf.clear();
        buf.reserve_exact(size.max(1));
        while buf.len() < size {
            let at = offset + buf.len() as u64;
            match rustix::io::pread(&*fd, rustix::buffer::spare_capacity(buf), at) {
                Ok(0) => break,
                Ok(_) => {}
                Err(Errno::INTR) => continue,
                Err(e) => return Err(e),
            }
        }
        buf.truncate(size);
        Ok(())
    }

    /// `write`.
    pub fn write(&self, handle: u64, offset: u64, data: &[u8]) -> Result<u32> {
        let fd = self.file(handle)?;
        let mut done = 0;
        while done < data.len() {
            match rustix::io::pwrite(&*fd, &data[done..], offset + done as u64) {
                Ok(n) => done += n,
                Err(Errno::INTR) => continue,
                Err(e) if done == 0 => return Err(e),
                Err(_) => break,
            }
        }
        Ok(u32::try_from(done).unwrap_or(u32::MAX))
    }

    /// `fsync`.
    pub fn fsync(&self, handle: u64, data_only: bool) -> Result<()> {
        let fd = self.file(handle)?;
        if data_only {
            rustix::fs::fdatasync(&*fd)
        } else {
            rustix::fs::fsync(&*fd)
        }
    }

    /// `fallocate`.
    pub fn fallocate(&self, handle: u64, offset: u64, length: u64, mode: i32) -> Result<()> {
        let fd = self.file(handle)?;
        let mode = rustix::fs::FallocateFlags::from_bits(mode as u32).ok_or(Errno::OPNOTSUPP)?;
        rustix::fs::fallocate(&*fd, mode, offset, length)
    }

    /// `release`.
    pub fn release(&self, handle: u64) {
        self.files.remove(handle);
    }
}

/// A regular file `open` opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Opened {
    /// Its handle, until `release`.
    pub handle: u64,
    /// Its size when it was opened.
    pub size: u64,
}

/// The open flags the router passes on: the access mode and the flags
/// that change how data is written; never one that changes what is opened.
pub(super) fn open_flags(flags: i32) -> OFlags {
    let given = OFlags::from_bits_retain(flags as u32);
    given
        & (OFlags::RWMODE
            | OFlags::APPEND
            | OFlags::TRUNC
            | OFlags::EXCL
            | OFlags::SYNC
            | OFlags::DSYNC)
}

fn writes(flags: OFlags) -> bool {
    flags.intersects(OFlags::WRONLY | OFlags::RDWR | OFlags::TRUNC | OFlags::APPEND)
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::super::testing::scratch;
    use super::*;

    fn raw(flags: OFlags) -> i32 {
        flags.bits() as i32
    }

    #[test]
    fn open_flags_pass_on_nothing_that_changes_what_is_opened() {
        let asked = OFlags::RDWR
            | OFlags::APPEND
            | OFlags::CREATE
            | OFlags::DIRECTORY
            | OFlags::PATH
            | OFlags::NOATIME
            | OFlags::TMPFILE
            | OFlags::NOCTTY;
        assert_eq!(open_flags(raw(asked)), OFlags::RDWR | OFlags::APPEND);
        // Flags the kernel does not know are dropped too.
        assert_eq!(open_flags(-1) & !(OFlags::RWMODE), {
            OFlags::APPEND | OFlags::TRUNC | OFlags::EXCL | OFlags::SYNC | OFlags::DSYNC
        });
    }

    #[test]
    fn writes_counts_truncating_and_appending_as_writing() {
        assert!(!writes(OFlags::RDONLY));
        assert!(writes(OFlags::WRONLY));
        assert!(writes(OFlags::RDWR));
        assert!(writes(OFlags::RDONLY | OFlags::TRUNC));
        assert!(writes(OFlags::RDONLY | OFlags::APPEND));
    }

    #[test]
    fn a_file_handle_never_opened_or_released_names_nothing() {
        let s = scratch();
        let t = &s.tree;
        let (_, _, handle) = t
            .create(t.root(), b"f", 0o644, 0, raw(OFlags::RDWR))
            .unwrap();
        t.write(handle, 0, b"data").unwrap();
        t.release(handle);
        let mut buf = Vec::new();
        for bad in [0, handle, handle + 1, u64::MAX] {
            assert_eq!(t.read(bad, 0, 4, &mut buf).unwrap_err(), Errno::BADF);
            assert_eq!(t.write(bad, 0, b"x").unwrap_err(), Errno::BADF);
            assert_eq!(t.fsync(bad, true).unwrap_err(), Errno::BADF);
            assert_eq!(t.fallocate(bad, 0, 1, 0).unwrap_err(), Errno::BADF);
            assert_eq!(t.file(bad).unwrap_err(), Errno::BADF);
        }
        // Releasing again is harmless, and the file kept what was written.
        t.release(handle);
        assert_eq!(std::fs::read(s.host.join("f")).unwrap(), b"data");
    }

    #[test]
    fn a_read_past_the_end_is_empty_and_one_at_the_largest_offset_fails() {
        let s = scratch();
        let t = &s.tree;
        let (ino, _, handle) = t
            .create(t.root(), b"f", 0o644, 0, raw(OFlags::WRONLY))
            .unwrap();
        assert_eq!(t.write(handle, 0, b"0123456789").unwrap(), 10);
        t.release(handle);
        let opened = t.open(ino, raw(OFlags::RDONLY)).unwrap();
        assert_eq!(opened.size, 10);
        let mut buf = b"stale".to_vec();
        t.read(opened.handle, 8, 100, &mut buf).unwrap();
        assert_eq!(buf, b"89");
        t.read(opened.handle, 10, 100, &mut buf).unwrap();
        assert!(buf.is_empty());
        t.read(opened.handle, 1 << 40, 100, &mut buf).unwrap();
        assert!(buf.is_empty());
        // An offset the kernel cannot represent is refused, not wrapped.
        assert!(t.read(opened.handle, u64::MAX, 100, &mut buf).is_err());
        assert!(buf.is_empty());
        // Reading through a descriptor opened read-only writes nothing.
        assert_eq!(t.write(opened.handle, 0, b"x").unwrap_err(), Errno::BADF);
        let fd = t.file(opened.handle).unwrap();
        assert_eq!(rustix::fs::fstat(fd.as_fd()).unwrap().st_size, 10);
    }

    #[test]
    fn a_write_at_an_offset_past_the_largest_file_writes_nothing() {
        let s = scratch();
        let t = &s.tree;
        let (_, _, handle) = t
            .create(t.root(), b"f", 0o644, 0, raw(OFlags::RDWR))
            .unwrap();
        assert!(t.write(handle, u64::MAX - 1, b"xy").is_err());
        assert!(t.write(handle, 1 << 63, b"xy").is_err());
        assert_eq!(std::fs::metadata(s.host.join("f")).unwrap().len(), 0);
    }

    #[test]
    fn fallocate_refuses_a_mode_it_does_not_know() {
        let s = scratch();
        let t = &s.tree;
        let (_, _, handle) = t
            .create(t.root(), b"f", 0o644, 0, raw(OFlags::RDWR))
            .unwrap();
        assert_eq!(
            t.fallocate(handle, 0, 4096, 1 << 30).unwrap_err(),
            Errno::OPNOTSUPP
        );
        assert_eq!(std::fs::metadata(s.host.join("f")).unwrap().len(), 0);
    }
}
