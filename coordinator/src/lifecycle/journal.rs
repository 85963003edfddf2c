//! Where the Host Coordinator's log lines go: to the systemd journal when
//! its socket exists, else to the Domain's `coordinator.log` (standard
//! error, once redirected).
//!
//! Owns the journal's native datagram protocol for single-line messages:
//! `KEY=value` fields separated by newlines. Each line carries the Domain ID
//! so `journalctl LAZARET_DOMAIN=<id>` shows one Domain. Trusts the socket
//! path: the system's, or `LAZARET_JOURNAL_SOCKET` from the invoking user's
//! environment (tests point it at a socket they own).

use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::OnceLock;

use lazaret_proto::common::UnixTimeNs;

/// The journal's native socket.
const SYSTEM_SOCKET: &str = "/run/systemd/journal/socket";

/// Where log lines go for this process.
#[derive(Debug)]
enum Sink {
    Journal {
        socket: UnixDatagram,
        path: PathBuf,
        domain: String,
    },
    Stderr,
}

static SINK: OnceLock<Sink> = OnceLock::new();

/// The journal socket to use, if one exists.
pub fn socket_path() -> Option<PathBuf> {
    let path = std::env::var_os("LAZARET_JOURNAL_SOCKET")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(SYSTEM_SOCKET));
    std::fs::symlink_metadata(&path)
        .ok()
        .filter(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
        .map(|_| path)
}

/// Chooses the sink once, for the Domain `domain`: the journal if its
/// socket exists, else standard error. Returns whether it is the journal.
///
/// The journal socket never blocks the coordinator: a line the journal
/// cannot take at once (its queue is full, or it is gone) goes to standard
/// error instead.
pub fn init(domain: &str) -> bool {
    let unbound = UnixDatagram::unbound().and_then(|s| s.set_nonblocking(true).map(|()| s));
    let sink = match (socket_path(), unbound) {
        (Some(path), Ok(socket)) => Sink::Journal {
            socket,
            path,
            domain: domain.to_owned(),
        },
        _ => Sink::Stderr,
    };
    matches!(SINK.get_or_init(|| sink), Sink::Journal { .. })
}

/// Writes one log line.
pub fn log(message: impl std::fmt::Display) {
    let line = message.to_string().replace('\n', " ");
    match SINK.get() {
        Some(Sink::Journal {
            socket,
            path,
            domain,
        }) => {
            let entry = format!(
                "MESSAGE={line}\nPRIORITY=6\nSYSLOG_IDENTIFIER=lazaret-coordinator\nLAZARET_DOMAIN={domain}\n"
            );
            if socket.send_to(entry.as_bytes(), path).is_err() {
                eprintln!("[{}] {line}", UnixTimeNs::now().as_secs());
            }
        }
        Some(Sink::Stderr) | None => eprintln!("[{}] {line}", UnixTimeNs::now().as_secs()),
    }
}
