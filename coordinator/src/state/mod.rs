//! A Domain's durable state found and handled from its records alone: the
//! `lazaret state` commands (list, inspect, verify, reset), `lazaret image`
//! (list, prune), and the recovery `lazaret down` runs when no coordinator
//! answers.
//!
//! Owns finding a Domain without its profile: the Domain ID from the
//! profile and the canonical workspace, or given; the Runtime Root from
//! `XDG_RUNTIME_DIR`; the Storage Root from the configuration's
//! `storage.data_root` alone (or the default), so a Domain whose profile
//! was removed, or whose `env:` values this shell lacks, is still found.
//! Every operation holds the Domain lock, as a coordinator does, so none
//! runs beside a generation; what is removed is removed beneath held
//! directory descriptors. Trusts the Domain Store and the catalog for what
//! to look for, and the filesystem for what is there.

pub mod anchor;

use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use lazaret_proto::catalog::ImageSourceIdentity;
use lazaret_proto::ids::{DomainId, GenerationId, ManifestDigest, PreparedArtifactId};
use lazaret_proto::ownership::ParticipantOwnership;
use lazaret_proto::store::{Domain, Generation, GenerationState};
use serde::Serialize;

use lazaret_hostfs::plan::{ConfinedError, RetainedDir, ensure_root};
use lazaret_hostfs::{beneath, tree};
use lazaret_storage::anchor::{ANCHORS_DIR, UPPER_DIR, WORK_DIR, anchor_name, sandbox_path_of};
use lazaret_storage::catalog::{CatalogError, StorageCatalog};
use lazaret_storage::store::{DomainStore, StoreError};

use crate::config::{ConfigError, DOMAINS_DIR, HostEnvironment};
use crate::lifecycle::DomainPaths;
use crate::lifecycle::recovery::{RecoveryError, finish_stale};
use crate::lifecycle::workspace::ISOLATED_DIR;

