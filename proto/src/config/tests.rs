use super::*;

fn sha(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// `bytes(x)` framed by hand.
fn b(x: &[u8]) -> Vec<u8> {
    let mut out = (x.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(x);
    out
}

#[test]
fn domain_id_matches_a_hand_framed_preimage() {
    let profile = ProfileName::parse("claude").unwrap();
    let mut preimage = b"lazaret-domain-id-v1\0".to_vec();
    assert_eq!(preimage.len(), 21);
    preimage.extend_from_slice(&[0, 0, 0, 6]);
    preimage.extend_from_slice(b"claude");
    preimage.extend_from_slice(&[0, 0, 0, 14]);
    preimage.extend_from_slice(b"/home/dev/proj");
    let id = domain_id(&profile, b"/home/dev/proj").unwrap();
    assert_eq!(id.0, sha(&preimage));
    // Unframed concatenation is not the v1 preimage.
    let unframed = [&b"lazaret-domain-id-v1\0"[..], b"claude", b"/home/dev/proj"].concat();
    assert_ne!(id.0, sha(&unframed));
    // Moving bytes between the two fields changes the digest.
    let other = domain_id(&ProfileName::parse("claud").unwrap(), b"e/home/dev/proj").unwrap();
    assert_ne!(id, other);
}

fn sample_record() -> ConfigurationFingerprintRecordV1 {
    ConfigurationFingerprintRecordV1 {
        selected_profile: "p".into(),
        storage_root: b"/s".to_vec(),
        runtime_root: b"/r".to_vec(),
        image: "img".into(),
        isolate_gitignored: true,
        persistent_dirs: vec!["/root".into(), "/opt".into()],
        environment_references: vec![EnvironmentReference {
            sandbox_name: "K".into(),
            host_name: "H".into(),
        }],
        volumes: vec![ResolvedVolume {
            canonical_host_source: b"/v".to_vec(),
            container_path: "/root/v".into(),
            kind: VolumeKind::Directory,
            access: VolumeAccess::ReadOnly,
            create: true,
        }],
        effective_allow_prefixes: vec![Ipv4Prefix::parse("203.0.113.10/32").unwrap()],
        effective_deny_prefixes: RFC1918.to_vec(),
        escalation_enabled: true,
        auto_approval_rules: vec![ResolvedAutoApprovalRule {
            canonical_executable: b"/usr/bin/gh".to_vec(),
            args: vec!["pr".into(), "create".into()],
            allow_extra_args: true,
        }],
    }
}

#[test]
fn fingerprint_matches_a_hand_framed_preimage() {
    let mut p = b"lazaret-configuration-fingerprint-v1\0".to_vec();
    p.extend(b(b"p"));
    p.extend(b(b"/s"));
    p.extend(b(b"/r"));
    p.extend(b(b"img"));
    p.push(1);
    // persistent dirs: items are bytes(path), sorted by encoding: "/opt" < "/root".
    p.extend(2u32.to_be_bytes());
    p.extend(b(&b(b"/opt")));
    p.extend(b(&b(b"/root")));
    // env references
    p.extend(1u32.to_be_bytes());
    p.extend(b(&[b(b"K"), b(b"H")].concat()));
    // volumes: host, container, kind=directory(1), access=read-only(0), create=1
    p.extend(1u32.to_be_bytes());
    p.extend(b(&[b(b"/v"), b(b"/root/v"), vec![1, 0, 1]].concat()));
    // allow
    p.extend(1u32.to_be_bytes());
    p.extend(b(&[203, 0, 113, 10, 32]));
    // deny, sorted: 10/8 < 172.16/12 < 192.168/16
    p.extend(3u32.to_be_bytes());
    p.extend(b(&[10, 0, 0, 0, 8]));
    p.extend(b(&[172, 16, 0, 0, 12]));
    p.extend(b(&[192, 168, 0, 0, 16]));
    p.push(1);
    // rules: exe, declared-order args, allow_extra_args
    let args = [2u32.to_be_bytes().to_vec(), b(&b(b"pr")), b(&b(b"create"))].concat();
    p.extend(1u32.to_be_bytes());
    p.extend(b(&[b(b"/usr/bin/gh"), args, vec![1]].concat()));

    let record = sample_record();
    assert_eq!(record.canonical_bytes().unwrap(), p);
    assert_eq!(record.fingerprint().unwrap().0, sha(&p));
}

#[test]
fn fingerprint_ignores_list_order_but_not_argument_order() {
    let base = sample_record();
    let mut reordered = base.clone();
    reordered.persistent_dirs.reverse();
    reordered.effective_deny_prefixes.reverse();
    assert_eq!(base.fingerprint(), reordered.fingerprint());

    let mut args_swapped = base.clone();
    args_swapped.auto_approval_rules[0].args.reverse();
    assert_ne!(base.fingerprint(), args_swapped.fingerprint());
}

#[test]
fn profile_names() {
    for good in ["a", "A9", "claude", "x.y_z-1", &"a".repeat(64)] {
        assert!(ProfileName::parse(good).is_ok(), "{good}");
    }
    for bad in [
        "",
        ".",
        "..",
        "-a",
        ".a",
        "_a",
        "a b",
        "a/b",
        "é",
        &"a".repeat(65),
    ] {
        assert!(ProfileName::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn env_names_and_references() {
    assert!(EnvName::parse("_A1").is_ok());
    for bad in ["", "1A", "A-B", "A B"] {
        assert!(EnvName::parse(bad).is_err(), "{bad}");
    }
    let r = EnvReferenceDecl::parse("env:API_KEY").unwrap();
    assert_eq!(r.host_name().as_str(), "API_KEY");
    for bad in [
        "API_KEY",
        "env:",
        "env:1X",
        "file:/x",
        "ENV:X",
        "sk-literal-secret",
    ] {
        assert!(EnvReferenceDecl::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn host_paths() {
    let cases = [
        ("/etc/x", HostAnchor::Root, "etc/x"),
        ("~/.config", HostAnchor::Home, ".config"),
        ("{profile_dir}/state", HostAnchor::ProfileDir, "state"),
    ];
    for (text, anchor, suffix) in cases {
        let p = HostPathDecl::parse(text).unwrap();
        assert_eq!((p.anchor(), p.suffix()), (anchor, suffix));
    }
    for bad in [
        "",
        "/",
        "~",
        "~/",
        "~//etc",
        "{profile_dir}//etc",
        "{profile_dir}/",
        "relative",
        "/a//b",
        "/a/",
        "/a/./b",
        "/a/../b",
        "~user/x",
        "/a/~b",
        "$HOME/x",
        "/a/$X",
        "/a/*",
        "/a/b?",
        "/a/[b]",
        "/a/{b}",
        "/a/`b`",
        "/a\0b",
        "{profile_dir}",
        "{PROFILE_DIR}/x",
    ] {
        assert!(HostPathDecl::parse(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn sandbox_paths() {
    let p = SandboxPath::parse("/root/.cache").unwrap();
    assert!(p.is_within(&SandboxPath::parse("/root").unwrap()));
    assert!(
        !SandboxPath::parse("/rootx")
            .unwrap()
            .is_within(&SandboxPath::parse("/root").unwrap())
    );
    assert!(p.overlaps(&SandboxPath::parse("/root").unwrap()));
    for bad in [
        "/", "", "root", "//root", "/root/", "/a/../b", "/a/./b", "~/x", "/a\0",
    ] {
        assert!(SandboxPath::parse(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn ipv4_prefixes() {
    let p = Ipv4Prefix::parse("10.222.7.9/16").unwrap();
    assert_eq!(p.to_string(), "10.222.0.0/16");
    assert_eq!(
        Ipv4Prefix::parse("1.2.3.4/0").unwrap().to_string(),
        "0.0.0.0/0"
    );
    assert_eq!(
        Ipv4Prefix::parse("1.2.3.4/32").unwrap().to_string(),
        "1.2.3.4/32"
    );
    for bad in [
        "10.0.0.0",
        "10.0.0.0/33",
        "10.0.0/8",
        "10.0.0.0/",
        "10.0.0.0/08",
        "010.0.0.0/8",
        "::1/128",
        "10.0.0.0/8 ",
        "10.0.0.0/+8",
        "a.b.c.d/8",
    ] {
        assert!(Ipv4Prefix::parse(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn image_and_arguments() {
    assert!(ImageReference::parse("oci:/x:tag").is_ok());
    assert!(ImageReference::parse("").is_err());
    assert!(ImageReference::parse("  ").is_err());
    assert!(ImageReference::parse("a\0b").is_err());
    assert!(Argument::parse("").is_ok());
    assert!(Argument::parse("a\0").is_err());
}

#[test]
fn a_quoted_value_is_escaped_and_a_long_one_shows_its_ends() {
    assert_eq!(quoted("a\u{1b}]0;t\u{7}"), "a\\u{1b}]0;t\\u{7}");
    let short = "x".repeat(QUOTED_MAX);
    assert_eq!(quoted(&short), short);
    let long = format!(
        "{}{}{}",
        "b".repeat(200),
        "m".repeat(400_000),
        "e".repeat(200)
    );
    let shown = quoted(&long);
    assert!(
        shown.starts_with(&"b".repeat(QUOTED_MAX * 3 / 4)),
        "{shown}"
    );
    assert!(shown.ends_with(&"e".repeat(QUOTED_MAX / 4)), "{shown}");
    assert!(
        shown.contains(&format!("…({} more characters)…", long.len() - QUOTED_MAX)),
        "{shown}"
    );
    assert!(shown.chars().count() < QUOTED_MAX + 40, "{shown}");
}

// ---------------------------------------------------------------------------
// ConfigurationFingerprintV2
// ---------------------------------------------------------------------------

use crate::names::{DnsMode, HostPattern};

fn host(text: &str) -> HostPattern {
    HostPattern::parse(text).unwrap()
}

fn sample_record_v2() -> ConfigurationFingerprintRecordV2 {
    ConfigurationFingerprintRecordV2 {
        base: sample_record(),
        allow_hosts: vec![host("*.pkgs.example.org"), host("api.anthropic.com")],
        dns: DnsMode::Lazaret,
        credentials: Vec::new(),
    }
}

/// The digests of the sample records, each computed once from a preimage
/// framed by a separate implementation of the schema's rules; they pin the
/// encodings against any later change.
const SAMPLE_V1_HEX: &str = "b7af4002e4dccbd4a6c264c1515bc6b5f4bf187f92715984ea7bbc107cbc8ace";
const SAMPLE_V2_HEX: &str = "96c00c7aebd00e375b14d6ee8bfa9c7893ef7f4ad2f6c979085386084dccabaf";
const SAMPLE_V2_DNS_HOST_HEX: &str =
    "bd5461221fd1ef04e5572ddc4779e1cf65db888a17d0922f6b0c55457155e2fe";
const SAMPLE_V2_NO_HOSTS_DNS_HOST_HEX: &str =
    "2e165e8d96d588c944ecb4031d9a94d8fdfff2026999bc91a6f5d2db0611cff5";

#[test]
fn fingerprint_v2_matches_a_hand_framed_preimage() {
    let v1 = sample_record().canonical_bytes().unwrap();
    let fields = &v1[b"lazaret-configuration-fingerprint-v1\0".len()..];
    let mut p = b"lazaret-configuration-fingerprint-v2\0".to_vec();
    assert_eq!(p.len(), 37);
    // Every v1 field, framed exactly as v1 frames it.
    p.extend_from_slice(fields);
    // allow_hosts: items bytes(name), sorted by the complete item encoding,
    // whose length prefix puts the 17-byte name first.
    p.extend(2u32.to_be_bytes());
    p.extend(b(&b(b"api.anthropic.com")));
    p.extend(b(&b(b"*.pkgs.example.org")));
    // dns: lazaret is 0x00.
    p.push(0x00);

    let record = sample_record_v2();
    assert_eq!(record.canonical_bytes().unwrap(), p);
    assert_eq!(record.fingerprint().unwrap().0, sha(&p));
    assert_eq!(record.fingerprint().unwrap().to_hex(), SAMPLE_V2_HEX);
    assert_eq!(
        sample_record().fingerprint().unwrap().to_hex(),
        SAMPLE_V1_HEX
    );

    let mut dns_host = record.clone();
    dns_host.dns = DnsMode::Host;
    let mut q = p.clone();
    *q.last_mut().unwrap() = 0x01;
    assert_eq!(dns_host.canonical_bytes().unwrap(), q);
    assert_eq!(
        dns_host.fingerprint().unwrap().to_hex(),
        SAMPLE_V2_DNS_HOST_HEX
    );

    let no_hosts = ConfigurationFingerprintRecordV2 {
        base: sample_record(),
        allow_hosts: Vec::new(),
        dns: DnsMode::Host,
        credentials: Vec::new(),
    };
    let mut e = b"lazaret-configuration-fingerprint-v2\0".to_vec();
    e.extend_from_slice(fields);
    e.extend(0u32.to_be_bytes());
    e.push(0x01);
    assert_eq!(no_hosts.canonical_bytes().unwrap(), e);
    assert_eq!(
        no_hosts.fingerprint().unwrap().to_hex(),
        SAMPLE_V2_NO_HOSTS_DNS_HOST_HEX
    );
}

#[test]
fn credentials_are_framed_after_the_dns_byte_and_their_values_never() {
    let p = sample_record_v2().canonical_bytes().unwrap();
    let mut record = sample_record_v2();
    record.credentials = vec![
        CredentialEntry {
            sandbox_name: "TOKEN".into(),
            host_name: "HOST_TOKEN".into(),
            hosts: vec![host("api.anthropic.com"), host("a.example.org")],
        },
        CredentialEntry {
            sandbox_name: "B".into(),
            host_name: "C".into(),
            hosts: vec![host("api.anthropic.com")],
        },
    ];
    // Sorted by complete item encoding: `B`'s item is the shorter prefix.
    let item = |sandbox: &[u8], host_name: &[u8], hosts: &[&[u8]]| {
        let mut i = b(sandbox);
        i.extend(b(host_name));
        let mut names: Vec<Vec<u8>> = hosts.iter().map(|h| b(h)).collect();
        names.sort();
        i.extend(u32::try_from(names.len()).unwrap().to_be_bytes());
        for n in names {
            i.extend(b(&n));
        }
        i
    };
    let mut c = p.clone();
    c.push(b'C');
    c.extend(2u32.to_be_bytes());
    c.extend(b(&item(b"B", b"C", &[b"api.anthropic.com"])));
    c.extend(b(&item(
        b"TOKEN",
        b"HOST_TOKEN",
        &[b"api.anthropic.com", b"a.example.org"],
    )));
    assert_eq!(record.canonical_bytes().unwrap(), c);
    assert_ne!(record.fingerprint(), sample_record_v2().fingerprint());
    // The order of entries and of hosts does not count.
    let mut reordered = record.clone();
    reordered.credentials.reverse();
    reordered.credentials[1].hosts.reverse();
    assert_eq!(reordered.canonical_bytes().unwrap(), c);
}

#[test]
fn a_v2_fingerprint_never_equals_the_v1_one_of_the_same_fields() {
    // Even with nothing v2 adds (no names, the host's resolver, as v1
    // behaves), the separators differ.
    let base = sample_record();
    let v2 = ConfigurationFingerprintRecordV2 {
        base: base.clone(),
        allow_hosts: Vec::new(),
        dns: DnsMode::Host,
        credentials: Vec::new(),
    };
    assert_ne!(base.fingerprint(), v2.fingerprint());
    let v1_bytes = base.canonical_bytes().unwrap();
    let v2_bytes = v2.canonical_bytes().unwrap();
    assert!(!v2_bytes.starts_with(&v1_bytes) && !v1_bytes.starts_with(&v2_bytes));
    // The enumeration hashes each record by its own schema.
    assert_eq!(
        ConfigurationRecord::V1(base.clone()).fingerprint(),
        base.fingerprint()
    );
    assert_eq!(
        ConfigurationRecord::V2(v2.clone()).fingerprint(),
        v2.fingerprint()
    );
}

#[test]
fn fingerprint_v2_covers_names_and_dns_but_not_their_order() {
    let base = sample_record_v2();
    let mut reordered = base.clone();
    reordered.allow_hosts.reverse();
    reordered.base.persistent_dirs.reverse();
    assert_eq!(base.fingerprint(), reordered.fingerprint());

    let mut changes = Vec::new();
    let mut c = base.clone();
    c.allow_hosts.pop();
    changes.push(("a name removed", c));
    let mut c = base.clone();
    c.allow_hosts.push(host("registry.npmjs.org"));
    changes.push(("a name added", c));
    let mut c = base.clone();
    c.allow_hosts[0] = host("*.example.org");
    changes.push(("a wildcard widened", c));
    let mut c = base.clone();
    c.dns = DnsMode::Host;
    changes.push(("dns", c));
    let mut c = base.clone();
    c.base.image = "other".into();
    changes.push(("a v1 field", c));
    for (what, changed) in changes {
        assert_ne!(base.fingerprint(), changed.fingerprint(), "{what}");
    }
}

#[test]
fn configuration_records_expose_what_v2_adds() {
    let v1 = ConfigurationRecord::V1(sample_record());
    assert_eq!(v1.schema(), ConfigSchema::V1);
    assert!(v1.allow_hosts().is_empty());
    assert_eq!(v1.dns(), DnsMode::Host);
    assert_eq!(v1.base(), &sample_record());
    let v2 = ConfigurationRecord::V2(sample_record_v2());
    assert_eq!(v2.schema(), ConfigSchema::V2);
    assert_eq!(v2.allow_hosts().len(), 2);
    assert_eq!(v2.dns(), DnsMode::Lazaret);
    assert_eq!(v2.base(), &sample_record());
    assert_eq!(
        ConfigSchema::from_id("lazaret-trusted-host-config-v2"),
        Some(ConfigSchema::V2)
    );
    assert_eq!(ConfigSchema::V1.id(), SCHEMA_ID);
    assert_eq!(
        ConfigSchema::from_id("lazaret-trusted-host-config-v3"),
        None
    );
}

#[test]
fn v2_profiles_read_names_and_dns_modes() {
    let profile: ProfileV2 = serde_json::from_str(
        r#"{"image": "img", "allow_hosts": ["api.anthropic.com", "*.pkgs.example.org"], "dns": "host"}"#,
    )
    .unwrap();
    let (v1, names) = profile.split();
    assert_eq!(v1.image.as_str(), "img");
    assert!(v1.isolate_gitignored, "v1 defaults hold in v2");
    assert_eq!(names.dns, DnsMode::Host);
    assert_eq!(
        names
            .allow_hosts
            .iter()
            .map(HostPattern::as_str)
            .collect::<Vec<_>>(),
        ["api.anthropic.com", "*.pkgs.example.org"]
    );
    let default: ProfileV2 = serde_json::from_str(r#"{"image": "img"}"#).unwrap();
    assert_eq!(default.dns, DnsMode::Lazaret);
    assert!(default.allow_hosts.is_empty());

    let err = serde_json::from_str::<ProfileV2>(r#"{"image": "i", "dns": "Host"}"#)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("unknown value `Host`, expected `lazaret`"),
        "{err}"
    );
    let err = serde_json::from_str::<ProfileV2>(r#"{"image": "i", "allow_hosts": ["*.org"]}"#)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`*.org` is a wildcard over fewer than two labels"),
        "{err}"
    );
    // A quoted entry is escaped and shortened as every quoted value is.
    let long = format!("{}\u{1b}", "a".repeat(400));
    let err = serde_json::from_str::<ProfileV2>(&format!(
        r#"{{"image": "i", "allow_hosts": [{}]}}"#,
        serde_json::to_string(&long).unwrap()
    ))
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("more characters") && !err.contains('\u{1b}'),
        "{err}"
    );
    let err = serde_json::from_str::<ProfileV2>(r#"{"image": "i", "allow_hosts": [""]}"#)
        .unwrap_err()
        .to_string();
    assert!(err.contains("is empty; write a host name"), "{err}");
    assert!(serde_json::from_str::<ProfileV2>(r#"{"image": "i", "colour": 1}"#).is_err());
    let written = serde_json::to_value(ProfileV2 {
        dns: DnsMode::Host,
        ..default
    })
    .unwrap();
    assert_eq!(written["dns"], "host");
}

#[test]
fn configuration_records_cross_a_socket_whole() {
    // The running Domain's record reaches `up` in `DomainStatus`: each
    // schema's record decodes to itself, names validated again.
    for record in [
        ConfigurationRecord::V1(sample_record()),
        ConfigurationRecord::V2(sample_record_v2()),
    ] {
        let bytes = postcard::to_stdvec(&record).unwrap();
        let back: ConfigurationRecord = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(back, record);
        assert_eq!(back.fingerprint(), record.fingerprint());
    }
    // A name that is not one is refused on the way in.
    let mut bad = sample_record_v2();
    let bytes = postcard::to_stdvec(&ConfigurationRecord::V2(bad.clone())).unwrap();
    let at = bytes
        .windows(b"api.anthropic.com".len())
        .position(|w| w == b"api.anthropic.com")
        .unwrap();
    let mut damaged = bytes.clone();
    damaged[at] = b'A';
    assert!(postcard::from_bytes::<ConfigurationRecord>(&damaged).is_err());
    bad.allow_hosts.clear();
    assert_ne!(
        postcard::to_stdvec(&ConfigurationRecord::V2(bad)).unwrap(),
        bytes
    );
}
