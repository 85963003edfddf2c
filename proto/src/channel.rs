//! Typed `SOCK_SEQPACKET` channels between Lazaret roles, carrying one
//! codec-encoded record per packet and descriptors passed with `SCM_RIGHTS`.
//!
//! This module owns the framing of every socketpair link (coordinator ↔
//! supervisor ↔ sidecar): one packet is one record in the
//! [`codec`](crate::codec) envelope, the receiver learns a packet's size
//! before reading it, and caps bytes and descriptors per packet. Descriptors
//! arrive close-on-exec and are owned by the caller; a record refers to them
//! by index, by the convention of the link's own module.
//!
//! It trusts nothing the peer sends: an oversize packet, a truncated control
//! message, too many descriptors or bytes that do not decode are errors, and
//! any descriptor that came with a refused packet is closed before returning.
//! It trusts the kernel for the peer's credentials (`SO_PEERCRED`) and for
//! packet boundaries. Whether the peer is the process it should be is for the
//! caller to decide: this module only reports what the kernel says.
//!
//! Every call blocks; a channel is used by one receiving thread at a time.

use std::fmt;
use std::io::{IoSlice, IoSliceMut};
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use rustix::io::{Errno, FdFlags};
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags,
    SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketFlags, SocketType,
};
use rustix::process::{Gid, Pid, Uid};

use crate::codec::{self, DecodeError, EncodeError, MAX_RECORD_LEN, WireRecord};

/// Bytes per packet a channel accepts unless configured otherwise.
pub const DEFAULT_MAX_BYTES: usize = 64 * 1024;

/// Descriptors per packet a channel accepts unless configured otherwise.
pub const DEFAULT_MAX_FDS: usize = 8;

/// The kernel's own ceiling on descriptors in one `SCM_RIGHTS` message
/// (`SCM_MAX_FD`); larger configured limits are lowered to it.
pub const KERNEL_MAX_FDS: usize = 253;

/// A role binary was run without its channel on standard input: by hand,
/// not by the role that starts it.
#[derive(Debug, thiserror::Error)]
#[error("{role}: no channel on standard input; it is started by {parent}, not by hand")]
pub struct RoleStdinError {
    /// The role binary.
    pub role: &'static str,
    /// The role that starts it.
    pub parent: &'static str,
    /// Why standard input is no channel.
    #[source]
    pub source: ChannelError,
}

/// Alignment of `struct cmsghdr` on Linux: its first field is a `size_t`.
const CMSG_ALIGN: usize = std::mem::align_of::<usize>();

