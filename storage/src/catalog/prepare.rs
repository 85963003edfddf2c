//! Preparing an image in the Storage Catalog: resolving a source to a
//! manifest digest, leasing an Available artifact of it or unpacking a new
//! one in a staging directory held by its prepare operation, and recording
//! the lease (the order is in the parent module's documentation).
//!
//! Trusts image content only through [`crate::image`]'s checks; an
//! artifact directory is reopened and checked before it is leased.

use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;

use lazaret_hostfs::beneath::{open_beneath, open_dir_path, open_dir_read};
use lazaret_proto::catalog::{
    ArtifactLease, ArtifactState, ImageSourceIdentity, PrepareOperation, PreparedArtifact,
};
use lazaret_proto::common::{HostPath, UnixTimeNs};
use lazaret_proto::ids::{DomainId, GenerationId, ManifestDigest, OperationId, PreparedArtifactId};
use lazaret_proto::process::HostProcessIdentity;
use lazaret_proto::signing::random_bytes;
use redb::ReadableTable;
use rustix::fd::{AsFd, OwnedFd};
use rustix::fs::{FlockOperation, Mode, OFlags, RenameFlags};
use rustix::io::Errno;

use super::{
    CatalogError, Damage, FETCH_TAG, IMAGE_CONFIG, PreparedLower, ROOTFS, STAGED_ARTIFACT,
    STAGED_LAYOUT, StorageCatalog, decode, encode, flock, tables,
};
use crate::image::{
    self, ImageConfig, ImageError, ImageSource, OciLayout, Progress, ResolvedImage, UnpackStats,
};

/// Whom a preparation is for, and the image as the user wrote it.
#[derive(Clone, Copy)]
struct Target<'a> {
    domain: DomainId,
    generation: GenerationId,
    shown: &'a str,
}

/// One prepare operation's staging directory, held locked.
#[derive(Debug)]
struct Staging {
    operation: PrepareOperation,
    name: String,
    /// The staging directory, opened for reading and `flock`ed: its lock
    /// tells recovery that the preparer lives.
    dir: OwnedFd,
}

/// The source identity recorded for a source.
fn identity_of(source: &ImageSource, canonical: &Path, tag: Option<&str>) -> ImageSourceIdentity {
    match source {
        ImageSource::OciLayout { .. } => ImageSourceIdentity::OciLayout {
            path: HostPath::from(canonical),
            tag: tag.unwrap_or_default().to_owned(),
        },
        ImageSource::OciArchive { .. } => ImageSourceIdentity::OciArchive {
            path: HostPath::from(canonical),
        },
        ImageSource::Registry { reference } => ImageSourceIdentity::Registry {
            reference: reference.to_string(),
        },
    }
}

