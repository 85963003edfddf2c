//! `lazaret`: the host CLI. Everything lives in the library.

#![forbid(unsafe_code)]

use std::process::ExitCode;

fn main() -> ExitCode {
    lazaret::run()
}
