//! The coordinator's only unsafe code: work a spawned child does between
//! fork and exec, the one socket option rustix does not name
//! (`SO_PEERPIDFD`), registering descriptors with the event loop's
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
