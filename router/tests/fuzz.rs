//! Fuzz target of the Workspace Router's tree ([`lazaret_router::tree`]):
//! what it does with FUSE requests once `fuser` has parsed them, driven as
//! random sequences of operations on scratch directories.
//!
//! `fuzz_tree_operations`: each input is a script of operations (lookup,
//! mkdir, create, mknod, symlink, link, open, read, write, release,
//! remove, rename, setattr, getattr, readlink, readdirplus, forget,
//! fallocate, fsync, access) with inode and handle numbers that are known
//! or made up, and names that are ordinary, ignored, protected, or not one
//! component at all (`/`, `..`, NUL, bytes that are not UTF-8, too long);
//! the host side may swap a name for a link out of the tree between two
//! operations. No operation may panic, and afterwards:
//! - nothing outside the two trees changed (the directory beside them and
//!   the file a planted link points at);
//! - nothing in either tree has a setuid, setgid or sticky bit, group or
//!   other write permission, or is a device;
//! - the host's protected files (git configuration, HEAD and hooks, the
//!   read-only `.husky`) and its ignored `.env` are as they were;
//! - no ignored name (`*.log`, `.env`, a `node_modules` directory)
//!   appeared on the host outside its git metadata.
//!
//! Seeds live in `tests/__fuzz__/tree_operations/corpus/` (the input
//! format is `build-support/fuzz_input.rs`'s; the script's is [`step`]'s);
//! rewrite them with
//! `cargo test -p lazaret-router --test fuzz -- --ignored write_seed_corpus`.
//! The default run (`cargo test`) replays the seeds and then tries random
//! scripts for one second; a long run:
//! `BOLERO_RANDOM_TEST_TIME_MS=600000 cargo test --release -p lazaret-router --test fuzz fuzz_ -- --test-threads=1`.
//! A failure prints `BOLERO_RANDOM_SEED=…`, which replays it; with
//! `LAZARET_FUZZ_TRACE=1` as well, each operation is printed as it runs.

#[allow(dead_code)]
#[path = "../../build-support/fuzz_input.rs"]
mod fuzz_input;

use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use fuzz_input::{Fields, Framer, Tally};
use lazaret_proto::router::{IgnoreFile, IgnoreScope, RelativePath, WorkspaceRules};
use lazaret_router::tree::{SetAttr, SetTime, Tree};
use lazaret_routing::classify::Classifier;
use rustix::fs::{Mode, OFlags, RenameFlags};

const TREE_OPERATIONS: &str = "tree_operations";

const IGNORE: &str = ".env\nnode_modules/\n*.log\n";

/// The host's files no operation may change: path and content.
const PROTECTED: &[(&str, &str)] = &[
    (".env", "SECRET=host\n"),
    (".git/config", "[core]\n"),
    (".husky/pre-commit", "#!/bin/sh\n"),
];

/// The host's `HEAD`, which makes `.git` git metadata; the sandbox may
/// rewrite it (`git checkout`), so it is not among [`PROTECTED`].
const HEAD: (&str, &str) = (".git/HEAD", "ref: refs/heads/main\n");

/// Names an operation may use; beyond these, names come from the input.
const NAMES: &[&[u8]] = &[
    b"a",
    b"b.txt",
    b"d",
    b"x.log",
    b".env",
    b"node_modules",
    b".git",
    b"config",
    b"hooks",
    b"HEAD",
    b"pre-commit",
    b".husky",
    b"kept.log",
    b"src.txt",
    b"index.lock",
    b"..",
    b".",
    b"",
    b"a/b",
    b"../outside",
    b"nul\0name",
    b"\xff\xfe\x80",
    b"target",
];

/// Where a symbolic link the sandbox makes may point.
const TARGETS: &[&[u8]] = &[
    b"../outside/target",
    b"../../outside",
    b"/etc/passwd",
    b"a",
    b".git/config",
    b"",
];

/// The two trees and what lies beside them.
struct Scratch {
    dir: tempfile::TempDir,
    host: PathBuf,
    isolated: PathBuf,
    outside: PathBuf,
}