/// Why a channel operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    /// A named socket could not be created, bound, accepted or connected.
    #[error("cannot {operation} the seqpacket socket {path}")]
    Socket {
        /// What was attempted.
        operation: &'static str,
        /// The socket path.
        path: String,
        /// What the kernel reported.
        #[source]
        source: Errno,
    },
    /// Standard input could not be taken over as the channel.
    #[error("cannot take the channel from standard input")]
    Stdin {
        /// What went wrong.
        #[source]
        source: std::io::Error,
    },
    /// `socketpair(2)` refused to create the pair.
    #[error("cannot create a seqpacket socket pair")]
    SocketPair {
        /// What the kernel reported.
        #[source]
        source: Errno,
    },
    /// The inherited descriptor could not be inspected, for example because
    /// it is not a socket at all.
    #[error("cannot inspect the inherited channel descriptor; pass a socket")]
    InspectInherited {
        /// What the kernel reported.
        #[source]
        source: Errno,
    },
    /// The inherited descriptor is a socket of the wrong kind.
    #[error(
        "inherited channel descriptor is a {domain:?} {socket_type:?} socket, \
         expected an AF_UNIX SOCK_SEQPACKET socket"
    )]
    NotSeqpacket {
        /// The socket's address family.
        domain: AddressFamily,
        /// The socket's type.
        socket_type: SocketType,
    },
    /// The inherited descriptor could not be marked close-on-exec.
    #[error("cannot mark the inherited channel descriptor close-on-exec")]
    SetCloexec {
        /// What the kernel reported.
        #[source]
        source: Errno,
    },
    /// The outgoing record could not be encoded.
    #[error("cannot encode the outgoing message")]
    Encode {
        /// What the codec reported.
        #[source]
        source: EncodeError,
    },
    /// The outgoing record is larger than this endpoint's byte limit.
    #[error("outgoing {record} of {len} bytes exceeds the channel limit of {max} bytes")]
    SendTooLarge {
        /// The record being sent.
        record: &'static str,
        /// Bytes the encoding needs.
        len: usize,
        /// Bytes allowed per packet.
        max: usize,
    },
    /// More descriptors were offered than this endpoint may send in one packet.
    #[error("cannot send {count} descriptors in one packet, the channel limit is {max}")]
    SendTooManyFds {
        /// Descriptors offered.
        count: usize,
        /// Descriptors allowed per packet.
        max: usize,
    },
    /// The control message for the descriptors could not be built.
    #[error("cannot fit {count} descriptors in the control buffer")]
    ControlBuffer {
        /// Descriptors offered.
        count: usize,
    },
    /// `sendmsg(2)` failed.
    #[error("cannot send on the channel")]
    Send {
        /// What the kernel reported.
        #[source]
        source: Errno,
    },
    /// `sendmsg(2)` sent part of a packet, which a seqpacket socket never
    /// should.
    #[error("sent only {sent} of {len} bytes of a packet")]
    ShortSend {
        /// Bytes the kernel accepted.
        sent: usize,
        /// Bytes in the packet.
        len: usize,
    },
    /// The peer closed its end: a zero-length read, or a send on a broken
    /// connection.
    #[error("the channel peer disconnected")]
    Disconnected,
    /// A non-blocking or time-bounded operation found nothing to receive,
    /// or no room to send: the peer did not send or did not read in time.
    #[error("the channel peer did not answer or read in time")]
    NotReady,
    /// `recvmsg(2)` failed.
    #[error("cannot receive from the channel")]
    Receive {
        /// What the kernel reported.
        #[source]
        source: Errno,
    },
    /// The incoming packet is larger than this endpoint accepts; it was
    /// consumed and discarded with its descriptors.
    #[error("incoming packet of {len} bytes exceeds the limit of {max} bytes, discarded")]
    PacketTooLarge {
        /// Bytes in the packet.
        len: usize,
        /// Bytes allowed per packet.
        max: usize,
    },
    /// The packet grew between learning its size and reading it, which
    /// happens when two threads receive on one channel at once.
    #[error(
        "incoming packet of {len} bytes did not fit the {buffer} bytes its peeked size \
         promised; receive from one thread at a time"
    )]
    PacketTruncated {
        /// Bytes in the packet.
        len: usize,
        /// Bytes that were read.
        buffer: usize,
    },
    /// The kernel truncated the control message: the peer sent more
    /// descriptors than fit, or they could not be installed.
    #[error(
        "incoming control message was truncated: the peer sent more than {max} descriptors \
         or they could not be installed"
    )]
    ControlTruncated {
        /// Descriptors allowed per packet.
        max: usize,
    },
    /// The packet carried more descriptors than this endpoint accepts.
    #[error("incoming packet carries {count} descriptors, more than the limit of {max}")]
    TooManyFds {
        /// Descriptors received (and closed).
        count: usize,
        /// Descriptors allowed per packet.
        max: usize,
    },
    /// The packet's bytes are not a valid record.
    #[error("cannot decode the incoming message")]
    Decode {
        /// What the codec reported.
        #[source]
        source: DecodeError,
    },
    /// `getsockopt(SO_PEERCRED)` failed.
    #[error("cannot read the channel peer's credentials")]
    PeerCredentials {
        /// What the kernel reported.
        #[source]
        source: Errno,
    },
    /// The peer runs as a different user than required.
    #[error("channel peer runs as uid {found}, expected uid {expected}")]
    PeerUidMismatch {
        /// The uid required.
        expected: u32,
        /// The uid the kernel reported.
        found: u32,
    },
}

/// Per-packet caps of one endpoint, applied to what it sends and receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest packet in bytes. Receiving is further bounded by the received
    /// record's [`WireRecord::MAX_ENCODED_LEN`] and by [`MAX_RECORD_LEN`].
    pub max_bytes: usize,
    /// Most descriptors in one packet; values above [`KERNEL_MAX_FDS`] count
    /// as [`KERNEL_MAX_FDS`].
    pub max_fds: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_bytes: DEFAULT_MAX_BYTES,
            max_fds: DEFAULT_MAX_FDS,
        }
    }
}

