//! The workspace boundary end to end, as an unprivileged user with real
//! runsc: a git repository's ignored files stay out of the sandbox and what
//! the sandbox makes of them stays out of the host; git's configuration and
//! hooks cannot be written inside while git itself works; git metadata the
//! sandbox plants never runs on the host; nothing planted beside, or
//! sourced by, a script the host's git runs runs with it, and `down` lists
//! what changed where that cannot be stopped; a submodule cannot be moved;
//! modes lose setuid, setgid and group/other write; subdirectory,
//! worktree, submodule and separate git directory workspaces; a killed
//! Workspace Router fails closed; files of other groups, and the main
//! trials again in a project directory of another group and under a
//! setgid parent; a tree deeper than `up` walks; a path unignored inside
//! stays hidden until the developer agrees. Needs root (to create the
//! test user and group and switch to them), runsc, git and a `/dev/fuse`
//! the user can open; CI provides all of them.

use std::os::unix::fs::MetadataExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use lazaret_tests::domain::{Shape, UserHost, git_image};
use libtest_mimic::{Failed, Trial};
use serde_json::Value;

use crate::domain::{
    Result, ShapedTest, assert_nothing_left, config, down, gated, in_every_shape, made_group,
    runnable, shaped_host, text, up, wait_until, writes_reach_the_host,
};

pub fn trials() -> Vec<Trial> {
    let tools = Path::new("/usr/bin/git").exists()
        && rustix::fs::access(
            "/dev/fuse",
            rustix::fs::Access::READ_OK | rustix::fs::Access::WRITE_OK,
        )
        .is_ok();
    let runnable = runnable() && tools;
    if std::env::var_os("CI").is_some() {
        assert!(
            runnable,
            "CI must run the workspace tests with git installed and /dev/fuse usable \
             (packaging/device-access.sh)"
        );
    }
    let shaped: [(&str, ShapedTest); 5] = [
        (
            "workspace::ignored_paths_are_isolated_both_ways",
            ignored_paths_are_isolated,
        ),
        (
            "workspace::git_works_inside_but_its_configuration_and_hooks_are_read_only",
            git_works_inside,
        ),
        (
            "workspace::modes_lose_setuid_setgid_and_group_other_write",
            modes,
        ),
        (
            "workspace::a_subdirectory_takes_the_enclosing_rules",
            subdirectory,
        ),
        (
            "workspace::a_worktree_and_a_submodule_work",
            worktree_and_submodule,
        ),
    ];
    gated(
        runnable,
        shaped
            .into_iter()
            .flat_map(|(name, test)| in_every_shape(name, test))
            .chain([
                Trial::test(
                    "workspace::a_separate_git_directory_and_what_its_hooks_run_are_read_only",
                    separate_git_dir,
                ),
                Trial::test(
                    "workspace::planted_git_metadata_runs_nothing_on_the_host",
                    planted_metadata,
                ),
                Trial::test(
                    "workspace::planted_git_metadata_in_a_plain_workspace_runs_nothing",
                    planted_metadata_plain,
                ),
                Trial::test("workspace::a_killed_router_fails_closed", killed_router),
                Trial::test(
                    "workspace::a_directory_made_unreadable_inside_stops_the_next_up",
                    unreadable_directory,
                ),
                Trial::test(
                    "workspace::files_of_other_groups_are_written_by_their_owner",
                    other_groups,
                ),
                Trial::test(
                    "workspace::a_tree_deeper_than_up_walks_stops_it_naming_its_first_too_deep_directory",
                    too_deep,
                ),
                Trial::test(
                    "workspace::a_submodule_cannot_be_moved",
                    submodule_unmovable,
                ),
                Trial::test(
                    "workspace::what_host_scripts_load_cannot_be_planted",
                    script_directories,
                ),
                Trial::test(
                    "workspace::down_lists_what_changed_where_git_runs_scripts",
                    down_lists_changes,
                ),
                Trial::test(
                    "workspace::a_path_unignored_inside_stays_hidden_until_accepted",
                    unignored_stays_hidden,
                ),
            ]),
    )
}

/// The serial lock and a test host whose profile `p` runs the git image.
fn git_host() -> (std::sync::MutexGuard<'static, ()>, UserHost) {
    shaped_git_host(Shape::Own)
}

/// [`git_host`] with its projects in `shape`.
fn shaped_git_host(shape: Shape) -> (std::sync::MutexGuard<'static, ()>, UserHost) {
    shaped_host(&config(&git_image(), "\"/root\""), shape)
}

/// [`git_host`] whose workspace is a [`repository`], and the workspace.
fn repository_host() -> (std::sync::MutexGuard<'static, ()>, UserHost, PathBuf) {
    shaped_repository_host(Shape::Own)
}

/// [`repository_host`] with its projects in `shape`.
fn shaped_repository_host(shape: Shape) -> (std::sync::MutexGuard<'static, ()>, UserHost, PathBuf) {
    let (serial, host) = shaped_git_host(shape);
    let ws = host.workspace.clone();
    repository(&host, &ws);
    (serial, host, ws)
}

