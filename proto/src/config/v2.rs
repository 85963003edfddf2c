//! The trusted-host configuration v2: v1 and, per profile, the host names
//! the sandbox may reach (`allow_hosts`), who answers its DNS queries
//! (`dns`) and the credentials the host adds to its requests
//! (`credentials`); and `ConfigurationFingerprintV2`, the digest of a
//! resolved v2 profile.
//!
//! Owns the v2 document shape and record only. Every v1 field keeps its v1
//! type, grammar and meaning: a v2 profile splits into the [`ProfileV1`]
//! it shares with v1 and the [`NamePolicyV2`] it adds, and a v2 record
//! embeds the v1 record, so code that reads v1 fields reads them the same
//! way for both schemas. Trusts nothing it decodes: each host name is
//! checked by [`HostPattern::parse`] as it is read.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize, Serializer, de};
use sha2::{Digest, Sha256};

use super::{
    EnvName, EnvReferenceDecl, EscalationV1, ImageReference, Ipv4Prefix, NetworkTable, Preimage,
    ProfileName, ProfileV1, SCHEMA_ID, SandboxPath, StorageTable, TrustedHostConfigurationV1,
    VolumeV1, default_true, encoded, quoted,
};
use crate::config::FramingError;
use crate::ids::ConfigurationFingerprint;
use crate::names::{DnsMode, HostPattern, HostPatternError};

/// The exact dispatch identifier of a v2 document's `schema` field.
pub const SCHEMA_ID_V2: &str = "lazaret-trusted-host-config-v2";

/// Which schema a document declared, and so which digest names its
/// resolved profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ConfigSchema {
    /// `lazaret-trusted-host-config-v1`.
    V1,
    /// `lazaret-trusted-host-config-v2`.
    V2,
}

impl ConfigSchema {
    /// Every schema this version reads, oldest first.
    pub const ALL: [ConfigSchema; 2] = [ConfigSchema::V1, ConfigSchema::V2];

    /// The `schema` field's exact text.
    pub fn id(self) -> &'static str {
        match self {
            ConfigSchema::V1 => SCHEMA_ID,
            ConfigSchema::V2 => SCHEMA_ID_V2,
        }
    }

    /// The schema whose `schema` field is exactly `text`.
    pub fn from_id(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.id() == text)
    }
}

/// The `schema` field of a v2 document: decodes only from the exact v2
/// identifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchemaIdV2;

impl Serialize for SchemaIdV2 {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(SCHEMA_ID_V2)
    }
}

impl<'de> Deserialize<'de> for SchemaIdV2 {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        if text == SCHEMA_ID_V2 {
            Ok(SchemaIdV2)
        } else {
            Err(de::Error::custom(format!(
                "unsupported schema `{}`: a v2 document's schema is `{SCHEMA_ID_V2}`",
                quoted(&text)
            )))
        }
    }
}

/// The v2 document as decoded: v1's tables, with v2 profiles.
///
/// Decoding refuses unknown fields at every depth, as v1's does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrustedHostConfigurationV2 {
    /// The dispatch identifier; always [`SCHEMA_ID_V2`].
    pub schema: SchemaIdV2,
    /// Where durable state lives.
    #[serde(default)]
    pub storage: StorageTable,
    /// Egress prefixes shared by every profile.
    #[serde(default)]
    pub network: NetworkTable,
    /// The profiles, by name. The caller selects exactly one.
    pub profiles: BTreeMap<ProfileName, ProfileV2>,
}

impl TrustedHostConfigurationV2 {
    /// The document's v1 fields, and what v2 adds to each profile.
    pub fn split(
        self,
    ) -> (
        TrustedHostConfigurationV1,
        BTreeMap<ProfileName, NamePolicyV2>,
    ) {
        let mut names = BTreeMap::new();
        let mut profiles = BTreeMap::new();
        for (name, profile) in self.profiles {
            let (profile, policy) = profile.split();
            names.insert(name.clone(), policy);
            profiles.insert(name, profile);
        }
        let v1 = TrustedHostConfigurationV1 {
            schema: super::SchemaId,
            storage: self.storage,
            network: self.network,
            profiles,
        };
        (v1, names)
    }
}

/// One `[profiles.NAME]` table of a v2 document: every v1 field, with its
/// v1 meaning, and the two v2 keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileV2 {
    /// The OCI image reference of the sandbox's base.
    pub image: ImageReference,
    /// Whether git-ignored workspace paths are routed to Domain storage.
    #[serde(default = "default_true")]
    pub isolate_gitignored: bool,
    /// Sandbox paths whose contents survive between generations.
    #[serde(default)]
    pub persistent_dirs: Vec<SandboxPath>,
    /// Prefixes this profile may reach, beside the global ones.
    #[serde(default)]
    pub allow_egress: Vec<Ipv4Prefix>,
    /// Prefixes this profile may not reach, beside the global ones.
    #[serde(default)]
    pub deny_egress: Vec<Ipv4Prefix>,
    /// Sandbox environment names and the host variables they come from.
    #[serde(default)]
    pub env: BTreeMap<EnvName, EnvReferenceDecl>,
    /// Host files and directories mounted into the sandbox.
    #[serde(default)]
    pub volumes: Vec<VolumeV1>,
    /// Host escalation settings.
    #[serde(default)]
    pub escalation: EscalationV1,
    /// Host names this profile may reach, in declared order.
    #[serde(default, deserialize_with = "host_patterns")]
    pub allow_hosts: Vec<HostPattern>,
    /// Who answers the sandbox's DNS queries; `"lazaret"` by default.
    #[serde(
        default,
        deserialize_with = "dns_mode",
        serialize_with = "dns_mode_text"
    )]
    pub dns: DnsMode,
    /// Credentials the sandbox holds only as placeholders.
    #[serde(default)]
    pub credentials: Vec<CredentialV2>,
}

