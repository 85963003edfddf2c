//! `lazaret-init`: the first process of every Lazaret sandbox, and what
//! each client session's command starts through.
//!
//! - `lazaret-init` (pid 1) holds the container open between client
//!   sessions, reaps every process that ends orphaned (so no zombie piles
//!   up), and ends every session's processes once its command is gone: a
//!   background process of a session never outlives it by more than
//!   [`SESSION_CHECK`]; only a process that leaves the session (`setsid`)
//!   does. The runtime stops it with SIGKILL.
//! - `lazaret-init session -- PROGRAM [ARGS...]` is what each session's
//!   `runsc exec` starts: the leader of a new session (the runtime makes
//!   every exec'd process one), it tells pid 1 its session began (a queued
//!   real-time signal, which carries its pid) and then becomes the program
//!   itself (`exec`), so signals, the terminal and the exit status are the
//!   program's own, at the cost of one `exec`.
//!
//! Built as a static executable with no dependencies beyond `std`, mounted
//! read-only in the sandbox's control area, so it runs on any image, even
//! one without a shell or a C library. Trusts nothing it reads: `/proc`
//! and the signals it receives are only used to find whom to kill, and a
//! session it is told about is ended only once its leader is gone.

mod sys;

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode};
use std::time::Duration;

/// How often pid 1 looks whether a session's leader is gone, while any
/// session runs.
const SESSION_CHECK: Duration = Duration::from_millis(50);

/// How long pid 1 sleeps between looks when no session runs.
const IDLE_CHECK: Duration = Duration::from_secs(1);

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    match args.first().and_then(|a| a.to_str()) {
        None => init(),
        Some("session") => session(&args[1..]),
        Some(_) => {
            eprintln!("usage: lazaret-init | lazaret-init session -- PROGRAM [ARGS...]");
            ExitCode::from(2)
        }
    }
}

/// Pid 1: reaps whatever ends, and ends what a finished session left.
fn init() -> ExitCode {
    let signals = match sys::Signals::block(&[sys::SIGCHLD, sys::SESSION_BEGAN]) {
        Ok(signals) => signals,
        Err(e) => {
            eprintln!("lazaret-init: cannot block signals: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut sessions = BTreeSet::new();
    loop {
        let wait = if sessions.is_empty() {
            IDLE_CHECK
        } else {
            SESSION_CHECK
        };
        if let Some(sys::Received {
            signal: sys::SESSION_BEGAN,
            sender,
        }) = signals.next_within(wait)
        {
            sessions.insert(sender);
        }
        sys::reap_all();
        sessions.retain(|&leader| session_runs(leader));
    }
}

/// Whether the session `leader` led still runs: its leader is alive, or
/// some of its processes are left, which are killed now (and looked for
/// again at the next check, in case one forked meanwhile).
fn session_runs(leader: u32) -> bool {
    if live_session_of(leader).is_some() {
        return true;
    }
    let left: Vec<u32> = session_members(leader).collect();
    for &pid in &left {
        sys::signal(i32::try_from(pid).unwrap_or(i32::MAX), sys::SIGKILL);
    }
    !left.is_empty()
}

/// A session's command (`[--identity PATH] -- PROGRAM [ARGS...]`): tells
/// pid 1 the session began, writes its identity to `PATH` if given, then
/// runs the program in this process.
fn session(args: &[OsString]) -> ExitCode {
    const USAGE: &str = "lazaret-init session: expected `[--identity PATH] -- PROGRAM [ARGS...]`";
    let (identity_path, args) = match args {
        [flag, path, rest @ ..] if flag.to_str() == Some("--identity") => (Some(path), rest),
        _ => (None, args),
    };
    let Some((dash, [program, program_args @ ..])) = args.split_first() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    if dash.to_str() != Some("--") {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    }
    sys::signal(1, sys::SESSION_BEGAN);
    if let Some(path) = identity_path {
        record_identity(std::path::Path::new(path));
    }
    let error = Command::new(program).args(program_args).exec();
    eprintln!("lazaret: cannot run {}: {error}", program.to_string_lossy());
    ExitCode::from(if error.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    })
}

/// Writes this session leader's identity inside the sandbox (pid, process
/// group, start time in clock ticks) to `path` in its session's mailbox,
/// where the Host Coordinator records it: a `.`-named file renamed into
/// place, so the host never reads half of it. Best effort: a session
/// without a mailbox runs all the same.
fn record_identity(path: &std::path::Path) {
    let Some(identity) = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| identity(&stat))
    else {
        return;
    };
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return;
    };
    let mut part = OsString::from(".");
    part.push(name);
    part.push(".part");
    let part = dir.join(part);
    if std::fs::write(&part, identity).is_err() || std::fs::rename(&part, path).is_err() {
        let _ = std::fs::remove_file(&part);
    }
}

/// `PID PGRP STARTTIME` of a `/proc/PID/stat` line: the fields after the
/// command name are state, ppid, pgrp, ..., and the 20th is the start time.
fn identity(stat: &str) -> Option<String> {
    let pid: u32 = stat.split_once(' ')?.0.parse().ok()?;
    let (_, after) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = after.split_ascii_whitespace().collect();
    let pgrp: u32 = fields.get(2)?.parse().ok()?;
    let start: u64 = fields.get(19)?.parse().ok()?;
    Some(format!("{pid} {pgrp} {start}\n"))
}

/// The live processes whose session is `session`, from `/proc`.
fn session_members(session: u32) -> impl Iterator<Item = u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(move |&pid| live_session_of(pid) == Some(session))
}

/// The session of process `pid`, unless it is gone or a zombie.
fn live_session_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    live_session(&stat)
}

/// The session of a `/proc/PID/stat` line, unless the process is a zombie:
/// the fields after the command name (which may hold anything, so the
/// last `)` ends it) are state, ppid, process group and session.
fn live_session(stat: &str) -> Option<u32> {
    let (_, after) = stat.rsplit_once(')')?;
    let mut fields = after.split_ascii_whitespace();
    let state = fields.next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    fields.nth(2)?.parse().ok()
}
