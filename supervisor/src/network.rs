//! Starts the generation's Network Sidecar and relays its attestation, or
//! its read-back of a running policy.
//!
//! Owns the sidecar's launch: the binary beside the supervisor's own (the
//! supervisor's install path, never `PATH`), inside the enforcement network
//! namespace this process holds, with CAP_NET_ADMIN alone, its channel on
//! standard input. It hands the sidecar the namespace descriptor, the
//! Host Coordinator's sealed policy memfd and the connectivity helper's
//! ready pipe, waits for the one report, and
//! reaps it. Trusts the Host Coordinator's request; does not trust the
//! sidecar's report beyond relaying it (the Host Coordinator verifies it).

use std::os::fd::{BorrowedFd, OwnedFd};
use std::time::Duration;

use lazaret_proto::channel::FdIndex;
use lazaret_proto::network::{
    ConnectivityLink, NamedEgress, NetworkReadinessAttestation, Observed,
};
use lazaret_proto::resolver::{ResolverReadiness, ResolverReport, ResolverRequest, ServeRequest};
use lazaret_proto::sidecar::{
    AttestParameters, AttestRequest, ObserveParameters, ObserveRequest, SidecarReport,
    SidecarRequest,
};
use rustix::thread::CapabilitySet;

use crate::helper::Helper;

/// How long installing and probing may take, DNS timeout included.
const ATTEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A started Network Sidecar, waiting for its one request.
pub type Sidecar = Helper<SidecarRequest, SidecarReport>;

/// Starts a sidecar in the network namespace this process runs in. The
/// supervisor starts the first before it is asked to attest, so that the
/// attestation does not wait for the sidecar to start.
pub fn start_sidecar() -> Result<Sidecar, String> {
    Sidecar::start(
        "lazaret-netsidecar",
        "the sidecar",
        CapabilitySet::NET_ADMIN,
        false,
    )
}

/// Runs `sidecar` on `policy` in `namespace`, the network namespace this
/// process runs in, with the connectivity helper's ready pipe, and
/// returns its attestation, or why there is none.
pub fn attest(
    sidecar: Sidecar,
    parameters: AttestParameters,
    [namespace, policy, helper_ready]: [BorrowedFd<'_>; 3],
) -> Result<NetworkReadinessAttestation, String> {
    let request = SidecarRequest::Attest(AttestRequest {
        parameters,
        namespace: FdIndex(0),
        policy: FdIndex(1),
        helper_ready: FdIndex(2),
    });
    let result = sidecar
        .send(&request, &[namespace, policy, helper_ready])
        .and_then(|()| sidecar.report(ATTEST_TIMEOUT))
        .and_then(|report| match report {
            SidecarReport::Attested(attestation) => Ok(*attestation),
            SidecarReport::Failed(error) => Err(format!("{:?}: {}", error.step, error.detail)),
            SidecarReport::Observed(_) => Err("the sidecar observed instead of attesting".into()),
        });
    sidecar.finish(result)
}

/// How long Lazaret's resolver may take to bind, probe itself (an allowed
/// name's probe waits for upstream) and report.
const RESOLVER_READY_TIMEOUT: Duration = Duration::from_secs(15);

/// Lazaret's resolver, started.
pub type Resolver = Helper<ResolverRequest, ResolverReport>;

/// Starts Lazaret's resolver in the network namespace this process runs
/// in, with CAP_NET_ADMIN and CAP_NET_BIND_SERVICE alone. The supervisor
/// starts it while the sidecar attests, so that serving names does not wait
/// for a process to start.
pub fn start_resolver() -> Result<Resolver, String> {
    Resolver::start(
        "lazaret-resolver",
        "Lazaret's resolver",
        lazaret_proto::resolver::CAPABILITIES,
        false,
    )
}

/// Has `resolver` serve `names` for `policy` (the sealed memfd the sidecar
/// had), once the sidecar's filter holds the set it fills; returns its
/// pidfd and readiness. It is left running, for the Domain pid 1's reaper;
/// it ends with the Domain pid namespace.
pub fn serve_names(
    resolver: Resolver,
    names: NamedEgress,
    policy: BorrowedFd<'_>,
) -> Result<(OwnedFd, ResolverReadiness), String> {
    let request = ResolverRequest::Serve(ServeRequest {
        names,
        upstream: ConnectivityLink::SLIRP4NETNS_RESOLVER,
        policy: FdIndex(0),
    });
    let result = resolver
        .send(&request, &[policy])
        .and_then(|()| resolver.report(RESOLVER_READY_TIMEOUT))
        .and_then(|report| match report {
            ResolverReport::Serving(readiness) => Ok(readiness),
            ResolverReport::Failed(error) => Err(format!("Lazaret's resolver: {error}")),
        })
        .and_then(|readiness| Ok((resolver.pidfd()?, readiness)));
    resolver.keep_if_ok(result)
}

/// How long a read-back may take.
const OBSERVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs the sidecar to read `namespace` back, changing nothing, and returns
/// what it found, or why it could not.
pub fn observe(
    parameters: ObserveParameters,
    namespace: BorrowedFd<'_>,
) -> Result<Observed, String> {
    let sidecar = start_sidecar()?;
    let request = SidecarRequest::Observe(ObserveRequest {
        parameters,
        namespace: FdIndex(0),
    });
    let result = sidecar
        .send(&request, &[namespace])
        .and_then(|()| sidecar.report(OBSERVE_TIMEOUT))
        .and_then(|report| match report {
            SidecarReport::Observed(observation) => Ok(*observation),
            SidecarReport::Failed(error) => Err(format!("{:?}: {}", error.step, error.detail)),
            SidecarReport::Attested(_) => Err("the sidecar attested instead of observing".into()),
        });
    sidecar.finish(result)
}
