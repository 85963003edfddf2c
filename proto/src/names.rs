//! Host names in a network policy: what `allow_hosts` may say, and which
//! looked-up names an entry allows.
//!
//! Owns the grammar of one entry: an exact DNS name, or `*.` followed by a
//! suffix of at least two labels, in the ASCII (IDNA/punycode) form only,
//! lower case, with no trailing dot, each label 1-63 bytes of letters,
//! digits and inner hyphens, the whole at most 253 bytes. Trusts nothing:
//! every entry is validated when decoded, and names looked up by the
//! sandbox are compared byte for byte after the same normalisation DNS
//! itself does (ASCII case folding, the root dot dropped).

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The longest name DNS carries, in its text form without the root dot.
pub const MAX_NAME_LEN: usize = 253;
/// The longest label.
pub const MAX_LABEL_LEN: usize = 63;

/// One `allow_hosts` entry, validated.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HostPattern {
    /// The entry as written (and as validated).
    text: String,
}

/// Why an `allow_hosts` entry is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HostPatternError {
    /// Nothing.
    #[error("is empty")]
    Empty,
    /// Longer than DNS allows.
    #[error("is {0} bytes long; a DNS name is at most {MAX_NAME_LEN}")]
    TooLong(usize),
    /// Ends with the root dot.
    #[error("ends with a dot; write the name without it")]
    TrailingDot,
    /// A label is empty (two dots, or a leading dot).
    #[error("has an empty label")]
    EmptyLabel,
    /// A label is longer than DNS allows.
    #[error("has a label of {0} bytes; a label is at most {MAX_LABEL_LEN}")]
    LongLabel(usize),
    /// Upper-case letters: DNS compares without case, the policy is written
    /// in one.
    #[error("has upper-case letters; write it in lower case")]
    UpperCase,
    /// Not ASCII: international names are written in their punycode form.
    #[error("is not ASCII; write an international name in its punycode form (xn--...)")]
    NotAscii,
    /// A byte no host name label may hold.
    #[error("has {0:?}, which a host name cannot hold (letters, digits and inner hyphens only)")]
    BadCharacter(char),
    /// A label starts or ends with a hyphen.
    #[error("has a label that starts or ends with a hyphen")]
    EdgeHyphen,
    /// `*` anywhere but as the whole first label.
    #[error("has `*` other than as `*.` at its start")]
    MisplacedWildcard,
    /// A wildcard over a top-level domain or less.
    #[error(
        "is a wildcard over fewer than two labels; write `*.` and a suffix such as `example.org`"
    )]
    BroadWildcard,
    /// An all-numeric last label: an address, not a name.
    #[error("is an address, not a name; addresses go in `allow_egress`")]
    Address,
}

impl HostPattern {
    /// Validates one entry.
    pub fn parse(text: &str) -> Result<Self, HostPatternError> {
        if text.is_empty() {
            return Err(HostPatternError::Empty);
        }
        if !text.is_ascii() {
            return Err(HostPatternError::NotAscii);
        }
        if text.len() > MAX_NAME_LEN {
            return Err(HostPatternError::TooLong(text.len()));
        }
        if text.ends_with('.') && text.len() > 1 {
            return Err(HostPatternError::TrailingDot);
        }
        let (wildcard, suffix) = match text.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let labels: Vec<&str> = suffix.split('.').collect();
        for label in &labels {
            check_label(label)?;
        }
        if wildcard && labels.len() < 2 {
            return Err(HostPatternError::BroadWildcard);
        }
        if labels
            .last()
            .is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit()))
        {
            return Err(HostPatternError::Address);
        }
        Ok(Self { text: text.into() })
    }

    /// The entry as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether this is a `*.` entry.
    pub fn is_wildcard(&self) -> bool {
        self.text.starts_with("*.")
    }

    /// Whether the entry allows `name`, a looked-up name in any case, with
    /// or without the root dot: an exact entry allows itself, `*.suffix`
    /// allows every name with at least one more label before `suffix`
    /// (never `suffix` itself).
    pub fn matches(&self, name: &str) -> bool {
        let name = name.strip_suffix('.').unwrap_or(name);
        match self.text.strip_prefix("*.") {
            None => name.eq_ignore_ascii_case(&self.text),
            Some(suffix) => {
                name.len() > suffix.len() + 1
                    && name.as_bytes()[name.len() - suffix.len() - 1] == b'.'
                    && name[name.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
            }
        }
    }
}

