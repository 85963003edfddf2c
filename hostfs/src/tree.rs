//! Walks of whole trees beneath a directory descriptor: removing a tree
//! however deep it is, and measuring what a tree occupies on disk.
//!
//! Every open is one of [`crate::beneath`]'s, so no walk leaves the
//! directory it starts in, follows a symbolic link or crosses a mount.
//! Removal never follows a symbolic link either: a link is unlinked, never
//! descended into. Trusts nothing about the trees it walks (they may hold
//! hostile image or sandbox content), only the descriptor it is given.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{AtFlags, FileType, Mode, RenameFlags};
use rustix::io::Errno;

use crate::beneath::{chmod_fd, file_type, list_names, lstat_at, open_dir_path, open_dir_read};

/// Opens a directory for reading so that its entries can be removed: a
/// directory whose mode denies the owner access (as an image may ask for)
/// is first given mode `0700`.
fn open_dir_for_removal(dir: BorrowedFd<'_>, name: &OsStr) -> Result<OwnedFd, Errno> {
    match open_dir_read(dir, name) {
        Err(Errno::ACCESS) => {
            let path_fd = open_dir_path(dir, name)?;
            chmod_fd(path_fd.as_fd(), Mode::RWXU)?;
            open_dir_read(dir, name)
        }
        Ok(fd) => {
            let mode = rustix::fs::fstat(&fd)?.st_mode;
            if mode & 0o700 != 0o700 {
                rustix::fs::fchmod(&fd, Mode::RWXU)?;
            }
            Ok(fd)
        }
        Err(e) => Err(e),
    }
}

