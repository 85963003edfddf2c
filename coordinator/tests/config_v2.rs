mod support;

// The trusted-host configuration v2: v1 and, per profile, `allow_hosts` and
// `dns`.
//
// 1. A v2 document decodes every v1 field exactly as v1 does; its two keys
//    are checked entry by entry, each refusal naming its field path.
// 2. In a v1 document the two keys stay unknown fields, with a hint.
// 3. `ConfigurationFingerprintV2` of a loaded v2 profile equals SHA-256 of
//    a preimage framed by hand in this file, never equals the v1 one of the
//    same fields, and covers every v2 field but no presentation.
// 4. The resolved configuration says which schema it came from, and its
//    network policy holds the names and the DNS mode (for v1: none, and the
//    host's resolver).
// 5. Random text behind a v2 header never panics the decoder.

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use lazaret_coordinator::config::{
    ConfigError, ConfigSchema, ResolvedDomainConfiguration, decode_configuration, decode_document,
};
use lazaret_proto::config::{ConfigurationRecord, SCHEMA_ID, SCHEMA_ID_V2};
use lazaret_proto::names::{DnsMode, HostPattern};
use proptest::prelude::*;
use sha2::{Digest, Sha256};
use support::{Fixture, message};

const V1: &str = "schema = \"lazaret-trusted-host-config-v1\"\n";
const V2: &str = "schema = \"lazaret-trusted-host-config-v2\"\n";

/// A document of `head` with profile `p` holding `extra`.
fn doc(head: &str, extra: &str) -> String {
    format!("{head}[profiles.p]\nimage = \"oci:/images/base:1\"\n{extra}\n")
}

fn chain(error: &ConfigError) -> String {
    lazaret_proto::error_chain(error)
}

#[track_caller]
fn refused(text: &str, path: &str, words: &[&str]) -> String {
    let msg = match decode_configuration(text.as_bytes()) {
        Ok(_) => panic!("expected the document to be refused:\n{text}"),
        Err(e) => {
            assert!(
                matches!(e, ConfigError::Field { .. }),
                "a field error: {e:?}"
            );
            chain(&e)
        }
    };
    assert!(
        msg.starts_with(&format!("{path}: ")),
        "expected the field path `{path}` at the start of: {msg}"
    );
    for word in words {
        assert!(msg.contains(word), "expected `{word}` in: {msg}");
    }
    msg
}

#[track_caller]
fn load_ok(fx: &Fixture, text: &str) -> ResolvedDomainConfiguration {
    fx.load_text("p", text)
        .unwrap_or_else(|e| panic!("expected the load to succeed: {}\n{text}", chain(&e)))
}

fn hosts(list: &[HostPattern]) -> Vec<&str> {
    list.iter().map(HostPattern::as_str).collect()
}

// ---------------------------------------------------------------------------
// 1 and 2: decoding
// ---------------------------------------------------------------------------

/// Every v1 field, written once and decoded under both schemas.
const EVERY_V1_FIELD: &str = r#"
isolate_gitignored = false
persistent_dirs = ["/root", "/opt"]
allow_egress = ["203.0.113.10/32"]
deny_egress = ["198.51.100.0/24"]
env = { TOKEN = "env:LZ_TOKEN" }
volumes = [
  { host = "{profile_dir}/state", container = "/root/state", kind = "directory", create = true },
]
[profiles.p.escalation]
enabled = true
auto_approve = [{ executable = "/usr/bin/git", args = ["status"] }]
"#;

