//! The trusted-host configuration loader: the only code in Lazaret that
//! reads the TOML document.
//!
//! A load runs in this order, each step trusting only the ones before it:
//! 1. select the file and roots from `--config`, `HOME` and the XDG
//!    variables ([`hostenv`]);
//! 2. read the file securely ([`source`]);
//! 3. decode it strictly and check every profile's structure ([`decode`]);
//! 4. resolve the selected profile on the filesystem, compare every tree,
//!    reopen everything, and only then read the referenced host variables
//!    ([`resolve`]).
//!
//! Its one output is a [`ResolvedDomainConfiguration`]: move-only, not
//! serializable, with the retained descriptors every later consumer uses.

mod decode;
pub mod hostenv;
mod keypath;
mod resolve;
mod source;

use std::ffi::OsStr;
use std::fmt;
use std::path::Path;

use std::collections::BTreeMap;

use lazaret_proto::config::{
    ConfigurationFingerprintRecordV1, ConfigurationRecord, EnvName, Ipv4Prefix, NamePolicyV2,
    ProfileName, ResolvedAutoApprovalRule, ResolvedVolume, TrustedHostConfigurationV1,
};
use lazaret_proto::ids::{ConfigurationFingerprint, DomainId};
use lazaret_proto::layout::SandboxLayoutV1;
use lazaret_proto::names::{DnsMode, HostPattern};
use rustix::fd::OwnedFd;

pub use lazaret_proto::config::ConfigSchema;

// The plans and directories the loader hands out are the host-filesystem
// layer's own.
pub use hostenv::HostEnvironment;
pub use lazaret_hostfs::plan::{
    ConfinedError, ConfinedPathPlan, ObjectIdentity, Opened, RetainedDir,
};
pub use resolve::{ExecutableError, check_executable};
pub use source::{ConfigSource, read as read_source};

/// The directory, beneath both the Storage Root and the Runtime Root, that
/// holds one directory per Domain, named by its Domain ID in hex.
pub const DOMAINS_DIR: &str = "domains";

/// A [`ConfigError::Field`]: `field` breaks `rule`.
fn field(field: impl Into<String>, rule: impl Into<String>) -> ConfigError {
    ConfigError::Field {
        field: field.into(),
        rule: rule.into(),
    }
}

/// Why a configuration could not be loaded. Every variant names the field,
/// variable or file at fault and the rule it broke.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A host variable that selects a path is missing or invalid.
    #[error("{variable} {reason}")]
    Environment {
        /// The variable.
        variable: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The configuration source broke a rule of the secure read.
    #[error("configuration file {path} {reason}")]
    Source {
        /// The file.
        path: String,
        /// The rule broken.
        reason: String,
    },
    /// The configuration source could not be read.
    #[error("cannot read configuration file {path}")]
    SourceIo {
        /// The file.
        path: String,
        /// What the kernel said.
        #[source]
        source: std::io::Error,
    },
    /// The document is not valid TOML (including duplicate keys or tables).
    #[error("configuration file {path} is not valid TOML: {message}")]
    Syntax {
        /// The file.
        path: String,
        /// What the parser said, with the line.
        message: String,
    },
    /// A field breaks a rule.
    #[error("{field}: {rule}")]
    Field {
        /// The field path, e.g. `profiles.default.volumes[0].container`.
        field: String,
        /// The rule broken.
        rule: String,
    },
    /// A path chosen by a field could not be used; the source says why.
    #[error("{field}")]
    Path {
        /// The field path or option.
        field: String,
        /// What went wrong with the path.
        source: ConfinedError,
    },
    /// An auto-approval executable fails a check every host command's
    /// executable passes; the source says which.
    #[error("{field}")]
    Executable {
        /// The field path of the executable.
        field: String,
        /// The check it failed.
        source: ExecutableError,
    },
    /// The selected profile does not exist.
    #[error("profile `{profile}` is not defined in {config}; defined profiles: {available}")]
    UnknownProfile {
        /// The profile asked for.
        profile: String,
        /// The configuration file.
        config: String,
        /// The profiles it defines.
        available: String,
    },
}

/// A resolved host environment value. It is never printed, logged or
/// serialized: `Debug` shows `<redacted>`, and there is no `Display`.
pub struct SecretValue(String);

impl SecretValue {
    fn new(value: String) -> Self {
        Self(value)
    }

