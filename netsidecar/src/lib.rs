//! The Network Sidecar role: in later versions it receives a Domain's
//! enforcement network namespace and sealed policy, installs routes with
//! rtnetlink, attaches `slirp4netns` and attests readiness. It trusts only the
//! Runtime Supervisor at the other end of its inherited channel.
//!
//! This version has no sidecar behaviour yet; the binary says so.

#![deny(missing_docs)]

/// What the binary prints when it is started: this version cannot enforce a
/// network policy yet.
pub const UNAVAILABLE: &str = "lazaret-netsidecar: not available in this version of Lazaret; \
     network isolation arrives with the Network Sidecar";