impl Scratch {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path();
        let (host, isolated, outside) = (
            base.join("host"),
            base.join("isolated"),
            base.join("outside"),
        );
        for d in [&host, &isolated, &outside] {
            std::fs::create_dir(d).unwrap();
        }
        for d in [".git/hooks", ".git/objects", ".husky", "node_modules/m"] {
            std::fs::create_dir_all(host.join(d)).unwrap();
        }
        for (path, content) in PROTECTED.iter().chain([&HEAD]) {
            std::fs::write(host.join(path), content).unwrap();
        }
        // The sandbox may edit it: the rules were read when the tree began.
        std::fs::write(host.join(".gitignore"), IGNORE).unwrap();
        std::fs::write(host.join("kept.log"), "tracked\n").unwrap();
        std::fs::write(host.join("src.txt"), "source\n").unwrap();
        std::fs::write(outside.join("target"), "outside").unwrap();
        Scratch {
            dir,
            host,
            isolated,
            outside,
        }
    }

    fn tree(&self) -> Tree {
        let rules = WorkspaceRules {
            isolate_ignored: true,
            global_excludes: Vec::new(),
            scopes: vec![IgnoreScope {
                root: RelativePath::default(),
                prefix: RelativePath::default(),
                exclude: Vec::new(),
                ignore_files: vec![IgnoreFile {
                    dir: RelativePath::default(),
                    content: IGNORE.as_bytes().to_vec(),
                }],
                tracked_ignored: vec![RelativePath(b"kept.log".to_vec())],
                tracked_ignored_dirs: Vec::new(),
            }],
            read_only: vec![RelativePath(b".husky".to_vec())],
            read_only_prefixes: Vec::new(),
            git_dirs: Vec::new(),
            kept_isolated: Vec::new(),
        };
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

    /// The host swaps `name` at the root of one side for a link out of the
    /// tree, as a process on the host may at any time.
    fn plant(&self, on_host: bool, name: &[u8]) {
        let side = if on_host { &self.host } else { &self.isolated };
        let path = side.join(std::ffi::OsStr::from_bytes(name));
        let _ = std::fs::remove_file(&path).or_else(|_| std::fs::remove_dir(&path));
        let _ = std::os::unix::fs::symlink(&self.outside, &path);
    }

    /// The properties every script must leave true.
    fn check(&self) {
        let mut beside: Vec<_> = std::fs::read_dir(self.dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        beside.sort();
        assert_eq!(beside, ["host", "isolated", "outside"], "beside the trees");
        let outside: Vec<_> = std::fs::read_dir(&self.outside)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(outside, ["target"], "in the directory beside the trees");
        let target = self.outside.join("target");
        assert_eq!(std::fs::read(&target).unwrap(), b"outside");
        assert_eq!(std::fs::metadata(&target).unwrap().mode() & 0o7777, 0o644);

        for (path, content) in PROTECTED {
            let path = self.host.join(path);
            let meta = std::fs::symlink_metadata(&path).unwrap();
            assert!(meta.is_file(), "{} is no longer a file", path.display());
            assert_eq!(std::fs::read_to_string(&path).unwrap(), *content);
        }
        let hooks = std::fs::read_dir(self.host.join(".git/hooks")).unwrap();
        assert_eq!(hooks.count(), 0, "a hook planted on the host");
        let husky = std::fs::read_dir(self.host.join(".husky")).unwrap();
        assert_eq!(husky.count(), 1, "a file planted in .husky");

        walk(&self.host, true);
        walk(&self.isolated, false);
    }
}

/// Checks every entry beneath `dir`, links not followed.
fn walk(dir: &Path, host: bool) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let path = entry.path();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        let kind = meta.file_type();
        assert!(
            !kind.is_block_device() && !kind.is_char_device(),
            "a device at {}",
            path.display()
        );
        if !kind.is_symlink() {
            assert_eq!(
                meta.mode() & 0o7022,
                0,
                "mode {:o} of {}",
                meta.mode(),
                path.display()
            );
        }
        if host {
            let name = entry.file_name();
            let name = name.as_bytes();
            let top = dir.file_name().is_some_and(|d| d == "host");
            let known = top && matches!(name, b".env" | b"kept.log" | b"node_modules");
            // `node_modules/` ignores only a directory of that name.
            let ignored = name.ends_with(b".log")
                || name == b".env"
                || (name == b"node_modules" && kind.is_dir());
            assert!(known || !ignored, "ignored {} on the host", path.display());
        }
        if kind.is_dir() {
            // Git metadata is git's: no ignore rule applies in it.
            let git = host && entry.file_name() == ".git";
            walk(&path, host && !git);
        }
    }
}

