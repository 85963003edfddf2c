//! Where a workspace path lives and what the sandbox may do to it.
//!
//! A [`Classifier`] answers two questions from the [`WorkspaceRules`] of a
//! generation, the same way for the Host Coordinator (which walks the host
//! tree with it while gathering the rules) and for the Workspace Router
//! (which routes every lookup and creation with it):
//!
//! - **route**: does the path live in the host workspace, or in the
//!   Domain's isolated directory? Ignored paths (when isolation is on), the
//!   paths the rules keep isolated from the last generation until the
//!   developer accepts a change, a `.git` the host does not have, and a
//!   `HEAD` the host does not have outside its git directories are
//!   isolated; everything else is the host's.
//! - **protection**: may the sandbox change it? Whatever git reads as
//!   configuration or runs (`config`, `config.worktree`, `commondir`,
//!   `hooks/`, `info/exclude`) in the host's git directories (each `.git`
//!   and those the rules name otherwise), their modules and worktrees, and
//!   in any host directory holding a `HEAD`, is read-only, as is what the
//!   rules name (by path, or by name prefix in a directory) and the lock
//!   file git would take for any of these (`config.lock`); the host's
//!   git directories cannot be moved or removed, and no directory moves
//!   into or out of git metadata.
//!
//! The two facts that make a name git metadata — the host has a `.git`
//! here, the host has a `HEAD` here — are read from the host by the
//! caller at the time of the question. The sandbox can never create
//! either on the host (both route to the isolated side), so each one found
//! there was made by the host.
//!
//! Ignore classification follows git's own rules: the `.gitignore` of the
//! deepest directory wins over shallower ones, then `info/exclude`, then
//! the global excludes; the last matching line of a file wins; a path below
//! an ignored directory is ignored; a tracked path is never ignored. It
//! trusts the rules it is given and nothing else; it touches no file.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use ignore::Match;
use ignore::gitignore::{Gitignore, GitignoreBuilder};
use lazaret_proto::router::WorkspaceRules;

/// The name of git's metadata directory (or file).
pub const GIT_DIR_NAME: &[u8] = b".git";

/// The file whose presence makes a directory look like a git directory to
/// git's repository discovery (with `objects/` and `refs/`).
pub const HEAD_NAME: &[u8] = b"HEAD";

/// The state of an operation in progress that git carries on later: a
/// todo list it runs (`exec` lines) when the developer continues.
const IN_PROGRESS: [&[u8]; 3] = [b"rebase-merge", b"rebase-apply", b"sequencer"];

/// The suffix of the lock file git creates beside a file it rewrites
/// (`config.lock` for `config`), and renames over it when done.
pub const LOCK_SUFFIX: &[u8] = b".lock";

/// The name a lock file locks: `config` for `config.lock`.
fn locked_name(name: &[u8]) -> Option<&[u8]> {
    name.strip_suffix(LOCK_SUFFIX).filter(|n| !n.is_empty())
}

/// Names whose protection, or route, depends on a `HEAD` beside them.
pub fn needs_head(name: &[u8]) -> bool {
    let name = locked_name(name).unwrap_or(name);
    matches!(
        name,
        b"config" | b"config.worktree" | b"commondir" | b"hooks"
    ) || IN_PROGRESS.contains(&name)
}

/// Where a path lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// In the host workspace.
    Host,
    /// In the Domain's isolated directory, visible inside the sandbox only.
    Isolated,
}

/// What the sandbox may do to a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Protection {
    /// Anything its mode allows.
    None,
    /// A directory inside the host's git metadata, or holding a path the
    /// host's git configuration reads or runs: it may gain and lose entries
    /// and be removed, but not be renamed or be the target of a rename, so
    /// nothing moves into or out of a protected position.
    Unmovable,
    /// A `.git` directory of the host: it cannot be renamed, replaced,
    /// removed or changed itself; its entries follow their own protection.
    Fixed,
    /// Configuration or hooks git reads or runs, or a `.git` file of the
    /// host: no write, no change, no rename from or to it, no removal, no
    /// creation; below a read-only directory nothing can be created.
    ReadOnly,
}

