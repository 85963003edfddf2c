//! The trusted-host configuration, v1 and v2: their document shapes, the
//! grammar of every string they hold, and the digests derived from a
//! resolved profile (`DomainIdV1`, `ConfigurationFingerprintV1` and
//! `ConfigurationFingerprintV2`). A v2 document is a v1 document whose
//! profiles may also name hosts (`allow_hosts`) and choose who answers DNS
//! (`dns`).
//!
//! This module owns syntax only: each grammar newtype refuses a malformed
//! value when it is decoded, so no later stage sees one. Relations between
//! fields, filesystem resolution and environment lookup belong to the Host
//! Coordinator's loader. Nothing here trusts its input; nothing here touches
//! the filesystem or the environment.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer, de};
use sha2::{Digest, Sha256};

use crate::ids::{ConfigurationFingerprint, DomainId};

/// The exact dispatch identifier of a v1 document's `schema` field.
pub const SCHEMA_ID: &str = "lazaret-trusted-host-config-v1";

mod v2;
pub use v2::{
    ConfigSchema, ConfigurationFingerprintRecordV2, ConfigurationRecord, CredentialEntry,
    CredentialV2, NamePolicyV2, ProfileV2, SCHEMA_ID_V2, SchemaIdV2, TrustedHostConfigurationV2,
    dns_mode_spelling,
};

/// The largest configuration source Lazaret reads, in bytes.
pub const MAX_SOURCE_LEN: u64 = 1_048_576;

/// The three RFC 1918 prefixes that every effective deny set holds.
pub const RFC1918: [Ipv4Prefix; 3] = [
    Ipv4Prefix::new_unchecked([10, 0, 0, 0], 8),
    Ipv4Prefix::new_unchecked([172, 16, 0, 0], 12),
    Ipv4Prefix::new_unchecked([192, 168, 0, 0], 16),
];

/// The v1 document as decoded: every profile, structurally checked.
///
/// Decoding refuses unknown fields at every depth; duplicate keys and tables
/// are refused by the TOML parser before this shape is reached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrustedHostConfigurationV1 {
    /// The dispatch identifier; always [`SCHEMA_ID`].
    pub schema: SchemaId,
    /// Where durable state lives.
    #[serde(default)]
    pub storage: StorageTable,
    /// Egress prefixes shared by every profile.
    #[serde(default)]
    pub network: NetworkTable,
    /// The profiles, by name. The caller selects exactly one.
    pub profiles: BTreeMap<ProfileName, ProfileV1>,
}

/// The `schema` field: decodes only from the exact v1 identifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchemaId;

impl Serialize for SchemaId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(SCHEMA_ID)
    }
}

impl<'de> Deserialize<'de> for SchemaId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        if text == SCHEMA_ID {
            Ok(SchemaId)
        } else {
            Err(de::Error::custom(format!(
                "unsupported schema `{}`: a v1 document's schema is `{SCHEMA_ID}`",
                quoted(&text)
            )))
        }
    }
}

/// The `[storage]` table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageTable {
    /// The Storage Root; absent means beneath the XDG data home.
    #[serde(default)]
    pub data_root: Option<HostPathDecl>,
}

/// The `[network]` table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkTable {
    /// Prefixes every profile may reach.
    #[serde(default)]
    pub default_allow: Vec<Ipv4Prefix>,
    /// Prefixes no profile may reach.
    #[serde(default)]
    pub default_deny: Vec<Ipv4Prefix>,
}

fn default_true() -> bool {
    true
}

/// One `[profiles.NAME]` table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileV1 {
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
}

/// One entry of a profile's `volumes` list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeV1 {
    /// The host source.
    pub host: HostPathDecl,
    /// Where the source appears in the sandbox.
    pub container: SandboxPath,
    /// Whether the source is a file or a directory.
    pub kind: VolumeKind,
    /// Whether the sandbox may write to it.
    #[serde(default)]
    pub access: VolumeAccess,
    /// Whether a missing directory source is created.
    #[serde(default)]
    pub create: bool,
}

/// The kind of object a volume source must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VolumeKind {
    /// A regular file.
    File,
    /// A directory.
    Directory,
}

