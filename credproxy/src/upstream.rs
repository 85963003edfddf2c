//! Connections from the proxy to the real hosts: TCP through the
//! caller's connector, TLS verified against the caller's roots, then
//! HTTP/2 or HTTP/1.1 as the host's ALPN answer says.
//!
//! Owns the upstream TLS configuration and the pool of connections: one
//! HTTP/2 connection per host, shared by concurrent requests, and a few
//! idle HTTP/1.1 ones per host, each back once its response has ended.
//! Trusts a host only once its certificate chains to the caller's roots
//! for its name: a certificate that fails is an error naming the host and
//! the reason, never a fallback to no verification.
//! Trusts the connector to reach the host it is asked for.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use http::header::HOST;
use http::uri::{Authority, Scheme};
use http::{HeaderValue, Request, Response, Uri, Version};
use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, RootCertStore};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// The future a [`Connect`] returns.
pub type Connecting = Pin<Box<dyn Future<Output = io::Result<TcpStream>> + Send>>;

/// How the proxy reaches a host: in production, resolve the name and
/// connect from a socket the filter lets out; in tests, a local port.
pub trait Connect: Send + Sync + 'static {
    /// A TCP connection to `host`, port `port`.
    fn connect(&self, host: &str, port: u16) -> Connecting;
}

impl<F> Connect for F
where
    F: Fn(&str, u16) -> Connecting + Send + Sync + 'static,
{
    fn connect(&self, host: &str, port: u16) -> Connecting {
        self(host, port)
    }
}

/// Why a request could not be sent to its host, or got no answer.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The host's trust store yielded no usable certificate.
    #[error(
        "found no usable trusted root certificate on the host ({errors} unusable); \
         set SSL_CERT_FILE to a CA bundle"
    )]
    NoRoots {
        /// How many certificates could not be used.
        errors: usize,
    },
    /// The TLS client configuration could not be built.
    #[error("cannot build the TLS client configuration")]
    Config {
        /// What rustls said.
        #[source]
        source: rustls::Error,
    },
    /// The name is not one TLS can verify.
    #[error("{host} is not a name a certificate can be verified for")]
    Name {
        /// The host.
        host: String,
    },
    /// The TCP connection failed.
    #[error("cannot connect to {host} port {port}")]
    Connect {
        /// The host.
        host: String,
        /// The port.
        port: u16,
        /// What the connector said.
        #[source]
        source: io::Error,
    },
    /// TCP and TLS took longer than the bound.
    #[error("connecting to {host} port {port} took longer than {timeout:?}")]
    ConnectTimeout {
        /// The host.
        host: String,
        /// The port.
        port: u16,
        /// The bound.
        timeout: Duration,
    },
    /// The host's certificate failed verification.
    #[error("the certificate of {host} failed verification; the request was not sent")]
    Certificate {
        /// The host.
        host: String,
        /// Why it failed.
        #[source]
        source: rustls::Error,
    },
    /// The TLS handshake failed otherwise.
    #[error("the TLS handshake with {host} failed")]
    Tls {
        /// The host.
        host: String,
        /// What failed.
        #[source]
        source: io::Error,
    },
    /// HTTP could not start on the connection.
    #[error("cannot start HTTP with {host}")]
    Handshake {
        /// The host.
        host: String,
        /// What hyper said.
        #[source]
        source: hyper::Error,
    },
    /// The request's target cannot be put in the form the host's HTTP
    /// version takes.
    #[error("the request's target cannot be sent to {host}")]
    Target {
        /// The host.
        host: String,
    },
    /// The request failed on the connection.
    #[error("the request to {host} failed")]
    Request {
        /// The host.
        host: String,
        /// What hyper said.
        #[source]
        source: hyper::Error,
    },
    /// The response's head did not arrive within the bound.
    #[error("{host} did not answer within {timeout:?}")]
    ResponseTimeout {
        /// The host.
        host: String,
        /// The bound.
        timeout: Duration,
    },
}

