//! The host inputs of configuration loading: the invoking user, `HOME`, the
//! XDG variables, and the host environment that `env:` references read.
//!
//! This module owns the selection rules for the configuration file, the
//! Storage Root and the Runtime Root. It trusts the invoking user's
//! environment to name paths, but never uses a value that is not a
//! NUL-free absolute path: an unset, empty or relative XDG config or data
//! value falls back to `HOME`, and an invalid `HOME` or `XDG_RUNTIME_DIR`
//! refuses loading.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::path::{Component, Path, PathBuf};

use lazaret_proto::config::{HostAnchor, HostPathDecl};

use super::ConfigError;

/// The host inputs of one load.
#[derive(Debug, Clone)]
pub struct HostEnvironment {
    /// The invoking user's uid.
    pub uid: u32,
    home: Option<OsString>,
    xdg_config_home: Option<OsString>,
    xdg_data_home: Option<OsString>,
    xdg_runtime_dir: Option<OsString>,
    /// Host variables for `env:` references; `None` reads the process
    /// environment at resolution time, so unreferenced values are never
    /// copied.
    variables: Option<BTreeMap<OsString, OsString>>,
}

impl HostEnvironment {
    /// The current process's user and environment.
    pub fn capture() -> Self {
        let var = std::env::var_os;
        Self {
            uid: rustix::process::getuid().as_raw(),
            home: var("HOME"),
            xdg_config_home: var("XDG_CONFIG_HOME"),
            xdg_data_home: var("XDG_DATA_HOME"),
            xdg_runtime_dir: var("XDG_RUNTIME_DIR"),
            variables: None,
        }
    }

    /// A fixed environment, for tests and embedding: `vars` holds every
    /// variable, including `HOME` and the XDG ones.
    pub fn from_vars<K, V>(uid: u32, vars: impl IntoIterator<Item = (K, V)>) -> Self
    where
        K: Into<OsString>,
        V: Into<OsString>,
    {
        let variables: BTreeMap<OsString, OsString> = vars
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        let var = |name: &str| variables.get(OsStr::new(name)).cloned();
        Self {
            uid,
            home: var("HOME"),
            xdg_config_home: var("XDG_CONFIG_HOME"),
            xdg_data_home: var("XDG_DATA_HOME"),
            xdg_runtime_dir: var("XDG_RUNTIME_DIR"),
            variables: Some(variables),
        }
    }

    /// The value of host variable `name`, if set.
    pub fn variable(&self, name: &str) -> Option<OsString> {
        match &self.variables {
            Some(vars) => vars.get(OsStr::new(name)).cloned(),
            None => std::env::var_os(name),
        }
    }

    /// `HOME`, which must be present, absolute and free of `..`.
    pub fn home(&self) -> Result<PathBuf, ConfigError> {
        let refuse = |reason: &str| ConfigError::Environment {
            variable: "HOME",
            reason: reason.to_owned(),
        };
        let value = self
            .home
            .as_deref()
            .filter(|v| !v.is_empty())
            .ok_or_else(|| {
                refuse("is not set; Lazaret needs the home directory of the invoking user")
            })?;
        normalize_absolute(value).ok_or_else(|| {
            refuse(&format!(
                "`{}` is not an absolute path without `..`",
                Path::new(value).display()
            ))
        })
    }

    /// An XDG base directory: set, nonempty and absolute, or else unset.
    fn xdg(value: Option<&OsString>) -> Option<PathBuf> {
        value.and_then(|v| normalize_absolute(v))
    }

    /// The configuration file: the explicit `--config` path, else
    /// `$XDG_CONFIG_HOME/lazaret/config.toml`, else
    /// `$HOME/.config/lazaret/config.toml`.
    pub fn config_path(&self, explicit: Option<&OsStr>) -> Result<PathBuf, ConfigError> {
        if let Some(explicit) = explicit {
            let text = explicit.to_str().ok_or_else(|| ConfigError::Field {
                field: "--config".into(),
                rule: "the configuration path is not valid UTF-8".into(),
            })?;
            let decl = HostPathDecl::parse(text).map_err(|e| ConfigError::Field {
                field: "--config".into(),
                rule: e.to_string(),
            })?;
            return self.expand(&decl, "--config");
        }
        match Self::xdg(self.xdg_config_home.as_ref()) {
            Some(base) => Ok(base.join("lazaret/config.toml")),
            None => Ok(self.home()?.join(".config/lazaret/config.toml")),
        }
    }

    /// The user's data directory: `$XDG_DATA_HOME`, else
    /// `$HOME/.local/share`.
    pub fn data_home(&self) -> Result<PathBuf, ConfigError> {
        match Self::xdg(self.xdg_data_home.as_ref()) {
            Some(base) => Ok(base),
            None => Ok(self.home()?.join(".local/share")),
        }
    }

    /// The Storage Root: `storage.data_root`, else `$XDG_DATA_HOME/lazaret`,
    /// else `$HOME/.local/share/lazaret`.
    pub fn storage_root(&self, data_root: Option<&HostPathDecl>) -> Result<PathBuf, ConfigError> {
        if let Some(decl) = data_root {
            return self.expand(decl, "storage.data_root");
        }
        match Self::xdg(self.xdg_data_home.as_ref()) {
            Some(base) => Ok(base.join("lazaret")),
            None => Ok(self.home()?.join(".local/share/lazaret")),
        }
    }

