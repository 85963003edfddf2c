//! Taking a generation's [`WorkspaceRules`] from the host, once, when it
//! starts.
//!
//! Owns repository discovery (the workspace's own repository, one that
//! encloses it, a linked worktree's), the reading of every `.gitignore`
//! that applies (above the workspace inside its repository, and in every
//! directory of the workspace that is not itself ignored),
//! `info/exclude`, the user's `core.excludesFile`, the indexes of the
//! repository and of the submodules and repositories nested in the
//! workspace, and the reduction of each index to the tracked paths its
//! rules would otherwise ignore. Owns too finding what git reads or runs
//! inside the workspace: the git directories not named `.git` that a
//! `.git` file or link names, the paths and names the repositories'
//! configuration and hooks make git read or run, what the scripts among
//! them run and source in turn, and the directories holding those
//! scripts (made read-only, and watched for `down`). Owns, given the rules
//! the Domain's last generation routed by, finding the host paths those
//! isolated that the new rules would share: the top-most of each, found
//! on the same walk.
//!
//! Runs in the Host Coordinator as the invoking user. Inside the workspace
//! it reaches files only through the workspace descriptor, beneath it, with
//! no symbolic link followed (a `.gitignore` that is a link is skipped, as
//! git skips it); the repository's own files outside the workspace are read
//! by path, as git reads them. Everything it reads may have been written by
//! the previous generation's sandbox (tracked `.gitignore` files, the
//! index): it is parsed as data with bounded sizes, never executed.

use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use lazaret_proto::router::{IgnoreFile, IgnoreScope, NamePrefix, RelativePath, WorkspaceRules};
use rustix::fs::{FileType, OFlags};

use crate::classify::{Classifier, DirState, GIT_DIR_NAME, HEAD_NAME, HostFacts, Route, join};
use crate::command::command_names;
use crate::gitconfig::{ConfigError, Configuration, Runs, UserConfig, normalize};
use lazaret_hostfs::beneath::Listed;
use lazaret_hostfs::read::ReadError;

/// The largest ignore file read (git's own limit is higher; a larger one
/// is refused rather than silently skipped, which could expose a secret).
pub const MAX_IGNORE_FILE_LEN: u64 = 1024 * 1024;

/// The largest allocation a hostile index may cause.
const INDEX_ALLOC_LIMIT: usize = 512 * 1024 * 1024;

/// The largest index read.
const MAX_INDEX_LEN: u64 = 1 << 30;

/// The largest `.git` file read.
const MAX_GIT_FILE_LEN: u64 = 4096;

/// How many directories below the workspace's root the walk goes. A
/// deeper directory that is not ignored stops `up` (its `.gitignore`
/// cannot be left unread), naming it. Projects nest a few dozen levels;
/// the bound is far above that and keeps the walk, and the paths it names,
/// finite.
pub const MAX_WALK_DEPTH: usize = 1024;

/// The longest path of a directory the walk takes, in bytes: the kernel
/// resolves at most `PATH_MAX` (4096) bytes, its terminating NUL included,
/// in one call, and git's files in the directory (`.git/commondir`) are
/// read by their whole path, so some room is left for their names.
pub const MAX_WALK_PATH_LEN: usize = 4000;

/// Why the rules could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum GatherError {
    /// A file or directory could not be read.
    #[error(
        "cannot read {path} ({error}); Lazaret reads it to take the workspace's git rules: \
         make it readable by you, or remove it"
    )]
    Read {
        /// What was read.
        path: String,
        /// What the kernel said.
        error: std::io::Error,
    },
    /// A directory of the workspace cannot be read, so its `.gitignore`
    /// (if any) cannot be; going on could expose what it ignores.
    #[error(
        "cannot read {path} ({error}); Lazaret reads every .gitignore in the workspace before \
         the sandbox starts: make it readable (chmod u+rx) or list it in a .gitignore"
    )]
    Unreadable {
        /// The directory.
        path: String,
        /// What the kernel said.
        error: std::io::Error,
    },
    /// The workspace is git metadata itself (a `.git` directory or a
    /// directory inside one), where the sandbox could write what git runs.
    #[error(
        "{path} is inside the git directory {git_dir} (or is that directory); run Lazaret on \
         the repository's worktree, not on its git metadata"
    )]
    InsideGitDir {
        /// The workspace.
        path: String,
        /// The git directory holding it.
        git_dir: String,
    },
    /// Names in the workspace may compare without case: `.GIT/config`
    /// would be `.git/config`, unprotected.
    #[error(
        "{path} is on {kind}, where names compare without case (`.GIT` is `.git`), so Lazaret \
         cannot keep git metadata read-only there; move the project to a case-sensitive \
         filesystem (ext4, btrfs, xfs)"
    )]
    CaseInsensitive {
        /// The directory.
        path: String,
        /// What folds case.
        kind: &'static str,
    },
    /// An ignore or configuration file is larger than Lazaret reads.
    #[error(
        "{path} is larger than {max} bytes, more than Lazaret reads for the workspace's git \
         rules: shorten it, or set isolate_gitignored = false in the profile"
    )]
    TooLarge {
        /// The file.
        path: String,
        /// The limit.
        max: u64,
    },
    /// A git configuration file could not be read.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A git index did not decode.
    #[error(
        "cannot read the git index {path}: {reason}; run `git status` on the host to rewrite it"
    )]
    Index {
        /// The index file.
        path: String,
        /// What gix-index said.
        reason: String,
    },
    /// A directory that is not ignored lies deeper than the walk goes.
    #[error(
        "the workspace holds directories more than {max} levels deep, deeper than Lazaret \
         walks to read the workspace's .gitignore files before the sandbox starts: move them \
         up, list them (or a directory above them) in a .gitignore, or set \
         isolate_gitignored = false in the profile; the first one is {path}"
    )]
    TooDeep {
        /// The first directory found below the bound.
        path: String,
        /// The bound.
        max: usize,
    },
    /// A directory that is not ignored has a path longer than the kernel
    /// resolves in one call.
    #[error(
        "the workspace holds a directory whose path is {len} bytes long, longer than the \
         {max} bytes Lazaret reads a directory by (Linux resolves at most 4095 at once), so \
         its .gitignore cannot be read before the sandbox starts: shorten the names on its \
         path, move it up, list it (or a directory above it) in a .gitignore, or set \
         isolate_gitignored = false in the profile; it is {path}"
    )]
    PathTooLong {
        /// The directory.
        path: String,
        /// Its path's length in bytes.
        len: usize,
        /// The longest path taken.
        max: usize,
    },
    /// A `.git` file does not name a git directory.
    #[error(
        "{path} is not a `gitdir: PATH` file of at most 4096 bytes, as git writes them: fix it \
         (`git worktree repair`, `git submodule absorbgitdirs`) or remove it"
    )]
    GitFile {
        /// The file.
        path: String,
    },
}

