//! Images: turning a profile's `image` reference into an unpacked root
//! filesystem.
//!
//! This module owns the image side of preparing a prepared lower, in the
//! order the Storage Catalog ([`crate::catalog`]) drives it:
//! 1. parse the reference ([`reference`]): `oci:PATH[:TAG]`,
//!    `oci-archive:PATH[:TAG]` or a registry reference;
//! 2. for a registry, ask it for the manifest digest and copy the image into
//!    a local OCI layout with skopeo, bounded in time ([`fetch`]); for an
//!    archive, extract it safely into a staging directory ([`extract_archive`]);
//! 3. select and verify one image manifest from the layout ([`layout`]);
//! 4. unpack its layers, bottom first, applying whiteouts and refusing
//!    anything that could escape the destination or create a device
//!    ([`unpack`], over the confined opens of `lazaret_hostfs`).
//!
//! Trust: a reference is only text; a layout's blobs are believed only once
//! their SHA-256 digest matches the descriptor that names them; layer
//! content is hostile until proven otherwise, and every write it causes is
//! made relative to the destination's descriptor with `RESOLVE_BENEATH`.
//! This module records nothing: durable intent and leases are the
//! catalog's.

pub mod fetch;
pub mod layout;
pub mod reference;
pub mod unpack;

use std::io::{self, Read};
use std::path::Path;

use lazaret_proto::ids::{ManifestDigest, PreparedArtifactId};
use rustix::fd::OwnedFd;
use rustix::fs::OFlags;
use sha2::{Digest, Sha256};

pub use layout::{Compression, ImageConfig, Layer, OciLayout, ResolvedImage};
pub use reference::{ImageSource, RegistryReference, parse_reference};
pub use unpack::{UnpackStats, Unpacker};

