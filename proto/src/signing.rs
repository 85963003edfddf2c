//! Ed25519 signing and verification of mailbox records.
//!
//! Owns the one way a [`MailboxRecord`] becomes a [`SignedProtocolRecord`]
//! (its codec encoding, signed over [`crate::mailbox::SIGNATURE_CONTEXT`]
//! and those bytes) and the one way back. [`open`] is the only reader: it
//! decodes the envelope within its bound, checks the signature against the
//! one public key the caller expects *before* decoding the payload, and
//! refuses a record whose kind another role signs. Trusts nothing in the
//! bytes; binding, freshness and replay are the receiver's checks.

use ring::signature::{ED25519, Ed25519KeyPair, KeyPair, UnparsedPublicKey};

use crate::codec::{self, DecodeError, EncodeError};
use crate::common::{ProtocolVersion, UnixTimeNs};
use crate::ids::CredentialId;
use crate::mailbox::{MailboxRecord, SignedProtocolRecord, signed_message};
use crate::trust::{
    GenerationIdentity, ProtocolCredential, ProtocolCredentialRole, ProtocolPublicKey,
    ProtocolSignature, ProtocolSigningKey,
};

/// Why a record could not be signed.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    /// The record does not encode within its bound.
    #[error("cannot encode the record")]
    Encode(#[from] EncodeError),
}

/// Why a mailbox file was refused.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The file is not a signed record within the bounds.
    #[error("not a signed record")]
    Envelope(#[source] DecodeError),
    /// The signature does not verify under the expected key.
    #[error("the signature does not verify under the expected key")]
    Signature,
    /// The signed payload is not a record.
    #[error("the signed payload is not a mailbox record")]
    Payload(#[source] DecodeError),
    /// The record is of a kind the other role signs.
    #[error("a {found:?} record may not be signed by the {expected:?} credential")]
    WrongSigner {
        /// The role whose key verified it.
        expected: ProtocolCredentialRole,
        /// The role that signs records of its kind.
        found: ProtocolCredentialRole,
    },
}

/// `N` bytes from the system's secure random source, for identifiers and
/// keys.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .expect("the system random generator works");
    bytes
}

/// A fresh Ed25519 key: its seed and public key, from the system's secure
/// random source.
pub fn generate() -> (ProtocolSigningKey, ProtocolPublicKey) {
    let seed = ProtocolSigningKey(random_bytes());
    let public = public_key(&seed);
    (seed, public)
}

/// A fresh protocol signing credential of a generation for `role`: a new
/// Ed25519 key, held in memory (and, for a session's `AgentSandbox`
/// credential, in that session's mailbox).
pub fn credential(
    identity: &GenerationIdentity,
    role: ProtocolCredentialRole,
) -> ProtocolCredential {
    let (signing_key, public_key) = generate();
    ProtocolCredential {
        protocol_version: ProtocolVersion::V1,
        credential_id: CredentialId(random_bytes()),
        generation_identity: identity.clone(),
        role,
        public_key,
        signing_key,
        issued_at: UnixTimeNs::now(),
    }
}

fn key_pair(key: &ProtocolSigningKey) -> Ed25519KeyPair {
    Ed25519KeyPair::from_seed_unchecked(&key.0).expect("every 32-byte seed is an Ed25519 key")
}

/// The public key of a signing key.
pub fn public_key(key: &ProtocolSigningKey) -> ProtocolPublicKey {
    let public: [u8; 32] = key_pair(key)
        .public_key()
        .as_ref()
        .try_into()
        .expect("Ed25519 public keys are 32 bytes");
    ProtocolPublicKey(public)
}

/// A signing key made ready once, for a party that signs many records
/// (the host signs every output chunk).
pub struct Signer {
    pair: Ed25519KeyPair,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Signer(<redacted>)")
    }
}

impl Signer {
    /// The signer of `key`.
    pub fn new(key: &ProtocolSigningKey) -> Self {
        Self {
            pair: key_pair(key),
        }
    }

