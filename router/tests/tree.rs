//! The merged workspace's rules, driven through the router's tree layer on
//! plain scratch directories (no FUSE, no privileges): what is visible,
//! where new paths go, what is protected, which modes reach the host, and
//! that nothing the sandbox plants leads the router out of its two trees.

use std::os::fd::OwnedFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use lazaret_proto::router::{IgnoreFile, IgnoreScope, NamePrefix, RelativePath, WorkspaceRules};
use lazaret_router::tree::{SetAttr, Tree};
use lazaret_routing::classify::Classifier;
use rustix::fs::{Mode, OFlags, RenameFlags};
use rustix::io::Errno;

struct Scratch {
    _dir: tempfile::TempDir,
    host: PathBuf,
    isolated: PathBuf,
    outside: PathBuf,
}

const IGNORE: &str = ".env\nnode_modules/\n*.log\n__pycache__/\n/moved/**/*.tmp\n/config/master.key\n/app/secret.txt\n";

fn rules(isolate: bool) -> WorkspaceRules {
    WorkspaceRules {
        isolate_ignored: isolate,
        global_excludes: Vec::new(),
        scopes: if isolate {
            vec![IgnoreScope {
                root: RelativePath::default(),
                prefix: RelativePath::default(),
                exclude: Vec::new(),
                ignore_files: vec![IgnoreFile {
                    dir: RelativePath::default(),
                    content: IGNORE.as_bytes().to_vec(),
                }],
                tracked_ignored: vec![RelativePath(b"kept.log".to_vec())],
                tracked_ignored_dirs: Vec::new(),
            }]
        } else {
            Vec::new()
        },
        read_only: vec![
            RelativePath(b".husky".to_vec()),
            RelativePath(b"tools/hooks".to_vec()),
            RelativePath(b"pre_commit".to_vec()),
        ],
        read_only_prefixes: vec![
            NamePrefix {
                dir: RelativePath::default(),
                prefix: b"pre_commit.".to_vec(),
            },
            NamePrefix {
                dir: RelativePath(b".config".to_vec()),
                prefix: b"lefthook".to_vec(),
            },
        ],
        git_dirs: vec![RelativePath(b".bare".to_vec())],
        kept_isolated: Vec::new(),
    }
}

impl Scratch {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().to_path_buf();
        let host = base.join("host");
        let isolated = base.join("isolated");
        let outside = base.join("outside");
        for d in [&host, &isolated, &outside] {
            std::fs::create_dir(d).unwrap();
        }
        std::fs::write(host.join(".gitignore"), IGNORE).unwrap();
        std::fs::write(host.join(".env"), "SECRET=host\n").unwrap();
        std::fs::create_dir_all(host.join("node_modules/host-only")).unwrap();
        std::fs::write(host.join("kept.log"), "tracked\n").unwrap();
        std::fs::write(host.join("src.txt"), "tracked source\n").unwrap();
        std::fs::create_dir_all(host.join(".git/hooks")).unwrap();
        std::fs::create_dir_all(host.join(".git/objects")).unwrap();
        std::fs::create_dir_all(host.join(".git/refs/heads")).unwrap();
        std::fs::create_dir_all(host.join(".git/modules/sub/hooks")).unwrap();
        std::fs::write(host.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
        std::fs::write(host.join(".git/config"), "[core]\n").unwrap();
        std::fs::write(host.join(".git/modules/sub/config"), "[core]\n").unwrap();
        std::fs::write(host.join(".git/index"), "index").unwrap();
        std::fs::create_dir_all(host.join(".bare/hooks")).unwrap();
        std::fs::create_dir_all(host.join(".bare/info")).unwrap();
        std::fs::write(host.join(".bare/HEAD"), "ref: refs/heads/main\n").unwrap();
        std::fs::write(host.join(".bare/config"), "[core]\n").unwrap();
        std::fs::write(outside.join("target"), "outside").unwrap();
        Scratch {
            _dir: dir,
            host,
            isolated,
            outside,
        }
    }

    fn tree(&self, isolate: bool) -> Tree {
        self.tree_with(rules(isolate))
    }

