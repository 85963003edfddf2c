//! Workspace routing: which paths of the Agent Workspace the sandbox shares
//! with the host, which stay in the Domain's own storage, and which it may
//! not change.
//!
//! The Host Coordinator takes a generation's [`WorkspaceRules`] from the
//! host with [`gather`]; the Workspace Router compiles them into a
//! [`Classifier`] and asks it about every path the sandbox touches. Both use
//! the same classifier, so the tree the coordinator walks is the tree the
//! router serves. When the generation ends, [`watch`] shows what changed
//! where git runs scripts from. Nothing here touches the sandbox; it trusts the rules it
//! is given, and reads the host only as the invoking user, as data.
//!
//! [`WorkspaceRules`]: lazaret_proto::router::WorkspaceRules
//! [`gather`]: gather::gather
//! [`Classifier`]: classify::Classifier

#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod classify;
pub mod command;
pub mod gather;
pub mod gitconfig;
pub mod watch;
