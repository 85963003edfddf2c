//! The host programs Lazaret runs — `runsc`, `slirp4netns`, `skopeo` and
//! its own role binaries — and how they are found and started.
//!
//! Each is found at a fixed path, never through `PATH` (a workspace's
//! `.venv/bin` on the developer's `PATH` would let the sandbox plant one),
//! and trusted only when no one but root and the invoking user can replace
//! it: the file and every directory above it owned by root or the user and
//! not writable by group or others (a sticky directory such as `/tmp`
//! excepted, whose entries only their owners may replace), the file
//! executable by the user. A program beneath the workspace or a volume,
//! which the sandbox can write, is refused at `up`. Each starts with a
//! cleared environment plus the variables its allow-list names. Trusts the
//! kernel's answers about the files, nothing else.

use std::path::{Path, PathBuf};
use std::process::Command;

use rustix::fs::{Access, AtFlags, CWD, FileType, Mode};
use rustix::io::Errno;

/// Where a package puts each host program, in the order tried.
const RUNSC: &[&str] = &["/usr/local/bin/runsc", "/usr/bin/runsc"];
const SLIRP4NETNS: &[&str] = &["/usr/local/bin/slirp4netns", "/usr/bin/slirp4netns"];
const SKOPEO: &[&str] = &["/usr/local/bin/skopeo", "/usr/bin/skopeo"];

/// The proxy settings a host program is given when the coordinator has
/// them.
pub const PROXY_ENVIRONMENT: &[&str] = &[
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
];

/// What skopeo may see of the coordinator's environment: where its
/// registry credentials and configuration are, temporary space, and the
/// proxies of [`PROXY_ENVIRONMENT`].
pub const SKOPEO_ENVIRONMENT: &[&str] = &[
    "HOME",
    "XDG_RUNTIME_DIR",
    "XDG_CONFIG_HOME",
    "TMPDIR",
    "REGISTRY_AUTH_FILE",
    "CONTAINERS_REGISTRIES_CONF",
];

/// What the Host Coordinator may see of the CLI's environment besides
/// [`SKOPEO_ENVIRONMENT`] (which it passes on), the variables the
/// profile's `env:` references name and Lazaret's own `LAZARET_*`
/// settings: its data directory and git's configuration (the workspace
/// rules read it).
pub const COORDINATOR_ENVIRONMENT: &[&str] = &[
    "XDG_DATA_HOME",
    "GIT_CONFIG_GLOBAL",
    "GIT_CONFIG_SYSTEM",
    "GIT_CONFIG_NOSYSTEM",
    // Where the invoking user's trust store is, for the Credential Proxy
    // to verify the real credential hosts against.
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
];

/// The prefix of Lazaret's own settings, passed to the coordinator.
const LAZARET_SETTINGS: &str = "LAZARET_";

/// The gVisor runtime.
pub fn runsc() -> Result<PathBuf, ProgramError> {
    host_program(RUNSC, "runsc (gVisor)", "runsc")
}

/// The user-mode network stack between the sandbox and the host.
pub fn slirp4netns() -> Result<PathBuf, ProgramError> {
    host_program(SLIRP4NETNS, "slirp4netns", "slirp4netns")
}

/// The registry client, or `None` when it is not installed; an error when
/// it is there but not trusted.
pub fn skopeo() -> Result<Option<PathBuf>, ProgramError> {
    match SKOPEO.iter().find(|p| exists(Path::new(p))) {
        Some(path) => trusted(Path::new(path)).map(Some),
        None => Ok(None),
    }
}

