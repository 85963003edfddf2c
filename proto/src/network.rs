//! The network policy a generation's sandbox runs under and the evidence
//! that it is in force.
//!
//! The Host Coordinator derives a [`DerivedNetworkPolicy`] from the resolved
//! configuration and hands it to the Network Sidecar in a sealed memfd. The
//! sidecar installs it, probes the result, and answers with a
//! [`NetworkReadinessAttestation`] built only from what it observed. The
//! Host Coordinator starts the sandbox only after an attestation whose
//! identity matches what it asked for.
//!
//! This module owns those shapes, the policy's structural validation, and
//! the digests that name a policy and a readiness identity. It trusts no
//! bytes it decodes: the sidecar validates a policy before installing it,
//! and the Host Coordinator checks an attestation's identity and
//! observations before believing it.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::codec::{EncodeError, WireRecord};
use crate::common::{UnixTimeNs, schema_id, tagged_digest};
use crate::ids::{DomainId, GenerationId, NetworkSidecarId, Sha256Digest};
use crate::names::{DnsMode, HostPattern};

pub use crate::ids::NamespaceIdentity;

schema_id!(
    /// The schema identifier of a derived network policy,
    /// `lazaret-derived-network-policy-v1`; also its digest's separator.
    DerivedNetworkPolicySchemaId = "lazaret-derived-network-policy-v1"
);

schema_id!(
    /// The schema identifier of a readiness attestation,
    /// `lazaret-network-readiness-attestation-v1`; also its digest's
    /// separator.
    NetworkReadinessAttestationSchemaId = "lazaret-network-readiness-attestation-v1"
);

schema_id!(
    /// The schema identifier of a readiness identity,
    /// `lazaret-network-readiness-identity-v1`; also its fingerprint's
    /// separator.
    NetworkReadinessIdentitySchemaId = "lazaret-network-readiness-identity-v1"
);

schema_id!(
    /// The schema identifier of a policy's names,
    /// `lazaret-named-egress-v1`; also its digest's separator.
    NamedEgressSchemaId = "lazaret-named-egress-v1"
);

/// An IP address family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum AddressFamily {
    /// IPv4.
    IPv4,
    /// IPv6.
    IPv6,
}

impl AddressFamily {
    /// The family of `address`.
    pub fn of(address: &IpAddr) -> Self {
        match address {
            IpAddr::V4(_) => Self::IPv4,
            IpAddr::V6(_) => Self::IPv6,
        }
    }

    /// The longest prefix length in the family.
    pub fn max_prefix_len(self) -> u8 {
        match self {
            Self::IPv4 => 32,
            Self::IPv6 => 128,
        }
    }
}

/// What a rule or default does with matching traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum PolicyAction {
    /// Routed via the connectivity helper's gateway.
    Allow,
    /// Unreachable.
    Deny,
}

/// Whether a family exists in the sandbox's network at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum FamilyDisposition {
    /// The family is configured and governed by the rules.
    Enabled,
    /// The family is switched off in the enforcement namespace.
    Disabled,
}

/// Whether one address family is enabled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct AddressFamilyDisposition {
    /// The family.
    pub family: AddressFamily,
    /// Enabled or disabled.
    pub disposition: FamilyDisposition,
}

/// What happens to traffic of one family that no prefix rule matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct DefaultAction {
    /// The family.
    pub family: AddressFamily,
    /// The action for unmatched destinations.
    pub action: PolicyAction,
}

/// An IP network: an address with its host bits cleared and a prefix
/// length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct IpPrefix {
    /// The network address.
    pub address: IpAddr,
    /// The prefix length in bits.
    pub prefix_len: u8,
}

impl IpPrefix {
    /// An IPv4 prefix; `None` if the length exceeds 32 or host bits are set.
    pub fn ipv4(octets: [u8; 4], prefix_len: u8) -> Option<Self> {
        let prefix = Self {
            address: IpAddr::V4(Ipv4Addr::from(octets)),
            prefix_len,
        };
        prefix.is_normalized().then_some(prefix)
    }

    /// The prefix holding exactly `address`.
    pub fn host(address: IpAddr) -> Self {
        Self {
            address,
            prefix_len: AddressFamily::of(&address).max_prefix_len(),
        }
    }

    /// Whether `address` lies within the prefix.
    pub fn contains(&self, address: IpAddr) -> bool {
        let len = u32::from(self.prefix_len);
        match (self.address, address) {
            (IpAddr::V4(net), IpAddr::V4(a)) => {
                let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
                u32::from(a) & mask == u32::from(net)
            }
            (IpAddr::V6(net), IpAddr::V6(a)) => {
                let mask = u128::MAX.checked_shl(128 - len).unwrap_or(0);
                u128::from(a) & mask == u128::from(net)
            }
            _ => false,
        }
    }

    /// Whether the length fits the family and no host bit is set.
    pub fn is_normalized(&self) -> bool {
        let family = AddressFamily::of(&self.address);
        if self.prefix_len > family.max_prefix_len() {
            return false;
        }
        // Shifting the network bits out leaves only the host bits.
        let len = u32::from(self.prefix_len);
        match self.address {
            IpAddr::V4(a) => u32::from(a).checked_shl(len).unwrap_or(0) == 0,
            IpAddr::V6(a) => u128::from(a).checked_shl(len).unwrap_or(0) == 0,
        }
    }
}

/// A route for one prefix: allowed via the gateway or unreachable. The
/// longest matching prefix wins.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PrefixRule {
    /// The family of `network`.
    pub family: AddressFamily,
    /// The destination network.
    pub network: IpPrefix,
    /// Allow or deny.
    pub action: PolicyAction,
}

/// One rule of the second enforcement layer: the nftables filter on the
/// enforcement namespace's output, evaluated in order (first match wins;
/// what matches none is dropped). Its input accepts only loopback and
/// replies to what left.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FilterRule {
    /// Anything out of `lo` is accepted.
    AcceptLoopback,
    /// DNS (UDP and TCP port 53) to a resolver is accepted.
    AcceptDns {
        /// The resolver.
        resolver: Ipv4Addr,
    },
    /// Traffic to `network` is accepted or dropped.
    Prefix {
        /// The destination network.
        network: IpPrefix,
        /// Accept or drop.
        action: PolicyAction,
    },
    /// DNS (UDP and TCP port 53) to a resolver is accepted from sockets
    /// that carry `mark`: Lazaret's resolver's, never the sandbox's.
    AcceptMarkedDns {
        /// The upstream resolver.
        resolver: Ipv4Addr,
        /// The socket mark.
        mark: u32,
    },
    /// Traffic to a member of the set of addresses Lazaret's resolver
    /// answered for allowed names is accepted.
    AcceptNamed,
    /// Traffic of a connection the filter let begin is accepted: a flow to
    /// an address admitted for a name outlives the admission.
    AcceptEstablished,
}

/// The names part of a v2 policy: which host names the sandbox may reach,
/// and who answers its DNS. The addresses those names have are learnt at
/// run time: Lazaret's resolver admits each answered address into the
/// filter's set for the answer's lifetime ([`Self::admission_timeout`])
/// before the sandbox sees the answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamedEgress {
    /// Always `lazaret-named-egress-v1`.
    pub schema_id: NamedEgressSchemaId,
    /// The allowed names, sorted and deduplicated.
    pub hosts: Vec<HostPattern>,
    /// Who answers names the policy does not allow.
    pub dns: DnsMode,
}

