//! The sandbox's filesystem, staged in the supervisor's private mount
//! namespace: the root filesystem overlay, the State Anchor overlays, the
//! volume binds, the control area, and the place of the routed workspace
//! (which `workspace` mounts).
//!
//! Owns every mount a generation makes. All of them live in the Domain
//! mount namespace, on a private tmpfs beneath the generation's runtime
//! directory, so the host sees none of them and they vanish with the
//! namespace. Sources arrive as descriptors opened by the Host Coordinator
//! and are reached through `/proc/self/fd/N`, never by a path the
//! supervisor could be tricked into following. Trusts those descriptors and
//! the plan that names them.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use lazaret_proto::config::{VolumeAccess, VolumeKind};
use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::mount::{MountFlags, MountPropagationFlags};

/// The size of the tmpfs holding the root filesystem's ephemeral upper:
/// what the sandbox may write outside its persistent dirs, volumes and
/// workspace, in memory, until `down`.
pub const ROOT_UPPER_SIZE: &str = "1g";
/// The size of the staging tmpfs itself (the bundle, runsc's state, the
/// control area): small files only.
const STAGING_SIZE: &str = "64m";

/// The static `lazaret-init` executable (built from `sandbox-init/init.rs`).
const SANDBOX_INIT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/lazaret-init"));

/// The static `lazaret-escalate` executable (the escalation-client crate).
const ESCALATION_CLIENT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/lazaret-escalate"));

/// The size of the Escalation Mailbox's tmpfs, and its most files: what the
/// sandbox may write there in all, so a flood of records fills the
/// mailbox and never the host's memory.
const MAILBOX_SIZE: &str = "size=32m,nr_inodes=16384";

/// What every `up` writes to the image's `/etc/profile.d`, so that a login
/// shell whose profile sets `PATH` afresh (Debian's does) still finds
/// `lazaret-escalate`.
const PROFILE_SCRIPT: &str = "\
# Written by Lazaret at every `lazaret up`: the control area's programs
# (lazaret-escalate) are on PATH in login shells too.
case \":$PATH:\" in *:/run/lazaret/bin:*) ;; *) PATH=\"$PATH:/run/lazaret/bin\" ;; esac
";

/// Why staging the filesystem failed.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// A mount failed.
    #[error("cannot mount {what} at {target}")]
    Mount {
        /// What was being mounted.
        what: String,
        /// Where.
        target: String,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },
    /// A staging directory or file could not be made.
    #[error("cannot create {path}")]
    Create {
        /// The path.
        path: String,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },
    /// A mount source could not be reopened inside the Domain mount
    /// namespace as the object the coordinator opened.
    #[error("cannot reopen {what} ({path}) inside the Domain mount namespace: {reason}")]
    Reopen {
        /// Which source.
        what: String,
        /// Its path, as far as known.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// A persistent directory is not a directory in the image.
    #[error("{path} in the image is not a directory")]
    NotADirectory {
        /// The sandbox path.
        path: String,
    },
}