impl Limits {
    fn send_max_bytes(&self) -> usize {
        self.max_bytes.min(MAX_RECORD_LEN)
    }

    fn recv_max_bytes<R: WireRecord>(&self) -> usize {
        self.max_bytes.min(R::MAX_ENCODED_LEN).min(MAX_RECORD_LEN)
    }

    fn fds(&self) -> usize {
        self.max_fds.min(KERNEL_MAX_FDS)
    }
}

/// Waits up to `timeout` for `fd` (a channel, a pidfd) to become readable
/// or hang up; `false` when the time ran out. The one bounded wait every
/// role uses before a blocking receive or to see a process exit.
pub fn readable_within(
    fd: BorrowedFd<'_>,
    timeout: std::time::Duration,
) -> rustix::io::Result<bool> {
    use rustix::event::{PollFd, PollFlags, Timespec, poll};
    // A timeout too long to add is no timeout.
    let deadline = std::time::Instant::now().checked_add(timeout);
    loop {
        let left = deadline.map(|d| d.saturating_duration_since(std::time::Instant::now()));
        let timeout = left.and_then(|left| Timespec::try_from(left).ok());
        let mut fds = [PollFd::new(&fd, PollFlags::IN)];
        match poll(&mut fds, timeout.as_ref()) {
            Ok(0) => return Ok(false),
            Ok(_) => return Ok(true),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// A record taken off a channel together with the descriptors that came
/// with it, in the order the sender listed them.
#[derive(Debug)]
pub struct Received<R> {
    /// The decoded record.
    pub message: R,
    /// The descriptors, each close-on-exec and owned by the caller. The
    /// record refers to them by index.
    pub fds: Vec<OwnedFd>,
}

/// What the kernel reports about the process at the other end of a socket
/// (`SO_PEERCRED`, see `unix(7)`).
///
/// For a `socketpair(2)` both ends report the process that created the pair,
/// not whoever holds the other end now; the values are a snapshot and the pid
/// may since have been reused. Use them for logging and for checking the
/// user, never to act on a process: a process is held by its pidfd.
///
/// The kernel reports pid 0 when the peer is outside this process's pid
/// namespace, which rustix's `UCred` (a non-zero `Pid`) cannot represent, so
/// ask only where the peer's pid is visible, such as between roles that
/// share a pid namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCredentials {
    /// The peer's process id, as seen from this process's pid namespace.
    pub pid: Pid,
    /// The peer's effective user id.
    pub uid: Uid,
    /// The peer's effective group id.
    pub gid: Gid,
}

/// One end of a channel: sends `S` records and receives `R` records over a
/// connected `AF_UNIX` `SOCK_SEQPACKET` socket.
pub struct Endpoint<S, R> {
    fd: OwnedFd,
    limits: Limits,
    _records: PhantomData<fn(&S) -> R>,
}

/// The sending half of a split [`Endpoint`].
pub struct Sender<S> {
    fd: Arc<OwnedFd>,
    limits: Limits,
    _records: PhantomData<fn(&S)>,
}

/// The receiving half of a split [`Endpoint`].
pub struct Receiver<R> {
    fd: Arc<OwnedFd>,
    limits: Limits,
    _records: PhantomData<fn() -> R>,
}

/// Two connected endpoints: what the first sends the second receives, and
/// the other way round.
pub type EndpointPair<A, B> = (Endpoint<A, B>, Endpoint<B, A>);

/// Creates a connected pair of endpoints with the default [`Limits`]. Both
/// descriptors are close-on-exec (`socketpair(2)` with `SOCK_CLOEXEC`).
pub fn pair<A: WireRecord, B: WireRecord>() -> Result<EndpointPair<A, B>, ChannelError> {
    let (left, right) = rustix::net::socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|source| ChannelError::SocketPair { source })?;
    Ok((Endpoint::new(left), Endpoint::new(right)))
}

/// The path by which a socket named `name` in the directory `dir` is bound
/// or reached: through the directory's `/proc/self/fd` link, so the path is
/// short (a Unix socket path holds at most 107 bytes) and names the
/// directory this process opened, not whatever a pathname resolves to now.
pub fn socket_path_at(dir: BorrowedFd<'_>, name: &str) -> std::path::PathBuf {
    std::path::PathBuf::from(format!(
        "/proc/self/fd/{}/{name}",
        std::os::fd::AsRawFd::as_raw_fd(&dir)
    ))
}

/// A close-on-exec `SOCK_SEQPACKET` socket and the address of `path`.
fn named_socket(
    path: &std::path::Path,
) -> Result<(OwnedFd, rustix::net::SocketAddrUnix), ChannelError> {
    let fail = |operation, source| ChannelError::Socket {
        operation,
        path: path.display().to_string(),
        source,
    };
    let fd = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| fail("create", e))?;
    let address = rustix::net::SocketAddrUnix::new(path).map_err(|e| fail("name", e))?;
    Ok((fd, address))
}

