//! Filesystem and environment resolution of the selected profile.
//!
//! This module owns the step from a structurally valid document (of either
//! schema) to a [`ResolvedDomainConfiguration`]: it opens the workspace,
//! creates and checks the Lazaret roots, opens every volume source and
//! auto-approval executable through confined plans, refuses every overlap
//! between the configuration file, workspace, roots, Domain trees and
//! sources, reopens everything to prove nothing moved, and only then reads
//! the host variables that `env:` references name; last, it builds the
//! record of the document's schema and its fingerprint. It trusts the
//! structural checks of [`super::decode`] and nothing on the filesystem.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use lazaret_proto::config::{
    AutoApprovalRuleV1, ConfigSchema, ConfigurationFingerprintRecordV1,
    ConfigurationFingerprintRecordV2, ConfigurationRecord, CredentialEntry, CredentialV2, EnvName,
    EnvironmentReference, HostAnchor, ProfileName, ProfileV1, ResolvedAutoApprovalRule,
    ResolvedVolume, TrustedHostConfigurationV1, VolumeKind, VolumeV1, domain_id,
};
use lazaret_proto::ids::DomainId;
use lazaret_proto::layout::SandboxLayoutV1;
use rustix::fd::AsFd;
use rustix::fs::{Access, AtFlags, FileType, Stat};

use super::decode::{effective_prefixes, global_prefixes};
use super::hostenv::HostEnvironment;
use super::source::ConfigSource;
use super::{
    ConfigError, ConfinedAuthorities, DecodedConfiguration, EffectiveNetworkPolicy,
    ResolvedCredential, ResolvedDomainConfiguration, ResolvedExecutable, ResolvedVolumeSource,
    SecretValue, field,
};
use lazaret_hostfs::beneath::proc_self_fd;
use lazaret_hostfs::plan::{
    ConfinedError, ConfinedPathPlan, ObjectIdentity, Opened, RetainedDir, canonicalize,
    ensure_root, identity, label, overlaps, planned_canonical, stat,
};

fn at(field_name: &str) -> impl Fn(ConfinedError) -> ConfigError + '_ {
    move |e| ConfigError::Path {
        field: field_name.to_owned(),
        source: e,
    }
}

/// A canonical tree the loader compares with others.
struct Area<'a> {
    /// The field or option that chose it.
    field: &'a str,
    /// What it is, for messages.
    what: &'a str,
    label: &'a Path,
    identity: Option<ObjectIdentity>,
}

impl Area<'_> {
    /// Refuses `self` and `other` when either is or lies inside the other,
    /// or both are the same object under two names.
    fn disjoint_from(&self, other: &Area<'_>) -> Result<(), ConfigError> {
        let same_object = self.identity.is_some() && self.identity == other.identity;
        if !overlaps(self.label, other.label) && !same_object {
            return Ok(());
        }
        let relation = if same_object || self.label == other.label {
            "is the same as"
        } else if self.label.starts_with(other.label) {
            "lies inside"
        } else {
            "contains"
        };
        Err(field(
            self.field,
            format!(
                "{} {} {relation} {} {} ({}); they must not overlap",
                self.what,
                self.label.display(),
                other.what,
                other.label.display(),
                other.field
            ),
        ))
    }
}

/// Everything resolution needs besides the document.
pub struct Inputs<'a> {
    pub host: &'a HostEnvironment,
    pub source: ConfigSource,
    pub workspace: &'a Path,
    pub profile: &'a ProfileName,
    pub layout: SandboxLayoutV1,
    pub env_values: super::EnvValues,
}

/// The option that names the Runtime Root.
const RUNTIME_FIELD: &str = "XDG_RUNTIME_DIR";

