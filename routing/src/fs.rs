//! Reaching the workspace's directories beneath a descriptor: the one way
//! both the Host Coordinator (taking the rules) and the Workspace Router
//! (serving the sandbox) open and list them. Also the two host reads the
//! coordinator makes outside that rule: a small file by path (git's
//! configuration and hooks, the user's own), bounded and never blocking,
//! and whether a directory's names compare without case.
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

/// Why a small file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// It is larger than the reader takes.
    #[error("it is larger than {max} bytes")]
    TooLarge {
        /// The limit.
        max: u64,
    },
    /// The kernel refused.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// The content of the regular file at `path` (relative to `dir`, or to the
/// working directory without one), of at most `max` bytes; `None` when
/// there is no regular file there: nothing, a FIFO, a device, a directory,
/// or, unless `follow`, a symbolic link. The file is opened once, without
/// blocking (a FIFO put in its place cannot hang the reader), checked and
/// read through that one descriptor, never more than `max + 1` bytes (a
/// file whose size says 0, as in `/proc`, is bounded too).
pub fn read_small(
    dir: Option<BorrowedFd<'_>>,
    path: &std::path::Path,
    follow: bool,
    max: u64,
) -> Result<Option<Vec<u8>>, ReadError> {
    use std::io::Read;
    let mut flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    if !follow {
        flags |= OFlags::NOFOLLOW;
    }
    let fd = match rustix::fs::openat(dir.unwrap_or(rustix::fs::CWD), path, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT | rustix::io::Errno::LOOP) => return Ok(None),
        Err(e) => return Err(ReadError::Io(e.into())),
    };
    let file = std::fs::File::from(fd);
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Ok(None);
    }
    if meta.len() > max {
        return Err(ReadError::TooLarge { max });
    }
    let mut content = Vec::new();
    file.take(max + 1).read_to_end(&mut content)?;
    if content.len() as u64 > max {
        return Err(ReadError::TooLarge { max });
    }
    Ok(Some(content))
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
    fn only_small_regular_files_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let read = |path: &std::path::Path, follow: bool, max: u64| {
            read_small(None, path, follow, max).map_err(|e| e.to_string())
        };
        let file = dir.path().join("file");
        std::fs::write(&file, "12345").unwrap();
        assert_eq!(read(&file, true, 5), Ok(Some(b"12345".to_vec())));
        assert_eq!(
            read(&file, true, 4),
            Err("it is larger than 4 bytes".to_owned())
        );
        // A FIFO with no writer: passed over at once, not waited on.
        let fifo = dir.path().join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        assert_eq!(read(&fifo, true, 100), Ok(None));
        // A file whose size says 0 but reads on.
        assert!(read(std::path::Path::new("/proc/self/maps"), true, 10).is_err());
        assert_eq!(read(dir.path(), true, 100), Ok(None));
        assert_eq!(read(&dir.path().join("absent"), true, 100), Ok(None));
        // A link, unless followed.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("file", &link).unwrap();
        assert_eq!(read(&link, false, 100), Ok(None));
        assert_eq!(read(&link, true, 100), Ok(Some(b"12345".to_vec())));
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
