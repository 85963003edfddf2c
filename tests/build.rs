//! Builds `lazaret-netprobe` (netprobe/main.rs) as a static executable with
//! the same compiler, so the network tests can run it on the host, in a
//! test network namespace and inside a sandbox whose image has no C library.
//! The library exposes its path as `lazaret_tests::netprobe()`.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let source = "netprobe/main.rs";
    println!("cargo::rerun-if-changed={source}");
    println!("cargo::rerun-if-changed=netprobe/sys.rs");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let rustc = std::env::var_os("RUSTC").expect("cargo sets RUSTC");
    let status = Command::new(rustc)
        .args([
            "--edition",
            "2024",
            "--crate-name",
            "lazaret_netprobe",
            "-C",
            "opt-level=3",
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
        .arg(out.join("lazaret-netprobe"))
        .arg(source)
        .status()
        .expect("run rustc for lazaret-netprobe");
    assert!(
        status.success(),
        "building the static lazaret-netprobe failed"
    );
}
