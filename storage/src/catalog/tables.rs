//! Every table of the Storage Catalog database (`catalog.redb`).
//!
//! Table names and key layouts are on-disk format: they never change. A new
//! layout is a new table name and a new schema version in
//! [`StoreMetadata`](lazaret_proto::catalog::StoreMetadata). Values are the
//! `lazaret_proto` records in their versioned postcard envelope
//! (`lazaret_proto::codec`), so a row is decoded by the same rules as a
//! record on any channel.

use redb::TableDefinition;

/// The schema metadata table: one row, [`METADATA_KEY`], holding the encoded
/// `StoreMetadata` (`lazaret-storage-catalog-v1`, version 1).
pub const METADATA: TableDefinition<&str, &[u8]> =
    TableDefinition::new("lazaret_storage_catalog_metadata");

/// The key of the only row of [`METADATA`].
pub const METADATA_KEY: &str = "store";

/// Prepared artifacts by `PreparedArtifactId`: encoded `PreparedArtifact`.
pub const ARTIFACTS: TableDefinition<&[u8; 16], &[u8]> = TableDefinition::new("prepared_artifacts");

/// The Available artifact of each manifest digest: `ManifestDigest` to
/// `PreparedArtifactId`. At most one artifact per digest is indexed.
pub const ARTIFACTS_BY_DIGEST: TableDefinition<&[u8; 32], &[u8; 16]> =
    TableDefinition::new("prepared_artifacts_by_manifest_digest");

/// Leases by (`DomainId`, `GenerationId`): encoded `ArtifactLease`. A
/// generation holds at most one lease, on its prepared lower.
pub const LEASES: TableDefinition<(&[u8; 32], u64), &[u8]> =
    TableDefinition::new("artifact_leases");

/// Prepare operations in flight by `OperationId`: encoded
/// `PrepareOperation`, recorded before any staging directory exists.
pub const OPERATIONS: TableDefinition<&[u8; 16], &[u8]> =
    TableDefinition::new("prepare_operations");
