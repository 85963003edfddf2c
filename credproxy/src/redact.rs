//! Taking real credentials back out of a response: wherever a host's
//! response (its header values, its body, its trailers) holds the real
//! value of one of that host's credentials, the sandbox gets the
//! placeholder instead.
//!
//! Owns the one place the proxy looks at a response's bytes. The request
//! side ([`crate::rewrite`]) puts the value into whatever header the
//! sandbox chose; a host that quotes a header back (an echo, an error
//! naming a bad value) would otherwise hand the value to the sandbox.
//! The body streams through as it comes: only a chunk's last bytes that
//! could begin a value wait for the next chunk, and only as many as the
//! value is long. What it cannot see: a value the host transforms
//! (compresses, encodes, cuts). The proxy asks hosts for uncompressed
//! responses so that it sees the rest. Trusts nothing in the response.

use http::{HeaderMap, HeaderValue};
use hyper::body::Bytes;

use crate::hosts::Credential;

/// Replaces each real value in a stream of chunks, holding back the tail
/// of a chunk that may begin one.
pub(crate) struct Redactor {
    credentials: Box<[Credential]>,
    /// Which bytes begin a value.
    starts: [bool; 256],
    /// The tail of the last chunk that may begin a value.
    carry: Vec<u8>,
}

impl Redactor {
    /// A redactor of `credentials`' values, or `None` when there are none.
    pub(crate) fn new(credentials: &[Credential]) -> Option<Self> {
        let mut starts = [false; 256];
        for credential in credentials {
            starts[usize::from(*credential.value().first()?)] = true;
        }
        (!credentials.is_empty()).then(|| Self {
            credentials: credentials.into(),
            starts,
            carry: Vec::new(),
        })
    }

    /// Whether every placeholder is as long as its value, so a body keeps
    /// its length.
    pub(crate) fn keeps_length(&self) -> bool {
        self.credentials
            .iter()
            .all(|c| c.placeholder().len() == c.value().len())
    }

    /// Replaces the values in `headers`' values; a value that would not
    /// be a header value any more is emptied rather than sent.
    pub(crate) fn headers(&self, headers: &mut HeaderMap) {
        for value in headers.values_mut() {
            let mut out = Vec::new();
            if self.scan(value.as_bytes(), false, &mut out).replaced {
                *value = HeaderValue::from_bytes(&out).unwrap_or(HeaderValue::from_static(""));
            }
        }
    }

    /// The next part of the body: what was held back and `chunk`, each
    /// value replaced, less a tail that may begin a value.
    pub(crate) fn push(&mut self, chunk: Bytes) -> Bytes {
        if self.carry.is_empty() && !chunk.iter().any(|b| self.starts[usize::from(*b)]) {
            // Nothing here begins a value: the chunk goes as it came.
            return chunk;
        }
        let joined;
        let input = if self.carry.is_empty() {
            &chunk[..]
        } else {
            joined = [std::mem::take(&mut self.carry).as_slice(), &chunk[..]].concat();
            &joined
        };
        let mut out = Vec::with_capacity(input.len());
        if let Some(from) = self.scan(input, true, &mut out).held_from {
            self.carry = input[from..].to_vec();
        }
        Bytes::from(out)
    }

    /// Whether nothing is held back.
    pub(crate) fn holds_nothing(&self) -> bool {
        self.carry.is_empty()
    }

    /// What is still held back, at the end of the body: it begins no
    /// whole value, or it would have been replaced.
    pub(crate) fn finish(&mut self) -> Option<Bytes> {
        let carry = std::mem::take(&mut self.carry);
        (!carry.is_empty()).then(|| Bytes::from(carry))
    }

    /// Copies `input` to `out` with every value replaced by its
    /// placeholder (the longest that matches at each position). With
    /// `hold`, a tail that is the start of a value is not copied: where it
    /// begins is returned.
    fn scan(&self, input: &[u8], hold: bool, out: &mut Vec<u8>) -> Scanned {
        let mut copied = 0;
        let mut at = 0;
        let mut replaced = false;
        while let Some(skip) = input[at..]
            .iter()
            .position(|b| self.starts[usize::from(*b)])
        {
            let pos = at + skip;
            let rest = &input[pos..];
            let whole = self
                .credentials
                .iter()
                .filter(|c| rest.starts_with(c.value()))
                .max_by_key(|c| c.value().len());
            if let Some(credential) = whole {
                out.extend_from_slice(&input[copied..pos]);
                out.extend_from_slice(credential.placeholder());
                at = pos + credential.value().len();
                copied = at;
                replaced = true;
            } else if hold
                && self
                    .credentials
                    .iter()
                    .any(|c| c.value().len() > rest.len() && c.value().starts_with(rest))
            {
                out.extend_from_slice(&input[copied..pos]);
                return Scanned {
                    replaced,
                    held_from: Some(pos),
                };
            } else {
                at = pos + 1;
            }
        }
        out.extend_from_slice(&input[copied..]);
        Scanned {
            replaced,
            held_from: None,
        }
    }
}