/// How the sandbox may use a volume.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum VolumeAccess {
    /// Mounted read-only.
    ReadOnly,
    /// Mounted read-write.
    #[default]
    ReadWrite,
}

impl VolumeKind {
    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            VolumeKind::File => "file",
            VolumeKind::Directory => "directory",
        }
    }
}

impl VolumeAccess {
    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            VolumeAccess::ReadOnly => "read-only",
            VolumeAccess::ReadWrite => "read-write",
        }
    }
}

/// A profile's `[escalation]` table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EscalationV1 {
    /// Whether the sandbox may ask the host to run commands.
    #[serde(default)]
    pub enabled: bool,
    /// Commands that run without asking the developer.
    #[serde(default)]
    pub auto_approve: Vec<AutoApprovalRuleV1>,
}

/// One declared auto-approval rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AutoApprovalRuleV1 {
    /// The host executable; resolved to one canonical path at load.
    pub executable: HostPathDecl,
    /// The arguments, in order.
    #[serde(default)]
    pub args: Vec<Argument>,
    /// Whether more arguments may follow `args`.
    #[serde(default)]
    pub allow_extra_args: bool,
}

/// Why a configuration string broke its grammar.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct GrammarError(String);

/// The longest value an error quotes whole, in characters.
pub const QUOTED_MAX: usize = 160;

/// `text` as an error quotes it: escaped as in a Rust string's debug form
/// (no control character reaches a terminal), and, when longer than
/// [`QUOTED_MAX`] characters, its beginning and its end around the count
/// of those left out. A huge value then never makes a huge message, while
/// the message itself, its reason and what to do, is never cut.
pub fn quoted(text: &str) -> String {
    let escaped: Vec<char> = text.escape_debug().collect();
    if escaped.len() <= QUOTED_MAX {
        return escaped.into_iter().collect();
    }
    let head = QUOTED_MAX * 3 / 4;
    let tail = QUOTED_MAX / 4;
    let left_out = escaped.len() - head - tail;
    let mut shown: String = escaped[..head].iter().collect();
    shown.push_str(&format!("…({left_out} more characters)…"));
    shown.extend(&escaped[escaped.len() - tail..]);
    shown
}

fn grammar(message: impl Into<String>) -> GrammarError {
    GrammarError(message.into())
}

fn refuse_nul(text: &str) -> Result<(), GrammarError> {
    if text.contains('\0') {
        Err(grammar("contains a NUL character"))
    } else {
        Ok(())
    }
}