/// The `/proc/self/fd/N` path of a descriptor.
fn fd_path(fd: BorrowedFd<'_>) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

/// Opens the directory `path` beneath `at` (a directory this process made
/// on its staging tmpfs, or the Domain's own state) without following a
/// link; `what` names it in errors.
fn open_dir(at: BorrowedFd<'_>, path: &Path, what: &str) -> Result<OwnedFd, MountError> {
    rustix::fs::openat(
        at,
        path,
        OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::RDONLY,
        Mode::empty(),
    )
    .map_err(|e| MountError::Create {
        path: format!("{what} ({})", path.display()),
        source: e.into(),
    })
}

fn create_dir(path: &Path) -> Result<(), MountError> {
    std::fs::create_dir_all(path).map_err(|source| MountError::Create {
        path: path.display().to_string(),
        source,
    })
}

/// Mounts a filesystem of type `fstype` (its source named the same) at
/// `target`; `what` says what it is for, in errors.
pub(crate) fn mount(
    what: &str,
    target: &Path,
    fstype: &str,
    flags: MountFlags,
    data: &str,
) -> Result<(), MountError> {
    let failed = |source| MountError::Mount {
        what: what.to_owned(),
        target: target.display().to_string(),
        source,
    };
    let data = std::ffi::CString::new(data)
        .map_err(|_| failed(io::Error::from(io::ErrorKind::InvalidInput)))?;
    rustix::mount::mount(fstype, target, fstype, flags, Some(data.as_c_str()))
        .map_err(|e| failed(e.into()))
}

fn bind(source: BorrowedFd<'_>, target: &Path, what: &str) -> Result<(), MountError> {
    rustix::mount::mount_bind(fd_path(source).as_str(), target).map_err(|e| MountError::Mount {
        what: what.to_owned(),
        target: target.display().to_string(),
        source: e.into(),
    })
}

/// Makes the bind mount at `target` read-only in the Domain mount
/// namespace itself, not only in the sandbox's view, keeping the flags
/// the mount already has (a user namespace may not drop those the host
/// locked, such as `nosuid`).
fn read_only(target: &Path, what: &str) -> Result<(), MountError> {
    let failed = |e: rustix::io::Errno| MountError::Mount {
        what: format!("{what} read-only"),
        target: target.display().to_string(),
        source: e.into(),
    };
    use rustix::fs::StatVfsMountFlags as Vfs;
    let kept = rustix::fs::statvfs(target).map_err(failed)?.f_flag;
    let mut flags = MountFlags::BIND | MountFlags::RDONLY;
    for (vfs, mount) in [
        (Vfs::NOSUID, MountFlags::NOSUID),
        (Vfs::NODEV, MountFlags::NODEV),
        (Vfs::NOEXEC, MountFlags::NOEXEC),
        (Vfs::NOATIME, MountFlags::NOATIME),
        (Vfs::NODIRATIME, MountFlags::NODIRATIME),
        (Vfs::RELATIME, MountFlags::RELATIME),
    ] {
        if kept.contains(vfs) {
            flags |= mount;
        }
    }
    rustix::mount::mount_remount(target, flags, "").map_err(failed)
}

/// One persistent directory to stage.
#[derive(Debug)]
pub struct AnchorSource<'a> {
    /// The sandbox path, e.g. `/root`.
    pub sandbox_path: &'a str,
    /// The Domain-owned directory holding `upper/` and `work/`.
    pub state_dir: BorrowedFd<'a>,
}

/// One volume to stage.
#[derive(Debug)]
pub struct VolumeSource<'a> {
    /// The sandbox path.
    pub sandbox_path: &'a str,
    /// The opened source.
    pub source: BorrowedFd<'a>,
    /// File or directory.
    pub kind: VolumeKind,
    /// Read-only or read-write.
    pub access: VolumeAccess,
}

/// What the bundle needs to know about the staged filesystem.
#[derive(Debug)]
pub struct Staged {
    /// The merged root filesystem.
    pub rootfs: PathBuf,
    /// (sandbox path, staged source) of each persistent directory.
    pub anchors: Vec<(String, PathBuf)>,
    /// Where the workspace is to be mounted.
    pub workspace: PathBuf,
    /// (sandbox path, staged source, access) of each volume.
    pub volumes: Vec<(String, PathBuf, VolumeAccess)>,
    /// The staged control area.
    pub control: PathBuf,
    /// The Escalation Mailbox's tmpfs.
    pub mailbox: PathBuf,
    /// Where the bundle is written.
    pub bundle: PathBuf,
    /// The runsc state directory.
    pub runsc_root: PathBuf,
    /// Whether `/tmp` gets a bounded tmpfs of its own
    /// ([`crate::bundle::TMP_SIZE`]): no persistent dir or volume is
    /// mounted there and the image's `/tmp` is empty or missing. Otherwise
    /// `/tmp` is what is mounted there or part of the root filesystem, and
    /// bounded as that is.
    pub private_tmp: bool,
}

/// The descriptors the filesystem is built from.
#[derive(Debug)]
pub struct Sources<'a> {
    /// The prepared lower's root filesystem.
    pub rootfs: BorrowedFd<'a>,
    /// The persistent directories.
    pub anchors: Vec<AnchorSource<'a>>,
    /// The volumes.
    pub volumes: Vec<VolumeSource<'a>>,
}

