//! The Domain Store: one redb database per Domain, `store.redb` in the
//! Domain's storage directory, holding the Domain, its generations and their
//! participants, and the workspace rules the newest generation routed by.
//!
//! Owns durable intent: every participant is written before the resource it
//! names exists, and every state change is committed before the next step.
//! Only the holder of the Domain flock opens the store (redb also locks the
//! file). Rows decode through the versioned `proto` codec; a row that does
//! not decode stops the operation rather than being skipped. Trusts the
//! flock holder — itself — and nothing read from disk beyond its shape.

mod tables;

use std::fs::File;

use lazaret_proto::codec::{self, DecodeError, EncodeError, WireRecord};
use lazaret_proto::ids::GenerationId;
use lazaret_proto::router::WorkspaceRules;
use lazaret_proto::store::{
    Domain, Generation, GenerationState, Participant, Session, SessionTerminal, StoreMetadata,
};
use redb::{Database, ReadableDatabase, ReadableTable};
use rustix::fs::{Mode, OFlags};

use lazaret_hostfs::plan::RetainedDir;

/// The file name of the Domain Store beneath the Domain's storage directory.
pub const STORE_FILE: &str = "store.redb";

/// Why the Domain Store failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database file could not be opened.
    #[error("cannot open the Domain Store {path}")]
    Open {
        /// The file.
        path: String,
        /// What went wrong.
        #[source]
        source: std::io::Error,
    },
    /// redb refused the database.
    #[error("the Domain Store {path} cannot be used; another Lazaret process may hold it")]
    Database {
        /// The file.
        path: String,
        /// What redb said.
        #[source]
        source: redb::DatabaseError,
    },
    /// A transaction failed.
    #[error("a Domain Store transaction failed")]
    Transaction(#[source] redb::Error),
    /// A row did not decode.
    #[error("a Domain Store row is unreadable; the store may be from another version")]
    Decode(#[source] DecodeError),
    /// A participant row names one role and holds another's ownership.
    #[error(
        "the participant in slot {slot} of generation {generation} is corrupt (its role and \
         ownership disagree); the Domain Store is damaged"
    )]
    Corrupt {
        /// The generation.
        generation: u64,
        /// The slot.
        slot: u32,
    },
    /// A record did not encode.
    #[error("a Domain Store record could not be encoded")]
    Encode(#[source] EncodeError),
    /// The store belongs to another schema or Domain.
    #[error("the Domain Store {path} {reason}")]
    Mismatch {
        /// The file.
        path: String,
        /// What does not match.
        reason: String,
    },
}

macro_rules! redb_error {
    ($($t:ty),*) => {
        $(impl From<$t> for StoreError {
            fn from(e: $t) -> Self {
                StoreError::Transaction(e.into())
            }
        })*
    };
}
redb_error!(
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);

fn encode<T: WireRecord>(record: &T) -> Result<Vec<u8>, StoreError> {
    codec::encode(record).map_err(StoreError::Encode)
}

fn decode<T: WireRecord>(bytes: &[u8]) -> Result<T, StoreError> {
    codec::decode(bytes).map_err(StoreError::Decode)
}

/// Where a participant sits in its generation's rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Slot(pub u32);

impl Slot {
    /// The prepared-lower lease.
    pub const PREPARED_LOWER: Slot = Slot(0);
    /// The Runtime Supervisor (helper processes).
    pub const SUPERVISOR: Slot = Slot(1);
    /// The sandbox container.
    pub const SANDBOX: Slot = Slot(2);
    /// The published control socket.
    pub const PUBLICATION: Slot = Slot(3);
    /// The holder of the Domain namespaces (the supervisor's pid 1).
    pub const NAMESPACE_HOLDER: Slot = Slot(4);
    /// The Session Coordinator's socket and client credential.
    pub const SESSION_PUBLICATION: Slot = Slot(5);
    /// The enforcement network and its attested policy.
    pub const NETWORK: Slot = Slot(6);
    /// The connectivity helper, slirp4netns.
    pub const CONNECTIVITY_HELPER: Slot = Slot(7);
    /// The workspace routing: its mount, isolated directory and router.
    pub const GIT_ROUTING: Slot = Slot(8);
    /// Lazaret's resolver, for a policy with names.
    pub const RESOLVER: Slot = Slot(9);
    /// The Credential Proxy, for a profile with credentials.
    pub const CREDENTIAL_PROXY: Slot = Slot(10);

    /// The State Anchor of persistent dir `index`.
    pub fn state_anchor(index: usize) -> Slot {
        Slot(100 + u32::try_from(index).unwrap_or(u32::MAX - 100))
    }

