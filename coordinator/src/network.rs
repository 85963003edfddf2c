//! The generation's network, from the Host Coordinator's side.
//!
//! Owns three things: the platform's denials, special-purpose IPv4 ranges,
//! the host's own addresses and the host's neighbourhood (its on-link
//! prefixes and default gateways) that no broad allow reaches (read over
//! netlink at `up`); deriving the [`DerivedNetworkPolicy`] once from the
//! resolved configuration and those denials (and sealing it in a memfd for
//! the sidecar); and
//! the connectivity helper, `slirp4netns`, which the
//! coordinator starts on the host, attached to the Domain's enforcement
//! namespace through descriptors the supervisor sent, and holds by pidfd
//! until the generation ends. It trusts the resolved configuration, the
//! kernel's answers about the host's own network and the namespace
//! descriptors (the supervisor proved their identities); it trusts nothing
//! slirp4netns prints beyond showing it to the user.

use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use lazaret_proto::codec::{self, EncodeError};
use lazaret_proto::names::DnsMode;
use lazaret_proto::network::{
    ConnectivityLink, DerivedNetworkPolicy, IpPrefix, NamedEgress, PolicyError,
};
use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

use crate::config::EffectiveNetworkPolicy;
use crate::process::{HeldProcess, kill_and_wait, pidfd_of_child, wait_exit};
use crate::sys::{ChildSetup, spawn_inheriting};
use lazaret_hostfs::programs::ProgramError;

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

/// The routing table of the kernel's local and broadcast routes.
const TABLE_LOCAL: u32 = 255;

/// The host's own network, as `up` reads it in the network namespace the
/// coordinator runs in (the host's).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostNetwork {
    /// The host's own IPv4 addresses.
    pub addresses: Vec<Ipv4Addr>,
    /// The prefixes on the host's links: its addresses' subnets and its
    /// routes without a gateway (where its neighbours are).
    pub on_link: Vec<IpPrefix>,
    /// The gateways of the host's default routes.
    pub gateways: Vec<Ipv4Addr>,
}

impl HostNetwork {
    /// Reads the host's addresses (an `RTM_GETADDR` dump) and routes (an
    /// `RTM_GETROUTE` dump of every table but `local`) over rtnetlink, in
    /// the network namespace this process runs in.
    pub fn read() -> Result<Self, HostNetworkError> {
        use futures_util::TryStreamExt;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .map_err(HostNetworkError::Connect)?;
        runtime.block_on(async {
            let (connection, handle, _) =
                rtnetlink::new_connection().map_err(HostNetworkError::Connect)?;
            tokio::spawn(connection);
            let dump = |what| move |source| HostNetworkError::Dump { what, source };
            let addresses: Vec<_> = handle
                .address()
                .get()
                .execute()
                .try_collect()
                .await
                .map_err(dump("addresses"))?;
            let routes: Vec<_> = handle
                .route()
                .get(rtnetlink::RouteMessageBuilder::<Ipv4Addr>::new().build())
                .execute()
                .try_collect()
                .await
                .map_err(dump("routes"))?;
            Ok(Self::of(&addresses, &routes))
        })
    }