/// Why a state operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The roots could not be found.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A directory is not as Lazaret keeps it.
    #[error(transparent)]
    Path(#[from] ConfinedError),
    /// The Domain Store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The catalog failed.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// Releasing a stale generation failed.
    #[error(transparent)]
    Recovery(#[from] RecoveryError),
    /// What was asked for is not there.
    #[error("{0}")]
    Unknown(String),
    /// A file operation failed.
    #[error("cannot {operation} {path}")]
    Io {
        /// What was attempted.
        operation: &'static str,
        /// Where.
        path: String,
        /// What the kernel said.
        #[source]
        source: std::io::Error,
    },
}

fn io(operation: &'static str, path: &Path) -> impl FnOnce(rustix::io::Errno) -> StateError {
    let path = path.display().to_string();
    move |e| StateError::Io {
        operation,
        path,
        source: e.into(),
    }
}

/// Where this user's Domains keep their state.
#[derive(Debug)]
pub struct Roots {
    /// The Storage Root.
    pub storage: PathBuf,
    /// The Runtime Root.
    pub runtime: PathBuf,
    uid: u32,
}

impl Roots {
    /// The roots of `host`, with the Storage Root the configuration at
    /// `config` names (its `storage.data_root` only).
    pub fn find(host: &HostEnvironment, config: Option<&OsStr>) -> Result<Self, StateError> {
        Ok(Self {
            storage: crate::config::storage_root_of(host, config)?,
            runtime: host.runtime_root()?,
            uid: host.uid,
        })
    }

    /// The Storage Root's `domains/` directory, if there is one.
    fn domains(&self) -> Result<Option<RetainedDir>, StateError> {
        if !self.storage.join(DOMAINS_DIR).is_dir() {
            return Ok(None);
        }
        Ok(Some(
            ensure_root(&self.storage, self.uid)?.open_child(Path::new(DOMAINS_DIR))?,
        ))
    }

    /// Every Domain with state under the Storage Root.
    pub fn domain_ids(&self) -> Result<Vec<DomainId>, StateError> {
        let Some(domains) = self.domains()? else {
            return Ok(Vec::new());
        };
        let dir = beneath::open_dir_read(domains.fd(), ".").map_err(io("list", domains.label()))?;
        let mut ids: Vec<DomainId> = beneath::list_names(dir.as_fd())
            .map_err(io("list", domains.label()))?
            .iter()
            .filter_map(|name| std::str::from_utf8(name).ok().and_then(DomainId::from_hex))
            .collect();
        ids.sort();
        Ok(ids)
    }

    /// The catalog, cleaned of what crashed preparers left.
    pub fn catalog(&self) -> Result<StorageCatalog, StateError> {
        Ok(StorageCatalog::open(
            &ensure_root(&self.storage, self.uid)?,
            self.uid,
        )?)
    }

    /// The catalog as it is.
    fn catalog_as_is(&self) -> Result<StorageCatalog, StateError> {
        Ok(StorageCatalog::open_as_is(
            &ensure_root(&self.storage, self.uid)?,
            self.uid,
        )?)
    }

    /// Takes Domain `id`: its lock, its directories and its store.
    pub fn take(&self, id: DomainId) -> Result<Access, StateError> {
        let paths = DomainPaths::new(id, self.runtime.join(DOMAINS_DIR).join(id.to_hex()));
        let Some(domains) = self.domains()? else {
            return Ok(Access::Absent);
        };
        let storage = match domains.open_child(Path::new(&id.to_hex())) {
            Ok(dir) => dir,
            Err(ConfinedError::Missing { .. }) => return Ok(Access::Absent),
            Err(e) => return Err(e.into()),
        };
        let runtime = ensure_root(&self.runtime, self.uid)?
            .ensure_child(&Path::new(DOMAINS_DIR).join(id.to_hex()), self.uid)?;
        let lock = crate::lifecycle::try_lock(&runtime).map_err(|e| StateError::Io {
            operation: "lock",
            path: paths.lock_file().display().to_string(),
            source: e,
        })?;
        let Some(lock) = lock else {
            return Ok(Access::Running(paths));
        };
        let Some((store, domain)) = DomainStore::open_existing(&storage, id)? else {
            return Ok(Access::Absent);
        };
        Ok(Access::Held(Box::new(Held {
            domain,
            storage,
            runtime,
            store,
            _lock: lock,
        })))
    }
}

/// What taking a Domain found.
#[derive(Debug)]
pub enum Access {
    /// This process owns it now.
    Held(Box<Held>),
    /// Its coordinator (or another command) holds it.
    Running(DomainPaths),
    /// It has no state.
    Absent,
}

/// A Domain this process owns: its lock, directories and store.
#[derive(Debug)]
pub struct Held {
    /// Its Domain row.
    pub domain: Domain,
    storage: RetainedDir,
    runtime: RetainedDir,
    store: DomainStore,
    _lock: OwnedFd,
}

/// One persistent dir's State Anchor on disk.
#[derive(Debug, Serialize)]
pub struct AnchorOnDisk {
    /// The persistent dir, inside the sandbox.
    pub sandbox_path: String,
    /// Bytes its upper and work directory occupy.
    pub bytes: u64,
}

/// Where a Domain is in its life, as `state list` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DomainState {
    /// Its coordinator runs.
    Running,
    /// Its last generation was stopped.
    Stopped,
    /// A generation's coordinator is gone; `lazaret down` finishes it.
    Stale,
    /// Another Lazaret command holds it (a coordinator starting or
    /// stopping, or a `state` command).
    Busy,
}

impl DomainState {
    /// How it is shown (and serialized).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Stopped => "stopped",
            Self::Stale => "stale",
            Self::Busy => "busy",
        }
    }
}

/// A Domain's state, as `state list` shows it.
#[derive(Debug, Serialize)]
pub struct DomainSummary {
    /// The Domain.
    pub domain_id: String,
    /// Its profile.
    pub profile: String,
    /// Its workspace.
    pub workspace: String,
    /// Where it is in its life.
    pub state: DomainState,
    /// Its last generation.
    pub last_generation: Option<u64>,
    /// The image digest of its last generation.
    pub image_digest: Option<String>,
    /// Its persistent dirs with state.
    pub persistent_dirs: Vec<AnchorOnDisk>,
    /// Bytes its isolated workspace storage occupies.
    pub ignored_bytes: u64,
    /// Bytes in all.
    pub total_bytes: u64,
}

