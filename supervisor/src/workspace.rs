//! The routed workspace: a FUSE filesystem mounted where the sandbox's
//! `/workspace` is staged, served by the generation's Workspace Router.
//!
//! Owns the mount and the router's launch: `/dev/fuse` opened and mounted
//! here, in the Domain mount namespace; the router started beside this
//! executable (never through `PATH`), in a network namespace of its own
//! with no interface, with CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH and
//! CAP_FOWNER alone; handed the connection, the host workspace, the
//! Domain's isolated directory and the sealed rules memfd over its
//! channel. This process then closes its own copy of the connection, so
//! that the router is its only server: if the router dies, every request
//! fails at once instead of waiting. Trusts the Host Coordinator's plan and
//! the router's report only as far as relaying it.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use lazaret_proto::channel::{ChannelError, Received, pair};
use lazaret_proto::error_chain as chain;
use lazaret_proto::router::{
    ROUTER_CAPABILITIES, RouterReport, RouterRequest, RoutingSummary, ServeRequest,
};
use lazaret_proto::supervisor::FdIndex;
use rustix::fs::{Mode, OFlags};
use rustix::mount::MountFlags;

use crate::sys::with_capabilities_only;

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

/// The router executable: beside this one.
fn router_binary() -> Result<PathBuf, String> {
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot locate the supervisor's executable: {e}"))?;
    let path = exe.with_file_name("lazaret-router");
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "lazaret-router is not installed beside {}",
            exe.display()
        ))
    }
}

/// Opens `/dev/fuse`, saying what to do when the user cannot.
fn open_fuse() -> Result<OwnedFd, String> {
    rustix::fs::open("/dev/fuse", OFlags::RDWR | OFlags::CLOEXEC, Mode::empty()).map_err(|e| {
        format!(
            "cannot open /dev/fuse ({e}); the workspace is served over FUSE, so the invoking \
             user must be able to open it, as on desktop distributions (mode 0666); \
             `packaging/device-access.sh` makes it so"
        )
    })
}

/// Mounts the workspace at `target` and starts its router on `host`,
/// `isolated` and the `rules` memfd.
pub fn route(
    target: &Path,
    host: BorrowedFd<'_>,
    isolated: BorrowedFd<'_>,
    rules: BorrowedFd<'_>,
) -> Result<Routed, String> {
    let binary = router_binary()?;
    let fuse = open_fuse()?;
    let options = format!(
        "fd={},rootmode=40000,user_id=0,group_id=0,allow_other",
        fuse.as_raw_fd()
    );
    crate::mounts::mount(
        "the routed workspace",
        target,
        "fuse",
        MountFlags::NOSUID | MountFlags::NODEV,
        &options,
    )
    .map_err(|e| chain(&e))?;

    let (ours, theirs) = pair::<RouterRequest, RouterReport>()
        .map_err(|e| format!("cannot make the router's channel: {}", chain(&e)))?;
    let mut command = Command::new(&binary);
    command
        .env_clear()
        .stdin(Stdio::from(theirs.into_fd()))
        .stdout(Stdio::null());
    with_capabilities_only(&mut command, ROUTER_CAPABILITIES, true);
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
    let pidfd = crate::pidfd_of(child.id()).map_err(|e| format!("cannot hold the router: {e}"));

    let request = RouterRequest::Serve(ServeRequest {
        fuse: FdIndex(0),
        host: FdIndex(1),
        isolated: FdIndex(2),
        rules: FdIndex(3),
    });
    let sent = ours
        .send(&request, &[fuse.as_fd(), host, isolated, rules])
        .map_err(|e| format!("cannot reach the router: {}", chain(&e)));
    // The router is the connection's only server from here on.
    drop(fuse);
    let result = pidfd.and_then(|pidfd| {
        sent?;
        match crate::readable_within(ours.as_fd(), READY_TIMEOUT) {
            Ok(true) => {}
            Ok(false) => {
                return Err(format!(
                    "the router did not answer within {} s",
                    READY_TIMEOUT.as_secs()
                ));
            }
            Err(e) => return Err(format!("cannot wait for the router: {e}")),
        }
        match ours.recv() {
            Ok(Received {
                message: RouterReport::Ready(summary),
                ..
            }) => Ok(Routed { pidfd, summary }),
            Ok(Received {
                message: RouterReport::Failed(error),
                ..
            }) => Err(format!(
                "the router failed ({:?}): {}",
                error.step, error.detail
            )),
            Err(ChannelError::Disconnected) => {
                Err("the router exited without a report; see the Domain log".to_owned())
            }
            Err(e) => Err(format!("bad report from the router: {}", chain(&e))),
        }
    });
    if result.is_err() {
        let _ = child.kill();
        let _ = child.wait();
    }
    result
}
