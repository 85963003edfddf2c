//! What routing needs from git's configuration files: the user's
//! `core.excludesFile`, and every path the configuration makes git read or
//! run (`core.hooksPath`, `include.path`, `includeIf.*.path`, and the
//! paths, file arguments and Python modules of any value git runs as a
//! command, such as `core.fsmonitor` or a `filter.*.clean` script).
//!
//! Owns reading git's configuration files in git's order (system, global,
//! then the repository's own, each include in its place, the last one set
//! winning) and git's default excludes file when none sets one. It reads
//! the files as the invoking user and trusts them as the user's own,
//! through one descriptor each, bounded, never blocking on a FIFO. A whole git configuration parser would be a large
//! dependency for these few lookups, whose syntax is plain: `[section]` or
//! `[section "subsection"]`, then `key = value` lines.

use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

use crate::command::{CommandNames, command_names};

/// The largest configuration file read.
const MAX_CONFIG_LEN: u64 = 1024 * 1024;

/// Where the invoking user's git configuration lives.
#[derive(Clone, Debug, Default)]
pub struct UserConfig {
    /// `$HOME`.
    pub home: Option<PathBuf>,
    /// `$XDG_CONFIG_HOME`, when set and absolute.
    pub xdg_config_home: Option<PathBuf>,
    /// `$GIT_CONFIG_GLOBAL`: the one global file git reads instead.
    pub global: Option<PathBuf>,
    /// `$GIT_CONFIG_SYSTEM`: the system file git reads instead.
    pub system: Option<PathBuf>,
    /// `$GIT_CONFIG_NOSYSTEM`: git reads no system file.
    pub no_system: bool,
}

/// One `key = value` of a configuration file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The section, lowercased (`core`, `includeif`).
    pub section: String,
    /// The subsection as written, if any.
    pub subsection: Option<String>,
    /// The key, lowercased.
    pub key: String,
    /// The value, unquoted, without its comment; empty for a bare key.
    pub value: String,
}

impl UserConfig {
    /// Where git looks, as the environment tells it: `home` (`$HOME`, as
    /// the caller validated it) and the variables `var` gives.
    pub fn from_env(home: Option<PathBuf>, var: impl Fn(&str) -> Option<OsString>) -> Self {
        UserConfig {
            home,
            xdg_config_home: var("XDG_CONFIG_HOME").map(Into::into),
            global: var("GIT_CONFIG_GLOBAL").map(Into::into),
            system: var("GIT_CONFIG_SYSTEM").map(Into::into),
            // git takes any value but a false one as true.
            no_system: var("GIT_CONFIG_NOSYSTEM")
                .is_some_and(|v| !matches!(v.to_str(), Some("" | "0" | "false" | "no" | "off"))),
        }
    }

    /// `$XDG_CONFIG_HOME/git`, else `$HOME/.config/git`.
    fn xdg_git_dir(&self) -> Option<PathBuf> {
        self.xdg_config_home
            .as_ref()
            .filter(|p| p.is_absolute())
            .map(|p| p.join("git"))
            .or_else(|| self.home.as_ref().map(|h| h.join(".config/git")))
    }

    /// The configuration files git reads for a repository whose git and
    /// common directories are given (none outside a repository), in git's
    /// order.
    pub fn files(&self, git_dir: Option<&Path>, common_dir: Option<&Path>) -> Vec<PathBuf> {
        let mut files = Vec::new();
        if !self.no_system {
            files.push(
                self.system
                    .clone()
                    .unwrap_or_else(|| PathBuf::from("/etc/gitconfig")),
            );
        }
        match &self.global {
            Some(global) => files.push(global.clone()),
            None => {
                files.extend(self.xdg_git_dir().map(|d| d.join("config")));
                files.extend(self.home.as_ref().map(|h| h.join(".gitconfig")));
            }
        }
        files.extend(common_dir.map(|d| d.join("config")));
        files.extend(git_dir.map(|d| d.join("config.worktree")));
        files
    }

    /// The configuration git reads from `files` (see [`files`](Self::files)),
    /// in git's order, each included file's entries in its place (includes
    /// followed as deep as git follows them). A file that does not exist,
    /// that cannot be opened, or is no regular file, is passed over, as git
    /// passes it over; one larger than Lazaret reads is an error.
    pub fn read(&self, files: &[PathBuf]) -> Result<Configuration, ConfigError> {
        let mut configuration = Configuration {
            user: self.clone(),
            entries: Vec::new(),
            included: Vec::new(),
        };
        for file in files {
            self.read_into(file, 0, &mut configuration)?;
        }
        Ok(configuration)
    }