    /// The host network that these address and route messages describe.
    fn of(
        addresses: &[rtnetlink::packet_route::address::AddressMessage],
        routes: &[rtnetlink::packet_route::route::RouteMessage],
    ) -> Self {
        use rtnetlink::packet_route::AddressFamily;
        use rtnetlink::packet_route::address::AddressAttribute;
        use rtnetlink::packet_route::route::{RouteAddress, RouteAttribute, RouteScope, RouteType};
        let mut host = Self::default();
        for message in addresses {
            for attribute in &message.attributes {
                if let AddressAttribute::Address(IpAddr::V4(a))
                | AddressAttribute::Local(IpAddr::V4(a)) = attribute
                {
                    host.addresses.push(*a);
                    host.on_link.extend(subnet(*a, message.header.prefix_len));
                }
            }
        }
        for route in routes {
            if route.header.address_family != AddressFamily::Inet
                || route.header.kind != RouteType::Unicast
            {
                continue;
            }
            let table = route
                .attributes
                .iter()
                .find_map(|a| match a {
                    RouteAttribute::Table(t) => Some(*t),
                    _ => None,
                })
                .unwrap_or(u32::from(route.header.table));
            if table == TABLE_LOCAL {
                continue;
            }
            let len = route.header.destination_prefix_length;
            let mut destination = Ipv4Addr::UNSPECIFIED;
            let mut gateways = Vec::new();
            for attribute in &route.attributes {
                match attribute {
                    RouteAttribute::Destination(RouteAddress::Inet(d)) => destination = *d,
                    RouteAttribute::Gateway(RouteAddress::Inet(g)) => gateways.push(*g),
                    RouteAttribute::MultiPath(hops) => {
                        gateways.extend(hops.iter().flat_map(|hop| {
                            hop.attributes.iter().filter_map(|a| match a {
                                RouteAttribute::Gateway(RouteAddress::Inet(g)) => Some(*g),
                                _ => None,
                            })
                        }));
                    }
                    _ => {}
                }
            }
            if len == 0 {
                host.gateways.extend(gateways);
            } else if gateways.is_empty() && route.header.scope == RouteScope::Link {
                host.on_link.extend(subnet(destination, len));
            }
        }
        for list in [&mut host.addresses, &mut host.gateways] {
            list.sort();
            list.dedup();
        }
        host.on_link.sort();
        host.on_link.dedup();
        host
    }

    /// The host's neighbourhood as denials: each on-link prefix and each
    /// default gateway as a /32, sorted; but loopback, what lies inside
    /// slirp4netns's own network (those addresses are the helper's, on the
    /// sandbox's side, and never lead to the host's neighbours), and what
    /// `allowed` names exactly.
    fn neighbourhood(&self, allowed: &[IpPrefix]) -> Vec<IpPrefix> {
        let gateways = self.gateways.iter().map(|g| IpPrefix::host(IpAddr::V4(*g)));
        let mut prefixes: Vec<IpPrefix> = self
            .on_link
            .iter()
            .copied()
            .chain(gateways)
            .filter(|p| !within(p, LOOPBACK) && !within(p, SLIRP4NETNS_NETWORK))
            .filter(|p| !allowed.contains(p))
            .collect();
        prefixes.sort();
        prefixes.dedup();
        prefixes
    }
}

