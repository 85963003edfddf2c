//! `lazaret-resolver`: see the library.

fn main() -> std::process::ExitCode {
    lazaret_resolver::run()
}
