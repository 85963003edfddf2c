//! What a State Anchor's upper holds against the image it overlays: the
//! walk behind `lazaret state inspect` and the ownership check of `state
//! verify`.
//!
//! Owns the reading of an upper as overlayfs wrote it: a character device
//! numbered 0:0 is a whiteout (a file of the image removed), a directory
//! marked `user.overlay.opaque` replaces the image's directory of that
//! name, anything else is added or, when the image has it too, modified.
//! Every step opens beneath a held descriptor without following links, and
//! the walk stops at a bound of entries and depth. Trusts nothing in the
//! upper: it is what the sandbox wrote.

use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use rustix::fs::{AtFlags, FileType};
use serde::Serialize;

/// The most entries one walk looks at.
const MAX_ENTRIES: usize = 1_000_000;
/// The deepest directory one walk descends into.
const MAX_DEPTH: usize = 256;
/// The most changed paths a report names (it counts them all).
pub const MAX_NAMED: usize = 2_000;

/// How an entry of the upper changes the image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ChangeKind {
    /// Not in the image.
    Added,
    /// In the image, and replaced by the upper's own.
    Modified,
    /// In the image, and removed (a whiteout).
    Removed,
    /// A directory of the image replaced whole (opaque).
    Replaced,
}

/// One changed path, relative to the persistent dir.
#[derive(Debug, Clone, Serialize)]
pub struct Change {
    /// How.
    pub kind: ChangeKind,
    /// The path, lossily as text.
    pub path: String,
}

/// What an upper changes, and what it holds that its owner did not write.
#[derive(Debug, Default, Serialize)]
pub struct Walked {
    /// Entries added.
    pub added: u64,
    /// Entries of the image modified.
    pub modified: u64,
    /// Entries of the image removed.
    pub removed: u64,
    /// Directories of the image replaced whole.
    pub replaced: u64,
    /// The changed paths, up to [`MAX_NAMED`].
    pub changes: Vec<Change>,
    /// Paths owned by another user than the Domain's, up to [`MAX_NAMED`].
    pub foreign: Vec<(String, u32)>,
    /// Whether the walk saw the whole upper (it stops at its bounds).
    pub complete: bool,
}

fn open_dir(at: BorrowedFd<'_>, name: &OsStr) -> rustix::io::Result<OwnedFd> {
    lazaret_hostfs::beneath::open_dir_read(at, name)
}

/// Whether the directory `dir` is marked opaque by overlayfs (in a user
/// namespace it uses the `user.` xattrs).
fn opaque(dir: BorrowedFd<'_>) -> bool {
    let mut value = [0u8; 4];
    matches!(
        rustix::fs::fgetxattr(dir, "user.overlay.opaque", &mut value),
        Ok(n) if n >= 1 && value[0] == b'y'
    )
}

struct Walk {
    uid: u32,
    seen: usize,
    out: Walked,
}

impl Walk {
    fn note(&mut self, kind: ChangeKind, path: &[u8]) {
        let count = match kind {
            ChangeKind::Added => &mut self.out.added,
            ChangeKind::Modified => &mut self.out.modified,
            ChangeKind::Removed => &mut self.out.removed,
            ChangeKind::Replaced => &mut self.out.replaced,
        };
        *count += 1;
        if self.out.changes.len() < MAX_NAMED {
            self.out.changes.push(Change {
                kind,
                path: String::from_utf8_lossy(path).into_owned(),
            });
        }
    }

