//! The only unsafe code of `lazaret-netprobe`: a `socket(2)` wrapper, so
//! the `raw` subcommand can ask for socket kinds that `std` does not offer,
//! and a `setsockopt(2)` one for `SO_MARK`, which `lookup --mark` sets.
//!
//! Trusts the C library's `socket` to behave as socket(2) documents; nothing
//! else. It returns an owned descriptor, never a raw integer.

use std::ffi::c_int;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

/// `AF_INET`, socket(2) / address_families(7).
pub const AF_INET: c_int = 2;
/// `AF_PACKET`, packet(7).
pub const AF_PACKET: c_int = 17;
/// `SOCK_RAW`, socket(2).
pub const SOCK_RAW: c_int = 3;
/// `SOCK_CLOEXEC`, socket(2) (the generic Linux value, x86_64 and aarch64).
pub const SOCK_CLOEXEC: c_int = 0o2000000;
/// `IPPROTO_ICMP`, raw(7).
pub const IPPROTO_ICMP: c_int = 1;
/// `IPPROTO_RAW`, raw(7).
pub const IPPROTO_RAW: c_int = 255;
/// `ETH_P_ALL` in host order, packet(7); socket(2) takes it in network order.
pub const ETH_P_ALL: u16 = 0x0003;

/// `SOL_SOCKET` and `SO_MARK`, socket(7).
const SOL_SOCKET: c_int = 1;
const SO_MARK: c_int = 36;

unsafe extern "C" {
    /// socket(2) from the C library.
    #[link_name = "socket"]
    fn c_socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int;
    /// setsockopt(2) from the C library.
    #[link_name = "setsockopt"]
    fn c_setsockopt(
        fd: c_int,
        level: c_int,
        name: c_int,
        value: *const std::ffi::c_void,
        len: u32,
    ) -> c_int;
}

/// Marks `socket`'s packets with `mark` (`SO_MARK`, which needs
/// CAP_NET_ADMIN).
pub fn set_mark(socket: &impl std::os::fd::AsRawFd, mark: u32) -> io::Result<()> {
    // SAFETY: setsockopt(2) reads `len` bytes at `value`, here the four
    // bytes of `mark`, which live across the call; the descriptor is
    // borrowed from an open socket.
    let rc = unsafe {
        c_setsockopt(
            socket.as_raw_fd(),
            SOL_SOCKET,
            SO_MARK,
            (&raw const mark).cast(),
            4,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// socket(2): a new socket of this domain, type and protocol, close-on-exec.
pub fn socket(domain: c_int, ty: c_int, protocol: c_int) -> io::Result<OwnedFd> {
    // SAFETY: socket(2) takes three integers and touches no memory of ours;
    // any values are allowed (bad ones fail with an errno).
    let fd = unsafe { c_socket(domain, ty | SOCK_CLOEXEC, protocol) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: socket(2) succeeded, so `fd` is a new open descriptor that
    // nothing else owns; the OwnedFd becomes its only owner and closes it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
