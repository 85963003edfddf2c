//! `lazaret-credproxy`: see the library's `role` module.

#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    lazaret_credproxy::role::run()
}
