//! The merged workspace the sandbox sees: the host workspace and the
//! Domain's isolated directory, routed path by path.
//!
//! Owns every operation the Workspace Router performs on the two
//! directories. Each one reaches its object through a directory
//! descriptor of one side and a path resolved beneath it with no symbolic
//! link, magic link or mount crossing, and acts on the last component with
//! a `*at` call that does not follow it, so nothing the sandbox plants (a
//! link, a rename race) can point the router outside the two trees. The
//! routing and protection decisions come from the [`Classifier`]; the
//! kernel's answer for the chosen side is the only other input. Modes the
//! sandbox sets lose setuid, setgid and group and other write bits (a
//! directory keeps a setgid bit it has), and the router creates no device
//! node and sets no extended attribute.
//!
//! This module holds the [`Tree`] and its locks; each operation lives in
//! the module that owns its part:
//! - `path`: the sandbox's names and the paths joined from them;
//! - `sides`: the two sides' directories, reached beneath their roots;
//! - `routing`: which side a name's entry is on, and where a new one goes;
//! - `inodes`: lookups and the inode table's records;
//! - `handles`: the open-handle tables;
//! - `attrs`: attributes; `files`: open files, reads and writes;
//! - `listing`: directory listings;
//! - `create`, `remove`, `rename`: changes to names.
//!
//! Trusts the supervisor's descriptors and the rules it was given; trusts
//! nothing the sandbox sends beyond the fact that it asked: every FUSE
//! request (its inode and handle numbers, names, offsets, modes and flags)
//! is the sandbox's.

mod attrs;
mod create;
mod files;
mod handles;
mod inodes;
mod listing;
mod path;
mod remove;
mod rename;
mod routing;
mod sides;

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::RwLock;

use lazaret_routing::classify::{Classifier, Protection, Route};
use rustix::fs::{FileType, Stat, StatVfs};
use rustix::io::Errno;

pub use self::attrs::{SetAttr, SetTime};
pub use self::files::Opened;
use self::handles::Handles;
pub use self::listing::{DirEntry, Listing};
use crate::nodes::{Kind, Node, Nodes, ROOT};

/// Every operation's result: the errno the sandbox sees on failure.
pub type Result<T> = std::result::Result<T, Errno>;

/// The mode bits the sandbox may set: no setuid, setgid or sticky bit, no
/// group or other write permission.
pub const MODE_MASK: u32 = 0o755;

/// The error a protected path gives.
pub const PROTECTED: Errno = Errno::ROFS;

/// How many entries a directory rename may look at before it is refused
/// rather than checked further.
pub const RECLASSIFY_LIMIT: usize = 100_000;

/// The kind of an object from its mode.
pub fn kind_of(stat: &Stat) -> Kind {
    match FileType::from_raw_mode(stat.st_mode) {
        FileType::Directory => Kind::Dir,
        FileType::RegularFile => Kind::File,
        FileType::Symlink => Kind::Symlink,
        _ => Kind::Special,
    }
}

/// The merged workspace.
#[derive(Debug)]
pub struct Tree {
    host: OwnedFd,
    isolated: OwnedFd,
    classifier: Classifier,
    nodes: RwLock<Nodes>,
    files: Handles<OwnedFd>,
    dirs: Handles<Listing>,
    /// The router's own uid: the invoking user's, in the Domain user
    /// namespace.
    owner: u32,
    /// Held for writing across every change to names (create, link,
    /// remove, rename), from its checks to its effect, so that no other
    /// request of the sandbox can swap a name between the two; held for
    /// reading across every lookup, from finding a name to recording its
    /// node, so that no node is recorded with what a name was before a
    /// change.
    names: RwLock<()>,
}

impl Tree {
    /// The tree over `host` (the workspace) and `isolated` (the Domain's
    /// isolated directory), routed by `classifier`.
    pub fn new(host: OwnedFd, isolated: OwnedFd, classifier: Classifier) -> Result<Self> {
        let state = classifier.root();
        let root = Node::new(
            Vec::new(),
            Route::Host,
            Kind::Dir,
            Some(state),
            Protection::Fixed,
        );
        for dir in [&host, &isolated] {
            if kind_of(&rustix::fs::fstat(dir)?) != Kind::Dir {
                return Err(Errno::NOTDIR);
            }
        }
        Ok(Tree {
            host,
            isolated,
            classifier,
            nodes: RwLock::new(Nodes::new(root)),
            files: Handles::new(),
            dirs: Handles::new(),
            owner: rustix::process::geteuid().as_raw(),
            names: RwLock::new(()),
        })
    }

    fn side(&self, route: Route) -> BorrowedFd<'_> {
        match route {
            Route::Host => self.host.as_fd(),
            Route::Isolated => self.isolated.as_fd(),
        }
    }

    fn lock_names(&self) -> std::sync::RwLockWriteGuard<'_, ()> {
        self.names.write().unwrap_or_else(|e| e.into_inner())
    }

    fn read_names(&self) -> std::sync::RwLockReadGuard<'_, ()> {
        self.names.read().unwrap_or_else(|e| e.into_inner())
    }

    /// `statfs`: the host workspace's filesystem.
    pub fn statfs(&self) -> Result<StatVfs> {
        rustix::fs::fstatvfs(&self.host)
    }

    /// `access`: only writing to a protected path is refused here; the
    /// sandbox's kernel checks modes itself.
    pub fn access(&self, ino: u64, write: bool) -> Result<()> {
        let node = self.node(ino)?;
        if write && node.protection.is_pinned() {
            return Err(PROTECTED);
        }
        Ok(())
    }

    /// The root's inode number.
    pub fn root(&self) -> u64 {
        ROOT
    }
}

/// A tree over two scratch directories, for the modules' tests: no FUSE,
/// no privileges.
#[cfg(test)]
mod testing {
    use std::os::fd::OwnedFd;
    use std::path::{Path, PathBuf};

    use lazaret_proto::router::WorkspaceRules;
    use lazaret_routing::classify::Classifier;
    use rustix::fs::{Mode, OFlags};

    use super::Tree;

    /// The two sides, on disk, and the tree over them.
    pub(super) struct Scratch {
        _dir: tempfile::TempDir,
        pub(super) host: PathBuf,
        pub(super) isolated: PathBuf,
        pub(super) tree: Tree,
    }

    /// A tree with rules that route everything to the host.
    pub(super) fn scratch() -> Scratch {
        let dir = tempfile::tempdir().unwrap();
        let host = dir.path().join("host");
        let isolated = dir.path().join("isolated");
        std::fs::create_dir(&host).unwrap();
        std::fs::create_dir(&isolated).unwrap();
        let open = |p: &Path| -> OwnedFd {
            rustix::fs::open(
                p,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .unwrap()
        };
        let rules = WorkspaceRules {
            isolate_ignored: false,
            global_excludes: Vec::new(),
            scopes: Vec::new(),
            read_only: Vec::new(),
            read_only_prefixes: Vec::new(),
            git_dirs: Vec::new(),
            kept_isolated: Vec::new(),
        };
        let tree = Tree::new(open(&host), open(&isolated), Classifier::new(&rules)).unwrap();
        Scratch {
            _dir: dir,
            host,
            isolated,
            tree,
        }
    }

    /// The entries of a directory on disk, sorted.
    pub(super) fn names(dir: &Path) -> Vec<Vec<u8>> {
        use std::os::unix::ffi::OsStrExt;
        let mut names: Vec<Vec<u8>> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().as_bytes().to_vec())
            .collect();
        names.sort();
        names
    }
}
