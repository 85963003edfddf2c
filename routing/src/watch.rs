//! What changed during a generation under the directories holding scripts
//! the host's git runs (a filter's or driver's script, a hook): where
//! Lazaret could not make them read-only (the worktree's root, where a
//! `python3 clean.py` filter imports from), or where what a script loads
//! is not known before it runs, `lazaret down` shows the developer what
//! changed there before the next git command runs it.
//!
//! Owns the comparison: when the generation starts, before the sandbox
//! exists, every entry the host has below those directories (not inside
//! git metadata, not on the isolated side: the sandbox cannot change
//! either on the host) is recorded by its type, inode, size, modification
//! and change times; when it ends, after the sandbox is gone, the same
//! walk is made again and the two compared. The change time is the
//! kernel's own, set on every write, truncation, `chmod`, rename or time
//! change, and nobody but the kernel sets it: content cannot change
//! behind it. Both walks are bounded ([`MAX_ENTRIES`]); a directory
//! holding more is reported as not checked rather than half compared.
//!
//! Reaches the host only through the workspace descriptor, beneath it,
//! following no link ([`lazaret_hostfs::beneath`]); trusts the rules it is given.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;

use lazaret_proto::router::{
    ChangeKind, RelativePath, WorkspaceChange, WorkspaceChanges, WorkspaceRules,
};
use rustix::fs::{AtFlags, FileType, OFlags, Stat};

use crate::classify::{Classifier, DirState, GIT_DIR_NAME, HEAD_NAME, HostFacts, Route, join};

/// The most entries one walk records, over all its directories.
pub const MAX_ENTRIES: usize = 20_000;

/// The most bytes of paths a report lists, each counted with
/// [`ENTRY_OVERHEAD`]; the rest of the changes is counted, not listed. The
/// report travels in a control answer of at most 64 KiB.
pub const MAX_LISTED_BYTES: usize = 32 * 1024;

/// What each listed path costs beyond its bytes: its length and kind as
/// encoded, with room to spare.
const ENTRY_OVERHEAD: usize = 8;

/// What is compared of one entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Meta {
    file_type: FileType,
    ino: u64,
    /// Size, modification and change times; not compared for a
    /// directory, whose entries are compared instead.
    size: u64,
    mtime: (i64, u64),
    ctime: (i64, u64),
}

impl Meta {
    fn of(stat: &Stat) -> Self {
        let file_type = FileType::from_raw_mode(stat.st_mode);
        let dir = file_type == FileType::Directory;
        let time = |sec: i64, nsec: u64| if dir { (0, 0) } else { (sec, nsec) };
        Meta {
            file_type,
            ino: stat.st_ino,
            size: if dir {
                0
            } else {
                u64::try_from(stat.st_size).unwrap_or(0)
            },
            mtime: time(stat.st_mtime, stat.st_mtime_nsec),
            ctime: time(stat.st_ctime, stat.st_ctime_nsec),
        }
    }
}

/// One walk's findings.
#[derive(Debug, Default)]
struct Walked {
    /// Every entry found, by workspace-relative path.
    entries: BTreeMap<Vec<u8>, Meta>,
    /// The directories whose walk went past [`MAX_ENTRIES`].
    unchecked: Vec<Vec<u8>>,
}

/// The directories to compare, and what they held when the generation
/// started.
#[derive(Debug)]
pub struct Watch {
    /// The rules, compiled; none when there is nothing to compare.
    classifier: Option<Classifier>,
    dirs: Vec<Vec<u8>>,
    /// The most entries a walk records.
    limit: usize,
    before: Walked,
}

impl Watch {
    /// Records what the host has below `dirs` (workspace-relative; one
    /// below another is walked once) in `workspace`, routed by `rules`.
    pub fn take(workspace: BorrowedFd<'_>, rules: &WorkspaceRules, dirs: &[RelativePath]) -> Self {
        Self::take_at_most(workspace, rules, dirs, MAX_ENTRIES)
    }

