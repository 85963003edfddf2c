//! Per-generation trust material: the identity every credential is bound
//! to, the TLS credentials of the Session Coordinator link, the protocol
//! signing credentials of the Escalation Mailbox, and the per-session
//! binding and capability that let a sandbox ask for anything at all.
//!
//! This module owns the shapes. Every credential names its
//! [`GenerationIdentity`], and nothing from one generation is accepted by
//! another. Decoding trusts nothing: whoever loads a manifest or bundle
//! checks its generation identity against its own before using any key in
//! it. Private keys are [`SecretBytes`] or [`ProtocolSigningKey`], which
//! `Debug` never shows.
//!
//! Protocol signatures are Ed25519: public keys are 32 raw bytes,
//! signatures 64 raw bytes, signing keys the 32-byte seed.

use std::fmt;

use serde::{Deserialize, Serialize, de, ser::SerializeTuple};

use crate::codec::WireRecord;
use crate::common::{HostPath, ProtocolVersion, SecretBytes, UnixTimeNs};
use crate::ids::{
    CapabilityId, CliId, ConfigurationFingerprint, CredentialId, DomainId, GenerationId,
    GenerationNonce, SessionId, Sha256Digest, SubjectId,
};

/// An Ed25519 public key, 32 raw bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ProtocolPublicKey(pub [u8; 32]);

impl fmt::Debug for ProtocolPublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ProtocolPublicKey({})", crate::ids::to_hex(&self.0))
    }
}

/// An Ed25519 signing key seed, 32 bytes. `Debug` never shows it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProtocolSigningKey(pub [u8; 32]);

impl fmt::Debug for ProtocolSigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ProtocolSigningKey(<redacted>)")
    }
}

/// An Ed25519 signature, 64 raw bytes; on the wire exactly 64 bytes with no
/// length prefix.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProtocolSignature(pub [u8; 64]);

impl fmt::Debug for ProtocolSignature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ProtocolSignature({})", crate::ids::to_hex(&self.0))
    }
}

impl Serialize for ProtocolSignature {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut tuple = serializer.serialize_tuple(64)?;
        for byte in &self.0 {
            tuple.serialize_element(byte)?;
        }
        tuple.end()
    }
}

impl<'de> Deserialize<'de> for ProtocolSignature {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Bytes64;

        impl<'de> de::Visitor<'de> for Bytes64 {
            type Value = ProtocolSignature;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("64 signature bytes")
            }

            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut out = [0u8; 64];
                for (i, byte) in out.iter_mut().enumerate() {
                    *byte = seq
                        .next_element()?
                        .ok_or_else(|| de::Error::invalid_length(i, &self))?;
                }
                Ok(ProtocolSignature(out))
            }
        }

        deserializer.deserialize_tuple(64, Bytes64)
    }
}

/// What every credential of a generation is bound to.
///
/// The seed's field list is partial after `generation_id`; the fingerprint,
/// a random nonce and the creation time are added. The nonce keeps a
/// generation distinct from an equally numbered one after a store reset.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GenerationIdentity {
    /// The selected profile's name.
    pub agent_profile: String,
    /// The Domain.
    pub domain_id: DomainId,
    /// The generation's number.
    pub generation_id: GenerationId,
    /// The configuration the generation runs under.
    pub configuration_fingerprint: ConfigurationFingerprint,
    /// Random bytes drawn when the generation started.
    pub generation_nonce: GenerationNonce,
    /// When the generation started.
    pub created_at: UnixTimeNs,
}

/// Which end of the Session Coordinator link a TLS credential serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TlsRole {
    /// The Host Coordinator's server certificate.
    SessionCoordinator,
    /// A host CLI's client certificate.
    ClientCLI,
}

/// Which party a protocol signing credential speaks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ProtocolCredentialRole {
    /// The Host Coordinator, signing decisions and results.
    SessionCoordinator,
    /// The sandbox, signing requests, cancellations and acknowledgements.
    AgentSandbox,
}

/// What a generation's parties pin: the TLS CA and the Session
/// Coordinator's protocol key.
///
/// The seed's field list is partial after `tls_ca_sha256`; the Session
/// Coordinator's protocol credential id and public key are added so the
/// sandbox can verify host-signed mailbox records.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrustManifest {
    /// Protocol version.
    pub protocol_version: ProtocolVersion,
    /// The generation.
    pub generation_identity: GenerationIdentity,
    /// SHA-256 of the per-generation CA certificate (DER).
    pub tls_ca_sha256: Sha256Digest,
    /// The Session Coordinator's protocol credential.
    pub session_coordinator_credential_id: CredentialId,
    /// Its public key.
    pub session_coordinator_public_key: ProtocolPublicKey,
}

impl WireRecord for TrustManifest {
    const NAME: &'static str = "TrustManifest";
    const MAX_ENCODED_LEN: usize = 1024;
}

