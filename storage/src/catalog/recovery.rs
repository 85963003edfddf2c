//! Recovery and reclaiming in the Storage Catalog: finishing or undoing
//! what crashed preparers and interrupted reclaims left, reading the
//! catalog's tables, releasing leases and reclaiming unleased artifacts.
//!
//! Runs under the catalog lock like every transaction (see the parent
//! module); trusts rows only once the codec decodes them.

use std::ffi::OsStr;

use lazaret_hostfs::{beneath, tree};
use lazaret_proto::catalog::{ArtifactLease, ArtifactState, PrepareOperation, PreparedArtifact};
use lazaret_proto::codec::WireRecord;
use lazaret_proto::ids::{DomainId, GenerationId, PreparedArtifactId};
use redb::{Database, ReadableDatabase, ReadableTable};
use rustix::fd::AsFd;
use rustix::fs::FlockOperation;
use rustix::io::Errno;

use super::{CatalogError, StorageCatalog, decode, encode, open_dir_read, tables};

impl StorageCatalog {
    /// Finishes or undoes what crashed preparers and reclaims left behind.
    pub(super) fn recover(&self, db: &Database) -> Result<(), CatalogError> {
        let operations = self.read_operations(db)?;
        let txn = db
            .begin_write()
            .map_err(self.db_error("begin a transaction"))?;
        {
            let mut ops = txn
                .open_table(tables::OPERATIONS)
                .map_err(self.db_error("open a table"))?;
            let artifacts = txn
                .open_table(tables::ARTIFACTS)
                .map_err(self.db_error("open a table"))?;
            for operation in &operations {
                let name = operation.operation_id.to_hex();
                if self.staging_is_live(&name)? {
                    continue;
                }
                self.remove_staging(&name)?;
                let expected = operation.expected_artifact_id;
                let recorded = artifacts
                    .get(&expected.0)
                    .map_err(self.db_error("read an artifact"))?
                    .is_some();
                if !recorded {
                    self.remove_artifact_dir(expected)?;
                }
                ops.remove(&operation.operation_id.0)
                    .map_err(self.db_error("drop an operation"))?;
            }
        }
        txn.commit().map_err(self.db_error("commit"))?;
        // Staging directories without an operation: left by a crash before
        // the operation was committed, or by a lost record.
        let live: Vec<String> = self
            .read_operations(db)?
            .iter()
            .map(|o| o.operation_id.to_hex())
            .collect();
        let staging = open_dir_read(self.staging.fd(), ".")
            .map_err(self.io_error("open", self.staging.label().to_path_buf()))?;
        for name in beneath::list_names(staging.as_fd())
            .map_err(self.io_error("list", self.staging.label().to_path_buf()))?
        {
            let name = String::from_utf8_lossy(&name).into_owned();
            if !live.contains(&name) && !self.staging_is_live(&name)? {
                self.remove_staging(&name)?;
            }
        }
        self.finish_reclaims(db)
    }

