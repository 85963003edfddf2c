//! `lazaret-escalate`: asks the host, from inside the sandbox, to run one
//! command; see the library for the protocol.

#![forbid(unsafe_code)]

use std::process::ExitCode;

fn main() -> ExitCode {
    ExitCode::from(lazaret_escalation_client::run(
        std::env::args_os().skip(1).collect(),
    ))
}
