//! Images and the Storage Catalog, end to end without privileges: OCI
//! layouts written here byte by byte (layers with the `tar` crate, gzip,
//! blobs, manifests, indexes), prepared through the catalog, and checked on
//! disk. Malicious layers must be refused with an error naming the layer
//! and entry, and leave nothing anywhere outside the catalog's own
//! bookkeeping.

use std::collections::BTreeSet;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use flate2::Compression as GzLevel;
use flate2::write::GzEncoder;
use lazaret_hostfs::plan::{RetainedDir, ensure_root};
use lazaret_proto::catalog::{ImageSourceIdentity, PrepareOperation};
use lazaret_proto::codec;
use lazaret_proto::common::{HostPath, UnixTimeNs};
use lazaret_proto::ids::{DomainId, GenerationId, OperationId, PreparedArtifactId};
use lazaret_proto::process::{HostProcessIdentity, LegacyUnverifiedProcessIdentityV1};
use lazaret_storage::catalog::{CatalogError, PreparedLower, StorageCatalog, tables};
use lazaret_storage::image::{ImageError, ImageSource, Progress, parse_reference};
use redb::ReadableDatabase;
use serde_json::json;
use sha2::{Digest, Sha256};
use tar::{EntryType, Header};

// ---------------------------------------------------------------- layers

/// A layer tarball under construction. Paths and link targets are written
/// byte for byte, so hostile names (`../x`, `/x`) are possible.
struct LayerBuilder {
    builder: tar::Builder<Vec<u8>>,
}

impl LayerBuilder {
    fn new() -> Self {
        Self {
            builder: tar::Builder::new(Vec::new()),
        }
    }

    fn entry(
        &mut self,
        kind: EntryType,
        path: &str,
        mode: u32,
        link: Option<&str>,
        data: &[u8],
    ) -> &mut Self {
        let mut header = Header::new_gnu();
        let name = &mut header.as_old_mut().name;
        assert!(path.len() < name.len(), "test paths are short");
        name[..path.len()].copy_from_slice(path.as_bytes());
        header.set_mode(mode);
        header.set_size(data.len() as u64);
        header.set_entry_type(kind);
        header.set_mtime(1_700_000_000);
        header.set_uid(1234);
        header.set_gid(1234);
        if let Some(link) = link {
            header.set_link_name_literal(link).unwrap();
        }
        if matches!(kind, EntryType::Char | EntryType::Block) {
            header.set_device_major(8).unwrap();
            header.set_device_minor(1).unwrap();
        }
        header.set_cksum();
        self.builder.append(&header, data).unwrap();
        self
    }

    fn dir(&mut self, path: &str, mode: u32) -> &mut Self {
        self.entry(EntryType::Directory, path, mode, None, b"")
    }

    fn file(&mut self, path: &str, mode: u32, data: &[u8]) -> &mut Self {
        self.entry(EntryType::Regular, path, mode, None, data)
    }

    fn symlink(&mut self, path: &str, target: &str) -> &mut Self {
        self.entry(EntryType::Symlink, path, 0o777, Some(target), b"")
    }

    fn hardlink(&mut self, path: &str, target: &str) -> &mut Self {
        self.entry(EntryType::Link, path, 0o644, Some(target), b"")
    }

    fn tar(&mut self) -> Vec<u8> {
        let builder = std::mem::replace(&mut self.builder, tar::Builder::new(Vec::new()));
        builder.into_inner().unwrap()
    }

    fn gzip(&mut self) -> Vec<u8> {
        let mut encoder = GzEncoder::new(Vec::new(), GzLevel::fast());
        encoder.write_all(&self.tar()).unwrap();
        encoder.finish().unwrap()
    }
}

// ---------------------------------------------------------------- layouts

const GZIP_LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
const TAR_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";

fn sha256(bytes: &[u8]) -> String {
    format!(
        "sha256:{}",
        lazaret_proto::ids::to_hex(&Sha256::digest(bytes))
    )
}

/// An OCI image layout being written.
struct OciWriter {
    dir: PathBuf,
    manifests: Vec<serde_json::Value>,
}

impl OciWriter {
    fn new(dir: &Path) -> Self {
        fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
        fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
        let this = Self {
            dir: dir.to_path_buf(),
            manifests: Vec::new(),
        };
        this.write_index();
        this
    }

    fn blob(&self, bytes: &[u8]) -> (String, usize) {
        let digest = sha256(bytes);
        fs::write(self.blob_path(&digest), bytes).unwrap();
        (digest, bytes.len())
    }

    fn blob_path(&self, digest: &str) -> PathBuf {
        self.dir.join("blobs/sha256").join(&digest[7..])
    }

    fn write_index(&self) {
        let index = json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": self.manifests,
        });
        fs::write(
            self.dir.join("index.json"),
            serde_json::to_vec(&index).unwrap(),
        )
        .unwrap();
    }

    fn config() -> serde_json::Value {
        json!({
            "architecture": host_arch(),
            "os": "linux",
            "config": {
                "Env": ["PATH=/bin", "GREETING=hello"],
                "Entrypoint": ["/bin/tool"],
                "Cmd": ["--serve"],
                "WorkingDir": "/work",
                "User": "0:0"
            },
            "rootfs": {"type": "layers", "diff_ids": []}
        })
    }

    /// Writes an image manifest (not yet in the index); returns its
    /// descriptor.
    fn manifest(
        &self,
        layers: &[(Vec<u8>, &str)],
        config: &serde_json::Value,
    ) -> serde_json::Value {
        let (config_digest, config_size) = self.blob(&serde_json::to_vec(config).unwrap());
        let layers: Vec<serde_json::Value> = layers
            .iter()
            .map(|(bytes, media_type)| {
                let (digest, size) = self.blob(bytes);
                json!({"mediaType": media_type, "digest": digest, "size": size})
            })
            .collect();
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": config_digest,
                "size": config_size,
            },
            "layers": layers,
        });
        let (digest, size) = self.blob(&serde_json::to_vec(&manifest).unwrap());
        json!({
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": digest,
            "size": size,
        })
    }

    /// Adds `descriptor` to the index under `tag`.
    fn tag(&mut self, mut descriptor: serde_json::Value, tag: &str) -> String {
        descriptor["annotations"] = json!({"org.opencontainers.image.ref.name": tag});
        let digest = descriptor["digest"].as_str().unwrap().to_owned();
        self.manifests.push(descriptor);
        self.write_index();
        digest
    }

    /// Writes and tags an image; returns its manifest digest.
    fn image(&mut self, layers: &[(Vec<u8>, &str)], tag: &str) -> String {
        let descriptor = self.manifest(layers, &Self::config());
        self.tag(descriptor, tag)
    }

    fn layer_digests(&self, manifest_digest: &str) -> Vec<String> {
        let manifest: serde_json::Value =
            serde_json::from_slice(&fs::read(self.blob_path(manifest_digest)).unwrap()).unwrap();
        manifest["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["digest"].as_str().unwrap().to_owned())
            .collect()
    }
}

