//! Running `runsc` rootless inside the Domain namespaces.
//!
//! Owns the command lines: `--rootless --ignore-cgroups --network=host`
//! (the sandbox's sockets live in the Domain network namespace runsc is
//! started in), the gVisor platform ([`Platform`]) and a per-generation
//! `--root` state directory. `runsc create` is refused in rootless mode, so
//! the sandbox starts with `run -detach`, with a dentry cache sized to the
//! descriptor limit ([`dentry_cache`]). Trusts the runsc executable the
//! Host Coordinator named, and what it prints of its own flags.

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

/// The gVisor platform, how the sandbox's processes run on the host.
///
/// Systrap (runsc 2023 and later) when runsc offers it: each process
/// inside costs the host about two tasks, a stub process and at most a
/// few threads, held in a pool that stops growing once as many processes
/// run as ever ran at once (eight waves of 502 processes left 1,152 host
/// tasks, the same after the second wave as after the eighth). Ptrace is
/// what older runsc has (KVM hangs in a nested VM): its stub processes
/// gain a thread for every sentry thread that ever ran one of their
/// processes and never give it back, so the host tasks grow with every
/// wave of processes (5,125, then 7,569, and the third wave of 510 ended
/// the sandbox when the sentry could not start a thread), whatever the
/// sandbox's process bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Platform {
    /// `--platform=systrap`.
    Systrap,
    /// `--platform=ptrace`.
    Ptrace,
}

impl Platform {
    /// The platform `runsc` should run on: systrap when its flags
    /// (`runsc flags`, which prints them on standard error) name it, else
    /// ptrace.
    pub fn of(runsc: &Path) -> Self {
        let flags = Command::new(runsc)
            .arg("flags")
            .env_clear()
            .stdin(Stdio::null())
            .output();
        match flags {
            Ok(out) if Self::offered(&String::from_utf8_lossy(&out.stderr)) => Self::Systrap,
            _ => Self::Ptrace,
        }
    }

    /// Whether `runsc flags` printed a `-platform` flag that offers systrap.
    fn offered(flags: &str) -> bool {
        let mut lines = flags.lines();
        while let Some(line) = lines.next() {
            if line.trim_start().starts_with("-platform ") {
                return lines.next().is_some_and(|help| help.contains("systrap"));
            }
        }
        false
    }

    /// Its name, as `--platform` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Systrap => "systrap",
            Self::Ptrace => "ptrace",
        }
    }
}

/// One container's runsc invocations.
#[derive(Debug)]
pub struct Runsc<'a> {
    /// The runsc executable.
    pub runsc: &'a Path,
    /// The platform the sandbox runs on.
    pub platform: Platform,
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
            .args(["--rootless", "--ignore-cgroups", "--network=host"])
            .arg(format!("--platform={}", self.platform.name()))
            .arg("--root")
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
    fn systrap_is_taken_only_where_runsc_offers_it() {
        let newer = "  -platform string\n    \tspecifies which platform to use: systrap \
                     (default), ptrace, kvm. (default \"systrap\")\n  -platform_device_path \
                     string\n";
        let older = "  -platform string\n    \tspecifies which platform to use: ptrace \
                     (default), kvm. (default \"ptrace\")\n  -platform_device_path string\n    \
                     \tpath to a platform-specific device file (systrap has none)\n";
        assert!(Platform::offered(newer));
        assert!(!Platform::offered(older));
        assert!(!Platform::offered(""));
    }

    #[test]
    fn the_dentry_cache_is_a_third_of_the_descriptor_limit_within_bounds() {
        assert_eq!(dentry_cache(Some(20_000)), 6_666);
        assert_eq!(dentry_cache(Some(1_024)), MIN_DENTRIES);
        assert_eq!(dentry_cache(Some(524_288)), MAX_DENTRIES);
        assert_eq!(dentry_cache(None), MAX_DENTRIES);
    }
}
