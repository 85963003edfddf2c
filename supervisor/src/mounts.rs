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
use std::path::{Path, PathBuf};

use lazaret_proto::config::{VolumeAccess, VolumeKind};
use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::mount::{MountFlags, MountPropagationFlags};

use crate::syscall::Syscall;

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

fn create_dir(sys: &dyn Syscall, path: &Path) -> Result<(), MountError> {
    sys.create_dir_all(path)
        .map_err(|source| MountError::Create {
            path: path.display().to_string(),
            source,
        })
}

/// Writes `bytes` to `path` and gives it `mode`.
fn write_file(sys: &dyn Syscall, path: &Path, bytes: &[u8], mode: u32) -> Result<(), MountError> {
    sys.write_file(path, bytes)
        .and_then(|()| sys.set_mode(path, mode))
        .map_err(|source| MountError::Create {
            path: path.display().to_string(),
            source,
        })
}

/// Mounts a filesystem of type `fstype` (its source named the same) at
/// `target`; `what` says what it is for, in errors.
pub(crate) fn mount(
    sys: &dyn Syscall,
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
    sys.mount(fstype, target, flags, data.as_c_str())
        .map_err(|e| failed(e.into()))
}

fn bind(
    sys: &dyn Syscall,
    source: BorrowedFd<'_>,
    target: &Path,
    what: &str,
) -> Result<(), MountError> {
    sys.mount_bind(Path::new(&fd_path(source)), target)
        .map_err(|e| MountError::Mount {
            what: what.to_owned(),
            target: target.display().to_string(),
            source: e.into(),
        })
}

/// Makes the bind mount at `target` read-only in the Domain mount
/// namespace itself, not only in the sandbox's view, keeping the flags
/// the mount already has (a user namespace may not drop those the host
/// locked, such as `nosuid`).
fn read_only(sys: &dyn Syscall, target: &Path, what: &str) -> Result<(), MountError> {
    let failed = |e: rustix::io::Errno| MountError::Mount {
        what: format!("{what} read-only"),
        target: target.display().to_string(),
        source: e.into(),
    };
    use rustix::fs::StatVfsMountFlags as Vfs;
    let kept = sys.mount_flags(target).map_err(failed)?;
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
    sys.remount(target, flags).map_err(failed)
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
pub fn private_proc(sys: &dyn Syscall) -> Result<(), MountError> {
    sys.set_propagation(
        Path::new("/"),
        MountPropagationFlags::REC | MountPropagationFlags::PRIVATE,
    )
    .map_err(|e| MountError::Mount {
        what: "private propagation".into(),
        target: "/".into(),
        source: e.into(),
    })?;
    mount(
        sys,
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
    sys: &dyn Syscall,
    runtime_dir: &Path,
    sources: &Sources<'_>,
    resolvers: &[std::net::Ipv4Addr],
) -> Result<Staged, MountError> {
    let scratch = runtime_dir.join("mnt");
    let rootfs = stage_root(sys, &scratch, sources.rootfs)?;
    let anchors = stage_anchors(sys, &scratch, sources)?;

    // The routed workspace is attached here by `workspace::Served::attach`.
    let workspace = scratch.join("workspace");
    create_dir(sys, &workspace)?;

    let volumes = stage_volumes(sys, &scratch, &sources.volumes)?;
    let control = stage_control(sys, &scratch, resolvers)?;

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
        mailbox: scratch.join("mailbox"),
        bundle: scratch.join("bundle"),
        runsc_root: scratch.join("runsc"),
    })
}

/// Mounts the staging tmpfs at `scratch`, makes its directories, and
/// mounts the root filesystem: the prepared lower `image` under an
/// ephemeral upper, whose `/etc/resolv.conf` is the link to the control
/// area's. Returns where the root filesystem is merged.
fn stage_root(
    sys: &dyn Syscall,
    scratch: &Path,
    image: BorrowedFd<'_>,
) -> Result<PathBuf, MountError> {
    create_dir(sys, scratch)?;
    mount(
        sys,
        "the staging tmpfs",
        scratch,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV,
        &format!("mode=0700,size={STAGING_SIZE}"),
    )?;
    for dir in ["empty", "root/ephemeral", "root/merged"] {
        create_dir(sys, &scratch.join(dir))?;
    }
    // The root filesystem's upper, bounded: a full upper makes writes
    // inside fail with ENOSPC, never the host's memory run out.
    mount(
        sys,
        "the root filesystem's ephemeral upper",
        &scratch.join("root/ephemeral"),
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
        create_dir(sys, &scratch.join(dir))?;
    }

    let upper_etc = scratch.join("root/ephemeral/upper/etc");
    sys.set_mode(&upper_etc, 0o755)
        .map_err(|source| MountError::Create {
            path: upper_etc.display().to_string(),
            source,
        })?;
    let etc = open_dir(rustix::fs::CWD, &upper_etc, "the root's upper /etc")?;
    link_resolv_conf(etc.as_fd(), "the root's /etc")?;
    write_profile_script(etc.as_fd(), "the root's /etc")?;
    let rootfs = scratch.join("root/merged");
    let root_options = format!(
        "lowerdir={},upperdir={},workdir={},userxattr",
        fd_path(image),
        scratch.join("root/ephemeral/upper").display(),
        scratch.join("root/ephemeral/work").display()
    );
    mount(
        sys,
        "the root filesystem overlay",
        &rootfs,
        "overlay",
        MountFlags::empty(),
        &root_options,
    )?;
    Ok(rootfs)
}

