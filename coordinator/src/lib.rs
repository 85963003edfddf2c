//! The Host Coordinator and what the host side shares with the `lazaret`
//! CLI (the `cli` crate).
//!
//! This crate owns what runs on the host as the invoking user besides the
//! CLI's own views: the trusted-host configuration loader (the only place
//! the TOML document is read), the Domain's lifecycle and its daemon, the
//! Storage Catalog, images, state, sessions and escalation. It trusts the
//! invoking user's environment and the configuration file only after the
//! loader's checks.

#![deny(missing_docs)]

pub mod aio;
pub mod catalog;
pub mod config;
pub mod escalation;
pub mod fault;
pub mod image;
pub mod lifecycle;
pub mod network;
pub mod process;
pub mod programs;
pub mod session;
pub mod state;
pub mod store;
mod sys;
