//! Reading an OCI image layout: `oci-layout`, `index.json`, and the
//! content-addressed blobs beneath `blobs/sha256/`.
//!
//! This module owns selecting one image manifest from a layout (by the
//! `org.opencontainers.image.ref.name` tag, then by platform through any
//! nested index), verifying every blob it reads against its descriptor's
//! SHA-256 digest and size, and parsing the image configuration.
//!
//! Trust: the layout directory is the user's, but nothing in it is believed
//! until hashed: `index.json` only points at content, and every blob is
//! checked against the digest that names it. Blobs are opened beneath the
//! layout's descriptor with `RESOLVE_BENEATH`, so a symbolic link inside
//! the layout cannot reach a file outside it.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use lazaret_proto::ids::{ManifestDigest, Sha256Digest, parse_hex32};
use rustix::fd::{AsFd, OwnedFd};
use rustix::fs::{FileType, Mode, OFlags, ResolveFlags};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::ImageError;

/// The annotation that carries a manifest's tag in an image index.
pub const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// The largest manifest, index or configuration read, in bytes.
const MAX_DOCUMENT: u64 = 4 << 20;

/// What an unsupported manifest's error tells the user to do.
const MANIFEST_HINT: &str = "only OCI image manifests and Docker v2 schema 2 manifests are \
     supported; convert the image with `skopeo copy --format oci`";

const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";

/// How a layer blob is compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// A plain tar.
    None,
    /// tar+gzip.
    Gzip,
}

/// A content descriptor as it appears in an index or manifest.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    /// What the blob is.
    #[serde(default)]
    pub media_type: String,
    /// `sha256:<hex>`.
    pub digest: String,
    /// The blob's size in bytes.
    pub size: u64,
    /// Annotations, where the tag lives.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// The platform, in an index.
    #[serde(default)]
    pub platform: Option<Platform>,
}

/// The platform of an index entry.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Platform {
    /// `linux`.
    #[serde(default)]
    pub os: String,
    /// `amd64`, `arm64`, ...
    #[serde(default)]
    pub architecture: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct IndexDocument {
    manifests: Vec<Descriptor>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ManifestDocument {
    #[serde(default)]
    media_type: Option<String>,
    config: Descriptor,
    layers: Vec<Descriptor>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LayoutFile {
    image_layout_version: String,
}

/// A layer to unpack: a verified-on-read blob and its compression.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layer {
    /// The blob's digest.
    pub digest: Sha256Digest,
    /// The blob's size in bytes.
    pub size: u64,
    /// How it is compressed.
    pub compression: Compression,
}

impl Layer {
    /// `sha256:<hex>`, as layers are named in messages.
    pub fn name(&self) -> String {
        format!("sha256:{}", self.digest.to_hex())
    }
}

/// The parts of the OCI image configuration a sandbox needs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageConfig {
    /// `os` (`linux`).
    pub os: String,
    /// `architecture` (`amd64`).
    pub architecture: String,
    /// `config.Env`: `NAME=value` strings.
    pub env: Vec<String>,
    /// `config.Entrypoint`.
    pub entrypoint: Vec<String>,
    /// `config.Cmd`.
    pub cmd: Vec<String>,
    /// `config.WorkingDir`, when set and nonempty.
    pub working_dir: Option<String>,
    /// `config.User`, when set and nonempty.
    pub user: Option<String>,
}

