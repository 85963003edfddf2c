//! How the helper roles (the Runtime Supervisor, the Workspace Router, the
//! Network Sidecar) log: `tracing` events, one line each with its time,
//! level and module, to standard error, which the Host Coordinator points
//! at the Domain's log file.
//!
//! Owns only the subscriber's set-up. Events never carry secrets: callers
//! log names and identifiers, never an environment value.

/// Installs the role's subscriber; a second call does nothing.
pub fn init() {
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}
