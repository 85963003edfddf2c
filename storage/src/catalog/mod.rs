//! The Storage Catalog: the user's prepared lowers (unpacked base images),
//! shared by every Domain, with the leases Domain generations hold on them
//! and the prepare operations in flight.
//!
//! On disk, beneath the Storage Root (every directory `0700`, owned by the
//! invoking user):
//!
//! ```text
//! catalog/catalog.redb                      the database (tables.rs), lazaret-storage-catalog-v1
//! catalog/artifacts/<artifact-id>/rootfs    a prepared lower
//! catalog/artifacts/<artifact-id>/image-config.json   its verified OCI image configuration
//! catalog/tmp/<operation-id>/               staging of one prepare operation
//! catalog/locks/<manifest-digest>.lock      serializes preparing one digest
//! ```
//!
//! Order of a preparation (intent before effect): the image reference is
//! resolved to a manifest digest; an Available artifact of that digest is
//! leased as it is. Otherwise a `PrepareOperation` is committed, then its
//! staging directory is created and held with `flock(2)`; the layers are
//! unpacked there; the artifact directory is renamed into place
//! (`RENAME_NOREPLACE`) and, in one transaction, recorded Available with its
//! digest index and the lease while the operation is dropped. Any failure
//! removes the staging directory and the operation. A crash leaves the
//! operation: the next [`StorageCatalog::open`] finds its staging directory
//! unlocked (its preparer is gone), removes it and any unrecorded artifact
//! directory of the expected id, and drops the operation.
//!
//! Reclaiming ([`StorageCatalog::reclaim_unleased`]) marks an unleased
//! artifact Reclaiming and drops it from the digest index before removing
//! its directory and row; an interrupted reclaim is finished by the next
//! open.
//!
//! Concurrency: every database transaction runs under an exclusive
//! `flock(2)` on the catalog directory, with the database opened for that
//! transaction only (redb allows one process at a time), so any number of
//! Host Coordinators share the catalog. Opening checks an intact catalog
//! read-only, so that `up` of a prepared image flushes the disk only for
//! its lease. Preparing a digest holds the
//! digest's lock file, so two processes never unpack the same manifest: the
//! second waits and then leases the first one's artifact.
//!
//! Trust: the catalog is the user's own, but rows are decoded by the
//! `lazaret_proto` codec's rules and an artifact's directory is reopened and
//! checked (owner, mode, `rootfs` present) before it is leased. Image
//! content is handled by [`crate::image`].
//!
//! The preparation is [`prepare`]'s; recovery, reading the tables and
//! reclaiming are [`recovery`]'s; this module opens the catalog and runs
//! its transactions.

mod prepare;
mod recovery;
pub mod tables;

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use lazaret_hostfs::beneath::{self, open_beneath, open_dir_read};
use lazaret_hostfs::plan::{ConfinedError, RetainedDir};
use lazaret_hostfs::tree;
use lazaret_proto::catalog::{ArtifactState, PrepareOperation, StoreMetadata};
use lazaret_proto::codec::{self, DecodeError, EncodeError, WireRecord};
use lazaret_proto::ids::{DomainId, GenerationId, ManifestDigest, PreparedArtifactId};
use redb::backends::FileBackend;
use redb::{Database, ReadOnlyDatabase, ReadableDatabase, ReadableTable, TableHandle};
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{FileType, FlockOperation, Mode, OFlags};
use rustix::io::Errno;

use crate::image::{ImageConfig, ImageError, UnpackStats};

/// The catalog's directory beneath the Storage Root.
pub const CATALOG_DIR: &str = "catalog";
/// The database file in the catalog directory.
pub const DATABASE_FILE: &str = "catalog.redb";
/// Prepared artifacts, one directory each.
pub const ARTIFACTS_DIR: &str = "artifacts";
/// Staging directories of prepare operations.
pub const STAGING_DIR: &str = "tmp";
/// Per-digest lock files.
pub const LOCKS_DIR: &str = "locks";
/// The root filesystem in an artifact directory.
pub const ROOTFS: &str = "rootfs";
/// The image configuration in an artifact directory.
pub const IMAGE_CONFIG: &str = "image-config.json";
/// The artifact being built in a staging directory.
const STAGED_ARTIFACT: &str = "artifact";
/// The fetched or extracted layout in a staging directory.
const STAGED_LAYOUT: &str = "layout";
/// The tag a registry image is copied under.
const FETCH_TAG: &str = "lazaret";

