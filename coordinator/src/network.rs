//! The generation's network, from the Host Coordinator's side.
//!
//! Owns three things: the platform's denials, special-purpose IPv4 ranges
//! and the host's own addresses that no profile reaches (read over netlink
//! at `up`); deriving the [`DerivedNetworkPolicy`] once from the resolved
//! configuration and those denials (and sealing it in a memfd for the
//! sidecar); and
//! the connectivity helper, `slirp4netns`, which the
//! coordinator starts on the host, attached to the Domain's enforcement
//! namespace through descriptors the supervisor sent, and holds by pidfd
//! until the generation ends. It trusts the resolved configuration and the
//! namespace descriptors (the supervisor proved their identities); it
//! trusts nothing slirp4netns prints beyond showing it to the user.

use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use lazaret_proto::codec;
use lazaret_proto::network::{ConnectivityLink, DerivedNetworkPolicy, IpPrefix};
use rustix::fs::{Mode, OFlags};

use crate::config::EffectiveNetworkPolicy;
use crate::process::{HeldProcess, kill_and_wait, pidfd_of_child, wait_exit};
use crate::sys::{ChildSetup, spawn_inheriting};

/// The special-purpose IPv4 ranges the platform denies whatever a profile
/// allows (`allow_egress = ["0.0.0.0/0"]` included): only a strictly
/// longer allow reaches into one. Loopback (127.0.0.0/8) is not among
/// them: it never leaves the sandbox's own namespace.
pub const SPECIAL_PURPOSE: [([u8; 4], u8); 7] = [
    // "This network".
    ([0, 0, 0, 0], 8),
    // Shared address space: carrier-grade NAT, Tailscale.
    ([100, 64, 0, 0], 10),
    // Link-local, with cloud metadata at 169.254.169.254.
    ([169, 254, 0, 0], 16),
    // IETF protocol assignments.
    ([192, 0, 0, 0], 24),
    // Multicast.
    ([224, 0, 0, 0], 4),
    // Reserved.
    ([240, 0, 0, 0], 4),
    // Limited broadcast.
    ([255, 255, 255, 255], 32),
];

/// The platform's denials for a host with `host_addresses`: the special
/// ranges and each host address as a /32 (but loopback, which the special
/// ranges leave to the namespace, and slirp4netns's resolver, whose own
/// route must stay), sorted.
pub fn platform_deny(host_addresses: &[Ipv4Addr]) -> Vec<IpPrefix> {
    let special = SPECIAL_PURPOSE
        .iter()
        .filter_map(|&(octets, len)| IpPrefix::ipv4(octets, len));
    let hosts = host_addresses
        .iter()
        .filter(|a| !a.is_loopback() && **a != ConnectivityLink::SLIRP4NETNS_RESOLVER)
        .map(|a| IpPrefix::host(IpAddr::V4(*a)));
    let mut prefixes: Vec<IpPrefix> = special.chain(hosts).collect();
    prefixes.sort();
    prefixes.dedup();
    prefixes
}

/// The host's own IPv4 addresses, from an `RTM_GETADDR` dump of the
/// network namespace this process runs in.
pub fn host_addresses() -> Result<Vec<Ipv4Addr>, String> {
    use futures_util::TryStreamExt;
    use rtnetlink::packet_route::address::AddressAttribute;
    let failed = |e: &dyn std::fmt::Display| format!("cannot read the host's addresses: {e}");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .map_err(|e| failed(&e))?;
    runtime.block_on(async {
        let (connection, handle, _) = rtnetlink::new_connection().map_err(|e| failed(&e))?;
        tokio::spawn(connection);
        let messages: Vec<_> = handle
            .address()
            .get()
            .execute()
            .try_collect()
            .await
            .map_err(|e| failed(&e))?;
        let mut addresses: Vec<Ipv4Addr> = messages
            .iter()
            .flat_map(|m| &m.attributes)
            .filter_map(|a| match a {
                AddressAttribute::Address(IpAddr::V4(a))
                | AddressAttribute::Local(IpAddr::V4(a)) => Some(*a),
                _ => None,
            })
            .collect();
        addresses.sort();
        addresses.dedup();
        Ok(addresses)
    })
}