/// Why the host's own network could not be read.
#[derive(Debug, thiserror::Error)]
pub enum HostNetworkError {
    /// No rtnetlink connection (its socket, or the runtime it runs on).
    #[error("cannot open a netlink connection to read the host's network")]
    Connect(#[source] std::io::Error),
    /// The kernel refused or broke off a dump.
    #[error("cannot read the host's {what} over netlink")]
    Dump {
        /// `addresses` or `routes`.
        what: &'static str,
        /// The netlink error.
        #[source]
        source: rtnetlink::Error,
    },
}

/// Loopback, 127.0.0.0/8.
const LOOPBACK: ([u8; 4], u8) = ([127, 0, 0, 0], 8);
/// slirp4netns's default network, 10.0.2.0/24, where the sandbox's
/// gateway and resolver are.
const SLIRP4NETNS_NETWORK: ([u8; 4], u8) = ([10, 0, 2, 0], 24);

/// Whether `prefix` lies within the network `(octets, len)`.
fn within(prefix: &IpPrefix, (octets, len): ([u8; 4], u8)) -> bool {
    IpPrefix::ipv4(octets, len)
        .is_some_and(|network| prefix.prefix_len >= len && network.contains(prefix.address))
}

/// The subnet of `address` with `prefix_len` bits, host bits cleared; none
/// for a whole-address prefix (a /32 is the address itself).
fn subnet(address: Ipv4Addr, prefix_len: u8) -> Option<IpPrefix> {
    if prefix_len == 0 || prefix_len >= 32 {
        return None;
    }
    let mask = u32::MAX << (32 - u32::from(prefix_len));
    IpPrefix::ipv4((u32::from(address) & mask).to_be_bytes(), prefix_len)
}

/// The platform's denials for a host with the network `host`, under a
/// profile that allows `allowed`: the special ranges, each host address as
/// a /32 (but loopback, which the special ranges leave to the namespace,
/// and slirp4netns's resolver, whose own route must stay), and the host's
/// neighbourhood (each on-link prefix, each default gateway as a /32) but
/// what an allowed prefix names exactly, sorted.
pub fn platform_deny(host: &HostNetwork, allowed: &[IpPrefix]) -> Vec<IpPrefix> {
    let special = SPECIAL_PURPOSE
        .iter()
        .filter_map(|&(octets, len)| IpPrefix::ipv4(octets, len));
    let hosts = host
        .addresses
        .iter()
        .filter(|a| !a.is_loopback() && **a != ConnectivityLink::SLIRP4NETNS_RESOLVER)
        .map(|a| IpPrefix::host(IpAddr::V4(*a)));
    let mut prefixes: Vec<IpPrefix> = special
        .chain(hosts)
        .chain(host.neighbourhood(allowed))
        .collect();
    prefixes.sort();
    prefixes.dedup();
    prefixes
}

/// The network a generation gets: its policy, and which of its denials are
/// the platform's.
#[derive(Debug)]
pub struct PlannedNetwork {
    /// The policy to install.
    pub policy: DerivedNetworkPolicy,
    /// The platform's denials in it ([`platform_deny`]).
    pub platform_deny: Vec<IpPrefix>,
    /// Its names, when Lazaret's resolver serves the sandbox ([`names`]).
    pub names: Option<NamedEgress>,
}

impl PlannedNetwork {
    /// The policy `up` installs on a host with the network `host`: the
    /// configuration's, with the platform's denials.
    pub fn new(network: &EffectiveNetworkPolicy, host: &HostNetwork) -> Result<Self, PlanError> {
        let platform_deny = platform_deny(host, &allowed(network));
        let policy = derive_policy(network, &platform_deny)?;
        Ok(Self {
            policy,
            platform_deny,
            names: names(network),
        })
    }

