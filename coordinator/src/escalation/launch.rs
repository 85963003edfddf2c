//! Starting an approved host command, and ending it.
//!
//! Owns the executable checks made before every launch (seed §3.2) and the
//! launch itself. A rule's executable is reopened through the confined plan
//! made at `up` and must still be the object `up` opened (same device and
//! inode) and pass the checks: a regular file with one hard link, owned by
//! root or the user, not writable by group or others, executable by the
//! user. An executable the developer approved by its path is resolved to
//! its canonical path, must lie outside everything the sandbox can write
//! and every Lazaret tree, and passes the same checks. The command is then
//! `/proc/self/fd/N` of that open descriptor, inherited by the command
//! alone (so a script's interpreter reads the same object), through a
//! launch process ([`super::subreaper`]) that ends everything the command
//! starts when it ends, is cancelled, or its session or Domain ends, and
//! when the coordinator dies: no shell, no `PATH`, no descriptor or
//! environment of the requester's choosing. It runs in the host workspace
//! with [`HOST_ENVIRONMENT`].
//! Trusts the configuration's plans; nothing from the sandbox but argv.

use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use rustix::fs::FileType;
use rustix::io::Errno;
use rustix::process::{Signal, WaitId, WaitIdOptions};

use super::subreaper::{self, NotStarted};

use crate::aio::{Exit, Stream};
use crate::config::confined::{canonicalize, overlaps, proc_self_fd};
use crate::config::{
    ConfinedPathPlan, ObjectIdentity, Opened, ResolvedDomainConfiguration, check_executable,
};

/// The `PATH` of host commands.
pub const HOST_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// What a host command sees of the coordinator's environment, besides
/// [`HOST_PATH`], `LANG=C.UTF-8` and the proxies
/// ([`crate::programs::PROXY_ENVIRONMENT`]): where the user's files and
/// settings are, and temporary space. Never the sandbox's environment.
pub const HOST_ENVIRONMENT: &[&str] = &[
    "HOME",
    "XDG_RUNTIME_DIR",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "TMPDIR",
];

/// A rule's executable as `up` found it.
#[derive(Debug)]
struct RuleExecutable {
    plan: ConfinedPathPlan,
    identity: ObjectIdentity,
}

/// What launches need, taken from the configuration at `up`.
#[derive(Debug)]
pub struct Launcher {
    rules: Vec<RuleExecutable>,
    /// Canonical trees an executable may not lie in, with what each is.
    forbidden: Vec<(PathBuf, String)>,
    /// The host workspace, the commands' working directory.
    workspace: OwnedFd,
    environment: Vec<(String, String)>,
    uid: u32,
}

/// An executable opened for one launch.
#[derive(Debug)]
pub struct Checked {
    opened: Opened,
    /// Its canonical path.
    pub canonical: PathBuf,
}

