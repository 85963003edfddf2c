//! `lazaret`: the host CLI. Everything lives in the library.

use std::process::ExitCode;

fn main() -> ExitCode {
    lazaret::run()
}