/// One `[[profiles.NAME.credentials]]` entry: a sandbox variable that holds
/// a placeholder, where the real value comes from, and the HTTPS hosts
/// whose requests get the real value in place of the placeholder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialV2 {
    /// The sandbox variable that holds the placeholder.
    pub env: EnvName,
    /// The host variable holding the real value: `env:NAME`.
    pub value: EnvReferenceDecl,
    /// The hosts (port 443) whose requests get the real value: exact names.
    #[serde(deserialize_with = "credential_hosts")]
    pub hosts: Vec<HostPattern>,
}

impl ProfileV2 {
    /// The v1 fields, and the v2 additions.
    pub fn split(self) -> (ProfileV1, NamePolicyV2) {
        let ProfileV2 {
            image,
            isolate_gitignored,
            persistent_dirs,
            allow_egress,
            deny_egress,
            env,
            volumes,
            escalation,
            allow_hosts,
            dns,
            credentials,
        } = self;
        let v1 = ProfileV1 {
            image,
            isolate_gitignored,
            persistent_dirs,
            allow_egress,
            deny_egress,
            env,
            volumes,
            escalation,
        };
        (
            v1,
            NamePolicyV2 {
                allow_hosts,
                dns,
                credentials,
            },
        )
    }
}

/// What a v2 profile adds to v1's: names, who resolves them, and the
/// credentials added to requests to some of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamePolicyV2 {
    /// The `allow_hosts` entries, in declared order.
    pub allow_hosts: Vec<HostPattern>,
    /// The `dns` mode.
    pub dns: DnsMode,
    /// The `credentials` entries, in declared order.
    pub credentials: Vec<CredentialV2>,
}

/// The spelling of a DNS mode in a document.
pub fn dns_mode_spelling(mode: DnsMode) -> &'static str {
    match mode {
        DnsMode::Lazaret => "lazaret",
        DnsMode::Host => "host",
    }
}

fn dns_mode<'de, D: Deserializer<'de>>(deserializer: D) -> Result<DnsMode, D::Error> {
    let text = String::deserialize(deserializer)?;
    match text.as_str() {
        "lazaret" => Ok(DnsMode::Lazaret),
        "host" => Ok(DnsMode::Host),
        other => Err(de::Error::custom(format!(
            "unknown value `{}`, expected `lazaret` (Lazaret's resolver answers only the names \
             allow_hosts lists) or `host` (the host's resolver answers every name)",
            quoted(other)
        ))),
    }
}

fn dns_mode_text<S: Serializer>(mode: &DnsMode, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(dns_mode_spelling(*mode))
}

/// One `allow_hosts` entry as decoded: the message quotes the entry the
/// way every configuration error quotes a value.
struct HostEntry(HostPattern);

impl<'de> Deserialize<'de> for HostEntry {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        HostPattern::parse(&text).map(HostEntry).map_err(|e| {
            de::Error::custom(match e {
                HostPatternError::Empty => {
                    "is empty; write a host name such as `api.example.org`".to_owned()
                }
                e => format!("`{}` {e}", quoted(&text)),
            })
        })
    }
}

fn host_patterns<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<HostPattern>, D::Error> {
    let entries = Vec::<HostEntry>::deserialize(deserializer)?;
    Ok(entries.into_iter().map(|e| e.0).collect())
}

/// A credential's `hosts`: at least one, each an exact name (a credential
/// goes to the hosts named, never to every name under a domain).
fn credential_hosts<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<HostPattern>, D::Error> {
    let hosts = host_patterns(deserializer)?;
    if hosts.is_empty() {
        return Err(de::Error::custom(
            "is empty; name the HTTPS hosts that get the real value, e.g. \
             `[\"api.example.org\"]`",
        ));
    }
    if let Some(wildcard) = hosts.iter().find(|h| h.is_wildcard()) {
        return Err(de::Error::custom(format!(
            "`{}` is a wildcard; a credential goes only to the exact host names listed",
            quoted(wildcard.as_str())
        )));
    }
    Ok(hosts)
}

/// Everything of a resolved selected v2 profile that the configuration
/// fingerprint covers: every v1 field, the allowed host names, the DNS
/// mode and the credential entries (never their values).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigurationFingerprintRecordV2 {
    /// Every field the v1 record has, resolved as v1 resolves it.
    pub base: super::ConfigurationFingerprintRecordV1,
    /// The allowed host names, sorted and deduplicated.
    pub allow_hosts: Vec<HostPattern>,
    /// Who answers the sandbox's DNS queries.
    pub dns: DnsMode,
    /// The credential entries: the variable, the reference to the real
    /// value and the hosts, sorted by variable.
    pub credentials: Vec<CredentialEntry>,
}