fn check_label(label: &str) -> Result<(), HostPatternError> {
    if label.is_empty() {
        return Err(HostPatternError::EmptyLabel);
    }
    if label.len() > MAX_LABEL_LEN {
        return Err(HostPatternError::LongLabel(label.len()));
    }
    for c in label.chars() {
        match c {
            'a'..='z' | '0'..='9' | '-' => {}
            'A'..='Z' => return Err(HostPatternError::UpperCase),
            '*' => return Err(HostPatternError::MisplacedWildcard),
            other => return Err(HostPatternError::BadCharacter(other)),
        }
    }
    if label.starts_with('-') || label.ends_with('-') {
        return Err(HostPatternError::EdgeHyphen);
    }
    Ok(())
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Serialize for HostPattern {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for HostPattern {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Self::parse(&text).map_err(|e| serde::de::Error::custom(format_args!("`{text}` {e}")))
    }
}

/// Whether any of `patterns` allows `name`.
pub fn allowed(patterns: &[HostPattern], name: &str) -> bool {
    patterns.iter().any(|p| p.matches(name))
}

/// Who answers the sandbox's DNS queries.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub enum DnsMode {
    /// Lazaret's resolver: only names the policy allows, never sent
    /// upstream otherwise (the v2 default).
    #[default]
    Lazaret,
    /// The host's resolver, through the connectivity helper, for every
    /// name (v1's behaviour, and v2's `dns = "host"`): a way out.
    Host,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_follow_the_grammar() {
        for good in [
            "api.anthropic.com",
            "*.pkgs.example.org",
            "localhost",
            "xn--bcher-kva.example",
            "a-b.c0.example",
            "*.a.b",
        ] {
            assert!(HostPattern::parse(good).is_ok(), "{good}");
        }
        let long_label = "a".repeat(64);
        let long_name = ["a".repeat(63).as_str(); 4].join(".") + ".ab";
        for (bad, why) in [
            ("", HostPatternError::Empty),
            ("example.org.", HostPatternError::TrailingDot),
            ("a..b", HostPatternError::EmptyLabel),
            (".a.b", HostPatternError::EmptyLabel),
            (long_label.as_str(), HostPatternError::LongLabel(64)),
            (
                long_name.as_str(),
                HostPatternError::TooLong(long_name.len()),
            ),
            ("Example.org", HostPatternError::UpperCase),
            ("bücher.example", HostPatternError::NotAscii),
            ("a_b.example", HostPatternError::BadCharacter('_')),
            ("-a.example", HostPatternError::EdgeHyphen),
            ("a.*.example", HostPatternError::MisplacedWildcard),
            ("*example.org", HostPatternError::MisplacedWildcard),
            ("*.org", HostPatternError::BroadWildcard),
            ("*", HostPatternError::MisplacedWildcard),
            ("198.18.0.1", HostPatternError::Address),
        ] {
            assert_eq!(HostPattern::parse(bad), Err(why), "{bad:?}");
        }
    }

    #[test]
    fn wildcards_match_deeper_names_only() {
        let w = HostPattern::parse("*.pkgs.example.org").unwrap();
        assert!(w.matches("a.pkgs.example.org"));
        assert!(w.matches("a.b.pkgs.example.org."));
        assert!(w.matches("A.PKGS.Example.org"));
        assert!(!w.matches("pkgs.example.org"));
        assert!(!w.matches("apkgs.example.org"));
        assert!(!w.matches(".pkgs.example.org"));
        assert!(!w.matches("a.pkgs.example.org.evil"));
        let e = HostPattern::parse("api.anthropic.com").unwrap();
        assert!(e.matches("API.anthropic.com."));
        assert!(!e.matches("x.api.anthropic.com"));
        assert!(!e.matches("api.anthropic.co"));
    }

    #[test]
    fn decoding_validates() {
        let bad: Result<HostPattern, _> = serde_json::from_str("\"*.org\"");
        assert!(bad.is_err());
        let good: HostPattern = serde_json::from_str("\"a.example\"").unwrap();
        assert_eq!(good.as_str(), "a.example");
    }
}
