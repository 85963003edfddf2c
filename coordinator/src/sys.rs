//! The coordinator's only unsafe code: work a spawned child does between
//! fork and exec, the launch spawner's fork of a launch process as its
//! parent's child (`CLONE_PARENT`), the one socket option rustix does not
//! name (`SO_PEERPIDFD`), registering descriptors with the event loop's
//! reactor, and taking the descriptors the launch mode is handed by
//! number.

#![allow(unsafe_code)]

use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::process::{Child, Command};

/// What a spawned child does between fork and exec.
#[derive(Debug, Default, Clone, Copy)]
pub struct ChildSetup<'a> {
    /// Descriptors the child inherits under their own numbers: it clears
    /// their close-on-exec flag. They stay close-on-exec in this process,
    /// so no other child inherits them.
    pub fds: &'a [BorrowedFd<'a>],
    /// A user namespace the child joins before it executes (the forked
    /// child is single-threaded, as `setns` requires).
    pub user_namespace: Option<BorrowedFd<'a>>,
    /// Whether the child is killed when this process dies.
    pub die_with_parent: bool,
}

/// Spawns `command` set up as `setup` says.
pub fn spawn_inheriting(command: &mut Command, setup: ChildSetup<'_>) -> std::io::Result<Child> {
    use std::os::unix::process::CommandExt;
    let raw: Vec<RawFd> = setup.fds.iter().map(|fd| fd.as_raw_fd()).collect();
    let user_namespace = setup.user_namespace.map(|fd| fd.as_raw_fd());
    let die_with_parent = setup.die_with_parent;
    // SAFETY: the closure runs in the child between fork and exec, where
    // only async-signal-safe work is allowed. It reads a vector allocated
    // before the fork and makes raw `fcntl`, `setns` and `prctl` calls
    // through rustix (no allocation, no locks), returning errors by value.
    // The descriptors are open in the child: it is a copy of this process,
    // forked inside `spawn` below while `setup`'s descriptors are borrowed.
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
            if die_with_parent {
                rustix::process::set_parent_process_death_signal(Some(
                    rustix::process::Signal::KILL,
                ))?;
            }
            Ok(())
        });
    }
    command.spawn()
}

/// Takes the descriptor numbered `raw` that this process's parent handed
/// it (the launch mode's executable and report pipe), making it
/// close-on-exec; an error when no such descriptor is open (`fcntl(2)`,
/// `F_GETFD`) or it is a standard stream.
pub fn inherited(raw: RawFd) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    if raw <= 2 {
        return Err(std::io::Error::other(format!(
            "descriptor {raw} is a standard stream"
        )));
    }
    // SAFETY: `F_GETFD` takes no pointer; on a number that is not open it
    // fails with `EBADF` and changes nothing.
    if unsafe { libc::fcntl(raw, libc::F_GETFD) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `raw` is open (`F_GETFD` succeeded) and above the standard
    // streams. The launch mode calls this first thing in `main`, single-
    // threaded, once for each of the distinct numbers its parent placed
    // there for it and named on its command line, so nothing else in this
    // process owns the descriptor.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
    rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::CLOEXEC)?;
    Ok(fd)
}

/// `SO_PEERPIDFD` (asm-generic, and x86-64's).
const SO_PEERPIDFD: libc::c_int = 77;