impl DomainSummary {
    /// A Domain whose records could not be read here (its coordinator
    /// holds them): what is known is its id and `state`.
    pub fn unread(domain_id: DomainId, state: DomainState) -> Self {
        Self {
            domain_id: domain_id.to_hex(),
            profile: String::new(),
            workspace: String::new(),
            state,
            last_generation: None,
            image_digest: None,
            persistent_dirs: Vec::new(),
            ignored_bytes: 0,
            total_bytes: 0,
        }
    }
}

/// The bytes the directory `name` beneath `dir` occupies; nothing there
/// is none.
fn usage(dir: BorrowedFd<'_>, name: &str) -> u64 {
    beneath::open_dir_read(dir, name)
        .ok()
        .and_then(|fd| tree::disk_usage(fd.as_fd()).ok())
        .unwrap_or(0)
}

/// One State Anchor in `anchors/`.
#[derive(Debug)]
struct AnchorEntry {
    /// Its name there.
    name: String,
    /// The persistent dir it stands for.
    sandbox_path: String,
}

/// A Domain's `anchors/` directory, opened once, and what it holds.
struct Anchors {
    dir: Option<OwnedFd>,
    entries: Vec<AnchorEntry>,
}

impl Anchors {
    /// What `storage`'s `anchors/` holds, by persistent dir; none when it
    /// was never made.
    fn read(storage: &RetainedDir) -> Result<Self, StateError> {
        let path = storage.label().join(ANCHORS_DIR);
        let dir = match beneath::open_dir_read(storage.fd(), ANCHORS_DIR) {
            Ok(dir) => dir,
            Err(rustix::io::Errno::NOENT) => {
                return Ok(Self {
                    dir: None,
                    entries: Vec::new(),
                });
            }
            Err(e) => return Err(io("open", &path)(e)),
        };
        let mut entries: Vec<AnchorEntry> = beneath::list_names(dir.as_fd())
            .map_err(io("list", &path))?
            .into_iter()
            .filter_map(|name| {
                let sandbox_path = sandbox_path_of(&name)?;
                let name = String::from_utf8(name).ok()?;
                Some(AnchorEntry { name, sandbox_path })
            })
            .collect();
        entries.sort_by(|a, b| a.sandbox_path.cmp(&b.sandbox_path));
        Ok(Self {
            dir: Some(dir),
            entries,
        })
    }

    /// Each anchor with the bytes it occupies.
    fn measured(&self) -> Vec<AnchorOnDisk> {
        self.entries
            .iter()
            .map(|entry| AnchorOnDisk {
                sandbox_path: entry.sandbox_path.clone(),
                bytes: self
                    .dir
                    .as_ref()
                    .map_or(0, |dir| usage(dir.as_fd(), &entry.name)),
            })
            .collect()
    }

    /// `sub` (a path) of anchor `name`, opened for reading.
    fn open(&self, name: &str, sub: &str) -> Option<OwnedFd> {
        let dir = self.dir.as_ref()?;
        beneath::open_dir_read(dir.as_fd(), Path::new(name).join(sub).as_os_str()).ok()
    }
}

/// The prepared lower a generation leased: its artifact and digest.
fn leased_image(
    store: &DomainStore,
    generation: GenerationId,
) -> Result<(Option<PreparedArtifactId>, Option<ManifestDigest>), StateError> {
    for (_, participant) in store.participants(generation)? {
        if let ParticipantOwnership::PreparedLower(lower) = participant.ownership {
            return Ok((lower.prepared_artifact_id, lower.selected_manifest_digest));
        }
    }
    Ok((None, None))
}

impl Held {
    /// Finishes a generation whose coordinator is gone, from the records
    /// alone: its participants released (processes proven before they are
    /// signalled), its sessions recorded closed. The generation it
    /// finished, if one was open.
    pub fn recover(&self, catalog: &StorageCatalog) -> Result<Option<GenerationId>, StateError> {
        Ok(finish_stale(
            &self.store,
            catalog,
            self.domain.domain_id,
            &self.runtime,
        )?)
    }

    /// The generation [`Self::recover`] would finish.
    pub fn stale_generation(&self) -> Result<Option<GenerationId>, StateError> {
        Ok(self.store.open_generation()?.map(|g| g.generation_id))
    }

    /// This Domain as `state list` shows it.
    pub fn summary(&self) -> Result<DomainSummary, StateError> {
        let latest = self.store.latest_generation()?;
        self.summary_of(latest.as_ref(), &Anchors::read(&self.storage)?)
    }