/// What a host CLI keeps beside its `ClientCLI` certificate: the
/// generation's [`TrustManifest`] and the CA certificate it pins.
///
/// Not in the seed: the manifest holds only the CA's digest, and a client
/// needs the certificate itself to verify the server. Whoever loads it
/// checks that SHA-256 of `ca_certificate_der` equals
/// `manifest.tls_ca_sha256` before trusting the certificate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientTrustBundle {
    /// The generation's pins.
    pub manifest: TrustManifest,
    /// The generation's TLS CA certificate, DER.
    pub ca_certificate_der: Vec<u8>,
}

impl WireRecord for ClientTrustBundle {
    const NAME: &'static str = "ClientTrustBundle";
    const MAX_ENCODED_LEN: usize = 8 * 1024;
}

/// A TLS certificate and key for one end of the Session Coordinator link,
/// issued by the generation's CA. Stored mode 0600.
///
/// The seed's field list is partial after `subject_id`; the certificate and
/// key are what a credential is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TlsCredential {
    /// The generation.
    pub generation_identity: GenerationIdentity,
    /// Server or client.
    pub role: TlsRole,
    /// The certificate's subject.
    pub subject_id: SubjectId,
    /// The certificate, DER.
    pub certificate_der: Vec<u8>,
    /// The private key, PKCS#8 DER.
    pub private_key_der: SecretBytes,
}

impl WireRecord for TlsCredential {
    const NAME: &'static str = "TlsCredential";
    const MAX_ENCODED_LEN: usize = 16 * 1024;
}

/// What the Host Coordinator publishes beside its socket so a CLI can
/// connect and check it reached the right generation.
///
/// The seed's field list is partial after `tls_ca_certificate_der`; the
/// socket and the client credential's location are added.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProtocolPublicationIdentity {
    /// Protocol version.
    pub protocol_version: ProtocolVersion,
    /// The generation.
    pub generation_identity: GenerationIdentity,
    /// The CA certificate to verify the server against, DER.
    pub tls_ca_certificate_der: Vec<u8>,
    /// The Session Coordinator socket.
    pub socket_path: HostPath,
    /// The file holding the CLI's `ClientCLI` [`TlsCredential`].
    pub client_credential_path: HostPath,
}

impl WireRecord for ProtocolPublicationIdentity {
    const NAME: &'static str = "ProtocolPublicationIdentity";
    const MAX_ENCODED_LEN: usize = 32 * 1024;
}

/// A protocol signing credential: an Ed25519 key pair bound to a
/// generation and a role.
///
/// The seed's field list is partial after `generation_identity`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProtocolCredential {
    /// Protocol version.
    pub protocol_version: ProtocolVersion,
    /// The credential.
    pub credential_id: CredentialId,
    /// The generation.
    pub generation_identity: GenerationIdentity,
    /// Who it speaks for.
    pub role: ProtocolCredentialRole,
    /// The public key.
    pub public_key: ProtocolPublicKey,
    /// The signing key.
    pub signing_key: ProtocolSigningKey,
    /// When it was issued.
    pub issued_at: UnixTimeNs,
}

impl WireRecord for ProtocolCredential {
    const NAME: &'static str = "ProtocolCredential";
    const MAX_ENCODED_LEN: usize = 1024;
}

/// Ties a sandbox's records to one Client Session of one generation and to
/// the credential that must sign them.
///
/// The seed's field list is partial after `session_id`; the signing
/// credential is added, so a record signed by any other key does not match.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SessionBinding {
    /// The generation.
    pub generation_identity: GenerationIdentity,
    /// The client that opened the session.
    pub cli_id: CliId,
    /// The session.
    pub session_id: SessionId,
    /// The `AgentSandbox` protocol credential of the session.
    pub credential_id: CredentialId,
}

/// The sandbox's permission to send requests for one session until it
/// expires.
///
/// The seed's field list is partial after `session_binding`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRequestCapability {
    /// Protocol version.
    pub protocol_version: ProtocolVersion,
    /// The capability.
    pub capability_id: CapabilityId,
    /// The session it is for.
    pub session_binding: SessionBinding,
    /// After this instant no request under it is accepted.
    pub expires_at: UnixTimeNs,
}

impl WireRecord for SessionRequestCapability {
    const NAME: &'static str = "SessionRequestCapability";
    const MAX_ENCODED_LEN: usize = 1024;
}

/// Everything the sandbox side of one session holds: the pins, its own
/// signing credential and its request capability. The host writes it as
/// the `credential` file (mode 0400) of the session's mailbox.
///
/// The seed's field list is partial after `trust_manifest`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxCredentialBundle {
    /// Protocol version.
    pub protocol_version: ProtocolVersion,
    /// The generation.
    pub generation_identity: GenerationIdentity,
    /// The generation's pins.
    pub trust_manifest: TrustManifest,
    /// The session's `AgentSandbox` credential.
    pub protocol_credential: ProtocolCredential,
    /// The session's request capability.
    pub request_capability: SessionRequestCapability,
}

impl WireRecord for SandboxCredentialBundle {
    const NAME: &'static str = "SandboxCredentialBundle";
    const MAX_ENCODED_LEN: usize = 4096;
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::test_support::{
        assert_rejects_bad_envelopes, assert_rejects_unknown_discriminant, round_trip,
    };