impl Launcher {
    /// Takes the rules' plans and the trees to keep out of from `resolved`.
    pub fn new(resolved: &ResolvedDomainConfiguration) -> std::io::Result<Self> {
        let auth = resolved.authorities();
        let rules = auth
            .executables
            .iter()
            .map(|e| {
                Ok(RuleExecutable {
                    plan: e.plan.try_clone()?,
                    identity: e.opened.identity,
                })
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        let mut forbidden = vec![
            (
                auth.workspace.label().to_path_buf(),
                "the workspace".to_owned(),
            ),
            (
                auth.profile_dir.label().to_path_buf(),
                "the profile directory".to_owned(),
            ),
            (
                auth.storage_root.label().to_path_buf(),
                "Lazaret's storage".to_owned(),
            ),
            (
                auth.runtime_root.label().to_path_buf(),
                "Lazaret's runtime directory".to_owned(),
            ),
        ];
        for (i, volume) in auth.volumes.iter().enumerate() {
            forbidden.push((
                volume.plan.canonical_label().to_path_buf(),
                format!("volume {i}'s source"),
            ));
        }
        let environment = HOST_ENVIRONMENT
            .iter()
            .chain(crate::programs::PROXY_ENVIRONMENT)
            .filter_map(|name| Some(((*name).to_owned(), std::env::var(name).ok()?)))
            .collect();
        Ok(Self {
            rules,
            forbidden,
            workspace: auth.workspace.fd().try_clone_to_owned()?,
            environment,
            uid: rustix::process::getuid().as_raw(),
        })
    }

    /// Rule `index`'s executable, reopened and checked for this launch.
    pub fn rule_executable(&self, index: usize) -> Result<Checked, String> {
        let rule = self
            .rules
            .get(index)
            .ok_or_else(|| format!("auto_approve[{index}] does not exist"))?;
        let opened = rule
            .plan
            .open_as(FileType::RegularFile)
            .map_err(|e| crate::lifecycle::chain(&e))?;
        let label = rule.plan.canonical_label();
        if opened.identity != rule.identity {
            return Err(format!(
                "{} was replaced since `lazaret up` checked it; run `lazaret down` and \
                 `lazaret up` to accept the new file",
                label.display()
            ));
        }
        check_executable(label, &opened, self.uid)?;
        Ok(Checked {
            opened,
            canonical: label.to_path_buf(),
        })
    }

    /// The executable at `path` (absolute, as requested), resolved and
    /// checked for a launch the developer approves.
    pub fn requested_executable(&self, path: &str) -> Result<Checked, String> {
        let canonical = canonicalize(Path::new(path)).map_err(|e| e.to_string())?;
        for (tree, what) in &self.forbidden {
            if overlaps(&canonical, tree) {
                return Err(format!(
                    "{} lies inside {what} ({}), which the sandbox can write or Lazaret owns; \
                     a host command must be an executable outside them",
                    canonical.display(),
                    tree.display()
                ));
            }
        }
        let plan = ConfinedPathPlan::for_canonical(&canonical).map_err(|e| e.to_string())?;
        let opened = plan
            .open_as(FileType::RegularFile)
            .map_err(|e| crate::lifecycle::chain(&e))?;
        check_executable(&canonical, &opened, self.uid)?;
        Ok(Checked { opened, canonical })
    }

    /// Checks `executable` again through the descriptor it was opened by,
    /// just before it runs: what the developer was shown is what runs,
    /// and it must still pass the checks (its mode or owner may have
    /// changed meanwhile).
    pub fn recheck(&self, executable: &Checked) -> Result<(), String> {
        check_executable(&executable.canonical, &executable.opened, self.uid).map_err(String::from)
    }

    /// Starts `argv` (element zero as the program's name) as
    /// `/proc/self/fd/N` of `executable`, through a launch process: this
    /// coordinator's own executable in mode `launch`
    /// ([`super::subreaper`]), which starts the command, ends whatever it
    /// leaves behind, and reports how it ended.
    pub fn spawn(&self, executable: &Checked, argv: &[String]) -> std::io::Result<HostCommand> {
        let exe = executable.opened.fd.as_fd();
        let (report, report_end) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        let arguments = subreaper::Arguments {
            executable: exe.as_raw_fd(),
            report: report_end.as_raw_fd(),
            parent: rustix::process::getpid().as_raw_nonzero().get(),
            argv: argv.iter().map(OsString::from).collect(),
        };
        // The running coordinator's own image, whatever its path holds now.
        let mut command = Command::new("/proc/self/exe");
        std::os::unix::process::CommandExt::arg0(&mut command, "lazaret-coordinator");
        command
            .args(arguments.to_args())
            .env_clear()
            .env("PATH", HOST_PATH)
            .env("LANG", "C.UTF-8")
            .envs(self.environment.iter().map(|(k, v)| (k, v)))
            .current_dir(proc_self_fd(self.workspace.as_fd()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        // The launch process alone inherits the executable's descriptor
        // and the report pipe (and passes on only the first), and is
        // killed if the coordinator dies before it has set its own
        // parent-death signal.
        let mut child = crate::sys::spawn_inheriting(
            &mut command,
            crate::sys::ChildSetup {
                fds: &[exe, report_end.as_fd()],
                user_namespace: None,
                die_with_parent: true,
            },
        )?;
        drop(report_end);
        // The child is ours and not yet waited for: its pid names it until
        // it is reaped, which only this pidfd's holder does.
        let pidfd = crate::process::pidfd_of_child(&child)?;
        let out = |fd: Option<OwnedFd>| {
            fd.ok_or_else(|| std::io::Error::other("no pipe"))
                .and_then(Stream::new)
        };
        let stdout = out(child.stdout.take().map(OwnedFd::from))?;
        let stderr = out(child.stderr.take().map(OwnedFd::from))?;
        let exit = Exit::watch(pidfd.as_fd())?;
        Ok(HostCommand {
            pidfd,
            exit,
            report,
            program: executable.canonical.display().to_string(),
            stdout: Some(stdout),
            stderr: Some(stderr),
            reaped: false,
        })
    }
}

/// A running host command, as its launch process: that process's pidfd,
/// its report pipe, the command's output.
#[derive(Debug)]
pub struct HostCommand {
    pidfd: OwnedFd,
    exit: Exit,
    /// Where the launch process says how the command ended.
    report: OwnedFd,
    /// The executable's canonical path, for messages.
    program: String,
    /// Its standard output, until it ends.
    pub stdout: Option<Stream>,
    /// Its standard error, until it ends.
    pub stderr: Option<Stream>,
    reaped: bool,
}

/// How a host command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// It exited with this status.
    Exited(u8),
    /// This signal ended it.
    Signaled(u8),
}

impl Ended {
    /// How a process a signal ended ended, from the signal its wait
    /// status names; `None` for one that exited.
    pub fn by_signal(signal: Option<i32>) -> Option<Self> {
        signal.map(|signal| Self::Signaled(u8::try_from(signal).unwrap_or(u8::MAX)))
    }
}

/// Why how a host command ended is not known.
#[derive(Debug, thiserror::Error)]
pub enum ReapError {
    /// Waiting for its launch process failed.
    #[error("cannot learn how the command ended")]
    Wait(#[source] Errno),
    /// Its launch process did not start it.
    #[error("cannot start {program}")]
    NotStarted {
        /// The executable's canonical path.
        program: String,
        /// Why not.
        #[source]
        why: NotStarted,
    },
    /// Its launch process exited without saying how it ended.
    #[error("cannot tell how {program} ended: its launch process gave no report")]
    NoReport {
        /// The executable's canonical path.
        program: String,
    },
}

/// How long a launch process has to end everything once told to, before
/// it is told more bluntly (`SIGHUP`, then `SIGKILL`).
pub const END_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

impl HostCommand {
    /// Completes when the launch process has exited (it is not reaped
    /// yet): the command has ended, and everything it started with it.
    pub async fn exited(&self) {
        self.exit.exited().await;
    }

    fn signal(&self, signal: Signal) {
        if !self.reaped {
            let _ = rustix::process::pidfd_send_signal(&self.pidfd, signal);
        }
    }

    /// Cancels the command: `SIGTERM` to it and to everything it started,
    /// and `SIGKILL` 0.5 s later to whatever is left.
    pub fn cancel(&self) {
        self.signal(Signal::TERM);
    }

    /// Ends the command and everything it started now: `SIGHUP` to its
    /// launch process, which kills them all (`SIGKILL`).
    pub fn end(&self) {
        self.signal(Signal::HUP);
    }

    /// Kills the launch process itself: only for one that does not exit
    /// when told to (what it had not ended yet may then run on).
    pub fn kill(&self) {
        self.signal(Signal::KILL);
    }

    /// Reaps the exited launch process: how the command ended, or why it
    /// could not be started.
    pub fn reap(&mut self) -> Result<Ended, ReapError> {
        // Without `WNOHANG`, `waitid` reports the child or fails.
        let status =
            rustix::process::waitid(WaitId::PidFd(self.pidfd.as_fd()), WaitIdOptions::EXITED)
                .and_then(|status| status.ok_or(Errno::CHILD))
                .map_err(ReapError::Wait)?;
        self.reaped = true;
        let mut bytes = [0u8; subreaper::MAX_REPORT];
        let mut len = 0;
        while len < bytes.len() {
            match rustix::io::read(&self.report, &mut bytes[len..]) {
                Ok(0) => break,
                Ok(n) => len += n,
                Err(Errno::INTR) => {}
                Err(_) => break,
            }
        }
        match subreaper::decode_report(&bytes[..len]) {
            Some(Ok(ended)) => Ok(ended),
            Some(Err(why)) => Err(ReapError::NotStarted {
                program: self.program.clone(),
                why,
            }),
            // Killed before it could say: as it ended. One that exited
            // without a report failed, whatever its status.
            None => {
                Ended::by_signal(status.terminating_signal()).ok_or_else(|| ReapError::NoReport {
                    program: self.program.clone(),
                })
            }
        }
    }
}

impl Drop for HostCommand {
    fn drop(&mut self) {
        // A command whose session or Domain ended never runs on. Its
        // launch process is reaped off the event loop: ending everything
        // below it may take a moment (a process in uninterruptible
        // sleep), which no task waits for.
        if !self.reaped {
            self.end();
            if let Ok(pidfd) = self.pidfd.try_clone() {
                let reaper = std::thread::Builder::new()
                    .name("lazaret-reap".into())
                    .spawn(move || {
                        let waited = crate::process::wait_exit(pidfd.as_fd(), 5 * END_WAIT);
                        if !waited.unwrap_or(false) {
                            let _ = rustix::process::pidfd_send_signal(&pidfd, Signal::KILL);
                        }
                        let _ = rustix::process::waitid(
                            WaitId::PidFd(pidfd.as_fd()),
                            WaitIdOptions::EXITED,
                        );
                    });
                if reaper.is_err() {
                    tracing::warn!("cannot start a thread to reap an ended host command");
                }
            }
        }
    }
}