fn read_error(path: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> GatherError {
    move |error| GatherError::Read {
        path: path.to_string(),
        error,
    }
}

/// The rules, and what discovery found.
#[derive(Debug)]
pub struct Gathered {
    /// The rules.
    pub rules: WorkspaceRules,
    /// The root of the repository the workspace is (or is in) on the host.
    pub repository: Option<PathBuf>,
    /// Whether that repository ignores the whole workspace (everything the
    /// sandbox writes there then stays in Domain storage).
    pub workspace_ignored: bool,
    /// The host paths that the earlier rules [`gather`] was given isolated
    /// and these rules would share, relative to the workspace, sorted:
    /// each the top-most such path (a directory stands for everything
    /// below it); the empty path is the whole workspace.
    pub newly_shared: Vec<RelativePath>,
    /// The directories holding scripts git runs for the host (a filter's,
    /// a driver's, a hook's), relative to the workspace: what changes
    /// below them during the generation is for the developer to review
    /// (see [`crate::watch`]).
    pub watched: Vec<RelativePath>,
}

/// A scope's tracked paths, relative to its repository's root, each with
/// whether it stands for a whole directory (a submodule, or a sparse
/// directory).
type Tracked = Vec<(Vec<u8>, bool)>;

/// A repository as discovery finds it.
#[derive(Debug)]
struct Repository {
    /// Its worktree root.
    worktree: PathBuf,
    /// Its git directory (a worktree's own for a linked worktree).
    git_dir: PathBuf,
    /// Its common directory (the main repository's for a linked worktree).
    common_dir: PathBuf,
}

/// Takes the rules for the workspace at `workspace_path`, opened as
/// `workspace`. With `isolate` false there are no ignore rules to take.
/// With `earlier`, the rules the Domain's last generation routed by, also
/// finds the host paths those isolated that the new rules would share
/// ([`Gathered::newly_shared`]); none when the new rules isolate nothing.
pub fn gather(
    workspace: BorrowedFd<'_>,
    workspace_path: &Path,
    isolate: bool,
    user: &UserConfig,
    earlier: Option<&WorkspaceRules>,
) -> Result<Gathered, GatherError> {
    let repository = discover(workspace_path)?;
    refuse_git_metadata(workspace_path, repository.as_ref())?;
    let root = lazaret_hostfs::beneath::open_dir(workspace, b"", OFlags::RDONLY).map_err(|e| {
        GatherError::Unreadable {
            path: workspace_path.display().to_string(),
            error: e.into(),
        }
    })?;
    let entries =
        lazaret_hostfs::beneath::list(root.as_fd()).map_err(|error| GatherError::Unreadable {
            path: workspace_path.display().to_string(),
            error,
        })?;
    refuse_case_insensitive(root.as_fd(), &entries, workspace_path)?;
    let mut rules = WorkspaceRules {
        isolate_ignored: isolate,
        global_excludes: Vec::new(),
        scopes: Vec::new(),
        read_only: Vec::new(),
        read_only_prefixes: Vec::new(),
        git_dirs: Vec::new(),
        kept_isolated: Vec::new(),
    };
    let config = user.read(&user.files(
        repository.as_ref().map(|r| r.git_dir.as_path()),
        repository.as_ref().map(|r| r.common_dir.as_path()),
    ))?;
    let mut watched = Vec::new();
    if let Some(repo) = &repository {
        protect_what_git_runs(
            &config,
            &repo.worktree,
            &repo.common_dir,
            workspace_path,
            &mut rules,
            &mut watched,
        );
        add_git_dirs(
            &[&repo.git_dir, &repo.common_dir],
            workspace_path,
            &mut rules,
        );
    }
    if !isolate {
        return Ok(Gathered {
            rules,
            repository: repository.map(|r| r.worktree),
            workspace_ignored: false,
            newly_shared: Vec::new(),
            watched,
        });
    }
    let excludes_file = config.excludes_file();
    if let Some(path) = &excludes_file {
        rules.global_excludes = read_file(None, path, true)?.unwrap_or_default();
    }
    let mut classifier = Classifier::new(&rules);
    let (top, top_tracked) = top_scope(repository.as_ref(), workspace_path)?;
    let index = classifier.add_scope(b"", &top.prefix.0, &top.exclude);
    for file in &top.ignore_files {
        classifier.add_ignore_file(index, &file.dir.0, &file.content);
    }
    track(&mut classifier, index, &top_tracked);
    let mut tracked = vec![top_tracked];
    rules.scopes.push(top);

    let workspace_ignored = classifier.workspace_is_isolated();
    let mut newly_shared = Vec::new();
    if !workspace_ignored {
        let before = earlier_state(earlier, &mut newly_shared);
        walk(
            workspace,
            workspace_path,
            (user, excludes_file.as_deref()),
            &mut classifier,
            Found {
                rules: &mut rules,
                tracked: &mut tracked,
                watched: &mut watched,
            },
            before.as_ref().map(|(before, root)| Before {
                classifier: before,
                root: root.clone(),
                newly_shared: &mut newly_shared,
            }),
        )?;
    }
    newly_shared.sort();
    keep_tracked_ignored(&classifier, &mut rules.scopes, &tracked);
    Ok(Gathered {
        rules,
        repository: repository.map(|r| r.worktree),
        workspace_ignored,
        newly_shared,
        watched,
    })
}

/// The top scope: the repository's (or none), with its `info/exclude` and
/// the `.gitignore` files between its root and the workspace, and the
/// paths its index tracks inside the workspace.
fn top_scope(
    repository: Option<&Repository>,
    workspace_path: &Path,
) -> Result<(IgnoreScope, Tracked), GatherError> {
    let prefix = repository
        .and_then(|r| workspace_path.strip_prefix(&r.worktree).ok())
        .map(|p| p.as_os_str().as_bytes().to_vec())
        .unwrap_or_default();
    let mut top = IgnoreScope {
        root: RelativePath::default(),
        prefix: RelativePath(prefix.clone()),
        exclude: Vec::new(),
        ignore_files: Vec::new(),
        tracked_ignored: Vec::new(),
        tracked_ignored_dirs: Vec::new(),
    };
    let Some(repo) = repository else {
        return Ok((top, Vec::new()));
    };
    top.exclude = read_file(None, &repo.common_dir.join("info/exclude"), true)?.unwrap_or_default();
    for dir in dirs_above(&prefix) {
        let path = repo
            .worktree
            .join(OsStr::from_bytes(&dir))
            .join(".gitignore");
        if let Some(content) = read_file(None, &path, false)? {
            top.ignore_files.push(IgnoreFile {
                dir: RelativePath(dir),
                content,
            });
        }
    }
    let tracked = read_index(&repo.git_dir.join("index"), Some(&prefix))?;
    Ok((top, tracked))
}

/// The directories from a repository's root down to the one holding the
/// workspace at `prefix` below it, as paths relative to the root (the
/// root is the empty path); the workspace itself is read by the walk.
fn dirs_above(prefix: &[u8]) -> Vec<Vec<u8>> {
    let mut dir = Vec::new();
    let mut dirs = vec![Vec::new()];
    for component in prefix.split(|b| *b == b'/').filter(|c| !c.is_empty()) {
        dir = join(&dir, component);
        dirs.push(dir.clone());
    }
    dirs.pop();
    dirs
}

/// The earlier rules, where they isolated anything, and their state of
/// the workspace's root; none, with the whole workspace newly shared,
/// when they isolated all of it.
fn earlier_state(
    earlier: Option<&WorkspaceRules>,
    newly_shared: &mut Vec<RelativePath>,
) -> Option<(Classifier, DirState)> {
    let before = earlier
        .filter(|rules| rules.isolate_ignored)
        .map(Classifier::new)?;
    if before.workspace_is_isolated() {
        newly_shared.push(RelativePath::default());
        return None;
    }
    let root = before.root();
    Some((before, root))
}

/// Keeps of each scope's `tracked` paths only those that matter: those
/// its rules would ignore.
fn keep_tracked_ignored(classifier: &Classifier, scopes: &mut [IgnoreScope], tracked: &[Tracked]) {
    for (i, scope) in scopes.iter_mut().enumerate() {
        for (path, whole_dir) in &tracked[i] {
            if classifier.ignored_untracked(i, path, *whole_dir) {
                let kept = if *whole_dir {
                    &mut scope.tracked_ignored_dirs
                } else {
                    &mut scope.tracked_ignored
                };
                kept.push(RelativePath(path.clone()));
            }
        }
    }
}

/// The files of hook managers (and of tools hooks commonly run) that
/// decide what a hook runs, as name prefixes in a directory of the
/// worktree (so that every variant is covered: `.huskyrc.json`,
/// `lefthook-local.yml`, `.config/lefthook.toml`, `commitlint.config.js`),
/// protected when hooks are installed.
const HOOK_MANAGER_NAMES: [(&str, &str); 10] = [
    ("", ".husky"),
    ("", ".pre-commit-config."),
    ("", "lefthook"),
    ("", ".lefthook"),
    (".config", "lefthook"),
    ("", ".overcommit"),
    ("", ".lintstagedrc"),
    ("", "lint-staged.config."),
    ("", ".commitlintrc"),
    ("", "commitlint.config."),
];

/// The largest hook or script scanned for the paths it runs.
const MAX_HOOK_LEN: u64 = 1024 * 1024;

/// The most hooks and scripts scanned for one repository: what they run
/// and source is followed that far, script by script.
const MAX_SCRIPTS: usize = 256;

/// The most symbolic links followed from one path, as the kernel allows.
const MAX_LINKS: usize = 40;

/// Adds to `rules` every path inside the workspace that git, for the
/// repository at `worktree` with git directory `common_dir` and
/// configuration `config`, reads as configuration or runs: its hooks
/// directory, included files and what its commands name; each hook and
/// each script, what they run and source in turn, and the modules they
/// run; the directory holding each script (an interpreter loads code
/// from it: `import json` in `scripts/clean.py` finds `scripts/json.py`
/// first); and, when hooks are installed, the hook managers' files. Each
/// is taken as written and through every link on its way. The workspace
/// itself, and a repository's worktree root, are never made read-only
/// whole: a script's directory that is one is added to `watched` instead,
/// as is every other script's directory, for `down` to compare.
fn protect_what_git_runs(
    config: &Configuration,
    worktree: &Path,
    common_dir: &Path,
    workspace_path: &Path,
    rules: &mut WorkspaceRules,
    watched: &mut Vec<RelativePath>,
) {
    let mut runs = config.what_runs(worktree);
    let hooks_dir = config
        .hooks_path(worktree)
        .unwrap_or_else(|| common_dir.join("hooks"));
    let mut hooks = Vec::new();
    if let Ok(entries) = std::fs::read_dir(&hooks_dir) {
        for hook in entries.flatten() {
            let path = hook.path();
            if path.extension().is_some_and(|e| e == "sample") {
                continue;
            }
            hooks.push(path);
        }
    }
    let installed = !hooks.is_empty();
    // husky 9 points `core.hooksPath` at `.husky/_`, whose hooks run the
    // scripts beside it: those are hooks too.
    if let Some(husky) = hooks_dir.parent().filter(|_| hooks_dir.ends_with("_")) {
        if let Ok(scripts) = std::fs::read_dir(husky) {
            hooks.extend(scripts.flatten().map(|script| script.path()));
        }
        runs.paths.push(husky.to_path_buf());
    }
    runs.paths.push(hooks_dir);
    scan_scripts(hooks, worktree, &mut runs);
    let mut prefixes = Vec::new();
    for module in runs.modules.drain(..) {
        if let (Some(dir), Some(name)) = (module.parent(), module.file_name()) {
            let mut prefix = name.as_bytes().to_vec();
            prefix.push(b'.');
            prefixes.push((dir.to_path_buf(), prefix));
        }
        runs.paths.push(module);
    }
    if installed {
        prefixes.extend(
            HOOK_MANAGER_NAMES
                .iter()
                .map(|(dir, prefix)| (worktree.join(dir), prefix.as_bytes().to_vec())),
        );
    }
    let worktree_root = normalize(worktree);
    let mut script_dirs = Vec::new();
    for script in &runs.scripts {
        for resolved in resolutions(script) {
            let Some(dir) = resolved.parent() else {
                continue;
            };
            let Some(inside) = inside(workspace_path, dir) else {
                continue;
            };
            if !watched.contains(&inside) {
                watched.push(inside);
            }
            if dir != worktree_root {
                script_dirs.push(dir.to_path_buf());
            }
        }
    }
    let all = runs
        .paths
        .iter()
        .chain(&runs.scripts)
        .chain(&runs.sourced)
        .chain(&script_dirs);
    for path in all {
        for inside in resolutions(path)
            .into_iter()
            .filter_map(|p| inside(workspace_path, &p))
        {
            if !inside.0.is_empty() && !rules.read_only.contains(&inside) {
                rules.read_only.push(inside);
            }
        }
    }
    for (dir, prefix) in prefixes {
        for dir in resolutions(&dir)
            .into_iter()
            .filter_map(|p| inside(workspace_path, &p))
        {
            let names = NamePrefix {
                dir,
                prefix: prefix.clone(),
            };
            if !rules.read_only_prefixes.contains(&names) {
                rules.read_only_prefixes.push(names);
            }
        }
    }
}

/// Adds to `runs` the `hooks` (as scripts) and what they and every script
/// and sourced file in `runs` name in turn: the paths their lines name
/// (relative ones taken from the worktree, where git runs hooks and
/// filters and what they start), the scripts they run and source and the
/// modules they run, at most [`MAX_SCRIPTS`] files. A hook is read
/// whatever runs it; another script when a shell runs it (see
/// [`runs_in_shell`]); a sourced file always.
fn scan_scripts(hooks: Vec<PathBuf>, worktree: &Path, runs: &mut Runs) {
    // A stack: the hooks are read first.
    let mut pending: Vec<(PathBuf, bool)> =
        runs.sourced.iter().map(|s| (s.clone(), true)).collect();
    pending.extend(runs.scripts.iter().map(|s| (s.clone(), false)));
    pending.extend(hooks.iter().map(|h| (h.clone(), true)));
    runs.scripts.extend(hooks);
    let mut scanned = std::collections::HashSet::new();
    while let Some((script, any)) = pending.pop() {
        if scanned.len() >= MAX_SCRIPTS {
            break;
        }
        if !scanned.insert(normalize(&script)) {
            continue;
        }
        // A script too large to scan is still read-only itself.
        let Ok(Some(text)) = lazaret_hostfs::read::read_small(None, &script, true, MAX_HOOK_LEN)
        else {
            continue;
        };
        let text = String::from_utf8_lossy(&text);
        if !any && !runs_in_shell(&script, &text) {
            continue;
        }
        let mut found = Runs::default();
        for line in text.lines() {
            if line.trim_start().starts_with('#') {
                continue;
            }
            found.add(&command_names(line), worktree, |p| Some(worktree.join(p)));
        }
        pending.extend(found.scripts.iter().map(|s| (s.clone(), false)));
        pending.extend(found.sourced.iter().map(|s| (s.clone(), true)));
        runs.paths.append(&mut found.paths);
        runs.scripts.append(&mut found.scripts);
        runs.sourced.append(&mut found.sourced);
        runs.modules.append(&mut found.modules);
    }
}

/// Whether the script at `path`, holding `text`, is one a shell runs: its
/// `#!` line names a shell, or it has none (the kernel then leaves it to
/// the shell) and its name no other language's extension.
fn runs_in_shell(path: &Path, text: &str) -> bool {
    match text.strip_prefix("#!") {
        Some(line) => {
            let line = line.lines().next().unwrap_or_default();
            let mut words = line.split_whitespace();
            let program = words.next().unwrap_or_default();
            let program = match program.rsplit('/').next() {
                Some("env") => words.find(|w| !w.starts_with('-')).unwrap_or_default(),
                _ => program,
            };
            crate::command::is_shell(program)
        }
        None => path
            .extension()
            .is_none_or(|e| matches!(e.to_str(), Some("sh" | "bash" | "dash" | "ksh" | "zsh"))),
    }
}

/// `path` and every path it becomes as its symbolic links are followed
/// one at a time (a link's target with the rest of the path; a link to a
/// link, on), each what git reads at some step, ending with the path the
/// kernel would open. `..` is applied to what precedes it once that is
/// resolved, as the kernel applies it; each step is also given with its
/// `..` applied by name, which may protect a path more than needed but
/// never less. At most [`MAX_LINKS`] links are followed.
fn resolutions(path: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut path = path.to_path_buf();
    for _ in 0..=MAX_LINKS {
        out.push(normalize(&path));
        let mut resolved = PathBuf::new();
        let mut rest = path.components();
        let mut link = None;
        while let Some(component) = rest.next() {
            match component {
                Component::CurDir => continue,
                Component::ParentDir => {
                    resolved.pop();
                    continue;
                }
                other => resolved.push(other),
            }
            if let Ok(target) = std::fs::read_link(&resolved) {
                let base = resolved.parent().unwrap_or(Path::new("/"));
                link = Some(base.join(target).join(rest.as_path()));
                break;
            }
        }
        match link {
            Some(next) => path = next,
            None => {
                out.push(resolved);
                break;
            }
        }
    }
    out
}

/// `path` relative to the workspace, if it is inside.
fn inside(workspace_path: &Path, path: &Path) -> Option<RelativePath> {
    let rel = path.strip_prefix(workspace_path).ok()?;
    RelativePath::parse(rel.as_os_str().as_bytes())
}

/// Adds the git directories among `dirs` (and their links' targets) that
/// are inside the workspace without being in a `.git` (which is
/// protected by name).
fn add_git_dirs(dirs: &[&Path], workspace_path: &Path, rules: &mut WorkspaceRules) {
    for dir in dirs {
        for inside in resolutions(dir)
            .into_iter()
            .filter_map(|p| inside(workspace_path, &p))
        {
            let named = inside.components().any(|c| c == GIT_DIR_NAME);
            if !inside.0.is_empty() && !named && !rules.git_dirs.contains(&inside) {
                rules.git_dirs.push(inside);
            }
        }
    }
}

/// Marks an index's paths tracked (whole directories as such).
fn track(classifier: &mut Classifier, scope: usize, paths: &[(Vec<u8>, bool)]) {
    for (path, whole_dir) in paths {
        if *whole_dir {
            classifier.add_tracked_dir(scope, path);
        } else {
            classifier.add_tracked(scope, path);
        }
    }
}

/// Refuses a directory whose names may compare without case.
fn refuse_case_insensitive(
    dir: BorrowedFd<'_>,
    entries: &[lazaret_hostfs::beneath::Listed],
    label: &Path,
) -> Result<(), GatherError> {
    match lazaret_hostfs::case::dir_case_insensitive(dir, entries) {
        Ok(None) => Ok(()),
        Ok(Some(kind)) => Err(GatherError::CaseInsensitive {
            path: label.display().to_string(),
            kind,
        }),
        Err(e) => Err(read_error(label.display())(e.into())),
    }
}

/// Refuses a workspace that is, or is inside, a `.git` directory or the
/// git directory of the repository discovery found: inside, git's
/// configuration and hooks would be ordinary files.
fn refuse_git_metadata(
    workspace_path: &Path,
    repository: Option<&Repository>,
) -> Result<(), GatherError> {
    let refuse = |git_dir: &Path| GatherError::InsideGitDir {
        path: workspace_path.display().to_string(),
        git_dir: git_dir.display().to_string(),
    };
    let mut ancestor = PathBuf::new();
    for component in workspace_path.components() {
        ancestor.push(component);
        if component.as_os_str() == OsStr::new(".git") {
            return Err(refuse(&ancestor));
        }
    }
    if let Some(repo) = repository {
        for dir in [&repo.git_dir, &repo.common_dir] {
            let dir = crate::gitconfig::normalize(dir);
            if workspace_path.starts_with(&dir) {
                return Err(refuse(&dir));
            }
        }
    }
    // A git directory no worktree names (a bare repository, a separate git
    // directory): what git's discovery would take for one.
    for ancestor in workspace_path.ancestors() {
        if is_git_directory(ancestor) {
            return Err(refuse(ancestor));
        }
    }
    Ok(())
}

/// Whether git's discovery takes `dir` for a git directory: it holds a
/// `HEAD` and `objects` and `refs` directories.
fn is_git_directory(dir: &Path) -> bool {
    dir.join("HEAD").is_file() && dir.join("objects").is_dir() && dir.join("refs").is_dir()
}

/// Finds the repository holding `start`: the nearest directory at or
/// above it with a `.git` directory or `.git` file, not crossing into
/// another filesystem (git's default).
fn discover(start: &Path) -> Result<Option<Repository>, GatherError> {
    let device = std::fs::symlink_metadata(start)
        .map_err(read_error(start.display()))?
        .dev();
    let mut dir = start;
    loop {
        if let Some((git_dir, common_dir)) = git_dir_of(dir)? {
            return Ok(Some(Repository {
                worktree: dir.to_path_buf(),
                git_dir,
                common_dir,
            }));
        }
        let Some(parent) = dir.parent() else {
            return Ok(None);
        };
        match std::fs::symlink_metadata(parent) {
            Ok(meta) if meta.dev() == device => dir = parent,
            _ => return Ok(None),
        }
    }
}

/// The git and common directories named by `dir/.git`, if it is a git
/// directory or a `gitdir:` file.
fn git_dir_of(dir: &Path) -> Result<Option<(PathBuf, PathBuf)>, GatherError> {
    let dot_git = dir.join(".git");
    let meta = match std::fs::metadata(&dot_git) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            return Err(GatherError::Unreadable {
                path: dir.display().to_string(),
                error: e,
            });
        }
        Err(e) => return Err(read_error(dot_git.display())(e)),
    };
    let git_dir = if meta.is_dir() {
        // A `.git` directory without HEAD is not a repository to git.
        if !dot_git.join("HEAD").exists() {
            return Ok(None);
        }
        dot_git
    } else {
        let not_a_git_file = || GatherError::GitFile {
            path: dot_git.display().to_string(),
        };
        let text = match lazaret_hostfs::read::read_small(None, &dot_git, true, MAX_GIT_FILE_LEN) {
            Ok(Some(text)) => text,
            Ok(None) | Err(ReadError::TooLarge { .. }) => return Err(not_a_git_file()),
            Err(ReadError::Io(e)) => return Err(read_error(dot_git.display())(e)),
        };
        parse_git_file(&text, dir).ok_or_else(not_a_git_file)?
    };
    let common_dir = match read_file(None, &git_dir.join("commondir"), true)? {
        Some(text) => {
            let text = String::from_utf8_lossy(&text).trim_end().to_owned();
            git_dir.join(text)
        }
        None => git_dir.clone(),
    };
    Ok(Some((git_dir, common_dir)))
}

