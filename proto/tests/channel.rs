//! Channel tests over real `SOCK_SEQPACKET` socketpairs in this process. They
//! need no privileges and spawn no processes.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileExt;

use lazaret_proto::channel::{self, ChannelError, Endpoint, Limits};
use lazaret_proto::codec::{DecodeError, WireRecord};
use rustix::fs::MemfdFlags;
use rustix::io::FdFlags;
use rustix::net::{AddressFamily, SendFlags, SocketFlags, SocketType};
use rustix::process::{PidfdFlags, Uid};
use serde::{Deserialize, Serialize};

/// `PID_FS_MAGIC` from `include/uapi/linux/magic.h`.
const PID_FS_MAGIC: u64 = 0x5049_4446;

#[derive(Debug, PartialEq, Serialize, Deserialize)]
enum Ping {
    Text(String),
    Blob(Vec<u8>),
    /// Carries descriptors: `memfd` and `pidfd` are their indexes.
    Handles {
        memfd: u8,
        pidfd: u8,
    },
}

impl WireRecord for Ping {
    const NAME: &'static str = "Ping";
}

/// A record with a tight size limit.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Tiny(Vec<u8>);

impl WireRecord for Tiny {
    const NAME: &'static str = "Tiny";
    const MAX_ENCODED_LEN: usize = 16;
}

/// A record whose envelope version no `Ping` reader accepts.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct FutureRecord(u64);

impl WireRecord for FutureRecord {
    const NAME: &'static str = "FutureRecord";
    const VERSION: u8 = 9;
}

fn memfd(name: &str, content: &[u8]) -> File {
    let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC).expect("memfd_create");
    let mut file = File::from(fd);
    file.write_all(content).expect("write memfd");
    file
}

/// How many descriptors of this process refer to the memfd called `name`.
/// Each test uses its own name, so tests running in parallel do not disturb
/// each other's counts.
fn open_memfds(name: &str) -> usize {
    let needle = format!("/memfd:{name} ");
    std::fs::read_dir("/proc/self/fd")
        .expect("read /proc/self/fd")
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with(&needle))
        .count()
}

fn seqpacket_pair(flags: SocketFlags) -> (OwnedFd, OwnedFd) {
    rustix::net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, flags, None)
        .expect("socketpair")
}

#[test]
fn memfd_and_pidfd_cross_with_the_record() {
    let (left, right) = channel::pair::<Ping, Ping>().unwrap();
    let file = memfd("lazaret-test-handles", b"hello from the other side");
    let pidfd =
        rustix::process::pidfd_open(rustix::process::getpid(), PidfdFlags::empty()).unwrap();

    left.send(
        &Ping::Handles { memfd: 0, pidfd: 1 },
        &[file.as_fd(), pidfd.as_fd()],
    )
    .unwrap();
    let mut received = right.recv().unwrap();

    assert_eq!(received.message, Ping::Handles { memfd: 0, pidfd: 1 });
    assert_eq!(received.fds.len(), 2);
    for fd in &received.fds {
        let flags = rustix::io::fcntl_getfd(fd).unwrap();
        assert!(flags.contains(FdFlags::CLOEXEC), "received fd not CLOEXEC");
    }

    let received_pidfd = received.fds.pop().unwrap();
    let received_memfd = File::from(received.fds.pop().unwrap());

    let mut content = [0u8; 25];
    received_memfd.read_exact_at(&mut content, 0).unwrap();
    assert_eq!(&content, b"hello from the other side");

    let statfs = rustix::fs::fstatfs(&received_pidfd).unwrap();
    assert_eq!(statfs.f_type as u64, PID_FS_MAGIC, "not a pidfd on pidfs");
    let sent = rustix::fs::fstat(&pidfd).unwrap();
    let got = rustix::fs::fstat(&received_pidfd).unwrap();
    assert_eq!(
        (got.st_dev, got.st_ino),
        (sent.st_dev, sent.st_ino),
        "received pidfd names another process"
    );
}

