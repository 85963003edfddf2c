//! What a command git runs for the host names in the worktree: the value
//! of a configured command (`core.fsmonitor`, a filter, a shell alias) or
//! a line of a hook script.
//!
//! Owns the reading of such a command as the shell would split it, closely
//! enough to find what it runs: the program of each simple command (after
//! environment assignments and wrappers such as `exec` or `env`), the
//! script an interpreter runs (`python3 clean.py`, `sh -c './x.sh'`), the
//! file a shell sources (`. ./tools/helpers.sh`, `source env.sh`), a
//! module run with `python -m`, and a path given as an option's value
//! (`--config=dir/file`). What a program is given as data (`black src/`,
//! `gh auth git-credential`) is not taken: making a project's directories
//! read-only because a command names them would stop ordinary work.
//! Trusts nothing it reads; it only finds names, which the caller turns
//! into paths to protect.

/// Programs that run the script named by their first argument.
const INTERPRETERS: [&str; 18] = [
    "sh", "bash", "dash", "zsh", "ksh", "fish", "python", "pypy", "node", "nodejs", "deno", "bun",
    "ruby", "perl", "php", "lua", "tclsh", "rscript",
];

/// The interpreters among them whose `-c` runs its argument as a command.
const SHELLS: [&str; 6] = ["sh", "bash", "dash", "zsh", "ksh", "fish"];

/// Words that run the command after them.
const WRAPPERS: [&str; 16] = [
    "exec", "command", "builtin", "env", "nohup", "nice", "time", "xargs", "sudo", "if", "then",
    "else", "elif", "do", "while", "until",
];

/// What a command names in the files around it. Relative paths name files
/// in the directory the command runs in.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct CommandNames<'a> {
    /// Files it runs: each program named by a path (`./tools/lint.sh`) and
    /// each script an interpreter runs (`clean.py` in `python3 clean.py`).
    /// An interpreter loads code from the directory of its script (Python
    /// imports from there first).
    pub scripts: Vec<&'a str>,
    /// Files a shell reads as commands of its own: the argument of `.` or
    /// `source`, with or without a `/` (bash looks a bare name up in the
    /// working directory too).
    pub sourced: Vec<&'a str>,
    /// Files it reads as configuration: each path an option or an
    /// assignment gives (`--config=conf/lint.toml`, `HOOK=./bin/x`).
    pub paths: Vec<&'a str>,
    /// The top-level packages of the modules run with `python -m NAME`
    /// (or `-mNAME`, `-Em NAME`), which Python looks up first in the
    /// directory it runs in.
    pub modules: Vec<&'a str>,
}

/// The names in `command`. No URL, variable or placeholder (`%f`) is a
/// name.
pub fn command_names(command: &str) -> CommandNames<'_> {
    let mut names = CommandNames::default();
    for segment in command.split([';', '|', '&', '(', ')', '`', '\n']) {
        let words = segment
            .split(|c: char| c.is_whitespace() || matches!(c, '<' | '>'))
            .map(|w| w.trim_matches(|c| matches!(c, '\'' | '"' | '!' | '{' | '}')))
            .filter(|w| !w.is_empty());
        simple_command(words, &mut names);
    }
    names
}

/// Where a simple command's reading is.
enum Expect {
    /// Its program (after assignments and wrappers).
    Program,
    /// The file `.` or `source` reads.
    Sourced,
    /// Arguments of a program: an interpreter's script is the first, and
    /// an option's value may be a path.
    Arguments { interpreter: Option<String> },
    /// The module `-m` names.
    Module,
    /// The arguments of a script or module: only option paths count.
    Options,
    /// Nothing more: the rest is code.
    Done,
}