#[test]
fn a_v2_document_reads_every_v1_field_as_v1_does() {
    let global = "[network]\ndefault_allow = [\"192.0.2.53/32\"]\n";
    let v1 = decode_configuration(doc(&format!("{V1}{global}"), EVERY_V1_FIELD).as_bytes())
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    let v2 = decode_configuration(doc(&format!("{V2}{global}"), EVERY_V1_FIELD).as_bytes())
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    assert_eq!(v1.schema, ConfigSchema::V1);
    assert_eq!(v2.schema, ConfigSchema::V2);
    assert_eq!(v1.document, v2.document);
    assert!(v1.names.is_empty());
    // The v2 defaults: no names, Lazaret's resolver.
    let p = v2.document.profiles.keys().next().unwrap().clone();
    let policy = v2.name_policy(&p);
    assert!(policy.allow_hosts.is_empty());
    assert_eq!(policy.dns, DnsMode::Lazaret);
    // And v1's meaning: no names, the host's resolver.
    let policy = v1.name_policy(&p);
    assert!(policy.allow_hosts.is_empty());
    assert_eq!(policy.dns, DnsMode::Host);
    // `decode_document` keeps the fields every schema has.
    assert_eq!(
        decode_document(doc(V2, EVERY_V1_FIELD).as_bytes()).unwrap(),
        decode_configuration(doc(V1, EVERY_V1_FIELD).as_bytes())
            .unwrap()
            .document
    );
}

#[test]
fn allow_hosts_and_dns_are_read_in_declared_order() {
    let decoded = decode_configuration(
        doc(
            V2,
            "allow_hosts = [\"registry.npmjs.org\", \"*.pkgs.example.org\", \"api.anthropic.com\"]\n\
             dns = \"host\"",
        )
        .as_bytes(),
    )
    .unwrap_or_else(|e| panic!("{}", chain(&e)));
    let policy = decoded.names.values().next().unwrap();
    assert_eq!(
        hosts(&policy.allow_hosts),
        [
            "registry.npmjs.org",
            "*.pkgs.example.org",
            "api.anthropic.com"
        ]
    );
    assert_eq!(policy.dns, DnsMode::Host);
    let lazaret = decode_configuration(doc(V2, "dns = \"lazaret\"").as_bytes()).unwrap();
    assert_eq!(lazaret.names.values().next().unwrap().dns, DnsMode::Lazaret);
}

#[test]
fn each_allow_hosts_entry_is_checked_and_named() {
    let entry = |list: &str| doc(V2, &format!("allow_hosts = [{list}]"));
    let msg = refused(
        &entry("\"api.anthropic.com\", \"*.org\""),
        "profiles.p.allow_hosts[1]",
        &[
            "`*.org` is a wildcard over fewer than two labels",
            "such as `example.org`",
        ],
    );
    assert_eq!(msg.lines().count(), 1, "{msg}");
    for (value, words) in [
        ("\"Example.org\"", &["`Example.org`", "lower case"][..]),
        ("\"example.org.\"", &["ends with a dot"]),
        ("\"bücher.example\"", &["punycode"]),
        ("\"a_b.example\"", &["cannot hold"]),
        ("\"a..b\"", &["empty label"]),
        ("\"a.*.example\"", &["`*`"]),
        ("\"198.18.0.1\"", &["addresses go in `allow_egress`"]),
        ("\"\"", &["is empty", "write a host name"]),
        ("1", &["invalid type"]),
    ] {
        refused(
            &entry(&format!("\"a.example\", {value}")),
            "profiles.p.allow_hosts[1]",
            words,
        );
    }
    refused(
        &doc(V2, "allow_hosts = \"a.example\""),
        "profiles.p.allow_hosts",
        &["invalid type"],
    );
    // A control character in an entry is escaped where it is quoted.
    let msg = refused(
        &entry("\"a\\u001b]0;x\\u0007.example\""),
        "profiles.p.allow_hosts[0]",
        &["cannot hold"],
    );
    assert!(!msg.chars().any(char::is_control), "{msg:?}");
}

#[test]
fn a_repeated_host_name_is_refused_naming_both_entries() {
    refused(
        &doc(
            V2,
            "allow_hosts = [\"a.example\", \"*.b.example\", \"a.example\"]",
        ),
        "profiles.p.allow_hosts[2]",
        &["`a.example` repeats profiles.p.allow_hosts[0]", "once"],
    );
    // A name and a wildcard over its parent are two entries, not a repeat.
    decode_configuration(doc(V2, "allow_hosts = [\"a.b.example\", \"*.b.example\"]").as_bytes())
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
}

#[test]
fn dns_is_lazaret_or_host() {
    for (value, words) in [
        (
            "\"Host\"",
            &["unknown value `Host`", "`lazaret`", "`host`"][..],
        ),
        ("\"none\"", &["unknown value `none`"]),
        ("\"\"", &["unknown value ``"]),
        ("true", &["invalid type"]),
    ] {
        refused(&doc(V2, &format!("dns = {value}")), "profiles.p.dns", words);
    }
}