/// Resolves the selected profile of `decoded`, in the order the module
/// describes: the workspace, the roots, the volume sources and
/// executables, every comparison, the reopening, then the environment and
/// the fingerprinted record.
pub fn resolve(
    decoded: DecodedConfiguration,
    inputs: Inputs<'_>,
) -> Result<ResolvedDomainConfiguration, ConfigError> {
    let Inputs {
        host,
        source,
        workspace,
        profile: profile_name,
        layout,
        env_values,
    } = inputs;
    let config = &decoded.document;
    let profile = select_profile(config, profile_name, source.plan.canonical_label())?;
    let here = format!("profiles.{profile_name}");

    // The workspace: an existing directory, retained, named canonically.
    let workspace = RetainedDir::open_ambient(workspace).map_err(at("workspace"))?;
    let domain_id = domain_id(profile_name, workspace.label().as_os_str().as_bytes())
        .map_err(|e| field("workspace", e.to_string()))?;
    let config_label = source.plan.canonical_label().to_path_buf();
    let fixed = FixedAreas {
        config: Area {
            field: "--config",
            what: "the configuration file",
            label: &config_label,
            identity: None,
        },
        workspace: Area {
            field: "workspace",
            what: "the workspace",
            label: workspace.label(),
            identity: Some(workspace.identity()),
        },
    };
    let roots = Roots::open(host, config, &fixed, profile_name, &domain_id)?;

    let volumes = resolve_volumes(&here, profile, host, &roots.profile_dir)?;
    let volume_fields = volume_fields(&here, volumes.len());
    let volume_areas = volume_areas(&volumes, &volume_fields);
    check_volume_overlaps(&volume_areas, &fixed, &roots)?;
    let executables = resolve_executables(&here, profile, host, &fixed, &roots, &volume_areas)?;

    // Every plan is reopened after the comparisons: nothing may have moved.
    roots.revalidate(&workspace)?;
    reopen_config(&source, &config_label)?;
    reopen_sources(&here, host.uid, &volumes, &volume_fields, &executables)?;

    // Only now: the host values that `env:` references name.
    // (With `EnvValues::Skip`, none is read and the environment is empty.)
    let (environment, credentials) = match env_values {
        super::EnvValues::Read => (
            read_environment(&here, profile, host)?,
            read_credentials(&here, &decoded.name_policy(profile_name).credentials, host)?,
        ),
        super::EnvValues::Skip => (Vec::new(), Vec::new()),
    };

    let (record, network) = record_and_policy(
        &decoded,
        profile_name,
        profile,
        &here,
        &roots,
        &volumes,
        &executables,
    )?;
    let fingerprint = record
        .fingerprint()
        .map_err(|e| field(&here, e.to_string()))?;

    Ok(ResolvedDomainConfiguration {
        profile: profile_name.clone(),
        domain_id,
        fingerprint,
        record,
        network,
        environment,
        credentials,
        authorities: ConfinedAuthorities {
            config_file: source.plan,
            config_fd: source.fd,
            workspace,
            storage_root: roots.storage,
            runtime_root: roots.runtime,
            profile_dir: roots.profile_dir,
            domain_storage: roots.domain_storage,
            domain_runtime: roots.domain_runtime,
            volumes,
            executables,
        },
        layout,
    })
}

/// The profile `name` of `config`, or the error that lists the profiles
/// the file at `config_label` defines.
fn select_profile<'c>(
    config: &'c TrustedHostConfigurationV1,
    name: &ProfileName,
    config_label: &Path,
) -> Result<&'c ProfileV1, ConfigError> {
    config.profiles.get(name).ok_or_else(|| {
        let available: Vec<&str> = config.profiles.keys().map(ProfileName::as_str).collect();
        ConfigError::UnknownProfile {
            profile: name.as_str().to_owned(),
            config: label(config_label),
            available: available.join(", "),
        }
    })
}

/// The two trees fixed before any root is created: the configuration file
/// and the workspace.
struct FixedAreas<'a> {
    config: Area<'a>,
    workspace: Area<'a>,
}

/// Refuses any overlap among the configuration file, the workspace, the
/// Storage Root at `storage` (chosen by `storage_field`) and the Runtime
/// Root at `runtime`; the roots are compared by name alone, since they may
/// not exist yet.
fn check_roots(
    fixed: &FixedAreas<'_>,
    storage_field: &str,
    storage: &Path,
    runtime: &Path,
) -> Result<(), ConfigError> {
    let storage_area = Area {
        field: storage_field,
        what: "the Storage Root",
        label: storage,
        identity: None,
    };
    let runtime_area = Area {
        field: RUNTIME_FIELD,
        what: "the Runtime Root",
        label: runtime,
        identity: None,
    };
    fixed.config.disjoint_from(&fixed.workspace)?;
    fixed.config.disjoint_from(&storage_area)?;
    fixed.config.disjoint_from(&runtime_area)?;
    storage_area.disjoint_from(&fixed.workspace)?;
    runtime_area.disjoint_from(&fixed.workspace)?;
    storage_area.disjoint_from(&runtime_area)
}

/// The field that chose the Storage Root: `storage.data_root` when the
/// document sets it, else the host variables it defaults from.
fn storage_field(config: &TrustedHostConfigurationV1) -> &'static str {
    if config.storage.data_root.is_some() {
        "storage.data_root"
    } else {
        "Storage Root ($XDG_DATA_HOME or $HOME)"
    }
}

/// The Lazaret roots and the selected Domain's directories beneath them,
/// created, owned by the invoking user and retained.
struct Roots {
    /// The field or variables that chose the Storage Root.
    storage_field: &'static str,
    storage: RetainedDir,
    runtime: RetainedDir,
    /// `profiles/<profile>` beneath the Storage Root.
    profile_dir: RetainedDir,
    /// `domains/<domain id>` beneath the Storage Root.
    domain_storage: RetainedDir,
    /// `domains/<domain id>` beneath the Runtime Root.
    domain_runtime: RetainedDir,
}

