//! The placeholder a sandbox holds in place of a credential: fresh for
//! each generation, random, and shaped like the real value where its kind
//! is known (`sk-ant-api03-` and random characters for an Anthropic key),
//! so that a client that checks a key's shape before sending it still
//! sends the placeholder, which the proxy then replaces.
//!
//! Owns the making of placeholders only. Trusts nothing: the real value is
//! read for its known prefix and its length, and nothing of the rest of it
//! reaches the placeholder.

use std::fmt;

/// Prefixes of well-known credential kinds, longest first where one
/// begins another; a placeholder keeps the one its real value begins with.
const KNOWN_PREFIXES: [&str; 17] = [
    "sk-ant-admin01-",
    "sk-ant-api03-",
    "sk-ant-",
    "sk-svcacct-",
    "sk-proj-",
    "sk-",
    "github_pat_",
    "ghp_",
    "gho_",
    "ghu_",
    "ghs_",
    "ghr_",
    "glpat-",
    "xoxb-",
    "xoxp-",
    "hf_",
    "AIza",
];

/// The fewest random characters a placeholder has: 62^32 is about 2^190,
/// so neither a guess nor a chance match in a header is a concern.
pub const MIN_RANDOM_LEN: usize = 32;

/// The characters the random part is drawn from: valid in every header
/// value, in URLs and in shells without quoting.
const ALPHABET: &[u8; 62] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/// A placeholder: what the sandbox's variable holds.
#[derive(Clone, PartialEq, Eq)]
pub struct Placeholder(String);

impl Placeholder {
    /// A fresh placeholder for `real`: its known prefix, then random
    /// characters to the real value's length (at least
    /// [`MIN_RANDOM_LEN`] of them).
    pub fn for_value(real: &str) -> Self {
        let prefix = KNOWN_PREFIXES
            .iter()
            .find(|p| real.starts_with(*p))
            .copied()
            .unwrap_or("");
        let random = real.len().saturating_sub(prefix.len()).max(MIN_RANDOM_LEN);
        let mut text = String::with_capacity(prefix.len() + random);
        text.push_str(prefix);
        while text.len() < prefix.len() + random {
            // Rejection sampling keeps every character equally likely:
            // 248 = 4 * 62 is the largest multiple of 62 a byte holds.
            for byte in crate::signing::random_bytes::<64>() {
                if byte < 248 && text.len() < prefix.len() + random {
                    text.push(char::from(ALPHABET[usize::from(byte % 62)]));
                }
            }
        }
        Self(text)
    }

    /// The placeholder's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Placeholder {
    /// Not secret, but long: its prefix and length only.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown: String = self.0.chars().take(8).collect();
        write!(f, "Placeholder({shown}…, {} bytes)", self.0.len())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::{ALPHABET, KNOWN_PREFIXES, MIN_RANDOM_LEN, Placeholder};

    fn random_part<'a>(placeholder: &'a Placeholder, prefix: &str) -> &'a str {
        placeholder
            .as_str()
            .strip_prefix(prefix)
            .expect("the prefix is kept")
    }

    #[test]
    fn a_known_kind_keeps_its_prefix_and_length() {
        let real = format!("sk-ant-api03-{}", "x".repeat(95));
        let placeholder = Placeholder::for_value(&real);
        assert!(placeholder.as_str().starts_with("sk-ant-api03-"));
        assert_eq!(placeholder.as_str().len(), real.len());
        assert!(!placeholder.as_str().contains("xxxx"));
        let github = Placeholder::for_value(&format!("ghp_{}", "a".repeat(36)));
        assert!(github.as_str().starts_with("ghp_"));
        assert_eq!(github.as_str().len(), 40);
    }

    #[test]
    fn a_short_or_unknown_value_gets_the_floor_of_random_characters() {
        let short = Placeholder::for_value("sk-abc");
        assert_eq!(random_part(&short, "sk-").len(), MIN_RANDOM_LEN);
        let unknown = Placeholder::for_value("hunter2");
        assert_eq!(unknown.as_str().len(), MIN_RANDOM_LEN);
        assert_eq!(Placeholder::for_value("").as_str().len(), MIN_RANDOM_LEN);
    }

    #[test]
    fn each_placeholder_is_fresh() {
        let real = "sk-ant-api03-secret";
        assert_ne!(Placeholder::for_value(real), Placeholder::for_value(real));
    }

    #[test]
    fn the_longest_known_prefix_wins() {
        for (real, prefix) in [
            ("sk-ant-api03-k", "sk-ant-api03-"),
            ("sk-ant-other", "sk-ant-"),
            ("sk-proj-k", "sk-proj-"),
            ("sk-k", "sk-"),
        ] {
            let placeholder = Placeholder::for_value(real);
            let kept = KNOWN_PREFIXES
                .iter()
                .filter(|p| placeholder.as_str().starts_with(*p))
                .max_by_key(|p| p.len())
                .copied();
            assert_eq!(kept, Some(prefix), "{real}");
        }
    }

    #[test]
    fn debug_shows_only_the_start() {
        let shown = format!("{:?}", Placeholder::for_value("hunter2"));
        assert!(shown.starts_with("Placeholder("), "{shown}");
        assert!(shown.ends_with(", 32 bytes)"), "{shown}");
    }

    proptest! {
        #[test]
        fn the_random_part_is_drawn_from_the_alphabet_and_never_echoes_the_value(
            real in "[ -~]{0,200}",
        ) {
            let placeholder = Placeholder::for_value(&real);
            let prefix = KNOWN_PREFIXES.iter().find(|p| real.starts_with(*p)).copied().unwrap_or("");
            let rest = random_part(&placeholder, prefix);
            prop_assert!(rest.len() >= MIN_RANDOM_LEN);
            prop_assert_eq!(placeholder.as_str().len(), real.len().max(prefix.len() + MIN_RANDOM_LEN));
            prop_assert!(rest.bytes().all(|b| ALPHABET.contains(&b)));
            let tail = &real[prefix.len()..];
            prop_assert!(tail.len() < 16 || !placeholder.as_str().contains(tail));
        }
    }
}
