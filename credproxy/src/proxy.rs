//! The proxy: one sandbox connection at a time, TLS under the
//! generation's CA, each request forwarded to the host its SNI names with
//! the credentials put into its header values, each response streamed
//! back as it comes.
//!
//! Owns the bounds on what the sandbox can make the host hold
//! ([`Limits`]). Trusts nothing from the sandbox side, which is hostile:
//! a handshake must name a served host and finish in time, a request must
//! be for the host its handshake named, and its headers are bounded in
//! size and time. Trusts the upstream only once its certificate is
//! verified ([`crate::upstream`]); its responses are passed on, never
//! read or rewritten.

use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::header::{CONNECTION, CONTENT_TYPE, HOST, TE, TRANSFER_ENCODING, UPGRADE};
use http::uri::Authority;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri};
use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use rustls::{RootCertStore, ServerConfig};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;

use lazaret_proto::error_chain as chain;

use crate::activity::{Activity, InFlight, Watched};
use crate::ca::{Authority as CertificateAuthority, Resolver};
use crate::hosts::{Hosts, normalize};
use crate::redact::{Redacted, Redactor};
use crate::rewrite::{RewriteError, rewrite};
use crate::upstream::{Connect, Upstream, UpstreamBody, UpstreamError};

/// Sandbox connections served at once. An agent keeps a few connections
/// per host in its pool; this leaves room for several agents while
/// bounding the descriptors, TLS state and buffers a hostile sandbox can
/// make the host hold. One more is closed at once.
pub const MAX_CONNECTIONS: usize = 256;

/// HTTP/2 streams open at once on one connection: RFC 9113's advised
/// minimum, which clients are built for; more wait in the client.
pub const MAX_STREAMS: u32 = 100;

/// Requests forwarded at once, over all connections: each may hold an
/// upstream connection and a streamed response, so the streams of every
/// connection together must be bounded too. One more is answered 503.
pub const MAX_REQUESTS: usize = 512;

/// The most bytes of one request's head (HTTP/1.1: the read buffer while
/// it is parsed; HTTP/2: the decoded header list). An agent's request has
/// a few KiB of headers; a larger head is refused with 431.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;

/// How long a client may take to finish the TLS handshake once
/// connected: a client that connects and says nothing holds a
/// connection slot no longer than this.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long an HTTP/1.1 request's head may take to arrive: a client that
/// sends headers byte by byte, forever, holds its connection no longer.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a connection may stay idle before it is closed: no byte
/// moved while no request waits for its host, or no request begun or
/// ended while none is in flight. The second bounds, for HTTP/2 as for
/// HTTP/1.1, a client that sends a request's head without end. Longer
/// than the pauses of a streamed model response (which sends keep-alive
/// events), shorter than an abandoned connection should live.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// How long connecting to the host (TCP and TLS) may take.
pub const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the host may take to start its answer (its head; the body
/// streams after). Model APIs take minutes to answer a request that is
/// not streamed; their clients wait ten.
pub const UPSTREAM_RESPONSE_TIMEOUT: Duration = Duration::from_secs(600);

/// The port of the hosts the proxy forwards to.
pub const UPSTREAM_PORT: u16 = 443;

/// The proxy's bounds; [`Limits::default`] gives the constants above,
/// tests smaller ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// [`MAX_CONNECTIONS`].
    pub connections: usize,
    /// [`MAX_STREAMS`].
    pub streams: u32,
    /// [`MAX_REQUESTS`].
    pub requests: usize,
    /// [`MAX_HEADER_BYTES`]; HTTP/1.1 reads at least 8 KiB regardless.
    pub header_bytes: usize,
    /// [`HANDSHAKE_TIMEOUT`].
    pub handshake: Duration,
    /// [`HEADER_READ_TIMEOUT`].
    pub header_read: Duration,
    /// [`IDLE_TIMEOUT`].
    pub idle: Duration,
    /// [`UPSTREAM_CONNECT_TIMEOUT`].
    pub upstream_connect: Duration,
    /// [`UPSTREAM_RESPONSE_TIMEOUT`].
    pub upstream_response: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            connections: MAX_CONNECTIONS,
            streams: MAX_STREAMS,
            requests: MAX_REQUESTS,
            header_bytes: MAX_HEADER_BYTES,
            handshake: HANDSHAKE_TIMEOUT,
            header_read: HEADER_READ_TIMEOUT,
            idle: IDLE_TIMEOUT,
            upstream_connect: UPSTREAM_CONNECT_TIMEOUT,
            upstream_response: UPSTREAM_RESPONSE_TIMEOUT,
        }
    }
}

