//! The Runtime Supervisor ↔ Workspace Router link, and the routing rules the
//! Host Coordinator takes from the host when a generation starts.
//!
//! This module owns the messages of that one channel (one `Serve` request,
//! one report) and the shape of [`WorkspaceRules`], which travels from the
//! Host Coordinator to the router in a sealed memfd that the supervisor
//! passes on unread. The router trusts only the supervisor at the other end
//! of its inherited channel and refuses rules that do not decode or whose
//! paths are not plain relative paths; the supervisor trusts the router's
//! report only as far as relaying it.

use rustix::thread::CapabilitySet;
use serde::{Deserialize, Serialize};

use crate::channel::FdIndex;
use crate::codec::WireRecord;

/// The largest [`WorkspaceRules`] encoding, and so the largest rules memfd.
pub const MAX_RULES_LEN: usize = 16 * 1024 * 1024;

/// The capabilities the Workspace Router runs with, in the Domain user
/// namespace, and no other: enough to act as the owner of the invoking
/// user's files whatever their mode (the only files that namespace maps).
pub const ROUTER_CAPABILITIES: CapabilitySet = CapabilitySet::DAC_OVERRIDE
    .union(CapabilitySet::DAC_READ_SEARCH)
    .union(CapabilitySet::FOWNER);

/// A path relative to a directory the record names: `/`-separated raw
/// bytes, no leading or trailing `/`, no empty, `.` or `..` component, no
/// NUL. The empty path is the directory itself.
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RelativePath(pub Vec<u8>);

impl RelativePath {
    /// Checks the path's shape; `None` when it is not a plain relative path.
    pub fn parse(bytes: &[u8]) -> Option<Self> {
        let path = Self(bytes.to_vec());
        path.is_valid().then_some(path)
    }

    /// Whether the path keeps the rules above.
    pub fn is_valid(&self) -> bool {
        self.0.is_empty()
            || (!self.0.contains(&0)
                && self
                    .0
                    .split(|b| *b == b'/')
                    .all(|c| !c.is_empty() && c != b"." && c != b".."))
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The components, in order; none for the empty path.
    pub fn components(&self) -> impl Iterator<Item = &[u8]> {
        self.0.split(|b| *b == b'/').filter(|c| !c.is_empty())
    }
}

impl std::fmt::Debug for RelativePath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RelativePath(\"{}\")", self.0.escape_ascii())
    }
}

impl std::fmt::Display for RelativePath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0.escape_ascii())
    }
}

/// One `.gitignore` file of a scope.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IgnoreFile {
    /// Its directory, relative to the scope's repository root.
    pub dir: RelativePath,
    /// Its content, as read.
    pub content: Vec<u8>,
}

/// One repository's view of ignored paths: the workspace's own repository
/// (or the one enclosing it), or a submodule or repository nested in it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IgnoreScope {
    /// Where the repository's root is, relative to the workspace; empty for
    /// the workspace itself or a repository enclosing it.
    pub root: RelativePath,
    /// Where the workspace is inside the repository, when the repository
    /// encloses it; empty otherwise.
    pub prefix: RelativePath,
    /// The repository's `info/exclude`.
    pub exclude: Vec<u8>,
    /// Every `.gitignore` that applies inside the workspace, by directory.
    pub ignore_files: Vec<IgnoreFile>,
    /// Paths, relative to the repository root, that its index tracks
    /// although its rules ignore them: git does not ignore tracked paths.
    pub tracked_ignored: Vec<RelativePath>,
    /// The directories among them that the index tracks whole (a
    /// submodule, a sparse directory): the directory is tracked, not a
    /// file of its name.
    pub tracked_ignored_dirs: Vec<RelativePath>,
}

/// The entries of a directory whose names start with a prefix: every name
/// a program that looks one name up may take (the Python module `tool`
/// run with `python -m tool` is `tool.py`, `tool.pyc`, `tool.abi3.so`, ...).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamePrefix {
    /// The directory, relative to the workspace.
    pub dir: RelativePath,
    /// The start of the names.
    pub prefix: Vec<u8>,
}