/// The network a generation gets: its policy, and which of its denials are
/// the platform's.
#[derive(Debug)]
pub struct PlannedNetwork {
    /// The policy to install.
    pub policy: DerivedNetworkPolicy,
    /// The platform's denials in it ([`platform_deny`]).
    pub platform_deny: Vec<IpPrefix>,
}

impl PlannedNetwork {
    /// The policy `up` installs on a host with `host_addresses`: the
    /// configuration's, with the platform's denials.
    pub fn new(
        network: &EffectiveNetworkPolicy,
        host_addresses: &[Ipv4Addr],
    ) -> Result<Self, String> {
        let platform_deny = platform_deny(host_addresses);
        let policy = derive_policy(network, &platform_deny)?;
        Ok(Self {
            policy,
            platform_deny,
        })
    }
}

/// The policy of a generation: the effective allow and deny prefixes (deny
/// holds RFC 1918) and the platform's denials, slirp4netns's DNS forwarder
/// as the one resolver, IPv4 only, unlisted destinations denied. An allow
/// naming exactly a platform-denied network gives way to the denial (only a
/// longer one reaches into it). Refused when it cannot be installed as
/// written.
pub fn derive_policy(
    network: &EffectiveNetworkPolicy,
    platform: &[IpPrefix],
) -> Result<DerivedNetworkPolicy, String> {
    let prefix = |p: &lazaret_proto::config::Ipv4Prefix| {
        IpPrefix::ipv4(p.network(), p.prefix_len()).expect("a configuration prefix is normalized")
    };
    let policy = DerivedNetworkPolicy::ipv4_only(
        network
            .allow
            .iter()
            .map(prefix)
            .filter(|allowed| !platform.contains(allowed)),
        network
            .deny
            .iter()
            .map(prefix)
            .chain(platform.iter().copied()),
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

/// A running slirp4netns attached (or attaching) to a generation's
/// enforcement namespace.
#[derive(Debug)]
pub struct ConnectivityHelper {
    child: Child,
    /// Its pidfd and identity.
    pub held: HeldProcess,
    /// The write end of its exit pipe: closing it (or this process dying)
    /// ends slirp4netns.
    exit: OwnedFd,
    /// What it writes, kept for the error that explains its failure.
    log: OwnedFd,
}

impl ConnectivityHelper {
    /// Starts slirp4netns with host loopback disabled and its seccomp
    /// filter on, joined to `user_namespace` and attached to
    /// `network_namespace` with `link`'s tap device and MTU. It writes `1`
    /// to `ready` (the write end of a pipe) once the tap device is
    /// attached: the Network Sidecar, which holds the read end, waits for
    /// that, so this does not. Its output goes to an unlinked file in
    /// `log_dir`, shown by [`ConnectivityHelper::explain`].
    pub fn start(
        user_namespace: BorrowedFd<'_>,
        network_namespace: BorrowedFd<'_>,
        link: &ConnectivityLink,
        log_dir: BorrowedFd<'_>,
        ready: OwnedFd,
    ) -> Result<Self, String> {
        let binary = crate::programs::slirp4netns()?;
        let log: OwnedFd = rustix::fs::openat(
            log_dir,
            ".",
            OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| format!("cannot make slirp4netns's log file: {e}"))?;
        let (exit_read, exit_write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| format!("cannot make a pipe: {e}"))?;
        // The child inherits these under the same numbers.
        let path = crate::config::confined::proc_self_fd;
        let number = |fd: &OwnedFd| fd.as_raw_fd().to_string();
        let mut command = Command::new(&binary);
        command
            .env_clear()
            .arg("--netns-type=path")
            .arg("--disable-host-loopback")
            .arg("--enable-seccomp")
            .arg("--enable-sandbox")
            .arg(format!("--mtu={}", link.mtu))
            .arg(format!("--ready-fd={}", number(&ready)))
            .arg(format!("--exit-fd={}", number(&exit_read)))
            .arg(path(network_namespace))
            .arg(&link.tap_name)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().map_err(|e| e.to_string())?))
            .stderr(Stdio::from(log.try_clone().map_err(|e| e.to_string())?));
        // It starts in the Domain user namespace, root there: that lets
        // `--enable-sandbox` give it a mount namespace of its own with
        // only /etc and /run of the host, read-only (this slirp4netns
        // joins only a target pid's user namespace for its sandbox, not
        // `--userns-path`'s, and fails as an ordinary user).
        let child = spawn_inheriting(
            &mut command,
            ChildSetup {
                fds: &[network_namespace, ready.as_fd(), exit_read.as_fd()],
                user_namespace: Some(user_namespace),
                die_with_parent: false,
            },
        )
        .map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
        // Only slirp4netns holds the write end now: its exit is the end
        // of the pipe.
        drop((ready, exit_read));
        // Failing here drops the exit pipe's write end, which ends it.
        let held = pidfd_of_child(&child)
            .and_then(HeldProcess::from_pidfd)
            .map_err(|e| format!("cannot hold slirp4netns: {e}"))?;
        Ok(Self {
            child,
            held,
            exit: exit_write,
            log,
        })
    }

    /// Why it failed to attach, if it has exited: what it wrote. Asked once
    /// a failure has come back through the sidecar and the supervisor, long
    /// after its pidfd reported the exit that closed its ready pipe, so
    /// this does not wait.
    pub fn explain(&self) -> Option<String> {
        let exited = wait_exit(self.held.pidfd.as_fd(), Duration::ZERO).unwrap_or(false);
        exited.then(|| format!("slirp4netns exited{}", output_of(&self.log)))
    }

    /// Ends slirp4netns: closes its exit pipe, then kills it through its
    /// pidfd if it lingers, and reaps it.
    pub fn stop(self) {
        let Self {
            mut child,
            held,
            exit,
            log: _,
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
        let policy = derive_policy(
            &EffectiveNetworkPolicy {
                allow: vec![prefix("198.18.0.10/32"), prefix("10.222.0.0/16")],
                deny,
            },
            &[],
        )
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
        let error = derive_policy(
            &EffectiveNetworkPolicy {
                allow: vec![],
                deny,
            },
            &[],
        )
        .unwrap_err();
        assert!(error.contains("10.0.2.3/32"), "{error}");
    }

    #[test]
    fn the_platform_denies_special_ranges_and_host_addresses_under_any_allow() {
        let host = [
            [192, 0, 2, 7],
            [127, 0, 0, 1],
            [10, 0, 2, 3],
            [203, 0, 113, 9],
        ]
        .map(Ipv4Addr::from);
        let planned = PlannedNetwork::new(
            &EffectiveNetworkPolicy {
                allow: vec![
                    prefix("0.0.0.0/0"),
                    // Exactly a platform range: the denial stands.
                    prefix("100.64.0.0/10"),
                    // Strictly longer: reaches into it.
                    prefix("169.254.10.0/24"),
                ],
                deny: RFC1918.to_vec(),
            },
            &host,
        )
        .unwrap();
        let at = |a: [u8; 4]| planned.policy.action_for(IpAddr::from(a));
        for denied in [
            [169, 254, 169, 254],
            [100, 100, 100, 200],
            [224, 0, 0, 251],
            [239, 255, 255, 250],
            [255, 255, 255, 255],
            [240, 0, 0, 1],
            [0, 0, 0, 1],
            [192, 0, 0, 170],
            [192, 0, 2, 7],
            [203, 0, 113, 9],
            [10, 1, 2, 3],
        ] {
            assert_eq!(at(denied), PolicyAction::Deny, "{denied:?}");
        }
        for allowed in [
            [1, 1, 1, 1],
            [169, 254, 10, 5],
            [192, 0, 2, 8],
            [10, 0, 2, 3],
        ] {
            assert_eq!(at(allowed), PolicyAction::Allow, "{allowed:?}");
        }
        // Loopback and the resolver are never among the platform's /32s.
        let shown: Vec<String> = planned
            .platform_deny
            .iter()
            .map(|p| format!("{}/{}", p.address, p.prefix_len))
            .collect();
        assert!(shown.contains(&"192.0.2.7/32".to_owned()), "{shown:?}");
        assert!(
            !shown
                .iter()
                .any(|p| p.starts_with("127.") || p == "10.0.2.3/32"),
            "{shown:?}"
        );
    }

    #[test]
    fn the_host_addresses_are_read() {
        let addresses = host_addresses().unwrap();
        assert!(
            addresses.contains(&Ipv4Addr::LOCALHOST),
            "loopback is among {addresses:?}"
        );
    }
}
