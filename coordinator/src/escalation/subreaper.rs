//! The launch process of an approved host command: the coordinator's own
//! executable started in mode `launch`, between the coordinator and the
//! command, which ends everything the command started.
//!
//! A command that puts a child in a session of its own (`setsid`,
//! `setsid -f`, a daemon's double fork) takes it out of the command's
//! process group, and killing the group misses it. So the command is
//! started by this process instead, a child subreaper
//! (`PR_SET_CHILD_SUBREAPER`, prctl(2)): whatever the command leaves
//! behind is re-parented here, not to init, and is found by walking the
//! children lists of `/proc` (`/proc/PID/task/TID/children`, proc(5)) down
//! from this process. When the command exits, everything still below
//! this process is killed and reaped; on `SIGTERM` (a cancellation)
//! everything gets `SIGTERM`, and 0.5 s later, or as soon as the command
//! exits, `SIGKILL`; on `SIGHUP` (its session or Domain ended, or the
//! coordinator died: this process's parent-death signal) everything is
//! killed at once. Only then does this process exit, after writing how
//! the command ended on its report pipe.
//!
//! A direct child is signalled by its pid (only this process reaps it, so
//! the pid cannot name another process meanwhile); a deeper one through a
//! pidfd, once its parent is proven to be the one it was found under. The
//! command itself dies with this process (`PR_SET_PDEATHSIG`). What it
//! hands to something outside this tree (a service manager, `at`, an SSH
//! connection to this host) is beyond reach, and so is what it started
//! once it has killed this process itself: it runs as the same user.
//! Trusts the coordinator that started it (its arguments and descriptors);
//! nothing the command does.

use std::ffi::OsString;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rustix::io::Errno;
use rustix::process::{Pid, Signal, WaitOptions};

use super::report::{Ended, NotStarted, Report, encode_report};
use crate::process::ProcStat;

/// The argument that selects this mode of `lazaret-coordinator`.
pub const MODE: &str = "launch";

/// How long a cancelled command has between `SIGTERM` and `SIGKILL`.
pub const TERM_GRACE: Duration = Duration::from_millis(500);

/// The error number of `e`. Every error of a launch is a system call's;
/// one that is not (the standard library refusing an argument) reads as
/// `EINVAL`.
fn errno(e: &std::io::Error) -> Errno {
    Errno::from_io_error(e).unwrap_or(Errno::INVAL)
}

/// What the coordinator hands the launch process.
#[derive(Debug, PartialEq, Eq)]
pub struct Arguments {
    /// The executable's descriptor, which the command runs as
    /// `/proc/self/fd/N`.
    pub executable: i32,
    /// Where the report goes.
    pub report: i32,
    /// The coordinator's pid, to check that it still is the parent once
    /// the parent-death signal is set.
    pub parent: i32,
    /// The command: element zero is its name (`argv[0]`).
    pub argv: Vec<OsString>,
}

impl Arguments {
    /// The arguments after [`MODE`]: `EXE_FD REPORT_FD PARENT_PID --
    /// ARGV...`.
    pub fn to_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec![
            MODE.into(),
            self.executable.to_string().into(),
            self.report.to_string().into(),
            self.parent.to_string().into(),
            "--".into(),
        ];
        args.extend(self.argv.iter().cloned());
        args
    }

    /// Parses what [`Self::to_args`] made (after the program's name).
    pub fn parse(args: &[OsString]) -> Result<Self, ArgumentsError> {
        let number = |index: usize| -> Result<i32, ArgumentsError> {
            args.get(index)
                .and_then(|a| a.to_str())
                .and_then(|a| a.parse().ok())
                .ok_or(ArgumentsError::NotANumber { index })
        };
        if args.first().map(|a| a.as_bytes()) != Some(MODE.as_bytes()) {
            return Err(ArgumentsError::Mode);
        }
        if args.get(4).map(|a| a.as_bytes()) != Some(b"--") {
            return Err(ArgumentsError::NoSeparator);
        }
        let argv = args[5..].to_vec();
        if argv.is_empty() {
            return Err(ArgumentsError::NoCommand);
        }
        let parsed = Self {
            executable: number(1)?,
            report: number(2)?,
            parent: number(3)?,
            argv,
        };
        if parsed.executable == parsed.report {
            return Err(ArgumentsError::SharedDescriptor);
        }
        Ok(parsed)
    }
}

