//! How a host command ended, as its launch process tells the coordinator.
//!
//! Owns the report that crosses the launch process's report pipe: how the
//! command ended ([`Ended`]) or why it was never started ([`NotStarted`]),
//! and its bytes on that pipe. Both sides of the pipe use it: the launch
//! process ([`super::subreaper`]) writes it, the coordinator
//! ([`super::launch`]) reads it. Trusts nothing it decodes: bytes that are
//! not a report read as none.

use rustix::io::Errno;

/// The most bytes of a report.
pub const MAX_REPORT: usize = 64;

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

/// Why the launch process did not start the command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NotStarted {
    /// Its parent-death signal, its role as subreaper or its signal
    /// handlers could not be set up.
    #[error("cannot prepare its launch")]
    Prepare(#[source] Errno),
    /// The coordinator died before the parent-death signal was set.
    #[error("the coordinator ended before it started")]
    Orphaned,
    /// It was cancelled, or its session or Domain ended, while the launch
    /// process made ready.
    #[error("it was cancelled before it started")]
    Cancelled,
    /// Starting it failed (`execve(2)`, `fork(2)`).
    #[error(transparent)]
    Spawn(Errno),
    /// It started, but its launch process could not install its seccomp
    /// filter and ended it at once.
    #[error(
        "its launch process could not install its seccomp filter and ended it as it started \
         (a kernel without CONFIG_SECCOMP_FILTER, or a filter above Lazaret that forbids \
         seccomp(2))"
    )]
    Unconfined,
}

/// What the launch process reports: how the command ended, or why it
/// was not started.
pub type Report = Result<Ended, NotStarted>;

/// `report`'s bytes on the pipe.
pub fn encode_report(report: &Report) -> Vec<u8> {
    let text = match report {
        Ok(Ended::Exited(code)) => format!("exited {code}"),
        Ok(Ended::Signaled(signal)) => format!("signaled {signal}"),
        Err(NotStarted::Prepare(e)) => format!("prepare-failed {}", e.raw_os_error()),
        Err(NotStarted::Orphaned) => "orphaned".to_owned(),
        Err(NotStarted::Cancelled) => "cancelled".to_owned(),
        Err(NotStarted::Spawn(e)) => format!("spawn-failed {}", e.raw_os_error()),
        Err(NotStarted::Unconfined) => "unconfined".to_owned(),
    };
    text.into_bytes()
}

/// Reads a report; `None` when it is not one (the launch process was
/// killed before it wrote it).
pub fn decode_report(bytes: &[u8]) -> Option<Report> {
    let text = std::str::from_utf8(bytes).ok()?;
    let (kind, number) = text.split_once(' ').unwrap_or((text, ""));
    let errno = || {
        let raw = std::io::Error::from_raw_os_error(number.parse().ok()?);
        Errno::from_io_error(&raw)
    };
    Some(match (kind, number) {
        ("exited", _) => Ok(Ended::Exited(number.parse().ok()?)),
        ("signaled", _) => Ok(Ended::Signaled(number.parse().ok()?)),
        ("prepare-failed", _) => Err(NotStarted::Prepare(errno()?)),
        ("orphaned", "") => Err(NotStarted::Orphaned),
        ("cancelled", "") => Err(NotStarted::Cancelled),
        ("spawn-failed", _) => Err(NotStarted::Spawn(errno()?)),
        ("unconfined", "") => Err(NotStarted::Unconfined),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_survive_their_trip() {
        for report in [
            Ok(Ended::Exited(0)),
            Ok(Ended::Exited(255)),
            Ok(Ended::Signaled(9)),
            Err(NotStarted::Prepare(Errno::PERM)),
            Err(NotStarted::Orphaned),
            Err(NotStarted::Cancelled),
            Err(NotStarted::Spawn(Errno::NOENT)),
            Err(NotStarted::Unconfined),
        ] {
            let bytes = encode_report(&report);
            assert!(bytes.len() <= MAX_REPORT);
            assert_eq!(decode_report(&bytes), Some(report));
        }
        assert_eq!(decode_report(b""), None);
        assert_eq!(decode_report(b"exited x"), None);
        assert_eq!(decode_report(b"spawn-failed 99999"), None);
    }

    #[test]
    fn a_report_that_is_not_one_reads_as_none() {
        for bytes in [
            &b"exited"[..],
            b"exited 256",
            b"exited -1",
            b"signaled",
            b"orphaned 1",
            b"cancelled now",
            b"prepare-failed",
            b"prepare-failed x",
            b"EXITED 0",
            b"exited 0 1",
            b"\xff\xfe",
        ] {
            assert_eq!(
                decode_report(bytes),
                None,
                "{:?}",
                String::from_utf8_lossy(bytes)
            );
        }
    }

    #[test]
    fn a_signal_beyond_a_byte_is_kept_as_the_largest() {
        assert_eq!(Ended::by_signal(None), None);
        assert_eq!(Ended::by_signal(Some(9)), Some(Ended::Signaled(9)));
        assert_eq!(Ended::by_signal(Some(300)), Some(Ended::Signaled(u8::MAX)));
        assert_eq!(Ended::by_signal(Some(-1)), Some(Ended::Signaled(u8::MAX)));
    }
}
