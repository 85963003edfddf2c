//! Replacing placeholders with real credentials in a request's header
//! values, and nowhere else.
//!
//! Owns the one place a real value enters a request: every occurrence of
//! a credential's placeholder inside a header value (`x-api-key: PH`,
//! `authorization: Bearer PH`) becomes the value; header names, the
//! request line and the body are left as they are (responses are
//! [`crate::redact`]'s). Trusts nothing in the request (it comes from the
//! sandbox): a value is scanned once, left to right
//! ([`crate::substitute`]), so nothing the real value holds is scanned
//! again, and a result that is not a valid header value refuses the
//! request instead of reaching the wire.

use http::{HeaderMap, HeaderName, HeaderValue};

use crate::hosts::Credential;
use crate::substitute::Way;

/// Why a request's headers could not be rewritten.
#[derive(Debug, thiserror::Error)]
pub enum RewriteError {
    /// The rewritten value of a header is not a valid header value.
    #[error(
        "the credential put into header {header} makes it an invalid header value; the request \
         was not sent"
    )]
    InvalidValue {
        /// The header.
        header: HeaderName,
    },
}

/// Replaces every placeholder of `credentials` in the values of `headers`
/// with its real value; how many values changed. With no credentials,
/// nothing changes. On an error, `headers` is left as it was.
pub fn rewrite(headers: &mut HeaderMap, credentials: &[Credential]) -> Result<usize, RewriteError> {
    if credentials.is_empty() {
        return Ok(0);
    }
    let starts = Way::ToValue.starts(credentials);
    let mut replaced = Vec::new();
    for (index, (name, value)) in headers.iter().enumerate() {
        if let Some(bytes) = replace(value.as_bytes(), credentials, &starts) {
            let mut new =
                HeaderValue::from_bytes(&bytes).map_err(|_| RewriteError::InvalidValue {
                    header: name.clone(),
                })?;
            // Never indexed by HPACK, never shown by `Debug`.
            new.set_sensitive(true);
            replaced.push((index, new));
        }
    }
    let changed = replaced.len();
    let mut replaced = replaced.into_iter().peekable();
    for (index, (_, value)) in headers.iter_mut().enumerate() {
        if let Some((_, new)) = replaced.next_if(|(at, _)| *at == index) {
            *value = new;
        }
    }
    Ok(changed)
}

/// `value` with every placeholder replaced ([`Way::scan`]); `None` when
/// no placeholder occurs.
fn replace(value: &[u8], credentials: &[Credential], starts: &[bool; 256]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(value.len());
    Way::ToValue
        .scan(credentials, starts, value, false, &mut out)
        .replaced
        .then_some(out)
}