/// Why an image could not be read, fetched or unpacked.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The `image` text is not a reference Lazaret understands.
    #[error("image reference `{reference}` {reason}")]
    Reference {
        /// The text as given.
        reference: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The path of an `oci:` reference is not an OCI image layout.
    #[error("{path} is not an OCI image layout: {reason}")]
    NotLayout {
        /// The path.
        path: String,
        /// Why not.
        reason: String,
    },
    /// A file operation on image content failed.
    #[error("cannot {operation} {path}")]
    Io {
        /// What was attempted.
        operation: &'static str,
        /// The file.
        path: String,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },
    /// A JSON document of the image is malformed.
    #[error("the {what} {path} is not valid JSON of the expected shape")]
    Json {
        /// Which document.
        what: &'static str,
        /// Where it is.
        path: String,
        /// What the parser said.
        #[source]
        source: serde_json::Error,
    },
    /// A document or blob breaks a rule of the image format.
    #[error("the {what} {path} {reason}")]
    InvalidDocument {
        /// Which document.
        what: &'static str,
        /// Where it is.
        path: String,
        /// The rule broken.
        reason: String,
    },
    /// A digest uses an algorithm other than SHA-256.
    #[error("{origin} names content by `{digest}`; only sha256 digests are supported")]
    UnsupportedDigest {
        /// The digest as written.
        digest: String,
        /// Where it was found.
        origin: String,
    },
    /// A manifest, configuration or layer of a kind Lazaret cannot use.
    #[error("unsupported {what} media type `{media_type}`: {hint}")]
    UnsupportedMediaType {
        /// What had the media type.
        what: &'static str,
        /// The media type.
        media_type: String,
        /// What to do.
        hint: &'static str,
    },
    /// A blob's content does not match the digest that names it.
    #[error(
        "blob {blob} has digest {actual}, but its descriptor says {expected}; the image is corrupt or was tampered with: fetch or build it again"
    )]
    DigestMismatch {
        /// The blob's path.
        blob: String,
        /// The digest the descriptor gives.
        expected: String,
        /// The digest of the content.
        actual: String,
    },
    /// A blob's size does not match its descriptor.
    #[error(
        "blob {blob} is {actual} bytes, but its descriptor says {expected}; the image is corrupt or was tampered with: fetch or build it again"
    )]
    SizeMismatch {
        /// The blob's path.
        blob: String,
        /// The size the descriptor gives.
        expected: u64,
        /// The size found.
        actual: u64,
    },
    /// No manifest in the layout carries the tag.
    #[error("the OCI layout {layout} has no image tagged `{tag}`; tags present: {available}")]
    TagNotFound {
        /// The layout.
        layout: String,
        /// The tag asked for.
        tag: String,
        /// The tags it has.
        available: String,
    },
    /// No tag was given and the layout does not hold exactly one image or
    /// one tagged `latest`.
    #[error(
        "the OCI layout {layout} holds {count} images and none is tagged `latest`; name one as `oci:{layout}:TAG` (tags present: {available})"
    )]
    NoTag {
        /// The layout.
        layout: String,
        /// How many images it holds.
        count: usize,
        /// The tags it has.
        available: String,
    },
    /// An image index has no manifest for this host's platform.
    #[error("the image index of {layout} has no manifest for {platform} (it has: {available})")]
    NoPlatform {
        /// The layout or reference.
        layout: String,
        /// This host's platform.
        platform: String,
        /// The platforms it has.
        available: String,
    },
    /// The image is for another platform.
    #[error("the image {image} is for {found}, but this host runs {host}")]
    Platform {
        /// The image.
        image: String,
        /// Its platform.
        found: String,
        /// This host's platform.
        host: String,
    },
    /// A layer entry is refused: it could escape the destination, needs a
    /// privilege, or is malformed. Nothing of the image is kept.
    #[error("layer {layer}: entry `{entry}` {reason}; the image is refused")]
    RefusedEntry {
        /// The layer digest (or archive path).
        layer: String,
        /// The entry's path as written in the tar.
        entry: String,
        /// Why it is refused.
        reason: String,
    },
    /// An image would unpack to more than the disk or the bound allows.
    #[error(
        "layer {layer}: entry `{entry}` would bring the image's files to {needed} bytes, \
         past the {limit} bytes it may take (the free space of the storage's filesystem less \
         1 GiB, and at most 16 GiB unless LAZARET_IMAGE_MAX_BYTES sets another bound); the \
         image is refused before it fills the disk"
    )]
    TooLarge {
        /// The layer digest (or archive path).
        layer: String,
        /// The entry's path as written in the tar.
        entry: String,
        /// The bytes of file contents with this entry.
        needed: u64,
        /// The bound.
        limit: u64,
    },
    /// Writing a layer entry failed.
    #[error("layer {layer}: cannot {operation} `{entry}`")]
    Unpack {
        /// The layer digest (or archive path).
        layer: String,
        /// The entry's path as written in the tar.
        entry: String,
        /// What was attempted.
        operation: &'static str,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },
    /// A layer is not a readable (optionally gzip-compressed) tar.
    #[error("layer {layer} is not a readable tar stream")]
    Layer {
        /// The layer digest (or archive path).
        layer: String,
        /// What the reader said.
        #[source]
        source: io::Error,
    },
    /// skopeo is not installed.
    #[error(
        "registry images are fetched with skopeo, which is not installed (apt-get install skopeo)"
    )]
    SkopeoMissing {
        /// What the kernel said.
        #[source]
        source: io::Error,
    },
    /// A host program is there but could be replaced by someone else.
    #[error("{detail}")]
    UntrustedProgram {
        /// Which file or directory, and how to fix it.
        detail: String,
    },
    /// No registry could be reached.
    #[error(
        "no registry is reachable for {reference} ({detail}); this machine may be offline. Build a local image instead (packaging/build-busybox-image.sh DIR TAG) and set `image = \"oci:DIR:TAG\"` in the profile"
    )]
    RegistryUnreachable {
        /// The reference.
        reference: String,
        /// What skopeo said.
        detail: String,
    },
    /// The registry answered but the fetch failed.
    #[error("cannot fetch {reference} from its registry: {detail}")]
    RegistryFetch {
        /// The reference.
        reference: String,
        /// What skopeo said.
        detail: String,
    },
}

/// What preparing an image is doing, for a progress bar. Events are sent
/// at phase changes and about every MiB of layer data read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Asking a registry which manifest the reference names.
    Resolving {
        /// The reference.
        image: String,
    },
    /// Copying an image from a registry (no byte counts are known).
    Fetching {
        /// The reference.
        image: String,
    },
    /// Extracting an `oci-archive`.
    Extracting {
        /// Archive bytes read.
        bytes_done: u64,
        /// The archive's size.
        bytes_total: u64,
    },
    /// The reference names this manifest.
    Resolved {
        /// The manifest digest.
        manifest_digest: ManifestDigest,
        /// How many layers it has.
        layers: usize,
        /// Their compressed size.
        bytes_total: u64,
    },
    /// An artifact for the manifest exists already: nothing is unpacked.
    Reused {
        /// The artifact.
        artifact_id: PreparedArtifactId,
    },
    /// Unpacking layer `layer` (from 1) of `layers`.
    Unpacking {
        /// The layer being unpacked, from 1.
        layer: usize,
        /// How many layers there are.
        layers: usize,
        /// Compressed bytes read over all layers so far.
        bytes_done: u64,
        /// Compressed bytes of all layers.
        bytes_total: u64,
    },
    /// The artifact is in place.
    Prepared {
        /// The artifact.
        artifact_id: PreparedArtifactId,
        /// Bytes it occupies on disk.
        disk_bytes: u64,
        /// Device nodes and FIFOs the layers held, not created.
        skipped_nodes: u64,
    },
}

