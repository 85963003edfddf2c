//! Whether a directory's names compare without case: by its filesystem,
//! its own case-folding flag, and by trying. Where they do, `.GIT/config`
//! is `.git/config`, which rules that compare bytes would not protect.
//!
//! Trusts the kernel's answers about the directory it is given.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use rustix::fd::BorrowedFd;
use rustix::fs::AtFlags;

use crate::beneath::Listed;

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

/// Whether the directory `dir` (opened for reading) folds case by its own
/// flag (`chattr +F`), which each directory of a filesystem may carry or
/// not.
pub fn dir_folds_case(dir: BorrowedFd<'_>) -> Option<&'static str> {
    // A filesystem without inode flags has no case folding either.
    let flags = rustix::fs::ioctl_getflags(dir).map_or(0, |f| f.bits());
    case_insensitive(0, flags)
}

/// Whether names in the directory `dir` (opened for reading, holding
/// `entries`) may compare without case: by its filesystem and flags (see
/// [`case_insensitive`]), and by trying: one entry's name with its case
/// swapped must not name the same file (which also catches a filesystem
/// not listed, such as a share of a case-insensitive one). The
/// filesystem's part holds for every directory on it.
pub fn dir_case_insensitive(
    dir: BorrowedFd<'_>,
    entries: &[Listed],
) -> rustix::io::Result<Option<&'static str>> {
    // Truncated to the 32 bits every magic fits in (the field is signed
    // on some architectures).
    let fs_type = rustix::fs::fstatfs(dir)?.f_type as u32;
    // A filesystem without inode flags has no case folding either.
    let flags = rustix::fs::ioctl_getflags(dir).map_or(0, |f| f.bits());
    if let Some(kind) = case_insensitive(fs_type, flags) {
        return Ok(Some(kind));
    }
    let Some(entry) = entries
        .iter()
        .find(|e| e.name.iter().any(u8::is_ascii_alphabetic))
    else {
        return Ok(None);
    };
    let swapped: Vec<u8> = entry
        .name
        .iter()
        .map(|b| {
            if b.is_ascii_lowercase() {
                b.to_ascii_uppercase()
            } else {
                b.to_ascii_lowercase()
            }
        })
        .collect();
    let stat =
        |name: &[u8]| rustix::fs::statat(dir, OsStr::from_bytes(name), AtFlags::SYMLINK_NOFOLLOW);
    let same = match (stat(&entry.name), stat(&swapped)) {
        (Ok(a), Ok(b)) => a.st_dev == b.st_dev && a.st_ino == b.st_ino,
        _ => false,
    };
    Ok(same.then_some("a filesystem that folds case (found by trying)"))
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use rustix::fs::{Mode, OFlags};

    use super::*;
    use crate::beneath::list;

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
        std::fs::write(dir.path().join("Name"), "").unwrap();
        let entries = list(fd.as_fd()).unwrap();
        assert_eq!(dir_case_insensitive(fd.as_fd(), &entries), Ok(None));
        // Two names differing in case are two files.
        std::fs::write(dir.path().join("nAME"), "").unwrap();
        assert_eq!(dir_case_insensitive(fd.as_fd(), &entries), Ok(None));
    }
}