/// A header map of `pairs`, for the crate's tests.
#[cfg(test)]
pub(crate) fn header_map(pairs: &[(&str, &[u8])]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in pairs {
        headers.append(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_bytes(value).unwrap(),
        );
    }
    headers
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::hosts::Hosts;

    const HOST: &str = "api.example.invalid";

    fn credentials(placeholder: &[u8], value: &[u8]) -> Hosts {
        let mut hosts = Hosts::new();
        hosts.add(HOST, placeholder, value).unwrap();
        hosts.serve("other.example.invalid").unwrap();
        hosts
    }

    fn map(pairs: &[(&str, &[u8])]) -> HeaderMap {
        header_map(pairs)
    }

    #[test]
    fn placeholders_in_values_become_the_value_and_names_stay() {
        let hosts = credentials(b"sk-ant-PH", b"sk-ant-REAL");
        let mut headers = map(&[
            ("x-api-key", b"sk-ant-PH"),
            ("authorization", b"Bearer sk-ant-PH"),
            ("x-twice", b"sk-ant-PH,sk-ant-PH"),
            ("x-other", b"nothing"),
            ("x-other", b"sk-ant-PH"),
        ]);
        let changed = rewrite(&mut headers, hosts.credentials(HOST).unwrap()).unwrap();
        assert_eq!(changed, 4);
        assert_eq!(headers["x-api-key"], "sk-ant-REAL");
        assert_eq!(headers["authorization"], "Bearer sk-ant-REAL");
        assert_eq!(headers["x-twice"], "sk-ant-REAL,sk-ant-REAL");
        let others: Vec<_> = headers.get_all("x-other").iter().collect();
        assert_eq!(others, ["nothing", "sk-ant-REAL"]);
        assert!(headers["x-api-key"].is_sensitive());
    }

    #[test]
    fn an_unlisted_host_is_unchanged() {
        let hosts = credentials(b"PH", b"REAL");
        let mut headers = map(&[("x-api-key", b"PH")]);
        let before = headers.clone();
        let changed = rewrite(
            &mut headers,
            hosts.credentials("other.example.invalid").unwrap(),
        )
        .unwrap();
        assert_eq!(changed, 0);
        assert_eq!(headers, before);
    }

    proptest! {
        #[test]
        fn no_placeholder_survives_for_a_listed_host(
            placeholder in "PH-[a-z]{4,12}",
            value in "[A-Z0-9_]{1,40}",
            parts in proptest::collection::vec(("[ -~]{0,12}", any::<bool>()), 1..6),
        ) {
            let hosts = credentials(placeholder.as_bytes(), value.as_bytes());
            let mut text = String::new();
            for (part, with) in &parts {
                text.push_str(part);
                if *with {
                    text.push_str(&placeholder);
                }
            }
            let mut headers = map(&[("authorization", text.as_bytes()), ("x-api-key", placeholder.as_bytes())]);
            rewrite(&mut headers, hosts.credentials(HOST).unwrap()).unwrap();
            for value in headers.values() {
                let bytes = value.as_bytes();
                prop_assert!(!bytes.windows(placeholder.len()).any(|w| w == placeholder.as_bytes()));
            }
            prop_assert_eq!(headers["x-api-key"].as_bytes(), value.as_bytes());
        }

        #[test]
        fn nothing_changes_for_an_unlisted_host(
            placeholder in "PH-[a-z]{4,12}",
            text in "[ -~]{0,40}",
        ) {
            let hosts = credentials(placeholder.as_bytes(), b"REAL");
            let with = format!("{text}{placeholder}{text}");
            let mut headers = map(&[("x-api-key", with.as_bytes()), ("x-other", text.as_bytes())]);
            let before = headers.clone();
            rewrite(&mut headers, hosts.credentials("other.example.invalid").unwrap()).unwrap();
            prop_assert_eq!(headers, before);
        }

        #[test]
        fn a_prefix_of_the_placeholder_is_left_alone(
            placeholder in "PH-[a-z]{4,12}",
            cut in 1usize..4,
            before in "[ -~]{0,10}",
            after in "[ -~]{0,10}",
        ) {
            let hosts = credentials(placeholder.as_bytes(), b"REAL");
            let prefix = &placeholder[..placeholder.len() - cut];
            let text = format!("{before}{prefix}");
            let later = format!("{prefix}{after}");
            prop_assume!(!text.contains(placeholder.as_str()) && !later.contains(placeholder.as_str()));
            let mut headers = map(&[("x-a", text.as_bytes()), ("x-b", later.as_bytes())]);
            let unchanged = headers.clone();
            let changed = rewrite(&mut headers, hosts.credentials(HOST).unwrap()).unwrap();
            prop_assert_eq!(changed, 0);
            prop_assert_eq!(headers, unchanged);
        }
    }

    #[test]
    fn a_result_that_is_not_a_header_value_is_refused_and_changes_nothing() {
        // `Hosts` refuses such a value; a credential made any other way
        // must still not reach the wire.
        let bad = Credential::for_test(b"PH", b"a\r\nx-evil: 1");
        let mut headers = map(&[("x-first", b"PH"), ("x-api-key", b"PH")]);
        let before = headers.clone();
        let e = rewrite(&mut headers, &[bad]).unwrap_err();
        assert!(matches!(e, RewriteError::InvalidValue { .. }));
        assert_eq!(headers, before);
    }
}
