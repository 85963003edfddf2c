//! The Runtime Supervisor's system calls, once the sandbox runs.
//!
//! Stage one (the process the coordinator started, outside the Domain pid
//! namespace) only waits for stage two then: its list is the shared group
//! and `waitid`. Stage two (the Domain's pid 1) then serves sessions and
//! rechecks: it starts `runsc exec` and `runsc kill` and Observe sidecars,
//! signals and reaps. A filter survives `execve`, so its list holds what
//! those programs need too (runsc is a static Go program; the sidecar goes
//! through the dynamic loader before its own, narrower, filter), and still
//! leaves out every mount, namespace, module, tracing, BPF and keyring
//! call: nothing the supervisor starts after `runsc run` makes one.
//!
//! Installed by [`crate::run_sandbox`] (stage two, after `runsc run
//! -detach` returned and before it reports the sandbox running: the
//! sandbox and gofer were started unfiltered, and runsc confines them with
//! its own filters) and by stage one once it has forked stage two. Trusts
//! nothing; owns the lists.

use lazaret_proto::seccomp::{AllowList, SeccompError};

/// `PR_SET_VMA` (`prctl(2)`), which the libc crate does not name.
const PR_SET_VMA: i32 = 0x5356_4d41;

/// Installs stage one's filter: it only waits for stage two and exits.
pub fn install_stage_one() -> Result<(), SeccompError> {
    let mut list = AllowList::runtime("lazaret-supervisor-stage-one");
    // Waiting for stage two by its pidfd.
    list.allow(&[libc::SYS_waitid]);
    list.install()
}

/// Installs stage two's filter on every thread, once the sandbox runs.
pub fn install_stage_two() -> Result<(), SeccompError> {
    let mut list = AllowList::runtime("lazaret-supervisor");
    // Its channel to the coordinator and the descriptors it passes.
    list.allow(&[libc::SYS_sendmsg, libc::SYS_recvmsg]);
    // Starting programs (runsc exec and kill, Observe sidecars): pipes
    // for their status, the child's set-up between fork and exec (a
    // session and controlling terminal for a terminal session, its
    // capability bounding set, no_new_privs), the exec itself, and a
    // role's own start (its inherited descriptors closed, its filter).
    list.allow(&[
        libc::SYS_pipe2,
        libc::SYS_dup2,
        libc::SYS_dup3,
        libc::SYS_setsid,
        libc::SYS_setpgid,
        libc::SYS_execve,
        libc::SYS_ioctl,
        libc::SYS_open,
        libc::SYS_openat,
        libc::SYS_readlink,
        libc::SYS_getdents64,
        libc::SYS_lseek,
        libc::SYS_close_range,
        libc::SYS_seccomp,
    ]);
    // A session's environment (a sealed memfd) and the wait for its
    // process to appear (inotify).
    list.allow(&[
        libc::SYS_memfd_create,
        libc::SYS_inotify_init1,
        libc::SYS_inotify_add_watch,
        libc::SYS_inotify_rm_watch,
    ]);
    let options = [
        libc::PR_SET_NAME,
        libc::PR_CAPBSET_DROP,
        libc::PR_SET_NO_NEW_PRIVS,
        libc::PR_GET_NO_NEW_PRIVS,
        libc::PR_SET_PDEATHSIG,
        libc::PR_CAPBSET_READ,
        // Go's runtime (1.25 and later) names its memory mappings at start.
        PR_SET_VMA,
    ];
    list.allow_when_first_is(libc::SYS_prctl, &options);
    // Processes: pidfds, signals, and reaping every orphan of the Domain.
    list.allow(&[
        libc::SYS_pidfd_open,
        libc::SYS_pidfd_send_signal,
        libc::SYS_kill,
        libc::SYS_waitid,
        libc::SYS_wait4,
        libc::SYS_getppid,
        libc::SYS_getuid,
        libc::SYS_getgid,
        libc::SYS_geteuid,
        libc::SYS_getegid,
        libc::SYS_capget,
        libc::SYS_capset,
    ]);
    // Sockets: runsc's to the sandbox's control socket (AF_UNIX), and an
    // Observe sidecar's (netlink, and its probes over IPv4 and IPv6).
    let families = [
        libc::AF_UNIX,
        libc::AF_NETLINK,
        libc::AF_INET,
        libc::AF_INET6,
    ];
    list.allow_when_first_is(libc::SYS_socket, &families);
    // What runsc, a static Go program, calls to start, reach the
    // sandbox's control socket, and deliver a signal or a terminal size.
    list.allow(&[
        libc::SYS_socketpair,
        libc::SYS_bind,
        libc::SYS_shutdown,
        libc::SYS_membarrier,
        libc::SYS_getrlimit,
        libc::SYS_arch_prctl,
        libc::SYS_set_tid_address,
        libc::SYS_uname,
        libc::SYS_prlimit64,
        libc::SYS_readlinkat,
        libc::SYS_flock,
        libc::SYS_unlinkat,
        libc::SYS_connect,
        libc::SYS_getsockopt,
        libc::SYS_setsockopt,
        libc::SYS_getsockname,
        libc::SYS_getpeername,
        libc::SYS_sendto,
        libc::SYS_recvfrom,
        libc::SYS_pread64,
        libc::SYS_access,
        libc::SYS_faccessat,
        libc::SYS_faccessat2,
        libc::SYS_getcwd,
        libc::SYS_fchdir,
        libc::SYS_chdir,
        libc::SYS_mlock,
        libc::SYS_epoll_pwait2,
    ]);
    list.install()
}