    /// The slot's name, as logs and fault points call it.
    pub fn name(self) -> String {
        match self {
            Self::PREPARED_LOWER => "prepared-lower".into(),
            Self::SUPERVISOR => "supervisor".into(),
            Self::SANDBOX => "sandbox".into(),
            Self::PUBLICATION => "publication".into(),
            Self::NAMESPACE_HOLDER => "namespace-holder".into(),
            Self::SESSION_PUBLICATION => "session-publication".into(),
            Self::NETWORK => "network".into(),
            Self::CONNECTIVITY_HELPER => "connectivity-helper".into(),
            Self::GIT_ROUTING => "git-routing".into(),
            Self::RESOLVER => "resolver".into(),
            Self::CREDENTIAL_PROXY => "credential-proxy".into(),
            Slot(n) if n >= 100 => format!("state-anchor-{}", n - 100),
            Slot(n) => format!("slot-{n}"),
        }
    }
}

/// An open Domain Store.
#[derive(Debug)]
pub struct DomainStore {
    db: Database,
}

impl DomainStore {
    /// Opens (creating if missing) the store of `domain` in `dir`.
    pub fn open(dir: &RetainedDir, domain: &Domain) -> Result<Self, StoreError> {
        let store = Self::open_file(dir, OFlags::CREATE)?;
        let path = dir.label().join(STORE_FILE).display().to_string();
        store.check_identity(&path, domain)?;
        Ok(store)
    }

