//! `lazaret-init`: the first process of every Lazaret sandbox.
//!
//! It holds the container open between client sessions, reaps every
//! process that ends orphaned (so no zombie piles up), and ends every
//! session's processes once the session's leader is gone: a background
//! process of a session never outlives it by more than [`SESSION_CHECK`]
//! ([`IDLE_CHECK`] for a session that began and ended while the sandbox
//! ran nothing else, between two looks); only a process that leaves the
//! session (`setsid`) does, as the leader of a session of its own. The
//! runtime stops it with SIGKILL.
//!
//! Each client session's command is what `runsc exec` starts, with nothing
//! in between (an extra `exec` inside the sandbox costs a session more
//! than the rest of its start together): the runtime makes it the leader of
//! a new session, and this process finds it in `/proc` at its next look.
//! It then writes that leader's identity (pid, process group, start time)
//! to the mailbox its `LAZARET_SESSION` variable names, once per session,
//! where the Host Coordinator records it as the sandbox's claim.
//!
//! Usage: `lazaret-init MAILBOXES VARIABLE FILE`: the directory of the
//! sessions' mailboxes, the variable naming a process's session, the file
//! the identity goes to in a mailbox (the supervisor passes the protocol's
//! names, so they are written down once).
//!
//! Built as a static executable with no dependencies beyond `std`, mounted
//! read-only in the sandbox's control area, so it runs on any image, even
//! one without a shell or a C library. Trusts nothing it reads: `/proc`
//! and the environment of a session's leader are only used to find whom
//! to kill and where a claim goes, a session is ended only once a fresh
//! look shows its leader gone, and a mailbox name must be hexadecimal.

mod sys;

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// How often pid 1 looks for new sessions and for sessions whose leader is
/// gone, while any process but itself runs.
const SESSION_CHECK: Duration = Duration::from_millis(50);

/// How often it looks while nothing else runs: waking 20 times a second
/// costs the host about 1.6% of a core (the sentry's timer and scheduling,
/// not the look), so an idle sandbox wakes 4 times a second.
const IDLE_CHECK: Duration = Duration::from_millis(250);

/// The most of a leader's environment read to find its session's name.
const ENVIRONMENT_LIMIT: u64 = 256 * 1024;

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    match args.as_slice() {
        [mailboxes, variable, file] => init(Claims {
            mailboxes: PathBuf::from(mailboxes),
            variable: variable.to_string_lossy().into_owned(),
            file: file.clone(),
            written: HashSet::new(),
        }),
        _ => {
            eprintln!("usage: lazaret-init MAILBOXES VARIABLE FILE");
            ExitCode::from(2)
        }
    }
}