impl Protection {
    /// Whether the entry itself may not be renamed, replaced or removed.
    pub fn is_pinned(self) -> bool {
        self >= Protection::Fixed
    }
}

/// What a directory passes on to the classification of its entries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirState {
    kind: DirKind,
    /// Everything below is read-only (a `hooks` directory).
    read_only: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum DirKind {
    /// Isolated: everything below is isolated too.
    Isolated,
    /// Inside the host's git metadata, at `rel` below the `.git`
    /// directory: everything below is the host's, and ignore rules do not
    /// apply.
    GitDir { rel: Vec<u8> },
    /// A worktree directory of the host.
    Tree {
        /// The innermost scope, if any.
        scope: Option<usize>,
        /// The directory relative to that scope's repository root.
        rel: Vec<u8>,
        /// The directory is ignored but holds tracked paths: its untracked
        /// entries are ignored.
        ignored: bool,
    },
}

impl DirState {
    fn of(kind: DirKind) -> Self {
        DirState {
            kind,
            read_only: false,
        }
    }

    /// The state of an isolated directory.
    pub fn isolated() -> Self {
        DirState::of(DirKind::Isolated)
    }

    /// Whether the directory's entries are isolated.
    pub fn is_isolated(&self) -> bool {
        self.kind == DirKind::Isolated
    }

    /// Whether the directory is git metadata of the host.
    pub fn is_git_metadata(&self) -> bool {
        matches!(self.kind, DirKind::GitDir { .. })
    }

    /// Whether nothing below may be created or changed.
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// The scope whose rules apply to the directory's entries and the
    /// directory's path relative to that scope's root; `None` outside a
    /// worktree directory of the host (isolated, or git metadata).
    pub fn scope(&self) -> Option<(Option<usize>, &[u8])> {
        match &self.kind {
            DirKind::Tree { scope, rel, .. } => Some((*scope, rel)),
            DirKind::Isolated | DirKind::GitDir { .. } => None,
        }
    }
}

/// What the host has around a name, read by the caller when it asks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostFacts {
    /// The host has an entry of this name in this directory.
    pub exists: bool,
    /// The host has a `HEAD` in this directory.
    pub dir_holds_head: bool,
}

/// One scope's compiled rules.
#[derive(Debug)]
struct Scope {
    /// The workspace relative to the scope root (the enclosing repository).
    prefix: Vec<u8>,
    /// `info/exclude`.
    exclude: Gitignore,
    /// Each `.gitignore`, by directory relative to the scope root.
    files: HashMap<Vec<u8>, Gitignore>,
    /// Tracked paths (all of them, or only those the rules ignore).
    tracked: HashSet<Vec<u8>>,
    /// Every proper ancestor of a tracked path.
    tracked_dirs: HashSet<Vec<u8>>,
    /// Directories tracked whole (submodules, sparse directories).
    tracked_trees: HashSet<Vec<u8>>,
}

/// The rules of one generation, compiled.
#[derive(Debug)]
pub struct Classifier {
    isolate: bool,
    global: Gitignore,
    scopes: Vec<Scope>,
    /// Nested scopes by workspace-relative root.
    scope_roots: HashMap<Vec<u8>, usize>,
    /// Paths the host's git configuration reads or runs, read-only with
    /// everything below them.
    read_only: HashSet<Vec<u8>>,
    /// Names read-only by prefix, by the directory holding them.
    read_only_prefixes: HashMap<Vec<u8>, Vec<Vec<u8>>>,
    /// The host's git directories not named `.git`.
    git_dirs: HashSet<Vec<u8>>,
    /// The directories holding any of them, unmovable.
    unmovable: HashSet<Vec<u8>>,
    /// Paths isolated, with everything below them, whatever the rest of
    /// the rules say: what the last generation isolated and the developer
    /// has not agreed to share.
    kept: HashSet<Vec<u8>>,
}