/// The directory a `gitdir: PATH` file names, relative to `dir`.
fn parse_git_file(text: &[u8], dir: &Path) -> Option<PathBuf> {
    let text = text.strip_prefix(b"gitdir:")?;
    let text = text.trim_ascii();
    if text.is_empty() || text.contains(&0) {
        return None;
    }
    Some(dir.join(OsStr::from_bytes(text)))
}

/// The tracked paths of an index (relative to its worktree) and whether
/// each is a submodule; with `prefix`, only those inside it. A missing
/// index tracks nothing.
fn read_index(path: &Path, prefix: Option<&[u8]>) -> Result<Tracked, GatherError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(read_error(path.display())(e)),
    };
    // gix-index maps the file: it must be one, of a bounded size.
    if !meta.is_file() || meta.len() > MAX_INDEX_LEN {
        return Err(GatherError::Index {
            path: path.display().to_string(),
            reason: format!(
                "it is not a regular file of at most {} MiB",
                MAX_INDEX_LEN >> 20
            ),
        });
    }
    let options = gix_index::decode::Options {
        alloc_limit_bytes: Some(INDEX_ALLOC_LIMIT),
        thread_limit: Some(1),
        ..Default::default()
    };
    let file = gix_index::File::at(path, gix_index::hash::Kind::Sha1, false, options)
        .or_else(|_| gix_index::File::at(path, gix_index::hash::Kind::Sha256, false, options))
        .map_err(|e| GatherError::Index {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
    let inside = |p: &[u8]| match prefix {
        None | Some(&[]) => true,
        Some(prefix) => p.starts_with(prefix) && p.get(prefix.len()) == Some(&b'/'),
    };
    Ok(file
        .entries()
        .iter()
        .map(|e| {
            // A sparse directory's entry ends in `/`.
            let path = e.path(&file);
            let path = path.strip_suffix(b"/").unwrap_or(path);
            (path.to_vec(), e.mode.is_submodule() || e.mode.is_sparse())
        })
        .filter(|(p, _)| inside(p))
        .collect())
}

/// The earlier rules a walk compares with, and where it puts the host
/// paths they isolated that the new rules share.
struct Before<'a> {
    classifier: &'a Classifier,
    /// Their state of the workspace's root.
    root: DirState,
    newly_shared: &'a mut Vec<RelativePath>,
}

