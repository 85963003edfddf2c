//! `lazaret-init`: the long-lived first process of every Lazaret sandbox.
//!
//! It holds the container open between client sessions and does nothing
//! else, so a sandbox runs on any image, even one without a shell. It is
//! built as a static executable with no dependencies beyond `std` and is
//! mounted read-only in the sandbox's control area. The runtime stops it
//! with SIGKILL.

fn main() {
    loop {
        std::thread::park();
    }
}
