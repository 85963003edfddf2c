//! Strict decoding and structural validation of a v1 or v2 document.
//!
//! This module owns the step from bytes to a [`DecodedConfiguration`] whose
//! every profile is structurally valid. It trusts nothing in the bytes: the
//! TOML parser refuses duplicate keys and tables, the `schema` field is
//! dispatched before anything else is interpreted, serde refuses unknown
//! fields and enumeration values at every depth (a v1 document keeps v1's
//! closed shape: the v2 keys are unknown there), and the relations between
//! fields (nesting of persistent and volume paths, protected destinations,
//! egress conflicts, escalation rules, repeated host names) are checked here
//! for every profile. Each error names the exact field path.

use std::collections::BTreeMap;

use lazaret_proto::config::{
    ConfigSchema, HostAnchor, Ipv4Prefix, NamePolicyV2, ProfileV1, RFC1918, SCHEMA_ID,
    SCHEMA_ID_V2, SandboxPath, TrustedHostConfigurationV1, TrustedHostConfigurationV2, VolumeKind,
    quoted,
};
use lazaret_proto::layout::SandboxLayoutV1;

use super::{ConfigError, DecodedConfiguration, field};

/// The field at byte `at` of `text` and where that byte is, as a syntax
/// error names them: `profiles.p.image (line 4, column 1)`.
fn place(text: &str, at: usize) -> String {
    let at = at.min(text.len());
    let before = text.get(..at).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
    let field = super::keypath::path_at(text, at);
    format!("{field} (line {line}, column {column})")
}

/// Where and why `text` is not TOML, naming the field, without quoting the
/// document (a line may be long, or hold control characters).
fn toml_error(text: &str, error: &toml::de::Error) -> String {
    let message = error.message().trim_end();
    let at = error.span().map_or(text.len(), |span| span.start);
    format!("{}: {message}", place(text, at))
}

/// The document at `source_label` as a TOML table, or the syntax error
/// with its field and line.
pub(super) fn parse_table(source_label: &str, bytes: &[u8]) -> Result<toml::Table, ConfigError> {
    let text = std::str::from_utf8(bytes).map_err(|e| {
        // The bytes before the first that is not UTF-8 are text.
        let valid = e.valid_up_to();
        let before = std::str::from_utf8(&bytes[..valid]).unwrap_or_default();
        ConfigError::Syntax {
            path: source_label.to_owned(),
            message: format!(
                "{}: is not valid UTF-8 (byte {valid})",
                place(before, valid)
            ),
        }
    })?;
    text.parse()
        .map_err(|e: toml::de::Error| ConfigError::Syntax {
            path: source_label.to_owned(),
            message: toml_error(text, &e),
        })
}

/// The schemas this version reads, as an error names them.
fn schemas_read() -> String {
    format!("`{SCHEMA_ID}` and `{SCHEMA_ID_V2}`")
}

/// The keys only a v2 profile has.
const V2_PROFILE_KEYS: [&str; 3] = ["allow_hosts", "dns", "credentials"];

/// Decodes `bytes` and validates the structure of every profile.
pub fn decode(
    source_label: &str,
    bytes: &[u8],
    layout: &SandboxLayoutV1,
) -> Result<DecodedConfiguration, ConfigError> {
    decode_raw(source_label, bytes, layout).map_err(printable_error)
}

/// `error` with every control character a document put in it escaped: a
/// quoted key or a string value may hold any character, and the error
/// reaches a terminal.
fn printable_error(error: ConfigError) -> ConfigError {
    match error {
        ConfigError::Field { field, rule } => ConfigError::Field {
            field: printable(&field),
            rule: printable(&rule),
        },
        ConfigError::Syntax { path, message } => ConfigError::Syntax {
            path,
            message: printable(&message),
        },
        error => error,
    }
}