#[derive(Deserialize)]
struct ConfigDocument {
    #[serde(default)]
    os: String,
    #[serde(default)]
    architecture: String,
    #[serde(default)]
    config: Option<ExecConfig>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ExecConfig {
    #[serde(default)]
    env: Option<Vec<String>>,
    #[serde(default)]
    entrypoint: Option<Vec<String>>,
    #[serde(default)]
    cmd: Option<Vec<String>>,
    #[serde(default)]
    working_dir: Option<String>,
    #[serde(default)]
    user: Option<String>,
}

impl ImageConfig {
    /// Parses an OCI (or Docker) image configuration and checks that it is
    /// for this host's platform. `origin` names it in errors.
    pub fn parse(bytes: &[u8], origin: &str) -> Result<Self, ImageError> {
        let document: ConfigDocument =
            serde_json::from_slice(bytes).map_err(|source| ImageError::Json {
                what: "image configuration",
                path: origin.to_owned(),
                source,
            })?;
        let (os, architecture) = host_platform();
        if !document.os.is_empty() && document.os != os
            || !document.architecture.is_empty() && document.architecture != architecture
        {
            return Err(ImageError::Platform {
                image: origin.to_owned(),
                found: format!("{}/{}", document.os, document.architecture),
                host: format!("{os}/{architecture}"),
            });
        }
        let exec = document.config.unwrap_or_default();
        Ok(Self {
            os: document.os,
            architecture: document.architecture,
            env: exec.env.unwrap_or_default(),
            entrypoint: exec.entrypoint.unwrap_or_default(),
            cmd: exec.cmd.unwrap_or_default(),
            working_dir: exec.working_dir.filter(|d| !d.is_empty()),
            user: exec.user.filter(|u| !u.is_empty()),
        })
    }
}

/// This host's platform in OCI terms: (`linux`, GOARCH name).
pub fn host_platform() -> (&'static str, &'static str) {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    };
    ("linux", arch)
}

/// One image selected from a layout, its manifest and configuration read
/// and verified.
#[derive(Clone, Debug)]
pub struct ResolvedImage {
    /// The digest of the selected image manifest.
    pub manifest_digest: ManifestDigest,
    /// The tag the manifest was selected by, if it had one.
    pub tag: Option<String>,
    /// The image configuration.
    pub config: ImageConfig,
    /// The configuration blob as read (its digest verified).
    pub config_bytes: Vec<u8>,
    /// The layers, bottom first.
    pub layers: Vec<Layer>,
}

impl ResolvedImage {
    /// The compressed size of all layers.
    pub fn layer_bytes(&self) -> u64 {
        self.layers.iter().map(|l| l.size).sum()
    }
}

/// An OCI image layout directory, held open.
#[derive(Debug)]
pub struct OciLayout {
    dir: OwnedFd,
    label: PathBuf,
}

fn parse_digest(digest: &str, origin: &str) -> Result<[u8; 32], ImageError> {
    let (algorithm, hex) = digest.split_once(':').unwrap_or(("", digest));
    if algorithm != "sha256" {
        return Err(ImageError::UnsupportedDigest {
            digest: digest.to_owned(),
            origin: origin.to_owned(),
        });
    }
    parse_hex32(hex).ok_or_else(|| ImageError::InvalidDocument {
        what: "descriptor",
        path: origin.to_owned(),
        reason: format!("digest `{digest}` is not `sha256:` and 64 lowercase hex digits"),
    })
}

fn is_index(media_type: &str) -> bool {
    media_type == OCI_INDEX || media_type == DOCKER_LIST
}

fn is_manifest(media_type: &str) -> bool {
    media_type == OCI_MANIFEST || media_type == DOCKER_MANIFEST
}

/// The compression a layer media type implies.
pub fn layer_compression(media_type: &str) -> Result<Compression, ImageError> {
    match media_type {
        "application/vnd.oci.image.layer.v1.tar"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar"
        | "application/vnd.docker.image.rootfs.diff.tar" => Ok(Compression::None),
        "application/vnd.oci.image.layer.v1.tar+gzip"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
        | "application/vnd.docker.image.rootfs.diff.tar.gzip"
        | "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip" => Ok(Compression::Gzip),
        "application/vnd.oci.image.layer.v1.tar+zstd"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd" => {
            Err(ImageError::UnsupportedMediaType {
                what: "layer",
                media_type: media_type.to_owned(),
                hint: "zstd layers are not supported; recompress the image with gzip, e.g. `skopeo copy --dest-compress-format gzip oci:SRC:TAG oci:DEST:TAG`",
            })
        }
        other => Err(ImageError::UnsupportedMediaType {
            what: "layer",
            media_type: other.to_owned(),
            hint: "only OCI and Docker v2 tar and tar+gzip layers can be unpacked",
        }),
    }
}

fn tags(manifests: &[Descriptor]) -> String {
    let tags: Vec<&str> = manifests
        .iter()
        .filter_map(|d| d.annotations.get(REF_NAME).map(String::as_str))
        .collect();
    if tags.is_empty() {
        "none".to_owned()
    } else {
        tags.join(", ")
    }
}

