//! The generation's network, from the Host Coordinator's side.
//!
//! Owns two things: deriving the [`DerivedNetworkPolicy`] once from the
//! resolved configuration (and sealing it in a memfd for the sidecar); and
//! the connectivity helper, `slirp4netns`, which the
//! coordinator starts on the host, attached to the Domain's enforcement
//! namespace through descriptors the supervisor sent, and holds by pidfd
//! until the generation ends. It trusts the resolved configuration and the
//! namespace descriptors (the supervisor proved their identities); it
//! trusts nothing slirp4netns prints beyond showing it to the user.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lazaret_proto::codec;
use lazaret_proto::network::{ConnectivityLink, DerivedNetworkPolicy, IpPrefix};
use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::fs::{Mode, OFlags};

use crate::config::EffectiveNetworkPolicy;
use crate::process::{HeldProcess, kill_and_wait, pidfd_of_child, wait_exit};
use crate::sys::spawn_inheriting;

/// How long slirp4netns may take to attach.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// The policy of a generation: the effective allow and deny prefixes (deny
/// holds RFC 1918), slirp4netns's DNS forwarder as the one resolver, IPv4
/// only, unlisted destinations denied. Refused when it cannot be installed
/// as written.
pub fn derive_policy(network: &EffectiveNetworkPolicy) -> Result<DerivedNetworkPolicy, String> {
    let prefix = |p: &lazaret_proto::config::Ipv4Prefix| {
        IpPrefix::ipv4(p.network(), p.prefix_len()).expect("a configuration prefix is normalized")
    };
    let policy = DerivedNetworkPolicy::ipv4_only(
        network.allow.iter().map(prefix),
        network.deny.iter().map(prefix),
        [ConnectivityLink::SLIRP4NETNS_RESOLVER],
    );
    policy.validate().map_err(|e| {
        let rule = e
            .rule_index()
            .and_then(|i| policy.prefix_rules.get(i))
            .map(|r| format!(" ({}/{})", r.network.address, r.network.prefix_len));
        format!(
            "the network policy cannot be installed{}: {e}",
            rule.unwrap_or_default()
        )
    })?;
    Ok(policy)
}

/// The policy, encoded, in a sealed memfd.
pub fn policy_memfd(policy: &DerivedNetworkPolicy) -> Result<OwnedFd, String> {
    let bytes = codec::encode(policy).map_err(|e| format!("cannot encode the policy: {e}"))?;
    lazaret_proto::memfd::sealed_bytes("lazaret-network-policy", &bytes)
        .map_err(|e| format!("cannot seal the policy in a memfd: {e}"))
}

/// A running slirp4netns attached to a generation's enforcement namespace.
#[derive(Debug)]
pub struct ConnectivityHelper {
    child: Child,
    /// Its pidfd and identity.
    pub held: HeldProcess,
    /// The write end of its exit pipe: closing it (or this process dying)
    /// ends slirp4netns.
    exit: OwnedFd,
}

