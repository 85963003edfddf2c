mod support;

// The `credentials` entries of a v2 profile: the sandbox holds a placeholder
// in the variable, the host keeps the real value.
//
// 1. An entry decodes in declared order; every refusal names the entry's
//    field: the variable also in `env` or repeated, a value that is not an
//    `env:` reference, hosts that are empty, wildcards, repeated, or not
//    allowed by `allow_hosts`, an unknown key. In a v1 document the key is
//    unknown, with the hint that v2 has it.
// 2. A load reads each entry's real value from the host, as `env` values
//    are read, naming the entry when the variable is missing.
// 3. The fingerprint covers the entry (variable, reference, hosts; not their
//    order) and never the value; a profile without credentials keeps the
//    digest it had before credentials existed.

use lazaret_coordinator::config::{ConfigError, decode_configuration};
use support::Fixture;

const V2: &str = "schema = \"lazaret-trusted-host-config-v2\"\n";

/// A v2 document with profile `p` allowing two hosts, holding `extra`.
fn doc(extra: &str) -> String {
    format!(
        "{V2}[profiles.p]\nimage = \"oci:/images/base:1\"\n\
         allow_hosts = [\"api.anthropic.com\", \"*.example.org\"]\n{extra}\n"
    )
}

/// One `[[profiles.p.credentials]]` table.
fn entry(env: &str, value: &str, hosts: &str) -> String {
    format!("[[profiles.p.credentials]]\nenv = {env}\nvalue = {value}\nhosts = {hosts}\n")
}

fn chain(error: &ConfigError) -> String {
    lazaret_proto::error_chain(error)
}

#[track_caller]
fn refused(text: &str, path: &str, words: &[&str]) {
    let msg = match decode_configuration(text.as_bytes()) {
        Ok(_) => panic!("expected the document to be refused:\n{text}"),
        Err(e) => chain(&e),
    };
    assert!(
        msg.starts_with(&format!("{path}: ")),
        "expected the field path `{path}` at the start of: {msg}"
    );
    for word in words {
        assert!(msg.contains(word), "expected `{word}` in: {msg}");
    }
}

#[test]
fn entries_decode_in_declared_order() {
    let text = doc(&format!(
        "{}{}",
        entry("\"KEY\"", "\"env:HOST_KEY\"", "[\"api.anthropic.com\"]"),
        entry(
            "\"OTHER\"",
            "\"env:HOST_OTHER\"",
            "[\"a.example.org\", \"b.example.org\"]"
        ),
    ));
    let decoded = decode_configuration(text.as_bytes()).unwrap_or_else(|e| panic!("{}", chain(&e)));
    let policy = decoded.names.values().next().unwrap();
    let shown: Vec<(&str, &str, Vec<&str>)> = policy
        .credentials
        .iter()
        .map(|c| {
            (
                c.env.as_str(),
                c.value.host_name().as_str(),
                c.hosts.iter().map(|h| h.as_str()).collect(),
            )
        })
        .collect();
    assert_eq!(
        shown,
        [
            ("KEY", "HOST_KEY", vec!["api.anthropic.com"]),
            (
                "OTHER",
                "HOST_OTHER",
                vec!["a.example.org", "b.example.org"]
            ),
        ]
    );
}

#[test]
fn each_refusal_names_the_entry_and_the_fix() {
    let at = "profiles.p.credentials[1]";
    let first = entry("\"KEY\"", "\"env:HOST_KEY\"", "[\"api.anthropic.com\"]");
    for (second, path, words) in [
        (
            entry("\"KEY\"", "\"env:H\"", "[\"api.anthropic.com\"]"),
            format!("{at}.env"),
            &["`KEY` repeats profiles.p.credentials[0].env"][..],
        ),
        (
            entry("\"B\"", "\"env:H\"", "[\"other.invalid\"]"),
            format!("{at}.hosts[0]"),
            &[
                "`other.invalid` is not allowed by profiles.p.allow_hosts",
                "add it there",
            ],
        ),
        (
            entry(
                "\"B\"",
                "\"env:H\"",
                "[\"a.example.org\", \"a.example.org\"]",
            ),
            format!("{at}.hosts[1]"),
            &["repeats profiles.p.credentials[1].hosts[0]"],
        ),
        (
            entry("\"B\"", "\"env:H\"", "[\"*.example.org\"]"),
            format!("{at}.hosts"),
            &["`*.example.org` is a wildcard", "exact host names"],
        ),
        (
            entry("\"B\"", "\"env:H\"", "[]"),
            format!("{at}.hosts"),
            &["is empty", "name the HTTPS hosts"],
        ),
        (
            entry("\"B\"", "\"sk-ant-literal\"", "[\"api.anthropic.com\"]"),
            format!("{at}.value"),
            &["env:NAME", "literal values are not allowed"],
        ),
        (
            entry("\"1B\"", "\"env:H\"", "[\"api.anthropic.com\"]"),
            format!("{at}.env"),
            &["invalid environment name"],
        ),
        (
            format!(
                "{}port = 8443\n",
                entry("\"B\"", "\"env:H\"", "[\"api.anthropic.com\"]")
            ),
            format!("{at}.port"),
            &[
                "unknown field `port`",
                "expected one of `env`, `value`, `hosts`",
            ],
        ),
    ] {
        refused(&doc(&format!("{first}{second}")), &path, words);
    }
}