impl Progress {
    /// Work done and total, for a bar: compressed bytes while unpacking or
    /// extracting; `None` for the other phases.
    pub fn fraction(&self) -> Option<(u64, u64)> {
        match *self {
            Self::Unpacking {
                bytes_done,
                bytes_total,
                ..
            }
            | Self::Extracting {
                bytes_done,
                bytes_total,
            } => Some((bytes_done.min(bytes_total), bytes_total)),
            _ => None,
        }
    }
}

/// Binary megabytes with one decimal, for progress lines.
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1u32 << 20))
}

impl std::fmt::Display for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Resolving { image } => write!(f, "resolving {image}"),
            Self::Fetching { image } => write!(f, "fetching {image}"),
            Self::Extracting {
                bytes_done,
                bytes_total,
            } => write!(
                f,
                "extracting archive {} / {}",
                mib(*bytes_done),
                mib(*bytes_total)
            ),
            Self::Resolved {
                manifest_digest,
                layers,
                bytes_total,
            } => write!(
                f,
                "image {} ({layers} layers, {})",
                manifest_digest.to_oci_string(),
                mib(*bytes_total)
            ),
            Self::Reused { artifact_id } => write!(f, "using prepared image {artifact_id}"),
            Self::Unpacking {
                layer,
                layers,
                bytes_done,
                bytes_total,
            } => write!(
                f,
                "unpacking layer {layer}/{layers} {} / {}",
                mib(*bytes_done),
                mib(*bytes_total)
            ),
            Self::Prepared {
                artifact_id,
                disk_bytes,
                skipped_nodes,
            } => {
                write!(
                    f,
                    "prepared image {artifact_id} ({} on disk)",
                    mib(*disk_bytes)
                )?;
                if *skipped_nodes > 0 {
                    write!(
                        f,
                        "; {skipped_nodes} device nodes and FIFOs in its layers were skipped \
                         (the sandbox's /dev is its own)"
                    )?;
                }
                Ok(())
            }
        }
    }
}

/// Bytes between two progress reports.
const PROGRESS_STEP: u64 = 1 << 20;

/// A reader that counts what passes through it and reports progress every
/// [`PROGRESS_STEP`] bytes.
struct CountingReader<'p, R> {
    inner: R,
    read: u64,
    reported: u64,
    report: &'p mut dyn FnMut(u64),
}

impl<R: Read> Read for CountingReader<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        if self.read - self.reported >= PROGRESS_STEP {
            self.reported = self.read;
            (self.report)(self.read);
        }
        Ok(n)
    }
}

impl<'p, R: Read> CountingReader<'p, R> {
    fn new(inner: R, report: &'p mut dyn FnMut(u64)) -> Self {
        Self {
            inner,
            read: 0,
            reported: 0,
            report,
        }
    }
}

/// A [`CountingReader`] that also hashes what passes through it, so a blob
/// is verified as it is unpacked.
struct VerifyingReader<'p, R> {
    counting: CountingReader<'p, R>,
    hasher: Sha256,
}

impl<R: Read> Read for VerifyingReader<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.counting.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

impl<'p, R: Read> VerifyingReader<'p, R> {
    fn new(inner: R, report: &'p mut dyn FnMut(u64)) -> Self {
        Self {
            counting: CountingReader::new(inner, report),
            hasher: Sha256::new(),
        }
    }

    /// Reads what is left and checks size and digest.
    fn verify(mut self, blob: &str, digest: &[u8; 32], size: u64) -> Result<(), ImageError> {
        io::copy(&mut self, &mut io::sink()).map_err(|source| ImageError::Io {
            operation: "read",
            path: blob.to_owned(),
            source,
        })?;
        let read = self.counting.read;
        (self.counting.report)(read);
        if read != size {
            return Err(ImageError::SizeMismatch {
                blob: blob.to_owned(),
                expected: size,
                actual: read,
            });
        }
        let actual: [u8; 32] = self.hasher.finalize().into();
        if &actual != digest {
            return Err(ImageError::DigestMismatch {
                blob: blob.to_owned(),
                expected: format!("sha256:{}", lazaret_proto::ids::to_hex(digest)),
                actual: format!("sha256:{}", lazaret_proto::ids::to_hex(&actual)),
            });
        }
        Ok(())
    }
}