/// Creates a listening `SOCK_SEQPACKET` socket bound at `path` (which must
/// not exist), close-on-exec.
pub fn listen(path: &std::path::Path) -> Result<OwnedFd, ChannelError> {
    let fail = |operation, source| ChannelError::Socket {
        operation,
        path: path.display().to_string(),
        source,
    };
    let (fd, address) = named_socket(path)?;
    rustix::net::bind(&fd, &address).map_err(|e| fail("bind", e))?;
    rustix::net::listen(&fd, 16).map_err(|e| fail("listen on", e))?;
    Ok(fd)
}

impl<S: WireRecord, R: WireRecord> Endpoint<S, R> {
    /// Accepts one connection on a listener made by [`listen`].
    pub fn accept(listener: BorrowedFd<'_>) -> Result<Self, ChannelError> {
        let fd = rustix::net::accept_with(listener, SocketFlags::CLOEXEC).map_err(|source| {
            ChannelError::Socket {
                operation: "accept on",
                path: String::from("(listener)"),
                source,
            }
        })?;
        Ok(Self::new(fd))
    }

    /// Connects to the `SOCK_SEQPACKET` socket at `path`.
    pub fn connect(path: &std::path::Path) -> Result<Self, ChannelError> {
        let (fd, address) = named_socket(path)?;
        rustix::net::connect(&fd, &address).map_err(|source| ChannelError::Socket {
            operation: "connect to",
            path: path.display().to_string(),
            source,
        })?;
        Ok(Self::new(fd))
    }

    /// Connects like [`connect`](Self::connect), with the connect itself
    /// (which waits while the listener's backlog is full) and every later
    /// `send` and `recv` on this endpoint bounded by `timeout`: past it they
    /// fail with [`ChannelError::NotReady`]. For asking a peer that may be
    /// stopped or stuck.
    pub fn connect_within(
        path: &std::path::Path,
        timeout: std::time::Duration,
    ) -> Result<Self, ChannelError> {
        let (fd, address) = named_socket(path)?;
        let fail = |operation, source| ChannelError::Socket {
            operation,
            path: path.display().to_string(),
            source,
        };
        let timeout = Some(timeout.max(std::time::Duration::from_millis(1)));
        rustix::net::sockopt::set_socket_timeout(&fd, rustix::net::sockopt::Timeout::Send, timeout)
            .and_then(|()| {
                rustix::net::sockopt::set_socket_timeout(
                    &fd,
                    rustix::net::sockopt::Timeout::Recv,
                    timeout,
                )
            })
            .map_err(|e| fail("set timeouts on", e))?;
        match retry(|| rustix::net::connect(&fd, &address)) {
            Ok(()) => Ok(Self::new(fd)),
            Err(Errno::AGAIN) => Err(ChannelError::NotReady),
            Err(source) => Err(fail("connect to", source)),
        }
    }

    /// Takes the channel a parent passed as standard input, and puts
    /// `/dev/null` in its place so no child of this process inherits it.
    pub fn take_stdin() -> Result<Self, ChannelError> {
        let fd = std::io::stdin()
            .as_fd()
            .try_clone_to_owned()
            .map_err(|source| ChannelError::Stdin { source })?;
        let null =
            std::fs::File::open("/dev/null").map_err(|source| ChannelError::Stdin { source })?;
        rustix::stdio::dup2_stdin(&null).map_err(|e| ChannelError::Stdin { source: e.into() })?;
        Self::from_inherited(fd)
    }