    /// The value, for handing to the sandbox process spec only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// One credential of the selected profile, resolved: the sandbox variable
/// that holds a placeholder, the real value, and the hosts that get it.
#[derive(Debug)]
pub struct ResolvedCredential {
    /// The sandbox variable.
    pub env: EnvName,
    /// The real value, from the host variable the entry names.
    pub value: SecretValue,
    /// The exact host names (port 443) whose requests get the value.
    pub hosts: Vec<HostPattern>,
}

/// The selected profile's effective egress policy: IPv4 prefixes and host
/// names, each sorted and deduplicated, and who answers DNS.
#[derive(Debug)]
pub struct EffectiveNetworkPolicy {
    /// Prefixes the sandbox may reach.
    pub allow: Vec<Ipv4Prefix>,
    /// Prefixes it may not reach; always holds RFC 1918.
    pub deny: Vec<Ipv4Prefix>,
    /// Host names the sandbox may reach (v2 `allow_hosts`); none for a v1
    /// document.
    pub hosts: Vec<HostPattern>,
    /// Who answers the sandbox's DNS queries: a v2 profile's `dns`
    /// (`Lazaret` unless it says `"host"`); `Host` for a v1 document.
    pub dns: DnsMode,
}

/// A volume source opened through its plan.
#[derive(Debug)]
pub struct ResolvedVolumeSource {
    /// The confined plan to the source.
    pub plan: ConfinedPathPlan,
    /// The source as opened at load.
    pub opened: Opened,
    /// Its fingerprinted form.
    pub volume: ResolvedVolume,
}

/// An auto-approval executable opened through its plan.
#[derive(Debug)]
pub struct ResolvedExecutable {
    /// The confined plan to the executable.
    pub plan: ConfinedPathPlan,
    /// The executable as opened at load.
    pub opened: Opened,
    /// Its fingerprinted rule.
    pub rule: ResolvedAutoApprovalRule,
}

/// The retained descriptors of every path the configuration selected.
#[derive(Debug)]
pub struct ConfinedAuthorities {
    /// The plan that reached the configuration file.
    pub config_file: ConfinedPathPlan,
    /// The configuration file, `O_PATH`.
    pub config_fd: OwnedFd,
    /// The Agent Workspace.
    pub workspace: RetainedDir,
    /// The Storage Root.
    pub storage_root: RetainedDir,
    /// The Runtime Root.
    pub runtime_root: RetainedDir,
    /// `profiles/<profile>` beneath the Storage Root.
    pub profile_dir: RetainedDir,
    /// `domains/<domain id>` beneath the Storage Root.
    pub domain_storage: RetainedDir,
    /// `domains/<domain id>` beneath the Runtime Root.
    pub domain_runtime: RetainedDir,
    /// The volume sources, in declared order.
    pub volumes: Vec<ResolvedVolumeSource>,
    /// The auto-approval executables, in declared order.
    pub executables: Vec<ResolvedExecutable>,
}

/// The one successful output of a load: the selected profile, resolved.
///
/// Move-only: it is neither `Clone` nor serializable, and it owns the
/// retained descriptors, the normalized profile data and the resolved
/// environment values.
#[derive(Debug)]
pub struct ResolvedDomainConfiguration {
    profile: ProfileName,
    domain_id: DomainId,
    fingerprint: ConfigurationFingerprint,
    record: ConfigurationRecord,
    network: EffectiveNetworkPolicy,
    environment: Vec<(EnvName, SecretValue)>,
    credentials: Vec<ResolvedCredential>,
    authorities: ConfinedAuthorities,
    layout: SandboxLayoutV1,
}

impl ResolvedDomainConfiguration {
    /// The selected profile.
    pub fn profile(&self) -> &ProfileName {
        &self.profile
    }

    /// `DomainIdV1` of (profile, canonical workspace).
    pub fn domain_id(&self) -> DomainId {
        self.domain_id
    }

    /// `ConfigurationFingerprintV1` of a v1 document,
    /// `ConfigurationFingerprintV2` of a v2 one.
    pub fn fingerprint(&self) -> ConfigurationFingerprint {
        self.fingerprint
    }

    /// The schema the document declared.
    pub fn schema(&self) -> ConfigSchema {
        self.record.schema()
    }

    /// The normalized selected-profile data every schema has: the whole
    /// fingerprinted record of a v1 document; of a v2 one, all but the
    /// host names and DNS mode ([`Self::fingerprint_record`]).
    pub fn record(&self) -> &ConfigurationFingerprintRecordV1 {
        self.record.base()
    }

    /// The whole record the fingerprint covers, of the document's schema.
    pub fn fingerprint_record(&self) -> &ConfigurationRecord {
        &self.record
    }

    /// The effective egress policy.
    pub fn network(&self) -> &EffectiveNetworkPolicy {
        &self.network
    }

    /// The sandbox environment: names and resolved values.
    pub fn environment(&self) -> &[(EnvName, SecretValue)] {
        &self.environment
    }

    /// The profile's credentials with their real values, in declared
    /// order; none when the load did not read host values.
    pub fn credentials(&self) -> &[ResolvedCredential] {
        &self.credentials
    }

    /// The retained descriptors.
    pub fn authorities(&self) -> &ConfinedAuthorities {
        &self.authorities
    }

