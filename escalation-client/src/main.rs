//! `lazaret-escalate`: the Escalation Client that runs inside the sandbox. It
//! will write a signed request into its session's mailbox and wait for the
//! developer's decision. It trusts nothing but the mailbox records signed by
//! the Host Coordinator.
//!
//! This version has no escalation behaviour yet; the binary says so.

use std::process::ExitCode;

fn main() -> ExitCode {
    eprintln!(
        "lazaret-escalate: not available in this version of Lazaret; \
         host escalation arrives with the Escalation Mailbox"
    );
    ExitCode::from(69)
}
