//! Installs the policy in the enforcement namespace with rtnetlink and
//! reads it back.
//!
//! Owns every change the sidecar makes: loopback up, IPv6 off, the tap
//! device's MTU, state and /32 address, one route per policy rule (allowed
//! prefixes via the gateway, marked on-link so the gateway itself needs no
//! route; denied prefixes `unreachable`) and one link route per resolver.
//! A default route via the gateway is added only for a policy that names
//! hosts, whose addresses the filter's set decides (see
//! [`DerivedNetworkPolicy::expected_routes`]). The readback trusts only the kernel:
//! the links, the main routing table, the IPv6 switches and addresses.

use std::net::{IpAddr, Ipv4Addr};

use futures_util::TryStreamExt;
use lazaret_proto::failure::Failure;
use lazaret_proto::network::{
    AddressFamily, ConnectivityLink, DerivedNetworkPolicy, IpPrefix, NamedEgress, PolicyAction,
    PrefixRule,
};
use lazaret_proto::sidecar::{SidecarError, SidecarStep};
use rtnetlink::packet_route::AddressFamily as NetlinkFamily;
use rtnetlink::packet_route::address::AddressAttribute;
use rtnetlink::packet_route::link::{LinkAttribute, LinkFlags};
use rtnetlink::packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteScope, RouteType,
};
use rtnetlink::packet_route::rule::{RuleAction, RuleAttribute};
use rtnetlink::{Handle, LinkUnspec, RouteMessageBuilder};

use crate::failed;

/// What the readback found.
#[derive(Debug)]
pub struct Readback {
    /// The main table's routes, as policy rules, sorted.
    pub routes: Vec<PrefixRule>,
    /// Whether the tap device is up with its address.
    pub tap_up: bool,
    /// Whether IPv6 is off everywhere and no interface has an IPv6 address.
    pub ipv6_disabled: bool,
}

const IPV6_CONF: &str = "/proc/sys/net/ipv6/conf";

/// The kernel's `local` routing table (`RT_TABLE_LOCAL`).
const TABLE_LOCAL: u32 = 255;
/// The kernel's `default` routing table (`RT_TABLE_DEFAULT`).
const TABLE_DEFAULT: u32 = 253;

/// Installs `policy` (with the default route `names` needs, when it
/// allows hosts) on `link` and reads the namespace back.
pub async fn install(
    policy: &DerivedNetworkPolicy,
    names: Option<&NamedEgress>,
    link: &ConnectivityLink,
) -> Result<Readback, SidecarError> {
    let (connection, handle, _) = rtnetlink::new_connection()
        .map_err(|e| failed(SidecarStep::Link, format!("cannot open rtnetlink: {e}")))?;
    tokio::spawn(connection);

    let links = list_links(&handle).await?;
    let index_of = |name: &str| links.iter().find(|(_, n, _)| n == name).map(|(i, _, _)| *i);
    let lo = index_of("lo").ok_or_else(|| failed(SidecarStep::Link, "the namespace has no lo"))?;
    let tap = index_of(&link.tap_name).ok_or_else(|| {
        failed(
            SidecarStep::Link,
            format!(
                "the namespace has no {} device: the connectivity helper did not attach",
                link.tap_name
            ),
        )
    })?;
    if let Some((_, other, _)) = links.iter().find(|(i, _, _)| *i != lo && *i != tap) {
        return Err(failed(
            SidecarStep::Link,
            format!("the namespace holds an unexpected interface {other}"),
        ));
    }

    // IPv6 goes first, so the tap device never gets a link-local address.
    disable_ipv6(&["all", "default", "lo", &link.tap_name])?;

    let step = |what: &str, e: rtnetlink::Error| failed(SidecarStep::Link, format!("{what}: {e}"));
    handle
        .link()
        .set(LinkUnspec::new_with_index(lo).up().build())
        .execute()
        .await
        .map_err(|e| step("cannot bring up lo", e))?;
    handle
        .link()
        .set(LinkUnspec::new_with_index(tap).mtu(link.mtu).up().build())
        .execute()
        .await
        .map_err(|e| step(&format!("cannot bring up {}", link.tap_name), e))?;
    // A /32 address: no connected subnet route beside the policy's.
    handle
        .address()
        .add(tap, IpAddr::V4(link.guest_address), 32)
        .execute()
        .await
        .map_err(|e| step(&format!("cannot address {}", link.tap_name), e))?;

    let resolver_route = |rule: &PrefixRule| {
        policy
            .resolvers
            .iter()
            .any(|r| rule.network == IpPrefix::host(r.address))
    };
    for rule in policy
        .expected_routes(names)
        .iter()
        .filter(|r| !resolver_route(r))
    {
        let IpAddr::V4(network) = rule.network.address else {
            return Err(failed(
                SidecarStep::Routes,
                "an IPv6 rule in an IPv4-only namespace",
            ));
        };
        let builder = RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(network, rule.network.prefix_len);
        let message = match rule.action {
            PolicyAction::Allow => builder
                .gateway(link.gateway)
                .output_interface(tap)
                .onlink()
                .build(),
            PolicyAction::Deny => builder.kind(RouteType::Unreachable).build(),
        };
        add_route(&handle, message, rule.network).await?;
    }
    for resolver in &policy.resolvers {
        let IpAddr::V4(address) = resolver.address else {
            return Err(failed(
                SidecarStep::Routes,
                "an IPv6 resolver in an IPv4-only namespace",
            ));
        };
        let message = RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(address, 32)
            .output_interface(tap)
            .scope(RouteScope::Link)
            .build();
        add_route(&handle, message, IpPrefix::host(resolver.address)).await?;
    }

    readback(&handle, tap, link).await
}