/// The roots real hosts are verified against: `ders`, the DER
/// certificates the Host Coordinator found in the invoking user's trust
/// store (rustls-native-certs, which honours `SSL_CERT_FILE` and
/// `SSL_CERT_DIR`). Certificates rustls cannot use are skipped; none at
/// all is an error.
pub fn roots(ders: &[Vec<u8>]) -> Result<RootCertStore, UpstreamError> {
    let mut roots = RootCertStore::empty();
    let (added, ignored) = roots.add_parsable_certificates(
        ders.iter()
            .map(|der| rustls::pki_types::CertificateDer::from(der.as_slice())),
    );
    if ignored > 0 {
        tracing::warn!("ignored {ignored} certificates of the host's trust store");
    }
    if added == 0 {
        return Err(UpstreamError::NoRoots { errors: ignored });
    }
    Ok(roots)
}

/// Idle HTTP/1.1 connections kept per host for the next request; more
/// are closed. Each serves one request at a time, so this is the
/// concurrency that reuses connections; past it, connections are new.
pub const MAX_IDLE_HTTP1: usize = 8;

/// The largest HTTP/2 frame the proxy accepts from a host: large, so a
/// response body crosses the proxy in few frames (each one a wake-up and
/// a copy), however small the frames the sandbox's client asks for.
const UPSTREAM_FRAME: u32 = 1 << 20;

/// How much of one response an HTTP/2 host may send ahead of the
/// sandbox's reading, and of all responses on the connection: enough for
/// the round trips of a fast stream. The connection's window bounds what
/// the proxy holds for one host, however many streams the sandbox opens.
const UPSTREAM_STREAM_WINDOW: u32 = 8 << 20;
const UPSTREAM_CONNECTION_WINDOW: u32 = 16 << 20;

/// A connection ready for one request.
enum Sender {
    /// HTTP/1.1: origin-form target, `Host` header.
    Http1(http1::SendRequest<Incoming>),
    /// HTTP/2: absolute target, `:authority`.
    Http2(http2::SendRequest<Incoming>),
}

/// What sending on one connection came to.
enum Attempt {
    /// The host's response.
    Answered(Response<Incoming>),
    /// The connection had closed before the request went out: it may go
    /// on another.
    Unsent(Request<Incoming>, hyper::Error),
}

impl Sender {
    /// `request` in the form this connection's HTTP version takes: an
    /// absolute target for HTTP/2, `Host` and an origin-form target for
    /// HTTP/1.1.
    fn shape(
        &self,
        host: &str,
        authority: &Authority,
        request: Request<Incoming>,
    ) -> Result<Request<Incoming>, UpstreamError> {
        let target = || UpstreamError::Target {
            host: host.to_owned(),
        };
        let (mut parts, body) = request.into_parts();
        let path = parts
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        match self {
            Self::Http2(_) => {
                parts.headers.remove(HOST);
                parts.uri = Uri::builder()
                    .scheme(Scheme::HTTPS)
                    .authority(authority.clone())
                    .path_and_query(path)
                    .build()
                    .map_err(|_| target())?;
                parts.version = Version::HTTP_2;
            }
            Self::Http1(_) => {
                let value = HeaderValue::from_str(authority.as_str()).map_err(|_| target())?;
                parts.headers.insert(HOST, value);
                parts.uri = path.parse().map_err(|_| target())?;
                parts.version = Version::HTTP_11;
            }
        }
        Ok(Request::from_parts(parts, body))
    }