/// What a script has made known so far.
struct Known {
    inodes: Vec<u64>,
    files: Vec<u64>,
    dirs: Vec<u64>,
}

impl Known {
    /// An inode number: a known one, or (rarely) any.
    fn inode(&self, fields: &mut Fields<'_>) -> u64 {
        pick(&self.inodes, fields)
    }
}

/// One of `known` as the next byte says; past their count, a number from
/// the input.
fn pick(known: &[u64], fields: &mut Fields<'_>) -> u64 {
    let at = usize::from(fields.byte());
    match known.get(at % 64) {
        Some(&n) if at < 250 => n,
        _ if at >= 250 => u64::from(fields.u16()),
        _ => known.last().copied().unwrap_or(1),
    }
}

/// A name: one of [`NAMES`], or bytes from the input.
fn name<'a>(fields: &mut Fields<'a>) -> &'a [u8] {
    let at = usize::from(fields.byte());
    match NAMES.get(at) {
        Some(name) => name,
        None if at == 255 => {
            static LONG: [u8; 256] = [b'n'; 256];
            &LONG[..255 + usize::from(fields.byte() % 2)]
        }
        None => fields.short(),
    }
}

/// Runs one operation the script's next bytes describe: a byte for the
/// operation, then its arguments, each read by [`Fields`].
fn step(tree: &Tree, scratch: &Scratch, known: &mut Known, fields: &mut Fields<'_>) -> bool {
    let op = fields.byte();
    let mode = u32::from(fields.u16()) | (0o100_000 * u32::from(op >= 128));
    let ok = match op % 20 {
        0 => {
            let parent = known.inode(fields);
            tree.lookup(parent, name(fields))
                .map(|(ino, _)| known.inodes.push(ino))
                .is_ok()
        }
        1 => {
            let parent = known.inode(fields);
            tree.mkdir(parent, name(fields), mode, u32::from(fields.byte()))
                .map(|(ino, _)| known.inodes.push(ino))
                .is_ok()
        }
        2 => {
            let parent = known.inode(fields);
            let name = name(fields);
            let flags = i32::from(fields.u16());
            tree.create(parent, name, mode, 0o022, flags)
                .map(|(ino, _, handle)| {
                    known.inodes.push(ino);
                    known.files.push(handle);
                })
                .is_ok()
        }
        3 => {
            let parent = known.inode(fields);
            let name = name(fields);
            let kind = [0o100_000, 0o010_000, 0o140_000, 0o020_000, 0o060_000]
                [usize::from(fields.byte() % 5)];
            let mode = kind | (mode & 0o7777);
            tree.mknod(parent, name, mode, 0).is_ok()
        }
        4 => {
            let parent = known.inode(fields);
            let name = name(fields);
            let target = TARGETS[usize::from(fields.byte()) % TARGETS.len()];
            tree.symlink(parent, name, target).is_ok()
        }
        5 => {
            let ino = known.inode(fields);
            let parent = known.inode(fields);
            tree.link(ino, parent, name(fields)).is_ok()
        }
        6 => {
            let ino = known.inode(fields);
            tree.open(ino, i32::from(fields.u16()))
                .map(|opened| known.files.push(opened.handle))
                .is_ok()
        }
        7 => {
            let handle = pick(&known.files, fields);
            let offset = u64::from(fields.u16());
            let mut buf = Vec::new();
            tree.read(handle, offset, u32::from(fields.u16()), &mut buf)
                .is_ok()
        }
        8 => {
            let handle = pick(&known.files, fields);
            let offset = u64::from(fields.u16());
            tree.write(handle, offset, fields.short()).is_ok()
        }
        9 => {
            tree.release(pick(&known.files, fields));
            true
        }
        10 => {
            let parent = known.inode(fields);
            let name = name(fields);
            tree.remove(parent, name, fields.byte() % 2 == 0).is_ok()
        }
        11 => {
            let parent = known.inode(fields);
            let from = name(fields);
            let new_parent = known.inode(fields);
            let to = name(fields);
            let flags = RenameFlags::from_bits_retain(u32::from(fields.byte() % 8));
            tree.rename(parent, from, new_parent, to, flags).is_ok()
        }
        12 => {
            let ino = known.inode(fields);
            let which = fields.byte();
            let set = SetAttr {
                mode: (which & 1 != 0).then_some(mode),
                size: (which & 2 != 0).then(|| u64::from(fields.u16())),
                atime: (which & 4 != 0).then_some(SetTime::Now),
                mtime: (which & 8 != 0).then_some(SetTime::At(std::time::UNIX_EPOCH)),
                ..SetAttr::default()
            };
            let handle = (which & 16 != 0).then(|| pick(&known.files, fields));
            tree.setattr(ino, set, handle).is_ok()
        }
        13 => {
            let ino = known.inode(fields);
            let handle = (fields.byte() % 2 == 0).then(|| pick(&known.files, fields));
            tree.getattr(ino, handle).is_ok()
        }
        14 => tree.readlink(known.inode(fields)).is_ok(),
        15 => {
            let ino = known.inode(fields);
            let Ok(handle) = tree.opendir(ino) else {
                return false;
            };
            known.dirs.push(handle);
            let from = usize::from(fields.byte() % 8);
            let mut room = usize::from(fields.byte() % 16);
            let listed = tree.readdirplus(handle, ino, from, |ino, _, _, _| {
                known.inodes.push(ino);
                room = room.saturating_sub(1);
                room == 0
            });
            if fields.byte() % 2 == 0 {
                let _ = tree.rewind(handle, ino);
            }
            listed.is_ok()
        }
        16 => {
            let handle = pick(&known.dirs, fields);
            tree.releasedir(handle);
            let ino = known.inode(fields);
            tree.forget(ino, u64::from(fields.byte() % 4));
            true
        }
        17 => {
            let handle = pick(&known.files, fields);
            let offset = u64::from(fields.u16());
            let length = u64::from(fields.u16());
            tree.fallocate(handle, offset, length, i32::from(fields.byte() % 4))
                .is_ok()
        }
        18 => {
            let handle = pick(&known.files, fields);
            let ino = known.inode(fields);
            let synced = tree.fsync(handle, fields.byte() % 2 == 0).is_ok();
            tree.access(ino, fields.byte() % 2 == 0).is_ok() && synced
        }
        _ => {
            let on_host = fields.byte() % 2 == 0;
            scratch.plant(on_host, NAMES[usize::from(fields.byte() % 3)]);
            true
        }
    };
    if known.inodes.len() > 64 {
        known.inodes.drain(1..33);
    }
    ok
}