/// `sh -c SCRIPT` on the host as the test user, in `dir`; fails the test
/// on a non-zero exit.
fn sh(host: &UserHost, dir: &Path, script: &str) -> String {
    let out = host
        .command(Path::new("/bin/sh"), dir)
        .args(["-c", script])
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .expect("run sh");
    assert!(out.status.success(), "host `{script}`: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A git repository in `dir` with one commit: a `.gitignore` for `.env`,
/// `node_modules/`, `*.log` and `__pycache__/`, a tracked `README`, and
/// the ignored host files `.env` (a secret) and `node_modules/host-only`.
fn repository(host: &UserHost, dir: &Path) {
    sh(
        host,
        dir,
        "git init -q -b main . && \
         printf '.env\\nnode_modules/\\n*.log\\n__pycache__/\\n' > .gitignore && \
         echo 'hello from the host' > README && \
         git add .gitignore README && \
         git -c user.name=host -c user.email=host@example.invalid commit -q -m init && \
         echo 'SECRET=host-only-value' > .env && \
         mkdir -p node_modules/host-only && echo x > node_modules/host-only/index.js",
    );
}

/// Runs `script` inside the sandbox; returns stdout, failing on non-zero.
fn inside(host: &UserHost, status: &Value, script: &str) -> std::result::Result<String, Failed> {
    let out = host.exec(status, script);
    if !out.status.success() {
        return Err(format!("inside `{script}`: {}", text(&out)).into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `script` inside the sandbox; fails the test if it succeeds.
fn refused_inside(host: &UserHost, status: &Value, script: &str) {
    let out = host.exec(status, script);
    assert!(
        !out.status.success(),
        "`{script}` succeeded inside: {}",
        text(&out)
    );
}

fn ignored_paths_are_isolated(shape: Shape) -> Result {
    let (_serial, host, ws) = shaped_repository_host(shape);
    let status = up(&host, &ws)?;
    writes_reach_the_host(&host, &status, &ws)?;
    assert_eq!(
        status["workspace_routing"]["isolate_gitignored"], true,
        "{status}"
    );
    assert_eq!(
        status["workspace_routing"]["repository"].as_str(),
        ws.to_str(),
        "{status}"
    );

    // The host's ignored files are not there; tracked ones are.
    let seen = host.exec(&status, "cat /workspace/.env; ls /workspace/node_modules");
    let seen = text(&seen);
    assert!(!seen.contains("host-only"), "{seen}");
    assert!(!seen.contains("SECRET=host-only-value"), "{seen}");
    assert_eq!(
        inside(&host, &status, "cat /workspace/README")?,
        "hello from the host\n"
    );

    // Edits and new files flow both ways.
    inside(
        &host,
        &status,
        "echo 'edited inside' >> /workspace/README && echo new > /workspace/new.txt",
    )?;
    assert_eq!(
        std::fs::read_to_string(ws.join("README"))?,
        "hello from the host\nedited inside\n"
    );
    assert_eq!(std::fs::read_to_string(ws.join("new.txt"))?, "new\n");
    sh(&host, &ws, "echo 'from the host' > host-new.txt");
    let from_host = wait_until(Duration::from_secs(5), "the host's new file inside", || {
        let out = host.exec(&status, "cat /workspace/host-new.txt");
        let seen = String::from_utf8_lossy(&out.stdout).into_owned();
        (seen == "from the host\n").then_some(seen)
    })?;
    assert_eq!(from_host, "from the host\n");

    // A host edit that keeps the length (and so needs the new mtime to be
    // noticed) shows up inside too, after the sandbox read, and the kernel
    // may have cached, the old contents.
    let edited = "hello from the host\nedited inside\n";
    assert_eq!(inside(&host, &status, "cat /workspace/README")?, edited);
    sh(
        &host,
        &ws,
        "printf 'HELLO FROM THE HOST\\nEDITED INSIDE\\n' > README",
    );
    let upper = edited.to_uppercase();
    wait_until(Duration::from_secs(5), "the host's edit inside", || {
        let out = host.exec(&status, "cat /workspace/README");
        (out.stdout == upper.as_bytes()).then_some(())
    })?;

    // What the sandbox writes to ignored paths stays in the Domain.
    inside(
        &host,
        &status,
        "mkdir -p /workspace/a/b /workspace/node_modules /workspace/pkg/__pycache__ && \
         echo log > /workspace/a/b/c.log && echo x > /workspace/node_modules/x && \
         echo pyc > /workspace/pkg/__pycache__/m.pyc && \
         echo 'SECRET=sandbox' > /workspace/.env && echo src > /workspace/pkg/m.py",
    )?;
    for path in ["a/b/c.log", "node_modules/x", "pkg/__pycache__"] {
        assert!(!ws.join(path).exists(), "{path} reached the host");
    }
    assert!(ws.join("pkg/m.py").exists() && ws.join("a/b").is_dir());
    assert_eq!(
        std::fs::read_to_string(ws.join(".env"))?,
        "SECRET=host-only-value\n"
    );
    assert!(!ws.join("node_modules/x").exists() && ws.join("node_modules/host-only").exists());

    // Un-ignoring `.env` inside changes nothing for this generation.
    inside(
        &host,
        &status,
        "printf 'node_modules/\\n*.log\\n__pycache__/\\n' > /workspace/.gitignore",
    )?;
    assert_eq!(
        inside(&host, &status, "cat /workspace/.env")?,
        "SECRET=sandbox\n"
    );
    sh(&host, &ws, "git checkout -q -- .gitignore");

    // The isolated copies persist across down and up.
    down(&host, &ws)?;
    let status = up(&host, &ws)?;
    assert_eq!(
        inside(
            &host,
            &status,
            "cat /workspace/a/b/c.log /workspace/node_modules/x /workspace/pkg/__pycache__/m.pyc \
             /workspace/.env"
        )?,
        "log\nx\npyc\nSECRET=sandbox\n"
    );
    let isolated = PathBuf::from(
        status["workspace_routing"]["isolated_root"]
            .as_str()
            .ok_or("status names no isolated root")?,
    );
    assert!(
        isolated.join("a/b/c.log").is_file(),
        "{}",
        isolated.display()
    );
    down(&host, &ws)?;
    Ok(())
}

fn git_works_inside(shape: Shape) -> Result {
    let (_serial, host, ws) = shaped_repository_host(shape);
    // Hooks kept in the worktree, as husky sets them up.
    sh(
        &host,
        &ws,
        "mkdir .husky && printf '#!/bin/sh\\nexit 0\\n' > .husky/pre-commit && \
         chmod +x .husky/pre-commit && git config core.hooksPath .husky && \
         git add .husky && git -c user.name=host -c user.email=host@example.invalid \
         commit -q -m hooks",
    );
    let config_before = std::fs::read(ws.join(".git/config"))?;
    let status = up(&host, &ws)?;
    for script in [
        "echo '[core]' >> /workspace/.git/config",
        "echo '#!/bin/sh' > /workspace/.git/hooks/pre-commit",
        "mv /workspace/.git /workspace/old-git",
        "rm /workspace/.git/config",
        "echo 'touch /tmp/x' >> /workspace/.husky/pre-commit",
        "mv /workspace/.husky /workspace/husky-old",
        // A lock file of a protected file would stop the host's `git config`.
        ": > /workspace/.git/config.lock",
        "mkdir /workspace/.git/config.lock",
        ": > /workspace/.git/info/exclude.lock",
    ] {
        refused_inside(&host, &status, script);
    }
    // gVisor reports a refused chmod as done; the host's mode is unchanged.
    let mode = |p: &str| std::fs::metadata(ws.join(p)).map(|m| m.mode() & 0o7777);
    let config_mode = mode(".git/config")?;
    host.exec(&status, "chmod 0777 /workspace/.git/config");
    assert_eq!(mode(".git/config")?, config_mode);
    assert!(!ws.join(".git/hooks/pre-commit").exists());
    assert_eq!(std::fs::read(ws.join(".git/config"))?, config_before);

    inside(
        &host,
        &status,
        "cd /workspace && export GIT_AUTHOR_NAME=agent GIT_AUTHOR_EMAIL=agent@example.invalid \
         GIT_COMMITTER_NAME=agent GIT_COMMITTER_EMAIL=agent@example.invalid && \
         echo change >> README && echo added > added.txt && \
         git add README added.txt && git commit -q -m 'from inside' && \
         git checkout -q -b feature && git checkout -q main && git branch -q -D feature && \
         echo wip >> README && git stash -q && git stash pop -q && git checkout -q -- README && \
         git checkout -q -b topic && echo t > topic.txt && git add topic.txt && \
         git commit -q -m topic && git checkout -q main && echo more >> added.txt && \
         git commit -q -am 'main again' && git checkout -q topic && git rebase -q main && \
         git checkout -q main && git merge -q --ff-only topic && git status --short",
    )?;
    let log = sh(&host, &ws, "git log --format=%s");
    assert_eq!(log, "topic\nmain again\nfrom inside\nhooks\ninit\n");
    assert!(!ws.join(".git/rebase-merge").exists());
    sh(&host, &ws, "git fsck --strict");
    down(&host, &ws)?;
    assert!(!ws.join(".git/config.lock").exists());
    sh(&host, &ws, "git config lazaret.test yes");
    Ok(())
}

/// A repository keeping its git directory in `.bare` (named by its `.git`
/// file), with the hook pre-commit installs: what it runs by name, and the
/// git directory, are protected; git works inside.
fn separate_git_dir() -> Result {
    let (_serial, host) = git_host();
    let ws = host.workspace.clone();
    sh(
        &host,
        &ws,
        "git init -q -b main --separate-git-dir .bare . && echo 'gitdir: .bare' > .git && \
         echo '.env' > .gitignore && echo hello > README && git add .gitignore README && \
         git -c user.name=host -c user.email=host@example.invalid commit -q -m init && \
         printf '#!/bin/sh\nexec python3 -mpre_commit hook-impl --hook-type=pre-commit\n' \
           > .bare/hooks/pre-commit && chmod +x .bare/hooks/pre-commit && \
         echo 'repos: []' > .pre-commit-config.yaml",
    );
    let config_before = std::fs::read(ws.join(".bare/config"))?;
    let exclude_before = std::fs::read(ws.join(".bare/info/exclude"))?;
    let status = up(&host, &ws)?;
    for script in [
        "echo 'import os' > /workspace/pre_commit.py",
        "mkdir /workspace/pre_commit",
        "echo x > /workspace/pre_commit.abi3.so",
        "echo 'repos: [evil]' > /workspace/.pre-commit-config.yaml",
        "echo x > /workspace/.pre-commit-config.yml",
        "printf '[core]\\n\\tfsmonitor = touch /tmp/x\\n' >> /workspace/.bare/config",
        "echo '#!/bin/sh' > /workspace/.bare/hooks/post-checkout",
        "echo '!.env' >> /workspace/.bare/info/exclude",
        "mv /workspace/.bare /workspace/bare-old",
    ] {
        refused_inside(&host, &status, script);
    }
    inside(
        &host,
        &status,
        "cd /workspace && export GIT_AUTHOR_NAME=agent GIT_AUTHOR_EMAIL=agent@example.invalid \
         GIT_COMMITTER_NAME=agent GIT_COMMITTER_EMAIL=agent@example.invalid && \
         echo change >> README && git commit -q --no-verify -am 'from inside' && \
         mkdir .bare/rebase-merge && echo 'exec touch /tmp/x' > .bare/rebase-merge/git-rebase-todo",
    )?;
    down(&host, &ws)?;
    assert_eq!(sh(&host, &ws, "git log --format=%s"), "from inside\ninit\n");
    assert_eq!(std::fs::read(ws.join(".bare/config"))?, config_before);
    assert_eq!(
        std::fs::read(ws.join(".bare/info/exclude"))?,
        exclude_before
    );
    assert_eq!(
        std::fs::read_to_string(ws.join(".pre-commit-config.yaml"))?,
        "repos: []\n"
    );
    for path in [
        "pre_commit.py",
        "pre_commit",
        "pre_commit.abi3.so",
        ".pre-commit-config.yml",
        ".bare/hooks/post-checkout",
        ".bare/rebase-merge",
    ] {
        assert!(!ws.join(path).exists(), "{path} reached the host");
    }
    Ok(())
}

/// A marker path the planted commands would create on the host, in a
/// directory the test user may write to.
fn marker(host: &UserHost, name: &str) -> PathBuf {
    host.user_dir("markers").join(name)
}

/// The three plants, made in `root` (inside the sandbox, or on the host
/// for the control), each aimed at its own marker:
/// - `src/.git`, a nested git directory whose `core.fsmonitor` runs on
///   `git status`;
/// - `bare`, a bare repository with a commit whose `core.pager` runs on
///   `git log` in a terminal;
/// - `wt/.git`, a `gitdir:` file naming `gd`, a git directory made by the
///   sandbox whose `core.fsmonitor` runs on `git status` in `wt`.
fn plants(host: &UserHost, root: &str) -> String {
    format!(
        "set -e; cd {root}; \
         mkdir -p src/.git/objects src/.git/refs; echo 'ref: refs/heads/main' > src/.git/HEAD; \
         printf '[core]\\n\\tfsmonitor = touch {nested}\\n' > src/.git/config; \
         git init -q --bare -b main bare; git init -q -b main c; cd c; echo x > x; git add x; \
         git -c user.name=a -c user.email=a@example.invalid commit -q -m x; \
         git push -q --receive-pack='git receive-pack' ../bare main; cd ..; \
         printf '[core]\\n\\tbare = true\\n\\tpager = \"touch {pager}; cat\"\\n' > bare/config; \
         mkdir -p gd/objects gd/refs wt; echo 'ref: refs/heads/main' > gd/HEAD; \
         printf '[core]\\n\\tfsmonitor = touch {gitfile}\\n' > gd/config; \
         echo 'gitdir: ../gd' > wt/.git",
        nested = marker(host, "nested").display(),
        pager = marker(host, "pager").display(),
        gitfile = marker(host, "gitfile").display(),
    )
}

/// Runs host `git status` and `git log` (on a terminal, so a pager would
/// run) in each planted directory, as the test user.
fn host_git_in_plants(host: &UserHost, root: &Path) {
    for dir in ["src", "bare", "wt"] {
        for script in ["git status --short", "script -qec 'git log -1' /dev/null"] {
            let _ = host
                .command(Path::new("/bin/sh"), &root.join(dir))
                .args(["-c", script])
                .env("GIT_CONFIG_NOSYSTEM", "1")
                .output();
        }
    }
}

const MARKERS: [&str; 3] = ["nested", "pager", "gitfile"];

fn markers(host: &UserHost) -> Vec<&'static str> {
    MARKERS
        .into_iter()
        .filter(|name| marker(host, name).exists())
        .collect()
}

/// The plants work: made on the host directly, host git runs every one.
fn control(host: &UserHost) {
    let control = host.user_dir("control");
    sh(host, &control, &plants(host, control.to_str().unwrap()));
    host_git_in_plants(host, &control);
    assert_eq!(
        markers(host),
        MARKERS,
        "the plants must run when made on the host (control)"
    );
    for name in MARKERS {
        let _ = std::fs::remove_file(marker(host, name));
    }
}

fn planted_in(host: &UserHost, ws: &Path) -> Result {
    control(host);
    let status = up(host, ws)?;
    inside(host, &status, &plants(host, "/workspace"))?;
    // Inside, the plants are what the sandbox made.
    assert_eq!(
        inside(host, &status, "cat /workspace/wt/.git")?,
        "gitdir: ../gd\n"
    );
    down(host, ws)?;
    for path in ["src/.git", "bare/HEAD", "gd/HEAD", "wt/.git", "c/.git"] {
        assert!(!ws.join(path).exists(), "{path} reached the host");
    }
    host_git_in_plants(host, ws);
    let ran = markers(host);
    assert!(ran.is_empty(), "planted commands ran on the host: {ran:?}");
    Ok(())
}

fn planted_metadata() -> Result {
    let (_serial, host, ws) = repository_host();
    planted_in(&host, &ws)
}

fn planted_metadata_plain() -> Result {
    let (_serial, host) = git_host();
    let ws = host.workspace.clone();
    planted_in(&host, &ws)
}

/// Modes lose setuid, setgid and group and other write; a directory keeps
/// the setgid bit the host's kernel gives it under a setgid directory
/// (and nothing else), and what is made has the group the host gives it.
fn modes(shape: Shape) -> Result {
    let (_serial, host, ws) = shaped_repository_host(shape);
    let status = up(&host, &ws)?;
    inside(
        &host,
        &status,
        "cd /workspace && echo x > x && chmod 6755 x && mkdir src && chmod 0777 src && \
         touch y && chmod 0666 y && mkdir -m 2777 shared && mkdir plain && chmod 2755 plain && \
         umask 0 && echo z > z && mkdir -m 0777 open",
    )?;
    let setgid_dirs = shape == Shape::SetgidParent;
    for path in ["x", "src", "y", "shared", "plain", "z", "open"] {
        let meta = std::fs::symlink_metadata(ws.join(path))?;
        let mode = meta.mode() & 0o7777;
        if meta.is_dir() {
            assert_eq!(mode & 0o4022, 0, "{path} has mode {mode:o} on the host");
            assert_eq!(
                mode & 0o2000 != 0,
                setgid_dirs,
                "{path} has mode {mode:o} on the host"
            );
        } else {
            assert_eq!(mode & 0o6022, 0, "{path} has mode {mode:o} on the host");
        }
        assert_eq!(
            (meta.uid(), meta.gid()),
            (host.uid(), made_group(&host)),
            "{path}"
        );
    }
    down(&host, &ws)?;
    Ok(())
}

fn subdirectory(shape: Shape) -> Result {
    let (_serial, host, ws) = shaped_repository_host(shape);
    sh(
        &host,
        &ws,
        "mkdir -p sub && echo 'SECRET=sub-value' > sub/.env && echo tracked > sub/file && \
         echo build > sub/out.log",
    );
    let sub = ws.join("sub");
    let status = up(&host, &sub)?;
    assert_eq!(
        status["workspace_routing"]["repository"].as_str(),
        ws.to_str(),
        "{status}"
    );
    let seen = text(&host.exec(&status, "cat /workspace/.env /workspace/out.log"));
    assert!(
        !seen.contains("sub-value") && !seen.contains("build"),
        "{seen}"
    );
    assert_eq!(inside(&host, &status, "cat /workspace/file")?, "tracked\n");
    down(&host, &sub)?;
    Ok(())
}

fn worktree_and_submodule(shape: Shape) -> Result {
    let (_serial, host, ws) = shaped_repository_host(shape);
    // A submodule from another repository on this host.
    let library = host.project("library");
    sh(
        &host,
        &library,
        "git init -q -b main . && echo '*.o' > .gitignore && echo lib > lib.c && \
         git add . && git -c user.name=h -c user.email=h@example.invalid commit -q -m lib",
    );
    sh(
        &host,
        &ws,
        &format!(
            "git -c protocol.file.allow=always submodule add -q {} lib && \
             git -c user.name=h -c user.email=h@example.invalid commit -q -m sub && \
             echo 'object' > lib/x.o",
            library.display()
        ),
    );
    let status = up(&host, &ws)?;
    assert_eq!(inside(&host, &status, "cat /workspace/lib/lib.c")?, "lib\n");
    let seen = text(&host.exec(&status, "cat /workspace/lib/x.o"));
    assert!(
        !seen.contains("object"),
        "the submodule's ignored file is visible: {seen}"
    );
    let out = host.exec(&status, "echo 'gitdir: /tmp' > /workspace/lib/.git");
    assert!(
        !out.status.success(),
        "a submodule's .git file was rewritten: {}",
        text(&out)
    );
    down(&host, &ws)?;

    // A linked worktree of the repository.
    let parent = host.project("worktrees");
    let worktree = parent.join("wt");
    sh(
        &host,
        &ws,
        &format!(
            "git worktree add -q {} && echo 'SECRET=wt' > {}/.env",
            worktree.display(),
            worktree.display()
        ),
    );
    let status = up(&host, &worktree)?;
    assert_eq!(
        status["workspace_routing"]["repository"].as_str(),
        worktree.to_str(),
        "{status}"
    );
    assert_eq!(
        inside(&host, &status, "cat /workspace/README")?,
        "hello from the host\n"
    );
    let seen = text(&host.exec(&status, "cat /workspace/.env"));
    assert!(!seen.contains("SECRET=wt"), "{seen}");
    let out = host.exec(&status, "echo 'gitdir: /tmp' > /workspace/.git");
    assert!(
        !out.status.success(),
        "the worktree's .git file was rewritten: {}",
        text(&out)
    );
    down(&host, &worktree)?;
    Ok(())
}

/// A submodule's working directory, or a directory holding it, cannot be
/// moved inside: its `.git` file and the superproject's index name it
/// where it is.
fn submodule_unmovable() -> Result {
    let (_serial, host, ws) = repository_host();
    let library = host.user_dir("library");
    sh(
        &host,
        &library,
        "git init -q -b main . && echo lib > lib.c && git add . && \
         git -c user.name=h -c user.email=h@example.invalid commit -q -m lib",
    );
    sh(
        &host,
        &ws,
        &format!(
            "mkdir vendor && git -c protocol.file.allow=always submodule add -q {} vendor/lib && \
             git -c user.name=h -c user.email=h@example.invalid commit -q -m sub",
            library.display()
        ),
    );
    let status = up(&host, &ws)?;
    inside(&host, &status, "mkdir -p /workspace/deep/x")?;
    let moved = done_inside(
        &host,
        &status,
        &[
            "mv /workspace/vendor/lib /workspace/deep/x/lib",
            "mv /workspace/vendor /workspace/deep/x/vendor",
            "mv /workspace/vendor /workspace/v2",
        ],
    );
    // Ordinary directories still move.
    inside(&host, &status, "mv /workspace/deep /workspace/deeper")?;
    down(&host, &ws)?;
    // The submodule works on the host where it was.
    let lib = std::fs::read_to_string(ws.join("vendor/lib/lib.c"));
    assert_eq!(
        lib.ok().as_deref(),
        Some("lib\n"),
        "moved inside: {moved:?}"
    );
    sh(
        &host,
        &ws,
        "git -C vendor/lib status --short && git submodule status",
    );
    // Nothing of it shows as changed (`deeper/x` is empty: git lists no
    // empty directory).
    assert_eq!(sh(&host, &ws, "git status --porcelain"), "");
    assert!(ws.join("deeper/x").is_dir() && !ws.join("deep").exists());
    assert!(moved.is_empty(), "moved inside: {moved:?}");
    Ok(())
}

/// Runs each of `scripts` inside; returns those that succeeded.
fn done_inside<'a>(host: &UserHost, status: &Value, scripts: &[&'a str]) -> Vec<&'a str> {
    scripts
        .iter()
        .copied()
        .filter(|script| host.exec(status, script).status.success())
        .collect()
}

/// The code the plants of [`script_plants`] run: each makes its own marker.
fn script_plants(host: &UserHost) -> [(&'static str, String); 3] {
    let make = |name: &str| marker(host, name).display().to_string();
    [
        (
            "json",
            format!(
                "printf 'open(\"{}\", \"w\").close()\\n' > scripts/json.py",
                make("json")
            ),
        ),
        (
            "helpers",
            format!("echo 'touch {}' >> tools/helpers.sh", make("helpers")),
        ),
        (
            "common",
            format!("echo 'touch {}' >> lib/common.sh", make("common")),
        ),
    ]
}

/// `git add` of a file the clean filter cleans and `git commit` with the
/// hook, on the host, as the developer runs them; their output.
fn host_add_and_commit(host: &UserHost, ws: &Path, name: &str) -> std::process::Output {
    host.command(Path::new("/bin/sh"), ws)
        .args([
            "-c",
            &format!(
                "echo {name} > {name}.txt && git add {name}.txt && \
                 git -c user.name=host -c user.email=host@example.invalid commit -q -m {name}"
            ),
        ])
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .expect("run sh")
}

/// What the host's git runs loads nothing the sandbox planted: a clean
/// filter's `python3 scripts/clean.py` imports from `scripts/`, where no
/// `json.py` can be made; a hook's `./tools/lint.sh` sources
/// `./tools/helpers.sh` and `lib/common.sh`, which cannot be changed.
fn script_directories() -> Result {
    let (_serial, host, ws) = repository_host();
    sh(
        &host,
        &ws,
        "mkdir scripts tools lib && \
         printf 'import sys\\nimport json\\nsys.stdout.write(sys.stdin.read())\\n' \
           > scripts/clean.py && \
         echo '*.txt filter=strip' > .gitattributes && \
         printf '#!/bin/sh\\n. ./tools/helpers.sh\\n. lib/common.sh\\nexit 0\\n' > tools/lint.sh && \
         chmod +x tools/lint.sh && echo true > tools/helpers.sh && echo true > lib/common.sh && \
         printf '#!/bin/sh\\nexec ./tools/lint.sh\\n' > .git/hooks/pre-commit && \
         chmod +x .git/hooks/pre-commit && \
         git config filter.strip.clean 'python3 scripts/clean.py' && git add . && \
         git -c user.name=host -c user.email=host@example.invalid commit -q -m scripts",
    );
    let plants = script_plants(&host);
    let status = up(&host, &ws)?;
    let planted: Vec<String> = plants
        .iter()
        .map(|(_, plant)| format!("cd /workspace && {plant}"))
        .collect();
    let mut attempts: Vec<&str> = planted.iter().map(String::as_str).collect();
    attempts.extend([
        "mkdir /workspace/scripts/json",
        "echo x > /workspace/tools/new.sh",
        "mv /workspace/tools /workspace/tools-old",
        "mv /workspace/lib /workspace/lib-old",
    ]);
    let done = done_inside(&host, &status, &attempts);
    // The rest of the project is the agent's to change.
    inside(
        &host,
        &status,
        "cd /workspace && echo more >> README && mkdir src && echo x > src/json.py",
    )?;
    down(&host, &ws)?;
    let committed = host_add_and_commit(&host, &ws, "a");
    let ran: Vec<&str> = plants
        .iter()
        .map(|(name, _)| *name)
        .filter(|name| marker(&host, name).exists())
        .collect();
    assert!(
        ran.is_empty(),
        "planted code ran on the host: {ran:?} (done inside: {done:?})"
    );
    assert!(done.is_empty(), "done inside: {done:?}");
    assert!(committed.status.success(), "{}", text(&committed));
    for path in ["scripts/json.py", "scripts/json", "tools/new.sh"] {
        assert!(!ws.join(path).exists(), "{path} reached the host");
    }

    // Control: the same plants made on the host do run.
    for (_, plant) in &plants {
        sh(&host, &ws, plant);
    }
    host_add_and_commit(&host, &ws, "b");
    for (name, _) in &plants {
        assert!(
            marker(&host, name).exists(),
            "the {name} plant must run when made on the host (control)"
        );
    }
    Ok(())
}

/// `lazaret down` lists what changed since `up` under a directory that
/// holds a script git runs, where it cannot be read-only: the worktree
/// root of a `python3 clean.py` filter.
fn down_lists_changes() -> Result {
    let (_serial, host, ws) = repository_host();
    sh(
        &host,
        &ws,
        "printf 'import sys\\nsys.stdout.write(sys.stdin.read())\\n' > clean.py && \
         echo '*.txt filter=strip' > .gitattributes && \
         git config filter.strip.clean 'python3 clean.py' && git add . && \
         git -c user.name=host -c user.email=host@example.invalid commit -q -m filter",
    );
    let status = up(&host, &ws)?;
    inside(
        &host,
        &status,
        "cd /workspace && echo 'import os' > json.py && echo more >> README && \
         mkdir pkg && echo x > pkg/m.py && echo sandbox > .env",
    )?;
    let out = host.lazaret(&ws, &["down", "p", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let answer: Value = serde_json::from_str(stdout.lines().last().ok_or("no output")?)?;
    assert_eq!(answer["event"], "stopped", "{answer}");
    let mut changes: Vec<(String, String)> = answer["workspace_changes"]
        .as_array()
        .ok_or_else(|| format!("no workspace_changes: {answer}"))?
        .iter()
        .map(|c| {
            (
                c["path"].as_str().unwrap_or_default().to_owned(),
                c["change"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    changes.sort();
    let expected: Vec<(String, String)> = [
        ("README", "changed"),
        ("json.py", "added"),
        ("pkg", "added"),
        ("pkg/m.py", "added"),
    ]
    .iter()
    .map(|(p, c)| (p.to_string(), c.to_string()))
    .collect();
    assert_eq!(changes, expected, "{answer}");

    // In text, as a warning; nothing else changed this time.
    let status = up(&host, &ws)?;
    inside(&host, &status, "rm /workspace/json.py")?;
    let out = host.lazaret(&ws, &["down", "p"]);
    assert!(out.status.success(), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("warning:"), "{}", text(&out));
    let listed: Vec<&str> = err.lines().filter(|l| l.starts_with("  ")).collect();
    assert_eq!(listed.len(), 1, "{}", text(&out));
    assert!(
        listed[0].contains("removed") && listed[0].contains("json.py"),
        "{}",
        text(&out)
    );
    // A generation that changed nothing there says nothing.
    up(&host, &ws)?;
    let out = host.lazaret(&ws, &["down", "p"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(out.stderr.is_empty(), "{}", text(&out));
    Ok(())
}

fn killed_router() -> Result {
    let (_serial, host, ws) = repository_host();
    let status = up(&host, &ws)?;
    assert_eq!(
        inside(&host, &status, "cat /workspace/README")?,
        "hello from the host\n"
    );
    let pid = status["workspace_routing"]["router"]["pid"]
        .as_u64()
        .ok_or("status names no router")?;
    // The pid is the router's, not whatever else may have it.
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))?;
    assert_eq!(comm.trim(), "lazaret-router", "pid {pid}");
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()?;
    assert!(killed.success());
    // The workspace fails closed: errors, not the host's files.
    let mut failed = false;
    for _ in 0..40 {
        let out = host.exec(&status, "cat /workspace/README && ls /workspace");
        if !out.status.success() && !String::from_utf8_lossy(&out.stdout).contains("hello") {
            failed = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    assert!(
        failed,
        "the workspace still answered after its router was killed"
    );
    let now = host.status(&ws, "p").ok_or("status shows no Domain")?;
    assert_eq!(now["state"], "degraded", "{now}");
    assert_eq!(
        now["workspace_routing"]["router"]["running"], false,
        "{now}"
    );
    down(&host, &ws)?;
    let status = up(&host, &ws)?;
    assert_eq!(
        inside(&host, &status, "cat /workspace/README")?,
        "hello from the host\n"
    );
    down(&host, &ws)?;
    assert_nothing_left(&host);
    Ok(())
}

/// The sandbox hides a `.gitignore` from the next generation by making its
/// directory unreadable to the coordinator: the next `up` refuses rather
/// than run without those rules.
fn unreadable_directory() -> Result {
    let (_serial, host, ws) = repository_host();
    sh(
        &host,
        &ws,
        "mkdir config && echo secret.env > config/.gitignore && \
         echo SECRET=locked > config/secret.env && git add config/.gitignore && \
         git -c user.name=h -c user.email=h@example.invalid commit -q -m config",
    );
    let status = up(&host, &ws)?;
    let seen = text(&host.exec(&status, "cat /workspace/config/secret.env"));
    assert!(!seen.contains("SECRET=locked"), "{seen}");
    inside(&host, &status, "chmod 000 /workspace/config")?;
    down(&host, &ws)?;
    let out = host.lazaret(&ws, &["up", "p"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("config") && err.contains("make it readable"),
        "{err}"
    );
    assert!(host.status(&ws, "p").is_none(), "nothing runs");
    std::fs::set_permissions(
        ws.join("config"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )?;
    Ok(())
}

/// The sandbox un-ignores host secrets for the next generation: it drops
/// `node_modules/` and `*.log` from the tracked `.gitignore` and adds its
/// own `.env` to the index (`git add -f`), both of which reach the host.
/// The next `up` keeps the host's `.env`, `node_modules/` and `build.log`
/// hidden, names them, and shares them only once the developer agrees: on
/// a terminal by answering `y`, or with `--accept-ignore-changes`.
fn unignored_stays_hidden() -> Result {
    let (_serial, host, ws) = repository_host();
    sh(
        &host,
        &ws,
        "echo 'host log' > build.log && echo secrets/ >> .gitignore && \
         mkdir secrets && echo KEY=host > secrets/key",
    );
    let status = up(&host, &ws)?;
    inside(
        &host,
        &status,
        "cd /workspace && echo 'SECRET=sandbox' > .env && git add -f .env && \
         printf '.env\\n__pycache__/\\nsecrets/\\n' > .gitignore",
    )?;
    // Both changes are the host's now.
    assert!(sh(&host, &ws, "git ls-files").lines().any(|l| l == ".env"));
    assert!(!std::fs::read_to_string(ws.join(".gitignore"))?.contains("node_modules"));
    down(&host, &ws)?;

    // Without a terminal: kept hidden, and said so.
    let out = host.lazaret(&ws, &["up", "p"]);
    assert!(out.status.success(), "{}", text(&out));
    let status = host.status(&ws, "p").ok_or("status shows no Domain")?;
    let seen = text(&host.exec(
        &status,
        "cat /workspace/.env /workspace/build.log; ls /workspace/node_modules",
    ));
    assert!(!seen.contains("SECRET=host-only-value"), "{seen}");
    assert!(!seen.contains("host-only"), "{seen}");
    assert!(!seen.contains("host log"), "{seen}");
    assert!(seen.contains("SECRET=sandbox"), "{seen}");
    let said = String::from_utf8_lossy(&out.stderr);
    for named in [
        ".env",
        "node_modules",
        "build.log",
        "--accept-ignore-changes",
    ] {
        assert!(said.contains(named), "`{named}` not named: {said}");
    }
    let kept = kept_isolated(&status);
    assert_eq!(kept, [".env", "build.log", "node_modules"], "{status}");
    let listed = host.lazaret(&ws, &["status", "p"]);
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.contains("kept hidden") && listed.contains("node_modules"),
        "{listed}"
    );
    down(&host, &ws)?;

    // `--json`: the event says what was kept, and the outcome's status too.
    let out = host.lazaret(&ws, &["up", "p", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let events: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(serde_json::from_str)
        .collect::<std::result::Result<_, _>>()?;
    let changes = events
        .iter()
        .find(|e| e["event"] == "ignore_changes")
        .ok_or_else(|| format!("no ignore_changes event: {events:?}"))?;
    assert_eq!(changes["outcome"], "kept", "{changes}");
    assert_eq!(changes["count"], 3, "{changes}");
    let last = events.last().ok_or("no events")?;
    assert_eq!(last["event"], "ready", "{last}");
    assert_eq!(kept_isolated(&last["status"]), kept, "{last}");
    down(&host, &ws)?;

    // On a terminal, `up` asks; anything but `y` keeps them hidden.
    let dir = host.user_dir("tmux");
    let tmux = crate::attach::Tmux {
        host: &host,
        dir,
        cwd: ws.clone(),
    };
    let lazaret = lazaret_tests::bin("lazaret");
    tmux.start(
        160,
        60,
        &format!(
            "{0} up p; echo UP=$?; {0} down p; echo DOWN=$?; {0} up p; echo UP2=$?; sleep 60",
            lazaret.display()
        ),
    )?;
    let screen = tmux
        .poll(Duration::from_secs(60), |s| s.contains("[y/N]"))?
        .map_err(|s| format!("not asked: {s}"))?;
    assert!(screen.contains("node_modules"), "{screen}");
    tmux.type_line("n")?;
    let asked_again = |s: &str| {
        s.split("DOWN=")
            .nth(1)
            .is_some_and(|after| after.contains("[y/N]"))
    };
    let screen = tmux
        .poll(Duration::from_secs(60), asked_again)?
        .map_err(|s| format!("not asked again: {s}"))?;
    assert!(
        screen.contains("UP=0") && screen.contains("DOWN=0"),
        "{screen}"
    );
    tmux.type_line("y")?;
    let screen = tmux
        .poll(Duration::from_secs(60), |s| s.contains("UP2="))?
        .map_err(|s| format!("no outcome: {s}"))?;
    assert!(screen.contains("UP2=0"), "{screen}");
    drop(tmux);
    let status = host.status(&ws, "p").ok_or("status shows no Domain")?;
    assert_eq!(
        inside(&host, &status, "cat /workspace/.env /workspace/build.log")?,
        "SECRET=host-only-value\nhost log\n"
    );
    assert!(inside(&host, &status, "ls /workspace/node_modules")?.contains("host-only"));
    assert!(kept_isolated(&status).is_empty(), "{status}");

    // The sandbox un-ignores another host directory; `--accept-ignore-
    // changes` shares it at once, and what was accepted before is not
    // named again.
    inside(
        &host,
        &status,
        "printf '.env\\n__pycache__/\\n' > /workspace/.gitignore",
    )?;
    down(&host, &ws)?;
    let out = host.lazaret(&ws, &["up", "p", "--accept-ignore-changes"]);
    assert!(out.status.success(), "{}", text(&out));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("secrets"), "{said}");
    assert!(!said.contains("node_modules"), "{said}");
    let status = host.status(&ws, "p").ok_or("status shows no Domain")?;
    assert_eq!(
        inside(&host, &status, "cat /workspace/secrets/key")?,
        "KEY=host\n"
    );
    assert!(kept_isolated(&status).is_empty(), "{status}");
    down(&host, &ws)?;
    assert_nothing_left(&host);
    Ok(())
}

/// The workspace paths a status keeps hidden against its rules.
fn kept_isolated(status: &Value) -> Vec<String> {
    status["workspace_routing"]["kept_isolated"]
        .as_array()
        .map(|paths| {
            paths
                .iter()
                .filter_map(|p| p.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Files and directories of other groups than the user's own, in a
/// project directory of another group: the owner writes them whatever
/// their group, read-only ones too (as the sandbox's root writes those of
/// the user's own group); a group-writable file of another owner is
/// written through the user's membership of its group, as on the host,
/// and one the user cannot write on the host stays unwritable; what is made in a setgid
/// directory takes its group (a directory its setgid bit too), as on the
/// host, and a `chmod` or `chown` inside does not take them off.
fn other_groups() -> Result {
    let (_serial, host) = shaped_git_host(Shape::OtherGroup);
    let ws = host.workspace.clone();
    let share = Shape::OtherGroup.group().ok_or("no test group")?;
    let user = host.uid();
    // Made as root: files of the user's in a group it is in and in one it
    // is not in (root's), files of root's the user's group may or may not
    // write, and a setgid directory of the test group.
    let file = |name: &str, owner: u32, group: u32, mode: u32| -> Result {
        let path = ws.join(name);
        std::fs::write(&path, "host\n")?;
        std::os::unix::fs::chown(&path, Some(owner), Some(group))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
        Ok(())
    };
    file("mine-shared-group", user, share, 0o644)?;
    file("mine-read-only", user, share, 0o444)?;
    file("mine-foreign-group", user, 0, 0o644)?;
    file("group-writable", 0, share, 0o664)?;
    file("not-mine", 0, share, 0o644)?;
    let setgid = ws.join("setgid");
    std::fs::create_dir(&setgid)?;
    std::os::unix::fs::chown(&setgid, Some(user), Some(share))?;
    std::fs::set_permissions(&setgid, std::fs::Permissions::from_mode(0o2755))?;

    let status = up(&host, &ws)?;
    // The sandbox sees them as its own group's, not as `nogroup`.
    assert_eq!(
        inside(&host, &status, "stat -c %u:%g /workspace /workspace/setgid")?,
        "0:0\n0:0\n"
    );
    inside(
        &host,
        &status,
        "cd /workspace && echo inside >> mine-shared-group && \
         echo inside >> mine-foreign-group && echo inside >> group-writable && \
         echo inside >> mine-read-only && echo a > setgid/read-only && \
         chmod 444 setgid/read-only && echo b >> setgid/read-only && \
         echo made > setgid/file && mkdir setgid/dir && mkdir -m 755 setgid/moded && \
         echo deeper > setgid/dir/file && chown 0:0 setgid/file setgid/dir && \
         chmod 755 setgid",
    )?;
    refused_inside(&host, &status, "echo inside >> /workspace/not-mine");
    down(&host, &ws)?;

    for name in [
        "mine-shared-group",
        "mine-foreign-group",
        "group-writable",
        "mine-read-only",
    ] {
        assert_eq!(
            std::fs::read_to_string(ws.join(name))?,
            "host\ninside\n",
            "{name}"
        );
    }
    assert_eq!(std::fs::read_to_string(ws.join("not-mine"))?, "host\n");
    let owner = |name: &str| -> std::io::Result<(u32, u32, u32)> {
        let meta = std::fs::symlink_metadata(ws.join(name))?;
        Ok((meta.uid(), meta.gid(), meta.mode() & 0o7777))
    };
    // Writing keeps each file's owner and group.
    assert_eq!(owner("mine-shared-group")?, (user, share, 0o644));
    assert_eq!(owner("mine-foreign-group")?, (user, 0, 0o644));
    assert_eq!(owner("group-writable")?, (0, share, 0o664));
    // The sandbox's root writes the user's read-only files, whatever
    // their group, as it writes those of the user's own group; their mode
    // stays.
    assert_eq!(owner("mine-read-only")?, (user, share, 0o444));
    assert_eq!(
        std::fs::read_to_string(ws.join("setgid/read-only"))?,
        "a\nb\n"
    );
    assert_eq!(owner("setgid/read-only")?, (user, share, 0o444));
    // What is made in the setgid directory has its group; directories
    // its setgid bit; the directory keeps its own.
    assert_eq!(owner("setgid")?, (user, share, 0o2755));
    assert_eq!(owner("setgid/file")?, (user, share, 0o644));
    assert_eq!(owner("setgid/dir")?, (user, share, 0o2755));
    assert_eq!(owner("setgid/moded")?, (user, share, 0o2755));
    assert_eq!(owner("setgid/dir/file")?, (user, share, 0o644));
    Ok(())
}

/// A 2,041-level tree in the workspace (each path fits in what the kernel
/// resolves relative to the workspace, not whole) stops `up` with the
/// whole reason and the whole path of its first directory below the
/// walk's bound; ignored, it is not walked and `up` goes on.
fn too_deep() -> Result {
    use rustix::fs::{Mode, OFlags};
    let (_serial, host, ws) = repository_host();
    let deep = ws.join("deep");
    std::fs::create_dir(&deep)?;
    let mut dir = rustix::fs::open(&deep, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())?;
    for _ in 0..2041 {
        rustix::fs::mkdirat(&dir, "a", Mode::from_raw_mode(0o755))?;
        dir = rustix::fs::openat(&dir, "a", OFlags::PATH | OFlags::DIRECTORY, Mode::empty())?;
    }
    let chowned = std::process::Command::new("chown")
        .arg("-R")
        .arg(format!("{}:{}", host.uid(), host.gid()))
        .arg(&deep)
        .status()?;
    assert!(chowned.success());

    let out = host.lazaret(&ws, &["up", "p"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    let first = format!("{}{}", deep.display(), "/a".repeat(1024));
    assert!(
        err.contains("more than 1024 levels deep")
            && err.contains("set isolate_gitignored = false"),
        "{err}"
    );
    // Whole, up to the note `up` adds after it.
    assert!(
        err.contains(&format!(
            "the first one is {first}; nothing of the generation"
        )),
        "{err}"
    );
    assert!(!err.contains("more characters"), "{err}");
    assert!(host.status(&ws, "p").is_none(), "nothing runs");

    sh(&host, &ws, "echo /deep/ >> .gitignore");
    up(&host, &ws)?;
    down(&host, &ws)?;
    Ok(())
}