impl Before<'_> {
    /// The earlier rules' state of the entry `name` of `dir_path` (their
    /// state `earlier`), which the new rules share. One they isolated is
    /// newly shared, and so is everything below it, which is not looked
    /// at again: `None`.
    fn child(
        &mut self,
        earlier: &DirState,
        dir_path: &[u8],
        name: &[u8],
        is_dir: bool,
        facts: HostFacts,
    ) -> Option<DirState> {
        let (was, then) = self
            .classifier
            .child(earlier, dir_path, name, is_dir, facts);
        if was == Route::Isolated {
            self.newly_shared.push(RelativePath(join(dir_path, name)));
            return None;
        }
        Some(then)
    }
}

/// What the walk adds to as it goes: the rules, each scope's tracked
/// paths, and the directories of scripts git runs.
struct Found<'a> {
    rules: &'a mut WorkspaceRules,
    tracked: &'a mut Vec<Tracked>,
    watched: &'a mut Vec<RelativePath>,
}

/// Walks the workspace's host directories that are not ignored, reading
/// their `.gitignore` files and finding the repositories nested in them
/// (and the directories of the scripts their git runs, into `watched`);
/// with `before`, also classifies each host entry the new rules share by
/// the earlier rules, and notes the top-most ones those isolated. `user`
/// is the invoking user's git configuration with the excludes file it
/// names.
fn walk(
    workspace: BorrowedFd<'_>,
    workspace_path: &Path,
    user: (&UserConfig, Option<&Path>),
    classifier: &mut Classifier,
    mut found: Found<'_>,
    mut before: Option<Before<'_>>,
) -> Result<(), GatherError> {
    // Each directory with its depth, its state by the new rules and, while
    // the earlier ones shared it too, by those.
    let earlier_root = before.as_ref().map(|b| b.root.clone());
    let mut pending = vec![(Vec::<u8>::new(), classifier.root(), earlier_root, 0usize)];
    while let Some((dir_path, state, earlier, depth)) = pending.pop() {
        let label = workspace_path.join(OsStr::from_bytes(&dir_path));
        let Some((fd, entries)) = open_walked(workspace, &dir_path, &label)? else {
            continue;
        };
        let has = |name: &[u8]| entries.iter().any(|e| e.name == name);
        if let Some((Some(scope), rel)) = state.scope()
            && has(b".gitignore")
            && let Some(content) =
                read_file(Some((fd.as_fd(), &label)), Path::new(".gitignore"), false)?
        {
            classifier.add_ignore_file(scope, rel, &content);
            found.rules.scopes[scope].ignore_files.push(IgnoreFile {
                dir: RelativePath(rel.to_vec()),
                content,
            });
        }
        let facts = HostFacts {
            exists: true,
            dir_holds_head: has(HEAD_NAME),
        };
        for entry in entries.iter().filter(|e| e.name != GIT_DIR_NAME) {
            let name = &entry.name;
            let is_dir = entry.file_type == FileType::Directory;
            let (route, mut child) = classifier.child(&state, &dir_path, name, is_dir, facts);
            if route != Route::Host {
                continue;
            }
            // Shared now: was it isolated before?
            let earlier_child = match (&mut before, &earlier) {
                (Some(before), Some(earlier)) => {
                    before.child(earlier, &dir_path, name, is_dir, facts)
                }
                _ => None,
            };
            if !is_dir || child.scope().is_none() {
                continue;
            }
            let child_path = join(&dir_path, name);
            let child_label = workspace_path.join(OsStr::from_bytes(&child_path));
            check_walkable(depth + 1, &child_label)?;
            if let Some(git_dirs) = git_dir_of(&child_label)? {
                let nested = (child_path.as_slice(), child_label.as_path());
                add_nested_repository(
                    nested,
                    git_dirs,
                    workspace_path,
                    user,
                    classifier,
                    &mut found,
                )?;
                child = classifier.child(&state, &dir_path, name, is_dir, facts).1;
            }
            pending.push((child_path, child, earlier_child, depth + 1));
        }
    }
    Ok(())
}