impl Roots {
    /// Compares the roots' planned canonical names with `fixed` before
    /// anything is created inside them, creates them, compares again under
    /// the names they were created with, then creates the profile's and
    /// the Domain's directories.
    fn open(
        host: &HostEnvironment,
        config: &TrustedHostConfigurationV1,
        fixed: &FixedAreas<'_>,
        profile_name: &ProfileName,
        domain_id: &DomainId,
    ) -> Result<Self, ConfigError> {
        let uid = host.uid;
        let storage_field = storage_field(config);
        let storage_path = host.storage_root(config.storage.data_root.as_ref())?;
        let runtime_path = host.runtime_root()?;
        let storage_planned = planned_canonical(&storage_path).map_err(at(storage_field))?;
        let runtime_planned = planned_canonical(&runtime_path).map_err(at(RUNTIME_FIELD))?;
        check_roots(fixed, storage_field, &storage_planned, &runtime_planned)?;

        let storage = ensure_root(&storage_path, uid).map_err(at(storage_field))?;
        let runtime = ensure_root(&runtime_path, uid).map_err(at(RUNTIME_FIELD))?;
        check_roots(fixed, storage_field, storage.label(), runtime.label())?;
        let profile_dir = storage
            .ensure_child(&Path::new("profiles").join(profile_name.as_str()), uid)
            .map_err(at(storage_field))?;
        let domains = Path::new(super::DOMAINS_DIR).join(domain_id.to_hex());
        let domain_storage = storage
            .ensure_child(&domains, uid)
            .map_err(at(storage_field))?;
        let domain_runtime = runtime
            .ensure_child(&domains, uid)
            .map_err(at(RUNTIME_FIELD))?;
        Ok(Self {
            storage_field,
            storage,
            runtime,
            profile_dir,
            domain_storage,
            domain_runtime,
        })
    }

    fn storage_area(&self) -> Area<'_> {
        Area {
            field: self.storage_field,
            what: "the Storage Root",
            label: self.storage.label(),
            identity: Some(self.storage.identity()),
        }
    }

    fn runtime_area(&self) -> Area<'_> {
        Area {
            field: RUNTIME_FIELD,
            what: "the Runtime Root",
            label: self.runtime.label(),
            identity: Some(self.runtime.identity()),
        }
    }

    fn profile_area(&self) -> Area<'_> {
        Area {
            field: "the profile directory",
            what: "the profile directory",
            label: self.profile_dir.label(),
            identity: Some(self.profile_dir.identity()),
        }
    }

    /// Reopens the workspace and both roots: each must be the object
    /// retained at first.
    fn revalidate(&self, workspace: &RetainedDir) -> Result<(), ConfigError> {
        workspace.revalidate().map_err(at("workspace"))?;
        self.storage.revalidate().map_err(at(self.storage_field))?;
        self.runtime.revalidate().map_err(at(RUNTIME_FIELD))
    }
}

/// The profile's volume sources, opened in declared order.
fn resolve_volumes(
    here: &str,
    profile: &ProfileV1,
    host: &HostEnvironment,
    profile_dir: &RetainedDir,
) -> Result<Vec<ResolvedVolumeSource>, ConfigError> {
    profile
        .volumes
        .iter()
        .enumerate()
        .map(|(i, volume)| {
            resolve_volume(
                &format!("{here}.volumes[{i}].host"),
                volume,
                host,
                profile_dir,
            )
        })
        .collect()
}

/// The field path of each of `count` volume sources of profile `here`.
fn volume_fields(here: &str, count: usize) -> Vec<String> {
    (0..count)
        .map(|i| format!("{here}.volumes[{i}].host"))
        .collect()
}

/// Each volume source as an [`Area`] named by its field.
fn volume_areas<'a>(volumes: &'a [ResolvedVolumeSource], fields: &'a [String]) -> Vec<Area<'a>> {
    volumes
        .iter()
        .zip(fields)
        .map(|(v, f)| Area {
            field: f,
            what: "the volume source",
            label: v.plan.canonical_label(),
            identity: Some(v.opened.identity),
        })
        .collect()
}