/// Reopens a descriptor from the Host Coordinator inside the Domain mount
/// namespace.
///
/// A descriptor opened before `unshare(CLONE_NEWNS)` names a mount of the
/// host namespace, which overlayfs and bind mounts refuse as a source. Its
/// path is resolved again here, without following any symbolic link, and
/// the object found must be the same one (device and inode) the
/// coordinator opened; anything else is refused.
pub fn rebase(fd: BorrowedFd<'_>, what: &str) -> Result<OwnedFd, MountError> {
    let link = fd_path(fd);
    let path = std::fs::read_link(&link).map_err(|e| MountError::Reopen {
        what: what.to_owned(),
        path: link.clone(),
        reason: format!("cannot read its path: {e}"),
    })?;
    let refuse = |reason: String| MountError::Reopen {
        what: what.to_owned(),
        path: path.display().to_string(),
        reason,
    };
    let again = rustix::fs::openat2(
        rustix::fs::CWD,
        &path,
        OFlags::PATH | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
        ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|e| refuse(e.to_string()))?;
    let before = rustix::fs::fstat(fd).map_err(|e| refuse(e.to_string()))?;
    let after = rustix::fs::fstat(&again).map_err(|e| refuse(e.to_string()))?;
    if (before.st_dev, before.st_ino) != (after.st_dev, after.st_ino) {
        return Err(refuse(
            "it was replaced after the coordinator opened it; run `lazaret up` again".into(),
        ));
    }
    Ok(again)
}

/// Opens `sandbox_path` inside the image, resolving its symbolic links as
/// the sandbox would (`RESOLVE_IN_ROOT`); `None` when the image lacks it.
fn image_dir(rootfs: BorrowedFd<'_>, sandbox_path: &str) -> Result<Option<OwnedFd>, MountError> {
    match rustix::fs::openat2(
        rootfs,
        sandbox_path.trim_start_matches('/'),
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS | ResolveFlags::NO_XDEV,
    ) {
        Ok(fd) => Ok(Some(fd)),
        Err(rustix::io::Errno::NOENT) => Ok(None),
        Err(rustix::io::Errno::NOTDIR) => Err(MountError::NotADirectory {
            path: sandbox_path.to_owned(),
        }),
        Err(e) => Err(MountError::Mount {
            what: format!("image directory {sandbox_path}"),
            target: sandbox_path.to_owned(),
            source: e.into(),
        }),
    }
}

/// Whether the image's `/tmp` is empty or missing, as the sandbox would
/// resolve it: only then does a tmpfs there hide nothing of the image.
fn image_tmp_is_empty(rootfs: BorrowedFd<'_>) -> Result<bool, MountError> {
    let failed = |e: rustix::io::Errno| MountError::Mount {
        what: "image directory /tmp".into(),
        target: "/tmp".into(),
        source: e.into(),
    };
    let dir = match rustix::fs::openat2(
        rootfs,
        "tmp",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS | ResolveFlags::NO_XDEV,
    ) {
        Ok(dir) => dir,
        Err(rustix::io::Errno::NOENT) => return Ok(true),
        Err(rustix::io::Errno::NOTDIR) => return Ok(false),
        Err(e) => return Err(failed(e)),
    };
    for entry in rustix::fs::Dir::read_from(&dir).map_err(failed)? {
        let entry = entry.map_err(failed)?;
        if ![&b"."[..], b".."].contains(&entry.file_name().to_bytes()) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Makes every mount of the Domain mount namespace private, so nothing
/// mounted here propagates to the host, and mounts a `/proc` that shows the
/// Domain pid namespace (runsc reads its own processes there). Must run as
/// the Domain pid namespace's init.
pub fn private_proc() -> Result<(), MountError> {
    rustix::mount::mount_change(
        "/",
        MountPropagationFlags::REC | MountPropagationFlags::PRIVATE,
    )
    .map_err(|e| MountError::Mount {
        what: "private propagation".into(),
        target: "/".into(),
        source: e.into(),
    })?;
    mount(
        "the Domain's /proc",
        Path::new("/proc"),
        "proc",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        "",
    )
}

/// Where the image's `/etc/resolv.conf` points, relative to `/etc` (as
/// systemd-resolved's link does): the control area's `resolv.conf`, which
/// names the resolvers the policy keeps reachable, read-only.
const RESOLV_CONF_LINK: &str = "../run/lazaret/resolv.conf";

/// Makes `name` beneath `dir` the link to the control area's `resolv.conf`,
/// replacing what is there unless it is a directory (which the sandbox may
/// have made in its own persistent `/etc`; then its resolution is its own).
fn link_resolv_conf(dir: BorrowedFd<'_>, what: &str) -> Result<(), MountError> {
    let failed = |e: rustix::io::Errno| MountError::Create {
        path: format!("{what}/resolv.conf"),
        source: e.into(),
    };
    match rustix::fs::unlinkat(dir, "resolv.conf", rustix::fs::AtFlags::empty()) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => {}
        Err(rustix::io::Errno::ISDIR) => return Ok(()),
        Err(e) => return Err(failed(e)),
    }
    rustix::fs::symlinkat(RESOLV_CONF_LINK, dir, "resolv.conf").map_err(failed)
}

/// Writes [`PROFILE_SCRIPT`] as `profile.d/lazaret.sh` beneath `etc`,
/// making `profile.d` if the image has none; a `profile.d` that is not a
/// directory is left alone.
fn write_profile_script(etc: BorrowedFd<'_>, what: &str) -> Result<(), MountError> {
    let failed = |e: rustix::io::Errno| MountError::Create {
        path: format!("{what}/profile.d/lazaret.sh"),
        source: e.into(),
    };
    match rustix::fs::mkdirat(etc, "profile.d", Mode::from_raw_mode(0o755)) {
        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
        Err(e) => return Err(failed(e)),
    }
    let dir = match rustix::fs::openat(
        etc,
        "profile.d",
        OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::RDONLY,
        Mode::empty(),
    ) {
        Ok(dir) => dir,
        Err(rustix::io::Errno::NOTDIR | rustix::io::Errno::LOOP) => return Ok(()),
        Err(e) => return Err(failed(e)),
    };
    match rustix::fs::unlinkat(&dir, "lazaret.sh", rustix::fs::AtFlags::empty()) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => {}
        Err(rustix::io::Errno::ISDIR) => return Ok(()),
        Err(e) => return Err(failed(e)),
    }
    let file = rustix::fs::openat(
        &dir,
        "lazaret.sh",
        OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    )
    .map_err(failed)?;
    std::io::Write::write_all(&mut std::fs::File::from(file), PROFILE_SCRIPT.as_bytes()).map_err(
        |e| MountError::Create {
            path: format!("{what}/profile.d/lazaret.sh"),
            source: e,
        },
    )
}

