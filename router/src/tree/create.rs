//! New entries: `mknod`, `mkdir`, `symlink`, `create` and `link`.
//!
//! Owns making an entry where the routing decisions put it, under the
//! lock on names, with the sandbox's mode masked (no setuid, setgid or
//! sticky bit, no group or other write), and no device node ever. A link
//! stays on its side (`EXDEV`), and git metadata holds no link, FIFO or
//! socket. Trusts nothing in a request: the name is checked when the new
//! entry is planned, and the kernel makes it on one side's directory.

use std::os::fd::OwnedFd;

use lazaret_routing::classify::Protection;
use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;

use super::files::open_flags;
use super::path::os;
use super::routing::refuse_special_in_git;
use super::{MODE_MASK, PROTECTED, Result, Tree, kind_of};
use crate::nodes::Kind;

impl Tree {
    /// Makes the entry `name` of directory `parent` with `make` (given the
    /// directory it goes in), after the checks every creation shares; git
    /// metadata refuses it when it is a `special` kind.
    fn make(
        &self,
        parent: u64,
        name: &[u8],
        is_dir: bool,
        special: Option<Kind>,
        make: impl FnOnce(&OwnedFd) -> Result<()>,
    ) -> Result<(u64, Stat)> {
        let _names = self.lock_names();
        let (node, state) = self.dir_node(parent)?;
        if let Some(kind) = special {
            refuse_special_in_git(&state, kind)?;
        }
        let mut plan = self.plan(&node, &state, name, is_dir)?;
        let dir = self.target_dir(&mut plan, &node.path)?;
        make(&dir)?;
        let stat = rustix::fs::statat(&dir, os(name), AtFlags::SYMLINK_NOFOLLOW)?;
        Ok(self.made(plan, stat))
    }

    /// `mknod`: regular files, FIFOs and sockets; never a device.
    pub fn mknod(&self, parent: u64, name: &[u8], mode: u32, umask: u32) -> Result<(u64, Stat)> {
        let file_type = FileType::from_raw_mode(mode);
        if !matches!(
            file_type,
            FileType::RegularFile | FileType::Fifo | FileType::Socket
        ) {
            return Err(Errno::PERM);
        }
        let special = (file_type != FileType::RegularFile).then_some(Kind::Special);
        let perm = Mode::from_raw_mode(mode & !umask & MODE_MASK);
        self.make(parent, name, false, special, |dir| {
            rustix::fs::mknodat(dir, os(name), file_type, perm, 0)
        })
    }

    /// `mkdir`.
    pub fn mkdir(&self, parent: u64, name: &[u8], mode: u32, umask: u32) -> Result<(u64, Stat)> {
        let perm = Mode::from_raw_mode(mode & !umask & MODE_MASK);
        self.make(parent, name, true, None, |dir| {
            rustix::fs::mkdirat(dir, os(name), perm)
        })
    }

    /// `symlink`.
    pub fn symlink(&self, parent: u64, name: &[u8], target: &[u8]) -> Result<(u64, Stat)> {
        self.make(parent, name, false, Some(Kind::Symlink), |dir| {
            rustix::fs::symlinkat(os(target), dir, os(name))
        })
    }

    /// `create`: a new regular file, opened.
    pub fn create(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> Result<(u64, Stat, u64)> {
        let _names = self.lock_names();
        let (node, state) = self.dir_node(parent)?;
        let mut plan = self.plan(&node, &state, name, false)?;
        let dir = self.target_dir(&mut plan, &node.path)?;
        let fd = rustix::fs::openat(
            &dir,
            os(name),
            open_flags(flags)
                | OFlags::CREATE
                | OFlags::NOFOLLOW
                | OFlags::NONBLOCK
                | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode & !umask & MODE_MASK),
        )?;
        let stat = rustix::fs::fstat(&fd)?;
        if kind_of(&stat) != Kind::File {
            return Err(Errno::INVAL);
        }
        let (ino, stat) = self.made(plan, stat);
        Ok((ino, stat, self.keep_file(fd)))
    }

    /// `link`: a new name for a file, on the same side only.
    pub fn link(&self, ino: u64, parent: u64, name: &[u8]) -> Result<(u64, Stat)> {
        let _names = self.lock_names();
        let node = self.node(ino)?;
        if node.protection != Protection::None {
            return Err(PROTECTED);
        }
        if node.kind == Kind::Dir {
            return Err(Errno::PERM);
        }
        let (dir_node, state) = self.dir_node(parent)?;
        refuse_special_in_git(&state, node.kind)?;
        let mut plan = self.plan(&dir_node, &state, name, false)?;
        if plan.route != node.route {
            return Err(Errno::XDEV);
        }
        let source = self.entry(&node)?;
        let dir = self.target_dir(&mut plan, &dir_node.path)?;
        rustix::fs::linkat(
            &source.dir,
            os(&source.name),
            &dir,
            os(name),
            AtFlags::empty(),
        )?;
        let stat = rustix::fs::statat(&dir, os(name), AtFlags::SYMLINK_NOFOLLOW)?;
        Ok(self.made(plan, stat))
    }
}