    /// The sandbox layout the configuration was checked against.
    pub fn layout(&self) -> &SandboxLayoutV1 {
        &self.layout
    }
}

/// What a load needs from its caller.
#[derive(Debug)]
pub struct LoadRequest<'a> {
    /// The profile, exactly as the user typed it.
    pub profile: &'a str,
    /// `--config`, if given.
    pub config: Option<&'a OsStr>,
    /// The workspace directory (normally the current directory).
    pub workspace: &'a Path,
    /// The invoking user and their environment.
    pub host: &'a HostEnvironment,
}

/// Whether a load reads the host values that `env:` references name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EnvValues {
    /// Read them; a missing one is an error (`up`, `config check`).
    Read,
    /// Leave them unread: the resolved environment is empty. For loads that
    /// only compare the configuration (its fingerprint holds the references'
    /// names, never their values), such as `attach`'s, in a shell that need
    /// not export the secrets.
    Skip,
}

/// Loads the selected profile: the same load `lazaret up` performs.
pub fn load(request: LoadRequest<'_>) -> Result<ResolvedDomainConfiguration, ConfigError> {
    load_with(request, EnvValues::Read)
}

/// [`load`], reading the `env:` values or not.
pub fn load_with(
    request: LoadRequest<'_>,
    env_values: EnvValues,
) -> Result<ResolvedDomainConfiguration, ConfigError> {
    let profile = ProfileName::parse(request.profile).map_err(|e| ConfigError::Field {
        field: "PROFILE".into(),
        rule: e.to_string(),
    })?;
    let config_path = request.host.config_path(request.config)?;
    let source = source::read(&config_path, request.host.uid)?;
    let layout = SandboxLayoutV1::production();
    let config = decode::decode(
        &lazaret_hostfs::plan::label(source.plan.canonical_label()),
        &source.bytes,
        &layout,
    )?;
    resolve::resolve(
        config,
        resolve::Inputs {
            host: request.host,
            source,
            workspace: request.workspace,
            profile: &profile,
            layout,
            env_values,
        },
    )
}

/// The Storage Root as the configuration names it (`storage.data_root`),
/// read from that one field: for finding a Domain's records when its
/// profile no longer loads (a profile removed, an `env:` value not
/// exported, another profile broken). A missing configuration file means
/// the default root.
pub fn storage_root_of(
    host: &HostEnvironment,
    config: Option<&OsStr>,
) -> Result<std::path::PathBuf, ConfigError> {
    let config_path = host.config_path(config)?;
    if config.is_none() && !config_path.exists() {
        return host.storage_root(None);
    }
    let source = source::read(&config_path, host.uid)?;
    let label = lazaret_hostfs::plan::label(source.plan.canonical_label());
    let field = |rule: String| ConfigError::Field {
        field: "storage.data_root".into(),
        rule,
    };
    let document = decode::parse_table(&label, &source.bytes)?;
    let declared = match document.get("storage").and_then(|s| s.get("data_root")) {
        None => None,
        Some(toml::Value::String(text)) => Some(
            lazaret_proto::config::HostPathDecl::parse(text).map_err(|e| field(e.to_string()))?,
        ),
        Some(_) => return Err(field("must be a string".into())),
    };
    host.storage_root(declared.as_ref())
}

/// A decoded document whose every profile is structurally valid: its
/// schema, the fields every schema has, and what v2 adds.
#[derive(Debug, Clone)]
pub struct DecodedConfiguration {
    /// The schema the document declared.
    pub schema: ConfigSchema,
    /// Every v1 field of every profile (for a v2 document, each profile
    /// without its `allow_hosts` and `dns`).
    pub document: TrustedHostConfigurationV1,
    /// Each profile's `allow_hosts` and `dns`, for a v2 document; empty for
    /// a v1 one.
    pub names: BTreeMap<ProfileName, NamePolicyV2>,
}

impl DecodedConfiguration {
    /// The host names `profile` may reach and who answers its DNS: for a v1
    /// document, none and the host's resolver.
    pub fn name_policy(&self, profile: &ProfileName) -> NamePolicyV2 {
        match self.schema {
            ConfigSchema::V1 => NamePolicyV2 {
                allow_hosts: Vec::new(),
                dns: DnsMode::Host,
                credentials: Vec::new(),
            },
            ConfigSchema::V2 => self.names.get(profile).cloned().unwrap_or_default(),
        }
    }
}

/// Decodes and structurally checks a document of either schema without
/// touching the filesystem or environment.
pub fn decode_configuration(bytes: &[u8]) -> Result<DecodedConfiguration, ConfigError> {
    decode::decode("(document)", bytes, &SandboxLayoutV1::production())
}

/// [`decode_configuration`], keeping the fields every schema has (for a v2
/// document, all but `allow_hosts` and `dns`); for tests and fuzzing of the
/// decoder.
pub fn decode_document(bytes: &[u8]) -> Result<TrustedHostConfigurationV1, ConfigError> {
    decode_configuration(bytes).map(|decoded| decoded.document)
}
