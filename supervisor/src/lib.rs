//! The Runtime Supervisor role: in later versions it creates a Domain's user,
//! mount and network namespaces, mounts the State Anchor and workspace layout,
//! writes the OCI bundle and runs `runsc`. It trusts only the Host Coordinator
//! at the other end of its inherited channel.
//!
//! This version has no supervisor behaviour yet; the binary says so.

#![deny(missing_docs)]

/// What the binary prints when it is started: this version cannot supervise a
/// sandbox yet.
pub const UNAVAILABLE: &str = "lazaret-supervisor: not available in this version of Lazaret; \
     the Runtime Supervisor arrives with `lazaret up`";