/// `dir` joined with `name`; the empty path is the root.
pub fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    if dir.is_empty() {
        return name.to_vec();
    }
    let mut path = Vec::with_capacity(dir.len() + 1 + name.len());
    path.extend_from_slice(dir);
    path.push(b'/');
    path.extend_from_slice(name);
    path
}

fn components(path: &[u8]) -> impl Iterator<Item = &[u8]> {
    path.split(|b| *b == b'/').filter(|c| !c.is_empty())
}

/// Every proper ancestor of `path` except the root, shallowest first.
fn proper_ancestors(path: &[u8]) -> impl Iterator<Item = &[u8]> {
    path.iter()
        .enumerate()
        .filter(|(_, b)| **b == b'/')
        .map(move |(i, _)| &path[..i])
}

/// Compiles one ignore file's lines, as git reads them: comments, blank
/// lines and lines that are not valid patterns are skipped. A byte that is
/// not UTF-8 becomes `?`, which matches it (and any other one character):
/// the pattern then ignores at least what git's would.
pub fn compile(content: &[u8]) -> Gitignore {
    let mut builder = GitignoreBuilder::new("");
    for line in content.split(|b| *b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let mut text = String::with_capacity(line.len());
        for chunk in line.utf8_chunks() {
            text.push_str(chunk.valid());
            text.extend(std::iter::repeat_n('?', chunk.invalid().len()));
        }
        // An invalid pattern matches nothing in git either.
        let _ = builder.add_line(None, &text);
    }
    builder.build().unwrap_or_else(|_| Gitignore::empty())
}

fn matched(ignore: &Gitignore, path: &[u8], is_dir: bool) -> Option<bool> {
    match ignore.matched(Path::new(OsStr::from_bytes(path)), is_dir) {
        Match::None => None,
        Match::Ignore(_) => Some(true),
        Match::Whitelist(_) => Some(false),
    }
}

impl Scope {
    fn track(&mut self, path: Vec<u8>) {
        for ancestor in proper_ancestors(&path) {
            self.tracked_dirs.insert(ancestor.to_vec());
        }
        self.tracked.insert(path);
    }

    /// Git's verdict on `rel` by the patterns alone: the deepest
    /// `.gitignore` that has a say, then `info/exclude`, then the global
    /// excludes.
    fn pattern_ignores(&self, global: &Gitignore, rel: &[u8], is_dir: bool) -> bool {
        let mut end = rel.len();
        loop {
            // The directory whose `.gitignore` is tried: the parent of
            // `rel[..end]`, deepest first.
            let dir_end = rel[..end].iter().rposition(|b| *b == b'/');
            let dir = &rel[..dir_end.unwrap_or(0)];
            if let Some(file) = self.files.get(dir) {
                let below = if dir.is_empty() {
                    rel
                } else {
                    &rel[dir.len() + 1..]
                };
                if let Some(verdict) = matched(file, below, is_dir) {
                    return verdict;
                }
            }
            match dir_end {
                Some(i) => end = i,
                None => break,
            }
        }
        matched(&self.exclude, rel, is_dir)
            .or_else(|| matched(global, rel, is_dir))
            .unwrap_or(false)
    }
}

impl Classifier {
    /// Compiles `rules`.
    pub fn new(rules: &WorkspaceRules) -> Self {
        let mut classifier = Classifier::empty(rules.isolate_ignored, &rules.global_excludes);
        for path in &rules.read_only {
            classifier.add_read_only(path.as_bytes());
        }
        for names in &rules.read_only_prefixes {
            classifier.add_read_only_prefix(names.dir.as_bytes(), &names.prefix);
        }
        for path in &rules.git_dirs {
            classifier.add_git_dir(path.as_bytes());
        }
        for path in &rules.kept_isolated {
            classifier.keep_isolated(path.as_bytes());
        }
        for scope in &rules.scopes {
            let index = classifier.add_scope(
                scope.root.as_bytes(),
                scope.prefix.as_bytes(),
                &scope.exclude,
            );
            for file in &scope.ignore_files {
                classifier.add_ignore_file(index, file.dir.as_bytes(), &file.content);
            }
            for path in &scope.tracked_ignored {
                classifier.add_tracked(index, path.as_bytes());
            }
            for path in &scope.tracked_ignored_dirs {
                classifier.add_tracked_dir(index, path.as_bytes());
            }
        }
        classifier
    }