/// Why a Storage Catalog operation failed.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// A catalog directory could not be created or is not the user's.
    #[error("cannot set up the storage catalog directory")]
    Directory {
        /// What went wrong with the path.
        #[source]
        source: ConfinedError,
    },
    /// A file operation in the catalog failed.
    #[error("storage catalog: cannot {operation} {path}")]
    Io {
        /// What was attempted.
        operation: &'static str,
        /// The file or directory.
        path: String,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },
    /// The database failed.
    #[error("storage catalog {path}: cannot {operation}")]
    Database {
        /// What was attempted.
        operation: &'static str,
        /// The database file.
        path: String,
        /// What redb said.
        #[source]
        source: Box<redb::Error>,
    },
    /// The database holds another schema.
    #[error(
        "storage catalog {path} holds {found}, not lazaret-storage-catalog-v1 version 1; it was written by another Lazaret version: move it aside and run the command again"
    )]
    Schema {
        /// The database file.
        path: String,
        /// What it holds.
        found: String,
    },
    /// A row does not decode.
    #[error(
        "storage catalog {path}: a row of table {table} is unreadable; move the catalog aside and run the command again"
    )]
    Corrupt {
        /// The database file.
        path: String,
        /// The table.
        table: &'static str,
        /// What the codec said.
        #[source]
        source: DecodeError,
    },
    /// A row could not be encoded.
    #[error("storage catalog: cannot encode a {record} row")]
    Encode {
        /// The record.
        record: &'static str,
        /// What the codec said.
        #[source]
        source: EncodeError,
    },
    /// The image could not be resolved, fetched or unpacked.
    #[error("cannot prepare the image `{image}`")]
    Image {
        /// The image reference.
        image: String,
        /// Why.
        #[source]
        source: ImageError,
    },
    /// The generation already leases another artifact.
    #[error(
        "Domain {domain} generation {generation} already leases prepared artifact {held}, not {wanted}; release that lease first"
    )]
    LeaseConflict {
        /// The Domain.
        domain: DomainId,
        /// The generation.
        generation: GenerationId,
        /// The artifact it holds.
        held: PreparedArtifactId,
        /// The artifact asked for.
        wanted: PreparedArtifactId,
    },
    /// An Available artifact's files are missing or wrong while running
    /// generations lease it.
    #[error(
        "prepared artifact {artifact} ({path}) is damaged: {reason}; {leases} generation(s) still lease it: stop them (`lazaret down`) and it will be prepared again"
    )]
    ArtifactDamaged {
        /// The artifact.
        artifact: PreparedArtifactId,
        /// Its directory.
        path: String,
        /// What is wrong.
        reason: Damage,
        /// How many leases it has.
        leases: usize,
    },
}

/// What is wrong with a prepared artifact's files.
#[derive(Debug, thiserror::Error)]
pub enum Damage {
    /// Its directory is missing or not the user's.
    #[error("{0}")]
    Directory(ConfinedError),
    /// Its root filesystem cannot be opened.
    #[error("its rootfs cannot be opened: {0}")]
    Rootfs(ConfinedError),
    /// Its image configuration cannot be opened.
    #[error("its {IMAGE_CONFIG} cannot be opened: {0}")]
    ConfigOpen(io::Error),
    /// Its image configuration cannot be read.
    #[error("its {IMAGE_CONFIG} cannot be read: {0}")]
    ConfigRead(io::Error),
    /// Its image configuration is not one Lazaret takes.
    #[error("{0}")]
    Config(Box<ImageError>),
}