impl NamedEgress {
    /// Where Lazaret's resolver listens in the enforcement namespace: the
    /// sandbox's only name server.
    pub const LISTEN: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 53), 53);
    /// The mark on the resolver's upstream socket; the filter lets only
    /// marked DNS reach the upstream resolver. The sandbox cannot mark its
    /// sockets (it has no CAP_NET_ADMIN, and gVisor does not pass marks).
    pub const UPSTREAM_MARK: u32 = 0x4c5a_0053;
    /// The shortest and longest time an answered address stays admitted.
    pub const TTL_CLAMP: (Duration, Duration) =
        (Duration::from_secs(30), Duration::from_secs(3600));
    /// The name the readiness probe asks to be refused.
    pub const REFUSED_PROBE: &'static str = "lazaret-readiness-probe.invalid";

    /// The names part of a policy, sorted and deduplicated.
    pub fn new(hosts: impl IntoIterator<Item = HostPattern>, dns: DnsMode) -> Self {
        let mut hosts: Vec<_> = hosts.into_iter().collect();
        hosts.sort();
        hosts.dedup();
        Self {
            schema_id: NamedEgressSchemaId,
            hosts,
            dns,
        }
    }

    /// Whether the policy allows `name` (any case, with or without the
    /// root dot).
    pub fn allows(&self, name: &str) -> bool {
        crate::names::allowed(&self.hosts, name)
    }

    /// How long an address answered with `ttl` stays admitted: the TTL
    /// clamped to [`Self::TTL_CLAMP`].
    pub fn admission_timeout(ttl: Duration) -> Duration {
        ttl.clamp(Self::TTL_CLAMP.0, Self::TTL_CLAMP.1)
    }

    /// The name the readiness probe asks to be answered: the first exact
    /// name, else a name under the first wildcard.
    pub fn allowed_probe(&self) -> Option<String> {
        self.hosts
            .iter()
            .find(|h| !h.is_wildcard())
            .or_else(|| self.hosts.first())
            .map(|h| h.as_str().replacen('*', "lazaret-readiness-probe", 1))
    }

    /// SHA-256 over the schema identifier, a NUL, and the encoding.
    pub fn digest(&self) -> Result<Sha256Digest, EncodeError> {
        tagged_digest(NamedEgressSchemaId::TEXT, self)
    }
}

impl WireRecord for NamedEgress {
    const NAME: &'static str = "NamedEgress";
    const MAX_ENCODED_LEN: usize = 512 * 1024;
}

/// An address in the filter's set of addresses Lazaret's resolver
/// admitted, for which name, and for how long still.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdmittedAddress {
    /// The name whose answer admitted it last.
    pub name: String,
    /// The address.
    pub address: Ipv4Addr,
    /// Milliseconds until it expires.
    pub expires_in_ms: u64,
}

/// What a read-back of a running namespace found: the namespace, and the
/// addresses admitted for names (none without names).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observed {
    /// The routes, filter, device and IPv6 switches.
    pub observation: NetworkObservation,
    /// The set's members, as many as a message carries.
    pub admitted: Vec<AdmittedAddress>,
    /// How many members the set has.
    pub admitted_total: u64,
}

/// Multicast and limited broadcast: the filter drops them before any
/// allowed prefix is looked at.
pub const FILTER_ALWAYS_DROPPED: [([u8; 4], u8); 2] =
    [([224, 0, 0, 0], 4), ([255, 255, 255, 255], 32)];

/// A DNS resolver the sandbox may reach (slirp's forwarder).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Resolver {
    /// The family of `address`.
    pub family: AddressFamily,
    /// The resolver's address.
    pub address: IpAddr,
}

/// Why a derived policy is not installable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// A family has two dispositions or two default actions.
    #[error("{field}: family {family:?} appears more than once")]
    DuplicateFamily {
        /// `address_families` or `default_actions`.
        field: &'static str,
        /// The repeated family.
        family: AddressFamily,
    },
    /// An enabled family has no default action.
    #[error("default_actions: enabled family {0:?} has no default action")]
    MissingDefault(AddressFamily),
    /// A rule or resolver names a family that is not enabled.
    #[error("{field}: family {family:?} is not enabled")]
    FamilyNotEnabled {
        /// `prefix_rules` or `resolvers`.
        field: &'static str,
        /// The family.
        family: AddressFamily,
    },
    /// A `family` field disagrees with its address.
    #[error("{field}[{index}]: family does not match the address")]
    FamilyMismatch {
        /// `prefix_rules` or `resolvers`.
        field: &'static str,
        /// Position in the list.
        index: usize,
    },
    /// A prefix is too long or has host bits set.
    #[error("prefix_rules[{0}]: prefix length too long or host bits set")]
    NotNormalized(usize),
    /// Two rules name the same network.
    #[error("prefix_rules[{0}]: the same network appears earlier")]
    DuplicatePrefix(usize),
    /// More rules than one generation's records can carry.
    #[error(
        "{0} prefix rules; at most {max} fit one policy (summarize prefixes)",
        max = DerivedNetworkPolicy::MAX_PREFIX_RULES
    )]
    TooManyRules(usize),
    /// A rule names exactly a resolver's address, whose own route keeps
    /// it reachable.
    #[error(
        "prefix_rules[{0}]: names exactly a resolver's address, which always stays reachable \
         through its own route; use a shorter or longer prefix"
    )]
    ResolverShadowed(usize),
}

impl PolicyError {
    /// The position of the prefix rule at fault, when one is.
    pub fn rule_index(&self) -> Option<usize> {
        match *self {
            Self::NotNormalized(i) | Self::DuplicatePrefix(i) | Self::ResolverShadowed(i) => {
                Some(i)
            }
            Self::FamilyMismatch {
                field: "prefix_rules",
                index,
            } => Some(index),
            _ => None,
        }
    }
}

/// The network policy of one generation, as delivered to the sidecar.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DerivedNetworkPolicy {
    /// Always `lazaret-derived-network-policy-v1`.
    pub schema_id: DerivedNetworkPolicySchemaId,
    /// Which families are enabled.
    pub address_families: Vec<AddressFamilyDisposition>,
    /// What unmatched traffic of each enabled family meets.
    pub default_actions: Vec<DefaultAction>,
    /// The allow and deny routes.
    pub prefix_rules: Vec<PrefixRule>,
    /// The reachable resolvers.
    pub resolvers: Vec<Resolver>,
}

impl DerivedNetworkPolicy {
    /// The most prefix rules one policy may hold: enough for any hand-kept
    /// list, and few enough that the policy, its attestation and a status
    /// report carrying both fit one channel message.
    pub const MAX_PREFIX_RULES: usize = 1024;

    /// The v1 shape: IPv4 enabled with default deny, IPv6 disabled, the
    /// given allow and deny prefixes, and the given resolvers. The result is
    /// canonical; validate it before use.
    pub fn ipv4_only(
        allow: impl IntoIterator<Item = IpPrefix>,
        deny: impl IntoIterator<Item = IpPrefix>,
        resolvers: impl IntoIterator<Item = Ipv4Addr>,
    ) -> Self {
        let rule = |action| {
            move |network: IpPrefix| PrefixRule {
                family: AddressFamily::of(&network.address),
                network,
                action,
            }
        };
        let mut prefix_rules: Vec<_> = allow.into_iter().map(rule(PolicyAction::Allow)).collect();
        prefix_rules.extend(deny.into_iter().map(rule(PolicyAction::Deny)));
        let mut policy = Self {
            schema_id: DerivedNetworkPolicySchemaId,
            address_families: vec![
                AddressFamilyDisposition {
                    family: AddressFamily::IPv4,
                    disposition: FamilyDisposition::Enabled,
                },
                AddressFamilyDisposition {
                    family: AddressFamily::IPv6,
                    disposition: FamilyDisposition::Disabled,
                },
            ],
            default_actions: vec![DefaultAction {
                family: AddressFamily::IPv4,
                action: PolicyAction::Deny,
            }],
            prefix_rules,
            resolvers: resolvers
                .into_iter()
                .map(|a| Resolver {
                    family: AddressFamily::IPv4,
                    address: IpAddr::V4(a),
                })
                .collect(),
        };
        policy.canonicalize();
        policy
    }