    /// Opens the existing store in `dir` from its records alone, for a
    /// Domain whose configuration is not at hand: `None` when there is no
    /// store; its Domain row must name `domain_id`.
    pub fn open_existing(
        dir: &RetainedDir,
        domain_id: lazaret_proto::ids::DomainId,
    ) -> Result<Option<(Self, Domain)>, StoreError> {
        let store = match Self::open_file(dir, OFlags::empty()) {
            Ok(store) => store,
            Err(StoreError::Open { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        let path = dir.label().join(STORE_FILE).display().to_string();
        let txn = store.db.begin_read()?;
        let domain = match txn.open_table(tables::DOMAIN) {
            Ok(table) => table
                .get(tables::DOMAIN_KEY)?
                .map(|v| decode::<Domain>(v.value()))
                .transpose()?,
            Err(redb::TableError::TableDoesNotExist(_)) => None,
            Err(e) => return Err(e.into()),
        };
        drop(txn);
        let domain = domain.ok_or_else(|| StoreError::Mismatch {
            path: path.clone(),
            reason: "holds no Domain".into(),
        })?;
        if domain.domain_id != domain_id {
            return Err(StoreError::Mismatch {
                path,
                reason: format!("belongs to Domain {}", domain.domain_id),
            });
        }
        store.check_identity(&path, &domain)?;
        Ok(Some((store, domain)))
    }

    fn open_file(dir: &RetainedDir, create: OFlags) -> Result<Self, StoreError> {
        let path = dir.label().join(STORE_FILE).display().to_string();
        let file: File = lazaret_hostfs::beneath::open_beneath(
            dir.fd(),
            STORE_FILE,
            OFlags::RDWR | create,
            // openat2(2) takes a mode only with O_CREAT.
            if create.is_empty() {
                Mode::empty()
            } else {
                Mode::RUSR | Mode::WUSR
            },
        )
        .map_err(|e| StoreError::Open {
            path: path.clone(),
            source: e.into(),
        })?
        .into();
        let database_error = |source| StoreError::Database {
            path: path.clone(),
            source,
        };
        let backend = redb::backends::FileBackend::new(file).map_err(database_error)?;
        let db = redb::Builder::new()
            .create_with_backend(backend)
            .map_err(database_error)?;
        Ok(Self { db })
    }

    /// Whether the store already holds this Domain's row, the current
    /// metadata and every table: then opening it commits nothing (each
    /// commit is a disk flush on the way to `up`).
    fn is_set_up(&self, domain: &Domain) -> bool {
        let Ok(txn) = self.db.begin_read() else {
            return false;
        };
        let row = |table: Result<redb::ReadOnlyTable<&str, &[u8]>, redb::TableError>, key| {
            table
                .ok()
                .and_then(|t| t.get(key).ok().flatten().map(|v| v.value().to_vec()))
        };
        let metadata = row(txn.open_table(tables::METADATA), tables::METADATA_KEY)
            .is_some_and(|b| decode::<StoreMetadata>(&b).is_ok());
        let same_domain = row(txn.open_table(tables::DOMAIN), tables::DOMAIN_KEY)
            .and_then(|b| decode::<Domain>(&b).ok())
            .is_some_and(|stored| stored.domain_id == domain.domain_id);
        metadata
            && same_domain
            && txn.open_table(tables::GENERATIONS).is_ok()
            && txn.open_table(tables::PARTICIPANTS).is_ok()
            && txn.open_table(tables::SESSIONS).is_ok()
            && txn.open_table(tables::SESSION_TERMINALS).is_ok()
            && txn.open_table(tables::WORKSPACE_RULES).is_ok()
    }

    /// Writes the metadata and Domain rows of a new store, or checks them.
    fn check_identity(&self, path: &str, domain: &Domain) -> Result<(), StoreError> {
        if self.is_set_up(domain) {
            return Ok(());
        }
        let txn = self.db.begin_write()?;
        {
            let mut metadata = txn.open_table(tables::METADATA)?;
            let existing = metadata
                .get(tables::METADATA_KEY)?
                .map(|v| v.value().to_vec());
            match existing {
                None => {
                    metadata.insert(
                        tables::METADATA_KEY,
                        encode(&StoreMetadata::CURRENT)?.as_slice(),
                    )?;
                }
                Some(bytes) => {
                    decode::<StoreMetadata>(&bytes).map_err(|_| StoreError::Mismatch {
                        path: path.to_owned(),
                        reason: "has another schema; it was written by another version of Lazaret"
                            .into(),
                    })?;
                }
            }
            let mut table = txn.open_table(tables::DOMAIN)?;
            let existing = table.get(tables::DOMAIN_KEY)?.map(|v| v.value().to_vec());
            match existing {
                None => {
                    table.insert(tables::DOMAIN_KEY, encode(domain)?.as_slice())?;
                }
                Some(bytes) => {
                    let stored: Domain = decode(&bytes)?;
                    if stored.domain_id != domain.domain_id {
                        return Err(StoreError::Mismatch {
                            path: path.to_owned(),
                            reason: format!("belongs to Domain {}", stored.domain_id),
                        });
                    }
                }
            }
            txn.open_table(tables::GENERATIONS)?;
            txn.open_table(tables::PARTICIPANTS)?;
            txn.open_table(tables::SESSIONS)?;
            txn.open_table(tables::SESSION_TERMINALS)?;
            txn.open_table(tables::WORKSPACE_RULES)?;
        }
        txn.commit()?;
        Ok(())
    }

    /// The newest generation, if any.
    pub fn latest_generation(&self) -> Result<Option<Generation>, StoreError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(tables::GENERATIONS)?;
        let last = table.last()?;
        last.map(|(_, v)| decode(v.value())).transpose()
    }

    /// The newest generation that is not closed: a running or stale one.
    pub fn open_generation(&self) -> Result<Option<Generation>, StoreError> {
        Ok(self
            .latest_generation()?
            .filter(|g| g.state != GenerationState::Closed))
    }

    /// The number the next generation gets.
    pub fn next_generation_id(&self) -> Result<GenerationId, StoreError> {
        Ok(GenerationId(
            self.latest_generation()?
                .map_or(1, |g| g.generation_id.0 + 1),
        ))
    }

    /// Writes a generation row.
    pub fn put_generation(&self, generation: &Generation) -> Result<(), StoreError> {
        let txn = self.db.begin_write()?;
        txn.open_table(tables::GENERATIONS)?
            .insert(generation.generation_id.0, encode(generation)?.as_slice())?;
        txn.commit()?;
        Ok(())
    }

    /// Writes a participant row.
    pub fn put_participant(&self, slot: Slot, participant: &Participant) -> Result<(), StoreError> {
        self.put_participants(&[(slot, participant)], None)
    }

    /// Writes several participants' rows and, if given, their generation's
    /// in one transaction: all or none.
    pub fn put_participants(
        &self,
        rows: &[(Slot, &Participant)],
        generation: Option<&Generation>,
    ) -> Result<(), StoreError> {
        self.put_participants_and_rules(rows, generation, None)
    }

    /// [`put_participants`](Self::put_participants), and, if given, the
    /// encoded `WorkspaceRules` a generation routes by, replacing those of
    /// every earlier one: all in one transaction.
    pub fn put_participants_and_rules(
        &self,
        rows: &[(Slot, &Participant)],
        generation: Option<&Generation>,
        rules: Option<(GenerationId, &[u8])>,
    ) -> Result<(), StoreError> {
        let txn = self.db.begin_write()?;
        if let Some((routed_by, encoded)) = rules {
            let mut table = txn.open_table(tables::WORKSPACE_RULES)?;
            table.retain(|generation, _| generation > routed_by.0)?;
            table.insert(routed_by.0, encoded)?;
        }
        {
            let mut table = txn.open_table(tables::PARTICIPANTS)?;
            for &(slot, participant) in rows {
                table.insert(
                    (participant.generation_id.0, slot.0),
                    encode(participant)?.as_slice(),
                )?;
            }
        }
        if let Some(generation) = generation {
            txn.open_table(tables::GENERATIONS)?
                .insert(generation.generation_id.0, encode(generation)?.as_slice())?;
        }
        txn.commit()?;
        Ok(())
    }

    /// Writes a session's row and its terminal's row in one transaction.
    pub fn put_session_state(
        &self,
        session: &Session,
        terminal: &SessionTerminal,
    ) -> Result<(), StoreError> {
        let key = |generation: GenerationId, session: lazaret_proto::ids::SessionId| {
            (generation.0, u128::from_be_bytes(session.0))
        };
        let txn = self.db.begin_write()?;
        txn.open_table(tables::SESSIONS)?.insert(
            key(session.generation_id, session.session_id),
            encode(session)?.as_slice(),
        )?;
        txn.open_table(tables::SESSION_TERMINALS)?.insert(
            key(terminal.generation_id, terminal.session_id),
            encode(terminal)?.as_slice(),
        )?;
        txn.commit()?;
        Ok(())
    }

    /// The workspace rules the newest generation that recorded any routed
    /// by, and that generation; `None` before the first.
    pub fn last_workspace_rules(
        &self,
    ) -> Result<Option<(GenerationId, WorkspaceRules)>, StoreError> {
        let txn = self.db.begin_read()?;
        let table = match txn.open_table(tables::WORKSPACE_RULES) {
            Ok(table) => table,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let last = table.last()?;
        last.map(|(k, v)| Ok((GenerationId(k.value()), decode(v.value())?)))
            .transpose()
    }

    /// Every generation, oldest first.
    pub fn generations(&self) -> Result<Vec<Generation>, StoreError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(tables::GENERATIONS)?;
        table.iter()?.map(|row| decode(row?.1.value())).collect()
    }

    /// The sessions of a generation and their terminals.
    pub fn sessions(
        &self,
        generation: GenerationId,
    ) -> Result<Vec<(Session, Option<SessionTerminal>)>, StoreError> {
        let txn = self.db.begin_read()?;
        let sessions = txn.open_table(tables::SESSIONS)?;
        let terminals = txn.open_table(tables::SESSION_TERMINALS)?;
        let range = (generation.0, 0)..=(generation.0, u128::MAX);
        let mut out = Vec::new();
        for row in sessions.range(range)? {
            let (key, value) = row?;
            let session: Session = decode(value.value())?;
            let terminal = terminals
                .get(key.value())?
                .map(|v| decode::<SessionTerminal>(v.value()))
                .transpose()?;
            out.push((session, terminal));
        }
        Ok(out)
    }

    /// The participants of a generation, by slot.
    pub fn participants(
        &self,
        generation: GenerationId,
    ) -> Result<Vec<(Slot, Participant)>, StoreError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(tables::PARTICIPANTS)?;
        let mut out = Vec::new();
        for row in table.range((generation.0, 0)..=(generation.0, u32::MAX))? {
            let (key, value) = row?;
            let participant: Participant = decode(value.value())?;
            let slot = key.value().1;
            if !participant.is_consistent() {
                return Err(StoreError::Corrupt {
                    generation: generation.0,
                    slot,
                });
            }
            out.push((Slot(slot), participant));
        }
        Ok(out)
    }
}

/// A Domain Store of a made-up Domain in a scratch directory, for tests.
#[cfg(test)]
pub(crate) fn scratch() -> (tempfile::TempDir, DomainStore) {
    let dir = tempfile::tempdir().unwrap();
    let retained = lazaret_hostfs::plan::ensure_root(
        &dir.path().join("domain"),
        rustix::process::getuid().as_raw(),
    )
    .unwrap();
    let domain = Domain {
        domain_id: lazaret_proto::ids::DomainId([7; 32]),
        profile_name: "p".into(),
        canonical_workspace: lazaret_proto::common::HostPath::from(std::path::Path::new("/w")),
    };
    let store = DomainStore::open(&retained, &domain).unwrap();
    (dir, store)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_newest_generations_workspace_rules_are_kept() {
        let (_dir, store) = scratch();
        for generation in [1, 2, 5] {
            store
                .put_participants_and_rules(&[], None, Some((GenerationId(generation), b"x")))
                .unwrap();
        }
        let txn = store.db.begin_read().unwrap();
        let table = txn.open_table(tables::WORKSPACE_RULES).unwrap();
        let kept: Vec<u64> = table
            .iter()
            .unwrap()
            .map(|row| row.unwrap().0.value())
            .collect();
        assert_eq!(kept, [5]);
        drop(table);
        drop(txn);
        // A row that is not rules stops the caller rather than being taken
        // for none.
        assert!(matches!(
            store.last_workspace_rules(),
            Err(StoreError::Decode(_))
        ));
    }
}
