//! A scratch host for configuration tests: a temporary home, runtime
//! directory, workspace and configuration file, and a loader bound to them.
//! Trusts nothing but the temporary directory it creates.

#![allow(dead_code)]

use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use lazaret_coordinator::config::{
    self, ConfigError, HostEnvironment, LoadRequest, ResolvedDomainConfiguration,
};

/// A temporary host layout for one test.
pub struct Fixture {
    _root: tempfile::TempDir,
    /// `$HOME`.
    pub home: PathBuf,
    /// `$XDG_RUNTIME_DIR` (mode 0700).
    pub runtime: PathBuf,
    /// The project directory.
    pub workspace: PathBuf,
    /// The configuration file (`$HOME/.config/lazaret/config.toml`).
    pub config: PathBuf,
    /// Extra host variables for `env:` references.
    pub vars: Vec<(String, std::ffi::OsString)>,
}

impl Fixture {
    pub fn new() -> Self {
        let root = tempfile::Builder::new()
            .prefix("lazaret-test-")
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
            _root: root,
            home,
            runtime,
            workspace,
            config,
            vars: Vec::new(),
        }
    }

    /// The scratch directory everything lives in.
    pub fn base(&self) -> &Path {
        self.home.parent().unwrap()
    }

    /// Writes the configuration file with mode 0600.
    pub fn write_config(&self, text: &str) {
        write_file(&self.config, text, 0o600);
    }

    /// The host environment the loader sees.
    pub fn host(&self) -> HostEnvironment {
        let mut vars: Vec<(String, std::ffi::OsString)> = vec![
            ("HOME".into(), self.home.clone().into()),
            ("XDG_RUNTIME_DIR".into(), self.runtime.clone().into()),
        ];
        vars.extend(self.vars.iter().cloned());
        HostEnvironment::from_vars(rustix::process::getuid().as_raw(), vars)
    }

    /// Loads `profile` from the default configuration path.
    pub fn load(&self, profile: &str) -> Result<ResolvedDomainConfiguration, ConfigError> {
        config::load(LoadRequest {
            profile,
            config: None,
            workspace: &self.workspace,
            host: &self.host(),
        })
    }

    /// Loads `profile` from the configuration at `config` (`--config`).
    pub fn load_from(
        &self,
        profile: &str,
        config: &Path,
    ) -> Result<ResolvedDomainConfiguration, ConfigError> {
        config::load(LoadRequest {
            profile,
            config: Some(config.as_os_str()),
            workspace: &self.workspace,
            host: &self.host(),
        })
    }

    /// Writes `text` as the configuration and loads `profile`.
    pub fn load_text(
        &self,
        profile: &str,
        text: &str,
    ) -> Result<ResolvedDomainConfiguration, ConfigError> {
        self.write_config(text);
        self.load(profile)
    }
}

/// Creates `path` (and its parents) holding `text` with `mode`.
pub fn write_file(path: &Path, text: &str, mode: u32) {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    let _ = std::fs::remove_file(path);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .unwrap();
    std::io::Write::write_all(&mut file, text.as_bytes()).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A minimal valid document with one profile `p` and `extra` appended to
/// its table.
pub fn minimal(extra: &str) -> String {
    format!(
        "schema = \"lazaret-trusted-host-config-v1\"\n\
         [profiles.p]\nimage = \"oci:/images/base:1\"\n{extra}\n"
    )
}

/// The message of an error, for assertions.
pub fn message(result: Result<ResolvedDomainConfiguration, ConfigError>) -> String {
    match result {
        Ok(_) => panic!("expected the load to fail"),
        Err(e) => lazaret_proto::error_chain(&e),
    }
}