/// How long a connection closed for idleness has to say so (HTTP/2's
/// GOAWAY) and finish what it was writing.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// The smallest read buffer hyper's HTTP/1.1 server accepts.
const MIN_HTTP1_BUFFER: usize = 8192;

/// What a proxy is made of, besides its CA.
pub struct Config {
    /// The hosts served and their credentials.
    pub hosts: Hosts,
    /// The roots hosts' certificates are verified against: in production
    /// [`crate::upstream::roots`] of the host's trust store.
    pub roots: RootCertStore,
    /// How to reach a host.
    pub connector: Arc<dyn Connect>,
    /// The hosts' port: [`UPSTREAM_PORT`] but in tests.
    pub upstream_port: u16,
    /// The bounds.
    pub limits: Limits,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("hosts", &self.hosts)
            .field("upstream_port", &self.upstream_port)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// Why the proxy could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The TLS server configuration could not be built.
    #[error("cannot build the TLS server configuration")]
    Tls {
        /// What rustls said.
        #[source]
        source: rustls::Error,
    },
    /// The upstream side could not be set up.
    #[error("cannot set up connections to the hosts")]
    Upstream {
        /// What failed.
        #[source]
        source: UpstreamError,
    },
}

/// Why a sandbox connection ended other than by closing.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    /// [`Limits::connections`] were being served; this one was closed.
    #[error("{limit} connections are being served already; closed a new one")]
    Busy {
        /// The bound.
        limit: usize,
    },
    /// The client did not finish the TLS handshake in time.
    #[error("the TLS handshake took longer than {timeout:?}")]
    HandshakeTimeout {
        /// The bound.
        timeout: Duration,
    },
    /// The TLS handshake failed (for a name not served, among others).
    #[error("the TLS handshake failed")]
    Handshake {
        /// What failed.
        #[source]
        source: io::Error,
    },
    /// HTTP on the connection failed.
    #[error("serving HTTP failed")]
    Http {
        /// What hyper said.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// What every connection shares.
struct Shared {
    acceptor: TlsAcceptor,
    hosts: Hosts,
    upstream: Upstream,
    limits: Limits,
    connections: Arc<Semaphore>,
    requests: Arc<Semaphore>,
    http: auto::Builder<TokioExecutor>,
}

/// The Credential Proxy; cheap to clone, one per generation.
#[derive(Clone)]
pub struct Proxy {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("hosts", &self.shared.hosts)
            .field("limits", &self.shared.limits)
            .finish_non_exhaustive()
    }
}

