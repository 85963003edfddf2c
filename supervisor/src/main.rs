use std::process::ExitCode;

fn main() -> ExitCode {
    eprintln!("{}", lazaret_supervisor::UNAVAILABLE);
    ExitCode::from(69)
}
