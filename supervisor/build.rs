//! Builds the two programs the supervisor places in every sandbox's control
//! area, both static so they run in any image, even one without a C
//! library:
//!
//! - `lazaret-init` (sandbox-init/init.rs), std only, compiled with the same
//!   rustc;
//! - `lazaret-escalate` (the `lazaret-escalation-client` crate), which
//!   needs its dependencies, built by a nested `cargo build` for the host
//!   triple with `+crt-static` in a target directory of its own (a flag
//!   given with `--target` applies to the program, not to the build scripts
//!   and proc-macros it needs).

include!("../build-support/static_exe.rs");

use std::path::{Path, PathBuf};

fn main() {
    build_static_exe(
        "sandbox-init/init.rs",
        &["sandbox-init/sys.rs"],
        "lazaret-init",
        "s",
    );
    build_escalation_client();
}

fn build_escalation_client() {
    let manifest_dir =
        PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let workspace = manifest_dir
        .parent()
        .expect("the supervisor is a workspace member");
    for input in ["escalation-client", "proto", "Cargo.lock", "Cargo.toml"] {
        println!(
            "cargo::rerun-if-changed={}",
            workspace.join(input).display()
        );
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let target = std::env::var("TARGET").expect("cargo sets TARGET");
    // OUT_DIR is <target dir>/<profile>/build/<unit>/out: one nested target
    // directory beside the profiles serves every profile's build.
    let nested = out
        .ancestors()
        .nth(4)
        .unwrap_or(&out)
        .join("lazaret-escalate-static");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = std::process::Command::new(cargo);
    command
        .current_dir(workspace)
        .args([
            "build",
            "--release",
            "--package",
            "lazaret-escalation-client",
        ])
        .args(["--bin", "lazaret-escalate", "--target", &target])
        .arg("--target-dir")
        .arg(&nested)
        .env("CARGO_ENCODED_RUSTFLAGS", "-Ctarget-feature=+crt-static")
        .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "s")
        .env("CARGO_PROFILE_RELEASE_PANIC", "abort")
        .env("CARGO_PROFILE_RELEASE_STRIP", "symbols")
        .env("CARGO_PROFILE_RELEASE_LTO", "off")
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "16");
    // What the outer build set for itself is not the nested build's.
    for name in [
        "RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "CARGO_TARGET_DIR",
        "RUSTC_WRAPPER",
    ] {
        command.env_remove(name);
    }
    let status = command
        .status()
        .unwrap_or_else(|e| panic!("cannot run cargo to build the static lazaret-escalate: {e}"));
    assert!(
        status.success(),
        "building the static lazaret-escalate failed"
    );
    let built = nested.join(&target).join("release/lazaret-escalate");
    copy(&built, &out.join("lazaret-escalate"));
}

fn copy(from: &Path, to: &Path) {
    std::fs::copy(from, to)
        .unwrap_or_else(|e| panic!("cannot copy {} to {}: {e}", from.display(), to.display()));
}
