//! Scratch hosts for unit tests of the lifecycle and the session hub: a
//! temporary home, runtime directory, workspace and configuration file,
//! loaded as `up` loads them, and the Domain Store a coordinator would
//! open there.
//!
//! Owns nothing outside its temporary directory, and trusts nothing but
//! it.

use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use lazaret_proto::common::{HostPath, UnixTimeNs};
use lazaret_proto::ids::GenerationId;
use lazaret_proto::process::PersistedHostProcessOwnership;
use lazaret_proto::store::{Domain, Generation, GenerationState};
use lazaret_storage::store::DomainStore;

use crate::config::{self, HostEnvironment, LoadRequest, ResolvedDomainConfiguration};

/// A temporary host layout for one test.
pub(crate) struct Scratch {
    root: tempfile::TempDir,
    /// `$HOME`.
    pub(crate) home: PathBuf,
    /// `$XDG_RUNTIME_DIR` (mode 0700).
    pub(crate) runtime: PathBuf,
    /// The workspace.
    pub(crate) workspace: PathBuf,
    /// The configuration file.
    pub(crate) config: PathBuf,
}

impl Scratch {
    pub(crate) fn new() -> Self {
        let root = tempfile::Builder::new()
            .prefix("lazaret-unit-")
            .tempdir()
            .unwrap();
        let base = std::fs::canonicalize(root.path()).unwrap();
        let home = base.join("home");
        let runtime = base.join("run");
        let workspace = base.join("work");
        for dir in [&home, &runtime, &workspace, &home.join(".config/lazaret")] {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(0o700)).unwrap();
        let config = home.join(".config/lazaret/config.toml");
        Self {
            root,
            home,
            runtime,
            workspace,
            config,
        }
    }

    /// The scratch directory everything lives in.
    pub(crate) fn base(&self) -> &Path {
        self.root.path()
    }

    /// The host environment the loader sees: `LZ_TOKEN` is `secret`.
    pub(crate) fn host(&self) -> HostEnvironment {
        let vars: Vec<(String, std::ffi::OsString)> = vec![
            ("HOME".into(), self.home.clone().into()),
            ("XDG_RUNTIME_DIR".into(), self.runtime.clone().into()),
            ("LZ_TOKEN".into(), "secret".into()),
        ];
        HostEnvironment::from_vars(rustix::process::getuid().as_raw(), vars)
    }

    /// Writes a configuration of one profile `p`, with `extra` in its
    /// table, and loads it as `up` does.
    pub(crate) fn load(&self, extra: &str) -> ResolvedDomainConfiguration {
        self.load_document(&format!(
            "schema = \"lazaret-trusted-host-config-v1\"\n\
             [profiles.p]\nimage = \"oci:/images/base:1\"\n{extra}\n"
        ))
    }

    /// Writes `text` as the configuration and loads its profile `p` as
    /// `up` does.
    pub(crate) fn load_document(&self, text: &str) -> ResolvedDomainConfiguration {
        let _ = std::fs::remove_file(&self.config);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&self.config)
            .unwrap();
        std::io::Write::write_all(&mut file, text.as_bytes()).unwrap();
        config::load(LoadRequest {
            profile: "p",
            config: None,
            workspace: &self.workspace,
            host: &self.host(),
        })
        .unwrap()
    }
}

/// The Domain Store of `resolved`, where its coordinator opens it.
pub(crate) fn store_of(resolved: &ResolvedDomainConfiguration) -> Arc<DomainStore> {
    let auth = resolved.authorities();
    let domain = Domain {
        domain_id: resolved.domain_id(),
        profile_name: resolved.profile().as_str().to_owned(),
        canonical_workspace: HostPath::from(auth.workspace.label()),
    };
    Arc::new(DomainStore::open(&auth.domain_storage, &domain).unwrap())
}

/// Generation `id` of `resolved`'s Domain, in `state`, with no recorded
/// coordinator.
pub(crate) fn generation(
    resolved: &ResolvedDomainConfiguration,
    id: u64,
    state: GenerationState,
) -> Generation {
    Generation {
        domain_id: resolved.domain_id(),
        generation_id: GenerationId(id),
        configuration_fingerprint: resolved.fingerprint(),
        state,
        host_coordinator: PersistedHostProcessOwnership::Unassigned,
        started_at: UnixTimeNs::now(),
        closed_at: None,
    }
}