/// Refuses a volume source that overlaps the configuration file, the
/// workspace, the Runtime Root, an earlier volume source, or the Storage
/// Root anywhere but strictly beneath the profile directory.
fn check_volume_overlaps(
    volumes: &[Area<'_>],
    fixed: &FixedAreas<'_>,
    roots: &Roots,
) -> Result<(), ConfigError> {
    let storage_area = roots.storage_area();
    let runtime_area = roots.runtime_area();
    let profile_dir = roots.profile_dir.label();
    for (i, area) in volumes.iter().enumerate() {
        area.disjoint_from(&fixed.config)?;
        area.disjoint_from(&fixed.workspace)?;
        area.disjoint_from(&runtime_area)?;
        let under_profile_dir = area.label.starts_with(profile_dir) && area.label != profile_dir;
        if !under_profile_dir {
            area.disjoint_from(&storage_area)?;
        }
        for earlier in &volumes[..i] {
            area.disjoint_from(earlier)?;
        }
    }
    Ok(())
}

/// The profile's auto-approval executables, resolved in declared order;
/// each must lie outside every tree the sandbox can write and every
/// Lazaret tree, and no two rules may be the same once resolved.
fn resolve_executables(
    here: &str,
    profile: &ProfileV1,
    host: &HostEnvironment,
    fixed: &FixedAreas<'_>,
    roots: &Roots,
    volumes: &[Area<'_>],
) -> Result<Vec<ResolvedExecutable>, ConfigError> {
    let (profile_area, storage_area, runtime_area) = (
        roots.profile_area(),
        roots.storage_area(),
        roots.runtime_area(),
    );
    let forbidden: Vec<&Area<'_>> = [
        &fixed.workspace,
        &profile_area,
        &storage_area,
        &runtime_area,
    ]
    .into_iter()
    .chain(volumes)
    .collect();
    let mut executables: Vec<ResolvedExecutable> = Vec::new();
    for (i, rule) in profile.escalation.auto_approve.iter().enumerate() {
        let rule_field = format!("{here}.escalation.auto_approve[{i}]");
        let exe_field = format!("{rule_field}.executable");
        let resolved = resolve_executable(&exe_field, rule, host)?;
        refuse_inside(&exe_field, resolved.plan.canonical_label(), &forbidden)?;
        if executables.iter().any(|e| e.rule == resolved.rule) {
            return Err(field(
                rule_field,
                "duplicates an earlier rule once its executable is resolved",
            ));
        }
        executables.push(resolved);
    }
    Ok(executables)
}

/// Refuses the executable at `executable` (chosen by `exe_field`) when it
/// lies inside, contains or is one of the `forbidden` trees; the first
/// such tree names the error.
fn refuse_inside(
    exe_field: &str,
    executable: &Path,
    forbidden: &[&Area<'_>],
) -> Result<(), ConfigError> {
    match forbidden
        .iter()
        .find(|tree| overlaps(executable, tree.label))
    {
        None => Ok(()),
        Some(tree) => Err(field(
            exe_field,
            format!(
                "{} lies inside {} {}; an auto-approved executable must live outside \
                 everything the sandbox can write and every Lazaret tree",
                executable.display(),
                tree.what,
                tree.label.display()
            ),
        )),
    }
}

/// Reopens the configuration file through its plan: it must be the object
/// the source was read from.
fn reopen_config(source: &ConfigSource, config_label: &Path) -> Result<(), ConfigError> {
    let config_again = source
        .plan
        .open_as(FileType::RegularFile)
        .map_err(at("--config"))?;
    let config_identity = identity(source.fd.as_fd(), config_label).map_err(at("--config"))?;
    if config_again.identity != config_identity {
        return Err(ConfigError::Path {
            field: "--config".into(),
            source: ConfinedError::Replaced {
                label: label(config_label),
            },
        });
    }
    Ok(())
}

/// Reopens every volume source and executable through its plan, requiring
/// the same object, and checks each executable again.
fn reopen_sources(
    here: &str,
    uid: u32,
    volumes: &[ResolvedVolumeSource],
    volume_fields: &[String],
    executables: &[ResolvedExecutable],
) -> Result<(), ConfigError> {
    for (v, f) in volumes.iter().zip(volume_fields) {
        reopen_same(&v.plan, &v.opened, f)?;
    }
    for (e, i) in executables.iter().zip(0..) {
        let f = format!("{here}.escalation.auto_approve[{i}].executable");
        reopen_same(&e.plan, &e.opened, &f)?;
        check_executable(e.plan.canonical_label(), &e.opened, uid).map_err(executable_at(&f))?;
    }
    Ok(())
}

/// The sandbox environment of profile `here`: each `env:` reference's
/// host value, which must be set, UTF-8 and free of NUL.
fn read_environment(
    here: &str,
    profile: &ProfileV1,
    host: &HostEnvironment,
) -> Result<Vec<(EnvName, SecretValue)>, ConfigError> {
    let mut environment = Vec::with_capacity(profile.env.len());
    for (name, reference) in &profile.env {
        let env_field = format!("{here}.env.{name}");
        let value = host_value(&env_field, host, reference.host_name().as_str())?;
        environment.push((name.clone(), SecretValue::new(value)));
    }
    Ok(environment)
}

/// The credentials of profile `here` with their real values: each entry's
/// `env:` reference must name a host variable that is set, UTF-8 and free
/// of NUL, as an `env` entry's must.
fn read_credentials(
    here: &str,
    credentials: &[CredentialV2],
    host: &HostEnvironment,
) -> Result<Vec<ResolvedCredential>, ConfigError> {
    credentials
        .iter()
        .enumerate()
        .map(|(i, credential)| {
            let at = format!("{here}.credentials[{i}].value");
            let value = host_value(&at, host, credential.value.host_name().as_str())?;
            Ok(ResolvedCredential {
                env: credential.env.clone(),
                value: SecretValue::new(value),
                hosts: credential.hosts.clone(),
            })
        })
        .collect()
}

/// The value of host variable `host_name`, for the reference at
/// `env_field`.
fn host_value(
    env_field: &str,
    host: &HostEnvironment,
    host_name: &str,
) -> Result<String, ConfigError> {
    let value = host.variable(host_name).ok_or_else(|| {
        field(
            env_field,
            format!("host variable {host_name} is not set; export it before starting Lazaret"),
        )
    })?;
    let value = value.into_string().map_err(|_| {
        field(
            env_field,
            format!("host variable {host_name} is not valid UTF-8"),
        )
    })?;
    if value.contains('\0') {
        return Err(field(
            env_field,
            format!("host variable {host_name} contains NUL"),
        ));
    }
    Ok(value)
}

/// The fingerprinted record of the document's schema, and the profile's
/// effective egress policy.
fn record_and_policy(
    decoded: &DecodedConfiguration,
    profile_name: &ProfileName,
    profile: &ProfileV1,
    here: &str,
    roots: &Roots,
    volumes: &[ResolvedVolumeSource],
    executables: &[ResolvedExecutable],
) -> Result<(ConfigurationRecord, EffectiveNetworkPolicy), ConfigError> {
    let config = &decoded.document;
    let (global_allow, global_deny) = global_prefixes(config);
    let (allow, deny) = effective_prefixes(here, profile, &global_allow, &global_deny)?;
    let base = fingerprint_record(
        profile_name,
        profile,
        &roots.storage,
        &roots.runtime,
        volumes,
        executables,
        (&allow, &deny),
    );
    let names = decoded.name_policy(profile_name);
    let mut hosts = names.allow_hosts;
    hosts.sort();
    hosts.dedup();
    let record = match decoded.schema {
        ConfigSchema::V1 => ConfigurationRecord::V1(base),
        ConfigSchema::V2 => ConfigurationRecord::V2(ConfigurationFingerprintRecordV2 {
            base,
            allow_hosts: hosts.clone(),
            dns: names.dns,
            credentials: credential_entries(&names.credentials),
        }),
    };
    let network = EffectiveNetworkPolicy {
        allow,
        deny,
        hosts,
        dns: names.dns,
    };
    Ok((record, network))
}

/// The credential entries as the fingerprint covers them, sorted by
/// variable: never their values.
fn credential_entries(credentials: &[CredentialV2]) -> Vec<CredentialEntry> {
    let mut entries: Vec<CredentialEntry> = credentials
        .iter()
        .map(|c| {
            let mut hosts = c.hosts.clone();
            hosts.sort();
            hosts.dedup();
            CredentialEntry {
                sandbox_name: c.env.as_str().to_owned(),
                host_name: c.value.host_name().as_str().to_owned(),
                hosts,
            }
        })
        .collect();
    entries.sort();
    entries
}

fn fingerprint_record(
    profile_name: &ProfileName,
    profile: &ProfileV1,
    storage_root: &RetainedDir,
    runtime_root: &RetainedDir,
    volumes: &[ResolvedVolumeSource],
    executables: &[ResolvedExecutable],
    (allow, deny): (
        &[lazaret_proto::config::Ipv4Prefix],
        &[lazaret_proto::config::Ipv4Prefix],
    ),
) -> ConfigurationFingerprintRecordV1 {
    let bytes = |p: &Path| p.as_os_str().as_bytes().to_vec();
    ConfigurationFingerprintRecordV1 {
        selected_profile: profile_name.as_str().to_owned(),
        storage_root: bytes(storage_root.label()),
        runtime_root: bytes(runtime_root.label()),
        image: profile.image.as_str().to_owned(),
        isolate_gitignored: profile.isolate_gitignored,
        persistent_dirs: profile
            .persistent_dirs
            .iter()
            .map(|p| p.as_str().to_owned())
            .collect(),
        environment_references: profile
            .env
            .iter()
            .map(|(name, reference)| EnvironmentReference {
                sandbox_name: name.as_str().to_owned(),
                host_name: reference.host_name().as_str().to_owned(),
            })
            .collect(),
        volumes: volumes.iter().map(|v| v.volume.clone()).collect(),
        effective_allow_prefixes: allow.to_vec(),
        effective_deny_prefixes: deny.to_vec(),
        escalation_enabled: profile.escalation.enabled,
        auto_approval_rules: executables.iter().map(|e| e.rule.clone()).collect(),
    }
}

/// Reopens a plan and requires the same object.
fn reopen_same(
    plan: &ConfinedPathPlan,
    opened: &Opened,
    field_name: &str,
) -> Result<(), ConfigError> {
    let expected = FileType::from_raw_mode(opened.stat.st_mode);
    let again = plan.open_as(expected).map_err(at(field_name))?;
    if again.identity != opened.identity {
        return Err(ConfigError::Path {
            field: field_name.to_owned(),
            source: ConfinedError::Replaced {
                label: label(plan.canonical_label()),
            },
        });
    }
    Ok(())
}

fn resolve_volume(
    field_name: &str,
    volume: &VolumeV1,
    host: &HostEnvironment,
    profile_dir: &RetainedDir,
) -> Result<ResolvedVolumeSource, ConfigError> {
    let expected = match volume.kind {
        VolumeKind::File => FileType::RegularFile,
        VolumeKind::Directory => FileType::Directory,
    };
    let declared = match volume.host.anchor() {
        HostAnchor::ProfileDir => None,
        HostAnchor::Root | HostAnchor::Home => Some(host.expand(&volume.host, field_name)?),
    };
    let open = || -> Result<(ConfinedPathPlan, Opened), ConfinedError> {
        let plan = match &declared {
            None => {
                let suffix = Path::new(volume.host.suffix());
                if volume.create {
                    profile_dir.ensure_child(suffix, host.uid)?;
                }
                ConfinedPathPlan::beneath(profile_dir, suffix)?
            }
            Some(declared) => {
                let parent = declared.parent().unwrap_or(Path::new("/"));
                let name = declared.file_name().unwrap_or_default();
                let canonical_parent = canonicalize(parent).map_err(|e| match e {
                    ConfinedError::Missing { .. } => ConfinedError::Missing {
                        label: label(declared),
                    },
                    other => other,
                })?;
                ConfinedPathPlan::for_canonical(&canonical_parent.join(name))?
            }
        };
        let opened = plan.open_as(expected)?;
        Ok((plan, opened))
    };
    let (plan, opened) = open().map_err(|e| match e {
        ConfinedError::Missing { label } => field(
            field_name,
            format!(
                "{label} does not exist; create it, or for a directory beneath \
                 `{{profile_dir}}/` set create = true"
            ),
        ),
        other => at(field_name)(other),
    })?;
    let volume = ResolvedVolume {
        canonical_host_source: plan.canonical_label().as_os_str().as_bytes().to_vec(),
        container_path: volume.container.as_str().to_owned(),
        kind: volume.kind,
        access: volume.access,
        create: volume.create,
    };
    Ok(ResolvedVolumeSource {
        plan,
        opened,
        volume,
    })
}

fn resolve_executable(
    field_name: &str,
    rule: &AutoApprovalRuleV1,
    host: &HostEnvironment,
) -> Result<ResolvedExecutable, ConfigError> {
    let declared: PathBuf = host.expand(&rule.executable, field_name)?;
    let canonical = canonicalize(&declared).map_err(at(field_name))?;
    let plan = ConfinedPathPlan::for_canonical(&canonical).map_err(at(field_name))?;
    let opened = plan
        .open_as(FileType::RegularFile)
        .map_err(at(field_name))?;
    check_executable(plan.canonical_label(), &opened, host.uid)
        .map_err(executable_at(field_name))?;
    let rule = ResolvedAutoApprovalRule {
        canonical_executable: canonical.as_os_str().as_bytes().to_vec(),
        args: rule.args.iter().map(|a| a.as_str().to_owned()).collect(),
        allow_extra_args: rule.allow_extra_args,
    };
    Ok(ResolvedExecutable { plan, opened, rule })
}

/// Why a host command's executable fails the checks it passes at load
/// and before every execution.
#[derive(Debug, thiserror::Error)]
pub enum ExecutableError {
    /// The opened executable could not be examined.
    #[error(transparent)]
    Stat(#[from] ConfinedError),
    /// It has more than one name.
    #[error(
        "{path} has {links} hard links; a host command's executable must have exactly one \
         (copy it instead of linking)"
    )]
    HardLinks {
        /// The executable's display name.
        path: String,
        /// Its link count.
        links: u64,
    },
    /// It belongs to neither root nor the invoking user.
    #[error(
        "{path} is owned by uid {owner}; a host command's executable must be owned by you \
         (uid {uid}) or root"
    )]
    Owner {
        /// The executable's display name.
        path: String,
        /// Its owner.
        owner: u32,
        /// The invoking user.
        uid: u32,
    },
    /// Its group or others may write it.
    #[error("{path} is writable by its group or others (mode {mode:04o}); run `chmod go-w {path}`")]
    Writable {
        /// The executable's display name.
        path: String,
        /// Its permission bits.
        mode: u32,
    },
    /// The invoking user may not execute it.
    #[error("{path} is not executable by you (mode {mode:04o})")]
    NotExecutable {
        /// The executable's display name.
        path: String,
        /// Its permission bits.
        mode: u32,
    },
}