    fn summary_of(
        &self,
        latest: Option<&Generation>,
        anchors: &Anchors,
    ) -> Result<DomainSummary, StateError> {
        let digest = match latest {
            Some(g) => leased_image(&self.store, g.generation_id)?.1,
            None => None,
        };
        let persistent_dirs = anchors.measured();
        let ignored_bytes = usage(self.storage.fd(), ISOLATED_DIR);
        Ok(DomainSummary {
            domain_id: self.domain.domain_id.to_hex(),
            profile: self.domain.profile_name.clone(),
            workspace: self.domain.canonical_workspace.to_string(),
            state: match latest.map(|g| g.state) {
                Some(GenerationState::Closed) | None => DomainState::Stopped,
                Some(_) => DomainState::Stale,
            },
            last_generation: latest.map(|g| g.generation_id.0),
            image_digest: digest.map(|d| d.to_hex()),
            total_bytes: persistent_dirs.iter().map(|a| a.bytes).sum::<u64>() + ignored_bytes,
            persistent_dirs,
            ignored_bytes,
        })
    }
}

/// One persistent dir in detail, as `state inspect` shows it.
#[derive(Debug, Serialize)]
pub struct AnchorDetail {
    /// The persistent dir, inside the sandbox.
    pub sandbox_path: String,
    /// Its upper on the host.
    pub upper: String,
    /// Bytes its upper and work directory occupy.
    pub bytes: u64,
    /// What the upper changes over the image.
    #[serde(flatten)]
    pub walked: anchor::Walked,
}

/// One Domain's State Anchor in detail.
#[derive(Debug, Serialize)]
pub struct Inspection {
    /// The Domain.
    #[serde(flatten)]
    pub summary: DomainSummary,
    /// Whether the image of the last generation was found to compare with.
    pub compared_with_image: bool,
    /// Each persistent dir.
    pub anchors: Vec<AnchorDetail>,
}

/// Opens `path` (a persistent dir, absolute) beneath an image's root
/// filesystem, following no link.
fn image_dir(rootfs: &OwnedFd, path: &str) -> Option<OwnedFd> {
    let relative = path.trim_start_matches('/');
    beneath::open_dir(
        rootfs.as_fd(),
        relative.as_bytes(),
        rustix::fs::OFlags::RDONLY,
    )
    .ok()
}

impl Held {
    /// Each persistent dir's upper against the image of the last
    /// generation.
    pub fn inspect(&self, catalog: &StorageCatalog) -> Result<Inspection, StateError> {
        let latest = self.store.latest_generation()?;
        let anchors = Anchors::read(&self.storage)?;
        let summary = self.summary_of(latest.as_ref(), &anchors)?;
        let artifact = match &latest {
            Some(g) => leased_image(&self.store, g.generation_id)?.0,
            None => None,
        };
        let rootfs = artifact.and_then(|id| catalog.artifact_rootfs(id).ok());
        let uid = rustix::process::getuid().as_raw();
        let details = anchors
            .entries
            .iter()
            .zip(&summary.persistent_dirs)
            .map(|(entry, on_disk)| {
                let upper_path = Path::new(&entry.name).join(UPPER_DIR);
                let lower = rootfs
                    .as_ref()
                    .and_then(|r| image_dir(r, &entry.sandbox_path));
                let walked = match anchors.open(&entry.name, UPPER_DIR) {
                    Some(upper) => {
                        anchor::walk(upper.as_fd(), lower.as_ref().map(AsFd::as_fd), uid)
                    }
                    None => anchor::Walked::default(),
                };
                AnchorDetail {
                    upper: self
                        .storage
                        .label()
                        .join(ANCHORS_DIR)
                        .join(upper_path)
                        .display()
                        .to_string(),
                    sandbox_path: entry.sandbox_path.clone(),
                    bytes: on_disk.bytes,
                    walked,
                }
            })
            .collect();
        Ok(Inspection {
            summary,
            compared_with_image: rootfs.is_some(),
            anchors: details,
        })
    }
}

/// One thing `state verify` found wrong.
#[derive(Debug, Serialize)]
pub struct Finding {
    /// What kind: `stale-generation`, `missing-upper`, `bad-work-dir`,
    /// `bad-mode`, `foreign-owner`, `dangling-lease`,
    /// `lease-without-domain`, `lease-without-artifact`,
    /// `stale-operation`.
    pub kind: &'static str,
    /// What and where, and what to do.
    pub detail: String,
}

