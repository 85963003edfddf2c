//! The sandbox's names and the workspace paths made of them.
//!
//! Owns the byte-level handling of a name the sandbox sent and of the
//! relative paths the tree joins from such names: joining, splitting at
//! the last `/`, and the conversion to what a `*at` call takes. Trusts
//! nothing in a name: every name here is sandbox-controlled. A name the
//! tree looks up, removes, renames or makes must be one component
//! ([`one_component`]); a NUL or more
//! bytes than a directory entry holds is left for the kernel's `*at` call
//! on one side's directory to refuse.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use lazaret_routing::classify::join;

/// Refuses a name that is not exactly one component: empty, `.`, `..`,
/// or holding a `/`. The kernel never sends such a name; one that arrives
/// anyway is never resolved, so nothing it names is reached through
/// another directory or a link on the way.
pub(super) fn one_component(name: &[u8]) -> rustix::io::Result<()> {
    if name.is_empty() || name.contains(&b'/') || name == b"." || name == b".." {
        return Err(rustix::io::Errno::INVAL);
    }
    Ok(())
}

/// `dir` joined with a relative path that may be empty.
pub(super) fn join_rel(dir: &[u8], rel: &[u8]) -> Vec<u8> {
    if rel.is_empty() {
        dir.to_vec()
    } else {
        join(dir, rel)
    }
}

pub(super) fn os(bytes: &[u8]) -> &OsStr {
    OsStr::from_bytes(bytes)
}

/// The parent and last component of a non-empty path.
pub(super) fn split(path: &[u8]) -> (&[u8], &[u8]) {
    match path.iter().rposition(|b| *b == b'/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (&[], path),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_takes_the_last_component_only() {
        assert_eq!(split(b"name"), (&b""[..], &b"name"[..]));
        assert_eq!(split(b"a/b/c"), (&b"a/b"[..], &b"c"[..]));
        // A name that is `..` stays one component: nothing climbs.
        assert_eq!(split(b"a/.."), (&b"a"[..], &b".."[..]));
        // Bytes that are not UTF-8 split like any other.
        assert_eq!(split(b"\xff/\xfe\x80"), (&b"\xff"[..], &b"\xfe\x80"[..]));
    }

    #[test]
    fn join_rel_keeps_the_directory_for_an_empty_path() {
        assert_eq!(join_rel(b"a/b", b""), b"a/b".to_vec());
        assert_eq!(join_rel(b"a", b"c/d"), b"a/c/d".to_vec());
        assert_eq!(join_rel(b"", b"c"), b"c".to_vec());
    }

    #[test]
    fn os_passes_every_byte_unchanged() {
        let name = b"caf\xe9\x00\xff";
        assert_eq!(os(name).as_bytes(), name);
    }
}