    /// Sorts every list and drops exact duplicates, so two equal policies
    /// encode to the same bytes.
    pub fn canonicalize(&mut self) {
        fn sort<T: Ord>(items: &mut Vec<T>) {
            items.sort();
            items.dedup();
        }
        sort(&mut self.address_families);
        sort(&mut self.default_actions);
        sort(&mut self.prefix_rules);
        sort(&mut self.resolvers);
    }

    /// Checks the policy can be installed as written:
    /// at most [`Self::MAX_PREFIX_RULES`] rules, one disposition and at most
    /// one default per family, a default for every enabled family,
    /// rules and resolvers only for enabled families and matching their
    /// addresses, normalized prefixes, and no network listed twice.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if self.prefix_rules.len() > Self::MAX_PREFIX_RULES {
            return Err(PolicyError::TooManyRules(self.prefix_rules.len()));
        }
        let mut enabled = BTreeSet::new();
        let mut seen = BTreeSet::new();
        for d in &self.address_families {
            if !seen.insert(d.family) {
                return Err(PolicyError::DuplicateFamily {
                    field: "address_families",
                    family: d.family,
                });
            }
            if d.disposition == FamilyDisposition::Enabled {
                enabled.insert(d.family);
            }
        }
        let mut defaults = BTreeSet::new();
        for d in &self.default_actions {
            if !defaults.insert(d.family) {
                return Err(PolicyError::DuplicateFamily {
                    field: "default_actions",
                    family: d.family,
                });
            }
        }
        if let Some(&family) = enabled.difference(&defaults).next() {
            return Err(PolicyError::MissingDefault(family));
        }
        let mut networks = BTreeSet::new();
        for (index, rule) in self.prefix_rules.iter().enumerate() {
            if AddressFamily::of(&rule.network.address) != rule.family {
                return Err(PolicyError::FamilyMismatch {
                    field: "prefix_rules",
                    index,
                });
            }
            if !enabled.contains(&rule.family) {
                return Err(PolicyError::FamilyNotEnabled {
                    field: "prefix_rules",
                    family: rule.family,
                });
            }
            if !rule.network.is_normalized() {
                return Err(PolicyError::NotNormalized(index));
            }
            if !networks.insert(rule.network) {
                return Err(PolicyError::DuplicatePrefix(index));
            }
            if self
                .resolvers
                .iter()
                .any(|r| rule.network == IpPrefix::host(r.address))
            {
                return Err(PolicyError::ResolverShadowed(index));
            }
        }
        for (index, resolver) in self.resolvers.iter().enumerate() {
            if AddressFamily::of(&resolver.address) != resolver.family {
                return Err(PolicyError::FamilyMismatch {
                    field: "resolvers",
                    index,
                });
            }
            if !enabled.contains(&resolver.family) {
                return Err(PolicyError::FamilyNotEnabled {
                    field: "resolvers",
                    family: resolver.family,
                });
            }
        }
        Ok(())
    }

    /// The policy's digest: SHA-256 over the schema identifier, a NUL, and
    /// the encoding of the policy's canonical form.
    pub fn digest(&self) -> Result<Sha256Digest, EncodeError> {
        let mut canonical = self.clone();
        canonical.canonicalize();
        tagged_digest(DerivedNetworkPolicySchemaId::TEXT, &canonical)
    }

    /// The routes that implement the policy, as rules, sorted: every prefix
    /// rule, each resolver as an allowed host route, and, when `names`
    /// allows hosts, a default route: their addresses are learnt at run
    /// time, so the filter's set alone decides them. This is what the
    /// sidecar must read back from the enforcement namespace.
    pub fn expected_routes(&self, names: Option<&NamedEgress>) -> Vec<PrefixRule> {
        let mut routes = self.prefix_rules.clone();
        let everything = IpPrefix::ipv4([0, 0, 0, 0], 0).expect("0.0.0.0/0 is a prefix");
        if names.is_some_and(|n| !n.hosts.is_empty())
            && !routes.iter().any(|r| r.network == everything)
        {
            routes.push(PrefixRule {
                family: AddressFamily::IPv4,
                network: everything,
                action: PolicyAction::Allow,
            });
        }
        routes.extend(self.resolvers.iter().map(|r| PrefixRule {
            family: r.family,
            network: IpPrefix::host(r.address),
            action: PolicyAction::Allow,
        }));
        routes.sort();
        routes.dedup();
        routes
    }

    /// The output filter that enforces the policy a second time, rule by
    /// rule in order: loopback, DNS to each resolver (with `names`, only
    /// from Lazaret's resolver's marked sockets), the multicast and
    /// broadcast drops, every prefix rule, longest prefix first (so the
    /// first match is the longest, as with routes), then, when `names`
    /// allows hosts, the connections already let through and the
    /// addresses its resolver admitted.
    pub fn expected_filter(&self, names: Option<&NamedEgress>) -> Vec<FilterRule> {
        let mut filter = vec![FilterRule::AcceptLoopback];
        filter.extend(self.resolvers.iter().filter_map(|r| match r.address {
            IpAddr::V4(resolver) if names.is_some() => Some(FilterRule::AcceptMarkedDns {
                resolver,
                mark: NamedEgress::UPSTREAM_MARK,
            }),
            IpAddr::V4(resolver) => Some(FilterRule::AcceptDns { resolver }),
            IpAddr::V6(_) => None,
        }));
        filter.extend(FILTER_ALWAYS_DROPPED.iter().filter_map(|&(octets, len)| {
            Some(FilterRule::Prefix {
                network: IpPrefix::ipv4(octets, len)?,
                action: PolicyAction::Deny,
            })
        }));
        let mut rules = self.prefix_rules.clone();
        rules.sort_by_key(|r| (std::cmp::Reverse(r.network.prefix_len), r.network));
        filter.extend(rules.into_iter().map(|r| FilterRule::Prefix {
            network: r.network,
            action: r.action,
        }));
        if names.is_some_and(|n| !n.hosts.is_empty()) {
            filter.extend([FilterRule::AcceptEstablished, FilterRule::AcceptNamed]);
        }
        filter
    }

    /// What the policy does with traffic to `address`: the longest matching
    /// route's action, else the family's default; a disabled family is
    /// denied.
    pub fn action_for(&self, address: IpAddr) -> PolicyAction {
        self.decide(&self.expected_routes(None), address)
    }

    /// Whether Lazaret's resolver may admit `address` for an allowed name:
    /// never one a prefix rule denies (the platform's denials, RFC 1918 and
    /// the profile's `deny_egress`, whatever longer prefix allows within
    /// them), nor loopback, nor a resolver. An allowed name that points
    /// there is a rebinding attempt.
    pub fn admits(&self, address: Ipv4Addr) -> bool {
        let ip = IpAddr::V4(address);
        !(address.is_loopback()
            || address.is_unspecified()
            || self.resolvers.iter().any(|r| r.address == ip)
            || self
                .prefix_rules
                .iter()
                .any(|r| r.action == PolicyAction::Deny && r.network.contains(ip)))
    }

    /// [`Self::action_for`], with the expected routes already computed.
    fn decide(&self, routes: &[PrefixRule], address: IpAddr) -> PolicyAction {
        let family = AddressFamily::of(&address);
        let enabled = self
            .address_families
            .iter()
            .any(|d| d.family == family && d.disposition == FamilyDisposition::Enabled);
        if !enabled {
            return PolicyAction::Deny;
        }
        match longest_match(routes, address) {
            Some(route) => route.action,
            None => self
                .default_actions
                .iter()
                .find(|d| d.family == family)
                .map_or(PolicyAction::Deny, |d| d.action),
        }
    }

    /// The destinations a readiness probe must check: for every route one
    /// address that route decides, an unlisted address when one exists,
    /// and the connectivity helper's gateway (host loopback) when the
    /// policy denies it. Probing sends no packet: it asks the kernel for a
    /// route by connecting a datagram socket.
    pub fn probe_plan(&self, gateway: Ipv4Addr, names: Option<&NamedEgress>) -> ProbePlan {
        let routes = self.expected_routes(names);
        let mut plan = ProbePlan::default();
        let mut add = |address: IpAddr, action: PolicyAction| match action {
            PolicyAction::Allow => plan.permitted.push(address),
            PolicyAction::Deny => plan.denied.push(address),
        };
        for route in &routes {
            let IpAddr::V4(network) = route.network.address else {
                continue;
            };
            let first = u32::from(network);
            let size = 1u64 << (32 - u32::from(route.network.prefix_len));
            let last = u32::try_from(u64::from(first) + size - 1).unwrap_or(u32::MAX);
            let candidates = [
                first.saturating_add(1).min(last),
                last.saturating_sub(1).max(first),
                first,
            ];
            if let Some(address) = candidates
                .into_iter()
                .map(|a| IpAddr::V4(Ipv4Addr::from(a)))
                .find(|a| longest_match(&routes, *a) == Some(*route))
            {
                add(address, route.action);
            }
        }
        let unlisted = UNLISTED_CANDIDATES
            .into_iter()
            .map(|a| IpAddr::V4(Ipv4Addr::from(a)))
            .find(|a| longest_match(&routes, *a).is_none());
        if let Some(address) = unlisted {
            add(address, self.decide(&routes, address));
        }
        let gateway = IpAddr::V4(gateway);
        if self.decide(&routes, gateway) == PolicyAction::Deny {
            add(gateway, PolicyAction::Deny);
        }
        for list in [&mut plan.denied, &mut plan.permitted] {
            list.sort();
            list.dedup();
        }
        plan
    }
}