    /// Walks `upper` (a directory of the upper) against `lower` (the
    /// image's directory of the same path, if it has one).
    fn dir(
        &mut self,
        upper: BorrowedFd<'_>,
        lower: Option<BorrowedFd<'_>>,
        path: &[u8],
        depth: usize,
    ) {
        let Ok(entries) = lazaret_hostfs::beneath::list(upper) else {
            self.out.complete = false;
            return;
        };
        for entry in entries {
            self.seen += 1;
            if self.seen > MAX_ENTRIES {
                self.out.complete = false;
                return;
            }
            let name = OsStr::from_bytes(&entry.name);
            let mut child_path = path.to_vec();
            child_path.push(b'/');
            child_path.extend_from_slice(&entry.name);
            let Ok(stat) = rustix::fs::statat(upper, name, AtFlags::SYMLINK_NOFOLLOW) else {
                continue;
            };
            if stat.st_uid != self.uid && self.out.foreign.len() < MAX_NAMED {
                self.out.foreign.push((
                    String::from_utf8_lossy(&child_path).into_owned(),
                    stat.st_uid,
                ));
            }
            let in_lower = lower
                .map(|l| rustix::fs::statat(l, name, AtFlags::SYMLINK_NOFOLLOW).is_ok())
                .unwrap_or(false);
            let file_type = FileType::from_raw_mode(stat.st_mode);
            if file_type == FileType::CharacterDevice && stat.st_rdev == 0 {
                self.note(ChangeKind::Removed, &child_path);
                continue;
            }
            if file_type != FileType::Directory {
                let kind = if in_lower {
                    ChangeKind::Modified
                } else {
                    ChangeKind::Added
                };
                self.note(kind, &child_path);
                continue;
            }
            let Ok(child) = open_dir(upper, name) else {
                self.out.complete = false;
                continue;
            };
            let replaced = in_lower && opaque(child.as_fd());
            let lower_child = if in_lower && !replaced {
                lower.and_then(|l| open_dir(l, name).ok())
            } else {
                None
            };
            match (in_lower, replaced) {
                (false, _) => self.note(ChangeKind::Added, &child_path),
                (true, true) => self.note(ChangeKind::Replaced, &child_path),
                (true, false) => {}
            }
            if depth >= MAX_DEPTH {
                self.out.complete = false;
                continue;
            }
            self.dir(
                child.as_fd(),
                lower_child.as_ref().map(AsFd::as_fd),
                &child_path,
                depth + 1,
            );
        }
    }
}

/// Walks the upper `upper` against the image's directory `lower`; files
/// not owned by `uid` are reported as foreign.
pub fn walk(upper: BorrowedFd<'_>, lower: Option<BorrowedFd<'_>>, uid: u32) -> Walked {
    let mut walk = Walk {
        uid,
        seen: 0,
        out: Walked {
            complete: true,
            ..Walked::default()
        },
    };
    walk.dir(upper, lower, b"", 0);
    walk.out
}

#[cfg(test)]
mod tests {
    use rustix::fs::{Mode, OFlags};

    use super::*;

    fn open(path: &std::path::Path) -> rustix::fd::OwnedFd {
        rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap()
    }

    #[test]
    fn changes_are_named_against_the_image() {
        let lower = tempfile::tempdir().unwrap();
        let upper = tempfile::tempdir().unwrap();
        for dir in ["etc", "usr/share"] {
            std::fs::create_dir_all(lower.path().join(dir)).unwrap();
        }
        std::fs::write(lower.path().join("etc/hosts"), b"").unwrap();
        std::fs::write(lower.path().join("usr/share/a"), b"").unwrap();
        std::fs::create_dir_all(upper.path().join("etc")).unwrap();
        std::fs::write(upper.path().join("etc/hosts"), b"changed").unwrap();
        std::fs::write(upper.path().join("etc/new"), b"").unwrap();
        std::fs::create_dir_all(upper.path().join("opt/tool")).unwrap();
        std::fs::write(upper.path().join("opt/tool/bin"), b"").unwrap();
        let uid = rustix::process::getuid().as_raw();
        let walked = walk(
            open(upper.path()).as_fd(),
            Some(open(lower.path()).as_fd()),
            uid,
        );
        let mut named: Vec<(ChangeKind, String)> = walked
            .changes
            .iter()
            .map(|c| (c.kind, c.path.clone()))
            .collect();
        named.sort_by(|a, b| a.1.cmp(&b.1));
        assert_eq!(
            named,
            [
                (ChangeKind::Modified, "/etc/hosts".to_owned()),
                (ChangeKind::Added, "/etc/new".to_owned()),
                (ChangeKind::Added, "/opt".to_owned()),
                (ChangeKind::Added, "/opt/tool".to_owned()),
                (ChangeKind::Added, "/opt/tool/bin".to_owned()),
            ]
        );
        assert_eq!((walked.added, walked.modified, walked.removed), (4, 1, 0));
        assert!(walked.complete && walked.foreign.is_empty());

        // Without an image, everything is added.
        let alone = walk(open(upper.path()).as_fd(), None, uid);
        assert_eq!((alone.added, alone.modified), (6, 0));
        // Another owner is foreign.
        let other = walk(open(upper.path()).as_fd(), None, uid + 1);
        assert_eq!(other.foreign.len(), 6);
    }
}