/// A prepared lower leased to one Domain generation: the unpacked image
/// and what its configuration says about running it.
#[derive(Debug)]
pub struct PreparedLower {
    /// The artifact.
    pub artifact_id: PreparedArtifactId,
    /// The manifest it was unpacked from.
    pub manifest_digest: ManifestDigest,
    /// `catalog/artifacts/<artifact-id>`, retained (owned by the user, mode
    /// `0700`); plan paths inside the image as `rootfs/...` beneath it.
    pub artifact_dir: RetainedDir,
    /// `catalog/artifacts/<artifact-id>/rootfs`, retained: the root
    /// filesystem, with the image's own mode.
    pub rootfs: RetainedDir,
    /// The root filesystem's path: for messages and for the OCI bundle,
    /// never reopened to authorize anything.
    pub rootfs_path: PathBuf,
    /// The image's configuration (environment, working directory,
    /// entrypoint and command, user).
    pub image_config: ImageConfig,
    /// Whether an existing artifact was leased rather than a new one
    /// unpacked.
    pub reused: bool,
    /// What unpacking did, when this call unpacked.
    pub stats: Option<UnpackStats>,
}

/// The Storage Catalog of one Storage Root.
#[derive(Debug)]
pub struct StorageCatalog {
    uid: u32,
    catalog: RetainedDir,
    artifacts: RetainedDir,
    staging: RetainedDir,
    locks: RetainedDir,
    /// The close of the database after a lease, left to a thread of its
    /// own ([`Self::with_db_closed_beside`]); joined before the next use
    /// and on drop.
    closing: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Drop for StorageCatalog {
    fn drop(&mut self) {
        self.finish_close();
    }
}

/// `flock(2)`, retried when interrupted.
fn flock(fd: BorrowedFd<'_>, operation: FlockOperation) -> Result<(), Errno> {
    loop {
        match rustix::fs::flock(fd, operation) {
            Err(Errno::INTR) => continue,
            other => return other,
        }
    }
}

fn decode<T: WireRecord>(bytes: &[u8], path: &str, table: &'static str) -> Result<T, CatalogError> {
    codec::decode(bytes).map_err(|source| CatalogError::Corrupt {
        path: path.to_owned(),
        table,
        source,
    })
}

fn encode<T: WireRecord>(record: &T) -> Result<Vec<u8>, CatalogError> {
    codec::encode(record).map_err(|source| CatalogError::Encode {
        record: T::NAME,
        source,
    })
}

impl StorageCatalog {
    /// Opens (creating where missing) the catalog beneath the Storage Root,
    /// checks the database's schema, and cleans up after prepare operations
    /// whose preparer is gone.
    pub fn open(storage_root: &RetainedDir, uid: u32) -> Result<Self, CatalogError> {
        Self::open_with(storage_root, uid, true)
    }

    /// Opens the catalog as it is, cleaning up nothing: for `lazaret state
    /// verify`, which reports what a crash left rather than finishing it.
    pub fn open_as_is(storage_root: &RetainedDir, uid: u32) -> Result<Self, CatalogError> {
        Self::open_with(storage_root, uid, false)
    }

    fn open_with(
        storage_root: &RetainedDir,
        uid: u32,
        recover: bool,
    ) -> Result<Self, CatalogError> {
        let directory = |source| CatalogError::Directory { source };
        let catalog = storage_root
            .ensure_child(Path::new(CATALOG_DIR), uid)
            .map_err(directory)?;
        let artifacts = catalog
            .ensure_child(Path::new(ARTIFACTS_DIR), uid)
            .map_err(directory)?;
        let staging = catalog
            .ensure_child(Path::new(STAGING_DIR), uid)
            .map_err(directory)?;
        let locks = catalog
            .ensure_child(Path::new(LOCKS_DIR), uid)
            .map_err(directory)?;
        let this = Self {
            uid,
            catalog,
            artifacts,
            staging,
            locks,
            closing: std::sync::Mutex::default(),
        };
        // An intact catalog is checked read-only, which flushes nothing
        // to disk (a writable redb session costs four flushes even when it
        // changes nothing); a new one, another schema, or one a crash left
        // work in is opened for writing.
        let intact = this
            .with_read_only(|db| Ok(this.is_intact(db, recover)))?
            .unwrap_or(false);
        if !intact {
            this.with_db(|db| {
                this.check_schema(db)?;
                if recover { this.recover(db) } else { Ok(()) }
            })?;
        }
        Ok(this)
    }