/// Why a host program cannot be run.
#[derive(Debug, thiserror::Error)]
pub enum ProgramError {
    /// None of its fixed paths holds it.
    #[error("{program} is not installed; install it with `apt-get install {package}`")]
    Missing {
        /// The program, as the user knows it.
        program: &'static str,
        /// The package that installs it.
        package: &'static str,
    },
    /// This executable's own path is unknown.
    #[error("cannot locate this executable")]
    CurrentExe(#[source] std::io::Error),
    /// A role binary is neither beside this executable nor installed.
    #[error("{name} is not installed beside {}", exe.display())]
    RoleMissing {
        /// The role binary's name.
        name: String,
        /// This executable.
        exe: PathBuf,
    },
    /// Its path could not be resolved.
    #[error("cannot resolve {}", path.display())]
    Resolve {
        /// The path as found.
        path: PathBuf,
        /// Why not.
        #[source]
        source: std::io::Error,
    },
    /// It or a directory above it could not be examined.
    #[error("cannot stat {}", path.display())]
    Stat {
        /// The file or directory.
        path: PathBuf,
        /// Why not.
        #[source]
        source: Errno,
    },
    /// It is not a regular file.
    #[error("{} is not a regular file", path.display())]
    NotRegular {
        /// Its canonical path.
        path: PathBuf,
    },
    /// Someone else could replace it.
    #[error(transparent)]
    Replaceable(#[from] Replaceable),
    /// The user may not execute it.
    #[error("{} is not executable by you", path.display())]
    NotExecutable {
        /// Its canonical path.
        path: PathBuf,
    },
    /// A directory above it could be replaced by someone else.
    #[error("{} is not trusted, since another user could replace it", program.display())]
    Ancestor {
        /// The program's canonical path.
        program: PathBuf,
        /// What is wrong with the directory.
        #[source]
        source: Replaceable,
    },
    /// It lies where the sandbox can write.
    #[error(
        "{} is beneath {}, which the sandbox can write; Lazaret will not run a program \
         the sandbox could replace: install Lazaret and its helpers outside the workspace \
         and the volumes",
        program.display(),
        root.display()
    )]
    Beneath {
        /// The program's path.
        program: PathBuf,
        /// The tree the sandbox can write.
        root: PathBuf,
    },
}

/// Why a file or directory could be replaced by someone but root and the
/// invoking user.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Replaceable {
    /// Another user owns it.
    #[error(
        "{} is owned by uid {owner}; Lazaret runs only programs that you (uid {uid}) or \
         root own, in directories you or root own",
        path.display()
    )]
    Owner {
        /// The file or directory.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// The invoking user.
        uid: u32,
    },
    /// Its group or others may write it.
    #[error(
        "{} is writable by its group or others (mode {mode:04o}); run `chmod go-w {}`",
        path.display(),
        path.display()
    )]
    Writable {
        /// The file or directory.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
}

/// The first of `candidates` that exists, once [`trusted`]; `program` and
/// `package` say how to install it when none does.
fn host_program(
    candidates: &[&str],
    program: &'static str,
    package: &'static str,
) -> Result<PathBuf, ProgramError> {
    let found = candidates
        .iter()
        .map(Path::new)
        .find(|p| exists(p))
        .ok_or(ProgramError::Missing { program, package })?;
    trusted(found)
}

/// The executable of a sibling role binary: beside this one, or in the
/// installed libexec directory, once [`trusted`].
pub fn role_binary(name: &str) -> Result<PathBuf, ProgramError> {
    let exe = std::env::current_exe().map_err(ProgramError::CurrentExe)?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    let candidates = [dir.join(name), dir.join("../libexec/lazaret").join(name)];
    let Some(found) = candidates.iter().find(|p| p.is_file()) else {
        return Err(ProgramError::RoleMissing {
            name: name.to_owned(),
            exe,
        });
    };
    trusted(found)
}

fn exists(path: &Path) -> bool {
    rustix::fs::lstat(path).is_ok()
}

/// `path`, resolved, when no one but root and the invoking user can
/// replace what it names: the file and every directory above it owned by
/// one of them and not writable by group or others (a sticky directory
/// excepted), the file a regular file the user may execute.
pub fn trusted(path: &Path) -> Result<PathBuf, ProgramError> {
    let uid = rustix::process::getuid().as_raw();
    let canonical = std::fs::canonicalize(path).map_err(|source| ProgramError::Resolve {
        path: path.to_path_buf(),
        source,
    })?;
    let stat_of = |path: &Path| {
        rustix::fs::stat(path).map_err(|source| ProgramError::Stat {
            path: path.to_path_buf(),
            source,
        })
    };
    let stat = stat_of(&canonical)?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
        return Err(ProgramError::NotRegular { path: canonical });
    }
    check_owner_and_mode(&canonical, &stat, uid)?;
    if rustix::fs::accessat(CWD, &canonical, Access::EXEC_OK, AtFlags::EACCESS).is_err() {
        return Err(ProgramError::NotExecutable { path: canonical });
    }
    for dir in canonical.ancestors().skip(1) {
        let stat = stat_of(dir)?;
        let sticky = Mode::from_raw_mode(stat.st_mode).contains(Mode::SVTX);
        if !sticky {
            check_owner_and_mode(dir, &stat, uid).map_err(|source| ProgramError::Ancestor {
                program: canonical.clone(),
                source,
            })?;
        }
    }
    Ok(canonical)
}

