//! Lazaret's resolver: the sandbox's only name server, for a generation
//! whose profile names hosts (configuration v2).
//!
//! The Runtime Supervisor starts it in the enforcement network namespace,
//! after the Network Sidecar has installed the filter, with CAP_NET_ADMIN
//! and CAP_NET_BIND_SERVICE in the Domain user namespace and nothing else.
//! It then:
//! 1. checks those are exactly its privileges;
//! 2. takes its channel and receives one [`ServeRequest`]: the names, the
//!    upstream resolver, and the sealed policy whose denials no admitted
//!    address may fall in;
//! 3. binds [`NamedEgress::LISTEN`], opens the filter's set and drops
//!    CAP_NET_BIND_SERVICE;
//! 4. serves, on one thread: a query for an allowed name's A records goes
//!    upstream from a socket marked [`NamedEgress::UPSTREAM_MARK`] (the
//!    only sockets the filter lets reach the upstream resolver); every
//!    address at the end of the answer's CNAME chain is admitted into the
//!    filter's set for its TTL, clamped, before the sandbox sees the
//!    answer; an answer with an address the policy denies is emptied
//!    (rebinding). AAAA for an allowed name is answered empty, anything
//!    else refused at once (or, with `dns = "host"`, relayed, admitting
//!    nothing). At most [`MAX_IN_FLIGHT`] queries wait for upstream;
//! 5. probes itself (one disallowed name, refused without going upstream;
//!    one allowed name, answered) and reports [`ResolverReadiness`];
//!    A profile with credentials names the Credential Proxy's hosts
//!    (`proxied`): the sandbox's A query for one is resolved and admitted as
//!    above, then answered with the proxy's address alone; the proxy's own
//!    [`Lookup`]s, on the socket pair the supervisor hands over, get the
//!    real (admitted) addresses;
//! 6. serves until the Domain pid namespace ends: it is a child of the
//!    namespace's pid 1, so the kernel ends it with the supervisor. (Its
//!    channel closes as soon as the supervisor has its report.)
//!
//! It trusts only the supervisor at the other end of its inherited channel;
//! the sandbox's queries and upstream's answers are untrusted bytes
//! ([`answer`]).

#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod admissions;
pub mod answer;
mod seccomp;

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket as StdUdpSocket};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_proto::op::{Message, ResponseCode};
use lazaret_netsidecar::NamedSet;
use lazaret_proto::channel::{Endpoint, Received};
use lazaret_proto::credproxy::{Looked, Lookup};
use lazaret_proto::error_chain as chain;
use lazaret_proto::failure::Failure;
use lazaret_proto::network::{DerivedNetworkPolicy, NamedEgress};
use lazaret_proto::resolver::{
    CAPABILITIES, ResolverError, ResolverProbe, ResolverReadiness, ResolverReport, ResolverRequest,
    ResolverStep, ServeRequest,
};
use rustix::thread::{CapabilitySet, CapabilitySets};
use tokio::net::UdpSocket;
use tokio::sync::Semaphore;

use crate::admissions::Admissions;
use crate::answer::{Decision, Upstream};

type Channel = Endpoint<ResolverReport, ResolverRequest>;

/// The most queries waiting for upstream at once; one more is answered
/// SERVFAIL at once.
pub const MAX_IN_FLIGHT: usize = 64;
/// How long upstream may take to answer, the query sent again halfway.
pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(2);
/// How many distinct refused names the log names.
const LOGGED_REFUSALS: usize = 200;

fn failed(step: ResolverStep, detail: impl std::fmt::Display) -> ResolverError {
    ResolverError {
        step,
        failure: Failure::check(detail),
    }
}