/// Runs a script on fresh trees; whether any operation succeeded.
fn tree_operations(script: &[u8]) -> bool {
    let scratch = Scratch::new();
    let tree = scratch.tree();
    let mut known = Known {
        inodes: vec![tree.root()],
        files: Vec::new(),
        dirs: Vec::new(),
    };
    let mut fields = Fields::new(script);
    let mut any = false;
    let trace = std::env::var_os("LAZARET_FUZZ_TRACE").is_some();
    for _ in 0..64 {
        if fields.is_empty() {
            break;
        }
        let before = fields.remaining();
        let ok = step(&tree, &scratch, &mut known, &mut fields);
        if trace {
            let used = &before[..before.len() - fields.remaining().len()];
            eprintln!(
                "operation {} {:x?}: {}",
                used[0] % 20,
                used,
                if ok { "done" } else { "refused" }
            );
        }
        any |= ok;
    }
    drop(tree);
    if trace {
        eprintln!("end of script");
    }
    scratch.check();
    any
}

#[test]
fn fuzz_tree_operations() {
    // The modes checked are the tree's alone: the scratch files' own are
    // made under the usual mask, whatever the caller's.
    rustix::process::umask(Mode::from_raw_mode(0o022));
    let seeds = fuzz_input::seeds(env!("CARGO_MANIFEST_DIR"), TREE_OPERATIONS);
    let tally = Tally::new(TREE_OPERATIONS);
    bolero::check!(name = TREE_OPERATIONS)
        .with_max_len(1024)
        .for_each(|data: &[u8]| {
            tally.count(tree_operations(&fuzz_input::input(data, &seeds)));
        });
}