    /// Whether a staging directory is held by a live preparer.
    pub(super) fn staging_is_live(&self, name: &str) -> Result<bool, CatalogError> {
        let path = self.staging.label().join(name);
        match open_dir_read(self.staging.fd(), name) {
            Ok(dir) => match rustix::fs::flock(&dir, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => Ok(false),
                Err(Errno::WOULDBLOCK | Errno::INTR) => Ok(true),
                Err(e) => Err(self.io_error("lock", path)(e)),
            },
            Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) => Ok(false),
            Err(e) => Err(self.io_error("open", path)(e)),
        }
    }

    pub(super) fn remove_staging(&self, name: &str) -> Result<(), CatalogError> {
        tree::remove_at(self.staging.fd(), OsStr::new(name))
            .map_err(self.io_error("remove", self.staging.label().join(name)))
    }

    pub(super) fn remove_artifact_dir(&self, id: PreparedArtifactId) -> Result<(), CatalogError> {
        let name = id.to_hex();
        tree::remove_at(self.artifacts.fd(), OsStr::new(&name))
            .map_err(self.io_error("remove", self.artifacts.label().join(name)))
    }

    /// Every row of a table of records, decoded.
    fn read_all<K: redb::Key + 'static, T: WireRecord>(
        &self,
        db: &impl ReadableDatabase,
        table: redb::TableDefinition<K, &'static [u8]>,
        name: &'static str,
    ) -> Result<Vec<T>, CatalogError> {
        let path = self.db_path();
        let txn = db
            .begin_read()
            .map_err(self.db_error("begin a transaction"))?;
        let table = txn
            .open_table(table)
            .map_err(self.db_error("open a table"))?;
        let mut out = Vec::new();
        for row in table.iter().map_err(self.db_error("read a table"))? {
            let (_, value) = row.map_err(self.db_error("read a table"))?;
            out.push(decode(value.value(), &path, name)?);
        }
        Ok(out)
    }

    pub(super) fn read_operations(
        &self,
        db: &impl ReadableDatabase,
    ) -> Result<Vec<PrepareOperation>, CatalogError> {
        self.read_all(db, tables::OPERATIONS, "prepare_operations")
    }

    fn read_artifacts(
        &self,
        db: &impl ReadableDatabase,
    ) -> Result<Vec<PreparedArtifact>, CatalogError> {
        self.read_all(db, tables::ARTIFACTS, "prepared_artifacts")
    }

    pub(super) fn read_leases(
        &self,
        db: &impl ReadableDatabase,
    ) -> Result<Vec<ArtifactLease>, CatalogError> {
        self.read_all(db, tables::LEASES, "artifact_leases")
    }

    /// Every lease.
    pub fn leases(&self) -> Result<Vec<ArtifactLease>, CatalogError> {
        self.with_db(|db| self.read_leases(db))
    }

    /// Every prepared artifact.
    pub fn artifacts(&self) -> Result<Vec<PreparedArtifact>, CatalogError> {
        self.with_db(|db| self.read_artifacts(db))
    }

    /// Every prepare operation in flight (or abandoned by a live process).
    pub fn operations(&self) -> Result<Vec<PrepareOperation>, CatalogError> {
        self.with_db(|db| self.read_operations(db))
    }

    /// Releases the lease of (`domain`, `generation`), returning it; no
    /// lease is not an error (release is idempotent).
    pub fn release_lease(
        &self,
        domain: DomainId,
        generation: GenerationId,
    ) -> Result<Option<ArtifactLease>, CatalogError> {
        self.with_db(|db| {
            let path = self.db_path();
            let txn = db
                .begin_write()
                .map_err(self.db_error("begin a transaction"))?;
            let removed = txn
                .open_table(tables::LEASES)
                .map_err(self.db_error("open a table"))?
                .remove((&domain.0, generation.0))
                .map_err(self.db_error("remove a lease"))?
                .map(|v| v.value().to_vec());
            txn.commit().map_err(self.db_error("commit"))?;
            removed
                .map(|bytes| decode::<ArtifactLease>(&bytes, &path, "artifact_leases"))
                .transpose()
        })
    }

    /// The artifacts in `state` that no generation leases.
    pub(super) fn unleased(
        &self,
        db: &impl ReadableDatabase,
        state: ArtifactState,
    ) -> Result<Vec<PreparedArtifact>, CatalogError> {
        let leased: Vec<PreparedArtifactId> = self
            .read_leases(db)?
            .iter()
            .map(|l| l.prepared_artifact_id)
            .collect();
        Ok(self
            .read_artifacts(db)?
            .into_iter()
            .filter(|a| a.state == state && !leased.contains(&a.prepared_artifact_id))
            .collect())
    }

    /// Removes every Available artifact that no generation leases,
    /// returning their ids. Each is first marked Reclaiming (and dropped
    /// from the digest index) so that an interrupted reclaim is finished by
    /// the next open.
    pub fn reclaim_unleased(&self) -> Result<Vec<PreparedArtifactId>, CatalogError> {
        self.with_db(|db| {
            let doomed = self.unleased(db, ArtifactState::Available)?;
            let txn = db
                .begin_write()
                .map_err(self.db_error("begin a transaction"))?;
            {
                let mut artifacts = txn
                    .open_table(tables::ARTIFACTS)
                    .map_err(self.db_error("open a table"))?;
                let mut by_digest = txn
                    .open_table(tables::ARTIFACTS_BY_DIGEST)
                    .map_err(self.db_error("open a table"))?;
                for artifact in &doomed {
                    let mut row = artifact.clone();
                    row.state = ArtifactState::Reclaiming;
                    artifacts
                        .insert(&row.prepared_artifact_id.0, encode(&row)?.as_slice())
                        .map_err(self.db_error("mark an artifact Reclaiming"))?;
                    let indexed = by_digest
                        .get(&row.selected_manifest_digest.0)
                        .map_err(self.db_error("read the digest index"))?
                        .map(|v| *v.value());
                    if indexed == Some(row.prepared_artifact_id.0) {
                        by_digest
                            .remove(&row.selected_manifest_digest.0)
                            .map_err(self.db_error("update the digest index"))?;
                    }
                }
            }
            txn.commit().map_err(self.db_error("commit"))?;
            self.finish_reclaims(db)?;
            Ok(doomed.iter().map(|a| a.prepared_artifact_id).collect())
        })
    }

    /// Removes the directories and rows of Reclaiming artifacts no one
    /// leases.
    fn finish_reclaims(&self, db: &Database) -> Result<(), CatalogError> {
        let doomed: Vec<PreparedArtifactId> = self
            .unleased(db, ArtifactState::Reclaiming)?
            .iter()
            .map(|a| a.prepared_artifact_id)
            .collect();
        if doomed.is_empty() {
            return Ok(());
        }
        for id in &doomed {
            self.remove_artifact_dir(*id)?;
        }
        let txn = db
            .begin_write()
            .map_err(self.db_error("begin a transaction"))?;
        {
            let mut artifacts = txn
                .open_table(tables::ARTIFACTS)
                .map_err(self.db_error("open a table"))?;
            for id in &doomed {
                artifacts
                    .remove(&id.0)
                    .map_err(self.db_error("drop an artifact"))?;
            }
        }
        txn.commit().map_err(self.db_error("commit"))
    }
}