    /// The name servers the sandbox's `/etc/resolv.conf` names: Lazaret's
    /// resolver when it serves, else the policy's resolvers.
    pub fn nameservers(&self) -> Vec<Ipv4Addr> {
        if self.names.is_some() {
            return vec![*NamedEgress::LISTEN.ip()];
        }
        self.policy
            .resolvers
            .iter()
            .filter_map(|r| match r.address {
                std::net::IpAddr::V4(a) => Some(a),
                std::net::IpAddr::V6(_) => None,
            })
            .collect()
    }
}

/// The names part of a policy: none when DNS is the host's and no host is
/// named (v1, and v2 with `dns = "host"` alone), which keeps v1's exact
/// network.
pub fn names(network: &EffectiveNetworkPolicy) -> Option<NamedEgress> {
    (network.dns == DnsMode::Lazaret || !network.hosts.is_empty())
        .then(|| NamedEgress::new(network.hosts.iter().cloned(), network.dns))
}

/// The prefixes `network` allows, as policy prefixes.
fn allowed(network: &EffectiveNetworkPolicy) -> Vec<IpPrefix> {
    network.allow.iter().map(prefix).collect()
}

fn prefix(p: &lazaret_proto::config::Ipv4Prefix) -> IpPrefix {
    IpPrefix::ipv4(p.network(), p.prefix_len()).expect("a configuration prefix is normalized")
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
) -> Result<DerivedNetworkPolicy, PlanError> {
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
    policy
        .validate()
        .map_err(|source| PlanError::Uninstallable {
            rule: source
                .rule_index()
                .and_then(|i| policy.prefix_rules.get(i))
                .map(|r| r.network),
            source,
        })?;
    Ok(policy)
}

/// The policy, encoded, in a sealed memfd.
pub fn policy_memfd(policy: &DerivedNetworkPolicy) -> Result<OwnedFd, PlanError> {
    let bytes = codec::encode(policy).map_err(PlanError::Encode)?;
    lazaret_proto::memfd::sealed_bytes("lazaret-network-policy", &bytes).map_err(PlanError::Seal)
}

/// Why a generation's network policy cannot be made or handed over.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The policy breaks a rule of the installer (a rule naming the
    /// resolver, too many rules, ...).
    #[error("the network policy cannot be installed{}", shown_rule(*rule))]
    Uninstallable {
        /// The rule that breaks it, when one does.
        rule: Option<IpPrefix>,
        /// The rule broken.
        #[source]
        source: PolicyError,
    },
    /// The policy does not encode.
    #[error("cannot encode the policy")]
    Encode(#[source] EncodeError),
    /// The encoded policy could not be sealed in a memfd.
    #[error("cannot seal the policy in a memfd")]
    Seal(#[source] std::io::Error),
}

/// ` (NETWORK/LEN)` for a rule, nothing without one.
fn shown_rule(rule: Option<IpPrefix>) -> String {
    rule.map(|r| format!(" ({}/{})", r.address, r.prefix_len))
        .unwrap_or_default()
}

/// Why slirp4netns could not be started and held.
#[derive(Debug, thiserror::Error)]
pub enum ConnectivityError {
    /// slirp4netns is missing or not trusted.
    #[error(transparent)]
    Program(#[from] ProgramError),
    /// Its log file could not be made.
    #[error("cannot make slirp4netns's log file")]
    Log(#[source] Errno),
    /// Its exit pipe could not be made.
    #[error("cannot make a pipe")]
    Pipe(#[source] Errno),
    /// Its log file's descriptor could not be duplicated for its output.
    #[error("cannot give slirp4netns its log file")]
    Output(#[source] std::io::Error),
    /// It could not be started.
    #[error("cannot start {}", program.display())]
    Spawn {
        /// The slirp4netns executable.
        program: PathBuf,
        /// Why not.
        #[source]
        source: std::io::Error,
    },
    /// Its pidfd could not be taken.
    #[error("cannot hold slirp4netns")]
    Hold(#[source] std::io::Error),
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
    ) -> Result<Self, ConnectivityError> {
        let binary = lazaret_hostfs::programs::slirp4netns()?;
        let log: OwnedFd = rustix::fs::openat(
            log_dir,
            ".",
            OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(ConnectivityError::Log)?;
        let (exit_read, exit_write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(ConnectivityError::Pipe)?;
        let output = || log.try_clone().map_err(ConnectivityError::Output);
        // The child inherits these under the same numbers.
        let path = lazaret_hostfs::beneath::proc_self_fd;
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
            .stdout(Stdio::from(output()?))
            .stderr(Stdio::from(output()?));
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
        .map_err(|source| ConnectivityError::Spawn {
            program: binary.clone(),
            source,
        })?;
        // Only slirp4netns holds the write end now: its exit is the end
        // of the pipe.
        drop((ready, exit_read));
        // Failing here drops the exit pipe's write end, which ends it.
        let held = pidfd_of_child(&child)
            .and_then(HeldProcess::from_pidfd)
            .map_err(ConnectivityError::Hold)?;
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
                hosts: Vec::new(),
                dns: lazaret_proto::names::DnsMode::Host,
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
                hosts: Vec::new(),
                dns: lazaret_proto::names::DnsMode::Host,
            },
            &[],
        )
        .unwrap_err();
        let error = lazaret_proto::error_chain(&error);
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
        let host = HostNetwork {
            addresses: host.to_vec(),
            ..HostNetwork::default()
        };
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
                hosts: Vec::new(),
                dns: lazaret_proto::names::DnsMode::Host,
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

    fn neighbourhood() -> HostNetwork {
        HostNetwork {
            addresses: vec![Ipv4Addr::new(192, 0, 2, 7), Ipv4Addr::LOCALHOST],
            on_link: [
                "192.0.2.0/24",
                "198.18.0.0/24",
                "127.0.0.0/8",
                "10.0.2.0/24",
            ]
            .map(policy_prefix)
            .to_vec(),
            gateways: vec![Ipv4Addr::new(192, 0, 2, 1)],
        }
    }

    fn policy_prefix(text: &str) -> IpPrefix {
        let p = prefix(text);
        IpPrefix::ipv4(p.network(), p.prefix_len()).unwrap()
    }

    fn allowing(allow: &[&str]) -> PlannedNetwork {
        PlannedNetwork::new(
            &EffectiveNetworkPolicy {
                allow: allow.iter().map(|p| prefix(p)).collect(),
                deny: RFC1918.to_vec(),
                hosts: Vec::new(),
                dns: lazaret_proto::names::DnsMode::Host,
            },
            &neighbourhood(),
        )
        .unwrap()
    }

    #[test]
    fn the_host_neighbourhood_is_denied_under_allow_all() {
        let planned = allowing(&["0.0.0.0/0"]);
        let at = |a: [u8; 4]| planned.policy.action_for(IpAddr::from(a));
        for denied in [
            // A neighbour, the gateway, the host itself.
            [192, 0, 2, 50],
            [192, 0, 2, 1],
            [192, 0, 2, 7],
            [198, 18, 0, 10],
        ] {
            assert_eq!(at(denied), PolicyAction::Deny, "{denied:?}");
        }
        assert_eq!(at([1, 1, 1, 1]), PolicyAction::Allow);
        assert_eq!(at([198, 18, 1, 10]), PolicyAction::Allow);
        // Loopback and slirp4netns's own network are never the host's
        // neighbours: the resolver stays reachable.
        assert_eq!(at([10, 0, 2, 3]), PolicyAction::Allow);
        assert!(
            planned
                .platform_deny
                .iter()
                .all(|p| !within(p, LOOPBACK) && !within(p, SLIRP4NETNS_NETWORK)),
            "{:?}",
            planned.platform_deny
        );
        for listed in ["192.0.2.0/24", "198.18.0.0/24", "192.0.2.1/32"] {
            assert!(
                planned.platform_deny.contains(&policy_prefix(listed)),
                "{listed} in {:?}",
                planned.platform_deny
            );
        }
    }

    #[test]
    fn an_allow_naming_a_neighbour_reaches_it_and_no_further() {
        // Naming the subnet: its neighbours, not its gateway or the host.
        let planned = allowing(&["0.0.0.0/0", "192.0.2.0/24"]);
        let at = |a: [u8; 4]| planned.policy.action_for(IpAddr::from(a));
        assert_eq!(at([192, 0, 2, 50]), PolicyAction::Allow);
        assert_eq!(at([192, 0, 2, 1]), PolicyAction::Deny);
        assert_eq!(at([192, 0, 2, 7]), PolicyAction::Deny);
        assert_eq!(at([198, 18, 0, 10]), PolicyAction::Deny);
        assert!(
            !planned
                .platform_deny
                .contains(&policy_prefix("192.0.2.0/24"))
        );
        // Naming the gateway.
        let planned = allowing(&["0.0.0.0/0", "192.0.2.1/32"]);
        let at = |a: [u8; 4]| planned.policy.action_for(IpAddr::from(a));
        assert_eq!(at([192, 0, 2, 1]), PolicyAction::Allow);
        assert_eq!(at([192, 0, 2, 50]), PolicyAction::Deny);
        // A longer prefix inside a neighbour subnet reaches into it.
        let planned = allowing(&["198.18.0.0/25"]);
        let at = |a: [u8; 4]| planned.policy.action_for(IpAddr::from(a));
        assert_eq!(at([198, 18, 0, 10]), PolicyAction::Allow);
        assert_eq!(at([198, 18, 0, 200]), PolicyAction::Deny);
        // A broader allow does not name it.
        let planned = allowing(&["198.18.0.0/16"]);
        let at = |a: [u8; 4]| planned.policy.action_for(IpAddr::from(a));
        assert_eq!(at([198, 18, 0, 10]), PolicyAction::Deny);
        assert_eq!(at([198, 18, 5, 10]), PolicyAction::Allow);
        // The host's own address stays denied even when named.
        let planned = allowing(&["0.0.0.0/0", "192.0.2.7/32"]);
        let at = |a: [u8; 4]| planned.policy.action_for(IpAddr::from(a));
        assert_eq!(at([192, 0, 2, 7]), PolicyAction::Deny);
    }

    #[test]
    fn the_neighbourhood_is_taken_from_addresses_and_routes() {
        use rtnetlink::packet_route::AddressFamily as Family;
        use rtnetlink::packet_route::address::{AddressAttribute, AddressMessage};
        use rtnetlink::packet_route::route::{
            RouteAddress, RouteAttribute, RouteMessage, RouteNextHop, RouteScope, RouteType,
        };
        let address = |a: [u8; 4], len: u8| {
            let mut m = AddressMessage::default();
            m.header.family = Family::Inet;
            m.header.prefix_len = len;
            m.attributes = vec![AddressAttribute::Address(IpAddr::from(a))];
            m
        };
        let gateway = |g: [u8; 4]| RouteAttribute::Gateway(RouteAddress::Inet(Ipv4Addr::from(g)));
        let route = |dst: [u8; 4], len: u8, kind, scope, table: u8, attributes: Vec<_>| {
            let mut m = RouteMessage::default();
            m.header.address_family = Family::Inet;
            m.header.destination_prefix_length = len;
            m.header.kind = kind;
            m.header.scope = scope;
            m.header.table = table;
            m.attributes = attributes;
            if len > 0 {
                m.attributes
                    .push(RouteAttribute::Destination(RouteAddress::Inet(dst.into())));
            }
            m
        };
        let mut hop = RouteNextHop::default();
        hop.attributes = vec![gateway([198, 51, 100, 1])];
        let (main, local) = (254, 255);
        let host = HostNetwork::of(
            &[
                address([192, 0, 2, 7], 24),
                address([127, 0, 0, 1], 8),
                address([203, 0, 113, 5], 32),
            ],
            &[
                route(
                    [0; 4],
                    0,
                    RouteType::Unicast,
                    RouteScope::Universe,
                    main,
                    vec![gateway([192, 0, 2, 1])],
                ),
                // A multipath default in another table.
                route(
                    [0; 4],
                    0,
                    RouteType::Unicast,
                    RouteScope::Universe,
                    100,
                    vec![RouteAttribute::MultiPath(vec![hop])],
                ),
                // On the link without a gateway.
                route(
                    [198, 18, 0, 0],
                    24,
                    RouteType::Unicast,
                    RouteScope::Link,
                    main,
                    vec![],
                ),
                // Through a gateway: not on the link.
                route(
                    [198, 18, 2, 0],
                    24,
                    RouteType::Unicast,
                    RouteScope::Universe,
                    main,
                    vec![gateway([198, 18, 0, 10])],
                ),
                route(
                    [198, 18, 9, 0],
                    24,
                    RouteType::Unreachable,
                    RouteScope::Universe,
                    main,
                    vec![],
                ),
                route(
                    [192, 0, 2, 255],
                    32,
                    RouteType::Broadcast,
                    RouteScope::Link,
                    local,
                    vec![],
                ),
                route(
                    [198, 18, 7, 0],
                    24,
                    RouteType::Unicast,
                    RouteScope::Link,
                    local,
                    vec![],
                ),
            ],
        );
        assert_eq!(
            host,
            HostNetwork {
                addresses: [[127, 0, 0, 1], [192, 0, 2, 7], [203, 0, 113, 5]]
                    .map(Ipv4Addr::from)
                    .to_vec(),
                on_link: ["127.0.0.0/8", "192.0.2.0/24", "198.18.0.0/24"]
                    .map(policy_prefix)
                    .to_vec(),
                gateways: [[192, 0, 2, 1], [198, 51, 100, 1]]
                    .map(Ipv4Addr::from)
                    .to_vec(),
            }
        );
    }

    #[test]
    fn the_host_network_is_read() {
        let host = HostNetwork::read().unwrap();
        assert!(
            host.addresses.contains(&Ipv4Addr::LOCALHOST),
            "loopback is among {host:?}"
        );
        assert!(
            host.on_link.contains(&policy_prefix("127.0.0.0/8")),
            "loopback's subnet is among {host:?}"
        );
    }
}