    fn take_at_most(
        workspace: BorrowedFd<'_>,
        rules: &WorkspaceRules,
        dirs: &[RelativePath],
        limit: usize,
    ) -> Self {
        if dirs.is_empty() {
            return Watch {
                classifier: None,
                dirs: Vec::new(),
                limit,
                before: Walked::default(),
            };
        }
        let classifier = Classifier::new(rules);
        let mut dirs: Vec<Vec<u8>> = dirs.iter().map(|d| d.as_bytes().to_vec()).collect();
        dirs.sort();
        dirs.dedup();
        let outer: Vec<Vec<u8>> = dirs
            .iter()
            .filter(|d| !dirs.iter().any(|o| o != *d && below(d, o)))
            .cloned()
            .collect();
        let before = walk(workspace, &classifier, &outer, limit);
        Watch {
            classifier: Some(classifier),
            dirs: outer,
            limit,
            before,
        }
    }

    /// The directories compared.
    pub fn dirs(&self) -> impl Iterator<Item = RelativePath> + '_ {
        self.dirs.iter().map(|d| RelativePath(d.clone()))
    }

    /// What changed below the directories since [`take`](Self::take).
    pub fn changes(&self, workspace: BorrowedFd<'_>) -> WorkspaceChanges {
        let Some(classifier) = &self.classifier else {
            return WorkspaceChanges::default();
        };
        let after = walk(workspace, classifier, &self.dirs, self.limit);
        let mut unchecked: Vec<Vec<u8>> = self.before.unchecked.clone();
        unchecked.extend(after.unchecked.iter().cloned());
        unchecked.sort();
        unchecked.dedup();
        let checked = |path: &[u8]| {
            !unchecked
                .iter()
                .any(|d| path == d.as_slice() || below(path, d))
        };
        let mut changes = Vec::new();
        for (path, meta) in &after.entries {
            if !checked(path) {
                continue;
            }
            match self.before.entries.get(path) {
                None => changes.push((path, ChangeKind::Added)),
                Some(old) if old != meta => changes.push((path, ChangeKind::Changed)),
                Some(_) => {}
            }
        }
        for path in self.before.entries.keys() {
            if checked(path) && !after.entries.contains_key(path) {
                changes.push((path, ChangeKind::Removed));
            }
        }
        changes.sort();
        let total = changes.len() as u64;
        // The unchecked directories first, then the changes, within one
        // budget that counts each path's encoding too.
        let mut listed = 0;
        let mut fits = |path: &[u8]| {
            listed += path.len() + ENTRY_OVERHEAD;
            listed <= MAX_LISTED_BYTES
        };
        let unchecked = unchecked
            .into_iter()
            .take_while(|dir| fits(dir))
            .map(RelativePath)
            .collect();
        let changes = changes
            .into_iter()
            .take_while(|(path, _)| fits(path))
            .map(|(path, change)| WorkspaceChange {
                path: RelativePath(path.clone()),
                change,
            })
            .collect();
        WorkspaceChanges {
            changes,
            total,
            unchecked,
        }
    }
}

/// Whether `path` is strictly below `dir` (the empty path is the root).
fn below(path: &[u8], dir: &[u8]) -> bool {
    dir.is_empty() && !path.is_empty()
        || path.len() > dir.len() && path.starts_with(dir) && path[dir.len()] == b'/'
}