    /// The prepare operations whose preparer is gone: what the next open
    /// cleans up.
    pub fn stale_operations(&self) -> Result<Vec<PrepareOperation>, CatalogError> {
        let mut stale = Vec::new();
        for operation in self.operations()? {
            if !self.staging_is_live(&operation.operation_id.to_hex())? {
                stale.push(operation);
            }
        }
        Ok(stale)
    }

    /// The bytes a prepared artifact's directory occupies on disk.
    pub fn artifact_size(&self, id: PreparedArtifactId) -> Result<u64, CatalogError> {
        let name = id.to_hex();
        let path = self.artifacts.label().join(&name);
        let dir = open_dir_read(self.artifacts.fd(), name.as_str())
            .map_err(self.io_error("open", path.clone()))?;
        tree::disk_usage(dir.as_fd()).map_err(self.io_error("measure", path))
    }

    /// The root filesystem of a prepared artifact, opened for reading.
    pub fn artifact_rootfs(&self, id: PreparedArtifactId) -> Result<OwnedFd, CatalogError> {
        let path = Path::new(&id.to_hex()).join(ROOTFS);
        open_dir_read(self.artifacts.fd(), path.as_os_str())
            .map_err(self.io_error("open", self.artifacts.label().join(&path)))
    }

    /// The catalog directory's path, for messages.
    pub fn label(&self) -> &Path {
        self.catalog.label()
    }

    fn db_path(&self) -> String {
        self.catalog
            .label()
            .join(DATABASE_FILE)
            .display()
            .to_string()
    }

    fn db_error<E: Into<redb::Error>>(
        &self,
        operation: &'static str,
    ) -> impl FnOnce(E) -> CatalogError + '_ {
        move |e| CatalogError::Database {
            operation,
            path: self.db_path(),
            source: Box::new(e.into()),
        }
    }

    fn io_error(
        &self,
        operation: &'static str,
        path: PathBuf,
    ) -> impl FnOnce(Errno) -> CatalogError {
        move |e| CatalogError::Io {
            operation,
            path: path.display().to_string(),
            source: e.into(),
        }
    }

    /// Takes the catalog lock and opens the database file, which must be a
    /// regular file of the user's (its mode is narrowed to `0600`).
    fn lock_and_open(&self) -> Result<(OwnedFd, File), CatalogError> {
        let label = self.catalog.label().to_path_buf();
        let lock =
            open_dir_read(self.catalog.fd(), ".").map_err(self.io_error("open", label.clone()))?;
        flock(lock.as_fd(), FlockOperation::LockExclusive).map_err(self.io_error("lock", label))?;
        let path = self.catalog.label().join(DATABASE_FILE);
        let fd = open_beneath(
            self.catalog.fd(),
            DATABASE_FILE,
            OFlags::RDWR | OFlags::CREATE,
            Mode::RUSR | Mode::WUSR,
        )
        .map_err(self.io_error("open", path.clone()))?;
        let stat = rustix::fs::fstat(&fd).map_err(self.io_error("stat", path.clone()))?;
        if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile || stat.st_uid != self.uid
        {
            return Err(CatalogError::Io {
                operation: "use",
                path: path.display().to_string(),
                source: io::Error::other("it is not a regular file owned by you"),
            });
        }
        if stat.st_mode & 0o077 != 0 {
            rustix::fs::fchmod(&fd, Mode::RUSR | Mode::WUSR)
                .map_err(self.io_error("set the mode of", path))?;
        }
        Ok((lock, File::from(fd)))
    }

