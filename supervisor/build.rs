//! Builds `lazaret-init` (sandbox-init/init.rs) as a static executable with
//! the same compiler, so the supervisor can carry it and mount it into any
//! image, including one without a C library.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let source = "sandbox-init/init.rs";
    println!("cargo::rerun-if-changed={source}");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let rustc = std::env::var_os("RUSTC").expect("cargo sets RUSTC");
    let status = Command::new(rustc)
        .args([
            "--edition",
            "2024",
            "--crate-name",
            "lazaret_init",
            "-C",
            "opt-level=s",
        ])
        .args([
            "-C",
            "panic=abort",
            "-C",
            "strip=symbols",
            "-C",
            "target-feature=+crt-static",
        ])
        .arg("-o")
        .arg(out.join("lazaret-init"))
        .arg(source)
        .status()
        .expect("run rustc for lazaret-init");
    assert!(status.success(), "building the static lazaret-init failed");
}
