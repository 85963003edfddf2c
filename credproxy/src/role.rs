//! The `lazaret-credproxy` role: one Credential Proxy for a generation
//! whose profile has credentials.
//!
//! The Runtime Supervisor starts it in the enforcement network namespace,
//! once Lazaret's resolver serves names, with no capabilities at all. It
//! then:
//! 1. checks it holds no capability;
//! 2. takes its channel and receives one [`ProxyServeRequest`]: the
//!    listening socket the supervisor bound at [`LISTEN`], the sealed memfd
//!    of its credentials and roots (from the Host Coordinator), and its end
//!    of the resolver's lookup socket pair;
//! 3. makes its CA (the key in this process's memory only) and reports
//!    [`ProxyReadiness`] with the CA's certificate, which the supervisor
//!    adds to the sandbox's trust;
//! 4. serves until the Domain pid namespace ends: it is a child of the
//!    namespace's pid 1, so the kernel ends it with the supervisor.
//!
//! It trusts only the supervisor at the other end of its inherited channel
//! and the resolver at the other end of its lookup socket; every byte from
//! the sandbox goes through [`crate::proxy`].

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, OwnedFd};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lazaret_proto::channel::{Endpoint, Received};
use lazaret_proto::codec;
use lazaret_proto::credproxy::{
    LISTEN, Looked, Lookup, ProxyCredentials, ProxyError, ProxyReadiness, ProxyReport,
    ProxyRequest, ProxyServeRequest, ProxyStep,
};
use lazaret_proto::error_chain as chain;
use lazaret_proto::failure::Failure;
use tokio::net::{TcpListener, TcpStream, UnixDatagram};

use crate::{Authority, Config, Connect, Connecting, Hosts, Limits, Proxy};

type Channel = Endpoint<ProxyReport, ProxyRequest>;

/// How long the resolver may take to look a host up (its upstream bound,
/// twice, and a margin).
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// How long one of a host's addresses has to accept a connection before
/// the next is tried: a silent first address leaves the others time
/// within the whole connection's bound.
const ADDRESS_TIMEOUT: Duration = Duration::from_secs(3);

fn failed(step: ProxyStep, detail: impl std::fmt::Display) -> ProxyError {
    ProxyError {
        step,
        failure: Failure::check(detail),
    }
}

