//! Starts the generation's Network Sidecar and relays its attestation, or
//! its read-back of a running policy; with names, starts Lazaret's
//! resolver, and with credentials the Credential Proxy beside it.
//!
//! Owns those roles' launches: each binary beside the supervisor's own
//! (the supervisor's install path, never `PATH`), inside the enforcement
//! network namespace this process holds, with its channel on standard
//! input: the sidecar with CAP_NET_ADMIN alone, the resolver with
//! CAP_NET_ADMIN and CAP_NET_BIND_SERVICE, the proxy with none. It hands
//! the sidecar the namespace descriptor, the Host Coordinator's sealed
//! policy memfd and the connectivity helper's ready pipe, waits for the
//! one report, and reaps it. For the proxy it binds the listener on
//! `127.0.0.54:443` and makes the lookup socket pair whose ends go to the
//! resolver and the proxy, and passes the sealed credentials memfd on
//! unread. Trusts the Host Coordinator's request; does not trust the
//! reports beyond relaying them (the Host Coordinator verifies them).

use std::os::fd::{BorrowedFd, OwnedFd};
use std::time::Duration;

use lazaret_proto::channel::FdIndex;
use lazaret_proto::credproxy::{ProxyReadiness, ProxyReport, ProxyRequest, ProxyServeRequest};
use lazaret_proto::network::{
    ConnectivityLink, NamedEgress, NetworkReadinessAttestation, Observed,
};
use lazaret_proto::resolver::{ResolverReadiness, ResolverReport, ResolverRequest, ServeRequest};
use lazaret_proto::sidecar::{
    AttestParameters, AttestRequest, ObserveParameters, ObserveRequest, SidecarReport,
    SidecarRequest, SidecarStep,
};
use rustix::thread::CapabilitySet;

use crate::helper::{Helper, HelperError};

/// Why the sidecar or Lazaret's resolver gave no attestation, read-back or
/// readiness.
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    /// The helper could not be started, reached or heard.
    #[error(transparent)]
    Helper(#[from] HelperError),
    /// The sidecar reported its own failure.
    #[error("{step:?}: {failure}")]
    Sidecar {
        /// The sidecar's step that failed.
        step: SidecarStep,
        /// What it said.
        failure: lazaret_proto::failure::Failure,
    },
    /// The sidecar answered another request than the one it was given.
    #[error("the sidecar {did} instead of {asked}")]
    Mismatched {
        /// What it did.
        did: &'static str,
        /// What it was asked.
        asked: &'static str,
    },
    /// Lazaret's resolver reported its own failure.
    #[error("Lazaret's resolver: {0}")]
    Resolver(lazaret_proto::resolver::ResolverError),
    /// The Credential Proxy reported its own failure.
    #[error("the Credential Proxy: {0}")]
    Proxy(lazaret_proto::credproxy::ProxyError),
    /// The Credential Proxy's sockets could not be made.
    #[error("cannot make the Credential Proxy's {what}")]
    ProxySocket {
        /// Which socket.
        what: &'static str,
        /// What the kernel said.
        #[source]
        source: std::io::Error,
    },
}

impl From<lazaret_proto::sidecar::SidecarError> for NetworkError {
    fn from(error: lazaret_proto::sidecar::SidecarError) -> Self {
        Self::Sidecar {
            step: error.step,
            failure: error.failure,
        }
    }
}

/// How long installing and probing may take, DNS timeout included.
const ATTEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A started Network Sidecar, waiting for its one request.
pub type Sidecar = Helper<SidecarRequest, SidecarReport>;

