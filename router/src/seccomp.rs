//! The Workspace Router's system calls: what serving `/workspace` from its
//! two directory descriptors needs, and nothing else. No socket, no new
//! program, no namespace, no mount: every FUSE request is the sandbox's,
//! so a bug that one of them reaches meets this list.
//!
//! Installed by [`crate::run`] once the session is made and reported, just
//! before serving; the FUSE workers it starts then inherit it. Trusts
//! nothing; owns the list.

use lazaret_proto::seccomp::{AllowList, SeccompError, arg_is};

/// `FUSE_DEV_IOC_CLONE` (`_IOR(229, 0, uint32_t)`): a worker's own
/// descriptor on the connection.
const FUSE_DEV_IOC_CLONE: u64 = 0x8004_e500;

/// Installs the router's filter on every thread.
pub fn install() -> Result<(), SeccompError> {
    let mut list = AllowList::runtime("lazaret-router");
    // The FUSE connection: each worker opens /dev/fuse and clones the
    // session onto it; requests come by read(2), replies go by writev(2)
    // (both in the shared group).
    list.allow_when(libc::SYS_ioctl, vec![arg_is(1, FUSE_DEV_IOC_CLONE)]);
    // Its one report on its channel, before it serves.
    list.allow(&[libc::SYS_sendmsg]);
    // Opening beneath the two directories (openat with
    // O_NOFOLLOW-checked paths, reopening by /proc/self/fd/N), listing,
    // duplicating a handle, and positioned I/O on open files.
    list.allow(&[
        libc::SYS_open,
        libc::SYS_openat,
        libc::SYS_openat2,
        libc::SYS_getdents64,
        libc::SYS_dup,
        libc::SYS_lseek,
        libc::SYS_pread64,
        libc::SYS_pwrite64,
        libc::SYS_copy_file_range,
        // A move between the host and isolated sides copies the file: the
        // standard library falls back from copy_file_range to sendfile
        // (and splice) across file systems.
        libc::SYS_sendfile,
        libc::SYS_splice,
    ]);
    // Changing the tree: create, link, rename, remove.
    list.allow(&[
        libc::SYS_mkdirat,
        libc::SYS_mknodat,
        libc::SYS_symlinkat,
        libc::SYS_linkat,
        libc::SYS_renameat2,
        libc::SYS_unlinkat,
        libc::SYS_readlinkat,
    ]);
    // Attributes: modes, owners, times, sizes, space, and statfs.
    list.allow(&[
        libc::SYS_fchmod,
        libc::SYS_fchmodat,
        libc::SYS_fchown,
        libc::SYS_fchownat,
        libc::SYS_utimensat,
        libc::SYS_ftruncate,
        libc::SYS_fallocate,
        libc::SYS_fstatfs,
    ]);
    // Durability: fsync and fdatasync on request.
    list.allow(&[libc::SYS_fsync, libc::SYS_fdatasync]);
    // The ids it maps (read once at start, and by the tree's checks).
    list.allow(&[
        libc::SYS_getuid,
        libc::SYS_geteuid,
        libc::SYS_getgid,
        libc::SYS_getegid,
    ]);
    list.install()
}
