//! `lazaret-supervisor`: the Runtime Supervisor, started by the Host
//! Coordinator with its channel on standard input.

#![forbid(unsafe_code)]

use std::process::ExitCode;

fn main() -> ExitCode {
    lazaret_supervisor::run()
}
