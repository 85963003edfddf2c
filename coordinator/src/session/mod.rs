//! The Session Coordinator: the Host Coordinator's endpoint for `lazaret
//! attach` clients.
//!
//! This module owns the link between a host CLI and its Domain's Host
//! Coordinator. [`tls`] holds the per-generation TLS material and the
//! frames carried inside the connection. It trusts a peer only after the
//! TLS handshake proved it holds a credential of the current generation.

pub mod hub;
pub mod link;
pub mod tls;

use lazaret_proto::common::{ProtocolVersion, UnixTimeNs};
use lazaret_proto::ids::CredentialId;
use lazaret_proto::trust::{
    GenerationIdentity, ProtocolCredential, ProtocolCredentialRole, ProtocolPublicKey,
    ProtocolSigningKey,
};

/// The directory, beneath the Domain's runtime directory, holding the
/// invoking user's client credential.
pub const CREDENTIAL_DIR: &str = "session";

/// The Session Coordinator's socket in the Domain's runtime directory.
pub const SESSION_SOCKET: &str = "session.sock";

/// `N` bytes from the system's secure random generator, for identifiers and
/// keys.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .expect("the system random generator works");
    bytes
}

/// The Session Coordinator's protocol signing credential of a generation:
/// a fresh Ed25519 key, held in memory only.
pub fn coordinator_protocol_credential(identity: &GenerationIdentity) -> ProtocolCredential {
    let seed: [u8; 32] = random_bytes();
    let pair = ring::signature::Ed25519KeyPair::from_seed_unchecked(&seed)
        .expect("every 32-byte seed is an Ed25519 key");
    let public: [u8; 32] = ring::signature::KeyPair::public_key(&pair)
        .as_ref()
        .try_into()
        .expect("Ed25519 public keys are 32 bytes");
    ProtocolCredential {
        protocol_version: ProtocolVersion::V1,
        credential_id: CredentialId(random_bytes()),
        generation_identity: identity.clone(),
        role: ProtocolCredentialRole::SessionCoordinator,
        public_key: ProtocolPublicKey(public),
        signing_key: ProtocolSigningKey(seed),
        issued_at: UnixTimeNs::now(),
    }
}