impl ConnectivityHelper {
    /// Starts slirp4netns with host loopback disabled and its seccomp
    /// filter on, joined to `user_namespace` and attached to
    /// `network_namespace` with `link`'s tap device and MTU, and waits until
    /// it reports the tap attached. Its output goes to an unlinked file in
    /// `log_dir`, shown in the error if it fails. `on_spawn` records the
    /// process before it is waited for.
    pub fn start(
        user_namespace: BorrowedFd<'_>,
        network_namespace: BorrowedFd<'_>,
        link: &ConnectivityLink,
        log_dir: BorrowedFd<'_>,
        on_spawn: impl FnOnce(&HeldProcess) -> Result<(), String>,
    ) -> Result<Self, String> {
        let binary = crate::programs::slirp4netns()?;
        let log: OwnedFd = rustix::fs::openat(
            log_dir,
            ".",
            OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| format!("cannot make slirp4netns's log file: {e}"))?;
        let (ready_read, ready_write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| format!("cannot make a pipe: {e}"))?;
        let (exit_read, exit_write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| format!("cannot make a pipe: {e}"))?;
        // The child inherits these under the same numbers.
        let path = crate::config::confined::proc_self_fd;
        let number = |fd: &OwnedFd| fd.as_raw_fd().to_string();
        let mut command = Command::new(&binary);
        command
            .env_clear()
            .arg("--netns-type=path")
            .arg(format!("--userns-path={}", path(user_namespace)))
            .arg("--disable-host-loopback")
            .arg("--enable-seccomp")
            .arg(format!("--mtu={}", link.mtu))
            .arg(format!("--ready-fd={}", number(&ready_write)))
            .arg(format!("--exit-fd={}", number(&exit_read)))
            .arg(path(network_namespace))
            .arg(&link.tap_name)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().map_err(|e| e.to_string())?))
            .stderr(Stdio::from(log.try_clone().map_err(|e| e.to_string())?));
        let child = spawn_inheriting(
            &mut command,
            &[
                user_namespace,
                network_namespace,
                ready_write.as_fd(),
                exit_read.as_fd(),
            ],
        )
        .map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
        drop((ready_write, exit_read));
        let held = pidfd_of_child(&child)
            .and_then(HeldProcess::from_pidfd)
            .map_err(|e| format!("cannot hold slirp4netns: {e}"))?;
        let helper = Self {
            child,
            held,
            exit: exit_write,
        };
        let waited = on_spawn(&helper.held).and_then(|()| helper.await_ready(&ready_read));
        match waited {
            Ok(()) => Ok(helper),
            Err(why) => {
                helper.stop();
                Err(format!("{why}{}", output_of(&log)))
            }
        }
    }

    /// Waits for slirp4netns to write `1` to its ready pipe.
    fn await_ready(&self, ready: &OwnedFd) -> Result<(), String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!(
                    "slirp4netns did not attach within {} s",
                    READY_TIMEOUT.as_secs()
                ));
            }
            let spec = Timespec::try_from(left).unwrap_or(Timespec {
                tv_sec: 1,
                tv_nsec: 0,
            });
            let mut fds = [
                PollFd::new(ready, PollFlags::IN),
                PollFd::new(&self.held.pidfd, PollFlags::IN),
            ];
            match poll(&mut fds, Some(&spec)) {
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(format!("cannot wait for slirp4netns: {e}")),
                Ok(_) => {}
            }
            if !fds[0].revents().is_empty() {
                let mut byte = [0u8; 1];
                return match rustix::io::read(ready, &mut byte) {
                    Ok(1) if byte[0] == b'1' => Ok(()),
                    _ => Err("slirp4netns exited before it attached".into()),
                };
            }
            if !fds[1].revents().is_empty() {
                return Err("slirp4netns exited before it attached".into());
            }
        }
    }

    /// Ends slirp4netns: closes its exit pipe, then kills it through its
    /// pidfd if it lingers, and reaps it.
    pub fn stop(self) {
        let Self {
            mut child,
            held,
            exit,
        } = self;
        drop(exit);
        let exited = wait_exit(held.pidfd.as_fd(), Duration::from_millis(500)).unwrap_or(false);
        if !exited {
            let _ = kill_and_wait(held.pidfd.as_fd(), Duration::from_secs(5));
        }
        let _ = child.wait();
    }
}

/// What slirp4netns wrote, as the tail of an error message.
fn output_of(log: &OwnedFd) -> String {
    let mut text = Vec::new();
    let mut chunk = [0u8; 4096];
    while text.len() < 64 * 1024 {
        let offset = u64::try_from(text.len()).unwrap_or(u64::MAX);
        match rustix::io::pread(log, &mut chunk, offset) {
            Ok(0) | Err(_) => break,
            Ok(n) => text.extend_from_slice(&chunk[..n]),
        }
    }
    let text = String::from_utf8_lossy(&text);
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with("* "))
        .collect();
    let tail = &lines[lines.len().saturating_sub(6)..];
    if tail.is_empty() {
        String::new()
    } else {
        format!("; slirp4netns said: {}", tail.join(" / "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lazaret_proto::config::{Ipv4Prefix, RFC1918};
    use lazaret_proto::network::PolicyAction;
    use std::net::IpAddr;

    fn prefix(text: &str) -> Ipv4Prefix {
        Ipv4Prefix::parse(text).unwrap()
    }

    #[test]
    fn the_policy_holds_the_configuration_and_the_resolver() {
        let mut deny = RFC1918.to_vec();
        deny.push(prefix("198.18.0.0/24"));
        let policy = derive_policy(&EffectiveNetworkPolicy {
            allow: vec![prefix("198.18.0.10/32"), prefix("10.222.0.0/16")],
            deny,
        })
        .unwrap();
        let at = |a: [u8; 4]| policy.action_for(IpAddr::from(a));
        assert_eq!(at([198, 18, 0, 10]), PolicyAction::Allow);
        assert_eq!(at([198, 18, 0, 20]), PolicyAction::Deny);
        assert_eq!(at([10, 222, 1, 1]), PolicyAction::Allow);
        assert_eq!(at([10, 1, 1, 1]), PolicyAction::Deny);
        assert_eq!(at([10, 0, 2, 3]), PolicyAction::Allow);
        assert_eq!(at([8, 8, 8, 8]), PolicyAction::Deny);
        assert_eq!(policy.resolvers.len(), 1);
    }

    #[test]
    fn a_prefix_naming_the_resolver_is_refused_with_its_name() {
        let mut deny = RFC1918.to_vec();
        deny.push(prefix("10.0.2.3/32"));
        let error = derive_policy(&EffectiveNetworkPolicy {
            allow: vec![],
            deny,
        })
        .unwrap_err();
        assert!(error.contains("10.0.2.3/32"), "{error}");
    }
}