    fn tree_with(&self, rules: WorkspaceRules) -> Tree {
        let open = |p: &Path| -> OwnedFd {
            rustix::fs::open(
                p,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .unwrap()
        };
        Tree::new(
            open(&self.host),
            open(&self.isolated),
            Classifier::new(&rules),
        )
        .unwrap()
    }
}

/// The inode of a path, looked up component by component.
fn ino(tree: &Tree, path: &str) -> Result<u64, Errno> {
    let mut ino = tree.root();
    for name in path.split('/').filter(|c| !c.is_empty()) {
        ino = tree.lookup(ino, name.as_bytes())?.0;
    }
    Ok(ino)
}

fn parent_and_name(tree: &Tree, path: &str) -> (u64, String) {
    let (parent, name) = path.rsplit_once('/').unwrap_or(("", path));
    (ino(tree, parent).unwrap(), name.to_owned())
}

fn create(tree: &Tree, path: &str, content: &[u8]) -> Result<u64, Errno> {
    let (parent, name) = parent_and_name(tree, path);
    let (ino, _, handle) = tree.create(parent, name.as_bytes(), 0o644, 0o022, libc_wronly())?;
    tree.write(handle, 0, content)?;
    tree.release(handle);
    Ok(ino)
}

fn libc_wronly() -> i32 {
    OFlags::WRONLY.bits() as i32
}

fn read(tree: &Tree, path: &str) -> Result<Vec<u8>, Errno> {
    let handle = tree
        .open(ino(tree, path)?, OFlags::RDONLY.bits() as i32)?
        .handle;
    let mut data = Vec::new();
    let read = tree.read(handle, 0, 1 << 16, &mut data);
    tree.release(handle);
    read.map(|()| data)
}

fn names(tree: &Tree, path: &str) -> Vec<String> {
    let handle = tree.opendir(ino(tree, path).unwrap()).unwrap();
    let mut names: Vec<String> = tree
        .listing(handle)
        .unwrap()
        .entries
        .iter()
        .map(|e| String::from_utf8(e.name.clone()).unwrap())
        .collect();
    tree.releasedir(handle);
    names.sort();
    names
}

#[test]
fn ignored_host_paths_are_invisible_and_new_ones_stay_isolated() {
    let s = Scratch::new();
    let tree = s.tree(true);
    assert_eq!(ino(&tree, ".env"), Err(Errno::NOENT));
    assert_eq!(ino(&tree, "node_modules"), Err(Errno::NOENT));
    assert_eq!(read(&tree, "kept.log").unwrap(), b"tracked\n");
    let listed = names(&tree, "");
    assert!(!listed.contains(&".env".into()) && !listed.contains(&"node_modules".into()));
    assert!(listed.contains(&"kept.log".into()) && listed.contains(&".git".into()));

    create(&tree, ".env", b"SECRET=sandbox\n").unwrap();
    assert_eq!(read(&tree, ".env").unwrap(), b"SECRET=sandbox\n");
    assert_eq!(
        std::fs::read(s.host.join(".env")).unwrap(),
        b"SECRET=host\n"
    );
    assert_eq!(
        std::fs::read(s.isolated.join(".env")).unwrap(),
        b"SECRET=sandbox\n"
    );

    let (root, _) = parent_and_name(&tree, "x");
    tree.mkdir(root, b"a", 0o755, 0).unwrap();
    tree.mkdir(ino(&tree, "a").unwrap(), b"b", 0o755, 0)
        .unwrap();
    create(&tree, "a/b/c.log", b"log").unwrap();
    create(&tree, "a/b/c.txt", b"txt").unwrap();
    assert!(s.host.join("a/b/c.txt").exists());
    assert!(!s.host.join("a/b/c.log").exists());
    assert!(s.isolated.join("a/b/c.log").exists());
    assert_eq!(names(&tree, "a/b"), ["c.log", "c.txt"]);

    tree.mkdir(root, b"pkg", 0o755, 0).unwrap();
    tree.mkdir(ino(&tree, "pkg").unwrap(), b"__pycache__", 0o755, 0)
        .unwrap();
    create(&tree, "pkg/__pycache__/m.pyc", b"pyc").unwrap();
    assert!(!s.host.join("pkg/__pycache__").exists());
    // A directory whose visible isolated entries remain is not empty.
    assert_eq!(tree.remove(root, b"pkg", true), Err(Errno::NOTEMPTY));

    // The same tree served again (the next generation) still has them.
    let again = s.tree(true);
    assert_eq!(read(&again, "a/b/c.log").unwrap(), b"log");
    assert_eq!(read(&again, "pkg/__pycache__/m.pyc").unwrap(), b"pyc");
}

#[test]
fn paths_kept_from_the_last_generation_stay_isolated_whatever_the_rules_say() {
    let s = Scratch::new();
    // The rules no longer ignore `.env` or `node_modules/`, and the index
    // tracks `.env`; the last generation isolated both.
    std::fs::create_dir_all(s.isolated.join("node_modules")).unwrap();
    std::fs::write(s.isolated.join(".env"), "SECRET=sandbox\n").unwrap();
    std::fs::write(s.host.join("node_modules/host-only/index.js"), "x").unwrap();
    let mut changed = rules(true);
    changed.scopes[0].ignore_files[0].content = b"*.log\n".to_vec();
    changed.scopes[0]
        .tracked_ignored
        .push(RelativePath(b".env".to_vec()));
    changed.kept_isolated = vec![
        RelativePath(b".env".to_vec()),
        RelativePath(b"node_modules".to_vec()),
    ];
    let tree = s.tree_with(changed.clone());
    assert_eq!(read(&tree, ".env").unwrap(), b"SECRET=sandbox\n");
    assert_eq!(
        ino(&tree, "node_modules/host-only/index.js"),
        Err(Errno::NOENT)
    );
    assert!(names(&tree, "node_modules").is_empty());
    // What the sandbox writes there stays isolated too.
    create(&tree, "node_modules/new.js", b"js").unwrap();
    assert!(!s.host.join("node_modules/new.js").exists());
    assert!(s.isolated.join("node_modules/new.js").exists());
    // A host file the same rules share shows.
    assert_eq!(read(&tree, "src.txt").unwrap(), b"tracked source\n");

    // Accepted: the same rules without them share the host's.
    changed.kept_isolated.clear();
    let accepted = s.tree_with(changed);
    assert_eq!(read(&accepted, ".env").unwrap(), b"SECRET=host\n");
    assert_eq!(
        read(&accepted, "node_modules/host-only/index.js").unwrap(),
        b"x"
    );
}

#[test]
fn a_renamed_directory_routes_its_new_entries_by_its_new_place() {
    let s = Scratch::new();
    let tree = s.tree(true);
    let (root, _) = parent_and_name(&tree, "x");
    let (a, _) = tree.mkdir(root, b"a", 0o755, 0).unwrap();
    let (b, _) = tree.mkdir(a, b"b", 0o755, 0).unwrap();
    create(&tree, "a/b/x.log", b"isolated").unwrap();
    tree.rename(root, b"a", root, b"moved", RenameFlags::empty())
        .unwrap();
    // The kernel keeps using the numbers it holds.
    let (_, _, handle) = tree.create(a, b"y.tmp", 0o644, 0, libc_wronly()).unwrap();
    tree.release(handle);
    assert!(!s.host.join("moved/y.tmp").exists());
    assert!(s.isolated.join("moved/y.tmp").exists());
    let (_, _, handle) = tree.create(b, b"z.tmp", 0o644, 0, libc_wronly()).unwrap();
    tree.release(handle);
    assert!(s.isolated.join("moved/b/z.tmp").exists());
    // The isolated entries moved with their directory.
    assert_eq!(read(&tree, "moved/b/x.log").unwrap(), b"isolated");
}

#[test]
fn a_rename_that_would_show_or_plant_an_ignored_file_is_refused() {
    let s = Scratch::new();
    std::fs::create_dir_all(s.host.join("config")).unwrap();
    std::fs::write(s.host.join("config/master.key"), "SECRET").unwrap();
    std::fs::write(s.host.join("config/app.yml"), "app").unwrap();
    let tree = s.tree(true);
    let (root, _) = parent_and_name(&tree, "x");
    // `config/master.key` is hidden; under another name it would show.
    assert_eq!(ino(&tree, "config/master.key"), Err(Errno::NOENT));
    assert_eq!(
        tree.rename(root, b"config", root, b"cfg", RenameFlags::empty()),
        Err(Errno::XDEV)
    );
    assert!(s.host.join("config/master.key").exists() && !s.host.join("cfg").exists());
    // A file made where it is not ignored cannot be moved to where it is.
    let (x, _) = tree.mkdir(root, b"x", 0o755, 0).unwrap();
    let (_, _, handle) = tree
        .create(x, b"secret.txt", 0o644, 0, libc_wronly())
        .unwrap();
    tree.release(handle);
    assert!(s.host.join("x/secret.txt").exists());
    assert_eq!(
        tree.rename(root, b"x", root, b"app", RenameFlags::empty()),
        Err(Errno::XDEV)
    );
    assert!(!s.host.join("app").exists());
    // An exchange is refused outright.
    assert_eq!(
        tree.rename(root, b"x", root, b"config", RenameFlags::EXCHANGE),
        Err(Errno::INVAL)
    );
}

#[test]
fn a_directory_holding_a_git_directory_of_the_host_cannot_move() {
    let s = Scratch::new();
    // A submodule (a `.git` file) and a nested repository (a `.git`
    // directory), each deep in an ordinary directory.
    std::fs::create_dir_all(s.host.join("vendor/lib")).unwrap();
    std::fs::write(
        s.host.join("vendor/lib/.git"),
        "gitdir: ../../.git/modules/lib\n",
    )
    .unwrap();
    std::fs::write(s.host.join("vendor/lib/lib.c"), "lib").unwrap();
    std::fs::create_dir_all(s.host.join("nested/repo/.git")).unwrap();
    for isolate in [true, false] {
        let tree = s.tree(isolate);
        let (root, _) = parent_and_name(&tree, "x");
        let vendor = ino(&tree, "vendor").unwrap();
        let (deep, _) = tree.mkdir(root, b"deep", 0o755, 0).unwrap();
        for (parent, name) in [(vendor, "lib"), (root, "vendor"), (root, "nested")] {
            assert_eq!(
                tree.rename(
                    parent,
                    name.as_bytes(),
                    deep,
                    name.as_bytes(),
                    RenameFlags::empty()
                ),
                Err(Errno::ROFS),
                "{name}"
            );
        }
        assert!(s.host.join("vendor/lib/lib.c").exists());
        assert!(s.host.join("nested/repo/.git").is_dir());
        // A directory holding only what the sandbox made inside moves.
        let (x, _) = tree.mkdir(deep, b"x", 0o755, 0).unwrap();
        tree.mkdir(x, b".git", 0o755, 0).unwrap();
        tree.rename(root, b"deep", root, b"deeper", RenameFlags::empty())
            .unwrap();
        std::fs::remove_dir_all(s.host.join("deeper")).unwrap();
        let _ = std::fs::remove_dir_all(s.isolated.join("deeper"));
    }
}

#[test]
fn git_configuration_and_hooks_are_read_only_and_the_rest_is_writable() {
    let s = Scratch::new();
    let tree = s.tree(true);
    let config = ino(&tree, ".git/config").unwrap();
    assert_eq!(tree.open(config, libc_wronly()), Err(Errno::ROFS));
    assert_eq!(read(&tree, ".git/config").unwrap(), b"[core]\n");
    assert_eq!(
        tree.setattr(
            config,
            SetAttr {
                size: Some(0),
                ..SetAttr::default()
            },
            None
        )
        .err(),
        Some(Errno::ROFS)
    );
    assert_eq!(
        create(&tree, ".git/hooks/pre-commit", b"#!/bin/sh\n"),
        Err(Errno::ROFS)
    );
    assert_eq!(
        create(&tree, ".git/modules/sub/hooks/post-checkout", b"x"),
        Err(Errno::ROFS)
    );
    assert_eq!(
        create(&tree, ".git/config.worktree", b"x"),
        Err(Errno::ROFS)
    );
    // A lock file left beside the configuration would stop the host's
    // `git config`; the index's is git's to take inside.
    let git = ino(&tree, ".git").unwrap();
    assert_eq!(create(&tree, ".git/config.lock", b""), Err(Errno::ROFS));
    assert_eq!(
        tree.mkdir(git, b"config.lock", 0o755, 0).err(),
        Some(Errno::ROFS)
    );
    create(&tree, ".git/index.lock", b"").unwrap();
    tree.remove(git, b"index.lock", false).unwrap();
    assert_eq!(
        tree.rename(git, b"config", git, b"config.old", RenameFlags::empty()),
        Err(Errno::ROFS)
    );
    let (root, _) = parent_and_name(&tree, "x");
    assert_eq!(
        tree.rename(root, b".git", root, b"old", RenameFlags::empty()),
        Err(Errno::ROFS)
    );
    assert_eq!(tree.remove(git, b"config", false), Err(Errno::ROFS));
    assert_eq!(
        tree.link(config, root, b"config-link").err(),
        Some(Errno::ROFS)
    );
    // A planted file cannot be renamed over the configuration.
    create(&tree, "planted", b"[core]\n\tfsmonitor = touch /tmp/x\n").unwrap();
    assert_eq!(
        tree.rename(root, b"planted", git, b"config", RenameFlags::empty()),
        Err(Errno::ROFS)
    );
    // Nor a planted directory moved into git metadata.
    tree.mkdir(root, b"evil", 0o755, 0).unwrap();
    let modules = ino(&tree, ".git/modules").unwrap();
    assert_eq!(
        tree.rename(root, b"evil", modules, b"evil", RenameFlags::empty()),
        Err(Errno::ROFS)
    );
    // What git writes in normal work stays writable.
    create(&tree, ".git/index.lock", b"new index").unwrap();
    tree.rename(git, b"index.lock", git, b"index", RenameFlags::empty())
        .unwrap();
    assert_eq!(
        std::fs::read(s.host.join(".git/index")).unwrap(),
        b"new index"
    );
    create(&tree, ".git/HEAD.lock", b"ref: refs/heads/x\n").unwrap();
    tree.rename(git, b"HEAD.lock", git, b"HEAD", RenameFlags::empty())
        .unwrap();
    create(&tree, ".git/refs/heads/main", b"0123\n").unwrap();
    tree.mkdir(ino(&tree, ".git/objects").unwrap(), b"ab", 0o755, 0)
        .unwrap();
    create(&tree, ".git/objects/ab/cdef", b"blob").unwrap();
    assert!(s.host.join(".git/objects/ab/cdef").exists());
}

#[test]
fn what_the_host_configuration_runs_is_read_only() {
    let s = Scratch::new();
    std::fs::create_dir_all(s.host.join(".husky")).unwrap();
    std::fs::write(s.host.join(".husky/pre-commit"), "#!/bin/sh\nnpm test\n").unwrap();
    let tree = s.tree(true);
    let hook = ino(&tree, ".husky/pre-commit").unwrap();
    assert_eq!(tree.open(hook, libc_wronly()), Err(Errno::ROFS));
    assert_eq!(
        create(&tree, ".husky/post-checkout", b"x"),
        Err(Errno::ROFS)
    );
    let (root, _) = parent_and_name(&tree, "x");
    assert_eq!(
        tree.rename(root, b".husky", root, b"old", RenameFlags::empty()),
        Err(Errno::ROFS)
    );
    // A hooks directory the host configures but does not have cannot be
    // made, and nothing can be moved into place above it.
    let (tools, _) = tree.mkdir(root, b"tools", 0o755, 0).unwrap();
    assert_eq!(
        tree.mkdir(tools, b"hooks", 0o755, 0).err(),
        Some(Errno::ROFS)
    );
    let (evil, _) = tree.mkdir(root, b"evil", 0o755, 0).unwrap();
    tree.mkdir(evil, b"hooks", 0o755, 0).unwrap();
    tree.remove(root, b"tools", true).unwrap();
    assert_eq!(
        tree.rename(root, b"evil", root, b"tools", RenameFlags::empty()),
        Err(Errno::ROFS)
    );
    // Nor can a link to it stand where the directory belongs.
    assert_eq!(
        tree.symlink(root, b"tools", b"evil").err(),
        Some(Errno::ROFS)
    );
    assert!(!s.host.join("tools").exists());
}

#[test]
fn git_metadata_holds_no_links_and_no_todo_list_of_the_sandbox() {
    let s = Scratch::new();
    std::fs::create_dir_all(s.host.join(".git/logs")).unwrap();
    std::fs::write(s.host.join(".git/logs/HEAD"), "").unwrap();
    let tree = s.tree(true);
    let logs = ino(&tree, ".git/logs").unwrap();
    let git = ino(&tree, ".git").unwrap();
    let modules = ino(&tree, ".git/modules").unwrap();
    tree.remove(logs, b"HEAD", false).unwrap();
    // A reflog that is a link would have host git append outside.
    assert_eq!(
        tree.symlink(logs, b"HEAD", b"../../../.bashrc").err(),
        Some(Errno::PERM)
    );
    // A module git directory that is a link would be taken for the real one.
    assert_eq!(
        tree.symlink(modules, b"other", b"../cache/m").err(),
        Some(Errno::PERM)
    );
    assert_eq!(
        tree.mknod(git, b"fifo", 0o010_644, 0).err(),
        Some(Errno::PERM)
    );
    let (root, _) = parent_and_name(&tree, "x");
    tree.symlink(root, b"link", b"target").unwrap();
    assert_eq!(
        tree.rename(root, b"link", logs, b"HEAD", RenameFlags::empty()),
        Err(Errno::PERM)
    );
    // A git directory the sandbox builds inside git metadata has read-only
    // configuration and hooks, like any other.
    tree.mkdir(git, b"cache", 0o755, 0).unwrap();
    let (m, _) = tree
        .mkdir(ino(&tree, ".git/cache").unwrap(), b"m", 0o755, 0)
        .unwrap();
    create(&tree, ".git/cache/m/HEAD", b"ref: refs/heads/main\n").unwrap();
    assert_eq!(
        create(&tree, ".git/cache/m/config", b"[core]\n"),
        Err(Errno::ROFS)
    );
    assert_eq!(tree.mkdir(m, b"hooks", 0o755, 0).err(), Some(Errno::ROFS));
    // A rebase started inside keeps its todo list inside.
    let (rebase, _) = tree.mkdir(git, b"rebase-merge", 0o755, 0).unwrap();
    let (_, _, handle) = tree
        .create(rebase, b"git-rebase-todo", 0o644, 0, libc_wronly())
        .unwrap();
    tree.release(handle);
    assert!(!s.host.join(".git/rebase-merge").exists());
    assert!(
        s.isolated
            .join(".git/rebase-merge/git-rebase-todo")
            .exists()
    );
    // Attributes could switch on drivers the user's configuration defines.
    tree.mkdir(git, b"info", 0o755, 0).unwrap();
    assert_eq!(
        create(&tree, ".git/info/attributes", b"* diff=x\n"),
        Err(Errno::ROFS)
    );
}

#[test]
fn a_directory_in_place_of_a_tracked_file_is_not_tracked() {
    let s = Scratch::new();
    let tree = s.tree(true);
    let (root, _) = parent_and_name(&tree, "x");
    tree.remove(root, b"kept.log", false).unwrap();
    let (dir, _) = tree.mkdir(root, b"kept.log", 0o755, 0).unwrap();
    let (_, _, handle) = tree.create(dir, b"a", 0o644, 0, libc_wronly()).unwrap();
    tree.release(handle);
    assert!(!s.host.join("kept.log").exists());
    assert!(s.isolated.join("kept.log/a").exists());
}

#[test]
fn new_git_metadata_never_reaches_the_host() {
    let s = Scratch::new();
    // Isolation of ignored paths off: git metadata is routed all the same.
    let tree = s.tree(false);
    let (root, _) = parent_and_name(&tree, "x");
    tree.mkdir(root, b"src", 0o755, 0).unwrap();
    let src = ino(&tree, "src").unwrap();
    tree.mkdir(src, b".git", 0o755, 0).unwrap();
    create(
        &tree,
        "src/.git/config",
        b"[core]\n\tfsmonitor = touch /tmp/planted\n",
    )
    .unwrap();
    create(&tree, "src/.git/HEAD", b"ref: refs/heads/main\n").unwrap();
    assert!(!s.host.join("src/.git").exists());
    assert!(s.isolated.join("src/.git/config").exists());
    assert_eq!(
        read(&tree, "src/.git/HEAD").unwrap(),
        b"ref: refs/heads/main\n"
    );

    // A bare repository layout: HEAD stays isolated, so the host's
    // discovery never finds one; objects/ and refs/ may land on the host.
    tree.mkdir(root, b"bare", 0o755, 0).unwrap();
    let bare = ino(&tree, "bare").unwrap();
    create(&tree, "bare/HEAD", b"ref: refs/heads/main\n").unwrap();
    tree.mkdir(bare, b"objects", 0o755, 0).unwrap();
    tree.mkdir(bare, b"refs", 0o755, 0).unwrap();
    create(
        &tree,
        "bare/config",
        b"[core]\n\tpager = touch /tmp/planted\n",
    )
    .unwrap();
    assert!(!s.host.join("bare/HEAD").exists());

    // A `.git` file pointing at a directory the sandbox made.
    tree.mkdir(root, b"wt", 0o755, 0).unwrap();
    create(&tree, "wt/.git", b"gitdir: ../bare\n").unwrap();
    assert!(!s.host.join("wt/.git").exists());

    // Moving a host file to a `.git` name moves it to the isolated side.
    create(&tree, "gitfile", b"gitdir: ../bare\n").unwrap();
    let wt = ino(&tree, "wt").unwrap();
    tree.remove(wt, b".git", false).unwrap();
    tree.rename(root, b"gitfile", wt, b".git", RenameFlags::empty())
        .unwrap();
    assert!(!s.host.join("wt/.git").exists() && !s.host.join("gitfile").exists());
    assert_eq!(read(&tree, "wt/.git").unwrap(), b"gitdir: ../bare\n");
    // A directory cannot be moved to a `.git` name on the host.
    tree.mkdir(root, b"d", 0o755, 0).unwrap();
    assert_eq!(
        tree.rename(root, b"d", wt, b"HEAD", RenameFlags::empty()),
        Err(Errno::XDEV)
    );
}

#[test]
fn a_host_directory_holding_head_protects_its_configuration() {
    let s = Scratch::new();
    std::fs::create_dir_all(s.host.join("fixtures/repo.git/hooks")).unwrap();
    std::fs::write(
        s.host.join("fixtures/repo.git/HEAD"),
        "ref: refs/heads/main\n",
    )
    .unwrap();
    std::fs::write(s.host.join("fixtures/repo.git/config"), "[core]\n").unwrap();
    let tree = s.tree(true);
    let config = ino(&tree, "fixtures/repo.git/config").unwrap();
    assert_eq!(tree.open(config, libc_wronly()), Err(Errno::ROFS));
    assert_eq!(
        create(&tree, "fixtures/repo.git/hooks/post-update", b"x"),
        Err(Errno::ROFS)
    );
    // Removing HEAD lifts nothing the host would use: a new HEAD can
    // never reach the host again.
    let repo = ino(&tree, "fixtures/repo.git").unwrap();
    tree.remove(repo, b"HEAD", false).unwrap();
    create(&tree, "fixtures/repo.git/HEAD", b"ref: refs/heads/main\n").unwrap();
    assert!(!s.host.join("fixtures/repo.git/HEAD").exists());
}

#[test]
fn modes_never_carry_setuid_setgid_or_group_and_other_write() {
    let s = Scratch::new();
    let tree = s.tree(true);
    let (root, _) = parent_and_name(&tree, "x");
    let (x, _, handle) = tree.create(root, b"x", 0o6777, 0, libc_wronly()).unwrap();
    tree.release(handle);
    let mode = |p: &str| std::fs::metadata(s.host.join(p)).unwrap().mode() & 0o7777;
    assert_eq!(mode("x"), 0o755);
    tree.setattr(
        x,
        SetAttr {
            mode: Some(0o6755),
            ..SetAttr::default()
        },
        None,
    )
    .unwrap();
    assert_eq!(mode("x"), 0o755);
    let (dir, _) = tree.mkdir(root, b"src", 0o1777, 0).unwrap();
    assert_eq!(mode("src"), 0o755);
    tree.setattr(
        dir,
        SetAttr {
            mode: Some(0o777),
            ..SetAttr::default()
        },
        None,
    )
    .unwrap();
    assert_eq!(mode("src"), 0o755);
    tree.mknod(root, b"fifo", 0o010_777, 0).unwrap();
    assert_eq!(mode("fifo"), 0o755);
    assert_eq!(
        tree.mknod(root, b"dev", 0o020_666, 0).err(),
        Some(Errno::PERM)
    );
}

#[test]
fn a_directory_keeps_the_setgid_bit_it_has_and_never_gains_one() {
    let s = Scratch::new();
    let tree = s.tree(true);
    let mode = |p: &str| std::fs::metadata(s.host.join(p)).unwrap().mode() & 0o7777;
    let chmod = |ino: u64, mode: u32| {
        tree.setattr(
            ino,
            SetAttr {
                mode: Some(mode),
                ..SetAttr::default()
            },
            None,
        )
        .unwrap();
    };
    // A shared tree on the host: new entries take its group.
    std::fs::create_dir(s.host.join("shared")).unwrap();
    std::fs::set_permissions(
        s.host.join("shared"),
        std::fs::Permissions::from_mode(0o2755),
    )
    .unwrap();
    let shared = ino(&tree, "shared").unwrap();
    chmod(shared, 0o755);
    assert_eq!(mode("shared"), 0o2755);
    // What is made in it: a directory setgid (the kernel's doing) and
    // staying so; a file never.
    let (made, _) = tree.mkdir(shared, b"made", 0o755, 0).unwrap();
    assert_eq!(mode("shared/made"), 0o2755);
    chmod(made, 0o700);
    assert_eq!(mode("shared/made"), 0o2700);
    let (file, _, handle) = tree
        .create(shared, b"file", 0o2755, 0, libc_wronly())
        .unwrap();
    tree.release(handle);
    chmod(file, 0o2755);
    assert_eq!(mode("shared/file"), 0o755);
    // A directory without the bit does not gain it.
    let (root, _) = parent_and_name(&tree, "plain");
    let (plain, _) = tree.mkdir(root, b"plain", 0o2755, 0).unwrap();
    assert_eq!(mode("plain"), 0o755);
    chmod(plain, 0o2755);
    assert_eq!(mode("plain"), 0o755);
}

#[test]
fn planted_links_do_not_lead_out_of_the_trees() {
    let s = Scratch::new();
    let tree = s.tree(true);
    let (root, _) = parent_and_name(&tree, "x");
    // A link is only a link: reading it gives its target, and operations
    // on names beneath it fail rather than follow it.
    tree.symlink(root, b"out", s.outside.as_os_str().as_encoded_bytes())
        .unwrap();
    assert_eq!(
        tree.readlink(ino(&tree, "out").unwrap()).unwrap(),
        s.outside.as_os_str().as_encoded_bytes()
    );
    assert!(tree.lookup(ino(&tree, "out").unwrap(), b"target").is_err());
    tree.symlink(
        root,
        b"outfile",
        s.outside.join("target").as_os_str().as_encoded_bytes(),
    )
    .unwrap();
    let link = ino(&tree, "outfile").unwrap();
    assert!(tree.open(link, OFlags::RDONLY.bits() as i32).is_err());
    assert!(
        tree.setattr(
            link,
            SetAttr {
                mode: Some(0o777),
                ..SetAttr::default()
            },
            None
        )
        .is_err()
    );
    assert_eq!(
        std::fs::metadata(s.outside.join("target"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o644
    );
    // A directory known to the kernel that is replaced by a link on the
    // host side is not followed either.
    tree.mkdir(root, b"dir", 0o755, 0).unwrap();
    let dir = ino(&tree, "dir").unwrap();
    std::fs::remove_dir(s.host.join("dir")).unwrap();
    std::os::unix::fs::symlink(&s.outside, s.host.join("dir")).unwrap();
    assert!(tree.lookup(dir, b"target").is_err());
    assert!(tree.create(dir, b"new", 0o644, 0, libc_wronly()).is_err());
    assert!(!s.outside.join("new").exists());
}

#[test]
fn a_removed_file_still_open_is_changed_through_its_handle_only() {
    let s = Scratch::new();
    let tree = s.tree(true);
    let (root, _) = parent_and_name(&tree, "x");
    let (ino, _, handle) = tree.create(root, b"temp", 0o644, 0, libc_wronly()).unwrap();
    tree.write(handle, 0, b"some data").unwrap();
    tree.remove(root, b"temp", false).unwrap();
    // Another file now takes the name; the old number does not reach it.
    create(&tree, "temp", b"other").unwrap();
    let set = SetAttr {
        size: Some(4),
        ..SetAttr::default()
    };
    assert_eq!(tree.setattr(ino, set, Some(handle)).unwrap().st_size, 4);
    assert_eq!(tree.getattr(ino, Some(handle)).unwrap().st_size, 4);
    assert_eq!(tree.getattr(ino, None).err(), Some(Errno::STALE));
    assert_eq!(std::fs::read(s.host.join("temp")).unwrap(), b"other");
    tree.release(handle);
}

#[test]
fn a_listing_read_again_from_its_start_shows_what_is_there_now() {
    let s = Scratch::new();
    let tree = s.tree(true);
    let root = tree.root();
    let handle = tree.opendir(root).unwrap();
    create(&tree, "late.txt", b"x").unwrap();
    create(&tree, "late.log", b"x").unwrap();
    let names = |tree: &Tree| -> Vec<Vec<u8>> {
        tree.listing(handle)
            .unwrap()
            .entries
            .iter()
            .map(|e| e.name.clone())
            .collect()
    };
    // The first read from the start uses what `opendir` listed.
    tree.rewind(handle, root).unwrap();
    assert!(!names(&tree).contains(&b"late.txt".to_vec()));
    tree.rewind(handle, root).unwrap();
    let now = names(&tree);
    assert!(now.contains(&b"late.txt".to_vec()) && now.contains(&b"late.log".to_vec()));
    tree.releasedir(handle);
}

#[test]
fn readdirplus_describes_each_name_as_it_is_now() {
    let s = Scratch::new();
    let tree = s.tree(true);
    let root = tree.root();
    create(&tree, "swap", b"file").unwrap();
    let handle = tree.opendir(root).unwrap();
    // After the listing, the file becomes a directory.
    tree.remove(root, b"swap", false).unwrap();
    tree.mkdir(root, b"swap", 0o755, 0o022).unwrap();
    let mut seen = None;
    tree.readdirplus(handle, root, 0, |ino, _, name, stat| {
        if name == b"swap" {
            seen = Some((ino, stat.st_mode));
        }
        false
    })
    .unwrap();
    let (listed, mode) = seen.expect("swap listed");
    assert_eq!(
        rustix::fs::FileType::from_raw_mode(mode),
        rustix::fs::FileType::Directory
    );
    assert_eq!(listed, ino(&tree, "swap").unwrap());
    tree.releasedir(handle);
}

#[test]
fn every_form_of_a_name_a_hook_runs_is_read_only() {
    let s = Scratch::new();
    let tree = s.tree(true);
    let root = tree.root();
    // `python -m pre_commit` would find any of these first.
    assert_eq!(create(&tree, "pre_commit.py", b"evil"), Err(Errno::ROFS));
    assert_eq!(
        create(&tree, "pre_commit.cpython-312-x86_64-linux-gnu.so", b"evil"),
        Err(Errno::ROFS)
    );
    assert_eq!(
        tree.mkdir(root, b"pre_commit", 0o755, 0).err(),
        Some(Errno::ROFS)
    );
    create(&tree, "pre_commit_notes.txt", b"fine").unwrap();
    // `.config/lefthook.yml`: `.config` cannot be swapped for another.
    tree.mkdir(root, b".config", 0o755, 0).unwrap();
    assert_eq!(
        create(&tree, ".config/lefthook-local.yml", b"x"),
        Err(Errno::ROFS)
    );
    create(&tree, ".config/other.toml", b"fine").unwrap();
    assert!(
        tree.rename(root, b".config", root, b"moved", RenameFlags::empty())
            .is_err()
    );
    assert!(!s.host.join("pre_commit.py").exists());
}

#[test]
fn a_git_directory_named_otherwise_is_protected_as_git() {
    let s = Scratch::new();
    let tree = s.tree(true);
    let root = tree.root();
    let config = ino(&tree, ".bare/config").unwrap();
    assert_eq!(tree.open(config, libc_wronly()), Err(Errno::ROFS));
    assert_eq!(
        create(&tree, ".bare/hooks/pre-commit", b"x"),
        Err(Errno::ROFS)
    );
    assert_eq!(create(&tree, ".bare/info/exclude", b""), Err(Errno::ROFS));
    assert_eq!(
        tree.rename(root, b".bare", root, b"old", RenameFlags::empty()),
        Err(Errno::ROFS)
    );
    // A rebase started inside stays inside.
    let bare = ino(&tree, ".bare").unwrap();
    tree.mkdir(bare, b"rebase-merge", 0o755, 0).unwrap();
    create(&tree, ".bare/rebase-merge/git-rebase-todo", b"exec evil\n").unwrap();
    assert!(!s.host.join(".bare/rebase-merge").exists());
    // What git writes in normal work reaches the host.
    create(&tree, ".bare/index", b"index").unwrap();
    assert!(s.host.join(".bare/index").exists());
}