    /// Runs `f` with the database open, under the catalog lock.
    fn with_db<T>(
        &self,
        f: impl FnOnce(&Database) -> Result<T, CatalogError>,
    ) -> Result<T, CatalogError> {
        let (db, lock) = self.open_db()?;
        let result = f(&db);
        drop(db);
        drop(lock);
        result
    }

    /// [`Self::with_db`], returning as soon as `f` has: the database is
    /// closed, and the catalog lock given up, on a thread of its own. A
    /// clean close flushes the disk twice, which the one commit of a lease
    /// need not wait for: it is durable already.
    fn with_db_closed_beside<T>(
        &self,
        f: impl FnOnce(&Database) -> Result<T, CatalogError>,
    ) -> Result<T, CatalogError> {
        let (db, lock) = self.open_db()?;
        let result = f(&db);
        let closing = std::thread::Builder::new()
            .name("catalog-close".into())
            .spawn(move || drop((db, lock)));
        // Without a thread, it closes here.
        if let Ok(closing) = closing {
            *self.closing.lock().unwrap_or_else(|e| e.into_inner()) = Some(closing);
        }
        result
    }

    /// Takes the catalog lock and opens the database for writing, once an
    /// earlier close has finished.
    fn open_db(&self) -> Result<(Database, OwnedFd), CatalogError> {
        self.finish_close();
        let (lock, file) = self.lock_and_open()?;
        let backend = FileBackend::new(file).map_err(self.db_error("open the database"))?;
        let db = Database::builder()
            .create_with_backend(backend)
            .map_err(self.db_error("open the database"))?;
        Ok((db, lock))
    }

    /// Waits for a close left to a thread of its own.
    fn finish_close(&self) {
        let closing = self
            .closing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(closing) = closing {
            let _ = closing.join();
        }
    }

    /// Runs `f` with the database open read-only, under the catalog lock;
    /// `None` when it cannot be opened so (new and empty, or left needing
    /// recovery by a crash): [`Self::with_db`] sets it up or repairs it.
    fn with_read_only<T>(
        &self,
        f: impl FnOnce(&ReadOnlyDatabase) -> Result<T, CatalogError>,
    ) -> Result<Option<T>, CatalogError> {
        self.finish_close();
        let (lock, file) = self.lock_and_open()?;
        let Ok(backend) = FileBackend::new(file) else {
            return Ok(None);
        };
        let Ok(db) = Database::builder().open_read_only_with_backend(backend) else {
            return Ok(None);
        };
        let result = f(&db);
        drop(db);
        drop(lock);
        result.map(Some)
    }

    /// Whether the catalog has the current schema and every table, and
    /// (with `recover`) nothing a crash left to finish: no prepare
    /// operation, no staging directory without a live preparer, no
    /// unleased artifact being reclaimed. Anything unreadable is not intact:
    /// the writable path says what is wrong with it.
    fn is_intact(&self, db: &ReadOnlyDatabase, recover: bool) -> bool {
        let Ok(txn) = db.begin_read() else {
            return false;
        };
        let current = encode(&StoreMetadata::CURRENT).ok();
        let schema = txn.open_table(tables::METADATA).is_ok_and(|table| {
            table
                .get(tables::METADATA_KEY)
                .ok()
                .flatten()
                .is_some_and(|v| Some(v.value()) == current.as_deref())
        });
        let tables = txn.open_table(tables::ARTIFACTS).is_ok()
            && txn.open_table(tables::ARTIFACTS_BY_DIGEST).is_ok()
            && txn.open_table(tables::LEASES).is_ok()
            && txn.open_table(tables::OPERATIONS).is_ok();
        drop(txn);
        if !(schema && tables) {
            return false;
        }
        if !recover {
            return true;
        }
        self.read_operations(db).is_ok_and(|o| o.is_empty())
            && self
                .unleased(db, ArtifactState::Reclaiming)
                .is_ok_and(|a| a.is_empty())
            && open_dir_read(self.staging.fd(), ".")
                .ok()
                .and_then(|dir| beneath::list_names(dir.as_fd()).ok())
                .is_some_and(|names| {
                    names.iter().all(|name| {
                        self.staging_is_live(&String::from_utf8_lossy(name))
                            .unwrap_or(false)
                    })
                })
    }

