//! The Host Coordinator and the `lazaret` host CLI.
//!
//! This crate owns everything that runs on the host as the invoking user: the
//! trusted-host configuration loader (the only place the TOML document is
//! read), and the CLI that drives it. It trusts the invoking user's
//! environment and the configuration file only after the loader's checks.

#![deny(missing_docs)]

pub mod aio;
pub mod catalog;
pub mod cli;
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