fn matches_host(descriptor: &Descriptor) -> bool {
    let (os, arch) = host_platform();
    descriptor
        .platform
        .as_ref()
        .is_some_and(|p| p.os == os && p.architecture == arch)
}

/// The manifest for this host's platform among `manifests`; the error
/// names the layout (`layout`) and the platforms it offers.
fn host_manifest(
    manifests: &[Descriptor],
    layout: impl FnOnce() -> String,
) -> Result<&Descriptor, ImageError> {
    manifests.iter().find(|d| matches_host(d)).ok_or_else(|| {
        let (os, arch) = host_platform();
        ImageError::NoPlatform {
            layout: layout(),
            platform: format!("{os}/{arch}"),
            available: manifests
                .iter()
                .filter_map(|d| d.platform.as_ref())
                .map(|p| format!("{}/{}", p.os, p.architecture))
                .collect::<Vec<_>>()
                .join(", "),
        }
    })
}

impl OciLayout {
    /// Opens the layout directory at `path` (the user's path; symbolic
    /// links in it are followed once, here) and checks its `oci-layout`
    /// file.
    pub fn open(path: &Path) -> Result<Self, ImageError> {
        let label = std::fs::canonicalize(path).map_err(|source| ImageError::NotLayout {
            path: path.display().to_string(),
            reason: format!("cannot open it: {source}"),
        })?;
        let dir = rustix::fs::openat2(
            rustix::fs::CWD,
            &label,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::NO_MAGICLINKS,
        )
        .map_err(|e| ImageError::NotLayout {
            path: label.display().to_string(),
            reason: format!("cannot open it as a directory: {}", std::io::Error::from(e)),
        })?;
        Self::from_dir(dir, label)
    }

    /// Uses an already opened layout directory (a staging directory the
    /// catalog made) labelled `label` in messages.
    pub fn from_dir(dir: OwnedFd, label: PathBuf) -> Result<Self, ImageError> {
        let layout = Self { dir, label };
        let bytes = layout.read_file("oci-layout", 4096)?;
        let file: LayoutFile =
            serde_json::from_slice(&bytes).map_err(|source| ImageError::Json {
                what: "oci-layout file",
                path: layout.path_of("oci-layout"),
                source,
            })?;
        if file.image_layout_version != "1.0.0" {
            return Err(ImageError::NotLayout {
                path: layout.label(),
                reason: format!(
                    "its imageLayoutVersion is `{}`, not 1.0.0",
                    file.image_layout_version
                ),
            });
        }
        Ok(layout)
    }

    /// The layout's path, for messages.
    pub fn label(&self) -> String {
        self.label.display().to_string()
    }

    /// The layout's canonical path, as resolved when it was opened.
    pub fn path(&self) -> &Path {
        &self.label
    }

    fn path_of(&self, name: &str) -> String {
        self.label.join(name).display().to_string()
    }