/// A pidfd of the process at the other end of a connected Unix socket
/// (`SO_PEERPIDFD`, Linux 6.5): the process that connected, held so that
/// its pid cannot be reused under us.
pub fn peer_pidfd(socket: BorrowedFd<'_>) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `getsockopt` writes at most `len` bytes into `fd`, a live
    // `c_int` of that size, and updates `len`; `socket` is a borrowed, open
    // descriptor for the duration of the call.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&raw mut fd).cast(),
            &raw mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if fd < 0 || len as usize != std::mem::size_of::<libc::c_int>() {
        return Err(std::io::Error::other("SO_PEERPIDFD returned no descriptor"));
    }
    // SAFETY: the kernel installed `fd` in this process for the caller (it
    // is close-on-exec) and nothing else owns it.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// A channel endpoint shared with synchronous code, registered by its
/// descriptor.
#[derive(Debug)]
pub struct SharedEndpoint<S, R>(pub std::sync::Arc<lazaret_proto::channel::Endpoint<S, R>>);

impl<S, R> AsRawFd for SharedEndpoint<S, R> {
    fn as_raw_fd(&self) -> RawFd {
        std::os::fd::AsFd::as_fd(&*self.0).as_raw_fd()
    }
}

/// Registers a descriptor this process owns with the current runtime's
/// reactor.
pub fn register_owned(
    fd: std::os::fd::OwnedFd,
) -> std::io::Result<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>> {
    // SAFETY: the `AsyncFd` owns `fd`, so the descriptor stays open and
    // names the same open file description until the `AsyncFd` is dropped,
    // and `as_raw_fd` of an `OwnedFd` always returns it.
    unsafe { tokio::io::unix::AsyncFd::register(fd) }.map_err(std::io::Error::from)
}

/// Registers a shared channel endpoint with the current runtime's reactor.
pub fn register_endpoint<S, R>(
    endpoint: std::sync::Arc<lazaret_proto::channel::Endpoint<S, R>>,
) -> std::io::Result<tokio::io::unix::AsyncFd<SharedEndpoint<S, R>>> {
    // SAFETY: the `AsyncFd` holds an `Arc` of the endpoint, which owns its
    // descriptor for as long as any `Arc` lives and never replaces it, so
    // the descriptor stays open and names the same socket until the
    // `AsyncFd` is dropped, and `as_raw_fd` always returns it.
    unsafe { tokio::io::unix::AsyncFd::register(SharedEndpoint(endpoint)) }
        .map_err(std::io::Error::from)
}

/// A launch process, ready to fork: everything the child needs is made
/// before the fork, so the child only makes system calls.
#[derive(Debug)]
pub struct LaunchPlan<'a> {
    /// The program to execute.
    pub program: std::ffi::CString,
    /// Its arguments, element zero its name.
    pub argv: Vec<std::ffi::CString>,
    /// Its whole environment, `NAME=VALUE` each.
    pub environment: Vec<std::ffi::CString>,
    /// Its standard input, output and error.
    pub stdin: BorrowedFd<'a>,
    /// See `stdin`.
    pub stdout: BorrowedFd<'a>,
    /// See `stdin`.
    pub stderr: BorrowedFd<'a>,
    /// Its working directory.
    pub directory: BorrowedFd<'a>,
    /// Descriptors it inherits under their own numbers.
    pub inherited: [BorrowedFd<'a>; 2],
    /// The pid of this process's parent, which becomes the child's; the
    /// child dies with it (`PR_SET_PDEATHSIG`) and gives up if it is gone.
    pub parent: i32,
}

/// Forks `plan`'s program as a child of this process's parent
/// (`CLONE_PARENT`), in a process group of its own: its pidfd, and the
/// error number of the step that failed if it did not reach `execve`.
/// Call it only from a single-threaded process (the launch spawner).
pub fn fork_launch(plan: &LaunchPlan<'_>) -> std::io::Result<(std::os::fd::OwnedFd, Option<i32>)> {
    use std::os::fd::FromRawFd;
    let pointers = |strings: &[std::ffi::CString]| {
        let mut list: Vec<*const libc::c_char> = strings.iter().map(|s| s.as_ptr()).collect();
        list.push(std::ptr::null());
        list
    };
    // Each descriptor the child moves or keeps lies above the standard
    // streams, which it replaces: none is lost to an earlier `dup2`.
    let fds = [plan.stdin, plan.stdout, plan.stderr, plan.directory];
    if fds
        .iter()
        .chain(&plan.inherited)
        .any(|fd| fd.as_raw_fd() <= 2)
    {
        return Err(std::io::Error::from_raw_os_error(libc::EBADF));
    }
    let argv = pointers(&plan.argv);
    let envp = pointers(&plan.environment);
    // The child writes its error number here when it cannot execute;
    // `execve` closes it (close-on-exec), so an empty read means it ran.
    let (failure_read, failure_write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    if failure_write.as_raw_fd() <= 2 {
        return Err(std::io::Error::from_raw_os_error(libc::EBADF));
    }
    let mut pidfd: libc::c_int = -1;
    let flags = (libc::CLONE_PARENT | libc::CLONE_PIDFD) as libc::c_ulong;
    // SAFETY: a `clone` without `CLONE_VM` and without a new stack is a
    // fork: the child runs on a copy of this process's memory. The caller
    // is single-threaded, so no lock is held by another thread in that
    // copy; the child only makes raw system calls on pointers made above
    // (live in its copy) and ends in `execve` or `_exit`, never returning.
    // `pidfd` is a live `c_int` the kernel writes in the parent
    // (`CLONE_PIDFD` uses the parent-tid argument).
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            flags,
            0usize,
            &raw mut pidfd,
            0usize,
            0usize,
        )
    };
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: this is the forked child; see above.
        unsafe { launch_child(plan, &argv, &envp, failure_write.as_raw_fd()) }
    }
    drop(failure_write);
    // SAFETY: the kernel installed `pidfd` in this process for this call
    // (close-on-exec), and nothing else owns it.
    let pidfd = unsafe { std::os::fd::OwnedFd::from_raw_fd(pidfd) };
    let mut errno = [0u8; 4];
    let failed = loop {
        match rustix::io::read(&failure_read, &mut errno) {
            Ok(4) => break Some(i32::from_ne_bytes(errno)),
            Ok(_) => break None,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => break Some(e.raw_os_error()),
        }
    };
    Ok((pidfd, failed))
}

/// The launch process between fork and exec: its standard streams, its
/// directory and group, its parent-death signal, its two inherited
/// descriptors, then `execve`. On a failure it writes the error number
/// to `failure` and exits.
///
/// # Safety
///
/// Only in the child of [`fork_launch`]: it never returns.
unsafe fn launch_child(
    plan: &LaunchPlan<'_>,
    argv: &[*const libc::c_char],
    envp: &[*const libc::c_char],
    failure: RawFd,
) -> ! {
    // SAFETY: every call below is a raw system call on descriptors that
    // are open in this copy of the process and on pointers to live,
    // NUL-terminated strings and null-terminated arrays made before the
    // fork; nothing allocates or takes a lock.
    unsafe {
        let fail = || -> ! {
            let errno = (*libc::__errno_location()).to_ne_bytes();
            libc::write(failure, errno.as_ptr().cast(), errno.len());
            libc::_exit(127)
        };
        let streams = [plan.stdin, plan.stdout, plan.stderr];
        for (number, fd) in streams.iter().enumerate() {
            if libc::dup2(fd.as_raw_fd(), number as libc::c_int) < 0 {
                fail();
            }
        }
        if libc::fchdir(plan.directory.as_raw_fd()) < 0 || libc::setpgid(0, 0) < 0 {
            fail();
        }
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) < 0 {
            fail();
        }
        if libc::getppid() != plan.parent {
            *libc::__errno_location() = libc::ESRCH;
            fail();
        }
        for fd in plan.inherited {
            if libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, 0) < 0 {
                fail();
            }
        }
        libc::execve(plan.program.as_ptr(), argv.as_ptr(), envp.as_ptr());
        fail()
    }
}