#[test]
fn two_messages_back_to_back_arrive_as_two_packets() {
    let (left, right) = channel::pair::<Ping, Ping>().unwrap();
    left.send(&Ping::Text("one".into()), &[]).unwrap();
    left.send(&Ping::Text("two".into()), &[]).unwrap();

    let first = right.recv().unwrap();
    let second = right.recv().unwrap();
    assert_eq!(first.message, Ping::Text("one".into()));
    assert_eq!(second.message, Ping::Text("two".into()));
    assert!(first.fds.is_empty() && second.fds.is_empty());
}

#[test]
fn both_directions_carry_their_own_record_type() {
    let (left, right) = channel::pair::<Ping, Tiny>().unwrap();
    left.send(&Ping::Text("request".into()), &[]).unwrap();
    assert_eq!(right.recv().unwrap().message, Ping::Text("request".into()));
    right.send(&Tiny(vec![1, 2, 3]), &[]).unwrap();
    assert_eq!(left.recv().unwrap().message, Tiny(vec![1, 2, 3]));
}

#[test]
fn receiver_refuses_a_packet_over_the_byte_cap_and_moves_on() {
    let name = "lazaret-test-byte-cap";
    let (left, right) = channel::pair::<Ping, Ping>().unwrap();
    let right = right.with_limits(Limits {
        max_bytes: 64,
        ..Limits::default()
    });
    let file = memfd(name, b"x");
    let before = open_memfds(name);

    left.send(&Ping::Blob(vec![7; 200]), &[file.as_fd()])
        .unwrap();
    let err = right.recv().unwrap_err();
    assert!(
        matches!(err, ChannelError::PacketTooLarge { max: 64, len } if len > 200),
        "{err:?}"
    );
    assert_eq!(open_memfds(name), before, "refused packet leaked its fd");

    // The oversize packet was consumed: the next one is readable.
    left.send(&Ping::Text("next".into()), &[]).unwrap();
    assert_eq!(right.recv().unwrap().message, Ping::Text("next".into()));
}

#[test]
fn receiver_byte_cap_is_bounded_by_the_record_limit() {
    let (raw_left, raw_right) = seqpacket_pair(SocketFlags::CLOEXEC);
    let receiver = Endpoint::<Ping, Tiny>::from_inherited(raw_right).unwrap();
    let sent = rustix::net::send(&raw_left, &[1; 40], SendFlags::empty()).unwrap();
    assert_eq!(sent, 40);

    let err = receiver.recv().unwrap_err();
    assert!(
        matches!(err, ChannelError::PacketTooLarge { len: 40, max: 16 }),
        "{err:?}"
    );
}

#[test]
fn sender_refuses_a_record_over_its_byte_cap() {
    let (left, right) = channel::pair::<Ping, Ping>().unwrap();
    let left = left.with_limits(Limits {
        max_bytes: 32,
        ..Limits::default()
    });
    let err = left.send(&Ping::Blob(vec![0; 100]), &[]).unwrap_err();
    assert!(
        matches!(
            err,
            ChannelError::SendTooLarge {
                record: "Ping",
                max: 32,
                ..
            }
        ),
        "{err:?}"
    );

    // Nothing was sent: the next packet is the next message.
    left.send(&Ping::Text("small".into()), &[]).unwrap();
    assert_eq!(right.recv().unwrap().message, Ping::Text("small".into()));
}

#[test]
fn sender_refuses_more_descriptors_than_its_cap() {
    let (left, right) = channel::pair::<Ping, Ping>().unwrap();
    let file = memfd("lazaret-test-send-cap", b"x");
    let nine: Vec<BorrowedFd<'_>> = (0..9).map(|_| file.as_fd()).collect();

    let err = left.send(&Ping::Text("nine".into()), &nine).unwrap_err();
    assert!(
        matches!(err, ChannelError::SendTooManyFds { count: 9, max: 8 }),
        "{err:?}"
    );

    left.send(&Ping::Text("eight".into()), &nine[..8]).unwrap();
    let received = right.recv().unwrap();
    assert_eq!(received.message, Ping::Text("eight".into()));
    assert_eq!(received.fds.len(), 8);
}