/// Why the arguments of a launch process are not what the coordinator
/// gives it ([`Arguments::to_args`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgumentsError {
    /// The mode argument is missing or another.
    #[error("the first argument is not `{}`", MODE)]
    Mode,
    /// A descriptor or the parent's pid is not a number.
    #[error("argument {index} is not a number")]
    NotANumber {
        /// Its position, the mode being 0.
        index: usize,
    },
    /// No `--` where the command should begin.
    #[error("the command does not follow `--`")]
    NoSeparator,
    /// Nothing after `--`.
    #[error("no command")]
    NoCommand,
    /// One descriptor named as both the executable and the report.
    #[error("the executable and the report share a descriptor")]
    SharedDescriptor,
}

/// The signals that end the command, as they arrive.
struct Signals {
    wake: std::os::unix::net::UnixStream,
    terminate: Arc<AtomicBool>,
    hang_up: Arc<AtomicBool>,
}

impl Signals {
    /// Catches `SIGTERM` and `SIGINT` (a cancellation), `SIGHUP` (end it
    /// all now) and `SIGCHLD` (something to reap), each also waking
    /// [`Self::wait`].
    fn catch() -> std::io::Result<Self> {
        use signal_hook::consts::{SIGCHLD, SIGHUP, SIGINT, SIGTERM};
        let (wake, write) = std::os::unix::net::UnixStream::pair()?;
        wake.set_nonblocking(true)?;
        write.set_nonblocking(true)?;
        let terminate = Arc::new(AtomicBool::new(false));
        let hang_up = Arc::new(AtomicBool::new(false));
        signal_hook::flag::register(SIGTERM, Arc::clone(&terminate))?;
        signal_hook::flag::register(SIGINT, Arc::clone(&terminate))?;
        signal_hook::flag::register(SIGHUP, Arc::clone(&hang_up))?;
        for signal in [SIGTERM, SIGINT, SIGHUP, SIGCHLD] {
            signal_hook::low_level::pipe::register(signal, write.try_clone()?)?;
        }
        Ok(Self {
            wake,
            terminate,
            hang_up,
        })
    }

    /// Waits until a signal arrived or `until` passed.
    fn wait(&self, until: Option<Instant>) {
        let timeout = until.map(|at| {
            let left = at.saturating_duration_since(Instant::now());
            rustix::event::Timespec {
                tv_sec: i64::try_from(left.as_secs()).unwrap_or(i64::MAX),
                tv_nsec: i64::from(left.subsec_nanos()),
            }
        });
        let mut fds = [rustix::event::PollFd::new(
            &self.wake,
            rustix::event::PollFlags::IN,
        )];
        let _ = rustix::event::poll(&mut fds, timeout.as_ref());
        let mut sink = [0u8; 64];
        while rustix::io::read(&self.wake, &mut sink).is_ok_and(|n| n > 0) {}
    }
}

/// How a reaped child ended.
fn ended_of(status: rustix::process::WaitStatus) -> Ended {
    Ended::by_signal(status.terminating_signal()).unwrap_or_else(|| {
        Ended::Exited(u8::try_from(status.exit_status().unwrap_or(255) & 0xff).unwrap_or(255))
    })
}

/// This process's children and theirs, down the tree: (pid, its parent).
fn descendants(me: Pid) -> Vec<(Pid, Pid)> {
    let mut found = Vec::new();
    let mut parents = vec![me];
    while let Some(parent) = parents.pop() {
        for child in children(parent) {
            if found.iter().any(|(p, _)| *p == child) || child == me {
                continue;
            }
            found.push((child, parent));
            parents.push(child);
        }
    }
    found
}