/// The route among `routes` that decides `address`: the longest prefix
/// containing it.
fn longest_match(routes: &[PrefixRule], address: IpAddr) -> Option<PrefixRule> {
    routes
        .iter()
        .filter(|r| r.network.contains(address))
        .max_by_key(|r| r.network.prefix_len)
        .copied()
}

/// Addresses tried, in order, as the unlisted destination of a probe.
const UNLISTED_CANDIDATES: [[u8; 4]; 4] = [
    [100, 64, 0, 1],
    [1, 0, 0, 1],
    [223, 255, 255, 1],
    [240, 0, 0, 1],
];

/// The destinations a readiness probe checks, derived from the policy
/// alone, so the Host Coordinator can tell whether a sidecar skipped one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProbePlan {
    /// Must prove unreachable.
    pub denied: Vec<IpAddr>,
    /// Must prove routed via the gateway.
    pub permitted: Vec<IpAddr>,
}

/// The connectivity helper's virtual network as seen from the enforcement
/// namespace: the tap device it creates there, the address the sidecar
/// gives that device, and the gateway that leads out.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectivityLink {
    /// The tap device's name.
    pub tap_name: String,
    /// The enforcement namespace's address on it, installed as a /32 so no
    /// subnet route exists besides the policy's.
    pub guest_address: Ipv4Addr,
    /// The helper's gateway; every allowed prefix routes via it.
    pub gateway: Ipv4Addr,
    /// The tap device's MTU, equal to the helper's.
    pub mtu: u32,
}

impl ConnectivityLink {
    /// The DNS forwarder of slirp4netns's default network.
    pub const SLIRP4NETNS_RESOLVER: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 3);

    /// slirp4netns's default network (10.0.2.0/24) with its largest MTU.
    pub fn slirp4netns() -> Self {
        Self {
            tap_name: "tap0".into(),
            guest_address: Ipv4Addr::new(10, 0, 2, 100),
            gateway: Ipv4Addr::new(10, 0, 2, 2),
            mtu: 65520,
        }
    }

    /// Checks the link is usable: an interface name the kernel accepts,
    /// distinct unicast addresses, and an MTU IPv4 allows.
    pub fn validate(&self) -> Result<(), LinkError> {
        let name_ok = (1..16).contains(&self.tap_name.len())
            && self
                .tap_name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !name_ok {
            return Err(LinkError::TapName(self.tap_name.clone()));
        }
        let unicast = |a: Ipv4Addr| !(a.is_unspecified() || a.is_broadcast() || a.is_multicast());
        if !unicast(self.guest_address)
            || !unicast(self.gateway)
            || self.guest_address == self.gateway
        {
            return Err(LinkError::Addresses {
                guest_address: self.guest_address,
                gateway: self.gateway,
            });
        }
        if !(68..=65535).contains(&self.mtu) {
            return Err(LinkError::Mtu(self.mtu));
        }
        Ok(())
    }
}

/// Why a [`ConnectivityLink`] is unusable.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    /// The tap name is not one the kernel accepts as an interface name.
    #[error("tap_name {0:?} is not an interface name")]
    TapName(String),
    /// The guest address and gateway are not distinct unicast addresses.
    #[error(
        "guest_address and gateway must be distinct unicast addresses \
         ({guest_address} and {gateway} are not)"
    )]
    Addresses {
        /// The guest's address.
        guest_address: Ipv4Addr,
        /// The gateway's.
        gateway: Ipv4Addr,
    },
    /// The MTU is outside what IPv4 allows.
    #[error("mtu {0} is outside 68..=65535")]
    Mtu(u32),
}

impl WireRecord for DerivedNetworkPolicy {
    const NAME: &'static str = "DerivedNetworkPolicy";
    const MAX_ENCODED_LEN: usize = 128 * 1024;
}

/// How the policy reached the sidecar.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PolicyDelivery {
    /// In a memfd sealed against writes, shrinking and growing.
    SealedMemfd,
}

/// What the sidecar read back from the enforcement namespace.
///
/// The seed's field list is partial after `observed_routes`; whether IPv6
/// is off is added, because the policy disables it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkObservation {
    /// How the policy arrived.
    pub policy_delivery: PolicyDelivery,
    /// Whether the connectivity helper's tap device was found attached,
    /// up, and carrying the namespace's address.
    pub helper_ready: bool,
    /// The routes found in the namespace, as rules.
    pub observed_routes: Vec<PrefixRule>,
    /// Whether IPv6 was found disabled on every interface.
    pub ipv6_disabled: bool,
    /// The output filter's rules found in the namespace, in order (its
    /// chains, hooks and drop policies checked as they were read).
    pub observed_filter: Vec<FilterRule>,
}

/// A destination the policy denies, and whether it proved unreachable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DeniedDestinationObservation {
    /// The probed address.
    pub destination: IpAddr,
    /// Whether the kernel refused it as unreachable.
    pub unreachable: bool,
}

/// A destination the policy allows, and whether it proved reachable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PermittedDestinationObservation {
    /// The probed address.
    pub destination: IpAddr,
    /// Whether it routed via the gateway.
    pub reachable: bool,
}

