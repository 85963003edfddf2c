use std::process::ExitCode;

fn main() -> ExitCode {
    eprintln!("{}", lazaret_netsidecar::UNAVAILABLE);
    ExitCode::from(69)
}
