//! The classifier against git itself: fixture repositories whose paths are
//! classified by `gather` + `Classifier` and by `git check-ignore`, which
//! must agree on every path. Needs `git` on `PATH`; no privileges.

use std::collections::BTreeSet;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use lazaret_proto::router::{RelativePath, WorkspaceRules};
use lazaret_routing::classify::{Classifier, HostFacts, Protection, Route};
use lazaret_routing::gather::gather;
use lazaret_routing::gitconfig::UserConfig;

/// A scratch repository and the home its git configuration lives in.
struct Fixture {
    _dir: tempfile::TempDir,
    home: PathBuf,
    repo: PathBuf,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        let home = base.join("home");
        let repo = base.join("repo");
        std::fs::create_dir_all(&home).unwrap();
        std::fs::create_dir_all(&repo).unwrap();
        let fixture = Fixture {
            _dir: dir,
            home,
            repo,
        };
        fixture.git(&fixture.repo, &["init", "-q", "."]);
        fixture
    }

    fn git(&self, cwd: &Path, args: &[&str]) -> String {
        let out = self.git_command(cwd).args(args).output().expect("run git");
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn git_command(&self, cwd: &Path) -> Command {
        let mut command = Command::new("git");
        command
            .current_dir(cwd)
            .env_clear()
            .env("HOME", &self.home)
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@example.invalid")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@example.invalid");
        command
    }

    fn write(&self, path: &str, content: &str) {
        let path = self.repo.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }

    /// The paths `git check-ignore` (run in `cwd`) reports ignored.
    fn git_ignored(&self, cwd: &Path, paths: &[String]) -> BTreeSet<String> {
        let mut child = self
            .git_command(cwd)
            .args(["check-ignore", "--stdin", "-z"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let input: Vec<u8> = paths.iter().flat_map(|p| p.bytes().chain([0])).collect();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), &input).unwrap();
        let out = child.wait_with_output().unwrap();
        // 0: some ignored, 1: none ignored.
        assert!(
            matches!(out.status.code(), Some(0 | 1)),
            "check-ignore failed"
        );
        out.stdout
            .split(|b| *b == 0)
            .filter(|p| !p.is_empty())
            .map(|p| String::from_utf8(p.to_vec()).unwrap())
            .collect()
    }

    fn user(&self) -> UserConfig {
        UserConfig {
            home: Some(self.home.clone()),
            xdg_config_home: None,
            no_system: true,
            ..UserConfig::default()
        }
    }
}