/// Stages the whole filesystem beneath `runtime_dir/mnt`, with `resolvers`
/// in the control area's `resolv.conf`. Must run inside the Domain mount
/// namespace.
pub fn stage(
    runtime_dir: &Path,
    sources: &Sources<'_>,
    resolvers: &[std::net::Ipv4Addr],
) -> Result<Staged, MountError> {
    let scratch = runtime_dir.join("mnt");
    create_dir(&scratch)?;
    mount(
        "the staging tmpfs",
        &scratch,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV,
        &format!("mode=0700,size={STAGING_SIZE}"),
    )?;
    let empty = scratch.join("empty");
    for dir in ["empty", "root/ephemeral", "root/merged"] {
        create_dir(&scratch.join(dir))?;
    }
    // The root filesystem's upper, bounded: a full upper makes writes
    // inside fail with ENOSPC, never the host's memory run out.
    let ephemeral = scratch.join("root/ephemeral");
    mount(
        "the root filesystem's ephemeral upper",
        &ephemeral,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV,
        &format!("mode=0700,size={ROOT_UPPER_SIZE}"),
    )?;
    for dir in [
        "root/ephemeral/upper/etc",
        "root/ephemeral/work",
        "bundle",
        "runsc",
        "control/bin",
        "control/mailbox",
        "mailbox",
    ] {
        create_dir(&scratch.join(dir))?;
    }

    // The root filesystem: the prepared lower under an ephemeral upper,
    // whose `/etc/resolv.conf` is the link to the control area's.
    let upper_etc = scratch.join("root/ephemeral/upper/etc");
    std::fs::set_permissions(&upper_etc, std::fs::Permissions::from_mode(0o755)).map_err(
        |source| MountError::Create {
            path: upper_etc.display().to_string(),
            source,
        },
    )?;
    let etc = open_dir(rustix::fs::CWD, &upper_etc, "the root's upper /etc")?;
    link_resolv_conf(etc.as_fd(), "the root's /etc")?;
    write_profile_script(etc.as_fd(), "the root's /etc")?;
    let rootfs = scratch.join("root/merged");
    let root_options = format!(
        "lowerdir={},upperdir={},workdir={},userxattr",
        fd_path(sources.rootfs),
        scratch.join("root/ephemeral/upper").display(),
        scratch.join("root/ephemeral/work").display()
    );
    mount(
        "the root filesystem overlay",
        &rootfs,
        "overlay",
        MountFlags::empty(),
        &root_options,
    )?;

    // The State Anchor: each persistent dir is the image's directory under
    // the Domain's own upper.
    let mut anchors = Vec::with_capacity(sources.anchors.len());
    for (i, anchor) in sources.anchors.iter().enumerate() {
        let lower_fd = image_dir(sources.rootfs, anchor.sandbox_path)?;
        let lower = match &lower_fd {
            Some(fd) => fd_path(fd.as_fd()),
            None => empty.display().to_string(),
        };
        let state = fd_path(anchor.state_dir);
        if anchor.sandbox_path == "/etc" {
            // A persistent /etc keeps everything but this link, which
            // every `up` puts back.
            let upper = open_dir(anchor.state_dir, Path::new("upper"), "the persistent /etc")?;
            link_resolv_conf(upper.as_fd(), "the persistent /etc")?;
            write_profile_script(upper.as_fd(), "the persistent /etc")?;
        }
        let target = scratch.join(format!("anchor/{i}"));
        create_dir(&target)?;
        let options =
            format!("lowerdir={lower},upperdir={state}/upper,workdir={state}/work,userxattr");
        let what = format!("the persistent dir {}", anchor.sandbox_path);
        mount(&what, &target, "overlay", MountFlags::empty(), &options)?;
        anchors.push((anchor.sandbox_path.to_owned(), target));
    }

    // The routed workspace is attached here by `workspace::Served::attach`.
    let workspace = scratch.join("workspace");
    create_dir(&workspace)?;

    let mut volumes = Vec::with_capacity(sources.volumes.len());
    for (i, volume) in sources.volumes.iter().enumerate() {
        let target = scratch.join(format!("volume/{i}"));
        match volume.kind {
            VolumeKind::Directory => create_dir(&target)?,
            VolumeKind::File => {
                create_dir(&scratch.join("volume"))?;
                std::fs::File::create(&target).map_err(|source| MountError::Create {
                    path: target.display().to_string(),
                    source,
                })?;
            }
        }
        bind(volume.source, &target, volume.sandbox_path)?;
        if volume.access == VolumeAccess::ReadOnly {
            read_only(&target, volume.sandbox_path)?;
        }
        volumes.push((volume.sandbox_path.to_owned(), target, volume.access));
    }

    let control = scratch.join("control");
    let resolv_conf: String = resolvers
        .iter()
        .map(|r| format!("nameserver {r}\n"))
        .collect();
    let resolv_path = control.join("resolv.conf");
    std::fs::write(&resolv_path, resolv_conf)
        .and_then(|()| {
            std::fs::set_permissions(&resolv_path, std::fs::Permissions::from_mode(0o444))
        })
        .map_err(|source| MountError::Create {
            path: resolv_path.display().to_string(),
            source,
        })?;
    for (name, program) in [
        ("lazaret-init", SANDBOX_INIT),
        ("lazaret-escalate", ESCALATION_CLIENT),
    ] {
        let path = control.join("bin").join(name);
        std::fs::write(&path, program)
            .and_then(|()| std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o555)))
            .map_err(|source| MountError::Create {
                path: path.display().to_string(),
                source,
            })?;
    }
    // The Escalation Mailbox: its own bounded tmpfs, which the coordinator
    // reaches through a descriptor and the sandbox at its protected path.
    let mailbox = scratch.join("mailbox");
    mount(
        "the Escalation Mailbox",
        &mailbox,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        &format!("mode=0700,{MAILBOX_SIZE}"),
    )?;
    // The control area, read-only in the Domain mount namespace too.
    rustix::mount::mount_bind(&control, &control).map_err(|e| MountError::Mount {
        what: "the control area".into(),
        target: control.display().to_string(),
        source: e.into(),
    })?;
    read_only(&control, "the control area")?;

    let tmp_taken = anchors.iter().any(|(path, _)| path == "/tmp")
        || volumes.iter().any(|(path, _, _)| path == "/tmp");
    let private_tmp = !tmp_taken && image_tmp_is_empty(sources.rootfs)?;
    Ok(Staged {
        private_tmp,
        rootfs,
        anchors,
        workspace,
        volumes,
        control,
        mailbox,
        bundle: scratch.join("bundle"),
        runsc_root: scratch.join("runsc"),
    })
}
