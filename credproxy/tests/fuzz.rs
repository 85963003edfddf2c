//! Fuzz target of the Credential Proxy's header rewriting
//! ([`lazaret_credproxy::rewrite::rewrite`]): the request headers come from
//! the sandbox, the credentials from the configuration.
//!
//! `fuzz_header_rewrite`: up to three credentials (any placeholder and
//! value [`Hosts::add`] accepts) and a list of headers (any name and value
//! `http` accepts, names repeated). The rewrite must never fail (both
//! sides are valid header bytes), must leave every header's name and
//! order and every value without a placeholder as they were, and must
//! give each other value exactly what an independent, naive left-to-right
//! longest-match replacement gives, marked sensitive; the count it returns
//! is the number of values changed.
//!
//! Seeds live in `tests/__fuzz__/header_rewrite/corpus/` (the input format
//! is `build-support/fuzz_input.rs`'s; the target's own is
//! [`header_rewrite`]'s); rewrite them with
//! `cargo test -p lazaret-credproxy --test fuzz -- --ignored write_seed_corpus`.
//! The default run (`cargo test`) replays the seeds and then tries random
//! inputs for one second; a long run:
//! `BOLERO_RANDOM_TEST_TIME_MS=600000 cargo test --release -p lazaret-credproxy --test fuzz fuzz_ -- --test-threads=1`.
//! A failure prints `BOLERO_RANDOM_SEED=…`, which replays it.

#[allow(dead_code)]
#[path = "../../build-support/fuzz_input.rs"]
mod fuzz_input;

use fuzz_input::{Fields, Framer, Tally};
use http::{HeaderMap, HeaderName, HeaderValue};
use lazaret_credproxy::hosts::Hosts;
use lazaret_credproxy::rewrite::rewrite;

const HEADER_REWRITE: &str = "header_rewrite";

const HOST: &str = "api.example.invalid";

/// `value` with each placeholder of `pairs` replaced, scanning left to
/// right and taking the longest placeholder at each position; `None` when
/// none occurs.
fn model(value: &[u8], pairs: &[(Vec<u8>, Vec<u8>)]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let mut at = 0;
    let mut replaced = false;
    while at < value.len() {
        let longest = pairs
            .iter()
            .filter(|(placeholder, _)| value[at..].starts_with(placeholder))
            .max_by_key(|(placeholder, _)| placeholder.len());
        match longest {
            Some((placeholder, real)) => {
                out.extend_from_slice(real);
                at += placeholder.len();
                replaced = true;
            }
            None => {
                out.push(value[at]);
                at += 1;
            }
        }
    }
    replaced.then_some(out)
}

/// The input: a byte for the number of credentials, each a placeholder
/// and a value (short fields), then headers, each a name and a value
/// (short fields), until the input ends.
fn header_rewrite(input: &[u8]) -> bool {
    let mut fields = Fields::new(input);
    let mut hosts = Hosts::new();
    hosts.serve(HOST).unwrap();
    let mut pairs = Vec::new();
    for _ in 0..fields.byte() % 4 {
        let (placeholder, value) = (fields.short(), fields.short());
        if hosts.add(HOST, placeholder, value).is_ok() {
            pairs.push((placeholder.to_vec(), value.to_vec()));
        }
    }
    let mut headers = HeaderMap::new();
    while !fields.is_empty() {
        let (name, value) = (fields.short(), fields.short());
        if let (Ok(name), Ok(value)) =
            (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
        {
            headers.append(name, value);
        }
    }
    let before: Vec<(HeaderName, HeaderValue)> = headers
        .iter()
        .map(|(n, v)| (n.clone(), v.clone()))
        .collect();
    let credentials = hosts.credentials(HOST).unwrap();
    assert_eq!(credentials.len(), pairs.len());
    let changed =
        rewrite(&mut headers, credentials).expect("valid header bytes in, valid header bytes out");
    let after: Vec<(&HeaderName, &HeaderValue)> = headers.iter().collect();
    assert_eq!(after.len(), before.len(), "headers added or lost");
    let mut expected_changes = 0;
    for ((name, old), (new_name, new)) in before.iter().zip(&after) {
        assert_eq!(name, *new_name, "a header renamed or moved");
        match model(old.as_bytes(), &pairs) {
            Some(value) => {
                expected_changes += 1;
                assert_eq!(new.as_bytes(), value.as_slice(), "{name}: {old:?}");
                assert!(
                    new.is_sensitive(),
                    "{name}: a real value not marked sensitive"
                );
            }
            None => assert_eq!(old, *new, "{name}: changed without a placeholder"),
        }
    }
    assert_eq!(changed, expected_changes);
    changed > 0
}

#[test]
fn fuzz_header_rewrite() {
    let seeds = fuzz_input::seeds(env!("CARGO_MANIFEST_DIR"), HEADER_REWRITE);
    let tally = Tally::new(HEADER_REWRITE);
    bolero::check!(name = HEADER_REWRITE).for_each(|data: &[u8]| {
        tally.count(header_rewrite(&fuzz_input::input(data, &seeds)));
    });
}

/// Writes the seed corpus: requests as the agents' clients send them.
#[test]
#[ignore = "writes the checked-in seed corpus"]
fn write_seed_corpus() {
    type Request<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a [(&'a str, &'a str)]);
    let anthropic = "sk-ant-api03-PHPHPHPHPHPHPHPHPHPHPHPHPHPHPHPHPHPH";
    let github = "ghp_PHPHPHPHPHPHPHPHPHPHPHPHPHPHPHPHPHPH";
    let bearer = format!("Bearer {github}");
    let twice = format!("{github},{github}");
    let requests: [Request<'_>; 4] = [
        (
            "anthropic",
            &[(anthropic, "sk-ant-api03-REALREALREALREALREAL")],
            &[
                ("x-api-key", anthropic),
                ("anthropic-version", "2023-06-01"),
                ("content-type", "application/json"),
                ("user-agent", "claude-cli/1.0"),
            ],
        ),
        (
            "bearer-twice",
            &[(github, "ghp_REALREALREALREALREALREALREAL")],
            &[
                ("authorization", bearer.as_str()),
                ("x-echo", twice.as_str()),
                ("x-echo", "nothing here"),
            ],
        ),
        (
            "prefix-of-another",
            &[("PH-one", "first"), ("PH-one-two", "second")],
            &[
                ("x-a", "PH-one-two PH-one PH-on"),
                ("x-b", "PH-one-twoPH-one"),
            ],
        ),
        (
            "no-credentials",
            &[],
            &[("x-api-key", anthropic), ("accept", "*/*")],
        ),
    ];
    for (file, credentials, headers) in requests {
        let mut f = Framer::default().byte(u8::try_from(credentials.len()).unwrap());
        for (placeholder, value) in credentials {
            f = f.short(placeholder.as_bytes()).short(value.as_bytes());
        }
        for (name, value) in headers {
            f = f.short(name.as_bytes()).short(value.as_bytes());
        }
        let input = f.done();
        header_rewrite(&input);
        fuzz_input::write_seed(env!("CARGO_MANIFEST_DIR"), HEADER_REWRITE, file, &input);
    }
}
