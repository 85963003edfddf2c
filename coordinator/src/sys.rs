//! The coordinator's only unsafe code: work a spawned child does between
//! fork and exec.

#![allow(unsafe_code)]

use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::process::{Child, Command};

/// Spawns `command` with `fds` inherited under their own numbers: between
/// fork and exec the child clears their close-on-exec flag. They stay
/// close-on-exec in this process, so no other child inherits them. With
/// `user_namespace`, the child joins that user namespace before it
/// executes (the forked child is single-threaded, as `setns` requires).
pub fn spawn_inheriting(
    command: &mut Command,
    fds: &[BorrowedFd<'_>],
    user_namespace: Option<BorrowedFd<'_>>,
) -> std::io::Result<Child> {
    use std::os::unix::process::CommandExt;
    let raw: Vec<RawFd> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
    let user_namespace = user_namespace.map(|fd| fd.as_raw_fd());
    // SAFETY: the closure runs in the child between fork and exec, where
    // only async-signal-safe work is allowed. It reads a vector allocated
    // before the fork and makes raw `fcntl` and `setns` calls through
    // rustix (no allocation, no locks), returning errors by value. The
    // descriptors are open in the child: it is a copy of this process,
    // forked inside `spawn` below while `fds` and the namespace are
    // borrowed.
    unsafe {
        command.pre_exec(move || {
            for &fd in &raw {
                let fd = BorrowedFd::borrow_raw(fd);
                rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty())?;
            }
            if let Some(fd) = user_namespace {
                rustix::thread::move_into_link_name_space(
                    BorrowedFd::borrow_raw(fd),
                    Some(rustix::thread::LinkNameSpaceType::User),
                )?;
            }
            Ok(())
        });
    }
    command.spawn()
}
