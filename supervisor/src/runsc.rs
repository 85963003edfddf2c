//! Running `runsc` rootless inside the Domain namespaces.
//!
//! Owns the command lines: `--rootless --ignore-cgroups --network=host`
//! (the sandbox's sockets live in the Domain network namespace runsc is
//! started in) and a per-generation `--root` state directory. `runsc create`
//! is refused in rootless mode, so the sandbox starts with `run -detach`.
//! Trusts the runsc executable the Host Coordinator named.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::process::{Command, Stdio};

use rustix::fs::{Mode, OFlags};

/// An unlinked temporary file in `dir` (`O_TMPFILE`).
fn tempfile_in(dir: &Path) -> std::io::Result<File> {
    let fd = rustix::fs::open(
        dir,
        OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC,
        Mode::RUSR | Mode::WUSR,
    )?;
    Ok(File::from(fd))
}

/// Why a runsc command failed.
#[derive(Debug, thiserror::Error)]
pub enum RunscError {
    /// runsc could not be started.
    #[error("cannot start {runsc}")]
    Spawn {
        /// The executable.
        runsc: String,
        /// What the kernel said.
        #[source]
        source: std::io::Error,
    },
    /// The file that collects runsc's messages could not be made.
    #[error("cannot make a file for runsc's messages in {root}")]
    Log {
        /// The runsc state directory.
        root: String,
        /// What the kernel said.
        #[source]
        source: std::io::Error,
    },
    /// runsc exited with a failure.
    #[error("`runsc {operation}` failed: {stderr}")]
    Failed {
        /// The subcommand.
        operation: String,
        /// What runsc printed.
        stderr: String,
    },
}

/// One container's runsc invocations.
#[derive(Debug)]
pub struct Runsc<'a> {
    /// The runsc executable.
    pub runsc: &'a Path,
    /// The `--root` state directory.
    pub root: &'a Path,
    /// The container ID.
    pub container_id: &'a str,
}

impl Runsc<'_> {
    /// `runsc` with the rootless flags, this state directory and `args`,
    /// with a clean environment and no standard input or output.
    pub fn command<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let mut command = Command::new(self.runsc);
        command
            .args(["--rootless", "--ignore-cgroups", "--network=host", "--root"])
            .arg(self.root)
            .args(args)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        command
    }

    fn run(&self, args: &[&str]) -> Result<(), RunscError> {
        let spawn = |source| RunscError::Spawn {
            runsc: self.runsc.display().to_string(),
            source,
        };
        // runsc's sandbox and gofer outlive `run -detach` and inherit its
        // standard error, so a pipe would never reach end of file: its
        // messages go to an unlinked temporary file instead.
        let log = |source| RunscError::Log {
            root: self.root.display().to_string(),
            source,
        };
        let mut stderr = tempfile_in(self.root).map_err(log)?;
        let status = self
            .command(args)
            .stderr(stderr.try_clone().map_err(log)?)
            .status()
            .map_err(spawn)?;
        if status.success() {
            return Ok(());
        }
        let mut text = String::new();
        let _ = stderr.seek(SeekFrom::Start(0));
        let _ = stderr.read_to_string(&mut text);
        Err(RunscError::Failed {
            operation: args.first().copied().unwrap_or_default().to_owned(),
            stderr: text.trim().to_owned(),
        })
    }

    /// `runsc run -detach --bundle BUNDLE ID`: starts the sandbox and returns
    /// once its init runs.
    pub fn run_detached(&self, bundle: &Path) -> Result<(), RunscError> {
        let bundle = bundle.display().to_string();
        self.run(&["run", "-detach", "--bundle", &bundle, self.container_id])
    }
}