/// What a scan did.
struct Scanned {
    /// Whether a value was replaced.
    replaced: bool,
    /// Where the held-back tail begins.
    held_from: Option<usize>,
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::hosts::Hosts;

    const HOST: &str = "api.example.invalid";

    fn redactor(pairs: &[(&[u8], &[u8])]) -> Redactor {
        let mut hosts = Hosts::new();
        for (placeholder, value) in pairs {
            hosts.add(HOST, placeholder, value).unwrap();
        }
        Redactor::new(hosts.credentials(HOST).unwrap()).unwrap()
    }

    /// The body as the sandbox gets it when the host sends `chunks`.
    fn through(redactor: &mut Redactor, chunks: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for chunk in chunks {
            out.extend_from_slice(&redactor.push(Bytes::copy_from_slice(chunk)));
        }
        out.extend_from_slice(&redactor.finish().unwrap_or_default());
        out
    }

    #[test]
    fn a_value_echoed_in_a_header_goes_back_as_the_placeholder() {
        let redactor = redactor(&[(b"sk-PLACEHOLDER", b"sk-REALVALUE12")]);
        let mut headers = crate::rewrite::header_map(&[
            ("x-echo", b"key sk-REALVALUE12 was bad"),
            ("x-other", b"sk-REAL"),
        ]);
        redactor.headers(&mut headers);
        assert_eq!(headers["x-echo"], "key sk-PLACEHOLDER was bad");
        assert_eq!(
            headers["x-other"], "sk-REAL",
            "a part of a value is not one"
        );
    }

    #[test]
    fn a_value_split_across_chunks_is_caught_and_only_its_start_waits() {
        let mut redactor = redactor(&[(b"sk-PLACEHOLDER", b"sk-REALVALUE12")]);
        // The first chunk's tail could begin the value: it waits.
        assert_eq!(
            &redactor.push(Bytes::from_static(b"data: {\"key\":\"sk-RE"))[..],
            b"data: {\"key\":\""
        );
        assert_eq!(
            &redactor.push(Bytes::from_static(b"ALVALUE12\"}\n\n"))[..],
            b"sk-PLACEHOLDER\"}\n\n"
        );
        assert!(redactor.holds_nothing());
        // An event that ends a chunk is never held.
        assert_eq!(
            &redactor.push(Bytes::from_static(b"data: {}\n\n"))[..],
            b"data: {}\n\n"
        );
        // A start that turns out not to be the value is let go.
        assert_eq!(&redactor.push(Bytes::from_static(b"x sk-R"))[..], b"x ");
        assert_eq!(&redactor.push(Bytes::from_static(b"ED"))[..], b"sk-RED");
        assert_eq!(redactor.push(Bytes::from_static(b"tail sk")).len(), 5);
        assert_eq!(redactor.finish().as_deref(), Some(&b"sk"[..]));
    }

    #[test]
    fn of_two_values_the_longest_that_matches_is_replaced() {
        let mut redactor = redactor(&[(b"PH-SHORT", b"ab"), (b"PH-LONG", b"abcd")]);
        assert_eq!(
            through(&mut redactor, &[b"abcd ab a"]),
            b"PH-LONG PH-SHORT a"
        );
    }

    proptest! {
        #[test]
        fn however_the_body_is_cut_no_value_gets_through(
            parts in proptest::collection::vec(
                prop_oneof![
                    Just(b"sk-ant-REAL0123456789".to_vec()),
                    Just(b"sk-ant-".to_vec()),
                    proptest::collection::vec(any::<u8>(), 0..12),
                ],
                0..12,
            ),
            cuts in proptest::collection::vec(0usize..200, 0..8),
        ) {
            let value = b"sk-ant-REAL0123456789";
            let placeholder = b"sk-ant-PLACEHOLDER-xy";
            let body = parts.concat();
            let mut points: Vec<usize> = cuts.into_iter().map(|c| c % (body.len() + 1)).collect();
            points.push(0);
            points.push(body.len());
            points.sort_unstable();
            let chunks: Vec<&[u8]> = points.windows(2).map(|w| &body[w[0]..w[1]]).collect();
            let mut redactor = redactor(&[(placeholder, value)]);
            let out = through(&mut redactor, &chunks);
            let whole = redactor_whole(&body, placeholder, value);
            prop_assert_eq!(&out, &whole);
            prop_assert!(!out.windows(value.len()).any(|w| w == value));
        }
    }

    /// `body` with each value replaced, left to right, in one piece.
    fn redactor_whole(body: &[u8], placeholder: &[u8], value: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut at = 0;
        while at < body.len() {
            if body[at..].starts_with(value) {
                out.extend_from_slice(placeholder);
                at += value.len();
            } else {
                out.push(body[at]);
                at += 1;
            }
        }
        out
    }
}