fn failed_by(
    step: ProxyStep,
    context: &str,
    error: &(dyn std::error::Error + 'static),
) -> ProxyError {
    ProxyError {
        step,
        failure: Failure::of(error).within(context),
    }
}

/// Runs the proxy until it is killed.
pub fn run() -> ExitCode {
    let channel = match Channel::start_role("lazaret-credproxy") {
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
    let started = {
        let _entered = runtime.enter();
        start(&channel).and_then(|started| {
            crate::seccomp::install().map_err(|e| failed_by(ProxyStep::Privileges, "", &e))?;
            Ok(started)
        })
    };
    let (proxy, listener, readiness) = match started {
        Ok(started) => started,
        Err(error) => {
            tracing::error!("{error}");
            let _ = channel.send(&ProxyReport::Failed(error), &[]);
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(hosts = ?readiness.hosts, "the Credential Proxy serves on {LISTEN}");
    if let Err(e) = channel.send(&ProxyReport::Serving(readiness), &[]) {
        tracing::error!("cannot report: {}", chain(&e));
        return ExitCode::FAILURE;
    }
    drop(channel);
    let error = runtime.block_on(proxy.serve(&listener));
    tracing::error!("cannot accept connections any more: {error}");
    ExitCode::FAILURE
}

/// Takes the request, reads the credentials, and makes the CA and the
/// proxy. Runs inside the runtime's context (its sockets register there).
fn start(channel: &Channel) -> Result<(Proxy, TcpListener, ProxyReadiness), ProxyError> {
    lazaret_proto::privilege::require_exactly(
        rustix::thread::CapabilitySet::empty(),
        "start it through lazaret-supervisor, which grants it no capability",
    )
    .map_err(|e| failed_by(ProxyStep::Privileges, "", &e))?;
    let Received { message, fds } = channel
        .recv()
        .map_err(|e| failed_by(ProxyStep::Request, "", &e))?;
    let ProxyRequest::Serve(ProxyServeRequest {
        listener,
        credentials,
        lookups,
    }) = message;
    let owned =
        |index: lazaret_proto::channel::FdIndex, what: &str| -> Result<OwnedFd, ProxyError> {
            index
                .get(&fds)
                .ok_or_else(|| failed(ProxyStep::Request, format!("{what} is missing")))?
                .try_clone_to_owned()
                .map_err(|e| failed_by(ProxyStep::Request, what, &e))
        };
    let bytes = lazaret_proto::memfd::read_sealed(
        owned(credentials, "the credentials memfd")?.as_fd(),
        <ProxyCredentials as codec::WireRecord>::MAX_ENCODED_LEN,
    )
    .map_err(|e| failed_by(ProxyStep::Request, "the credentials", &e))?;
    let credentials: ProxyCredentials =
        codec::decode(&bytes).map_err(|e| failed_by(ProxyStep::Request, "the credentials", &e))?;
    let mut hosts = Hosts::new();
    for credential in &credentials.credentials {
        for host in &credential.hosts {
            hosts
                .add(
                    host,
                    credential.placeholder.as_bytes(),
                    credential.value.as_bytes(),
                )
                .map_err(|e| failed_by(ProxyStep::Request, &format!("`{}`", credential.env), &e))?;
        }
    }
    let roots = crate::upstream::roots(&credentials.roots)
        .map_err(|e| failed_by(ProxyStep::Tls, "", &e))?;
    let authority = Arc::new(
        Authority::generate(hosts.names()).map_err(|e| failed_by(ProxyStep::Tls, "", &e))?,
    );
    let socket = |fd: OwnedFd, what: &str| -> Result<_, ProxyError> {
        let on_socket = |e: &io::Error| failed_by(ProxyStep::Sockets, what, e);
        Ok(fd)
            .and_then(|fd| {
                let std = std::os::unix::net::UnixDatagram::from(fd);
                std.set_nonblocking(true)?;
                UnixDatagram::from_std(std)
            })
            .map_err(|e| on_socket(&e))
    };
    let lookups = socket(owned(lookups, "the lookup socket")?, "the lookup socket")?;
    let listener = std::net::TcpListener::from(owned(listener, "the listening socket")?);
    let listener = listener
        .set_nonblocking(true)
        .and_then(|()| TcpListener::from_std(listener))
        .map_err(|e| failed_by(ProxyStep::Sockets, "the listening socket", &e))?;
    let readiness = ProxyReadiness {
        listen: LISTEN,
        hosts: credentials.hosts(),
        ca_certificate: authority.certificate_pem(),
    };
    let proxy = Proxy::new(
        authority,
        Config {
            hosts,
            roots,
            connector: Arc::new(Connector(Arc::new(ResolverLookups::new(lookups)))),
            upstream_port: crate::proxy::UPSTREAM_PORT,
            limits: Limits::default(),
        },
    )
    .map_err(|e| failed_by(ProxyStep::Tls, "", &e))?;
    Ok((proxy, listener, readiness))
}

/// Reaches a credential host: its addresses from Lazaret's resolver (which
/// admits them into the filter's set first), then a plain connection to
/// the first that answers.
struct ResolverLookups {
    socket: tokio::sync::Mutex<UnixDatagram>,
    next: AtomicU64,
}

impl ResolverLookups {
    fn new(socket: UnixDatagram) -> Self {
        Self {
            socket: tokio::sync::Mutex::new(socket),
            next: AtomicU64::new(1),
        }
    }

    /// The admitted addresses of `host`, one lookup at a time.
    async fn look_up(&self, host: &str) -> io::Result<Vec<Ipv4Addr>> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let lookup = codec::encode(&Lookup {
            id,
            name: host.to_owned(),
        })
        .map_err(io::Error::other)?;
        let socket = self.socket.lock().await;
        socket.send(&lookup).await?;
        let mut buffer = vec![0u8; 4096];
        let looked = tokio::time::timeout(LOOKUP_TIMEOUT, async {
            loop {
                let len = socket.recv(&mut buffer).await?;
                if len == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::BrokenPipe,
                        "Lazaret's resolver is gone",
                    ));
                }
                // An answer to an earlier lookup that timed out is dropped.
                match codec::decode::<Looked>(&buffer[..len]) {
                    Ok(looked) if looked.id == id => return Ok(looked),
                    _ => {}
                }
            }
        })
        .await
        .map_err(|_| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!("Lazaret's resolver did not look {host} up within {LOOKUP_TIMEOUT:?}"),
            )
        })??;
        if looked.addresses.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{host} has no address (DNS rcode {})", looked.response_code),
            ));
        }
        Ok(looked.addresses)
    }
}

/// The proxy's connector: shares its lookup socket with every connection
/// it opens.
struct Connector(Arc<ResolverLookups>);

impl Connect for Connector {
    fn connect(&self, host: &str, port: u16) -> Connecting {
        let lookups = Arc::clone(&self.0);
        let host = host.to_owned();
        Box::pin(async move {
            let mut last = None;
            for address in lookups.look_up(&host).await? {
                match tokio::time::timeout(ADDRESS_TIMEOUT, TcpStream::connect((address, port)))
                    .await
                {
                    Ok(Ok(stream)) => return Ok(stream),
                    Ok(Err(e)) => last = Some(e),
                    Err(_) => {
                        last = Some(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!("{address}:{port} did not answer within {ADDRESS_TIMEOUT:?}"),
                        ));
                    }
                }
            }
            Err(last.unwrap_or_else(|| io::Error::other(format!("{host} has no address"))))
        })
    }
}