/// The walked directory `dir_path` of the workspace (named `label`),
/// opened beneath it and listed; `None` when it is gone, or was replaced
/// by a link, since its parent was listed. The root's filesystem is
/// checked whole by [`gather`]; below it (on the same filesystem: the
/// walk crosses no mount) only a directory's own case-folding flag can
/// differ, and refuses it.
fn open_walked(
    workspace: BorrowedFd<'_>,
    dir_path: &[u8],
    label: &Path,
) -> Result<Option<(OwnedFd, Vec<Listed>)>, GatherError> {
    let fd = match lazaret_hostfs::beneath::open_dir(workspace, dir_path, OFlags::RDONLY) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT | rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR) => {
            return Ok(None);
        }
        Err(e) => {
            return Err(GatherError::Unreadable {
                path: label.display().to_string(),
                error: e.into(),
            });
        }
    };
    let entries =
        lazaret_hostfs::beneath::list(fd.as_fd()).map_err(|error| GatherError::Unreadable {
            path: label.display().to_string(),
            error,
        })?;
    if let Some(kind) =
        lazaret_hostfs::case::dir_folds_case(fd.as_fd()).filter(|_| !dir_path.is_empty())
    {
        return Err(GatherError::CaseInsensitive {
            path: label.display().to_string(),
            kind,
        });
    }
    Ok(Some((fd, entries)))
}