/// Walks `dirs`, recording every entry the host has below them that the
/// sandbox could have changed (not git metadata, not isolated), at most
/// `limit` in all.
fn walk(
    workspace: BorrowedFd<'_>,
    classifier: &Classifier,
    dirs: &[Vec<u8>],
    limit: usize,
) -> Walked {
    let mut walked = Walked::default();
    for dir in dirs {
        let Some(state) = state_of(workspace, classifier, dir) else {
            continue;
        };
        let mut found = BTreeMap::new();
        let mut pending = vec![(dir.clone(), state)];
        let mut complete = true;
        'walk: while let Some((path, state)) = pending.pop() {
            let Ok(fd) = lazaret_hostfs::beneath::open_dir(workspace, &path, OFlags::RDONLY) else {
                continue;
            };
            let Ok(listed) = lazaret_hostfs::beneath::list(fd.as_fd()) else {
                continue;
            };
            let dir_holds_head = listed.iter().any(|e| e.name == HEAD_NAME);
            for entry in listed {
                if entry.name == GIT_DIR_NAME {
                    continue;
                }
                let is_dir = entry.file_type == FileType::Directory;
                let facts = HostFacts {
                    exists: true,
                    dir_holds_head,
                };
                let (route, child) = classifier.child(&state, &path, &entry.name, is_dir, facts);
                if route != Route::Host || child.is_git_metadata() {
                    continue;
                }
                let Ok(stat) = rustix::fs::statat(
                    &fd,
                    OsStr::from_bytes(&entry.name),
                    AtFlags::SYMLINK_NOFOLLOW,
                ) else {
                    continue;
                };
                if walked.entries.len() + found.len() >= limit {
                    complete = false;
                    break 'walk;
                }
                let child_path = join(&path, &entry.name);
                if is_dir {
                    pending.push((child_path.clone(), child));
                }
                found.insert(child_path, Meta::of(&stat));
            }
        }
        if complete {
            walked.entries.extend(found);
        } else {
            walked.unchecked.push(dir.clone());
        }
    }
    walked
}

