//! The Domain's namespaces: a user namespace that maps the invoking user to
//! root, and mount, network and pid namespaces owned by it.
//!
//! Owns the order that makes this work rootless: the user namespace first
//! (alone, while single-threaded), its id maps written by the process
//! itself (`setgroups` denied first, as an unprivileged writer must), then
//! the other namespaces, which the new user namespace now owns. Trusts
//! nothing but the kernel.

use std::io;

use lazaret_proto::ownership::NamespaceIdentity;
use rustix::thread::UnshareFlags;

use crate::sys::unshare_namespaces;

/// Why the namespaces could not be made.
#[derive(Debug, thiserror::Error)]
pub enum NamespaceError {
    /// `unshare(2)` failed.
    #[error("cannot create the {what} namespace (are unprivileged user namespaces enabled?)")]
    Unshare {
        /// Which namespaces.
        what: &'static str,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },
    /// Writing an id map failed.
    #[error("cannot write {file}")]
    Map {
        /// The `/proc/self` file.
        file: &'static str,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },
    /// A namespace could not be identified.
    #[error("cannot stat {file}")]
    Identify {
        /// The `/proc/self/ns` link.
        file: &'static str,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },
}

/// Enters a new user namespace mapping `uid`/`gid` to 0, then new mount,
/// network, pid, ipc and uts namespaces owned by it. The calling process
/// must be single-threaded. Children spawned afterwards start in the new
/// pid namespace; the first one is its init.
pub fn enter(uid: u32, gid: u32) -> Result<(), NamespaceError> {
    unshare_namespaces(UnshareFlags::NEWUSER).map_err(|source| NamespaceError::Unshare {
        what: "user",
        source,
    })?;
    let write = |file: &'static str, text: String| {
        std::fs::write(file, text).map_err(|source| NamespaceError::Map { file, source })
    };
    write("/proc/self/setgroups", "deny".into())?;
    write("/proc/self/uid_map", format!("0 {uid} 1\n"))?;
    write("/proc/self/gid_map", format!("0 {gid} 1\n"))?;
    unshare_namespaces(
        UnshareFlags::NEWNS
            | UnshareFlags::NEWNET
            | UnshareFlags::NEWPID
            | UnshareFlags::NEWIPC
            | UnshareFlags::NEWUTS,
    )
    .map_err(|source| NamespaceError::Unshare {
        what: "mount, network and pid",
        source,
    })
}

/// The identity (device, inode) of one of this process's namespaces.
pub fn identity(file: &'static str) -> Result<NamespaceIdentity, NamespaceError> {
    let stat = rustix::fs::stat(file).map_err(|e| NamespaceError::Identify {
        file,
        source: e.into(),
    })?;
    Ok(NamespaceIdentity {
        device: stat.st_dev,
        inode: stat.st_ino,
    })
}

/// Brings up the loopback interface of the (new, empty) network namespace:
/// one `RTM_NEWLINK` request over rtnetlink setting `IFF_UP` on interface 1,
/// which is `lo` in every new network namespace, and its acknowledgement.
pub fn loopback_up() -> io::Result<()> {
    use rustix::net::netlink::SocketAddrNetlink;
    use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};

    const RTM_NEWLINK: u16 = 16;
    const NLM_F_REQUEST: u16 = 0x1;
    const NLM_F_ACK: u16 = 0x4;
    const NLMSG_ERROR: u16 = 2;
    const IFF_UP: u32 = 0x1;
    const LOOPBACK_INDEX: i32 = 1;

    let fd = rustix::net::socket_with(
        AddressFamily::NETLINK,
        SocketType::RAW,
        SocketFlags::CLOEXEC,
        None,
    )?;
    // struct nlmsghdr (16 bytes) then struct ifinfomsg (16 bytes).
    let mut message = Vec::with_capacity(32);
    message.extend_from_slice(&32u32.to_ne_bytes());
    message.extend_from_slice(&RTM_NEWLINK.to_ne_bytes());
    message.extend_from_slice(&(NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
    message.extend_from_slice(&1u32.to_ne_bytes()); // sequence
    message.extend_from_slice(&0u32.to_ne_bytes()); // port: the kernel fills it
    message.extend_from_slice(&[0, 0]); // family AF_UNSPEC, padding
    message.extend_from_slice(&0u16.to_ne_bytes()); // device type
    message.extend_from_slice(&LOOPBACK_INDEX.to_ne_bytes());
    message.extend_from_slice(&IFF_UP.to_ne_bytes()); // flags
    message.extend_from_slice(&IFF_UP.to_ne_bytes()); // change mask
    rustix::net::sendto(
        &fd,
        &message,
        SendFlags::empty(),
        &SocketAddrNetlink::new(0, 0),
    )?;

    let mut reply = [0u8; 256];
    let n = rustix::net::recv(&fd, &mut reply, RecvFlags::empty())?.0;
    // The acknowledgement is an NLMSG_ERROR whose error field is 0.
    let kind = reply.get(4..6).map(|b| u16::from_ne_bytes([b[0], b[1]]));
    let error = reply
        .get(16..20)
        .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
    match (n >= 20, kind, error) {
        (true, Some(NLMSG_ERROR), Some(0)) => Ok(()),
        (true, Some(NLMSG_ERROR), Some(errno)) => Err(io::Error::from_raw_os_error(-errno)),
        _ => Err(io::Error::other("unexpected rtnetlink reply")),
    }
}
