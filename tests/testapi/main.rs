//! `lazaret-testapi`: the HTTPS test API of the Credential Proxy's
//! end-to-end tests and benchmark. It stands in for a real host such as
//! `api.anthropic.com` inside a test network namespace: it serves TLS with
//! a certificate from a test CA it makes at start (the CA's certificate is
//! written for the harness to trust), answers HTTP/1.1 and HTTP/2, and
//! writes every request it receives, headers and all, as one JSON line to
//! its log, so a test can see what arrived on the wire.
//!
//! Routes: `/echo…` answers with the request's log record; `/stream` sends
//! server-sent events frame by frame; `/bytes` sends bytes for throughput;
//! `POST /v1/messages` is a scripted Messages API (script.rs) for a real
//! Claude Code; anything else is 404 (and logged).
//!
//! Owns its listeners, its log file and the CA file it writes. Trusts its
//! command line (written by the test) and nothing a client sends: bodies
//! are read with a size cap and any shape it did not expect is a 400,
//! never a crash. It runs until it is killed.

mod script;
mod tls;

use std::convert::Infallible;
use std::ffi::OsString;
use std::fs::{File, OpenOptions, Permissions};
use std::io::{self, Write};
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, HOST, HeaderValue};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;

const USAGE: &str = "usage: lazaret-testapi --listen ADDR:PORT [--listen ADDR:PORT ...] \\
           --names NAME[,NAME...] --ca-out FILE --log FILE
prints `listening ADDR:PORT` for each listener, then `ready`, and serves
until killed; addresses are literal: 127.0.0.1:0, [::1]:443";

/// The largest request body the Messages API reads.
const MAX_BODY: usize = 8 * 1024 * 1024;

/// The size of one body frame of `/bytes`.
const FRAME: usize = 64 * 1024;

/// What `/bytes` sends.
static ZEROS: [u8; FRAME] = [0; FRAME];

/// The largest event and the most events `/stream` sends.
const MAX_EVENT: u64 = 16 * 1024 * 1024;
const MAX_EVENTS: u64 = 10_000_000;

/// How long a client may take to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The command line.
#[derive(Debug, PartialEq, Eq)]
struct Args {
    listen: Vec<SocketAddr>,
    names: Vec<String>,
    ca_out: PathBuf,
    log: PathBuf,
}

/// Whether `name` can be a subject alternative name: an IP address, or
/// a DNS name (letters, digits, `-`, `_`, `.`, a `*` label).
fn valid_name(name: &str) -> bool {
    name.parse::<IpAddr>().is_ok()
        || (!name.is_empty()
            && name.len() <= 253
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.*".contains(&b)))
}

/// Parses the command line (without the program name); `None` for
/// `--help`.
fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Option<Args>, String> {
    let mut listen = Vec::new();
    let mut names: Option<Vec<String>> = None;
    let mut ca_out = None;
    let mut log = None;
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        if arg == "--help" || arg == "-h" {
            return Ok(None);
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag.to_owned(), Some(value.into())),
            _ => (arg.clone(), None),
        };
        if !matches!(flag.as_str(), "--listen" | "--names" | "--ca-out" | "--log") {
            return Err(format!("unknown argument {arg:?}"));
        }
        let value: String = match inline {
            Some(value) => value,
            None => args.next().ok_or_else(|| format!("{flag} needs a value"))?,
        };
        let once = |given: bool| {
            if given {
                Err(format!("{flag} is given twice"))
            } else if value.is_empty() {
                Err(format!("{flag} is empty"))
            } else {
                Ok(())
            }
        };
        match flag.as_str() {
            "--listen" => listen.push(value.parse().map_err(|_| {
                format!("--listen {value:?} is not a literal ADDR:PORT such as 127.0.0.1:8443")
            })?),
            "--names" => {
                once(names.is_some())?;
                let list: Vec<String> = value.split(',').map(|n| n.trim().to_owned()).collect();
                if let Some(bad) = list.iter().find(|n| !valid_name(n)) {
                    return Err(format!(
                        "--names: {bad:?} is neither a DNS name nor an IP address"
                    ));
                }
                names = Some(list);
            }
            "--ca-out" => {
                once(ca_out.is_some())?;
                ca_out = Some(PathBuf::from(value));
            }
            _ => {
                once(log.is_some())?;
                log = Some(PathBuf::from(value));
            }
        }
    }
    if listen.is_empty() {
        return Err("--listen is required".into());
    }
    Ok(Some(Args {
        listen,
        names: names.ok_or("--names is required")?,
        ca_out: ca_out.ok_or("--ca-out is required")?,
        log: log.ok_or("--log is required")?,
    }))
}