#[test]
fn every_v2_profile_is_checked_even_when_another_is_selected() {
    let text = format!(
        "{}[profiles.q]\nimage = \"x\"\nallow_hosts = [\"*.com\"]\n",
        doc(V2, "")
    );
    refused(&text, "profiles.q.allow_hosts[0]", &["wildcard"]);
    let fx = Fixture::new();
    let msg = message(fx.load_text("p", &text));
    assert!(msg.starts_with("profiles.q.allow_hosts[0]: "), "{msg}");
}

#[test]
fn v2_keys_are_unknown_in_a_v1_document_and_say_so() {
    for (key, value) in [("allow_hosts", "[\"a.example\"]"), ("dns", "\"host\"")] {
        let msg = refused(
            &doc(V1, &format!("{key} = {value}")),
            &format!("profiles.p.{key}"),
            &[
                &format!("unknown field `{key}`, expected one of `image`"),
                &format!("`{key}` is a v2 key"),
                "schema = \"lazaret-trusted-host-config-v2\"",
            ],
        );
        // v1's list of fields is v1's.
        assert!(
            !msg.contains("expected one of `image`, `allow_hosts`"),
            "{msg}"
        );
    }
    // Elsewhere they are plain unknown fields, in v1 and in v2 alike.
    for head in [V1, V2] {
        let msg = refused(
            &format!("{head}[network]\nallow_hosts = []\n[profiles.p]\nimage = \"x\"\n"),
            "network.allow_hosts",
            &["unknown field `allow_hosts`"],
        );
        assert!(!msg.contains("v2 key"), "{msg}");
        refused(
            &doc(
                head,
                "persistent_dirs = [\"/root\"]\nvolumes = [{ host = \"/srv/x\", container = \"/root/x\", kind = \"directory\", dns = \"host\" }]",
            ),
            "profiles.p.volumes[0].dns",
            &["unknown field `dns`"],
        );
    }
    // A v2 profile's list of fields names the two keys.
    refused(
        &doc(V2, "colour = 1"),
        "profiles.p.colour",
        &["unknown field `colour`", "`allow_hosts`", "`dns`"],
    );
}

#[test]
fn the_schema_error_names_both_schemas() {
    for wrong in ["lazaret-trusted-host-config-v3", "v2", ""] {
        refused(
            &format!("schema = '{wrong}'\n[profiles.p]\nimage = 'x'\n"),
            "schema",
            &[
                "unsupported schema",
                &format!("reads only `{SCHEMA_ID}` and `{SCHEMA_ID_V2}`"),
            ],
        );
    }
    refused(
        "[profiles.p]\nimage = 'x'\n",
        "schema",
        &["required", SCHEMA_ID, SCHEMA_ID_V2],
    );
    refused(
        "schema = 2\n[profiles.p]\nimage = 'x'\n",
        "schema",
        &["must be the string", SCHEMA_ID, SCHEMA_ID_V2, "integer"],
    );
}

// ---------------------------------------------------------------------------
// 3 and 4: loading, the schema, the network policy and the fingerprint
// ---------------------------------------------------------------------------

#[test]
fn a_v1_load_has_no_names_and_the_hosts_resolver() {
    let fx = Fixture::new();
    let c = load_ok(&fx, &doc(V1, "allow_egress = [\"203.0.113.10/32\"]"));
    assert_eq!(c.schema(), ConfigSchema::V1);
    assert!(c.network().hosts.is_empty());
    assert_eq!(c.network().dns, DnsMode::Host);
    assert!(matches!(c.fingerprint_record(), ConfigurationRecord::V1(_)));
    assert_eq!(c.fingerprint(), c.record().fingerprint().unwrap());
}