fn decode_raw(
    source_label: &str,
    bytes: &[u8],
    layout: &SandboxLayoutV1,
) -> Result<DecodedConfiguration, ConfigError> {
    let table = parse_table(source_label, bytes)?;

    // Dispatch on `schema` before interpreting anything else, so a document
    // of another version is named as such rather than as unknown fields.
    let schema = match table.get("schema") {
        None => {
            return Err(field(
                "schema",
                format!(
                    "is required and must be \"{SCHEMA_ID_V2}\" (or \"{SCHEMA_ID}\" for a \
                     v1 document)"
                ),
            ));
        }
        Some(toml::Value::String(s)) => match ConfigSchema::from_id(s) {
            Some(schema) => schema,
            None => {
                return Err(field(
                    "schema",
                    format!(
                        "unsupported schema `{}`: this version of Lazaret reads only {}",
                        quoted(s),
                        schemas_read()
                    ),
                ));
            }
        },
        Some(other) => {
            return Err(field(
                "schema",
                format!(
                    "must be the string \"{SCHEMA_ID_V2}\" or \"{SCHEMA_ID}\", found a {}",
                    other.type_str()
                ),
            ));
        }
    };

    let (config, names) = match schema {
        ConfigSchema::V1 => (
            deserialize::<TrustedHostConfigurationV1>(schema, table)?,
            None,
        ),
        ConfigSchema::V2 => {
            let (config, names) = deserialize::<TrustedHostConfigurationV2>(schema, table)?.split();
            (config, Some(names))
        }
    };

    if config.profiles.is_empty() {
        return Err(field(
            "profiles",
            "at least one profile is required, e.g. [profiles.default]",
        ));
    }
    if let Some(decl) = &config.storage.data_root {
        if decl.anchor() == HostAnchor::ProfileDir {
            return Err(field(
                "storage.data_root",
                "`{profile_dir}/` may begin only a volume `host` path",
            ));
        }
    }
    let (global_allow, global_deny) = global_prefixes(&config);
    for (name, profile) in &config.profiles {
        let at = format!("profiles.{name}");
        check_profile(&at, profile, layout)?;
        effective_prefixes(&at, profile, &global_allow, &global_deny)?;
        if let Some(policy) = names.as_ref().and_then(|n| n.get(name)) {
            check_names(&at, policy)?;
            check_credentials(&at, profile, policy)?;
        }
    }
    Ok(DecodedConfiguration {
        schema,
        document: config,
        names: names.unwrap_or_default(),
    })
}

/// Deserializes the document's shape for `schema`, naming the field at
/// fault. In a v1 document a v2 key is unknown, as it always was; the
/// error then says which schema has it.
fn deserialize<T: serde::de::DeserializeOwned>(
    schema: ConfigSchema,
    table: toml::Table,
) -> Result<T, ConfigError> {
    serde_path_to_error::deserialize(table).map_err(|e| {
        use serde_path_to_error::Segment;
        let segments: Vec<&Segment> = e.path().iter().collect();
        // A key of a profile table: `profiles`, the profile's name, the key.
        let profile_key = match segments.as_slice() {
            [
                Segment::Map { key: top },
                Segment::Map { .. },
                Segment::Map { key },
            ] if top == "profiles" => Some(key.clone()),
            _ => None,
        };
        let path = e.path().to_string();
        // The bare message: the parser's own `in `a.b`` context drops
        // array indices and would name a second, wrong field path.
        let mut message = e.into_inner().message().trim_end().to_owned();
        if schema == ConfigSchema::V1 && message.starts_with("unknown field") {
            if let Some(key) = V2_PROFILE_KEYS
                .iter()
                .find(|k| profile_key.as_deref() == Some(**k))
            {
                message.push_str(&format!(
                    "; `{key}` is a v2 key: set schema = \"{SCHEMA_ID_V2}\" to use it \
                     (docs/config.md, \"Migrating from v1\")"
                ));
            }
        }
        field(
            if path == "." {
                String::from("(document)")
            } else {
                path
            },
            message,
        )
    })
}

/// `text` with each control character but the newline escaped
/// (`\u{1b}`); a syntax error's message spans lines.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() && c != '\n' {
                c.escape_debug().collect()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Checks what v2 adds to one profile: each host name listed once.
fn check_names(at: &str, policy: &NamePolicyV2) -> Result<(), ConfigError> {
    let name = |i: usize| format!("{at}.allow_hosts[{i}]");
    for (i, host) in policy.allow_hosts.iter().enumerate() {
        if let Some(j) = policy.allow_hosts[..i].iter().position(|h| h == host) {
            return Err(field(
                name(i),
                format!("`{host}` repeats {}; list each host name once", name(j)),
            ));
        }
    }
    Ok(())
}