/// Starts a sidecar in the network namespace this process runs in. The
/// supervisor starts the first before it is asked to attest, so that the
/// attestation does not wait for the sidecar to start.
pub fn start_sidecar() -> Result<Sidecar, HelperError> {
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
) -> Result<NetworkReadinessAttestation, NetworkError> {
    let request = SidecarRequest::Attest(AttestRequest {
        parameters,
        namespace: FdIndex(0),
        policy: FdIndex(1),
        helper_ready: FdIndex(2),
    });
    let result = sidecar
        .send(&request, &[namespace, policy, helper_ready])
        .and_then(|()| sidecar.report(ATTEST_TIMEOUT))
        .map_err(NetworkError::from)
        .and_then(|report| match report {
            SidecarReport::Attested(attestation) => Ok(*attestation),
            SidecarReport::Failed(error) => Err(error.into()),
            SidecarReport::Observed(_) => Err(NetworkError::Mismatched {
                did: "observed",
                asked: "attesting",
            }),
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
pub fn start_resolver() -> Result<Resolver, HelperError> {
    Resolver::start(
        "lazaret-resolver",
        "Lazaret's resolver",
        lazaret_proto::resolver::CAPABILITIES,
        false,
    )
}

/// Has `resolver` serve `names` for `policy` (the sealed memfd the sidecar
/// had), once the sidecar's filter holds the set it fills, answering the
/// `proxied` hosts with the Credential Proxy's address and its lookups on
/// `lookups`; returns its pidfd and readiness. It is left running, for the
/// Domain pid 1's reaper; it ends with the Domain pid namespace.
pub fn serve_names(
    resolver: Resolver,
    names: NamedEgress,
    policy: BorrowedFd<'_>,
    proxied: Vec<String>,
    lookups: Option<BorrowedFd<'_>>,
) -> Result<(OwnedFd, ResolverReadiness), NetworkError> {
    let request = ResolverRequest::Serve(ServeRequest {
        names,
        upstream: ConnectivityLink::SLIRP4NETNS_RESOLVER,
        policy: FdIndex(0),
        proxied,
        lookups: lookups.map(|_| FdIndex(1)),
    });
    let fds: Vec<BorrowedFd<'_>> = std::iter::once(policy).chain(lookups).collect();
    let result = resolver
        .send(&request, &fds)
        .and_then(|()| resolver.report(RESOLVER_READY_TIMEOUT))
        .map_err(NetworkError::from)
        .and_then(|report| match report {
            ResolverReport::Serving(readiness) => Ok(readiness),
            ResolverReport::Failed(error) => Err(NetworkError::Resolver(error)),
        })
        .and_then(|readiness| Ok((resolver.pidfd()?, readiness)));
    resolver.keep_if_ok(result)
}

/// How long the Credential Proxy may take to read its credentials, make
/// its CA and report.
const PROXY_READY_TIMEOUT: Duration = Duration::from_secs(10);

/// The Credential Proxy, started.
pub type CredentialProxy = Helper<ProxyRequest, ProxyReport>;

/// Starts the Credential Proxy in the network namespace this process runs
/// in, with no capability at all.
pub fn start_proxy() -> Result<CredentialProxy, HelperError> {
    CredentialProxy::start(
        "lazaret-credproxy",
        "the Credential Proxy",
        CapabilitySet::empty(),
        false,
    )
}

/// The Credential Proxy's two sockets, made by this process: its listener
/// at [`lazaret_proto::credproxy::LISTEN`] (port 443 needs a privilege the
/// proxy does not have) and the lookup socket pair it shares with
/// Lazaret's resolver.
#[derive(Debug)]
pub struct ProxySockets {
    /// The listening socket.
    pub listener: OwnedFd,
    /// The proxy's end of the lookup pair.
    pub proxy_end: OwnedFd,
    /// The resolver's end.
    pub resolver_end: OwnedFd,
}

impl ProxySockets {
    /// Binds the listener and makes the pair.
    pub fn new() -> Result<Self, NetworkError> {
        let listener =
            std::net::TcpListener::bind(lazaret_proto::credproxy::LISTEN).map_err(|source| {
                NetworkError::ProxySocket {
                    what: "listening socket",
                    source,
                }
            })?;
        let (proxy_end, resolver_end) =
            std::os::unix::net::UnixDatagram::pair().map_err(|source| {
                NetworkError::ProxySocket {
                    what: "lookup socket pair",
                    source,
                }
            })?;
        Ok(Self {
            listener: listener.into(),
            proxy_end: proxy_end.into(),
            resolver_end: resolver_end.into(),
        })
    }
}

/// Has `proxy` serve with the `credentials` memfd (unread here) on
/// `listener`, looking hosts up on `lookups`; returns its pidfd and
/// readiness. It is left running like the resolver.
pub fn serve_credentials(
    proxy: CredentialProxy,
    credentials: BorrowedFd<'_>,
    listener: BorrowedFd<'_>,
    lookups: BorrowedFd<'_>,
) -> Result<(OwnedFd, ProxyReadiness), NetworkError> {
    let request = ProxyRequest::Serve(ProxyServeRequest {
        listener: FdIndex(0),
        credentials: FdIndex(1),
        lookups: FdIndex(2),
    });
    let result = proxy
        .send(&request, &[listener, credentials, lookups])
        .and_then(|()| proxy.report(PROXY_READY_TIMEOUT))
        .map_err(NetworkError::from)
        .and_then(|report| match report {
            ProxyReport::Serving(readiness) => Ok(readiness),
            ProxyReport::Failed(error) => Err(NetworkError::Proxy(error)),
        })
        .and_then(|readiness| Ok((proxy.pidfd()?, readiness)));
    proxy.keep_if_ok(result)
}

/// How long a read-back may take.
const OBSERVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs the sidecar to read `namespace` back, changing nothing, and returns
/// what it found, or why it could not.
pub fn observe(
    parameters: ObserveParameters,
    namespace: BorrowedFd<'_>,
) -> Result<Observed, NetworkError> {
    let sidecar = start_sidecar()?;
    let request = SidecarRequest::Observe(ObserveRequest {
        parameters,
        namespace: FdIndex(0),
    });
    let result = sidecar
        .send(&request, &[namespace])
        .and_then(|()| sidecar.report(OBSERVE_TIMEOUT))
        .map_err(NetworkError::from)
        .and_then(|report| match report {
            SidecarReport::Observed(observation) => Ok(*observation),
            SidecarReport::Failed(error) => Err(error.into()),
            SidecarReport::Attested(_) => Err(NetworkError::Mismatched {
                did: "attested",
                asked: "observing",
            }),
        });
    sidecar.finish(result)
}