    /// A classifier with no scope yet, for building up while the host tree
    /// is walked.
    pub fn empty(isolate: bool, global_excludes: &[u8]) -> Self {
        Classifier {
            isolate,
            global: compile(global_excludes),
            scopes: Vec::new(),
            scope_roots: HashMap::new(),
            read_only: HashSet::new(),
            read_only_prefixes: HashMap::new(),
            git_dirs: HashSet::new(),
            unmovable: HashSet::new(),
            kept: HashSet::new(),
        }
    }

    /// Isolates `path` (workspace-relative; the empty path is the whole
    /// workspace) with everything below it, whatever the rest of the rules
    /// say.
    pub fn keep_isolated(&mut self, path: &[u8]) {
        self.kept.insert(path.to_vec());
    }

    /// Makes `path` (workspace-relative) read-only, with everything below
    /// it, and the directories holding it unmovable.
    pub fn add_read_only(&mut self, path: &[u8]) {
        self.pin_ancestors(path);
        self.read_only.insert(path.to_vec());
    }

    /// Makes every entry of `dir` (workspace-relative) whose name starts
    /// with `prefix` read-only, with everything below it; `dir` and the
    /// directories holding it become unmovable.
    pub fn add_read_only_prefix(&mut self, dir: &[u8], prefix: &[u8]) {
        if !dir.is_empty() {
            self.pin_ancestors(dir);
            self.unmovable.insert(dir.to_vec());
        }
        self.read_only_prefixes
            .entry(dir.to_vec())
            .or_default()
            .push(prefix.to_vec());
    }

    /// Takes the directory at `path` (workspace-relative) for a git
    /// directory of the host, as a `.git` is; the directories holding it
    /// become unmovable.
    pub fn add_git_dir(&mut self, path: &[u8]) {
        self.pin_ancestors(path);
        self.git_dirs.insert(path.to_vec());
    }

    fn pin_ancestors(&mut self, path: &[u8]) {
        for ancestor in proper_ancestors(path) {
            self.unmovable.insert(ancestor.to_vec());
        }
    }

    /// Whether the entry `name` of a worktree directory at `dir_path` is a
    /// git directory's place: `.git`, or one the rules name.
    fn is_git_dir(&self, dir_path: &[u8], name: &[u8]) -> bool {
        name == GIT_DIR_NAME
            || (!self.git_dirs.is_empty() && self.git_dirs.contains(&join(dir_path, name)))
    }

    /// Adds a scope rooted at `root` (workspace-relative; the first scope's
    /// root is the workspace), the workspace being at `prefix` inside it;
    /// returns its index.
    pub fn add_scope(&mut self, root: &[u8], prefix: &[u8], exclude: &[u8]) -> usize {
        let index = self.scopes.len();
        self.scopes.push(Scope {
            prefix: prefix.to_vec(),
            exclude: compile(exclude),
            files: HashMap::new(),
            tracked: HashSet::new(),
            tracked_dirs: HashSet::new(),
            tracked_trees: HashSet::new(),
        });
        if index > 0 {
            self.scope_roots.insert(root.to_vec(), index);
        }
        index
    }

    /// Adds the `.gitignore` of `dir` (relative to the scope root).
    pub fn add_ignore_file(&mut self, scope: usize, dir: &[u8], content: &[u8]) {
        self.scopes[scope]
            .files
            .insert(dir.to_vec(), compile(content));
    }

