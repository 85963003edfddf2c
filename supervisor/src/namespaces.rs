//! The Domain's namespaces: a user namespace that maps the invoking user to
//! root, and mount, network and pid namespaces owned by it.
//!
//! Owns the order that makes this work rootless: the user namespace first
//! (alone, while single-threaded), its id maps written by the process
//! itself (`setgroups` denied first, as an unprivileged writer must), then
//! the other namespaces, which the new user namespace now owns. Trusts
//! nothing but the kernel.

use std::io;
use std::os::fd::OwnedFd;

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
    /// A namespace could not be identified or opened.
    #[error("cannot open {file}")]
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

/// Opens one of this process's namespaces, for another process to join,
/// with its identity (device, inode).
pub fn open(file: &'static str) -> Result<(OwnedFd, NamespaceIdentity), NamespaceError> {
    let failed = |e: rustix::io::Errno| NamespaceError::Identify {
        file,
        source: e.into(),
    };
    let fd = rustix::fs::open(
        file,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(failed)?;
    let stat = rustix::fs::fstat(&fd).map_err(failed)?;
    let identity = NamespaceIdentity {
        device: stat.st_dev,
        inode: stat.st_ino,
    };
    Ok((fd, identity))
}