    /// Sends `request`; its response's head, within `timeout`.
    async fn send(
        &mut self,
        host: &str,
        request: Request<Incoming>,
        timeout: Duration,
    ) -> Result<Attempt, UpstreamError> {
        let response = async {
            match self {
                Self::Http1(send) => send.try_send_request(request).await,
                Self::Http2(send) => send.try_send_request(request).await,
            }
        };
        match tokio::time::timeout(timeout, response).await {
            Ok(Ok(response)) => Ok(Attempt::Answered(response)),
            Ok(Err(mut failed)) => match failed.take_message() {
                Some(request) => Ok(Attempt::Unsent(request, failed.into_error())),
                None => Err(UpstreamError::Request {
                    host: host.to_owned(),
                    source: failed.into_error(),
                }),
            },
            Err(_) => Err(UpstreamError::ResponseTimeout {
                host: host.to_owned(),
                timeout,
            }),
        }
    }
}

/// The connections kept for later requests.
#[derive(Default)]
struct Pool {
    /// One per host, shared by its requests.
    http2: HashMap<String, http2::SendRequest<Incoming>>,
    /// Up to [`MAX_IDLE_HTTP1`] idle ones per host.
    http1: HashMap<String, Vec<http1::SendRequest<Incoming>>>,
}

impl Pool {
    /// A live pooled connection to `host`, if there is one.
    fn take(&mut self, host: &str) -> Option<Sender> {
        if let Some(send) = self.http2.get(host) {
            if !send.is_closed() {
                return Some(Sender::Http2(send.clone()));
            }
            self.http2.remove(host);
        }
        let idle = self.http1.get_mut(host)?;
        while let Some(send) = idle.pop() {
            if !send.is_closed() {
                return Some(Sender::Http1(send));
            }
        }
        None
    }

    /// Keeps `send` for a later request to `host`, unless enough are kept.
    fn give_back(&mut self, host: &str, send: http1::SendRequest<Incoming>) {
        let idle = self.http1.entry(host.to_owned()).or_default();
        idle.retain(|send| !send.is_closed());
        if idle.len() < MAX_IDLE_HTTP1 && !send.is_closed() {
            idle.push(send);
        }
    }
}

/// Shared with the response bodies that give their connection back.
type SharedPool = Arc<Mutex<Pool>>;

fn lock(pool: &Mutex<Pool>) -> std::sync::MutexGuard<'_, Pool> {
    pool.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A host's response body, streamed as it comes; an HTTP/1.1 connection
/// goes back to the pool once the body has ended.
pub(crate) struct UpstreamBody {
    body: Incoming,
    ended: bool,
    back: Option<(SharedPool, String, http1::SendRequest<Incoming>)>,
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            self.ended = true;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for UpstreamBody {
    fn drop(&mut self) {
        // A body dropped before its end leaves its connection mid-message.
        if self.ended || self.body.is_end_stream() {
            if let Some((pool, host, send)) = self.back.take() {
                lock(&pool).give_back(&host, send);
            }
        }
    }
}

/// How the proxy reaches hosts, and the connections it keeps.
pub(crate) struct Upstream {
    connector: Arc<dyn Connect>,
    tls: TlsConnector,
    port: u16,
    connect_timeout: Duration,
    pool: SharedPool,
}

impl Upstream {
    /// Connects through `connector` to `port`, verifying against `roots`.
    pub(crate) fn new(
        connector: Arc<dyn Connect>,
        roots: RootCertStore,
        port: u16,
        connect_timeout: Duration,
    ) -> Result<Self, UpstreamError> {
        let mut config =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .map_err(|source| UpstreamError::Config { source })?
                .with_root_certificates(roots)
                .with_no_client_auth();
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Self {
            connector,
            tls: TlsConnector::from(Arc::new(config)),
            port,
            connect_timeout,
            pool: SharedPool::default(),
        })
    }

