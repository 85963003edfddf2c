//! Small value types that many records share: raw host paths, timestamps,
//! secret bytes, the closed version markers every record family carries, and
//! the fixed schema-identifier strings of stores and network records.
//!
//! This module owns how those values look on the wire. It trusts no bytes it
//! decodes: a version or schema identifier that this build does not speak is
//! a decode error, never a default.

use std::ffi::OsStr;
use std::fmt;
use std::os::unix::ffi::OsStrExt;

use serde::{Deserialize, Serialize, de};
use sha2::{Digest, Sha256};

use crate::codec::{self, EncodeError, WireRecord};
use crate::ids::Sha256Digest;

/// A host pathname as raw Linux bytes: not necessarily UTF-8, never
/// reinterpreted. Holding one grants nothing; consumers open paths through
/// their own confined plans.
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct HostPath(pub Vec<u8>);

impl HostPath {
    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The bytes as an `OsStr`, for the standard library's path APIs.
    pub fn as_os_str(&self) -> &OsStr {
        OsStr::from_bytes(&self.0)
    }
}

impl From<&[u8]> for HostPath {
    fn from(bytes: &[u8]) -> Self {
        Self(bytes.to_vec())
    }
}

impl From<&std::path::Path> for HostPath {
    fn from(path: &std::path::Path) -> Self {
        Self(path.as_os_str().as_bytes().to_vec())
    }
}

impl From<&std::path::PathBuf> for HostPath {
    fn from(path: &std::path::PathBuf) -> Self {
        Self::from(path.as_path())
    }
}

impl From<&str> for HostPath {
    fn from(text: &str) -> Self {
        Self(text.as_bytes().to_vec())
    }
}

impl fmt::Debug for HostPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HostPath(\"{}\")", self.0.escape_ascii())
    }
}

impl fmt::Display for HostPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.escape_ascii())
    }
}

/// A point in time as nanoseconds since the Unix epoch (UTC), as read from
/// `CLOCK_REALTIME`. A `u64` reaches the year 2554. Used for display,
/// freshness and expiry checks; never as an identity.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct UnixTimeNs(pub u64);

impl UnixTimeNs {
    /// The current wall-clock time; a clock before the epoch reads as zero.
    pub fn now() -> Self {
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Self(u64::try_from(since.as_nanos()).unwrap_or(u64::MAX))
    }

    /// Whole seconds since the epoch.
    pub fn as_secs(&self) -> u64 {
        self.0 / 1_000_000_000
    }

    /// This instant moved `by` later, saturating at the end of time.
    pub fn after(self, by: std::time::Duration) -> Self {
        Self(
            self.0
                .saturating_add(u64::try_from(by.as_nanos()).unwrap_or(u64::MAX)),
        )
    }

    /// How long after `earlier` this instant is; zero if it is not after.
    pub fn since(self, earlier: Self) -> std::time::Duration {
        std::time::Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

/// Secret bytes (a private key): compared and serialized like any bytes, but
/// never shown by `Debug`, so a record holding one can be logged safely.
/// Comparison is not constant-time; do not use it to authenticate.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretBytes(pub Vec<u8>);

impl SecretBytes {
    /// The secret bytes, for the one caller that uses them.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for SecretBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretBytes(<{} bytes redacted>)", self.0.len())
    }
}

/// A version byte inside a record that this build does not speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("unknown {family} version {found}")]
pub struct UnknownVersion {
    /// Which version marker was being decoded.
    pub family: &'static str,
    /// The value found.
    pub found: u8,
}

/// Declares a closed version enum that travels as one byte holding the
/// version number, so `V1` is `0x01` on the wire and any other byte fails to
/// decode.
macro_rules! closed_version {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident = $value:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
        #[serde(into = "u8", try_from = "u8")]
        pub enum $name {
            $($(#[$vdoc])* $variant),+
        }

        impl From<$name> for u8 {
            fn from(version: $name) -> u8 {
                match version {
                    $($name::$variant => $value),+
                }
            }
        }

        impl TryFrom<u8> for $name {
            type Error = $crate::common::UnknownVersion;

            fn try_from(found: u8) -> Result<Self, Self::Error> {
                match found {
                    $($value => Ok($name::$variant),)+
                    _ => Err($crate::common::UnknownVersion {
                        family: stringify!($name),
                        found,
                    }),
                }
            }
        }
    };
}
pub(crate) use closed_version;

closed_version!(
    /// The version of the trust and mailbox protocol records
    /// (`protocol_version`). v1 is the only version.
    ProtocolVersion {
        /// Protocol version 1.
        V1 = 1,
    }
);

/// Accepts exactly one string; every other string is an invalid value.
pub(crate) struct ExactStr(pub &'static str);

impl de::Visitor<'_> for ExactStr {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the schema identifier `{}`", self.0)
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<(), E> {
        if text == self.0 {
            Ok(())
        } else {
            Err(E::invalid_value(de::Unexpected::Str(text), &self))
        }
    }
}

/// Declares a unit type standing for one exact schema-identifier string: it
/// serializes as that string and decodes only from it.
macro_rules! schema_id {
    ($(#[$doc:meta])* $name:ident = $text:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
        pub struct $name;

        impl $name {
            /// The exact identifier string.
            pub const TEXT: &'static str = $text;

            /// The exact identifier string.
            pub fn as_str(&self) -> &'static str {
                Self::TEXT
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(Self::TEXT)
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                deserializer
                    .deserialize_str($crate::common::ExactStr(Self::TEXT))
                    .map(|()| $name)
            }
        }
    };
}
pub(crate) use schema_id;

/// SHA-256 over `tag`, one NUL byte, and the record's codec encoding
/// (version byte included). The tag keeps digests of different record kinds
/// apart even if two encodings were ever equal.
pub fn tagged_digest<T: WireRecord>(tag: &str, record: &T) -> Result<Sha256Digest, EncodeError> {
    let bytes = codec::encode(record)?;
    let mut hasher = Sha256::new();
    hasher.update(tag.as_bytes());
    hasher.update([0u8]);
    hasher.update(&bytes);
    Ok(Sha256Digest(hasher.finalize().into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    schema_id!(
        /// A test identifier.
        TestSchema = "lazaret-test-v1"
    );

    #[test]
    fn version_is_one_byte_and_closed() {
        assert_eq!(postcard::to_allocvec(&ProtocolVersion::V1).unwrap(), [1]);
        assert_eq!(
            postcard::from_bytes::<ProtocolVersion>(&[1]).unwrap(),
            ProtocolVersion::V1
        );
        assert!(postcard::from_bytes::<ProtocolVersion>(&[0]).is_err());
        assert!(postcard::from_bytes::<ProtocolVersion>(&[2]).is_err());
    }

    #[test]
    fn schema_id_decodes_only_its_own_text() {
        let bytes = postcard::to_allocvec(&TestSchema).unwrap();
        assert_eq!(bytes[0] as usize, TestSchema.as_str().len());
        assert_eq!(&bytes[1..], b"lazaret-test-v1");
        assert_eq!(
            postcard::from_bytes::<TestSchema>(&bytes).unwrap(),
            TestSchema
        );
        let other = postcard::to_allocvec("lazaret-test-v2").unwrap();
        assert!(postcard::from_bytes::<TestSchema>(&other).is_err());
    }

    #[test]
    fn secrets_and_paths_debug_safely() {
        let secret = SecretBytes(b"hunter2".to_vec());
        let shown = format!("{secret:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        let path = HostPath(b"/tmp/\xffx".to_vec());
        assert_eq!(format!("{path:?}"), "HostPath(\"/tmp/\\xffx\")");
    }
}
