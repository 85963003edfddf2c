mod support;

// One test per validation rule of the trusted-host configuration v1
// (schema.md "Trusted host configuration", specification.md 3.2), each with
// a valid side and an invalid side. Every refusal is checked for the exact
// field path it names (the message starts with `PATH: `) and for a word of
// the rule it broke.
//
// Purely structural rules go through `decode_document`; rules that need the
// filesystem or the host environment go through a full `load` in a scratch
// [`Fixture`].

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use lazaret_coordinator::config::{
    self, ConfigError, LoadRequest, ResolvedDomainConfiguration, decode_document,
};
use lazaret_proto::config::{TrustedHostConfigurationV1, VolumeAccess, VolumeKind};
use support::{Fixture, message, minimal, write_file};

const HEAD: &str = "schema = \"lazaret-trusted-host-config-v1\"\n";
const IMAGE: &str = "image = \"oci:/images/base:1\"\n";

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// A document with `global` right after `schema` and `profile` inside
/// `[profiles.p]`.
fn doc(global: &str, profile: &str) -> String {
    format!("{HEAD}{global}\n[profiles.p]\n{IMAGE}{profile}\n")
}

/// An error and its causes, as one line.
fn chain(error: &ConfigError) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Asserts that `msg` names exactly `path` as its field and contains every
/// word of `words`.
#[track_caller]
fn expect_field(msg: &str, path: &str, words: &[&str]) {
    assert!(
        msg.starts_with(&format!("{path}: ")),
        "expected the field path `{path}` at the start of: {msg}"
    );
    for word in words {
        assert!(msg.contains(word), "expected `{word}` in: {msg}");
    }
}

#[track_caller]
fn accepted(text: &str) -> TrustedHostConfigurationV1 {
    decode_document(text.as_bytes())
        .unwrap_or_else(|e| panic!("expected the document to decode: {}\n{text}", chain(&e)))
}

#[track_caller]
fn decode_error(text: &str) -> String {
    match decode_document(text.as_bytes()) {
        Ok(_) => panic!("expected the document to be refused:\n{text}"),
        Err(e) => chain(&e),
    }
}

#[track_caller]
fn refused(text: &str, path: &str, words: &[&str]) {
    expect_field(&decode_error(text), path, words);
}

#[track_caller]
fn load_ok(fx: &Fixture, text: &str) -> ResolvedDomainConfiguration {
    fx.load_text("p", text)
        .unwrap_or_else(|e| panic!("expected the load to succeed: {}\n{text}", chain(&e)))
}

#[track_caller]
fn load_refused(fx: &Fixture, text: &str, path: &str, words: &[&str]) -> String {
    let msg = message(fx.load_text("p", text));
    expect_field(&msg, path, words);
    msg
}

/// Loads profile `p` with `workspace` as the Agent Workspace.
fn load_in(fx: &Fixture, workspace: &Path) -> Result<ResolvedDomainConfiguration, ConfigError> {
    config::load(LoadRequest {
        profile: "p",
        config: None,
        workspace,
        host: &fx.host(),
    })
}

/// A TOML literal string holding `path`.
fn q(path: &Path) -> String {
    let text = path.display().to_string();
    assert!(!text.contains('\''), "scratch paths are plain");
    format!("'{text}'")
}

/// One volume inline table.
fn volume(host: &str, container: &str, kind: &str, more: &str) -> String {
    format!("{{ host = {host}, container = '{container}', kind = '{kind}'{more} }}")
}

/// A profile body with `/root` persistent and `volumes`.
fn with_volumes(volumes: &[String]) -> String {
    format!(
        "persistent_dirs = ['/root']\nvolumes = [\n  {}\n]",
        volumes.join(",\n  ")
    )
}

/// One auto-approval rule inline table.
fn rule(executable: &str, more: &str) -> String {
    format!("{{ executable = {executable}{more} }}")
}

/// An enabled `[profiles.p.escalation]` table with `rules`.
fn escalation(rules: &[String]) -> String {
    format!(
        "[profiles.p.escalation]\nenabled = true\nauto_approve = [\n  {}\n]",
        rules.join(",\n  ")
    )
}

/// The selected profile's directory under the default Storage Root.
fn profile_dir(fx: &Fixture) -> PathBuf {
    fx.home.join(".local/share/lazaret/profiles/p")
}

/// Writes a shell script at `path` with `mode`.
fn tool(path: &Path, mode: u32) -> PathBuf {
    write_file(path, "#!/bin/sh\nexit 0\n", mode);
    path.to_path_buf()
}