/// A credential entry as the fingerprint covers it: what it is called,
/// where its value comes from and where it goes; never the value.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CredentialEntry {
    /// The sandbox variable.
    pub sandbox_name: String,
    /// The host variable the value is read from.
    pub host_name: String,
    /// The hosts that get the value, sorted and deduplicated.
    pub hosts: Vec<HostPattern>,
}

impl ConfigurationFingerprintRecordV2 {
    /// The canonical preimage of `ConfigurationFingerprintV2`: its own
    /// separator, every v1 field framed as v1 frames it, the sorted list
    /// of `bytes(name)` items, and one DNS-mode byte; then, only when the
    /// profile has credentials (so that a profile without keeps its
    /// digest), the byte `C` and the sorted list of credential items, each
    /// `bytes(sandbox_name) bytes(host_name)` and the sorted list of its
    /// `bytes(host)` items.
    pub fn canonical_bytes(&self) -> Result<Vec<u8>, FramingError> {
        let names = |hosts: &[HostPattern]| {
            hosts
                .iter()
                .map(|h| encoded(|i| i.bytes(h.as_str().as_bytes()).map(drop)))
                .collect::<Result<Vec<_>, _>>()
        };
        let mut preimage = Preimage::separator(b"lazaret-configuration-fingerprint-v2\0");
        self.base.append_fields(&mut preimage)?;
        preimage
            .list_sorted(names(&self.allow_hosts)?)?
            .raw(&[match self.dns {
                DnsMode::Lazaret => 0,
                DnsMode::Host => 1,
            }]);
        if !self.credentials.is_empty() {
            let credentials = self
                .credentials
                .iter()
                .map(|c| {
                    let hosts = names(&c.hosts)?;
                    encoded(|i| {
                        i.bytes(c.sandbox_name.as_bytes())?
                            .bytes(c.host_name.as_bytes())?
                            .list_sorted(hosts)
                            .map(drop)
                    })
                })
                .collect::<Result<_, _>>()?;
            preimage.raw(b"C").list_sorted(credentials)?;
        }
        Ok(preimage.0)
    }

    /// `ConfigurationFingerprintV2`: SHA-256 of [`Self::canonical_bytes`].
    pub fn fingerprint(&self) -> Result<ConfigurationFingerprint, FramingError> {
        Ok(ConfigurationFingerprint(
            Sha256::digest(self.canonical_bytes()?).into(),
        ))
    }
}

/// The fingerprinted record of a resolved profile, of the schema its
/// document declared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ConfigurationRecord {
    /// From a v1 document: `ConfigurationFingerprintV1`.
    V1(super::ConfigurationFingerprintRecordV1),
    /// From a v2 document: `ConfigurationFingerprintV2`.
    V2(ConfigurationFingerprintRecordV2),
}

impl ConfigurationRecord {
    /// The schema the record was resolved from.
    pub fn schema(&self) -> ConfigSchema {
        match self {
            ConfigurationRecord::V1(_) => ConfigSchema::V1,
            ConfigurationRecord::V2(_) => ConfigSchema::V2,
        }
    }

    /// The fields every schema has.
    pub fn base(&self) -> &super::ConfigurationFingerprintRecordV1 {
        match self {
            ConfigurationRecord::V1(record) => record,
            ConfigurationRecord::V2(record) => &record.base,
        }
    }

    /// The allowed host names, sorted; none for v1.
    pub fn allow_hosts(&self) -> &[HostPattern] {
        match self {
            ConfigurationRecord::V1(_) => &[],
            ConfigurationRecord::V2(record) => &record.allow_hosts,
        }
    }

    /// The credential entries, sorted by variable; none for v1.
    pub fn credentials(&self) -> &[CredentialEntry] {
        match self {
            ConfigurationRecord::V1(_) => &[],
            ConfigurationRecord::V2(record) => &record.credentials,
        }
    }

    /// Who answers the sandbox's DNS queries: for v1, always the host's
    /// resolver.
    pub fn dns(&self) -> DnsMode {
        match self {
            ConfigurationRecord::V1(_) => DnsMode::Host,
            ConfigurationRecord::V2(record) => record.dns,
        }
    }

    /// The canonical preimage of the record's fingerprint.
    pub fn canonical_bytes(&self) -> Result<Vec<u8>, FramingError> {
        match self {
            ConfigurationRecord::V1(record) => record.canonical_bytes(),
            ConfigurationRecord::V2(record) => record.canonical_bytes(),
        }
    }

    /// `ConfigurationFingerprintV1` or `ConfigurationFingerprintV2`, by
    /// schema.
    pub fn fingerprint(&self) -> Result<ConfigurationFingerprint, FramingError> {
        match self {
            ConfigurationRecord::V1(record) => record.fingerprint(),
            ConfigurationRecord::V2(record) => record.fingerprint(),
        }
    }
}