/// The children of `parent`: the children lists of its threads, or, on a
/// kernel without them (`CONFIG_PROC_CHILDREN`), every process whose
/// parent it is.
fn children(parent: Pid) -> Vec<Pid> {
    let tasks = format!("/proc/{}/task", parent.as_raw_nonzero());
    let Ok(threads) = std::fs::read_dir(&tasks) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    let mut listed = false;
    for thread in threads.flatten() {
        if let Ok(text) = std::fs::read_to_string(thread.path().join("children")) {
            listed = true;
            found.extend(parse_pids(&text));
        }
    }
    if !listed {
        found = scan_children(parent);
    }
    found
}

/// The pids of a children list: numbers separated by spaces.
fn parse_pids(text: &str) -> impl Iterator<Item = Pid> + '_ {
    text.split_ascii_whitespace()
        .filter_map(|n| n.parse().ok())
        .filter_map(Pid::from_raw)
}

/// Every process whose parent is `parent`, by its `stat`.
fn scan_children(parent: Pid) -> Vec<Pid> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(Pid::from_raw)
        .filter(|pid| parent_of(*pid) == Some(parent))
        .collect()
}

/// The parent of `pid`, from its `/proc/PID/stat`.
fn parent_of(pid: Pid) -> Option<Pid> {
    ProcStat::read(pid.as_raw_nonzero().get().unsigned_abs())
        .ok()?
        .parent()
}

/// Sends `signal` to `pid`, found as a child of `parent`: by pid when it
/// is this process's own child, else through a pidfd, once the process it
/// names is proven to be that one (a child of `parent`, or re-parented
/// here) and alive while that was read.
fn send(me: Pid, pid: Pid, parent: Pid, signal: Signal) {
    if parent == me {
        let _ = rustix::process::kill_process(pid, signal);
        return;
    }
    let Ok(pidfd) = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()) else {
        return;
    };
    let proven = matches!(parent_of(pid), Some(p) if p == parent || p == me);
    if proven && alive(&pidfd) {
        let _ = rustix::process::pidfd_send_signal(&pidfd, signal);
    }
}

/// Whether the process behind `pidfd` has not exited (its pidfd is not
/// readable yet).
fn alive(pidfd: &OwnedFd) -> bool {
    let mut fds = [rustix::event::PollFd::new(
        pidfd,
        rustix::event::PollFlags::IN,
    )];
    let zero = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    matches!(rustix::event::poll(&mut fds, Some(&zero)), Ok(0))
}

/// Sends `signal` to everything below this process, once.
fn signal_all(me: Pid, signal: Signal) {
    for (pid, parent) in descendants(me) {
        send(me, pid, parent, signal);
    }
}

/// Reaps what has ended without waiting, noting the command's end if it
/// was among them; whether any child is left.
fn reap_ended(command: Pid, ended: &mut Option<Ended>) -> bool {
    loop {
        match rustix::process::wait(WaitOptions::NOHANG) {
            Ok(Some((pid, status))) => {
                if pid == command {
                    *ended = Some(ended_of(status));
                }
            }
            Err(rustix::io::Errno::INTR) => {}
            Ok(None) => return true,
            Err(_) => return false,
        }
    }
}

/// How long [`kill_all`] waits for a killed child before it looks for
/// more: re-parented processes, or ones the last walk missed.
const KILL_ROUND: Duration = Duration::from_millis(20);

/// How long [`kill_all`] goes on. A process killed in uninterruptible
/// sleep (a hung network file system) exits only when it wakes; past
/// this it is left with its `SIGKILL` pending, to be reaped by init.
const KILL_LIMIT: Duration = Duration::from_secs(5);