/// Implements `Serialize`/`Deserialize` for a newtype through its text form,
/// so the grammar check runs on every decode.
macro_rules! text_newtype {
    ($name:ident) => {
        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = String::deserialize(deserializer)?;
                $name::parse(&text).map_err(de::Error::custom)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

/// A profile name: `[A-Za-z0-9][A-Za-z0-9._-]{0,63}`, not `.` or `..`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProfileName(String);

impl ProfileName {
    /// Checks `text` against the profile-name grammar.
    pub fn parse(text: &str) -> Result<Self, GrammarError> {
        let bytes = text.as_bytes();
        let valid_first = bytes.first().is_some_and(u8::is_ascii_alphanumeric);
        let valid_rest = bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if !valid_first || !valid_rest || bytes.len() > 64 || text == "." || text == ".." {
            return Err(grammar(format!(
                "invalid profile name `{}`: a name starts with a letter or digit, \
                 continues with letters, digits, `.`, `_` or `-`, and has at most 64 characters",
                quoted(text)
            )));
        }
        Ok(Self(text.to_owned()))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

text_newtype!(ProfileName);

/// An environment variable name: `[A-Za-z_][A-Za-z0-9_]*`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EnvName(String);

impl EnvName {
    /// Checks `text` against the environment-name grammar.
    pub fn parse(text: &str) -> Result<Self, GrammarError> {
        let bytes = text.as_bytes();
        let valid_first = bytes
            .first()
            .is_some_and(|b| b.is_ascii_alphabetic() || *b == b'_');
        let valid_rest = bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || *b == b'_');
        if !valid_first || !valid_rest {
            return Err(grammar(format!(
                "invalid environment name `{}`: a name matches [A-Za-z_][A-Za-z0-9_]*",
                quoted(text)
            )));
        }
        Ok(Self(text.to_owned()))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

text_newtype!(EnvName);

/// The value of a profile `env` entry: `env:NAME`, naming a host variable.
/// Literal values and other schemes are refused.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EnvReferenceDecl {
    text: String,
    host_name: EnvName,
}

impl EnvReferenceDecl {
    /// Checks `text` is `env:` followed by a valid environment name.
    pub fn parse(text: &str) -> Result<Self, GrammarError> {
        let Some(name) = text.strip_prefix("env:") else {
            return Err(grammar(
                "an environment value must be a reference of the form `env:NAME` to a host \
                 variable; literal values are not allowed in the configuration",
            ));
        };
        let host_name = EnvName::parse(name)?;
        Ok(Self {
            text: text.to_owned(),
            host_name,
        })
    }

    /// The host variable named.
    pub fn host_name(&self) -> &EnvName {
        &self.host_name
    }

    /// The declaration as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

text_newtype!(EnvReferenceDecl);

/// A nonempty, NUL-free image reference. Its forms (`oci:`, `oci-archive:`,
/// registry references) are interpreted when the image is prepared.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ImageReference(String);

impl ImageReference {
    /// Checks `text` is a nonempty, NUL-free string.
    pub fn parse(text: &str) -> Result<Self, GrammarError> {
        refuse_nul(text)?;
        if text.trim().is_empty() {
            return Err(grammar("the image reference is empty"));
        }
        Ok(Self(text.to_owned()))
    }

    /// The reference as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

text_newtype!(ImageReference);

/// One auto-approval argument: any UTF-8 string without NUL.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Argument(String);

impl Argument {
    /// Checks `text` has no NUL.
    pub fn parse(text: &str) -> Result<Self, GrammarError> {
        refuse_nul(text)?;
        Ok(Self(text.to_owned()))
    }

    /// The argument.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

text_newtype!(Argument);

/// Checks the components of a path suffix (the part after `/`, `~/` or
/// `{profile_dir}/`): nonempty, no empty component (so no repeated or
/// trailing separator), no `.` or `..`, and no expansion, variable, glob or
/// shell form.
fn check_components(suffix: &str) -> Result<(), GrammarError> {
    if suffix.is_empty() {
        return Err(grammar("the path has nothing after its anchor"));
    }
    for component in suffix.split('/') {
        match component {
            "" => {
                return Err(grammar(
                    "the path has an empty component (`//` or a trailing `/`)",
                ));
            }
            "." | ".." => {
                return Err(grammar(format!(
                    "the path has a `{}` component; write the normalized path",
                    quoted(component)
                )));
            }
            _ => {}
        }
        if component.starts_with('~') {
            return Err(grammar(format!(
                "`{}`: `~` expands only as the leading `~/`",
                quoted(component)
            )));
        }
        if let Some(c) = component
            .chars()
            .find(|c| matches!(c, '$' | '`' | '*' | '?' | '[' | ']' | '{' | '}' | '\\'))
        {
            return Err(grammar(format!(
                "`{}`: `{c}` would be an expansion, variable, glob or shell form, \
                 which paths here do not have",
                quoted(component)
            )));
        }
    }
    Ok(())
}

/// Where a host path declaration is anchored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HostAnchor {
    /// `/`: an absolute path.
    Root,
    /// `~/`: the invoking user's home directory.
    Home,
    /// `{profile_dir}/`: the selected profile's directory (volume sources only).
    ProfileDir,
}

/// A host path as declared: absolute, or beginning with exactly `~/` or
/// `{profile_dir}/`, followed by a normalized relative suffix.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HostPathDecl {
    text: String,
    anchor: HostAnchor,
}

impl HostPathDecl {
    /// The profile-directory anchor of volume sources.
    pub const PROFILE_DIR_PREFIX: &'static str = "{profile_dir}/";

    /// Checks `text` against the host-path grammar.
    pub fn parse(text: &str) -> Result<Self, GrammarError> {
        refuse_nul(text)?;
        let (anchor, suffix) = if let Some(rest) = text.strip_prefix(Self::PROFILE_DIR_PREFIX) {
            (HostAnchor::ProfileDir, rest)
        } else if let Some(rest) = text.strip_prefix("~/") {
            (HostAnchor::Home, rest)
        } else if let Some(rest) = text.strip_prefix('/') {
            (HostAnchor::Root, rest)
        } else {
            return Err(grammar(format!(
                "invalid host path `{}`: a host path is absolute or begins with `~/` \
                 (or `{{profile_dir}}/` for a volume source)",
                quoted(text)
            )));
        };
        check_components(suffix)
            .map_err(|e| grammar(format!("invalid host path `{}`: {e}", quoted(text))))?;
        Ok(Self {
            text: text.to_owned(),
            anchor,
        })
    }

    /// The anchor.
    pub fn anchor(&self) -> HostAnchor {
        self.anchor
    }

    /// The normalized suffix after the anchor, without a leading `/`.
    pub fn suffix(&self) -> &str {
        match self.anchor {
            HostAnchor::Root => &self.text[1..],
            HostAnchor::Home => &self.text[2..],
            HostAnchor::ProfileDir => &self.text[Self::PROFILE_DIR_PREFIX.len()..],
        }
    }

    /// The declaration as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

text_newtype!(HostPathDecl);

/// A normalized absolute sandbox path other than `/`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SandboxPath(String);

impl SandboxPath {
    /// Checks `text` against the sandbox-path grammar.
    pub fn parse(text: &str) -> Result<Self, GrammarError> {
        refuse_nul(text)?;
        let Some(suffix) = text.strip_prefix('/') else {
            return Err(grammar(format!(
                "invalid sandbox path `{}`: a sandbox path is absolute",
                quoted(text)
            )));
        };
        if suffix.is_empty() {
            return Err(grammar("the sandbox root `/` cannot be used here"));
        }
        check_components(suffix)
            .map_err(|e| grammar(format!("invalid sandbox path `{}`: {e}", quoted(text))))?;
        Ok(Self(text.to_owned()))
    }

    /// The path.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `self` is `other` or lies beneath it.
    pub fn is_within(&self, other: &SandboxPath) -> bool {
        self.0 == other.0
            || (self.0.starts_with(&other.0) && self.0.as_bytes()[other.0.len()] == b'/')
    }

    /// Whether one of the two paths is the other or lies beneath it.
    pub fn overlaps(&self, other: &SandboxPath) -> bool {
        self.is_within(other) || other.is_within(self)
    }
}

text_newtype!(SandboxPath);

/// An IPv4 prefix with its host bits cleared. Written `a.b.c.d/len`; a
/// written address with host bits set is normalized, not refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ipv4Prefix {
    network: [u8; 4],
    len: u8,
}

impl Ipv4Prefix {
    const fn new_unchecked(network: [u8; 4], len: u8) -> Self {
        Self { network, len }
    }

    /// Builds a prefix, clearing host bits. `None` when `len > 32`.
    pub fn new(address: [u8; 4], len: u8) -> Option<Self> {
        if len > 32 {
            return None;
        }
        let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
        let network = (u32::from_be_bytes(address) & mask).to_be_bytes();
        Some(Self { network, len })
    }

    /// Parses `a.b.c.d/len` in its strict dotted-decimal form.
    pub fn parse(text: &str) -> Result<Self, GrammarError> {
        let invalid = || {
            grammar(format!(
                "invalid IPv4 prefix `{}`: write it as a.b.c.d/len, e.g. `203.0.113.10/32` \
                 (v1 networks are IPv4 only)",
                quoted(text)
            ))
        };
        let (address, len) = text.split_once('/').ok_or_else(invalid)?;
        let address: std::net::Ipv4Addr = address.parse().map_err(|_| invalid())?;
        let canonical_len = !len.is_empty()
            && len.len() <= 2
            && len.bytes().all(|b| b.is_ascii_digit())
            && !(len.len() == 2 && len.starts_with('0'));
        if !canonical_len {
            return Err(invalid());
        }
        let len: u8 = len.parse().map_err(|_| invalid())?;
        Self::new(address.octets(), len).ok_or_else(invalid)
    }

    /// The network address, host bits cleared.
    pub fn network(&self) -> [u8; 4] {
        self.network
    }

    /// The prefix length.
    pub fn prefix_len(&self) -> u8 {
        self.len
    }

    /// The canonical item encoding: four address bytes and the length.
    pub fn encoding(&self) -> [u8; 5] {
        let [a, b, c, d] = self.network;
        [a, b, c, d, self.len]
    }
}

impl fmt::Display for Ipv4Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d] = self.network;
        write!(f, "{a}.{b}.{c}.{d}/{}", self.len)
    }
}

impl Serialize for Ipv4Prefix {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Ipv4Prefix {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Ipv4Prefix::parse(&text).map_err(de::Error::custom)
    }
}

/// One resolved environment entry as fingerprinted: names only, never the
/// value.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct EnvironmentReference {
    /// The variable's name inside the sandbox.
    pub sandbox_name: String,
    /// The host variable it is read from.
    pub host_name: String,
}

/// One resolved volume: its canonical host source and how it is mounted.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ResolvedVolume {
    /// The canonical host pathname, as raw bytes.
    pub canonical_host_source: Vec<u8>,
    /// The sandbox destination.
    pub container_path: String,
    /// File or directory.
    pub kind: VolumeKind,
    /// Read-only or read-write.
    pub access: VolumeAccess,
    /// Whether a missing source was to be created.
    pub create: bool,
}

