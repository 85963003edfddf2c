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

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use rustix::fs::FileType;
use rustix::io::Errno;
use rustix::process::{Signal, WaitId, WaitIdOptions};

use super::report::{self, Ended, NotStarted};
use super::spawner;

use crate::aio::{Exit, Stream};
use crate::config::{
    ConfinedError, ConfinedPathPlan, ObjectIdentity, Opened, ResolvedDomainConfiguration,
    check_executable,
};
use lazaret_hostfs::plan::{canonicalize, overlaps};

/// The `PATH` of host commands.
pub const HOST_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// What a host command sees of the coordinator's environment, besides
/// [`HOST_PATH`], `LANG=C.UTF-8` and the proxies
/// ([`lazaret_hostfs::programs::PROXY_ENVIRONMENT`]): where the user's files and
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
    forbidden: Vec<(PathBuf, Tree)>,
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
            (auth.workspace.label().to_path_buf(), Tree::Workspace),
            (auth.profile_dir.label().to_path_buf(), Tree::ProfileDir),
            (auth.storage_root.label().to_path_buf(), Tree::Storage),
            (auth.runtime_root.label().to_path_buf(), Tree::Runtime),
        ];
        for (i, volume) in auth.volumes.iter().enumerate() {
            forbidden.push((volume.plan.canonical_label().to_path_buf(), Tree::Volume(i)));
        }
        let environment = HOST_ENVIRONMENT
            .iter()
            .chain(lazaret_hostfs::programs::PROXY_ENVIRONMENT)
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
    pub fn rule_executable(&self, index: usize) -> Result<Checked, ExecutableError> {
        let rule = self
            .rules
            .get(index)
            .ok_or(ExecutableError::NoRule { index })?;
        let opened = rule.plan.open_as(FileType::RegularFile)?;
        let label = rule.plan.canonical_label();
        if opened.identity != rule.identity {
            return Err(ExecutableError::Replaced {
                path: label.to_path_buf(),
            });
        }
        checked(label, &opened, self.uid)?;
        Ok(Checked {
            opened,
            canonical: label.to_path_buf(),
        })
    }

    /// The executable at `path` (absolute, as requested), resolved and
    /// checked for a launch the developer approves.
    pub fn requested_executable(&self, path: &str) -> Result<Checked, ExecutableError> {
        let canonical = canonicalize(Path::new(path)).map_err(ExecutableError::Resolve)?;
        if let Some((tree, what)) = forbidden_tree(&canonical, &self.forbidden) {
            return Err(ExecutableError::Forbidden {
                path: canonical,
                tree: tree.to_path_buf(),
                what,
            });
        }
        let plan = ConfinedPathPlan::for_canonical(&canonical).map_err(ExecutableError::Resolve)?;
        let opened = plan.open_as(FileType::RegularFile)?;
        checked(&canonical, &opened, self.uid)?;
        Ok(Checked { opened, canonical })
    }

    /// Checks `executable` again through the descriptor it was opened by,
    /// just before it runs: what the developer was shown is what runs,
    /// and it must still pass the checks (its mode or owner may have
    /// changed meanwhile).
    pub fn recheck(&self, executable: &Checked) -> Result<(), ExecutableError> {
        checked(&executable.canonical, &executable.opened, self.uid)
    }

    /// Starts `argv` (element zero as the program's name) as
    /// `/proc/self/fd/N` of `executable`, through a launch process: this
    /// coordinator's own executable in mode `launch`
    /// ([`super::subreaper`]), which starts the command, ends whatever it
    /// leaves behind, and reports how it ended.
    pub fn spawn(&self, executable: &Checked, argv: &[String]) -> Result<HostCommand, LaunchError> {
        self.start(executable, argv)
            .map_err(|source| LaunchError::Spawn {
                program: executable.canonical.clone(),
                source,
            })
    }

    fn start(&self, executable: &Checked, argv: &[String]) -> std::io::Result<HostCommand> {
        let pipe = || rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC);
        let (report, report_end) = pipe()?;
        let (stdout, stdout_end) = pipe()?;
        let (stderr, stderr_end) = pipe()?;
        let mut environment: Vec<(Vec<u8>, Vec<u8>)> = [("PATH", HOST_PATH), ("LANG", "C.UTF-8")]
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect();
        environment.extend(
            self.environment
                .iter()
                .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec())),
        );
        // The launch process's own (debug builds), which it keeps from
        // the command.
        environment.extend(
            lazaret_proto::seccomp::debug_variables()
                .into_iter()
                .map(|(k, v)| (k.into_vec(), v.into_vec())),
        );
        let request = spawner::LaunchRequest {
            argv: argv.iter().map(|a| a.as_bytes().to_vec()).collect(),
            environment,
        };
        // The running coordinator's own image, in mode `launch`, started
        // by the unconfined spawner as this process's child. It alone
        // inherits the executable's descriptor and the report pipe (and
        // passes on only the first), and is killed if the coordinator dies
        // before it has set its own parent-death signal.
        let pidfd = spawner::Spawner::launch(
            &request,
            &spawner::LaunchFds {
                executable: executable.opened.fd.as_fd(),
                report: report_end.as_fd(),
                stdout: stdout_end.as_fd(),
                stderr: stderr_end.as_fd(),
                directory: self.workspace.as_fd(),
            },
        )?;
        drop((report_end, stdout_end, stderr_end));
        let stdout = Stream::new(stdout)?;
        let stderr = Stream::new(stderr)?;
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

