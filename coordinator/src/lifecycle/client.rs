//! The CLI's side of the lifecycle: starting a coordinator and following its
//! startup, and asking a running one for status or to stop.
//!
//! Owns no Domain state. It trusts a control socket's answers only after
//! checking the peer's uid equals its own, and a coordinator's startup
//! reports (and its one question) because it started that coordinator
//! itself.

use std::ffi::OsString;
use std::os::fd::AsFd;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use lazaret_hostfs::programs::role_binary;
use lazaret_proto::channel::{ChannelError, Endpoint, Received};
use lazaret_proto::control::{ControlRequest, ControlResponse, StartupEvent, StartupReply};
use rustix::fs::{FlockOperation, Mode, OFlags};

use super::DomainPaths;
use super::context::IgnoreChangesMode;

/// Why a lifecycle request failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The coordinator binary could not be found or started.
    #[error("cannot start the Host Coordinator: {0}")]
    Spawn(String),
    /// The channel to the coordinator failed.
    #[error("the Host Coordinator connection failed")]
    Channel(#[from] ChannelError),
    /// The coordinator exited without a final report.
    #[error("the Host Coordinator exited without finishing; see {log}")]
    Vanished {
        /// The Domain log.
        log: String,
    },
    /// The coordinator's seccomp filter killed it.
    #[error("the Host Coordinator {}; see {log}", lazaret_proto::seccomp::KILLED)]
    KilledByFilter {
        /// The Domain log.
        log: String,
    },
    /// The coordinator did not release the Domain in time.
    #[error(
        "the Host Coordinator stopped the Domain but did not exit within {} s of `down`; \
         it may be stuck: end it, then run `lazaret down` again",
        .0.as_secs()
    )]
    Lingering(Duration),
}

/// How long a coordinator may take to answer `status`.
pub const STATUS_TIMEOUT: Duration = Duration::from_secs(5);

/// How long `down` may take in all: for its coordinator to stop the
/// Domain and answer, then exit. Longer than the coordinator's own bounds
/// on stopping (sessions, supervisor, sandbox, slirp4netns) added up.
pub const DOWN_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a control request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// No coordinator serves the Domain: no runtime directory or socket,
    /// nobody listening, or it died while answering.
    #[error("no Host Coordinator serves the Domain")]
    NotRunning,
    /// A coordinator holds the socket but did not answer in time: it is
    /// stopped or stuck.
    #[error(
        "the Host Coordinator at {socket} did not answer within {} s; it may be stopped \
         (SIGSTOP) or stuck",
        within.as_secs()
    )]
    NoAnswer {
        /// The control socket.
        socket: String,
        /// How long it was given.
        within: Duration,
    },
    /// The channel failed otherwise.
    #[error("the Host Coordinator at {socket} answered wrongly")]
    Channel {
        /// The control socket.
        socket: String,
        /// What failed.
        #[source]
        source: ChannelError,
    },
}

/// Sends one request to the running coordinator of a Domain and waits at
/// most `within` for its answer: connecting, sending and receiving share
/// that one bound.
pub fn request(
    paths: &DomainPaths,
    request: ControlRequest,
    within: Duration,
) -> Result<ControlResponse, RequestError> {
    let socket_name = paths.control_socket().display().to_string();
    let classify = |error: ChannelError| match error {
        ChannelError::Socket {
            source: rustix::io::Errno::NOENT | rustix::io::Errno::CONNREFUSED,
            ..
        }
        | ChannelError::Disconnected => RequestError::NotRunning,
        ChannelError::NotReady => RequestError::NoAnswer {
            socket: socket_name.clone(),
            within,
        },
        source => RequestError::Channel {
            socket: socket_name.clone(),
            source,
        },
    };
    let dir = match rustix::fs::open(
        &paths.runtime_dir,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(dir) => dir,
        Err(rustix::io::Errno::NOENT) => return Err(RequestError::NotRunning),
        Err(source) => {
            return Err(classify(ChannelError::Socket {
                operation: "open the directory of",
                path: socket_name.clone(),
                source,
            }));
        }
    };
    let deadline = Instant::now() + within;
    let socket = lazaret_proto::channel::socket_path_at(dir.as_fd(), super::CONTROL_SOCKET);
    let peer = Endpoint::<ControlRequest, ControlResponse>::connect_within(&socket, within)
        .map_err(&classify)?;
    peer.require_peer_uid(rustix::process::getuid())
        .map_err(&classify)?;
    peer.send(&request, &[]).map_err(&classify)?;
    // The time the connect and the send took is not given again.
    let left = deadline.saturating_duration_since(Instant::now());
    let answered = lazaret_proto::channel::readable_within(peer.as_fd(), left).map_err(|e| {
        classify(ChannelError::Socket {
            operation: "wait for an answer on",
            path: socket_name.clone(),
            source: e,
        })
    })?;
    if !answered {
        return Err(classify(ChannelError::NotReady));
    }
    Ok(peer.recv().map_err(&classify)?.message)
}