/// The State Anchor: each persistent dir is the image's directory under
/// the Domain's own upper, overlaid at `scratch/anchor/N`.
fn stage_anchors(
    sys: &dyn Syscall,
    scratch: &Path,
    sources: &Sources<'_>,
) -> Result<Vec<(String, PathBuf)>, MountError> {
    let empty = scratch.join("empty");
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
        create_dir(sys, &target)?;
        let options =
            format!("lowerdir={lower},upperdir={state}/upper,workdir={state}/work,userxattr");
        let what = format!("the persistent dir {}", anchor.sandbox_path);
        mount(
            sys,
            &what,
            &target,
            "overlay",
            MountFlags::empty(),
            &options,
        )?;
        anchors.push((anchor.sandbox_path.to_owned(), target));
    }
    Ok(anchors)
}

/// Binds each volume at `scratch/volume/N`, read-only in the Domain mount
/// namespace too when it is read-only.
fn stage_volumes(
    sys: &dyn Syscall,
    scratch: &Path,
    sources: &[VolumeSource<'_>],
) -> Result<Vec<(String, PathBuf, VolumeAccess)>, MountError> {
    let mut volumes = Vec::with_capacity(sources.len());
    for (i, volume) in sources.iter().enumerate() {
        let target = scratch.join(format!("volume/{i}"));
        match volume.kind {
            VolumeKind::Directory => create_dir(sys, &target)?,
            VolumeKind::File => {
                create_dir(sys, &scratch.join("volume"))?;
                sys.create_file(&target)
                    .map_err(|source| MountError::Create {
                        path: target.display().to_string(),
                        source,
                    })?;
            }
        }
        bind(sys, volume.source, &target, volume.sandbox_path)?;
        if volume.access == VolumeAccess::ReadOnly {
            read_only(sys, &target, volume.sandbox_path)?;
        }
        volumes.push((volume.sandbox_path.to_owned(), target, volume.access));
    }
    Ok(volumes)
}

/// Writes the control area (`resolv.conf` naming `resolvers`, and the
/// sandbox's programs) and mounts the Escalation Mailbox. Returns where
/// the control area is; [`seal_control`] completes it and makes it
/// read-only before the sandbox runs.
fn stage_control(
    sys: &dyn Syscall,
    scratch: &Path,
    resolvers: &[std::net::Ipv4Addr],
) -> Result<PathBuf, MountError> {
    let control = scratch.join("control");
    let resolv_conf: String = resolvers
        .iter()
        .map(|r| format!("nameserver {r}\n"))
        .collect();
    write_file(
        sys,
        &control.join("resolv.conf"),
        resolv_conf.as_bytes(),
        0o444,
    )?;
    for (name, program) in [
        ("lazaret-init", SANDBOX_INIT),
        ("lazaret-escalate", ESCALATION_CLIENT),
    ] {
        write_file(sys, &control.join("bin").join(name), program, 0o555)?;
    }
    // The Escalation Mailbox: its own bounded tmpfs, which the coordinator
    // reaches through a descriptor and the sandbox at its protected path.
    mount(
        sys,
        "the Escalation Mailbox",
        &scratch.join("mailbox"),
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        &format!("mode=0700,{MAILBOX_SIZE}"),
    )?;
    Ok(control)
}

/// Completes the control area with `trust`, the sandbox's CA bundle when
/// the profile has credentials ([`lazaret_proto::credproxy::TRUST_FILE`]),
/// and makes it read-only, in the Domain mount namespace too.
pub fn seal_control(
    sys: &dyn Syscall,
    control: &Path,
    trust: Option<&[u8]>,
) -> Result<(), MountError> {
    if let Some(trust) = trust {
        let path = control.join(lazaret_proto::credproxy::TRUST_FILE);
        write_file(sys, &path, trust, 0o444)?;
    }
    sys.mount_bind(control, control)
        .map_err(|e| MountError::Mount {
            what: "the control area".into(),
            target: control.display().to_string(),
            source: e.into(),
        })?;
    read_only(sys, control, "the control area")
}

/// Where images keep their CA bundle: Debian and Ubuntu, Fedora and
/// RHEL, Alpine, openSUSE.
const IMAGE_TRUST: [&str; 4] = [
    "etc/ssl/certs/ca-certificates.crt",
    "etc/pki/tls/certs/ca-bundle.crt",
    "etc/ssl/cert.pem",
    "etc/ssl/ca-bundle.pem",
];

/// The largest CA bundle taken from an image.
const MAX_IMAGE_TRUST: u64 = 4 * 1024 * 1024;

/// The CA bundle the staged root filesystem `rootfs` offers its programs,
/// resolved as the sandbox would (its links stay inside it), or nothing
/// when it has none: the first of [`IMAGE_TRUST`] that is a regular file
/// of at most [`MAX_IMAGE_TRUST`] bytes.
pub fn image_trust(rootfs: &Path) -> Result<Vec<u8>, MountError> {
    use std::io::Read;
    let failed = |path: &str, e: io::Error| MountError::Create {
        path: format!("{}/{path}", rootfs.display()),
        source: e,
    };
    let root = rustix::fs::open(
        rootfs,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| failed("", e.into()))?;
    for path in IMAGE_TRUST {
        let file = match rustix::fs::openat2(
            &root,
            path,
            OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
        ) {
            Ok(file) => std::fs::File::from(file),
            Err(rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR) => continue,
            Err(rustix::io::Errno::LOOP) => {
                tracing::warn!("the image's {path} is a loop of links: not taken");
                continue;
            }
            Err(e) => return Err(failed(path, e.into())),
        };
        let metadata = file.metadata().map_err(|e| failed(path, e))?;
        if !metadata.is_file() || metadata.len() > MAX_IMAGE_TRUST {
            tracing::warn!(
                "the image's {path} is not a regular file of at most {MAX_IMAGE_TRUST} bytes: \
                 not taken into the sandbox's trust"
            );
            continue;
        }
        let mut bytes = Vec::new();
        file.take(MAX_IMAGE_TRUST)
            .read_to_end(&mut bytes)
            .map_err(|e| failed(path, e))?;
        return Ok(bytes);
    }
    tracing::warn!(
        "the image has no CA bundle at /{}: the sandbox trusts only the Credential Proxy, so \
         TLS to any other host fails unless a client names its own trust; install a CA bundle \
         in the image (Debian's ca-certificates package)",
        IMAGE_TRUST.join(", /")
    );
    Ok(Vec::new())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::syscall::recording::{Call, Recording};
    use rustix::io::Errno;
    use std::net::Ipv4Addr;
    use std::os::unix::fs::PermissionsExt;

    /// An image, a Domain state directory per anchor, and a place to stage.
    struct Fixture {
        dir: tempfile::TempDir,
        image: OwnedFd,
    }

    fn opened(path: &Path) -> OwnedFd {
        rustix::fs::open(
            path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap()
    }

    impl Fixture {
        /// An image holding `dirs` (and whatever `files`).
        fn new(dirs: &[&str], files: &[&str]) -> Self {
            let dir = tempfile::tempdir().unwrap();
            let image = dir.path().join("image");
            std::fs::create_dir(&image).unwrap();
            for d in dirs {
                std::fs::create_dir_all(image.join(d)).unwrap();
            }
            for f in files {
                std::fs::write(image.join(f), b"x").unwrap();
            }
            let image = opened(&image);
            Fixture { dir, image }
        }

        fn runtime(&self) -> PathBuf {
            self.dir.path().join("runtime")
        }

        fn scratch(&self) -> PathBuf {
            self.runtime().join("mnt")
        }

        /// A Domain state directory (`upper/`, `work/`) named `name`.
        fn state(&self, name: &str) -> OwnedFd {
            let state = self.dir.path().join("state").join(name);
            std::fs::create_dir_all(state.join("upper")).unwrap();
            std::fs::create_dir_all(state.join("work")).unwrap();
            opened(&state)
        }

        /// A volume source directory named `name`.
        fn volume(&self, name: &str) -> OwnedFd {
            let source = self.dir.path().join("volumes").join(name);
            std::fs::create_dir_all(&source).unwrap();
            opened(&source)
        }

        fn sources<'a>(
            &'a self,
            anchors: &'a [(&'a str, OwnedFd)],
            volumes: &'a [(&'a str, OwnedFd, VolumeKind, VolumeAccess)],
        ) -> Sources<'a> {
            Sources {
                rootfs: self.image.as_fd(),
                anchors: anchors
                    .iter()
                    .map(|(path, fd)| AnchorSource {
                        sandbox_path: path,
                        state_dir: fd.as_fd(),
                    })
                    .collect(),
                volumes: volumes
                    .iter()
                    .map(|(path, fd, kind, access)| VolumeSource {
                        sandbox_path: path,
                        source: fd.as_fd(),
                        kind: *kind,
                        access: *access,
                    })
                    .collect(),
            }
        }

        fn stage(&self, sys: &Recording, sources: &Sources<'_>) -> Result<Staged, MountError> {
            stage(
                sys,
                &self.runtime(),
                sources,
                &[Ipv4Addr::new(10, 0, 2, 3), Ipv4Addr::new(10, 0, 2, 4)],
            )
        }
    }

    fn position(calls: &[Call], wanted: impl Fn(&Call) -> bool) -> usize {
        calls
            .iter()
            .position(wanted)
            .unwrap_or_else(|| panic!("no such call in {calls:#?}"))
    }

    fn mount_at(target: &Path) -> impl Fn(&Call) -> bool + '_ {
        move |c| matches!(c, Call::Mount { target: t, .. } if t == target)
    }

    #[test]
    fn the_mounts_are_made_in_order_with_their_flags_and_bounds() {
        let fixture = Fixture::new(&["etc", "root"], &[]);
        let anchors = [("/root", fixture.state("root"))];
        let volumes = [(
            "/data",
            fixture.volume("data"),
            VolumeKind::Directory,
            VolumeAccess::ReadWrite,
        )];
        let sys = Recording::default();
        let staged = fixture
            .stage(&sys, &fixture.sources(&anchors, &volumes))
            .unwrap();
        let scratch = fixture.scratch();
        let mounts: Vec<_> = sys
            .mounts()
            .into_iter()
            .map(|(fstype, target, flags, data)| {
                (
                    fstype,
                    target.strip_prefix(&scratch).unwrap().to_owned(),
                    flags,
                    data,
                )
            })
            .collect();
        let nosuid_nodev = MountFlags::NOSUID | MountFlags::NODEV;
        assert_eq!(mounts.len(), 5, "{mounts:#?}");
        assert_eq!(
            mounts[0],
            (
                "tmpfs".into(),
                PathBuf::new(),
                nosuid_nodev,
                format!("mode=0700,size={STAGING_SIZE}")
            )
        );
        assert_eq!(
            mounts[1],
            (
                "tmpfs".into(),
                PathBuf::from("root/ephemeral"),
                nosuid_nodev,
                format!("mode=0700,size={ROOT_UPPER_SIZE}")
            )
        );
        let (fstype, target, flags, data) = &mounts[2];
        assert_eq!(
            (fstype.as_str(), target.as_path()),
            ("overlay", Path::new("root/merged"))
        );
        assert_eq!(*flags, MountFlags::empty());
        assert_eq!(
            *data,
            format!(
                "lowerdir={},upperdir={},workdir={},userxattr",
                fd_path(fixture.image.as_fd()),
                scratch.join("root/ephemeral/upper").display(),
                scratch.join("root/ephemeral/work").display()
            )
        );
        assert_eq!(mounts[3].0, "overlay");
        assert_eq!(mounts[3].1, Path::new("anchor/0"));
        assert_eq!(
            mounts[4],
            (
                "tmpfs".into(),
                PathBuf::from("mailbox"),
                nosuid_nodev | MountFlags::NOEXEC,
                format!("mode=0700,{MAILBOX_SIZE}")
            )
        );
        assert_eq!(staged.rootfs, scratch.join("root/merged"));
        assert_eq!(
            staged.anchors,
            vec![("/root".into(), scratch.join("anchor/0"))]
        );
        assert_eq!(staged.workspace, scratch.join("workspace"));
        assert_eq!(staged.mailbox, scratch.join("mailbox"));
        assert_eq!(staged.bundle, scratch.join("bundle"));
        assert!(staged.bundle.is_dir() && staged.runsc_root.is_dir());
    }

    #[test]
    fn nothing_is_made_in_the_staging_before_its_tmpfs_is_mounted() {
        let fixture = Fixture::new(&[], &[]);
        let sys = Recording::default();
        fixture.stage(&sys, &fixture.sources(&[], &[])).unwrap();
        let calls = sys.calls();
        let scratch = fixture.scratch();
        let tmpfs = position(&calls, mount_at(&scratch));
        let first_inside = position(&calls, |c| match c {
            Call::CreateDir(p) | Call::WriteFile(p) | Call::CreateFile(p) => {
                p.starts_with(&scratch) && p != &scratch
            }
            _ => false,
        });
        assert!(tmpfs < first_inside, "{calls:#?}");
        assert_eq!(calls[0], Call::CreateDir(scratch.clone()));
        // The upper's tmpfs comes before anything is made in it.
        let ephemeral = scratch.join("root/ephemeral");
        let upper = position(&calls, mount_at(&ephemeral));
        let in_upper = position(
            &calls,
            |c| matches!(c, Call::CreateDir(p) if p.starts_with(&ephemeral) && *p != ephemeral),
        );
        assert!(upper < in_upper, "{calls:#?}");
    }

    #[test]
    fn the_root_overlay_comes_after_its_upper_etc_is_written() {
        let fixture = Fixture::new(&["etc"], &[]);
        let sys = Recording::default();
        fixture.stage(&sys, &fixture.sources(&[], &[])).unwrap();
        let scratch = fixture.scratch();
        let etc = scratch.join("root/ephemeral/upper/etc");
        let calls = sys.calls();
        let mode = position(&calls, |c| *c == Call::SetMode(etc.clone(), 0o755));
        let overlay = position(&calls, mount_at(&scratch.join("root/merged")));
        assert!(mode < overlay);
        let link = std::fs::read_link(etc.join("resolv.conf")).unwrap();
        assert_eq!(link, Path::new(RESOLV_CONF_LINK));
        let script = std::fs::read_to_string(etc.join("profile.d/lazaret.sh")).unwrap();
        assert_eq!(script, PROFILE_SCRIPT);
    }

    #[test]
    fn the_control_area_holds_the_resolvers_and_programs_and_is_made_read_only() {
        let fixture = Fixture::new(&[], &[]);
        let sys = Recording::default();
        *sys.flags.lock().unwrap() =
            rustix::fs::StatVfsMountFlags::NOSUID | rustix::fs::StatVfsMountFlags::NODEV;
        let staged = fixture.stage(&sys, &fixture.sources(&[], &[])).unwrap();
        let control = fixture.scratch().join("control");
        assert_eq!(staged.control, control);
        let trust = lazaret_proto::credproxy::TRUST_FILE;
        seal_control(&sys, &control, Some(b"-----BEGIN CERTIFICATE-----\n")).unwrap();
        assert_eq!(
            std::fs::read(control.join(trust)).unwrap(),
            b"-----BEGIN CERTIFICATE-----\n"
        );
        let resolv = control.join("resolv.conf");
        assert_eq!(
            std::fs::read_to_string(&resolv).unwrap(),
            "nameserver 10.0.2.3\nnameserver 10.0.2.4\n"
        );
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&resolv), 0o444);
        assert_eq!(mode(&control.join(trust)), 0o444);
        for (name, bytes) in [
            ("lazaret-init", SANDBOX_INIT),
            ("lazaret-escalate", ESCALATION_CLIENT),
        ] {
            let path = control.join("bin").join(name);
            assert_eq!(std::fs::read(&path).unwrap(), bytes, "{name}");
            assert_eq!(mode(&path), 0o555, "{name}");
        }
        let calls = sys.calls();
        let n = calls.len();
        assert_eq!(
            calls[n - 3],
            Call::Bind {
                source: control.clone(),
                target: control.clone()
            }
        );
        assert_eq!(calls[n - 2], Call::MountFlags(control.clone()));
        assert_eq!(
            calls[n - 1],
            Call::Remount(
                control.clone(),
                MountFlags::BIND | MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV
            )
        );
        // The mailbox is mounted before the control area is made read-only.
        let mailbox = position(&calls, mount_at(&fixture.scratch().join("mailbox")));
        assert!(mailbox < n - 3);
    }

    #[test]
    fn the_image_trust_is_the_first_bundle_resolved_inside_the_root() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "host file").unwrap();
        assert_eq!(image_trust(root.path()).unwrap(), b"");
        // A link out of the root resolves inside it: to nothing.
        let certs = root.path().join("etc/ssl/certs");
        std::fs::create_dir_all(&certs).unwrap();
        std::os::unix::fs::symlink(
            outside.path().join("secret"),
            certs.join("ca-certificates.crt"),
        )
        .unwrap();
        assert_eq!(image_trust(root.path()).unwrap(), b"");
        // A loop of links: skipped, not a failure of `up`.
        std::fs::remove_file(certs.join("ca-certificates.crt")).unwrap();
        std::os::unix::fs::symlink("ca-certificates.crt", certs.join("ca-certificates.crt"))
            .unwrap();
        assert_eq!(image_trust(root.path()).unwrap(), b"");
        // Not a regular file: skipped, the next taken.
        std::fs::remove_file(certs.join("ca-certificates.crt")).unwrap();
        std::fs::create_dir(certs.join("ca-certificates.crt")).unwrap();
        std::fs::write(root.path().join("etc/ssl/cert.pem"), "alpine").unwrap();
        assert_eq!(image_trust(root.path()).unwrap(), b"alpine");
        std::fs::remove_dir(certs.join("ca-certificates.crt")).unwrap();
        std::fs::write(certs.join("ca-certificates.crt"), "debian").unwrap();
        assert_eq!(image_trust(root.path()).unwrap(), b"debian");
    }

    #[test]
    fn a_read_only_volume_keeps_the_flags_its_mount_has() {
        let fixture = Fixture::new(&[], &[]);
        let volumes = [(
            "/data",
            fixture.volume("data"),
            VolumeKind::Directory,
            VolumeAccess::ReadOnly,
        )];
        let sys = Recording::default();
        use rustix::fs::StatVfsMountFlags as Vfs;
        *sys.flags.lock().unwrap() = Vfs::NOSUID | Vfs::NOEXEC | Vfs::RELATIME | Vfs::MANDLOCK;
        let staged = fixture
            .stage(&sys, &fixture.sources(&[], &volumes))
            .unwrap();
        let target = fixture.scratch().join("volume/0");
        let calls = sys.calls();
        let bound = position(&calls, |c| {
            *c == Call::Bind {
                source: PathBuf::from(fd_path(volumes[0].1.as_fd())),
                target: target.clone(),
            }
        });
        assert_eq!(calls[bound + 1], Call::MountFlags(target.clone()));
        assert_eq!(
            calls[bound + 2],
            Call::Remount(
                target.clone(),
                MountFlags::BIND
                    | MountFlags::RDONLY
                    | MountFlags::NOSUID
                    | MountFlags::NOEXEC
                    | MountFlags::RELATIME
            )
        );
        assert_eq!(
            staged.volumes,
            vec![("/data".into(), target, VolumeAccess::ReadOnly)]
        );
    }

    #[test]
    fn a_read_write_volume_is_bound_and_left_writable() {
        let fixture = Fixture::new(&[], &[]);
        let volumes = [(
            "/data",
            fixture.volume("data"),
            VolumeKind::Directory,
            VolumeAccess::ReadWrite,
        )];
        let sys = Recording::default();
        fixture
            .stage(&sys, &fixture.sources(&[], &volumes))
            .unwrap();
        let target = fixture.scratch().join("volume/0");
        let calls = sys.calls();
        assert!(calls.contains(&Call::CreateDir(target.clone())));
        assert!(
            calls
                .iter()
                .any(|c| matches!(c, Call::Bind { target: t, .. } if *t == target))
        );
        assert!(
            !calls
                .iter()
                .any(|c| matches!(c, Call::Remount(t, _) | Call::MountFlags(t) if *t == target)),
            "{calls:#?}"
        );
    }

    #[test]
    fn a_file_volume_is_bound_on_a_file() {
        let fixture = Fixture::new(&[], &[]);
        let source = fixture.dir.path().join("a-file");
        std::fs::write(&source, b"data").unwrap();
        let file =
            rustix::fs::open(&source, OFlags::PATH | OFlags::CLOEXEC, Mode::empty()).unwrap();
        let volumes = [(
            "/etc/app.conf",
            file,
            VolumeKind::File,
            VolumeAccess::ReadWrite,
        )];
        let sys = Recording::default();
        fixture
            .stage(&sys, &fixture.sources(&[], &volumes))
            .unwrap();
        let target = fixture.scratch().join("volume/0");
        let calls = sys.calls();
        let made = position(&calls, |c| *c == Call::CreateFile(target.clone()));
        assert!(!calls.contains(&Call::CreateDir(target.clone())));
        assert_eq!(
            calls[made - 1],
            Call::CreateDir(fixture.scratch().join("volume"))
        );
        assert!(matches!(&calls[made + 1], Call::Bind { target: t, .. } if *t == target));
        assert!(target.is_file());
    }

    #[test]
    fn an_anchor_the_image_lacks_overlays_the_empty_directory() {
        let fixture = Fixture::new(&["home"], &[]);
        let anchors = [
            ("/home", fixture.state("home")),
            ("/srv", fixture.state("srv")),
        ];
        let sys = Recording::default();
        fixture
            .stage(&sys, &fixture.sources(&anchors, &[]))
            .unwrap();
        let scratch = fixture.scratch();
        let overlays: Vec<_> = sys
            .mounts()
            .into_iter()
            .filter(|(_, target, _, _)| target.starts_with(scratch.join("anchor")))
            .collect();
        assert_eq!(overlays.len(), 2, "{overlays:#?}");
        let state = fd_path(anchors[1].1.as_fd());
        assert_eq!(overlays[1].1, scratch.join("anchor/1"));
        assert_eq!(
            overlays[1].3,
            format!(
                "lowerdir={},upperdir={state}/upper,workdir={state}/work,userxattr",
                scratch.join("empty").display()
            )
        );
        // The image's own /home is the first one's lower, by descriptor.
        assert!(
            overlays[0].3.starts_with("lowerdir=/proc/self/fd/"),
            "{}",
            overlays[0].3
        );
    }

    #[test]
    fn an_anchor_lower_is_resolved_inside_the_image() {
        // /home links to an absolute path; inside the image it is the
        // image's /data/home, never the host's.
        let fixture = Fixture::new(&["data/home/user"], &[]);
        let image = fixture.dir.path().join("image");
        std::os::unix::fs::symlink("/data/home", image.join("home")).unwrap();
        let lower = image_dir(fixture.image.as_fd(), "/home").unwrap().unwrap();
        let found = std::fs::read_link(fd_path(lower.as_fd())).unwrap();
        assert_eq!(found, image.join("data/home"));
    }

    #[test]
    fn an_anchor_that_is_a_file_in_the_image_is_refused_before_it_is_mounted() {
        let fixture = Fixture::new(&[], &["opt"]);
        let anchors = [("/opt", fixture.state("opt"))];
        let sys = Recording::default();
        let error = fixture
            .stage(&sys, &fixture.sources(&anchors, &[]))
            .unwrap_err();
        assert!(
            matches!(&error, MountError::NotADirectory { path } if path == "/opt"),
            "{error:?}"
        );
        assert!(
            !sys.mounts()
                .iter()
                .any(|(_, t, _, _)| t.starts_with(fixture.scratch().join("anchor"))),
        );
    }

    #[test]
    fn a_persistent_etc_gets_its_link_and_profile_script_back() {
        let fixture = Fixture::new(&["etc"], &[]);
        let state = fixture.state("etc");
        let upper = fixture.dir.path().join("state/etc/upper");
        // What the sandbox left: its own resolv.conf and an old script.
        std::fs::write(upper.join("resolv.conf"), "nameserver 1.1.1.1\n").unwrap();
        std::fs::create_dir(upper.join("profile.d")).unwrap();
        std::fs::write(upper.join("profile.d/lazaret.sh"), "old").unwrap();
        std::fs::write(upper.join("hosts"), "kept").unwrap();
        let anchors = [("/etc", state)];
        let sys = Recording::default();
        fixture
            .stage(&sys, &fixture.sources(&anchors, &[]))
            .unwrap();
        assert_eq!(
            std::fs::read_link(upper.join("resolv.conf")).unwrap(),
            Path::new(RESOLV_CONF_LINK)
        );
        assert_eq!(
            std::fs::read_to_string(upper.join("profile.d/lazaret.sh")).unwrap(),
            PROFILE_SCRIPT
        );
        assert_eq!(
            std::fs::read_to_string(upper.join("hosts")).unwrap(),
            "kept"
        );
    }

    #[test]
    fn a_resolv_conf_directory_and_a_profile_d_file_are_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("resolv.conf")).unwrap();
        std::fs::write(dir.path().join("profile.d"), "not a directory").unwrap();
        let fd = opened(dir.path());
        link_resolv_conf(fd.as_fd(), "test").unwrap();
        write_profile_script(fd.as_fd(), "test").unwrap();
        assert!(dir.path().join("resolv.conf").is_dir());
        assert_eq!(
            std::fs::read_to_string(dir.path().join("profile.d")).unwrap(),
            "not a directory"
        );
    }

    #[test]
    fn tmp_gets_its_own_tmpfs_only_when_nothing_is_there() {
        let cases: [(&[&str], &[&str], bool, bool); 5] = [
            // (image dirs, image files, a volume at /tmp, private)
            (&["tmp"], &[], false, true),
            (&[], &[], false, true),
            (&["tmp"], &["tmp/kept"], false, false),
            (&[], &["tmp"], false, false),
            (&["tmp"], &[], true, false),
        ];
        for (dirs, files, volume, private) in cases {
            let fixture = Fixture::new(dirs, files);
            let volumes = [(
                "/tmp",
                fixture.volume("tmp"),
                VolumeKind::Directory,
                VolumeAccess::ReadWrite,
            )];
            let volumes = if volume { &volumes[..] } else { &[] };
            let sys = Recording::default();
            let staged = fixture.stage(&sys, &fixture.sources(&[], volumes)).unwrap();
            assert_eq!(staged.private_tmp, private, "{dirs:?} {files:?} {volume}");
        }
    }

    #[test]
    fn a_failed_staging_tmpfs_stops_everything_and_is_named() {
        let fixture = Fixture::new(&[], &[]);
        let sys = Recording::default();
        sys.fail_when(|c| matches!(c, Call::Mount { .. }), Errno::PERM);
        let error = fixture.stage(&sys, &fixture.sources(&[], &[])).unwrap_err();
        let MountError::Mount {
            what,
            target,
            source,
        } = &error
        else {
            panic!("{error:?}")
        };
        assert_eq!(what, "the staging tmpfs");
        assert_eq!(*target, fixture.scratch().display().to_string());
        assert_eq!(source.raw_os_error(), Some(Errno::PERM.raw_os_error()));
        assert_eq!(sys.calls().len(), 2, "{:#?}", sys.calls());
    }

    #[test]
    fn a_failed_root_overlay_stops_before_any_anchor_or_volume() {
        let fixture = Fixture::new(&["root"], &[]);
        let anchors = [("/root", fixture.state("root"))];
        let volumes = [(
            "/data",
            fixture.volume("data"),
            VolumeKind::Directory,
            VolumeAccess::ReadOnly,
        )];
        let sys = Recording::default();
        sys.fail_when(
            |c| matches!(c, Call::Mount { fstype, .. } if fstype == "overlay"),
            Errno::INVAL,
        );
        let error = fixture
            .stage(&sys, &fixture.sources(&anchors, &volumes))
            .unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("cannot mount the root filesystem overlay at "),
            "{error}"
        );
        let calls = sys.calls();
        assert!(matches!(calls.last(), Some(Call::Mount { fstype, .. }) if fstype == "overlay"));
        assert!(!calls.iter().any(|c| matches!(c, Call::Bind { .. })));
    }

    #[test]
    fn a_failed_anchor_overlay_names_the_persistent_dir() {
        let fixture = Fixture::new(&["root", "home"], &[]);
        let anchors = [
            ("/root", fixture.state("root")),
            ("/home", fixture.state("home")),
        ];
        let sys = Recording::default();
        let second = fixture.scratch().join("anchor/1");
        sys.fail_when(
            move |c| matches!(c, Call::Mount { target, .. } if *target == second),
            Errno::NOSPC,
        );
        let error = fixture
            .stage(&sys, &fixture.sources(&anchors, &[]))
            .unwrap_err();
        let MountError::Mount { what, .. } = &error else {
            panic!("{error:?}")
        };
        assert_eq!(what, "the persistent dir /home");
        // The first anchor was mounted, the workspace never made.
        assert!(
            sys.mounts()
                .iter()
                .any(|(_, t, _, _)| *t == fixture.scratch().join("anchor/0"))
        );
        assert!(
            !sys.calls()
                .contains(&Call::CreateDir(fixture.scratch().join("workspace")))
        );
    }

    #[test]
    fn a_failed_volume_bind_names_the_sandbox_path() {
        let fixture = Fixture::new(&[], &[]);
        let volumes = [(
            "/data",
            fixture.volume("data"),
            VolumeKind::Directory,
            VolumeAccess::ReadOnly,
        )];
        let sys = Recording::default();
        sys.fail_when(|c| matches!(c, Call::Bind { .. }), Errno::ACCESS);
        let error = fixture
            .stage(&sys, &fixture.sources(&[], &volumes))
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            format!(
                "cannot mount /data at {}",
                fixture.scratch().join("volume/0").display()
            )
        );
        // Not made read-only, and no control area written.
        assert!(!sys.calls().iter().any(|c| matches!(c, Call::Remount(..))));
        assert!(!fixture.scratch().join("control/resolv.conf").exists());
    }

    #[test]
    fn a_volume_that_cannot_be_made_read_only_fails_the_staging() {
        let fixture = Fixture::new(&[], &[]);
        let volumes = [(
            "/data",
            fixture.volume("data"),
            VolumeKind::Directory,
            VolumeAccess::ReadOnly,
        )];
        let sys = Recording::default();
        sys.fail_when(|c| matches!(c, Call::Remount(..)), Errno::PERM);
        let error = fixture
            .stage(&sys, &fixture.sources(&[], &volumes))
            .unwrap_err();
        let MountError::Mount { what, .. } = &error else {
            panic!("{error:?}")
        };
        assert_eq!(what, "/data read-only");
    }

    #[test]
    fn a_directory_that_cannot_be_made_is_named() {
        let fixture = Fixture::new(&[], &[]);
        let sys = Recording::default();
        let bundle = fixture.scratch().join("bundle");
        let wanted = bundle.clone();
        sys.fail_when(move |c| *c == Call::CreateDir(wanted.clone()), Errno::NOSPC);
        let error = fixture.stage(&sys, &fixture.sources(&[], &[])).unwrap_err();
        assert!(
            matches!(&error, MountError::Create { path, .. } if *path == bundle.display().to_string()),
            "{error:?}"
        );
        // Nothing after it: the root overlay is never mounted.
        assert_eq!(sys.calls().last(), Some(&Call::CreateDir(bundle)));
    }

    #[test]
    fn a_control_file_that_cannot_be_written_is_named() {
        let fixture = Fixture::new(&[], &[]);
        let sys = Recording::default();
        sys.fail_when(
            |c| matches!(c, Call::SetMode(p, 0o555) if p.ends_with("lazaret-init")),
            Errno::ROFS,
        );
        let error = fixture.stage(&sys, &fixture.sources(&[], &[])).unwrap_err();
        assert!(
            error.to_string().contains("control/bin/lazaret-init"),
            "{error}"
        );
        assert!(
            !sys.mounts()
                .iter()
                .any(|(_, t, _, _)| t.ends_with("mailbox"))
        );
    }

    #[test]
    fn mount_data_with_a_nul_is_refused_before_the_call() {
        let sys = Recording::default();
        let error = mount(
            &sys,
            "x",
            Path::new("/x"),
            "tmpfs",
            MountFlags::empty(),
            "a\0b",
        )
        .unwrap_err();
        let MountError::Mount { source, .. } = &error else {
            panic!("{error:?}")
        };
        assert_eq!(source.kind(), io::ErrorKind::InvalidInput);
        assert!(sys.calls().is_empty());
    }

    #[test]
    fn the_domain_proc_is_mounted_after_everything_is_made_private() {
        let sys = Recording::default();
        private_proc(&sys).unwrap();
        assert_eq!(
            sys.calls(),
            vec![
                Call::Propagation(
                    "/".into(),
                    MountPropagationFlags::REC | MountPropagationFlags::PRIVATE
                ),
                Call::Mount {
                    fstype: "proc".into(),
                    target: "/proc".into(),
                    flags: MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
                    data: String::new(),
                },
            ]
        );
        let failing = Recording::default();
        failing.fail_when(|c| matches!(c, Call::Propagation(..)), Errno::PERM);
        let error = private_proc(&failing).unwrap_err();
        assert!(error.to_string().contains("private propagation"), "{error}");
        assert_eq!(failing.calls().len(), 1);
    }

    #[test]
    fn a_source_is_reopened_as_the_same_object() {
        let dir = tempfile::tempdir().unwrap();
        let fd = opened(dir.path());
        let again = rebase(fd.as_fd(), "a test directory").unwrap();
        let (a, b) = (
            rustix::fs::fstat(&fd).unwrap(),
            rustix::fs::fstat(&again).unwrap(),
        );
        assert_eq!((a.st_dev, a.st_ino), (b.st_dev, b.st_ino));
    }

    #[test]
    fn a_source_removed_after_it_was_opened_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("gone");
        std::fs::create_dir(&gone).unwrap();
        let fd = opened(&gone);
        std::fs::remove_dir(&gone).unwrap();
        let error = rebase(fd.as_fd(), "the workspace").unwrap_err();
        assert!(
            matches!(&error, MountError::Reopen { what, .. } if what == "the workspace"),
            "{error:?}"
        );
    }
}
