//! Session processes: `runsc exec` of one client session's command, and the
//! reaping of every child of the Domain's pid 1.
//!
//! Owns the process specification of a session (command, working
//! directory `/workspace`, environment, terminal, capabilities; the
//! command itself, which the sandbox's pid 1 finds as a new session's
//! leader, and whose session it ends once the command is gone) and its
//! delivery: the spec lives in a sealed memfd that `runsc exec` reads
//! through `/proc/1/fd/N` (this process is pid 1 of the Domain pid
//! namespace), so it is never a file. Owns the only `waitpid` of this
//! process: the reaper records the status of each session process for the
//! thread waiting on it and discards the rest. Trusts the coordinator's
//! request and descriptors.

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};

use lazaret_proto::ids::SessionId;
use lazaret_proto::supervisor::{ExecRequest, ExecSignal, ExecStdio};
use rustix::fs::OFlags;
use rustix::process::{Pid, PidfdFlags, WaitOptions, WaitStatus, pidfd_open};
use serde_json::json;

use crate::bundle::SANDBOX_PATH;
use crate::runsc::Runsc;
use crate::syscall::{ProcessStatus, Processes};

#[derive(Debug, Default)]
struct Children {
    /// Session processes whose status someone waits for.
    watched: HashSet<i32>,
    /// Statuses of watched processes that have exited.
    exited: HashMap<i32, WaitStatus>,
}

/// The Domain pid 1's reaper: reaps every child at once and keeps the
/// statuses of watched session processes.
#[derive(Debug, Default)]
pub struct Reaper {
    children: Mutex<Children>,
    changed: Condvar,
}

impl Reaper {
    /// Starts reaping in a background thread.
    pub fn start() -> Arc<Self> {
        let reaper = Arc::new(Self::default());
        let background = Arc::clone(&reaper);
        std::thread::spawn(move || background.reap());
        reaper
    }

    fn reap(&self) {
        use rustix::process::{WaitId, WaitIdOptions};
        loop {
            // Wait, without reaping, until some child has exited. The reap
            // itself happens under the lock, which a spawn holds until it
            // has its child's pidfd: a pid is never reaped (and free for
            // reuse) before the pidfd that names it exists.
            if rustix::process::waitid(WaitId::All, WaitIdOptions::EXITED | WaitIdOptions::NOWAIT)
                .is_err()
            {
                // No children right now: look again shortly.
                std::thread::sleep(std::time::Duration::from_millis(10));
                continue;
            }
            let mut children = self.children.lock().unwrap_or_else(|e| e.into_inner());
            // `wait` is `wait4(-1)`: any child, in any process group.
            while let Ok(Some((pid, status))) = rustix::process::wait(WaitOptions::NOHANG) {
                // A session's `runsc exec` is not named here: it may pass
                // on a signal that ended the process inside.
                if children.watched.remove(&pid.as_raw_nonzero().get()) {
                    children.exited.insert(pid.as_raw_nonzero().get(), status);
                    self.changed.notify_all();
                } else if status.terminating_signal() == Some(libc::SIGSYS) {
                    tracing::error!(
                        "process {pid} of the Domain {} (`lazaret status` names the \
                         participant that ended)",
                        lazaret_proto::seccomp::KILLED
                    );
                }
            }
        }
    }

    /// Spawns `command`, watches it, and opens its pidfd. The lock is held
    /// across the spawn and the `pidfd_open`, so the reaper can neither take
    /// the status before the pid is watched nor reap the pid before it is
    /// held.
    fn spawn(&self, command: &mut Command) -> std::io::Result<(i32, OwnedFd)> {
        let mut children = self.children.lock().unwrap_or_else(|e| e.into_inner());
        let child = command.spawn()?;
        let pid =
            i32::try_from(child.id()).map_err(|_| std::io::Error::other("pid out of range"))?;
        let pidfd = Pid::from_raw(pid)
            .ok_or_else(|| std::io::Error::other("a child without a pid"))
            .and_then(|p| pidfd_open(p, PidfdFlags::empty()).map_err(Into::into))?;
        children.watched.insert(pid);
        Ok((pid, pidfd))
    }