/// Every file and directory beneath `root`, relative to it, `.git` skipped.
fn tree(root: &Path) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            if entry.file_name() == ".git" {
                continue;
            }
            let path = entry.path();
            let is_dir = entry.file_type().unwrap().is_dir();
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_str()
                .unwrap()
                .to_owned();
            out.push((rel, is_dir));
            if is_dir {
                pending.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The paths the classifier isolates, for the workspace at `workspace`.
fn classified(fixture: &Fixture, workspace: &Path, paths: &[(String, bool)]) -> BTreeSet<String> {
    let classifier = Classifier::new(&rules_of(fixture, workspace));
    let host = |_: &[u8]| HostFacts {
        exists: true,
        dir_holds_head: false,
    };
    paths
        .iter()
        .filter(|(path, is_dir)| {
            classifier.walk(path.as_bytes(), *is_dir, &host).0 == Route::Isolated
        })
        .map(|(path, _)| path.clone())
        .collect()
}

fn assert_same(ours: &BTreeSet<String>, git: &BTreeSet<String>) {
    let only_ours: Vec<_> = ours.difference(git).collect();
    let only_git: Vec<_> = git.difference(ours).collect();
    assert!(
        only_ours.is_empty() && only_git.is_empty(),
        "isolated by Lazaret but not ignored by git: {only_ours:?}\n\
         ignored by git but not isolated by Lazaret: {only_git:?}"
    );
}

const ROOT_RULES: &str = "\
# comment
*.log
!important.log
/root-only.txt
build/
docs/**/*.tmp
**/cache
foo/bar
\\#hash
*.py[co]
**/__pycache__/
node_modules/
.env
secret*
!secret-public*
dir-only/
a/**/b
trailing-space.txt\x20\x20
";

const SRC_RULES: &str = "*.gen.rs\n!keep.gen.rs\n/local-only\n!src-debug.log\n";
const DEEP_RULES: &str = "!*.log\ntmp/\n*.txt\n!plain.txt\n";

fn populate(fixture: &Fixture) {
    fixture.write(".gitignore", ROOT_RULES);
    fixture.write("src/.gitignore", SRC_RULES);
    fixture.write("src/deep/.gitignore", DEEP_RULES);
    fixture.write(".git/info/exclude", "*.bak\n!notbak.bak\n");
    std::fs::create_dir_all(fixture.home.join(".config/git")).unwrap();
    std::fs::write(
        fixture.home.join(".config/git/ignore"),
        "*.swp\n.DS_Store\n",
    )
    .unwrap();
    let dirs = [
        "",
        "src",
        "src/deep",
        "src/deep/x",
        "src/deep/tmp",
        "docs",
        "docs/a/b",
        "a",
        "a/x/y",
        "build",
        "cache",
        "lib/cache",
        "dir-only",
        "node_modules",
        "pkg/__pycache__",
        "foo",
    ];
    let names = [
        "important.log",
        "x.log",
        "root-only.txt",
        "thing.tmp",
        "a.pyc",
        "a.py",
        "#hash",
        ".env",
        "secret.txt",
        "secret-public.txt",
        "keep.gen.rs",
        "x.gen.rs",
        "local-only",
        "src-debug.log",
        "file.bak",
        "notbak.bak",
        "x.swp",
        ".DS_Store",
        "b",
        "bar",
        "plain.txt",
        "trailing-space.txt",
    ];
    for dir in dirs {
        for name in names {
            let path = if dir.is_empty() {
                name.to_owned()
            } else {
                format!("{dir}/{name}")
            };
            // A name that is also one of the directories stays a directory.
            if !dirs.contains(&path.as_str()) {
                fixture.write(&path, "x");
            }
        }
    }
    // A file named like a directory-only rule is not ignored.
    fixture.write("src/dir-only", "x");
}

#[test]
fn the_classifier_agrees_with_git_check_ignore() {
    let fixture = Fixture::new();
    populate(&fixture);
    let paths = tree(&fixture.repo);
    assert!(paths.len() >= 200, "only {} paths", paths.len());
    let names: Vec<String> = paths.iter().map(|(p, _)| p.clone()).collect();
    let git = fixture.git_ignored(&fixture.repo, &names);
    // The fixture exercises both verdicts.
    assert!(
        git.len() > 50 && git.len() < names.len() - 50,
        "{}",
        git.len()
    );
    assert_same(&classified(&fixture, &fixture.repo, &paths), &git);
}

#[test]
fn tracked_paths_are_never_ignored() {
    let fixture = Fixture::new();
    populate(&fixture);
    fixture.git(
        &fixture.repo,
        &[
            "add",
            "-f",
            "x.log",
            "build/b",
            "src/deep/tmp/x.log",
            ".gitignore",
        ],
    );
    let paths = tree(&fixture.repo);
    let names: Vec<String> = paths.iter().map(|(p, _)| p.clone()).collect();
    let git = fixture.git_ignored(&fixture.repo, &names);
    assert!(!git.contains("x.log") && !git.contains("build/b"));
    assert!(
        git.contains("build/x.log"),
        "build/ stays ignored around build/b"
    );
    let ours = classified(&fixture, &fixture.repo, &paths);
    // `build` itself holds a tracked file: it is the host's directory
    // (git reports the directory ignored, but its tracked file is not).
    let git: BTreeSet<String> = git
        .into_iter()
        .filter(|p| p != "build" && p != "src/deep/tmp")
        .collect();
    assert_same(&ours, &git);
}

#[test]
fn a_subdirectory_workspace_takes_the_enclosing_rules() {
    let fixture = Fixture::new();
    populate(&fixture);
    let workspace = fixture.repo.join("src");
    let paths = tree(&workspace);
    let names: Vec<String> = paths.iter().map(|(p, _)| format!("src/{p}")).collect();
    let git: BTreeSet<String> = fixture
        .git_ignored(&fixture.repo, &names)
        .into_iter()
        .map(|p| p.strip_prefix("src/").unwrap().to_owned())
        .collect();
    assert!(
        git.contains(".env"),
        "the enclosing .gitignore ignores src/.env"
    );
    assert_same(&classified(&fixture, &workspace, &paths), &git);
}

#[test]
fn an_ignored_workspace_is_isolated_whole() {
    let fixture = Fixture::new();
    populate(&fixture);
    let workspace = fixture.repo.join("node_modules");
    let dir = std::fs::File::open(&workspace).unwrap();
    let gathered = gather(dir.as_fd(), &workspace, true, &fixture.user(), None).unwrap();
    assert!(gathered.workspace_ignored);
    assert_eq!(gathered.repository.as_deref(), Some(fixture.repo.as_path()));
}

#[test]
fn a_nested_repository_has_its_own_rules() {
    let fixture = Fixture::new();
    fixture.write(".gitignore", "*.log\n");
    let nested = fixture.repo.join("vendor/lib");
    std::fs::create_dir_all(&nested).unwrap();
    fixture.git(&nested, &["init", "-q", "."]);
    fixture.write("vendor/lib/.gitignore", "*.o\n");
    fixture.write("vendor/lib/.git/info/exclude", "*.tmp\n");
    for name in ["a.o", "a.log", "a.tmp", "a.c", "keep.o"] {
        fixture.write(&format!("vendor/lib/{name}"), "x");
    }
    fixture.git(&nested, &["add", "-f", "keep.o"]);
    fixture.write("top.log", "x");
    let paths = tree(&fixture.repo);
    let ours = classified(&fixture, &fixture.repo, &paths);
    let inside: Vec<String> = ["a.o", "a.log", "a.tmp", "a.c", "keep.o"]
        .iter()
        .map(|n| n.to_string())
        .collect();
    let mut git: BTreeSet<String> = fixture
        .git_ignored(&nested, &inside)
        .into_iter()
        .map(|p| format!("vendor/lib/{p}"))
        .collect();
    git.insert("top.log".into());
    assert_same(&ours, &git);
}

#[test]
fn a_linked_worktree_reads_the_main_repository() {
    let fixture = Fixture::new();
    fixture.write(".gitignore", "*.log\n");
    fixture.write("f.txt", "x");
    fixture.git(&fixture.repo, &["add", "."]);
    fixture.git(&fixture.repo, &["commit", "-q", "-m", "one"]);
    fixture.write(".git/info/exclude", "*.bak\n");
    let worktree = fixture.repo.parent().unwrap().join("wt");
    fixture.git(
        &fixture.repo,
        &["worktree", "add", "-q", worktree.to_str().unwrap()],
    );
    for name in ["a.log", "a.bak", "a.txt"] {
        std::fs::write(worktree.join(name), "x").unwrap();
    }
    let dir = std::fs::File::open(&worktree).unwrap();
    let gathered = gather(dir.as_fd(), &worktree, true, &fixture.user(), None).unwrap();
    assert_eq!(gathered.repository.as_deref(), Some(worktree.as_path()));
    let paths = tree(&worktree);
    let names: Vec<String> = paths.iter().map(|(p, _)| p.clone()).collect();
    assert_same(
        &classified(&fixture, &worktree, &paths),
        &fixture.git_ignored(&worktree, &names),
    );
}

#[test]
fn a_workspace_inside_git_metadata_is_refused() {
    let fixture = Fixture::new();
    std::fs::create_dir_all(fixture.repo.join(".git/hooks")).unwrap();
    for workspace in [fixture.repo.join(".git"), fixture.repo.join(".git/hooks")] {
        let dir = std::fs::File::open(&workspace).unwrap();
        let error = gather(dir.as_fd(), &workspace, true, &fixture.user(), None)
            .expect_err("a git directory is no workspace");
        assert!(
            error.to_string().contains("inside the git directory"),
            "{error}"
        );
    }
    // A separate git directory (`git init --separate-git-dir`), found
    // through the worktree's `.git` file.
    let separate = fixture.repo.parent().unwrap().join("separate");
    let worktree = fixture.repo.parent().unwrap().join("wt");
    std::fs::create_dir_all(&worktree).unwrap();
    fixture.git(
        &worktree,
        &[
            "init",
            "-q",
            "--separate-git-dir",
            separate.to_str().unwrap(),
            ".",
        ],
    );
    let inside = separate.join("hooks");
    std::fs::create_dir_all(&inside).unwrap();
    let dir = std::fs::File::open(&inside).unwrap();
    let error = gather(dir.as_fd(), &inside, true, &fixture.user(), None)
        .expect_err("a separate git directory's hooks are no workspace");
    assert!(
        error.to_string().contains("inside the git directory"),
        "{error}"
    );
    // Nor is the git directory itself (a bare repository).
    let dir = std::fs::File::open(&separate).unwrap();
    let error = gather(dir.as_fd(), &separate, true, &fixture.user(), None)
        .expect_err("a bare repository is no workspace");
    assert!(
        error.to_string().contains("inside the git directory"),
        "{error}"
    );
}

#[test]
fn what_the_repository_runs_is_read_only() {
    let fixture = Fixture::new();
    fixture.write(
        "scripts/pre-commit",
        "#!/bin/sh\n./tools/lint.sh --config=conf/lint.toml && exit 0\n# ./not/this\n\
         black src/ tests/\n",
    );
    fixture.write("tools/lint.sh", "true\n");
    // The hook is a link to a link to the script.
    std::os::unix::fs::symlink("scripts/pre-commit", fixture.repo.join("hook-link")).unwrap();
    std::os::unix::fs::symlink(
        "../../hook-link",
        fixture.repo.join(".git/hooks/pre-commit"),
    )
    .unwrap();
    // What pre-commit installs: `python -mpre_commit`, which Python looks
    // up in the worktree first (`pre_commit.py`, `pre_commit/`).
    fixture.write(
        ".git/hooks/pre-push",
        "#!/usr/bin/env bash\nINSTALL_PYTHON=/usr/bin/python3\n\
         exec \"$INSTALL_PYTHON\" -mpre_commit hook-impl --hook-type=pre-push -- \"$@\"\n",
    );
    fixture.git(
        &fixture.repo,
        &[
            "config",
            "filter.nb.clean",
            "python3 -m nbstrip.cli clean.py",
        ],
    );
    fixture.git(
        &fixture.repo,
        &["config", "diff.nb.textconv", "python3 conv.py"],
    );
    fixture.git(
        &fixture.repo,
        &[
            "config",
            "credential.helper",
            "!/usr/bin/gh auth git-credential",
        ],
    );
    fixture.git(
        &fixture.repo,
        &["config", "core.fsmonitor", "sh tools/watch.sh --fast"],
    );
    fixture.git(
        &fixture.repo,
        &["config", "alias.t", "!bash scripts/test.sh"],
    );
    let rules = rules_of(&fixture, &fixture.repo);
    let read_only = texts(&rules.read_only);
    for expected in [
        ".git/hooks",
        ".git/hooks/pre-commit",
        "hook-link",
        "scripts/pre-commit",
        "tools/lint.sh",
        "conf/lint.toml",
        "tools/watch.sh",
        "scripts/test.sh",
        "pre_commit",
        "nbstrip",
        "conv.py",
    ] {
        assert!(read_only.contains(expected), "{expected} in {read_only:?}");
    }
    // What commands take as data stays writable, and so do the worktree
    // root and the directory of a file read as configuration.
    for data in ["not/this", "src", "tests", "auth", "clean.py", "", "conf"] {
        assert!(!read_only.contains(data), "{data} in {read_only:?}");
    }
    // The directories scripts run from are read-only whole: what their
    // interpreter imports from there too.
    for dir in ["scripts", "tools"] {
        assert!(read_only.contains(dir), "{dir} in {read_only:?}");
    }
    let prefixes: BTreeSet<(String, String)> = rules
        .read_only_prefixes
        .iter()
        .map(|n| {
            (
                String::from_utf8(n.dir.0.clone()).unwrap(),
                String::from_utf8(n.prefix.clone()).unwrap(),
            )
        })
        .collect();
    for (dir, prefix) in [
        ("", "pre_commit."),
        ("", "nbstrip."),
        ("", ".pre-commit-config."),
        ("", "lefthook"),
        (".config", "lefthook"),
        ("", ".husky"),
    ] {
        assert!(
            prefixes.contains(&(dir.to_owned(), prefix.to_owned())),
            "{dir}/{prefix}* in {prefixes:?}"
        );
    }
    // The classifier holds them: every form of the module is read-only.
    let classifier = Classifier::new(&rules);
    let host = |_: &[u8]| HostFacts::default();
    for path in [
        "pre_commit.py",
        "pre_commit.cpython-312-x86_64-linux-gnu.so",
        "pre_commit/__main__.py",
        "lefthook-local.yml",
        ".config/lefthook.toml",
        ".huskyrc.json",
    ] {
        assert_eq!(
            read_only_at(&classifier, path, &host),
            Protection::ReadOnly,
            "{path}"
        );
    }
    assert_eq!(
        read_only_at(&classifier, "src/pre_commit.py", &host),
        Protection::None
    );
}

#[test]
fn husky_scripts_and_a_hooks_path_set_by_an_include_are_read() {
    let fixture = Fixture::new();
    fixture.write(
        ".husky/_/pre-commit",
        "#!/bin/sh\n. \"$(dirname \"$0\")/h\"\n",
    );
    fixture.write(
        ".husky/pre-commit",
        "python3 -m mytool --fix\n./scripts/check.sh\n",
    );
    fixture.write(".git/hooks.inc", "[core]\n\thooksPath = .husky/_\n");
    fixture.git(&fixture.repo, &["config", "include.path", "hooks.inc"]);
    let rules = rules_of(&fixture, &fixture.repo);
    let read_only = texts(&rules.read_only);
    for expected in [".husky", ".husky/_", "scripts/check.sh", "mytool"] {
        assert!(read_only.contains(expected), "{expected} in {read_only:?}");
    }
}

#[test]
fn what_scripts_run_and_source_is_read_only_and_their_directories_watched() {
    let fixture = Fixture::new();
    fixture.write(".git/hooks/pre-commit", "#!/bin/sh\nexec ./tools/lint.sh\n");
    fixture.write(
        "tools/lint.sh",
        "#!/bin/sh\n. ./tools/helpers.sh\nsource lib/common.sh\n\
         . \"$(git rev-parse --show-toplevel)/computed.sh\"\n",
    );
    fixture.write("lib/common.sh", "bin/deep.sh --all\n");
    fixture.write("bin/deep.sh", "#!/usr/bin/env bash\npython3 py/run.py\n");
    // A Python script is not read as shell: what it opens is data.
    fixture.write("py/run.py", "open('data/y.json')\n");
    fixture.git(
        &fixture.repo,
        &["config", "filter.x.clean", "python3 scripts/clean.py"],
    );
    fixture.git(&fixture.repo, &["config", "diff.x.textconv", "./conv.sh"]);
    let dir = std::fs::File::open(&fixture.repo).unwrap();
    let gathered = gather(dir.as_fd(), &fixture.repo, true, &fixture.user(), None).expect("gather");
    let read_only = texts(&gathered.rules.read_only);
    for expected in ["tools", "lib/common.sh", "bin", "py", "scripts", "conv.sh"] {
        assert!(read_only.contains(expected), "{expected} in {read_only:?}");
    }
    for writable in ["lib", "", "data", "data/y.json", "computed.sh"] {
        assert!(!read_only.contains(writable), "{writable} in {read_only:?}");
    }
    let watched = texts(&gathered.watched);
    for expected in ["", "tools", "bin", "py", "scripts", ".git/hooks"] {
        assert!(watched.contains(expected), "{expected} in {watched:?}");
    }
    assert!(!watched.contains("lib"), "{watched:?}");
    // A file cannot be made in them; the root's other files stay the
    // project's.
    let classifier = Classifier::new(&gathered.rules);
    let host = |_: &[u8]| HostFacts::default();
    for (path, protection) in [
        ("scripts/json.py", Protection::ReadOnly),
        ("scripts/json/__init__.py", Protection::ReadOnly),
        ("tools/new.sh", Protection::ReadOnly),
        ("json.py", Protection::None),
        ("lib/other.sh", Protection::None),
    ] {
        assert_eq!(read_only_at(&classifier, path, &host), protection, "{path}");
    }
}

#[test]
fn the_lock_file_of_a_read_only_file_is_read_only() {
    let fixture = Fixture::new();
    fixture.git(
        &fixture.repo,
        &["config", "core.fsmonitor", "lint --config=conf/x.toml"],
    );
    let rules = rules_of(&fixture, &fixture.repo);
    let classifier = Classifier::new(&rules);
    let host = |path: &[u8]| HostFacts {
        exists: fixture
            .repo
            .join(std::str::from_utf8(path).unwrap())
            .exists(),
        dir_holds_head: false,
    };
    for (path, protection) in [
        (".git/config.lock", Protection::ReadOnly),
        (".git/config.worktree.lock", Protection::ReadOnly),
        (".git/info/exclude.lock", Protection::ReadOnly),
        (".git/modules/sub/config.lock", Protection::ReadOnly),
        ("conf/x.toml.lock", Protection::ReadOnly),
        // git inside takes these.
        (".git/index.lock", Protection::None),
        (".git/HEAD.lock", Protection::None),
        (".git/refs/heads/main.lock", Protection::None),
        ("conf/y.toml.lock", Protection::None),
        (".lock", Protection::None),
    ] {
        assert_eq!(read_only_at(&classifier, path, &host), protection, "{path}");
    }
    // Beside a `HEAD` the host has, as `config` is there.
    let state = classifier.root();
    let head = HostFacts {
        exists: false,
        dir_holds_head: true,
    };
    assert_eq!(
        classifier.protection(&state, b"", b"config.lock", false, head),
        Protection::ReadOnly
    );
    assert!(lazaret_routing::classify::needs_head(b"config.lock"));
}

/// The rules `gather` takes for the workspace at `workspace`.
fn rules_of(fixture: &Fixture, workspace: &Path) -> WorkspaceRules {
    let dir = std::fs::File::open(workspace).unwrap();
    gather(dir.as_fd(), workspace, true, &fixture.user(), None)
        .expect("gather")
        .rules
}

/// Paths as text.
fn texts(paths: &[RelativePath]) -> BTreeSet<String> {
    paths
        .iter()
        .map(|p| String::from_utf8(p.0.clone()).unwrap())
        .collect()
}

/// The protection of `path` (a file) under `classifier`.
fn read_only_at(
    classifier: &Classifier,
    path: &str,
    host: &dyn Fn(&[u8]) -> HostFacts,
) -> Protection {
    let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
    let state = classifier.walk(dir.as_bytes(), true, host).1;
    classifier.protection(
        &state,
        dir.as_bytes(),
        name.as_bytes(),
        false,
        HostFacts::default(),
    )
}

#[test]
fn git_directories_not_named_dot_git_are_protected_as_git_directories() {
    let fixture = Fixture::new();
    // The workspace's repository keeps its git directory in `.bare`, named
    // by its `.git` file.
    let workspace = fixture.repo.parent().unwrap().join("ws");
    std::fs::create_dir_all(&workspace).unwrap();
    fixture.git(
        &workspace,
        &["init", "-q", "--separate-git-dir", ".bare", "."],
    );
    // A nested repository whose git directory is a sibling; one whose
    // `.git` is a link to a bare repository; a bare repository no `.git`
    // names (a test fixture: an ordinary directory, whose configuration
    // and hooks the `HEAD` beside them protect).
    fixture.git(&workspace, &["init", "-q", "--bare", "mirror.git"]);
    let nested = workspace.join("nested");
    std::fs::create_dir_all(&nested).unwrap();
    fixture.git(
        &nested,
        &["init", "-q", "--separate-git-dir", "../gitdata", "."],
    );
    fixture.git(&workspace, &["init", "-q", "--bare", "linkdata"]);
    std::fs::create_dir_all(workspace.join("linked")).unwrap();
    std::os::unix::fs::symlink("../linkdata", workspace.join("linked/.git")).unwrap();
    let rules = rules_of(&fixture, &workspace);
    let git_dirs = texts(&rules.git_dirs);
    let expected: BTreeSet<String> = [".bare", "gitdata", "linkdata"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(git_dirs, expected);
    let classifier = Classifier::new(&rules);
    let host = |path: &[u8]| HostFacts {
        exists: workspace.join(std::str::from_utf8(path).unwrap()).exists(),
        dir_holds_head: false,
    };
    for dir in [".bare", "gitdata", "linkdata"] {
        // A todo list the developer would continue stays inside.
        let (route, _) = classifier.walk(format!("{dir}/rebase-merge").as_bytes(), true, &host);
        assert_eq!(route, Route::Isolated, "{dir}");
        for file in ["config", "info/exclude", "hooks/pre-commit"] {
            assert_eq!(
                read_only_at(&classifier, &format!("{dir}/{file}"), &host),
                Protection::ReadOnly,
                "{dir}/{file}"
            );
        }
        let state = classifier.root();
        let protection =
            classifier.protection(&state, b"", dir.as_bytes(), true, host(dir.as_bytes()));
        assert_eq!(protection, Protection::Fixed, "{dir}");
    }
}

#[test]
fn a_submodule_in_an_ignored_directory_stays_tracked() {
    let fixture = Fixture::new();
    fixture.write(".gitignore", "vendor/\nsecrets/\n");
    fixture.write("secrets/prod.key", "SECRET");
    let sub = fixture.repo.join("vendor/sub");
    std::fs::create_dir_all(&sub).unwrap();
    fixture.git(&sub, &["init", "-q", "."]);
    fixture.write("vendor/sub/file.c", "x");
    fixture.write("vendor/other.c", "x");
    fixture.git(&sub, &["add", "file.c"]);
    fixture.git(&sub, &["commit", "-q", "-m", "x"]);
    let head = fixture.git(&sub, &["rev-parse", "HEAD"]);
    fixture.git(
        &fixture.repo,
        &[
            "update-index",
            "--add",
            "--cacheinfo",
            &format!("160000,{},vendor/sub", head.trim()),
        ],
    );
    // What the sandbox could add to the index: a submodule entry for an
    // ignored directory of secrets, with no repository there.
    fixture.git(
        &fixture.repo,
        &[
            "update-index",
            "--add",
            "--cacheinfo",
            &format!("160000,{},secrets", head.trim()),
        ],
    );
    let rules = rules_of(&fixture, &fixture.repo);
    let dirs = texts(&rules.scopes[0].tracked_ignored_dirs);
    assert_eq!(
        dirs,
        BTreeSet::from(["secrets".into(), "vendor/sub".into()])
    );
    let classifier = Classifier::new(&rules);
    let host = |_: &[u8]| HostFacts {
        exists: true,
        dir_holds_head: false,
    };
    for (path, is_dir, route) in [
        ("vendor/sub", true, Route::Host),
        ("vendor/sub/file.c", false, Route::Host),
        ("vendor/other.c", false, Route::Isolated),
        ("secrets/prod.key", false, Route::Isolated),
        // A file of the submodule's name is not it.
        ("vendor/sub", false, Route::Isolated),
    ] {
        assert_eq!(
            classifier.walk(path.as_bytes(), is_dir, &host).0,
            route,
            "{path}"
        );
    }
}

#[test]
fn patterns_that_are_not_utf8_ignore_what_git_ignores() {
    use std::os::unix::ffi::OsStrExt;
    let fixture = Fixture::new();
    std::fs::write(fixture.repo.join(".gitignore"), b"secret\xe9.txt\n").unwrap();
    let name = std::ffi::OsStr::from_bytes(b"secret\xe9.txt");
    std::fs::write(fixture.repo.join(name), "x").unwrap();
    std::fs::write(fixture.repo.join("secret.txt"), "x").unwrap();
    let rules = rules_of(&fixture, &fixture.repo);
    let classifier = Classifier::new(&rules);
    let host = |_: &[u8]| HostFacts {
        exists: true,
        dir_holds_head: false,
    };
    assert_eq!(
        classifier.walk(b"secret\xe9.txt", false, &host).0,
        Route::Isolated
    );
    assert_eq!(classifier.walk(b"secret.txt", false, &host).0, Route::Host);
}

/// `gather` of the workspace at `workspace`, compared with `earlier`.
fn gathered_after(
    fixture: &Fixture,
    workspace: &Path,
    earlier: &WorkspaceRules,
) -> lazaret_routing::gather::Gathered {
    let dir = std::fs::File::open(workspace).unwrap();
    gather(dir.as_fd(), workspace, true, &fixture.user(), Some(earlier)).expect("gather")
}

/// The route of the file at `path` (workspace-relative) under `rules`,
/// with the host having every path.
fn route_of(rules: &WorkspaceRules, path: &str) -> Route {
    Classifier::new(rules)
        .walk(path.as_bytes(), false, &|_| HostFacts {
            exists: true,
            dir_holds_head: false,
        })
        .0
}

#[test]
fn paths_the_last_rules_isolated_and_the_new_share_are_found_top_most() {
    let fixture = Fixture::new();
    fixture.write(".gitignore", ".env\nnode_modules/\n*.log\n__pycache__/\n");
    fixture.write(".env", "SECRET=host\n");
    fixture.write("node_modules/a/b/index.js", "x\n");
    fixture.write("x.log", "log\n");
    fixture.write("src/deep/y.log", "log\n");
    fixture.write("src/__pycache__/m.pyc", "pyc\n");
    fixture.write("src/main.rs", "fn main() {}\n");
    fixture.git(&fixture.repo, &["add", ".gitignore", "src/main.rs"]);
    let earlier = rules_of(&fixture, &fixture.repo);

    // The same rules share nothing new.
    let same = gathered_after(&fixture, &fixture.repo, &earlier);
    assert!(same.newly_shared.is_empty(), "{:?}", same.newly_shared);

    // A `.gitignore` edited and a path added to the index (`git add -f`).
    fixture.write(".gitignore", "__pycache__/\n");
    fixture.git(&fixture.repo, &["add", "-f", ".env"]);
    let now = gathered_after(&fixture, &fixture.repo, &earlier);
    assert_eq!(
        texts(&now.newly_shared).into_iter().collect::<Vec<_>>(),
        [".env", "node_modules", "src/deep/y.log", "x.log"],
        "only the top-most of each, nothing still ignored"
    );
    assert_eq!(route_of(&now.rules, ".env"), Route::Host);

    // Kept: the new rules route them to the isolated side, with
    // everything below, until accepted.
    let mut kept = now.rules.clone();
    kept.kept_isolated = now.newly_shared.clone();
    for path in [
        ".env",
        "node_modules/a/b/index.js",
        "x.log",
        "src/deep/y.log",
    ] {
        assert_eq!(route_of(&kept, path), Route::Isolated, "{path}");
    }
    assert_eq!(route_of(&kept, "src/main.rs"), Route::Host);
    // The next `up` compares with the kept rules: still newly shared.
    let next = gathered_after(&fixture, &fixture.repo, &kept);
    assert_eq!(next.newly_shared, now.newly_shared);
    // Accepted: compared with the rules as they were taken, nothing is.
    let accepted = gathered_after(&fixture, &fixture.repo, &now.rules);
    assert!(
        accepted.newly_shared.is_empty(),
        "{:?}",
        accepted.newly_shared
    );
}

#[test]
fn a_host_file_made_since_under_a_pattern_now_dropped_is_newly_shared() {
    let fixture = Fixture::new();
    fixture.write(".gitignore", "*.key\n");
    let earlier = rules_of(&fixture, &fixture.repo);
    // Made on the host after the last generation started, believing it
    // ignored.
    fixture.write("conf/server.key", "KEY\n");
    fixture.write(".gitignore", "");
    let now = gathered_after(&fixture, &fixture.repo, &earlier);
    assert_eq!(
        texts(&now.newly_shared).into_iter().collect::<Vec<_>>(),
        ["conf/server.key"]
    );
}

#[test]
fn a_workspace_no_longer_ignored_whole_stays_isolated_whole() {
    let fixture = Fixture::new();
    fixture.write(".gitignore", "vendored/\n");
    fixture.write("vendored/lib/.env", "SECRET\n");
    let workspace = fixture.repo.join("vendored");
    let earlier = rules_of(&fixture, &workspace);
    fixture.write(".gitignore", "");
    let now = gathered_after(&fixture, &workspace, &earlier);
    assert_eq!(now.newly_shared, [RelativePath::default()]);
    let mut kept = now.rules.clone();
    kept.kept_isolated = now.newly_shared.clone();
    assert!(Classifier::new(&kept).workspace_is_isolated());
    assert_eq!(route_of(&kept, "lib/.env"), Route::Isolated);
}

#[test]
fn rules_that_isolated_nothing_share_nothing_new() {
    let fixture = Fixture::new();
    fixture.write(".gitignore", ".env\n");
    fixture.write(".env", "SECRET\n");
    let dir = std::fs::File::open(&fixture.repo).unwrap();
    let earlier = gather(dir.as_fd(), &fixture.repo, false, &fixture.user(), None)
        .unwrap()
        .rules;
    fixture.write(".gitignore", "");
    let now = gathered_after(&fixture, &fixture.repo, &earlier);
    assert!(now.newly_shared.is_empty(), "{:?}", now.newly_shared);
}

/// Makes `levels` nested directories named `name` in `dir`, each made and
/// entered through its parent's descriptor (their whole paths may be
/// longer than the kernel resolves at once).
fn nest(dir: &Path, name: &str, levels: usize) {
    use rustix::fs::{Mode, OFlags};
    let mut fd = rustix::fs::open(dir, OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap();
    for _ in 0..levels {
        rustix::fs::mkdirat(&fd, name, Mode::from_raw_mode(0o755)).unwrap();
        fd =
            rustix::fs::openat(&fd, name, OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap();
    }
}

#[test]
fn a_tree_deeper_than_the_walk_goes_is_refused_naming_its_first_too_deep_directory() {
    use lazaret_routing::gather::MAX_WALK_DEPTH;
    let fixture = Fixture::new();
    // As deep as the walk goes: taken.
    nest(&fixture.repo.join("."), "a", MAX_WALK_DEPTH);
    rules_of(&fixture, &fixture.repo);

    // 2,041 levels: each path fits in what the kernel resolves relative to
    // the workspace, not whole.
    let deep = fixture.repo.join("deep");
    std::fs::create_dir(&deep).unwrap();
    nest(&deep, "a", 2041);
    let dir = std::fs::File::open(&fixture.repo).unwrap();
    let error = gather(dir.as_fd(), &fixture.repo, true, &fixture.user(), None)
        .expect_err("a tree deeper than the walk goes");
    let shown = error.to_string();
    // `deep` is one level down: the first too deep is its 1,024th `a`.
    let first = format!("{}{}", deep.display(), "/a".repeat(MAX_WALK_DEPTH));
    assert!(
        shown.starts_with(&format!(
            "the workspace holds directories more than {MAX_WALK_DEPTH} levels deep"
        )),
        "{shown}"
    );
    assert!(
        shown.contains("list them (or a directory above them) in a .gitignore"),
        "{shown}"
    );
    // The whole path of the first directory below the bound, to its end.
    assert!(
        shown.ends_with(&format!("; the first one is {first}")),
        "{shown}"
    );

    // Ignored, it is not walked.
    fixture.write(".gitignore", "/deep/\n");
    rules_of(&fixture, &fixture.repo);
}

#[test]
fn a_directory_path_longer_than_the_kernel_resolves_is_refused_naming_it() {
    use lazaret_routing::gather::MAX_WALK_PATH_LEN;
    let fixture = Fixture::new();
    let long = fixture.repo.join("long");
    std::fs::create_dir(&long).unwrap();
    let name = "n".repeat(250);
    nest(&long, &name, 20);
    let dir = std::fs::File::open(&fixture.repo).unwrap();
    let error = gather(dir.as_fd(), &fixture.repo, true, &fixture.user(), None)
        .expect_err("a path longer than the walk takes");
    let shown = error.to_string();
    // The first directory past the bound, named whole.
    let mut first = long.clone();
    while first.as_os_str().len() <= MAX_WALK_PATH_LEN {
        first.push(&name);
    }
    assert!(
        shown.starts_with(&format!(
            "the workspace holds a directory whose path is {} bytes long",
            first.as_os_str().len()
        )),
        "{shown}"
    );
    assert!(shown.contains("shorten the names on its path"), "{shown}");
    assert!(
        shown.ends_with(&format!("; it is {}", first.display())),
        "{shown}"
    );
    fixture.write(".gitignore", "long/\n");
    rules_of(&fixture, &fixture.repo);
}
