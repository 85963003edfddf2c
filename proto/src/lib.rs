//! Records, codecs and channels shared by every Lazaret role.
//!
//! `proto` owns the shapes that cross a boundary: the serialized records of
//! the design schema (configuration, Domain Store, Storage Catalog, process
//! identity, sessions, trust, mailbox, network), their postcard codec, and the
//! SEQPACKET channel that carries them with descriptors between roles. It
//! trusts no bytes it decodes: every decoder refuses unknown versions,
//! trailing bytes and oversize input. Its one unsafe call ([`sys`]) closes
//! the descriptors a role inherited.

#![deny(missing_docs)]

pub mod catalog;
pub mod channel;
pub mod codec;
pub mod common;
pub mod config;
pub mod control;
pub mod credproxy;
pub mod failure;
pub mod ids;
pub mod layout;
pub mod logging;
pub mod mailbox;
pub mod memfd;
pub mod names;
pub mod network;
pub mod ownership;
pub mod placeholder;
pub mod privilege;
pub mod process;
pub mod resolver;
pub mod router;
pub mod seccomp;
pub mod session;
pub mod sidecar;
pub mod signing;
pub mod store;
pub mod supervisor;
pub mod sys;
pub mod terminal;
pub mod trust;

#[cfg(test)]
mod test_support;

/// An error and its sources on one line, `: `-separated, as every role
/// prints and reports failures.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