    /// Waits for a watched process to exit and returns its status.
    fn wait(&self, pid: i32) -> WaitStatus {
        let mut children = self.children.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(status) = children.exited.remove(&pid) {
                return status;
            }
            children = self
                .changed
                .wait(children)
                .unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl Processes for Reaper {
    fn spawn(&self, command: &mut Command) -> std::io::Result<(i32, OwnedFd)> {
        Reaper::spawn(self, command)
    }

    fn wait(&self, pid: i32) -> ProcessStatus {
        Reaper::wait(self, pid).into()
    }
}

/// The OCI process specification of a session.
fn process_spec(request: &ExecRequest, environment: &[String]) -> serde_json::Value {
    let mut env = vec![format!("PATH={SANDBOX_PATH}"), "HOME=/root".to_owned()];
    if let Some(term) = &request.term {
        env.push(format!("TERM={term}"));
    }
    env.extend(environment.iter().cloned());
    // Which mailbox beneath /run/lazaret/mailbox is this session's; last,
    // so nothing of the profile's environment replaces it.
    env.push(format!(
        "{}={}",
        lazaret_proto::mailbox::SESSION_ENV,
        request.session_id.to_hex()
    ));
    let (terminal, size) = match request.stdio {
        ExecStdio::Terminal { rows, columns, .. } => {
            (true, json!({"height": rows, "width": columns}))
        }
        ExecStdio::Pipes { .. } => (false, json!({"height": 0, "width": 0})),
    };
    crate::bundle::process(
        &request.args,
        env,
        &request.cwd,
        json!({"terminal": terminal, "consoleSize": size}),
    )
}

/// A session process that started.
#[derive(Debug)]
pub struct Started {
    /// The pidfd of its `runsc exec`.
    pub pidfd: OwnedFd,
    pid: i32,
    /// Where `runsc exec` writes the process's pid inside once it runs.
    pid_file: PathBuf,
    /// Kept open until the process ends: `runsc exec` reads it.
    _spec: OwnedFd,
}

/// Where `runsc exec` writes the sandbox-internal pid of a session's
/// process, so signals can reach it (`runsc exec` of this runsc release
/// does not pass signals on).
pub fn internal_pid_file(runtime: &Runsc<'_>, session_id: SessionId) -> PathBuf {
    runtime
        .root
        .join(format!("session-{}.pid", session_id.to_hex()))
}

/// Why a session process could not be started or signalled.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The request names a descriptor its packet did not carry.
    #[error("descriptor {index} is missing")]
    MissingDescriptor {
        /// The index the request names.
        index: u16,
    },
    /// The session's environment could not be read.
    #[error(transparent)]
    Environment(#[from] crate::bundle::BundleError),
    /// The process specification could not be encoded.
    #[error("cannot encode the process spec")]
    Encode(#[source] serde_json::Error),
    /// The sealed memfd for the process specification could not be made.
    #[error("cannot hold the process spec")]
    HoldSpec(#[source] std::io::Error),
    /// The session's streams could not be duplicated for `runsc exec`.
    #[error("cannot pass the session's streams")]
    Streams(#[source] std::io::Error),
    /// `runsc exec` could not be started.
    #[error("cannot start runsc exec")]
    Start(#[source] std::io::Error),
    /// The session's process has not written its pid yet, or never will.
    #[error("the session's process is not known (yet)")]
    UnknownProcess(#[source] std::io::Error),
    /// `runsc kill` could not be started.
    #[error("cannot run runsc kill")]
    StartKill(#[source] std::io::Error),
    /// `runsc kill` did not return within [`KILL_BOUND`].
    #[error("runsc kill {signal} did not return within {seconds} s: the sandbox does not answer")]
    KillSilent {
        /// The signal's name.
        signal: &'static str,
        /// The bound.
        seconds: u64,
    },
    /// `runsc kill` failed.
    #[error("runsc kill {signal} failed ({status:?})")]
    KillFailed {
        /// The signal's name.
        signal: &'static str,
        /// Its exit status, if it exited.
        status: Option<i32>,
    },
}

/// How long one `runsc kill` may take.
const KILL_BOUND: std::time::Duration = std::time::Duration::from_secs(5);

/// How long a signal waits for `runsc exec` to write the process's pid:
/// the process runs (and `ps` inside shows it) a moment before the file
/// holds its pid, and a client killed in that moment must still take its
/// process with it.
const PID_FILE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The sandbox-internal pid `runsc exec` wrote to `file`, waiting up to
/// [`PID_FILE_WAIT`] for the file to hold one.
fn internal_pid(file: &std::path::Path) -> Result<u32, ExecError> {
    let deadline = std::time::Instant::now() + PID_FILE_WAIT;
    loop {
        let read = std::fs::read_to_string(file);
        if let Ok(Ok(pid)) = read.as_deref().map(|text| text.trim().parse::<u32>()) {
            return Ok(pid);
        }
        if std::time::Instant::now() >= deadline {
            let (kind, why) = match read {
                Err(e) => (e.kind(), e.to_string()),
                Ok(text) => (
                    std::io::ErrorKind::InvalidData,
                    format!("holds no pid: {:?}", text.trim()),
                ),
            };
            let waited = PID_FILE_WAIT.as_secs();
            return Err(ExecError::UnknownProcess(std::io::Error::new(
                kind,
                format!("{} after {waited} s: {why}", file.display()),
            )));
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Sends `signal` to a session's process inside the sandbox with
/// `runsc kill --pid` (a window's change, to every process, with
/// `runsc kill --all`), within [`KILL_BOUND`].
pub fn signal(
    reaper: &dyn Processes,
    runtime: &Runsc<'_>,
    session_id: SessionId,
    signal: ExecSignal,
) -> Result<(), ExecError> {
    let mut command = if signal == ExecSignal::WindowChanged {
        runtime.command(["kill", "--all", runtime.container_id, signal.name()])
    } else {
        let pid = internal_pid(&internal_pid_file(runtime, session_id))?.to_string();
        runtime.command([
            "kill",
            "--pid",
            pid.as_str(),
            runtime.container_id,
            signal.name(),
        ])
    };
    command.stderr(Stdio::null());
    // The reaper owns every wait of this process: spawn and wait through it.
    let (child, pidfd) = reaper.spawn(&mut command).map_err(ExecError::StartKill)?;
    // A sandbox that does not answer (stopped, or stuck) holds `runsc kill`
    // for at most this long.
    let ended = lazaret_proto::channel::readable_within(pidfd.as_fd(), KILL_BOUND).unwrap_or(false);
    if !ended {
        let _ = rustix::process::pidfd_send_signal(&pidfd, rustix::process::Signal::KILL);
    }
    match reaper.wait(child).exit {
        Some(0) => Ok(()),
        _ if !ended => Err(ExecError::KillSilent {
            signal: signal.name(),
            seconds: KILL_BOUND.as_secs(),
        }),
        status => Err(ExecError::KillFailed {
            signal: signal.name(),
            status,
        }),
    }
}

/// The exit of a session process.
#[derive(Debug, Clone, Copy)]
pub struct Exit {
    /// The exit code; `128 + N` for signal N.
    pub code: u8,
    /// Whether a signal ended it.
    pub signaled: bool,
}

/// Starts a session's `runsc exec`; `stdio` are the descriptors named by
/// the request (the PTY slave, or the input and output pipes).
pub fn spawn(
    reaper: &dyn Processes,
    runtime: &Runsc<'_>,
    request: &ExecRequest,
    environment: &[String],
    stdio: (BorrowedFd<'_>, BorrowedFd<'_>),
) -> Result<Started, ExecError> {
    let spec =
        serde_json::to_vec(&process_spec(request, environment)).map_err(ExecError::Encode)?;
    let spec = lazaret_proto::memfd::sealed_bytes("lazaret-process", &spec)
        .map_err(ExecError::HoldSpec)?;
    let (input, output) = stdio;
    let dup = |fd: BorrowedFd<'_>| {
        fd.try_clone_to_owned()
            .map(Stdio::from)
            .map_err(ExecError::Streams)
    };
    // Each stream gets an open file description of its own (the same pipe
    // or terminal, opened again through /proc/self/fd): runsc makes each
    // donated description non-blocking for itself and gives the process
    // the flags it found, so two streams sharing one description race, and
    // the one imported second would see a non-blocking stream (EAGAIN in
    // the process when the pipe is full).
    let terminal = matches!(request.stdio, ExecStdio::Terminal { .. });
    let reopen = |fd: BorrowedFd<'_>| {
        let access = if terminal {
            OFlags::RDWR
        } else {
            OFlags::WRONLY
        };
        // A description this user may not open again (a pipe of another
        // user's, handed in by the CLI) is shared as it is.
        match rustix::fs::open(
            format!("/proc/self/fd/{}", fd.as_raw_fd()),
            access | OFlags::CLOEXEC | OFlags::NOCTTY,
            rustix::fs::Mode::empty(),
        ) {
            Ok(fd) => Ok(Stdio::from(fd)),
            Err(_) => dup(fd),
        }
    };
    let pid_file = internal_pid_file(runtime, request.session_id);
    let process = format!("/proc/1/fd/{}", spec.as_raw_fd());
    let mut command = runtime.command([
        "exec".as_ref(),
        "--internal-pid-file".as_ref(),
        pid_file.as_os_str(),
        "--process".as_ref(),
        process.as_ref(),
        runtime.container_id.as_ref(),
    ]);
    command
        .stdin(dup(input)?)
        .stdout(if terminal {
            reopen(output)?
        } else {
            dup(output)?
        })
        .stderr(reopen(output)?);
    if terminal {
        crate::sys::with_controlling_terminal(&mut command);
    }
    let (pid, pidfd) = reaper.spawn(&mut command).map_err(ExecError::Start)?;
    Ok(Started {
        pidfd,
        pid,
        pid_file,
        _spec: spec,
    })
}

/// Waits until a started session process runs inside the sandbox (its
/// `runsc exec` wrote the process's pid) or its `runsc exec` ended,
/// whichever comes first. Unbounded: the coordinator bounds a session's
/// start, and kills a `runsc exec` it gave up on once it is reported.
pub fn wait_running(started: &Started) {
    use rustix::event::{PollFd, PollFlags, poll};
    use rustix::fs::inotify;
    let watch = || -> std::io::Result<OwnedFd> {
        let fd = inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK)?;
        let dir = started
            .pid_file
            .parent()
            .unwrap_or(std::path::Path::new("/"));
        inotify::add_watch(
            &fd,
            dir,
            inotify::WatchFlags::CLOSE_WRITE | inotify::WatchFlags::MOVED_TO,
        )?;
        Ok(fd)
    };
    // Without a watch, the start is reported at once, as the spawn.
    let Ok(watch) = watch() else {
        return;
    };
    let mut events = [0u8; 4096];
    while !started.pid_file.exists() {
        let mut fds = [
            PollFd::new(&watch, PollFlags::IN),
            PollFd::new(&started.pidfd, PollFlags::IN),
        ];
        match poll(&mut fds, None) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return,
        }
        if !fds[1].revents().is_empty() {
            return;
        }
        while matches!(rustix::io::read(&watch, &mut events), Ok(n) if n > 0) {}
    }
}

/// The exit code of a command that could not be run (none by that name,
/// or not executable): the shell's "not found". `runsc exec` has said why
/// on the session's standard error.
const NOT_RUN: u8 = 127;

/// The code `runsc exec` exits with when it did not start the process.
const RUNSC_FAILED: i32 = 128;

/// Waits for a started session process to exit.
pub fn wait(reaper: &dyn Processes, started: Started) -> Exit {
    let status = reaper.wait(started.pid);
    exit_of(status, started.pid_file.exists())
}

/// The exit of a session process whose `runsc exec` ended with `status`,
/// having written the process's pid inside (`ran`) or not.
fn exit_of(status: ProcessStatus, ran: bool) -> Exit {
    // Without its pid written, the process never ran inside.
    if status.exit == Some(RUNSC_FAILED) && !ran {
        return Exit {
            code: NOT_RUN,
            signaled: false,
        };
    }
    match (status.exit, status.signal) {
        (Some(code), _) => Exit {
            code: u8::try_from(code).unwrap_or(u8::MAX),
            signaled: code > 128,
        },
        (None, Some(signal)) => Exit {
            code: u8::try_from(128 + signal).unwrap_or(u8::MAX),
            signaled: true,
        },
        (None, None) => Exit {
            code: u8::MAX,
            signaled: false,
        },
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use lazaret_proto::supervisor::FdIndex;
    use rustix::io::Errno;

    use super::*;
    use crate::runsc::Platform;
    use crate::syscall::recording::{Call, Recording};

    fn runsc(root: &Path) -> Runsc<'_> {
        Runsc {
            runsc: Path::new("/opt/runsc"),
            platform: Platform::Systrap,
            root,
            container_id: "lazaret-c1",
        }
    }

    const SESSION: SessionId = SessionId([7; 16]);

    fn request(stdio: ExecStdio) -> ExecRequest {
        ExecRequest {
            session_id: SESSION,
            args: vec!["bash".into(), "-l".into()],
            cwd: "/workspace".into(),
            term: Some("xterm-256color".into()),
            environment: FdIndex(0),
            stdio,
        }
    }

    const PIPES: ExecStdio = ExecStdio::Pipes {
        input: FdIndex(1),
        output: FdIndex(2),
    };

    /// Starts `request` through `sys` with a pipe for each stream.
    fn start(
        sys: &Recording,
        root: &Path,
        request: &ExecRequest,
        environment: &[String],
    ) -> Result<Started, ExecError> {
        let (input, output) = rustix::pipe::pipe().unwrap();
        spawn(
            sys,
            &runsc(root),
            request,
            environment,
            (input.as_fd(), output.as_fd()),
        )
    }

    fn spec_of(started: &Started) -> serde_json::Value {
        let bytes = lazaret_proto::memfd::read_sealed(started._spec.as_fd(), 1 << 20).unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[test]
    fn a_session_runs_runsc_exec_on_a_sealed_spec_with_a_clean_environment() {
        let root = tempfile::tempdir().unwrap();
        let sys = Recording::default();
        let started = start(&sys, root.path(), &request(PIPES), &[]).unwrap();
        let calls = sys.calls();
        let [Call::Spawn { program, args, env }] = &calls[..] else {
            panic!("{calls:#?}")
        };
        assert_eq!(program, "/opt/runsc");
        let pid_file = root
            .path()
            .join(format!("session-{}.pid", SESSION.to_hex()));
        let expected: Vec<String> = vec![
            "--rootless".to_owned(),
            "--ignore-cgroups".to_owned(),
            "--network=host".to_owned(),
            "--platform=systrap".to_owned(),
            "--root".to_owned(),
            root.path().display().to_string(),
            "exec".to_owned(),
            "--internal-pid-file".to_owned(),
            pid_file.display().to_string(),
            "--process".to_owned(),
            format!("/proc/1/fd/{}", started._spec.as_raw_fd()),
            "lazaret-c1".to_owned(),
        ];
        assert_eq!(*args, expected);
        assert_eq!(
            *env,
            vec![(
                "PATH".to_owned(),
                Some("/usr/sbin:/usr/bin:/sbin:/bin".to_owned())
            )]
        );
        assert_eq!(started.pid_file, pid_file);
    }

    #[test]
    fn the_spec_names_the_command_cwd_and_environment_with_the_session_last() {
        let root = tempfile::tempdir().unwrap();
        let sys = Recording::default();
        let session_env = lazaret_proto::mailbox::SESSION_ENV;
        let environment = vec!["EDITOR=vi".to_owned(), format!("{session_env}=forged")];
        let started = start(&sys, root.path(), &request(PIPES), &environment).unwrap();
        let spec = spec_of(&started);
        assert_eq!(spec["args"], serde_json::json!(["bash", "-l"]));
        assert_eq!(spec["cwd"], "/workspace");
        assert_eq!(spec["terminal"], false);
        assert_eq!(spec["noNewPrivileges"], true);
        let env: Vec<String> = serde_json::from_value(spec["env"].clone()).unwrap();
        assert_eq!(
            env,
            vec![
                format!("PATH={SANDBOX_PATH}"),
                "HOME=/root".to_owned(),
                "TERM=xterm-256color".to_owned(),
                "EDITOR=vi".to_owned(),
                format!("{session_env}=forged"),
                format!("{session_env}={}", SESSION.to_hex()),
            ]
        );
    }

    #[test]
    fn a_terminal_session_gets_its_window_size() {
        let root = tempfile::tempdir().unwrap();
        let sys = Recording::default();
        let request = request(ExecStdio::Terminal {
            slave: FdIndex(1),
            rows: 40,
            columns: 120,
        });
        let started = start(&sys, root.path(), &request, &[]).unwrap();
        let spec = spec_of(&started);
        assert_eq!(spec["terminal"], true);
        assert_eq!(
            spec["consoleSize"],
            serde_json::json!({"height": 40, "width": 120})
        );
    }

    #[test]
    fn a_runsc_exec_that_cannot_start_is_named() {
        let root = tempfile::tempdir().unwrap();
        let sys = Recording::default();
        sys.fail_when(|c| matches!(c, Call::Spawn { .. }), Errno::AGAIN);
        let error = start(&sys, root.path(), &request(PIPES), &[]).unwrap_err();
        assert!(matches!(error, ExecError::Start(_)), "{error:?}");
        assert!(
            lazaret_proto::error_chain(&error).starts_with("cannot start runsc exec: "),
            "{error}"
        );
    }

    #[test]
    fn a_window_change_goes_to_every_process() {
        let root = tempfile::tempdir().unwrap();
        let sys = Recording::default();
        signal(
            &sys,
            &runsc(root.path()),
            SESSION,
            ExecSignal::WindowChanged,
        )
        .unwrap();
        let spawned = sys.spawned();
        assert_eq!(spawned.len(), 1);
        assert_eq!(spawned[0][6..], ["kill", "--all", "lazaret-c1", "WINCH"]);
    }

    #[test]
    fn a_signal_goes_to_the_pid_runsc_exec_wrote() {
        let root = tempfile::tempdir().unwrap();
        let runtime = runsc(root.path());
        std::fs::write(internal_pid_file(&runtime, SESSION), "42\n").unwrap();
        let sys = Recording::default();
        signal(&sys, &runtime, SESSION, ExecSignal::Interrupt).unwrap();
        assert_eq!(
            sys.spawned()[0][6..],
            ["kill", "--pid", "42", "lazaret-c1", "INT"]
        );
    }

    #[test]
    fn a_signal_waits_for_the_pid_runsc_exec_is_still_writing() {
        let root = tempfile::tempdir().unwrap();
        let runtime = runsc(root.path());
        let file = internal_pid_file(&runtime, SESSION);
        // Created empty first, as a writer that has not written yet leaves it.
        std::fs::write(&file, "").unwrap();
        let writer = {
            let file = file.clone();
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(200));
                std::fs::write(file, "7\n").unwrap();
            })
        };
        let sys = Recording::default();
        signal(&sys, &runtime, SESSION, ExecSignal::Kill).unwrap();
        writer.join().unwrap();
        assert_eq!(
            sys.spawned()[0][6..],
            ["kill", "--pid", "7", "lazaret-c1", "KILL"]
        );
    }

    #[test]
    fn a_signal_before_the_process_runs_is_refused_without_runsc() {
        let root = tempfile::tempdir().unwrap();
        let sys = Recording::default();
        let error = signal(&sys, &runsc(root.path()), SESSION, ExecSignal::Terminate).unwrap_err();
        assert!(matches!(error, ExecError::UnknownProcess(_)), "{error:?}");
        assert!(sys.calls().is_empty());
    }

    #[test]
    fn a_failed_runsc_kill_is_reported_with_its_status() {
        let root = tempfile::tempdir().unwrap();
        let runtime = runsc(root.path());
        std::fs::write(internal_pid_file(&runtime, SESSION), "42").unwrap();
        let sys = Recording::default();
        // The double numbers its children from 1001.
        sys.statuses.lock().unwrap().insert(
            1001,
            ProcessStatus {
                exit: Some(1),
                signal: None,
            },
        );
        let error = signal(&sys, &runtime, SESSION, ExecSignal::Kill).unwrap_err();
        assert_eq!(error.to_string(), "runsc kill KILL failed (Some(1))");
        let sys = Recording::default();
        sys.fail_when(|c| matches!(c, Call::Spawn { .. }), Errno::NOMEM);
        let error = signal(&sys, &runtime, SESSION, ExecSignal::Hangup).unwrap_err();
        assert!(matches!(error, ExecError::StartKill(_)), "{error:?}");
    }

    #[test]
    fn a_session_exit_is_its_code_or_its_signal() {
        let exit = |exit, signal, ran| {
            let e = exit_of(ProcessStatus { exit, signal }, ran);
            (e.code, e.signaled)
        };
        assert_eq!(exit(Some(0), None, true), (0, false));
        assert_eq!(exit(Some(3), None, true), (3, false));
        assert_eq!(exit(Some(130), None, true), (130, true));
        assert_eq!(exit(None, Some(9), true), (137, true));
        assert_eq!(exit(None, None, true), (u8::MAX, false));
        // runsc's own failure, with the process never started inside, is
        // the shell's "not found"; once it ran, 128 is its code.
        assert_eq!(exit(Some(RUNSC_FAILED), None, false), (NOT_RUN, false));
        assert_eq!(exit(Some(RUNSC_FAILED), None, true), (128, false));
    }

    #[test]
    fn waiting_for_a_session_reads_its_status_through_the_reaper() {
        let root = tempfile::tempdir().unwrap();
        let sys = Recording::default();
        let started = start(&sys, root.path(), &request(PIPES), &[]).unwrap();
        sys.statuses.lock().unwrap().insert(
            started.pid,
            ProcessStatus {
                exit: Some(RUNSC_FAILED),
                signal: None,
            },
        );
        // No pid file: the command never ran inside.
        let exit = wait(&sys, started);
        assert_eq!((exit.code, exit.signaled), (NOT_RUN, false));
    }

    #[test]
    fn a_started_session_whose_runsc_exec_ended_is_not_waited_for() {
        let root = tempfile::tempdir().unwrap();
        let sys = Recording::default();
        // The double's pidfd reads as ended at once; no pid file is ever
        // written, and this returns instead of waiting for one.
        let started = start(&sys, root.path(), &request(PIPES), &[]).unwrap();
        wait_running(&started);
        assert!(!started.pid_file.exists());
    }
}
