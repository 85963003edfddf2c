//! Opens beneath a directory descriptor: the one resolution rule every
//! Lazaret process uses to reach what lies under a directory it holds (the
//! Host Coordinator's owned directories, image roots it unpacks, the
//! workspace the Workspace Router serves), and the listing of such a
//! directory.
//!
//! Owns the rule: `openat2(2)` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV` and `O_NOFOLLOW`, so no link,
//! `..` or mount that the sandbox, an image or anyone else placed in the
//! tree leads out of it. Trusts the descriptor it is given as the root,
//! nothing about the tree beneath it.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use rustix::fd::{BorrowedFd, OwnedFd};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags, Stat};
use rustix::io::Errno;

/// Resolution beneath a root, following no link and crossing no mount.
pub const BENEATH: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS)
    .union(ResolveFlags::NO_XDEV);

/// `openat2(2)` of `path` beneath `dir` with [`BENEATH`], `O_NOFOLLOW` and
/// `O_CLOEXEC` (and `O_NOCTTY` unless `O_PATH`, which `openat2(2)` refuses
/// beside it).
pub fn open_beneath<P: AsRef<OsStr>>(
    dir: BorrowedFd<'_>,
    path: P,
    flags: OFlags,
    mode: Mode,
) -> Result<OwnedFd, Errno> {
    let flags = if flags.contains(OFlags::PATH) {
        flags
    } else {
        flags | OFlags::NOCTTY
    };
    rustix::fs::openat2(
        dir,
        path.as_ref(),
        flags | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        mode,
        BENEATH,
    )
}

/// Opens the directory at `path` (relative, `/`-separated; empty for the
/// root itself) beneath `root`, with `flags` (`O_PATH` or `O_RDONLY`).
pub fn open_dir(root: BorrowedFd<'_>, path: &[u8], flags: OFlags) -> Result<OwnedFd, Errno> {
    let path: &[u8] = if path.is_empty() { b"." } else { path };
    open_beneath(
        root,
        OsStr::from_bytes(path),
        flags | OFlags::DIRECTORY,
        Mode::empty(),
    )
}

/// Opens the directory `path` beneath `dir` as `O_PATH`.
pub fn open_dir_path<P: AsRef<OsStr>>(dir: BorrowedFd<'_>, path: P) -> Result<OwnedFd, Errno> {
    open_beneath(dir, path, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())
}

/// Opens the directory `path` beneath `dir` for reading its entries.
pub fn open_dir_read<P: AsRef<OsStr>>(dir: BorrowedFd<'_>, path: P) -> Result<OwnedFd, Errno> {
    open_beneath(dir, path, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
}

/// `fstatat(2)` with `AT_SYMLINK_NOFOLLOW`; `None` when nothing is there.
pub fn lstat_at<P: AsRef<OsStr>>(dir: BorrowedFd<'_>, name: P) -> Result<Option<Stat>, Errno> {
    match rustix::fs::statat(dir, name.as_ref(), AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => Ok(Some(stat)),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The type of a `stat` result.
pub fn file_type(stat: &Stat) -> FileType {
    FileType::from_raw_mode(stat.st_mode)
}

/// The `/proc/self/fd/N` magic link of an open descriptor: the way to reach
/// exactly that object again (reopen it, or ask `faccessat(2)` about it).
pub fn proc_self_fd(fd: BorrowedFd<'_>) -> String {
    format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd))
}

/// `chmod(2)` of exactly the object an `O_PATH` descriptor names, through
/// its `/proc/self/fd` link (`fchmod(2)` refuses `O_PATH` descriptors).
pub fn chmod_fd(fd: BorrowedFd<'_>, mode: Mode) -> Result<(), Errno> {
    let link = proc_self_fd(fd);
    rustix::fs::chmodat(rustix::fs::CWD, link.as_str(), mode, AtFlags::empty())
}

/// One entry of a directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    /// Its name.
    pub name: Vec<u8>,
    /// Its type; a link is a link, never what it names.
    pub file_type: FileType,
    /// Its inode number (never 0).
    pub ino: u64,
}

/// Calls `each` with every entry of a directory opened for reading, `.`
/// and `..` left out.
fn each_entry(
    dir: BorrowedFd<'_>,
    mut each: impl FnMut(&rustix::fs::DirEntry),
) -> Result<(), Errno> {
    let mut reader = rustix::fs::Dir::read_from(dir)?;
    while let Some(entry) = reader.read() {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            each(&entry);
        }
    }
    Ok(())
}

/// The names in a directory opened for reading, without `.` and `..`.
pub fn list_names(dir: BorrowedFd<'_>) -> Result<Vec<Vec<u8>>, Errno> {
    let mut names = Vec::new();
    each_entry(dir, |entry| {
        names.push(entry.file_name().to_bytes().to_vec())
    })?;
    Ok(names)
}

/// The entries of a directory opened for reading, `.` and `..` left out;
/// an entry that vanished while being typed is left out too.
pub fn list(dir: BorrowedFd<'_>) -> std::io::Result<Vec<Listed>> {
    let mut out = Vec::new();
    each_entry(dir, |entry| {
        let file_type = match entry.file_type() {
            FileType::Unknown => {
                match rustix::fs::statat(dir, entry.file_name(), AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(stat) => FileType::from_raw_mode(stat.st_mode),
                    Err(_) => return,
                }
            }
            known => known,
        };
        out.push(Listed {
            name: entry.file_name().to_bytes().to_vec(),
            file_type,
            ino: entry.ino().max(1),
        });
    })?;
    Ok(out)
}
