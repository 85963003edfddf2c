//! Lazaret's resolver's system calls: answering the sandbox's queries on
//! its bound socket, asking the upstream resolver over marked UDP sockets,
//! admitting answers to the packet filter's set over its open nf_tables
//! socket, and answering the Credential Proxy's lookups. No file is
//! opened, no program started. Every query is the sandbox's, so a bug that
//! one of them reaches meets this list.
//!
//! Installed by [`crate::run`] once its sockets are open and its
//! capabilities narrowed, before it probes and serves. Trusts nothing;
//! owns the list.

use lazaret_proto::seccomp::{AllowList, SeccompError};

/// Installs the resolver's filter on every thread.
pub fn install() -> Result<(), SeccompError> {
    let mut list = AllowList::runtime("lazaret-resolver");
    // A UDP socket per upstream query (IPv4 only), marked so the packet
    // filter lets it out, bound and connected to the upstream.
    list.allow_when_first_is(libc::SYS_socket, &[libc::AF_INET]);
    list.allow(&[
        libc::SYS_setsockopt,
        libc::SYS_getsockopt,
        libc::SYS_bind,
        libc::SYS_connect,
        libc::SYS_getsockname,
    ]);
    // Datagrams on every socket it holds: the sandbox's queries and their
    // answers, upstream exchanges, nf_tables messages, the proxy's lookups.
    list.allow(&[
        libc::SYS_sendto,
        libc::SYS_recvfrom,
        libc::SYS_sendmsg,
        libc::SYS_recvmsg,
        libc::SYS_sendmmsg,
        libc::SYS_recvmmsg,
    ]);
    list.install()
}
