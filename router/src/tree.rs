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
//! Trusts the supervisor's descriptors and the rules it was given; trusts
//! nothing the sandbox sends beyond the fact that it asked.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use lazaret_routing::classify::{
    Classifier, DirState, HEAD_NAME, HostFacts, Protection, Route, join, needs_head,
};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags, Stat, StatVfs, Timestamps};
use rustix::io::Errno;

use crate::nodes::{Kind, Node, Nodes, ROOT};

/// Every operation's result: the errno the sandbox sees on failure.
pub type Result<T> = std::result::Result<T, Errno>;

/// The mode bits the sandbox may set: no setuid, setgid or sticky bit, no
/// group or other write permission.
pub const MODE_MASK: u32 = 0o755;

/// The setgid bit, which a directory keeps (see [`masked`]).
const SETGID: u32 = 0o2000;

/// The error a protected path gives.
pub const PROTECTED: Errno = Errno::ROFS;

/// How many entries a directory rename may look at before it is refused
/// rather than checked further.
pub const RECLASSIFY_LIMIT: usize = 100_000;

/// `dir` joined with a relative path that may be empty.
fn join_rel(dir: &[u8], rel: &[u8]) -> Vec<u8> {
    if rel.is_empty() {
        dir.to_vec()
    } else {
        join(dir, rel)
    }
}

fn os(bytes: &[u8]) -> &OsStr {
    OsStr::from_bytes(bytes)
}

/// The kind of an object from its mode.
pub fn kind_of(stat: &Stat) -> Kind {
    match FileType::from_raw_mode(stat.st_mode) {
        FileType::Directory => Kind::Dir,
        FileType::RegularFile => Kind::File,
        FileType::Symlink => Kind::Symlink,
        _ => Kind::Special,
    }
}

/// The open flags the router passes on: the access mode and the flags
/// that change how data is written; never one that changes what is opened.
fn open_flags(flags: i32) -> OFlags {
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

/// One entry of a directory listing.
#[derive(Clone, Debug)]
pub struct DirEntry {
    /// Its name.
    pub name: Vec<u8>,
    /// Its kind.
    pub kind: Kind,
    /// An inode number for `d_ino` (never 0).
    pub ino: u64,
}

/// A regular file `open` opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Opened {
    /// Its handle, until `release`.
    pub handle: u64,
    /// Its size when it was opened.
    pub size: u64,
}

/// A directory's entries, as listed when it was opened.
#[derive(Debug)]
pub struct Listing {
    /// Its visible entries.
    pub entries: Vec<DirEntry>,
    /// Whether a read from its start has used it.
    read: std::sync::atomic::AtomicBool,
}

/// A visible entry found by name.
#[derive(Debug)]
struct Found {
    path: Vec<u8>,
    route: Route,
    stat: Stat,
    kind: Kind,
    state: Option<DirState>,
    protection: Protection,
}

impl Found {
    fn node(&self) -> Node {
        Node::new(
            self.path.clone(),
            self.route,
            self.kind,
            self.state.clone(),
            self.protection,
        )
    }
}

/// The two sides' directories of one merged directory: the host's opened
/// at once (none for an isolated directory), the isolated side's when
/// first needed (none where it does not exist).
struct Sides {
    host: Option<OwnedFd>,
    isolated: Option<Option<OwnedFd>>,
}