    /// Marks `path` (relative to the scope root) tracked.
    pub fn add_tracked(&mut self, scope: usize, path: &[u8]) {
        self.scopes[scope].track(path.to_vec());
    }

    /// Marks the directory `path` (relative to the scope root) tracked
    /// whole: a submodule, or a sparse directory.
    pub fn add_tracked_dir(&mut self, scope: usize, path: &[u8]) {
        let s = &mut self.scopes[scope];
        s.track(path.to_vec());
        s.tracked_trees.insert(path.to_vec());
    }

    /// The state of the workspace root: the enclosing repository's rules
    /// applied to the workspace's own path in it.
    pub fn root(&self) -> DirState {
        if self.kept.contains(&[] as &[u8]) {
            return DirState::isolated();
        }
        let mut state = DirState::of(DirKind::Tree {
            scope: (!self.scopes.is_empty()).then_some(0),
            rel: Vec::new(),
            ignored: false,
        });
        if let Some(scope) = self.scopes.first() {
            for component in components(&scope.prefix) {
                state = self.in_scope(&state, component, true).1;
            }
        }
        state
    }

    /// Whether the whole workspace is isolated: the repository enclosing
    /// it ignores it.
    pub fn workspace_is_isolated(&self) -> bool {
        self.root().is_isolated()
    }

    /// Classifies the entry `name` of the directory at `dir_path` (whose
    /// state is `dir`): its route and, for a directory, the state it passes
    /// on to its own entries.
    pub fn child(
        &self,
        dir: &DirState,
        dir_path: &[u8],
        name: &[u8],
        is_dir: bool,
        host: HostFacts,
    ) -> (Route, DirState) {
        let (route, state, _) = self.entry(dir, dir_path, name, is_dir, host);
        (route, state)
    }

    /// [`child`](Self::child), with what the sandbox may do to the entry
    /// (nothing is protected on the isolated side), each worked out once.
    pub fn entry(
        &self,
        dir: &DirState,
        dir_path: &[u8],
        name: &[u8],
        is_dir: bool,
        host: HostFacts,
    ) -> (Route, DirState, Protection) {
        let (route, mut state) = self.route_child(dir, dir_path, name, is_dir, host);
        let protection = match route {
            Route::Host => self.protection(dir, dir_path, name, is_dir, host),
            Route::Isolated => Protection::None,
        };
        state.read_only = protection == Protection::ReadOnly;
        (route, state, protection)
    }

    fn route_child(
        &self,
        dir: &DirState,
        dir_path: &[u8],
        name: &[u8],
        is_dir: bool,
        host: HostFacts,
    ) -> (Route, DirState) {
        let isolated = (Route::Isolated, DirState::isolated());
        match &dir.kind {
            DirKind::Isolated => return isolated,
            DirKind::GitDir { .. } if IN_PROGRESS.contains(&name) && !host.exists => {
                // A rebase or cherry-pick started inside stays inside: its
                // todo list must not be what the developer continues.
                return isolated;
            }
            DirKind::GitDir { rel } => {
                let state = DirState::of(DirKind::GitDir {
                    rel: join(rel, name),
                });
                return (Route::Host, state);
            }
            DirKind::Tree { .. } => {}
        }
        // Kept from the last generation: whatever the host has there now,
        // git metadata included, stays out of sight until the developer
        // agrees.
        if !self.kept.is_empty() && self.kept.contains(&join(dir_path, name)) {
            return isolated;
        }
        if self.is_git_dir(dir_path, name) {
            return if host.exists {
                let state = DirState::of(DirKind::GitDir { rel: Vec::new() });
                (Route::Host, state)
            } else {
                isolated
            };
        }
        if name == HEAD_NAME && !host.exists {
            return isolated;
        }
        let (route, state) = self.in_scope(dir, name, is_dir);
        if route == Route::Host && is_dir {
            if let Some(&scope) = self.scope_roots.get(&join(dir_path, name)) {
                let state = DirState::of(DirKind::Tree {
                    scope: Some(scope),
                    rel: Vec::new(),
                    ignored: false,
                });
                return (Route::Host, state);
            }
        }
        (route, state)
    }

