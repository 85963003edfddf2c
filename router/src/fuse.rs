//! The FUSE face of the merged workspace: each request the kernel sends on
//! the `/dev/fuse` connection, answered by the [`Tree`].
//!
//! Owns the connection's settings (what the kernel may cache and for how
//! long, the largest read and write) and the translation between FUSE's
//! types and the tree's. Extended attributes, locks beyond the kernel's
//! own, and every other request it does not answer are refused, so nothing
//! the sandbox asks for reaches the host unexamined. Trusts the kernel's
//! framing (fuser parses it) and nothing in a request beyond it.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use rustix::fs::Stat;

use crate::ids::Ids;
use crate::nodes::Kind;
use crate::tree::{SetAttr, SetTime, Tree};

/// How long the kernel may keep names and attributes without asking
/// again: short, so the developer's edits on the host show up inside
/// promptly. The same bound holds for cached contents: when a refreshed
/// attribute shows a new size or mtime, the kernel drops the file's
/// pages (`FUSE_AUTO_INVAL_DATA`).
const TTL: Duration = Duration::from_secs(1);

/// The largest file whose contents go through the kernel's page cache.
/// One read then fetches the whole file in one request, where direct I/O
/// would send one request per read the sandbox makes (the common case:
/// source files read in small pieces, again and again). A larger file is
/// opened with `FOPEN_DIRECT_IO`: every read and write reaches the host
/// file in requests of up to 1 MiB, where the page cache would split it
/// into 128 KiB readahead requests. Contents are never kept past the
/// open that read them (no `FOPEN_KEEP_CACHE`); shared mappings work in
/// both modes (`FUSE_DIRECT_IO_ALLOW_MMAP`).
const CACHED_MAX: u64 = 128 << 10;

/// The largest read or write one request carries.
const MAX_IO: u32 = 1 << 20;

/// The filesystem the router serves.
#[derive(Debug)]
pub struct Router {
    tree: Tree,
    ids: Ids,
}

impl Router {
    /// Serves `tree`, showing owners and groups through `ids`.
    pub fn new(tree: Tree, ids: Ids) -> Self {
        Router { tree, ids }
    }

    /// The attributes the kernel gets for `stat`.
    fn attr(&self, ino: u64, stat: &Stat) -> FileAttr {
        attr(&self.ids, ino, stat)
    }

    /// Answers a request that makes or finds an entry.
    fn entry(&self, reply: ReplyEntry, result: crate::tree::Result<(u64, Stat)>) {
        match result {
            Ok((ino, stat)) => reply.entry(&TTL, &self.attr(ino, &stat), Generation(0)),
            Err(e) => reply.error(errno(e)),
        }
    }

    /// A read of a directory from its start lists it again.
    fn rewound(&self, fh: FileHandle, ino: INodeNo, offset: u64) -> crate::tree::Result<()> {
        if offset == 0 {
            self.tree.rewind(fh.0, ino.0)?;
        }
        Ok(())
    }
}

fn errno(e: rustix::io::Errno) -> Errno {
    Errno::from_i32(e.raw_os_error())
}

fn file_type(kind: Kind, stat: &Stat) -> FileType {
    match kind {
        Kind::Dir => FileType::Directory,
        Kind::File => FileType::RegularFile,
        Kind::Symlink => FileType::Symlink,
        Kind::Special => match rustix::fs::FileType::from_raw_mode(stat.st_mode) {
            rustix::fs::FileType::Fifo => FileType::NamedPipe,
            rustix::fs::FileType::Socket => FileType::Socket,
            rustix::fs::FileType::CharacterDevice => FileType::CharDevice,
            _ => FileType::BlockDevice,
        },
    }
}

fn time(sec: i64, nsec: u64) -> SystemTime {
    let nsec = u32::try_from(nsec).unwrap_or(0);
    match u64::try_from(sec) {
        Ok(sec) => UNIX_EPOCH + Duration::new(sec, nsec),
        Err(_) => UNIX_EPOCH,
    }
}