    /// Signs `record`: the codec encoding of the signed envelope, ready to
    /// be written as a mailbox file.
    pub fn seal(&self, record: &MailboxRecord) -> Result<Vec<u8>, SignError> {
        self.seal_payload(codec::encode(record)?)
    }

    /// Signs `payload_bytes` as they are, whatever they hold: [`Self::seal`]'s
    /// second half, and how a test makes a correctly signed file whose
    /// payload is not a record.
    pub fn seal_payload(&self, payload_bytes: Vec<u8>) -> Result<Vec<u8>, SignError> {
        let signature = self.pair.sign(&signed_message(&payload_bytes));
        let signature: [u8; 64] = signature
            .as_ref()
            .try_into()
            .expect("Ed25519 signatures are 64 bytes");
        let signed = SignedProtocolRecord {
            payload_bytes,
            signature: ProtocolSignature(signature),
        };
        Ok(codec::encode(&signed)?)
    }
}

/// Signs `record` with `key` once ([`Signer::seal`]).
pub fn seal(key: &ProtocolSigningKey, record: &MailboxRecord) -> Result<Vec<u8>, SignError> {
    Signer::new(key).seal(record)
}

/// Signs `payload_bytes` with `key` once ([`Signer::seal_payload`]).
pub fn seal_payload(
    key: &ProtocolSigningKey,
    payload_bytes: Vec<u8>,
) -> Result<Vec<u8>, SignError> {
    Signer::new(key).seal_payload(payload_bytes)
}

/// Reads a mailbox file's bytes as a record `signer` signed with `key`:
/// the envelope, then the signature, then the payload, then the record's
/// kind against `signer`.
pub fn open(
    bytes: &[u8],
    key: &ProtocolPublicKey,
    signer: ProtocolCredentialRole,
) -> Result<MailboxRecord, OpenError> {
    let signed: SignedProtocolRecord = codec::decode(bytes).map_err(OpenError::Envelope)?;
    UnparsedPublicKey::new(&ED25519, &key.0)
        .verify(&signed.signed_message(), &signed.signature.0)
        .map_err(|_| OpenError::Signature)?;
    let record = signed.payload().map_err(OpenError::Payload)?;
    let found = record.signer_role();
    if found != signer {
        return Err(OpenError::WrongSigner {
            expected: signer,
            found,
        });
    }
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mailbox::tests::request;
    use proptest::prelude::*;

    const SANDBOX: ProtocolCredentialRole = ProtocolCredentialRole::AgentSandbox;

    #[test]
    fn a_sealed_record_opens_under_its_key_only() {
        let (key, public) = generate();
        let record = MailboxRecord::Request(request());
        let bytes = seal(&key, &record).unwrap();
        assert_eq!(open(&bytes, &public, SANDBOX).unwrap(), record);

        let (_, other) = generate();
        assert!(matches!(
            open(&bytes, &other, SANDBOX),
            Err(OpenError::Signature)
        ));
        // A sandbox record is never accepted as the host's, even under the
        // right key.
        assert!(matches!(
            open(&bytes, &public, ProtocolCredentialRole::SessionCoordinator),
            Err(OpenError::WrongSigner { .. })
        ));
    }

    #[test]
    fn every_flipped_bit_is_refused() {
        let (key, public) = generate();
        let bytes = seal(&key, &MailboxRecord::Request(request())).unwrap();
        for at in 0..bytes.len() {
            for bit in 0..8 {
                let mut changed = bytes.clone();
                changed[at] ^= 1 << bit;
                assert!(
                    open(&changed, &public, SANDBOX).is_err(),
                    "byte {at} bit {bit} changed and was accepted"
                );
            }
        }
        assert!(open(&bytes[..bytes.len() - 1], &public, SANDBOX).is_err());
        assert!(open(&[], &public, SANDBOX).is_err());
    }

    proptest! {
        #[test]
        fn random_bytes_never_open(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let (_, public) = generate();
            prop_assert!(open(&bytes, &public, SANDBOX).is_err());
        }
    }
}