fn decompressed<'a, R: Read + 'a>(reader: R, compression: Compression) -> Box<dyn Read + 'a> {
    match compression {
        Compression::None => Box::new(reader),
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(reader)),
    }
}

/// Unpacks the layers of `image`, bottom first, into the directory `root`
/// (which should be empty), verifying each layer blob as it streams.
pub fn unpack_layers(
    layout: &OciLayout,
    image: &ResolvedImage,
    root: OwnedFd,
    progress: &mut dyn FnMut(Progress),
) -> Result<UnpackStats, ImageError> {
    let layers = image.layers.len();
    let bytes_total = image.layer_bytes();
    let mut unpacker = Unpacker::new(root, true);
    let mut base = 0u64;
    for (index, layer) in image.layers.iter().enumerate() {
        let name = layer.name();
        let blob = layout.blob_path(&layer.digest.0);
        progress(Progress::Unpacking {
            layer: index + 1,
            layers,
            bytes_done: base,
            bytes_total,
        });
        let file = layout.open_layer(layer)?;
        let mut report = |read: u64| {
            progress(Progress::Unpacking {
                layer: index + 1,
                layers,
                bytes_done: base + read,
                bytes_total,
            })
        };
        let mut reader = VerifyingReader::new(file, &mut report);
        let applied = unpacker.apply_layer(decompressed(&mut reader, layer.compression), &name);
        let verified = reader.verify(&blob, &layer.digest.0, layer.size);
        // A corrupt blob explains whatever else went wrong.
        verified?;
        applied?;
        base += layer.size;
    }
    unpacker.finish(&layout.label())
}

/// Extracts the `oci-archive` at `archive` (a tar, optionally gzip
/// compressed, of an OCI image layout) into the directory `destination`,
/// with the same refusals as layer unpacking (whiteouts have no meaning in
/// an archive and are refused).
pub fn extract_archive(
    archive: &Path,
    destination: OwnedFd,
    progress: &mut dyn FnMut(Progress),
) -> Result<(), ImageError> {
    let label = archive.display().to_string();
    let io_error = |operation: &'static str| {
        let label = label.clone();
        move |source: io::Error| ImageError::Io {
            operation,
            path: label,
            source,
        }
    };
    // O_NONBLOCK: a FIFO at the path must not block the open; it is
    // refused below as not a regular file.
    let file = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(OFlags::NONBLOCK.bits() as i32)
            .open(archive)
            .map_err(io_error("open the OCI archive"))?
    };
    let metadata = file.metadata().map_err(io_error("stat the OCI archive"))?;
    if !metadata.is_file() {
        return Err(ImageError::InvalidDocument {
            what: "OCI archive",
            path: label,
            reason: "is not a regular file".to_owned(),
        });
    }
    let bytes_total = metadata.len();
    let mut buffered = io::BufReader::new(file);
    let gzip = {
        use std::io::BufRead;
        let head = buffered
            .fill_buf()
            .map_err(io_error("read the OCI archive"))?;
        head.starts_with(&[0x1f, 0x8b])
    };
    let mut report = |read: u64| {
        progress(Progress::Extracting {
            bytes_done: read,
            bytes_total,
        })
    };
    report(0);
    let mut reader = CountingReader::new(buffered, &mut report);
    let mut unpacker = Unpacker::new(destination, false);
    let compression = if gzip {
        Compression::Gzip
    } else {
        Compression::None
    };
    unpacker.apply_layer(decompressed(&mut reader, compression), &label)?;
    drop(reader);
    report(bytes_total);
    // The extracted layout is read, not kept: no need to measure it.
    unpacker.finish_unmeasured(&label).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verifying_reader_reports_and_checks() {
        let data = vec![7u8; 3 << 20];
        let digest: [u8; 32] = Sha256::digest(&data).into();
        let mut reports = Vec::new();
        let mut report = |n: u64| reports.push(n);
        let mut reader = VerifyingReader::new(&data[..], &mut report);
        let mut first = vec![0u8; 1 << 20];
        reader.read_exact(&mut first).unwrap();
        reader.verify("blob", &digest, data.len() as u64).unwrap();
        assert_eq!(reports.first(), Some(&(1 << 20)));
        assert_eq!(reports.last(), Some(&(3 << 20)));

        let mut quiet = |_: u64| {};
        let reader = VerifyingReader::new(&data[..], &mut quiet);
        assert!(matches!(
            reader.verify("blob", &[0; 32], data.len() as u64),
            Err(ImageError::DigestMismatch { .. })
        ));
        let reader = VerifyingReader::new(&data[..], &mut quiet);
        assert!(matches!(
            reader.verify("blob", &digest, 1),
            Err(ImageError::SizeMismatch { .. })
        ));
    }
}
