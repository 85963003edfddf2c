//! The wire codec for serialized records: one version byte followed by the
//! record's postcard encoding, nothing before and nothing after.
//!
//! This module owns the envelope rules every channel and store relies on:
//! decoding refuses empty and oversize input, an unknown version byte, a
//! malformed body and trailing bytes. It trusts no input; callers get either a
//! whole record or a [`DecodeError`] that says which rule the bytes broke.

use serde::{Serialize, de::DeserializeOwned};

/// The largest encoded record any Lazaret codec accepts, in bytes. Individual
/// records set a tighter [`WireRecord::MAX_ENCODED_LEN`].
pub const MAX_RECORD_LEN: usize = 16 << 20;

/// A serialized record that may cross a protocol or durable-storage boundary.
///
/// Only records the schema marks `<<serialized>>` implement this trait;
/// `<<runtime>>` records implement neither `Serialize` nor `Deserialize`.
pub trait WireRecord: Serialize + DeserializeOwned {
    /// A stable name for the record, used in errors and golden vectors.
    const NAME: &'static str;
    /// The envelope version this build writes and the only one it reads.
    const VERSION: u8 = 1;
    /// The largest encoding of this record that decoding accepts.
    const MAX_ENCODED_LEN: usize = 64 * 1024;
}

/// Why bytes could not be decoded into a record.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    /// No bytes at all: not even a version byte.
    #[error("{record}: empty input")]
    Empty {
        /// The record that was expected.
        record: &'static str,
    },
    /// More bytes than the record may ever occupy.
    #[error("{record}: input of {len} bytes exceeds the limit of {max} bytes")]
    Oversize {
        /// The record that was expected.
        record: &'static str,
        /// Bytes offered.
        len: usize,
        /// Bytes allowed.
        max: usize,
    },
    /// A version byte this build does not speak.
    #[error("{record}: unknown version {found}, this build reads version {expected}")]
    UnknownVersion {
        /// The record that was expected.
        record: &'static str,
        /// The version byte found.
        found: u8,
        /// The version byte this build reads.
        expected: u8,
    },
    /// The body is not a valid encoding of the record.
    #[error("{record}: malformed body: {reason}")]
    Malformed {
        /// The record that was expected.
        record: &'static str,
        /// What postcard reported.
        reason: postcard::Error,
    },
    /// A valid record followed by bytes that belong to nothing.
    #[error("{record}: {count} trailing bytes after the record")]
    TrailingBytes {
        /// The record that was expected.
        record: &'static str,
        /// How many bytes were left over.
        count: usize,
    },
}

/// Why a record could not be encoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EncodeError {
    /// The record does not fit its own size limit; no peer would accept it.
    #[error("{record}: encoding of {len} bytes exceeds the limit of {max} bytes")]
    Oversize {
        /// The record being encoded.
        record: &'static str,
        /// Bytes the encoding needs.
        len: usize,
        /// Bytes allowed.
        max: usize,
    },
    /// postcard refused the value.
    #[error("{record}: cannot encode: {reason}")]
    Serialize {
        /// The record being encoded.
        record: &'static str,
        /// What postcard reported.
        reason: postcard::Error,
    },
}

fn max_len<T: WireRecord>() -> usize {
    T::MAX_ENCODED_LEN.min(MAX_RECORD_LEN)
}

/// Encodes `record` as its version byte followed by its postcard body.
pub fn encode<T: WireRecord>(record: &T) -> Result<Vec<u8>, EncodeError> {
    let bytes =
        postcard::to_extend(record, vec![T::VERSION]).map_err(|reason| EncodeError::Serialize {
            record: T::NAME,
            reason,
        })?;
    if bytes.len() > max_len::<T>() {
        return Err(EncodeError::Oversize {
            record: T::NAME,
            len: bytes.len(),
            max: max_len::<T>(),
        });
    }
    Ok(bytes)
}

/// Decodes exactly one record from `bytes`, refusing anything else.
pub fn decode<T: WireRecord>(bytes: &[u8]) -> Result<T, DecodeError> {
    let record = T::NAME;
    if bytes.len() > max_len::<T>() {
        return Err(DecodeError::Oversize {
            record,
            len: bytes.len(),
            max: max_len::<T>(),
        });
    }
    let (&version, body) = bytes.split_first().ok_or(DecodeError::Empty { record })?;
    if version != T::VERSION {
        return Err(DecodeError::UnknownVersion {
            record,
            found: version,
            expected: T::VERSION,
        });
    }
    let (value, rest) = postcard::take_from_bytes::<T>(body)
        .map_err(|reason| DecodeError::Malformed { record, reason })?;
    if !rest.is_empty() {
        return Err(DecodeError::TrailingBytes {
            record,
            count: rest.len(),
        });
    }
    Ok(value)
}