/// How a DNS query through a resolver ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DnsOutcome {
    /// The resolver answered with this response code (0 is NOERROR, 3 is
    /// NXDOMAIN).
    Answered {
        /// The DNS RCODE.
        response_code: u8,
    },
    /// No answer came in time: the resolver is routed, but the host's
    /// resolver did not answer.
    TimedOut,
    /// The query could not be sent: the resolver is not routed.
    Unreachable,
}

/// One DNS query made through a resolver, and its answer.
///
/// The seed's field list is partial after `resolved_addresses`; the outcome
/// is added because a readiness probe records a timeout as observed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DnsObservation {
    /// The resolver asked.
    pub resolver: IpAddr,
    /// The name asked for.
    pub query_name: String,
    /// The addresses answered; empty if none.
    pub resolved_addresses: Vec<IpAddr>,
    /// How the query ended.
    pub outcome: DnsOutcome,
}

/// A request to the sidecar to probe a namespace and attest readiness.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NetworkReachabilityProbe {
    /// The Domain.
    pub domain_id: DomainId,
    /// The generation.
    pub generation_id: GenerationId,
    /// The enforcement namespace to probe (passed alongside as a
    /// descriptor; this identity is what the descriptor must prove to be).
    pub enforcement_namespace: NamespaceIdentity,
}

impl WireRecord for NetworkReachabilityProbe {
    const NAME: &'static str = "NetworkReachabilityProbe";
    const MAX_ENCODED_LEN: usize = 128;
}

/// What is being attested: which policy in which namespace, for which
/// generation, by which sidecar. Its fingerprint is recorded as the
/// network participant's `readiness_fingerprint`.
///
/// The seed's field list is partial after `generation_id`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NetworkReadinessIdentity {
    /// Always `lazaret-network-readiness-identity-v1`.
    pub schema_id: NetworkReadinessIdentitySchemaId,
    /// The Domain.
    pub domain_id: DomainId,
    /// The generation.
    pub generation_id: GenerationId,
    /// The sidecar instance.
    pub network_sidecar_id: NetworkSidecarId,
    /// Digest of the installed policy.
    pub derived_policy_digest: Sha256Digest,
    /// The enforcement namespace.
    pub enforcement_namespace: NamespaceIdentity,
}

impl NetworkReadinessIdentity {
    /// SHA-256 over the schema identifier, a NUL, and the encoding.
    pub fn fingerprint(&self) -> Result<Sha256Digest, EncodeError> {
        tagged_digest(NetworkReadinessIdentitySchemaId::TEXT, self)
    }
}

impl WireRecord for NetworkReadinessIdentity {
    const NAME: &'static str = "NetworkReadinessIdentity";
    const MAX_ENCODED_LEN: usize = 256;
}

/// The sidecar's answer: what it installed and what it observed.
///
/// The seed's field list is partial after `generation_id`; the rest are the
/// identity fields and the observations the design brief lists (routes read
/// back, denied destinations unreachable, permitted reachable, DNS
/// answered).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkReadinessAttestation {
    /// Always `lazaret-network-readiness-attestation-v1`.
    pub schema_id: NetworkReadinessAttestationSchemaId,
    /// The Domain.
    pub domain_id: DomainId,
    /// The generation.
    pub generation_id: GenerationId,
    /// The sidecar instance.
    pub network_sidecar_id: NetworkSidecarId,
    /// Digest of the policy the sidecar installed.
    pub derived_policy_digest: Sha256Digest,
    /// The namespace it installed the policy in.
    pub enforcement_namespace: NamespaceIdentity,
    /// What it read back.
    pub observation: NetworkObservation,
    /// Denied destinations probed.
    pub denied_destinations: Vec<DeniedDestinationObservation>,
    /// Permitted destinations probed.
    pub permitted_destinations: Vec<PermittedDestinationObservation>,
    /// DNS queries made.
    pub dns_observations: Vec<DnsObservation>,
    /// When the observations were completed.
    pub observed_at: UnixTimeNs,
}

impl NetworkReadinessAttestation {
    /// The identity this attestation is about.
    pub fn readiness_identity(&self) -> NetworkReadinessIdentity {
        NetworkReadinessIdentity {
            schema_id: NetworkReadinessIdentitySchemaId,
            domain_id: self.domain_id,
            generation_id: self.generation_id,
            network_sidecar_id: self.network_sidecar_id,
            derived_policy_digest: self.derived_policy_digest,
            enforcement_namespace: self.enforcement_namespace,
        }
    }

    /// Whether every observation shows a ready network: the helper ready,
    /// IPv6 off, at least one denied and one permitted probe and every probe
    /// as the policy wants, and at least one DNS query that left (answered
    /// or timed out: either is what the host's resolver did). The identity
    /// is checked separately, against what was asked for.
    pub fn observations_show_ready(&self) -> bool {
        let o = &self.observation;
        o.helper_ready
            && o.ipv6_disabled
            && !self.denied_destinations.is_empty()
            && self.denied_destinations.iter().all(|d| d.unreachable)
            && !self.permitted_destinations.is_empty()
            && self.permitted_destinations.iter().all(|p| p.reachable)
            && !self.dns_observations.is_empty()
            && self
                .dns_observations
                .iter()
                .all(|d| d.outcome != DnsOutcome::Unreachable)
    }

    /// Checks the attestation is about exactly what was asked and shows the
    /// policy in force: the same identity, the routes and the filter read
    /// back equal to the policy's, every destination of the policy's probe plan probed
    /// and none else, and observations that show a ready network.
    pub fn verify(
        &self,
        expected: &NetworkReadinessIdentity,
        policy: &DerivedNetworkPolicy,
        names: Option<&NamedEgress>,
        link: &ConnectivityLink,
    ) -> Result<(), AttestationMismatch> {
        if self.readiness_identity() != *expected {
            return Err(AttestationMismatch::Identity);
        }
        if self.observation.observed_routes != policy.expected_routes(names) {
            return Err(AttestationMismatch::Routes);
        }
        if self.observation.observed_filter != policy.expected_filter(names) {
            return Err(AttestationMismatch::Filter);
        }
        let plan = policy.probe_plan(link.gateway, names);
        let mut denied: Vec<_> = self
            .denied_destinations
            .iter()
            .map(|d| d.destination)
            .collect();
        let mut permitted: Vec<_> = self
            .permitted_destinations
            .iter()
            .map(|p| p.destination)
            .collect();
        denied.sort();
        permitted.sort();
        if denied != plan.denied || permitted != plan.permitted {
            return Err(AttestationMismatch::Probes);
        }
        if !self.observations_show_ready() {
            return Err(AttestationMismatch::NotReady);
        }
        Ok(())
    }

    /// SHA-256 over the schema identifier, a NUL, and the encoding.
    pub fn digest(&self) -> Result<Sha256Digest, EncodeError> {
        tagged_digest(NetworkReadinessAttestationSchemaId::TEXT, self)
    }

    /// The evidence recorded in the network participant once this
    /// attestation is accepted.
    pub fn evidence(&self) -> Result<NetworkReadinessEvidence, EncodeError> {
        Ok(NetworkReadinessEvidence {
            domain_id: self.domain_id,
            generation_id: self.generation_id,
            network_sidecar_id: self.network_sidecar_id,
            attestation_digest: self.digest()?,
        })
    }
}

impl WireRecord for NetworkReadinessAttestation {
    const NAME: &'static str = "NetworkReadinessAttestation";
    const MAX_ENCODED_LEN: usize = 256 * 1024;
}