/// Reads the namespace back without changing anything: what `install`
/// reads after installing, for re-verifying a running policy.
pub async fn observe(link: &ConnectivityLink) -> Result<Readback, SidecarError> {
    let (connection, handle, _) = rtnetlink::new_connection()
        .map_err(|e| failed(SidecarStep::Link, format!("cannot open rtnetlink: {e}")))?;
    tokio::spawn(connection);
    let links = list_links(&handle).await?;
    let tap = links
        .iter()
        .find(|(_, name, _)| *name == link.tap_name)
        .map(|(index, _, _)| *index)
        .ok_or_else(|| {
            failed(
                SidecarStep::Readback,
                format!("the namespace has no {} device any more", link.tap_name),
            )
        })?;
    readback(&handle, tap, link).await
}

/// The routes, the helper's device and IPv6 as the namespace has them now.
async fn readback(
    handle: &Handle,
    tap: u32,
    link: &ConnectivityLink,
) -> Result<Readback, SidecarError> {
    check_rules(handle).await?;
    let routes = read_routes(handle, tap, link).await?;
    let links = list_links(handle).await?;
    let tap_up = links
        .iter()
        .any(|(i, _, flags)| *i == tap && flags.contains(LinkFlags::Up))
        && has_address(handle, tap, link.guest_address).await?;
    let ipv6_disabled = ipv6_disabled(handle, &["all", "default", "lo", &link.tap_name]).await?;
    Ok(Readback {
        routes,
        tap_up,
        ipv6_disabled,
    })
}

async fn add_route(
    handle: &Handle,
    message: RouteMessage,
    network: IpPrefix,
) -> Result<(), SidecarError> {
    handle.route().add(message).execute().await.map_err(|e| {
        failed(
            SidecarStep::Routes,
            format!(
                "cannot install the route for {}/{}: {e}",
                network.address, network.prefix_len
            ),
        )
    })
}

/// Collects a dump reply, or says what could not be listed.
async fn dump<T>(
    replies: impl futures_util::Stream<Item = Result<T, rtnetlink::Error>>,
    what: &str,
) -> Result<Vec<T>, SidecarError> {
    replies
        .try_collect()
        .await
        .map_err(|e| failed(SidecarStep::Readback, format!("cannot list {what}: {e}")))
}