impl Proxy {
    /// A proxy serving `config.hosts` with certificates from `authority`.
    pub fn new(authority: Arc<CertificateAuthority>, config: Config) -> Result<Self, ProxyError> {
        let Config {
            hosts,
            roots,
            connector,
            upstream_port,
            limits,
        } = config;
        let resolver = Arc::new(Resolver::new(authority, &hosts));
        let mut tls =
            ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .map_err(|source| ProxyError::Tls { source })?
                .with_no_client_auth()
                .with_cert_resolver(resolver);
        tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let upstream = Upstream::new(connector, roots, upstream_port, limits.upstream_connect)
            .map_err(|source| ProxyError::Upstream { source })?;
        let mut http = auto::Builder::new(TokioExecutor::new());
        http.http1()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read)
            .max_buf_size(limits.header_bytes.max(MIN_HTTP1_BUFFER));
        http.http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(limits.streams)
            .max_header_list_size(u32::try_from(limits.header_bytes).unwrap_or(u32::MAX));
        Ok(Self {
            shared: Arc::new(Shared {
                acceptor: TlsAcceptor::from(Arc::new(tls)),
                hosts,
                upstream,
                limits,
                connections: Arc::new(Semaphore::new(limits.connections)),
                requests: Arc::new(Semaphore::new(limits.requests)),
                http,
            }),
        })
    }

    /// Accepts connections from `listener` and serves each on its own
    /// task, until accepting fails for a reason other than a lack of
    /// descriptors or memory.
    pub async fn serve(&self, listener: &TcpListener) -> io::Error {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let proxy = self.clone();
                    tokio::spawn(async move {
                        if let Err(e) = proxy.serve_connection(stream).await {
                            tracing::debug!("connection: {}", chain(&e));
                        }
                    });
                }
                Err(e) if transient(&e) => {
                    tracing::warn!("cannot accept a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return e,
            }
        }
    }

    /// Serves one accepted connection until it closes, fails, or is idle
    /// for [`Limits::idle`].
    pub async fn serve_connection(&self, stream: TcpStream) -> Result<(), ConnectionError> {
        let shared = &self.shared;
        let Ok(_slot) = shared.connections.clone().try_acquire_owned() else {
            return Err(ConnectionError::Busy {
                limit: shared.limits.connections,
            });
        };
        let _ = stream.set_nodelay(true);
        let activity = Activity::new();
        let tls = tokio::time::timeout(
            shared.limits.handshake,
            shared
                .acceptor
                .accept(Watched::new(stream, activity.clone())),
        )
        .await
        .map_err(|_| ConnectionError::HandshakeTimeout {
            timeout: shared.limits.handshake,
        })?
        .map_err(|source| ConnectionError::Handshake { source })?;
        // The resolver gave a certificate only for a served name.
        let Some(host) = tls.get_ref().1.server_name().and_then(normalize) else {
            return Ok(());
        };
        let host: Arc<str> = host.into();
        let service = {
            let proxy = self.clone();
            let activity = activity.clone();
            service_fn(move |request| {
                let proxy = proxy.clone();
                let host = host.clone();
                let activity = activity.clone();
                async move { Ok::<_, Infallible>(proxy.handle(&host, &activity, request).await) }
            })
        };
        let connection = shared.http.serve_connection(TokioIo::new(tls), service);
        tokio::pin!(connection);
        let idle = shared.limits.idle;
        let recheck = idle.min(Duration::from_secs(1));
        let mut deadline = activity.next_check(idle, recheck);
        loop {
            tokio::select! {
                served = connection.as_mut() => {
                    return served.map_err(|source| ConnectionError::Http { source });
                }
                () = tokio::time::sleep_until(deadline) => {
                    if activity.is_idle(idle) {
                        tracing::debug!("closing a connection idle for {idle:?}");
                        // HTTP/2 says GOAWAY, so the client retries what it
                        // sent meanwhile elsewhere.
                        connection.as_mut().graceful_shutdown();
                        let _ = tokio::time::timeout(CLOSE_GRACE, connection.as_mut()).await;
                        return Ok(());
                    }
                    deadline = activity.next_check(idle, recheck);
                }
            }
        }
    }

    /// The response to one request: the host's, or the proxy's own error.
    async fn handle(
        &self,
        host: &str,
        activity: &Arc<Activity>,
        request: Request<Incoming>,
    ) -> Response<ProxyBody> {
        let in_flight = activity.request();
        let mut response = match self.forward(host, activity, request).await {
            Ok(response) => response,
            Err(error) => {
                // Debug only: the sandbox decides how many requests are
                // refused, and must not spend the Domain log's budget.
                tracing::debug!(host, "request refused: {}", chain(&error));
                error.response()
            }
        };
        response.body_mut().in_flight = Some(in_flight);
        response
    }

    /// Checks `request`, rewrites its headers and sends it to `host`.
    async fn forward(
        &self,
        host: &str,
        activity: &Arc<Activity>,
        request: Request<Incoming>,
    ) -> Result<Response<ProxyBody>, RequestError> {
        let shared = &self.shared;
        let Ok(slot) = shared.requests.clone().try_acquire_owned() else {
            return Err(RequestError::Busy {
                limit: shared.limits.requests,
            });
        };
        let (mut parts, body) = request.into_parts();
        if parts.method == Method::CONNECT {
            return Err(RequestError::Connect);
        }
        let authority = authority_of(host, &parts.uri, &parts.headers)?;
        strip_hop_by_hop(&mut parts.headers);
        let credentials = shared.hosts.credentials(host).unwrap_or(&[]);
        rewrite(&mut parts.headers, credentials).map_err(|source| RequestError::Rewrite {
            host: host.to_owned(),
            source,
        })?;
        let redactor = Redactor::new(credentials);
        if redactor.is_some() {
            Redactor::ask_readable(&mut parts.headers);
        }
        let downstream_version = parts.version;
        let waiting = activity.waiting();
        let response = shared
            .upstream
            .send(
                host,
                &authority,
                Request::from_parts(parts, body),
                shared.limits.upstream_response,
            )
            .await?;
        drop(waiting);
        let (mut parts, body) = response.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        if let Some(redactor) = &redactor {
            redactor.head(&mut parts.headers);
        }
        parts.version = downstream_version;
        Ok(Response::from_parts(
            parts,
            ProxyBody::upstream(body, slot, redactor),
        ))
    }
}