fn finding(kind: &'static str, detail: String) -> Finding {
    Finding { kind, detail }
}

impl Held {
    /// The structural checks of `state verify`: records against
    /// directories, leases, operations, work directories, owners and
    /// modes.
    pub fn verify(&self, roots: &Roots) -> Result<Vec<Finding>, StateError> {
        let mut found = Vec::new();
        let generations = self.store.generations()?;
        if let Some(open) = generations
            .iter()
            .rev()
            .find(|g| g.state != GenerationState::Closed)
        {
            found.push(finding(
                "stale-generation",
                format!(
                    "generation {} was never stopped and its coordinator is gone; `lazaret down` \
                     finishes it",
                    open.generation_id.0
                ),
            ));
        }
        // The dirs the last generation recorded have their upper and work
        // directories, owned by the user, the anchors' own dirs 0700.
        let anchors = Anchors::read(&self.storage)?;
        if let Some(last) = generations.last() {
            found.extend(self.verify_recorded_anchors(last.generation_id, &anchors)?);
        }
        found.extend(self.verify_anchor_dirs(roots, &anchors));
        found.extend(self.verify_catalog(roots, &generations)?);
        Ok(found)
    }

    /// Each State Anchor generation `last` recorded has its upper and work
    /// directories.
    fn verify_recorded_anchors(
        &self,
        last: GenerationId,
        anchors: &Anchors,
    ) -> Result<Vec<Finding>, StateError> {
        let mut found = Vec::new();
        for (_, participant) in self.store.participants(last)? {
            let ParticipantOwnership::StateAnchor(anchor) = participant.ownership else {
                continue;
            };
            let Some(path) = anchor.sandbox_path else {
                continue;
            };
            let name = anchor_name(&path);
            for (sub, kind) in [(UPPER_DIR, "missing-upper"), (WORK_DIR, "bad-work-dir")] {
                let there = anchors.dir.as_ref().and_then(|dir| {
                    beneath::lstat_at(dir.as_fd(), Path::new(&name).join(sub).as_os_str())
                        .ok()
                        .flatten()
                });
                let is_dir = there
                    .as_ref()
                    .is_some_and(|s| beneath::file_type(s) == rustix::fs::FileType::Directory);
                if !is_dir {
                    found.push(finding(
                        kind,
                        format!(
                            "the State Anchor of {path} has no {sub} directory ({}); \
                             `lazaret state reset --dir {path}` starts it afresh",
                            self.storage
                                .label()
                                .join(ANCHORS_DIR)
                                .join(&name)
                                .join(sub)
                                .display()
                        ),
                    ));
                }
            }
        }
        Ok(found)
    }

    /// Each State Anchor directory is the user's, mode 0700, and holds
    /// nothing of another owner.
    fn verify_anchor_dirs(&self, roots: &Roots, anchors: &Anchors) -> Vec<Finding> {
        let mut found = Vec::new();
        for anchor in &anchors.entries {
            let Some(dir) = anchors.dir.as_ref() else {
                break;
            };
            if let Ok(Some(stat)) = beneath::lstat_at(dir.as_fd(), OsStr::new(&anchor.name)) {
                if stat.st_uid != roots.uid || stat.st_mode & 0o777 != 0o700 {
                    found.push(finding(
                        "bad-mode",
                        format!(
                            "the State Anchor of {} ({}) has owner {} and mode {:04o}; it must be \
                             yours with mode 0700: `chmod 0700` it if it is yours, or \
                             `lazaret state reset --dir {}` to start it afresh",
                            anchor.sandbox_path,
                            self.storage
                                .label()
                                .join(ANCHORS_DIR)
                                .join(&anchor.name)
                                .display(),
                            stat.st_uid,
                            stat.st_mode & 0o7777,
                            anchor.sandbox_path,
                        ),
                    ));
                }
            }
            if let Some(upper) = anchors.open(&anchor.name, UPPER_DIR) {
                let walked = anchor::walk(upper.as_fd(), None, roots.uid);
                for (path, owner) in walked.foreign {
                    found.push(finding(
                        "foreign-owner",
                        format!(
                            "{}{path} in the State Anchor is owned by uid {owner}, not by you: \
                             nothing the sandbox makes can be; someone else put it there",
                            anchor.sandbox_path
                        ),
                    ));
                }
            }
        }
        found
    }

