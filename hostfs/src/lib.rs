//! The host-filesystem layer every Lazaret host process shares: descriptor
//! relative, confined access to what lies beneath a directory it holds.
//!
//! - [`beneath`]: the one resolution rule (`openat2(2)` with
//!   `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS |
//!   RESOLVE_NO_XDEV`), the opens made with it and directory listing;
//! - [`tree`]: removing and measuring whole trees through those opens;
//! - [`plan`]: confined path plans, identity checks and the retained,
//!   Lazaret-owned directories created component by component;
//! - [`read`]: the bounded, non-blocking read of a small file by path;
//! - [`case`]: whether a directory's names compare without case;
//! - [`programs`]: the host programs Lazaret runs, trusted by who can
//!   replace them on disk.
//!
//! The configuration loader, image preparation, the Storage Catalog and
//! Domain Store, state operations, recovery and the Workspace Router all
//! reach the host's files through these modules. Trusts only the
//! descriptors it is given and the kernel's answers about them.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod beneath;
pub mod case;
pub mod plan;
pub mod programs;
pub mod read;
pub mod tree;
