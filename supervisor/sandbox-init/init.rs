//! `lazaret-init`: the first process of every Lazaret sandbox, and the
//! leader of every client session in it.
//!
//! - `lazaret-init` (pid 1) holds the container open between client
//!   sessions and reaps every process that ends orphaned, so no zombie
//!   piles up. The runtime stops it with SIGKILL.
//! - `lazaret-init session [--terminal] -- PROGRAM [ARGS...]` is what each
//!   session's `runsc exec` starts: the leader of a new session (the runtime
//!   makes every exec'd process one), it runs the program as its child,
//!   passes on the signals the Runtime Supervisor sends it, and when the
//!   program ends — or on SIGHUP, the client being gone — kills every
//!   process left in its session before it exits with the program's
//!   status. A background process of a session never outlives it; only a
//!   process that leaves the session (`setsid`) does.
//!
//! Built as a static executable with no dependencies beyond `std`, mounted
//! read-only in the sandbox's control area, so it runs on any image, even
//! one without a shell or a C library. Trusts nothing it reads: `/proc` is
//! only used to find whom to kill.

mod sys;

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, ExitCode};
use std::time::Duration;

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    match args.first().and_then(|a| a.to_str()) {
        None => init(),
        Some("session") => session(&args[1..]),
        Some(_) => {
            eprintln!("usage: lazaret-init | lazaret-init session [--terminal] -- PROGRAM [ARGS...]");
            ExitCode::from(2)
        }
    }
}

/// Pid 1: reaps whatever ends, forever.
fn init() -> ExitCode {
    loop {
        if sys::reap_any().is_err() {
            // No child now; orphans are adopted later.
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

/// A session leader: runs `args` (after `--`), passes signals on, and
/// ends the session with it.
fn session(args: &[OsString]) -> ExitCode {
    let (terminal, rest) = match args.first().and_then(|a| a.to_str()) {
        Some("--terminal") => (true, &args[1..]),
        _ => (false, args),
    };
    let Some(("--", [program, program_args @ ..])) = rest
        .split_first()
        .map(|(dash, tail)| (dash.to_str().unwrap_or(""), tail))
    else {
        eprintln!("lazaret-init session: expected `-- PROGRAM [ARGS...]`");
        return ExitCode::from(2);
    };
    // Blocked before the program starts, so none is lost; the program
    // starts with none blocked.
    let signals = match sys::Signals::block(&[
        sys::SIGHUP,
        sys::SIGINT,
        sys::SIGQUIT,
        sys::SIGTERM,
        sys::SIGCHLD,
        sys::SIGTSTP,
        sys::SIGTTIN,
        sys::SIGTTOU,
    ]) {
        Ok(signals) => signals,
        Err(e) => {
            eprintln!("lazaret-init session: cannot block signals: {e}");
            return ExitCode::from(126);
        }
    };
    let mut command = Command::new(program);
    command.args(program_args);
    sys::Signals::unblocked_in_child(&mut command);
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!("lazaret: cannot run {}: {e}", program.to_string_lossy());
            let code = if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 };
            return ExitCode::from(code);
        }
    };
    let pid = i32::try_from(child.id()).unwrap_or(i32::MAX);
    let code = loop {
        match signals.next() {
            sys::SIGCHLD => match child.try_wait() {
                Ok(Some(status)) => {
                    break status
                        .code()
                        .or(status.signal().map(|s| 128 + s))
                        .unwrap_or(255);
                }
                Ok(None) => {}
                Err(_) => break 255,
            },
            // The client is gone, or the terminal hung up.
            sys::SIGHUP => break 128 + sys::SIGHUP,
            // With a terminal, ^C, ^\ and ^Z reach the terminal's
            // foreground process group by themselves; what the supervisor
            // sends (its client's SIGTERM) is passed on.
            sys::SIGTERM => sys::signal(pid, sys::SIGTERM),
            signal @ (sys::SIGINT | sys::SIGQUIT) if !terminal => sys::signal(pid, signal),
            _ => {}
        }
    };
    end_session();
    // Reap the program if it is still there (killed above).
    let _ = child.try_wait();
    ExitCode::from(u8::try_from(code).unwrap_or(u8::MAX))
}

/// Kills every other process of this process's session, until none is
/// left (a process may fork while it is being killed); bounded.
fn end_session() {
    let me = std::process::id();
    for _ in 0..200 {
        let members: Vec<u32> = session_members(me).filter(|&pid| pid != me).collect();
        if members.is_empty() {
            return;
        }
        for pid in members {
            sys::signal(i32::try_from(pid).unwrap_or(i32::MAX), sys::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The live processes whose session is `session`, from `/proc`.
fn session_members(session: u32) -> impl Iterator<Item = u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(move |&pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| live_session(&stat))
                == Some(session)
        })
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
