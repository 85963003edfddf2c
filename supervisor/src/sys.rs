//! The supervisor's only unsafe code: `unshare(2)` and the work children
//! do between fork and exec.
//!
//! rustix marks `unshare` unsafe because unsharing the descriptor table
//! (`CLONE_FILES`) can invalidate descriptors other threads hold. The
//! supervisor never unshares `CLONE_FILES`, and calls this only while it is
//! single-threaded (before it spawns anything), which `CLONE_NEWUSER`
//! requires anyway.

#![allow(unsafe_code)]

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