/// One resolved auto-approval rule.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ResolvedAutoApprovalRule {
    /// The canonical executable pathname, as raw bytes.
    pub canonical_executable: Vec<u8>,
    /// The arguments, in declared order.
    pub args: Vec<String>,
    /// Whether more arguments may follow.
    pub allow_extra_args: bool,
}

/// Everything of a resolved selected profile that the configuration
/// fingerprint covers. Resolved environment values have no field here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigurationFingerprintRecordV1 {
    /// The selected profile's name.
    pub selected_profile: String,
    /// The canonical Storage Root, as raw bytes.
    pub storage_root: Vec<u8>,
    /// The canonical Runtime Root, as raw bytes.
    pub runtime_root: Vec<u8>,
    /// The image reference as written.
    pub image: String,
    /// Whether git-ignored paths are isolated.
    pub isolate_gitignored: bool,
    /// The persistent sandbox paths.
    pub persistent_dirs: Vec<String>,
    /// The environment references.
    pub environment_references: Vec<EnvironmentReference>,
    /// The resolved volumes.
    pub volumes: Vec<ResolvedVolume>,
    /// The effective allow prefixes.
    pub effective_allow_prefixes: Vec<Ipv4Prefix>,
    /// The effective deny prefixes, RFC 1918 included.
    pub effective_deny_prefixes: Vec<Ipv4Prefix>,
    /// Whether escalation is enabled.
    pub escalation_enabled: bool,
    /// The resolved auto-approval rules.
    pub auto_approval_rules: Vec<ResolvedAutoApprovalRule>,
}

