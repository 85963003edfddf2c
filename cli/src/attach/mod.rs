//! `lazaret attach PROFILE [-- COMMAND...]`: a Client Session.
//!
//! Connects to the Domain's Session Coordinator socket, proves itself with
//! the generation's client certificate and checks the coordinator against
//! the trust manifest, then moves bytes: the local terminal (raw, and its
//! modes and the standard streams' file status flags restored on every
//! exit path) or plain standard input and output, window-size changes, and
//! the exit code of the process inside. Only pipes and `/dev/null` are
//! handed to the process inside; a terminal, socket or file is relayed.
//! Trusts the coordinator only through the TLS handshake pinned to the
//! generation's CA.
//!
//! The connection is the coordinator's own link code
//! ([`lazaret_coordinator::session::link`]: the same socket, frames and
//! `tokio-rustls`), on a current-thread tokio runtime; [`relay`] moves the
//! bytes, [`terminal`] keeps the terminal the developer's.

mod relay;
mod terminal;

use std::io::{IsTerminal, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use lazaret_proto::ids::SessionId;
use lazaret_proto::session::{OpenSession, SessionOpened, SessionRefusal};
use lazaret_proto::terminal::SessionExitOutcome;

use self::relay::{Ended, EndedHere, RelayError, Signals};
use self::terminal::{RawMode, StatusFlags};
use super::screen::Screen;
use super::{Failure, Globals};
use crate::config::{ConfigError, ConfinedError, HostEnvironment, RetainedDir};
use crate::lifecycle::{DomainPaths, chain};
use crate::session::link::{ClientLink, LinkError};
use crate::session::tls::{ClientCredential, TlsError, read_publication};
use crate::session::{CREDENTIAL_DIR, SESSION_SOCKET};

/// How long the coordinator has to complete TLS, and then to open the
/// session asked for.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(60);

/// How long what is left to send, and the goodbye, may take once the
/// session ended: as long as one write to a coordinator that stopped
/// reading could ever wait.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// The configuration, being loaded on a thread of its own.
type Loading<'scope> = std::thread::ScopedJoinHandle<
    'scope,
    Result<crate::config::ResolvedDomainConfiguration, Failure>,
>;

/// Why `lazaret attach` failed, in the order it gets there; the message is
/// the error with its causes.
#[derive(Debug, thiserror::Error)]
enum AttachError {
    /// The Domain has no runtime directory, credential or listener.
    #[error(
        "profile `{profile}` is not running in this workspace; start it with `lazaret up {profile}`"
    )]
    NotRunning { profile: String },
    /// The profile or workspace does not name a Domain.
    #[error("invalid configuration")]
    Config(#[from] ConfigError),
    /// The runtime directory could not be opened.
    #[error("cannot open {}", path.display())]
    RuntimeDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The credential directory could not be opened.
    #[error("cannot open the session credential directory")]
    CredentialDir(#[source] ConfinedError),
    /// The credential could not be loaded.
    #[error("cannot load the session credential")]
    Credential(#[source] TlsError),
    /// The event loop could not be made.
    #[error("cannot start the event loop")]
    Runtime(#[source] std::io::Error),
    /// The socket refused the connection for another reason than the
    /// Domain being down.
    #[error("cannot connect to {}", path.display())]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// rustls could not start a client.
    #[error("cannot start TLS")]
    StartTls(#[source] rustls::Error),
    /// The handshake failed.
    #[error("the Domain's Session Coordinator was refused")]
    Handshake(#[source] LinkError),
    /// The publication beside the credential could not be read.
    #[error("cannot read the session publication")]
    Publication(#[source] TlsError),
    /// The credential is of another generation or Domain.
    #[error(
        "the session credential in {} does not belong to the Domain's running generation \
         (it was left by another run); run `lazaret down {profile}` and `lazaret up {profile}` \
         to renew it",
        dir.display()
    )]
    ForeignCredential { dir: PathBuf, profile: String },
    /// The thread loading the configuration panicked.
    #[error("loading the configuration failed unexpectedly")]
    LoadPanicked,
    /// The configuration as it is now does not load.
    #[error("cannot check the running Domain against the configuration: {reason}")]
    Configuration { reason: String },
    /// The Domain runs another configuration than the one there is now.
    #[error(
        "profile `{profile}` runs under another configuration than the one it has now \
         (fingerprint {running} running, {configured} configured); run `lazaret up {profile}` \
         to see what differs, then `lazaret down {profile}` and `lazaret up {profile}` to \
         apply it"
    )]
    Reconfigured {
        profile: String,
        running: String,
        configured: String,
    },
    /// Asking for the session failed.
    #[error("the session connection failed")]
    Open(#[source] LinkError),
    /// The coordinator refused the session.
    #[error("the session was refused: {0}")]
    Refused(SessionRefusal),
    /// The signal handlers could not be registered.
    #[error(transparent)]
    Signals(std::io::Error),
    /// The terminal could not be made raw.
    #[error("cannot set the terminal raw")]
    Raw(#[source] std::io::Error),
    /// The Domain went down under the session.
    #[error("the Domain went down (`lazaret down {profile}`); the session ended")]
    DomainDown { profile: String },
    /// The session's process was lost.
    #[error("the session's process was lost")]
    ProcessLost,
    /// This side ended the session.
    #[error("{0}; the session ended")]
    EndedHere(EndedHere),
    /// The relay failed.
    #[error(transparent)]
    Relay(#[from] RelayError),
}

impl From<AttachError> for Failure {
    fn from(error: AttachError) -> Self {
        match error {
            AttachError::Config(error) => Failure::from(error),
            AttachError::EndedHere(why) => Failure {
                message: chain(&error),
                status: 128 + u8::try_from(why.signal()).unwrap_or(0),
            },
            error => super::failure(chain(&error)),
        }
    }
}

/// `lazaret attach PROFILE [-- COMMAND...]`: returns the exit code.
pub fn attach(globals: &Globals, profile: &str, command: Vec<String>) -> Result<u8, Failure> {
    let _flags = StatusFlags::save();
    // The configuration is loaded on a thread of its own while the
    // connection is made, which mostly waits on the coordinator.
    std::thread::scope(|scope| {
        let loaded = scope.spawn(|| globals.load_with(profile, crate::config::EnvValues::Skip));
        let workspace = globals.workspace_dir()?;
        Ok(run(&workspace, profile, command, loaded)?)
    })
}

/// The rest of [`attach`], with the configuration being loaded by `loaded`.
fn run(
    workspace: &Path,
    profile: &str,
    command: Vec<String>,
    loaded: Loading<'_>,
) -> Result<u8, AttachError> {
    let paths = DomainPaths::locate(profile, workspace, &HostEnvironment::capture())?;
    let domain = Domain::open(&paths, profile)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(AttachError::Runtime)?;
    let mut link = runtime.block_on(domain.connect())?;
    domain.check_generation()?;
    check_configuration(loaded, &domain.credential, profile)?;
    runtime.block_on(session(&mut link, command, profile))
}

/// A running Domain as its client sees it: the runtime directory, the
/// credential directory and the credential in it.
struct Domain<'a> {
    paths: &'a DomainPaths,
    profile: &'a str,
    dir: OwnedFd,
    credential_dir: RetainedDir,
    credential: ClientCredential,
}

impl<'a> Domain<'a> {
    /// Opens the Domain's runtime and credential directories and loads the
    /// credential.
    fn open(paths: &'a DomainPaths, profile: &'a str) -> Result<Self, AttachError> {
        let not_running = || AttachError::NotRunning {
            profile: profile.to_owned(),
        };
        let dir = rustix::fs::open(
            &paths.runtime_dir,
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| match std::io::Error::from(e) {
            e if absent(&e) => not_running(),
            source => AttachError::RuntimeDir {
                path: paths.runtime_dir.clone(),
                source,
            },
        })?;
        let credential_path = paths.runtime_dir.join(CREDENTIAL_DIR);
        let credential_dir = RetainedDir::open_ambient(&credential_path).map_err(|e| match &e {
            ConfinedError::Missing { .. } => not_running(),
            ConfinedError::Io { source, .. } if absent(source) => not_running(),
            _ => AttachError::CredentialDir(e),
        })?;
        let credential =
            ClientCredential::load(&credential_dir).map_err(AttachError::Credential)?;
        Ok(Self {
            paths,
            profile,
            dir,
            credential_dir,
            credential,
        })
    }

    /// Connects to the Session Coordinator and completes TLS.
    async fn connect(&self) -> Result<ClientLink, AttachError> {
        let socket = lazaret_proto::channel::socket_path_at(self.dir.as_fd(), SESSION_SOCKET);
        let stream = std::os::unix::net::UnixStream::connect(&socket)
            .and_then(|stream| {
                stream.set_nonblocking(true)?;
                tokio::net::UnixStream::from_std(stream)
            })
            .map_err(|source| {
                if absent(&source) {
                    AttachError::NotRunning {
                        profile: self.profile.to_owned(),
                    }
                } else {
                    AttachError::Connect {
                        path: self.paths.runtime_dir.join(SESSION_SOCKET),
                        source,
                    }
                }
            })?;
        let handshake = ClientLink::connect(stream, self.credential.client_config());
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
            Ok(Ok(link)) => Ok(link),
            Ok(Err(LinkError::Start(e))) => Err(AttachError::StartTls(e)),
            Ok(Err(e)) => Err(AttachError::Handshake(e)),
            Err(_) => Err(AttachError::Handshake(LinkError::TimedOut(
                HANDSHAKE_TIMEOUT,
            ))),
        }
    }

    /// Checks that the publication beside the credential names the same
    /// generation, of this Domain (after the handshake, so that a
    /// credential of another generation is refused by TLS itself first).
    fn check_generation(&self) -> Result<(), AttachError> {
        let manifest = self.credential.manifest();
        let publication =
            read_publication(&self.credential_dir).map_err(AttachError::Publication)?;
        if publication.generation_identity != manifest.generation_identity
            || manifest.generation_identity.domain_id != self.paths.domain_id
        {
            return Err(AttachError::ForeignCredential {
                dir: self.paths.runtime_dir.clone(),
                profile: self.profile.to_owned(),
            });
        }
        Ok(())
    }
}

/// A Domain that is not running has no runtime dir or no listener.
fn absent(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
    )
}

/// The generation must run the profile as configured now: a session under
/// an older configuration (another network policy, other volumes) is
/// refused rather than entered unawares. The `env:` values are not needed
/// for that, and this shell need not export them.
fn check_configuration(
    loaded: Loading<'_>,
    credential: &ClientCredential,
    profile: &str,
) -> Result<(), AttachError> {
    let loaded = loaded
        .join()
        .map_err(|_| AttachError::LoadPanicked)?
        .map_err(|f| AttachError::Configuration { reason: f.message })?;
    let running = credential
        .manifest()
        .generation_identity
        .configuration_fingerprint;
    if loaded.fingerprint() != running {
        return Err(AttachError::Reconfigured {
            profile: profile.to_owned(),
            running: running.to_hex()[..16].to_owned(),
            configured: loaded.fingerprint().to_hex()[..16].to_owned(),
        });
    }
    Ok(())
}

/// Asks for the session and relays it: the exit code of its process.
async fn session(
    link: &mut ClientLink,
    command: Vec<String>,
    profile: &str,
) -> Result<u8, AttachError> {
    let terminal = std::io::stdin().is_terminal();
    let (rows, columns) = terminal::window_size();
    let open = OpenSession {
        command: (!command.is_empty()).then_some(command),
        terminal,
        prompts: terminal && std::io::stdout().is_terminal(),
        rows,
        columns,
        term: terminal.then(|| std::env::var("TERM").ok()).flatten(),
        // Without a terminal, the process reads and writes this CLI's own
        // standard input and output when both are pipes or /dev/null:
        // nothing is relayed. A terminal (on standard output), a socket or
        // a file is never handed in.
        direct_stdio: !terminal
            && crate::session::donatable(rustix::stdio::stdin())
            && crate::session::donatable(rustix::stdio::stdout()),
    };
    let session_id = open_session(link, &open).await?;

    // Signals are registered only now: until the session runs, they end
    // this CLI as usual. Raw mode is undone by `RawMode`'s drop on every
    // path out.
    let signals = Signals::register().map_err(AttachError::Signals)?;
    let raw = if terminal {
        Some(RawMode::enter(std::io::stdin().as_fd()).map_err(AttachError::Raw)?)
    } else {
        None
    };
    let mut screen = Screen::default();
    let result = relay::relay(
        link,
        session_id,
        signals,
        !open.direct_stdio,
        terminal.then_some(&mut screen),
    )
    .await;
    if terminal {
        // What the program inside left set (the alternate screen, a
        // scrolling region, origin or insert mode, colours, keyboard
        // modes) is undone before the shell is back.
        let mut stdout = std::io::stdout().lock();
        let _ = stdout
            .write_all(&screen.reset())
            .and_then(|()| stdout.flush());
    }
    drop(raw);
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, link.close()).await;
    match result? {
        Ended::Session(SessionExitOutcome::Exited | SessionExitOutcome::Terminated, code) => {
            Ok(code)
        }
        Ended::Session(SessionExitOutcome::DomainDown, _) => Err(AttachError::DomainDown {
            profile: profile.to_owned(),
        }),
        Ended::Session(SessionExitOutcome::Lost, _) => Err(AttachError::ProcessLost),
        Ended::Here(why) => Err(AttachError::EndedHere(why)),
    }
}

/// Sends the request for the session (with this CLI's standard input and
/// output when they are handed in) and waits for the answer.
async fn open_session(link: &mut ClientLink, open: &OpenSession) -> Result<SessionId, AttachError> {
    let exchange = async {
        if open.direct_stdio {
            let stdio = [rustix::stdio::stdin(), rustix::stdio::stdout()]
                .into_iter()
                .map(|fd| fd.try_clone_to_owned().map_err(LinkError::Io))
                .collect::<Result<Vec<_>, _>>()?;
            link.send_with_fds(open, stdio).await?;
        } else {
            link.send(open).await?;
        }
        link.recv::<SessionOpened>().await
    };
    let opened = tokio::time::timeout(HANDSHAKE_TIMEOUT, exchange)
        .await
        .unwrap_or(Err(LinkError::TimedOut(HANDSHAKE_TIMEOUT)))
        .map_err(AttachError::Open)?;
    match opened {
        SessionOpened::Opened { session_id } => Ok(session_id),
        SessionOpened::Refused(refusal) => Err(AttachError::Refused(refusal)),
    }
}

#[cfg(test)]
mod tests {
    use super::relay::{EndedHere, RelayError};
    use super::{AttachError, Failure, LinkError, SessionRefusal};

    fn shown(error: AttachError) -> (String, u8) {
        let Failure { message, status } = Failure::from(error);
        (message, status)
    }

    #[test]
    fn a_session_ended_here_exits_with_its_signal() {
        for (why, message, status) in [
            (
                EndedHere::Terminated,
                "lazaret attach was asked to stop (SIGTERM); the session ended",
                143,
            ),
            (
                EndedHere::HungUp,
                "the terminal hung up (SIGHUP); the session ended",
                129,
            ),
            (
                EndedHere::TerminalLost,
                "the terminal went away; the session ended",
                129,
            ),
            (
                EndedHere::OutputClosed,
                "standard output was closed; the session ended",
                141,
            ),
        ] {
            assert_eq!(
                shown(AttachError::EndedHere(why)),
                (message.to_owned(), status)
            );
        }
    }

    #[test]
    fn failures_say_what_failed_with_their_causes() {
        let profile = "dev".to_owned();
        assert_eq!(
            shown(AttachError::NotRunning {
                profile: profile.clone()
            }),
            (
                "profile `dev` is not running in this workspace; start it with `lazaret up dev`"
                    .to_owned(),
                1
            )
        );
        assert_eq!(
            shown(AttachError::Relay(RelayError::Lost(LinkError::Closed))).0,
            "the connection to the Domain was lost: the other end closed the session connection"
        );
        let refused = shown(AttachError::Open(LinkError::Tls(
            rustls::Error::AlertReceived(rustls::AlertDescription::BadCertificate),
        )))
        .0;
        assert_eq!(
            refused,
            "the session connection failed: TLS refused the session connection: received fatal \
             alert: BadCertificate"
        );
        let (message, status) = shown(AttachError::DomainDown { profile });
        assert_eq!(
            message,
            "the Domain went down (`lazaret down dev`); the session ended"
        );
        assert_eq!(status, 1);
        assert_eq!(
            shown(AttachError::Refused(SessionRefusal::GoingDown)).0,
            "the session was refused: the Domain is going down"
        );
    }
}
