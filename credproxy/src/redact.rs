//! Taking real credentials back out of a response: wherever a host's
//! response (its header values, its body, its trailers) holds the real
//! value of one of that host's credentials, the sandbox gets the
//! placeholder instead.
//!
//! Owns the one place the proxy looks at a response's bytes, and the
//! response body that streams them ([`Redacted`]). The request side
//! ([`crate::rewrite`]) puts the value into whatever header the sandbox
//! chose; a host that quotes a header back (an echo, an error naming a
//! bad value) would otherwise hand the value to the sandbox. The body
//! streams through as it comes: only a chunk's last bytes that could begin
//! a value wait for the next chunk, and only as many as the value is
//! long. What it cannot see: a value the host transforms (compresses,
//! encodes, cuts). The proxy asks hosts for uncompressed responses so that
//! it sees the rest. Trusts nothing in the response.

use std::pin::Pin;
use std::task::{Context, Poll};

use http::header::{ACCEPT_ENCODING, CONTENT_LENGTH};
use http::{HeaderMap, HeaderValue};
use hyper::body::{Body, Bytes, Frame, SizeHint};

use crate::hosts::Credential;
use crate::substitute::Way;

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
        (!credentials.is_empty()).then(|| Self {
            credentials: credentials.into(),
            starts: Way::ToPlaceholder.starts(credentials),
            carry: Vec::new(),
        })
    }

    /// Asks the host, in the request's `headers`, for a response this
    /// can read: uncompressed.
    pub(crate) fn ask_readable(headers: &mut HeaderMap) {
        headers.insert(ACCEPT_ENCODING, HeaderValue::from_static("identity"));
    }

    /// The response's head as the sandbox gets it: values taken out of
    /// `headers`, and no `Content-Length` a replacement would falsify.
    pub(crate) fn head(&self, headers: &mut HeaderMap) {
        self.headers(headers);
        if !self.keeps_length() {
            headers.remove(CONTENT_LENGTH);
        }
    }

    /// Whether every placeholder is as long as its value, so a body keeps
    /// its length.
    fn keeps_length(&self) -> bool {
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

    fn scan(&self, input: &[u8], hold: bool, out: &mut Vec<u8>) -> crate::substitute::Scanned {
        Way::ToPlaceholder.scan(&self.credentials, &self.starts, input, hold, out)
    }
}

/// A host's response body as the sandbox gets it: as it comes, with the
/// values taken out when there is a [`Redactor`].
pub(crate) struct Redacted<B> {
    body: B,
    redactor: Option<Box<Redactor>>,
    /// Trailers held while the redactor's last bytes go first.
    trailers: Option<HeaderMap>,
    /// Whether `body` has ended.
    ended: bool,
}

impl<B> Redacted<B> {
    /// `body`, through `redactor` if there is one.
    pub(crate) fn new(body: B, redactor: Option<Redactor>) -> Self {
        Self {
            body,
            redactor: redactor.map(Box::new),
            trailers: None,
            ended: false,
        }
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for Redacted<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = &mut *self;
        let Some(redactor) = this.redactor.as_mut() else {
            return Pin::new(&mut this.body).poll_frame(cx);
        };
        if let Some(trailers) = this.trailers.take() {
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
        if this.ended {
            return Poll::Ready(None);
        }
        loop {
            let frame = match std::task::ready!(Pin::new(&mut this.body).poll_frame(cx)) {
                Some(Ok(frame)) => frame,
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => {
                    this.ended = true;
                    return Poll::Ready(redactor.finish().map(|rest| Ok(Frame::data(rest))));
                }
            };
            let frame = match frame.into_data() {
                Ok(data) => match redactor.push(data) {
                    // All of it held back: wait for more.
                    out if out.is_empty() => continue,
                    out => Frame::data(out),
                },
                Err(frame) => match frame.into_trailers() {
                    Ok(mut trailers) => {
                        redactor.headers(&mut trailers);
                        match redactor.finish() {
                            Some(rest) => {
                                this.trailers = Some(trailers);
                                Frame::data(rest)
                            }
                            None => Frame::trailers(trailers),
                        }
                    }
                    Err(_) => continue,
                },
            };
            return Poll::Ready(Some(Ok(frame)));
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended
            || (self.body.is_end_stream()
                && self.trailers.is_none()
                && self.redactor.as_ref().is_none_or(|r| r.holds_nothing()))
    }

    fn size_hint(&self) -> SizeHint {
        match &self.redactor {
            Some(redactor) if !redactor.keeps_length() => SizeHint::default(),
            _ => self.body.size_hint(),
        }
    }
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
    fn an_empty_value_beside_another_leaves_the_other_redacted() {
        let credentials = [
            Credential::for_test(b"PH-EMPTY", b""),
            Credential::for_test(b"PH-KEY", b"key"),
        ];
        let mut redactor = Redactor::new(&credentials).unwrap();
        assert_eq!(
            through(&mut redactor, &[b"a key, ", b"ke", b"y"]),
            b"a PH-KEY, PH-KEY"
        );
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