fn host_arch() -> &'static str {
    lazaret_storage::image::layout::host_platform().1
}

// ---------------------------------------------------------------- fixture

/// A scratch directory holding a Storage Root, an image directory and an
/// `outside` sentinel directory that nothing may ever write to.
struct Fixture {
    _temp: tempfile::TempDir,
    base: PathBuf,
    storage: RetainedDir,
    uid: u32,
}

impl Fixture {
    fn new() -> Self {
        let temp = tempfile::Builder::new()
            .prefix("lazaret-image-")
            .tempdir()
            .unwrap();
        let base = fs::canonicalize(temp.path()).unwrap();
        fs::create_dir(base.join("outside")).unwrap();
        fs::create_dir(base.join("images")).unwrap();
        let uid = rustix::process::getuid().as_raw();
        let storage = ensure_root(&base.join("storage"), uid).unwrap();
        Self {
            _temp: temp,
            base,
            storage,
            uid,
        }
    }

    fn catalog(&self) -> StorageCatalog {
        StorageCatalog::open(&self.storage, self.uid).unwrap()
    }

    fn layout(&self, name: &str) -> OciWriter {
        OciWriter::new(&self.base.join("images").join(name))
    }

    fn catalog_dir(&self) -> PathBuf {
        self.base.join("storage/catalog")
    }

    /// Every path under the scratch directory except the catalog's
    /// database and lock files, which a failed prepare may touch.
    fn snapshot(&self) -> BTreeSet<PathBuf> {
        fn walk(dir: &Path, out: &mut BTreeSet<PathBuf>) {
            for entry in fs::read_dir(dir).unwrap() {
                let entry = entry.unwrap();
                let path = entry.path();
                out.insert(path.clone());
                if entry.file_type().unwrap().is_dir() {
                    walk(&path, out);
                }
            }
        }
        let mut out = BTreeSet::new();
        walk(&self.base, &mut out);
        let locks = self.catalog_dir().join("locks");
        out.retain(|p| !p.starts_with(&locks) || *p == locks);
        out
    }

    fn staging_entries(&self) -> usize {
        fs::read_dir(self.catalog_dir().join("tmp"))
            .unwrap()
            .count()
    }

    fn artifact_entries(&self) -> usize {
        fs::read_dir(self.catalog_dir().join("artifacts"))
            .unwrap()
            .count()
    }
}

impl Drop for Fixture {
    /// Gives every directory back its write bit, so that the scratch
    /// directory can be removed by an unprivileged user too (unpacked
    /// images may hold read-only directories).
    fn drop(&mut self) {
        fn walk(dir: &Path) {
            let _ = fs::set_permissions(dir, fs::Permissions::from_mode(0o700));
            if let Ok(entries) = fs::read_dir(dir) {
                for entry in entries.flatten() {
                    if entry.file_type().is_ok_and(|t| t.is_dir()) {
                        walk(&entry.path());
                    }
                }
            }
        }
        walk(&self.base);
    }
}

fn domain(n: u8) -> DomainId {
    DomainId([n; 32])
}

fn oci(path: &Path, tag: &str) -> ImageSource {
    ImageSource::OciLayout {
        path: path.to_path_buf(),
        tag: Some(tag.to_owned()),
    }
}

fn prepare(
    catalog: &StorageCatalog,
    source: &ImageSource,
    domain_id: DomainId,
    generation: u64,
) -> (Result<PreparedLower, CatalogError>, Vec<Progress>) {
    let mut events = Vec::new();
    let result = catalog.prepare_and_lease(
        source,
        domain_id,
        GenerationId(generation),
        this_process(),
        &mut |p| events.push(p),
    );
    (result, events)
}

/// This test process, as the preparer a prepare operation records.
fn this_process() -> HostProcessIdentity {
    HostProcessIdentity::LegacyUnverifiedV1(LegacyUnverifiedProcessIdentityV1 {
        host_pid: std::process::id(),
        start_time_ticks: 0,
    })
}

fn image_error(error: CatalogError) -> ImageError {
    match error {
        CatalogError::Image { source, .. } => source,
        other => panic!("expected an image error, got {other:?}"),
    }
}

fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
}

// ---------------------------------------------------------------- good images

/// Two layers exercising files, directories, links, modes and whiteouts.
fn good_layers() -> Vec<(Vec<u8>, &'static str)> {
    let lower = LayerBuilder::new()
        .dir("./", 0o755)
        .dir("bin/", 0o755)
        .file("bin/tool", 0o4755, b"#!/bin/sh\necho tool\n")
        .symlink("bin/sh", "tool")
        .symlink("bin/abs", "/etc/hostname")
        .hardlink("bin/tool2", "bin/tool")
        .dir("etc/", 0o755)
        .file("etc/hostname", 0o644, b"lower\n")
        .file("etc/removeme", 0o600, b"gone soon\n")
        .file("etc/group-secret", 0o2640, b"sgid\n")
        .dir("opt/data/", 0o750)
        .file("opt/data/old-a", 0o644, b"a")
        .dir("opt/data/old-dir/", 0o755)
        .file("opt/data/old-dir/b", 0o644, b"b")
        .dir("tmp/", 0o1777)
        .dir("ro/", 0o555)
        .file("ro/inside", 0o444, b"read only\n")
        .file("deep/implicit/parents/file", 0o640, b"deep\n")
        .gzip();
    let upper = LayerBuilder::new()
        .file("etc/hostname", 0o600, b"upper\n")
        .file("etc/.wh.removeme", 0o644, b"")
        .dir("opt/data/", 0o755)
        .file("opt/data/.wh..wh..opq", 0o644, b"")
        .file("opt/data/new", 0o644, b"new\n")
        .file("etc/same-layer", 0o644, b"kept\n")
        .file("etc/.wh.same-layer", 0o644, b"")
        .file("ro/added-later", 0o644, b"later\n")
        .file("etc/.wh.never-existed", 0o644, b"")
        .tar();
    vec![(lower, GZIP_LAYER), (upper, TAR_LAYER)]
}

