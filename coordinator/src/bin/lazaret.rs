//! `lazaret`: the host CLI. Everything lives in the library's `cli` module.

use std::process::ExitCode;

fn main() -> ExitCode {
    lazaret_coordinator::cli::run()
}
