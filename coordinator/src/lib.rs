//! The Host Coordinator and what the host side shares with the `lazaret`
//! CLI (the `cli` crate).
//!
//! This crate owns what runs on the host as the invoking user besides the
//! CLI's own views: the trusted-host configuration loader (the only place
//! the TOML document is read), the Domain's lifecycle and its daemon, state
//! operations, sessions and escalation. The Storage Catalog, images and the
//! Domain Store it drives are `lazaret_storage`'s, and every host file it
//! opens is reached through `lazaret_hostfs`. It trusts the invoking
//! user's environment and the configuration file only after the loader's
//! checks.

#![deny(missing_docs)]

pub mod aio;
pub mod config;
pub mod escalation;
pub mod lifecycle;
pub mod network;
pub mod process;
mod seccomp;
pub mod session;
pub mod state;
mod sys;