    /// The catalog: this Domain's leases, and what no Domain explains.
    fn verify_catalog(
        &self,
        roots: &Roots,
        generations: &[Generation],
    ) -> Result<Vec<Finding>, StateError> {
        let mut found = Vec::new();
        let catalog = roots.catalog_as_is()?;
        let artifacts: Vec<PreparedArtifactId> = catalog
            .artifacts()?
            .iter()
            .map(|a| a.prepared_artifact_id)
            .collect();
        let known = roots.domain_ids()?;
        for lease in catalog.leases()? {
            if !artifacts.contains(&lease.prepared_artifact_id) {
                found.push(finding(
                    "lease-without-artifact",
                    format!(
                        "Domain {} generation {} leases image {}, which the catalog does not hold",
                        lease.domain_id, lease.generation_id.0, lease.prepared_artifact_id
                    ),
                ));
            }
            if !known.contains(&lease.domain_id) {
                found.push(finding(
                    "lease-without-domain",
                    format!(
                        "image {} is leased by Domain {} generation {}, which has no state; \
                         the lease keeps the image from `lazaret image prune`",
                        lease.prepared_artifact_id, lease.domain_id, lease.generation_id.0
                    ),
                ));
            } else if lease.domain_id == self.domain.domain_id {
                let open = generations.iter().any(|g| {
                    g.generation_id == lease.generation_id && g.state != GenerationState::Closed
                });
                if !open {
                    found.push(finding(
                        "dangling-lease",
                        format!(
                            "generation {} of this Domain is closed but still leases image {}, \
                             which keeps it from `lazaret image prune`",
                            lease.generation_id.0, lease.prepared_artifact_id
                        ),
                    ));
                }
            }
        }
        for operation in catalog.stale_operations()? {
            found.push(finding(
                "stale-operation",
                format!(
                    "image preparation {} was left by a preparer that is gone; the next command \
                     that opens the catalog (`lazaret up`, `down`, `image`, `state inspect` or \
                     `state reset`) cleans it up",
                    operation.operation_id
                ),
            ));
        }
        Ok(found)
    }
}

/// What `state reset` removes.
#[derive(Debug, Serialize)]
pub struct Removal {
    /// The persistent dir, or `ignored` for the isolated workspace storage.
    pub what: String,
    /// Bytes it occupied.
    pub bytes: u64,
    #[serde(skip)]
    target: Target,
}

/// Where a [`Removal`] is, beneath the Domain's storage directory.
#[derive(Debug)]
enum Target {
    /// The anchor of this name in `anchors/`.
    Anchor(String),
    /// The isolated workspace storage, emptied.
    Isolated,
}

impl Removal {
    /// Whether this is the isolated workspace storage (the ignored files
    /// kept for the sandbox).
    pub fn is_isolated(&self) -> bool {
        matches!(self.target, Target::Isolated)
    }
}

impl Held {
    /// What `state reset` would remove: every persistent dir's state and
    /// the isolated workspace storage, or only the dirs in `only`. A dir
    /// in `only` without state is an error naming what there is.
    pub fn reset_plan(&self, only: &[String]) -> Result<Vec<Removal>, StateError> {
        let anchors = Anchors::read(&self.storage)?;
        let measured = anchors.measured();
        let removal = |i: usize| Removal {
            what: measured[i].sandbox_path.clone(),
            bytes: measured[i].bytes,
            target: Target::Anchor(anchors.entries[i].name.clone()),
        };
        if only.is_empty() {
            let mut plan: Vec<Removal> = (0..measured.len()).map(removal).collect();
            plan.push(Removal {
                what: "ignored".into(),
                bytes: usage(self.storage.fd(), ISOLATED_DIR),
                target: Target::Isolated,
            });
            return Ok(plan);
        }
        only.iter()
            .map(|dir| {
                let dir = dir.trim_end_matches('/');
                measured
                    .iter()
                    .position(|a| a.sandbox_path == dir)
                    .map(removal)
                    .ok_or_else(|| {
                        let kept: Vec<&str> =
                            measured.iter().map(|a| a.sandbox_path.as_str()).collect();
                        StateError::Unknown(format!(
                            "the Domain keeps no state for {dir}; it keeps: {}",
                            if kept.is_empty() {
                                "nothing".to_owned()
                            } else {
                                kept.join(", ")
                            }
                        ))
                    })
            })
            .collect()
    }

