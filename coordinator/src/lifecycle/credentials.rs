//! A generation's credentials: a fresh placeholder for each, what the
//! sandbox's environment carries instead of the real values, and the
//! sealed memfd that hands the real values to the Credential Proxy.
//!
//! Owns the placeholders of one generation (made once, so the sandbox's
//! environment and the proxy agree). The real values stay in this
//! process's memory and that memfd: never in a record, a message, a log or
//! a file. Trusts the resolved configuration and the invoking user's trust
//! store (rustls-native-certs, which honours `SSL_CERT_FILE`), whose roots
//! the proxy verifies the real hosts against.

use std::os::fd::OwnedFd;

use lazaret_proto::credproxy::{ProxyCredential, ProxyCredentials, TRUST_PATH, TRUST_VARIABLES};
use lazaret_proto::placeholder::Placeholder;

use crate::config::ResolvedDomainConfiguration;

/// The generation's credentials and their placeholders.
#[derive(Debug)]
pub(super) struct Credentials<'a> {
    resolved: &'a ResolvedDomainConfiguration,
    placeholders: Vec<Placeholder>,
}

/// Why the proxy's memfd could not be made.
#[derive(Debug, thiserror::Error)]
pub(super) enum CredentialsError {
    /// The host's trust store has no certificate.
    #[error(
        "found no trusted root certificate on the host to verify the credential hosts \
         against ({errors}); install ca-certificates or set SSL_CERT_FILE to a CA bundle"
    )]
    NoRoots {
        /// What reading the store met.
        errors: String,
    },
    /// The credentials do not encode.
    #[error("cannot encode the credentials")]
    Encode(#[source] lazaret_proto::codec::EncodeError),
    /// The memfd could not be made.
    #[error("cannot seal the credentials in a memfd")]
    Memfd(#[source] std::io::Error),
}

impl<'a> Credentials<'a> {
    /// Fresh placeholders for the profile's credentials.
    pub(super) fn new(resolved: &'a ResolvedDomainConfiguration) -> Self {
        let placeholders = resolved
            .credentials()
            .iter()
            .map(|c| Placeholder::for_value(c.value.expose()))
            .collect();
        Self {
            resolved,
            placeholders,
        }
    }

    /// Whether the profile has none (no proxy runs).
    pub(super) fn is_empty(&self) -> bool {
        self.placeholders.is_empty()
    }

    /// The variables the sandbox gets for them: each credential's
    /// placeholder, and the trust bundle in every variable common TLS
    /// clients read; nothing without credentials.
    pub(super) fn environment(&self) -> Vec<(String, String)> {
        if self.is_empty() {
            return Vec::new();
        }
        self.resolved
            .credentials()
            .iter()
            .zip(&self.placeholders)
            .map(|(c, p)| (c.env.as_str().to_owned(), p.as_str().to_owned()))
            .chain(
                TRUST_VARIABLES
                    .iter()
                    .map(|name| ((*name).to_owned(), TRUST_PATH.to_owned())),
            )
            .collect()
    }

    /// Every host the proxy serves, sorted, each once (as
    /// [`ProxyCredentials::hosts`] lists them, without copying a value).
    pub(super) fn hosts(&self) -> Vec<String> {
        lazaret_proto::credproxy::served_hosts(
            self.resolved
                .credentials()
                .iter()
                .flat_map(|c| c.hosts.iter().map(|h| h.as_str())),
        )
    }

    fn proxy_credentials(&self, roots: Vec<Vec<u8>>) -> ProxyCredentials {
        ProxyCredentials {
            credentials: self
                .resolved
                .credentials()
                .iter()
                .zip(&self.placeholders)
                .map(|(c, p)| ProxyCredential {
                    env: c.env.as_str().to_owned(),
                    placeholder: p.as_str().to_owned(),
                    value: c.value.expose().to_owned(),
                    hosts: c.hosts.iter().map(|h| h.as_str().to_owned()).collect(),
                })
                .collect(),
            roots,
        }
    }

    /// The proxy's sealed memfd: the credentials with their real values,
    /// and the host's trusted roots.
    pub(super) fn proxy_memfd(&self) -> Result<OwnedFd, CredentialsError> {
        let found = rustls_native_certs::load_native_certs();
        if found.certs.is_empty() {
            let errors = found
                .errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ");
            return Err(CredentialsError::NoRoots { errors });
        }
        let roots = found.certs.iter().map(|c| c.to_vec()).collect();
        let bytes = lazaret_proto::codec::encode(&self.proxy_credentials(roots))
            .map_err(CredentialsError::Encode)?;
        lazaret_proto::memfd::sealed_bytes("lazaret-credentials", &bytes)
            .map_err(CredentialsError::Memfd)
    }
}
