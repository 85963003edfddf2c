//! The Storage Catalog's records: one redb database under the Storage Root,
//! shared by every Domain of the user, recording prepared artifacts
//! (unpacked base images keyed by manifest digest), the leases Domain
//! generations hold on them, and prepare operations still in flight.
//!
//! This module owns the row shapes; the schema's `StorageCatalog` class is
//! the database itself, named by its [`StoreMetadata`]. Any Host
//! Coordinator of the user may write the catalog, so nothing here is trusted
//! beyond its shape: an artifact's files are re-validated before use, and a
//! prepare operation's process identity is re-proven before recovery acts
//! on it.

use serde::{Deserialize, Serialize};

use crate::codec::WireRecord;
use crate::common::{HostPath, UnixTimeNs, closed_version, schema_id};
use crate::ids::{DomainId, GenerationId, ManifestDigest, OperationId, PreparedArtifactId};
use crate::process::HostProcessIdentity;

schema_id!(
    /// The Storage Catalog's schema identifier, `lazaret-storage-catalog-v1`.
    StorageCatalogSchemaId = "lazaret-storage-catalog-v1"
);

closed_version!(
    /// The Storage Catalog's schema version. v1 is the only one.
    StorageCatalogSchemaVersion {
        /// Schema version 1.
        V1 = 1,
    }
);

/// The metadata row of the Storage Catalog: which schema the database
/// holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreMetadata {
    /// Always `lazaret-storage-catalog-v1`.
    pub schema_id: StorageCatalogSchemaId,
    /// Always 1.
    pub schema_version: StorageCatalogSchemaVersion,
}

impl StoreMetadata {
    /// The metadata this build writes and reads.
    pub const CURRENT: Self = Self {
        schema_id: StorageCatalogSchemaId,
        schema_version: StorageCatalogSchemaVersion::V1,
    };
}

impl WireRecord for StoreMetadata {
    const NAME: &'static str = "StorageCatalogMetadata";
    const MAX_ENCODED_LEN: usize = 64;
}

/// Where an image came from, in the form it was given and resolved: what a
/// prepared artifact is looked up by besides its manifest digest.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ImageSourceIdentity {
    /// A registry reference such as `docker.io/library/debian:trixie`.
    Registry {
        /// The reference as configured.
        reference: String,
    },
    /// A local OCI image layout directory and tag (`oci:PATH:TAG`).
    OciLayout {
        /// The layout directory's canonical path.
        path: HostPath,
        /// The tag selected in the layout's index.
        tag: String,
    },
    /// A local OCI archive (`oci-archive:PATH`).
    OciArchive {
        /// The archive's canonical path.
        path: HostPath,
    },
}

/// Whether an artifact may be leased.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ArtifactState {
    /// Complete and leasable.
    Available,
    /// Being deleted; no new lease may be taken.
    Reclaiming,
}

/// One unpacked image in the catalog.
///
/// The seed's field list is partial after `selected_manifest_digest`; the
/// state, directory, size and time are what the catalog needs to lease,
/// show and reclaim an artifact.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedArtifact {
    /// The artifact.
    pub prepared_artifact_id: PreparedArtifactId,
    /// Where the image came from.
    pub source_identity: ImageSourceIdentity,
    /// The manifest that was unpacked.
    pub selected_manifest_digest: ManifestDigest,
    /// Whether it may be leased.
    pub state: ArtifactState,
    /// The artifact's directory, relative to the catalog's artifact root.
    pub artifact_dir: HostPath,
    /// Bytes the unpacked tree occupies.
    pub unpacked_bytes: u64,
    /// When preparation finished.
    pub prepared_at: UnixTimeNs,
}

impl WireRecord for PreparedArtifact {
    const NAME: &'static str = "PreparedArtifact";
    const MAX_ENCODED_LEN: usize = 16 * 1024;
}

