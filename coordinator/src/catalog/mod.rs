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

pub mod tables;

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use lazaret_proto::catalog::{
    ArtifactLease, ArtifactState, ImageSourceIdentity, PrepareOperation, PreparedArtifact,
    StoreMetadata,
};
use lazaret_proto::codec::{self, DecodeError, EncodeError, WireRecord};
use lazaret_proto::common::{HostPath, UnixTimeNs};
use lazaret_proto::ids::{DomainId, GenerationId, ManifestDigest, OperationId, PreparedArtifactId};
use redb::backends::FileBackend;
use redb::{Database, ReadOnlyDatabase, ReadableDatabase, ReadableTable, TableHandle};
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{FileType, FlockOperation, Mode, OFlags, RenameFlags};
use rustix::io::Errno;

use crate::config::{ConfinedError, RetainedDir};
use crate::image::fsops::{self, open_beneath, open_dir_path, open_dir_read};
use crate::image::{
    self, ImageConfig, ImageError, ImageSource, OciLayout, Progress, ResolvedImage, UnpackStats,
};

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
        reason: String,
        /// How many leases it has.
        leases: usize,
    },
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
        fsops::disk_usage(dir.as_fd()).map_err(self.io_error("measure", path))
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
                .and_then(|dir| fsops::list_dir(dir.as_fd()).ok())
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

    /// Finishes or undoes what crashed preparers and reclaims left behind.
    fn recover(&self, db: &Database) -> Result<(), CatalogError> {
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
        for name in fsops::list_dir(staging.as_fd())
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
    fn staging_is_live(&self, name: &str) -> Result<bool, CatalogError> {
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

    fn remove_staging(&self, name: &str) -> Result<(), CatalogError> {
        fsops::remove_at(self.staging.fd(), OsStr::new(name))
            .map_err(self.io_error("remove", self.staging.label().join(name)))
    }

    fn remove_artifact_dir(&self, id: PreparedArtifactId) -> Result<(), CatalogError> {
        let name = id.to_hex();
        fsops::remove_at(self.artifacts.fd(), OsStr::new(&name))
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

    fn read_operations(
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

    fn read_leases(&self, db: &impl ReadableDatabase) -> Result<Vec<ArtifactLease>, CatalogError> {
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
    fn unleased(
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

    /// Resolves `source` to a manifest digest, leases the Available
    /// artifact of that digest or unpacks a new one, and records the lease
    /// of (`domain`, `generation`). Leasing again for a generation that
    /// holds the same artifact is a no-op; one that holds another is a
    /// [`CatalogError::LeaseConflict`]. `progress` hears about each phase
    /// and about every MiB unpacked, on this thread: keep it cheap.
    pub fn prepare_and_lease(
        &self,
        source: &ImageSource,
        domain: DomainId,
        generation: GenerationId,
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
                let staging = self.begin(identity)?;
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
                let staging = self.begin(identity_of(source, &canonical, None))?;
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
                let staging = self.begin(identity_of(source, Path::new(""), None))?;
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
    fn begin(&self, source_identity: ImageSourceIdentity) -> Result<Staging, CatalogError> {
        let operation_id = OperationId(crate::session::random_bytes());
        let expected_artifact_id = PreparedArtifactId(crate::session::random_bytes());
        let name = operation_id.to_hex();
        let preparer = crate::process::own_identity().map_err(|source| CatalogError::Io {
            operation: "read the identity of this process from",
            path: "/proc/self".to_owned(),
            source,
        })?;
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
    fn insert_lease(
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
    ) -> Result<PreparedLower, String> {
        let name = id.to_hex();
        let artifact_dir = self
            .artifacts
            .ensure_child(Path::new(&name), self.uid)
            .map_err(|e| e.to_string())?;
        let rootfs = artifact_dir
            .open_child(Path::new(ROOTFS))
            .map_err(|e| format!("its rootfs cannot be opened: {e}"))?;
        let config = open_beneath(
            artifact_dir.fd(),
            IMAGE_CONFIG,
            OFlags::RDONLY,
            Mode::empty(),
        )
        .map_err(|e| {
            format!(
                "its {IMAGE_CONFIG} cannot be opened: {}",
                io::Error::from(e)
            )
        })?;
        let mut bytes = Vec::new();
        File::from(config)
            .take(4 << 20)
            .read_to_end(&mut bytes)
            .map_err(|e| format!("its {IMAGE_CONFIG} cannot be read: {e}"))?;
        let rootfs_path = artifact_dir.label().join(ROOTFS);
        let image_config = ImageConfig::parse(
            &bytes,
            &artifact_dir
                .label()
                .join(IMAGE_CONFIG)
                .display()
                .to_string(),
        )
        .map_err(|e| e.to_string())?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn open(storage: &Path) -> StorageCatalog {
        let uid = rustix::process::getuid().as_raw();
        let root = crate::config::confined::ensure_root(storage, uid).unwrap();
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