/// (index, name, flags) of every interface.
async fn list_links(handle: &Handle) -> Result<Vec<(u32, String, LinkFlags)>, SidecarError> {
    let messages = dump(handle.link().get().execute(), "interfaces").await?;
    Ok(messages
        .into_iter()
        .map(|m| {
            let name = m
                .attributes
                .iter()
                .find_map(|a| match a {
                    LinkAttribute::IfName(n) => Some(n.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            (m.header.index, name, m.header.flags)
        })
        .collect())
}

async fn has_address(handle: &Handle, index: u32, wanted: Ipv4Addr) -> Result<bool, SidecarError> {
    let messages = dump(
        handle
            .address()
            .get()
            .set_link_index_filter(index)
            .execute(),
        "addresses",
    )
    .await?;
    Ok(messages.iter().any(|m| {
        m.header.prefix_len == 32
            && m.attributes
                .iter()
                .any(|a| matches!(a, AddressAttribute::Address(IpAddr::V4(a)) if *a == wanted))
    }))
}

/// Requires the IPv4 routing rules to be the kernel's three defaults (look
/// up `local`, then `main`, then `default`) and nothing else: a rule that
/// sent some traffic to another table would route around the policy.
async fn check_rules(handle: &Handle) -> Result<(), SidecarError> {
    let messages = dump(
        handle.rule().get(rtnetlink::IpVersion::V4).execute(),
        "routing rules",
    )
    .await?;
    let mut found = Vec::new();
    for m in &messages {
        let mut priority = 0;
        let mut table = u32::from(m.header.table);
        for a in &m.attributes {
            match a {
                RuleAttribute::Priority(p) => priority = *p,
                RuleAttribute::Table(t) => table = *t,
                // What the kernel reports for "none".
                RuleAttribute::Protocol(_)
                | RuleAttribute::SuppressPrefixLen(u32::MAX)
                | RuleAttribute::SuppressIfGroup(u32::MAX) => {}
                other => {
                    return Err(failed(
                        SidecarStep::Readback,
                        format!("a routing rule (priority {priority}) has a selector: {other:?}"),
                    ));
                }
            }
        }
        let plain = m.header.src_len == 0
            && m.header.dst_len == 0
            && m.header.tos == 0
            && m.header.action == RuleAction::ToTable;
        if !plain {
            return Err(failed(
                SidecarStep::Readback,
                format!("the routing rule at priority {priority} is not a plain table lookup"),
            ));
        }
        found.push((priority, table));
    }
    found.sort_unstable();
    let defaults = [
        (0, TABLE_LOCAL),
        (32766, u32::from(RouteHeader::RT_TABLE_MAIN)),
        (32767, TABLE_DEFAULT),
    ];
    if found != defaults {
        return Err(failed(
            SidecarStep::Readback,
            format!("the routing rules are not the kernel's defaults: (priority, table) {found:?}"),
        ));
    }
    Ok(())
}

/// The main table's IPv4 routes as rules: unicast via the gateway on the
/// tap device is an allowed prefix, a link route on the tap device to one
/// host is a resolver (allowed), `unreachable` is a denied prefix. Any
/// other route is an error: nothing but the policy may route. The `local`
/// table may hold only the kernel's local and broadcast routes; every other
/// table must be empty.
async fn read_routes(
    handle: &Handle,
    tap: u32,
    link: &ConnectivityLink,
) -> Result<Vec<PrefixRule>, SidecarError> {
    let messages = dump(
        handle
            .route()
            .get(RouteMessageBuilder::<Ipv4Addr>::new().build())
            .execute(),
        "routes",
    )
    .await?;
    let mut rules = Vec::new();
    for m in messages {
        let table = m
            .attributes
            .iter()
            .find_map(|a| match a {
                RouteAttribute::Table(t) => Some(*t),
                _ => None,
            })
            .unwrap_or(u32::from(m.header.table));
        if m.header.address_family != NetlinkFamily::Inet {
            continue;
        }
        if table == TABLE_LOCAL && matches!(m.header.kind, RouteType::Local | RouteType::Broadcast)
        {
            continue;
        }
        if table != u32::from(RouteHeader::RT_TABLE_MAIN) {
            return Err(failed(
                SidecarStep::Readback,
                format!(
                    "a {:?} route to {}/{} is in routing table {table}; only the main table \
                     may route",
                    m.header.kind,
                    route_destination(&m),
                    m.header.destination_prefix_length
                ),
            ));
        }
        let mut destination = Ipv4Addr::UNSPECIFIED;
        let mut gateway = None;
        let mut oif = None;
        for a in &m.attributes {
            match a {
                RouteAttribute::Destination(RouteAddress::Inet(d)) => destination = *d,
                RouteAttribute::Gateway(RouteAddress::Inet(g)) => gateway = Some(*g),
                RouteAttribute::Oif(i) => oif = Some(*i),
                _ => {}
            }
        }
        let len = m.header.destination_prefix_length;
        let network = IpPrefix::ipv4(destination.octets(), len).ok_or_else(|| {
            failed(
                SidecarStep::Readback,
                format!("a route to {destination}/{len} is malformed"),
            )
        })?;
        let action = match (m.header.kind, gateway, oif) {
            (RouteType::Unicast, Some(g), Some(i)) if g == link.gateway && i == tap => {
                PolicyAction::Allow
            }
            (RouteType::Unicast, None, Some(i))
                if i == tap && len == 32 && m.header.scope == RouteScope::Link =>
            {
                PolicyAction::Allow
            }
            (RouteType::Unreachable, _, _) => PolicyAction::Deny,
            (kind, gateway, oif) => {
                return Err(failed(
                    SidecarStep::Readback,
                    format!(
                        "an unexpected route to {destination}/{len} ({kind:?}, gateway {gateway:?}, \
                         interface {oif:?}) is in the namespace"
                    ),
                ));
            }
        };
        rules.push(PrefixRule {
            family: AddressFamily::IPv4,
            network,
            action,
        });
    }
    rules.sort();
    Ok(rules)
}

fn route_destination(m: &RouteMessage) -> Ipv4Addr {
    m.attributes
        .iter()
        .find_map(|a| match a {
            RouteAttribute::Destination(RouteAddress::Inet(d)) => Some(*d),
            _ => None,
        })
        .unwrap_or(Ipv4Addr::UNSPECIFIED)
}

fn disable_ipv6(interfaces: &[&str]) -> Result<(), SidecarError> {
    if !std::path::Path::new(IPV6_CONF).exists() {
        // The kernel has no IPv6: nothing to switch off.
        return Ok(());
    }
    for name in interfaces {
        let path = format!("{IPV6_CONF}/{name}/disable_ipv6");
        std::fs::write(&path, "1").map_err(|e| SidecarError {
            step: SidecarStep::Ipv6,
            failure: Failure::os(
                format!("cannot write {path}"),
                &e,
                Some(path.as_str().into()),
            ),
        })?;
    }
    Ok(())
}

/// Whether every switch reads 1 and no interface has an IPv6 address.
async fn ipv6_disabled(handle: &Handle, interfaces: &[&str]) -> Result<bool, SidecarError> {
    if std::path::Path::new(IPV6_CONF).exists() {
        for name in interfaces {
            let path = format!("{IPV6_CONF}/{name}/disable_ipv6");
            let value = std::fs::read_to_string(&path).map_err(|e| SidecarError {
                step: SidecarStep::Readback,
                failure: Failure::os(
                    format!("cannot read {path}"),
                    &e,
                    Some(path.as_str().into()),
                ),
            })?;
            if value.trim() != "1" {
                return Ok(false);
            }
        }
    }
    let messages = dump(handle.address().get().execute(), "addresses").await?;
    Ok(!messages
        .iter()
        .any(|m| m.header.family == NetlinkFamily::Inet6))
}
