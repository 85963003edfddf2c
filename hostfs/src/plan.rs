//! Confined path authority: `ConfinedPathPlan`s and the component-wise
//! creation of Lazaret-owned directories.
//!
//! A plan retains an ancestor directory descriptor and a normalized relative
//! suffix; consumers reopen beneath the ancestor with `openat2(2)` and
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS |
//! RESOLVE_NO_XDEV`, then revalidate type and identity. The canonical pathname
//! a plan carries is a label for messages and digests, never reopened.
//!
//! Trust: the invoking user's ambient ancestors (`/`, `/home`, ...) are
//! resolved once to their canonical form; everything at or beneath a
//! Lazaret-owned root must be a real directory owned by the invoking user
//! with mode `0700`.

use std::ffi::OsStr;
use std::fmt;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags, Stat, StatxFlags};

use crate::beneath::open_beneath;

/// The filesystem identity of an opened object: device, inode and mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ObjectIdentity {
    /// `st_dev`.
    pub device: u64,
    /// `st_ino`.
    pub inode: u64,
    /// The mount ID from `statx(2)` `STATX_MNT_ID`.
    pub mount_id: u64,
}

/// Why a confined open or creation failed.
#[derive(Debug, thiserror::Error)]
pub enum ConfinedError {
    /// The path does not exist.
    #[error("{label} does not exist")]
    Missing {
        /// The canonical pathname.
        label: String,
    },
    /// A component is a symbolic link, which a confined path never follows.
    #[error("{label} is or passes through a symbolic link; use the real path")]
    Symlink {
        /// The canonical pathname.
        label: String,
    },
    /// A component is the root of another mount.
    #[error("{label} crosses a mount point; use a path on the same filesystem as its parent")]
    MountCrossing {
        /// The canonical pathname.
        label: String,
    },
    /// The object has the wrong type.
    #[error("{label} is a {found}, not a {expected}")]
    WrongType {
        /// The canonical pathname.
        label: String,
        /// What it is.
        found: &'static str,
        /// What it had to be.
        expected: &'static str,
    },
    /// A Lazaret-owned directory is owned by someone else.
    #[error(
        "{label} is owned by uid {owner}, not by you (uid {uid}); Lazaret directories must be yours"
    )]
    NotOwned {
        /// The canonical pathname.
        label: String,
        /// Its owner.
        owner: u32,
        /// The invoking user.
        uid: u32,
    },
    /// A Lazaret-owned directory does not have mode `0700`.
    #[error(
        "{label} has mode {mode:04o}; Lazaret directories must have mode 0700 (chmod 700 {label})"
    )]
    Mode {
        /// The canonical pathname.
        label: String,
        /// Its permission bits.
        mode: u32,
    },
    /// The object changed between two opens.
    #[error("{label} was replaced while Lazaret was checking it; run the command again")]
    Replaced {
        /// The canonical pathname.
        label: String,
    },
    /// A path is not absolute or not normalized.
    #[error("{label} is not an absolute normalized path")]
    NotNormalized {
        /// The pathname.
        label: String,
    },
    /// Any other system call failure.
    #[error("cannot {operation} {label}")]
    Io {
        /// What was attempted.
        operation: &'static str,
        /// The canonical pathname.
        label: String,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },
}

/// The display form of a pathname.
pub fn label(path: &Path) -> String {
    path.display().to_string()
}

/// Resolves `path` once to its canonical form (`realpath(3)`).
pub fn canonicalize(path: &Path) -> Result<PathBuf, ConfinedError> {
    std::fs::canonicalize(path).map_err(|source| {
        if source.kind() == io::ErrorKind::NotFound {
            ConfinedError::Missing { label: label(path) }
        } else {
            ConfinedError::Io {
                operation: "resolve",
                label: label(path),
                source,
            }
        }
    })
}

fn io_error(operation: &'static str, path: &Path, errno: rustix::io::Errno) -> ConfinedError {
    let label = label(path);
    match errno {
        rustix::io::Errno::NOENT => ConfinedError::Missing { label },
        rustix::io::Errno::LOOP => ConfinedError::Symlink { label },
        rustix::io::Errno::XDEV => ConfinedError::MountCrossing { label },
        errno => ConfinedError::Io {
            operation,
            label,
            source: errno.into(),
        },
    }
}

/// A human name for a file type.
pub fn type_name(file_type: FileType) -> &'static str {
    match file_type {
        FileType::RegularFile => "regular file",
        FileType::Directory => "directory",
        FileType::Symlink => "symbolic link",
        FileType::Fifo => "FIFO",
        FileType::Socket => "socket",
        FileType::CharacterDevice => "character device",
        FileType::BlockDevice => "block device",
        FileType::Unknown => "special file",
    }
}