#[test]
fn a_v2_load_exposes_sorted_names_and_the_dns_mode() {
    let fx = Fixture::new();
    let c = load_ok(
        &fx,
        &doc(
            V2,
            "allow_hosts = [\"registry.npmjs.org\", \"*.pkgs.example.org\", \"api.anthropic.com\"]",
        ),
    );
    assert_eq!(c.schema(), ConfigSchema::V2);
    let sorted = [
        "*.pkgs.example.org",
        "api.anthropic.com",
        "registry.npmjs.org",
    ];
    assert_eq!(hosts(&c.network().hosts), sorted);
    assert_eq!(c.network().dns, DnsMode::Lazaret);
    let ConfigurationRecord::V2(record) = c.fingerprint_record() else {
        panic!("a v2 record: {:?}", c.fingerprint_record());
    };
    assert_eq!(hosts(&record.allow_hosts), sorted);
    assert_eq!(record.dns, DnsMode::Lazaret);
    assert_eq!(&record.base, c.record());

    let c = load_ok(&fx, &doc(V2, "dns = \"host\""));
    assert!(c.network().hosts.is_empty());
    assert_eq!(c.network().dns, DnsMode::Host);
}

/// `bytes(x)`, framed here.
fn frame(x: &[u8]) -> Vec<u8> {
    let mut out = u32::try_from(x.len()).unwrap().to_be_bytes().to_vec();
    out.extend_from_slice(x);
    out
}

fn path_bytes(p: &Path) -> Vec<u8> {
    p.as_os_str().as_bytes().to_vec()
}

#[test]
fn fingerprint_v2_matches_a_preimage_framed_by_hand() {
    let fx = Fixture::new();
    let text = format!(
        "{V2}[profiles.p]\nimage = \"oci:/images/base:1\"\n\
         allow_hosts = [\"registry.npmjs.org\", \"*.pkgs.example.org\", \"api.anthropic.com\"]\n\
         dns = \"host\"\n"
    );
    let c = load_ok(&fx, &text);

    let mut p = b"lazaret-configuration-fingerprint-v2\0".to_vec();
    p.extend(frame(b"p"));
    p.extend(frame(&path_bytes(&fx.home.join(".local/share/lazaret"))));
    p.extend(frame(&path_bytes(&fx.runtime.join("lazaret"))));
    p.extend(frame(b"oci:/images/base:1"));
    p.push(0x01); // isolate_gitignored, by default
    p.extend([0, 0, 0, 0]); // persistent dirs
    p.extend([0, 0, 0, 0]); // environment references
    p.extend([0, 0, 0, 0]); // volumes
    p.extend([0, 0, 0, 0]); // effective allow
    // Effective deny: RFC 1918, sorted.
    p.extend([0, 0, 0, 3]);
    p.extend([0, 0, 0, 5, 10, 0, 0, 0, 8]);
    p.extend([0, 0, 0, 5, 172, 16, 0, 0, 12]);
    p.extend([0, 0, 0, 5, 192, 168, 0, 0, 16]);
    p.push(0x00); // escalation disabled
    p.extend([0, 0, 0, 0]); // auto-approval rules
    // allow_hosts: items bytes(name), sorted by their complete encodings,
    // so by length first.
    p.extend([0, 0, 0, 3]);
    p.extend([0, 0, 0, 21, 0, 0, 0, 17]);
    p.extend(b"api.anthropic.com");
    p.extend([0, 0, 0, 22, 0, 0, 0, 18]);
    p.extend(b"*.pkgs.example.org");
    p.extend([0, 0, 0, 22, 0, 0, 0, 18]);
    p.extend(b"registry.npmjs.org");
    p.push(0x01); // dns = "host"

    assert_eq!(c.fingerprint_record().canonical_bytes().unwrap(), p);
    let digest: [u8; 32] = Sha256::digest(&p).into();
    assert_eq!(c.fingerprint().0, digest);
}

#[test]
fn v1_and_v2_of_the_same_fields_share_the_domain_but_not_the_fingerprint() {
    let fx = Fixture::new();
    let v1 = load_ok(&fx, &doc(V1, EVERY_V1_FIELD_LOADABLE));
    let (v1_domain, v1_fingerprint) = (v1.domain_id(), v1.fingerprint());
    let v1_record = v1.record().clone();
    drop(v1);
    // v2 with what v1 means: no names, the host's resolver.
    let v2 = load_ok(
        &fx,
        &doc(V2, &format!("dns = \"host\"\n{EVERY_V1_FIELD_LOADABLE}")),
    );
    assert_eq!(v2.domain_id(), v1_domain);
    assert_eq!(v2.record(), &v1_record);
    assert_ne!(v2.fingerprint(), v1_fingerprint);
}

