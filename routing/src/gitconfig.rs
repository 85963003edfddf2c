//! The one git configuration value routing needs: `core.excludesFile`.
//!
//! Owns reading that key from git's configuration files in git's order
//! (system, global, then the repository's own; the last one set wins) and
//! git's default when none sets it. It reads the files as the invoking user
//! and trusts them as the user's own; it follows no `include`, which the
//! documentation says.
//!
//! A whole git configuration parser would be a large dependency for one key
//! whose syntax is plain: `[core]` then `excludesFile = PATH`.

use std::path::{Path, PathBuf};

/// The largest configuration file read.
const MAX_CONFIG_LEN: u64 = 1024 * 1024;

/// Where the invoking user's git configuration lives.
#[derive(Clone, Debug, Default)]
pub struct UserConfig {
    /// `$HOME`.
    pub home: Option<PathBuf>,
    /// `$XDG_CONFIG_HOME`, when set and absolute.
    pub xdg_config_home: Option<PathBuf>,
}

impl UserConfig {
    /// `$XDG_CONFIG_HOME/git`, else `$HOME/.config/git`.
    fn xdg_git_dir(&self) -> Option<PathBuf> {
        self.xdg_config_home
            .as_ref()
            .filter(|p| p.is_absolute())
            .map(|p| p.join("git"))
            .or_else(|| self.home.as_ref().map(|h| h.join(".config/git")))
    }

    /// The file `core.excludesFile` names for a repository whose common
    /// directory is `common_dir` (none outside a repository), or git's
    /// default; `None` when there is none.
    pub fn excludes_file(&self, common_dir: Option<&Path>) -> Option<PathBuf> {
        let mut files = vec![PathBuf::from("/etc/gitconfig")];
        files.extend(self.xdg_git_dir().map(|d| d.join("config")));
        files.extend(self.home.as_ref().map(|h| h.join(".gitconfig")));
        files.extend(common_dir.map(|d| d.join("config")));
        let configured = files
            .iter()
            .filter_map(|f| read(f))
            .filter_map(|text| excludes_file_in(&text))
            .next_back();
        match configured {
            Some(value) => self.expand(&value),
            None => self.xdg_git_dir().map(|d| d.join("ignore")),
        }
    }

    /// Expands a leading `~/` to the home directory; a relative path names
    /// nothing Lazaret can find (git resolves it against its working
    /// directory).
    fn expand(&self, value: &str) -> Option<PathBuf> {
        if let Some(rest) = value.strip_prefix("~/") {
            return self.home.as_ref().map(|h| h.join(rest));
        }
        let path = PathBuf::from(value);
        path.is_absolute().then_some(path)
    }
}

fn read(path: &Path) -> Option<String> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() || meta.len() > MAX_CONFIG_LEN {
        return None;
    }
    std::fs::read(path)
        .ok()
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
}

/// The last `core.excludesFile` value set in one configuration text.
pub fn excludes_file_in(text: &str) -> Option<String> {
    let mut in_core = false;
    let mut found = None;
    for line in text.lines() {
        let line = line.trim_start();
        if let Some(rest) = line.strip_prefix('[') {
            let Some((header, after)) = rest.split_once(']') else {
                in_core = false;
                continue;
            };
            in_core = header.trim().eq_ignore_ascii_case("core");
            // A key may follow the header on the same line.
            if in_core {
                if let Some(value) = key_value(after.trim_start()) {
                    found = Some(value);
                }
            }
            continue;
        }
        if in_core {
            if let Some(value) = key_value(line) {
                found = Some(value);
            }
        }
    }
    found
}

/// The value of an `excludesFile = VALUE` line, unquoted and without its
/// comment.
fn key_value(line: &str) -> Option<String> {
    let (key, value) = line.split_once('=')?;
    if !key.trim().eq_ignore_ascii_case("excludesfile") {
        return None;
    }
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
    let value = out.trim_end().to_owned();
    (!value.is_empty()).then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_core_excludes_file_wins() {
        let text = "[user]\n\texcludesFile = /not/this\n[core]\n\teditor = vi\n\
                    \texcludesfile = ~/first\n[Core]\n  ExcludesFile = \"/with space/x\" # note\n\
                    [core \"sub\"]\n\texcludesFile = /nor/this\n";
        assert_eq!(excludes_file_in(text).as_deref(), Some("/with space/x"));
        assert_eq!(
            excludes_file_in("[core] excludesFile = /a\n").as_deref(),
            Some("/a")
        );
        assert_eq!(excludes_file_in("[core]\nbare = false\n"), None);
    }

    #[test]
    fn the_default_is_the_xdg_ignore_file() {
        let user = UserConfig {
            home: Some("/nonexistent-home".into()),
            xdg_config_home: None,
        };
        assert_eq!(
            user.excludes_file(None),
            Some(PathBuf::from("/nonexistent-home/.config/git/ignore"))
        );
        let user = UserConfig {
            home: Some("/h".into()),
            xdg_config_home: Some("/x".into()),
        };
        assert_eq!(user.expand("~/ig"), Some(PathBuf::from("/h/ig")));
        assert_eq!(user.expand("relative"), None);
        assert_eq!(user.xdg_git_dir(), Some(PathBuf::from("/x/git")));
    }
}