/// `fstat(2)` on a descriptor.
pub fn stat(fd: BorrowedFd<'_>, path: &Path) -> Result<Stat, ConfinedError> {
    rustix::fs::fstat(fd).map_err(|e| io_error("stat", path, e))
}

/// The identity of an open descriptor: `statx(2)` with `AT_EMPTY_PATH`.
pub fn identity(fd: BorrowedFd<'_>, path: &Path) -> Result<ObjectIdentity, ConfinedError> {
    let statx = rustix::fs::statx(
        fd,
        "",
        AtFlags::EMPTY_PATH,
        StatxFlags::BASIC_STATS | StatxFlags::MNT_ID,
    )
    .map_err(|e| io_error("stat", path, e))?;
    Ok(ObjectIdentity {
        device: rustix::fs::makedev(statx.stx_dev_major, statx.stx_dev_minor),
        inode: statx.stx_ino,
        mount_id: statx.stx_mnt_id,
    })
}

/// Checks that `path` is absolute and lexically normalized (no `.`, `..`,
/// repeated or trailing separators).
fn normalized_components(path: &Path) -> Result<Vec<&OsStr>, ConfinedError> {
    let not_normalized = || ConfinedError::NotNormalized { label: label(path) };
    let bytes = path.as_os_str().as_bytes();
    if !bytes.starts_with(b"/") || (bytes.len() > 1 && bytes.ends_with(b"/")) {
        return Err(not_normalized());
    }
    if bytes.windows(2).any(|w| w == b"//") {
        return Err(not_normalized());
    }
    let mut out = Vec::new();
    for component in path.components() {
        match component {
            Component::RootDir => {}
            Component::Normal(name) => out.push(name),
            _ => return Err(not_normalized()),
        }
    }
    Ok(out)
}

/// Opens the canonical directory `path` from `/`, refusing any symbolic
/// link on the way (mount crossings are allowed: ambient ancestors such as
/// `/run/user/UID` are mount points).
fn open_ambient_dir(path: &Path) -> Result<OwnedFd, ConfinedError> {
    normalized_components(path)?;
    rustix::fs::openat2(
        rustix::fs::CWD,
        path,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|e| io_error("open", path, e))
}

/// Resolves the longest existing prefix of `path` to its canonical form
/// once, and returns it with the components that do not exist yet.
fn canonical_existing_prefix(path: &Path) -> Result<(PathBuf, Vec<PathBuf>), ConfinedError> {
    let components = normalized_components(path)?;
    for existing in (0..=components.len()).rev() {
        let prefix: PathBuf = std::iter::once(OsStr::new("/"))
            .chain(components[..existing].iter().copied())
            .collect();
        match std::fs::canonicalize(&prefix) {
            Ok(canonical) => {
                let missing = components[existing..].iter().map(PathBuf::from).collect();
                return Ok((canonical, missing));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(ConfinedError::Io {
                    operation: "resolve",
                    label: label(&prefix),
                    source,
                });
            }
        }
    }
    unreachable!("`/` always exists")
}

/// A retained ancestor directory and a normalized relative suffix beneath
/// it: the only way the loader's consumers reach a configured object.
pub struct ConfinedPathPlan {
    retained_ancestor: OwnedFd,
    relative_suffix: PathBuf,
    canonical_label: PathBuf,
}

impl fmt::Debug for ConfinedPathPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConfinedPathPlan")
            .field("relative_suffix", &self.relative_suffix)
            .field("canonical_label", &self.canonical_label)
            .finish_non_exhaustive()
    }
}

impl ConfinedPathPlan {
    /// A plan for `canonical`, whose parent directory is retained. The path
    /// must already be canonical: every component of the parent is checked
    /// not to be a symbolic link.
    pub fn for_canonical(canonical: &Path) -> Result<Self, ConfinedError> {
        let components = normalized_components(canonical)?;
        let Some(name) = components.last() else {
            return Err(ConfinedError::NotNormalized {
                label: label(canonical),
            });
        };
        let parent = canonical.parent().unwrap_or(Path::new("/"));
        let retained_ancestor = open_ambient_dir(parent)?;
        Ok(Self {
            retained_ancestor,
            relative_suffix: PathBuf::from(name),
            canonical_label: canonical.to_path_buf(),
        })
    }

    /// A plan for `suffix` beneath an already retained directory.
    pub fn beneath(dir: &RetainedDir, suffix: &Path) -> Result<Self, ConfinedError> {
        let joined = dir.label.join(suffix);
        normalized_components(&joined)?;
        Ok(Self {
            retained_ancestor: dir.fd.try_clone().map_err(|source| ConfinedError::Io {
                operation: "duplicate descriptor of",
                label: label(&dir.label),
                source,
            })?,
            relative_suffix: suffix.to_path_buf(),
            canonical_label: joined,
        })
    }

