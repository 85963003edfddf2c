//! The two sides' directories: the host workspace and the Domain's
//! isolated directory, reached beneath their roots.
//!
//! Owns every path resolution the tree makes: a directory of one side is
//! opened with its path resolved beneath that side's descriptor with no
//! symbolic link, magic link or mount crossing
//! (`lazaret_hostfs::beneath::open_dir`), and an object in it is reached by its
//! last component with a `*at` call that does not follow it. Also owns the
//! isolated side's directories made on demand (mode 0700) and the reading
//! of a directory's entries. Trusts the two descriptors the supervisor
//! gave and nothing in a path: each path is made of names the sandbox
//! sent.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use lazaret_routing::classify::{DirState, Route};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;

use super::path::{os, split};
use super::{Result, Tree};
use crate::nodes::{Kind, Node};

impl Tree {
    /// Opens the directory `path` of one side.
    pub(super) fn open_dir(&self, route: Route, path: &[u8], flags: OFlags) -> Result<OwnedFd> {
        lazaret_hostfs::beneath::open_dir(self.side(route), path, flags)
    }

    /// Opens the isolated side's directory `path`, if there is one.
    pub(super) fn isolated_dir_if_any(
        &self,
        path: &[u8],
        flags: OFlags,
    ) -> Result<Option<OwnedFd>> {
        match self.open_dir(Route::Isolated, path, flags) {
            Ok(fd) => Ok(Some(fd)),
            Err(Errno::NOENT | Errno::NOTDIR) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Opens the isolated directory `path`, creating it and its parents
    /// (mode 0700) as needed.
    pub(super) fn isolated_dir(&self, path: &[u8]) -> Result<OwnedFd> {
        match self.open_dir(Route::Isolated, path, OFlags::PATH) {
            Err(Errno::NOENT) => {}
            other => return other,
        }
        let mut dir = self.open_dir(Route::Isolated, b"", OFlags::PATH)?;
        for component in path.split(|b| *b == b'/').filter(|c| !c.is_empty()) {
            match rustix::fs::mkdirat(&dir, os(component), Mode::from_raw_mode(0o700)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => return Err(e),
            }
            dir = lazaret_hostfs::beneath::open_dir(dir.as_fd(), component, OFlags::PATH)?;
        }
        Ok(dir)
    }

    /// A node's parent directory and name; the root is `.` of its side. A
    /// removed node has none: its path names something else now.
    pub(super) fn entry(&self, node: &Node) -> Result<Entry> {
        if node.removed {
            return Err(Errno::STALE);
        }
        if node.path.is_empty() {
            return Ok(Entry {
                dir: self.open_dir(Route::Host, b"", OFlags::PATH)?,
                name: b".".to_vec(),
            });
        }
        let (parent, name) = split(&node.path);
        Ok(Entry {
            dir: self.open_dir(node.route, parent, OFlags::PATH)?,
            name: name.to_vec(),
        })
    }

    pub(super) fn exists_at(dir: BorrowedFd<'_>, name: &[u8]) -> Result<Option<Stat>> {
        match rustix::fs::statat(dir, os(name), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => Ok(Some(stat)),
            Err(Errno::NOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// The two sides' directories of one merged directory: the host's opened
/// at once (none for an isolated directory), the isolated side's when
/// first needed (none where it does not exist).
pub(super) struct Sides {
    pub(super) host: Option<OwnedFd>,
    pub(super) isolated: Option<Option<OwnedFd>>,
}

impl Sides {
    pub(super) fn new(tree: &Tree, dir_path: &[u8], dir: &DirState) -> Result<Self> {
        let host = if dir.is_isolated() {
            None
        } else {
            Some(tree.open_dir(Route::Host, dir_path, OFlags::PATH)?)
        };
        Ok(Sides {
            host,
            isolated: None,
        })
    }

    pub(super) fn isolated(
        &mut self,
        tree: &Tree,
        dir_path: &[u8],
    ) -> Result<Option<BorrowedFd<'_>>> {
        if self.isolated.is_none() {
            self.isolated = Some(tree.isolated_dir_if_any(dir_path, OFlags::PATH)?);
        }
        Ok(self
            .isolated
            .as_ref()
            .and_then(Option::as_ref)
            .map(AsFd::as_fd))
    }
}

/// What a node's parent directory and name are, for `*at` calls.
pub(super) struct Entry {
    pub(super) dir: OwnedFd,
    pub(super) name: Vec<u8>,
}

/// One entry of a listed directory: its name, kind and inode number.
pub(super) type Listed = (Vec<u8>, Kind, u64);

/// The entries of a directory opened for reading: name, kind, inode.
pub(super) fn list(dir: BorrowedFd<'_>) -> Result<Vec<Listed>> {
    let listed = lazaret_hostfs::beneath::list(dir).map_err(io_errno)?;
    Ok(listed
        .into_iter()
        .map(|entry| {
            let kind = match entry.file_type {
                FileType::Directory => Kind::Dir,
                FileType::RegularFile => Kind::File,
                FileType::Symlink => Kind::Symlink,
                _ => Kind::Special,
            };
            (entry.name, kind, entry.ino)
        })
        .collect())
}

/// The errno of an I/O error (`EIO` when it carries none).
pub(super) fn io_errno(error: std::io::Error) -> Errno {
    Errno::from_io_error(&error).unwrap_or(Errno::IO)
}