    /// [`take_stdin`](Self::take_stdin) for the role binary `role`, which
    /// `parent` starts: the error, for whoever ran it, says so.
    pub fn take_role_stdin(
        role: &'static str,
        parent: &'static str,
    ) -> Result<Self, RoleStdinError> {
        Self::take_stdin().map_err(|source| RoleStdinError {
            role,
            parent,
            source,
        })
    }

    /// What a helper role the Runtime Supervisor starts does first in
    /// `main`, while single-threaded: closes every descriptor it inherited
    /// above standard error, refuses arguments (it is not run by hand),
    /// starts logging to standard error (the Domain log) and takes its
    /// channel from standard input. On failure, the exit code to return:
    /// 1 when the descriptors could not be closed, else 2.
    pub fn start_role(role: &'static str) -> Result<Self, std::process::ExitCode> {
        if let Err(e) = crate::sys::close_inherited_descriptors() {
            eprintln!("{role}: cannot close inherited descriptors: {e}");
            return Err(std::process::ExitCode::FAILURE);
        }
        if std::env::args_os().len() > 1 {
            eprintln!(
                "{role}: started with unexpected arguments; it is started by \
                 lazaret-supervisor, not by hand"
            );
            return Err(std::process::ExitCode::from(2));
        }
        crate::logging::init();
        Self::take_role_stdin(role, "lazaret-supervisor").map_err(|e| {
            eprintln!("{}", crate::error_chain(&e));
            std::process::ExitCode::from(2)
        })
    }

    fn new(fd: OwnedFd) -> Self {
        Self {
            fd,
            limits: Limits::default(),
            _records: PhantomData,
        }
    }

    /// Adopts a channel descriptor inherited from the parent process.
    ///
    /// Refuses anything but an `AF_UNIX` `SOCK_SEQPACKET` socket, then marks
    /// it close-on-exec so it is not handed on to this process's own
    /// children. The descriptor is closed if it is refused.
    pub fn from_inherited(fd: OwnedFd) -> Result<Self, ChannelError> {
        let domain = rustix::net::sockopt::socket_domain(&fd)
            .map_err(|source| ChannelError::InspectInherited { source })?;
        let socket_type = rustix::net::sockopt::socket_type(&fd)
            .map_err(|source| ChannelError::InspectInherited { source })?;
        if domain != AddressFamily::UNIX || socket_type != SocketType::SEQPACKET {
            return Err(ChannelError::NotSeqpacket {
                domain,
                socket_type,
            });
        }
        rustix::io::fcntl_setfd(&fd, FdFlags::CLOEXEC)
            .map_err(|source| ChannelError::SetCloexec { source })?;
        Ok(Self::new(fd))
    }

