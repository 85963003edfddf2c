//! The unsafe calls of the shared crate: closing every descriptor a role
//! inherited beyond the ones it was handed, and (for the seccomp tests) a
//! raw system call with arguments that do nothing.
//!
//! Trusts nothing a parent left open: a role starts with its standard
//! streams (its channel on standard input) and nothing else, whatever the
//! process that started the chain held.

#![allow(unsafe_code)]

/// Marks every descriptor above standard error close-on-exec
/// (`close_range(3, ~0, CLOSE_RANGE_CLOEXEC)`, `close_range(2)`): for a
/// process that takes descriptors it was handed by number, so that no
/// other one it inherited reaches a program it executes.
pub fn cloexec_inherited_descriptors() -> std::io::Result<()> {
    // SAFETY: `close_range` takes no pointers, and with
    // `CLOSE_RANGE_CLOEXEC` it closes nothing: it only sets a flag on each
    // descriptor, which no owner of one relies on being clear.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Closes every descriptor above standard error (`close_range(3, ~0, 0)`).
/// Call it first in a role's `main`, while the process is single-threaded
/// and before anything else opens a descriptor.
pub fn close_inherited_descriptors() -> std::io::Result<()> {
    // SAFETY: `close_range` takes no pointers. Closing descriptors another
    // part of this process owns would break I/O safety, so this runs first
    // in `main`, single-threaded, when no descriptor above 2 is owned by
    // anything: each one is a stray inherited from the parent.
    let rc = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Makes system call `number` with every argument zero: a null pointer,
/// no flags, no length, pid 0 (for `ptrace`, `PTRACE_ATTACH` of pid 0).
/// For the seccomp tests' forbidden calls, each of which then fails
/// (`EFAULT`, `EPERM`, `ESRCH`) or is stopped by the filter first.
#[cfg(debug_assertions)]
pub(crate) fn call_with_no_effect(number: i64) -> std::io::Result<i64> {
    let request = if number == libc::SYS_ptrace {
        libc::PTRACE_ATTACH as u64
    } else {
        0
    };
    // SAFETY: every pointer argument is null, which the kernel checks
    // (EFAULT) rather than dereferences in this process; no call in the
    // forbidden list (`kexec_load`, `ptrace`, `mount`, `bpf`, `execve`)
    // changes this process's memory or descriptors with these arguments.
    let rc = unsafe { libc::syscall(number, request, 0u64, 0u64, 0u64, 0u64, 0u64) };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}