/// Whether accepting failed for want of descriptors or memory (EMFILE,
/// ENFILE, ENOBUFS, ENOMEM: accept(2)), which closing connections frees,
/// or for a connection that went before it was taken.
fn transient(error: &io::Error) -> bool {
    const ENOMEM: i32 = 12;
    const ENFILE: i32 = 23;
    const EMFILE: i32 = 24;
    const ENOBUFS: i32 = 105;
    matches!(
        error.raw_os_error(),
        Some(EMFILE | ENFILE | ENOBUFS | ENOMEM)
    ) || matches!(
        error.kind(),
        io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
    )
}

/// The request's authority (its `:authority` or `Host`), if it names
/// `host` on the proxied port.
fn authority_of(host: &str, uri: &Uri, headers: &HeaderMap) -> Result<Authority, RequestError> {
    let from_header = match headers.get(HOST) {
        Some(value) => Some(
            value
                .to_str()
                .ok()
                .and_then(|v| v.parse::<Authority>().ok())
                .ok_or(RequestError::BadHost)?,
        ),
        None => None,
    };
    let authority = match (uri.authority(), from_header) {
        (Some(a), Some(h)) if !a.host().eq_ignore_ascii_case(h.host()) || a.port() != h.port() => {
            return Err(RequestError::BadHost);
        }
        (Some(a), _) => a.clone(),
        (None, Some(h)) => h,
        (None, None) => return Err(RequestError::NoHost),
    };
    // A user-info part (`evil@host`) is not the host's business, and a
    // front end might route on it: the authority goes upstream as sent.
    if authority.as_str().contains('@') {
        return Err(RequestError::UserInfo);
    }
    let named = normalize(authority.host());
    let port = authority.port_u16();
    if named.as_deref() != Some(host) || port.is_some_and(|p| p != UPSTREAM_PORT) {
        return Err(RequestError::Misdirected {
            host: host.to_owned(),
            authority: authority.as_str().to_owned(),
        });
    }
    Ok(authority)
}

/// Removes the headers that describe one connection rather than the
/// request (RFC 9110 7.6.1): `Connection` and what it lists,
/// `Keep-Alive`, `Proxy-Connection`, `Transfer-Encoding`, `Upgrade`, and
/// `TE` unless it is `trailers` (which HTTP/2 allows).
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let listed: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in listed {
        headers.remove(name);
    }
    for name in [CONNECTION, TRANSFER_ENCODING, UPGRADE] {
        headers.remove(name);
    }
    for name in ["keep-alive", "proxy-connection"] {
        headers.remove(name);
    }
    let trailers_only = headers
        .get_all(TE)
        .iter()
        .all(|value| value.as_bytes().eq_ignore_ascii_case(b"trailers"));
    if !trailers_only {
        headers.remove(TE);
    }
}

/// Why a request was answered by the proxy itself.
#[derive(Debug, thiserror::Error)]
enum RequestError {
    #[error("{limit} requests are being forwarded already; try again")]
    Busy { limit: usize },
    #[error("CONNECT is not forwarded: the proxy forwards requests to its hosts, not tunnels")]
    Connect,
    #[error("the request names no host")]
    NoHost,
    #[error("the request's Host and :authority disagree or are not host names")]
    BadHost,
    #[error("the request's authority carries a user name; name the host alone")]
    UserInfo,
    #[error("this connection is for {host}, not for {authority}; connect to {authority} itself")]
    Misdirected { host: String, authority: String },
    #[error("cannot put the credential for {host} into the request")]
    Rewrite {
        host: String,
        #[source]
        source: RewriteError,
    },
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
}

