//! Where a Domain's State Anchors live in its storage directory: one
//! directory per persistent dir beneath `anchors/`, named by the hex of the
//! dir's sandbox path, holding the overlay's upper and work directories.
//!
//! Owns only these names; the Host Coordinator's preparation and the state
//! operations both read and make the directories through `lazaret_hostfs`.
//! Trusts nothing: a name read back from `anchors/` is accepted only in
//! exactly the form [`anchor_name`] makes.

use std::path::{Path, PathBuf};

/// The State Anchors' directory in a Domain's storage.
pub const ANCHORS_DIR: &str = "anchors";
/// The upper of one anchor.
pub const UPPER_DIR: &str = "upper";
/// The overlay work directory of one anchor.
pub const WORK_DIR: &str = "work";

/// The name in `anchors/` of persistent dir `path`.
pub fn anchor_name(path: &str) -> String {
    lazaret_proto::ids::to_hex(path.as_bytes())
}

/// The State Anchor directory of persistent dir `path`, beneath the
/// Domain's storage directory: `anchors/<name>`.
pub fn anchor_dir(path: &str) -> PathBuf {
    Path::new(ANCHORS_DIR).join(anchor_name(path))
}

/// The persistent dir a name in `anchors/` stands for: exactly
/// [`anchor_name`]'s form of an absolute path.
pub fn sandbox_path_of(name: &[u8]) -> Option<String> {
    let bytes = lazaret_proto::ids::parse_hex_bytes(std::str::from_utf8(name).ok()?)?;
    String::from_utf8(bytes).ok().filter(|p| p.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::{anchor_dir, anchor_name, sandbox_path_of};

    #[test]
    fn a_name_stands_for_its_path_and_nothing_else_does() {
        let name = anchor_name("/root/.cache");
        assert_eq!(
            sandbox_path_of(name.as_bytes()).as_deref(),
            Some("/root/.cache")
        );
        assert_eq!(
            anchor_dir("/root"),
            std::path::Path::new("anchors/2f726f6f74")
        );
        // Not hex, upper-case hex, a relative path, not UTF-8.
        for bad in ["zz", "2F726F6F74", "726f6f74", "ff"] {
            assert_eq!(sandbox_path_of(bad.as_bytes()), None, "{bad}");
        }
    }
}