/// One generation's hold on an artifact; an artifact with a lease is never
/// reclaimed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ArtifactLease {
    /// The artifact held.
    pub prepared_artifact_id: PreparedArtifactId,
    /// The holding Domain.
    pub domain_id: DomainId,
    /// The holding generation.
    pub generation_id: GenerationId,
}

impl WireRecord for ArtifactLease {
    const NAME: &'static str = "ArtifactLease";
    const MAX_ENCODED_LEN: usize = 128;
}

/// A preparation in flight: recorded before fetching or unpacking starts,
/// removed once the artifact is Available or its staging is cleaned up.
///
/// The seed's field list is partial after `source_identity`; the staging
/// directory, the preparing process and the start time are what recovery
/// needs to tell a live preparation from an abandoned one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrepareOperation {
    /// The operation.
    pub operation_id: OperationId,
    /// The id the artifact will have when done.
    pub expected_artifact_id: PreparedArtifactId,
    /// The image being prepared.
    pub source_identity: ImageSourceIdentity,
    /// The staging directory, relative to the catalog's staging root.
    pub staging_dir: HostPath,
    /// The process doing the work.
    pub preparer: HostProcessIdentity,
    /// When the operation was recorded.
    pub started_at: UnixTimeNs,
}

impl WireRecord for PrepareOperation {
    const NAME: &'static str = "PrepareOperation";
    const MAX_ENCODED_LEN: usize = 16 * 1024;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec;
    use crate::process::tests::pidfs_identity;
    use crate::test_support::{
        assert_rejects_bad_envelopes, assert_rejects_unknown_discriminant, round_trip,
    };

    #[test]
    fn metadata_round_trips_and_is_exact() {
        let bytes = round_trip(&StoreMetadata::CURRENT);
        assert_eq!(&bytes[2..bytes.len() - 1], b"lazaret-storage-catalog-v1");
        assert_eq!(bytes[bytes.len() - 1], 1);
        assert_rejects_bad_envelopes(&StoreMetadata::CURRENT);
        let mut v2 = bytes.clone();
        *v2.last_mut().unwrap() = 2;
        assert!(codec::decode::<StoreMetadata>(&v2).is_err());
        let mut renamed = bytes;
        let last_char = renamed.len() - 2;
        renamed[last_char] = b'2';
        assert!(codec::decode::<StoreMetadata>(&renamed).is_err());
    }

    #[test]
    fn rows_round_trip() {
        let artifact = PreparedArtifact {
            prepared_artifact_id: PreparedArtifactId([1; 16]),
            source_identity: ImageSourceIdentity::OciLayout {
                path: HostPath::from("/images/busybox"),
                tag: "latest".into(),
            },
            selected_manifest_digest: ManifestDigest([2; 32]),
            state: ArtifactState::Reclaiming,
            artifact_dir: HostPath::from("0101"),
            unpacked_bytes: 1 << 20,
            prepared_at: UnixTimeNs(9),
        };
        let bytes = round_trip(&artifact);
        assert_rejects_bad_envelopes(&artifact);
        // version, 16 id bytes, then the source variant.
        assert_rejects_unknown_discriminant::<PreparedArtifact>(bytes, 17);

        let lease = ArtifactLease {
            prepared_artifact_id: PreparedArtifactId([1; 16]),
            domain_id: DomainId([3; 32]),
            generation_id: GenerationId(4),
        };
        round_trip(&lease);
        assert_rejects_bad_envelopes(&lease);

        for source in [
            ImageSourceIdentity::Registry {
                reference: "docker.io/library/debian:trixie".into(),
            },
            ImageSourceIdentity::OciArchive {
                path: HostPath::from("/images/a.tar"),
            },
        ] {
            let operation = PrepareOperation {
                operation_id: OperationId([5; 16]),
                expected_artifact_id: PreparedArtifactId([6; 16]),
                source_identity: source,
                staging_dir: HostPath::from("op-0505"),
                preparer: pidfs_identity(),
                started_at: UnixTimeNs(10),
            };
            round_trip(&operation);
            assert_rejects_bad_envelopes(&operation);
        }
    }
}