impl RequestError {
    fn status(&self) -> StatusCode {
        match self {
            Self::Busy { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::Connect => StatusCode::METHOD_NOT_ALLOWED,
            Self::NoHost | Self::BadHost | Self::UserInfo => StatusCode::BAD_REQUEST,
            Self::Misdirected { .. } => StatusCode::MISDIRECTED_REQUEST,
            Self::Rewrite { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            Self::Upstream(
                UpstreamError::ConnectTimeout { .. } | UpstreamError::ResponseTimeout { .. },
            ) => StatusCode::GATEWAY_TIMEOUT,
            Self::Upstream(_) => StatusCode::BAD_GATEWAY,
        }
    }

    /// The proxy's answer: the status, and the error's chain as text.
    fn response(&self) -> Response<ProxyBody> {
        let body = format!("lazaret credential proxy: {}\n", chain(self));
        let mut response = Response::new(ProxyBody::message(body.into()));
        *response.status_mut() = self.status();
        response.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        response
    }
}

/// A response's body: the host's, streamed frame by frame as it comes
/// (holding the request's slot until it ends, with the real values taken
/// out for a host with credentials), or the proxy's message.
pub(crate) struct ProxyBody {
    kind: Kind,
    /// The request, counted in flight until its response's body ends.
    in_flight: Option<InFlight>,
}

enum Kind {
    Upstream {
        body: Redacted<UpstreamBody>,
        _slot: OwnedSemaphorePermit,
    },
    Message(Option<Bytes>),
}

impl ProxyBody {
    fn upstream(
        body: UpstreamBody,
        slot: OwnedSemaphorePermit,
        redactor: Option<Redactor>,
    ) -> Self {
        Self {
            kind: Kind::Upstream {
                body: Redacted::new(body, redactor),
                _slot: slot,
            },
            in_flight: None,
        }
    }

    fn message(text: Bytes) -> Self {
        Self {
            kind: Kind::Message(Some(text)),
            in_flight: None,
        }
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match &mut self.kind {
            Kind::Upstream { body, .. } => Pin::new(body).poll_frame(cx),
            Kind::Message(text) => Poll::Ready(text.take().map(|t| Ok(Frame::data(t)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Upstream { body, .. } => body.is_end_stream(),
            Kind::Message(text) => text.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Upstream { body, .. } => body.size_hint(),
            Kind::Message(text) => {
                SizeHint::with_exact(text.as_ref().map_or(0, |t| t.len() as u64))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let pairs: Vec<(&str, &[u8])> = pairs.iter().map(|(n, v)| (*n, v.as_bytes())).collect();
        crate::rewrite::header_map(&pairs)
    }

    #[test]
    fn hop_by_hop_headers_go_and_end_to_end_ones_stay() {
        let mut map = headers(&[
            ("connection", "keep-alive, x-private"),
            ("x-private", "1"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("te", "gzip"),
            ("x-api-key", "PH"),
            ("authorization", "Bearer PH"),
        ]);
        strip_hop_by_hop(&mut map);
        let mut names: Vec<_> = map.keys().map(HeaderName::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, ["authorization", "x-api-key"]);
        let mut map = headers(&[("te", "trailers")]);
        strip_hop_by_hop(&mut map);
        assert_eq!(map["te"], "trailers");
    }

    #[test]
    fn the_authority_must_be_the_handshakes_host() {
        let host = "api.example.invalid";
        let origin: Uri = "/v1/messages".parse().unwrap();
        let ok = authority_of(host, &origin, &headers(&[("host", "API.example.invalid")]));
        assert_eq!(ok.unwrap().as_str(), "API.example.invalid");
        let with_port = authority_of(
            host,
            &origin,
            &headers(&[("host", "api.example.invalid:443")]),
        );
        assert!(with_port.is_ok());
        for (uri, host_header, status) in [
            ("/", None, StatusCode::BAD_REQUEST),
            (
                "/",
                Some("other.example.invalid"),
                StatusCode::MISDIRECTED_REQUEST,
            ),
            (
                "/",
                Some("api.example.invalid:8443"),
                StatusCode::MISDIRECTED_REQUEST,
            ),
            ("/", Some("bad host"), StatusCode::BAD_REQUEST),
            (
                "https://api.example.invalid/",
                Some("other.example.invalid"),
                StatusCode::BAD_REQUEST,
            ),
            (
                "https://other.example.invalid/",
                None,
                StatusCode::MISDIRECTED_REQUEST,
            ),
            (
                "/",
                Some("evil.example@api.example.invalid"),
                StatusCode::BAD_REQUEST,
            ),
            (
                "https://evil.example@api.example.invalid/",
                None,
                StatusCode::BAD_REQUEST,
            ),
        ] {
            let uri: Uri = uri.parse().unwrap();
            let map = host_header.map_or_else(HeaderMap::new, |h| headers(&[("host", h)]));
            let e = authority_of(host, &uri, &map).unwrap_err();
            assert_eq!(e.status(), status, "{uri} {host_header:?}");
        }
    }
}
