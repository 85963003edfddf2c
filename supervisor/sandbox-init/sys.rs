//! The few C library calls `lazaret-init` needs that `std` does not offer:
//! reaping any child, signalling a pid, and waiting for a signal with a
//! timeout. Declared by hand (the program has no dependencies
//! beyond `std`, whose static C library provides them); each wrapper is
//! safe.

use std::io;
use std::time::Duration;

pub const SIGKILL: i32 = 9;
pub const SIGCHLD: i32 = 17;

const SIG_BLOCK: i32 = 0;
const WNOHANG: i32 = 1;

/// The C library's `sigset_t`: 1024 bits.
#[repr(C)]
struct SigSet([u64; 16]);

/// The C library's `siginfo_t`: 128 bytes, filled by the kernel and not
/// read here.
#[repr(C)]
struct SigInfo([u8; 128]);

/// The C library's `struct timespec`.
#[repr(C)]
struct Timespec {
    seconds: i64,
    nanoseconds: i64,
}

unsafe extern "C" {
    fn waitpid(pid: i32, status: *mut i32, options: i32) -> i32;
    fn kill(pid: i32, signal: i32) -> i32;
    fn sigemptyset(set: *mut SigSet) -> i32;
    fn sigaddset(set: *mut SigSet, signal: i32) -> i32;
    fn sigprocmask(how: i32, set: *const SigSet, old: *mut SigSet) -> i32;
    fn sigtimedwait(set: *const SigSet, info: *mut SigInfo, timeout: *const Timespec) -> i32;
}

/// Reaps every child that has ended, without waiting.
pub fn reap_all() {
    loop {
        let mut status = 0;
        // SAFETY: `status` is a valid, writable int for the call.
        if unsafe { waitpid(-1, &mut status, WNOHANG) } <= 0 {
            return;
        }
    }
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
    /// Blocks `signals`: from now on they wait for [`Signals::next_within`].
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

    /// The next of the blocked signals, waiting at most `timeout`; `None`
    /// when none came (or another signal interrupted the wait).
    pub fn next_within(&self, timeout: Duration) -> Option<i32> {
        let mut info = SigInfo([0; 128]);
        let timeout = Timespec {
            seconds: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
            nanoseconds: i64::from(timeout.subsec_nanos()),
        };
        // SAFETY: the set is initialised, `info` is a writable
        // siginfo_t-sized buffer and `timeout` a valid timespec.
        let signo = unsafe { sigtimedwait(&self.0, &mut info, &timeout) };
        (signo > 0).then_some(signo)
    }
}