/// Every v1 field that loads without host tools or variables.
const EVERY_V1_FIELD_LOADABLE: &str = r#"isolate_gitignored = false
persistent_dirs = ["/root", "/opt"]
allow_egress = ["203.0.113.10/32"]
deny_egress = ["198.51.100.0/24"]
volumes = [
  { host = "{profile_dir}/state", container = "/root/state", kind = "directory", create = true },
]
"#;

#[test]
fn fingerprint_v2_covers_names_and_dns_but_no_presentation() {
    let fx = Fixture::new();
    let base_text = doc(
        V2,
        "allow_hosts = [\"a.example\", \"*.b.example\"]\ndns = \"lazaret\"",
    );
    let base = load_ok(&fx, &base_text).fingerprint();
    for same in [
        // Declared order, the default written out or left out, comments.
        doc(V2, "allow_hosts = [\"*.b.example\", \"a.example\"]"),
        doc(
            V2,
            "# names\nallow_hosts = [\n  'a.example', # one\n  \"*.b.example\",\n]\ndns = 'lazaret'",
        ),
        format!(
            "{V2}[profiles.p]\nallow_hosts = [\"a.example\", \"*.b.example\"]\nimage = \"oci:/images/base:1\"\n\
             [profiles.other]\nimage = \"x\"\nallow_hosts = [\"c.example\"]\ndns = \"host\"\n"
        ),
    ] {
        assert_eq!(load_ok(&fx, &same).fingerprint(), base, "{same}");
    }
    for changed in [
        doc(V2, "allow_hosts = [\"a.example\"]"),
        doc(
            V2,
            "allow_hosts = [\"a.example\", \"*.b.example\", \"c.example\"]",
        ),
        doc(V2, "allow_hosts = [\"a.example\", \"*.c.example\"]"),
        doc(V2, "allow_hosts = [\"a.example\", \"x.b.example\"]"),
        doc(
            V2,
            "allow_hosts = [\"a.example\", \"*.b.example\"]\ndns = \"host\"",
        ),
        doc(
            V2,
            "allow_hosts = [\"a.example\", \"*.b.example\"]\nisolate_gitignored = false",
        ),
    ] {
        assert_ne!(load_ok(&fx, &changed).fingerprint(), base, "{changed}");
    }
}

// ---------------------------------------------------------------------------
// 5: robustness
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn decoder_survives_arbitrary_v2_text(text in any::<String>()) {
        let input = format!("{V2}[profiles.p]\n{text}");
        let _ = decode_configuration(input.as_bytes());
    }

    #[test]
    fn any_valid_host_list_decodes_and_any_refusal_names_an_entry(
        names in prop::collection::vec("(\\*\\.)?[a-zA-Z0-9_.-]{0,12}", 0..6),
    ) {
        let list: Vec<String> = names.iter().map(|n| format!("{n:?}")).collect();
        let text = doc(V2, &format!("allow_hosts = [{}]", list.join(", ")));
        let parsed: Vec<Option<HostPattern>> =
            names.iter().map(|n| HostPattern::parse(n).ok()).collect();
        let first_bad = parsed.iter().position(Option::is_none);
        let repeat = (0..names.len()).find(|&i| names[..i].contains(&names[i]));
        match decode_configuration(text.as_bytes()) {
            Ok(decoded) => {
                prop_assert!(first_bad.is_none() && repeat.is_none());
                let policy = decoded.names.values().next().unwrap();
                prop_assert_eq!(hosts(&policy.allow_hosts), names.iter().map(String::as_str).collect::<Vec<_>>());
            }
            Err(e) => {
                let msg = chain(&e);
                let at = match first_bad {
                    Some(i) => i,
                    None => repeat.expect("refused without a bad or repeated entry"),
                };
                let expected = format!("profiles.p.allow_hosts[{at}]: ");
                prop_assert!(msg.starts_with(&expected), "{}", msg);
            }
        }
    }
}
