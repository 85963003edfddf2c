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
                if children.watched.remove(&pid.as_raw_nonzero().get()) {
                    children.exited.insert(pid.as_raw_nonzero().get(), status);
                    self.changed.notify_all();
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

/// How long one `runsc kill` may take.
const KILL_BOUND: std::time::Duration = std::time::Duration::from_secs(5);

/// Sends `signal` to a session's process inside the sandbox with
/// `runsc kill --pid` (a window's change, to every process, with
/// `runsc kill --all`), within [`KILL_BOUND`].
pub fn signal(
    reaper: &Reaper,
    runtime: &Runsc<'_>,
    session_id: SessionId,
    signal: ExecSignal,
) -> Result<(), String> {
    let mut command = if signal == ExecSignal::WindowChanged {
        runtime.command(["kill", "--all", runtime.container_id, signal.name()])
    } else {
        let file = internal_pid_file(runtime, session_id);
        let pid = std::fs::read_to_string(&file)
            .map_err(|e| format!("the session's process is not known (yet): {e}"))?;
        runtime.command([
            "kill",
            "--pid",
            pid.trim(),
            runtime.container_id,
            signal.name(),
        ])
    };
    command.stderr(Stdio::null());
    // The reaper owns every wait of this process: spawn and wait through it.
    let (child, pidfd) = reaper
        .spawn(&mut command)
        .map_err(|e| format!("cannot run runsc kill: {e}"))?;
    // A sandbox that does not answer (stopped, or stuck) holds `runsc kill`
    // for at most this long.
    let ended = lazaret_proto::channel::readable_within(pidfd.as_fd(), KILL_BOUND).unwrap_or(false);
    if !ended {
        let _ = rustix::process::pidfd_send_signal(&pidfd, rustix::process::Signal::KILL);
    }
    match reaper.wait(child).exit_status() {
        Some(0) => Ok(()),
        _ if !ended => Err(format!(
            "runsc kill {} did not return within {} s: the sandbox does not answer",
            signal.name(),
            KILL_BOUND.as_secs()
        )),
        other => Err(format!("runsc kill {} failed ({other:?})", signal.name())),
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
    reaper: &Reaper,
    runtime: &Runsc<'_>,
    request: &ExecRequest,
    environment: &[String],
    stdio: (BorrowedFd<'_>, BorrowedFd<'_>),
) -> Result<Started, String> {
    let spec =
        serde_json::to_vec(&process_spec(request, environment)).map_err(|e| e.to_string())?;
    let spec = lazaret_proto::memfd::sealed_bytes("lazaret-process", &spec)
        .map_err(|e| format!("cannot hold the process spec: {e}"))?;
    let (input, output) = stdio;
    let dup = |fd: BorrowedFd<'_>| {
        fd.try_clone_to_owned()
            .map(Stdio::from)
            .map_err(|e| format!("cannot pass the session's streams: {e}"))
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
    let (pid, pidfd) = reaper
        .spawn(&mut command)
        .map_err(|e| format!("cannot start runsc exec: {e}"))?;
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
pub fn wait(reaper: &Reaper, started: Started) -> Exit {
    let status = reaper.wait(started.pid);
    // Without its pid written, the process never ran inside.
    if status.exit_status() == Some(RUNSC_FAILED) && !started.pid_file.exists() {
        return Exit {
            code: NOT_RUN,
            signaled: false,
        };
    }
    match (status.exit_status(), status.terminating_signal()) {
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