    /// Replaces this endpoint's per-packet caps.
    #[must_use]
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// This endpoint's per-packet caps.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Sends `message` as one packet with `fds` attached.
    ///
    /// See [`Sender::send`].
    pub fn send(&self, message: &S, fds: &[BorrowedFd<'_>]) -> Result<(), ChannelError> {
        send_packet(
            self.fd.as_fd(),
            &self.limits,
            message,
            fds,
            SendFlags::empty(),
        )
    }

    /// Receives the next packet as one record with its descriptors.
    ///
    /// See [`Receiver::recv`].
    pub fn recv(&self) -> Result<Received<R>, ChannelError> {
        recv_packet(self.fd.as_fd(), &self.limits, RecvFlags::empty())
    }

    /// [`send`](Self::send) without waiting (`MSG_DONTWAIT`): a socket
    /// whose buffer is full fails with [`ChannelError::NotReady`] and sends
    /// nothing. For event loops that wait for writability themselves.
    pub fn try_send(&self, message: &S, fds: &[BorrowedFd<'_>]) -> Result<(), ChannelError> {
        send_packet(
            self.fd.as_fd(),
            &self.limits,
            message,
            fds,
            SendFlags::DONTWAIT,
        )
    }

    /// [`recv`](Self::recv) without waiting (`MSG_DONTWAIT`): `None` when
    /// no packet is queued. For event loops that wait for readability
    /// themselves.
    pub fn try_recv(&self) -> Result<Option<Received<R>>, ChannelError> {
        match recv_packet(self.fd.as_fd(), &self.limits, RecvFlags::DONTWAIT) {
            Err(ChannelError::NotReady) => Ok(None),
            other => other.map(Some),
        }
    }

    /// Reports the peer's credentials; see [`PeerCredentials`] for what they
    /// mean on a socketpair.
    pub fn peer_credentials(&self) -> Result<PeerCredentials, ChannelError> {
        peer_credentials(self.fd.as_fd())
    }

    /// Fails unless the peer's effective uid is `expected`; returns the
    /// credentials when it is.
    pub fn require_peer_uid(&self, expected: Uid) -> Result<PeerCredentials, ChannelError> {
        require_peer_uid(self.fd.as_fd(), expected)
    }

    /// Splits the endpoint into halves that can be moved to different
    /// threads. The socket closes when both halves are dropped.
    pub fn split(self) -> (Sender<S>, Receiver<R>) {
        let fd = Arc::new(self.fd);
        (
            Sender {
                fd: Arc::clone(&fd),
                limits: self.limits,
                _records: PhantomData,
            },
            Receiver {
                fd,
                limits: self.limits,
                _records: PhantomData,
            },
        )
    }

    /// Gives up the typed view and returns the socket, for example to hand
    /// it to a child process.
    pub fn into_fd(self) -> OwnedFd {
        self.fd
    }
}

impl<S: WireRecord> Sender<S> {
    /// Sends `message` as one packet with `fds` attached (`sendmsg(2)` with
    /// `SCM_RIGHTS`).
    ///
    /// Refuses, before anything is sent, a record over this endpoint's byte
    /// cap and more descriptors than its descriptor cap. The caller keeps its
    /// descriptors; the peer receives duplicates. A closed peer is
    /// [`ChannelError::Disconnected`]; no `SIGPIPE` is raised.
    pub fn send(&self, message: &S, fds: &[BorrowedFd<'_>]) -> Result<(), ChannelError> {
        send_packet(
            self.fd.as_fd(),
            &self.limits,
            message,
            fds,
            SendFlags::empty(),
        )
    }

    /// This half's per-packet caps.
    pub fn limits(&self) -> Limits {
        self.limits
    }
}

impl<R: WireRecord> Receiver<R> {
    /// Receives the next packet as one record with its descriptors
    /// (`recvmsg(2)` with `MSG_CMSG_CLOEXEC`), blocking until one arrives.
    ///
    /// The packet's size is peeked first so the buffer fits it exactly. A
    /// packet over the byte cap is consumed and refused, so the next call
    /// sees the next packet. A zero-length read is
    /// [`ChannelError::Disconnected`]. On every error the packet's
    /// descriptors are closed.
    pub fn recv(&self) -> Result<Received<R>, ChannelError> {
        recv_packet(self.fd.as_fd(), &self.limits, RecvFlags::empty())
    }

    /// This half's per-packet caps.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Reports the peer's credentials; see [`PeerCredentials`] for what they
    /// mean on a socketpair.
    pub fn peer_credentials(&self) -> Result<PeerCredentials, ChannelError> {
        peer_credentials(self.fd.as_fd())
    }

    /// Fails unless the peer's effective uid is `expected`; returns the
    /// credentials when it is.
    pub fn require_peer_uid(&self, expected: Uid) -> Result<PeerCredentials, ChannelError> {
        require_peer_uid(self.fd.as_fd(), expected)
    }
}

impl<S, R> AsFd for Endpoint<S, R> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl<S> AsFd for Sender<S> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl<R> AsFd for Receiver<R> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl<S, R> fmt::Debug for Endpoint<S, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("fd", &self.fd)
            .field("sends", &std::any::type_name::<S>())
            .field("receives", &std::any::type_name::<R>())
            .field("limits", &self.limits)
            .finish()
    }
}

impl<S> fmt::Debug for Sender<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sender")
            .field("fd", &self.fd)
            .field("sends", &std::any::type_name::<S>())
            .field("limits", &self.limits)
            .finish()
    }
}