/// Checks a profile's credentials: each variable once, and not also in
/// `env` (the sandbox would see the value); each host allowed by the
/// profile's `allow_hosts` (the proxy serves only names the sandbox may
/// reach), listed once.
fn check_credentials(
    at: &str,
    profile: &ProfileV1,
    policy: &NamePolicyV2,
) -> Result<(), ConfigError> {
    // With credentials, the sandbox's trust variables name the bundle that
    // trusts the Credential Proxy; the profile cannot set them too.
    if !policy.credentials.is_empty()
        && let Some(name) = profile
            .env
            .keys()
            .find(|n| lazaret_proto::credproxy::TRUST_VARIABLES.contains(&n.as_str()))
    {
        return Err(field(
            format!("{at}.env.{name}"),
            format!(
                "a profile with credentials sets {name} itself, to {} (the image's CA \
                 bundle and the Credential Proxy's CA); remove it from env",
                lazaret_proto::credproxy::TRUST_PATH
            ),
        ));
    }
    for (i, credential) in policy.credentials.iter().enumerate() {
        let here = format!("{at}.credentials[{i}]");
        let env = &credential.env;
        if profile.env.contains_key(env) {
            return Err(field(
                format!("{here}.env"),
                format!(
                    "`{env}` is also in {at}.env, which would give the sandbox the real value; \
                     remove it from env"
                ),
            ));
        }
        let source = credential.value.host_name();
        if let Some((name, _)) = profile
            .env
            .iter()
            .find(|(_, reference)| reference.host_name() == source)
        {
            return Err(field(
                format!("{at}.env.{name}"),
                format!(
                    "`{name}` reads {}, the real value of {here}, which would give the sandbox \
                     the real value; remove it from env",
                    credential.value.as_str()
                ),
            ));
        }
        if let Some(j) = policy.credentials[..i].iter().position(|c| &c.env == env) {
            return Err(field(
                format!("{here}.env"),
                format!("`{env}` repeats {at}.credentials[{j}].env; list each variable once"),
            ));
        }
        for (k, host) in credential.hosts.iter().enumerate() {
            let at_host = format!("{here}.hosts[{k}]");
            if let Some(j) = credential.hosts[..k].iter().position(|h| h == host) {
                return Err(field(
                    at_host,
                    format!("`{host}` repeats {here}.hosts[{j}]; list each host once"),
                ));
            }
            if !lazaret_proto::names::allowed(&policy.allow_hosts, host.as_str()) {
                return Err(field(
                    at_host,
                    format!(
                        "`{host}` is not allowed by {at}.allow_hosts; add it there, since the \
                         sandbox must reach a host to send it the credential"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Checks every relation within one profile.
fn check_profile(
    at: &str,
    profile: &ProfileV1,
    layout: &SandboxLayoutV1,
) -> Result<(), ConfigError> {
    check_destinations(
        &format!("{at}.persistent_dirs"),
        "",
        &profile.persistent_dirs,
        layout,
    )?;
    let containers: Vec<SandboxPath> = profile
        .volumes
        .iter()
        .map(|v| v.container.clone())
        .collect();
    check_destinations(&format!("{at}.volumes"), ".container", &containers, layout)?;

    for (i, volume) in profile.volumes.iter().enumerate() {
        let here = format!("{at}.volumes[{i}]");
        let parents: Vec<&SandboxPath> = profile
            .persistent_dirs
            .iter()
            .filter(|p| volume.container.is_within(p))
            .collect();
        match parents.as_slice() {
            [parent] if *parent == &volume.container => {
                return Err(field(
                    format!("{here}.container"),
                    format!(
                        "`{}` is itself a persistent dir; a volume must lie strictly beneath one",
                        volume.container
                    ),
                ));
            }
            [_] => {}
            [] => {
                return Err(field(
                    format!("{here}.container"),
                    format!(
                        "`{}` is not beneath any persistent_dirs entry; a volume must lie strictly \
                         beneath exactly one persistent dir (add its parent to persistent_dirs)",
                        volume.container
                    ),
                ));
            }
            _ => {
                return Err(field(
                    format!("{here}.container"),
                    format!(
                        "`{}` lies beneath more than one persistent dir",
                        volume.container
                    ),
                ));
            }
        }
        if volume.host.anchor() == HostAnchor::ProfileDir && volume.host.suffix().is_empty() {
            return Err(field(
                format!("{here}.host"),
                "names the profile directory itself",
            ));
        }
        if volume.create {
            if volume.kind != VolumeKind::Directory {
                return Err(field(
                    format!("{here}.create"),
                    "only a directory source can be created; a file source is never created",
                ));
            }
            if volume.host.anchor() != HostAnchor::ProfileDir {
                return Err(field(
                    format!("{here}.create"),
                    "only a source beneath `{profile_dir}/` can be created",
                ));
            }
        }
    }

    let escalation = &profile.escalation;
    if !escalation.enabled && !escalation.auto_approve.is_empty() {
        return Err(field(
            format!("{at}.escalation.auto_approve"),
            "auto-approval rules are valid only while escalation.enabled = true",
        ));
    }
    for (i, rule) in escalation.auto_approve.iter().enumerate() {
        let here = format!("{at}.escalation.auto_approve[{i}]");
        if rule.executable.anchor() == HostAnchor::ProfileDir {
            return Err(field(
                format!("{here}.executable"),
                "`{profile_dir}/` may begin only a volume `host` path",
            ));
        }
        if rule.allow_extra_args && rule.args.is_empty() {
            return Err(field(
                format!("{here}.allow_extra_args"),
                "allow_extra_args = true needs at least one configured argument as the prefix",
            ));
        }
        if escalation.auto_approve[..i].contains(rule) {
            return Err(field(here, "duplicates an earlier rule"));
        }
    }
    Ok(())
}

/// Checks a list of sandbox destinations, the entries of `at` (each named
/// `at[i]` followed by `item`): pairwise distinct, none above or beneath
/// another, none touching a protected destination of the layout.
fn check_destinations(
    at: &str,
    item: &str,
    paths: &[SandboxPath],
    layout: &SandboxLayoutV1,
) -> Result<(), ConfigError> {
    let name = |i: usize| format!("{at}[{i}]{item}");
    for (i, path) in paths.iter().enumerate() {
        if let Some(protected) = layout.conflict(path) {
            return Err(field(
                name(i),
                format!(
                    "`{path}` overlaps `{protected}`, which Lazaret mounts itself; \
                     choose a path outside it"
                ),
            ));
        }
        if let Some(j) = paths[..i].iter().position(|earlier| earlier.overlaps(path)) {
            let relation = if paths[j] == *path {
                "repeats"
            } else {
                "overlaps"
            };
            return Err(field(
                name(i),
                format!(
                    "`{path}` {relation} `{}` ({}); entries may not repeat or nest",
                    paths[j],
                    name(j)
                ),
            ));
        }
    }
    Ok(())
}

/// A prefix labelled with the field that declared it.
#[derive(Debug, Clone)]
pub struct LabeledPrefix {
    prefix: Ipv4Prefix,
    origin: String,
}

impl LabeledPrefix {
    fn collect(at: &str, prefixes: &[Ipv4Prefix]) -> Vec<LabeledPrefix> {
        prefixes
            .iter()
            .enumerate()
            .map(|(i, prefix)| LabeledPrefix {
                prefix: *prefix,
                origin: format!("{at}[{i}]"),
            })
            .collect()
    }
}

/// The effective allow and deny prefixes of one profile, sorted and
/// deduplicated: allow is the global and profile allows; deny is the global
/// and profile denies and RFC 1918. An exact prefix in both is refused.
pub fn effective_prefixes(
    at: &str,
    profile: &ProfileV1,
    global_allow: &[LabeledPrefix],
    global_deny: &[LabeledPrefix],
) -> Result<(Vec<Ipv4Prefix>, Vec<Ipv4Prefix>), ConfigError> {
    let mut allow: BTreeMap<Ipv4Prefix, String> = BTreeMap::new();
    for l in global_allow.iter().cloned().chain(LabeledPrefix::collect(
        &format!("{at}.allow_egress"),
        &profile.allow_egress,
    )) {
        allow.entry(l.prefix).or_insert(l.origin);
    }
    let mut deny: BTreeMap<Ipv4Prefix, String> = BTreeMap::new();
    for l in global_deny
        .iter()
        .cloned()
        .chain(LabeledPrefix::collect(
            &format!("{at}.deny_egress"),
            &profile.deny_egress,
        ))
        .chain(RFC1918.iter().map(|p| LabeledPrefix {
            prefix: *p,
            origin: "the built-in RFC 1918 deny list".into(),
        }))
    {
        deny.entry(l.prefix).or_insert(l.origin);
    }
    for (prefix, origin) in &allow {
        if let Some(denied_by) = deny.get(prefix) {
            return Err(field(
                origin.clone(),
                format!(
                    "{prefix} is also denied by {denied_by}; the same prefix cannot be both \
                     allowed and denied (allow a longer prefix inside it instead)"
                ),
            ));
        }
    }
    Ok((allow.into_keys().collect(), deny.into_keys().collect()))
}

/// The labelled global prefixes of a document.
pub fn global_prefixes(
    config: &TrustedHostConfigurationV1,
) -> (Vec<LabeledPrefix>, Vec<LabeledPrefix>) {
    (
        LabeledPrefix::collect("network.default_allow", &config.network.default_allow),
        LabeledPrefix::collect("network.default_deny", &config.network.default_deny),
    )
}