fn check_owner_and_mode(path: &Path, stat: &rustix::fs::Stat, uid: u32) -> Result<(), Replaceable> {
    if stat.st_uid != 0 && stat.st_uid != uid {
        return Err(Replaceable::Owner {
            path: path.to_path_buf(),
            owner: stat.st_uid,
            uid,
        });
    }
    let mode = stat.st_mode & 0o7777;
    if mode & 0o022 != 0 {
        return Err(Replaceable::Writable {
            path: path.to_path_buf(),
            mode,
        });
    }
    Ok(())
}

/// Refuses `program` when it lies beneath one of `writable` (the
/// workspace, the volumes' sources): the sandbox could replace it.
pub fn outside(program: &Path, writable: &[&Path]) -> Result<(), ProgramError> {
    match writable.iter().find(|root| program.starts_with(root)) {
        None => Ok(()),
        Some(root) => Err(ProgramError::Beneath {
            program: program.to_path_buf(),
            root: root.to_path_buf(),
        }),
    }
}

/// A command for `program` with a cleared environment plus those of
/// `allowed` that are set here.
pub fn command(program: &Path, allowed: &[&str]) -> Command {
    let mut command = Command::new(program);
    command.env_clear();
    for name in allowed {
        if let Some(value) = std::env::var_os(name) {
            command.env(name, value);
        }
    }
    command
}

/// [`command`] for a program that reaches the network (skopeo, and the
/// coordinator, which passes them on): `allowed` and the proxies of
/// [`PROXY_ENVIRONMENT`].
pub fn networked_command(program: &Path, allowed: &[&str]) -> Command {
    let mut command = command(program, allowed);
    for name in PROXY_ENVIRONMENT {
        if let Some(value) = std::env::var_os(name) {
            command.env(name, value);
        }
    }
    command
}