/// Kills everything below this process and reaps it, until no child is
/// left: what a killed process had started is re-parented here and found
/// on the next round.
fn kill_all(me: Pid, command: Pid, signals: &Signals, ended: &mut Option<Ended>) {
    let limit = Instant::now() + KILL_LIMIT;
    loop {
        for (pid, parent) in descendants(me) {
            send(me, pid, parent, Signal::KILL);
        }
        if !reap_ended(command, ended) || Instant::now() >= limit {
            return;
        }
        // A child's end (SIGCHLD) wakes this at once.
        signals.wait(Some(Instant::now() + KILL_ROUND));
    }
}

/// Runs the command of `args` to its end and ends whatever it left.
pub fn main(args: &[OsString]) -> ExitCode {
    // Sanitized first: no descriptor it inherited reaches the command but
    // the two it takes below (the command gets the executable's anew).
    if let Err(e) = lazaret_proto::sys::cloexec_inherited_descriptors() {
        eprintln!("lazaret-coordinator launch: cannot mark inherited descriptors: {e}");
        return ExitCode::FAILURE;
    }
    let args = match Arguments::parse(args) {
        Ok(args) => args,
        Err(why) => {
            eprintln!("lazaret-coordinator launch: {why}; this mode is started by the coordinator");
            return ExitCode::FAILURE;
        }
    };
    let (executable, report) = match (
        crate::sys::inherited(args.executable),
        crate::sys::inherited(args.report),
    ) {
        (Ok(executable), Ok(report)) => (executable, report),
        _ => {
            eprintln!("lazaret-coordinator launch: the descriptors it was given are not open");
            return ExitCode::FAILURE;
        }
    };
    let mut report = std::fs::File::from(report);
    let outcome = run(&args, executable);
    // A report that could not be written is a failure of the launch, not
    // a clean exit of the command.
    match report.write_all(&encode_report(&outcome)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::FAILURE,
    }
}

/// Starts the command and follows it to its end.
fn run(args: &Arguments, executable: OwnedFd) -> Report {
    let me = rustix::process::getpid();
    let signals = prepare(me, args.parent)?;
    let command = spawn(args, &executable).map_err(|e| NotStarted::Spawn(errno(&e)))?;
    drop(executable);
    // Only the command and what it starts hold the output pipes now, so
    // the coordinator sees them end with it.
    if let Ok(null) = rustix::fs::open(
        "/dev/null",
        rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    ) {
        let _ = rustix::stdio::dup2_stdout(&null);
        let _ = rustix::stdio::dup2_stderr(&null);
    }
    // The command runs as approved, unfiltered; from here on this process
    // only follows it. Unconfined, it does not go on.
    if super::seccomp::install_launcher().is_err() {
        kill_all(me, command, &signals, &mut None);
        return Err(NotStarted::Unconfined);
    }
    Ok(follow(me, command, &signals))
}

/// Makes this process ready to start the command: it ends with the
/// coordinator `parent` (but ends what is below it first), is the
/// subreaper of whatever the command leaves, and catches the signals
/// that end the command; the coordinator must still be its parent, and
/// no cancellation may have come meanwhile.
fn prepare(me: Pid, parent: i32) -> Result<Signals, NotStarted> {
    rustix::process::set_parent_process_death_signal(Some(Signal::HUP))
        .and_then(|()| rustix::process::set_child_subreaper(Some(me)))
        .map_err(NotStarted::Prepare)?;
    let signals = Signals::catch().map_err(|e| NotStarted::Prepare(errno(&e)))?;
    if rustix::process::getppid()
        .map(Pid::as_raw_nonzero)
        .map(i32::from)
        != Some(parent)
    {
        return Err(NotStarted::Orphaned);
    }
    // Cancelled, or its session or Domain ended, while this process made
    // ready: the command never starts.
    if signals.terminate.load(Ordering::SeqCst) || signals.hang_up.load(Ordering::SeqCst) {
        return Err(NotStarted::Cancelled);
    }
    Ok(signals)
}

