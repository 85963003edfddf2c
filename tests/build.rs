//! Builds `lazaret-netprobe` (netprobe/main.rs) as a static executable with
//! the same compiler, so the network tests can run it on the host, in a
//! test network namespace and inside a sandbox whose image has no C library.
//! The library exposes its path as `lazaret_tests::netprobe()`.

include!("../build-support/static_exe.rs");

fn main() {
    build_static_exe(
        "netprobe/main.rs",
        &["netprobe/sys.rs"],
        "lazaret-netprobe",
        "3",
    );
}
