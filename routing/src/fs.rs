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

/// `FS_CASEFOLD_FL`: the directory's names compare without case.
const CASEFOLD: u32 = 0x4000_0000;

/// Filesystems whose names may compare without case, by `statfs` magic.
const CASE_INSENSITIVE: [(u32, &str); 10] = [
    (0x4d44, "a FAT filesystem"),
    (0x2011_bab0, "an exFAT filesystem"),
    (0x5346_544e, "an NTFS filesystem"),
    (0x7366_746e, "an NTFS filesystem"),
    (0xff53_4d42, "a CIFS share"),
    (0xfe53_4d42, "an SMB share"),
    (0x517b, "an SMB share"),
    (0x786f_4256, "a VirtualBox shared folder"),
    (0x482b, "an HFS+ filesystem"),
    (0x4244, "an HFS filesystem"),
];

/// Why names in a directory of this filesystem type (`statfs` magic) and
/// with these inode flags may compare without case, if they may: there
/// `.GIT/config` is `.git/config`, which rules that compare bytes would
/// not protect.
pub fn case_insensitive(fs_type: u32, flags: u32) -> Option<&'static str> {
    if flags & CASEFOLD != 0 {
        return Some("a filesystem that folds case in this directory (chattr +F)");
    }
    CASE_INSENSITIVE
        .iter()
        .find(|(magic, _)| *magic == fs_type)
        .map(|(_, name)| *name)
}

/// [`case_insensitive`] for the directory `dir` (opened for reading).
pub fn dir_case_insensitive(dir: BorrowedFd<'_>) -> rustix::io::Result<Option<&'static str>> {
    // Truncated to the 32 bits every magic fits in (the field is signed
    // on some architectures).
    let fs_type = rustix::fs::fstatfs(dir)?.f_type as u32;
    // A filesystem without inode flags has no case folding either.
    let flags = rustix::fs::ioctl_getflags(dir).map_or(0, |f| f.bits());
    Ok(case_insensitive(fs_type, flags))
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    #[test]
    fn case_insensitive_names_are_recognized() {
        assert_eq!(case_insensitive(0x4d44, 0), Some("a FAT filesystem"));
        assert_eq!(case_insensitive(0xff53_4d42, 0), Some("a CIFS share"));
        // ext4 and tmpfs compare bytes, unless the directory folds case.
        assert_eq!(case_insensitive(0xef53, 0), None);
        assert_eq!(case_insensitive(0x0102_1994, 0x80000), None);
        assert!(case_insensitive(0xef53, CASEFOLD | 0x80000).is_some());
    }

    #[test]
    fn an_ordinary_directory_compares_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let fd = rustix::fs::open(
            dir.path(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
        assert_eq!(dir_case_insensitive(fd.as_fd()), Ok(None));
    }
}