    /// Sends `request` (headers final, target origin-form) to `host` as
    /// `authority`, on a pooled connection or else a new one; the
    /// response's head within `timeout`. A request that a pooled
    /// connection could not send (it had closed) goes on a new one.
    pub(crate) async fn send(
        &self,
        host: &str,
        authority: &Authority,
        request: Request<Incoming>,
        timeout: Duration,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        let pooled = lock(&self.pool).take(host);
        let request = match pooled {
            Some(mut sender) => {
                let request = sender.shape(host, authority, request)?;
                match sender.send(host, request, timeout).await? {
                    Attempt::Answered(response) => return Ok(self.pooled(host, sender, response)),
                    Attempt::Unsent(request, e) => {
                        tracing::debug!(host, "a pooled connection could not send: {e}");
                        request
                    }
                }
            }
            None => request,
        };
        let mut sender = self.connect_bounded(host).await?;
        let request = sender.shape(host, authority, request)?;
        match sender.send(host, request, timeout).await? {
            Attempt::Answered(response) => Ok(self.pooled(host, sender, response)),
            Attempt::Unsent(_, source) => Err(UpstreamError::Request {
                host: host.to_owned(),
                source,
            }),
        }
    }

    /// `response`, its HTTP/1.1 connection to be pooled once its body has
    /// ended.
    fn pooled(
        &self,
        host: &str,
        sender: Sender,
        response: Response<Incoming>,
    ) -> Response<UpstreamBody> {
        let back = match sender {
            Sender::Http1(send) => Some((self.pool.clone(), host.to_owned(), send)),
            Sender::Http2(_) => None,
        };
        response.map(|body| UpstreamBody {
            body,
            ended: false,
            back,
        })
    }

    /// A new connection to `host` within the connect bound; an HTTP/2 one
    /// is pooled at once.
    async fn connect_bounded(&self, host: &str) -> Result<Sender, UpstreamError> {
        let sender = tokio::time::timeout(self.connect_timeout, self.connect(host))
            .await
            .map_err(|_| UpstreamError::ConnectTimeout {
                host: host.to_owned(),
                port: self.port,
                timeout: self.connect_timeout,
            })??;
        if let Sender::Http2(send) = &sender {
            lock(&self.pool).http2.insert(host.to_owned(), send.clone());
        }
        Ok(sender)
    }

    /// A new connection: TCP, TLS with verification, HTTP as ALPN says,
    /// its connection task spawned.
    async fn connect(&self, host: &str) -> Result<Sender, UpstreamError> {
        let name = ServerName::try_from(host.to_owned()).map_err(|_| UpstreamError::Name {
            host: host.to_owned(),
        })?;
        let tcp = self
            .connector
            .connect(host, self.port)
            .await
            .map_err(|source| UpstreamError::Connect {
                host: host.to_owned(),
                port: self.port,
                source,
            })?;
        let _ = tcp.set_nodelay(true);
        let tls = self
            .tls
            .connect(name, tcp)
            .await
            .map_err(|e| tls_error(host, e))?;
        let http2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
        let io = TokioIo::new(tls);
        let handshake = |source| UpstreamError::Handshake {
            host: host.to_owned(),
            source,
        };
        let label = host.to_owned();
        if http2 {
            let (send, connection) = http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .max_frame_size(UPSTREAM_FRAME)
                .initial_stream_window_size(UPSTREAM_STREAM_WINDOW)
                .initial_connection_window_size(UPSTREAM_CONNECTION_WINDOW)
                .handshake(io)
                .await
                .map_err(handshake)?;
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::debug!(host = label, "upstream HTTP/2 connection ended: {e}");
                }
            });
            Ok(Sender::Http2(send))
        } else {
            let (send, connection) = http1::handshake(io).await.map_err(handshake)?;
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::debug!(host = label, "upstream HTTP/1.1 connection ended: {e}");
                }
            });
            Ok(Sender::Http1(send))
        }
    }
}

/// The handshake's failure, a certificate's named as such.
fn tls_error(host: &str, error: io::Error) -> UpstreamError {
    let certificate = error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .filter(|e| {
            matches!(
                e,
                rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented
            )
        })
        .cloned();
    match certificate {
        Some(source) => UpstreamError::Certificate {
            host: host.to_owned(),
            source,
        },
        None => UpstreamError::Tls {
            host: host.to_owned(),
            source: error,
        },
    }
}