/// Refuses to walk the directory `label`, `depth` levels below the
/// workspace's root, when it lies deeper than the walk goes or its path is
/// longer than the walk reads a directory by (its `.git` is looked for by
/// its whole path).
fn check_walkable(depth: usize, label: &Path) -> Result<(), GatherError> {
    if depth > MAX_WALK_DEPTH {
        return Err(GatherError::TooDeep {
            path: label.display().to_string(),
            max: MAX_WALK_DEPTH,
        });
    }
    let len = label.as_os_str().len();
    if len > MAX_WALK_PATH_LEN {
        return Err(GatherError::PathTooLong {
            path: label.display().to_string(),
            len,
            max: MAX_WALK_PATH_LEN,
        });
    }
    Ok(())
}

/// Adds the repository nested at `path` of the workspace (named `label`),
/// whose git directory and common directory are `git_dir` and
/// `common_dir`: both as git directories, what its git reads and runs, and
/// a scope of its own with its excludes and the paths its index tracks.
fn add_nested_repository(
    (path, label): (&[u8], &Path),
    (git_dir, common_dir): (PathBuf, PathBuf),
    workspace_path: &Path,
    (user, excludes_file): (&UserConfig, Option<&Path>),
    classifier: &mut Classifier,
    found: &mut Found<'_>,
) -> Result<(), GatherError> {
    let known = found.rules.git_dirs.len();
    add_git_dirs(&[&git_dir, &common_dir], workspace_path, found.rules);
    for added in &found.rules.git_dirs[known..] {
        classifier.add_git_dir(&added.0);
    }
    let config = user.read(&user.files(Some(&git_dir), Some(&common_dir)))?;
    protect_what_git_runs(
        &config,
        label,
        &common_dir,
        workspace_path,
        found.rules,
        found.watched,
    );
    // Its own excludes file, if its configuration names another, below
    // its `info/exclude` (whose lines win).
    let mut exclude = match config.excludes_file() {
        Some(own) if Some(own.as_path()) != excludes_file => {
            read_file(None, &own, true)?.unwrap_or_default()
        }
        _ => Vec::new(),
    };
    exclude.push(b'\n');
    exclude.extend(read_file(None, &common_dir.join("info/exclude"), true)?.unwrap_or_default());
    let scope = classifier.add_scope(path, b"", &exclude);
    let paths = read_index(&git_dir.join("index"), None)?;
    track(classifier, scope, &paths);
    found.tracked.push(paths);
    found.rules.scopes.push(IgnoreScope {
        root: RelativePath(path.to_vec()),
        prefix: RelativePath::default(),
        exclude,
        ignore_files: Vec::new(),
        tracked_ignored: Vec::new(),
        tracked_ignored_dirs: Vec::new(),
    });
    Ok(())
}