    /// Opens the planned object beneath the retained ancestor with `flags`
    /// (never following a symbolic link or crossing a mount).
    pub fn open(&self, flags: OFlags) -> Result<OwnedFd, ConfinedError> {
        open_beneath(
            self.retained_ancestor.as_fd(),
            &self.relative_suffix,
            flags,
            Mode::empty(),
        )
        .map_err(|e| io_error("open", &self.canonical_label, e))
    }

    /// Opens the object as `O_PATH` and checks that its type is `expected`.
    pub fn open_as(&self, expected: FileType) -> Result<Opened, ConfinedError> {
        let fd = self.open(OFlags::PATH)?;
        let stat = stat(fd.as_fd(), &self.canonical_label)?;
        let found = FileType::from_raw_mode(stat.st_mode);
        if found != expected {
            return Err(ConfinedError::WrongType {
                label: self.label(),
                found: type_name(found),
                expected: type_name(expected),
            });
        }
        let identity = identity(fd.as_fd(), &self.canonical_label)?;
        Ok(Opened { fd, stat, identity })
    }

    /// The canonical pathname: for messages and digests only.
    pub fn canonical_label(&self) -> &Path {
        &self.canonical_label
    }

    /// Another plan to the same object, retaining the same ancestor.
    pub fn try_clone(&self) -> io::Result<Self> {
        Ok(Self {
            retained_ancestor: self.retained_ancestor.try_clone()?,
            relative_suffix: self.relative_suffix.clone(),
            canonical_label: self.canonical_label.clone(),
        })
    }

    fn label(&self) -> String {
        label(&self.canonical_label)
    }
}

/// An object opened through a plan: an `O_PATH` descriptor, its `fstat` and
/// its identity.
#[derive(Debug)]
pub struct Opened {
    /// The `O_PATH` descriptor.
    pub fd: OwnedFd,
    /// What `fstat(2)` said when it was opened.
    pub stat: Stat,
    /// Its device, inode and mount.
    pub identity: ObjectIdentity,
}

/// A Lazaret-owned directory: retained descriptor, identity and canonical
/// label.
#[derive(Debug)]
pub struct RetainedDir {
    fd: OwnedFd,
    identity: ObjectIdentity,
    label: PathBuf,
}

impl RetainedDir {
    /// The canonical pathname: for messages and digests only.
    pub fn label(&self) -> &Path {
        &self.label
    }

    /// The directory's identity.
    pub fn identity(&self) -> ObjectIdentity {
        self.identity
    }

    /// The retained `O_PATH` descriptor.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Opens (creating where missing) the Lazaret-owned directory `suffix`
    /// beneath this one, one component at a time.
    pub fn ensure_child(&self, suffix: &Path, uid: u32) -> Result<RetainedDir, ConfinedError> {
        let mut current = RetainedDir {
            fd: self.fd.try_clone().map_err(|source| ConfinedError::Io {
                operation: "duplicate descriptor of",
                label: label(&self.label),
                source,
            })?,
            identity: self.identity,
            label: self.label.clone(),
        };
        for component in normalized_components(&Path::new("/").join(suffix))? {
            current = current.ensure_component(component, uid)?;
        }
        Ok(current)
    }

    /// Opens, or creates with mode `0700`, one owned child directory and
    /// checks ownership and mode.
    fn ensure_component(&self, name: &OsStr, uid: u32) -> Result<RetainedDir, ConfinedError> {
        let child = self.label.join(name);
        match rustix::fs::mkdirat(&self.fd, name, Mode::RWXU) {
            Ok(()) => {
                // A restrictive umask may have removed bits; the mode must
                // be exactly 0700. The check below proves the result.
                open_beneath(
                    self.fd.as_fd(),
                    name,
                    OFlags::RDONLY | OFlags::DIRECTORY,
                    Mode::empty(),
                )
                .and_then(|dir| rustix::fs::fchmod(&dir, Mode::RWXU))
                .map_err(|e| io_error("set the mode of", &child, e))?;
            }
            Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(io_error("create", &child, e)),
        }
        let fd = self.open_child_dir(name, &child)?;
        RetainedDir::validate_owned(fd, child, uid)
    }

