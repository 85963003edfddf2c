//! The Domain lifecycle: starting a generation, serving it, stopping it, and
//! finishing a stale one.
//!
//! The Host Coordinator daemon ([`daemon`]) owns a running generation: it
//! brings one up step by step (the storage and plan in `prepare`, the
//! sockets in `publish`, the network in `network`, the workspace in
//! `workspace`) and serves it (`serve`). What those steps share sits
//! below them, importing none of them: a step's failure (`failure`), the
//! CLI's startup channel (`report`), the steps' context (`context`), work
//! run beside the main line (`beside`), the records (`record`) and the
//! running generation (`live`). The CLI side ([`client`]) starts it, asks
//! it for status, and asks it to stop.
//! Recovery ([`recovery`]) finishes a generation whose coordinator is gone,
//! from its records alone. This module owns the runtime file layout of a
//! Domain and how the CLI finds it without reading the configuration. It
//! trusts the invoking user's environment for paths, and nothing that
//! answers on a socket until its uid is checked.

mod beside;
pub mod client;
mod context;
mod credentials;
pub mod daemon;
mod failure;
pub mod journal;
mod live;
pub mod logfile;
mod network;
mod prepare;
mod publish;
mod record;
pub mod recovery;
mod report;
mod serve;
mod supervisor;
#[cfg(test)]
pub(crate) mod testing;
mod usage;
pub(crate) mod workspace;

use std::path::{Path, PathBuf};

use lazaret_proto::config::{ProfileName, domain_id};
use lazaret_proto::ids::{DomainId, GenerationId};

use crate::config::{ConfigError, HostEnvironment};

/// The lock file whose `flock` is Domain ownership.
pub const LOCK_FILE: &str = "lock";
/// The control socket of a running coordinator.
pub const CONTROL_SOCKET: &str = "control.sock";
/// The coordinator's log file.
pub const LOG_FILE: &str = "coordinator.log";

/// The runtime paths of one Domain.
#[derive(Debug, Clone)]
pub struct DomainPaths {
    /// The Domain.
    pub domain_id: DomainId,
    /// `<runtime root>/domains/<domain id>`.
    pub runtime_dir: PathBuf,
}

impl DomainPaths {
    /// The paths of a Domain whose runtime directory is `runtime_dir`.
    pub fn new(domain_id: DomainId, runtime_dir: PathBuf) -> Self {
        Self {
            domain_id,
            runtime_dir,
        }
    }

    /// Finds a Domain's runtime directory from the profile name and the
    /// workspace alone, without reading the configuration: the Runtime Root
    /// comes from `XDG_RUNTIME_DIR`, the Domain ID from the profile and the
    /// canonical workspace.
    pub fn locate(
        profile: &str,
        workspace: &Path,
        host: &HostEnvironment,
    ) -> Result<Self, ConfigError> {
        let profile = ProfileName::parse(profile).map_err(|e| ConfigError::Field {
            field: "PROFILE".into(),
            rule: e.to_string(),
        })?;
        let canonical =
            lazaret_hostfs::plan::canonicalize(workspace).map_err(|source| ConfigError::Path {
                field: "workspace".into(),
                source,
            })?;
        let id = domain_id(&profile, canonical.as_os_str().as_encoded_bytes()).map_err(|e| {
            ConfigError::Field {
                field: "workspace".into(),
                rule: e.to_string(),
            }
        })?;
        let runtime_dir = host
            .runtime_root()?
            .join(crate::config::DOMAINS_DIR)
            .join(id.to_hex());
        Ok(Self::new(id, runtime_dir))
    }

    /// The control socket.
    pub fn control_socket(&self) -> PathBuf {
        self.runtime_dir.join(CONTROL_SOCKET)
    }

    /// The lock file.
    pub fn lock_file(&self) -> PathBuf {
        self.runtime_dir.join(LOCK_FILE)
    }

    /// The log file.
    pub fn log_file(&self) -> PathBuf {
        self.runtime_dir.join(LOG_FILE)
    }

    /// The log file before the last rotation
    /// ([`logfile::PREVIOUS_LOG_FILE`]).
    pub fn previous_log_file(&self) -> PathBuf {
        self.runtime_dir.join(logfile::PREVIOUS_LOG_FILE)
    }

    /// The name of a generation's runtime directory.
    pub fn generation_dir_name(generation: GenerationId) -> String {
        format!("gen-{}", generation.0)
    }
}

pub use lazaret_proto::error_chain as chain;

/// Opens a Domain's lock file in its runtime directory and tries to take
/// it without blocking: `None` when another process (a running
/// coordinator, or another command on the Domain) holds it. Holding it is
/// owning the Domain.
pub fn try_lock(
    runtime: &crate::config::RetainedDir,
) -> std::io::Result<Option<std::os::fd::OwnedFd>> {
    use rustix::fs::{FlockOperation, Mode, OFlags};
    let fd = lazaret_hostfs::beneath::open_beneath(
        runtime.fd(),
        LOCK_FILE,
        OFlags::RDWR | OFlags::CREATE,
        Mode::RUSR | Mode::WUSR,
    )?;
    match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(Some(fd)),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
        Err(e) => Err(e.into()),
    }
}