/// The file at `path` (beneath `dir` when given), as
/// [`read_small`](lazaret_hostfs::read::read_small) reads it, of at most
/// [`MAX_IGNORE_FILE_LEN`] bytes: ignore files and git's small metadata.
fn read_file(
    dir: Option<(BorrowedFd<'_>, &Path)>,
    path: &Path,
    follow: bool,
) -> Result<Option<Vec<u8>>, GatherError> {
    let label = || match dir {
        Some((_, dir)) => dir.join(path).display().to_string(),
        None => path.display().to_string(),
    };
    lazaret_hostfs::read::read_small(dir.map(|(fd, _)| fd), path, follow, MAX_IGNORE_FILE_LEN)
        .map_err(|e| match e {
            ReadError::TooLarge { max } => GatherError::TooLarge { path: label(), max },
            ReadError::Io(error) => GatherError::Read {
                path: label(),
                error,
            },
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch workspace outside any repository, and a home without git
    /// configuration.
    struct Scratch {
        _dir: tempfile::TempDir,
        home: PathBuf,
        workspace: PathBuf,
    }

    impl Scratch {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            let base = std::fs::canonicalize(dir.path()).unwrap();
            let (home, workspace) = (base.join("home"), base.join("workspace"));
            std::fs::create_dir_all(&home).unwrap();
            std::fs::create_dir_all(&workspace).unwrap();
            Scratch {
                _dir: dir,
                home,
                workspace,
            }
        }

        /// Writes `content` at `path` of the workspace, making its parents.
        fn write(&self, path: impl AsRef<Path>, content: &str) {
            let path = self.workspace.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, content).unwrap();
        }

        fn gather(&self) -> Result<Gathered, GatherError> {
            let user = UserConfig {
                home: Some(self.home.clone()),
                no_system: true,
                ..UserConfig::default()
            };
            let dir = std::fs::File::open(&self.workspace).unwrap();
            gather(dir.as_fd(), &self.workspace, true, &user, None)
        }

        /// The directories whose `.gitignore` the walk read, sorted.
        fn ignore_dirs(&self) -> Vec<Vec<u8>> {
            let gathered = self.gather().unwrap();
            assert!(gathered.repository.is_none());
            let mut dirs: Vec<Vec<u8>> = gathered.rules.scopes[0]
                .ignore_files
                .iter()
                .map(|f| f.dir.0.clone())
                .collect();
            dirs.sort();
            dirs
        }
    }

    #[test]
    fn the_walk_reads_gitignore_files_under_any_name() {
        use std::os::unix::ffi::OsStringExt;
        let fx = Scratch::new();
        fx.write(".gitignore", "*.log\n");
        fx.write("données/.gitignore", "cache/\n");
        fx.write("日本/深い/.gitignore", "tmp/\n");
        // A name that is not UTF-8 at all.
        let raw = std::ffi::OsString::from_vec(b"r\xffw".to_vec());
        fx.write(Path::new(&raw).join(".gitignore"), "x\n");
        assert_eq!(
            fx.ignore_dirs(),
            [
                b"".to_vec(),
                "données".as_bytes().to_vec(),
                b"r\xffw".to_vec(),
                "日本/深い".as_bytes().to_vec(),
            ]
        );
        let gathered = fx.gather().unwrap();
        let content = gathered.rules.scopes[0]
            .ignore_files
            .iter()
            .find(|f| f.dir.0 == "données".as_bytes())
            .map(|f| f.content.clone());
        assert_eq!(content.as_deref(), Some(&b"cache/\n"[..]));
    }

    #[test]
    fn the_walk_follows_no_symbolic_link() {
        let fx = Scratch::new();
        let outside = fx.home.join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join(".gitignore"), "secret\n").unwrap();
        // A link to a directory outside the workspace is not walked into,
        std::os::unix::fs::symlink(&outside, fx.workspace.join("link")).unwrap();
        // nor one to a directory inside it walked twice,
        fx.write("real/.gitignore", "a\n");
        std::os::unix::fs::symlink("real", fx.workspace.join("alias")).unwrap();
        // and a `.gitignore` that is a link is skipped, as git skips it.
        fx.write("linked/keep", "");
        std::os::unix::fs::symlink(
            outside.join(".gitignore"),
            fx.workspace.join("linked/.gitignore"),
        )
        .unwrap();
        assert_eq!(fx.ignore_dirs(), [b"real".to_vec()]);
    }

    #[test]
    fn the_walk_reads_every_level_of_a_deep_tree_but_not_what_is_ignored() {
        let fx = Scratch::new();
        let mut path = PathBuf::new();
        let mut expected = Vec::new();
        for level in 0..64 {
            path.push(format!("d{level}"));
            fx.write(path.join(".gitignore"), "never\n");
            expected.push(path.as_os_str().as_bytes().to_vec());
        }
        // Below an ignored directory nothing is read.
        fx.write("d0/never/.gitignore", "x\n");
        fx.write("skipped/inner/.gitignore", "x\n");
        fx.write(".gitignore", "/skipped/\n");
        expected.push(Vec::new());
        expected.sort();
        assert_eq!(fx.ignore_dirs(), expected);
    }

    #[test]
    fn a_walked_directory_is_bounded_by_depth_and_path_length() {
        let at = |len: usize| PathBuf::from(format!("/{}", "n".repeat(len - 1)));
        assert!(check_walkable(MAX_WALK_DEPTH, &at(MAX_WALK_PATH_LEN)).is_ok());
        match check_walkable(MAX_WALK_DEPTH + 1, Path::new("/w/deep")) {
            Err(GatherError::TooDeep { path, max }) => {
                assert_eq!((path.as_str(), max), ("/w/deep", MAX_WALK_DEPTH));
            }
            other => panic!("expected TooDeep: {other:?}"),
        }
        let long = at(MAX_WALK_PATH_LEN + 1);
        match check_walkable(1, &long) {
            Err(GatherError::PathTooLong { path, len, max }) => {
                assert_eq!(path, long.display().to_string());
                assert_eq!((len, max), (MAX_WALK_PATH_LEN + 1, MAX_WALK_PATH_LEN));
            }
            other => panic!("expected PathTooLong: {other:?}"),
        }
    }

    #[test]
    fn the_directories_above_a_workspace_run_from_the_repository_root() {
        assert!(dirs_above(b"").is_empty());
        assert_eq!(dirs_above(b"w"), [b"".to_vec()]);
        assert_eq!(
            dirs_above(b"a/b/w"),
            [b"".to_vec(), b"a".to_vec(), b"a/b".to_vec()]
        );
        assert_eq!(
            dirs_above("dé/\u{65e5}/w".as_bytes()),
            [
                b"".to_vec(),
                "dé".as_bytes().to_vec(),
                "dé/\u{65e5}".as_bytes().to_vec()
            ]
        );
    }

    #[test]
    fn a_gone_directory_is_skipped_and_a_file_is_not_walked() {
        let fx = Scratch::new();
        fx.write("file", "");
        let dir = std::fs::File::open(&fx.workspace).unwrap();
        let label = fx.workspace.join("gone");
        assert!(open_walked(dir.as_fd(), b"gone", &label).unwrap().is_none());
        assert!(open_walked(dir.as_fd(), b"file", &label).unwrap().is_none());
        std::os::unix::fs::symlink(".", fx.workspace.join("self")).unwrap();
        assert!(open_walked(dir.as_fd(), b"self", &label).unwrap().is_none());
        let (_, entries) = open_walked(dir.as_fd(), b"", &fx.workspace)
            .unwrap()
            .unwrap();
        let mut names: Vec<&[u8]> = entries.iter().map(|e| e.name.as_slice()).collect();
        names.sort();
        assert_eq!(names, [&b"file"[..], b"self"]);
    }

    #[test]
    fn resolutions_follow_links_as_the_kernel_does() {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir_all(base.join("real/sub")).unwrap();
        std::os::unix::fs::symlink("real/sub", base.join("tools")).unwrap();
        std::os::unix::fs::symlink("b", base.join("a")).unwrap();
        std::os::unix::fs::symlink("c", base.join("b")).unwrap();
        // `..` after a link leaves the link's target, not the link.
        let found = resolutions(&base.join("tools/../x.sh"));
        assert!(found.contains(&base.join("real/x.sh")), "{found:?}");
        // Each link of a chain.
        let found = resolutions(&base.join("a"));
        assert_eq!(found.first(), Some(&base.join("a")));
        for step in ["b", "c"] {
            assert!(found.contains(&base.join(step)), "{found:?}");
        }
        // A loop ends.
        std::os::unix::fs::symlink("loop", base.join("loop")).unwrap();
        assert!(resolutions(&base.join("loop")).len() <= MAX_LINKS + 2);
    }
}