fn usage(message: &str) -> ExitCode {
    eprintln!("lazaret-testapi: {message}\n{USAGE}");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let mut args = Vec::new();
    for arg in std::env::args_os().skip(1) {
        match arg.into_string() {
            Ok(arg) => args.push(arg),
            Err(arg) => return usage(&format!("argument {arg:?} is not UTF-8")),
        }
    }
    let args = match parse_args(args) {
        Ok(Some(args)) => args,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(message) => return usage(&message),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("lazaret-testapi: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(run(args))
}

async fn run(args: Args) -> ExitCode {
    let (server, listeners) = match start(&args).await {
        Ok(started) => started,
        Err(message) => {
            eprintln!("lazaret-testapi: {message}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = announce(&listeners, &mut io::stdout().lock()) {
        eprintln!("lazaret-testapi: cannot say ready: {e}");
        return ExitCode::FAILURE;
    }
    for listener in listeners {
        tokio::spawn(server.clone().serve(listener));
    }
    std::future::pending().await
}

/// Makes the certificates, opens the log, binds every listener and
/// writes the CA's certificate.
async fn start(args: &Args) -> Result<(Arc<Server>, Vec<TcpListener>), String> {
    let issued = tls::issue(&args.names)?;
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o644)
        .open(&args.log)
        .map_err(|e| format!("cannot open the log {}: {e}", args.log.display()))?;
    let mut listeners = Vec::new();
    for addr in &args.listen {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        listeners.push(listener);
    }
    write_atomically(&args.ca_out, issued.ca_pem.as_bytes()).map_err(|e| {
        format!(
            "cannot write the CA certificate to {}: {e}",
            args.ca_out.display()
        )
    })?;
    Ok((Arc::new(Server::new(issued.config, log)), listeners))
}

/// `listening ADDR` for every listener, then `ready`, flushed.
fn announce(listeners: &[TcpListener], out: &mut impl Write) -> io::Result<()> {
    for listener in listeners {
        writeln!(out, "listening {}", listener.local_addr()?)?;
    }
    out.write_all(b"ready\n")?;
    out.flush()
}

/// Writes `path` (mode 0644) through a temporary file beside it, so a
/// reader sees the old file or the whole new one.
fn write_atomically(path: &Path, contents: &[u8]) -> io::Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "the path names no file"))?;
    let mut temp_name = OsString::from(".");
    temp_name.push(name);
    temp_name.push(format!(".tmp{}", std::process::id()));
    let temp = path.with_file_name(temp_name);
    let written = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .open(&temp)?;
        file.set_permissions(Permissions::from_mode(0o644))?;
        file.write_all(contents)?;
        file.sync_all()?;
        std::fs::rename(&temp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    written
}

/// What every connection shares.
struct Server {
    acceptor: TlsAcceptor,
    http: auto::Builder<TokioExecutor>,
    log: Mutex<File>,
}

impl Server {
    fn new(config: Arc<rustls::ServerConfig>, log: File) -> Self {
        let mut http = auto::Builder::new(TokioExecutor::new());
        http.http1().timer(TokioTimer::new());
        http.http2().timer(TokioTimer::new());
        Self {
            acceptor: TlsAcceptor::from(config),
            http,
            log: Mutex::new(log),
        }
    }

    /// Accepts connections from `listener` forever, each on its own task.
    async fn serve(self: Arc<Self>, listener: TcpListener) {
        loop {
            match listener.accept().await {
                Ok((stream, peer)) => {
                    tokio::spawn(self.clone().connection(stream, peer));
                }
                Err(e) => {
                    eprintln!("lazaret-testapi: cannot accept a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// Serves one connection until it closes. A failed handshake is said
    /// on stderr (a client that does not trust the test CA, say); a
    /// connection the client drops is not.
    async fn connection(self: Arc<Self>, stream: TcpStream, peer: SocketAddr) {
        let _ = stream.set_nodelay(true);
        let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, self.acceptor.accept(stream)).await
        {
            Ok(Ok(tls)) => tls,
            Ok(Err(e)) => {
                eprintln!("lazaret-testapi: the TLS handshake from {peer} failed: {e}");
                return;
            }
            Err(_) => {
                eprintln!("lazaret-testapi: the TLS handshake from {peer} timed out");
                return;
            }
        };
        let sni: Option<Arc<str>> = tls.get_ref().1.server_name().map(Arc::from);
        let server = self.clone();
        let service = service_fn(move |request| {
            let server = server.clone();
            let sni = sni.clone();
            async move { Ok::<_, Infallible>(server.handle(sni.as_deref(), request).await) }
        });
        let _ = self.http.serve_connection(TokioIo::new(tls), service).await;
    }

    /// Logs `request`, then answers it.
    async fn handle(&self, sni: Option<&str>, request: Request<Incoming>) -> Response<Out> {
        let record = record(sni, &request);
        self.log(&record);
        let query = request.uri().query().map(str::to_owned);
        let query = query.as_deref();
        match (request.method(), request.uri().path()) {
            (_, path) if path.starts_with("/echo") => json_response(StatusCode::OK, &record),
            (&Method::GET, "/stream") => stream(query),
            (&Method::GET, "/bytes") => zeros(query),
            (&Method::POST, "/v1/messages") => messages(request, false).await,
            (&Method::POST, "/v1/messages/count_tokens") => messages(request, true).await,
            _ => text(StatusCode::NOT_FOUND, "not found\n"),
        }
    }

    /// Appends `record` to the log as one line, in one write.
    fn log(&self, record: &Value) {
        let mut line = record.to_string();
        line.push('\n');
        let mut file = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        if let Err(e) = file.write_all(line.as_bytes()) {
            eprintln!("lazaret-testapi: cannot write the log: {e}");
        }
    }
}

/// A request as the log and `/echo` show it.
fn record(sni: Option<&str>, request: &Request<Incoming>) -> Value {
    let lossy = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    let uri = request.uri();
    let authority = uri
        .authority()
        .map(|a| a.as_str().to_owned())
        .or_else(|| request.headers().get(HOST).map(|v| lossy(v.as_bytes())));
    let headers: Vec<Value> = request
        .headers()
        .iter()
        .map(|(name, value)| json!([name.as_str(), lossy(value.as_bytes())]))
        .collect();
    let path = uri
        .path_and_query()
        .map_or_else(|| uri.path().to_owned(), |p| p.as_str().to_owned());
    json!({
        "host": sni,
        "authority": authority,
        "method": request.method().as_str(),
        "path": path,
        "version": format!("{:?}", request.version()),
        "headers": headers,
    })
}

/// A response body: whole, streamed from a channel frame by frame, or
/// zeros in [`FRAME`]-sized frames.
#[derive(Debug)]
enum Out {
    Full(Option<Bytes>),
    Channel(mpsc::Receiver<Bytes>),
    Zeros(u64),
}

impl Body for Out {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            Self::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            Self::Channel(rx) => rx.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b)))),
            Self::Zeros(left) => {
                if *left == 0 {
                    return Poll::Ready(None);
                }
                let n = usize::try_from(*left).map_or(FRAME, |left| left.min(FRAME));
                *left -= n as u64;
                Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(&ZEROS[..n])))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Full(bytes) => bytes.is_none(),
            Self::Channel(_) => false,
            Self::Zeros(left) => *left == 0,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Full(bytes) => SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64)),
            Self::Channel(_) => SizeHint::default(),
            Self::Zeros(left) => SizeHint::with_exact(*left),
        }
    }
}