fn mode_of(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

fn prefixes(list: &[lazaret_proto::config::Ipv4Prefix]) -> Vec<String> {
    list.iter().map(ToString::to_string).collect()
}

// ---------------------------------------------------------------------------
// Schema dispatch, closed shape, TOML syntax
// ---------------------------------------------------------------------------

#[test]
fn schema_is_required_and_exact() {
    accepted(&minimal(""));
    refused(
        "[profiles.p]\nimage = 'x'\n",
        "schema",
        &["required", "lazaret-trusted-host-config-v1"],
    );
    for wrong in [
        "lazaret-trusted-host-config-v3",
        "Lazaret-Trusted-Host-Config-V1",
        "lazaret-trusted-host-config-v1 ",
        "",
    ] {
        refused(
            &format!("schema = '{wrong}'\n[profiles.p]\nimage = 'x'\n"),
            "schema",
            &["unsupported schema", "reads only"],
        );
    }
    for (value, found) in [("1", "integer"), ("true", "boolean"), ("['x']", "array")] {
        refused(
            &format!("schema = {value}\n[profiles.p]\nimage = 'x'\n"),
            "schema",
            &["must be the string", found],
        );
    }
    // Dispatch comes first: a document of another version is named as such,
    // not as a list of unknown fields.
    refused(
        "schema = 'lazaret-trusted-host-config-v3'\nnew_field = 1\n[agents.x]\n",
        "schema",
        &["unsupported schema"],
    );
}

#[test]
fn unknown_fields_are_refused_at_every_depth() {
    let vol = volume("'/srv/data'", "/root/data", "directory", "");
    accepted(&doc(
        "[storage]\ndata_root = '/srv/lazaret'\n[network]\ndefault_allow = []\ndefault_deny = []",
        &format!(
            "{}\n[profiles.p.escalation]\nenabled = true\nauto_approve = [{}]",
            with_volumes(&[vol]),
            rule("'/usr/bin/gh'", ", args = ['pr'], allow_extra_args = true")
        ),
    ));

    refused(&doc("foo = 1", ""), "foo", &["unknown field `foo`"]);
    refused(
        &doc("[storage]\nfoo = '/x'", ""),
        "storage.foo",
        &["unknown field `foo`"],
    );
    refused(
        &doc("[network]\ndefault_allowed = []", ""),
        "network.default_allowed",
        &["unknown field `default_allowed`"],
    );
    refused(
        &minimal("foo = 1"),
        "profiles.p.foo",
        &["unknown field `foo`"],
    );
    refused(
        &minimal(&with_volumes(&[volume(
            "'/srv/data'",
            "/root/data",
            "directory",
            ", mode = 'ro'",
        )])),
        "profiles.p.volumes[0].mode",
        &["unknown field `mode`"],
    );
    refused(
        &minimal("[profiles.p.escalation]\nenabled = false\nargv = ['x']"),
        "profiles.p.escalation.argv",
        &["unknown field `argv`"],
    );
    refused(
        &minimal(&escalation(&[
            rule("'/usr/bin/gh'", ""),
            rule("'/usr/bin/git'", ", shell = true"),
        ])),
        "profiles.p.escalation.auto_approve[1].shell",
        &["unknown field `shell`"],
    );
}

#[test]
fn field_aliases_are_not_accepted() {
    accepted(&minimal("isolate_gitignored = false"));
    refused(
        &minimal("isolate-gitignored = false"),
        "profiles.p.isolate-gitignored",
        &["unknown field"],
    );
    refused(
        &doc("[storage]\ndata-root = '/srv/x'", ""),
        "storage.data-root",
        &["unknown field"],
    );
    refused(
        &minimal("[profiles.p.escalation]\nEnabled = true"),
        "profiles.p.escalation.Enabled",
        &["unknown field"],
    );
}

/// Asserts that `text` is refused as TOML naming `field` at `place`
/// (`line L, column C`), with every word of `words` in the reason.
#[track_caller]
fn syntax_refused(text: &str, field: &str, place: &str, words: &[&str]) -> String {
    let msg = decode_error(text);
    assert!(
        msg.contains(&format!("is not valid TOML: {field} ({place}): ")),
        "expected `{field} ({place})` in: {msg}"
    );
    for word in words {
        assert!(msg.contains(word), "expected `{word}` in: {msg}");
    }
    msg
}

#[test]
fn duplicate_keys_and_tables_are_toml_errors() {
    accepted(&minimal("isolate_gitignored = true"));
    // A duplicate key: named, where, without quoting the line.
    let msg = syntax_refused(
        &minimal("image = 'other'"),
        "profiles.p.image",
        "line 4, column 1",
        &["duplicate key"],
    );
    assert!(!msg.contains("'other'"), "{msg}");

    // A duplicate table.
    syntax_refused(
        &format!("{HEAD}[profiles.p]\n{IMAGE}[profiles.p]\nimage = 'y'\n"),
        "profiles.p",
        "line 4, column 11",
        &["duplicate"],
    );

    // A duplicate sub-table, a table redefining an inline table, a
    // duplicate top-level table.
    for (text, field) in [
        (
            minimal(
                "[profiles.p.escalation]\nenabled = true\n[profiles.p.escalation]\nenabled = true",
            ),
            "profiles.p.escalation",
        ),
        (
            minimal("escalation = { enabled = true }\n[profiles.p.escalation]\nenabled = true"),
            "profiles.p.escalation",
        ),
        (
            format!("{HEAD}[storage]\n[storage]\n[profiles.p]\n{IMAGE}"),
            "storage",
        ),
    ] {
        let msg = decode_error(&text);
        assert!(
            msg.contains(&format!("is not valid TOML: {field} (")) && msg.contains("duplicate"),
            "{msg}"
        );
    }

    // Inside an inline table in an array, and in an array of tables.
    syntax_refused(
        &minimal(&format!(
            "persistent_dirs = ['/root']\nvolumes = [{}, {{ host = '/a', host = '/b' }}]",
            volume("'/srv/y'", "/root/y", "file", "")
        )),
        "profiles.p.volumes[1].host",
        "line 5, column 86",
        &["duplicate key"],
    );
    syntax_refused(
        &minimal(
            "[profiles.p.escalation]\nenabled = true\n\
             [[profiles.p.escalation.auto_approve]]\nexecutable = '/usr/bin/gh'\n\
             [[profiles.p.escalation.auto_approve]]\nexecutable = '/usr/bin/gh'\n\
             executable = '/usr/bin/git'",
        ),
        "profiles.p.escalation.auto_approve[1].executable",
        "line 10, column 1",
        &["duplicate key"],
    );

    // Through a full load the message names the configuration file.
    let fx = Fixture::new();
    let msg = message(fx.load_text("p", &minimal("image = 'other'")));
    assert!(
        msg.contains(&fx.config.display().to_string())
            && msg.contains("profiles.p.image (line 4, column 1): duplicate key"),
        "{msg}"
    );
}

/// Every kind of TOML syntax error names the field it lies in, the line
/// and the column.
#[test]
fn every_syntax_error_names_its_field() {
    let cases: &[(&str, &str, &str, &str)] = &[
        // An unterminated string.
        (
            "image2 = 'oci:x\n",
            "profiles.p.image2",
            "line 4, column 16",
            "expected `'`",
        ),
        // A key with no value.
        (
            "isolate_gitignored = \n",
            "profiles.p.isolate_gitignored",
            "line 4, column 22",
            "quoted",
        ),
        // A key with no `=`.
        (
            "isolate_gitignored true\n",
            "profiles.p.isolate_gitignored",
            "line 4, column 20",
            "expected `=`",
        ),
        // An escape that does not exist.
        (
            "env = { A = \"\\q\" }\n",
            "profiles.p.env.A",
            "line 4, column 15",
            "escaped",
        ),
        // An extra comma in an array.
        (
            "persistent_dirs = ['/root',, '/opt']\n",
            "profiles.p.persistent_dirs[1]",
            "line 4, column 28",
            "comma",
        ),
        // A malformed number and date.
        (
            "isolate_gitignored = 1__0\n",
            "profiles.p.isolate_gitignored",
            "line 4, column 23",
            "`_`",
        ),
        (
            "isolate_gitignored = 1979-13-01\n",
            "profiles.p.isolate_gitignored",
            "line 4, column 22",
            "month",
        ),
        // A key that is not a key.
        ("!! = 1\n", "profiles.p.!!", "line 4, column 1", "key"),
        // An unclosed table header.
        (
            "[profiles.p.escalation\nenabled = true\n",
            "profiles.p.escalation",
            "line 4, column 23",
            "`]`",
        ),
    ];
    for (extra, field, place, word) in cases {
        syntax_refused(&minimal(extra), field, place, &[word]);
    }
    // A huge quoted key is named by its ends, not whole.
    let long = "k".repeat(100_000);
    let msg = decode_error(&minimal(&format!("\"{long}\" = 1\n\"{long}\" = 2")));
    assert!(
        msg.contains("duplicate key"),
        "{}",
        &msg[..msg.len().min(400)]
    );
    assert!(
        msg.contains("more characters"),
        "{}",
        &msg[..msg.len().min(400)]
    );
    assert!(msg.len() < 600, "{} bytes", msg.len());
}

/// The decoder's own refusals name their field too: the schema, an
/// unknown field, a wrong type, an unknown variant, a missing field and a
/// value's grammar (each kind has its own test above and below).
#[test]
fn every_decode_error_names_its_field() {
    refused(
        "schema = 'v0'\n[profiles.p]\nimage = 'x'\n",
        "schema",
        &["unsupported schema `v0`"],
    );
    refused(&minimal("foo = 1"), "profiles.p.foo", &["unknown field"]);
    refused(
        &minimal("isolate_gitignored = 'yes'"),
        "profiles.p.isolate_gitignored",
        &["invalid type"],
    );
    refused(
        &minimal(&with_volumes(&[volume("'/srv/x'", "/root/x", "dir", "")])),
        "profiles.p.volumes[0].kind",
        &["unknown variant"],
    );
    refused(
        &format!("{HEAD}[profiles.p]\nisolate_gitignored = true\n"),
        "profiles.p",
        &["missing field `image`"],
    );
    refused(
        &minimal("persistent_dirs = ['root']"),
        "profiles.p.persistent_dirs[0]",
        &["invalid sandbox path `root`"],
    );
    // A huge value is quoted by its ends; the rule is whole.
    let long = "s".repeat(400_000);
    let msg = decode_error(&format!("schema = '{long}'\n[profiles.p]\nimage = 'x'\n"));
    expect_field(
        &msg,
        "schema",
        &[
            "more characters",
            "reads only `lazaret-trusted-host-config-v1`",
        ],
    );
    assert!(msg.len() < 600, "{} bytes", msg.len());
}

#[test]
fn documents_are_utf8_and_strings_nul_free() {
    accepted(&minimal("# café\npersistent_dirs = ['/home/café']"));
    // Named by the field the first byte that is not UTF-8 lies in.
    let mut bytes = minimal("").into_bytes();
    bytes.extend_from_slice(b"# \xff\xfe\n");
    let msg = chain(&decode_document(&bytes).unwrap_err());
    assert!(
        msg.contains("profiles.p (line 5, column 3): is not valid UTF-8"),
        "{msg}"
    );
    let mut bytes = minimal("").into_bytes();
    bytes.extend_from_slice(b"isolate_gitignored = \"\xff\"\n");
    let msg = chain(&decode_document(&bytes).unwrap_err());
    assert!(
        msg.contains("profiles.p.isolate_gitignored (line 5, column 23): is not valid UTF-8"),
        "{msg}"
    );

    refused(
        &format!("{HEAD}[profiles.p]\nimage = \"a\\u0000b\"\n"),
        "profiles.p.image",
        &["NUL"],
    );
    refused(
        &minimal(&escalation(&[rule(
            "'/usr/bin/gh'",
            ", args = [\"ok\", \"a\\u0000\"]",
        )])),
        "profiles.p.escalation.auto_approve[0].args[1]",
        &["NUL"],
    );
    refused(
        &minimal(&with_volumes(&[volume(
            "\"/srv/a\\u0000b\"",
            "/root/x",
            "directory",
            "",
        )])),
        "profiles.p.volumes[0].host",
        &["NUL"],
    );
    refused(
        &minimal("persistent_dirs = [\"/root\\u0000\"]"),
        "profiles.p.persistent_dirs[0]",
        &["NUL"],
    );
    refused(
        &format!("{HEAD}[profiles.\"a\\u0000\"]\n{IMAGE}"),
        // Named with its control character escaped.
        "profiles.a\\0",
        &["invalid profile name"],
    );
}

#[test]
fn wrong_types_are_refused_with_their_path() {
    accepted(&minimal(
        "isolate_gitignored = false\npersistent_dirs = []\nallow_egress = []\nenv = {}\nvolumes = []",
    ));
    let cases: &[(&str, &str, &str)] = &[
        (
            "isolate_gitignored = 'yes'",
            "profiles.p.isolate_gitignored",
            "expected a boolean",
        ),
        (
            "persistent_dirs = '/root'",
            "profiles.p.persistent_dirs",
            "expected a sequence",
        ),
        (
            "persistent_dirs = [1]",
            "profiles.p.persistent_dirs[0]",
            "invalid type",
        ),
        (
            "allow_egress = '10.1.0.0/16'",
            "profiles.p.allow_egress",
            "expected a sequence",
        ),
        (
            "deny_egress = [10]",
            "profiles.p.deny_egress[0]",
            "invalid type",
        ),
        ("env = ['A']", "profiles.p.env", "invalid type"),
        ("env = { A = 1 }", "profiles.p.env.A", "invalid type"),
        ("volumes = {}", "profiles.p.volumes", "invalid type"),
        ("escalation = true", "profiles.p.escalation", "invalid type"),
        (
            "[profiles.p.escalation]\nenabled = 'true'",
            "profiles.p.escalation.enabled",
            "expected a boolean",
        ),
        (
            "[profiles.p.escalation]\nenabled = true\nauto_approve = { executable = '/usr/bin/gh' }",
            "profiles.p.escalation.auto_approve",
            "invalid type",
        ),
        (
            "[profiles.p.escalation]\nenabled = true\nauto_approve = [{ executable = '/usr/bin/gh', args = 'pr' }]",
            "profiles.p.escalation.auto_approve[0].args",
            "expected a sequence",
        ),
        (
            "[profiles.p.escalation]\nenabled = true\nauto_approve = [{ executable = '/usr/bin/gh', args = ['a'], allow_extra_args = 1 }]",
            "profiles.p.escalation.auto_approve[0].allow_extra_args",
            "expected a boolean",
        ),
    ];
    for (extra, path, word) in cases {
        refused(&minimal(extra), path, &[word]);
    }
    refused(
        &minimal(&with_volumes(&[volume(
            "'/srv/x'",
            "/root/x",
            "directory",
            ", create = 'true'",
        )])),
        "profiles.p.volumes[0].create",
        &["expected a boolean"],
    );
    refused(
        &format!("{HEAD}[profiles.p]\nimage = 1\n"),
        "profiles.p.image",
        &["invalid type"],
    );
    refused(&doc("storage = 'x'", ""), "storage", &["invalid type"]);
    refused(
        &doc("[network]\ndefault_deny = '10.1.0.0/16'", ""),
        "network.default_deny",
        &["expected a sequence"],
    );
    refused(
        &doc("[storage]\ndata_root = 7", ""),
        "storage.data_root",
        &["invalid type"],
    );
    refused(
        &format!("{HEAD}profiles = ['p']\n"),
        "profiles",
        &["invalid type"],
    );
    refused(
        &format!("{HEAD}[profiles]\np = 'x'\n"),
        "profiles.p",
        &["invalid type"],
    );
}

#[test]
fn unknown_enumeration_values_are_refused() {
    for kind in ["file", "directory"] {
        for access in ["read-only", "read-write"] {
            accepted(&minimal(&with_volumes(&[volume(
                "'/srv/x'",
                "/root/x",
                kind,
                &format!(", access = '{access}'"),
            )])));
        }
    }
    for kind in ["dir", "Directory", "FILE", "symlink", ""] {
        refused(
            &minimal(&with_volumes(&[volume("'/srv/x'", "/root/x", kind, "")])),
            "profiles.p.volumes[0].kind",
            &["unknown variant", "`file` or `directory`"],
        );
    }
    for access in ["rw", "ro", "read_only", "readonly", "Read-Write"] {
        refused(
            &minimal(&with_volumes(&[volume(
                "'/srv/x'",
                "/root/x",
                "file",
                &format!(", access = '{access}'"),
            )])),
            "profiles.p.volumes[0].access",
            &["unknown variant", "`read-only` or `read-write`"],
        );
    }
}

#[test]
fn required_fields_are_required() {
    refused(
        &format!("{HEAD}[profiles.p]\nisolate_gitignored = true\n"),
        "profiles.p",
        &["missing field `image`"],
    );
    refused(
        &format!("{HEAD}[profiles.p]\nimage = ''\n"),
        "profiles.p.image",
        &["empty"],
    );
    refused(
        &format!("{HEAD}[profiles.p]\nimage = '   '\n"),
        "profiles.p.image",
        &["empty"],
    );
    for (table, missing) in [
        ("{ container = '/root/x', kind = 'file' }", "host"),
        ("{ host = '/srv/x', kind = 'file' }", "container"),
        ("{ host = '/srv/x', container = '/root/x' }", "kind"),
    ] {
        refused(
            &minimal(&format!(
                "persistent_dirs = ['/root']\nvolumes = [{}, {table}]",
                volume("'/srv/y'", "/root/y", "file", "")
            )),
            "profiles.p.volumes[1]",
            &[&format!("missing field `{missing}`")],
        );
    }
    refused(
        &minimal("[profiles.p.escalation]\nenabled = true\nauto_approve = [{ args = ['a'] }]"),
        "profiles.p.escalation.auto_approve[0]",
        &["missing field `executable`"],
    );
}

#[test]
fn profiles_are_required_and_nonempty() {
    accepted(&minimal(""));
    let msg = decode_error(HEAD);
    expect_field(&msg, "(document)", &["missing field `profiles`"]);
    for empty in ["profiles = {}\n", "[profiles]\n"] {
        refused(
            &format!("{HEAD}{empty}"),
            "profiles",
            &["at least one profile"],
        );
    }
}

#[test]
fn optional_fields_take_their_defaults() {
    let fx = Fixture::new();
    let resolved = load_ok(&fx, &minimal(""));
    let record = resolved.record();
    assert!(record.isolate_gitignored);
    assert!(record.persistent_dirs.is_empty());
    assert!(record.environment_references.is_empty());
    assert!(record.volumes.is_empty());
    assert!(!record.escalation_enabled);
    assert!(record.auto_approval_rules.is_empty());
    assert!(record.effective_allow_prefixes.is_empty());
    assert_eq!(
        prefixes(&record.effective_deny_prefixes),
        ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"]
    );
    assert_eq!(
        record.storage_root,
        fx.home
            .join(".local/share/lazaret")
            .into_os_string()
            .into_vec()
    );
    // Defaults and their explicit equal values are the same configuration.
    let explicit = minimal(
        "isolate_gitignored = true\npersistent_dirs = []\nallow_egress = []\ndeny_egress = []\n\
         env = {}\nvolumes = []\n[profiles.p.escalation]\nenabled = false\nauto_approve = []",
    );
    let fingerprint = resolved.fingerprint();
    drop(resolved);
    assert_eq!(load_ok(&fx, &explicit).fingerprint(), fingerprint);
}

// ---------------------------------------------------------------------------
// Profile names and selection
// ---------------------------------------------------------------------------

const BAD_NAMES: [&str; 10] = [
    "..", ".", "-a", ".hidden", "_a", "a/b", "a b", "é", "naïve", "",
];

#[test]
fn profile_names_follow_the_grammar_as_table_keys() {
    let long_ok = "a".repeat(64);
    for name in ["a", "0", "Z9", "a.b_c-d", "gpt-4.1", long_ok.as_str()] {
        accepted(&format!("{HEAD}[profiles.\"{name}\"]\n{IMAGE}"));
    }
    let long_bad = "a".repeat(65);
    for name in BAD_NAMES.iter().copied().chain([long_bad.as_str()]) {
        refused(
            &format!("{HEAD}[profiles.\"{name}\"]\n{IMAGE}"),
            &format!("profiles.{name}"),
            &["invalid profile name", "at most 64 characters"],
        );
    }
}

#[test]
fn the_selected_profile_follows_the_grammar() {
    let fx = Fixture::new();
    let long_ok = "b".repeat(64);
    for name in ["a.b_c-d", long_ok.as_str()] {
        let text = format!("{HEAD}[profiles.\"{name}\"]\n{IMAGE}");
        let resolved = fx.load_text(name, &text).unwrap();
        assert_eq!(resolved.profile().as_str(), name);
        assert_eq!(resolved.record().selected_profile, name);
    }
    fx.write_config(&minimal(""));
    let long_bad = "b".repeat(65);
    for name in BAD_NAMES.iter().copied().chain([long_bad.as_str()]) {
        let msg = message(fx.load(name));
        expect_field(&msg, "PROFILE", &["invalid profile name"]);
    }
}

#[test]
fn selection_is_exact_and_names_the_defined_profiles() {
    let fx = Fixture::new();
    let text = format!("{HEAD}[profiles.Claude]\n{IMAGE}[profiles.codex]\n{IMAGE}");
    assert_eq!(
        fx.load_text("Claude", &text).unwrap().profile().as_str(),
        "Claude"
    );
    assert_eq!(fx.load("codex").unwrap().profile().as_str(), "codex");
    for asked in ["claude", "CODEX", "gemini", "Claud"] {
        let msg = message(fx.load(asked));
        assert!(
            msg.starts_with(&format!("profile `{asked}` is not defined in ")),
            "{msg}"
        );
        assert!(msg.contains(&fx.config.display().to_string()), "{msg}");
        assert!(msg.ends_with("defined profiles: Claude, codex"), "{msg}");
    }
}

#[test]
fn every_profile_is_decoded_but_only_the_selected_one_resolved() {
    let fx = Fixture::new();
    // Profile `q` references a missing variable and a missing volume source:
    // neither is resolved when `p` is selected.
    let q = format!(
        "[profiles.q]\n{IMAGE}env = {{ T = 'env:LAZARET_TEST_UNSET_VARIABLE' }}\n{}\n",
        with_volumes(&[volume(
            &q(&fx.base().join("missing")),
            "/root/m",
            "directory",
            "",
        )])
    );
    let text = format!("{}{q}", minimal(""));
    load_ok(&fx, &text);
    let msg = message(fx.load("q"));
    expect_field(&msg, "profiles.q.volumes[0].host", &["does not exist"]);

    // A structurally invalid nonselected profile refuses every load.
    let text = format!(
        "{}[profiles.q]\n{IMAGE}persistent_dirs = ['/proc']\n",
        minimal("")
    );
    load_refused(&fx, &text, "profiles.q.persistent_dirs[0]", &["/proc"]);
}

// ---------------------------------------------------------------------------
// Host paths
// ---------------------------------------------------------------------------

/// Declarations no host path may take, with a word of the rule broken.
const BAD_HOST_PATHS: [(&str, &str); 27] = [
    ("/", "nothing after its anchor"),
    ("~/", "nothing after its anchor"),
    ("~//etc", "empty component"),
    ("//etc", "empty component"),
    ("/srv/data/", "empty component"),
    ("~/data/", "empty component"),
    ("/srv//data", "empty component"),
    ("/srv/./data", "`.` component"),
    ("/srv/.", "`.` component"),
    ("/srv/../etc", "`..` component"),
    ("~/../etc", "`..` component"),
    ("$HOME/x", "absolute or begins with `~/`"),
    ("${HOME}/x", "absolute or begins with `~/`"),
    ("/srv/$HOME", "expansion, variable, glob or shell form"),
    ("/srv/*.txt", "expansion, variable, glob or shell form"),
    ("/srv/data?", "expansion, variable, glob or shell form"),
    ("/srv/[ab]", "expansion, variable, glob or shell form"),
    ("/srv/`id`", "expansion, variable, glob or shell form"),
    ("/srv/a\\b", "expansion, variable, glob or shell form"),
    ("/srv/{a,b}", "expansion, variable, glob or shell form"),
    ("/srv/~x", "`~` expands only as the leading `~/`"),
    ("data/x", "absolute or begins with `~/`"),
    ("./x", "absolute or begins with `~/`"),
    ("~", "absolute or begins with `~/`"),
    ("~user/x", "absolute or begins with `~/`"),
    ("", "absolute or begins with `~/`"),
    ("{profile_dir}x", "absolute or begins with `~/`"),
];

#[test]
fn host_path_forms_are_accepted() {
    for host in [
        "/srv/data",
        "~/data",
        "{profile_dir}/state",
        "{profile_dir}/a/b.c",
    ] {
        accepted(&minimal(&with_volumes(&[volume(
            &format!("'{host}'"),
            "/root/x",
            "directory",
            "",
        )])));
    }
    for root in ["/srv/lazaret", "~/state"] {
        accepted(&doc(&format!("[storage]\ndata_root = '{root}'"), ""));
    }
    for exe in ["/usr/bin/gh", "~/bin/tool"] {
        accepted(&minimal(&escalation(&[rule(&format!("'{exe}'"), "")])));
    }
}

#[test]
fn host_path_grammar_is_refused_in_every_host_field() {
    let all = BAD_HOST_PATHS.iter().copied().chain([
        ("{profile_dir}/", "nothing after its anchor"),
        ("{profile_dir}//etc", "empty component"),
        ("{profile_dir}/x/", "empty component"),
        ("{profile_dir}/../x", "`..` component"),
        ("{profile_dir}/$X", "expansion"),
    ]);
    for (bad, word) in all {
        let words = ["invalid host path", word];
        refused(
            &minimal(&with_volumes(&[volume(
                &format!("'{bad}'"),
                "/root/x",
                "directory",
                "",
            )])),
            "profiles.p.volumes[0].host",
            &words,
        );
        if !bad.starts_with("{profile_dir}/") {
            refused(
                &doc(&format!("[storage]\ndata_root = '{bad}'"), ""),
                "storage.data_root",
                &words,
            );
            refused(
                &minimal(&escalation(&[rule(&format!("'{bad}'"), "")])),
                "profiles.p.escalation.auto_approve[0].executable",
                &words,
            );
        }
    }
}

#[test]
fn profile_dir_anchor_is_only_for_volume_hosts() {
    accepted(&minimal(&with_volumes(&[volume(
        "'{profile_dir}/x'",
        "/root/x",
        "directory",
        "",
    )])));
    refused(
        &doc("[storage]\ndata_root = '{profile_dir}/state'", ""),
        "storage.data_root",
        &["`{profile_dir}/` may begin only a volume `host` path"],
    );
    refused(
        &minimal(&escalation(&[
            rule("'/usr/bin/gh'", ""),
            rule("'{profile_dir}/bin/tool'", ""),
        ])),
        "profiles.p.escalation.auto_approve[1].executable",
        &["`{profile_dir}/` may begin only a volume `host` path"],
    );
}

// ---------------------------------------------------------------------------
// Sandbox paths and destinations
// ---------------------------------------------------------------------------

const BAD_SANDBOX_PATHS: [(&str, &str); 12] = [
    ("/", "sandbox root"),
    ("root", "is absolute"),
    ("root/x", "is absolute"),
    ("", "is absolute"),
    ("~/x", "is absolute"),
    ("/root/", "empty component"),
    ("/root//x", "empty component"),
    ("/root/./x", "`.` component"),
    ("/root/..", "`..` component"),
    ("/root/../etc", "`..` component"),
    ("/root/$HOME", "expansion"),
    ("/root/*", "glob"),
];

#[test]
fn sandbox_paths_are_normalized_absolute_and_not_root() {
    accepted(&minimal(
        "persistent_dirs = ['/root', '/home/agent/.cache', '/opt', '/home/café']",
    ));
    for (bad, word) in BAD_SANDBOX_PATHS {
        refused(
            &minimal(&format!("persistent_dirs = ['/opt', '{bad}']")),
            "profiles.p.persistent_dirs[1]",
            &[word],
        );
        refused(
            &minimal(&format!(
                "persistent_dirs = ['/root']\nvolumes = [{}]",
                volume("'/srv/x'", bad, "directory", "")
            )),
            "profiles.p.volumes[0].container",
            &[word],
        );
    }
}

#[test]
fn persistent_dirs_are_distinct_and_do_not_nest() {
    accepted(&minimal(
        "persistent_dirs = ['/root', '/rootfs', '/home/a', '/home/ab']",
    ));
    refused(
        &minimal("persistent_dirs = ['/opt', '/root', '/root']"),
        "profiles.p.persistent_dirs[2]",
        &["repeats", "profiles.p.persistent_dirs[1]"],
    );
    refused(
        &minimal("persistent_dirs = ['/root', '/root/.cache']"),
        "profiles.p.persistent_dirs[1]",
        &["overlaps", "may not repeat or nest"],
    );
    refused(
        &minimal("persistent_dirs = ['/root/.cache', '/root']"),
        "profiles.p.persistent_dirs[1]",
        &["overlaps", "may not repeat or nest"],
    );
}

/// Sandbox destinations that overlap the production layout, and the
/// protected member each overlaps.
const PROTECTED: [(&str, &str); 11] = [
    ("/workspace", "/workspace"),
    ("/workspace/x", "/workspace"),
    ("/run", "/run/lazaret"),
    ("/run/lazaret", "/run/lazaret"),
    ("/run/lazaret/x", "/run/lazaret"),
    ("/proc", "/proc"),
    ("/proc/self", "/proc"),
    ("/sys/fs", "/sys"),
    ("/dev", "/dev"),
    ("/dev/x", "/dev"),
    ("/dev/shm/a", "/dev"),
];

#[test]
fn persistent_dirs_avoid_protected_destinations() {
    accepted(&minimal(
        "persistent_dirs = ['/workspaces', '/run/user', '/runner', '/procs', '/devices', '/system']",
    ));
    for (path, protected) in PROTECTED {
        refused(
            &minimal(&format!("persistent_dirs = ['/root', '{path}']")),
            "profiles.p.persistent_dirs[1]",
            &[
                &format!("`{path}` overlaps `{protected}`"),
                "Lazaret mounts",
            ],
        );
    }
}

#[test]
fn volume_containers_avoid_protected_destinations() {
    accepted(&minimal(
        "persistent_dirs = ['/run/user']\nvolumes = [{ host = '/srv/x', container = '/run/user/x', kind = 'file' }]",
    ));
    for (path, protected) in PROTECTED {
        refused(
            &minimal(&format!(
                "persistent_dirs = ['/root']\nvolumes = [{}, {}]",
                volume("'/srv/y'", "/root/y", "file", ""),
                volume("'/srv/x'", path, "directory", "")
            )),
            "profiles.p.volumes[1].container",
            &[
                &format!("`{path}` overlaps `{protected}`"),
                "Lazaret mounts",
            ],
        );
    }
}

// ---------------------------------------------------------------------------
// Volumes: structure
// ---------------------------------------------------------------------------

#[test]
fn volume_containers_lie_strictly_beneath_one_persistent_dir() {
    accepted(&minimal(&format!(
        "persistent_dirs = ['/root', '/opt']\nvolumes = [{}, {}]",
        volume("'/srv/a'", "/root/.config/a", "directory", ""),
        volume("'/srv/b'", "/opt/b", "file", ""),
    )));
    refused(
        &minimal(&with_volumes(&[volume(
            "'/srv/a'",
            "/root",
            "directory",
            "",
        )])),
        "profiles.p.volumes[0].container",
        &["is itself a persistent dir", "strictly beneath"],
    );
    refused(
        &minimal(&with_volumes(&[
            volume("'/srv/a'", "/root/a", "directory", ""),
            volume("'/srv/b'", "/opt/b", "directory", ""),
        ])),
        "profiles.p.volumes[1].container",
        &["not beneath any persistent_dirs entry"],
    );
    // A sibling with a common string prefix is not beneath.
    refused(
        &minimal(&with_volumes(&[volume(
            "'/srv/a'",
            "/rootx/a",
            "directory",
            "",
        )])),
        "profiles.p.volumes[0].container",
        &["not beneath any persistent_dirs entry"],
    );
    refused(
        &minimal(&volumes_without_persistent()),
        "profiles.p.volumes[0].container",
        &["not beneath any persistent_dirs entry"],
    );
}

fn volumes_without_persistent() -> String {
    format!(
        "volumes = [{}]",
        volume("'/srv/a'", "/root/a", "directory", "")
    )
}

#[test]
fn volume_containers_are_distinct_and_do_not_nest() {
    accepted(&minimal(&with_volumes(&[
        volume("'/srv/a'", "/root/a", "directory", ""),
        volume("'/srv/b'", "/root/ab", "directory", ""),
    ])));
    refused(
        &minimal(&with_volumes(&[
            volume("'/srv/a'", "/root/a", "directory", ""),
            volume("'/srv/b'", "/root/a", "directory", ""),
        ])),
        "profiles.p.volumes[1].container",
        &["repeats", "profiles.p.volumes[0].container"],
    );
    refused(
        &minimal(&with_volumes(&[
            volume("'/srv/a'", "/root/a", "directory", ""),
            volume("'/srv/b'", "/root/a/b", "file", ""),
        ])),
        "profiles.p.volumes[1].container",
        &["overlaps", "may not repeat or nest"],
    );
    refused(
        &minimal(&with_volumes(&[
            volume("'/srv/b'", "/root/a/b", "file", ""),
            volume("'/srv/a'", "/root/a", "directory", ""),
        ])),
        "profiles.p.volumes[1].container",
        &["overlaps", "may not repeat or nest"],
    );
}

#[test]
fn create_is_only_for_directories_beneath_the_profile_dir() {
    accepted(&minimal(&with_volumes(&[volume(
        "'{profile_dir}/state'",
        "/root/state",
        "directory",
        ", create = true",
    )])));
    refused(
        &minimal(&with_volumes(&[volume(
            "'{profile_dir}/state.json'",
            "/root/state.json",
            "file",
            ", create = true",
        )])),
        "profiles.p.volumes[0].create",
        &["only a directory source can be created", "never created"],
    );
    for host in ["'~/state'", "'/srv/state'"] {
        refused(
            &minimal(&with_volumes(&[volume(
                host,
                "/root/state",
                "directory",
                ", create = true",
            )])),
            "profiles.p.volumes[0].create",
            &["only a source beneath `{profile_dir}/` can be created"],
        );
    }
}

// ---------------------------------------------------------------------------
// Volumes: resolution
// ---------------------------------------------------------------------------

#[test]
fn create_makes_a_0700_directory_beneath_the_profile_dir() {
    let fx = Fixture::new();
    let text = minimal(&with_volumes(&[
        volume(
            "'{profile_dir}/agent-state'",
            "/root/state",
            "directory",
            ", create = true",
        ),
        volume(
            "'{profile_dir}/a/b'",
            "/root/b",
            "directory",
            ", create = true",
        ),
    ]));
    let resolved = load_ok(&fx, &text);
    let dir = profile_dir(&fx);
    for created in [dir.join("agent-state"), dir.join("a"), dir.join("a/b")] {
        assert!(created.is_dir(), "{}", created.display());
        assert_eq!(mode_of(&created), 0o700, "{}", created.display());
    }
    let volumes = &resolved.record().volumes;
    assert_eq!(
        volumes[0].canonical_host_source,
        dir.join("agent-state").into_os_string().into_vec()
    );
    assert_eq!(volumes[0].container_path, "/root/state");
    assert_eq!(volumes[0].kind, VolumeKind::Directory);
    assert!(volumes[0].create);
    drop(resolved);
    // A second load finds the directories and keeps them.
    load_ok(&fx, &text);
}

#[test]
fn a_missing_source_without_create_is_refused_with_a_hint() {
    let fx = Fixture::new();
    std::fs::create_dir(fx.base().join("data")).unwrap();
    load_ok(
        &fx,
        &minimal(&with_volumes(&[volume(
            &q(&fx.base().join("data")),
            "/root/data",
            "directory",
            "",
        )])),
    );
    let msg = load_refused(
        &fx,
        &minimal(&with_volumes(&[volume(
            "'{profile_dir}/agent-state'",
            "/root/state",
            "directory",
            "",
        )])),
        "profiles.p.volumes[0].host",
        &["does not exist", "set create = true"],
    );
    assert!(!profile_dir(&fx).join("agent-state").exists(), "{msg}");
    load_refused(
        &fx,
        &minimal(&with_volumes(&[
            volume(&q(&fx.base().join("data")), "/root/data", "directory", ""),
            volume(&q(&fx.base().join("data/none")), "/root/none", "file", ""),
        ])),
        "profiles.p.volumes[1].host",
        &["does not exist", "create it"],
    );
    load_refused(
        &fx,
        &minimal(&with_volumes(&[volume(
            "'~/no/such/dir'",
            "/root/x",
            "directory",
            "",
        )])),
        "profiles.p.volumes[0].host",
        &["does not exist"],
    );
}

#[test]
fn a_source_has_the_declared_kind() {
    let fx = Fixture::new();
    let dir = fx.base().join("data");
    let file = fx.base().join("note.txt");
    std::fs::create_dir(&dir).unwrap();
    write_file(&file, "x", 0o644);
    let resolved = load_ok(
        &fx,
        &minimal(&with_volumes(&[
            volume(&q(&dir), "/root/data", "directory", ""),
            volume(
                &q(&file),
                "/root/note.txt",
                "file",
                ", access = 'read-only'",
            ),
        ])),
    );
    let volumes = &resolved.record().volumes;
    assert_eq!(volumes[0].kind, VolumeKind::Directory);
    assert_eq!(volumes[1].kind, VolumeKind::File);
    assert_eq!(
        volumes[1].canonical_host_source,
        file.clone().into_os_string().into_vec()
    );
    drop(resolved);
    load_refused(
        &fx,
        &minimal(&with_volumes(&[volume(&q(&dir), "/root/data", "file", "")])),
        "profiles.p.volumes[0].host",
        &["is a directory, not a regular file"],
    );
    load_refused(
        &fx,
        &minimal(&with_volumes(&[volume(
            &q(&file),
            "/root/n",
            "directory",
            "",
        )])),
        "profiles.p.volumes[0].host",
        &["is a regular file, not a directory"],
    );
    // A `{profile_dir}/` source to be created must be a directory if present.
    write_file(&profile_dir(&fx).join("state"), "x", 0o600);
    load_refused(
        &fx,
        &minimal(&with_volumes(&[volume(
            "'{profile_dir}/state'",
            "/root/state",
            "directory",
            ", create = true",
        )])),
        "profiles.p.volumes[0].host",
        &["regular file", "directory"],
    );
}

#[test]
fn special_files_and_symlinks_cannot_satisfy_a_source() {
    let fx = Fixture::new();
    let dir = fx.base().join("data");
    std::fs::create_dir(&dir).unwrap();
    let link = fx.base().join("data-link");
    symlink(&dir, &link).unwrap();
    load_refused(
        &fx,
        &minimal(&with_volumes(&[volume(
            &q(&link),
            "/root/d",
            "directory",
            "",
        )])),
        "profiles.p.volumes[0].host",
        &["symbolic link"],
    );
    let fifo = fx.base().join("fifo");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    load_refused(
        &fx,
        &minimal(&with_volumes(&[volume(&q(&fifo), "/root/f", "file", "")])),
        "profiles.p.volumes[0].host",
        &["is a FIFO, not a regular file"],
    );
    let socket_path = fx.base().join("sock");
    let _listener = std::os::unix::net::UnixListener::bind(&socket_path).unwrap();
    load_refused(
        &fx,
        &minimal(&with_volumes(&[volume(
            &q(&socket_path),
            "/root/s",
            "file",
            "",
        )])),
        "profiles.p.volumes[0].host",
        &["is a socket, not a regular file"],
    );
    let msg = message(fx.load_text(
        "p",
        &minimal(&with_volumes(&[volume(
            "'/dev/null'",
            "/root/null",
            "file",
            "",
        )])),
    ));
    assert!(
        msg.starts_with("profiles.p.volumes[0].host: ")
            && (msg.contains("character device") || msg.contains("mount point")),
        "{msg}"
    );
}

#[test]
fn a_source_on_another_mount_is_refused() {
    // `/proc` is its own mount beneath `/`.
    let fx = Fixture::new();
    load_refused(
        &fx,
        &minimal(&with_volumes(&[volume(
            "'/proc'",
            "/root/p",
            "directory",
            "",
        )])),
        "profiles.p.volumes[0].host",
        &["crosses a mount point"],
    );
}

#[test]
fn access_defaults_to_read_write() {
    let fx = Fixture::new();
    let text = minimal(&with_volumes(&[
        volume(
            "'{profile_dir}/a'",
            "/root/a",
            "directory",
            ", create = true",
        ),
        volume(
            "'{profile_dir}/b'",
            "/root/b",
            "directory",
            ", create = true, access = 'read-only'",
        ),
        volume(
            "'{profile_dir}/c'",
            "/root/c",
            "directory",
            ", create = true, access = 'read-write'",
        ),
    ]));
    let resolved = load_ok(&fx, &text);
    let access: Vec<VolumeAccess> = resolved.record().volumes.iter().map(|v| v.access).collect();
    assert_eq!(
        access,
        [
            VolumeAccess::ReadWrite,
            VolumeAccess::ReadOnly,
            VolumeAccess::ReadWrite
        ]
    );
    assert!(
        !accepted(&minimal(&with_volumes(&[volume(
            "'/srv/a'", "/root/a", "file", ""
        )])))
        .profiles
        .values()
        .next()
        .unwrap()
        .volumes[0]
            .create
    );
}

#[test]
fn volume_sources_stay_out_of_lazaret_and_workspace_trees() {
    let fx = Fixture::new();
    // The first load creates the roots.
    load_ok(&fx, &minimal(""));
    let storage = fx.home.join(".local/share/lazaret");
    // A source given as an absolute path strictly beneath the profile
    // directory is allowed.
    std::fs::create_dir(profile_dir(&fx).join("cache")).unwrap();
    std::fs::create_dir(fx.workspace.join("sub")).unwrap();
    std::fs::create_dir_all(fx.base().join("data/inner")).unwrap();
    load_ok(
        &fx,
        &minimal(&with_volumes(&[volume(
            &q(&profile_dir(&fx).join("cache")),
            "/root/cache",
            "directory",
            "",
        )])),
    );
    let cases: Vec<(PathBuf, &str, &str)> = vec![
        (
            fx.workspace.clone(),
            "directory",
            "is the same as the workspace",
        ),
        (
            fx.workspace.join("sub"),
            "directory",
            "lies inside the workspace",
        ),
        (
            fx.base().to_path_buf(),
            "directory",
            "contains the configuration file",
        ),
        (
            fx.config.clone(),
            "file",
            "is the same as the configuration file",
        ),
        (
            fx.home.join(".config"),
            "directory",
            "contains the configuration file",
        ),
        (fx.runtime.clone(), "directory", "contains the Runtime Root"),
        (
            fx.runtime.join("lazaret/domains"),
            "directory",
            "lies inside the Runtime Root",
        ),
        (
            fx.home.join(".local/share"),
            "directory",
            "contains the Storage Root",
        ),
        (
            storage.join("domains"),
            "directory",
            "lies inside the Storage Root",
        ),
        (
            storage.join("profiles"),
            "directory",
            "lies inside the Storage Root",
        ),
        (profile_dir(&fx), "directory", "the Storage Root"),
    ];
    for (source, kind, words) in cases {
        load_refused(
            &fx,
            &minimal(&with_volumes(&[volume(&q(&source), "/root/v", kind, "")])),
            "profiles.p.volumes[0].host",
            &[words, "must not overlap"],
        );
    }
    // Volume sources are disjoint from one another.
    let data = fx.base().join("data");
    for (second, relation) in [
        (data.clone(), "is the same as the volume source"),
        (data.join("inner"), "lies inside the volume source"),
    ] {
        load_refused(
            &fx,
            &minimal(&with_volumes(&[
                volume(&q(&data), "/root/a", "directory", ""),
                volume(&q(&second), "/root/b", "directory", ""),
            ])),
            "profiles.p.volumes[1].host",
            &[relation, "profiles.p.volumes[0].host"],
        );
    }
    load_refused(
        &fx,
        &minimal(&with_volumes(&[
            volume(&q(&data.join("inner")), "/root/a", "directory", ""),
            volume(&q(&data), "/root/b", "directory", ""),
        ])),
        "profiles.p.volumes[1].host",
        &["contains the volume source"],
    );
}

// ---------------------------------------------------------------------------
// Roots
// ---------------------------------------------------------------------------

#[test]
fn data_root_takes_absolute_and_home_forms() {
    let fx = Fixture::new();
    let state = fx.base().join("state");
    let resolved = load_ok(
        &fx,
        &doc(&format!("[storage]\ndata_root = {}", q(&state)), ""),
    );
    assert_eq!(
        resolved.record().storage_root,
        state.clone().into_os_string().into_vec()
    );
    assert_eq!(mode_of(&state), 0o700);
    assert_eq!(mode_of(&state.join("profiles/p")), 0o700);
    assert_eq!(
        resolved.authorities().profile_dir.label(),
        state.join("profiles/p")
    );
    drop(resolved);

    let resolved = load_ok(&fx, &doc("[storage]\ndata_root = '~/lazaret-state'", ""));
    let home_state = fx.home.join("lazaret-state");
    assert_eq!(
        resolved.record().storage_root,
        home_state.clone().into_os_string().into_vec()
    );
    assert_eq!(mode_of(&home_state), 0o700);
    drop(resolved);

    // An existing root must be Lazaret's: mode 0700, a directory.
    let open = fx.base().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
    load_refused(
        &fx,
        &doc(&format!("[storage]\ndata_root = {}", q(&open)), ""),
        "storage.data_root",
        &["mode 0755", "0700"],
    );
    let file = fx.base().join("file");
    write_file(&file, "", 0o600);
    load_refused(
        &fx,
        &doc(&format!("[storage]\ndata_root = {}", q(&file)), ""),
        "storage.data_root",
        &["regular file", "directory"],
    );
}

#[test]
fn roots_do_not_overlap_the_workspace_or_each_other() {
    let fx = Fixture::new();
    load_refused(
        &fx,
        &doc(
            &format!("[storage]\ndata_root = {}", q(&fx.workspace.join("state"))),
            "",
        ),
        "storage.data_root",
        &[
            "the Storage Root",
            "lies inside the workspace",
            "must not overlap",
        ],
    );
    assert!(!fx.workspace.join("state").exists());
    load_refused(
        &fx,
        &doc(&format!("[storage]\ndata_root = {}", q(&fx.runtime)), ""),
        "storage.data_root",
        &["contains the Runtime Root"],
    );
    load_refused(
        &fx,
        &doc("[storage]\ndata_root = '~/.config'", ""),
        "--config",
        &[
            "the configuration file",
            "lies inside the Storage Root",
            "(storage.data_root)",
        ],
    );

    // A Storage Root above the workspace.
    let outer = fx.base().join("outer");
    let project = outer.join("project");
    std::fs::create_dir_all(&project).unwrap();
    fx.write_config(&doc(&format!("[storage]\ndata_root = {}", q(&outer)), ""));
    expect_field(
        &message(load_in(&fx, &project)),
        "storage.data_root",
        &["contains the workspace"],
    );
    // A workspace that holds the configuration file or the Runtime Root.
    fx.write_config(&minimal(""));
    expect_field(
        &message(load_in(&fx, &fx.home)),
        "--config",
        &["lies inside the workspace"],
    );
    expect_field(
        &message(load_in(&fx, &fx.runtime)),
        "XDG_RUNTIME_DIR",
        &["the Runtime Root", "lies inside the workspace"],
    );
    assert!(load_in(&fx, &project).is_ok());
}

// ---------------------------------------------------------------------------
// Network
// ---------------------------------------------------------------------------

#[test]
fn prefixes_have_host_bits_cleared() {
    let decoded = accepted(&doc(
        "[network]\ndefault_allow = ['198.51.100.53/24']",
        "allow_egress = ['10.222.7.9/16', '8.8.8.8/0', '203.0.113.10/32']",
    ));
    let profile = decoded.profiles.values().next().unwrap();
    assert_eq!(
        prefixes(&profile.allow_egress),
        ["10.222.0.0/16", "0.0.0.0/0", "203.0.113.10/32"]
    );
    assert_eq!(
        prefixes(&decoded.network.default_allow),
        ["198.51.100.0/24"]
    );

    let fx = Fixture::new();
    let resolved = load_ok(&fx, &minimal("allow_egress = ['10.222.7.9/16']"));
    assert_eq!(prefixes(&resolved.network().allow), ["10.222.0.0/16"]);
    assert_eq!(
        prefixes(&resolved.record().effective_allow_prefixes),
        ["10.222.0.0/16"]
    );
}

#[test]
fn effective_prefixes_are_unions_deduplicated_with_rfc1918_denied() {
    let fx = Fixture::new();
    let text = doc(
        "[network]\ndefault_allow = ['203.0.113.10/32', '203.0.113.10/32']\n\
         default_deny = ['10.0.0.0/8', '100.64.0.0/10']",
        "allow_egress = ['203.0.113.10/32', '198.51.100.7/24', '198.51.100.0/24']\n\
         deny_egress = ['10.1.0.0/16', '10.1.2.3/16', '100.64.9.9/10']",
    );
    let resolved = load_ok(&fx, &text);
    let allow = prefixes(&resolved.network().allow);
    let deny = prefixes(&resolved.network().deny);
    assert_eq!(allow, ["198.51.100.0/24", "203.0.113.10/32"]);
    assert_eq!(
        deny,
        [
            "10.0.0.0/8",
            "10.1.0.0/16",
            "100.64.0.0/10",
            "172.16.0.0/12",
            "192.168.0.0/16"
        ]
    );
    assert_eq!(prefixes(&resolved.record().effective_allow_prefixes), allow);
    assert_eq!(prefixes(&resolved.record().effective_deny_prefixes), deny);
    drop(resolved);
    // RFC 1918 is denied even when nothing is configured.
    let resolved = load_ok(&fx, &minimal(""));
    assert_eq!(
        prefixes(&resolved.network().deny),
        ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"]
    );
    assert!(resolved.network().allow.is_empty());
}

#[test]
fn an_exact_prefix_cannot_be_both_allowed_and_denied() {
    // Overlaps at different lengths are valid.
    let fx = Fixture::new();
    let resolved = load_ok(
        &fx,
        &doc(
            "[network]\ndefault_deny = ['198.51.100.0/24']",
            "allow_egress = ['10.222.0.0/16', '192.168.1.0/24', '198.51.100.53/32', '0.0.0.0/0']",
        ),
    );
    assert!(prefixes(&resolved.network().allow).contains(&"10.222.0.0/16".to_owned()));
    assert!(prefixes(&resolved.network().deny).contains(&"10.0.0.0/8".to_owned()));
    drop(resolved);

    refused(
        &doc(
            "[network]\ndefault_allow = ['198.51.100.0/24']",
            "deny_egress = ['198.51.100.0/24']",
        ),
        "network.default_allow[0]",
        &["also denied by profiles.p.deny_egress[0]", "both"],
    );
    refused(
        &doc(
            "[network]\ndefault_deny = ['203.0.113.0/24']",
            "allow_egress = ['8.8.8.8/32', '203.0.113.77/24']",
        ),
        "profiles.p.allow_egress[1]",
        &["also denied by network.default_deny[0]"],
    );
    refused(
        &minimal("allow_egress = ['1.1.1.1/32']\ndeny_egress = ['1.1.1.1/32']"),
        "profiles.p.allow_egress[0]",
        &["also denied by profiles.p.deny_egress[0]"],
    );
    for rfc in [
        "10.0.0.0/8",
        "10.9.9.9/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
    ] {
        refused(
            &minimal(&format!("allow_egress = ['{rfc}']")),
            "profiles.p.allow_egress[0]",
            &["the built-in RFC 1918 deny list"],
        );
    }
    refused(
        &doc("[network]\ndefault_allow = ['172.16.0.0/12']", ""),
        "network.default_allow[0]",
        &["RFC 1918"],
    );
    // A conflict in any profile refuses the document.
    let text = format!(
        "{}[profiles.q]\n{IMAGE}allow_egress = ['192.168.0.0/16']\n",
        minimal("")
    );
    refused(&text, "profiles.q.allow_egress[0]", &["RFC 1918"]);
    // Also through a full load.
    load_refused(
        &fx,
        &minimal("allow_egress = ['10.0.0.0/8']"),
        "profiles.p.allow_egress[0]",
        &["RFC 1918"],
    );
}

#[test]
fn prefixes_are_ipv4_and_well_formed() {
    accepted(&minimal(
        "allow_egress = ['0.0.0.0/0', '1.2.3.4/32', '9.9.9.9/9']",
    ));
    for bad in [
        "2001:db8::/32",
        "::/0",
        "::ffff:1.2.3.4/128",
        "10.0.0.0",
        "10.0.0.0/",
        "10.0.0.0/33",
        "10.0.0.0/08",
        "10.0.0.0/-1",
        "10.0.0.0/+8",
        "10.0.0.0/ 8",
        " 10.0.0.0/8",
        "10.0.0/8",
        "010.0.0.0/8",
        "10.0.0.256/8",
        "10.0.0.0/8/8",
        "example.com/32",
        "",
    ] {
        for (global, profile, path) in [
            (
                format!("[network]\ndefault_deny = ['1.1.1.1/32', '{bad}']"),
                String::new(),
                "network.default_deny[1]",
            ),
            (
                String::new(),
                format!("allow_egress = ['{bad}']"),
                "profiles.p.allow_egress[0]",
            ),
            (
                String::new(),
                format!("deny_egress = ['1.1.1.1/32', '{bad}']"),
                "profiles.p.deny_egress[1]",
            ),
        ] {
            refused(
                &doc(&global, &profile),
                path,
                &["invalid IPv4 prefix", "IPv4 only"],
            );
        }
    }
    refused(
        &doc("[network]\ndefault_allow = [167772160]", ""),
        "network.default_allow[0]",
        &["invalid type"],
    );
}

// ---------------------------------------------------------------------------
// Environment
// ---------------------------------------------------------------------------

#[test]
fn env_keys_follow_the_grammar() {
    accepted(&minimal(
        "env = { A = 'env:X', _b = 'env:_Y', A1_2 = 'env:Z9', GH_TOKEN = 'env:GH_TOKEN' }",
    ));
    let msg = decode_error(&minimal("env = { A = 'env:X', A = 'env:Y' }"));
    assert!(
        msg.contains("not valid TOML") && msg.contains("duplicate key"),
        "{msg}"
    );
    for bad in ["1A", "A-B", "A.B", "", "É", "A B", "$A"] {
        refused(
            &minimal(&format!("env = {{ \"{bad}\" = 'env:X' }}")),
            &format!("profiles.p.env.{bad}"),
            &["invalid environment name", "[A-Za-z_][A-Za-z0-9_]*"],
        );
    }
}

#[test]
fn env_values_are_references_only() {
    for bad in [
        "literal",
        "ghp_secret",
        "file:/etc/token",
        "ENV:X",
        " env:X",
        "",
    ] {
        refused(
            &minimal(&format!("env = {{ TOKEN = '{bad}' }}")),
            "profiles.p.env.TOKEN",
            &["`env:NAME`", "literal values are not allowed"],
        );
    }
    for bad in [
        "env:",
        "env:1X",
        "env:X Y",
        "env:$X",
        "env:X-Y",
        "env:env:X",
    ] {
        refused(
            &minimal(&format!("env = {{ TOKEN = '{bad}' }}")),
            "profiles.p.env.TOKEN",
            &["invalid environment name"],
        );
    }
}

#[test]
fn env_references_resolve_to_present_utf8_values() {
    let mut fx = Fixture::new();
    let text = minimal("env = { TOKEN = 'env:HOST_TOKEN', OTHER = 'env:HOST_OTHER' }");
    let msg = load_refused(
        &fx,
        &text,
        "profiles.p.env.OTHER",
        &["host variable HOST_OTHER is not set"],
    );
    assert!(msg.contains("export"), "{msg}");

    fx.vars.push(("HOST_OTHER".into(), "o".into()));
    fx.vars.push((
        "HOST_TOKEN".into(),
        OsString::from_vec(vec![b'a', 0xff, 0xfe, b'z']),
    ));
    load_refused(
        &fx,
        &text,
        "profiles.p.env.TOKEN",
        &["host variable HOST_TOKEN is not valid UTF-8"],
    );

    fx.vars.pop();
    fx.vars.push(("HOST_TOKEN".into(), "a\0b".into()));
    load_refused(
        &fx,
        &text,
        "profiles.p.env.TOKEN",
        &["host variable HOST_TOKEN contains NUL"],
    );

    fx.vars.pop();
    fx.vars.push(("HOST_TOKEN".into(), "".into()));
    let resolved = load_ok(&fx, &text);
    let env: Vec<(&str, &str)> = resolved
        .environment()
        .iter()
        .map(|(name, value)| (name.as_str(), value.expose()))
        .collect();
    assert_eq!(env, [("OTHER", "o"), ("TOKEN", "")]);
}

#[test]
fn env_values_are_never_in_debug_output_or_the_record() {
    const SECRET: &str = "lazaret-secret-value-4f1c9e";
    const UNREFERENCED: &str = "lazaret-unreferenced-value-77ab";
    let mut fx = Fixture::new();
    fx.vars.push(("HOST_TOKEN".into(), SECRET.into()));
    fx.vars.push(("NOT_REFERENCED".into(), UNREFERENCED.into()));
    let text = minimal("env = { GH_TOKEN = 'env:HOST_TOKEN' }");
    let resolved = load_ok(&fx, &text);

    let (name, value) = &resolved.environment()[0];
    assert_eq!(name.as_str(), "GH_TOKEN");
    assert_eq!(value.expose(), SECRET);
    assert_eq!(format!("{value:?}"), "<redacted>");

    let debug = format!("{resolved:?}");
    assert!(
        !debug.contains(SECRET),
        "the value leaked into Debug output"
    );
    assert!(!debug.contains(UNREFERENCED));
    assert!(debug.contains("<redacted>"));

    let record = resolved.record();
    assert_eq!(record.environment_references.len(), 1);
    assert_eq!(record.environment_references[0].sandbox_name, "GH_TOKEN");
    assert_eq!(record.environment_references[0].host_name, "HOST_TOKEN");
    let serialized = serde_json::to_string(record).unwrap();
    assert!(!serialized.contains(SECRET));
    assert!(!format!("{record:?}").contains(SECRET));

    // The value does not enter the fingerprint.
    let fingerprint = resolved.fingerprint();
    drop(resolved);
    fx.vars[0].1 = "another value".into();
    assert_eq!(load_ok(&fx, &text).fingerprint(), fingerprint);
}

// ---------------------------------------------------------------------------
// Escalation: structure
// ---------------------------------------------------------------------------

#[test]
fn auto_approval_needs_escalation_enabled() {
    accepted(&minimal("[profiles.p.escalation]\nenabled = true"));
    accepted(&minimal(
        "[profiles.p.escalation]\nenabled = false\nauto_approve = []",
    ));
    accepted(&minimal(&escalation(&[rule("'/usr/bin/gh'", "")])));
    for table in [
        "[profiles.p.escalation]\nenabled = false\nauto_approve = [{ executable = '/usr/bin/gh' }]",
        "[profiles.p.escalation]\nauto_approve = [{ executable = '/usr/bin/gh' }]",
    ] {
        refused(
            &minimal(table),
            "profiles.p.escalation.auto_approve",
            &["valid only while escalation.enabled = true"],
        );
    }
}

#[test]
fn allow_extra_args_needs_a_nonempty_prefix() {
    accepted(&minimal(&escalation(&[
        rule("'/usr/bin/gh'", ", args = ['pr'], allow_extra_args = true"),
        rule("'/usr/bin/git'", ", allow_extra_args = false"),
        rule("'/usr/bin/make'", ""),
    ])));
    for extra in [
        ", allow_extra_args = true",
        ", args = [], allow_extra_args = true",
    ] {
        refused(
            &minimal(&escalation(&[
                rule("'/usr/bin/gh'", ""),
                rule("'/usr/bin/git'", extra),
            ])),
            "profiles.p.escalation.auto_approve[1].allow_extra_args",
            &["at least one configured argument"],
        );
    }
}

#[test]
fn duplicate_rules_are_refused() {
    accepted(&minimal(&escalation(&[
        rule("'/usr/bin/gh'", ", args = ['pr', 'view']"),
        rule("'/usr/bin/gh'", ", args = ['view', 'pr']"),
        rule(
            "'/usr/bin/gh'",
            ", args = ['pr', 'view'], allow_extra_args = true",
        ),
        rule("'/usr/bin/gh'", ""),
    ])));
    refused(
        &minimal(&escalation(&[
            rule("'/usr/bin/gh'", ", args = ['pr']"),
            rule("'/usr/bin/git'", ""),
            rule("'/usr/bin/gh'", ", args = ['pr'], allow_extra_args = false"),
        ])),
        "profiles.p.escalation.auto_approve[2]",
        &["duplicates an earlier rule"],
    );
}

// ---------------------------------------------------------------------------
// Escalation: executables
// ---------------------------------------------------------------------------

#[test]
fn a_valid_executable_resolves_to_its_canonical_path() {
    let fx = Fixture::new();
    let exe = tool(&fx.base().join("bin/tool"), 0o755);
    let resolved = load_ok(
        &fx,
        &minimal(&escalation(&[rule(
            &q(&exe),
            ", args = ['run', '--flag'], allow_extra_args = true",
        )])),
    );
    let rules = &resolved.record().auto_approval_rules;
    assert!(resolved.record().escalation_enabled);
    assert_eq!(rules.len(), 1);
    assert_eq!(
        rules[0].canonical_executable,
        exe.clone().into_os_string().into_vec()
    );
    assert_eq!(rules[0].args, ["run", "--flag"]);
    assert!(rules[0].allow_extra_args);
    drop(resolved);

    // The `~/` form, and a minimal owner-only executable.
    let home_exe = tool(&fx.home.join("bin/helper"), 0o500);
    let resolved = load_ok(&fx, &minimal(&escalation(&[rule("'~/bin/helper'", "")])));
    assert_eq!(
        resolved.record().auto_approval_rules[0].canonical_executable,
        home_exe.into_os_string().into_vec()
    );
}

#[test]
fn a_symlinked_executable_resolves_to_its_target() {
    let fx = Fixture::new();
    let exe = tool(&fx.base().join("bin/tool"), 0o755);
    symlink(&exe, fx.base().join("bin/link")).unwrap();
    symlink(fx.base().join("bin"), fx.base().join("bin-link")).unwrap();
    for declared in [fx.base().join("bin/link"), fx.base().join("bin-link/tool")] {
        let resolved = load_ok(&fx, &minimal(&escalation(&[rule(&q(&declared), "")])));
        assert_eq!(
            resolved.record().auto_approval_rules[0].canonical_executable,
            exe.clone().into_os_string().into_vec(),
            "{}",
            declared.display()
        );
    }
    // Two declarations of the same canonical rule are duplicates.
    load_refused(
        &fx,
        &minimal(&escalation(&[
            rule(&q(&fx.base().join("bin/link")), ""),
            rule(&q(&exe), ""),
        ])),
        "profiles.p.escalation.auto_approve[1]",
        &["duplicates an earlier rule once its executable is resolved"],
    );
}

#[test]
fn an_executable_must_be_executable_and_not_writable_by_others() {
    let fx = Fixture::new();
    let field = "profiles.p.escalation.auto_approve[0].executable";
    let exe = fx.base().join("bin/tool");
    let text = minimal(&escalation(&[rule(&q(&exe), "")]));
    for mode in [0o755, 0o700, 0o555, 0o4755] {
        tool(&exe, mode);
        load_ok(&fx, &text);
    }
    tool(&exe, 0o644);
    load_refused(&fx, &text, field, &["is not executable by you", "0644"]);
    for (mode, shown) in [(0o775, "0775"), (0o757, "0757"), (0o777, "0777")] {
        tool(&exe, mode);
        load_refused(
            &fx,
            &text,
            field,
            &["writable by its group or others", shown],
        );
    }
}

#[test]
fn an_executable_must_have_exactly_one_link() {
    let fx = Fixture::new();
    let exe = tool(&fx.base().join("bin/tool"), 0o755);
    let text = minimal(&escalation(&[rule(&q(&exe), "")]));
    load_ok(&fx, &text);
    std::fs::hard_link(&exe, fx.base().join("bin/alias")).unwrap();
    load_refused(
        &fx,
        &text,
        "profiles.p.escalation.auto_approve[0].executable",
        &["has 2 hard links", "exactly one"],
    );
}

#[test]
fn an_executable_must_exist_and_be_a_regular_file() {
    let fx = Fixture::new();
    let bin = fx.base().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let field = "profiles.p.escalation.auto_approve[0].executable";
    load_refused(
        &fx,
        &minimal(&escalation(&[rule(&q(&bin.join("missing")), "")])),
        field,
        &["does not exist"],
    );
    load_refused(
        &fx,
        &minimal(&escalation(&[rule(&q(&bin), "")])),
        field,
        &["is a directory, not a regular file"],
    );
    let msg = message(fx.load_text("p", &minimal(&escalation(&[rule("'/dev/null'", "")]))));
    assert!(
        msg.starts_with(&format!("{field}: /dev/null "))
            && (msg.contains("is a character device, not a regular file")
                || msg.contains("crosses a mount point")),
        "{msg}"
    );
}

#[test]
fn an_executable_must_be_owned_by_root_or_the_invoking_user() {
    let fx = Fixture::new();
    let exe = tool(&fx.base().join("bin/tool"), 0o755);
    let text = minimal(&escalation(&[rule(&q(&exe), "")]));
    load_ok(&fx, &text);
    // Only root can give a file away; as another user the rule is covered by
    // the file created above being accepted.
    if rustix::process::getuid().is_root() {
        std::os::unix::fs::chown(&exe, Some(65534), Some(65534)).unwrap();
        load_refused(
            &fx,
            &text,
            "profiles.p.escalation.auto_approve[0].executable",
            &["owned by uid 65534", "or root"],
        );
    }
}

#[test]
fn executable_checks_repeat_before_every_execution() {
    let fx = Fixture::new();
    let exe = tool(&fx.base().join("bin/tool"), 0o755);
    let resolved = load_ok(&fx, &minimal(&escalation(&[rule(&q(&exe), "")])));
    let uid = rustix::process::getuid().as_raw();
    let executable = &resolved.authorities().executables[0];
    config::check_executable(executable.plan.canonical_label(), &executable.opened, uid).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o775)).unwrap();
    let why = config::check_executable(executable.plan.canonical_label(), &executable.opened, uid)
        .unwrap_err()
        .to_string();
    assert!(why.contains("writable by its group or others"), "{why}");
}