/// Where an executable may not lie: what the sandbox can write, and
/// Lazaret's own trees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tree {
    /// The host workspace.
    Workspace,
    /// The profile's directory.
    ProfileDir,
    /// Lazaret's storage root.
    Storage,
    /// Lazaret's runtime root.
    Runtime,
    /// The source of the profile's volume with this index.
    Volume(usize),
}

impl std::fmt::Display for Tree {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Workspace => f.write_str("the workspace"),
            Self::ProfileDir => f.write_str("the profile directory"),
            Self::Storage => f.write_str("Lazaret's storage"),
            Self::Runtime => f.write_str("Lazaret's runtime directory"),
            Self::Volume(i) => write!(f, "volume {i}'s source"),
        }
    }
}

/// The first of `forbidden` that `canonical` lies in (or holds).
fn forbidden_tree<'a>(
    canonical: &Path,
    forbidden: &'a [(PathBuf, Tree)],
) -> Option<(&'a Path, Tree)> {
    forbidden
        .iter()
        .find(|(tree, _)| overlaps(canonical, tree))
        .map(|(tree, what)| (tree.as_path(), *what))
}

/// The checks of [`check_executable`], as an [`ExecutableError`].
fn checked(label: &Path, opened: &Opened, uid: u32) -> Result<(), ExecutableError> {
    check_executable(label, opened, uid).map_err(|reason| ExecutableError::Unfit {
        path: label.to_path_buf(),
        reason,
    })
}

/// Why an executable may not run as a host command.
#[derive(Debug, thiserror::Error)]
pub enum ExecutableError {
    /// The classification named a rule the configuration does not hold.
    #[error("auto_approve[{index}] does not exist")]
    NoRule {
        /// The rule's index.
        index: usize,
    },
    /// The requested path could not be resolved or planned.
    #[error(transparent)]
    Resolve(ConfinedError),
    /// The executable could not be opened through its confined plan.
    #[error(transparent)]
    Open(#[from] ConfinedError),
    /// A rule's executable is no longer the object `up` checked.
    #[error(
        "{} was replaced since `lazaret up` checked it; run `lazaret down` and \
         `lazaret up` to accept the new file",
        path.display()
    )]
    Replaced {
        /// Its canonical path.
        path: PathBuf,
    },
    /// The executable lies where the sandbox can write or Lazaret owns.
    #[error(
        "{} lies inside {what} ({}), which the sandbox can write or Lazaret owns; \
         a host command must be an executable outside them",
        path.display(),
        tree.display()
    )]
    Forbidden {
        /// Its canonical path.
        path: PathBuf,
        /// The tree it lies in.
        tree: PathBuf,
        /// What that tree is.
        what: Tree,
    },
    /// It fails the checks of [`check_executable`] (links, owner, mode,
    /// execute permission).
    #[error("{reason}")]
    Unfit {
        /// Its canonical path.
        path: PathBuf,
        /// The check it failed.
        reason: crate::config::ExecutableError,
    },
}

