//! The Runtime Supervisor ↔ Network Sidecar link: the one request that asks
//! the sidecar to install a generation's policy and attest it, and the one
//! report it answers with.
//!
//! This module owns the messages of that channel. Descriptors (the
//! enforcement namespace and the sealed policy memfd) travel beside the
//! request with SCM_RIGHTS and are named by their index in the packet. The
//! sidecar trusts only the supervisor at the other end of its inherited
//! channel, and even then checks that the namespace descriptor names the
//! namespace in the probe and that the policy validates; the supervisor
//! forwards the report to the Host Coordinator, which trusts no field of it
//! until the attestation verifies against what it asked for.

use serde::{Deserialize, Serialize};

use crate::channel::FdIndex;
use crate::codec::WireRecord;
use crate::failure::Failure;
use crate::ids::NetworkSidecarId;
use crate::network::{
    ConnectivityLink, NamedEgress, NetworkReachabilityProbe, NetworkReadinessAttestation,
};

/// What an attestation is asked for; the Host Coordinator chooses it and
/// the supervisor passes it on unchanged.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttestParameters {
    /// Which Domain, generation and namespace the attestation is for.
    pub probe: NetworkReachabilityProbe,
    /// The sidecar instance's identifier.
    pub network_sidecar_id: NetworkSidecarId,
    /// The connectivity helper's network in the namespace.
    pub link: ConnectivityLink,
    /// The policy's names (a v2 profile's), whose resolver alone may ask
    /// the upstream resolver and whose admitted addresses the filter's set
    /// holds.
    pub names: Option<NamedEgress>,
}

/// What the sidecar is asked to do: install the policy in the namespace,
/// probe it, and attest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttestRequest {
    /// What to attest.
    pub parameters: AttestParameters,
    /// The enforcement network namespace (an nsfs descriptor).
    pub namespace: FdIndex,
    /// The sealed memfd holding the encoded
    /// [`DerivedNetworkPolicy`](crate::network::DerivedNetworkPolicy).
    pub policy: FdIndex,
    /// The read end of the connectivity helper's ready pipe, where the
    /// helper writes `1` once its device is attached; end of file means
    /// it exited first.
    pub helper_ready: FdIndex,
}

/// What a read-back is asked for: the namespace it must run in and the
/// connectivity helper's network there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObserveParameters {
    /// The enforcement network namespace.
    pub enforcement_namespace: crate::ownership::NamespaceIdentity,
    /// The connectivity helper's network in the namespace.
    pub link: ConnectivityLink,
}

/// What the sidecar is asked to do to re-verify a running policy: read the
/// namespace back, change nothing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObserveRequest {
    /// What to observe.
    pub parameters: ObserveParameters,
    /// The enforcement network namespace (an nsfs descriptor).
    pub namespace: FdIndex,
}

/// The supervisor's request to its sidecar.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SidecarRequest {
    /// Install, probe and attest.
    Attest(AttestRequest),
    /// Read the namespace back, changing nothing.
    Observe(ObserveRequest),
}

impl WireRecord for SidecarRequest {
    const NAME: &'static str = "SidecarRequest";
}

/// Which step of installing a policy failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SidecarStep {
    /// The request or its descriptors were malformed.
    Request,
    /// The sidecar's own privileges were not exactly CAP_NET_ADMIN.
    Privileges,
    /// The namespace descriptor did not name the namespace to configure.
    Namespace,
    /// The policy memfd was unsealed, unreadable or invalid.
    Policy,
    /// Configuring loopback or the tap device failed.
    Link,
    /// Installing a route failed.
    Routes,
    /// Disabling IPv6 failed.
    Ipv6,
    /// Reading the namespace back failed or disagreed with the policy.
    Readback,
    /// Probing failed.
    Probes,
    /// Installing or reading back the packet filter failed.
    Filter,
}

/// A failure the sidecar reports before exiting; it renders as the
/// failure's sentence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{failure}")]
pub struct SidecarError {
    /// The step that failed.
    pub step: SidecarStep,
    /// What failed and why.
    pub failure: Failure,
}

/// The sidecar's one answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SidecarReport {
    /// The policy is installed; this is what was observed.
    Attested(Box<NetworkReadinessAttestation>),
    /// Installing or probing failed.
    Failed(SidecarError),
    /// What a read-back found.
    Observed(Box<crate::network::Observed>),
}

impl WireRecord for SidecarReport {
    const NAME: &'static str = "SidecarReport";
    const MAX_ENCODED_LEN: usize = 256 * 1024;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::network::tests::attestation;
    use crate::ownership::NamespaceIdentity;
    use crate::test_support::{assert_rejects_bad_envelopes, round_trip};

    #[test]
    fn messages_round_trip() {
        let a = attestation();
        let request = SidecarRequest::Attest(AttestRequest {
            parameters: AttestParameters {
                probe: NetworkReachabilityProbe {
                    domain_id: a.domain_id,
                    generation_id: a.generation_id,
                    enforcement_namespace: NamespaceIdentity {
                        device: 4,
                        inode: 5,
                    },
                },
                network_sidecar_id: a.network_sidecar_id,
                link: ConnectivityLink::slirp4netns(),
                names: Some(NamedEgress::new(
                    [crate::names::HostPattern::parse("*.a.example").unwrap()],
                    crate::names::DnsMode::Lazaret,
                )),
            },
            namespace: FdIndex(0),
            policy: FdIndex(1),
            helper_ready: FdIndex(2),
        });
        round_trip(&request);
        assert_rejects_bad_envelopes(&request);
        let report = SidecarReport::Attested(Box::new(a));
        round_trip(&report);
        assert_rejects_bad_envelopes(&report);
        round_trip(&SidecarReport::Failed(SidecarError {
            step: SidecarStep::Routes,
            failure: Failure::check("no"),
        }));
    }
}