#[test]
fn a_variable_also_in_env_is_refused_since_the_sandbox_would_see_the_value() {
    refused(
        &doc(&format!(
            "env = {{ KEY = \"env:HOST_KEY\" }}\n{}",
            entry("\"KEY\"", "\"env:HOST_KEY\"", "[\"api.anthropic.com\"]")
        )),
        "profiles.p.credentials[0].env",
        &["`KEY` is also in profiles.p.env", "remove it from env"],
    );
}

#[test]
fn a_trust_variable_in_env_is_refused_since_credentials_set_it() {
    refused(
        &doc(&format!(
            "env = {{ NODE_EXTRA_CA_CERTS = \"env:HOST_CA\" }}\n{}",
            entry("\"KEY\"", "\"env:HOST_KEY\"", "[\"api.anthropic.com\"]")
        )),
        "profiles.p.env.NODE_EXTRA_CA_CERTS",
        &[
            "sets NODE_EXTRA_CA_CERTS itself",
            "/run/lazaret/ca-certificates.pem",
        ],
    );
    // Without credentials, the profile may set it.
    assert!(
        decode_configuration(doc("env = { NODE_EXTRA_CA_CERTS = \"env:HOST_CA\" }").as_bytes())
            .is_ok()
    );
}

#[test]
fn an_env_entry_reading_a_credentials_value_is_refused() {
    // Under another name in the sandbox, the real value would be inside.
    refused(
        &doc(&format!(
            "env = {{ OTHER = \"env:HOST_KEY\" }}\n{}",
            entry("\"KEY\"", "\"env:HOST_KEY\"", "[\"api.anthropic.com\"]")
        )),
        "profiles.p.env.OTHER",
        &["reads env:HOST_KEY", "profiles.p.credentials[0]"],
    );
}

#[test]
fn in_a_v1_document_credentials_are_unknown_with_a_hint() {
    let text = format!(
        "schema = \"lazaret-trusted-host-config-v1\"\n[profiles.p]\nimage = \"oci:/i:1\"\n{}",
        entry("\"KEY\"", "\"env:HOST_KEY\"", "[\"api.anthropic.com\"]")
    );
    let msg = chain(&decode_configuration(text.as_bytes()).unwrap_err());
    assert!(msg.contains("`credentials` is a v2 key"), "{msg}");
}

#[test]
fn a_load_reads_each_value_from_the_host_and_names_a_missing_one() {
    let mut fx = Fixture::new();
    let text = doc(&entry(
        "\"KEY\"",
        "\"env:HOST_KEY\"",
        "[\"api.anthropic.com\"]",
    ));
    let msg = chain(&fx.load_text("p", &text).unwrap_err());
    assert!(
        msg.starts_with("profiles.p.credentials[0].value: host variable HOST_KEY is not set"),
        "{msg}"
    );
    fx.vars.push(("HOST_KEY".into(), "sk-ant-real".into()));
    let resolved = fx
        .load_text("p", &text)
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    let [credential] = resolved.credentials() else {
        panic!("one credential: {:?}", resolved.credentials());
    };
    assert_eq!(credential.env.as_str(), "KEY");
    assert_eq!(credential.value.expose(), "sk-ant-real");
    assert_eq!(credential.hosts[0].as_str(), "api.anthropic.com");
    // Never shown, and never in the sandbox's environment.
    assert!(!format!("{resolved:?}").contains("sk-ant-real"));
    assert!(resolved.environment().is_empty());
}

#[test]
fn the_fingerprint_covers_the_entry_and_never_the_value() {
    let mut fx = Fixture::new();
    fx.vars.push(("HOST_KEY".into(), "first".into()));
    fx.vars.push(("HOST_OTHER".into(), "x".into()));
    let one = |hosts: &str| entry("\"KEY\"", "\"env:HOST_KEY\"", hosts);
    let load = |fx: &Fixture, extra: &str| {
        fx.load_text("p", &doc(extra))
            .unwrap_or_else(|e| panic!("{}", chain(&e)))
            .fingerprint()
    };
    let without = load(&fx, "");
    let with = load(&fx, &one("[\"api.anthropic.com\", \"a.example.org\"]"));
    assert_ne!(without, with);
    // The value is not covered.
    fx.vars[0].1 = "second".into();
    assert_eq!(
        load(&fx, &one("[\"api.anthropic.com\", \"a.example.org\"]")),
        with
    );
    // The order of hosts is not; the hosts, the reference and the name are.
    assert_eq!(
        load(&fx, &one("[\"a.example.org\", \"api.anthropic.com\"]")),
        with
    );
    assert_ne!(load(&fx, &one("[\"api.anthropic.com\"]")), with);
    let other_reference = entry(
        "\"KEY\"",
        "\"env:HOST_OTHER\"",
        "[\"api.anthropic.com\", \"a.example.org\"]",
    );
    assert_ne!(load(&fx, &other_reference), with);
    let other_name = entry(
        "\"KEY2\"",
        "\"env:HOST_KEY\"",
        "[\"api.anthropic.com\", \"a.example.org\"]",
    );
    assert_ne!(load(&fx, &other_name), with);
}