fn respond(status: StatusCode, content_type: &'static str, body: Out) -> Response<Out> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

fn text(status: StatusCode, body: &str) -> Response<Out> {
    let body = Out::Full(Some(Bytes::from(body.to_owned())));
    respond(status, "text/plain; charset=utf-8", body)
}

fn json_response(status: StatusCode, value: &Value) -> Response<Out> {
    let body = Out::Full(Some(Bytes::from(value.to_string())));
    respond(status, "application/json", body)
}

/// A body whose frames `frames` are sent one by one, each when the
/// connection has taken the one before, `delay` apart.
fn channel(frames: impl Iterator<Item = Bytes> + Send + 'static, delay: Duration) -> Out {
    let (tx, rx) = mpsc::channel(1);
    tokio::spawn(async move {
        for (i, frame) in frames.enumerate() {
            if i > 0 && !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            if tx.send(frame).await.is_err() {
                return;
            }
        }
    });
    Out::Channel(rx)
}

/// The value of `key` in a query string, a number; `default` when absent.
fn query_number(query: Option<&str>, key: &str, default: Option<u64>) -> Result<u64, String> {
    let value = query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v);
    match value {
        Some(v) => v
            .parse()
            .map_err(|_| format!("{key}={v:?} is not a number\n")),
        None => default.ok_or_else(|| format!("{key} is required\n")),
    }
}

