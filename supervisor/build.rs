//! Builds `lazaret-init` (sandbox-init/init.rs) as a static executable with
//! the same compiler, so the supervisor can carry it and mount it into any
//! image, including one without a C library.

include!("../build-support/static_exe.rs");

fn main() {
    build_static_exe(
        "sandbox-init/init.rs",
        &["sandbox-init/sys.rs"],
        "lazaret-init",
        "s",
    );
}