    fn read_into(
        &self,
        file: &Path,
        depth: usize,
        configuration: &mut Configuration,
    ) -> Result<(), ConfigError> {
        let text = match lazaret_hostfs::read::read_small(None, file, true, MAX_CONFIG_LEN) {
            Ok(Some(bytes)) => String::from_utf8_lossy(&bytes).into_owned(),
            // git passes over a file it cannot open (with a warning), so
            // nothing in it is run: nothing to protect either.
            Ok(None) | Err(lazaret_hostfs::read::ReadError::Io(_)) => return Ok(()),
            Err(error) => {
                return Err(ConfigError {
                    path: file.to_path_buf(),
                    error,
                });
            }
        };
        let dir = file.parent().unwrap_or(Path::new("/"));
        for entry in entries(&text) {
            let include =
                entry.key == "path" && matches!(entry.section.as_str(), "include" | "includeif");
            if include {
                if let Some(target) = self.expand(&entry.value, Some(dir)) {
                    if depth < MAX_INCLUDE_DEPTH {
                        self.read_into(&target, depth + 1, configuration)?;
                    }
                    configuration.included.push(target);
                }
                continue;
            }
            configuration.entries.push(entry);
        }
        Ok(())
    }

    /// Expands a leading `~/` to the home directory and a relative path
    /// against `base`; without a base a relative path names nothing
    /// Lazaret can find (git resolves it against its working directory).
    fn expand(&self, value: &str, base: Option<&Path>) -> Option<PathBuf> {
        if let Some(rest) = value.strip_prefix("~/") {
            return self.home.as_ref().map(|h| h.join(rest));
        }
        let path = PathBuf::from(value);
        if path.is_absolute() {
            return Some(path);
        }
        base.map(|b| b.join(path))
    }
}

/// How deep git follows includes.
const MAX_INCLUDE_DEPTH: usize = 10;

/// A git configuration file Lazaret could not read.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot read the git configuration file {} ({error}); Lazaret reads it for what git runs \
     from the workspace: make it readable by you, or remove it",
    path.display()
)]
pub struct ConfigError {
    /// The file.
    pub path: PathBuf,
    /// Why.
    pub error: lazaret_hostfs::read::ReadError,
}

/// The configuration git reads for one repository, read once: every entry
/// in git's order, includes read in place.
#[derive(Debug)]
pub struct Configuration {
    user: UserConfig,
    entries: Vec<Entry>,
    /// The included files.
    included: Vec<PathBuf>,
}

impl Configuration {
    /// The value of the last `core.KEY` (`key` lowercased), as git takes it.
    fn core(&self, key: &str) -> Option<&str> {
        self.entries
            .iter()
            .filter(|e| e.section == "core" && e.subsection.is_none() && e.key == key)
            .map(|e| e.value.trim())
            .next_back()
    }

    /// The file `core.excludesFile` names, or git's default; `None` when
    /// there is none.
    pub fn excludes_file(&self) -> Option<PathBuf> {
        match self.core("excludesfile") {
            Some(value) => self.user.expand(value, None),
            None => self.user.xdg_git_dir().map(|d| d.join("ignore")),
        }
    }

    /// The directory `core.hooksPath` names, relative ones taken from
    /// `worktree`.
    pub fn hooks_path(&self, worktree: &Path) -> Option<PathBuf> {
        self.core("hookspath")
            .and_then(|value| self.user.expand(value, Some(worktree)))
    }

    /// What the configuration makes git read as configuration or run:
    /// include targets, the hooks directory, and what each command names
    /// (see [`command_names`]). A relative path is taken from `worktree`,
    /// where git runs hooks and filters.
    pub fn what_runs(&self, worktree: &Path) -> Runs {
        let mut runs = Runs {
            paths: self.included.clone(),
            ..Runs::default()
        };
        runs.paths.extend(self.hooks_path(worktree));
        for entry in self.entries.iter().filter(|e| runs_program(e)) {
            runs.add(&command_names(&entry.value), worktree, |word| {
                self.user.expand(word, Some(worktree))
            });
        }
        runs
    }
}

