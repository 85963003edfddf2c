//! Replacing a credential's placeholder with its value, or its value with
//! its placeholder, in bytes: the one scan both directions of the proxy
//! use. A request's header values get the real values
//! ([`crate::rewrite`]); a response gets them taken back out
//! ([`crate::redact`]).
//!
//! Owns the scan's rule: left to right, at each position the longest
//! string that matches is replaced, and scanning goes on after it, so
//! nothing a replacement put in is scanned again. An empty string
//! replaces nothing. Trusts nothing in the bytes it scans.

use crate::hosts::Credential;

/// Which way the strings go.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Way {
    /// Placeholders become real values (requests).
    ToValue,
    /// Real values become placeholders (responses).
    ToPlaceholder,
}

/// What a scan did.
pub(crate) struct Scanned {
    /// Whether a string was replaced.
    pub replaced: bool,
    /// Where a held-back tail begins (only when asked to hold).
    pub held_from: Option<usize>,
}

impl Way {
    /// What `credential` has to be found, and what it becomes.
    fn pair(self, credential: &Credential) -> (&[u8], &[u8]) {
        match self {
            Self::ToValue => (credential.placeholder(), credential.value()),
            Self::ToPlaceholder => (credential.value(), credential.placeholder()),
        }
    }

    /// Which bytes begin a string this way replaces: the scan looks
    /// closer only at those.
    pub(crate) fn starts(self, credentials: &[Credential]) -> [bool; 256] {
        let mut starts = [false; 256];
        for credential in credentials {
            if let Some(first) = self.pair(credential).0.first() {
                starts[usize::from(*first)] = true;
            }
        }
        starts
    }

    /// Copies `input` to `out` with each string of `credentials` replaced
    /// (`starts` as [`Way::starts`] gives it). With `hold`, a tail that
    /// is the start of a string, but not all of one, is not copied: where
    /// it begins is returned, for the caller to scan again with what
    /// follows.
    pub(crate) fn scan(
        self,
        credentials: &[Credential],
        starts: &[bool; 256],
        input: &[u8],
        hold: bool,
        out: &mut Vec<u8>,
    ) -> Scanned {
        let pairs = || {
            credentials
                .iter()
                .map(move |c| self.pair(c))
                .filter(|(from, _)| !from.is_empty())
        };
        let mut copied = 0;
        let mut at = 0;
        let mut replaced = false;
        while let Some(skip) = input[at..].iter().position(|b| starts[usize::from(*b)]) {
            let pos = at + skip;
            let rest = &input[pos..];
            let whole = pairs()
                .filter(|(from, _)| rest.starts_with(from))
                .max_by_key(|(from, _)| from.len());
            if let Some((from, to)) = whole {
                out.extend_from_slice(&input[copied..pos]);
                out.extend_from_slice(to);
                at = pos + from.len();
                copied = at;
                replaced = true;
            } else if hold
                && pairs().any(|(from, _)| from.len() > rest.len() && from.starts_with(rest))
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
