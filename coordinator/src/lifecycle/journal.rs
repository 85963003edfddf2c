//! Where the Host Coordinator's logs go: `tracing` events, to the systemd
//! journal through `tracing-journald` when its socket exists, else to the
//! Domain's `coordinator.log` ([`super::logfile`], which keeps it to its
//! size).
//!
//! Owns the subscriber of the coordinator process and the names of the
//! fields every event carries through its spans: `LAZARET_DOMAIN` and
//! `LAZARET_PROFILE` (the Domain span), `LAZARET_GENERATION` (the
//! generation span) and `LAZARET_SESSION` (a session's span), so
//! `journalctl LAZARET_DOMAIN=<id>` shows one Domain. Events never carry an
//! `env:` value: the environment is logged by name only. Trusts the journal
//! socket at its system path.

use std::path::{Path, PathBuf};

use tracing_subscriber::layer::SubscriberExt;

/// The journal's native socket.
pub const SYSTEM_SOCKET: &str = "/run/systemd/journal/socket";

/// The journal socket, if one exists.
pub fn socket_path() -> Option<PathBuf> {
    let path = Path::new(SYSTEM_SOCKET);
    std::fs::symlink_metadata(path)
        .ok()
        .filter(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
        .map(|_| path.to_path_buf())
}

/// Installs this process's subscriber: the journal if its socket exists
/// and takes a connection, else standard error (the Domain log file).
/// Returns whether it is the journal. Call it once, after standard error
/// is redirected.
pub fn init() -> bool {
    let journal = socket_path().and_then(|_| {
        tracing_journald::layer().ok().map(|layer| {
            layer
                .with_syslog_identifier("lazaret-coordinator".to_owned())
                .with_field_prefix(None)
        })
    });
    let to_journal = journal.is_some();
    let file = (!to_journal).then(|| {
        tracing_subscriber::fmt::layer()
            .with_writer(|| super::logfile::EventWriter)
            .with_ansi(false)
            .with_target(false)
    });
    let subscriber = tracing_subscriber::registry().with(journal).with(file);
    let _ = tracing::subscriber::set_global_default(subscriber);
    to_journal
}

/// The span every event of the Domain's coordinator runs in.
pub fn domain_span(domain: &str, profile: &str) -> tracing::Span {
    tracing::info_span!("domain", lazaret_domain = domain, lazaret_profile = profile)
}

/// The span of one generation, inside the Domain's.
pub fn generation_span(generation: u64) -> tracing::Span {
    tracing::info_span!("generation", lazaret_generation = generation)
}
