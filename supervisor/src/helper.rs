//! Starting a least-privilege helper role (the Network Sidecar, the
//! Workspace Router) and waiting for its one report.
//!
//! Owns how a helper is found (beside this executable, never through
//! `PATH`), started (empty environment, its channel on standard input,
//! standard output on `/dev/null`, standard error shared with this process,
//! the capabilities it keeps and nothing else) and waited for (one report
//! within a bound, a silent or dead helper named as such). Trusts nothing
//! in the report beyond its shape; the callers and the Host Coordinator
//! judge it.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use lazaret_proto::channel::{ChannelError, Endpoint, pair};
use lazaret_proto::codec::WireRecord;
use rustix::thread::CapabilitySet;

use crate::sys::with_capabilities_only;

/// Why a helper could not be started or gave no report.
#[derive(Debug, thiserror::Error)]
pub enum HelperError {
    /// This executable's path is unknown, so its siblings cannot be found.
    #[error("cannot locate the supervisor's executable")]
    Locate(#[source] io::Error),
    /// The helper's executable is not beside this one.
    #[error("{name} is not installed beside {}", exe.display())]
    NotInstalled {
        /// The helper's executable name.
        name: String,
        /// This executable.
        exe: PathBuf,
    },
    /// The helper's channel could not be made.
    #[error("cannot make {what}'s channel")]
    Channel {
        /// Which helper.
        what: &'static str,
        /// Why.
        #[source]
        source: ChannelError,
    },
    /// The helper could not be started.
    #[error("cannot start {}", binary.display())]
    Spawn {
        /// Its executable.
        binary: PathBuf,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },
    /// No pidfd could be opened for the started helper.
    #[error("cannot open a pidfd for {what} (pid {pid})")]
    Pidfd {
        /// Which helper.
        what: &'static str,
        /// Its pid.
        pid: u32,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },
    /// The request could not be sent.
    #[error("cannot reach {what}")]
    Send {
        /// Which helper.
        what: &'static str,
        /// Why.
        #[source]
        source: ChannelError,
    },
    /// The helper gave no report in time.
    #[error("{what} did not answer within {seconds} s")]
    Silent {
        /// Which helper.
        what: &'static str,
        /// How long it was given.
        seconds: u64,
    },
    /// Waiting for the report failed.
    #[error("cannot wait for {what}")]
    Wait {
        /// Which helper.
        what: &'static str,
        /// What the kernel said.
        #[source]
        source: rustix::io::Errno,
    },
    /// The helper closed its channel without a report.
    #[error("{what} exited without a report; see the Domain log")]
    Exited {
        /// Which helper.
        what: &'static str,
    },
    /// The helper's seccomp filter killed it.
    #[error("{what} {}; see the Domain log", lazaret_proto::seccomp::KILLED)]
    KilledByFilter {
        /// Which helper.
        what: &'static str,
    },
    /// The report did not decode, or the channel failed.
    #[error("bad report from {what}")]
    BadReport {
        /// Which helper.
        what: &'static str,
        /// Why.
        #[source]
        source: ChannelError,
    },
}

/// A started helper and this end of its channel.
#[derive(Debug)]
pub struct Helper<S, R> {
    /// What it is, for messages (`the sidecar`).
    what: &'static str,
    child: Child,
    channel: Endpoint<S, R>,
}

/// The executable `name`, beside this one.
fn sibling(name: &str) -> Result<PathBuf, HelperError> {
    let exe = std::env::current_exe().map_err(HelperError::Locate)?;
    let path = exe.with_file_name(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(HelperError::NotInstalled {
            name: name.to_owned(),
            exe,
        })
    }
}

impl<S: WireRecord, R: WireRecord> Helper<S, R> {
    /// Starts the helper `name` (called `what` in messages) with `kept`
    /// capabilities alone, in a new network namespace when `new_network`.
    pub fn start(
        name: &str,
        what: &'static str,
        kept: CapabilitySet,
        new_network: bool,
    ) -> Result<Self, HelperError> {
        let binary = sibling(name)?;
        let (ours, theirs) =
            pair::<S, R>().map_err(|source| HelperError::Channel { what, source })?;
        let mut command = Command::new(&binary);
        command
            .env_clear()
            .stdin(Stdio::from(theirs.into_fd()))
            .stdout(Stdio::null());
        lazaret_proto::seccomp::pass_debug_variables(&mut command);
        with_capabilities_only(&mut command, kept, new_network);
        let child = command
            .spawn()
            .map_err(|source| HelperError::Spawn { binary, source })?;
        Ok(Helper {
            what,
            child,
            channel: ours,
        })
    }

    /// A pidfd of the helper, which names it for good.
    pub fn pidfd(&self) -> Result<OwnedFd, HelperError> {
        let pid = self.child.id();
        crate::pidfd_of(pid).map_err(|source| HelperError::Pidfd {
            what: self.what,
            pid,
            source,
        })
    }

    /// Sends the helper its request with its descriptors.
    pub fn send(&self, request: &S, fds: &[BorrowedFd<'_>]) -> Result<(), HelperError> {
        self.channel
            .send(request, fds)
            .map_err(|source| match source {
                ChannelError::Disconnected if self.killed_by_filter() => {
                    HelperError::KilledByFilter { what: self.what }
                }
                source => HelperError::Send {
                    what: self.what,
                    source,
                },
            })
    }

    /// The helper's one report, within `timeout`.
    pub fn report(&self, timeout: Duration) -> Result<R, HelperError> {
        let what = self.what;
        match lazaret_proto::channel::readable_within(self.channel.as_fd(), timeout) {
            Ok(true) => {}
            Ok(false) => {
                return Err(HelperError::Silent {
                    what,
                    seconds: timeout.as_secs(),
                });
            }
            Err(source) => return Err(HelperError::Wait { what, source }),
        }
        match self.channel.recv() {
            Ok(received) => Ok(received.message),
            Err(ChannelError::Disconnected) if self.killed_by_filter() => {
                Err(HelperError::KilledByFilter { what })
            }
            Err(ChannelError::Disconnected) => Err(HelperError::Exited { what }),
            Err(source) => Err(HelperError::BadReport { what, source }),
        }
    }

    /// Whether the helper, which closed its channel, ends within a second
    /// killed by `SIGSYS`. Its status stays for the reap.
    fn killed_by_filter(&self) -> bool {
        use rustix::process::{Pid, WaitId, WaitIdOptions};
        let Some(pid) = i32::try_from(self.child.id()).ok().and_then(Pid::from_raw) else {
            return false;
        };
        let until = std::time::Instant::now() + Duration::from_secs(1);
        loop {
            // Not reaped (NOWAIT): the pid names the child until `finish`.
            let options = WaitIdOptions::EXITED | WaitIdOptions::NOWAIT | WaitIdOptions::NOHANG;
            match rustix::process::waitid(WaitId::Pid(pid), options) {
                Ok(Some(status)) => return status.terminating_signal() == Some(libc::SIGSYS),
                Ok(None) if std::time::Instant::now() < until => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                _ => return false,
            }
        }
    }

    /// Ends the helper if `result` failed, and reaps it either way.
    pub fn finish<T, E>(mut self, result: Result<T, E>) -> Result<T, E> {
        if result.is_err() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        result
    }

    /// Kills the helper unless `result` succeeded; one that succeeded is
    /// left running, for the Domain pid 1's reaper.
    pub fn keep_if_ok<T, E>(mut self, result: Result<T, E>) -> Result<T, E> {
        if result.is_err() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        result
    }
}
