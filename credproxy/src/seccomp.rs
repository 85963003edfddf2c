//! The Credential Proxy's system calls: accepting the sandbox's TLS
//! connections on its bound listener, connecting to the credential hosts
//! over IPv4, and asking Lazaret's resolver for their addresses over its
//! datagram socket. No file is opened, no program started. Every byte it
//! reads from a connection is the sandbox's, and it holds the real
//! credentials, so a bug that one of them reaches meets this list (and
//! leaves no core file).
//!
//! Installed by [`crate::role::run`] once the request is read and the
//! listener adopted, before it serves. Trusts nothing; owns the list.

use lazaret_proto::seccomp::{AllowList, SeccompError};

/// Installs the proxy's filter on every thread.
pub fn install() -> Result<(), SeccompError> {
    let mut list = AllowList::runtime("lazaret-credproxy");
    // Connections in: accepted from the listener it was handed.
    list.allow(&[libc::SYS_accept4]);
    // Connections out: a TCP socket per host connection (IPv4 only),
    // connected without blocking, its error read once writable.
    list.allow_when_first_is(libc::SYS_socket, &[libc::AF_INET]);
    list.allow(&[
        libc::SYS_connect,
        libc::SYS_setsockopt,
        libc::SYS_getsockopt,
        libc::SYS_getsockname,
        libc::SYS_getpeername,
        libc::SYS_shutdown,
    ]);
    // Bytes on every socket: TLS records both ways, and the lookups.
    list.allow(&[
        libc::SYS_sendto,
        libc::SYS_recvfrom,
        libc::SYS_sendmsg,
        libc::SYS_recvmsg,
    ]);
    list.install()
}