/// `error` and its chain as the failure of `step`, after `context`.
fn failed_by(
    step: ResolverStep,
    context: &str,
    error: &(dyn std::error::Error + 'static),
) -> ResolverError {
    ResolverError {
        step,
        failure: Failure::of(error).within(context),
    }
}

/// Runs the resolver until it is killed.
pub fn run() -> ExitCode {
    let channel = match Channel::start_role("lazaret-resolver") {
        Ok(channel) => channel,
        Err(code) => return code,
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::error!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let started = start(&channel).and_then(|server| {
        seccomp::install().map_err(|e| failed_by(ResolverStep::Privileges, "", &e))?;
        let readiness = runtime.block_on(server.probe())?;
        Ok((server, readiness))
    });
    let server = match started {
        Ok((server, readiness)) => {
            if let Err(e) = channel.send(&ResolverReport::Serving(readiness), &[]) {
                tracing::error!("cannot report: {}", chain(&e));
                return ExitCode::FAILURE;
            }
            server
        }
        Err(error) => {
            tracing::error!("{error}");
            let _ = channel.send(&ResolverReport::Failed(error), &[]);
            return ExitCode::FAILURE;
        }
    };
    drop(channel);
    runtime.block_on(server.serve_forever());
    ExitCode::FAILURE
}

/// The resolver, ready to serve: its listening socket, and what every
/// query's task shares.
struct Server {
    listen: StdUdpSocket,
    /// The Credential Proxy's lookups, when there is a proxy.
    lookups: Option<std::os::unix::net::UnixDatagram>,
    parts: Parts,
}

/// Takes the request, opens the sockets and the set, and gives up what
/// only that needed.
fn start(channel: &Channel) -> Result<Server, ResolverError> {
    lazaret_proto::privilege::require_exactly(
        CAPABILITIES,
        "start it through lazaret-supervisor, which grants exactly CAP_NET_ADMIN and \
         CAP_NET_BIND_SERVICE",
    )
    .map_err(|e| failed_by(ResolverStep::Privileges, "", &e))?;
    let Received { message, fds } = channel
        .recv()
        .map_err(|e| failed_by(ResolverStep::Request, "", &e))?;
    let ResolverRequest::Serve(ServeRequest {
        names,
        upstream,
        policy,
        proxied,
        lookups,
    }) = message;
    let lookups = lookups
        .map(|index| {
            let fd = index.get(&fds).ok_or_else(|| {
                failed(
                    ResolverStep::Request,
                    "the proxy's lookup socket is missing",
                )
            })?;
            fd.try_clone_to_owned()
                .map(std::os::unix::net::UnixDatagram::from)
                .map_err(|e| failed_by(ResolverStep::Request, "the proxy's lookup socket", &e))
        })
        .transpose()?;
    let policy_fd = policy
        .get(&fds)
        .ok_or_else(|| failed(ResolverStep::Request, "the policy descriptor is missing"))?;
    let policy = lazaret_netsidecar::read_policy(policy_fd).map_err(|e| ResolverError {
        step: ResolverStep::Request,
        failure: e.failure,
    })?;
    let listen = StdUdpSocket::bind(NamedEgress::LISTEN).map_err(|e| {
        failed_by(
            ResolverStep::Sockets,
            &format!("cannot listen on {}", NamedEgress::LISTEN),
            &e,
        )
    })?;
    listen
        .set_nonblocking(true)
        .map_err(|e| failed_by(ResolverStep::Sockets, "", &e))?;
    let set = NamedSet::open().map_err(|e| ResolverError {
        step: ResolverStep::Sockets,
        failure: e.failure,
    })?;
    // Binding port 53 is done; marking sockets and filling the set need
    // CAP_NET_ADMIN alone. No thread exists yet, so this holds for all.
    rustix::thread::set_capabilities(
        None,
        CapabilitySets {
            effective: CapabilitySet::NET_ADMIN,
            permitted: CapabilitySet::NET_ADMIN,
            inheritable: CapabilitySet::empty(),
        },
    )
    .map_err(|e| {
        failed_by(
            ResolverStep::Privileges,
            "cannot drop CAP_NET_BIND_SERVICE",
            &e,
        )
    })?;
    Ok(Server {
        listen,
        lookups,
        parts: Parts {
            names: Arc::new(names),
            proxied: Arc::new(proxied.into_iter().collect()),
            policy: Arc::new(policy),
            upstream: SocketAddrV4::new(upstream, 53),
            set: Arc::new(Mutex::new(Admissions::new(set))),
            forwarded: Arc::new(AtomicU64::new(0)),
        },
    })
}

impl Server {
    /// Serves on a task of the current runtime, sends the two readiness
    /// queries to it, and says what they got.
    async fn probe(&self) -> Result<ResolverReadiness, ResolverError> {
        let listen = self
            .listen
            .try_clone()
            .map_err(|e| failed_by(ResolverStep::Sockets, "", &e))?;
        let serving = tokio::spawn(self.parts.clone().serve(listen));
        let forwarded = &self.parts.forwarded;
        let probe = |name: String| async move {
            let before = forwarded.load(Ordering::SeqCst);
            let (response_code, addresses) = ask(&name).await?;
            Ok::<_, ResolverError>(ResolverProbe {
                name,
                response_code,
                addresses,
                forwarded: forwarded.load(Ordering::SeqCst) != before,
            })
        };
        let refused_probe = probe(NamedEgress::REFUSED_PROBE.to_owned()).await;
        let allowed_probe = match self.parts.names.allowed_probe() {
            Some(name) => Some(probe(name).await),
            None => None,
        };
        serving.abort();
        Ok(ResolverReadiness {
            names_digest: self
                .parts
                .names
                .digest()
                .map_err(|e| failed_by(ResolverStep::Probe, "", &e))?,
            listen: NamedEgress::LISTEN,
            allowed_probe: allowed_probe.transpose()?,
            refused_probe: refused_probe?,
        })
    }

    async fn serve_forever(self) {
        if let Some(lookups) = self.lookups {
            tokio::spawn(self.parts.clone().serve_lookups(lookups));
        }
        self.parts.serve(self.listen).await;
    }
}

/// What each query's task shares.
#[derive(Clone)]
struct Parts {
    names: Arc<NamedEgress>,
    /// The Credential Proxy's hosts.
    proxied: Arc<BTreeSet<String>>,
    policy: Arc<DerivedNetworkPolicy>,
    upstream: SocketAddrV4,
    set: Arc<Mutex<Admissions<NamedSet>>>,
    /// Queries sent upstream so far, for the readiness probes.
    forwarded: Arc<AtomicU64>,
}

impl Parts {
    /// Answers every datagram that reaches `listen`.
    async fn serve(self, listen: StdUdpSocket) {
        let listen = match UdpSocket::from_std(listen) {
            Ok(socket) => Arc::new(socket),
            Err(e) => {
                tracing::error!("cannot serve on {}: {e}", NamedEgress::LISTEN);
                return;
            }
        };
        let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
        let refused = Arc::new(Mutex::new(BTreeSet::new()));
        let mut buffer = vec![0u8; 4096];
        loop {
            let (len, client) = match listen.recv_from(&mut buffer).await {
                Ok(received) => received,
                Err(e) => {
                    tracing::warn!("cannot receive a query: {e}");
                    continue;
                }
            };
            let reply = match answer::decide(&self.names, &buffer[..len]) {
                Decision::Drop => continue,
                Decision::Reply(bytes) => bytes,
                Decision::Refuse { reply, name } => {
                    log_refusal(&refused, name);
                    reply
                }
                decision => {
                    let Ok(permit) = Arc::clone(&in_flight).try_acquire_owned() else {
                        if let Decision::Resolve(q) | Decision::Relay(q) = decision {
                            let _ = listen
                                .send_to(&answer::reply(&q, ResponseCode::ServFail, vec![]), client)
                                .await;
                        }
                        continue;
                    };
                    let parts = self.clone();
                    let listen = Arc::clone(&listen);
                    tokio::spawn(async move {
                        let bytes = parts.resolve(decision, Asker::Sandbox).await;
                        let _ = listen.send_to(&bytes, client).await;
                        drop(permit);
                    });
                    continue;
                }
            };
            let _ = listen.send_to(&reply, client).await;
        }
    }

    /// Answers the Credential Proxy's lookups, one at a time (it looks a
    /// host up only to open a connection, and keeps it), for as long as
    /// the resolver runs: a datagram pair says nothing when the proxy's
    /// end closes, and both end with the Domain pid namespace. An empty
    /// datagram or a failed read ends it. A host that is not proxied is
    /// refused.
    async fn serve_lookups(self, socket: std::os::unix::net::UnixDatagram) {
        let socket = match socket
            .set_nonblocking(true)
            .and_then(|()| tokio::net::UnixDatagram::from_std(socket))
        {
            Ok(socket) => socket,
            Err(e) => {
                tracing::error!("cannot serve the Credential Proxy's lookups: {e}");
                return;
            }
        };
        let mut buffer = vec![0u8; 1024];
        loop {
            let len = match socket.recv(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(len) => len,
            };
            let Ok(Lookup { id, name }) = lazaret_proto::codec::decode::<Lookup>(&buffer[..len])
            else {
                tracing::warn!("the Credential Proxy sent a lookup that does not decode");
                continue;
            };
            let (response_code, addresses) = self.look_up(&name).await;
            let looked = Looked {
                id,
                response_code,
                addresses,
            };
            if let Ok(bytes) = lazaret_proto::codec::encode(&looked) {
                let _ = socket.send(&bytes).await;
            }
        }
    }

    /// The admitted addresses of the proxied host `name`, as the proxy
    /// connects to them: resolved and admitted as the sandbox's query is.
    async fn look_up(&self, name: &str) -> (u8, Vec<Ipv4Addr>) {
        let refused = (lazaret_proto::resolver::REFUSED, Vec::new());
        if !self.proxied.contains(name) {
            return refused;
        }
        let id = random_id();
        let Some(query) = answer::client_query(name, id).and_then(|q| Message::from_vec(&q).ok())
        else {
            return refused;
        };
        let answered = self.resolve(Decision::Resolve(query), Asker::Proxy).await;
        answer::client_answer(&answered, id).unwrap_or((2, Vec::new()))
    }

    /// Whether `query` asks for a proxied host.
    fn is_proxied(&self, query: &Message) -> bool {
        let name = name_of(query).to_ascii_lowercase();
        self.proxied
            .contains(name.strip_suffix('.').unwrap_or(&name))
    }

    /// Asks upstream, admits what an allowed name resolves to, and returns
    /// the answer for `asker`.
    async fn resolve(&self, decision: Decision, asker: Asker) -> Vec<u8> {
        let (Decision::Resolve(query) | Decision::Relay(query)) = &decision else {
            return Vec::new();
        };
        let relay = matches!(decision, Decision::Relay(_));
        let id = random_id();
        let bytes = if relay {
            let mut fresh = query.clone();
            fresh.set_id(id);
            fresh.to_vec().unwrap_or_default()
        } else {
            answer::upstream_query(query, id)
        };
        self.forwarded.fetch_add(1, Ordering::SeqCst);
        let answered = match self.ask_upstream(&bytes, id, query).await {
            Ok(answered) => answered,
            Err(why) => {
                tracing::warn!(
                    "upstream did not answer for {}: {}",
                    name_of(query),
                    chain(&why)
                );
                return answer::reply(query, ResponseCode::ServFail, vec![]);
            }
        };
        if relay {
            return answer::relayed(query, answered);
        }
        match answer::read_upstream(query, &answered, |a| self.policy.admits(a)) {
            Upstream::Truncated => answer::truncated(query),
            Upstream::Rebinding(address) => {
                tracing::warn!(
                    "{} resolves to {address}, which the policy denies: answered with no \
                     address (a name may not point into a denied range)",
                    name_of(query)
                );
                answer::reply(query, ResponseCode::NoError, vec![])
            }
            Upstream::Addresses {
                code,
                mut records,
                admit,
            } => {
                let admitted = {
                    let mut set = self.set.lock().unwrap_or_else(|p| p.into_inner());
                    let name = name_of(query).to_ascii_lowercase();
                    let name = name.strip_suffix('.').unwrap_or(&name);
                    let now = std::time::Instant::now();
                    admit
                        .iter()
                        .map(|&(address, timeout)| set.admit(address, timeout, name, now))
                        .collect::<Result<Vec<_>, _>>()
                };
                match admitted {
                    Ok(left) => {
                        // No client caches an address past its admission.
                        if let Some(shortest) = left.iter().min() {
                            answer::cap_ttls(&mut records, *shortest);
                        }
                        if asker == Asker::Sandbox && self.is_proxied(query) {
                            records = answer::proxied(
                                query,
                                records,
                                *lazaret_proto::credproxy::LISTEN.ip(),
                            );
                        }
                        answer::reply(query, code, records)
                    }
                    Err(e) => {
                        tracing::error!("{}: {}", name_of(query), e.failure);
                        answer::reply(query, ResponseCode::ServFail, vec![])
                    }
                }
            }
        }
    }

    /// Sends `bytes` upstream from a fresh marked socket, again halfway
    /// through [`UPSTREAM_TIMEOUT`], and waits for the answer with `id` to
    /// `query`'s question.
    async fn ask_upstream(
        &self,
        bytes: &[u8],
        id: u16,
        query: &Message,
    ) -> Result<Message, UpstreamError> {
        let socket = marked_socket(self.upstream).map_err(UpstreamError::Socket)?;
        let mut buffer = vec![0u8; 65535];
        for _ in 0..2 {
            socket.send(bytes).await.map_err(UpstreamError::Send)?;
            let wait = tokio::time::timeout(UPSTREAM_TIMEOUT / 2, async {
                loop {
                    let len = socket.recv(&mut buffer).await?;
                    if let Some(answer) = answer::answers(&buffer[..len], id, query) {
                        return Ok::<_, std::io::Error>(answer);
                    }
                }
            });
            match wait.await {
                Ok(Ok(answer)) => return Ok(answer),
                Ok(Err(e)) => return Err(UpstreamError::Receive(e)),
                Err(_) => {}
            }
        }
        Err(UpstreamError::Silent {
            upstream: self.upstream,
            seconds: UPSTREAM_TIMEOUT.as_secs(),
        })
    }
}

/// Who a resolved answer is for: the sandbox gets the Credential Proxy's
/// address for a proxied host, the proxy the host's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Asker {
    Sandbox,
    Proxy,
}

/// Why the upstream resolver gave no answer to a forwarded query.
#[derive(Debug, thiserror::Error)]
enum UpstreamError {
    /// The marked socket could not be made.
    #[error("cannot open a marked socket to the upstream resolver")]
    Socket(#[source] std::io::Error),
    /// The query could not be sent.
    #[error("cannot send the query upstream")]
    Send(#[source] std::io::Error),
    /// The answer could not be received.
    #[error("cannot receive the upstream answer")]
    Receive(#[source] std::io::Error),
    /// No answer came in time.
    #[error("no answer from {upstream} within {seconds} s")]
    Silent {
        /// The upstream resolver.
        upstream: SocketAddrV4,
        /// How long it was given.
        seconds: u64,
    },
}

/// A UDP socket connected to `upstream`, carrying the mark the filter
/// lets through.
fn marked_socket(upstream: SocketAddrV4) -> std::io::Result<UdpSocket> {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None)?;
    socket.set_mark(NamedEgress::UPSTREAM_MARK)?;
    socket.set_nonblocking(true)?;
    socket.bind(&SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)).into())?;
    socket.connect(&SocketAddr::V4(upstream).into())?;
    UdpSocket::from_std(socket.into())
}

/// Sends a query for `name` to the listening address, as a client in the
/// sandbox does, and returns the answer's code and addresses.
async fn ask(name: &str) -> Result<(u8, Vec<Ipv4Addr>), ResolverError> {
    let step = ResolverStep::Probe;
    let id = random_id();
    let query = answer::client_query(name, id)
        .ok_or_else(|| failed(step, format!("{name} is not a name")))?;
    let socket = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .map_err(|e| failed(step, e))?;
    socket
        .connect(NamedEgress::LISTEN)
        .await
        .map_err(|e| failed(step, e))?;
    socket.send(&query).await.map_err(|e| failed(step, e))?;
    let mut buffer = vec![0u8; 4096];
    let wait = UPSTREAM_TIMEOUT + Duration::from_secs(1);
    let answered = tokio::time::timeout(wait, async {
        loop {
            let len = socket.recv(&mut buffer).await?;
            if let Some(answer) = answer::client_answer(&buffer[..len], id) {
                return Ok::<_, std::io::Error>(answer);
            }
        }
    })
    .await
    .map_err(|_| {
        failed(
            step,
            format!("no answer for {name} within {} s", wait.as_secs()),
        )
    })?;
    answered.map_err(|e| failed(step, e))
}

/// A query id nobody can guess: upstream's answers are matched by it.
fn random_id() -> u16 {
    let mut bytes = [0u8; 2];
    if rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty()).is_err() {
        bytes = (std::process::id() as u16 ^ 0x5a5a).to_ne_bytes();
    }
    u16::from_ne_bytes(bytes)
}

fn name_of(query: &Message) -> String {
    query
        .queries()
        .first()
        .map_or_else(|| "?".into(), |q| q.name().to_ascii())
}

/// Logs a refused name the first time, up to [`LOGGED_REFUSALS`] names,
/// so the Domain log tells what a profile may be missing.
fn log_refusal(refused: &Mutex<BTreeSet<String>>, name: String) {
    let mut seen = refused.lock().unwrap_or_else(|p| p.into_inner());
    if seen.len() < LOGGED_REFUSALS && seen.insert(name.clone()) {
        tracing::info!("refused {name}: not in allow_hosts");
        if seen.len() == LOGGED_REFUSALS {
            tracing::info!("further refused names are not logged");
        }
    }
}