#[test]
fn receiver_refuses_more_descriptors_than_its_cap_without_leaking() {
    for (cap, sent) in [(0, 1), (2, 5), (3, 4), (8, 20)] {
        let name = format!("lazaret-test-recv-cap-{cap}-{sent}");
        let (left, right) = channel::pair::<Ping, Ping>().unwrap();
        let left = left.with_limits(Limits {
            max_fds: 64,
            ..Limits::default()
        });
        let right = right.with_limits(Limits {
            max_fds: cap,
            ..Limits::default()
        });
        let file = memfd(&name, b"x");
        let fds: Vec<BorrowedFd<'_>> = (0..sent).map(|_| file.as_fd()).collect();
        let before = open_memfds(&name);
        assert_eq!(before, 1);

        left.send(&Ping::Text("too many".into()), &fds).unwrap();
        let err = right.recv().unwrap_err();
        assert!(
            matches!(
                err,
                ChannelError::ControlTruncated { max } | ChannelError::TooManyFds { max, .. }
                    if max == cap
            ),
            "cap {cap}, sent {sent}: {err:?}"
        );
        assert_eq!(
            open_memfds(&name),
            before,
            "cap {cap}, sent {sent}: refused descriptors leaked"
        );
    }
}

#[test]
fn undecodable_packet_is_refused_and_its_descriptors_closed() {
    let name = "lazaret-test-decode";
    let (raw_left, raw_right) = seqpacket_pair(SocketFlags::CLOEXEC);
    let sender = Endpoint::<FutureRecord, Ping>::from_inherited(raw_left).unwrap();
    let receiver = Endpoint::<Ping, Ping>::from_inherited(raw_right).unwrap();
    let file = memfd(name, b"x");
    let before = open_memfds(name);

    sender.send(&FutureRecord(1), &[file.as_fd()]).unwrap();
    let err = receiver.recv().unwrap_err();
    assert!(
        matches!(
            err,
            ChannelError::Decode {
                source: DecodeError::UnknownVersion { found: 9, .. }
            }
        ),
        "{err:?}"
    );
    assert_eq!(open_memfds(name), before, "refused packet leaked its fd");
}

#[test]
fn peer_credentials_name_this_process() {
    let (left, right) = channel::pair::<Ping, Ping>().unwrap();
    for endpoint in [&left, &right] {
        let credentials = endpoint.peer_credentials().unwrap();
        assert_eq!(credentials.pid, rustix::process::getpid());
        assert_eq!(credentials.uid, rustix::process::getuid());
        assert_eq!(credentials.gid, rustix::process::getgid());
    }

    let me = rustix::process::getuid();
    assert_eq!(left.require_peer_uid(me).unwrap().uid, me);
    let other = Uid::from_raw(me.as_raw().wrapping_add(1));
    let err = left.require_peer_uid(other).unwrap_err();
    assert!(
        matches!(err, ChannelError::PeerUidMismatch { expected, found }
            if expected == other.as_raw() && found == me.as_raw()),
        "{err:?}"
    );
}

#[test]
fn dropped_peer_is_disconnected_after_its_queued_packets() {
    let (left, right) = channel::pair::<Ping, Ping>().unwrap();
    left.send(&Ping::Text("last words".into()), &[]).unwrap();
    drop(left);

    assert_eq!(
        right.recv().unwrap().message,
        Ping::Text("last words".into())
    );
    assert!(matches!(right.recv(), Err(ChannelError::Disconnected)));
    assert!(matches!(
        right.send(&Ping::Text("anyone?".into()), &[]),
        Err(ChannelError::Disconnected)
    ));
}

#[test]
fn split_halves_work_from_different_threads() {
    let (left, right) = channel::pair::<Ping, Ping>().unwrap();
    let (tx, rx) = right.split();
    let echo = std::thread::spawn(move || {
        let received = rx.recv().unwrap();
        tx.send(&received.message, &[]).unwrap();
    });
    left.send(&Ping::Text("echo".into()), &[]).unwrap();
    assert_eq!(left.recv().unwrap().message, Ping::Text("echo".into()));
    echo.join().unwrap();

    // Both halves are gone, so the socket is closed.
    assert!(matches!(left.recv(), Err(ChannelError::Disconnected)));
}

