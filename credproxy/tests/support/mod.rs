//! Shared by the proxy's tests: a test CA, HTTPS upstreams on 127.0.0.1
//! that record what they receive, a proxy in front of them, and clients
//! that trust the proxy's CA.

#![allow(dead_code)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderMap, Request, Response, Version};
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Bytes, Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use lazaret_credproxy::{Authority, Config, Connecting, Hosts, Limits, Proxy};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::client::TlsStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// The host with credentials.
pub const API: &str = "api.test.invalid";
/// A host served but with no credential.
pub const OTHER: &str = "other.test.invalid";
/// A host whose certificate does not chain to the test CA.
pub const BAD: &str = "bad.test.invalid";
/// A host the proxy does not serve.
pub const UNSERVED: &str = "unserved.test.invalid";

pub const PLACEHOLDER: &str = "sk-ant-PLACEHOLDER0123456789";
pub const REAL: &str = "sk-ant-REAL-VALUE-abcdef";

/// No test step waits longer than this.
pub const BOUND: Duration = Duration::from_secs(10);

pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A CA made in the test.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl TestCa {
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        let key = KeyPair::generate().unwrap();
        Self {
            issuer: CertifiedIssuer::self_signed(params, key).unwrap(),
        }
    }

    pub fn roots(&self) -> RootCertStore {
        let mut roots = RootCertStore::empty();
        roots.add(self.issuer.der().clone()).unwrap();
        roots
    }

    /// A server configuration with one certificate for `names`.
    pub fn server_config(&self, names: &[&str], alpn: &[&[u8]]) -> ServerConfig {
        let params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], key)
            .unwrap();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        config
    }
}

/// One request as an upstream received it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub authority: String,
    pub path: String,
    pub version: Version,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// An HTTPS upstream on 127.0.0.1.
pub struct Upstream {
    pub port: u16,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    /// Released by the test: lets `/sse` send its second event and
    /// `/hold` answer.
    pub gate: Arc<Semaphore>,
    /// Requests to `/hold` that arrived.
    pub held: Arc<AtomicUsize>,
    /// Connections accepted.
    pub connections: Arc<AtomicUsize>,
}

impl Upstream {
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

/// A body fed through a channel, frame by frame.
pub struct ChannelBody(mpsc::Receiver<Bytes>);

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b))))
    }
}

/// Waits (within [`BOUND`]) for the test to open `gate` once, and uses
/// that opening up.
async fn pass(gate: &Semaphore) {
    if let Ok(Ok(permit)) = tokio::time::timeout(BOUND, gate.acquire()).await {
        permit.forget();
    }
}

type UpstreamBody = http_body_util::Either<Full<Bytes>, ChannelBody>;

async fn answer(
    request: Request<Incoming>,
    seen: Arc<Mutex<Vec<Seen>>>,
    gate: Arc<Semaphore>,
    held: Arc<AtomicUsize>,
) -> Response<UpstreamBody> {
    let (parts, body) = request.into_parts();
    let body = tokio::time::timeout(BOUND, body.collect())
        .await
        .unwrap()
        .unwrap()
        .to_bytes();
    let authority = parts
        .uri
        .authority()
        .map(|a| a.to_string())
        .or_else(|| {
            parts
                .headers
                .get("host")
                .map(|h| h.to_str().unwrap().to_owned())
        })
        .unwrap_or_default();
    seen.lock().unwrap().push(Seen {
        authority,
        path: parts.uri.path().to_owned(),
        version: parts.version,
        headers: parts.headers.clone(),
        body: body.clone(),
    });
    match parts.uri.path() {
        "/sse" => {
            let (send, receive) = mpsc::channel(4);
            tokio::spawn(async move {
                send.send(Bytes::from_static(b"data: one\n\n"))
                    .await
                    .unwrap();
                pass(&gate).await;
                let _ = send.send(Bytes::from_static(b"data: two\n\n")).await;
            });
            Response::builder()
                .header("content-type", "text/event-stream")
                .body(http_body_util::Either::Right(ChannelBody(receive)))
                .unwrap()
        }
        "/hold" => {
            held.fetch_add(1, Ordering::SeqCst);
            pass(&gate).await;
            Response::new(http_body_util::Either::Left(Full::from("held")))
        }
        // Quotes the key it was sent, in a header and in the body (with a
        // length), as an API's error might.
        "/echo-key" => {
            let key = parts.headers.get("x-api-key").cloned().unwrap();
            let mut quoted = b"bad key: ".to_vec();
            quoted.extend_from_slice(key.as_bytes());
            Response::builder()
                .header("x-echo", key)
                .header("content-length", quoted.len().to_string())
                .body(http_body_util::Either::Left(Full::from(quoted)))
                .unwrap()
        }
        // Closes the connection after answering.
        "/close" => Response::builder()
            .header("connection", "close")
            .body(http_body_util::Either::Left(Full::from("closing")))
            .unwrap(),
        _ => Response::builder()
            .header("x-echo-len", body.len().to_string())
            .body(http_body_util::Either::Left(Full::new(body)))
            .unwrap(),
    }
}

