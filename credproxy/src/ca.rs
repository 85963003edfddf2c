//! The Credential Proxy's certificate authority: made fresh for each
//! generation, it issues a short-lived certificate for each name the proxy
//! serves, on demand, and the TLS handshake's choice of certificate.
//!
//! Owns the CA key, which lives in this process's memory only and is
//! never written anywhere: only the CA's certificate leaves it (the
//! caller adds it to the sandbox's trust). Trusts nothing the sandbox
//! says: a handshake whose SNI is missing or names a host the proxy does
//! not serve gets no certificate, so it fails before any request is read.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, GeneralSubtree, IsCa, KeyPair, KeyUsagePurpose, NameConstraints,
    SanType,
};
use rustls::crypto::ring::sign::any_ecdsa_type;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::hosts::Hosts;

/// How long a leaf certificate is valid. Short, so a certificate that
/// somehow left the proxy is soon worthless; long enough that a
/// generation issues few. A leaf is issued again once half of this has
/// passed.
pub const LEAF_VALIDITY: Duration = Duration::from_secs(24 * 60 * 60);

/// How far before its issue a leaf's validity starts, for a client whose
/// clock runs a little behind the host's.
const LEAF_BACKDATE: Duration = Duration::from_secs(5 * 60);

/// Why the CA or one of its certificates could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    /// rcgen could not make a key or a certificate.
    #[error("cannot generate the {what}; the credential proxy cannot serve without it")]
    Generate {
        /// Which key or certificate.
        what: &'static str,
        /// What rcgen said.
        #[source]
        source: rcgen::Error,
    },
    /// The name cannot be put in a certificate.
    #[error("cannot issue a certificate for {name:?}: it is not a DNS name")]
    Name {
        /// The name asked for.
        name: String,
        /// What rcgen said.
        #[source]
        source: rcgen::Error,
    },
    /// rustls does not take the leaf's key.
    #[error("cannot use the key of the certificate for {name}")]
    Key {
        /// The name the certificate is for.
        name: String,
        /// What rustls said.
        #[source]
        source: rustls::Error,
    },
}

/// A leaf certificate and key as rustls serves them, and when to issue
/// the next one.
struct Issued {
    key: Arc<CertifiedKey>,
    renew_at: SystemTime,
}

/// A generation's CA: its key (in memory only), its certificate, and the
/// leaves it has issued, one per name.
pub struct Authority {
    issuer: CertifiedIssuer<'static, KeyPair>,
    issued: Mutex<HashMap<String, Issued>>,
}

impl fmt::Debug for Authority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Authority").finish_non_exhaustive()
    }
}

fn generate_key(what: &'static str) -> Result<KeyPair, CaError> {
    KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(|source| CaError::Generate { what, source })
}

