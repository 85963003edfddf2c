//! The supervisor's only unsafe code: `unshare(2)`, the `fork(2)` that
//! makes the Domain's pid 1, and the work children do between fork and
//! exec.
//!
//! rustix marks `unshare` unsafe because unsharing the descriptor table
//! (`CLONE_FILES`) can invalidate descriptors other threads hold. The
//! supervisor never unshares `CLONE_FILES`, and calls this only while it is
//! single-threaded (before it spawns anything), which `CLONE_NEWUSER`
//! requires anyway. `fork` without `exec` is sound only in a process of one
//! thread, which [`fork_single_threaded`] checks before it forks.

#![allow(unsafe_code)]

use std::os::fd::OwnedFd;

use rustix::thread::UnshareFlags;

/// `unshare(2)` of namespaces only.
///
/// Refuses `CLONE_FILES`, `CLONE_FS` and `CLONE_SYSVSEM`: only namespace
/// flags are accepted.
pub fn unshare_namespaces(flags: UnshareFlags) -> std::io::Result<()> {
    let namespaces = UnshareFlags::NEWUSER
        | UnshareFlags::NEWNS
        | UnshareFlags::NEWNET
        | UnshareFlags::NEWPID
        | UnshareFlags::NEWIPC
        | UnshareFlags::NEWUTS;
    if !namespaces.contains(flags) {
        return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
    }
    // SAFETY: only namespace flags are passed (checked above), so no
    // descriptor table or filesystem context is unshared; descriptors held
    // anywhere in this process stay valid.
    unsafe { rustix::thread::unshare_unsafe(flags) }.map_err(Into::into)
}

/// Which side of [`fork_single_threaded`] this process is on.
#[derive(Debug)]
pub enum Forked {
    /// The new process.
    Child,
    /// The process that forked, with the child's pidfd.
    Parent(OwnedFd),
}

/// `fork(2)` of a process that has one thread, and the child's pidfd for
/// the parent. Refuses (`WouldBlock`) when this process has more than one
/// thread: another thread could hold a lock (the allocator's, a standard
/// stream's) that the child, which continues without `exec`, would then
/// wait on forever.
pub fn fork_single_threaded() -> std::io::Result<Forked> {
    if std::fs::read_dir("/proc/self/task")?.count() != 1 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::WouldBlock,
            "the process has more than one thread",
        ));
    }
    // SAFETY: the process has one thread (checked above; nothing here
    // starts one before the fork), so no lock can be held by a thread that
    // does not exist in the child, and the child may go on running Rust
    // code without `exec`. glibc's `fork` runs its own at-fork handlers.
    match unsafe { libc::fork() } {
        -1 => Err(std::io::Error::last_os_error()),
        0 => Ok(Forked::Child),
        pid => {
            // The child is this process's and unreaped (nothing waits
            // before this), so the pid names it until its pidfd is open.
            let pid = rustix::process::Pid::from_raw(pid).ok_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::InvalidData, "fork returned pid 0")
            })?;
            let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())?;
            Ok(Forked::Parent(pidfd))
        }
    }
}

/// Makes a spawned child the leader of a new session whose controlling
/// terminal is its standard input (the PTY slave), as an interactive
/// process needs: `setsid(2)` then `ioctl(0, TIOCSCTTY)` between fork and
/// exec.
pub fn with_controlling_terminal(command: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the child between fork and exec, where
    // only async-signal-safe work is allowed. It makes two raw system calls
    // through rustix (no allocation, no locks, no shared state) and returns
    // their errors by value.
    unsafe {
        command.pre_exec(|| {
            rustix::process::setsid()?;
            rustix::process::ioctl_tiocsctty(rustix::stdio::stdin())?;
            Ok(())
        });
    }
}

/// Leaves a spawned child the capabilities `kept` and no other: between
/// fork and exec it optionally moves into a new, empty network namespace
/// (while it still may), drops every other capability from its bounding
/// set and sets `no_new_privs`. Executing as root of the user namespace
/// then grants exactly the bounding set, so the program starts with `kept`
/// in the Domain user namespace and nothing else.
pub fn with_capabilities_only(
    command: &mut std::process::Command,
    kept: rustix::thread::CapabilitySet,
    new_network: bool,
) {
    use rustix::thread::{CapabilitySet, UnshareFlags};
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the child between fork and exec, where
    // only async-signal-safe work is allowed. It makes raw `unshare` and
    // `prctl` calls through rustix and iterates a bit set held on the
    // stack (no allocation, no locks, no shared state), returning errors by
    // value. `unshare` is given `CLONE_NEWNET` only, which invalidates no
    // descriptor; the child has one thread.
    unsafe {
        command.pre_exec(move || {
            if new_network {
                rustix::thread::unshare_unsafe(UnshareFlags::NEWNET)?;
            }
            for capability in CapabilitySet::all().difference(kept).iter() {
                match rustix::thread::remove_capability_from_bounding_set(capability) {
                    // Capabilities newer than the running kernel do not exist.
                    Ok(()) | Err(rustix::io::Errno::INVAL) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            rustix::thread::set_no_new_privs(true)?;
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn fork_is_refused_beside_another_thread() {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let other = std::thread::spawn(move || stopped.recv());
        let refused = super::fork_single_threaded();
        stop.send(()).unwrap();
        other.join().unwrap().unwrap();
        let error = refused.expect_err("forked with two threads");
        assert_eq!(error.kind(), std::io::ErrorKind::WouldBlock);
    }
}