/// What the Workspace Router routes by, taken from the host when the
/// generation starts and fixed for its life: editing a `.gitignore` inside
/// the sandbox changes nothing until the next generation, and that one
/// keeps what this one isolated ([`kept_isolated`](Self::kept_isolated))
/// until the developer accepts the change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkspaceRules {
    /// The profile's `isolate_gitignored`: whether ignored paths go to
    /// Domain storage. Git metadata is routed and protected either way.
    pub isolate_ignored: bool,
    /// The invoking user's global excludes (`core.excludesFile`).
    pub global_excludes: Vec<u8>,
    /// The repositories, outermost first: the one of the workspace (or
    /// enclosing it, or none: the workspace's own `.gitignore` files still
    /// apply), then the submodules and repositories nested in it. Empty
    /// when ignored paths are not isolated.
    pub scopes: Vec<IgnoreScope>,
    /// Paths in the workspace that the host's git configuration makes git
    /// read as configuration or run (`core.hooksPath`, included files, a
    /// program named by path), relative to the workspace; each is
    /// read-only inside, with everything below it, and the directories
    /// holding it cannot be moved.
    pub read_only: Vec<RelativePath>,
    /// Names read-only the same way, by prefix (hook managers' files in
    /// their variants, modules a hook runs with `python -m`).
    pub read_only_prefixes: Vec<NamePrefix>,
    /// Git directories of the host inside the workspace, not named `.git`,
    /// that a `.git` file or link names: routed and protected as `.git`
    /// is, and the directories holding them cannot be moved.
    pub git_dirs: Vec<RelativePath>,
    /// Host paths, relative to the workspace, that the Domain's last
    /// generation kept from the sandbox and that the rest of these rules
    /// would share (a `.gitignore` edited, a path added to the index):
    /// isolated, with everything below them, until the developer accepts
    /// the change. Empty when there is none, or once accepted.
    pub kept_isolated: Vec<RelativePath>,
}

impl WireRecord for WorkspaceRules {
    const NAME: &'static str = "WorkspaceRules";
    const MAX_ENCODED_LEN: usize = MAX_RULES_LEN;
}

impl WorkspaceRules {
    /// The first path in the record that is not a plain relative path.
    pub fn invalid_path(&self) -> Option<&RelativePath> {
        let scoped = self.scopes.iter().flat_map(|s| {
            [&s.root, &s.prefix]
                .into_iter()
                .chain(s.ignore_files.iter().map(|f| &f.dir))
                .chain(&s.tracked_ignored)
                .chain(&s.tracked_ignored_dirs)
        });
        scoped
            .into_iter()
            .chain(&self.read_only)
            .chain(self.read_only_prefixes.iter().map(|p| &p.dir))
            .chain(&self.git_dirs)
            .chain(&self.kept_isolated)
            .find(|p| !p.is_valid())
    }
}

/// How an entry of the workspace changed during a generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ChangeKind {
    /// It was not there when the generation started.
    Added,
    /// It was there, and is gone.
    Removed,
    /// Its content, type, mode or times changed, or another file took its
    /// name.
    Changed,
}

impl ChangeKind {
    /// The word `down` prints.
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Added => "added",
            ChangeKind::Removed => "removed",
            ChangeKind::Changed => "changed",
        }
    }
}

/// One entry that changed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkspaceChange {
    /// Its path, relative to the workspace.
    pub path: RelativePath,
    /// How.
    pub change: ChangeKind,
}

/// What changed on the host during a generation below the directories
/// holding scripts the host's git runs, which the developer should review
/// before the next git command runs them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkspaceChanges {
    /// The changes, by path; as many as fit the answer.
    pub changes: Vec<WorkspaceChange>,
    /// How many changes there were in all.
    pub total: u64,
    /// Directories not compared: they hold more entries than Lazaret
    /// compares.
    pub unchecked: Vec<RelativePath>,
}

/// What the supervisor asks of its router: serve the FUSE connection the
/// packet carries.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServeRequest {
    /// The `/dev/fuse` connection of the mounted workspace.
    pub fuse: FdIndex,
    /// The host workspace directory.
    pub host: FdIndex,
    /// The Domain's isolated directory, for ignored paths and the git
    /// metadata the sandbox makes.
    pub isolated: FdIndex,
    /// The sealed memfd holding the encoded [`WorkspaceRules`].
    pub rules: FdIndex,
}

/// The supervisor's request to its router.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RouterRequest {
    /// Serve the workspace.
    Serve(ServeRequest),
}

impl WireRecord for RouterRequest {
    const NAME: &'static str = "RouterRequest";
}

/// Which step of starting the router failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RouterStep {
    /// The request or its descriptors were malformed.
    Request,
    /// The router's own privileges were not what it expects.
    Privileges,
    /// The rules memfd was unsealed, unreadable or invalid.
    Rules,
    /// The FUSE connection could not be set up.
    Connection,
}

/// A failure the router reports before exiting; it renders as the
/// failure's sentence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{failure}")]
pub struct RouterError {
    /// The step that failed.
    pub step: RouterStep,
    /// What failed and why.
    pub failure: crate::failure::Failure,
}