fn simple_command<'a>(words: impl Iterator<Item = &'a str>, names: &mut CommandNames<'a>) {
    let mut expect = Expect::Program;
    for word in words {
        expect = match expect {
            Expect::Done => break,
            Expect::Sourced => {
                if is_name(word) {
                    names.sourced.push(word);
                }
                Expect::Options
            }
            Expect::Module => {
                names.modules.extend(python_package(word));
                Expect::Options
            }
            Expect::Options => {
                argument(word, None, names);
                Expect::Options
            }
            Expect::Program => {
                if let Some((name, value)) = word.split_once('=') {
                    if is_identifier(name) {
                        names.paths.extend(path_value(value));
                        Expect::Program
                    } else {
                        Expect::Arguments { interpreter: None }
                    }
                } else if WRAPPERS.contains(&base_name(word).as_str()) {
                    Expect::Program
                } else if matches!(word, "." | "source") {
                    Expect::Sourced
                } else {
                    if word.contains('/') && is_name(word) {
                        names.scripts.push(word);
                    }
                    Expect::Arguments {
                        interpreter: interpreter(word),
                    }
                }
            }
            Expect::Arguments { interpreter } => argument(word, interpreter, names),
        };
    }
}

/// Reads one argument of a program (`interpreter` when it is one).
fn argument<'a>(
    word: &'a str,
    interpreter: Option<String>,
    names: &mut CommandNames<'a>,
) -> Expect {
    let Some(kind) = interpreter else {
        if let Some((_, value)) = word.split_once('=') {
            names.paths.extend(path_value(value));
        }
        return Expect::Arguments { interpreter: None };
    };
    let shell = SHELLS.contains(&kind.as_str());
    if let Some(flags) = word.strip_prefix('-').filter(|f| !f.starts_with('-')) {
        // Short flags, possibly bundled: `-m`, `-mNAME`, `-Em NAME`, `-c`.
        for (i, flag) in flags.char_indices() {
            match flag {
                'm' if kind.starts_with("py") => {
                    let rest = &flags[i + 1..];
                    if rest.is_empty() {
                        return Expect::Module;
                    }
                    names.modules.extend(python_package(rest));
                    return Expect::Options;
                }
                // The argument is a command line: read it as one.
                'c' if shell => return Expect::Program,
                // The argument is code; what it names is not read.
                'c' => return Expect::Done,
                'e' if !shell => return Expect::Done,
                c if c.is_ascii_alphabetic() => {}
                _ => break,
            }
        }
        return Expect::Arguments {
            interpreter: Some(kind),
        };
    }
    if let Some(value) = word.strip_prefix("--").and_then(|w| w.split_once('=')) {
        names.paths.extend(path_value(value.1));
        return Expect::Arguments {
            interpreter: Some(kind),
        };
    }
    if word == "--" || word.starts_with('-') {
        return Expect::Arguments {
            interpreter: Some(kind),
        };
    }
    // The script, then its own arguments.
    if is_name(word) {
        names.scripts.push(word);
    }
    Expect::Options
}

/// Whether `program` (a path or a name, as a `#!` line gives it) is a
/// shell.
pub fn is_shell(program: &str) -> bool {
    interpreter(program).is_some_and(|kind| SHELLS.contains(&kind.as_str()))
}

/// The interpreter a program word names, by its base name without a
/// version (`python3.12`, `/usr/bin/bash`, `$INSTALL_PYTHON`), lowercased.
fn interpreter(word: &str) -> Option<String> {
    let base = base_name(word);
    let bare = base.trim_end_matches(|c: char| c.is_ascii_digit() || c == '.' || c == '-');
    if bare.contains("python") {
        return Some("python".to_owned());
    }
    INTERPRETERS.contains(&bare).then(|| bare.to_owned())
}

/// The last component of a word, lowercased.
fn base_name(word: &str) -> String {
    word.rsplit('/').next().unwrap_or(word).to_ascii_lowercase()
}

/// A value that names a path: it holds a `/`.
fn path_value(value: &str) -> Option<&str> {
    (value.contains('/') && is_name(value)).then_some(value)
}