impl StorageCatalog {
    /// Resolves `source` to a manifest digest, leases the Available
    /// artifact of that digest or unpacks a new one, and records the lease
    /// of (`domain`, `generation`). Leasing again for a generation that
    /// holds the same artifact is a no-op; one that holds another is a
    /// [`CatalogError::LeaseConflict`]. `preparer` is the process that
    /// prepares (the caller), recorded with a prepare operation for those
    /// who look at it. `progress` hears about each phase and about every
    /// MiB unpacked, on this thread: keep it cheap.
    pub fn prepare_and_lease(
        &self,
        source: &ImageSource,
        domain: DomainId,
        generation: GenerationId,
        preparer: HostProcessIdentity,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<PreparedLower, CatalogError> {
        let shown = source.to_string();
        let target = Target {
            domain,
            generation,
            shown: &shown,
        };
        let image_error = |source: ImageError| CatalogError::Image {
            image: shown.clone(),
            source,
        };
        match source {
            ImageSource::OciLayout { path, tag } => {
                let layout = OciLayout::open(path).map_err(image_error)?;
                let resolved = layout.resolve(tag.as_deref()).map_err(image_error)?;
                self.announce(&resolved, progress);
                if let Some(lower) =
                    self.lease_existing(resolved.manifest_digest, target, progress)?
                {
                    return Ok(lower);
                }
                let identity = identity_of(
                    source,
                    layout.path(),
                    resolved.tag.as_deref().or(tag.as_deref()),
                );
                let staging = self.begin(identity, preparer)?;
                self.complete(staging, &layout, &resolved, target, progress)
            }
            ImageSource::OciArchive { path, tag } => {
                let canonical = std::fs::canonicalize(path)
                    .map_err(|source| ImageError::Io {
                        operation: "open the OCI archive",
                        path: path.display().to_string(),
                        source,
                    })
                    .map_err(image_error)?;
                let staging = self.begin(identity_of(source, &canonical, None), preparer)?;
                self.stage(staging, target, progress, |staging, progress| {
                    let layout = self.staged_layout(staging, |dir| {
                        image::extract_archive(&canonical, dir, progress)
                    })?;
                    let resolved = layout.resolve(tag.as_deref())?;
                    Ok((layout, resolved))
                })
            }
            ImageSource::Registry { reference } => {
                progress(Progress::Resolving {
                    image: shown.clone(),
                });
                let digest = image::fetch::resolve_registry(reference).map_err(image_error)?;
                if let Some(lower) = self.lease_existing(digest, target, progress)? {
                    return Ok(lower);
                }
                let staging = self.begin(identity_of(source, Path::new(""), None), preparer)?;
                progress(Progress::Fetching {
                    image: shown.clone(),
                });
                let destination = self.staging.label().join(&staging.name).join(STAGED_LAYOUT);
                self.stage(staging, target, progress, |staging, _| {
                    image::fetch::copy_registry(reference, digest, &destination, FETCH_TAG)?;
                    let dir = open_dir_path(staging.dir.as_fd(), STAGED_LAYOUT).map_err(|e| {
                        ImageError::Io {
                            operation: "open",
                            path: destination.display().to_string(),
                            source: e.into(),
                        }
                    })?;
                    let layout = OciLayout::from_dir(dir, destination.clone())?;
                    let resolved = layout.resolve(Some(FETCH_TAG))?;
                    if resolved.manifest_digest != digest {
                        return Err(ImageError::RegistryFetch {
                            reference: shown.clone(),
                            detail: format!(
                                "the registry served manifest {} for {}",
                                resolved.manifest_digest.to_oci_string(),
                                digest.to_oci_string()
                            ),
                        });
                    }
                    Ok((layout, resolved))
                })
            }
        }
    }

    /// Fills a staging entry with `build`, abandoning it if that fails,
    /// then announces the image and completes the preparation.
    fn stage(
        &self,
        staging: Staging,
        target: Target<'_>,
        progress: &mut dyn FnMut(Progress),
        build: impl FnOnce(
            &Staging,
            &mut dyn FnMut(Progress),
        ) -> Result<(OciLayout, ResolvedImage), ImageError>,
    ) -> Result<PreparedLower, CatalogError> {
        let (layout, resolved) = match build(&staging, progress) {
            Ok(built) => built,
            Err(source) => {
                self.abandon(staging);
                return Err(CatalogError::Image {
                    image: target.shown.to_owned(),
                    source,
                });
            }
        };
        self.announce(&resolved, progress);
        self.complete(staging, &layout, &resolved, target, progress)
    }

    fn announce(&self, resolved: &ResolvedImage, progress: &mut dyn FnMut(Progress)) {
        progress(Progress::Resolved {
            manifest_digest: resolved.manifest_digest,
            layers: resolved.layers.len(),
            bytes_total: resolved.layer_bytes(),
        });
    }

    /// Creates `layout/` in the staging directory, fills it with `fill`,
    /// and opens it as a layout.
    fn staged_layout(
        &self,
        staging: &Staging,
        fill: impl FnOnce(OwnedFd) -> Result<(), ImageError>,
    ) -> Result<OciLayout, ImageError> {
        let label = self.staging.label().join(&staging.name).join(STAGED_LAYOUT);
        let io = |operation| {
            let label = label.clone();
            move |e: Errno| ImageError::Io {
                operation,
                path: label.display().to_string(),
                source: e.into(),
            }
        };
        rustix::fs::mkdirat(&staging.dir, STAGED_LAYOUT, Mode::RWXU).map_err(io("create"))?;
        fill(open_dir_path(staging.dir.as_fd(), STAGED_LAYOUT).map_err(io("open"))?)?;
        let dir = open_dir_path(staging.dir.as_fd(), STAGED_LAYOUT).map_err(io("open"))?;
        OciLayout::from_dir(dir, label)
    }

    /// Records a prepare operation, then creates and locks its staging
    /// directory.
    fn begin(
        &self,
        source_identity: ImageSourceIdentity,
        preparer: HostProcessIdentity,
    ) -> Result<Staging, CatalogError> {
        let operation_id = OperationId(random_bytes());
        let expected_artifact_id = PreparedArtifactId(random_bytes());
        let name = operation_id.to_hex();
        let operation = PrepareOperation {
            operation_id,
            expected_artifact_id,
            source_identity,
            staging_dir: HostPath::from(name.as_str()),
            preparer,
            started_at: UnixTimeNs::now(),
        };
        self.with_db(|db| {
            let txn = db
                .begin_write()
                .map_err(self.db_error("begin a transaction"))?;
            {
                let mut ops = txn
                    .open_table(tables::OPERATIONS)
                    .map_err(self.db_error("open a table"))?;
                ops.insert(&operation_id.0, encode(&operation)?.as_slice())
                    .map_err(self.db_error("record a prepare operation"))?;
            }
            txn.commit().map_err(self.db_error("commit"))?;
            let path = self.staging.label().join(&name);
            rustix::fs::mkdirat(self.staging.fd(), name.as_str(), Mode::RWXU)
                .map_err(self.io_error("create", path.clone()))?;
            let dir = open_dir_read(self.staging.fd(), name.as_str())
                .map_err(self.io_error("open", path.clone()))?;
            flock(dir.as_fd(), FlockOperation::NonBlockingLockExclusive)
                .map_err(self.io_error("lock", path))?;
            Ok(Staging {
                operation,
                name,
                dir,
            })
        })
        .inspect(|_| crate::fault::point("image", "staged"))
    }

    /// Undoes a prepare operation: removes its staging directory and any
    /// unrecorded artifact directory, then drops the record. Best effort:
    /// what fails here is finished by the next open.
    fn abandon(&self, staging: Staging) {
        let _ = self.with_db(|db| {
            self.remove_staging(&staging.name)?;
            let expected = staging.operation.expected_artifact_id;
            let txn = db
                .begin_write()
                .map_err(self.db_error("begin a transaction"))?;
            {
                let artifacts = txn
                    .open_table(tables::ARTIFACTS)
                    .map_err(self.db_error("open a table"))?;
                if artifacts
                    .get(&expected.0)
                    .map_err(self.db_error("read an artifact"))?
                    .is_none()
                {
                    self.remove_artifact_dir(expected)?;
                }
                let mut ops = txn
                    .open_table(tables::OPERATIONS)
                    .map_err(self.db_error("open a table"))?;
                ops.remove(&staging.operation.operation_id.0)
                    .map_err(self.db_error("drop an operation"))?;
            }
            txn.commit().map_err(self.db_error("commit"))
        });
    }

    /// Holds the lock of one manifest digest until the descriptor drops.
    fn lock_digest(&self, digest: ManifestDigest) -> Result<OwnedFd, CatalogError> {
        let name = format!("{}.lock", digest.to_hex());
        let path = self.locks.label().join(&name);
        let fd = open_beneath(
            self.locks.fd(),
            name.as_str(),
            OFlags::RDWR | OFlags::CREATE,
            Mode::RUSR | Mode::WUSR,
        )
        .map_err(self.io_error("open", path.clone()))?;
        flock(fd.as_fd(), FlockOperation::LockExclusive).map_err(self.io_error("lock", path))?;
        Ok(fd)
    }

    /// Under the digest lock: leases an artifact another process finished
    /// meanwhile, or unpacks, then moves the artifact into place and
    /// records it. Abandons the operation on any failure.
    fn complete(
        &self,
        staging: Staging,
        layout: &OciLayout,
        resolved: &ResolvedImage,
        target: Target<'_>,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<PreparedLower, CatalogError> {
        let Target {
            domain,
            generation,
            shown,
        } = target;
        let result = (|| {
            let _digest_lock = self.lock_digest(resolved.manifest_digest)?;
            if let Some(lower) = self.lease_existing(resolved.manifest_digest, target, progress)? {
                return Ok((lower, false));
            }
            let stats = self
                .unpack(&staging, layout, resolved, progress)
                .map_err(|source| CatalogError::Image {
                    image: shown.to_owned(),
                    source,
                })?;
            let lower = self.commit(&staging, resolved, stats, domain, generation)?;
            progress(Progress::Prepared {
                artifact_id: lower.artifact_id,
                disk_bytes: stats.disk_bytes,
                skipped_nodes: stats.skipped_nodes,
            });
            Ok((lower, true))
        })();
        match result {
            Ok((lower, true)) => {
                // The operation is dropped; its staging leftovers go too.
                let _ = self.remove_staging(&staging.name);
                Ok(lower)
            }
            Ok((lower, false)) => {
                self.abandon(staging);
                Ok(lower)
            }
            Err(e) => {
                self.abandon(staging);
                Err(e)
            }
        }
    }

    /// Unpacks into `artifact/rootfs` of the staging directory and writes
    /// the image configuration beside it, then flushes the filesystem.
    fn unpack(
        &self,
        staging: &Staging,
        layout: &OciLayout,
        resolved: &ResolvedImage,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<UnpackStats, ImageError> {
        let base = self
            .staging
            .label()
            .join(&staging.name)
            .join(STAGED_ARTIFACT);
        let io = |operation: &'static str, path: &Path| {
            let path = path.display().to_string();
            move |e: Errno| ImageError::Io {
                operation,
                path,
                source: e.into(),
            }
        };
        rustix::fs::mkdirat(&staging.dir, STAGED_ARTIFACT, Mode::RWXU)
            .map_err(io("create", &base))?;
        let artifact =
            open_dir_path(staging.dir.as_fd(), STAGED_ARTIFACT).map_err(io("open", &base))?;
        let rootfs_path = base.join(ROOTFS);
        rustix::fs::mkdirat(&artifact, ROOTFS, Mode::RWXU).map_err(io("create", &rootfs_path))?;
        let rootfs = open_dir_path(artifact.as_fd(), ROOTFS).map_err(io("open", &rootfs_path))?;
        let stats = image::unpack_layers(layout, resolved, rootfs, progress)?;
        let config_path = base.join(IMAGE_CONFIG);
        let fd = open_beneath(
            artifact.as_fd(),
            IMAGE_CONFIG,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL,
            Mode::RUSR | Mode::WUSR,
        )
        .map_err(io("create", &config_path))?;
        File::from(fd)
            .write_all(&resolved.config_bytes)
            .map_err(|source| ImageError::Io {
                operation: "write",
                path: config_path.display().to_string(),
                source,
            })?;
        rustix::fs::syncfs(&staging.dir).map_err(io("flush", &base))?;
        Ok(stats)
    }

    /// Moves the staged artifact into place and, in one transaction,
    /// records it Available, indexes its digest, records the lease and
    /// drops the operation.
    fn commit(
        &self,
        staging: &Staging,
        resolved: &ResolvedImage,
        stats: UnpackStats,
        domain: DomainId,
        generation: GenerationId,
    ) -> Result<PreparedLower, CatalogError> {
        let id = staging.operation.expected_artifact_id;
        let name = id.to_hex();
        let artifact = PreparedArtifact {
            prepared_artifact_id: id,
            source_identity: staging.operation.source_identity.clone(),
            selected_manifest_digest: resolved.manifest_digest,
            state: ArtifactState::Available,
            artifact_dir: HostPath::from(name.as_str()),
            unpacked_bytes: stats.disk_bytes,
            prepared_at: UnixTimeNs::now(),
        };
        let lease = ArtifactLease {
            prepared_artifact_id: id,
            domain_id: domain,
            generation_id: generation,
        };
        self.with_db(|db| {
            rustix::fs::renameat_with(
                &staging.dir,
                STAGED_ARTIFACT,
                self.artifacts.fd(),
                name.as_str(),
                RenameFlags::NOREPLACE,
            )
            .map_err(self.io_error(
                "move the prepared artifact to",
                self.artifacts.label().join(&name),
            ))?;
            let txn = db
                .begin_write()
                .map_err(self.db_error("begin a transaction"))?;
            let conflict = {
                let mut artifacts = txn
                    .open_table(tables::ARTIFACTS)
                    .map_err(self.db_error("open a table"))?;
                artifacts
                    .insert(&id.0, encode(&artifact)?.as_slice())
                    .map_err(self.db_error("record an artifact"))?;
                let mut by_digest = txn
                    .open_table(tables::ARTIFACTS_BY_DIGEST)
                    .map_err(self.db_error("open a table"))?;
                by_digest
                    .insert(&resolved.manifest_digest.0, &id.0)
                    .map_err(self.db_error("index an artifact"))?;
                let mut ops = txn
                    .open_table(tables::OPERATIONS)
                    .map_err(self.db_error("open a table"))?;
                ops.remove(&staging.operation.operation_id.0)
                    .map_err(self.db_error("drop an operation"))?;
                self.insert_lease(&txn, lease)?
            };
            txn.commit().map_err(self.db_error("commit"))?;
            if let Some(held) = conflict {
                return Err(CatalogError::LeaseConflict {
                    domain,
                    generation,
                    held,
                    wanted: id,
                });
            }
            let lower = self
                .open_lower(id, resolved.manifest_digest)
                .map_err(|reason| CatalogError::ArtifactDamaged {
                    artifact: id,
                    path: self.artifacts.label().join(&name).display().to_string(),
                    reason,
                    leases: 1,
                })?;
            Ok(PreparedLower {
                reused: false,
                stats: Some(stats),
                ..lower
            })
        })
    }

    /// Inserts a lease unless the generation holds another; returns the
    /// other artifact then.
    pub(super) fn insert_lease(
        &self,
        txn: &redb::WriteTransaction,
        lease: ArtifactLease,
    ) -> Result<Option<PreparedArtifactId>, CatalogError> {
        let mut leases = txn
            .open_table(tables::LEASES)
            .map_err(self.db_error("open a table"))?;
        let key = (&lease.domain_id.0, lease.generation_id.0);
        let existing = leases
            .get(key)
            .map_err(self.db_error("read a lease"))?
            .map(|v| v.value().to_vec());
        if let Some(bytes) = existing {
            let held: ArtifactLease = decode(&bytes, &self.db_path(), "artifact_leases")?;
            if held.prepared_artifact_id != lease.prepared_artifact_id {
                return Ok(Some(held.prepared_artifact_id));
            }
        }
        leases
            .insert(key, encode(&lease)?.as_slice())
            .map_err(self.db_error("record a lease"))?;
        Ok(None)
    }

    /// Reopens an artifact's directory, root filesystem and configuration.
    fn open_lower(
        &self,
        id: PreparedArtifactId,
        digest: ManifestDigest,
    ) -> Result<PreparedLower, Damage> {
        let name = id.to_hex();
        let artifact_dir = self
            .artifacts
            .ensure_child(Path::new(&name), self.uid)
            .map_err(Damage::Directory)?;
        let rootfs = artifact_dir
            .open_child(Path::new(ROOTFS))
            .map_err(Damage::Rootfs)?;
        let config = open_beneath(
            artifact_dir.fd(),
            IMAGE_CONFIG,
            OFlags::RDONLY,
            Mode::empty(),
        )
        .map_err(|e| Damage::ConfigOpen(e.into()))?;
        let mut bytes = Vec::new();
        File::from(config)
            .take(4 << 20)
            .read_to_end(&mut bytes)
            .map_err(Damage::ConfigRead)?;
        let rootfs_path = artifact_dir.label().join(ROOTFS);
        let image_config = ImageConfig::parse(
            &bytes,
            &artifact_dir
                .label()
                .join(IMAGE_CONFIG)
                .display()
                .to_string(),
        )
        .map_err(|e| Damage::Config(Box::new(e)))?;
        Ok(PreparedLower {
            artifact_id: id,
            manifest_digest: digest,
            artifact_dir,
            rootfs,
            rootfs_path,
            image_config,
            reused: true,
            stats: None,
        })
    }

    /// Leases the Available artifact of `digest` to `target`, if there is
    /// a sound one, and tells `progress` it was reused. A damaged artifact
    /// that no one leases is forgotten (and `None` returned, so that it is
    /// prepared again).
    fn lease_existing(
        &self,
        digest: ManifestDigest,
        target: Target<'_>,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<Option<PreparedLower>, CatalogError> {
        let Target {
            domain, generation, ..
        } = target;
        let leased = self.with_db_closed_beside(|db| {
            let path = self.db_path();
            let txn = db
                .begin_write()
                .map_err(self.db_error("begin a transaction"))?;
            let artifact = {
                let by_digest = txn
                    .open_table(tables::ARTIFACTS_BY_DIGEST)
                    .map_err(self.db_error("open a table"))?;
                let artifacts = txn
                    .open_table(tables::ARTIFACTS)
                    .map_err(self.db_error("open a table"))?;
                let id = by_digest
                    .get(&digest.0)
                    .map_err(self.db_error("read the digest index"))?
                    .map(|v| *v.value());
                match id {
                    None => None,
                    Some(id) => artifacts
                        .get(&id)
                        .map_err(self.db_error("read an artifact"))?
                        .map(|v| decode::<PreparedArtifact>(v.value(), &path, "prepared_artifacts"))
                        .transpose()?,
                }
            };
            let Some(artifact) = artifact.filter(|a| a.state == ArtifactState::Available) else {
                return Ok(None);
            };
            let id = artifact.prepared_artifact_id;
            let lower = match self.open_lower(id, digest) {
                Ok(lower) => lower,
                Err(reason) => {
                    let leases = self
                        .read_leases(db)?
                        .iter()
                        .filter(|l| l.prepared_artifact_id == id)
                        .count();
                    if leases > 0 {
                        return Err(CatalogError::ArtifactDamaged {
                            artifact: id,
                            path: self
                                .artifacts
                                .label()
                                .join(id.to_hex())
                                .display()
                                .to_string(),
                            reason,
                            leases,
                        });
                    }
                    {
                        let mut by_digest = txn
                            .open_table(tables::ARTIFACTS_BY_DIGEST)
                            .map_err(self.db_error("open a table"))?;
                        by_digest
                            .remove(&digest.0)
                            .map_err(self.db_error("update the digest index"))?;
                        let mut artifacts = txn
                            .open_table(tables::ARTIFACTS)
                            .map_err(self.db_error("open a table"))?;
                        artifacts
                            .remove(&id.0)
                            .map_err(self.db_error("drop an artifact"))?;
                    }
                    txn.commit().map_err(self.db_error("commit"))?;
                    self.remove_artifact_dir(id)?;
                    return Ok(None);
                }
            };
            if let Some(held) = self.insert_lease(
                &txn,
                ArtifactLease {
                    prepared_artifact_id: id,
                    domain_id: domain,
                    generation_id: generation,
                },
            )? {
                return Err(CatalogError::LeaseConflict {
                    domain,
                    generation,
                    held,
                    wanted: id,
                });
            }
            txn.commit().map_err(self.db_error("commit"))?;
            Ok(Some(lower))
        })?;
        if let Some(lower) = &leased {
            progress(Progress::Reused {
                artifact_id: lower.artifact_id,
            });
        }
        Ok(leased)
    }
}