    fn open_file(&self, name: &str) -> Result<(File, u64), ImageError> {
        let fd = rustix::fs::openat2(
            &self.dir,
            name,
            // O_NONBLOCK: opening a FIFO planted in the layout must not
            // wait for a writer; it is refused as not a regular file.
            OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
        )
        .map_err(|e| {
            if e == rustix::io::Errno::NOENT && !name.starts_with("blobs/") {
                ImageError::NotLayout {
                    path: self.label(),
                    reason: format!("it has no `{name}`"),
                }
            } else {
                ImageError::Io {
                    operation: "open",
                    path: self.path_of(name),
                    source: e.into(),
                }
            }
        })?;
        let stat = rustix::fs::fstat(&fd).map_err(|e| ImageError::Io {
            operation: "stat",
            path: self.path_of(name),
            source: e.into(),
        })?;
        if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
            return Err(ImageError::InvalidDocument {
                what: "layout entry",
                path: self.path_of(name),
                reason: "is not a regular file".to_owned(),
            });
        }
        Ok((File::from(fd), u64::try_from(stat.st_size).unwrap_or(0)))
    }

    fn read_file(&self, name: &str, max: u64) -> Result<Vec<u8>, ImageError> {
        let (file, size) = self.open_file(name)?;
        if size > max {
            return Err(ImageError::InvalidDocument {
                what: "layout entry",
                path: self.path_of(name),
                reason: format!("is {size} bytes, more than the {max} allowed"),
            });
        }
        let mut bytes = Vec::new();
        file.take(max + 1)
            .read_to_end(&mut bytes)
            .map_err(|source| ImageError::Io {
                operation: "read",
                path: self.path_of(name),
                source,
            })?;
        Ok(bytes)
    }

    fn blob_name(digest: &[u8; 32]) -> String {
        format!("blobs/sha256/{}", lazaret_proto::ids::to_hex(digest))
    }

    /// The path of the blob with `digest`, for messages.
    pub fn blob_path(&self, digest: &[u8; 32]) -> String {
        self.path_of(&Self::blob_name(digest))
    }

    /// Opens the blob a layer names, for streaming; the caller verifies the
    /// digest and size as it reads (see [`super::VerifyingReader`]).
    pub fn open_layer(&self, layer: &Layer) -> Result<File, ImageError> {
        let name = Self::blob_name(&layer.digest.0);
        let (file, size) = self.open_file(&name)?;
        if size != layer.size {
            return Err(ImageError::SizeMismatch {
                blob: self.path_of(&name),
                expected: layer.size,
                actual: size,
            });
        }
        Ok(file)
    }

    /// Reads a small blob whole and verifies its digest and size.
    fn read_blob(
        &self,
        descriptor: &Descriptor,
        what: &'static str,
    ) -> Result<([u8; 32], Vec<u8>), ImageError> {
        let digest = parse_digest(&descriptor.digest, &self.label())?;
        let name = Self::blob_name(&digest);
        if descriptor.size > MAX_DOCUMENT {
            return Err(ImageError::InvalidDocument {
                what,
                path: self.path_of(&name),
                reason: format!(
                    "is {} bytes, more than the {MAX_DOCUMENT} allowed",
                    descriptor.size
                ),
            });
        }
        let bytes = self.read_file(&name, MAX_DOCUMENT)?;
        if bytes.len() as u64 != descriptor.size {
            return Err(ImageError::SizeMismatch {
                blob: self.path_of(&name),
                expected: descriptor.size,
                actual: bytes.len() as u64,
            });
        }
        let actual: [u8; 32] = Sha256::digest(&bytes).into();
        if actual != digest {
            return Err(ImageError::DigestMismatch {
                blob: self.path_of(&name),
                expected: descriptor.digest.clone(),
                actual: format!("sha256:{}", lazaret_proto::ids::to_hex(&actual)),
            });
        }
        Ok((digest, bytes))
    }

    /// Selects the image tagged `tag` (or, without a tag, the only image,
    /// else `latest`), follows nested indexes to this host's platform, and
    /// reads and verifies its manifest and configuration.
    pub fn resolve(&self, tag: Option<&str>) -> Result<ResolvedImage, ImageError> {
        let index_bytes = self.read_file("index.json", MAX_DOCUMENT)?;
        let index: IndexDocument =
            serde_json::from_slice(&index_bytes).map_err(|source| ImageError::Json {
                what: "image index",
                path: self.path_of("index.json"),
                source,
            })?;
        let candidates: Vec<&Descriptor> = match tag {
            Some(tag) => index
                .manifests
                .iter()
                .filter(|d| d.annotations.get(REF_NAME).map(String::as_str) == Some(tag))
                .collect(),
            None if index.manifests.len() == 1 => index.manifests.iter().collect(),
            None => index
                .manifests
                .iter()
                .filter(|d| d.annotations.get(REF_NAME).map(String::as_str) == Some("latest"))
                .collect(),
        };
        let selected = match candidates.as_slice() {
            [] => {
                return Err(match tag {
                    Some(tag) => ImageError::TagNotFound {
                        layout: self.label(),
                        tag: tag.to_owned(),
                        available: tags(&index.manifests),
                    },
                    None => ImageError::NoTag {
                        layout: self.label(),
                        count: index.manifests.len(),
                        available: tags(&index.manifests),
                    },
                });
            }
            [one] => *one,
            many => many
                .iter()
                .copied()
                .find(|d| matches_host(d))
                .unwrap_or(many[0]),
        };
        let selected_tag = selected.annotations.get(REF_NAME).cloned();
        let mut descriptor = selected.clone();
        for _ in 0..4 {
            let (digest, bytes) = self.read_blob(&descriptor, "manifest")?;
            let media_type = if descriptor.media_type.is_empty() {
                sniff_media_type(&bytes)
            } else {
                descriptor.media_type.clone()
            };
            if is_index(&media_type) {
                let nested: IndexDocument =
                    serde_json::from_slice(&bytes).map_err(|source| ImageError::Json {
                        what: "nested image index",
                        path: self.blob_path(&digest),
                        source,
                    })?;
                descriptor = host_manifest(&nested.manifests, || self.label())?.clone();
                continue;
            }
            if !is_manifest(&media_type) {
                return Err(ImageError::UnsupportedMediaType {
                    what: "manifest",
                    media_type,
                    hint: MANIFEST_HINT,
                });
            }
            return self.read_manifest(digest, &bytes, selected_tag);
        }
        Err(ImageError::InvalidDocument {
            what: "image index",
            path: self.path_of("index.json"),
            reason: "nests indexes more than 4 deep".to_owned(),
        })
    }

    fn read_manifest(
        &self,
        digest: [u8; 32],
        bytes: &[u8],
        tag: Option<String>,
    ) -> Result<ResolvedImage, ImageError> {
        let path = self.blob_path(&digest);
        let manifest: ManifestDocument =
            serde_json::from_slice(bytes).map_err(|source| ImageError::Json {
                what: "image manifest",
                path: path.clone(),
                source,
            })?;
        if let Some(media_type) = &manifest.media_type
            && !is_manifest(media_type)
        {
            return Err(ImageError::UnsupportedMediaType {
                what: "manifest",
                media_type: media_type.clone(),
                hint: MANIFEST_HINT,
            });
        }
        if !manifest.config.media_type.is_empty()
            && manifest.config.media_type != OCI_CONFIG
            && manifest.config.media_type != DOCKER_CONFIG
        {
            return Err(ImageError::UnsupportedMediaType {
                what: "image configuration",
                media_type: manifest.config.media_type.clone(),
                hint: "this is not a container image (an artifact of another kind?)",
            });
        }
        let (_, config_bytes) = self.read_blob(&manifest.config, "image configuration")?;
        let config = ImageConfig::parse(&config_bytes, &self.label())?;
        let layers = manifest
            .layers
            .iter()
            .map(|d| {
                Ok(Layer {
                    digest: Sha256Digest(parse_digest(&d.digest, &path)?),
                    size: d.size,
                    compression: layer_compression(&d.media_type)?,
                })
            })
            .collect::<Result<Vec<_>, ImageError>>()?;
        Ok(ResolvedImage {
            manifest_digest: ManifestDigest(digest),
            tag,
            config,
            config_bytes,
            layers,
        })
    }

    /// The directory descriptor.
    pub fn dir(&self) -> rustix::fd::BorrowedFd<'_> {
        self.dir.as_fd()
    }
}

