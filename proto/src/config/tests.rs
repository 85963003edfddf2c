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
