//! Identifiers shared by every record: Domain IDs, configuration
//! fingerprints, generations, content digests, and the random tokens that
//! name sessions, clients, requests, credentials, capabilities, artifacts,
//! operations, sidecars and containers. This module owns their
//! representation and their lowercase-hex text form; it trusts nothing it
//! parses.
//!
//! Two representations are used. Content digests are 32-byte SHA-256 values.
//! Tokens are 16 random bytes drawn by their creator from the kernel's
//! random source: a token says nothing about what it names, is never reused,
//! and is compared only for equality. Generations alone are counters, because
//! their order matters.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Formats bytes as lowercase hexadecimal.
pub fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    out
}

/// Parses exactly 64 lowercase hexadecimal digits into 32 bytes.
pub fn parse_hex32(text: &str) -> Option<[u8; 32]> {
    parse_hex(text)
}

/// Parses exactly `2 * N` lowercase hexadecimal digits into `N` bytes.
pub fn parse_hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    if text.len() != 2 * N {
        return None;
    }
    parse_hex_bytes(text)?.try_into().ok()
}

/// Parses lowercase hexadecimal digits, two per byte, into bytes.
pub fn parse_hex_bytes(text: &str) -> Option<Vec<u8>> {
    let digits = text.as_bytes();
    if digits.len() % 2 != 0 {
        return None;
    }
    let nibble = |d: u8| match d {
        b'0'..=b'9' => Some(d - b'0'),
        b'a'..=b'f' => Some(d - b'a' + 10),
        _ => None,
    };
    digits
        .chunks_exact(2)
        .map(|pair| Some((nibble(pair[0])? << 4) | nibble(pair[1])?))
        .collect()
}

/// Defines a fixed-size byte identifier with its lowercase-hex text form.
macro_rules! hex_id {
    ($len:literal, $(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        pub struct $name(pub [u8; $len]);

        impl $name {
            /// The identifier as lowercase hexadecimal, as shown to users and
            /// used in path names.
            pub fn to_hex(&self) -> String {
                to_hex(&self.0)
            }

            /// Parses exactly twice as many lowercase hexadecimal digits as
            /// the identifier has bytes.
            pub fn from_hex(text: &str) -> Option<Self> {
                parse_hex(text).map(Self)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.to_hex())
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.to_hex())
            }
        }
    };
}

/// A 32-byte digest identifier.
macro_rules! digest_id {
    ($($body:tt)*) => { hex_id!(32, $($body)*); };
}

digest_id!(
    /// `DomainIdV1`: SHA-256 over the selected profile and the canonical
    /// workspace path (see [`crate::config::domain_id`]).
    DomainId
);

digest_id!(
    /// `ConfigurationFingerprintV1`: SHA-256 over the canonical
    /// configuration record (see [`crate::config::ConfigurationFingerprintRecordV1`]).
    ConfigurationFingerprint
);

/// One run of a Domain from `up` to `down` or crash. Generations of a Domain
/// are numbered from 1 upward and never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct GenerationId(pub u64);

impl fmt::Display for GenerationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

digest_id!(
    /// A SHA-256 digest of some named content (a certificate, a policy, a
    /// bundle): which content is said by the field that holds it.
    Sha256Digest
);

digest_id!(
    /// The SHA-256 digest of an OCI image manifest, the form an image
    /// reference resolves to. v1 accepts only `sha256` manifest digests.
    ManifestDigest
);

impl ManifestDigest {
    /// The digest in OCI form, `sha256:` followed by 64 lowercase hex digits.
    pub fn to_oci_string(&self) -> String {
        format!("sha256:{}", self.to_hex())
    }

    /// Parses the OCI form `sha256:<64 lowercase hex digits>`.
    pub fn from_oci_str(text: &str) -> Option<Self> {
        text.strip_prefix("sha256:").and_then(Self::from_hex)
    }
}

/// A 16-byte random token identifier.
macro_rules! token_id {
    ($($body:tt)*) => { hex_id!(16, $($body)*); };
}

token_id!(
    /// A random token distinguishing one generation from every other run of
    /// the same Domain, even after the Domain Store is reset and generation
    /// numbers start again.
    GenerationNonce
);

token_id!(
    /// Names one Client Session: one `lazaret attach`.
    SessionId
);

token_id!(
    /// Names one host CLI client, the holder of one `ClientCLI` TLS
    /// credential.
    CliId
);

token_id!(
    /// Names one escalation request; results, chunks, acknowledgements,
    /// cancellations and decisions refer back to it.
    RequestId
);

token_id!(
    /// Names one protocol signing credential.
    CredentialId
);

token_id!(
    /// Names one session request capability issued to the sandbox.
    CapabilityId
);

token_id!(
    /// Names the subject of one TLS certificate. For a `ClientCLI`
    /// certificate it carries the same bytes as the client's [`CliId`].
    SubjectId
);

token_id!(
    /// Names one prepared artifact (an unpacked image) in the Storage
    /// Catalog. A re-preparation of the same manifest gets a new id.
    PreparedArtifactId
);

token_id!(
    /// Names one in-flight prepare operation in the Storage Catalog.
    OperationId
);

token_id!(
    /// Names one Network Sidecar instance of one generation.
    NetworkSidecarId
);

token_id!(
    /// Names one gVisor container. Rendered as 32 hex digits for `runsc`;
    /// every rendering has the same length, so no container ID is a prefix
    /// of another (runsc matches IDs by prefix).
    ContainerId
);

/// A namespace as the kernel names it: the device and inode of its
/// `/proc/<pid>/ns/*` file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NamespaceIdentity {
    /// `st_dev` of the namespace file (the nsfs device).
    pub device: u64,
    /// `st_ino` of the namespace file.
    pub inode: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_refuses_other_forms() {
        let bytes: [u8; 32] = std::array::from_fn(|i| (i * 8) as u8);
        let text = to_hex(&bytes);
        assert_eq!(&text[..6], "000810");
        assert_eq!(parse_hex32(&text), Some(bytes));
        assert_eq!(parse_hex32(&text.to_uppercase()), None);
        assert_eq!(parse_hex32(&text[1..]), None);
        assert_eq!(parse_hex32(&format!("{}zz", &text[..62])), None);
    }

    #[test]
    fn tokens_are_sixteen_bytes_in_hex_and_on_the_wire() {
        let id = SessionId(std::array::from_fn(|i| i as u8));
        let text = id.to_hex();
        assert_eq!(text, "000102030405060708090a0b0c0d0e0f");
        assert_eq!(SessionId::from_hex(&text), Some(id));
        assert_eq!(SessionId::from_hex(&text[2..]), None);
        assert_eq!(format!("{id:?}"), format!("SessionId({text})"));
        let bytes = postcard::to_allocvec(&id).unwrap();
        assert_eq!(bytes, id.0);
        let digest = ManifestDigest([0xab; 32]);
        let oci = digest.to_oci_string();
        assert!(oci.starts_with("sha256:abab"));
        assert_eq!(ManifestDigest::from_oci_str(&oci), Some(digest));
        assert_eq!(ManifestDigest::from_oci_str(&oci[7..]), None);
    }
}