/// What git's configuration (or a hook) makes git read or run.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Runs {
    /// Files and directories git or what it runs reads, by path.
    pub paths: Vec<PathBuf>,
    /// Files run as programs or interpreters' scripts: what the
    /// interpreter loads from their directories runs too.
    pub scripts: Vec<PathBuf>,
    /// Files a shell sources: their lines run as the sourcing script's.
    pub sourced: Vec<PathBuf>,
    /// Python modules run with `-m`, as the path of their top-level
    /// package in the directory a command runs in: every name that
    /// package may take there (`tool`, `tool.py`, `tool.*.so`) is read.
    pub modules: Vec<PathBuf>,
}

impl Runs {
    /// Adds what one command names, run in `worktree`; `expand` makes a
    /// path of a word (relative ones taken from `worktree`).
    pub fn add(
        &mut self,
        named: &CommandNames<'_>,
        worktree: &Path,
        expand: impl Fn(&str) -> Option<PathBuf>,
    ) {
        self.paths
            .extend(named.paths.iter().filter_map(|word| expand(word)));
        self.scripts
            .extend(named.scripts.iter().filter_map(|word| expand(word)));
        self.sourced
            .extend(named.sourced.iter().filter_map(|word| expand(word)));
        self.modules
            .extend(named.modules.iter().map(|m| worktree.join(m)));
    }
}

/// Whether git runs the value of `entry` as a command.
fn runs_program(entry: &Entry) -> bool {
    let key = entry.key.as_str();
    match entry.section.as_str() {
        "core" => matches!(
            key,
            "fsmonitor"
                | "pager"
                | "editor"
                | "sshcommand"
                | "askpass"
                | "gitproxy"
                | "alternaterefscommand"
        ),
        "uploadpack" => key == "packobjectshook",
        "diff" | "difftool" | "mergetool" | "merge" | "filter" | "credential" | "gpg"
        | "sequence" | "pager" | "alias" | "tar" | "trailer" | "browser" | "man" | "guitool"
        | "sendemail" => true,
        "remote" => matches!(key, "uploadpack" | "receivepack" | "vcs"),
        "interactive" => key == "difffilter",
        "web" => key == "browser",
        "submodule" => key == "update" && entry.value.trim_start().starts_with('!'),
        _ => false,
    }
}

/// `path` without `.` components and with each `..` applied to what is
/// before it, without looking at the filesystem.
pub fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// The entries of one configuration text, in order.
pub fn entries(text: &str) -> Vec<Entry> {
    let mut out = Vec::new();
    let mut section = String::new();
    let mut subsection = None;
    // A line ending in a backslash continues on the next.
    let mut joined = Vec::new();
    let mut pending = String::new();
    for line in text.lines() {
        match line.strip_suffix('\\') {
            Some(head) => pending.push_str(head),
            None => {
                pending.push_str(line);
                joined.push(std::mem::take(&mut pending));
            }
        }
    }
    if !pending.is_empty() {
        joined.push(pending);
    }
    for line in &joined {
        let mut line = line.trim_start();
        if let Some(rest) = line.strip_prefix('[') {
            let Some((header, after)) = rest.split_once(']') else {
                section.clear();
                continue;
            };
            let header = header.trim();
            (section, subsection) = match header.split_once(char::is_whitespace) {
                Some((name, sub)) => (
                    name.to_ascii_lowercase(),
                    Some(sub.trim().trim_matches('"').to_owned()),
                ),
                None => match header.split_once('.') {
                    Some((name, sub)) => (name.to_ascii_lowercase(), Some(sub.to_owned())),
                    None => (header.to_ascii_lowercase(), None),
                },
            };
            // A key may follow the header on the same line.
            line = after.trim_start();
        }
        if section.is_empty() || line.is_empty() || line.starts_with(['#', ';']) {
            continue;
        }
        let (key, value) = match line.split_once('=') {
            Some((key, value)) => (key.trim(), unquote(value)),
            None => (line.trim(), String::new()),
        };
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            continue;
        }
        out.push(Entry {
            section: section.clone(),
            subsection: subsection.clone(),
            key: key.to_ascii_lowercase(),
            value,
        });
    }
    out
}