    /// Writes the schema metadata into a new database, or checks it.
    fn check_schema(&self, db: &Database) -> Result<(), CatalogError> {
        let txn = db
            .begin_write()
            .map_err(self.db_error("begin a transaction"))?;
        let existing = {
            let table = txn
                .open_table(tables::METADATA)
                .map_err(self.db_error("open the metadata table"))?;
            table
                .get(tables::METADATA_KEY)
                .map_err(self.db_error("read the schema metadata"))?
                .map(|v| v.value().to_vec())
        };
        match existing {
            Some(bytes) => match codec::decode::<StoreMetadata>(&bytes) {
                Ok(metadata) if metadata == StoreMetadata::CURRENT => {}
                Ok(_) | Err(_) => {
                    return Err(CatalogError::Schema {
                        path: self.db_path(),
                        found: format!("schema metadata `{}`", bytes.escape_ascii()),
                    });
                }
            },
            None => {
                let others = txn
                    .list_tables()
                    .map_err(self.db_error("list tables"))?
                    .filter(|t| t.name() != tables::METADATA.name())
                    .count();
                if others > 0 {
                    return Err(CatalogError::Schema {
                        path: self.db_path(),
                        found: "tables but no schema metadata".to_owned(),
                    });
                }
                let mut table = txn
                    .open_table(tables::METADATA)
                    .map_err(self.db_error("open the metadata table"))?;
                table
                    .insert(
                        tables::METADATA_KEY,
                        encode(&StoreMetadata::CURRENT)?.as_slice(),
                    )
                    .map_err(self.db_error("write the schema metadata"))?;
            }
        }
        // Create every table, so that read transactions find them.
        txn.open_table(tables::ARTIFACTS)
            .map_err(self.db_error("open a table"))?;
        txn.open_table(tables::ARTIFACTS_BY_DIGEST)
            .map_err(self.db_error("open a table"))?;
        txn.open_table(tables::LEASES)
            .map_err(self.db_error("open a table"))?;
        txn.open_table(tables::OPERATIONS)
            .map_err(self.db_error("open a table"))?;
        txn.commit().map_err(self.db_error("commit"))
    }
}

#[cfg(test)]
mod tests {
    use lazaret_proto::catalog::ArtifactLease;

    use super::*;

    fn open(storage: &Path) -> StorageCatalog {
        let uid = rustix::process::getuid().as_raw();
        let root = lazaret_hostfs::plan::ensure_root(storage, uid).unwrap();
        StorageCatalog::open(&root, uid).unwrap()
    }

    #[test]
    fn a_close_left_beside_ends_before_the_next_use_and_before_the_drop() {
        let scratch = tempfile::tempdir().unwrap();
        let storage = scratch.path().join("storage");
        let catalog = open(&storage);
        let lease = ArtifactLease {
            prepared_artifact_id: PreparedArtifactId([1; 16]),
            domain_id: DomainId([2; 32]),
            generation_id: GenerationId(3),
        };
        catalog
            .with_db_closed_beside(|db| {
                let txn = db.begin_write().map_err(catalog.db_error("begin"))?;
                assert_eq!(catalog.insert_lease(&txn, lease)?, None);
                txn.commit().map_err(catalog.db_error("commit"))
            })
            .unwrap();
        // The next use opens the database once the close is done.
        assert_eq!(catalog.leases().unwrap(), vec![lease]);
        catalog.with_db_closed_beside(|_| Ok(())).unwrap();
        // So does another process's, through the catalog lock.
        assert_eq!(open(&storage).leases().unwrap(), vec![lease]);
        drop(catalog);
        // Closed cleanly: a read-only open refuses a database a writer
        // left without its close.
        let file = storage.join(CATALOG_DIR).join(DATABASE_FILE);
        let db = Database::builder().open_read_only(&file);
        assert!(db.is_ok(), "the catalog was not closed cleanly");
    }
}