/// Removes whatever is at `name` beneath `dir`: a directory with all its
/// contents, anything else by `unlinkat(2)`. Nothing there is success.
pub fn remove_at(dir: BorrowedFd<'_>, name: &OsStr) -> Result<(), Errno> {
    let Some(stat) = lstat_at(dir, name)? else {
        return Ok(());
    };
    let flags = if file_type(&stat) == FileType::Directory {
        let top = open_dir_for_removal(dir, name)?;
        empty_dir(top.as_fd())?;
        AtFlags::REMOVEDIR
    } else {
        AtFlags::empty()
    };
    match rustix::fs::unlinkat(dir, name, flags) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Empties the directory `top` (opened for reading) holding at most two
/// descriptors however deep the tree is (a tree the sandbox made can be
/// deeper than the descriptors a process may hold): each subdirectory's
/// entries are moved up into `top` under a fresh name, then the emptied
/// subdirectory is removed, until `top` holds nothing. Interrupted, what
/// is left is all inside `top`, for the next try.
fn empty_dir(top: BorrowedFd<'_>) -> Result<(), Errno> {
    let mut fresh = 0u64;
    loop {
        let names = list_names(top)?;
        if names.is_empty() {
            return Ok(());
        }
        for name in names {
            let name = OsStr::from_bytes(&name);
            let Some(stat) = lstat_at(top, name)? else {
                continue;
            };
            let flags = if file_type(&stat) == FileType::Directory {
                let child = open_dir_for_removal(top, name)?;
                for inner in list_names(child.as_fd())? {
                    let inner = OsStr::from_bytes(&inner);
                    let mut opened_up = false;
                    loop {
                        fresh += 1;
                        let moved = format!(".lazaret-removing-{fresh}");
                        match rustix::fs::renameat_with(
                            &child,
                            inner,
                            top,
                            moved.as_str(),
                            RenameFlags::NOREPLACE,
                        ) {
                            Ok(()) | Err(Errno::NOENT) => break,
                            Err(Errno::EXIST) => {}
                            // Moving a directory rewrites its `..`, which
                            // takes write access to it: given once.
                            Err(Errno::ACCESS) if !opened_up => {
                                opened_up = true;
                                drop(open_dir_for_removal(child.as_fd(), inner)?);
                            }
                            Err(e) => return Err(e),
                        }
                    }
                }
                AtFlags::REMOVEDIR
            } else {
                AtFlags::empty()
            };
            match rustix::fs::unlinkat(top, name, flags) {
                Ok(()) | Err(Errno::NOENT) => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// Removes every entry of the directory `dir` (opened for reading) for
/// which `keep` is false.
pub fn remove_children(
    dir: BorrowedFd<'_>,
    mut keep: impl FnMut(&[u8]) -> bool,
) -> Result<(), Errno> {
    for name in list_names(dir)? {
        if !keep(&name) {
            remove_at(dir, OsStr::from_bytes(&name))?;
        }
    }
    Ok(())
}

/// How deep [`disk_usage_until`] descends (a descriptor per level); a
/// deeper tree is counted as incomplete.
const MAX_MEASURED_DEPTH: usize = 256;

/// The bytes a tree occupies on disk (`st_blocks * 512`), each inode
/// counted once. `dir` is opened for reading.
pub fn disk_usage(dir: BorrowedFd<'_>) -> Result<u64, Errno> {
    disk_usage_until(dir, None).map(|(bytes, _)| bytes)
}

/// [`disk_usage`], stopping at `deadline` if one is given: the bytes
/// counted, and whether the whole tree was (a directory this process may
/// not read, which the sandbox can make in its uppers, or one deeper than
/// [`MAX_MEASURED_DEPTH`], is left out and makes the count incomplete
/// too).
pub fn disk_usage_until(
    dir: BorrowedFd<'_>,
    deadline: Option<std::time::Instant>,
) -> Result<(u64, bool), Errno> {
    struct Walk {
        seen: HashSet<(u64, u64)>,
        deadline: Option<std::time::Instant>,
        complete: bool,
    }
    fn walk(dir: BorrowedFd<'_>, state: &mut Walk, depth: usize) -> Result<u64, Errno> {
        let mut total = 0u64;
        for name in list_names(dir)? {
            if state
                .deadline
                .is_some_and(|d| std::time::Instant::now() >= d)
            {
                state.complete = false;
                break;
            }
            let name = OsStr::from_bytes(&name);
            let Some(stat) = lstat_at(dir, name)? else {
                continue;
            };
            if !state.seen.insert((stat.st_dev, stat.st_ino)) {
                continue;
            }
            total = total.saturating_add(u64::try_from(stat.st_blocks).unwrap_or(0) * 512);
            if file_type(&stat) == FileType::Directory && depth >= MAX_MEASURED_DEPTH {
                state.complete = false;
            } else if file_type(&stat) == FileType::Directory {
                match open_dir_read(dir, name) {
                    Ok(child) => {
                        total = total.saturating_add(walk(child.as_fd(), state, depth + 1)?);
                    }
                    Err(Errno::ACCESS) => state.complete = false,
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(total)
    }
    let mut state = Walk {
        seen: HashSet::new(),
        deadline,
        complete: true,
    };
    let bytes = walk(dir, &mut state, 0)?;
    Ok((bytes, state.complete))
}

#[cfg(test)]
mod tests {
    use rustix::fs::OFlags;

    use super::*;
    use crate::beneath::open_beneath;

    fn open(path: &std::path::Path) -> OwnedFd {
        rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap()
    }

    #[test]
    fn a_tree_deeper_than_the_descriptors_a_process_holds_is_removed() {
        let base = tempfile::tempdir().unwrap();
        std::fs::create_dir(base.path().join("top")).unwrap();
        // More levels than this process may hold descriptors, made one at a
        // time beneath the last, each with a file and one level shut to
        // its owner.
        let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .current
            .unwrap_or(1024);
        let levels = usize::try_from(limit).unwrap_or(1024).min(100_000) + 100;
        let mut dir = open(&base.path().join("top"));
        for level in 0..levels {
            rustix::fs::mkdirat(&dir, "d", Mode::RWXU).unwrap();
            let file = open_beneath(
                dir.as_fd(),
                "f",
                OFlags::WRONLY | OFlags::CREATE,
                Mode::RUSR,
            );
            drop(file.unwrap());
            let next = open_dir_read(dir.as_fd(), "d").unwrap();
            if level == levels / 2 {
                rustix::fs::fchmod(&next, Mode::empty()).unwrap();
            }
            if level == levels / 3 {
                rustix::fs::fchmod(&next, Mode::RUSR | Mode::XUSR).unwrap();
            }
            dir = next;
        }
        drop(dir);
        let root = open(base.path());
        remove_at(root.as_fd(), OsStr::new("top")).unwrap();
        assert!(!base.path().join("top").exists());
        // Nothing there is success.
        remove_at(root.as_fd(), OsStr::new("top")).unwrap();
    }
}
