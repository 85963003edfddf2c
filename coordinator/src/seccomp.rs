//! The Host Coordinator's system calls once its generation is up: serving
//! the control and session sockets (TLS, descriptors passed), the
//! mailboxes (inotify, signed records), the stores (redb files, fsync,
//! locks), terminals for sessions, the journal, and watching and ending
//! its participants by pidfd. It starts no program itself: an approved
//! host command is started by the unconfined launch spawner
//! ([`crate::escalation::spawner`]), so this list has no `execve`, and no
//! mount, namespace, tracing, BPF, module or keyring call either.
//!
//! Installed by `lifecycle::daemon` once the sandbox is staged and its
//! network attested, after the last program the coordinator starts
//! (the supervisor, slirp4netns, skopeo) and before it goes live. Trusts
//! nothing; owns the list.

use lazaret_proto::seccomp::{AllowList, SeccompError};

/// Installs the coordinator's filter on every thread.
pub fn install() -> Result<(), SeccompError> {
    let mut list = AllowList::runtime("lazaret-coordinator");
    // Files: the stores, the mailboxes, the Domain log and its rotation
    // (standard error moved onto the new file with dup2), usage walks,
    // and the runtime directory's sockets.
    list.allow(&[
        libc::SYS_open,
        libc::SYS_openat,
        libc::SYS_openat2,
        libc::SYS_readlink,
        libc::SYS_renameat,
        libc::SYS_faccessat,
        libc::SYS_faccessat2,
        libc::SYS_lseek,
        libc::SYS_pread64,
        libc::SYS_pwrite64,
        libc::SYS_getdents64,
        libc::SYS_readlinkat,
        libc::SYS_mkdirat,
        libc::SYS_unlinkat,
        libc::SYS_renameat2,
        libc::SYS_linkat,
        libc::SYS_symlinkat,
        libc::SYS_fchmod,
        libc::SYS_fchmodat,
        libc::SYS_fchown,
        libc::SYS_fchownat,
        libc::SYS_utimensat,
        libc::SYS_ftruncate,
        libc::SYS_fallocate,
        libc::SYS_fsync,
        libc::SYS_fdatasync,
        libc::SYS_flock,
        libc::SYS_fstatfs,
        libc::SYS_statfs,
        libc::SYS_dup,
        libc::SYS_dup2,
        libc::SYS_dup3,
        libc::SYS_pipe2,
        libc::SYS_memfd_create,
        libc::SYS_ioctl,
        libc::SYS_umask,
    ]);
    // Sockets: Unix stream listeners and their clients (the peer's
    // credentials and pidfd), datagrams to the journal, descriptors passed
    // both ways.
    list.allow_when_first_is(libc::SYS_socket, &[libc::AF_UNIX]);
    list.allow(&[
        libc::SYS_socketpair,
        libc::SYS_bind,
        libc::SYS_listen,
        libc::SYS_accept4,
        libc::SYS_connect,
        libc::SYS_getsockopt,
        libc::SYS_setsockopt,
        libc::SYS_getsockname,
        libc::SYS_getpeername,
        libc::SYS_shutdown,
        libc::SYS_sendto,
        libc::SYS_recvfrom,
        libc::SYS_sendmsg,
        libc::SYS_recvmsg,
    ]);
    // Change notices: mailboxes and the workspace's git rules.
    list.allow(&[
        libc::SYS_inotify_init1,
        libc::SYS_inotify_add_watch,
        libc::SYS_inotify_rm_watch,
        libc::SYS_timerfd_create,
        libc::SYS_timerfd_settime,
    ]);
    // Participants: held, signalled and reaped by pidfd; the launch
    // processes are its children; its own ids and limits.
    list.allow(&[
        libc::SYS_pidfd_open,
        libc::SYS_pidfd_send_signal,
        libc::SYS_waitid,
        libc::SYS_wait4,
        libc::SYS_kill,
        libc::SYS_getppid,
        libc::SYS_getuid,
        libc::SYS_geteuid,
        libc::SYS_getgid,
        libc::SYS_getegid,
        libc::SYS_prlimit64,
        libc::SYS_uname,
    ]);
    list.install()
}
