//! The Credential Proxy's links: the one request the Runtime Supervisor
//! sends it, the credentials the Host Coordinator seals for it, the one
//! report it answers with, and the lookups it asks Lazaret's resolver for.
//!
//! This module owns those messages and the proxy's fixed places (where it
//! listens inside the enforcement namespace, where the sandbox finds the CA
//! that signs its certificates). The real values travel only in
//! [`ProxyCredentials`], inside a sealed memfd from the coordinator to the
//! proxy: never in a message, a record or a file. The proxy trusts only the
//! supervisor at the other end of its inherited channel and the resolver at
//! the other end of its lookup socket; the Host Coordinator trusts no field
//! of the report until it checks it against the hosts it asked for.

use std::net::{Ipv4Addr, SocketAddrV4};

use serde::{Deserialize, Serialize};

use crate::channel::FdIndex;
use crate::codec::WireRecord;

/// Where the proxy listens, inside the enforcement network namespace (the
/// sandbox's too): Lazaret's resolver answers every credential host with
/// this address, so the sandbox's TLS to the host's port 443 reaches it.
pub const LISTEN: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 54), 443);

/// The file in the control area (`/run/lazaret` inside the sandbox) that
/// holds the image's CA bundle and the proxy's CA after it.
pub const TRUST_FILE: &str = "ca-certificates.pem";

/// The sandbox path of [`TRUST_FILE`].
pub const TRUST_PATH: &str = "/run/lazaret/ca-certificates.pem";

/// The variables every sandbox process gets, each naming [`TRUST_PATH`],
/// when a profile has credentials: what OpenSSL, GnuTLS, Node.js, Python
/// requests, curl and git read for the roots they trust.
pub const TRUST_VARIABLES: [&str; 5] = [
    "SSL_CERT_FILE",
    "NODE_EXTRA_CA_CERTS",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "GIT_SSL_CAINFO",
];

/// One credential as the proxy gets it: what the sandbox holds, the real
/// value, and the hosts whose requests get the value in its place.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProxyCredential {
    /// The sandbox's variable, for the proxy's log.
    pub env: String,
    /// The placeholder the sandbox's environment carries.
    pub placeholder: String,
    /// The real value.
    pub value: String,
    /// The hosts (exact names, port 443) that get the real value.
    pub hosts: Vec<String>,
}

impl std::fmt::Debug for ProxyCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyCredential")
            .field("env", &self.env)
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

/// What the Host Coordinator seals in the proxy's memfd: the credentials,
/// and the roots the real hosts are verified against (DER certificates, as
/// the invoking user's TLS clients find them).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProxyCredentials {
    /// The credentials, each with its hosts.
    pub credentials: Vec<ProxyCredential>,
    /// The trusted root certificates, DER.
    pub roots: Vec<Vec<u8>>,
}

impl ProxyCredentials {
    /// Every host the proxy serves: sorted, each once.
    pub fn hosts(&self) -> Vec<String> {
        served_hosts(
            self.credentials
                .iter()
                .flat_map(|c| c.hosts.iter().map(String::as_str)),
        )
    }
}

/// The hosts a proxy serves for credentials listing `hosts`: sorted, each
/// once, as [`ProxyReadiness::hosts`] lists them.
pub fn served_hosts<'a>(hosts: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut hosts: Vec<String> = hosts.into_iter().map(str::to_owned).collect();
    hosts.sort();
    hosts.dedup();
    hosts
}

impl WireRecord for ProxyCredentials {
    const NAME: &'static str = "ProxyCredentials";
    // A host's trust store is a few hundred certificates.
    const MAX_ENCODED_LEN: usize = 8 * 1024 * 1024;
}

/// What the proxy is asked to do.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProxyServeRequest {
    /// The listening TCP socket, bound to [`LISTEN`] by the supervisor.
    pub listener: FdIndex,
    /// The sealed memfd of [`ProxyCredentials`].
    pub credentials: FdIndex,
    /// The proxy's end of a datagram socket pair whose other end Lazaret's
    /// resolver reads: [`Lookup`]s, answered with [`Looked`].
    pub lookups: FdIndex,
}

/// The supervisor's request to its proxy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProxyRequest {
    /// Serve until the Domain pid namespace ends.
    Serve(ProxyServeRequest),
}

impl WireRecord for ProxyRequest {
    const NAME: &'static str = "ProxyRequest";
}

/// What the proxy reports once it listens.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProxyReadiness {
    /// Where it listens.
    pub listen: SocketAddrV4,
    /// The hosts it serves, sorted.
    pub hosts: Vec<String>,
    /// Its CA's certificate, PEM: the sandbox trusts it.
    pub ca_certificate: String,
}

