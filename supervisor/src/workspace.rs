//! The routed workspace: a FUSE filesystem mounted where the sandbox's
//! `/workspace` is staged, served by the generation's Workspace Router.
//!
//! Owns the mount and the router's launch: `/dev/fuse` opened and mounted
//! here, in the Domain mount namespace (detached while the rest of the
//! plan is staged, then attached where `/workspace` is staged); the router
//! started (before the plan comes) beside this executable (never through
//! `PATH`), in a network namespace of its own with no interface, with
//! CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH and CAP_FOWNER alone; handed the
//! connection, the host workspace, the Domain's isolated directory and the
//! sealed rules memfd over its channel. This process then closes its own
//! copy of the connection, so that the router is its only server: if the
//! router dies, every request fails at once instead of waiting. Trusts the
//! Host Coordinator's plan and the router's report only as far as relaying
//! it.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use lazaret_proto::channel::FdIndex;
use lazaret_proto::router::{
    ROUTER_CAPABILITIES, RouterReport, RouterRequest, RoutingSummary, ServeRequest,
};
use rustix::fs::{Mode, OFlags};
use rustix::mount::{FsMountFlags, FsOpenFlags, MountAttrFlags, MoveMountFlags};

use crate::helper::{Helper, HelperError};

/// Why the routed workspace could not be mounted or served.
#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    /// `/dev/fuse` could not be opened.
    #[error(
        "cannot open /dev/fuse ({errno}); the workspace is served over FUSE, so the invoking \
         user must be able to open it, as on desktop distributions (mode 0666); \
         `packaging/device-access.sh` makes it so"
    )]
    OpenFuse {
        /// What the kernel said.
        errno: rustix::io::Errno,
    },
    /// A call of the mount API failed.
    #[error(
        "cannot mount the routed workspace: {call} failed ({errno}); the workspace is \
         mounted with the kernel's mount API (fsopen, fsconfig, fsmount), as FUSE in \
         the Domain user namespace: Lazaret needs Linux 5.2 or later with FUSE \
         available (`modprobe fuse` loads it; `grep fuse /proc/filesystems` shows it)"
    )]
    Mount {
        /// The call that failed.
        call: &'static str,
        /// What the kernel said.
        errno: rustix::io::Errno,
    },
    /// The router could not be started, reached or heard.
    #[error(transparent)]
    Helper(#[from] HelperError),
    /// The router reported its own failure.
    #[error("the router failed ({step:?}): {failure}")]
    Router {
        /// The router's step that failed.
        step: lazaret_proto::router::RouterStep,
        /// What it said.
        failure: lazaret_proto::failure::Failure,
    },
    /// The served mount could not be attached where `/workspace` is staged.
    #[error("cannot attach the routed workspace at {}: {errno}", target.display())]
    Attach {
        /// Where.
        target: std::path::PathBuf,
        /// What the kernel said.
        errno: rustix::io::Errno,
    },
}

/// How long the router may take to read its rules and answer the kernel.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The running router.
#[derive(Debug)]
pub struct Routed {
    /// Its pidfd.
    pub pidfd: OwnedFd,
    /// What it serves.
    pub summary: RoutingSummary,
}

/// Opens `/dev/fuse`, saying what to do when the user cannot.
fn open_fuse() -> Result<OwnedFd, WorkspaceError> {
    rustix::fs::open("/dev/fuse", OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())
        .map_err(|errno| WorkspaceError::OpenFuse { errno })
}

/// A started Workspace Router, waiting for its one request.
pub type Router = Helper<RouterRequest, RouterReport>;

/// Starts a router. The supervisor starts it before the plan comes, so
/// that serving the workspace does not wait for a process to start; one
/// never sent a request exits when its channel closes.
pub fn start_router() -> Result<Router, HelperError> {
    Router::start("lazaret-router", "the router", ROUTER_CAPABILITIES, true)
}

/// The workspace's FUSE mount, served and not yet attached anywhere.
#[derive(Debug)]
pub struct Served {
    /// The detached mount (`fsmount`).
    mount: OwnedFd,
    /// The router serving it.
    routed: Routed,
}

impl Served {
    /// Attaches the mount at `target`; the router that serves it.
    pub fn attach(self, target: &Path) -> Result<Routed, WorkspaceError> {
        rustix::mount::move_mount(
            self.mount.as_fd(),
            "",
            rustix::fs::CWD,
            target,
            MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
        )
        .map_err(|errno| WorkspaceError::Attach {
            target: target.to_owned(),
            errno,
        })?;
        Ok(self.routed)
    }
}

/// Makes the workspace's FUSE mount, detached (so that it is made while
/// the rest is staged), and has `router` serve it on `host`, `isolated`
/// and the `rules` memfd.
pub fn serve(
    router: Result<Router, HelperError>,
    host: BorrowedFd<'_>,
    isolated: BorrowedFd<'_>,
    rules: BorrowedFd<'_>,
) -> Result<Served, WorkspaceError> {
    let router = router?;
    let fuse = open_fuse()?;
    let mount = detached_mount(fuse.as_fd())
        .map_err(|(call, errno)| WorkspaceError::Mount { call, errno })?;

    let request = RouterRequest::Serve(ServeRequest {
        fuse: FdIndex(0),
        host: FdIndex(1),
        isolated: FdIndex(2),
        rules: FdIndex(3),
    });
    let sent = router.pidfd().and_then(|pidfd| {
        router
            .send(&request, &[fuse.as_fd(), host, isolated, rules])
            .map(|()| pidfd)
    });
    // The router is the connection's only server from here on.
    drop(fuse);
    let result = sent.map_err(WorkspaceError::from).and_then(|pidfd| {
        match router.report(READY_TIMEOUT)? {
            RouterReport::Ready(summary) => Ok(Routed { pidfd, summary }),
            RouterReport::Failed(error) => Err(WorkspaceError::Router {
                step: error.step,
                failure: error.failure,
            }),
        }
    });
    router
        .keep_if_ok(result)
        .map(|routed| Served { mount, routed })
}

/// A FUSE superblock on the connection `fuse`, as a mount attached
/// nowhere: `nosuid`, `nodev`, every file as root's to the kernel (the
/// router decides access), open to the sandbox's other users. A failure
/// names the call that failed.
fn detached_mount(fuse: BorrowedFd<'_>) -> Result<OwnedFd, (&'static str, rustix::io::Errno)> {
    let context = rustix::mount::fsopen("fuse", FsOpenFlags::FSOPEN_CLOEXEC)
        .map_err(|e| ("fsopen(\"fuse\")", e))?;
    for (call, key, value) in [
        ("fsconfig(fd)", "fd", fuse.as_raw_fd().to_string()),
        ("fsconfig(rootmode)", "rootmode", "40000".to_owned()),
        ("fsconfig(user_id)", "user_id", "0".to_owned()),
        ("fsconfig(group_id)", "group_id", "0".to_owned()),
    ] {
        rustix::mount::fsconfig_set_string(context.as_fd(), key, value).map_err(|e| (call, e))?;
    }
    rustix::mount::fsconfig_set_flag(context.as_fd(), "allow_other")
        .map_err(|e| ("fsconfig(allow_other)", e))?;
    rustix::mount::fsconfig_create(context.as_fd()).map_err(|e| ("fsconfig(CREATE)", e))?;
    rustix::mount::fsmount(
        context.as_fd(),
        FsMountFlags::FSMOUNT_CLOEXEC,
        MountAttrFlags::MOUNT_ATTR_NOSUID | MountAttrFlags::MOUNT_ATTR_NODEV,
    )
    .map_err(|e| ("fsmount", e))
}
