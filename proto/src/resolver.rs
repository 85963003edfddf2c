//! The Runtime Supervisor ↔ resolver link: the one request that starts
//! Lazaret's resolver for a generation, and the one report that says it
//! serves, with what its readiness probes saw.
//!
//! This module owns the messages of that channel. The sealed policy memfd
//! travels beside the request with SCM_RIGHTS. The resolver trusts only the
//! supervisor at the other end of its inherited channel and validates the
//! policy it reads; the Host Coordinator trusts no field of the report
//! until it checks it against the names it asked for.

use std::net::{Ipv4Addr, SocketAddrV4};

use serde::{Deserialize, Serialize};

use crate::channel::FdIndex;
use crate::codec::WireRecord;
use crate::ids::Sha256Digest;
use crate::network::NamedEgress;

/// What the resolver is asked to do: serve `names` for the policy in the
/// memfd, upstream through `upstream`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServeRequest {
    /// The names the sandbox may resolve, and who answers the others.
    pub names: NamedEgress,
    /// The resolver it forwards to (the connectivity helper's).
    pub upstream: Ipv4Addr,
    /// The sealed memfd holding the encoded
    /// [`DerivedNetworkPolicy`](crate::network::DerivedNetworkPolicy), whose
    /// denials no admitted address may fall in.
    pub policy: FdIndex,
    /// The Credential Proxy's hosts: answered to the sandbox with the
    /// proxy's address ([`crate::credproxy::LISTEN`]) once their real
    /// addresses are admitted, and looked up for the proxy on `lookups`.
    pub proxied: Vec<String>,
    /// The resolver's end of the proxy's lookup socket pair, when there
    /// is a proxy.
    pub lookups: Option<FdIndex>,
}

/// The supervisor's request to its resolver.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ResolverRequest {
    /// Serve until the Domain pid namespace ends.
    Serve(ServeRequest),
}

impl WireRecord for ResolverRequest {
    const NAME: &'static str = "ResolverRequest";
}

/// One readiness query the resolver sent to itself, and its answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResolverProbe {
    /// The name asked for (type A).
    pub name: String,
    /// The answer's RCODE (0 NOERROR, 2 SERVFAIL, 3 NXDOMAIN, 5 REFUSED).
    pub response_code: u8,
    /// The addresses answered.
    pub addresses: Vec<Ipv4Addr>,
    /// Whether the query was sent upstream.
    pub forwarded: bool,
}

/// The capabilities the resolver is started with, in the Domain user
/// namespace: binding port 53 (dropped once bound), marking its upstream
/// sockets and filling the filter's set.
pub const CAPABILITIES: rustix::thread::CapabilitySet =
    rustix::thread::CapabilitySet::NET_ADMIN.union(rustix::thread::CapabilitySet::NET_BIND_SERVICE);

/// The rcode of a refused query.
pub const REFUSED: u8 = 5;

/// What the resolver reports once it serves: where, for which names, and
/// its two readiness probes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResolverReadiness {
    /// The digest of the [`NamedEgress`] it serves.
    pub names_digest: Sha256Digest,
    /// Where it listens.
    pub listen: SocketAddrV4,
    /// A name the policy allows, answered (by the upstream or, when it is
    /// silent, with SERVFAIL); none when no name is allowed.
    pub allowed_probe: Option<ResolverProbe>,
    /// A name the policy does not allow: refused without being forwarded
    /// (forwarded with `dns = "host"`).
    pub refused_probe: ResolverProbe,
}

impl ResolverReadiness {
    /// Checks the readiness is about `names` and shows them served: the
    /// same names, the listening address, the disallowed probe refused and
    /// never forwarded unless DNS is the host's, and the allowed probe
    /// answered when a name is allowed.
    pub fn verify(&self, names: &NamedEgress) -> Result<(), ReadinessMismatch> {
        if self.names_digest != names.digest().map_err(ReadinessMismatch::Digest)? {
            return Err(ReadinessMismatch::OtherNames);
        }
        if self.listen != NamedEgress::LISTEN {
            return Err(ReadinessMismatch::Listen(self.listen));
        }
        let refused = &self.refused_probe;
        if refused.name != NamedEgress::REFUSED_PROBE {
            return Err(ReadinessMismatch::RefusedProbeName(refused.name.clone()));
        }
        if names.dns == crate::names::DnsMode::Lazaret
            && (refused.forwarded || refused.response_code != REFUSED)
        {
            return Err(ReadinessMismatch::NotRefused {
                response_code: refused.response_code,
                forwarded: refused.forwarded,
            });
        }
        match (&self.allowed_probe, names.allowed_probe()) {
            (None, None) => Ok(()),
            (Some(probe), Some(name)) if probe.name == name && probe.forwarded => Ok(()),
            (Some(probe), _) => Err(ReadinessMismatch::AllowedProbe(probe.name.clone())),
            (None, Some(name)) => Err(ReadinessMismatch::NoAllowedProbe(name)),
        }
    }
}