/// `GET /stream?chunks=N&delay_ms=D&size=S`: N events of S `x`s, D ms
/// apart.
fn stream(query: Option<&str>) -> Response<Out> {
    let parsed = (|| {
        let chunks = query_number(query, "chunks", Some(1))?;
        let delay = query_number(query, "delay_ms", Some(0))?;
        let size = query_number(query, "size", Some(16))?;
        if chunks > MAX_EVENTS || size > MAX_EVENT {
            return Err(format!(
                "at most {MAX_EVENTS} chunks of {MAX_EVENT} bytes\n"
            ));
        }
        Ok((chunks, Duration::from_millis(delay), size as usize))
    })();
    let (chunks, delay, size) = match parsed {
        Ok(parsed) => parsed,
        Err(message) => return text(StatusCode::BAD_REQUEST, &message),
    };
    let mut event = Vec::with_capacity(size + 8);
    event.extend_from_slice(b"data: ");
    event.resize(6 + size, b'x');
    event.extend_from_slice(b"\n\n");
    let event = Bytes::from(event);
    let frames = (0..chunks).map(move |_| event.clone());
    let mut response = respond(StatusCode::OK, "text/event-stream", channel(frames, delay));
    response
        .headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// `GET /bytes?n=N`: N bytes in 64 KiB frames.
fn zeros(query: Option<&str>) -> Response<Out> {
    match query_number(query, "n", None) {
        Ok(n) => respond(StatusCode::OK, "application/octet-stream", Out::Zeros(n)),
        Err(message) => text(StatusCode::BAD_REQUEST, &message),
    }
}

fn api_error(status: StatusCode, kind: &str, message: &str) -> Response<Out> {
    json_response(status, &script::error(kind, message))
}

/// `POST /v1/messages` (the script) and `POST /v1/messages/count_tokens`.
async fn messages(request: Request<Incoming>, count_tokens: bool) -> Response<Out> {
    let body = match Limited::new(request.into_body(), MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
            return api_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "request_too_large",
                "the request body is larger than 8 MiB",
            );
        }
        Err(e) => {
            return api_error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                &format!("cannot read the request body: {e}"),
            );
        }
    };
    let request: Value = match serde_json::from_slice(&body) {
        Ok(value) => value,
        Err(e) => {
            return api_error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                &format!("the request body is not JSON: {e}"),
            );
        }
    };
    if count_tokens {
        return json_response(StatusCode::OK, &json!({"input_tokens": 10}));
    }
    let reply = match script::reply(&request, body.len()) {
        Ok(reply) => reply,
        Err(message) => {
            return api_error(StatusCode::BAD_REQUEST, "invalid_request_error", &message);
        }
    };
    let mut response = if reply.stream {
        let events = script::events(&reply).into_iter();
        let mut response = respond(
            StatusCode::OK,
            "text/event-stream",
            channel(events, Duration::ZERO),
        );
        response
            .headers_mut()
            .insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        response
    } else {
        json_response(StatusCode::OK, &script::message(&reply))
    };
    if let Ok(id) = HeaderValue::from_str(&script::request_id()) {
        response.headers_mut().insert("request-id", id);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    use http_body_util::Full;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};
    use tokio_rustls::TlsConnector;
    use tokio_rustls::client::TlsStream;

    const NAME: &str = "api.test.invalid";

    fn parse(list: &[&str]) -> Result<Option<Args>, String> {
        parse_args(list.iter().map(|s| (*s).to_owned()))
    }

    #[test]
    fn the_command_line() {
        let args = parse(&[
            "--listen",
            "127.0.0.1:0",
            "--listen=[::1]:8443",
            "--names",
            "api.test.invalid, other.test.invalid,10.0.0.1",
            "--ca-out",
            "/tmp/ca.pem",
            "--log=/tmp/log",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            args,
            Args {
                listen: vec![
                    "127.0.0.1:0".parse().unwrap(),
                    "[::1]:8443".parse().unwrap()
                ],
                names: vec![
                    "api.test.invalid".into(),
                    "other.test.invalid".into(),
                    "10.0.0.1".into()
                ],
                ca_out: "/tmp/ca.pem".into(),
                log: "/tmp/log".into(),
            }
        );
        assert_eq!(parse(&["--help"]), Ok(None));
        let good = [
            "--listen",
            "127.0.0.1:1",
            "--names",
            "a",
            "--ca-out",
            "c",
            "--log",
            "l",
        ];
        for (bad, says) in [
            (vec!["--port", "1"], "unknown argument"),
            (vec!["--listen", "localhost:1"], "not a literal"),
            (vec!["--names", "a,,b"], "neither a DNS name"),
            (vec!["--names", "a b"], "neither a DNS name"),
            (vec!["--log", "x"], "given twice"),
            (vec!["--ca-out="], "is empty"),
        ] {
            let mut list = bad;
            list.extend(good);
            let e = parse(&list).unwrap_err();
            assert!(e.contains(says), "{list:?}: {e}");
        }
        assert_eq!(
            parse(&["--names", "a", "--listen"]),
            Err("--listen needs a value".into())
        );
        assert_eq!(
            parse(&["--names", "a", "--ca-out", "c", "--log", "l"]),
            Err("--listen is required".into())
        );
        assert_eq!(
            parse(&["--listen", "127.0.0.1:1", "--ca-out", "c", "--log", "l"]),
            Err("--names is required".into())
        );
    }

    #[test]
    fn query_numbers() {
        let q = Some("chunks=3&x&delay_ms=20");
        assert_eq!(query_number(q, "chunks", Some(1)), Ok(3));
        assert_eq!(query_number(q, "size", Some(16)), Ok(16));
        assert!(query_number(q, "x", Some(1)).is_err());
        assert!(query_number(None, "n", None).is_err());
    }

    async fn connect(addr: SocketAddr, ca: &Path, alpn: &[u8]) -> TlsStream<TcpStream> {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_file(ca).unwrap())
            .unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![alpn.to_vec()];
        let tcp = TcpStream::connect(addr).await.unwrap();
        let tls = TlsConnector::from(Arc::new(config))
            .connect(ServerName::try_from(NAME).unwrap(), tcp)
            .await
            .unwrap();
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(alpn));
        tls
    }

    fn get(uri: &str) -> Request<Full<Bytes>> {
        Request::get(uri).body(Full::default()).unwrap()
    }

    async fn body(response: Response<Incoming>) -> Bytes {
        response.into_body().collect().await.unwrap().to_bytes()
    }

    #[tokio::test]
    async fn serves_echo_streams_and_the_messages_api_over_https() {
        let dir = tempfile::tempdir().unwrap();
        let args = Args {
            listen: vec!["127.0.0.1:0".parse().unwrap()],
            names: vec![NAME.into(), "127.0.0.1".into()],
            ca_out: dir.path().join("ca.pem"),
            log: dir.path().join("requests.jsonl"),
        };
        let (server, listeners) = start(&args).await.unwrap();
        let mut said = Vec::new();
        announce(&listeners, &mut said).unwrap();
        let addr = listeners[0].local_addr().unwrap();
        assert_ne!(addr.port(), 0);
        assert_eq!(
            String::from_utf8(said).unwrap(),
            format!("listening {addr}\nready\n")
        );
        let mode = std::fs::metadata(&args.ca_out)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o644);
        for listener in listeners {
            tokio::spawn(server.clone().serve(listener));
        }

        // HTTP/1.1: the echo carries the key sent, and the log holds it.
        let tls = connect(addr, &args.ca_out, b"http/1.1").await;
        let (mut h1, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .unwrap();
        tokio::spawn(connection);
        let request = Request::get("/echo/x?y=1")
            .header(HOST, NAME)
            .header("x-api-key", "sk-ant-test-real")
            .header("authorization", "Bearer sk-ant-test-real")
            .body(Full::default())
            .unwrap();
        let response = h1.send_request(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()[CONTENT_TYPE], "application/json");
        let echo: Value = serde_json::from_slice(&body(response).await).unwrap();
        assert_eq!(echo["host"], NAME);
        assert_eq!(echo["authority"], NAME);
        assert_eq!(echo["method"], "GET");
        assert_eq!(echo["path"], "/echo/x?y=1");
        assert_eq!(echo["version"], "HTTP/1.1");
        assert_eq!(
            echo["headers"],
            json!([
                ["host", NAME],
                ["x-api-key", "sk-ant-test-real"],
                ["authorization", "Bearer sk-ant-test-real"],
            ])
        );
        let log = std::fs::read_to_string(&args.log).unwrap();
        let lines: Vec<Value> = log
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines, [echo]);

        // /stream, /bytes and a 404 on the same connection.
        let started = std::time::Instant::now();
        let response = h1
            .send_request(get("/stream?chunks=3&delay_ms=30&size=4"))
            .await
            .unwrap();
        assert_eq!(response.headers()[CONTENT_TYPE], "text/event-stream");
        assert_eq!(&body(response).await[..], b"data: xxxx\n\n".repeat(3));
        assert!(started.elapsed() >= Duration::from_millis(60));
        let response = h1.send_request(get("/bytes?n=200000")).await.unwrap();
        assert_eq!(response.headers()["content-length"], "200000");
        assert_eq!(body(response).await.len(), 200_000);
        let response = h1.send_request(get("/api/hello")).await.unwrap();
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        let response = h1.send_request(get("/bytes")).await.unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);

        // HTTP/2: the streamed Messages API, count_tokens, a bad body.
        let tls = connect(addr, &args.ca_out, b"h2").await;
        let (mut h2, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                .await
                .unwrap();
        tokio::spawn(connection);
        let post = |uri: &str, body: String| {
            Request::post(format!("https://{NAME}{uri}"))
                .header(CONTENT_TYPE, "application/json")
                .header("x-api-key", "sk-ant-test-real")
                .body(Full::new(Bytes::from(body)))
                .unwrap()
        };
        let turn = json!({
            "model": "claude-test-model",
            "max_tokens": 32000,
            "stream": true,
            "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
            "messages": [{"role": "user", "content": "write the file"}],
        });
        let response = h2
            .send_request(post("/v1/messages?beta=true", turn.to_string()))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()[CONTENT_TYPE], "text/event-stream");
        let stream = String::from_utf8(body(response).await.to_vec()).unwrap();
        let events = script::tests::parse_sse(&stream);
        assert_eq!(events[1].1["content_block"]["name"], "Bash");
        assert_eq!(events.last().unwrap().0, "message_stop");
        let response = h2
            .send_request(post("/v1/messages/count_tokens", turn.to_string()))
            .await
            .unwrap();
        let count: Value = serde_json::from_slice(&body(response).await).unwrap();
        assert_eq!(count, json!({"input_tokens": 10}));
        let response = h2
            .send_request(post("/v1/messages", "{not json".into()))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        let error: Value = serde_json::from_slice(&body(response).await).unwrap();
        assert_eq!(error["type"], "error");
        assert_eq!(error["error"]["type"], "invalid_request_error");

        let log = std::fs::read_to_string(&args.log).unwrap();
        let lines: Vec<Value> = log
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 8);
        let messages = &lines[5];
        assert_eq!(messages["version"], "HTTP/2.0");
        assert_eq!(messages["authority"], NAME);
        assert_eq!(messages["path"], "/v1/messages?beta=true");
        assert_eq!(messages["method"], "POST");
        assert!(
            messages["headers"]
                .as_array()
                .unwrap()
                .contains(&json!(["x-api-key", "sk-ant-test-real"]))
        );
    }
}
