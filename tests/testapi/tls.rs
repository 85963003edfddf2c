//! The test API's certificates: a test CA made in memory at start, whose
//! certificate the harness trusts (it is written to `--ca-out`), and one
//! leaf naming all of `--names`, which every listener serves whatever the
//! client's SNI says. The CA's key lives in memory only and dies with the
//! process.

use std::net::IpAddr;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::ServerConfig;
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

/// The CA's certificate (PEM) and the TLS configuration serving the leaf.
#[derive(Debug)]
pub struct Issued {
    /// The test CA's certificate, PEM.
    pub ca_pem: String,
    /// Serves the leaf, ALPN `h2` and `http/1.1`.
    pub config: Arc<ServerConfig>,
}

fn key(what: &str) -> Result<KeyPair, String> {
    KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(|e| format!("cannot generate the {what}: {e}"))
}

/// A subject alternative name for `name`: an IP address or a DNS name.
fn san(name: &str) -> Result<SanType, String> {
    if let Ok(ip) = name.parse::<IpAddr>() {
        return Ok(SanType::IpAddress(ip));
    }
    name.try_into()
        .map(SanType::DnsName)
        .map_err(|e| format!("{name:?} cannot be put in a certificate: {e}"))
}

/// Makes the CA and a leaf for all of `names` (at least one), signed by it.
pub fn issue(names: &[String]) -> Result<Issued, String> {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "lazaret test API CA");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = CertifiedIssuer::self_signed(params, key("CA key")?)
        .map_err(|e| format!("cannot make the CA certificate: {e}"))?;

    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(
        DnType::CommonName,
        names.first().map_or("lazaret test API", String::as_str),
    );
    params.distinguished_name = dn;
    params.subject_alt_names = names.iter().map(|n| san(n)).collect::<Result<_, _>>()?;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    let leaf_key = key("leaf key")?;
    let leaf = params
        .signed_by(&leaf_key, &ca)
        .map_err(|e| format!("cannot make the leaf certificate: {e}"))?;

    let mut config =
        ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("cannot build the TLS configuration: {e}"))?
            .with_no_client_auth()
            .with_single_cert(
                vec![leaf.der().clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der())),
            )
            .map_err(|e| format!("cannot use the leaf certificate: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Issued {
        ca_pem: ca.pem(),
        config: Arc::new(config),
    })
}