/// What the router serves, as it reports once it is ready.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoutingSummary {
    /// Repositories whose rules apply.
    pub scopes: u32,
    /// `.gitignore` files read.
    pub ignore_files: u32,
    /// Tracked paths the rules would otherwise ignore.
    pub tracked_ignored: u32,
    /// Paths the host's git configuration reads or runs, made read-only.
    pub read_only: u32,
    /// Host paths kept isolated although the rules would share them.
    pub kept_isolated: u32,
}

impl RoutingSummary {
    /// The counts of `rules`.
    pub fn of(rules: &WorkspaceRules) -> Self {
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        Self {
            scopes: count(rules.scopes.len()),
            ignore_files: count(rules.scopes.iter().map(|s| s.ignore_files.len()).sum()),
            tracked_ignored: count(
                rules
                    .scopes
                    .iter()
                    .map(|s| s.tracked_ignored.len() + s.tracked_ignored_dirs.len())
                    .sum(),
            ),
            read_only: count(rules.read_only.len() + rules.read_only_prefixes.len()),
            kept_isolated: count(rules.kept_isolated.len()),
        }
    }
}

/// The router's one report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RouterReport {
    /// The connection is initialized and served from now on.
    Ready(RoutingSummary),
    /// Starting failed; the router exits.
    Failed(RouterError),
}

impl WireRecord for RouterReport {
    const NAME: &'static str = "RouterReport";
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{assert_rejects_bad_envelopes, round_trip};

    fn path(text: &str) -> RelativePath {
        RelativePath(text.as_bytes().to_vec())
    }

    #[test]
    fn relative_paths_are_plain() {
        for good in ["", "a", "a/b", ".env", "a/.git/config", "..a", "a\u{e9}"] {
            assert!(path(good).is_valid(), "{good:?}");
        }
        for bad in [
            "/", "/a", "a/", "a//b", ".", "a/./b", "..", "a/../b", "a\0b",
        ] {
            assert!(!path(bad).is_valid(), "{bad:?}");
        }
        assert_eq!(
            path("a/b/c").components().collect::<Vec<_>>(),
            [b"a" as &[u8], b"b", b"c"]
        );
        assert_eq!(path("").components().count(), 0);
    }

    fn rules() -> WorkspaceRules {
        WorkspaceRules {
            isolate_ignored: true,
            global_excludes: b"*.swp\n".to_vec(),
            scopes: vec![IgnoreScope {
                root: path(""),
                prefix: path("sub"),
                exclude: b"/secret\n".to_vec(),
                ignore_files: vec![IgnoreFile {
                    dir: path("sub"),
                    content: b".env\nnode_modules/\n".to_vec(),
                }],
                tracked_ignored: vec![path("sub/keep.log")],
                tracked_ignored_dirs: vec![path("sub/vendor/module")],
            }],
            read_only: vec![path(".husky")],
            read_only_prefixes: vec![NamePrefix {
                dir: path(""),
                prefix: b"pre_commit.".to_vec(),
            }],
            git_dirs: vec![path(".bare")],
            kept_isolated: vec![path(".env"), path("node_modules")],
        }
    }

    #[test]
    fn messages_round_trip() {
        let r = rules();
        round_trip(&r);
        assert_rejects_bad_envelopes(&r);
        assert_eq!(r.invalid_path(), None);
        let summary = RoutingSummary::of(&r);
        assert_eq!(
            summary,
            RoutingSummary {
                scopes: 1,
                ignore_files: 1,
                tracked_ignored: 2,
                read_only: 2,
                kept_isolated: 2,
            }
        );
        round_trip(&RouterRequest::Serve(ServeRequest {
            fuse: FdIndex(0),
            host: FdIndex(1),
            isolated: FdIndex(2),
            rules: FdIndex(3),
        }));
        round_trip(&RouterReport::Ready(summary));
        round_trip(&RouterReport::Failed(RouterError {
            step: RouterStep::Rules,
            failure: crate::failure::Failure::check("no"),
        }));
    }

    #[test]
    fn a_path_that_escapes_is_found() {
        let mut r = rules();
        r.scopes[0].tracked_ignored.push(path("../etc/passwd"));
        assert_eq!(r.invalid_path(), Some(&path("../etc/passwd")));
        let mut r = rules();
        r.scopes[0].ignore_files[0].dir = path("/abs");
        assert_eq!(r.invalid_path(), Some(&path("/abs")));
        let mut r = rules();
        r.git_dirs.push(path("a/../.."));
        assert_eq!(r.invalid_path(), Some(&path("a/../..")));
        let mut r = rules();
        r.read_only_prefixes[0].dir = path("a/");
        assert_eq!(r.invalid_path(), Some(&path("a/")));
        let mut r = rules();
        r.kept_isolated.push(path("../.ssh"));
        assert_eq!(r.invalid_path(), Some(&path("../.ssh")));
    }
}
