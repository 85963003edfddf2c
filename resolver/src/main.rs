//! `lazaret-resolver`: see the library.

#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    lazaret_resolver::run()
}