/// A field too long for the digests' `u32` length framing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a digest input of {0} bytes or items does not fit the u32 framing")]
pub struct FramingError(pub usize);

/// Builds a digest preimage with the v1 framing: `bytes(x)` is a `u32be`
/// length and `x`; a Boolean is one byte; a list is a `u32be` count and
/// `bytes(item)` for each item encoding.
#[derive(Debug, Default)]
struct Preimage(Vec<u8>);

fn u32be(n: usize) -> Result<[u8; 4], FramingError> {
    u32::try_from(n)
        .map(u32::to_be_bytes)
        .map_err(|_| FramingError(n))
}

impl Preimage {
    fn separator(separator: &[u8]) -> Self {
        Self(separator.to_vec())
    }

    fn bytes(&mut self, x: &[u8]) -> Result<&mut Self, FramingError> {
        self.0.extend_from_slice(&u32be(x.len())?);
        self.0.extend_from_slice(x);
        Ok(self)
    }

    fn boolean(&mut self, b: bool) -> &mut Self {
        self.0.push(u8::from(b));
        self
    }

    fn raw(&mut self, x: &[u8]) -> &mut Self {
        self.0.extend_from_slice(x);
        self
    }

    /// Appends a list in the given order.
    fn list_in_order(&mut self, items: &[Vec<u8>]) -> Result<&mut Self, FramingError> {
        self.0.extend_from_slice(&u32be(items.len())?);
        for item in items {
            self.bytes(item)?;
        }
        Ok(self)
    }