/// What [`run_coordinator`] starts a coordinator for.
#[derive(Debug)]
pub struct Start<'a> {
    /// The profile.
    pub profile: &'a str,
    /// `--config`, if given.
    pub config: Option<&'a OsString>,
    /// The workspace.
    pub workspace: &'a Path,
    /// The host variables the profile's `env:` references name.
    pub referenced: &'a [String],
    /// The Domain log, named if the coordinator exits early.
    pub log_hint: &'a Path,
    /// What to do with host paths the last generation isolated that the
    /// workspace's rules now share.
    pub ignore_changes: IgnoreChangesMode,
}

/// Starts `lazaret-coordinator start` for the Domain and passes every
/// startup event to `on_event` until a final one (ready, already running,
/// failed), which is returned; what `on_event` answers a question with is
/// sent back. The coordinator sees only the environment
/// [`lazaret_hostfs::programs::coordinator_command`] allows, with the host
/// variables the profile's `env:` references name.
pub fn run_coordinator(
    start: &Start<'_>,
    on_event: &mut dyn FnMut(&StartupEvent) -> Option<StartupReply>,
) -> Result<StartupEvent, ClientError> {
    let Start {
        profile,
        config,
        workspace,
        referenced,
        log_hint,
        ignore_changes,
    } = *start;
    let binary = role_binary("lazaret-coordinator")
        .map_err(|e| ClientError::Spawn(lazaret_proto::error_chain(&e)))?;
    let (ours, theirs) = lazaret_proto::channel::pair::<StartupReply, StartupEvent>()?;
    let mut command = lazaret_hostfs::programs::coordinator_command(&binary, referenced);
    command
        .arg("start")
        .arg(profile)
        .arg("--workspace")
        .arg(workspace)
        .arg("--ignore-changes")
        .arg(match ignore_changes {
            IgnoreChangesMode::Ask => "ask",
            IgnoreChangesMode::Keep => "keep",
            IgnoreChangesMode::Accept => "accept",
        })
        .stdin(Stdio::from(theirs.into_fd()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .current_dir("/");
    if let Some(config) = config {
        command.arg("--config").arg(config);
    }
    let mut child = command
        .spawn()
        .map_err(|e| ClientError::Spawn(format!("{}: {e}", binary.display())))?;
    // The command still holds the coordinator's end of the channel: drop
    // it, so a coordinator that dies is seen as the channel's end instead of
    // a wait on an end this process holds itself.
    drop(command);
    let outcome = loop {
        match ours.recv() {
            Ok(Received { message, .. }) => {
                let last = matches!(
                    message,
                    StartupEvent::Ready(_)
                        | StartupEvent::AlreadyRunning { .. }
                        | StartupEvent::Failed { .. }
                );
                if let Some(reply) = on_event(&message) {
                    // A coordinator gone meanwhile is seen at the next
                    // receive.
                    let _ = ours.send(&reply, &[]);
                }
                if last {
                    break Ok(message);
                }
            }
            Err(ChannelError::Disconnected) => {
                break Err(ClientError::Vanished {
                    log: log_hint.display().to_string(),
                });
            }
            Err(e) => break Err(e.into()),
        }
    };
    // A coordinator that ends after its final report is reaped here; one
    // that stays to serve the Domain is left running and is adopted by init
    // when this CLI exits.
    if !matches!(outcome, Ok(StartupEvent::Ready(_))) {
        use std::os::unix::process::ExitStatusExt;
        let status = child.wait();
        if let (Err(ClientError::Vanished { log }), Ok(status)) = (&outcome, status) {
            if status.signal() == Some(libc::SIGSYS) {
                return Err(ClientError::KilledByFilter { log: log.clone() });
            }
        }
    }
    outcome
}

/// Waits until no process holds the Domain's lock (the coordinator has
/// exited), at most until `deadline`; `bound` is the whole wait it ends,
/// for the error.
pub fn wait_released(
    paths: &DomainPaths,
    deadline: Instant,
    bound: Duration,
) -> Result<(), ClientError> {
    let Ok(fd) = rustix::fs::open(
        paths.lock_file(),
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
    ) else {
        return Ok(());
    };
    loop {
        match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockShared) {
            Ok(()) => return Ok(()),
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Err(_) => return Err(ClientError::Lingering(bound)),
        }
    }
}
