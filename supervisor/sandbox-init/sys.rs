//! The few C library calls `lazaret-init` needs that `std` does not offer:
//! waiting for any child, signalling a pid, and taking signals
//! synchronously. Declared by hand (the program has no dependencies beyond
//! `std`, whose static C library provides them); each wrapper is safe.

use std::io;

pub const SIGHUP: i32 = 1;
pub const SIGINT: i32 = 2;
pub const SIGQUIT: i32 = 3;
pub const SIGKILL: i32 = 9;
pub const SIGTERM: i32 = 15;
pub const SIGCHLD: i32 = 17;
pub const SIGTSTP: i32 = 20;
pub const SIGTTIN: i32 = 21;
pub const SIGTTOU: i32 = 22;

const SIG_BLOCK: i32 = 0;
const SIG_SETMASK: i32 = 2;

/// The C library's `sigset_t`: 1024 bits.
#[repr(C)]
struct SigSet([u64; 16]);

/// The C library's `siginfo_t`: 128 bytes, of which only the signal
/// number is read.
#[repr(C)]
struct SigInfo {
    signo: i32,
    errno: i32,
    code: i32,
    rest: [u8; 116],
}

unsafe extern "C" {
    fn waitpid(pid: i32, status: *mut i32, options: i32) -> i32;
    fn kill(pid: i32, signal: i32) -> i32;
    fn sigemptyset(set: *mut SigSet) -> i32;
    fn sigaddset(set: *mut SigSet, signal: i32) -> i32;
    fn sigprocmask(how: i32, set: *const SigSet, old: *mut SigSet) -> i32;
    fn sigwaitinfo(set: *const SigSet, info: *mut SigInfo) -> i32;
}

/// Waits for any child to end and reaps it: `Ok(())`, or the error
/// (`ECHILD` when there is no child).
pub fn reap_any() -> io::Result<()> {
    let mut status = 0;
    // SAFETY: `status` is a valid, writable int for the call.
    if unsafe { waitpid(-1, &mut status, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sends `signal` to `pid`; a process that is already gone is no error.
pub fn signal(pid: i32, signal: i32) {
    // SAFETY: plain system call on integers; no memory is passed.
    unsafe {
        kill(pid, signal);
    }
}

/// A set of signals this (single-threaded) process blocks and then takes
/// one at a time.
pub struct Signals(SigSet);

impl Signals {
    /// Blocks `signals`: from now on they wait for [`Signals::next`].
    /// Children inherit the mask unless started through
    /// [`Signals::unblocked_in_child`].
    pub fn block(signals: &[i32]) -> io::Result<Self> {
        let mut set = SigSet([0; 16]);
        // SAFETY: `set` is a valid sigset_t for each call; the signal
        // numbers are valid constants.
        unsafe {
            sigemptyset(&mut set);
            for &signal in signals {
                sigaddset(&mut set, signal);
            }
            if sigprocmask(SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(Self(set))
    }

    /// Makes `command`'s child start with no signal blocked.
    pub fn unblocked_in_child(command: &mut std::process::Command) {
        use std::os::unix::process::CommandExt;
        let empty = SigSet([0; 16]);
        // SAFETY: the closure runs in the forked child before exec and only
        // calls sigprocmask, which is async-signal-safe, on a set it owns.
        unsafe {
            command.pre_exec(move || {
                if sigprocmask(SIG_SETMASK, &empty, std::ptr::null_mut()) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }

    /// Waits for the next of the blocked signals and returns its number.
    pub fn next(&self) -> i32 {
        loop {
            let mut info = SigInfo {
                signo: 0,
                errno: 0,
                code: 0,
                rest: [0; 116],
            };
            // SAFETY: the set is initialised and `info` is a writable
            // siginfo_t-sized buffer.
            let signo = unsafe { sigwaitinfo(&self.0, &mut info) };
            if signo > 0 {
                return signo;
            }
            // EINTR (a signal outside the set): wait again.
        }
    }
}