    /// The Runtime Root: `$XDG_RUNTIME_DIR/lazaret`; the variable must be set
    /// to an absolute path.
    pub fn runtime_root(&self) -> Result<PathBuf, ConfigError> {
        let value = self
            .xdg_runtime_dir
            .as_deref()
            .filter(|v| !v.is_empty())
            .ok_or_else(|| ConfigError::Environment {
                variable: "XDG_RUNTIME_DIR",
                reason: "is not set; Lazaret keeps its runtime control state under \
                         $XDG_RUNTIME_DIR/lazaret (a login session sets it, usually to \
                         /run/user/$(id -u))"
                    .into(),
            })?;
        let base = normalize_absolute(value).ok_or_else(|| ConfigError::Environment {
            variable: "XDG_RUNTIME_DIR",
            reason: format!(
                "`{}` is not an absolute path without `..`",
                Path::new(value).display()
            ),
        })?;
        Ok(base.join("lazaret"))
    }

    /// Expands a `/` or `~/` declaration; `{profile_dir}/` is refused here.
    pub fn expand(&self, decl: &HostPathDecl, field: &str) -> Result<PathBuf, ConfigError> {
        match decl.anchor() {
            HostAnchor::Root => Ok(PathBuf::from(decl.as_str())),
            HostAnchor::Home => Ok(self.home()?.join(decl.suffix())),
            HostAnchor::ProfileDir => Err(ConfigError::Field {
                field: field.to_owned(),
                rule: "`{profile_dir}/` may begin only a volume `host` path".into(),
            }),
        }
    }
}

/// Normalizes an absolute path lexically (dropping `.`, repeated and
/// trailing separators); `None` for a relative path or one with `..`.
fn normalize_absolute(value: &OsStr) -> Option<PathBuf> {
    let path = Path::new(value);
    if !path.is_absolute() {
        return None;
    }
    let mut out = PathBuf::from("/");
    for component in path.components() {
        match component {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(name) => out.push(name),
            Component::ParentDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> HostEnvironment {
        HostEnvironment::from_vars(1000, vars.iter().map(|(k, v)| (*k, *v)))
    }

    #[test]
    fn config_path_selection() {
        let e = env(&[("HOME", "/home/u"), ("XDG_CONFIG_HOME", "/cfg")]);
        assert_eq!(
            e.config_path(None).unwrap(),
            Path::new("/cfg/lazaret/config.toml")
        );
        let explicit = e.config_path(Some(OsStr::new("~/x.toml"))).unwrap();
        assert_eq!(explicit, Path::new("/home/u/x.toml"));
        for unset in ["", "relative/dir"] {
            let e = env(&[("HOME", "/home/u/"), ("XDG_CONFIG_HOME", unset)]);
            assert_eq!(
                e.config_path(None).unwrap(),
                Path::new("/home/u/.config/lazaret/config.toml")
            );
        }
        let no_home = env(&[]);
        assert!(matches!(
            no_home.config_path(None),
            Err(ConfigError::Environment {
                variable: "HOME",
                ..
            })
        ));
        let relative_home = env(&[("HOME", "home/u")]);
        assert!(relative_home.config_path(None).is_err());
        for bad in [
            "x.toml",
            "~//x.toml",
            "{profile_dir}/x.toml",
            "/a/../b.toml",
        ] {
            let err = e.config_path(Some(OsStr::new(bad))).unwrap_err();
            assert!(err.to_string().starts_with("--config: "), "{bad}: {err}");
        }
    }

    #[test]
    fn storage_and_runtime_roots() {
        let e = env(&[
            ("HOME", "/home/u"),
            ("XDG_DATA_HOME", "/data"),
            ("XDG_RUNTIME_DIR", "/run/user/1000/"),
        ]);
        assert_eq!(e.storage_root(None).unwrap(), Path::new("/data/lazaret"));
        assert_eq!(
            e.runtime_root().unwrap(),
            Path::new("/run/user/1000/lazaret")
        );
        let decl = HostPathDecl::parse("~/state").unwrap();
        assert_eq!(
            e.storage_root(Some(&decl)).unwrap(),
            Path::new("/home/u/state")
        );
        let decl = HostPathDecl::parse("{profile_dir}/x").unwrap();
        assert!(
            e.storage_root(Some(&decl))
                .unwrap_err()
                .to_string()
                .starts_with("storage.data_root: ")
        );

        let e = env(&[("HOME", "/home/u"), ("XDG_DATA_HOME", "data")]);
        assert_eq!(
            e.storage_root(None).unwrap(),
            Path::new("/home/u/.local/share/lazaret")
        );
        for runtime in [None, Some(""), Some("run/user/1"), Some("/run/../x")] {
            let mut vars = vec![("HOME", "/home/u")];
            vars.extend(runtime.map(|r| ("XDG_RUNTIME_DIR", r)));
            let err = env(&vars).runtime_root().unwrap_err();
            assert!(err.to_string().starts_with("XDG_RUNTIME_DIR"), "{err}");
        }
    }
}