/// The index of `name` in [`NAMES`].
fn named(name: &[u8]) -> u8 {
    let at = NAMES
        .iter()
        .position(|n| *n == name)
        .expect("a listed name");
    u8::try_from(at).unwrap()
}

/// Writes the seed corpus: scripts of ordinary work and of attempts to
/// get out.
#[test]
#[ignore = "writes the checked-in seed corpus"]
fn write_seed_corpus() {
    rustix::process::umask(Mode::from_raw_mode(0o022));
    // Operation bytes: the operation, then the mode (two bytes), then its
    // own arguments. Inode 0 of the known list is the root.
    let op = |f: Framer, op: u8| f.byte(op).u16(0o644);
    let root = 0;
    let last = 63;
    let scripts: Vec<(&str, Vec<u8>)> = vec![
        (
            "mkdir-create-write-read",
            {
                let f = op(Framer::default(), 1)
                    .byte(root)
                    .byte(named(b"d"))
                    .byte(0o022);
                let f = op(f, 2).byte(last).byte(named(b"b.txt")).u16(1);
                let f = op(f, 8).byte(0).u16(0).short(b"hello");
                let f = op(f, 9).byte(0);
                let f = op(f, 6).byte(last).u16(0);
                op(f, 7).byte(1).u16(0).u16(100)
            }
            .done(),
        ),
        (
            "ignored-goes-isolated",
            {
                let f = op(Framer::default(), 2)
                    .byte(root)
                    .byte(named(b"x.log"))
                    .u16(1);
                let f = op(f, 8).byte(0).u16(0).short(b"log line\n");
                op(f, 11)
                    .byte(root)
                    .byte(named(b"x.log"))
                    .byte(root)
                    .byte(named(b"b.txt"))
                    .byte(0)
            }
            .done(),
        ),
        (
            "protected-writes",
            {
                let f = op(Framer::default(), 0).byte(root).byte(named(b".git"));
                let f = op(f, 0).byte(last).byte(named(b"config"));
                let f = op(f, 6).byte(last).u16(1);
                let f = op(f, 12).byte(last).byte(3).u16(0);
                let f = op(f, 2).byte(1).byte(named(b"hooks")).u16(1);
                op(f, 11)
                    .byte(root)
                    .byte(named(b"src.txt"))
                    .byte(1)
                    .byte(named(b"config"))
                    .byte(0)
            }
            .done(),
        ),
        (
            "links-out",
            {
                let f = op(Framer::default(), 4)
                    .byte(root)
                    .byte(named(b"a"))
                    .byte(0);
                let f = op(f, 0).byte(root).byte(named(b"a"));
                let f = op(f, 6).byte(last).u16(2);
                let f = op(f, 12).byte(last).byte(1);
                let f = op(f, 19).byte(0).byte(2);
                let f = op(f, 0).byte(root).byte(named(b"d"));
                op(f, 2).byte(last).byte(named(b"target")).u16(1)
            }
            .done(),
        ),
        (
            "bad-names",
            {
                let f = op(Framer::default(), 1).byte(root).byte(named(b".."));
                let f = op(f, 2).byte(root).byte(named(b"a/b")).u16(1);
                let f = op(f, 2).byte(root).byte(named(b"../outside")).u16(1);
                let f = op(f, 3).byte(root).byte(named(b"nul\0name")).byte(3);
                let f = op(f, 1).byte(root).byte(named(b"\xff\xfe\x80"));
                op(f, 1).byte(root).byte(255).byte(1)
            }
            .done(),
        ),
        (
            "listing-and-rename-dirs",
            {
                let f = op(Framer::default(), 1).byte(root).byte(named(b"d"));
                let f = op(f, 15).byte(root).byte(0).byte(8).byte(0);
                let f = op(f, 11)
                    .byte(root)
                    .byte(named(b"d"))
                    .byte(root)
                    .byte(named(b"node_modules"))
                    .byte(0);
                let f = op(f, 10).byte(root).byte(named(b"d")).byte(0);
                op(f, 16).byte(0).byte(1).byte(1)
            }
            .done(),
        ),
    ];
    for (file, script) in scripts {
        assert!(tree_operations(&script), "{file} does something");
        fuzz_input::write_seed(env!("CARGO_MANIFEST_DIR"), TREE_OPERATIONS, file, &script);
    }
}