/// Pid 1: reaps whatever ends, and ends what a finished session left.
fn init(claims: Claims) -> ExitCode {
    let signals = match sys::Signals::block(&[sys::SIGCHLD]) {
        Ok(signals) => signals,
        Err(e) => {
            eprintln!("lazaret-init: cannot block signals: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut sessions = Sessions {
        known: HashMap::new(),
        claims,
    };
    let mut looked = Instant::now();
    let mut pace = IDLE_CHECK;
    loop {
        // An orphan's end wakes this early, to reap it; the look at the
        // sessions keeps its own pace.
        let _ = signals.next_within(pace.saturating_sub(looked.elapsed()));
        sys::reap_all();
        if looked.elapsed() >= pace {
            sessions.look();
            looked = Instant::now();
            pace = if sessions.known.is_empty() {
                IDLE_CHECK
            } else {
                SESSION_CHECK
            };
        }
    }
}

/// What pid 1 knows of the sandbox's processes.
struct Sessions {
    /// The session of each live process, as read when it was first seen
    /// (a process may leave its session later: read again before acting).
    known: HashMap<u32, u32>,
    claims: Claims,
}

impl Sessions {
    /// One look at `/proc`: records the processes that are new (and claims
    /// the mailbox of each new session leader), then kills what is left of
    /// every session whose leader is gone.
    fn look(&mut self) {
        let live: HashSet<u32> = pids().collect();
        self.known.retain(|pid, _| live.contains(pid));
        for &pid in &live {
            if pid == 1 || self.known.contains_key(&pid) {
                continue;
            }
            let Some(stat) = read_stat(pid) else { continue };
            let Some(session) = live_session(&stat) else { continue };
            self.known.insert(pid, session);
            if session == pid {
                self.claims.claim(pid, &stat);
            }
        }
        // A session is over when its leader is not among the live
        // processes as its leader; sessions 0 and 1 are the runtime's and
        // this process's own.
        let over: HashSet<u32> = self
            .known
            .values()
            .copied()
            .filter(|&s| s > 1 && self.known.get(&s) != Some(&s))
            .collect();
        for session in over {
            if live_session_of(session) == Some(session) {
                // Its leader became one after it was first seen.
                self.known.insert(session, session);
                continue;
            }
            let members: Vec<u32> = self
                .known
                .iter()
                .filter(|&(_, &s)| s == session)
                .map(|(&pid, _)| pid)
                .collect();
            for pid in members {
                match live_session_of(pid) {
                    Some(now) if now == session => {
                        sys::signal(i32::try_from(pid).unwrap_or(i32::MAX), sys::SIGKILL);
                    }
                    // It left the session since: it is what it is now.
                    Some(now) => {
                        self.known.insert(pid, now);
                    }
                    None => {
                        self.known.remove(&pid);
                    }
                }
            }
        }
    }
}

/// Where each session leader's identity is written, and the sessions whose
/// identity was.
struct Claims {
    mailboxes: PathBuf,
    variable: String,
    file: OsString,
    written: HashSet<String>,
}

impl Claims {
    /// Writes the identity of the session leader `pid` (whose stat line is
    /// `stat`) to the mailbox its environment names, once per mailbox: a
    /// `.`-named file renamed into place, so the host never reads half of
    /// it. Best effort: a session without a mailbox runs all the same.
    fn claim(&mut self, pid: u32, stat: &str) {
        let Some(name) = self.session_name(pid) else {
            return;
        };
        if self.written.contains(&name) {
            return;
        }
        let Some(identity) = identity(stat) else {
            return;
        };
        let dir = self.mailboxes.join(&name);
        let mut part = OsString::from(".");
        part.push(&self.file);
        part.push(".part");
        let part = dir.join(part);
        if std::fs::write(&part, identity).is_ok()
            && std::fs::rename(&part, dir.join(&self.file)).is_ok()
        {
            self.written.insert(name);
        } else {
            let _ = std::fs::remove_file(&part);
        }
    }

    /// The session name in `pid`'s environment, if it is one a mailbox
    /// can have: lowercase hexadecimal, nothing that leads elsewhere.
    fn session_name(&self, pid: u32) -> Option<String> {
        let mut environment = Vec::new();
        std::fs::File::open(format!("/proc/{pid}/environ"))
            .ok()?
            .take(ENVIRONMENT_LIMIT)
            .read_to_end(&mut environment)
            .ok()?;
        let prefix = format!("{}=", self.variable);
        environment
            .split(|&b| b == 0)
            .filter_map(|entry| entry.strip_prefix(prefix.as_bytes()))
            .next_back()
            .filter(|value| is_mailbox_name(value))
            .map(|value| String::from_utf8_lossy(value).into_owned())
    }
}

/// Whether `name` is a mailbox's name: 1 to 64 lowercase hex digits.
fn is_mailbox_name(name: &[u8]) -> bool {
    (1..=64).contains(&name.len()) && name.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
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

/// The pids `/proc` lists.
fn pids() -> impl Iterator<Item = u32> {
    std::fs::read_dir(Path::new("/proc"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
}

fn read_stat(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()
}

/// The session of process `pid`, unless it is gone or a zombie.
fn live_session_of(pid: u32) -> Option<u32> {
    live_session(&read_stat(pid)?)
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
