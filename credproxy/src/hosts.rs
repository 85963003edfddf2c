//! What the proxy serves: the host names it terminates TLS for, each with
//! the credentials that apply to requests to it.
//!
//! Owns the real credential values once the caller hands them over; they
//! never appear in `Debug` output or an error. Trusts its caller (the
//! role's configuration, from the Host Coordinator) for every name and
//! value, and checks only that each can be used: a DNS name, and bytes
//! that may stand in an HTTP header value.

use std::collections::BTreeMap;
use std::fmt;

use http::HeaderValue;
use rustls::pki_types::DnsName;

/// Why a host or a credential cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum HostsError {
    /// The host is not a DNS name (an address, or not a name at all).
    #[error("{host:?} is not a DNS host name; credentials are given for host names only")]
    NotAName {
        /// The host as given.
        host: String,
    },
    /// The placeholder is empty.
    #[error("the placeholder for a credential of {host} is empty")]
    EmptyPlaceholder {
        /// The host.
        host: String,
    },
    /// The placeholder or the value cannot stand in a header value.
    #[error(
        "the {what} of a credential for {host} has bytes that cannot stand in an HTTP header \
         value (control characters or line breaks)"
    )]
    NotHeaderSafe {
        /// The host.
        host: String,
        /// `placeholder` or `value`.
        what: &'static str,
    },
    /// The host already has a credential with this placeholder.
    #[error("{host} has two credentials with the same placeholder")]
    DuplicatePlaceholder {
        /// The host.
        host: String,
    },
}

/// One credential: what the sandbox holds, and the real value the proxy
/// puts in its place.
#[derive(Clone)]
pub struct Credential {
    placeholder: Box<[u8]>,
    value: Box<[u8]>,
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credential")
            .field("placeholder_len", &self.placeholder.len())
            .finish_non_exhaustive()
    }
}

impl Credential {
    /// The placeholder the sandbox holds.
    pub fn placeholder(&self) -> &[u8] {
        &self.placeholder
    }

    /// The real value.
    pub(crate) fn value(&self) -> &[u8] {
        &self.value
    }

    /// A credential made without the checks of [`Hosts::add`].
    #[cfg(test)]
    pub(crate) fn for_test(placeholder: &[u8], value: &[u8]) -> Self {
        Self {
            placeholder: placeholder.into(),
            value: value.into(),
        }
    }
}

/// Whether `bytes` may stand anywhere inside a header value: visible
/// ASCII, space, tab or obs-text, as `http` accepts them.
fn header_safe(bytes: &[u8]) -> bool {
    HeaderValue::from_bytes(bytes).is_ok()
}

/// `host` as the proxy compares it: lowercase, without a trailing dot, if
/// it is a DNS name.
pub(crate) fn normalize(host: &str) -> Option<String> {
    let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    if host.is_empty() || host.parse::<std::net::IpAddr>().is_ok() {
        return None;
    }
    DnsName::try_from(host.as_str()).ok()?;
    Some(host)
}

/// The hosts the proxy serves, each with its credentials (none: requests
/// to it pass through unchanged).
#[derive(Debug, Clone, Default)]
pub struct Hosts {
    hosts: BTreeMap<String, Vec<Credential>>,
}

impl Hosts {
    /// No host served.
    pub fn new() -> Self {
        Self::default()
    }

    /// Serves `host`, with no credential unless one is added for it.
    pub fn serve(&mut self, host: &str) -> Result<(), HostsError> {
        let name = normalize(host).ok_or_else(|| HostsError::NotAName {
            host: host.to_owned(),
        })?;
        self.hosts.entry(name).or_default();
        Ok(())
    }

    /// Serves `host` and replaces `placeholder` with `value` in the
    /// header values of its requests.
    pub fn add(&mut self, host: &str, placeholder: &[u8], value: &[u8]) -> Result<(), HostsError> {
        let name = normalize(host).ok_or_else(|| HostsError::NotAName {
            host: host.to_owned(),
        })?;
        if placeholder.is_empty() {
            return Err(HostsError::EmptyPlaceholder { host: name });
        }
        for (what, bytes) in [("placeholder", placeholder), ("value", value)] {
            if !header_safe(bytes) {
                return Err(HostsError::NotHeaderSafe { host: name, what });
            }
        }
        let credentials = self.hosts.entry(name.clone()).or_default();
        if credentials
            .iter()
            .any(|c| c.placeholder.as_ref() == placeholder)
        {
            return Err(HostsError::DuplicatePlaceholder { host: name });
        }
        credentials.push(Credential {
            placeholder: placeholder.into(),
            value: value.into(),
        });
        Ok(())
    }

    /// The names served, lowercase.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.hosts.keys().map(String::as_str)
    }

    /// The credentials for `host` (lowercase), or `None` if it is not
    /// served.
    pub fn credentials(&self, host: &str) -> Option<&[Credential]> {
        self.hosts.get(host).map(Vec::as_slice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_normalized_and_checked() {
        let mut hosts = Hosts::new();
        hosts.serve("API.Example.Invalid.").unwrap();
        assert_eq!(hosts.names().collect::<Vec<_>>(), ["api.example.invalid"]);
        for bad in ["", "127.0.0.1", "::1", "a b", "bücher.invalid"] {
            assert!(
                matches!(hosts.serve(bad), Err(HostsError::NotAName { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn values_that_cannot_be_in_a_header_are_refused_and_never_shown() {
        let mut hosts = Hosts::new();
        let e = hosts
            .add("a.invalid", b"PH", b"secret\r\nx-evil: 1")
            .unwrap_err();
        assert!(matches!(e, HostsError::NotHeaderSafe { what: "value", .. }));
        assert!(!e.to_string().contains("secret"));
        assert!(matches!(
            hosts.add("a.invalid", b"", b"v"),
            Err(HostsError::EmptyPlaceholder { .. })
        ));
        hosts.add("a.invalid", b"PH", b"secret").unwrap();
        assert!(matches!(
            hosts.add("a.invalid", b"PH", b"other"),
            Err(HostsError::DuplicatePlaceholder { .. })
        ));
        assert!(!format!("{hosts:?}").contains("secret"));
    }
}