#[test]
fn from_inherited_adopts_a_seqpacket_socket_and_marks_it_cloexec() {
    let (raw_left, raw_right) = seqpacket_pair(SocketFlags::empty());
    assert!(
        !rustix::io::fcntl_getfd(&raw_right)
            .unwrap()
            .contains(FdFlags::CLOEXEC)
    );

    let left = Endpoint::<Ping, Ping>::from_inherited(raw_left).unwrap();
    let right = Endpoint::<Ping, Ping>::from_inherited(raw_right).unwrap();
    assert!(
        rustix::io::fcntl_getfd(&right)
            .unwrap()
            .contains(FdFlags::CLOEXEC)
    );

    left.send(&Ping::Text("inherited".into()), &[]).unwrap();
    assert_eq!(
        right.recv().unwrap().message,
        Ping::Text("inherited".into())
    );
}

#[test]
fn from_inherited_refuses_a_stream_socket() {
    let (stream, _other) = rustix::net::socketpair(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .unwrap();
    let err = Endpoint::<Ping, Ping>::from_inherited(stream).unwrap_err();
    assert!(
        matches!(
            err,
            ChannelError::NotSeqpacket {
                domain: AddressFamily::UNIX,
                socket_type: SocketType::STREAM
            }
        ),
        "{err:?}"
    );
}

#[test]
fn from_inherited_refuses_a_descriptor_that_is_not_a_socket() {
    let file = memfd("lazaret-test-not-a-socket", b"");
    let err = Endpoint::<Ping, Ping>::from_inherited(OwnedFd::from(file)).unwrap_err();
    assert!(
        matches!(err, ChannelError::InspectInherited { source } if source == rustix::io::Errno::NOTSOCK),
        "{err:?}"
    );
}

#[test]
fn error_messages_are_lowercase_and_chain_their_source() {
    let file = memfd("lazaret-test-message", b"");
    let err = Endpoint::<Ping, Ping>::from_inherited(OwnedFd::from(file)).unwrap_err();
    let text = err.to_string();
    assert!(text.starts_with(char::is_lowercase), "{text}");
    assert!(!text.ends_with('.'), "{text}");
    assert!(std::error::Error::source(&err).is_some());
}

#[test]
fn non_blocking_calls_say_when_the_peer_is_not_ready() {
    let (a, b) = channel::pair::<Ping, Ping>().unwrap();
    assert!(matches!(b.try_recv(), Ok(None)), "nothing queued yet");
    a.try_send(&Ping::Text("one".into()), &[]).unwrap();
    let got = b.try_recv().unwrap().expect("a queued packet");
    assert_eq!(got.message, Ping::Text("one".into()));

    // A peer that never reads: the socket fills, and a send that cannot
    // wait says so instead of blocking.
    let blob = Ping::Blob(vec![7; 32 * 1024]);
    let mut sent = 0;
    let refused = loop {
        match a.try_send(&blob, &[]) {
            Ok(()) => sent += 1,
            Err(e) => break e,
        }
        assert!(sent < 10_000, "the socket never filled");
    };
    assert!(matches!(refused, ChannelError::NotReady), "{refused:?}");
}

#[test]
fn a_bounded_connect_and_receive_end_in_time() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("silent.sock");
    let listener = channel::listen(&path).unwrap();
    // Accepted by the kernel (backlog), never answered by anyone.
    let peer = Endpoint::<Ping, Ping>::connect_within(&path, std::time::Duration::from_millis(100))
        .unwrap();
    peer.send(&Ping::Text("status?".into()), &[]).unwrap();
    let started = std::time::Instant::now();
    let silent = peer.recv().unwrap_err();
    assert!(matches!(silent, ChannelError::NotReady), "{silent:?}");
    assert!(started.elapsed() < std::time::Duration::from_secs(5));

    // A backlog that is full refuses a bounded connect in time.
    let mut held = Vec::new();
    let refused = loop {
        match Endpoint::<Ping, Ping>::connect_within(&path, std::time::Duration::from_millis(50)) {
            Ok(peer) => held.push(peer),
            Err(e) => break e,
        }
        assert!(held.len() < 10_000, "the backlog never filled");
    };
    assert!(matches!(refused, ChannelError::NotReady), "{refused:?}");
    drop(listener);
}