impl Sides {
    fn new(tree: &Tree, dir_path: &[u8], dir: &DirState) -> Result<Self> {
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

    fn isolated(&mut self, tree: &Tree, dir_path: &[u8]) -> Result<Option<BorrowedFd<'_>>> {
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

/// Where a new entry goes.
#[derive(Debug)]
struct Plan {
    path: Vec<u8>,
    route: Route,
    state: DirState,
    protection: Protection,
    /// The host side's parent directory, as opened to plan.
    host_dir: Option<OwnedFd>,
}

/// What a node's parent directory and name are, for `*at` calls.
struct Entry {
    dir: OwnedFd,
    name: Vec<u8>,
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

/// Open files or directories by handle number.
#[derive(Debug)]
struct Handles<T> {
    open: Mutex<HashMap<u64, Arc<T>>>,
    next: AtomicU64,
}

impl<T> Handles<T> {
    fn new() -> Self {
        Handles {
            open: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<T>>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `value`; returns its handle.
    fn insert(&self, value: T) -> u64 {
        let handle = self.next.fetch_add(1, Ordering::Relaxed);
        self.table().insert(handle, Arc::new(value));
        handle
    }

    /// What `handle` names.
    fn get(&self, handle: u64) -> Result<Arc<T>> {
        self.table().get(&handle).cloned().ok_or(Errno::BADF)
    }

    /// Puts `value` in place of what `handle` names.
    fn replace(&self, handle: u64, value: T) -> Result<()> {
        match self.table().get_mut(&handle) {
            Some(slot) => {
                *slot = Arc::new(value);
                Ok(())
            }
            None => Err(Errno::BADF),
        }
    }

    /// Forgets `handle`.
    fn remove(&self, handle: u64) {
        self.table().remove(&handle);
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

    fn node(&self, ino: u64) -> Result<Node> {
        self.nodes
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(ino)
            .cloned()
            .ok_or(Errno::STALE)
    }

    /// The node of a directory and its state. A removed directory's
    /// path may name another object now: it has no entries (`ENOENT` to
    /// any lookup or creation in it, as for a removed directory on disk).
    fn dir_node(&self, ino: u64) -> Result<(Node, DirState)> {
        let node = self.node(ino)?;
        let state = node.state.clone().ok_or(Errno::NOTDIR)?;
        if node.removed {
            return Err(Errno::NOENT);
        }
        Ok((node, state))
    }

    /// Opens the directory `path` of one side.
    fn open_dir(&self, route: Route, path: &[u8], flags: OFlags) -> Result<OwnedFd> {
        lazaret_hostfs::beneath::open_dir(self.side(route), path, flags)
    }

    /// Opens the isolated side's directory `path`, if there is one.
    fn isolated_dir_if_any(&self, path: &[u8], flags: OFlags) -> Result<Option<OwnedFd>> {
        match self.open_dir(Route::Isolated, path, flags) {
            Ok(fd) => Ok(Some(fd)),
            Err(Errno::NOENT | Errno::NOTDIR) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Opens the isolated directory `path`, creating it and its parents
    /// (mode 0700) as needed.
    fn isolated_dir(&self, path: &[u8]) -> Result<OwnedFd> {
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

    /// The directory to create an entry of `route` in.
    fn target_dir(&self, plan: &mut Plan, path: &[u8]) -> Result<OwnedFd> {
        match plan.route {
            Route::Host => match plan.host_dir.take() {
                Some(dir) => Ok(dir),
                None => self.open_dir(Route::Host, path, OFlags::PATH),
            },
            Route::Isolated => self.isolated_dir(path),
        }
    }

    /// A node's parent directory and name; the root is `.` of its side. A
    /// removed node has none: its path names something else now.
    fn entry(&self, node: &Node) -> Result<Entry> {
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

    fn exists_at(dir: BorrowedFd<'_>, name: &[u8]) -> Result<Option<Stat>> {
        match rustix::fs::statat(dir, os(name), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => Ok(Some(stat)),
            Err(Errno::NOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// What the host has around `name` in `host_dir`.
    fn facts(host_dir: Option<BorrowedFd<'_>>, name: &[u8], exists: bool) -> Result<HostFacts> {
        let dir_holds_head = match host_dir {
            Some(dir) if needs_head(name) => Self::exists_at(dir, HEAD_NAME)?.is_some(),
            _ => false,
        };
        Ok(HostFacts {
            exists,
            dir_holds_head,
        })
    }

    /// The visible entry `name` of the directory at `dir_path`.
    fn find(&self, dir_path: &[u8], dir: &DirState, name: &[u8]) -> Result<Option<Found>> {
        let mut sides = Sides::new(self, dir_path, dir)?;
        self.find_in(&mut sides, dir_path, dir, name)
    }

    /// [`find`](Self::find) in a directory whose sides are open.
    fn find_in(
        &self,
        sides: &mut Sides,
        dir_path: &[u8],
        dir: &DirState,
        name: &[u8],
    ) -> Result<Option<Found>> {
        let path = join(dir_path, name);
        let host_stat = match &sides.host {
            Some(fd) => Self::exists_at(fd.as_fd(), name)?,
            None => None,
        };
        let facts = Self::facts(
            sides.host.as_ref().map(AsFd::as_fd),
            name,
            host_stat.is_some(),
        )?;
        if let Some(stat) = host_stat {
            let kind = kind_of(&stat);
            let (route, state, protection) =
                self.classifier
                    .entry(dir, dir_path, name, kind == Kind::Dir, facts);
            if route == Route::Host {
                return Ok(Some(Found {
                    path,
                    route,
                    stat,
                    kind,
                    state: (kind == Kind::Dir).then_some(state),
                    protection,
                }));
            }
        }
        let Some(isolated_dir) = sides.isolated(self, dir_path)? else {
            return Ok(None);
        };
        let Some(stat) = Self::exists_at(isolated_dir, name)? else {
            return Ok(None);
        };
        let kind = kind_of(&stat);
        let (route, state) = self
            .classifier
            .child(dir, dir_path, name, kind == Kind::Dir, facts);
        if route != Route::Isolated {
            // Kept from an earlier generation whose rules isolated it.
            return Ok(None);
        }
        Ok(Some(Found {
            path,
            route,
            stat,
            kind,
            state: (kind == Kind::Dir).then_some(state),
            protection: Protection::None,
        }))
    }

    /// Where a new entry `name` of the directory `parent` goes; refuses a
    /// protected position.
    fn plan(&self, parent: &Node, dir: &DirState, name: &[u8], is_dir: bool) -> Result<Plan> {
        if name.is_empty() || name.contains(&b'/') || name == b"." || name == b".." {
            return Err(Errno::INVAL);
        }
        if dir.is_read_only() {
            return Err(PROTECTED);
        }
        let host_dir = if dir.is_isolated() {
            None
        } else {
            Some(self.open_dir(Route::Host, &parent.path, OFlags::PATH)?)
        };
        let exists = match &host_dir {
            Some(fd) => Self::exists_at(fd.as_fd(), name)?.is_some(),
            None => false,
        };
        let facts = Self::facts(host_dir.as_ref().map(AsFd::as_fd), name, exists)?;
        let (route, state, protection) =
            self.classifier
                .entry(dir, &parent.path, name, is_dir, facts);
        if protection.is_pinned() {
            return Err(PROTECTED);
        }
        Ok(Plan {
            path: join(&parent.path, name),
            route,
            state,
            protection,
            host_dir,
        })
    }

    fn register(&self, found: &Found) -> u64 {
        self.nodes
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .lookup(found.node())
    }

    /// Registers a newly made entry and returns its number and attributes.
    fn made(&self, plan: Plan, stat: Stat) -> (u64, Stat) {
        let kind = kind_of(&stat);
        let found = Found {
            path: plan.path,
            route: plan.route,
            stat,
            kind,
            state: (kind == Kind::Dir).then_some(plan.state),
            protection: plan.protection,
        };
        (self.register(&found), stat)
    }

    /// `lookup`: the entry `name` of directory `parent`.
    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<(u64, Stat)> {
        let _names = self.read_names();
        let (node, state) = self.dir_node(parent)?;
        let found = self.find(&node.path, &state, name)?.ok_or(Errno::NOENT)?;
        Ok((self.register(&found), found.stat))
    }

    /// `forget`: the kernel drops `count` lookups of `ino`.
    pub fn forget(&self, ino: u64, count: u64) {
        self.nodes
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .forget(ino, count);
    }

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

    /// `unlink` and `rmdir`.
    pub fn remove(&self, parent: u64, name: &[u8], dir: bool) -> Result<()> {
        let _names = self.lock_names();
        let (node, state) = self.dir_node(parent)?;
        let found = self.find(&node.path, &state, name)?.ok_or(Errno::NOENT)?;
        match (dir, found.kind == Kind::Dir) {
            (false, true) => return Err(Errno::ISDIR),
            (true, false) => return Err(Errno::NOTDIR),
            _ => {}
        }
        if found.protection.is_pinned() {
            return Err(PROTECTED);
        }
        if let (true, Route::Host, Some(state)) = (dir, found.route, &found.state) {
            if !self.isolated_entries(&found.path, state, None)?.is_empty() {
                return Err(Errno::NOTEMPTY);
            }
        }
        let parent_dir = self.open_dir(found.route, &node.path, OFlags::PATH)?;
        let flags = if dir {
            AtFlags::REMOVEDIR
        } else {
            AtFlags::empty()
        };
        rustix::fs::unlinkat(&parent_dir, os(name), flags)?;
        if dir && found.route == Route::Host {
            // The isolated side's directory of the same path holds nothing
            // visible; remove it if it holds nothing at all.
            if let Ok(shadow) = self.open_dir(Route::Isolated, &node.path, OFlags::PATH) {
                let _ = rustix::fs::unlinkat(&shadow, os(name), AtFlags::REMOVEDIR);
            }
        }
        self.nodes
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .unlink(&found.path);
        Ok(())
    }

    /// `rename`. `RENAME_EXCHANGE` is refused: each side of an exchange
    /// would need both checks in both directions.
    pub fn rename(
        &self,
        parent: u64,
        name: &[u8],
        new_parent: u64,
        new_name: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        if flags.intersects(RenameFlags::EXCHANGE | RenameFlags::WHITEOUT) {
            return Err(Errno::INVAL);
        }
        let _names = self.lock_names();
        let (from_dir, from_state) = self.dir_node(parent)?;
        let (to_dir, to_state) = self.dir_node(new_parent)?;
        let source = self
            .find(&from_dir.path, &from_state, name)?
            .ok_or(Errno::NOENT)?;
        let is_dir = source.kind == Kind::Dir;
        if source.protection.is_pinned() || (is_dir && source.protection == Protection::Unmovable) {
            return Err(PROTECTED);
        }
        refuse_special_in_git(&to_state, source.kind)?;
        let mut plan = self.plan(&to_dir, &to_state, new_name, is_dir)?;
        if is_dir && plan.protection == Protection::Unmovable {
            return Err(PROTECTED);
        }
        if source.path == plan.path {
            return Ok(());
        }
        // A visible entry already at the target on the other side cannot
        // be replaced from this one.
        if let Some(existing) = self.find(&to_dir.path, &to_state, new_name)? {
            if existing.protection.is_pinned() {
                return Err(PROTECTED);
            }
            if existing.route != plan.route {
                return Err(Errno::XDEV);
            }
        }
        if is_dir && source.route == Route::Host {
            self.check_move(&source, &plan)?;
        }
        let from = self.open_dir(source.route, &from_dir.path, OFlags::PATH)?;
        let to = self.target_dir(&mut plan, &to_dir.path)?;
        if source.route != plan.route {
            if is_dir {
                return Err(Errno::XDEV);
            }
            move_across(&from, name, &to, new_name, source.kind, flags)?;
        } else if is_dir && source.route == Route::Host {
            let isolated = self.move_isolated_dir(&source.path, &plan.path)?;
            if let Err(e) = rustix::fs::renameat_with(&from, os(name), &to, os(new_name), flags) {
                if isolated {
                    let _ = self.move_isolated_dir(&plan.path, &source.path);
                }
                return Err(e);
            }
        } else {
            rustix::fs::renameat_with(&from, os(name), &to, os(new_name), flags)?;
        }
        self.moved(&source.path, &plan);
        Ok(())
    }

    /// Whether the host directory `source` may move to `plan`. Not when
    /// it holds a git directory of the host at any depth (a submodule's
    /// `.git` file, a nested repository's `.git`), which would no longer
    /// work where it went (`EROFS`: a directory cannot be moved whole to
    /// a place its `.git` file does not name). Not, either, when an entry
    /// beneath it would be seen on another side at its new place (a host
    /// file its rules hide would show, an isolated one vanish: the rules
    /// are the paths'), nor to the other side (`EXDEV`: `mv` then copies
    /// what the sandbox sees instead, which leaves a `.git` in place). Both
    /// classifications are walked together over what both sides hold;
    /// more than [`RECLASSIFY_LIMIT`] entries count as a change.
    fn check_move(&self, source: &Found, plan: &Plan) -> Result<()> {
        let Some(old) = source.state.clone() else {
            return Ok(());
        };
        let mut reclassified = source.route != plan.route;
        let mut pending = vec![(Vec::new(), old, plan.state.clone())];
        let mut seen = 0usize;
        while let Some((rel, old, new)) = pending.pop() {
            let old_path = join_rel(&source.path, &rel);
            let new_path = join_rel(&plan.path, &rel);
            let host = match self.open_dir(Route::Host, &old_path, OFlags::RDONLY) {
                Ok(fd) => list(fd.as_fd())?,
                Err(Errno::NOENT | Errno::NOTDIR) => Vec::new(),
                Err(e) => return Err(e),
            };
            let isolated = match self.isolated_dir_if_any(&old_path, OFlags::RDONLY)? {
                Some(fd) => list(fd.as_fd())?,
                None => Vec::new(),
            };
            let host_listing = HostListing::new(&host);
            let entries = host
                .iter()
                .map(|e| (e, Route::Host))
                .chain(isolated.iter().map(|e| (e, Route::Isolated)));
            for ((name, kind, _), side) in entries {
                seen += 1;
                if seen > RECLASSIFY_LIMIT {
                    return Err(Errno::XDEV);
                }
                let is_dir = *kind == Kind::Dir;
                let facts = host_listing.facts(name);
                let (before, old_child) =
                    self.classifier.child(&old, &old_path, name, is_dir, facts);
                // The host made it (the sandbox's `.git` is isolated).
                let git_dir = side == Route::Host
                    && before == Route::Host
                    && old_child.is_git_metadata()
                    && !old.is_git_metadata();
                if git_dir {
                    return Err(PROTECTED);
                }
                let (after, new_child) =
                    self.classifier.child(&new, &new_path, name, is_dir, facts);
                if (before == side) != (after == side) {
                    reclassified = true;
                }
                let inside_git = old_child.is_git_metadata() && new_child.is_git_metadata();
                if is_dir && before == side && !inside_git {
                    pending.push((join_rel(&rel, name), old_child, new_child));
                }
            }
        }
        if reclassified {
            Err(Errno::XDEV)
        } else {
            Ok(())
        }
    }

    /// Moves the isolated side's directory of a host directory being
    /// renamed with it, so its isolated entries stay beneath it; refuses
    /// (`EXDEV`) to merge into one already at the target. Returns whether
    /// there was one to move.
    fn move_isolated_dir(&self, from: &[u8], to: &[u8]) -> Result<bool> {
        let (from_parent, from_name) = split(from);
        let Some(source) = self.isolated_dir_if_any(from_parent, OFlags::PATH)? else {
            return Ok(false);
        };
        if Self::exists_at(source.as_fd(), from_name)?.is_none() {
            return Ok(false);
        }
        let (to_parent, to_name) = split(to);
        let target = self.isolated_dir(to_parent)?;
        match rustix::fs::renameat_with(
            &source,
            os(from_name),
            &target,
            os(to_name),
            RenameFlags::NOREPLACE,
        ) {
            Ok(()) => Ok(true),
            Err(Errno::EXIST | Errno::NOTEMPTY) => Err(Errno::XDEV),
            Err(e) => Err(e),
        }
    }

    /// Updates the inode table after a rename: the moved subtree's paths,
    /// then the route, state and protection of every moved node the
    /// kernel holds, parents first, as a lookup at the new place would
    /// find them.
    fn moved(&self, from: &[u8], plan: &Plan) {
        let moved = {
            let mut nodes = self.nodes.write().unwrap_or_else(|e| e.into_inner());
            nodes.rename(from, &plan.path);
            nodes.update(&plan.path, |node| {
                node.route = plan.route;
                node.protection = plan.protection;
                if node.state.is_some() {
                    node.state = Some(plan.state.clone());
                }
            });
            nodes.below(&plan.path)
        };
        for path in moved {
            let (parent, name) = split(&path);
            let Some(parent_state) = self.state_of(parent) else {
                continue;
            };
            if let Ok(Some(found)) = self.find(parent, &parent_state, name) {
                let mut nodes = self.nodes.write().unwrap_or_else(|e| e.into_inner());
                nodes.update(&path, |node| {
                    node.route = found.route;
                    node.protection = found.protection;
                    node.state = found.state;
                });
            }
        }
    }

    /// The state of the directory node at `path`, if the kernel holds it.
    fn state_of(&self, path: &[u8]) -> Option<DirState> {
        self.nodes
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .at(path)
            .and_then(|node| node.state.clone())
    }

    /// The entries of the isolated side's directory of the host directory
    /// at `path` that the merged view shows, given the host directory's
    /// listing (listed here when not given).
    fn isolated_entries(
        &self,
        path: &[u8],
        state: &DirState,
        host: Option<&[Listed]>,
    ) -> Result<Vec<DirEntry>> {
        let Some(fd) = self.isolated_dir_if_any(path, OFlags::RDONLY)? else {
            return Ok(Vec::new());
        };
        let listed_here;
        let host = match host {
            Some(host) => host,
            None => {
                listed_here = list(self.open_dir(Route::Host, path, OFlags::RDONLY)?.as_fd())?;
                &listed_here
            }
        };
        let host = HostListing::new(host);
        let mut out = Vec::new();
        for (name, kind, ino) in list(fd.as_fd())? {
            let facts = host.facts(&name);
            let (route, _) = self
                .classifier
                .child(state, path, &name, kind == Kind::Dir, facts);
            if route == Route::Isolated {
                out.push(DirEntry { name, kind, ino });
            }
        }
        Ok(out)
    }

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
    fn open_file(&self, entry: &Entry, flags: OFlags) -> Result<OwnedFd> {
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

    fn keep_file(&self, fd: OwnedFd) -> u64 {
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

    /// `opendir`: the merged listing, taken now.
    pub fn opendir(&self, ino: u64) -> Result<u64> {
        let listing = self.list_dir(ino)?;
        Ok(self.dirs.insert(listing))
    }

    /// Before a read from the start of an open directory: the first uses
    /// the listing `opendir` took; a later one (after `rewinddir`) takes
    /// it again, as it must see what the directory holds now.
    pub fn rewind(&self, handle: u64, ino: u64) -> Result<()> {
        if !self.listing(handle)?.read.swap(true, Ordering::Relaxed) {
            return Ok(());
        }
        let listing = self.list_dir(ino)?;
        listing.read.store(true, Ordering::Relaxed);
        self.dirs.replace(handle, listing)
    }

    /// The merged listing of the directory `ino`.
    fn list_dir(&self, ino: u64) -> Result<Listing> {
        let (node, state) = match self.dir_node(ino) {
            Ok(dir) => dir,
            // A removed directory lists nothing.
            Err(Errno::NOENT) => {
                return Ok(Listing {
                    entries: Vec::new(),
                    read: std::sync::atomic::AtomicBool::new(false),
                });
            }
            Err(e) => return Err(e),
        };
        let entries = match node.route {
            Route::Isolated => {
                let dir = self.open_dir(Route::Isolated, &node.path, OFlags::RDONLY)?;
                list(dir.as_fd())?
                    .into_iter()
                    .map(|(name, kind, ino)| DirEntry { name, kind, ino })
                    .collect()
            }
            Route::Host => {
                let dir = self.open_dir(Route::Host, &node.path, OFlags::RDONLY)?;
                let listed = list(dir.as_fd())?;
                let host = HostListing::new(&listed);
                let mut entries = Vec::with_capacity(listed.len());
                for (name, kind, ino) in &listed {
                    let is_dir = *kind == Kind::Dir;
                    let (route, _) =
                        self.classifier
                            .child(&state, &node.path, name, is_dir, host.facts(name));
                    if route == Route::Host {
                        entries.push(DirEntry {
                            name: name.clone(),
                            kind: *kind,
                            ino: *ino,
                        });
                    }
                }
                let shown: HashSet<Vec<u8>> = entries.iter().map(|e| e.name.clone()).collect();
                for entry in self.isolated_entries(&node.path, &state, Some(&listed))? {
                    if !shown.contains(&entry.name) {
                        entries.push(entry);
                    }
                }
                entries
            }
        };
        Ok(Listing {
            entries,
            read: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The listing of an open directory.
    pub fn listing(&self, handle: u64) -> Result<Arc<Listing>> {
        self.dirs.get(handle)
    }

    /// `readdirplus`: the entries of an open directory from `from` on,
    /// each with its attributes and counted as a lookup, handed to `emit`
    /// (its inode, the offset of the next entry, its name, its attributes)
    /// until `emit` says the reply is full. An entry that vanished since the
    /// listing is skipped.
    pub fn readdirplus(
        &self,
        handle: u64,
        ino: u64,
        from: usize,
        mut emit: impl FnMut(u64, u64, &[u8], &Stat) -> bool,
    ) -> Result<()> {
        let listing = self.listing(handle)?;
        let _names = self.read_names();
        // The directory as it is now (it may have been renamed since it
        // was listed): each name is found afresh, nothing taken from the
        // listing but the name. A removed directory lists nothing more.
        let (node, state) = match self.dir_node(ino) {
            Ok(dir) => dir,
            Err(Errno::NOENT) => return Ok(()),
            Err(e) => return Err(e),
        };
        let mut sides = Sides::new(self, &node.path, &state)?;
        let mut emitted = false;
        for (i, entry) in listing.entries.iter().enumerate().skip(from) {
            let found = match self.find_in(&mut sides, &node.path, &state, &entry.name) {
                Ok(Some(found)) => found,
                // Gone since the listing: skipped.
                Ok(None) => continue,
                // What was added so far goes out; the kernel asks again.
                Err(_) if emitted => break,
                Err(e) => return Err(e),
            };
            let ino = self.register(&found);
            // Offsets 1 and 2 are `.` and `..`; entry i is at i + 3.
            if emit(ino, i as u64 + 3, &entry.name, &found.stat) {
                // It did not fit: the kernel never saw this lookup.
                self.forget(ino, 1);
                break;
            }
            emitted = true;
        }
        Ok(())
    }

    /// `releasedir`.
    pub fn releasedir(&self, handle: u64) {
        self.dirs.remove(handle);
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

/// Refuses a link, FIFO or socket in git metadata: git makes none there,
/// and host git would follow a link wherever the sandbox pointed it
/// (appending a reflog to a file outside the workspace, taking another
/// directory for a submodule's).
fn refuse_special_in_git(dir: &DirState, kind: Kind) -> Result<()> {
    if dir.is_git_metadata() && matches!(kind, Kind::Symlink | Kind::Special) {
        return Err(Errno::PERM);
    }
    Ok(())
}

/// The parent and last component of a non-empty path.
fn split(path: &[u8]) -> (&[u8], &[u8]) {
    match path.iter().rposition(|b| *b == b'/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (&[], path),
    }
}

/// The entries of a directory opened for reading: name, kind, inode.
/// One entry of a listed directory: its name, kind and inode number.
type Listed = (Vec<u8>, Kind, u64);

/// What a host directory's listing says about the names in it.
struct HostListing<'a> {
    names: HashSet<&'a [u8]>,
    holds_head: bool,
}

impl<'a> HostListing<'a> {
    fn new(listed: &'a [Listed]) -> Self {
        HostListing {
            names: listed.iter().map(|(n, _, _)| n.as_slice()).collect(),
            holds_head: listed.iter().any(|(n, _, _)| n == HEAD_NAME),
        }
    }

    fn facts(&self, name: &[u8]) -> HostFacts {
        HostFacts {
            exists: self.names.contains(name),
            dir_holds_head: self.holds_head && needs_head(name),
        }
    }
}

fn list(dir: BorrowedFd<'_>) -> Result<Vec<Listed>> {
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

/// Moves a file, link or special file from one side to the other: a copy
/// under a temporary name, renamed into place, then the source removed.
fn move_across(
    from: &OwnedFd,
    name: &[u8],
    to: &OwnedFd,
    new_name: &[u8],
    kind: Kind,
    flags: RenameFlags,
) -> Result<()> {
    let temp = format!(".lazaret-move-{}", std::process::id()).into_bytes();
    let temp = [temp.as_slice(), b"-", new_name].concat();
    let temp = if temp.len() > 255 {
        temp[..255].to_vec()
    } else {
        temp
    };
    let stat = rustix::fs::statat(from, os(name), AtFlags::SYMLINK_NOFOLLOW)?;
    let mode = Mode::from_raw_mode(stat.st_mode & MODE_MASK);
    match kind {
        Kind::File => {
            let source = rustix::fs::openat(
                from,
                os(name),
                OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            let target = rustix::fs::openat(
                to,
                os(&temp),
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                mode,
            )?;
            let copied = copy(&source, &target);
            if let Err(e) = copied {
                let _ = rustix::fs::unlinkat(to, os(&temp), AtFlags::empty());
                return Err(e);
            }
            let times = Timestamps {
                last_access: stat_time(stat.st_atime, stat.st_atime_nsec),
                last_modification: stat_time(stat.st_mtime, stat.st_mtime_nsec),
            };
            let _ = rustix::fs::futimens(&target, &times);
        }
        Kind::Symlink => {
            let target = rustix::fs::readlinkat(from, os(name), Vec::new())?;
            rustix::fs::symlinkat(target.as_c_str(), to, os(&temp))?;
        }
        Kind::Special => {
            let file_type = FileType::from_raw_mode(stat.st_mode);
            if !matches!(file_type, FileType::Fifo | FileType::Socket) {
                return Err(Errno::XDEV);
            }
            rustix::fs::mknodat(to, os(&temp), file_type, mode, 0)?;
        }
        Kind::Dir => return Err(Errno::XDEV),
    }
    if let Err(e) = rustix::fs::renameat_with(to, os(&temp), to, os(new_name), flags) {
        let _ = rustix::fs::unlinkat(to, os(&temp), AtFlags::empty());
        return Err(e);
    }
    rustix::fs::unlinkat(from, os(name), AtFlags::empty())
}

fn stat_time(sec: i64, nsec: u64) -> rustix::fs::Timespec {
    rustix::fs::Timespec {
        tv_sec: sec,
        tv_nsec: i64::try_from(nsec).unwrap_or(0),
    }
}

/// The errno of an I/O error (`EIO` when it carries none).
fn io_errno(error: std::io::Error) -> Errno {
    Errno::from_io_error(&error).unwrap_or(Errno::IO)
}

/// Copies a whole file between two descriptors, from their current
/// offsets (the kernel copies in place where it can: `copy_file_range`).
fn copy(source: &OwnedFd, target: &OwnedFd) -> Result<()> {
    let mut reader = std::fs::File::from(rustix::io::dup(source)?);
    let mut writer = std::fs::File::from(rustix::io::dup(target)?);
    std::io::copy(&mut reader, &mut writer)
        .map(drop)
        .map_err(io_errno)
}