/// Maps a failed executable check to the field that chose the executable.
fn executable_at(field_name: &str) -> impl Fn(ExecutableError) -> ConfigError + '_ {
    move |source| ConfigError::Executable {
        field: field_name.to_owned(),
        source,
    }
}

/// The checks a host command's executable (a rule's, or one the developer
/// approved) passes at load and before every execution: one hard link,
/// owned by root or the invoking user, no group or other write, executable
/// by the invoking user. `label` names it in the messages.
pub fn check_executable(label: &Path, opened: &Opened, uid: u32) -> Result<(), ExecutableError> {
    let path = label.display().to_string();
    let now: Stat = stat(opened.fd.as_fd(), label)?;
    if now.st_nlink != 1 {
        return Err(ExecutableError::HardLinks {
            path,
            links: now.st_nlink,
        });
    }
    if now.st_uid != 0 && now.st_uid != uid {
        return Err(ExecutableError::Owner {
            path,
            owner: now.st_uid,
            uid,
        });
    }
    let mode = now.st_mode & 0o7777;
    if mode & 0o022 != 0 {
        return Err(ExecutableError::Writable { path, mode });
    }
    // Asked of the opened object through its descriptor's magic link:
    // `faccessat2(2)` has no `AT_EMPTY_PATH` in rustix's raw backend (it
    // refuses the flag with EINVAL), so that form refused every executable.
    let fd_path = proc_self_fd(opened.fd.as_fd());
    rustix::fs::accessat(
        rustix::fs::CWD,
        fd_path.as_str(),
        Access::EXEC_OK,
        AtFlags::EACCESS,
    )
    .map_err(|_| ExecutableError::NotExecutable { path, mode })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    /// The field and rule of a [`ConfigError::Field`].
    #[track_caller]
    fn field_error(result: Result<(), ConfigError>) -> (String, String) {
        match result {
            Err(ConfigError::Field { field, rule }) => (field, rule),
            other => panic!("expected a field error: {other:?}"),
        }
    }

    fn area<'a>(field: &'a str, what: &'a str, label: &'a str) -> Area<'a> {
        Area {
            field,
            what,
            label: Path::new(label),
            identity: None,
        }
    }

    #[test]
    fn overlapping_trees_are_refused_naming_the_first_field_and_the_relation() {
        let volume = area("profiles.p.volumes[0].host", "the volume source", "/w/src");
        let workspace = area("workspace", "the workspace", "/w");
        let sibling = area("profiles.p.volumes[1].host", "the volume source", "/w2");
        assert!(volume.disjoint_from(&sibling).is_ok());
        let (field, rule) = field_error(volume.disjoint_from(&workspace));
        assert_eq!(field, "profiles.p.volumes[0].host");
        assert_eq!(
            rule,
            "the volume source /w/src lies inside the workspace /w (workspace); they must not \
             overlap"
        );
        let (field, rule) = field_error(workspace.disjoint_from(&volume));
        assert_eq!(field, "workspace");
        assert!(
            rule.contains("/w contains the volume source /w/src"),
            "{rule}"
        );
        let (_, rule) = field_error(workspace.disjoint_from(&workspace));
        assert!(rule.contains("is the same as"), "{rule}");
    }

    #[test]
    fn one_object_under_two_names_is_the_same_tree() {
        let identity = Some(ObjectIdentity {
            device: 1,
            inode: 2,
            mount_id: 3,
        });
        let a = Area {
            identity,
            ..area("profiles.p.volumes[0].host", "the volume source", "/a")
        };
        let b = Area {
            identity,
            ..area("profiles.p.volumes[1].host", "the volume source", "/b")
        };
        let (field, rule) = field_error(b.disjoint_from(&a));
        assert_eq!(field, "profiles.p.volumes[1].host");
        assert!(
            rule.contains("/b is the same as the volume source /a"),
            "{rule}"
        );
        // Unknown identities never compare equal.
        let (c, d) = (area("x", "x", "/c"), area("y", "y", "/d"));
        assert!(c.disjoint_from(&d).is_ok());
    }

    #[test]
    fn roots_overlapping_the_workspace_or_each_other_name_their_field() {
        let fixed = FixedAreas {
            config: area(
                "--config",
                "the configuration file",
                "/home/u/.config/l.toml",
            ),
            workspace: area("workspace", "the workspace", "/home/u/w"),
        };
        let storage = "storage.data_root";
        let ok = check_roots(&fixed, storage, Path::new("/home/u/s"), Path::new("/run/u"));
        assert!(ok.is_ok());
        let (field, rule) = field_error(check_roots(
            &fixed,
            storage,
            Path::new("/home/u/w/.state"),
            Path::new("/run/u"),
        ));
        assert_eq!(field, storage);
        assert!(
            rule.contains("the Storage Root /home/u/w/.state lies inside"),
            "{rule}"
        );
        let (field, rule) = field_error(check_roots(
            &fixed,
            storage,
            Path::new("/srv/l"),
            Path::new("/srv/l/run"),
        ));
        assert_eq!(field, storage);
        assert!(rule.contains("contains the Runtime Root /srv/l/run (XDG_RUNTIME_DIR)"));
        // A configuration file inside a root is named as `--config`.
        let (field, _) = field_error(check_roots(
            &fixed,
            storage,
            Path::new("/home/u/.config"),
            Path::new("/run/u"),
        ));
        assert_eq!(field, "--config");
    }

    #[test]
    fn an_executable_inside_a_forbidden_tree_names_the_first_one() {
        let workspace = area("workspace", "the workspace", "/w");
        let volume = area("profiles.p.volumes[0].host", "the volume source", "/v");
        let forbidden = [&workspace, &volume];
        let exe_field = "profiles.p.escalation.auto_approve[0].executable";
        assert!(refuse_inside(exe_field, Path::new("/usr/bin/gh"), &forbidden).is_ok());
        let (field, rule) = field_error(refuse_inside(
            exe_field,
            Path::new("/v/bin/tool"),
            &forbidden,
        ));
        assert_eq!(field, exe_field);
        assert!(
            rule.starts_with("/v/bin/tool lies inside the volume source /v; an auto-approved"),
            "{rule}"
        );
        // A tree named first wins when two hold it.
        let nested = area("profiles.p.volumes[1].host", "the volume source", "/w/v");
        let (_, rule) = field_error(refuse_inside(
            exe_field,
            Path::new("/w/v/tool"),
            &[&nested, &workspace],
        ));
        assert!(rule.contains("inside the volume source /w/v;"), "{rule}");
    }

    #[test]
    fn environment_values_must_be_set_utf8_and_free_of_nul() {
        use std::os::unix::ffi::OsStringExt;
        let host = HostEnvironment::from_vars(
            1000,
            [
                ("TOKEN", std::ffi::OsString::from("s3cret")),
                ("BYTES", std::ffi::OsString::from_vec(b"\xff".to_vec())),
                ("NUL", std::ffi::OsString::from("a\0b")),
            ],
        );
        let at = "profiles.p.env.T";
        assert_eq!(host_value(at, &host, "TOKEN").unwrap(), "s3cret");
        let refused = |name| field_error(host_value(at, &host, name).map(|_| ()));
        assert_eq!(
            refused("UNSET"),
            (
                at.to_owned(),
                "host variable UNSET is not set; export it before starting Lazaret".to_owned()
            )
        );
        assert_eq!(refused("BYTES").1, "host variable BYTES is not valid UTF-8");
        assert_eq!(refused("NUL").1, "host variable NUL contains NUL");
    }

    #[test]
    fn the_environment_is_read_in_name_order_and_the_first_failure_named() {
        let decoded = crate::config::decode_document(
            b"schema = \"lazaret-trusted-host-config-v1\"\n[profiles.p]\nimage = \"x\"\n\
              env = { B = 'env:HOST_B', A = 'env:HOST_A' }\n",
        )
        .unwrap();
        let profile = &decoded.profiles[&ProfileName::parse("p").unwrap()];
        let host = HostEnvironment::from_vars(1000, [("HOST_A", "1"), ("HOST_B", "2")]);
        let environment = read_environment("profiles.p", profile, &host).unwrap();
        let shown: Vec<(&str, &str)> = environment
            .iter()
            .map(|(name, value)| (name.as_str(), value.expose()))
            .collect();
        assert_eq!(shown, [("A", "1"), ("B", "2")]);
        let host = HostEnvironment::from_vars(1000, [("HOST_A", "1")]);
        let Err(ConfigError::Field { field, .. }) = read_environment("profiles.p", profile, &host)
        else {
            panic!("HOST_B is not set");
        };
        assert_eq!(field, "profiles.p.env.B");
    }

    #[test]
    fn an_unknown_profile_lists_those_defined() {
        let decoded = crate::config::decode_document(
            b"schema = \"lazaret-trusted-host-config-v1\"\n[profiles.b]\nimage = \"x\"\n\
              [profiles.a]\nimage = \"y\"\n",
        )
        .unwrap();
        let name = |n| ProfileName::parse(n).unwrap();
        let config = Path::new("/home/u/.config/lazaret/config.toml");
        assert!(select_profile(&decoded, &name("a"), config).is_ok());
        match select_profile(&decoded, &name("c"), config) {
            Err(e @ ConfigError::UnknownProfile { .. }) => assert_eq!(
                e.to_string(),
                "profile `c` is not defined in /home/u/.config/lazaret/config.toml; defined \
                 profiles: a, b"
            ),
            other => panic!("expected an unknown profile: {other:?}"),
        }
        assert_eq!(
            volume_fields("profiles.a", 2),
            ["profiles.a.volumes[0].host", "profiles.a.volumes[1].host"]
        );
    }

    /// A file at `path` with `mode`, opened as a host command's executable.
    fn opened(path: &Path, mode: u32) -> Opened {
        std::fs::write(path, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
        ConfinedPathPlan::for_canonical(path)
            .unwrap()
            .open_as(FileType::RegularFile)
            .unwrap()
    }

    #[test]
    fn executable_checks_fail_with_typed_reasons() {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        let uid = rustix::process::getuid().as_raw();
        let tool = base.join("tool");
        assert!(check_executable(&tool, &opened(&tool, 0o755), uid).is_ok());

        let writable = base.join("writable");
        match check_executable(&writable, &opened(&writable, 0o775), uid) {
            Err(ExecutableError::Writable { path, mode }) => {
                assert_eq!((path, mode), (writable.display().to_string(), 0o775));
            }
            other => panic!("expected Writable: {other:?}"),
        }

        let plain = base.join("plain");
        let error = check_executable(&plain, &opened(&plain, 0o644), uid).unwrap_err();
        assert!(
            matches!(error, ExecutableError::NotExecutable { mode: 0o644, .. }),
            "{error:?}"
        );
        assert_eq!(
            error.to_string(),
            format!("{} is not executable by you (mode 0644)", plain.display())
        );

        let linked = base.join("linked");
        let exe = opened(&linked, 0o755);
        std::fs::hard_link(&linked, base.join("second")).unwrap();
        let error = check_executable(&linked, &exe, uid).unwrap_err();
        assert!(
            matches!(error, ExecutableError::HardLinks { links: 2, .. }),
            "{error:?}"
        );
        // Rendered through the field that chose it, as a load reports it.
        let at = "profiles.p.escalation.auto_approve[0].executable";
        let shown = lazaret_proto::error_chain(&executable_at(at)(error));
        assert!(
            shown.starts_with(&format!("{at}: {} has 2 hard links;", linked.display())),
            "{shown}"
        );
        assert_eq!(
            ExecutableError::Owner {
                path: "/x".into(),
                owner: 5,
                uid: 6
            }
            .to_string(),
            "/x is owned by uid 5; a host command's executable must be owned by you (uid 6) \
             or root"
        );
    }
}