    pub(crate) fn generation_identity() -> GenerationIdentity {
        GenerationIdentity {
            agent_profile: "default".into(),
            domain_id: DomainId([0xd0; 32]),
            generation_id: GenerationId(7),
            configuration_fingerprint: ConfigurationFingerprint([0xcf; 32]),
            generation_nonce: GenerationNonce([0x4e; 16]),
            created_at: UnixTimeNs(1_700_000_000_000_000_000),
        }
    }

    pub(crate) fn session_binding() -> SessionBinding {
        SessionBinding {
            generation_identity: generation_identity(),
            cli_id: CliId([0xc1; 16]),
            session_id: SessionId([0x5e; 16]),
            credential_id: CredentialId([0xa5; 16]),
        }
    }

    fn manifest() -> TrustManifest {
        TrustManifest {
            protocol_version: ProtocolVersion::V1,
            generation_identity: generation_identity(),
            tls_ca_sha256: Sha256Digest([0xca; 32]),
            session_coordinator_credential_id: CredentialId([0x5c; 16]),
            session_coordinator_public_key: ProtocolPublicKey([0x9b; 32]),
        }
    }

    fn credential(role: ProtocolCredentialRole) -> ProtocolCredential {
        ProtocolCredential {
            protocol_version: ProtocolVersion::V1,
            credential_id: CredentialId([0xa5; 16]),
            generation_identity: generation_identity(),
            role,
            public_key: ProtocolPublicKey([0x11; 32]),
            signing_key: ProtocolSigningKey([0x22; 32]),
            issued_at: UnixTimeNs(3),
        }
    }

    #[test]
    fn trust_records_round_trip() {
        let manifest = manifest();
        let bytes = round_trip(&manifest);
        assert_rejects_bad_envelopes(&manifest);
        // The first body byte is the protocol version, which is closed.
        assert_eq!(bytes[1], 1);
        assert_rejects_unknown_discriminant::<TrustManifest>(bytes, 1);

        for role in [TlsRole::SessionCoordinator, TlsRole::ClientCLI] {
            let tls = TlsCredential {
                generation_identity: generation_identity(),
                role,
                subject_id: SubjectId([0xc1; 16]),
                certificate_der: vec![0x30, 0x82, 0x01, 0x00],
                private_key_der: SecretBytes(vec![0x30, 0x2e, 0x02, 0x01]),
            };
            round_trip(&tls);
            assert_rejects_bad_envelopes(&tls);
        }

        let publication = ProtocolPublicationIdentity {
            protocol_version: ProtocolVersion::V1,
            generation_identity: generation_identity(),
            tls_ca_certificate_der: vec![0x30, 0x82],
            socket_path: HostPath::from("/run/user/1000/lazaret/domains/d0/coordinator.sock"),
            client_credential_path: HostPath::from("/run/user/1000/lazaret/domains/d0/cli.cred"),
        };
        round_trip(&publication);
        assert_rejects_bad_envelopes(&publication);

        let sandbox = credential(ProtocolCredentialRole::AgentSandbox);
        round_trip(&sandbox);
        assert_rejects_bad_envelopes(&sandbox);
        round_trip(&credential(ProtocolCredentialRole::SessionCoordinator));

        let capability = SessionRequestCapability {
            protocol_version: ProtocolVersion::V1,
            capability_id: CapabilityId([0xcc; 16]),
            session_binding: session_binding(),
            expires_at: UnixTimeNs(u64::MAX),
        };
        round_trip(&capability);
        assert_rejects_bad_envelopes(&capability);

        let bundle = SandboxCredentialBundle {
            protocol_version: ProtocolVersion::V1,
            generation_identity: generation_identity(),
            trust_manifest: manifest,
            protocol_credential: sandbox,
            request_capability: capability,
        };
        round_trip(&bundle);
        assert_rejects_bad_envelopes(&bundle);
    }

    #[test]
    fn keys_stay_out_of_debug_output() {
        let shown = format!("{:?}", credential(ProtocolCredentialRole::AgentSandbox));
        assert!(shown.contains("<redacted>"), "{shown}");
        assert!(!shown.contains("34, 34"), "{shown}");
        let tls = TlsCredential {
            generation_identity: generation_identity(),
            role: TlsRole::ClientCLI,
            subject_id: SubjectId([1; 16]),
            certificate_der: vec![],
            private_key_der: SecretBytes(b"PRIVATE".to_vec()),
        };
        assert!(!format!("{tls:?}").contains("PRIVATE"));
    }

    #[test]
    fn signature_is_exactly_64_bytes_on_the_wire() {
        let signature = ProtocolSignature(std::array::from_fn(|i| i as u8));
        let bytes = postcard::to_allocvec(&signature).unwrap();
        assert_eq!(bytes, (0u8..64).collect::<Vec<_>>());
        assert_eq!(
            postcard::from_bytes::<ProtocolSignature>(&bytes).unwrap(),
            signature
        );
        assert!(postcard::from_bytes::<ProtocolSignature>(&bytes[..63]).is_err());
    }
}