impl NetworkObservation {
    /// How what a later read-back found differs from `policy` in force:
    /// nothing when the routes, the rules and the filter are still the
    /// policy's and the helper's device is up.
    pub fn drift(
        &self,
        policy: &DerivedNetworkPolicy,
        names: Option<&NamedEgress>,
    ) -> Vec<NetworkDrift> {
        let mut drift = Vec::new();
        if self.observed_routes != policy.expected_routes(names) {
            drift.push(NetworkDrift::Routes);
        }
        if self.observed_filter != policy.expected_filter(names) {
            drift.push(NetworkDrift::Filter);
        }
        if !self.helper_ready {
            drift.push(NetworkDrift::HelperDown);
        }
        if !self.ipv6_disabled {
            drift.push(NetworkDrift::Ipv6Enabled);
        }
        drift
    }
}

/// A way a running namespace no longer shows its attested policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum NetworkDrift {
    /// The routes differ from the policy's.
    #[error("the routes differ from the policy")]
    Routes,
    /// The packet filter differs from the policy's.
    #[error("the packet filter differs from the policy")]
    Filter,
    /// The connectivity helper's device is down or unaddressed.
    #[error("the connectivity helper's device is down")]
    HelperDown,
    /// IPv6 is enabled on an interface.
    #[error("IPv6 is enabled on an interface")]
    Ipv6Enabled,
}

/// Why an attestation is not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AttestationMismatch {
    /// It names another Domain, generation, sidecar, policy or namespace.
    #[error("it attests another Domain, generation, sidecar, policy or network namespace")]
    Identity,
    /// The routes read back differ from the policy's.
    #[error("the routes read back from the namespace differ from the policy")]
    Routes,
    /// The filter read back differs from the policy's.
    #[error("the packet filter read back from the namespace differs from the policy")]
    Filter,
    /// It probed other destinations than the policy's probe plan.
    #[error("it did not probe exactly the destinations the policy calls for")]
    Probes,
    /// An observation shows the network not ready.
    #[error("its observations do not show the policy in force")]
    NotReady,
}

/// The durable trace of an accepted attestation, kept in the network
/// participant.
///
/// The seed's field list is partial after `network_sidecar_id`; the
/// attestation's digest ties the evidence to exactly what was accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NetworkReadinessEvidence {
    /// The Domain.
    pub domain_id: DomainId,
    /// The generation.
    pub generation_id: GenerationId,
    /// The sidecar that attested.
    pub network_sidecar_id: NetworkSidecarId,
    /// Digest of the accepted attestation.
    pub attestation_digest: Sha256Digest,
}

#[cfg(test)]
pub(crate) mod tests {
    use std::net::Ipv6Addr;

    use super::*;
    use crate::codec;
    use crate::names::{DnsMode, HostPattern};
    use crate::test_support::{
        assert_rejects_bad_envelopes, assert_rejects_unknown_discriminant, round_trip,
    };

    pub(crate) fn policy() -> DerivedNetworkPolicy {
        DerivedNetworkPolicy::ipv4_only(
            [IpPrefix::ipv4([203, 0, 113, 10], 32).unwrap()],
            [
                IpPrefix::ipv4([10, 0, 0, 0], 8).unwrap(),
                IpPrefix::ipv4([172, 16, 0, 0], 12).unwrap(),
                IpPrefix::ipv4([192, 168, 0, 0], 16).unwrap(),
            ],
            [Ipv4Addr::new(10, 0, 2, 3)],
        )
    }