    /// Removes what `plan` names, beneath the Domain's storage directory.
    pub fn reset(&self, plan: &[Removal]) -> Result<(), StateError> {
        let anchors_path = self.storage.label().join(ANCHORS_DIR);
        for removal in plan {
            match &removal.target {
                Target::Isolated => {
                    let path = self.storage.label().join(ISOLATED_DIR);
                    match beneath::open_dir_read(self.storage.fd(), ISOLATED_DIR) {
                        Ok(dir) => tree::remove_children(dir.as_fd(), |_| false)
                            .map_err(io("empty", &path))?,
                        Err(rustix::io::Errno::NOENT) => {}
                        Err(e) => return Err(io("open", &path)(e)),
                    }
                }
                Target::Anchor(name) => {
                    let dir = beneath::open_dir_read(self.storage.fd(), ANCHORS_DIR)
                        .map_err(io("open", &anchors_path))?;
                    tree::remove_at(dir.as_fd(), OsStr::new(name))
                        .map_err(io("remove", &anchors_path.join(name)))?;
                }
            }
        }
        Ok(())
    }
}

/// A prepared image, as `image list` shows it.
#[derive(Debug, Serialize)]
pub struct ImageSummary {
    /// The artifact.
    pub artifact_id: String,
    /// Its manifest digest.
    pub manifest_digest: String,
    /// Where it came from.
    pub source: String,
    /// Bytes on disk.
    pub bytes: u64,
    /// The (Domain, generation) pairs that lease it.
    pub leased_by: Vec<(String, u64)>,
}

/// Every prepared image.
pub fn images(catalog: &StorageCatalog) -> Result<Vec<ImageSummary>, StateError> {
    images_where(catalog, |_| true)
}

/// The prepared images `wanted` selects by their leases, each measured.
fn images_where(
    catalog: &StorageCatalog,
    wanted: impl Fn(&[(String, u64)]) -> bool,
) -> Result<Vec<ImageSummary>, StateError> {
    let leases = catalog.leases()?;
    let mut out = Vec::new();
    for a in catalog.artifacts()? {
        let leased_by: Vec<(String, u64)> = leases
            .iter()
            .filter(|l| l.prepared_artifact_id == a.prepared_artifact_id)
            .map(|l| (l.domain_id.to_hex(), l.generation_id.0))
            .collect();
        if !wanted(&leased_by) {
            continue;
        }
        out.push(ImageSummary {
            artifact_id: a.prepared_artifact_id.to_hex(),
            manifest_digest: a.selected_manifest_digest.to_hex(),
            source: match &a.source_identity {
                ImageSourceIdentity::Registry { reference } => reference.clone(),
                ImageSourceIdentity::OciLayout { path, tag } => format!("oci:{path}:{tag}"),
                ImageSourceIdentity::OciArchive { path, .. } => format!("oci-archive:{path}"),
            },
            bytes: catalog.artifact_size(a.prepared_artifact_id).unwrap_or(0),
            leased_by,
        });
    }
    Ok(out)
}

/// Removes every image no generation leases; what was removed. Only the
/// unleased ones are measured (before they go).
pub fn prune(catalog: &StorageCatalog) -> Result<Vec<ImageSummary>, StateError> {
    let unleased = images_where(catalog, <[_]>::is_empty)?;
    let removed = catalog.reclaim_unleased()?;
    Ok(unleased
        .into_iter()
        .filter(|i| removed.iter().any(|id| id.to_hex() == i.artifact_id))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchor_names_round_trip() {
        for path in ["/root", "/usr/local", "/home/dev/.cache"] {
            let name = anchor_name(path);
            assert_eq!(sandbox_path_of(name.as_bytes()).as_deref(), Some(path));
        }
        assert_eq!(anchor_name("/root"), "2f726f6f74");
        assert!(sandbox_path_of(b"zz").is_none());
        assert!(sandbox_path_of(b"726f6f74").is_none(), "not absolute");
    }
}
