//! Connections from the proxy to the real hosts: TCP through the
//! caller's connector, TLS verified against the caller's roots, then
//! HTTP/2 or HTTP/1.1 as the host's ALPN answer says.
//!
//! Owns the upstream TLS configuration and the pool of HTTP/2 connections
//! (one per host, shared by concurrent requests; an HTTP/1.1 connection
//! serves one request). Trusts a host only once its certificate chains to
//! the caller's roots for its name: a certificate that fails is an error
//! naming the host and the reason, never a fallback to no verification.
//! Trusts the connector to reach the host it is asked for.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper::{Request, Response};
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
        "found no trusted root certificate on the host ({errors} errors reading the store); \
         set SSL_CERT_FILE to a CA bundle"
    )]
    NoRoots {
        /// How many errors the search met.
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

/// The host's trust store as rustls-native-certs finds it (which honours
/// `SSL_CERT_FILE` and `SSL_CERT_DIR`): the roots real hosts are verified
/// against in production.
pub fn native_roots() -> Result<RootCertStore, UpstreamError> {
    let found = rustls_native_certs::load_native_certs();
    for error in &found.errors {
        tracing::warn!("while reading the host's trust store: {error}");
    }
    let mut roots = RootCertStore::empty();
    let (added, ignored) = roots.add_parsable_certificates(found.certs);
    if ignored > 0 {
        tracing::warn!("ignored {ignored} certificates of the host's trust store");
    }
    if added == 0 {
        return Err(UpstreamError::NoRoots {
            errors: found.errors.len(),
        });
    }
    Ok(roots)
}

/// A connection ready for one request.
pub(crate) enum Sender {
    /// HTTP/1.1: origin-form target, `Host` header.
    Http1(http1::SendRequest<Incoming>),
    /// HTTP/2: absolute target, `:authority`.
    Http2(http2::SendRequest<Incoming>),
}

impl Sender {
    /// Whether requests go out as HTTP/2.
    pub(crate) fn is_http2(&self) -> bool {
        matches!(self, Self::Http2(_))
    }

    /// Sends `request`; its response's head, within `timeout`.
    pub(crate) async fn send(
        self,
        host: &str,
        request: Request<Incoming>,
        timeout: Duration,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let response = async {
            match self {
                Self::Http1(mut send) => {
                    send.ready().await?;
                    send.send_request(request).await
                }
                Self::Http2(mut send) => {
                    send.ready().await?;
                    send.send_request(request).await
                }
            }
        };
        match tokio::time::timeout(timeout, response).await {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(source)) => Err(UpstreamError::Request {
                host: host.to_owned(),
                source,
            }),
            Err(_) => Err(UpstreamError::ResponseTimeout {
                host: host.to_owned(),
                timeout,
            }),
        }
    }
}

/// How the proxy reaches hosts, and the HTTP/2 connections it keeps.
pub(crate) struct Upstream {
    connector: Arc<dyn Connect>,
    tls: TlsConnector,
    port: u16,
    connect_timeout: Duration,
    pooled: Mutex<HashMap<String, http2::SendRequest<Incoming>>>,
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
            pooled: Mutex::new(HashMap::new()),
        })
    }

    /// A connection to `host` for one request: its pooled HTTP/2
    /// connection if it has a live one, else a new connection.
    pub(crate) async fn sender(&self, host: &str) -> Result<Sender, UpstreamError> {
        {
            let mut pooled = self.pooled.lock().unwrap_or_else(PoisonError::into_inner);
            match pooled.get(host) {
                Some(send) if !send.is_closed() => return Ok(Sender::Http2(send.clone())),
                Some(_) => {
                    pooled.remove(host);
                }
                None => {}
            }
        }
        let sender = tokio::time::timeout(self.connect_timeout, self.connect(host))
            .await
            .map_err(|_| UpstreamError::ConnectTimeout {
                host: host.to_owned(),
                port: self.port,
                timeout: self.connect_timeout,
            })??;
        if let Sender::Http2(send) = &sender {
            self.pooled
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(host.to_owned(), send.clone());
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