/// Follows the started `command` to its end: it exits, or is cancelled
/// (`SIGTERM` to everything below this process, then [`TERM_GRACE`] to
/// end), or this process is told to end it all (`SIGHUP`). Then kills
/// and reaps everything left; how the command ended.
fn follow(me: Pid, command: Pid, signals: &Signals) -> Ended {
    let mut ended: Option<Ended> = None;
    let mut grace_ends: Option<Instant> = None;
    loop {
        reap_ended(command, &mut ended);
        if ended.is_some() || signals.hang_up.load(Ordering::Relaxed) {
            break;
        }
        if grace_ends.is_some_and(|at| Instant::now() >= at) {
            break;
        }
        if grace_ends.is_none() && signals.terminate.load(Ordering::Relaxed) {
            signal_all(me, Signal::TERM);
            grace_ends = Some(Instant::now() + TERM_GRACE);
            continue;
        }
        signals.wait(grace_ends);
    }
    kill_all(me, command, signals, &mut ended);
    ended.unwrap_or(Ended::Signaled(Signal::KILL.as_raw() as u8))
}

/// Starts the command: `/proc/self/fd/N` of the executable with the
/// command's name as `argv[0]`, this process's environment, working
/// directory and standard streams, in a process group of its own (a
/// `kill 0` in it does not reach this process), killed if this process
/// dies. The executable's descriptor is the only one it inherits.
fn spawn(args: &Arguments, executable: &OwnedFd) -> std::io::Result<Pid> {
    let path = lazaret_hostfs::beneath::proc_self_fd(executable.as_fd());
    let mut command = Command::new(&path);
    std::os::unix::process::CommandExt::arg0(&mut command, &args.argv[0]);
    command
        .args(&args.argv[1..])
        .stdin(Stdio::inherit())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit());
    lazaret_proto::seccomp::remove_debug_variables(&mut command);
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let child = crate::sys::spawn_inheriting(
        &mut command,
        crate::sys::ChildSetup {
            fds: &[executable.as_fd()],
            user_namespace: None,
            die_with_parent: true,
        },
    )?;
    // The child is reaped by `wait`, not through `Child`.
    Ok(Pid::from_child(&child))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_and_reports_survive_their_trip() {
        let args = Arguments {
            executable: 7,
            report: 9,
            parent: 4242,
            argv: vec!["/usr/bin/gh".into(), "--".into(), "-x".into(), "".into()],
        };
        assert_eq!(Arguments::parse(&args.to_args()), Ok(args));
        assert!(Arguments::parse(&["launch".into(), "7".into()]).is_err());
        assert!(Arguments::parse(&["start".into()]).is_err());
    }

    #[test]
    fn malformed_arguments_say_what_is_wrong() {
        let args = |list: &[&str]| -> Vec<OsString> { list.iter().map(OsString::from).collect() };
        let parse = |list: &[&str]| Arguments::parse(&args(list));
        assert_eq!(parse(&[]), Err(ArgumentsError::Mode));
        assert_eq!(
            parse(&["launch", "7", "9", "1", "x"]),
            Err(ArgumentsError::NoSeparator)
        );
        assert_eq!(
            parse(&["launch", "7", "9", "1", "--"]),
            Err(ArgumentsError::NoCommand)
        );
        assert_eq!(
            parse(&["launch", "7", "nine", "1", "--", "/bin/true"]),
            Err(ArgumentsError::NotANumber { index: 2 })
        );
        assert_eq!(
            parse(&["launch", "7", "7", "1", "--", "/bin/true"]),
            Err(ArgumentsError::SharedDescriptor)
        );
        assert_eq!(
            ArgumentsError::Mode.to_string(),
            "the first argument is not `launch`"
        );
        // A command's own `--` and empty arguments are its own.
        let parsed = parse(&["launch", "3", "4", "1", "--", "/bin/echo", "--", ""]).unwrap();
        assert_eq!(parsed.argv, args(&["/bin/echo", "--", ""]));
    }

    #[test]
    fn a_children_list_is_read() {
        let pids: Vec<i32> = parse_pids("12 13 \n")
            .map(|p| p.as_raw_nonzero().get())
            .collect();
        assert_eq!(pids, [12, 13]);
    }
}