impl<R> fmt::Debug for Receiver<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Receiver")
            .field("fd", &self.fd)
            .field("receives", &std::any::type_name::<R>())
            .field("limits", &self.limits)
            .finish()
    }
}

/// Runs `call` again for as long as it is interrupted by a signal.
fn retry<T>(mut call: impl FnMut() -> Result<T, Errno>) -> Result<T, Errno> {
    loop {
        match call() {
            Err(Errno::INTR) => continue,
            other => return other,
        }
    }
}

/// A zeroed byte region of `len` bytes starting on a `cmsghdr` boundary, so
/// rustix does not shorten it and the kernel's descriptor count is exact.
/// `len` bytes of `storage`, aligned for a `cmsghdr`, for the control
/// messages of `sendmsg(2)` and `recvmsg(2)`; `storage` grows to fit.
pub fn control_space(storage: &mut Vec<MaybeUninit<u8>>, len: usize) -> &mut [MaybeUninit<u8>] {
    if len == 0 {
        return &mut [];
    }
    storage.clear();
    storage.resize(len + CMSG_ALIGN, MaybeUninit::new(0));
    let offset = storage.as_ptr().align_offset(CMSG_ALIGN);
    &mut storage[offset..offset + len]
}

fn send_packet<S: WireRecord>(
    fd: BorrowedFd<'_>,
    limits: &Limits,
    message: &S,
    fds: &[BorrowedFd<'_>],
    flags: SendFlags,
) -> Result<(), ChannelError> {
    let max_fds = limits.fds();
    if fds.len() > max_fds {
        return Err(ChannelError::SendTooManyFds {
            count: fds.len(),
            max: max_fds,
        });
    }
    let bytes = codec::encode(message).map_err(|source| ChannelError::Encode { source })?;
    let max_bytes = limits.send_max_bytes();
    if bytes.len() > max_bytes {
        return Err(ChannelError::SendTooLarge {
            record: S::NAME,
            len: bytes.len(),
            max: max_bytes,
        });
    }

    let mut storage = Vec::new();
    let rights = SendAncillaryMessage::ScmRights(fds);
    let space_len = if fds.is_empty() { 0 } else { rights.size() };
    let mut control = SendAncillaryBuffer::new(control_space(&mut storage, space_len));
    if !fds.is_empty() && !control.push(rights) {
        return Err(ChannelError::ControlBuffer { count: fds.len() });
    }

    let iov = [IoSlice::new(&bytes)];
    let sent = retry(|| rustix::net::sendmsg(fd, &iov, &mut control, SendFlags::NOSIGNAL | flags))
        .map_err(|source| match source {
            Errno::PIPE | Errno::CONNRESET => ChannelError::Disconnected,
            Errno::AGAIN => ChannelError::NotReady,
            source => ChannelError::Send { source },
        })?;
    if sent != bytes.len() {
        return Err(ChannelError::ShortSend {
            sent,
            len: bytes.len(),
        });
    }
    Ok(())
}

fn recv_error(source: Errno) -> ChannelError {
    match source {
        Errno::CONNRESET => ChannelError::Disconnected,
        Errno::AGAIN => ChannelError::NotReady,
        source => ChannelError::Receive { source },
    }
}

fn recv_packet<R: WireRecord>(
    fd: BorrowedFd<'_>,
    limits: &Limits,
    flags: RecvFlags,
) -> Result<Received<R>, ChannelError> {
    let max_bytes = limits.recv_max_bytes::<R>();
    let max_fds = limits.fds();

    // Learn the size of the next packet without consuming it. With no
    // control buffer the kernel installs none of its descriptors.
    let peeked = retry(|| {
        rustix::net::recvmsg(
            fd,
            &mut [IoSliceMut::new(&mut [])],
            &mut RecvAncillaryBuffer::default(),
            RecvFlags::PEEK | RecvFlags::TRUNC | RecvFlags::CMSG_CLOEXEC | flags,
        )
    })
    .map_err(recv_error)?
    .bytes;

    // Read the packet for real. An oversize packet is read into a buffer of
    // the cap's size only, to be consumed and refused.
    let mut data = vec![0u8; peeked.min(max_bytes)];
    let mut storage = Vec::new();
    let space_len = if max_fds == 0 {
        0
    } else {
        rustix::cmsg_space!(ScmRights(max_fds))
    };
    let mut control = RecvAncillaryBuffer::new(control_space(&mut storage, space_len));
    let received = retry(|| {
        rustix::net::recvmsg(
            fd,
            &mut [IoSliceMut::new(&mut data)],
            &mut control,
            RecvFlags::TRUNC | RecvFlags::CMSG_CLOEXEC | flags,
        )
    })
    .map_err(recv_error)?;

    // Take ownership of every descriptor before looking at anything else, so
    // each early return below closes them.
    let mut fds = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = message {
            fds.extend(rights);
        }
    }
    drop(control);

    let len = received.bytes;
    if len == 0 {
        return Err(ChannelError::Disconnected);
    }
    if len > max_bytes {
        return Err(ChannelError::PacketTooLarge {
            len,
            max: max_bytes,
        });
    }
    if len > data.len() || received.flags.contains(ReturnFlags::TRUNC) {
        return Err(ChannelError::PacketTruncated {
            len,
            buffer: data.len(),
        });
    }
    if received.flags.contains(ReturnFlags::CTRUNC) {
        return Err(ChannelError::ControlTruncated { max: max_fds });
    }
    if fds.len() > max_fds {
        return Err(ChannelError::TooManyFds {
            count: fds.len(),
            max: max_fds,
        });
    }
    let message = codec::decode(&data[..len]).map_err(|source| ChannelError::Decode { source })?;
    Ok(Received { message, fds })
}

