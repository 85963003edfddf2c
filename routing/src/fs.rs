//! Reaching the workspace's directories beneath a descriptor: the one way
//! both the Host Coordinator (taking the rules) and the Workspace Router
//! (serving the sandbox) open and list them.
//!
//! Owns the resolution rule: `openat2` with `RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV`, so no
//! link, `..` or mount the sandbox or anyone else placed in the tree leads
//! out of it. Trusts the descriptor it is given as the root.

use std::ffi::OsStr;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};

/// Resolution beneath a root, following no link and crossing no mount.
pub const BENEATH: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS)
    .union(ResolveFlags::NO_XDEV);

/// Opens the directory at `path` (relative, `/`-separated; empty for the
/// root itself) beneath `root`, with `flags` (`O_PATH` or `O_RDONLY`).
pub fn open_dir(root: BorrowedFd<'_>, path: &[u8], flags: OFlags) -> rustix::io::Result<OwnedFd> {
    let path: &[u8] = if path.is_empty() { b"." } else { path };
    rustix::fs::openat2(
        root,
        OsStr::from_bytes(path),
        flags | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        BENEATH,
    )
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

/// The entries of a directory opened for reading, `.` and `..` left out;
/// an entry that vanished while being typed is left out too.
pub fn list(dir: BorrowedFd<'_>) -> std::io::Result<Vec<Listed>> {
    let mut out = Vec::new();
    let mut reader = rustix::fs::Dir::read_from(dir)?;
    while let Some(entry) = reader.read() {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        let file_type = match entry.file_type() {
            FileType::Unknown => {
                match rustix::fs::statat(dir, entry.file_name(), AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(stat) => FileType::from_raw_mode(stat.st_mode),
                    Err(_) => continue,
                }
            }
            known => known,
        };
        out.push(Listed {
            name: name.to_vec(),
            file_type,
            ino: entry.ino().max(1),
        });
    }
    Ok(out)
}
