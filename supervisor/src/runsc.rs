//! Running `runsc` rootless inside the Domain namespaces.
//!
//! Owns the command lines: `--rootless --ignore-cgroups --network=host`
//! (the sandbox's sockets live in the Domain network namespace runsc is
//! started in) and a per-generation `--root` state directory. `runsc create`
//! is refused in rootless mode, so the sandbox starts with `run -detach`,
//! with a dentry cache sized to the descriptor limit ([`dentry_cache`]).
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
        let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile).maximum;
        let dcache = format!("--dcache={}", dentry_cache(limit));
        let args = [
            &dcache,
            "run",
            "-detach",
            "--bundle",
            &bundle,
            self.container_id,
        ];
        self.run(&args)
    }
}

/// The most dentries gVisor keeps cached for the whole sandbox
/// (`--dcache`), given the hard limit on open descriptors.
///
/// runsc's default is 1,000 per mount. A dentry it has dropped costs a
/// syscall to find again on a bind mount, but on the routed workspace two
/// FUSE round trips (the gofer opens each file it walks: `OPEN`, then
/// `RELEASE`), and a tree larger than the cache misses on every walk, so
/// `find` over 5,000 files sent the router 15,000 requests instead of
/// 2,700. Each cached dentry holds up to two descriptors in the gofer (its
/// own and a data handle), one in the sentry and two in the router (5,000
/// files created: 10,613, 5,043 and 10,007): a third of the limit leaves
/// each a third for files the sandbox holds open. Never below
/// the default's 1,000, and at most 32,768: each costs the sandbox about
/// 2.5 KiB of memory (5,000 files walked raised its RSS from 37 to 51 MB).
fn dentry_cache(hard_limit: Option<u64>) -> u64 {
    hard_limit
        .map_or(MAX_DENTRIES, |limit| limit / 3)
        .clamp(MIN_DENTRIES, MAX_DENTRIES)
}

const MIN_DENTRIES: u64 = 1_000;
const MAX_DENTRIES: u64 = 32_768;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dentry_cache_is_a_third_of_the_descriptor_limit_within_bounds() {
        assert_eq!(dentry_cache(Some(20_000)), 6_666);
        assert_eq!(dentry_cache(Some(1_024)), MIN_DENTRIES);
        assert_eq!(dentry_cache(Some(524_288)), MAX_DENTRIES);
        assert_eq!(dentry_cache(None), MAX_DENTRIES);
    }
}