fn peer_credentials(fd: BorrowedFd<'_>) -> Result<PeerCredentials, ChannelError> {
    let cred = rustix::net::sockopt::socket_peercred(fd)
        .map_err(|source| ChannelError::PeerCredentials { source })?;
    Ok(PeerCredentials {
        pid: cred.pid,
        uid: cred.uid,
        gid: cred.gid,
    })
}

/// Fails unless the effective uid of the peer of the Unix socket `fd` is
/// `expected`; returns its credentials when it is. For sockets that carry
/// another protocol than an [`Endpoint`]'s.
pub fn require_peer_uid(
    fd: BorrowedFd<'_>,
    expected: Uid,
) -> Result<PeerCredentials, ChannelError> {
    let credentials = peer_credentials(fd)?;
    if credentials.uid != expected {
        return Err(ChannelError::PeerUidMismatch {
            expected: expected.as_raw(),
            found: credentials.uid.as_raw(),
        });
    }
    Ok(credentials)
}

/// The index of a descriptor in the packet that carries a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FdIndex(pub u16);

impl FdIndex {
    /// The descriptor this index names among a packet's `fds`.
    pub fn get(self, fds: &[OwnedFd]) -> Option<BorrowedFd<'_>> {
        fds.get(usize::from(self.0)).map(AsFd::as_fd)
    }

    /// The descriptor this index names, keeping it and closing the rest.
    pub fn pick(self, fds: Vec<OwnedFd>) -> Option<OwnedFd> {
        fds.into_iter().nth(usize::from(self.0))
    }

    /// Takes the descriptor this index names out of a packet's `fds`, for
    /// packets that carry several to keep.
    pub fn take(self, fds: &mut [Option<OwnedFd>]) -> Option<OwnedFd> {
        fds.get_mut(usize::from(self.0)).and_then(Option::take)
    }
}

/// The descriptors a packet carries, built beside the record that names
/// them: each [`FdList::push`] hands out the [`FdIndex`] the record stores,
/// so no index is counted by hand.
#[derive(Debug, Default)]
pub struct FdList<'a> {
    fds: Vec<BorrowedFd<'a>>,
}

impl<'a> FdList<'a> {
    /// An empty list.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `fd` and returns the index that names it in the packet.
    ///
    /// # Panics
    ///
    /// Past 65,536 descriptors, far more than any channel's limit (the
    /// send refuses more than its limit anyway).
    pub fn push(&mut self, fd: BorrowedFd<'a>) -> FdIndex {
        let index = u16::try_from(self.fds.len()).expect("fewer than 65,536 descriptors");
        self.fds.push(fd);
        FdIndex(index)
    }

    /// The descriptors, in the order their indexes name them.
    pub fn as_slice(&self) -> &[BorrowedFd<'a>] {
        &self.fds
    }
}
