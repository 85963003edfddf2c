//! The Network Sidecar's system calls: reading its sealed request, the
//! enforcement namespace's links, addresses and routes (rtnetlink), the
//! packet filter (nf_tables), the IPv6 settings under /proc/sys, and its
//! probes (UDP and TCP over IPv4 and IPv6). It starts no program and makes
//! no namespace; its privilege, CAP_NET_ADMIN in the Domain, is what this
//! list keeps to networking.
//!
//! Installed by [`crate::run`] once its capabilities are checked, before it
//! reads its request. An Observe sidecar is started by the supervisor
//! under the supervisor's own filter, and the kernel applies both. Trusts
//! nothing; owns the list.

use lazaret_proto::seccomp::{AllowList, SeccompError};

/// Installs the sidecar's filter on every thread.
pub fn install() -> Result<(), SeccompError> {
    let mut list = AllowList::runtime("lazaret-netsidecar");
    // Sockets: netlink (routing and nf_tables), and the probes' IPv4 and
    // IPv6 sockets.
    let families = [libc::AF_NETLINK, libc::AF_INET, libc::AF_INET6];
    list.allow_when_first_is(libc::SYS_socket, &families);
    list.allow(&[
        libc::SYS_bind,
        libc::SYS_connect,
        libc::SYS_setsockopt,
        libc::SYS_getsockopt,
        libc::SYS_getsockname,
        libc::SYS_getpeername,
        libc::SYS_sendto,
        libc::SYS_recvfrom,
        libc::SYS_sendmsg,
        libc::SYS_recvmsg,
        libc::SYS_shutdown,
        libc::SYS_socketpair,
        libc::SYS_ioctl,
    ]);
    // Files: the sealed request (its seals and size), the namespace it
    // checks, and /proc/sys/net/ipv6/conf/*.
    list.allow(&[libc::SYS_openat, libc::SYS_lseek, libc::SYS_pread64]);
    list.install()
}
