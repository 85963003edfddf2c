//! `lazaret-coordinator`: the Host Coordinator daemon of one running Domain.
//! This version has no daemon behaviour yet; the binary says so.

use std::process::ExitCode;

fn main() -> ExitCode {
    eprintln!(
        "lazaret-coordinator: not available in this version of Lazaret; \
         the Host Coordinator daemon arrives with `lazaret up`"
    );
    ExitCode::from(69)
}