#[test]
fn an_executable_lives_outside_sandbox_writable_and_lazaret_trees() {
    let fx = Fixture::new();
    let field = "profiles.p.escalation.auto_approve[0].executable";
    // The first load creates the Lazaret roots.
    load_ok(&fx, &minimal(""));

    let in_workspace = tool(&fx.workspace.join("scripts/run.sh"), 0o755);
    load_refused(
        &fx,
        &minimal(&escalation(&[rule(&q(&in_workspace), "")])),
        field,
        &[
            "lies inside the workspace",
            "outside everything the sandbox can write",
        ],
    );

    let in_profile = tool(&profile_dir(&fx).join("bin/tool"), 0o755);
    assert!(in_profile.starts_with(fx.home.join(".local/share/lazaret/profiles/p")));
    load_refused(
        &fx,
        &minimal(&escalation(&[rule(&q(&in_profile), "")])),
        field,
        &["lies inside the profile directory"],
    );

    let in_storage = tool(&fx.home.join(".local/share/lazaret/tool"), 0o755);
    load_refused(
        &fx,
        &minimal(&escalation(&[rule(&q(&in_storage), "")])),
        field,
        &["lies inside the Storage Root"],
    );

    let in_runtime = tool(&fx.runtime.join("lazaret/tool"), 0o755);
    load_refused(
        &fx,
        &minimal(&escalation(&[rule(&q(&in_runtime), "")])),
        field,
        &["lies inside the Runtime Root"],
    );

    let data = fx.base().join("data");
    let in_volume = tool(&data.join("tool"), 0o755);
    let text = format!(
        "{}\n{}",
        with_volumes(&[volume(&q(&data), "/root/data", "directory", "")]),
        escalation(&[rule(&q(&in_volume), "")])
    );
    load_refused(
        &fx,
        &minimal(&text),
        field,
        &["lies inside the volume source"],
    );
    // A file volume that is the executable itself.
    let text = format!(
        "{}\n{}",
        with_volumes(&[volume(&q(&in_volume), "/root/tool", "file", "")]),
        escalation(&[rule(&q(&in_volume), "")])
    );
    load_refused(&fx, &minimal(&text), field, &["the volume source"]);

    // The same script outside every tree is accepted.
    let outside = tool(&fx.base().join("bin/tool"), 0o755);
    load_ok(&fx, &minimal(&escalation(&[rule(&q(&outside), "")])));
}