    /// The ignore classification of `name` in the scope of `dir`.
    fn in_scope(&self, dir: &DirState, name: &[u8], is_dir: bool) -> (Route, DirState) {
        let DirKind::Tree {
            scope,
            rel,
            ignored,
        } = &dir.kind
        else {
            return (Route::Isolated, DirState::isolated());
        };
        let rel = join(rel, name);
        let tree = |ignored| {
            DirState::of(DirKind::Tree {
                scope: *scope,
                rel: rel.clone(),
                ignored,
            })
        };
        let Some(s) = scope.map(|i| &self.scopes[i]).filter(|_| self.isolate) else {
            return (Route::Host, tree(false));
        };
        // A tracked file; a directory of the same name is not it.
        if s.tracked.contains(&rel) && !is_dir && !s.tracked_trees.contains(&rel) {
            return (Route::Host, tree(false));
        }
        // A directory holding tracked paths, or one the index tracks whole
        // (a submodule), is the host's, but what its own rules do not
        // cover (a submodule's repository is a scope of its own) stays as
        // ignored as around it: an entry the sandbox adds to the index
        // exposes no directory's contents.
        if s.tracked_dirs.contains(&rel) || (is_dir && s.tracked_trees.contains(&rel)) {
            let ignored = *ignored || s.pattern_ignores(&self.global, &rel, true);
            return (Route::Host, tree(ignored));
        }
        if *ignored || s.pattern_ignores(&self.global, &rel, is_dir) {
            return (Route::Isolated, DirState::isolated());
        }
        (Route::Host, tree(false))
    }

    /// What the sandbox may do to the entry `name` of a directory whose
    /// state is `dir`. The lock file of a read-only file (`config.lock`)
    /// is read-only too: one left there would stop the host's git from
    /// changing the file (`git config`: "could not lock config file").
    pub fn protection(
        &self,
        dir: &DirState,
        dir_path: &[u8],
        name: &[u8],
        is_dir: bool,
        host: HostFacts,
    ) -> Protection {
        let protection = self.own_protection(dir, dir_path, name, is_dir, host);
        match locked_name(name) {
            Some(locked)
                if protection != Protection::ReadOnly
                    && self.own_protection(dir, dir_path, locked, false, host)
                        == Protection::ReadOnly =>
            {
                Protection::ReadOnly
            }
            _ => protection,
        }
    }

    /// [`protection`](Self::protection), its lock file aside.
    fn own_protection(
        &self,
        dir: &DirState,
        dir_path: &[u8],
        name: &[u8],
        is_dir: bool,
        host: HostFacts,
    ) -> Protection {
        if dir.read_only {
            return Protection::ReadOnly;
        }
        if dir.is_isolated() {
            return Protection::None;
        }
        let by_prefix = self
            .read_only_prefixes
            .get(dir_path)
            .is_some_and(|prefixes| prefixes.iter().any(|p| name.starts_with(p)));
        if by_prefix {
            return Protection::ReadOnly;
        }
        let git_dir = matches!(dir.kind, DirKind::Tree { .. }) && self.is_git_dir(dir_path, name);
        if !self.read_only.is_empty() || !self.unmovable.is_empty() {
            let path = join(dir_path, name);
            if self.read_only.contains(&path) {
                return Protection::ReadOnly;
            }
            if self.unmovable.contains(&path) {
                // Only a real directory may stand there: a link in its
                // place would lead git elsewhere.
                return if is_dir {
                    self.by_kind(dir, name, is_dir, git_dir, host)
                        .max(Protection::Unmovable)
                } else {
                    Protection::ReadOnly
                };
            }
        }
        self.by_kind(dir, name, is_dir, git_dir, host)
    }