/// The attributes of `stat`, its owner and group as `ids` shows them
/// (see [`crate::ids`]).
fn attr(ids: &Ids, ino: u64, stat: &Stat) -> FileAttr {
    let kind = crate::tree::kind_of(stat);
    FileAttr {
        ino: INodeNo(ino),
        size: u64::try_from(stat.st_size).unwrap_or(0),
        blocks: u64::try_from(stat.st_blocks).unwrap_or(0),
        atime: time(stat.st_atime, stat.st_atime_nsec),
        mtime: time(stat.st_mtime, stat.st_mtime_nsec),
        ctime: time(stat.st_ctime, stat.st_ctime_nsec),
        crtime: UNIX_EPOCH,
        kind: file_type(kind, stat),
        perm: (stat.st_mode & 0o7777) as u16,
        nlink: u32::try_from(stat.st_nlink).unwrap_or(u32::MAX),
        uid: ids.uids.shown(stat.st_uid),
        gid: ids.gids.shown(stat.st_gid),
        rdev: 0,
        blksize: u32::try_from(stat.st_blksize).unwrap_or(4096),
        flags: 0,
    }
}

/// Answers a request that returns nothing.
fn empty(reply: ReplyEmpty, result: crate::tree::Result<()>) {
    match result {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(e)),
    }
}

/// How a file of `size` bytes is opened (see [`CACHED_MAX`]).
fn open_mode(size: u64) -> FopenFlags {
    if size <= CACHED_MAX {
        FopenFlags::empty()
    } else {
        FopenFlags::FOPEN_DIRECT_IO
    }
}

fn set_time(time: Option<TimeOrNow>) -> Option<SetTime> {
    time.map(|t| match t {
        TimeOrNow::SpecificTime(at) => SetTime::At(at),
        TimeOrNow::Now => SetTime::Now,
    })
}

