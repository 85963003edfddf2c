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

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use lazaret_proto::channel::{ChannelError, Endpoint, pair};
use lazaret_proto::codec::WireRecord;
use lazaret_proto::error_chain as chain;
use rustix::thread::CapabilitySet;

use crate::sys::with_capabilities_only;

/// A started helper and this end of its channel.
#[derive(Debug)]
pub struct Helper<S, R> {
    /// What it is, for messages (`the sidecar`).
    what: &'static str,
    child: Child,
    channel: Endpoint<S, R>,
}

/// The executable `name`, beside this one.
fn sibling(name: &str) -> Result<PathBuf, String> {
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot locate the supervisor's executable: {e}"))?;
    let path = exe.with_file_name(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!("{name} is not installed beside {}", exe.display()))
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
    ) -> Result<Self, String> {
        let binary = sibling(name)?;
        let (ours, theirs) =
            pair::<S, R>().map_err(|e| format!("cannot make {what}'s channel: {}", chain(&e)))?;
        let mut command = Command::new(&binary);
        command
            .env_clear()
            .stdin(Stdio::from(theirs.into_fd()))
            .stdout(Stdio::null());
        with_capabilities_only(&mut command, kept, new_network);
        let child = command
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
        Ok(Helper {
            what,
            child,
            channel: ours,
        })
    }

    /// A pidfd of the helper, which names it for good.
    pub fn pidfd(&self) -> Result<OwnedFd, String> {
        let pid = self.child.id();
        crate::pidfd_of(pid)
            .map_err(|e| format!("cannot open a pidfd for {} (pid {pid}): {e}", self.what))
    }

    /// Sends the helper its request with its descriptors.
    pub fn send(&self, request: &S, fds: &[BorrowedFd<'_>]) -> Result<(), String> {
        self.channel
            .send(request, fds)
            .map_err(|e| format!("cannot reach {}: {}", self.what, chain(&e)))
    }

    /// The helper's one report, within `timeout`.
    pub fn report(&self, timeout: Duration) -> Result<R, String> {
        match lazaret_proto::channel::readable_within(self.channel.as_fd(), timeout) {
            Ok(true) => {}
            Ok(false) => {
                return Err(format!(
                    "{} did not answer within {} s",
                    self.what,
                    timeout.as_secs()
                ));
            }
            Err(e) => return Err(format!("cannot wait for {}: {e}", self.what)),
        }
        match self.channel.recv() {
            Ok(received) => Ok(received.message),
            Err(ChannelError::Disconnected) => Err(format!(
                "{} exited without a report; see the Domain log",
                self.what
            )),
            Err(e) => Err(format!("bad report from {}: {}", self.what, chain(&e))),
        }
    }

    /// Ends the helper if `result` failed, and reaps it either way.
    pub fn finish<T>(mut self, result: Result<T, String>) -> Result<T, String> {
        if result.is_err() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        result
    }

    /// Kills the helper unless `result` succeeded; one that succeeded is
    /// left running, for the Domain pid 1's reaper.
    pub fn keep_if_ok<T>(mut self, result: Result<T, String>) -> Result<T, String> {
        if result.is_err() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        result
    }
}