/// The media type of a manifest or index that does not declare one.
fn sniff_media_type(bytes: &[u8]) -> String {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Sniff {
        #[serde(default)]
        media_type: Option<String>,
        #[serde(default)]
        manifests: Option<serde_json::Value>,
    }
    match serde_json::from_slice::<Sniff>(bytes) {
        Ok(Sniff {
            media_type: Some(m),
            ..
        }) => m,
        Ok(Sniff {
            manifests: Some(_), ..
        }) => OCI_INDEX.to_owned(),
        _ => OCI_MANIFEST.to_owned(),
    }
}

/// Picks the manifest for this host from a registry's raw manifest or index
/// (what `skopeo inspect --raw` prints): the digest of the raw bytes for a
/// manifest, the matching entry's digest for an index.
pub fn select_raw(raw: &[u8], origin: &str) -> Result<ManifestDigest, ImageError> {
    let media_type = sniff_media_type(raw);
    if is_index(&media_type) {
        let index: IndexDocument =
            serde_json::from_slice(raw).map_err(|source| ImageError::Json {
                what: "image index",
                path: origin.to_owned(),
                source,
            })?;
        let entry = host_manifest(&index.manifests, || origin.to_owned())?;
        return Ok(ManifestDigest(parse_digest(&entry.digest, origin)?));
    }
    if !is_manifest(&media_type) {
        return Err(ImageError::UnsupportedMediaType {
            what: "manifest",
            media_type,
            hint: MANIFEST_HINT,
        });
    }
    Ok(ManifestDigest(Sha256::digest(raw).into()))
}
