// Shared by the build scripts that embed or ship a small std-only program
// (`include!`d, not a crate): compiles one source file with the same rustc
// as a static executable, so it runs in any image, even one without a C
// library.

/// Compiles `source` (and the modules beside it, listed in `also`) into
/// `$OUT_DIR/NAME` with `opt_level`, statically linked, stripped,
/// aborting on panic.
fn build_static_exe(source: &str, also: &[&str], name: &str, opt_level: &str) {
    for file in std::iter::once(&source).chain(also) {
        println!("cargo::rerun-if-changed={file}");
    }
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let rustc = std::env::var_os("RUSTC").expect("cargo sets RUSTC");
    let status = std::process::Command::new(rustc)
        .args(["--edition", "2024", "--crate-name", &name.replace('-', "_")])
        .args(["-C", &format!("opt-level={opt_level}")])
        .args(["-C", "panic=abort", "-C", "strip=symbols"])
        .args(["-C", "target-feature=+crt-static"])
        .arg("-o")
        .arg(out.join(name))
        .arg(source)
        .status()
        .unwrap_or_else(|e| panic!("cannot run rustc for {name}: {e}"));
    assert!(status.success(), "building the static {name} from {source} failed");
}