impl Filesystem for Router {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(MAX_IO);
        let _ = config.set_max_readahead(MAX_IO);
        let _ = config.set_max_background(64);
        // Each is an optimisation the kernel may lack; none is needed.
        for flag in [
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_AUTO_INVAL_DATA,
            InitFlags::FUSE_CACHE_SYMLINKS,
            InitFlags::FUSE_ATOMIC_O_TRUNC,
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP,
        ] {
            let _ = config.add_capabilities(flag);
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.entry(reply, self.tree.lookup(parent.0, name.as_bytes()));
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.tree.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.tree.getattr(ino.0, fh.map(|h| h.0)) {
            Ok(stat) => reply.attr(&TTL, &self.attr(ino.0, &stat)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        // An owner or group the sandbox sets to what it is shown keeps the
        // host's (`chown` after `create`, as gVisor does, must not take a
        // setgid directory's group off what is made in it).
        let (uid, gid) = match (uid, gid) {
            (None, None) => (None, None),
            _ => match self.tree.getattr(ino.0, fh.map(|h| h.0)) {
                Ok(stat) => (
                    uid.filter(|&u| u != self.ids.uids.shown(stat.st_uid)),
                    gid.filter(|&g| g != self.ids.gids.shown(stat.st_gid)),
                ),
                Err(e) => return reply.error(errno(e)),
            },
        };
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: set_time(atime),
            mtime: set_time(mtime),
        };
        match self.tree.setattr(ino.0, set, fh.map(|h| h.0)) {
            Ok(stat) => reply.attr(&TTL, &self.attr(ino.0, &stat)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.tree.readlink(ino.0) {
            Ok(target) => reply.data(&target),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn mknod(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        self.entry(
            reply,
            self.tree.mknod(parent.0, name.as_bytes(), mode, umask),
        );
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        self.entry(
            reply,
            self.tree.mkdir(parent.0, name.as_bytes(), mode, umask),
        );
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.tree.remove(parent.0, name.as_bytes(), false));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.tree.remove(parent.0, name.as_bytes(), true));
    }

    fn symlink(
        &self,
        _req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        let target = target.as_os_str().as_bytes();
        self.entry(
            reply,
            self.tree.symlink(parent.0, link_name.as_bytes(), target),
        );
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let flags = rustix::fs::RenameFlags::from_bits_retain(flags.bits());
        let renamed = self.tree.rename(
            parent.0,
            name.as_bytes(),
            newparent.0,
            newname.as_bytes(),
            flags,
        );
        empty(reply, renamed);
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.entry(
            reply,
            self.tree.link(ino.0, newparent.0, newname.as_bytes()),
        );
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.tree.open(ino.0, flags.0) {
            Ok(file) => reply.opened(FileHandle(file.handle), open_mode(file.size)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        thread_local! {
            // One read buffer per serving thread, reused: a fresh 1 MiB
            // allocation per request would cost a page fault per page.
            static BUFFER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        BUFFER.with_borrow_mut(
            |buf| match self.tree.read(fh.0, offset, size.min(MAX_IO), buf) {
                Ok(()) => reply.data(buf),
                Err(e) => reply.error(errno(e)),
            },
        );
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.tree.write(fh.0, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.tree.release(fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        empty(reply, self.tree.fsync(fh.0, datasync));
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.tree.opendir(ino.0) {
            Ok(handle) => reply.opened(FileHandle(handle), FopenFlags::empty()),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if let Err(e) = self.rewound(fh, ino, offset) {
            return reply.error(errno(e));
        }
        let listing = match self.tree.listing(fh.0) {
            Ok(listing) => listing,
            Err(e) => return reply.error(errno(e)),
        };
        // Offsets 1 and 2 are `.` and `..`; entry i is at i + 3.
        let dots: [(&[u8], u64); 2] = [(b".", ino.0), (b"..", ino.0)];
        let all = dots
            .iter()
            .map(|(name, ino)| (*name, *ino, FileType::Directory))
            .chain(listing.entries.iter().map(|e| {
                let kind = match e.kind {
                    Kind::Dir => FileType::Directory,
                    Kind::File => FileType::RegularFile,
                    Kind::Symlink => FileType::Symlink,
                    Kind::Special => FileType::NamedPipe,
                };
                (e.name.as_slice(), e.ino, kind)
            }));
        for (i, (name, ino, kind)) in all.enumerate().skip(offset as usize) {
            if reply.add(INodeNo(ino), i as u64 + 1, kind, OsStr::from_bytes(name)) {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        if let Err(e) = self.rewound(fh, ino, offset) {
            return reply.error(errno(e));
        }
        // `.` and `..` (offsets 1 and 2) carry the directory's own
        // attributes and count as no lookup.
        if offset < 2 {
            let stat = match self.tree.getattr(ino.0, None) {
                Ok(stat) => stat,
                Err(e) => return reply.error(errno(e)),
            };
            for (name, next) in [(".", 1u64), ("..", 2)].into_iter().skip(offset as usize) {
                let dir = self.attr(ino.0, &stat);
                if reply.add(ino, next, name, &TTL, &dir, Generation(0)) {
                    return reply.ok();
                }
            }
        }
        let from = offset.saturating_sub(2) as usize;
        let listed = self
            .tree
            .readdirplus(fh.0, ino.0, from, |ino, next, name, stat| {
                reply.add(
                    INodeNo(ino),
                    next,
                    OsStr::from_bytes(name),
                    &TTL,
                    &self.attr(ino, stat),
                    Generation(0),
                )
            });
        match listed {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.tree.releasedir(fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.tree.statfs() {
            Ok(s) => reply.statfs(
                s.f_blocks,
                s.f_bfree,
                s.f_bavail,
                s.f_files,
                s.f_ffree,
                u32::try_from(s.f_bsize).unwrap_or(4096),
                u32::try_from(s.f_namemax).unwrap_or(255),
                u32::try_from(s.f_frsize).unwrap_or(4096),
            ),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        // No file capabilities, ACLs or other attributes reach the host.
        reply.error(Errno::from_i32(rustix::io::Errno::OPNOTSUPP.raw_os_error()));
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        reply.error(Errno::from_i32(rustix::io::Errno::NODATA.raw_os_error()));
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, size: u32, reply: ReplyXattr) {
        if size == 0 {
            reply.size(0);
        } else {
            reply.data(&[]);
        }
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::from_i32(rustix::io::Errno::OPNOTSUPP.raw_os_error()));
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        empty(
            reply,
            self.tree.access(ino.0, mask.contains(AccessFlags::W_OK)),
        );
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        match self
            .tree
            .create(parent.0, name.as_bytes(), mode, umask, flags)
        {
            Ok((ino, stat, handle)) => reply.created(
                &TTL,
                &self.attr(ino, &stat),
                Generation(0),
                FileHandle(handle),
                FopenFlags::FOPEN_DIRECT_IO,
            ),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        empty(reply, self.tree.fallocate(fh.0, offset, length, mode));
    }
}
