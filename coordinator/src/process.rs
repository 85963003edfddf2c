//! Process identity: naming a process by its pidfd, and proving a recorded
//! identity again before acting on it.
//!
//! Owns the translation between a live pidfd and the durable
//! `PidfsProcessAuthorityV1` / `PidfsProcessIdentityV1` records. On this
//! kernel pidfds live on pidfs, where the inode of a pidfd names its process
//! for the life of the boot; a recorded identity is proven by opening a new
//! pidfd for the recorded pid and requiring the same boot, device and inode.
//! Nothing here signals a bare pid: a signal goes only to a proven pidfd.
//! Trusts the kernel's `/proc` and pidfs answers, nothing recorded.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use lazaret_proto::channel::readable_within;
use lazaret_proto::process::{
    BootId, HostProcessIdentity, PersistedHostProcessOwnership, PidfsProcessAuthorityV1,
    PidfsProcessIdentityV1,
};
use rustix::process::{Pid, PidfdFlags, Signal, pidfd_open, pidfd_send_signal};

/// The magic number of pidfs (`fstatfs(2)` `f_type`).
const PIDFS_MAGIC: u64 = 0x5049_4446;

/// A process held by its pidfd, with its durable identity.
#[derive(Debug)]
pub struct HeldProcess {
    /// The pidfd.
    pub pidfd: OwnedFd,
    /// Under which boot and pidfs inode it is named.
    pub authority: PidfsProcessAuthorityV1,
    /// Its pid and start time.
    pub identity: PidfsProcessIdentityV1,
}

impl HeldProcess {
    /// Names the process behind `pidfd`.
    pub fn from_pidfd(pidfd: OwnedFd) -> io::Result<Self> {
        let statfs = rustix::fs::fstatfs(&pidfd)?;
        if statfs.f_type as u64 != PIDFS_MAGIC {
            return Err(io::Error::other("the descriptor is not a pidfd on pidfs"));
        }
        let stat = rustix::fs::fstat(&pidfd)?;
        let host_pid = fdinfo_pid(pidfd.as_fd())?;
        let start_time_ticks = start_time(host_pid)?;
        Ok(Self {
            authority: PidfsProcessAuthorityV1 {
                boot_id: boot_id()?,
                pidfs_st_dev: stat.st_dev,
                pidfs_st_ino: stat.st_ino,
            },
            identity: PidfsProcessIdentityV1 {
                host_pid,
                start_time_ticks,
            },
            pidfd,
        })
    }

    /// Names this process.
    pub fn current() -> io::Result<Self> {
        let pidfd = pidfd_open(rustix::process::getpid(), PidfdFlags::empty())?;
        Self::from_pidfd(pidfd)
    }

    /// Whether the process is stopped (by SIGSTOP, a terminal's stop or a
    /// tracer): it runs no code until continued, so whatever waits on it
    /// waits. A process that exited is not stopped; the pid's state counts
    /// only while the pidfd still names that pid with the same start time.
    pub fn stopped(&self) -> bool {
        let pid = self.identity.host_pid;
        let Ok(stat) = ProcStat::read(pid) else {
            return false;
        };
        matches!(stat.state(), Some("T" | "t"))
            && stat.start_time() == Some(self.identity.start_time_ticks)
            && fdinfo_pid(self.pidfd.as_fd()).is_ok_and(|now| now == pid)
    }

    /// The durable record of this process, committed.
    pub fn committed(&self) -> PersistedHostProcessOwnership {
        PersistedHostProcessOwnership::Committed(self.record())
    }

    /// The durable identity of this process.
    pub fn record(&self) -> HostProcessIdentity {
        HostProcessIdentity::PidfsV1 {
            authority: self.authority,
            identity: self.identity,
        }
    }
}

/// The current boot's id, read once per process: it cannot change while
/// the process runs.
pub fn boot_id() -> io::Result<BootId> {
    static BOOT_ID: std::sync::OnceLock<BootId> = std::sync::OnceLock::new();
    if let Some(id) = BOOT_ID.get() {
        return Ok(*id);
    }
    let path = "/proc/sys/kernel/random/boot_id";
    let text = std::fs::read_to_string(path)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot read {path}: {e}")))?;
    let id = BootId::parse_kernel_text(text.trim())
        .ok_or_else(|| io::Error::other(format!("{path} does not hold a boot id")))?;
    Ok(*BOOT_ID.get_or_init(|| id))
}

/// The pid (in this process's pid namespace) of the process behind a pidfd,
/// from `/proc/self/fdinfo`. Zero or less means it has exited.
fn fdinfo_pid(pidfd: BorrowedFd<'_>) -> io::Result<u32> {
    let text = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd()))?;
    text.lines()
        .find_map(|line| line.strip_prefix("Pid:"))
        .and_then(|pid| pid.trim().parse::<i64>().ok())
        .and_then(|pid| u32::try_from(pid).ok().filter(|p| *p > 0))
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "the process has exited"))
}

/// This process's durable identity: by pidfs inode where pidfds live on
/// pidfs, else by pid and start time (for display only).
pub fn own_identity() -> io::Result<HostProcessIdentity> {
    if let Ok(held) = HeldProcess::current() {
        return Ok(held.record());
    }
    let host_pid = rustix::process::getpid()
        .as_raw_nonzero()
        .get()
        .unsigned_abs();
    Ok(HostProcessIdentity::LegacyUnverifiedV1(
        lazaret_proto::process::LegacyUnverifiedProcessIdentityV1 {
            host_pid,
            start_time_ticks: start_time(host_pid)?,
        },
    ))
}