/// A command for the Host Coordinator at `program`: a cleared environment
/// plus [`COORDINATOR_ENVIRONMENT`], [`SKOPEO_ENVIRONMENT`], the proxies, every
/// `LAZARET_*` setting, and the variables in `referenced` (the host names
/// of the profile's `env:` references), those that are set here.
pub fn coordinator_command(program: &Path, referenced: &[String]) -> Command {
    let mut command = networked_command(program, SKOPEO_ENVIRONMENT);
    for (name, value) in std::env::vars_os() {
        let passed = name.to_str().is_some_and(|n| {
            n.starts_with(LAZARET_SETTINGS)
                || COORDINATOR_ENVIRONMENT.contains(&n)
                || referenced.iter().any(|r| r == n)
        });
        if passed {
            command.env(name, value);
        }
    }
    command
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;

    use super::{ProgramError, Replaceable, outside, trusted};

    /// Why `path` is not trusted, as the user reads it.
    fn refusal(path: &Path) -> String {
        lazaret_proto::error_chain(&trusted(path).unwrap_err())
    }

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn only_programs_no_one_else_can_replace_are_trusted() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path().join("bin");
        std::fs::create_dir(&dir).unwrap();
        chmod(&dir, 0o755);
        let program = dir.join("helper");
        std::fs::write(&program, "#!/bin/sh\n").unwrap();
        chmod(&program, 0o755);
        let canonical = std::fs::canonicalize(&program).unwrap();
        assert_eq!(trusted(&program).ok(), Some(canonical.clone()));
        // Through a link, the file it names is checked and returned.
        let link = scratch.path().join("link");
        std::os::unix::fs::symlink(&program, &link).unwrap();
        assert_eq!(trusted(&link).ok(), Some(canonical));

        chmod(&program, 0o775);
        assert!(refusal(&program).contains("chmod go-w"));
        chmod(&program, 0o644);
        assert!(refusal(&program).contains("not executable"));
        chmod(&program, 0o755);

        // A directory above it that others may write, unless sticky.
        chmod(&dir, 0o777);
        let refused = refusal(&program);
        assert!(
            refused.contains("another user could replace it"),
            "{refused}"
        );
        chmod(&dir, 0o1777);
        assert!(trusted(&program).is_ok());
        chmod(&dir, 0o755);

        if rustix::process::geteuid().is_root() {
            let other = Some(12_345);
            std::os::unix::fs::chown(&program, other, None).unwrap();
            assert!(refusal(&program).contains("owned by uid 12345"));
            std::os::unix::fs::chown(&program, Some(0), None).unwrap();
            std::os::unix::fs::chown(&dir, other, None).unwrap();
            assert!(refusal(&program).contains("owned by uid 12345"));
        }
        assert!(trusted(&dir.join("missing")).is_err());
        assert!(refusal(&dir).contains("not a regular file"));
    }

    #[test]
    fn programs_the_sandbox_can_write_are_refused() {
        let program = Path::new("/home/dev/project/target/release/lazaret-supervisor");
        for root in ["/home/dev/project", "/home/dev/project/target", "/"] {
            let refused = outside(program, &[Path::new("/srv/volume"), Path::new(root)]);
            assert!(
                refused
                    .unwrap_err()
                    .to_string()
                    .contains("the sandbox can write"),
                "{root}"
            );
        }
        for root in ["/home/dev/proj", "/home/dev/project/src", "/srv"] {
            assert!(outside(program, &[Path::new(root)]).is_ok(), "{root}");
        }
    }

    #[test]
    fn each_refusal_names_the_step_and_the_path() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path().join("bin");
        std::fs::create_dir(&dir).unwrap();
        chmod(&dir, 0o755);
        let program = dir.join("helper");
        std::fs::write(&program, "#!/bin/sh\n").unwrap();
        chmod(&program, 0o755);
        let canonical = std::fs::canonicalize(&program).unwrap();

        let missing = dir.join("missing");
        match trusted(&missing) {
            Err(ProgramError::Resolve { path, source }) => {
                assert_eq!(path, missing);
                assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
            }
            other => panic!("{other:?}"),
        }
        chmod(&program, 0o757);
        match trusted(&program) {
            Err(ProgramError::Replaceable(Replaceable::Writable { path, mode })) => {
                assert_eq!((path, mode), (canonical.clone(), 0o757));
            }
            other => panic!("{other:?}"),
        }
        chmod(&program, 0o644);
        assert!(matches!(
            trusted(&program),
            Err(ProgramError::NotExecutable { path }) if path == canonical
        ));
        chmod(&program, 0o755);
        chmod(&dir, 0o775);
        match trusted(&program) {
            Err(ProgramError::Ancestor {
                program: named,
                source: Replaceable::Writable { path, mode },
            }) => {
                assert_eq!(named, canonical);
                assert_eq!(path, std::fs::canonicalize(&dir).unwrap());
                assert_eq!(mode, 0o775);
            }
            other => panic!("{other:?}"),
        }
        // The sentence carries the directory's fix after the program's.
        let said = refusal(&program);
        assert!(
            said.contains(&format!("chmod go-w {}", dir.display())),
            "{said}"
        );
    }

    #[test]
    fn a_program_beneath_a_writable_tree_names_both() {
        let program = Path::new("/work/ws/tools/runsc");
        match outside(program, &[Path::new("/srv"), Path::new("/work/ws")]) {
            Err(ProgramError::Beneath { program: p, root }) => {
                assert_eq!(p, program);
                assert_eq!(root, Path::new("/work/ws"));
            }
            other => panic!("{other:?}"),
        }
        // A sibling whose name only begins the same is not beneath it.
        assert!(outside(Path::new("/work/wsx/runsc"), &[Path::new("/work/ws")]).is_ok());
    }
}