/// Why a resolver's readiness is not accepted.
#[derive(Debug, thiserror::Error)]
pub enum ReadinessMismatch {
    /// The names could not be encoded to be digested.
    #[error("cannot digest the names")]
    Digest(#[source] crate::codec::EncodeError),
    /// It serves other names.
    #[error("it serves other names than it was given")]
    OtherNames,
    /// It listens elsewhere.
    #[error("it listens on {0}, not {expected}", expected = NamedEgress::LISTEN)]
    Listen(SocketAddrV4),
    /// Its disallowed probe asked another name.
    #[error("it probed {0:?} as the refused name")]
    RefusedProbeName(String),
    /// A disallowed name was answered or went upstream.
    #[error(
        "it did not refuse a name the policy does not allow (rcode {response_code}, \
         forwarded: {forwarded})"
    )]
    NotRefused {
        /// The answer's RCODE.
        response_code: u8,
        /// Whether it went upstream.
        forwarded: bool,
    },
    /// Its allowed probe asked another name, or was not forwarded.
    #[error("its allowed probe {0:?} was not the expected name or was not forwarded")]
    AllowedProbe(String),
    /// It made no allowed probe though a name is allowed.
    #[error("it did not probe the allowed name {0}")]
    NoAllowedProbe(String),
}

/// The step a resolver failed at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ResolverStep {
    /// Checking its own privileges.
    Privileges,
    /// Reading its request or policy.
    Request,
    /// Opening its sockets.
    Sockets,
    /// Probing itself.
    Probe,
}

/// Why the resolver does not serve.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{step:?}: {failure}")]
pub struct ResolverError {
    /// The step.
    pub step: ResolverStep,
    /// What failed and why.
    pub failure: crate::failure::Failure,
}

/// The resolver's one report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ResolverReport {
    /// It serves, and keeps serving until the Domain pid namespace ends.
    Serving(ResolverReadiness),
    /// It could not start serving; it exits.
    Failed(ResolverError),
}

impl WireRecord for ResolverReport {
    const NAME: &'static str = "ResolverReport";
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::{DnsMode, HostPattern};

    fn readiness(names: &NamedEgress) -> ResolverReadiness {
        ResolverReadiness {
            names_digest: names.digest().unwrap(),
            listen: NamedEgress::LISTEN,
            allowed_probe: names.allowed_probe().map(|name| ResolverProbe {
                name,
                response_code: 0,
                addresses: vec![Ipv4Addr::new(198, 18, 2, 10)],
                forwarded: true,
            }),
            refused_probe: ResolverProbe {
                name: NamedEgress::REFUSED_PROBE.into(),
                response_code: REFUSED,
                addresses: vec![],
                forwarded: false,
            },
        }
    }

    #[test]
    fn readiness_is_checked_against_the_names() {
        let names = NamedEgress::new([HostPattern::parse("a.example").unwrap()], DnsMode::Lazaret);
        let good = readiness(&names);
        assert!(good.verify(&names).is_ok());
        let other = NamedEgress::new([HostPattern::parse("b.example").unwrap()], DnsMode::Lazaret);
        assert!(good.verify(&other).is_err(), "other names");
        let mut leaked = good.clone();
        leaked.refused_probe.forwarded = true;
        assert!(
            leaked.verify(&names).is_err(),
            "a disallowed name went upstream"
        );
        let mut answered = good.clone();
        answered.refused_probe.response_code = 0;
        assert!(
            answered.verify(&names).is_err(),
            "a disallowed name answered"
        );
        let mut skipped = good.clone();
        skipped.allowed_probe = None;
        assert!(skipped.verify(&names).is_err(), "no allowed probe");
        let mut elsewhere = good;
        elsewhere.listen = std::net::SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 1), 53);
        assert!(elsewhere.verify(&names).is_err(), "another address");
        // With the host's DNS, the disallowed name is forwarded.
        let host = NamedEgress::new(names.hosts.clone(), DnsMode::Host);
        let mut forwarded = readiness(&host);
        forwarded.refused_probe.forwarded = true;
        forwarded.refused_probe.response_code = 3;
        assert!(forwarded.verify(&host).is_ok());
    }
}