impl Authority {
    /// Makes a CA with a fresh ECDSA P-256 key, which may sign only leaf
    /// certificates, and only for `names` (and names below them): its
    /// name constraints say so, so a client that trusts it trusts it for
    /// those hosts alone, whatever it signs.
    ///
    /// Its validity stays at rcgen's wide default, as the Session
    /// Coordinator's CA's does: the CA is bounded by the generation (its
    /// key dies with the proxy process), not by the clock.
    pub fn generate<'n>(names: impl IntoIterator<Item = &'n str>) -> Result<Self, CaError> {
        let mut params = CertificateParams::default();
        params.name_constraints = Some(NameConstraints {
            permitted_subtrees: names
                .into_iter()
                .map(|name| GeneralSubtree::DnsName(name.to_owned()))
                .collect(),
            excluded_subtrees: Vec::new(),
        });
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, "lazaret credential proxy CA");
        params.distinguished_name = name;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let issuer =
            CertifiedIssuer::self_signed(params, generate_key("CA key")?).map_err(|source| {
                CaError::Generate {
                    what: "CA certificate",
                    source,
                }
            })?;
        Ok(Self {
            issuer,
            issued: Mutex::new(HashMap::new()),
        })
    }

    /// The CA's certificate, PEM, for the sandbox's trust.
    pub fn certificate_pem(&self) -> String {
        self.issuer.pem()
    }

    /// The CA's certificate, DER.
    pub fn certificate_der(&self) -> CertificateDer<'static> {
        self.issuer.der().clone()
    }

    /// The certificate and key for `name` (a lowercase DNS name), issued
    /// now unless one issued earlier is still young enough.
    pub fn issue(&self, name: &str) -> Result<Arc<CertifiedKey>, CaError> {
        let now = SystemTime::now();
        let mut issued = self.issued.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(leaf) = issued.get(name).filter(|leaf| leaf.renew_at > now) {
            return Ok(leaf.key.clone());
        }
        let key = Arc::new(self.sign_leaf(name, now)?);
        issued.insert(
            name.to_owned(),
            Issued {
                key: key.clone(),
                renew_at: now + LEAF_VALIDITY / 2,
            },
        );
        Ok(key)
    }

    fn sign_leaf(&self, name: &str, now: SystemTime) -> Result<CertifiedKey, CaError> {
        let dns_name = name.try_into().map_err(|source| CaError::Name {
            name: name.to_owned(),
            source,
        })?;
        let mut params = CertificateParams::default();
        let mut subject = DistinguishedName::new();
        subject.push(DnType::CommonName, name);
        params.distinguished_name = subject;
        params.subject_alt_names = vec![SanType::DnsName(dns_name)];
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        params.not_before = now.checked_sub(LEAF_BACKDATE).unwrap_or(now).into();
        params.not_after = (now + LEAF_VALIDITY).into();
        let key = generate_key("leaf key")?;
        let certificate =
            params
                .signed_by(&key, &self.issuer)
                .map_err(|source| CaError::Generate {
                    what: "leaf certificate",
                    source,
                })?;
        let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let signing_key = any_ecdsa_type(&der).map_err(|source| CaError::Key {
            name: name.to_owned(),
            source,
        })?;
        Ok(CertifiedKey::new(
            vec![certificate.der().clone()],
            signing_key,
        ))
    }
}

/// The handshake's choice of certificate: one from the [`Authority`] for
/// an SNI name the proxy serves, none for any other name or for none.
#[derive(Debug)]
pub struct Resolver {
    authority: Arc<Authority>,
    names: BTreeSet<String>,
}

impl Resolver {
    /// Serves certificates for the names in `hosts`.
    pub fn new(authority: Arc<Authority>, hosts: &Hosts) -> Self {
        Self {
            authority,
            names: hosts.names().map(str::to_owned).collect(),
        }
    }
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let Some(sni) = client_hello.server_name() else {
            tracing::debug!("refused a handshake without SNI");
            return None;
        };
        let name = sni.to_ascii_lowercase();
        if !self.names.contains(&name) {
            tracing::debug!(name, "refused a handshake for a name not served");
            return None;
        }
        match self.authority.issue(&name) {
            Ok(key) => Some(key),
            Err(e) => {
                tracing::error!(name, "cannot issue a certificate: {e}");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leaf_is_issued_once_per_name_and_is_short_lived() {
        let authority =
            Authority::generate(["api.example.invalid", "other.example.invalid"]).unwrap();
        let a = authority.issue("api.example.invalid").unwrap();
        let again = authority.issue("api.example.invalid").unwrap();
        assert!(Arc::ptr_eq(&a, &again));
        let b = authority.issue("other.example.invalid").unwrap();
        assert!(!Arc::ptr_eq(&a, &b));
        assert_eq!(a.cert.len(), 1);
        assert!(
            authority
                .certificate_pem()
                .starts_with("-----BEGIN CERTIFICATE-----")
        );
    }

    #[test]
    fn the_ca_is_trusted_only_for_its_names() {
        use rustls::client::danger::ServerCertVerifier;
        use rustls::pki_types::{ServerName, UnixTime};
        let authority = Authority::generate(["api.example.invalid"]).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots.add(authority.certificate_der()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier =
            rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .unwrap();
        let verify = |name: &'static str| {
            let leaf = authority.issue(name).unwrap();
            verifier.verify_server_cert(
                &leaf.cert[0],
                &[],
                &ServerName::try_from(name).unwrap(),
                &[],
                UnixTime::now(),
            )
        };
        assert!(verify("api.example.invalid").is_ok());
        // Even a leaf the CA signed for another name does not verify.
        assert!(verify("other.example.invalid").is_err());
    }

    #[test]
    fn a_name_that_is_not_a_dns_name_is_refused() {
        let authority = Authority::generate(["api.example.invalid"]).unwrap();
        assert!(matches!(
            authority.issue("bücher.invalid"),
            Err(CaError::Name { .. })
        ));
    }
}
