#![forbid(unsafe_code)]

use std::process::ExitCode;

fn main() -> ExitCode {
    lazaret_router::run()
}