/// The start time of process `pid`, in clock ticks since boot.
fn start_time(pid: u32) -> io::Result<u64> {
    ProcStat::read(pid)?
        .start_time()
        .ok_or_else(|| io::Error::other(format!("/proc/{pid}/stat holds no start time")))
}

/// A process's `/proc/PID/stat` (proc(5)): the fields after its command's
/// name. The name is in parentheses and may hold anything, spaces and `)`
/// among it, so the fields are those after the last `)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcStat {
    /// The text after the name's closing `)`.
    fields: String,
}

impl ProcStat {
    /// Reads `/proc/PID/stat` of `pid`.
    pub fn read(pid: u32) -> io::Result<Self> {
        let path = format!("/proc/{pid}/stat");
        let bytes = std::fs::read(&path)?;
        Self::parse(&bytes).ok_or_else(|| io::Error::other(format!("{path} is not a stat file")))
    }

    /// The fields of a `stat` file's text; `None` when it has no name.
    pub fn parse(stat: &[u8]) -> Option<Self> {
        let close = stat.iter().rposition(|b| *b == b')')?;
        let fields = std::str::from_utf8(&stat[close + 1..]).ok()?;
        Some(Self {
            fields: fields.to_owned(),
        })
    }

    /// Field `n` as proc(5) numbers them (the state is field 3).
    fn field(&self, n: usize) -> Option<&str> {
        self.fields.split_ascii_whitespace().nth(n.checked_sub(3)?)
    }

    /// Field 3, the state: `R` running, `S` sleeping, `T` stopped, `t`
    /// stopped by a tracer, `Z` a zombie, and more.
    pub fn state(&self) -> Option<&str> {
        self.field(3)
    }

    /// Field 4, the parent's pid.
    pub fn parent(&self) -> Option<Pid> {
        Pid::from_raw(self.field(4)?.parse().ok()?)
    }

    /// Field 22, the start time in clock ticks since boot.
    pub fn start_time(&self) -> Option<u64> {
        self.field(22)?.parse().ok()
    }
}

/// What proving a recorded identity found.
#[derive(Debug)]
pub enum Proof {
    /// The recorded process is alive (or not yet reaped); here is a fresh
    /// pidfd for it.
    Alive(OwnedFd),
    /// No process with the recorded identity exists any more.
    Gone,
    /// The record is of another boot, or unverifiable; nothing may be done
    /// with it.
    Unprovable,
}

/// Proves a recorded identity against the live system.
pub fn prove(record: &HostProcessIdentity) -> io::Result<Proof> {
    let HostProcessIdentity::PidfsV1 {
        authority,
        identity,
    } = record
    else {
        return Ok(Proof::Unprovable);
    };
    if authority.boot_id != boot_id()? {
        // Every process of an earlier boot is gone.
        return Ok(Proof::Gone);
    }
    let Some(pid) = i32::try_from(identity.host_pid)
        .ok()
        .and_then(Pid::from_raw)
    else {
        return Ok(Proof::Unprovable);
    };
    let pidfd = match pidfd_open(pid, PidfdFlags::empty()) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::SRCH) => return Ok(Proof::Gone),
        Err(e) => return Err(e.into()),
    };
    let stat = rustix::fs::fstat(&pidfd)?;
    if stat.st_dev == authority.pidfs_st_dev && stat.st_ino == authority.pidfs_st_ino {
        Ok(Proof::Alive(pidfd))
    } else {
        // The pid now names a different process.
        Ok(Proof::Gone)
    }
}

/// Waits until the process behind `pidfd` exits, up to `timeout`. Returns
/// whether it exited.
pub fn wait_exit(pidfd: BorrowedFd<'_>, timeout: Duration) -> io::Result<bool> {
    Ok(readable_within(pidfd, timeout)?)
}

/// Whether `fd` becomes readable within `timeout` (`poll(2)`; zero asks
/// whether it is readable now).
pub fn readable(fd: BorrowedFd<'_>, timeout: Duration) -> bool {
    readable_within(fd, timeout).unwrap_or(false)
}

/// Sends SIGKILL to a proven pidfd and waits for the process to exit.
pub fn kill_and_wait(pidfd: BorrowedFd<'_>, timeout: Duration) -> io::Result<bool> {
    match pidfd_send_signal(pidfd, Signal::KILL) {
        Ok(()) | Err(rustix::io::Errno::SRCH) => {}
        Err(e) => return Err(e.into()),
    }
    wait_exit(pidfd, timeout)
}

/// The pidfd of a spawned child that has not been waited for.
pub fn pidfd_of_child(child: &std::process::Child) -> io::Result<OwnedFd> {
    let pid = i32::try_from(child.id())
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
    // The child is not yet reaped, so its pid cannot name another process.
    rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).map_err(Into::into)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_is_read_past_any_name() {
        let stat = ProcStat::parse(b"1234 (a) b (c) S 77 1234 1234 0 -1");
        assert_eq!(stat.as_ref().and_then(ProcStat::parent), Pid::from_raw(77));
        assert_eq!(stat.as_ref().and_then(ProcStat::state), Some("S"));
        assert_eq!(stat.as_ref().and_then(ProcStat::start_time), None);
        assert_eq!(ProcStat::parse(b"1 (x").and_then(|s| s.parent()), None);
        let own = ProcStat::read(std::process::id()).expect("this process's stat");
        assert!(own.parent().is_some() && own.start_time().is_some());
    }
}
