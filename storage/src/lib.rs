//! Lazaret's storage on the host: the Storage Catalog of prepared lowers
//! (unpacked base images) with its leases and prepare operations, image
//! preparation (references, fetching with skopeo, OCI layouts, unpacking),
//! and each Domain's Domain Store.
//!
//! - [`anchor`]: where a Domain's State Anchors live in its storage;
//! - [`catalog`]: the user's prepared lowers, shared by every Domain;
//! - [`image`]: turning a profile's `image` into an unpacked root filesystem;
//! - [`store`]: one Domain's durable record of its generations and
//!   participants;
//! - [`fault`]: the named pause points of the fault-injection tests, which
//!   the catalog and the Host Coordinator's lifecycle both reach.
//!
//! Every file is reached through `lazaret_hostfs`, beneath a retained
//! directory. Trusts its caller (the Host Coordinator or the CLI, as the
//! invoking user) and what it reads back only after the codec's and the
//! image checks.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod anchor;
pub mod catalog;
pub mod fault;
pub mod image;
pub mod store;
