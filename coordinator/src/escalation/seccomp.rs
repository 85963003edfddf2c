//! The launch process's system calls once the approved command runs: it
//! only follows the command to its end, walks `/proc` for what the command
//! left below it, signals and reaps, and writes its report. It starts
//! nothing more and opens nothing but `/proc`.
//!
//! Installed by [`super::subreaper`] right after it started the command,
//! which therefore runs unfiltered, as the developer approved it. Trusts
//! nothing; owns the list.

use lazaret_proto::seccomp::{AllowList, SeccompError};

/// Installs the launch process's filter.
pub fn install_launcher() -> Result<(), SeccompError> {
    let mut list = AllowList::runtime("lazaret-coordinator-launch");
    // Following the command: reaping (wait4 for any child, waitid), its
    // signals' wake-ups on a socket pair, and signals to what is below it,
    // directly or by pidfd.
    list.allow(&[
        libc::SYS_wait4,
        libc::SYS_waitid,
        libc::SYS_kill,
        libc::SYS_pidfd_open,
        libc::SYS_pidfd_send_signal,
        libc::SYS_sendto,
        libc::SYS_recvfrom,
    ]);
    // Walking /proc/PID/task/TID/children and reading /proc/PID/stat.
    list.allow(&[libc::SYS_openat, libc::SYS_getdents64, libc::SYS_lseek]);
    list.install()
}