/// Starts an upstream serving `names` with a certificate from `ca`,
/// offering `alpn`.
pub async fn upstream(ca: &TestCa, names: &[&str], alpn: &[&[u8]]) -> Upstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let acceptor = TlsAcceptor::from(Arc::new(ca.server_config(names, alpn)));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let gate = Arc::new(Semaphore::new(0));
    let held = Arc::new(AtomicUsize::new(0));
    let connections = Arc::new(AtomicUsize::new(0));
    let state = (seen.clone(), gate.clone(), held.clone());
    let accepted = connections.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            accepted.fetch_add(1, Ordering::SeqCst);
            let acceptor = acceptor.clone();
            let state = state.clone();
            tokio::spawn(async move {
                let Ok(Ok(tls)) = tokio::time::timeout(BOUND, acceptor.accept(stream)).await else {
                    return;
                };
                let service = service_fn(move |request| {
                    let (seen, gate, held) = state.clone();
                    async move { Ok::<_, Infallible>(answer(request, seen, gate, held).await) }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    Upstream {
        port,
        seen,
        gate,
        held,
        connections,
    }
}

/// A connector sending each host to its local port.
pub fn local(ports: HashMap<String, u16>) -> Arc<dyn lazaret_credproxy::Connect> {
    Arc::new(move |host: &str, _port: u16| -> Connecting {
        let port = ports.get(host).copied();
        let host = host.to_owned();
        Box::pin(async move {
            let port = port.ok_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::NotFound, format!("no port for {host}"))
            })?;
            TcpStream::connect(("127.0.0.1", port)).await
        })
    })
}

/// The hosts every test serves: API with the credential, OTHER and BAD
/// without.
pub fn hosts() -> Hosts {
    let mut hosts = Hosts::new();
    hosts
        .add(API, PLACEHOLDER.as_bytes(), REAL.as_bytes())
        .unwrap();
    hosts.serve(OTHER).unwrap();
    hosts.serve(BAD).unwrap();
    hosts
}

/// A proxy listening on 127.0.0.1, and its CA.
pub struct Running {
    pub address: SocketAddr,
    pub authority: Arc<Authority>,
}

pub async fn proxy(
    roots: RootCertStore,
    connector: Arc<dyn lazaret_credproxy::Connect>,
    limits: Limits,
) -> Running {
    let served = hosts();
    let authority = Arc::new(Authority::generate(served.names()).unwrap());
    let proxy = Proxy::new(
        authority.clone(),
        Config {
            hosts: served,
            roots,
            connector,
            upstream_port: 443,
            limits,
        },
    )
    .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let error = proxy.serve(&listener).await;
        panic!("the proxy stopped accepting: {error}");
    });
    Running { address, authority }
}

/// A TLS connection to the proxy for `name`, trusting its CA, offering
/// `alpn`.
pub async fn tls(
    running: &Running,
    name: &str,
    alpn: &[&[u8]],
) -> std::io::Result<TlsStream<TcpStream>> {
    let mut roots = RootCertStore::empty();
    roots.add(running.authority.certificate_der()).unwrap();
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let tcp = TcpStream::connect(running.address).await?;
    let name = ServerName::try_from(name.to_owned()).unwrap();
    tokio::time::timeout(
        BOUND,
        TlsConnector::from(Arc::new(config)).connect(name, tcp),
    )
    .await
    .map_err(|_| std::io::Error::other("handshake timed out"))?
}

/// An HTTP client over one connection to the proxy.
pub enum Client {
    Http1(hyper::client::conn::http1::SendRequest<Full<Bytes>>),
    Http2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

impl Client {
    /// Connects for `name` with HTTP/2 or HTTP/1.1; the connection's task
    /// is returned too.
    pub async fn connect(
        running: &Running,
        name: &str,
        http2: bool,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let alpn: &[&[u8]] = if http2 { &[b"h2"] } else { &[b"http/1.1"] };
        let stream = tls(running, name, alpn).await.unwrap();
        let io = TokioIo::new(stream);
        if http2 {
            let (send, connection) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                    .await
                    .unwrap();
            let task = tokio::spawn(async move {
                let _ = connection.await;
            });
            (Self::Http2(send), task)
        } else {
            let (send, connection) = hyper::client::conn::http1::handshake(io).await.unwrap();
            let task = tokio::spawn(async move {
                let _ = connection.await;
            });
            (Self::Http1(send), task)
        }
    }

    /// A request for `path` on `name` with `headers` and `body`.
    pub fn request(
        &self,
        name: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Request<Full<Bytes>> {
        let mut builder = Request::builder().method(if body.is_empty() { "GET" } else { "POST" });
        builder = match self {
            Self::Http1(_) => builder.uri(path).header("host", name),
            Self::Http2(_) => builder.uri(format!("https://{name}{path}")),
        };
        for (header, value) in headers {
            builder = builder.header(*header, *value);
        }
        builder.body(Full::from(body.to_owned())).unwrap()
    }

    /// Sends `request`; the response's head, within [`BOUND`].
    pub async fn send(
        &mut self,
        request: Request<Full<Bytes>>,
    ) -> hyper::Result<Response<Incoming>> {
        let sent = async {
            match self {
                Self::Http1(send) => {
                    send.ready().await?;
                    send.send_request(request).await
                }
                Self::Http2(send) => {
                    send.ready().await?;
                    send.send_request(request).await
                }
            }
        };
        tokio::time::timeout(BOUND, sent)
            .await
            .expect("no response in time")
    }
}

/// The whole body, within [`BOUND`].
pub async fn text(response: Response<Incoming>) -> String {
    let body = tokio::time::timeout(BOUND, response.into_body().collect())
        .await
        .expect("body in time")
        .expect("body")
        .to_bytes();
    String::from_utf8(body.to_vec()).unwrap()
}