#[test]
fn good_image_unpacks_with_links_modes_and_whiteouts() {
    let fx = Fixture::new();
    let mut layout = fx.layout("good");
    let digest = layout.image(&good_layers(), "v1");
    let catalog = fx.catalog();

    let (result, events) = prepare(&catalog, &oci(&layout.dir, "v1"), domain(1), 1);
    let lower = result.unwrap();
    assert_eq!(lower.manifest_digest.to_oci_string(), digest);
    assert!(!lower.reused);
    let root = &lower.rootfs_path;
    assert_eq!(
        *root,
        fx.catalog_dir()
            .join("artifacts")
            .join(lower.artifact_id.to_hex())
            .join("rootfs")
    );

    // Files, symlinks (never followed: the absolute target stays as is),
    // hard links.
    assert_eq!(
        fs::read(root.join("bin/tool")).unwrap(),
        b"#!/bin/sh\necho tool\n"
    );
    assert_eq!(
        fs::read_link(root.join("bin/sh")).unwrap(),
        Path::new("tool")
    );
    assert_eq!(
        fs::read_link(root.join("bin/abs")).unwrap(),
        Path::new("/etc/hostname")
    );
    let tool = fs::metadata(root.join("bin/tool")).unwrap();
    let tool2 = fs::metadata(root.join("bin/tool2")).unwrap();
    assert_eq!(tool.ino(), tool2.ino());
    assert_eq!(tool.nlink(), 2);
    assert_eq!(
        fs::read(root.join("deep/implicit/parents/file")).unwrap(),
        b"deep\n"
    );

    // Modes: setuid and setgid stripped, sticky kept on a directory,
    // read-only directories applied after later layers wrote into them.
    assert_eq!(mode(&root.join("bin/tool")), 0o755);
    assert_eq!(mode(&root.join("etc/group-secret")), 0o640);
    assert_eq!(mode(&root.join("tmp")), 0o1777);
    assert_eq!(mode(&root.join("ro")), 0o555);
    assert_eq!(mode(&root.join("ro/inside")), 0o444);
    assert_eq!(fs::read(root.join("ro/added-later")).unwrap(), b"later\n");
    assert_eq!(mode(&root.join("deep/implicit")), 0o755);
    assert_eq!(mode(root), 0o755);
    assert_eq!(
        fs::metadata(root.join("bin/tool")).unwrap().mtime(),
        1_700_000_000
    );
    // Ownership from the tar is ignored.
    assert_eq!(fs::metadata(root.join("bin/tool")).unwrap().uid(), fx.uid);

    // Whiteouts: the upper layer replaced, deleted and made opaque; a
    // whiteout never hides its own layer's entries; no .wh. file exists.
    assert_eq!(fs::read(root.join("etc/hostname")).unwrap(), b"upper\n");
    assert_eq!(mode(&root.join("etc/hostname")), 0o600);
    assert!(!root.join("etc/removeme").exists());
    assert_eq!(fs::read(root.join("etc/same-layer")).unwrap(), b"kept\n");
    let data: BTreeSet<String> = fs::read_dir(root.join("opt/data"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(data, BTreeSet::from(["new".to_owned()]));
    assert_eq!(mode(&root.join("opt/data")), 0o755);
    for entry in walk_names(root) {
        assert!(!entry.contains(".wh."), "{entry} was created");
    }

    let stats = lower.stats.unwrap();
    assert_eq!(stats.stripped_mode_bits, 2);
    assert_eq!(stats.hardlinks, 1);
    assert_eq!(stats.symlinks, 2);
    assert_eq!(stats.whiteouts, 4);
    assert!(stats.disk_bytes > 0);

    // The configuration.
    let config = &lower.image_config;
    assert_eq!(config.env, ["PATH=/bin", "GREETING=hello"]);
    assert_eq!(config.entrypoint, ["/bin/tool"]);
    assert_eq!(config.cmd, ["--serve"]);
    assert_eq!(config.working_dir.as_deref(), Some("/work"));
    assert_eq!(config.user.as_deref(), Some("0:0"));

    // Progress: resolved, each layer, prepared.
    assert!(matches!(
        events.first(),
        Some(Progress::Resolved { layers: 2, .. })
    ));
    assert!(events.iter().any(|p| matches!(
        p,
        Progress::Unpacking {
            layer: 2,
            layers: 2,
            ..
        }
    )));
    assert!(matches!(events.last(), Some(Progress::Prepared { .. })));
    let last_fraction = events.iter().rev().find_map(Progress::fraction).unwrap();
    assert_eq!(last_fraction.0, last_fraction.1);

    // The catalog: one Available artifact, one lease, no operation, no
    // staging left; directories 0700.
    let artifacts = catalog.artifacts().unwrap();
    assert_eq!(artifacts.len(), 1);
    assert_eq!(artifacts[0].prepared_artifact_id, lower.artifact_id);
    assert!(matches!(
        &artifacts[0].source_identity,
        ImageSourceIdentity::OciLayout { tag, .. } if tag == "v1"
    ));
    assert_eq!(catalog.leases().unwrap().len(), 1);
    assert!(catalog.operations().unwrap().is_empty());
    assert_eq!(fx.staging_entries(), 0);
    for dir in ["", "artifacts", "tmp", "locks"] {
        assert_eq!(mode(&fx.catalog_dir().join(dir)), 0o700, "{dir}");
    }
    assert_eq!(mode(lower.artifact_dir.label()), 0o700);
    assert_eq!(mode(&fx.catalog_dir().join("catalog.redb")) & 0o077, 0);

    // The artifact can be reclaimed once unleased, even with read-only
    // directories inside.
    catalog.release_lease(domain(1), GenerationId(1)).unwrap();
    drop(lower);
    assert_eq!(catalog.reclaim_unleased().unwrap().len(), 1);
    assert!(catalog.artifacts().unwrap().is_empty());
    assert_eq!(fx.artifact_entries(), 0);
}

fn walk_names(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        out.push(entry.file_name().into_string().unwrap());
        if entry.file_type().unwrap().is_dir() {
            out.extend(walk_names(&entry.path()));
        }
    }
    out
}

#[test]
fn same_digest_is_unpacked_once_and_leased_per_generation() {
    let fx = Fixture::new();
    let mut layout = fx.layout("shared");
    let layers = vec![(
        LayerBuilder::new().file("hello", 0o644, b"hi").gzip(),
        GZIP_LAYER,
    )];
    let digest = layout.image(&layers, "one");
    // A second tag naming the same manifest.
    let descriptor = layout.manifests[0].clone();
    layout.tag(descriptor, "two");
    let catalog = fx.catalog();

    let (first, _) = prepare(&catalog, &oci(&layout.dir, "one"), domain(1), 1);
    let first = first.unwrap();
    assert_eq!(first.manifest_digest.to_oci_string(), digest);

    // Another Domain, another tag: the same artifact, no unpack.
    let (second, events) = prepare(&catalog, &oci(&layout.dir, "two"), domain(2), 7);
    let second = second.unwrap();
    assert!(second.reused);
    assert_eq!(second.artifact_id, first.artifact_id);
    assert!(
        !events
            .iter()
            .any(|p| matches!(p, Progress::Unpacking { .. }))
    );
    assert!(events.iter().any(|p| matches!(p, Progress::Reused { .. })));
    assert_eq!(second.image_config, first.image_config);

    // The same generation again is idempotent.
    let (again, _) = prepare(&catalog, &oci(&layout.dir, "one"), domain(1), 1);
    assert_eq!(again.unwrap().artifact_id, first.artifact_id);

    let leases = catalog.leases().unwrap();
    assert_eq!(leases.len(), 2);
    assert!(
        leases
            .iter()
            .all(|l| l.prepared_artifact_id == first.artifact_id)
    );
    assert_eq!(catalog.artifacts().unwrap().len(), 1);
    assert_eq!(fx.artifact_entries(), 1);

    // A catalog opened afresh (another Host Coordinator) sees the same.
    let other = fx.catalog();
    let (third, _) = prepare(&other, &oci(&layout.dir, "one"), domain(3), 1);
    assert_eq!(third.unwrap().artifact_id, first.artifact_id);

    // Release removes exactly one lease, and is idempotent.
    let released = catalog
        .release_lease(domain(2), GenerationId(7))
        .unwrap()
        .unwrap();
    assert_eq!(released.domain_id, domain(2));
    assert!(
        catalog
            .release_lease(domain(2), GenerationId(7))
            .unwrap()
            .is_none()
    );
    let leases = catalog.leases().unwrap();
    assert_eq!(leases.len(), 2);
    assert!(!leases.iter().any(|l| l.domain_id == domain(2)));

    // A leased artifact is never reclaimed.
    assert!(catalog.reclaim_unleased().unwrap().is_empty());

    // A generation holding one artifact cannot lease another.
    let mut other_layout = fx.layout("other");
    other_layout.image(
        &[(LayerBuilder::new().file("x", 0o644, b"x").tar(), TAR_LAYER)],
        "latest",
    );
    let (conflict, _) = prepare(&catalog, &oci(&other_layout.dir, "latest"), domain(1), 1);
    assert!(
        matches!(conflict, Err(CatalogError::LeaseConflict { .. })),
        "{conflict:?}"
    );
}

#[test]
fn concurrent_prepares_of_one_digest_unpack_once() {
    let fx = Fixture::new();
    let mut layout = fx.layout("concurrent");
    let big: Vec<u8> = (0..4 << 20).map(|i| (i % 251) as u8).collect();
    let layers = vec![(
        LayerBuilder::new().file("big", 0o644, &big).gzip(),
        GZIP_LAYER,
    )];
    layout.image(&layers, "latest");
    let source = oci(&layout.dir, "latest");
    let results: Vec<(PreparedArtifactId, bool)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..3u8)
            .map(|n| {
                let fx = &fx;
                let source = &source;
                scope.spawn(move || {
                    let catalog = fx.catalog();
                    let (result, _) = prepare(&catalog, source, domain(10 + n), 1);
                    let lower = result.unwrap();
                    (lower.artifact_id, lower.reused)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(results.iter().all(|(id, _)| *id == results[0].0));
    assert_eq!(results.iter().filter(|(_, reused)| !reused).count(), 1);
    let catalog = fx.catalog();
    assert_eq!(catalog.artifacts().unwrap().len(), 1);
    assert_eq!(catalog.leases().unwrap().len(), 3);
    assert_eq!(fx.artifact_entries(), 1);
    assert_eq!(fx.staging_entries(), 0);
}

#[test]
fn tags_and_platform_indexes_are_selected() {
    let fx = Fixture::new();
    let mut layout = fx.layout("multi");
    let a = layout.manifest(
        &[(
            LayerBuilder::new().file("which", 0o644, b"host").tar(),
            TAR_LAYER,
        )],
        &OciWriter::config(),
    );
    let mut foreign_config = OciWriter::config();
    foreign_config["architecture"] = json!("s390x");
    let b = layout.manifest(
        &[(
            LayerBuilder::new().file("which", 0o644, b"foreign").tar(),
            TAR_LAYER,
        )],
        &foreign_config,
    );
    // A nested index with two platforms, tagged `multi`.
    let with_platform = |mut d: serde_json::Value, arch: &str| {
        d["platform"] = json!({"os": "linux", "architecture": arch});
        d
    };
    let nested = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [with_platform(b.clone(), "s390x"), with_platform(a.clone(), host_arch())],
    });
    let (nested_digest, nested_size) = layout.blob(&serde_json::to_vec(&nested).unwrap());
    layout.tag(
        json!({
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "digest": nested_digest,
            "size": nested_size,
        }),
        "multi",
    );
    layout.tag(b.clone(), "foreign");
    let catalog = fx.catalog();

    let (lower, _) = prepare(&catalog, &oci(&layout.dir, "multi"), domain(1), 1);
    let lower = lower.unwrap();
    assert_eq!(
        lower.manifest_digest.to_oci_string(),
        a["digest"].as_str().unwrap()
    );
    assert_eq!(fs::read(lower.rootfs_path.join("which")).unwrap(), b"host");

    let (foreign, _) = prepare(&catalog, &oci(&layout.dir, "foreign"), domain(2), 1);
    let error = image_error(foreign.unwrap_err());
    assert!(matches!(error, ImageError::Platform { .. }), "{error}");

    let (missing, _) = prepare(&catalog, &oci(&layout.dir, "nope"), domain(3), 1);
    let error = image_error(missing.unwrap_err());
    assert!(matches!(error, ImageError::TagNotFound { .. }), "{error}");
    assert!(error.to_string().contains("multi, foreign"), "{error}");

    // No tag and two images, none `latest`.
    let untagged = ImageSource::OciLayout {
        path: layout.dir.clone(),
        tag: None,
    };
    let (none, _) = prepare(&catalog, &untagged, domain(4), 1);
    assert!(matches!(
        image_error(none.unwrap_err()),
        ImageError::NoTag { .. }
    ));

    // One image and no tag: that image.
    let mut single = fx.layout("single");
    let digest = single.image(
        &[(LayerBuilder::new().file("f", 0o644, b"1").tar(), TAR_LAYER)],
        "whatever",
    );
    let (only, _) = prepare(
        &catalog,
        &parse_reference(&format!("oci:{}", single.dir.display())).unwrap(),
        domain(5),
        1,
    );
    assert_eq!(only.unwrap().manifest_digest.to_oci_string(), digest);
}

#[test]
fn digest_and_size_mismatches_are_refused() {
    let fx = Fixture::new();
    let mut layout = fx.layout("corrupt");
    let layers = vec![(
        LayerBuilder::new().file("f", 0o644, &[1u8; 4096]).gzip(),
        GZIP_LAYER,
    )];
    let manifest = layout.image(&layers, "latest");
    let layer = layout.layer_digests(&manifest)[0].clone();
    let catalog = fx.catalog();
    let before = fx.snapshot();

    // Same size, one byte changed near the end (after the tar stream, so
    // only the digest can catch it).
    let path = layout.blob_path(&layer);
    let mut bytes = fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    fs::write(&path, &bytes).unwrap();
    let (result, _) = prepare(&catalog, &oci(&layout.dir, "latest"), domain(1), 1);
    let error = image_error(result.unwrap_err());
    assert!(
        matches!(error, ImageError::DigestMismatch { .. }),
        "{error}"
    );
    assert!(error.to_string().contains(&layer[7..]), "{error}");
    assert_eq!(fx.snapshot(), before);

    // A truncated blob.
    bytes.truncate(bytes.len() - 10);
    fs::write(&path, &bytes).unwrap();
    let (result, _) = prepare(&catalog, &oci(&layout.dir, "latest"), domain(1), 1);
    assert!(matches!(
        image_error(result.unwrap_err()),
        ImageError::SizeMismatch { .. }
    ));

    // A tampered manifest.
    let manifest_path = layout.blob_path(&manifest);
    let mut text = fs::read(&manifest_path).unwrap();
    text[0] = b' ';
    fs::write(&manifest_path, &text).unwrap();
    let (result, _) = prepare(&catalog, &oci(&layout.dir, "latest"), domain(1), 1);
    assert!(matches!(
        image_error(result.unwrap_err()),
        ImageError::DigestMismatch { .. }
    ));

    assert!(catalog.artifacts().unwrap().is_empty());
    assert!(catalog.leases().unwrap().is_empty());
    assert!(catalog.operations().unwrap().is_empty());
    assert_eq!(fx.staging_entries(), 0);
    assert_eq!(fx.artifact_entries(), 0);
}

#[test]
fn zstd_layers_are_refused_clearly() {
    let fx = Fixture::new();
    let mut layout = fx.layout("zstd");
    layout.image(
        &[(
            b"not really zstd".to_vec(),
            "application/vnd.oci.image.layer.v1.tar+zstd",
        )],
        "latest",
    );
    let (result, _) = prepare(&fx.catalog(), &oci(&layout.dir, "latest"), domain(1), 1);
    let error = image_error(result.unwrap_err());
    assert!(matches!(error, ImageError::UnsupportedMediaType { .. }));
    assert!(error.to_string().contains("gzip"), "{error}");
}

// ---------------------------------------------------------------- malicious layers

/// Prepares an image whose top layer is `malicious` over a harmless lower
/// layer, and checks it is refused naming the layer and `entry`, and that
/// nothing outside the catalog's bookkeeping changed.
fn assert_refused(malicious: Vec<u8>, entry: &str, reason: &str) {
    let fx = Fixture::new();
    let mut layout = fx.layout("evil");
    let lower = LayerBuilder::new()
        .dir("etc/", 0o755)
        .file("etc/passwd", 0o644, b"root:x:0:0::/root:/bin/sh\n")
        .gzip();
    let manifest = layout.image(&[(lower, GZIP_LAYER), (malicious, TAR_LAYER)], "latest");
    let evil_layer = layout.layer_digests(&manifest)[1].clone();
    let catalog = fx.catalog();
    let before = fx.snapshot();

    let (result, _) = prepare(&catalog, &oci(&layout.dir, "latest"), domain(1), 1);
    let error = image_error(result.unwrap_err());
    let message = error.to_string();
    assert!(
        matches!(error, ImageError::RefusedEntry { .. }),
        "{message}"
    );
    assert!(message.contains(&evil_layer), "{message} names the layer");
    assert!(
        message.contains(&format!("entry `{entry}`")),
        "{message} names {entry}"
    );
    assert!(message.contains(reason), "{message} says {reason}");

    assert_eq!(fx.snapshot(), before, "nothing was written");
    assert_eq!(fs::read_dir(fx.base.join("outside")).unwrap().count(), 0);
    assert!(catalog.artifacts().unwrap().is_empty());
    assert!(catalog.leases().unwrap().is_empty());
    assert!(catalog.operations().unwrap().is_empty());
    assert_eq!(fx.staging_entries(), 0);
    assert_eq!(fx.artifact_entries(), 0);
}

#[test]
fn malicious_parent_traversal_is_refused() {
    assert_refused(
        LayerBuilder::new().file("../escape", 0o644, b"x").tar(),
        "../escape",
        "`..` component",
    );
    assert_refused(
        LayerBuilder::new()
            .file("a/../../../../escape", 0o644, b"x")
            .tar(),
        "a/../../../../escape",
        "`..` component",
    );
}

#[test]
fn malicious_absolute_path_is_refused() {
    assert_refused(
        LayerBuilder::new().file("/abs/escape", 0o644, b"x").tar(),
        "/abs/escape",
        "absolute path",
    );
}

#[test]
fn malicious_symlink_escape_is_refused() {
    // The sentinel `outside` directory is the symlink's target.
    let outside = std::env::temp_dir().join("lazaret-never-written");
    assert_refused(
        LayerBuilder::new()
            .symlink("evil", "/tmp/lazaret-never-written")
            .file("evil/pwned", 0o644, b"x")
            .tar(),
        "evil/pwned",
        "symbolic link `evil`",
    );
    assert!(!outside.join("pwned").exists());
    // A symlink to the parent, then a chain through it.
    assert_refused(
        LayerBuilder::new()
            .symlink("up", "..")
            .symlink("upup", "up/..")
            .file("upup/pwned", 0o644, b"x")
            .tar(),
        "upup/pwned",
        "symbolic link `upup`",
    );
    assert_refused(
        LayerBuilder::new()
            .dir("d/", 0o755)
            .symlink("d/up", "../../../../..")
            .dir("d/up/pwned/", 0o755)
            .tar(),
        "d/up/pwned/",
        "symbolic link `d/up`",
    );
    // A symlink replacing a directory of the lower layer.
    assert_refused(
        LayerBuilder::new()
            .symlink("etc", "/")
            .file("etc/pwned", 0o644, b"x")
            .tar(),
        "etc/pwned",
        "symbolic link `etc`",
    );
}

#[test]
fn symlink_escape_to_a_real_outside_directory_writes_nothing() {
    let fx = Fixture::new();
    let outside = fx.base.join("outside");
    let mut layout = fx.layout("evil");
    let layer = LayerBuilder::new()
        .symlink("evil", outside.to_str().unwrap())
        .file("evil/pwned", 0o644, b"x")
        .tar();
    layout.image(&[(layer, TAR_LAYER)], "latest");
    let (result, _) = prepare(&fx.catalog(), &oci(&layout.dir, "latest"), domain(1), 1);
    assert!(matches!(
        image_error(result.unwrap_err()),
        ImageError::RefusedEntry { .. }
    ));
    assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);
}

#[test]
fn malicious_hardlinks_are_refused() {
    assert_refused(
        LayerBuilder::new()
            .hardlink("link", "../../etc/passwd")
            .tar(),
        "link",
        "hard link to a path with a `..` component",
    );
    assert_refused(
        LayerBuilder::new().hardlink("link", "/etc/passwd").tar(),
        "link",
        "hard link to an absolute path",
    );
    assert_refused(
        LayerBuilder::new()
            .symlink("sys", "/etc")
            .hardlink("link", "sys/passwd")
            .tar(),
        "link",
        "symbolic link `sys`",
    );
    assert_refused(
        LayerBuilder::new().hardlink("link", "etc").tar(),
        "link",
        "directory",
    );
}

#[test]
fn device_nodes_and_fifos_are_skipped() {
    let fx = Fixture::new();
    let mut layout = fx.layout("nodes");
    let lower_layer = LayerBuilder::new()
        .dir("dev", 0o755)
        .file("dev/console", 0o644, b"an earlier layer's file")
        .tar();
    let upper_layer = LayerBuilder::new()
        .entry(EntryType::Char, "dev/console", 0o600, None, b"")
        .entry(EntryType::Block, "dev/sdb", 0o600, None, b"")
        .entry(EntryType::Fifo, "run/pipe", 0o4640, None, b"")
        .file("etc/kept", 0o644, b"kept")
        .tar();
    layout.image(
        &[(lower_layer, TAR_LAYER), (upper_layer, TAR_LAYER)],
        "latest",
    );
    let (result, events) = prepare(&fx.catalog(), &oci(&layout.dir, "latest"), domain(1), 1);
    let lower = result.unwrap();
    for gone in ["dev/console", "dev/sdb", "run/pipe"] {
        assert!(
            fs::symlink_metadata(lower.rootfs_path.join(gone)).is_err(),
            "{gone} is neither created nor left as it was"
        );
    }
    assert_eq!(
        fs::read(lower.rootfs_path.join("etc/kept")).unwrap(),
        b"kept"
    );
    let Some(last @ Progress::Prepared { skipped_nodes, .. }) = events.last() else {
        panic!("{events:?}");
    };
    assert_eq!(*skipped_nodes, 3);
    assert!(
        last.to_string().contains("3 device nodes and FIFOs"),
        "{last}"
    );
}

/// A tar of one sparse file of `size` made by GNU tar in `format`.
fn sparse_layer(fx: &Fixture, format: &str, size: &str) -> Vec<u8> {
    let dir = fx.base.join(format!("sparse-{format}"));
    fs::create_dir_all(&dir).unwrap();
    let status = std::process::Command::new("truncate")
        .args(["-s", size])
        .arg(dir.join("big"))
        .status()
        .unwrap();
    assert!(status.success());
    let output = std::process::Command::new("tar")
        .args([&format!("--format={format}"), "--sparse", "-C"])
        .arg(&dir)
        .args(["-cf", "-", "big"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    output.stdout
}

#[test]
fn a_huge_sparse_layer_is_refused_before_it_fills_the_disk() {
    let fx = Fixture::new();
    let mut layout = fx.layout("sparse");
    let layer = sparse_layer(&fx, "gnu", "20G");
    assert!(
        layer.len() < 1 << 20,
        "the layer is small: {} bytes",
        layer.len()
    );
    layout.image(&[(layer, TAR_LAYER)], "latest");
    let (result, _) = prepare(&fx.catalog(), &oci(&layout.dir, "latest"), domain(1), 1);
    match image_error(result.unwrap_err()) {
        ImageError::TooLarge { entry, needed, .. } => {
            assert_eq!(entry, "big");
            assert_eq!(needed, 20 << 30);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(fx.staging_entries(), 0, "nothing of it is left");
}

#[test]
fn pax_sparse_files_are_refused() {
    let fx = Fixture::new();
    let mut layout = fx.layout("pax-sparse");
    layout.image(&[(sparse_layer(&fx, "posix", "1M"), TAR_LAYER)], "latest");
    let (result, _) = prepare(&fx.catalog(), &oci(&layout.dir, "latest"), domain(1), 1);
    let error = image_error(result.unwrap_err()).to_string();
    assert!(error.contains("sparse file in the PAX format"), "{error}");
}

#[test]
fn small_gnu_sparse_files_are_expanded() {
    let fx = Fixture::new();
    let mut layout = fx.layout("gnu-sparse");
    layout.image(&[(sparse_layer(&fx, "gnu", "3M"), TAR_LAYER)], "latest");
    let (result, _) = prepare(&fx.catalog(), &oci(&layout.dir, "latest"), domain(1), 1);
    let lower = result.unwrap();
    let big = fs::read(lower.rootfs_path.join("big")).unwrap();
    assert_eq!(big.len(), 3 << 20);
    assert!(big.iter().all(|&b| b == 0));
}

// ---------------------------------------------------------------- archives and registries

#[test]
fn oci_archive_is_extracted_and_prepared() {
    let fx = Fixture::new();
    let mut layout = fx.layout("for-archive");
    let digest = layout.image(&good_layers(), "arch");
    let archive = fx.base.join("images/image.tar");
    let mut builder = tar::Builder::new(fs::File::create(&archive).unwrap());
    builder.append_dir_all(".", &layout.dir).unwrap();
    builder.into_inner().unwrap().sync_all().unwrap();
    let catalog = fx.catalog();

    let source = parse_reference(&format!("oci-archive:{}:arch", archive.display())).unwrap();
    let (result, events) = prepare(&catalog, &source, domain(1), 1);
    let lower = result.unwrap();
    assert!(!lower.reused);
    assert_eq!(lower.manifest_digest.to_oci_string(), digest);
    assert_eq!(
        fs::read(lower.rootfs_path.join("etc/hostname")).unwrap(),
        b"upper\n"
    );
    assert!(
        events
            .iter()
            .any(|p| matches!(p, Progress::Extracting { .. }))
    );
    assert!(matches!(
        &catalog.artifacts().unwrap()[0].source_identity,
        ImageSourceIdentity::OciArchive { .. }
    ));
    assert_eq!(fx.staging_entries(), 0);

    // The layout holds the same manifest: reused.
    let (again, _) = prepare(&catalog, &oci(&layout.dir, "arch"), domain(2), 1);
    assert!(again.unwrap().reused);

    // A gzip-compressed archive works too, and its extraction is refused
    // like a layer when it holds a device node.
    let gz = fx.base.join("images/image.tar.gz");
    let mut encoder = GzEncoder::new(Vec::new(), GzLevel::fast());
    encoder.write_all(&fs::read(&archive).unwrap()).unwrap();
    fs::write(&gz, encoder.finish().unwrap()).unwrap();
    let (result, _) = prepare(
        &catalog,
        &parse_reference(&format!("oci-archive:{}:arch", gz.display())).unwrap(),
        domain(3),
        1,
    );
    assert!(result.unwrap().reused);

    // An archive holding one entry of `kind` at `name` is refused.
    let evil = fx.base.join("images/evil.tar");
    let refused = |kind: EntryType, name: &str, mode: u32| {
        fs::write(
            &evil,
            LayerBuilder::new().entry(kind, name, mode, None, b"").tar(),
        )
        .unwrap();
        let (result, _) = prepare(
            &catalog,
            &parse_reference(&format!("oci-archive:{}", evil.display())).unwrap(),
            domain(4),
            1,
        );
        image_error(result.unwrap_err())
    };
    let error = refused(EntryType::Char, "blobs/null", 0o666);
    assert!(matches!(error, ImageError::RefusedEntry { .. }), "{error}");

    // A FIFO in an archive is refused too (it could stall a reader).
    let error = refused(EntryType::Fifo, "index.json", 0o644);
    assert!(error.to_string().contains("FIFO"), "{error}");
    assert_eq!(fx.staging_entries(), 0);
    assert!(catalog.operations().unwrap().is_empty());
}

#[test]
fn fifos_in_a_layout_do_not_stall_reading() {
    let fx = Fixture::new();
    let layout = fx.layout("fifo-index");
    fs::remove_file(layout.dir.join("index.json")).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        layout.dir.join("index.json"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    let (result, _) = prepare(&fx.catalog(), &oci(&layout.dir, "latest"), domain(1), 1);
    let error = image_error(result.unwrap_err());
    assert!(error.to_string().contains("not a regular file"), "{error}");
}

#[test]
fn unreachable_registry_fails_fast_and_clearly() {
    // Nothing here can reach a registry: the manifest request fails at
    // once on name resolution, or is killed when its time is up
    // (LAZARET_SKOPEO_TIMEOUT_SECS, default 60 s).
    let fx = Fixture::new();
    let catalog = fx.catalog();
    let source = parse_reference("registry.invalid/x:1").unwrap();
    let started = Instant::now();
    let (result, events) = prepare(&catalog, &source, domain(1), 1);
    assert!(started.elapsed() < Duration::from_secs(75));
    let error = image_error(result.unwrap_err());
    let message = error.to_string();
    assert!(
        matches!(error, ImageError::RegistryUnreachable { .. }),
        "{message} (is skopeo installed? apt-get install -y skopeo)"
    );
    assert!(
        message.contains("no registry is reachable for registry.invalid/x:1"),
        "{message}"
    );
    assert!(
        message.contains("oci:"),
        "{message} says how to use a local image"
    );
    assert!(matches!(events.first(), Some(Progress::Resolving { .. })));
    assert!(catalog.operations().unwrap().is_empty());
    assert_eq!(fx.staging_entries(), 0);
}

#[test]
fn skopeo_copies_into_a_layout_the_catalog_reads() {
    // The copy half of the registry path, from a local source (the only
    // kind this machine has): skopeo writes a layout, the catalog reads it.
    let fx = Fixture::new();
    let mut layout = fx.layout("source");
    let digest = layout.image(&good_layers(), "src");
    let copied = fx.base.join("images/copied");
    lazaret_storage::image::fetch::copy_with_skopeo(
        &format!("oci:{}:src", layout.dir.display()),
        &copied,
        "lazaret",
        "test image",
    )
    .unwrap();
    let (result, _) = prepare(&fx.catalog(), &oci(&copied, "lazaret"), domain(1), 1);
    let lower = result.unwrap();
    // skopeo compresses the uncompressed layer, so the digest differs; the
    // content does not.
    assert_ne!(lower.manifest_digest.to_oci_string(), digest);
    assert_eq!(
        fs::read(lower.rootfs_path.join("etc/hostname")).unwrap(),
        b"upper\n"
    );
    assert!(lower.rootfs_path.join("opt/data/new").exists());
    assert!(!lower.rootfs_path.join("opt/data/old-a").exists());

    // A failing copy says what skopeo said.
    let error = lazaret_storage::image::fetch::copy_with_skopeo(
        &format!("oci:{}:missing", layout.dir.display()),
        &fx.base.join("images/never"),
        "lazaret",
        "test image",
    )
    .unwrap_err();
    assert!(matches!(error, ImageError::RegistryFetch { .. }), "{error}");
}

#[test]
fn a_registry_reference_pinned_to_a_prepared_digest_needs_no_registry() {
    let fx = Fixture::new();
    let mut layout = fx.layout("pinned");
    let digest = layout.image(
        &[(LayerBuilder::new().file("f", 0o644, b"1").tar(), TAR_LAYER)],
        "latest",
    );
    let catalog = fx.catalog();
    let (first, _) = prepare(&catalog, &oci(&layout.dir, "latest"), domain(1), 1);
    let first = first.unwrap();
    let pinned = parse_reference(&format!("registry.invalid/x@{digest}")).unwrap();
    let (second, events) = prepare(&catalog, &pinned, domain(2), 1);
    let second = second.unwrap();
    assert!(second.reused);
    assert_eq!(second.artifact_id, first.artifact_id);
    assert!(
        !events
            .iter()
            .any(|p| matches!(p, Progress::Fetching { .. }))
    );
}

// ---------------------------------------------------------------- recovery

#[test]
fn crashed_prepare_is_cleaned_up_on_next_open() {
    let fx = Fixture::new();
    drop(fx.catalog());
    let catalog_dir = fx.catalog_dir();

    let operation = |id: u8| PrepareOperation {
        operation_id: OperationId([id; 16]),
        expected_artifact_id: PreparedArtifactId([id + 100; 16]),
        source_identity: ImageSourceIdentity::OciLayout {
            path: HostPath::from("/images/x"),
            tag: "latest".into(),
        },
        staging_dir: HostPath::from(OperationId([id; 16]).to_hex().as_str()),
        preparer: HostProcessIdentity::LegacyUnverifiedV1(LegacyUnverifiedProcessIdentityV1 {
            host_pid: 1,
            start_time_ticks: 1,
        }),
        started_at: UnixTimeNs::now(),
    };
    let crashed = operation(1);
    let live = operation(2);
    {
        let db = redb::Database::open(catalog_dir.join("catalog.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut ops = txn.open_table(tables::OPERATIONS).unwrap();
            for op in [&crashed, &live] {
                ops.insert(&op.operation_id.0, codec::encode(op).unwrap().as_slice())
                    .unwrap();
            }
        }
        txn.commit().unwrap();
    }
    // The crashed preparer got as far as unpacking (with a read-only
    // directory) and even renaming its artifact into place.
    let staged = catalog_dir.join("tmp").join(crashed.operation_id.to_hex());
    fs::create_dir_all(staged.join("artifact/rootfs/ro")).unwrap();
    fs::write(staged.join("artifact/rootfs/ro/file"), b"x").unwrap();
    fs::set_permissions(
        staged.join("artifact/rootfs/ro"),
        fs::Permissions::from_mode(0o500),
    )
    .unwrap();
    let orphan = catalog_dir
        .join("artifacts")
        .join(crashed.expected_artifact_id.to_hex());
    fs::create_dir_all(orphan.join("rootfs")).unwrap();
    // A staging directory nobody recorded.
    fs::create_dir(catalog_dir.join("tmp/stray")).unwrap();
    // The live preparer holds its staging directory locked.
    let live_dir = catalog_dir.join("tmp").join(live.operation_id.to_hex());
    fs::create_dir(&live_dir).unwrap();
    let held = fs::File::open(&live_dir).unwrap();
    rustix::fs::flock(&held, rustix::fs::FlockOperation::LockExclusive).unwrap();

    let catalog = fx.catalog();
    assert!(!staged.exists());
    assert!(!orphan.exists());
    assert!(!catalog_dir.join("tmp/stray").exists());
    assert!(live_dir.exists());
    let remaining = catalog.operations().unwrap();
    assert_eq!(remaining, vec![live.clone()]);

    // Once its preparer is gone, the next open cleans it too.
    drop(held);
    let catalog = fx.catalog();
    assert!(catalog.operations().unwrap().is_empty());
    assert!(!live_dir.exists());
}

/// Opening an intact catalog writes nothing to it (a writable database
/// session would flush the disk four times before `up` could lease), and
/// one a crash left work in is still cleaned up (above).
#[test]
fn opening_an_intact_catalog_writes_nothing() {
    let fx = Fixture::new();
    drop(fx.catalog());
    let file = fx.catalog_dir().join("catalog.redb");
    let before = fs::read(&file).unwrap();
    let modified = fs::metadata(&file).unwrap().modified().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    drop(fx.catalog());
    assert_eq!(fs::metadata(&file).unwrap().modified().unwrap(), modified);
    assert!(
        fs::read(&file).unwrap() == before,
        "the database file changed"
    );
}

#[test]
fn another_schema_is_refused() {
    let fx = Fixture::new();
    drop(fx.catalog());
    {
        let db = redb::Database::open(fx.catalog_dir().join("catalog.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut meta = txn.open_table(tables::METADATA).unwrap();
            meta.insert(
                tables::METADATA_KEY,
                b"\x01\x1alazaret-storage-catalog-v2\x01".as_slice(),
            )
            .unwrap();
        }
        txn.commit().unwrap();
        let read = db.begin_read().unwrap();
        let meta = read.open_table(tables::METADATA).unwrap();
        assert!(meta.get(tables::METADATA_KEY).unwrap().is_some());
    }
    let error = StorageCatalog::open(&fx.storage, fx.uid).unwrap_err();
    assert!(matches!(error, CatalogError::Schema { .. }), "{error}");
    assert!(error.to_string().contains("move it aside"), "{error}");
}

// ---------------------------------------------------------------- the busybox image

#[test]
fn busybox_image_builds_and_prepares() {
    if !Path::new("/bin/busybox").exists() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI installs busybox-static; this test must run there"
        );
        eprintln!(
            "SKIPPED: /bin/busybox is absent; install busybox-static (apt-get install -y busybox-static)"
        );
        return;
    }
    let fx = Fixture::new();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/build-busybox-image.sh");
    let dest = fx.base.join("images/busybox");
    let output = std::process::Command::new("sh")
        .arg(&script)
        .arg(&dest)
        .arg("test")
        .env("TMPDIR", &fx.base)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "build-busybox-image.sh failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let catalog = fx.catalog();
    let source = parse_reference(&format!("oci:{}:test", dest.display())).unwrap();
    let (result, _) = prepare(&catalog, &source, domain(1), 1);
    let lower = result.unwrap();
    let root = &lower.rootfs_path;
    let busybox = fs::symlink_metadata(root.join("bin/busybox")).unwrap();
    assert!(busybox.is_file(), "/bin/busybox is a real file");
    assert_eq!(busybox.permissions().mode() & 0o777, 0o755);
    assert_eq!(
        fs::read_link(root.join("bin/sh")).unwrap(),
        Path::new("busybox")
    );
    assert_eq!(
        fs::read_link(root.join("bin/nc")).unwrap(),
        Path::new("busybox")
    );
    for dir in [
        "root",
        "tmp",
        "etc",
        "proc",
        "sys",
        "dev",
        "workspace",
        "run",
    ] {
        assert!(root.join(dir).is_dir(), "/{dir}");
    }
    assert_eq!(mode(&root.join("tmp")), 0o1777);
    assert!(
        fs::read_to_string(root.join("etc/passwd"))
            .unwrap()
            .starts_with("root:x:0:0:")
    );
    assert!(
        fs::read_to_string(root.join("etc/group"))
            .unwrap()
            .starts_with("root:x:0:")
    );
    assert_eq!(lower.image_config.cmd, ["/bin/sh"]);
    assert_eq!(
        lower.image_config.working_dir.as_deref(),
        Some("/workspace")
    );
    // The binary runs (it is static).
    let echo = std::process::Command::new(root.join("bin/busybox"))
        .args(["echo", "hello"])
        .output()
        .unwrap();
    assert_eq!(echo.stdout, b"hello\n");
    assert!(fs::read_dir(&fx.base).unwrap().all(|e| {
        !e.unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with("lazaret-busybox")
    }));
}