    fn open_child_dir(&self, name: &OsStr, child: &Path) -> Result<OwnedFd, ConfinedError> {
        let fd = open_beneath(self.fd.as_fd(), name, OFlags::PATH, Mode::empty())
            .map_err(|e| io_error("open", child, e))?;
        let found = FileType::from_raw_mode(stat(fd.as_fd(), child)?.st_mode);
        match found {
            FileType::Directory => Ok(fd),
            FileType::Symlink => Err(ConfinedError::Symlink {
                label: label(child),
            }),
            found => Err(ConfinedError::WrongType {
                label: label(child),
                found: type_name(found),
                expected: "directory",
            }),
        }
    }

    /// Checks an opened directory is owned by `uid` with mode `0700`.
    fn validate_owned(fd: OwnedFd, path: PathBuf, uid: u32) -> Result<RetainedDir, ConfinedError> {
        let stat = stat(fd.as_fd(), &path)?;
        if stat.st_uid != uid {
            return Err(ConfinedError::NotOwned {
                label: label(&path),
                owner: stat.st_uid,
                uid,
            });
        }
        let mode = stat.st_mode & 0o7777;
        if mode != 0o700 {
            return Err(ConfinedError::Mode {
                label: label(&path),
                mode,
            });
        }
        let identity = identity(fd.as_fd(), &path)?;
        Ok(RetainedDir {
            fd,
            identity,
            label: path,
        })
    }

    /// Opens the existing directory `suffix` beneath this one (never
    /// following a symbolic link or crossing a mount) and retains it.
    /// Unlike [`RetainedDir::ensure_child`] it creates nothing and does not
    /// require mode `0700`: an unpacked image's root filesystem keeps the
    /// image's modes inside a Lazaret-owned parent.
    pub fn open_child(&self, suffix: &Path) -> Result<RetainedDir, ConfinedError> {
        let label = self.label.join(suffix);
        normalized_components(&label)?;
        let fd = open_beneath(
            self.fd.as_fd(),
            suffix,
            OFlags::PATH | OFlags::DIRECTORY,
            Mode::empty(),
        )
        .map_err(|e| io_error("open", &label, e))?;
        let identity = identity(fd.as_fd(), &label)?;
        Ok(RetainedDir {
            fd,
            identity,
            label,
        })
    }

    /// Opens an existing directory that Lazaret does not own (the
    /// workspace), retaining it as its own plan ancestor.
    pub fn open_ambient(path: &Path) -> Result<RetainedDir, ConfinedError> {
        let canonical = canonicalize(path)?;
        let fd = open_ambient_dir(&canonical)?;
        let identity = identity(fd.as_fd(), &canonical)?;
        Ok(RetainedDir {
            fd,
            identity,
            label: canonical,
        })
    }

    /// Checks that the canonical label still names the retained directory:
    /// neither replaced nor moved across a mount.
    pub fn revalidate(&self) -> Result<(), ConfinedError> {
        let again = open_ambient_dir(&self.label)?;
        if identity(again.as_fd(), &self.label)? != self.identity {
            return Err(ConfinedError::Replaced {
                label: label(&self.label),
            });
        }
        Ok(())
    }
}

/// Opens or creates a Lazaret-owned root at `path` (absolute, normalized).
///
/// The longest existing prefix of the root's parent is the ambient ancestor:
/// it is resolved once to its canonical form and reopened without following
/// symbolic links. The root and every component created beneath the ambient
/// ancestor are Lazaret-owned: real directories (never symbolic links or
/// mount points), owned by `uid`, mode `0700`. Missing components are
/// created one at a time.
pub fn ensure_root(path: &Path, uid: u32) -> Result<RetainedDir, ConfinedError> {
    let components = normalized_components(path)?;
    let Some(name) = components.last() else {
        return Err(ConfinedError::NotNormalized { label: label(path) });
    };
    let parent = path.parent().unwrap_or(Path::new("/"));
    let (existing, missing) = canonical_existing_prefix(parent)?;
    let fd = open_ambient_dir(&existing)?;
    let identity = identity(fd.as_fd(), &existing)?;
    let ambient = RetainedDir {
        fd,
        identity,
        label: existing,
    };
    let suffix: PathBuf = missing
        .iter()
        .map(PathBuf::as_path)
        .chain([Path::new(name)])
        .collect();
    ambient.ensure_child(&suffix, uid)
}

/// The canonical path `path` will have once its missing components exist:
/// its longest existing prefix resolved once, followed by the rest.
pub fn planned_canonical(path: &Path) -> Result<PathBuf, ConfinedError> {
    let (existing, missing) = canonical_existing_prefix(path)?;
    Ok(missing.iter().fold(existing, |acc, name| acc.join(name)))
}

/// Whether one of two canonical paths is the other or lies beneath it,
/// comparing whole components.
pub fn overlaps(a: &Path, b: &Path) -> bool {
    a.starts_with(b) || b.starts_with(a)
}