    pub(crate) fn attestation() -> NetworkReadinessAttestation {
        let policy = policy();
        NetworkReadinessAttestation {
            schema_id: NetworkReadinessAttestationSchemaId,
            domain_id: DomainId([1; 32]),
            generation_id: GenerationId(2),
            network_sidecar_id: NetworkSidecarId([3; 16]),
            derived_policy_digest: policy.digest().unwrap(),
            enforcement_namespace: NamespaceIdentity {
                device: 4,
                inode: 4026532000,
            },
            observation: NetworkObservation {
                policy_delivery: PolicyDelivery::SealedMemfd,
                helper_ready: true,
                observed_routes: policy.prefix_rules.clone(),
                ipv6_disabled: true,
                observed_filter: policy.expected_filter(None),
            },
            denied_destinations: vec![DeniedDestinationObservation {
                destination: IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3)),
                unreachable: true,
            }],
            permitted_destinations: vec![PermittedDestinationObservation {
                destination: IpAddr::V4(Ipv4Addr::new(203, 0, 113, 10)),
                reachable: true,
            }],
            dns_observations: vec![DnsObservation {
                resolver: IpAddr::V4(Ipv4Addr::new(10, 0, 2, 3)),
                query_name: "example.test".into(),
                resolved_addresses: vec![IpAddr::V4(Ipv4Addr::new(198, 18, 0, 10))],
                outcome: DnsOutcome::Answered { response_code: 0 },
            }],
            observed_at: UnixTimeNs(1),
        }
    }

    #[test]
    fn policy_round_trips_validates_and_digests_canonically() {
        let policy = policy();
        policy.validate().unwrap();
        let bytes = round_trip(&policy);
        assert_rejects_bad_envelopes(&policy);

        let mut shuffled = policy.clone();
        shuffled.prefix_rules.reverse();
        shuffled.address_families.reverse();
        assert_ne!(codec::encode(&shuffled).unwrap(), bytes);
        assert_eq!(shuffled.digest().unwrap(), policy.digest().unwrap());

        let mut other = policy.clone();
        other.prefix_rules[0].action = PolicyAction::Allow;
        assert_ne!(other.digest().unwrap(), policy.digest().unwrap());
    }

    #[test]
    fn policy_validation_refuses_contradictions() {
        let mut p = policy();
        p.prefix_rules.push(PrefixRule {
            family: AddressFamily::IPv4,
            network: IpPrefix {
                address: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
                prefix_len: 8,
            },
            action: PolicyAction::Allow,
        });
        assert_eq!(
            p.validate(),
            Err(PolicyError::NotNormalized(p.prefix_rules.len() - 1))
        );

        let mut p = policy();
        let again = PrefixRule {
            action: PolicyAction::Allow,
            ..p.prefix_rules[0]
        };
        p.prefix_rules.push(again);
        assert!(matches!(p.validate(), Err(PolicyError::DuplicatePrefix(_))));

        let mut p = policy();
        p.prefix_rules.push(PrefixRule {
            family: AddressFamily::IPv6,
            network: IpPrefix {
                address: IpAddr::V6(Ipv6Addr::UNSPECIFIED),
                prefix_len: 0,
            },
            action: PolicyAction::Allow,
        });
        assert!(matches!(
            p.validate(),
            Err(PolicyError::FamilyNotEnabled { .. })
        ));

        let mut p = policy();
        p.resolvers[0].family = AddressFamily::IPv6;
        assert!(matches!(
            p.validate(),
            Err(PolicyError::FamilyMismatch { .. })
        ));

        let mut p = policy();
        p.default_actions.clear();
        assert_eq!(
            p.validate(),
            Err(PolicyError::MissingDefault(AddressFamily::IPv4))
        );
    }

    fn v4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(a, b, c, d))
    }

    #[test]
    fn longest_prefix_decides() {
        // Allow 10.222.0.0/16 with deny 10.0.0.0/8 reaches 10.222.x, not 10.1.x.
        let policy = DerivedNetworkPolicy::ipv4_only(
            [IpPrefix::ipv4([10, 222, 0, 0], 16).unwrap()],
            [IpPrefix::ipv4([10, 0, 0, 0], 8).unwrap()],
            [ConnectivityLink::SLIRP4NETNS_RESOLVER],
        );
        policy.validate().unwrap();
        assert_eq!(policy.action_for(v4(10, 222, 5, 6)), PolicyAction::Allow);
        assert_eq!(policy.action_for(v4(10, 1, 2, 3)), PolicyAction::Deny);
        assert_eq!(policy.action_for(v4(10, 0, 2, 3)), PolicyAction::Allow);
        assert_eq!(policy.action_for(v4(10, 0, 2, 2)), PolicyAction::Deny);
        assert_eq!(policy.action_for(v4(8, 8, 8, 8)), PolicyAction::Deny);
        let v6 = IpAddr::V6("2001:db8::1".parse().unwrap());
        assert_eq!(policy.action_for(v6), PolicyAction::Deny);
    }

    #[test]
    fn probe_plan_covers_every_route_with_an_address_it_decides() {
        let policy = DerivedNetworkPolicy::ipv4_only(
            [
                IpPrefix::ipv4([10, 222, 0, 0], 16).unwrap(),
                IpPrefix::ipv4([198, 18, 0, 10], 32).unwrap(),
            ],
            [
                IpPrefix::ipv4([10, 0, 0, 0], 8).unwrap(),
                IpPrefix::ipv4([198, 18, 0, 0], 24).unwrap(),
            ],
            [ConnectivityLink::SLIRP4NETNS_RESOLVER],
        );
        let link = ConnectivityLink::slirp4netns();
        let plan = policy.probe_plan(link.gateway, None);
        assert_eq!(
            plan.permitted,
            vec![v4(10, 0, 2, 3), v4(10, 222, 0, 1), v4(198, 18, 0, 10)]
        );
        assert_eq!(
            plan.denied,
            vec![
                v4(10, 0, 0, 1),
                v4(10, 0, 2, 2),
                v4(100, 64, 0, 1),
                v4(198, 18, 0, 1)
            ]
        );
        for address in &plan.denied {
            assert_eq!(policy.action_for(*address), PolicyAction::Deny);
        }
        for address in &plan.permitted {
            assert_eq!(policy.action_for(*address), PolicyAction::Allow);
        }
        // Allowing everything leaves no unlisted address to probe.
        let open = DerivedNetworkPolicy::ipv4_only(
            [IpPrefix::ipv4([0, 0, 0, 0], 0).unwrap()],
            [IpPrefix::ipv4([10, 0, 0, 0], 8).unwrap()],
            [ConnectivityLink::SLIRP4NETNS_RESOLVER],
        );
        let plan = open.probe_plan(link.gateway, None);
        assert_eq!(plan.denied, vec![v4(10, 0, 0, 1), v4(10, 0, 2, 2)]);
        assert!(plan.permitted.contains(&v4(0, 0, 0, 1)));
    }

    /// An attestation of `policy` as a working sidecar makes it: every
    /// route read back, every planned destination probed as the policy
    /// wants.
    fn attestation_of(policy: &DerivedNetworkPolicy) -> NetworkReadinessAttestation {
        let plan = policy.probe_plan(ConnectivityLink::slirp4netns().gateway, None);
        let mut attestation = attestation();
        attestation.derived_policy_digest = policy.digest().unwrap();
        attestation.observation.observed_routes = policy.expected_routes(None);
        attestation.observation.observed_filter = policy.expected_filter(None);
        attestation.denied_destinations = plan
            .denied
            .iter()
            .map(|&destination| DeniedDestinationObservation {
                destination,
                unreachable: true,
            })
            .collect();
        attestation.permitted_destinations = plan
            .permitted
            .iter()
            .map(|&destination| PermittedDestinationObservation {
                destination,
                reachable: true,
            })
            .collect();
        attestation
    }

    #[test]
    fn a_policy_holds_a_bounded_number_of_rules() {
        let rules = |n: u32| {
            (0..n).map(|i| IpPrefix::ipv4((0x0b00_0000 + (i << 8)).to_be_bytes(), 24).unwrap())
        };
        let max = u32::try_from(DerivedNetworkPolicy::MAX_PREFIX_RULES).unwrap();
        let full = DerivedNetworkPolicy::ipv4_only(rules(max), [], []);
        assert_eq!(full.validate(), Ok(()));
        let over = DerivedNetworkPolicy::ipv4_only(rules(max + 1), [], []);
        assert_eq!(
            over.validate(),
            Err(PolicyError::TooManyRules(
                DerivedNetworkPolicy::MAX_PREFIX_RULES + 1
            ))
        );
        // The largest policy's attestation, with every route read back and
        // probed, still fits a status report.
        let big = attestation_of(&full);
        let size = codec::encode(&full).unwrap().len() + codec::encode(&big).unwrap().len();
        assert!(size < 48 * 1024, "{size} bytes");
    }

    fn names() -> NamedEgress {
        NamedEgress::new(
            ["api.example.org", "*.pkgs.example.org"].map(|h| HostPattern::parse(h).unwrap()),
            DnsMode::Lazaret,
        )
    }

    #[test]
    fn names_route_everything_and_let_the_set_decide() {
        let policy = policy();
        let names = names();
        let everything = IpPrefix::ipv4([0, 0, 0, 0], 0).unwrap();
        let routes = policy.expected_routes(Some(&names));
        assert!(
            routes
                .iter()
                .any(|r| r.network == everything && r.action == PolicyAction::Allow)
        );
        assert_eq!(routes.len(), policy.expected_routes(None).len() + 1);
        // The filter: marked DNS only, and the set last, after every denial.
        let filter = policy.expected_filter(Some(&names));
        assert_eq!(
            filter[1],
            FilterRule::AcceptMarkedDns {
                resolver: Ipv4Addr::new(10, 0, 2, 3),
                mark: NamedEgress::UPSTREAM_MARK,
            }
        );
        assert_eq!(
            filter[filter.len() - 2..],
            [FilterRule::AcceptEstablished, FilterRule::AcceptNamed]
        );
        assert!(!filter.contains(&FilterRule::AcceptDns {
            resolver: Ipv4Addr::new(10, 0, 2, 3)
        }));
        // DNS alone (no hosts): no default route, no set.
        let dns_only = NamedEgress::new([], DnsMode::Lazaret);
        assert_eq!(
            policy.expected_routes(Some(&dns_only)),
            policy.expected_routes(None)
        );
        assert!(
            !policy
                .expected_filter(Some(&dns_only))
                .contains(&FilterRule::AcceptNamed)
        );
        // The probe plan has no unlisted address left to probe, and still
        // a permitted one (the resolver).
        let plan = policy.probe_plan(ConnectivityLink::slirp4netns().gateway, Some(&names));
        assert!(!plan.permitted.is_empty() && !plan.denied.is_empty());
    }

    #[test]
    fn no_denied_address_is_admitted() {
        let policy = policy();
        for (address, admitted) in [
            ([198, 18, 2, 10], true),
            ([203, 0, 113, 10], true),
            ([10, 1, 2, 3], false),
            ([192, 168, 1, 1], false),
            ([127, 0, 0, 1], false),
            ([0, 0, 0, 0], false),
            ([10, 0, 2, 3], false),
        ] {
            assert_eq!(
                policy.admits(Ipv4Addr::from(address)),
                admitted,
                "{address:?}"
            );
        }
    }

    #[test]
    fn names_have_a_probe_name_and_a_digest() {
        let names = names();
        assert_eq!(names.allowed_probe().as_deref(), Some("api.example.org"));
        let wild = NamedEgress::new(
            [HostPattern::parse("*.a.example").unwrap()],
            DnsMode::Lazaret,
        );
        let probe = wild.allowed_probe().unwrap();
        assert!(wild.allows(&probe), "{probe}");
        assert_eq!(NamedEgress::new([], DnsMode::Lazaret).allowed_probe(), None);
        assert_ne!(names.digest().unwrap(), wild.digest().unwrap());
        let host = NamedEgress::new(names.hosts.clone(), DnsMode::Host);
        assert_ne!(names.digest().unwrap(), host.digest().unwrap());
        assert_eq!(
            NamedEgress::admission_timeout(Duration::from_secs(5)),
            Duration::from_secs(30)
        );
        assert_eq!(
            NamedEgress::admission_timeout(Duration::from_secs(86_400)),
            Duration::from_secs(3600)
        );
    }

    #[test]
    fn the_filter_decides_as_the_routes_do() {
        // A /32 allowed inside a denied /24 inside an allowed /8: the
        // filter lists them longest first, so its first match is the
        // route's longest match; multicast and broadcast go before all.
        let policy = DerivedNetworkPolicy::ipv4_only(
            [
                IpPrefix::ipv4([0, 0, 0, 0], 0).unwrap(),
                IpPrefix::ipv4([198, 18, 0, 10], 32).unwrap(),
            ],
            [IpPrefix::ipv4([198, 18, 0, 0], 24).unwrap()],
            [ConnectivityLink::SLIRP4NETNS_RESOLVER],
        );
        let filter = policy.expected_filter(None);
        let prefix = |octets, len, action| FilterRule::Prefix {
            network: IpPrefix::ipv4(octets, len).unwrap(),
            action,
        };
        assert_eq!(
            filter,
            [
                FilterRule::AcceptLoopback,
                FilterRule::AcceptDns {
                    resolver: ConnectivityLink::SLIRP4NETNS_RESOLVER
                },
                prefix([224, 0, 0, 0], 4, PolicyAction::Deny),
                prefix([255, 255, 255, 255], 32, PolicyAction::Deny),
                prefix([198, 18, 0, 10], 32, PolicyAction::Allow),
                prefix([198, 18, 0, 0], 24, PolicyAction::Deny),
                prefix([0, 0, 0, 0], 0, PolicyAction::Allow),
            ]
        );
        for address in [[198, 18, 0, 10], [198, 18, 0, 11], [8, 8, 8, 8]] {
            let first = filter.iter().find_map(|rule| match rule {
                FilterRule::Prefix { network, action }
                    if network.contains(IpAddr::from(address)) =>
                {
                    Some(*action)
                }
                _ => None,
            });
            assert_eq!(
                first,
                Some(policy.action_for(IpAddr::from(address))),
                "{address:?}"
            );
        }
    }

    #[test]
    fn a_rule_may_not_shadow_the_resolver() {
        let policy = DerivedNetworkPolicy::ipv4_only(
            [],
            [IpPrefix::ipv4([10, 0, 2, 3], 32).unwrap()],
            [ConnectivityLink::SLIRP4NETNS_RESOLVER],
        );
        assert_eq!(policy.validate(), Err(PolicyError::ResolverShadowed(0)));
    }

    #[test]
    fn verify_accepts_only_a_matching_complete_attestation() {
        let policy = policy();
        let link = ConnectivityLink::slirp4netns();
        let good = attestation_of(&policy);
        let identity = good.readiness_identity();
        assert_eq!(good.verify(&identity, &policy, None, &link), Ok(()));

        let mut other = identity;
        other.generation_id = GenerationId(9);
        assert_eq!(
            good.verify(&other, &policy, None, &link),
            Err(AttestationMismatch::Identity)
        );
        let mut routes = good.clone();
        routes.observation.observed_routes.pop();
        assert_eq!(
            routes.verify(&identity, &policy, None, &link),
            Err(AttestationMismatch::Routes)
        );
        // A filter rule missing, or two swapped (first match wins).
        let mut filter = good.clone();
        filter.observation.observed_filter.pop();
        assert_eq!(
            filter.verify(&identity, &policy, None, &link),
            Err(AttestationMismatch::Filter)
        );
        let mut swapped = good.clone();
        swapped.observation.observed_filter.swap(3, 4);
        assert_eq!(
            swapped.verify(&identity, &policy, None, &link),
            Err(AttestationMismatch::Filter)
        );
        let mut skipped = good.clone();
        skipped.denied_destinations.pop();
        assert_eq!(
            skipped.verify(&identity, &policy, None, &link),
            Err(AttestationMismatch::Probes)
        );
        let mut open = good.clone();
        open.denied_destinations[0].unreachable = false;
        assert_eq!(
            open.verify(&identity, &policy, None, &link),
            Err(AttestationMismatch::NotReady)
        );
        let mut dns = good;
        dns.dns_observations[0].outcome = DnsOutcome::TimedOut;
        assert_eq!(dns.verify(&identity, &policy, None, &link), Ok(()));
        dns.dns_observations[0].outcome = DnsOutcome::Unreachable;
        assert_eq!(
            dns.verify(&identity, &policy, None, &link),
            Err(AttestationMismatch::NotReady)
        );
    }

    #[test]
    fn the_slirp4netns_link_validates() {
        let link = ConnectivityLink::slirp4netns();
        assert_eq!(link.validate(), Ok(()));
        let long = ConnectivityLink {
            tap_name: "a-name-too-long-for-linux".into(),
            ..link.clone()
        };
        assert!(long.validate().is_err());
        let same = ConnectivityLink {
            gateway: link.guest_address,
            ..link
        };
        assert!(same.validate().is_err());
    }

    #[test]
    fn prefixes_normalize() {
        assert!(IpPrefix::ipv4([10, 0, 0, 0], 8).is_some());
        assert!(IpPrefix::ipv4([10, 0, 0, 1], 8).is_none());
        assert!(IpPrefix::ipv4([0, 0, 0, 0], 0).is_some());
        assert!(IpPrefix::ipv4([1, 2, 3, 4], 32).is_some());
        assert!(IpPrefix::ipv4([1, 2, 3, 4], 33).is_none());
        let v6 = IpPrefix {
            address: IpAddr::V6("2001:db8::".parse().unwrap()),
            prefix_len: 32,
        };
        assert!(v6.is_normalized());
    }

    #[test]
    fn attestation_round_trips_and_yields_identity_and_evidence() {
        let attestation = attestation();
        assert!(attestation.observations_show_ready());
        round_trip(&attestation);
        assert_rejects_bad_envelopes(&attestation);

        let identity = attestation.readiness_identity();
        round_trip(&identity);
        assert_rejects_bad_envelopes(&identity);
        let evidence = attestation.evidence().unwrap();
        assert_eq!(evidence.attestation_digest, attestation.digest().unwrap());
        assert_ne!(
            identity.fingerprint().unwrap(),
            attestation.digest().unwrap()
        );

        let mut blocked = attestation;
        blocked.denied_destinations[0].unreachable = false;
        assert!(!blocked.observations_show_ready());
    }

    #[test]
    fn probe_round_trips_and_unknown_family_is_refused() {
        let probe = NetworkReachabilityProbe {
            domain_id: DomainId([1; 32]),
            generation_id: GenerationId(2),
            enforcement_namespace: NamespaceIdentity {
                device: 4,
                inode: 5,
            },
        };
        round_trip(&probe);
        assert_rejects_bad_envelopes(&probe);

        let bytes = codec::encode(&policy()).unwrap();
        // version, schema id (length + text), list length, first family.
        let index = 2 + DerivedNetworkPolicySchemaId::TEXT.len() + 1;
        assert_eq!(bytes[index], 0);
        assert_rejects_unknown_discriminant::<DerivedNetworkPolicy>(bytes, index);
    }
}