/// A word that can be a file's name: no URL, variable or placeholder, and
/// not a number (a descriptor in `2>/dev/null`).
fn is_name(word: &str) -> bool {
    !word.contains("://") && !word.contains(['$', '%']) && !word.bytes().all(|b| b.is_ascii_digit())
}

fn is_identifier(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The top-level package of a dotted module name, if it is one.
fn python_package(module: &str) -> Option<&str> {
    let package = module.split('.').next()?;
    is_identifier(package).then_some(package)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every file `command` names, scripts first.
    fn paths(command: &str) -> Vec<&str> {
        let names = command_names(command);
        let mut all = names.scripts;
        all.extend(names.sourced);
        all.extend(names.paths);
        all
    }

    fn modules(command: &str) -> Vec<&str> {
        command_names(command).modules
    }

    #[test]
    fn programs_scripts_and_option_paths_are_names() {
        assert_eq!(
            paths("./tools/lint.sh --fast && exit 0"),
            ["./tools/lint.sh"]
        );
        assert_eq!(paths("python3 -u clean.py %f"), ["clean.py"]);
        assert_eq!(
            paths("/usr/bin/env python3.12 tools/x.py --all"),
            ["tools/x.py"]
        );
        assert_eq!(paths("bash -c './tools/y.sh --fast'"), ["./tools/y.sh"]);
        assert_eq!(paths("!sh scripts/test.sh"), ["scripts/test.sh"]);
        assert_eq!(paths("bash -eu run.sh"), ["run.sh"]);
        assert_eq!(
            paths("HOOK=./bin/x exec lint --config=conf/lint.toml 2>/dev/null"),
            ["./bin/x", "conf/lint.toml"]
        );
        assert_eq!(
            paths("if [ -x hooks/a ]; then node hooks/a.js; fi"),
            ["hooks/a.js"]
        );
    }

    #[test]
    fn what_a_program_takes_as_data_is_not_a_name() {
        for command in [
            "black src/ tests/",
            "!/usr/bin/gh auth git-credential",
            "!npm test",
            "!cd src && make",
            "git-lfs clean -- %f",
            "open https://example.org/x ${HOME}/y",
            "python3 -c 'import tool' tools/z",
            "sh -c \"$HOOK\"",
        ] {
            let names = command_names(command);
            assert!(
                paths(command).iter().all(|p| p.starts_with('/')) && names.modules.is_empty(),
                "{command}: {names:?}"
            );
        }
    }

    #[test]
    fn scripts_sourced_files_and_option_paths_are_told_apart() {
        let names = command_names(
            "python3 scripts/clean.py --config=conf/x.toml && . ./tools/helpers.sh; \
             source lib/common.sh x && . env.sh && exec ./bin/run",
        );
        assert_eq!(names.scripts, ["scripts/clean.py", "./bin/run"]);
        assert_eq!(
            names.sourced,
            ["./tools/helpers.sh", "lib/common.sh", "env.sh"]
        );
        assert_eq!(names.paths, ["conf/x.toml"]);
        // What is sourced from a variable is not known.
        assert!(command_names(". \"$HOME/.profile\"").sourced.is_empty());
    }

    #[test]
    fn python_modules_are_names() {
        let pre_commit = r#"exec "$INSTALL_PYTHON" -mpre_commit hook-impl --config=.pre-commit-config.yaml --hook-dir "$HERE" -- "$@""#;
        assert_eq!(modules(pre_commit), ["pre_commit"]);
        assert!(paths(pre_commit).is_empty());
        assert_eq!(modules("python3 -m nbstripout.cli x.py"), ["nbstripout"]);
        assert_eq!(modules("python -Em tool"), ["tool"]);
        assert_eq!(modules("python -m 9no"), Vec::<&str>::new());
        // `-m` means something else to other programs.
        assert_eq!(modules("git commit -m wip"), Vec::<&str>::new());
    }
}
