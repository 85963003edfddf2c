//! Helpers shared by the record modules' unit tests: round trips and the
//! envelope rules every decoder must keep.

use std::fmt::Debug;

use crate::codec::{self, DecodeError, WireRecord};

/// Encodes and decodes `record`, asserting the result equals it, and returns
/// the encoding.
pub(crate) fn round_trip<T: WireRecord + PartialEq + Debug>(record: &T) -> Vec<u8> {
    let bytes = codec::encode(record).expect("record encodes");
    assert_eq!(bytes[0], T::VERSION, "{}: version byte first", T::NAME);
    assert!(
        bytes.len() <= T::MAX_ENCODED_LEN,
        "{}: fits its limit",
        T::NAME
    );
    let back: T = codec::decode(&bytes).expect("record decodes");
    assert_eq!(&back, record, "{}: round trip", T::NAME);
    bytes
}

/// Asserts that decoding refuses `record`'s encoding under an unknown version
/// byte, with trailing bytes, truncated, empty, and padded beyond the
/// record's limit.
pub(crate) fn assert_rejects_bad_envelopes<T: WireRecord + PartialEq + Debug>(record: &T) {
    let good = codec::encode(record).expect("record encodes");

    for version in [0u8, 2, 0xff] {
        let mut bytes = good.clone();
        bytes[0] = version;
        assert_eq!(
            codec::decode::<T>(&bytes),
            Err(DecodeError::UnknownVersion {
                record: T::NAME,
                found: version,
                expected: T::VERSION,
            })
        );
    }

    let mut trailing = good.clone();
    trailing.push(0);
    assert_eq!(
        codec::decode::<T>(&trailing),
        Err(DecodeError::TrailingBytes {
            record: T::NAME,
            count: 1,
        })
    );

    assert!(matches!(
        codec::decode::<T>(&good[..good.len() - 1]),
        Err(DecodeError::Malformed { .. })
    ));
    assert_eq!(
        codec::decode::<T>(&[]),
        Err(DecodeError::Empty { record: T::NAME })
    );

    let max = T::MAX_ENCODED_LEN.min(codec::MAX_RECORD_LEN);
    let mut oversize = good;
    oversize.resize(max + 1, 0);
    assert_eq!(
        codec::decode::<T>(&oversize),
        Err(DecodeError::Oversize {
            record: T::NAME,
            len: max + 1,
            max,
        })
    );
}

/// Asserts that `bytes` (an encoding of `T` whose byte at `index` was an
/// enum discriminant) fails to decode once that byte names no variant.
pub(crate) fn assert_rejects_unknown_discriminant<T: WireRecord + Debug>(
    mut bytes: Vec<u8>,
    index: usize,
) {
    bytes[index] = 0x7f;
    assert!(
        matches!(
            codec::decode::<T>(&bytes),
            Err(DecodeError::Malformed { .. })
        ),
        "{}: unknown discriminant at byte {index} must be refused",
        T::NAME
    );
}