/// The state of the host directory `dir`, if it is one the sandbox could
/// change: on the host side, not git metadata.
fn state_of(workspace: BorrowedFd<'_>, classifier: &Classifier, dir: &[u8]) -> Option<DirState> {
    let exists = |_: &[u8]| HostFacts {
        exists: true,
        dir_holds_head: false,
    };
    let (route, state) = classifier.walk(dir, true, &exists);
    (route == Route::Host
        && !state.is_git_metadata()
        && lazaret_hostfs::beneath::open_dir(workspace, dir, OFlags::PATH).is_ok())
    .then_some(state)
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use lazaret_proto::router::{IgnoreFile, IgnoreScope};

    use super::*;

    /// Rules ignoring `.env` and `node_modules/`.
    fn rules() -> WorkspaceRules {
        WorkspaceRules {
            isolate_ignored: true,
            global_excludes: Vec::new(),
            scopes: vec![IgnoreScope {
                root: RelativePath::default(),
                prefix: RelativePath::default(),
                exclude: Vec::new(),
                ignore_files: vec![IgnoreFile {
                    dir: RelativePath::default(),
                    content: b".env\nnode_modules/\n".to_vec(),
                }],
                tracked_ignored: Vec::new(),
                tracked_ignored_dirs: Vec::new(),
            }],
            read_only: Vec::new(),
            read_only_prefixes: Vec::new(),
            git_dirs: Vec::new(),
            kept_isolated: Vec::new(),
        }
    }

    fn write(root: &std::path::Path, path: &str, text: &str) {
        let path = root.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    /// Waits (boundedly) until a file changed now gets a later change time
    /// than `meta`'s: the kernel's file clock ticks every few milliseconds.
    fn after_change_time(root: &std::path::Path, meta: &std::fs::Metadata) {
        use std::os::unix::fs::MetadataExt;
        let probe = root.join("probe");
        for _ in 0..10_000 {
            std::fs::write(&probe, "x").unwrap();
            let now = std::fs::metadata(&probe).unwrap();
            if (now.ctime(), now.ctime_nsec()) > (meta.ctime(), meta.ctime_nsec()) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        std::fs::remove_file(probe).unwrap();
    }

    fn listed(changes: &WorkspaceChanges) -> Vec<(String, ChangeKind)> {
        changes
            .changes
            .iter()
            .map(|c| (c.path.to_string(), c.change))
            .collect()
    }

    #[test]
    fn what_changed_below_the_directories_is_listed() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for path in ["README", "clean.py", "gone.txt", "pkg/m.py", "same.txt"] {
            write(root, path, "host\n");
        }
        write(root, ".env", "SECRET\n");
        write(root, "node_modules/x/index.js", "x\n");
        write(root, ".git/config", "[core]\n");
        let ws = std::fs::File::open(root).unwrap();
        let watch = Watch::take(ws.as_fd(), &rules(), &[RelativePath::default()]);
        assert_eq!(watch.dirs().collect::<Vec<_>>(), [RelativePath::default()]);
        let nothing = watch.changes(ws.as_fd());
        assert_eq!(nothing, WorkspaceChanges::default());

        write(root, "json.py", "import os\n");
        write(root, "pkg/sub/__init__.py", "\n");
        std::fs::remove_file(root.join("gone.txt")).unwrap();
        // The same size and modification time: the change time tells,
        // once the kernel's clock has moved on from the one it recorded.
        let before = std::fs::metadata(root.join("README")).unwrap();
        after_change_time(root, &before);
        write(root, "README", "HOST\n");
        let file = std::fs::File::options()
            .write(true)
            .open(root.join("README"))
            .unwrap();
        file.set_modified(before.modified().unwrap()).unwrap();
        // The sandbox cannot change these on the host; the host's own
        // changes to them are not the question.
        write(root, ".env", "OTHER\n");
        write(root, "node_modules/y.js", "y\n");
        write(root, ".git/config", "[core]\n\tfsmonitor = x\n");
        let changes = watch.changes(ws.as_fd());
        assert_eq!(
            listed(&changes),
            [
                ("README".to_owned(), ChangeKind::Changed),
                ("gone.txt".to_owned(), ChangeKind::Removed),
                ("json.py".to_owned(), ChangeKind::Added),
                ("pkg/sub".to_owned(), ChangeKind::Added),
                ("pkg/sub/__init__.py".to_owned(), ChangeKind::Added),
            ]
        );
        assert_eq!(changes.total, 5);
        assert!(changes.unchecked.is_empty());
    }

    #[test]
    fn a_long_report_is_cut_to_fit_the_answer_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let ws = std::fs::File::open(root).unwrap();
        let watch = Watch::take(ws.as_fd(), &rules(), &[RelativePath::default()]);
        let long = "n".repeat(200);
        for i in 0..1_000 {
            write(root, &format!("{long}{i}"), "x\n");
        }
        let changes = watch.changes(ws.as_fd());
        assert_eq!(changes.total, 1_000);
        assert!(
            !changes.changes.is_empty() && changes.changes.len() < 1_000,
            "{}",
            changes.changes.len()
        );
        let answer = lazaret_proto::control::ControlResponse::Stopped {
            generation_id: lazaret_proto::ids::GenerationId(1),
            workspace_changes: changes,
        };
        lazaret_proto::codec::encode(&answer).expect("the answer fits");
    }

    #[test]
    fn a_directory_too_large_to_compare_is_said_to_be() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for i in 0..5 {
            write(root, &format!("big/{i}"), "x\n");
        }
        write(root, "small/a", "x\n");
        let ws = std::fs::File::open(root).unwrap();
        let dirs = [
            RelativePath(b"small".to_vec()),
            RelativePath(b"big".to_vec()),
            // Below another: walked with it.
            RelativePath(b"small".to_vec()),
        ];
        let watch = Watch::take_at_most(ws.as_fd(), &rules(), &dirs, 3);
        write(root, "small/b", "x\n");
        write(root, "big/new", "x\n");
        let changes = watch.changes(ws.as_fd());
        assert_eq!(
            listed(&changes),
            [("small/b".to_owned(), ChangeKind::Added)]
        );
        assert_eq!(changes.unchecked, [RelativePath(b"big".to_vec())]);
        // A directory below another is compared with it.
        let nested = [RelativePath(b"small".to_vec()), RelativePath::default()];
        let watch = Watch::take(ws.as_fd(), &rules(), &nested);
        assert_eq!(watch.dirs().collect::<Vec<_>>(), [RelativePath::default()]);
    }
}