/// A value unquoted, with its escapes applied and its comment removed.
fn unquote(value: &str) -> String {
    let mut out = String::new();
    let mut quoted = false;
    let mut chars = value.trim().chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => quoted = !quoted,
            '\\' => match chars.next() {
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some(other) => out.push(other),
                None => {}
            },
            '#' | ';' if !quoted => break,
            c => out.push(c),
        }
    }
    out.trim_end().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `core.excludesFile` a configuration file holding `text` sets.
    fn excludes(text: &str) -> Option<String> {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config");
        std::fs::write(&file, text).unwrap();
        let config = UserConfig::default().read(&[file]).unwrap();
        config.core("excludesfile").map(str::to_owned)
    }

    #[test]
    fn the_last_core_excludes_file_wins() {
        let text = "[user]\n\texcludesFile = /not/this\n[core]\n\teditor = vi\n\
                    \texcludesfile = ~/first\n[Core]\n  ExcludesFile = \"/with space/x\" # note\n\
                    [core \"sub\"]\n\texcludesFile = /nor/this\n";
        assert_eq!(excludes(text).as_deref(), Some("/with space/x"));
        assert_eq!(
            excludes("[core] excludesFile = /a\n").as_deref(),
            Some("/a")
        );
        assert_eq!(excludes("[core]\nbare = false\n"), None);
    }

    #[test]
    fn a_configuration_file_larger_than_read_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config");
        std::fs::write(&file, vec![b'#'; MAX_CONFIG_LEN as usize + 1]).unwrap();
        let error = UserConfig::default().read(&[file]).unwrap_err();
        assert!(error.to_string().contains("larger than"), "{error}");
    }

    #[test]
    fn the_default_is_the_xdg_ignore_file() {
        let user = UserConfig {
            home: Some("/nonexistent-home".into()),
            xdg_config_home: None,
            ..UserConfig::default()
        };
        assert_eq!(
            user.read(&[]).unwrap().excludes_file(),
            Some(PathBuf::from("/nonexistent-home/.config/git/ignore"))
        );
        let user = UserConfig {
            home: Some("/h".into()),
            xdg_config_home: Some("/x".into()),
            ..UserConfig::default()
        };
        assert_eq!(user.expand("~/ig", None), Some(PathBuf::from("/h/ig")));
        assert_eq!(user.expand("relative", None), None);
        assert_eq!(user.xdg_git_dir(), Some(PathBuf::from("/x/git")));
    }

    #[test]
    fn what_a_configuration_runs_is_found_and_resolved() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config");
        let included = dir.path().join("more.config");
        std::fs::write(
            &config,
            "[core]\n\thooksPath = .husky\n\tfsmonitor = \"tools/watch.sh --fast\"\n\
             \tpager = less\n[include]\n\tpath = more.config\n\
             [remote \"origin\"]\n\turl = ../sibling/x.git\n\
             [branch \"main\"]\n\tmerge = refs/heads/main\n\
             [alias]\n\tt = !bash scripts/test.sh --all\n\tco = checkout main\n\
             [diff \"x\"]\n\ttextconv = python3 \\\n\t\ttools/conv.py\n\
             [filter \"nb\"]\n\tclean = python3 -m nbstripout.cli --config=cfg/nb.toml\n\
             \tsmudge = python3 smudge.py %f\n",
        )
        .unwrap();
        std::fs::write(
            &included,
            "[filter \"x\"]\n\tclean = ./scripts/../bin/clean\n",
        )
        .unwrap();
        let user = UserConfig::default();
        let runs = user.read(&[config]).unwrap().what_runs(Path::new("/w"));
        // As written: `..` is the kernel's to apply, after any link.
        assert!(
            runs.scripts
                .contains(&PathBuf::from("/w/./scripts/../bin/clean"))
        );
        let sorted = |paths: &[PathBuf]| {
            let mut paths: Vec<PathBuf> = paths.iter().map(|p| normalize(p)).collect();
            paths.sort();
            paths
        };
        let mut expected = vec![
            PathBuf::from("/w/.husky"),
            PathBuf::from("/w/cfg/nb.toml"),
            included,
        ];
        expected.sort();
        assert_eq!(sorted(&runs.paths), expected);
        assert_eq!(
            sorted(&runs.scripts),
            [
                "/w/bin/clean",
                "/w/scripts/test.sh",
                "/w/smudge.py",
                "/w/tools/conv.py",
                "/w/tools/watch.sh"
            ]
            .map(PathBuf::from)
        );
        assert_eq!(runs.modules, [PathBuf::from("/w/nbstripout")]);
    }
}
