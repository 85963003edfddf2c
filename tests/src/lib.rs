//! Shared helpers for Lazaret's end-to-end tests: locating the built role
//! binaries beside the test executable, the network probe this crate builds,
//! and scratch hosts (home, runtime directory, workspace) and test networks
//! that each test owns and removes.
//!
//! Trusts only what it creates: every test runs the binaries with a cleared
//! environment that names its own scratch directories.

pub mod domain;
pub mod net;

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The directory holding the workspace's built binaries (`target/debug`):
/// the parent of the `deps` directory this test executable lives in.
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable has a path");
    let deps = exe
        .parent()
        .expect("the test executable is in target/*/deps");
    deps.parent().expect("deps has a parent").to_path_buf()
}

/// The path of a built binary; panics with the build command when missing.
pub fn bin(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.is_file(),
        "{} is not built; run `cargo build --workspace --bins` before the end-to-end tests",
        path.display()
    );
    path
}

/// The static `lazaret-netprobe` executable that `build.rs` compiled from
/// `tests/netprobe/main.rs`: runs on the host, in a test network namespace
/// and inside a sandbox of any image.
pub fn netprobe() -> PathBuf {
    Path::new(env!("OUT_DIR")).join("lazaret-netprobe")
}

/// A scratch host for one test: `$HOME`, `$XDG_RUNTIME_DIR` and a project.
#[derive(Debug)]
pub struct Scratch {
    dir: tempfile::TempDir,
    /// `$HOME`.
    pub home: PathBuf,
    /// `$XDG_RUNTIME_DIR`, mode 0700.
    pub runtime: PathBuf,
    /// The project directory.
    pub workspace: PathBuf,
}

impl Scratch {
    /// Creates the scratch tree under the system temporary directory.
    pub fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("lazaret-e2e-")
            .tempdir()
            .expect("create a scratch directory");
        let base = std::fs::canonicalize(dir.path()).expect("canonical scratch directory");
        let home = base.join("home");
        let runtime = base.join("run");
        let workspace = base.join("project");
        for d in [&home, &runtime, &workspace] {
            std::fs::create_dir_all(d).expect("create scratch directories");
        }
        std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o700))
            .expect("chmod runtime dir");
        Self {
            dir,
            home,
            runtime,
            workspace,
        }
    }

    /// The scratch tree's root.
    pub fn base(&self) -> &Path {
        self.dir.path()
    }

    /// The default configuration path of this scratch home.
    pub fn config_path(&self) -> PathBuf {
        self.home.join(".config/lazaret/config.toml")
    }

    /// `lazaret ARGS...` in the workspace with a cleared environment.
    pub fn lazaret<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut command = Command::new(bin("lazaret"));
        command
            .args(args)
            .current_dir(&self.workspace)
            .env_clear()
            .env("HOME", &self.home)
            .env("XDG_RUNTIME_DIR", &self.runtime)
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
        command
    }
}

impl Default for Scratch {
    fn default() -> Self {
        Self::new()
    }
}

/// Runs a command and returns its output.
pub fn run(mut command: impl std::borrow::BorrowMut<Command>) -> Output {
    command.borrow_mut().output().expect("start the command")
}

/// The exit code, stdout and stderr of an output, as text.
pub fn text(output: &Output) -> (Option<i32>, String, String) {
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Appends everything `from` yields to `into`, on a thread of its own.
pub fn collect(
    mut from: impl std::io::Read + Send + 'static,
    into: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = from.read(&mut buf) {
            if n == 0 {
                break;
            }
            into.lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend_from_slice(&buf[..n]);
        }
    })
}