/// Why an approved command was not started.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// Its executable no longer passes the checks.
    #[error(transparent)]
    Executable(#[from] ExecutableError),
    /// No executable was checked for it at admission.
    #[error("no executable was checked for it")]
    Unchecked,
    /// Its launch process could not be started.
    #[error("cannot start {}", program.display())]
    Spawn {
        /// The executable's canonical path.
        program: PathBuf,
        /// Why not.
        #[source]
        source: std::io::Error,
    },
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
        let mut bytes = [0u8; report::MAX_REPORT];
        let mut len = 0;
        while len < bytes.len() {
            match rustix::io::read(&self.report, &mut bytes[len..]) {
                Ok(0) => break,
                Ok(n) => len += n,
                Err(Errno::INTR) => {}
                Err(_) => break,
            }
        }
        match report::decode_report(&bytes[..len]) {
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

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use crate::config::{HostEnvironment, LoadRequest};

    /// A scratch host with one auto-approval rule for `tools/rule`: its
    /// directory, the resolved configuration, the rule's path.
    fn scratch() -> (tempfile::TempDir, ResolvedDomainConfiguration, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        let (home, run, work, tools) = (
            base.join("home"),
            base.join("run"),
            base.join("work"),
            base.join("tools"),
        );
        for d in [&home, &run, &work, &tools] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o700)).unwrap();
        let rule = tools.join("rule");
        std::fs::write(&rule, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&rule, std::fs::Permissions::from_mode(0o755)).unwrap();
        let file = base.join("config.toml");
        std::fs::write(
            &file,
            format!(
                "schema = \"lazaret-trusted-host-config-v2\"\n[profiles.p]\nimage = \"x\"\n\
                 [profiles.p.escalation]\nenabled = true\nauto_approve = [\
                 {{ executable = {:?}, args = [\"-x\"], allow_extra_args = true }}]\n",
                rule.display().to_string()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let host = HostEnvironment::from_vars(
            rustix::process::getuid().as_raw(),
            [
                ("HOME", home.as_os_str()),
                ("XDG_RUNTIME_DIR", run.as_os_str()),
            ],
        );
        let resolved = crate::config::load(LoadRequest {
            profile: "p",
            config: Some(file.as_os_str()),
            workspace: &work,
            host: &host,
        })
        .unwrap_or_else(|e| panic!("{}", lazaret_proto::error_chain(&e)));
        (dir, resolved, rule)
    }

    #[test]
    fn a_rules_executable_is_reopened_and_checked() {
        let (_dir, resolved, rule) = scratch();
        let launcher = Launcher::new(&resolved).unwrap();
        let checked = launcher.rule_executable(0).unwrap();
        assert_eq!(checked.canonical, rule);
        assert!(launcher.recheck(&checked).is_ok());
        assert!(matches!(
            launcher.rule_executable(1),
            Err(ExecutableError::NoRule { index: 1 })
        ));
        // Its mode changed after admission: the recheck refuses it.
        std::fs::set_permissions(&rule, std::fs::Permissions::from_mode(0o777)).unwrap();
        match launcher.recheck(&checked) {
            Err(ExecutableError::Unfit { path, reason }) => {
                assert_eq!(path, rule);
                assert!(reason.to_string().contains("chmod go-w"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            launcher.rule_executable(0),
            Err(ExecutableError::Unfit { .. })
        ));
    }

    #[test]
    fn a_replaced_rule_executable_is_refused() {
        let (dir, resolved, rule) = scratch();
        let launcher = Launcher::new(&resolved).unwrap();
        let other = dir.path().join("tools/other");
        std::fs::write(&other, "#!/bin/sh\necho swapped\n").unwrap();
        std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::rename(&other, &rule).unwrap();
        let error = launcher.rule_executable(0).unwrap_err();
        assert!(
            matches!(&error, ExecutableError::Replaced { path } if *path == rule),
            "{error:?}"
        );
        assert!(
            error
                .to_string()
                .contains("was replaced since `lazaret up`"),
            "{error}"
        );
    }

    #[test]
    fn a_requested_executable_inside_a_writable_tree_is_refused() {
        let (dir, resolved, rule) = scratch();
        let launcher = Launcher::new(&resolved).unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        let planted = base.join("work/tool");
        std::fs::write(&planted, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o755)).unwrap();
        match launcher.requested_executable(planted.to_str().unwrap()) {
            Err(ExecutableError::Forbidden { path, tree, what }) => {
                assert_eq!(path, planted);
                assert_eq!(tree, base.join("work"));
                assert_eq!(what, Tree::Workspace);
            }
            other => panic!("{other:?}"),
        }
        // Through a link from outside, it is still what the link names.
        let link = base.join("tools/link");
        std::os::unix::fs::symlink(&planted, &link).unwrap();
        assert!(matches!(
            launcher.requested_executable(link.to_str().unwrap()),
            Err(ExecutableError::Forbidden { .. })
        ));
        // Outside every tree, it passes.
        let checked = launcher
            .requested_executable(rule.to_str().unwrap())
            .unwrap();
        assert_eq!(checked.canonical, rule);
    }

    #[test]
    fn a_requested_path_that_is_no_executable_file_is_refused() {
        let (dir, resolved, _) = scratch();
        let launcher = Launcher::new(&resolved).unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        let missing = base.join("tools/missing");
        assert!(matches!(
            launcher.requested_executable(missing.to_str().unwrap()),
            Err(ExecutableError::Resolve(_))
        ));
        let tools = base.join("tools");
        assert!(matches!(
            launcher.requested_executable(tools.to_str().unwrap()),
            Err(ExecutableError::Open(_))
        ));
        let linked = base.join("tools/linked");
        std::fs::hard_link(base.join("tools/rule"), &linked).unwrap();
        match launcher.requested_executable(linked.to_str().unwrap()) {
            Err(ExecutableError::Unfit { path, reason }) => {
                assert_eq!(path, linked);
                assert!(reason.to_string().contains("hard links"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn each_forbidden_tree_is_named() {
        let trees = [
            (PathBuf::from("/w"), Tree::Workspace),
            (PathBuf::from("/v/0"), Tree::Volume(0)),
            (PathBuf::from("/v/1"), Tree::Volume(1)),
        ];
        assert_eq!(
            forbidden_tree(Path::new("/v/1/bin/x"), &trees),
            Some((Path::new("/v/1"), Tree::Volume(1)))
        );
        // A tree inside the executable's path (a directory above it) too.
        assert_eq!(
            forbidden_tree(Path::new("/"), &trees),
            Some((Path::new("/w"), Tree::Workspace))
        );
        assert_eq!(forbidden_tree(Path::new("/wx/bin"), &trees), None);
        assert_eq!(Tree::Volume(1).to_string(), "volume 1's source");
        assert_eq!(Tree::Storage.to_string(), "Lazaret's storage");
    }
}