    /// The protection git metadata gives the entry `name` of `dir`, which
    /// is a git directory's place when `git_dir`.
    fn by_kind(
        &self,
        dir: &DirState,
        name: &[u8],
        is_dir: bool,
        git_dir: bool,
        host: HostFacts,
    ) -> Protection {
        match &dir.kind {
            DirKind::Isolated => Protection::None,
            DirKind::GitDir { .. } if IN_PROGRESS.contains(&name) && host.exists => {
                Protection::ReadOnly
            }
            DirKind::GitDir { rel } => match gitdir_protection(&join(rel, name), is_dir) {
                // Any git directory nested in git metadata (a module's, a
                // worktree's, one the sandbox builds) has its own.
                _ if host.dir_holds_head
                    && gitdir_protection(name, is_dir) == Protection::ReadOnly =>
                {
                    Protection::ReadOnly
                }
                protection => protection,
            },
            DirKind::Tree { .. } if git_dir && host.exists => {
                if is_dir {
                    Protection::Fixed
                } else {
                    Protection::ReadOnly
                }
            }
            DirKind::Tree { .. } if host.dir_holds_head => match gitdir_protection(name, is_dir) {
                Protection::ReadOnly => Protection::ReadOnly,
                _ => Protection::None,
            },
            DirKind::Tree { .. } => Protection::None,
        }
    }

    /// The route and state of a workspace-relative path whose last
    /// component is a directory when `is_dir`, asking `host` for the facts
    /// of each component (given its path).
    pub fn walk(
        &self,
        path: &[u8],
        is_dir: bool,
        host: &dyn Fn(&[u8]) -> HostFacts,
    ) -> (Route, DirState) {
        let mut state = self.root();
        let mut route = if state.is_isolated() {
            Route::Isolated
        } else {
            Route::Host
        };
        let mut dir_path: Vec<u8> = Vec::new();
        let mut rest = components(path).peekable();
        while let Some(name) = rest.next() {
            let last = rest.peek().is_none();
            let child_path = join(&dir_path, name);
            let facts = host(&child_path);
            (route, state) = self.child(&state, &dir_path, name, !last || is_dir, facts);
            dir_path = child_path;
        }
        (route, state)
    }

    /// Whether a tracked path (relative to the scope root) would be ignored
    /// if it were not tracked: the patterns ignore it or one of its
    /// directories.
    pub fn ignored_untracked(&self, scope: usize, rel: &[u8], is_dir: bool) -> bool {
        let s = &self.scopes[scope];
        let mut prefix = Vec::new();
        let mut rest = components(rel).peekable();
        while let Some(name) = rest.next() {
            prefix = join(&prefix, name);
            let dir = rest.peek().is_some() || is_dir;
            if s.pattern_ignores(&self.global, &prefix, dir) {
                return true;
            }
        }
        false
    }
}

/// The protection of `rel`, a path inside a git directory of the host.
fn gitdir_protection(rel: &[u8], is_dir: bool) -> Protection {
    let parts: Vec<&[u8]> = components(rel).collect();
    let read_only_name =
        |name: &[u8]| matches!(name, b"config" | b"config.worktree" | b"commondir");
    let read_only = match parts.as_slice() {
        [b"hooks", ..] | [b"info", b"exclude" | b"attributes"] => true,
        [name] => read_only_name(name),
        [b"modules" | b"worktrees", inner @ ..] => {
            inner.len() > 1
                && (inner.contains(&(b"hooks" as &[u8]))
                    || inner.last().is_some_and(|n| read_only_name(n))
                    || inner.ends_with(&[b"info" as &[u8], b"exclude"])
                    || inner.ends_with(&[b"info" as &[u8], b"attributes"]))
        }
        _ => false,
    };
    if read_only {
        Protection::ReadOnly
    } else if is_dir {
        Protection::Unmovable
    } else {
        Protection::None
    }
}