    /// Appends a list after sorting its item encodings bytewise.
    fn list_sorted(&mut self, mut items: Vec<Vec<u8>>) -> Result<&mut Self, FramingError> {
        items.sort_unstable();
        self.list_in_order(&items)
    }

    fn digest(&self) -> [u8; 32] {
        Sha256::digest(&self.0).into()
    }
}

fn encoded(
    f: impl FnOnce(&mut Preimage) -> Result<(), FramingError>,
) -> Result<Vec<u8>, FramingError> {
    let mut item = Preimage::default();
    f(&mut item)?;
    Ok(item.0)
}

/// The `DomainIdV1` of a profile name and a canonical workspace path.
pub fn domain_id(
    profile: &ProfileName,
    canonical_workspace: &[u8],
) -> Result<DomainId, FramingError> {
    let mut preimage = Preimage::separator(b"lazaret-domain-id-v1\0");
    preimage
        .bytes(profile.as_str().as_bytes())?
        .bytes(canonical_workspace)?;
    Ok(DomainId(preimage.digest()))
}

impl ConfigurationFingerprintRecordV1 {
    /// The canonical preimage of `ConfigurationFingerprintV1`.
    pub fn canonical_bytes(&self) -> Result<Vec<u8>, FramingError> {
        let mut preimage = Preimage::separator(b"lazaret-configuration-fingerprint-v1\0");
        self.append_fields(&mut preimage)?;
        Ok(preimage.0)
    }

    /// Appends every field, after the separator, as the v1 preimage frames
    /// them (the v2 preimage frames them the same way).
    fn append_fields(&self, preimage: &mut Preimage) -> Result<(), FramingError> {
        let paths = self
            .persistent_dirs
            .iter()
            .map(|p| encoded(|i| i.bytes(p.as_bytes()).map(drop)))
            .collect::<Result<_, _>>()?;
        let env = self
            .environment_references
            .iter()
            .map(|r| {
                encoded(|i| {
                    i.bytes(r.sandbox_name.as_bytes())?
                        .bytes(r.host_name.as_bytes())
                        .map(drop)
                })
            })
            .collect::<Result<_, _>>()?;
        let volumes = self
            .volumes
            .iter()
            .map(|v| {
                encoded(|i| {
                    i.bytes(&v.canonical_host_source)?
                        .bytes(v.container_path.as_bytes())?
                        .raw(&[
                            match v.kind {
                                VolumeKind::File => 0,
                                VolumeKind::Directory => 1,
                            },
                            match v.access {
                                VolumeAccess::ReadOnly => 0,
                                VolumeAccess::ReadWrite => 1,
                            },
                        ])
                        .boolean(v.create);
                    Ok(())
                })
            })
            .collect::<Result<_, _>>()?;
        let prefixes = |set: &[Ipv4Prefix]| set.iter().map(|p| p.encoding().to_vec()).collect();
        let rules = self
            .auto_approval_rules
            .iter()
            .map(|r| {
                let args = r
                    .args
                    .iter()
                    .map(|a| encoded(|i| i.bytes(a.as_bytes()).map(drop)))
                    .collect::<Result<Vec<_>, _>>()?;
                encoded(|i| {
                    i.bytes(&r.canonical_executable)?
                        .list_in_order(&args)?
                        .boolean(r.allow_extra_args);
                    Ok(())
                })
            })
            .collect::<Result<_, _>>()?;

        preimage
            .bytes(self.selected_profile.as_bytes())?
            .bytes(&self.storage_root)?
            .bytes(&self.runtime_root)?
            .bytes(self.image.as_bytes())?
            .boolean(self.isolate_gitignored)
            .list_sorted(paths)?
            .list_sorted(env)?
            .list_sorted(volumes)?
            .list_sorted(prefixes(&self.effective_allow_prefixes))?
            .list_sorted(prefixes(&self.effective_deny_prefixes))?
            .boolean(self.escalation_enabled)
            .list_sorted(rules)?;
        Ok(())
    }

    /// `ConfigurationFingerprintV1`: SHA-256 of [`Self::canonical_bytes`].
    pub fn fingerprint(&self) -> Result<ConfigurationFingerprint, FramingError> {
        Ok(ConfigurationFingerprint(
            Sha256::digest(self.canonical_bytes()?).into(),
        ))
    }
}

#[cfg(test)]
mod tests;