impl ProxyReadiness {
    /// Checks the readiness is about `hosts` (sorted, as
    /// [`ProxyCredentials::hosts`] gives them): the same hosts, the fixed
    /// address, and a CA certificate.
    pub fn verify(&self, hosts: &[String]) -> Result<(), ProxyMismatch> {
        if self.listen != LISTEN {
            return Err(ProxyMismatch::Listen(self.listen));
        }
        if self.hosts != hosts {
            return Err(ProxyMismatch::Hosts(self.hosts.clone()));
        }
        // One PEM block, a certificate, and nothing else: it is written
        // into the sandbox's trust bundle as it is.
        let pem = self.ca_certificate.trim_end();
        if !pem.starts_with("-----BEGIN CERTIFICATE-----")
            || !pem.ends_with("-----END CERTIFICATE-----")
            || pem.matches("-----").count() != 4
        {
            return Err(ProxyMismatch::Certificate);
        }
        Ok(())
    }
}

/// Why a proxy's readiness is not accepted.
#[derive(Debug, thiserror::Error)]
pub enum ProxyMismatch {
    /// It listens elsewhere.
    #[error("it listens on {0}, not {LISTEN}")]
    Listen(SocketAddrV4),
    /// It serves other hosts.
    #[error("it serves {0:?}, not the profile's credential hosts")]
    Hosts(Vec<String>),
    /// What it calls its CA certificate is not one.
    #[error("it sent no CA certificate")]
    Certificate,
}

/// The step a proxy failed at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProxyStep {
    /// Checking its own privileges.
    Privileges,
    /// Reading its request or credentials.
    Request,
    /// Making its CA and TLS configuration.
    Tls,
    /// Taking its sockets.
    Sockets,
}

/// Why the proxy does not serve.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{step:?}: {failure}")]
pub struct ProxyError {
    /// The step.
    pub step: ProxyStep,
    /// What failed and why.
    pub failure: crate::failure::Failure,
}

/// The proxy's one report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProxyReport {
    /// It serves, and keeps serving until the Domain pid namespace ends.
    Serving(ProxyReadiness),
    /// It could not start serving; it exits.
    Failed(ProxyError),
}

impl WireRecord for ProxyReport {
    const NAME: &'static str = "ProxyReport";
}

/// The proxy asks the resolver for the addresses of a credential host:
/// the resolver asks upstream, admits what it answers into the filter's
/// set (so the proxy may connect there) and returns them. Only a host the
/// resolver was told is proxied is looked up.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lookup {
    /// Matches the answer to the question.
    pub id: u64,
    /// The host.
    pub name: String,
}

impl WireRecord for Lookup {
    const NAME: &'static str = "Lookup";
    const MAX_ENCODED_LEN: usize = 512;
}

/// The resolver's answer to a [`Lookup`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Looked {
    /// The lookup's id.
    pub id: u64,
    /// The answer's RCODE (0 NOERROR, 2 SERVFAIL, 3 NXDOMAIN, 5 REFUSED).
    pub response_code: u8,
    /// The admitted addresses.
    pub addresses: Vec<Ipv4Addr>,
}

impl WireRecord for Looked {
    const NAME: &'static str = "Looked";
    const MAX_ENCODED_LEN: usize = 4096;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn credentials() -> ProxyCredentials {
        ProxyCredentials {
            credentials: vec![
                ProxyCredential {
                    env: "A".into(),
                    placeholder: "p".into(),
                    value: "secret-value".into(),
                    hosts: vec!["b.example".into(), "a.example".into()],
                },
                ProxyCredential {
                    env: "B".into(),
                    placeholder: "q".into(),
                    value: "other".into(),
                    hosts: vec!["a.example".into()],
                },
            ],
            roots: vec![],
        }
    }

    #[test]
    fn the_hosts_are_sorted_once_each() {
        assert_eq!(credentials().hosts(), ["a.example", "b.example"]);
    }

    #[test]
    fn a_credential_never_shows_its_value_in_debug() {
        let shown = format!("{:?}", credentials());
        assert!(!shown.contains("secret-value"), "{shown}");
        assert!(shown.contains("a.example"), "{shown}");
    }

    #[test]
    fn readiness_is_checked_against_the_credentials() {
        let credentials = credentials();
        let good = ProxyReadiness {
            listen: LISTEN,
            hosts: credentials.hosts(),
            ca_certificate: "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".into(),
        };
        assert!(good.verify(&credentials.hosts()).is_ok());
        let mut other = good.clone();
        other.hosts.pop();
        assert!(matches!(
            other.verify(&credentials.hosts()),
            Err(ProxyMismatch::Hosts(_))
        ));
        let mut elsewhere = good.clone();
        elsewhere.listen = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 443);
        assert!(matches!(
            elsewhere.verify(&credentials.hosts()),
            Err(ProxyMismatch::Listen(_))
        ));
        let two = format!("{0}{0}", good.ca_certificate);
        for bad in ["", "-----BEGIN CERTIFICATE-----\n...", two.as_str()] {
            let mut not_one = good.clone();
            not_one.ca_certificate = bad.into();
            assert!(matches!(
                not_one.verify(&credentials.hosts()),
                Err(ProxyMismatch::Certificate)
            ));
        }
    }
}
