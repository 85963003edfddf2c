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
    ConfigurationFingerprintRecordV2, ConfigurationRecord, EnvironmentReference, HostAnchor,
    ProfileName, ProfileV1, ResolvedAutoApprovalRule, ResolvedVolume, VolumeKind, VolumeV1,
    domain_id,
};
use lazaret_proto::layout::SandboxLayoutV1;
use rustix::fd::AsFd;
use rustix::fs::{Access, AtFlags, FileType, Stat};

use super::decode::{effective_prefixes, global_prefixes};
use super::hostenv::HostEnvironment;
use super::source::ConfigSource;
use super::{
    ConfigError, ConfinedAuthorities, DecodedConfiguration, EffectiveNetworkPolicy,
    ResolvedDomainConfiguration, ResolvedExecutable, ResolvedVolumeSource, SecretValue, field,
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
    let uid = host.uid;
    let config = &decoded.document;
    let Some(profile) = config.profiles.get(profile_name) else {
        let available: Vec<&str> = config.profiles.keys().map(ProfileName::as_str).collect();
        return Err(ConfigError::UnknownProfile {
            profile: profile_name.as_str().to_owned(),
            config: label(source.plan.canonical_label()),
            available: available.join(", "),
        });
    };
    let here = format!("profiles.{profile_name}");

    // The workspace: an existing directory, retained, named canonically.
    let workspace = RetainedDir::open_ambient(workspace).map_err(at("workspace"))?;
    let domain_id = domain_id(profile_name, workspace.label().as_os_str().as_bytes())
        .map_err(|e| field("workspace", e.to_string()))?;

    // The roots, compared before anything is created inside them.
    let storage_field = if config.storage.data_root.is_some() {
        "storage.data_root"
    } else {
        "Storage Root ($XDG_DATA_HOME or $HOME)"
    };
    let storage_path = host.storage_root(config.storage.data_root.as_ref())?;
    let runtime_path = host.runtime_root()?;
    let storage_planned = planned_canonical(&storage_path).map_err(at(storage_field))?;
    let runtime_planned = planned_canonical(&runtime_path).map_err(at("XDG_RUNTIME_DIR"))?;
    let config_label = source.plan.canonical_label().to_path_buf();
    let workspace_identity = workspace.identity();
    let workspace_area = Area {
        field: "workspace",
        what: "the workspace",
        label: workspace.label(),
        identity: Some(workspace_identity),
    };
    let config_area = Area {
        field: "--config",
        what: "the configuration file",
        label: &config_label,
        identity: None,
    };
    let check_roots = |storage: &Path, runtime: &Path| -> Result<(), ConfigError> {
        let storage_area = Area {
            field: storage_field,
            what: "the Storage Root",
            label: storage,
            identity: None,
        };
        let runtime_area = Area {
            field: "XDG_RUNTIME_DIR",
            what: "the Runtime Root",
            label: runtime,
            identity: None,
        };
        config_area.disjoint_from(&workspace_area)?;
        config_area.disjoint_from(&storage_area)?;
        config_area.disjoint_from(&runtime_area)?;
        storage_area.disjoint_from(&workspace_area)?;
        runtime_area.disjoint_from(&workspace_area)?;
        storage_area.disjoint_from(&runtime_area)
    };
    check_roots(&storage_planned, &runtime_planned)?;

    let storage_root = ensure_root(&storage_path, uid).map_err(at(storage_field))?;
    let runtime_root = ensure_root(&runtime_path, uid).map_err(at("XDG_RUNTIME_DIR"))?;
    check_roots(storage_root.label(), runtime_root.label())?;
    let profile_dir = storage_root
        .ensure_child(&Path::new("profiles").join(profile_name.as_str()), uid)
        .map_err(at(storage_field))?;
    let domains = Path::new(super::DOMAINS_DIR).join(domain_id.to_hex());
    let domain_storage = storage_root
        .ensure_child(&domains, uid)
        .map_err(at(storage_field))?;
    let domain_runtime = runtime_root
        .ensure_child(&domains, uid)
        .map_err(at("XDG_RUNTIME_DIR"))?;

    // Volume sources.
    let mut volumes = Vec::with_capacity(profile.volumes.len());
    for (i, volume) in profile.volumes.iter().enumerate() {
        volumes.push(resolve_volume(
            &format!("{here}.volumes[{i}].host"),
            volume,
            host,
            &profile_dir,
        )?);
    }
    let volume_fields: Vec<String> = (0..volumes.len())
        .map(|i| format!("{here}.volumes[{i}].host"))
        .collect();
    let volume_areas: Vec<Area<'_>> = volumes
        .iter()
        .zip(&volume_fields)
        .map(|(v, f)| Area {
            field: f,
            what: "the volume source",
            label: v.plan.canonical_label(),
            identity: Some(v.opened.identity),
        })
        .collect();
    let storage_area = Area {
        field: storage_field,
        what: "the Storage Root",
        label: storage_root.label(),
        identity: Some(storage_root.identity()),
    };
    let runtime_area = Area {
        field: "XDG_RUNTIME_DIR",
        what: "the Runtime Root",
        label: runtime_root.label(),
        identity: Some(runtime_root.identity()),
    };
    for (i, area) in volume_areas.iter().enumerate() {
        area.disjoint_from(&config_area)?;
        area.disjoint_from(&workspace_area)?;
        area.disjoint_from(&runtime_area)?;
        let under_profile_dir =
            area.label.starts_with(profile_dir.label()) && area.label != profile_dir.label();
        if !under_profile_dir {
            area.disjoint_from(&storage_area)?;
        }
        for earlier in &volume_areas[..i] {
            area.disjoint_from(earlier)?;
        }
    }

    // Auto-approval executables.
    let profile_area = Area {
        field: "the profile directory",
        what: "the profile directory",
        label: profile_dir.label(),
        identity: Some(profile_dir.identity()),
    };
    let mut executables: Vec<ResolvedExecutable> = Vec::new();
    for (i, rule) in profile.escalation.auto_approve.iter().enumerate() {
        let rule_field = format!("{here}.escalation.auto_approve[{i}]");
        let exe_field = format!("{rule_field}.executable");
        let resolved = resolve_executable(&exe_field, rule, host)?;
        let exe_area = Area {
            field: &exe_field,
            what: "the executable",
            label: resolved.plan.canonical_label(),
            identity: None,
        };
        for forbidden in [&workspace_area, &profile_area, &storage_area, &runtime_area]
            .into_iter()
            .chain(&volume_areas)
        {
            if overlaps(exe_area.label, forbidden.label) {
                return Err(field(
                    &exe_field,
                    format!(
                        "{} lies inside {} {}; an auto-approved executable must live outside \
                         everything the sandbox can write and every Lazaret tree",
                        exe_area.label.display(),
                        forbidden.what,
                        forbidden.label.display()
                    ),
                ));
            }
        }
        if executables.iter().any(|e| e.rule == resolved.rule) {
            return Err(field(
                rule_field,
                "duplicates an earlier rule once its executable is resolved",
            ));
        }
        executables.push(resolved);
    }

    // Every plan is reopened after the comparisons: nothing may have moved.
    workspace.revalidate().map_err(at("workspace"))?;
    storage_root.revalidate().map_err(at(storage_field))?;
    runtime_root.revalidate().map_err(at("XDG_RUNTIME_DIR"))?;
    let config_again = source
        .plan
        .open_as(FileType::RegularFile)
        .map_err(at("--config"))?;
    let config_identity = identity(source.fd.as_fd(), &config_label).map_err(at("--config"))?;
    if config_again.identity != config_identity {
        return Err(ConfigError::Path {
            field: "--config".into(),
            source: ConfinedError::Replaced {
                label: label(&config_label),
            },
        });
    }
    for (v, f) in volumes.iter().zip(&volume_fields) {
        reopen_same(&v.plan, &v.opened, f)?;
    }
    for (e, i) in executables.iter().zip(0..) {
        let f = format!("{here}.escalation.auto_approve[{i}].executable");
        reopen_same(&e.plan, &e.opened, &f)?;
        check_executable(e.plan.canonical_label(), &e.opened, uid)
            .map_err(|rule| field(&f, rule))?;
    }

    // Only now: the host values that `env:` references name.
    // (With `EnvValues::Skip`, none is read and the environment is empty.)
    let mut environment = Vec::with_capacity(profile.env.len());
    let read = env_values == super::EnvValues::Read;
    for (name, reference) in profile.env.iter().filter(|_| read) {
        let env_field = format!("{here}.env.{name}");
        let host_name = reference.host_name().as_str();
        let value = host.variable(host_name).ok_or_else(|| {
            field(
                &env_field,
                format!("host variable {host_name} is not set; export it before starting Lazaret"),
            )
        })?;
        let value = value.into_string().map_err(|_| {
            field(
                &env_field,
                format!("host variable {host_name} is not valid UTF-8"),
            )
        })?;
        if value.contains('\0') {
            return Err(field(
                &env_field,
                format!("host variable {host_name} contains NUL"),
            ));
        }
        environment.push((name.clone(), SecretValue::new(value)));
    }

    let (global_allow, global_deny) = global_prefixes(config);
    let (allow, deny) = effective_prefixes(&here, profile, &global_allow, &global_deny)?;
    let base = fingerprint_record(
        profile_name,
        profile,
        &storage_root,
        &runtime_root,
        &volumes,
        &executables,
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
        }),
    };
    let fingerprint = record
        .fingerprint()
        .map_err(|e| field(&here, e.to_string()))?;

    Ok(ResolvedDomainConfiguration {
        profile: profile_name.clone(),
        domain_id,
        fingerprint,
        record,
        network: EffectiveNetworkPolicy {
            allow,
            deny,
            hosts,
            dns: names.dns,
        },
        environment,
        authorities: ConfinedAuthorities {
            config_file: source.plan,
            config_fd: source.fd,
            workspace,
            storage_root,
            runtime_root,
            profile_dir,
            domain_storage,
            domain_runtime,
            volumes,
            executables,
        },
        layout,
    })
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
        .map_err(|rule| field(field_name, rule))?;
    let rule = ResolvedAutoApprovalRule {
        canonical_executable: canonical.as_os_str().as_bytes().to_vec(),
        args: rule.args.iter().map(|a| a.as_str().to_owned()).collect(),
        allow_extra_args: rule.allow_extra_args,
    };
    Ok(ResolvedExecutable { plan, opened, rule })
}

/// The checks a host command's executable (a rule's, or one the developer
/// approved) passes at load and before every execution: one hard link,
/// owned by root or the invoking user, no group or other write, executable
/// by the invoking user. `label` names it in the messages.
pub fn check_executable(label: &Path, opened: &Opened, uid: u32) -> Result<(), String> {
    let path = label.display();
    let now: Stat = stat(opened.fd.as_fd(), label).map_err(|e| e.to_string())?;
    if now.st_nlink != 1 {
        return Err(format!(
            "{path} has {} hard links; a host command's executable must have exactly one \
             (copy it instead of linking)",
            now.st_nlink
        ));
    }
    if now.st_uid != 0 && now.st_uid != uid {
        return Err(format!(
            "{path} is owned by uid {}; a host command's executable must be owned by you \
             (uid {uid}) or root",
            now.st_uid
        ));
    }
    let mode = now.st_mode & 0o7777;
    if mode & 0o022 != 0 {
        return Err(format!(
            "{path} is writable by its group or others (mode {mode:04o}); run `chmod go-w {path}`"
        ));
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
    .map_err(|_| format!("{path} is not executable by you (mode {mode:04o})"))?;
    Ok(())
}
