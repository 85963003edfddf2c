//! Layer unpacking: applying OCI layer tarballs, in order, to one root
//! directory, and extracting `oci-archive` files the same way.
//!
//! The `tar` crate only parses; every filesystem write is made here,
//! relative to a descriptor of the destination root, and every parent is
//! reached with `openat2(2)` and `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV` ([`lazaret_hostfs::beneath`]), so nothing
//! can be written outside the root whatever the layer says.
//!
//! Trust: none in the tar stream. An entry is refused (naming the layer and
//! the entry) when its path is absolute or has a `..` component, when a
//! parent on its path is a symbolic link, when it is a hard link whose
//! target is refused by the same rules or is missing or a directory, and
//! when it is a sparse file in the PAX format, which is not expanded.
//! Device nodes and FIFOs in layers are skipped and counted, never created
//! (root filesystems often carry `/dev/console`; the sandbox's `/dev` is
//! gVisor's own, and a FIFO in the host catalog could stall a host reader);
//! in an `oci-archive` either is refused. Setuid and setgid bits, and the
//! sticky bit on anything but a directory, are stripped and counted, never
//! created. Ownership in the tar is ignored: everything belongs to the
//! invoking user (root inside the rootless sandbox). Symbolic links are
//! created with their target as written (an absolute target means the
//! sandbox root once mounted) and never followed here. Extended attributes
//! are not applied.
//!
//! Bounds: at most [`MAX_ENTRIES`] entries, and file contents (a GNU sparse
//! file counted at its full size, since its holes are written out) within
//! [`MAX_FILE_BYTES`] (or what [`MAX_FILE_BYTES_VAR`] sets) and the free space of the destination's filesystem
//! less [`FREE_RESERVE`], checked before each file is written, so a small
//! layer that expands hugely is refused before it fills the disk.
//!
//! Whiteouts (OCI image spec, "Whiteouts"): `.wh.NAME` removes `NAME` as
//! left by earlier layers, and `.wh..wh..opq` removes every entry of its
//! directory that this layer did not itself add. Neither is created.
//!
//! Directory modes and times are applied by [`Unpacker::finish`], deepest
//! first, so a read-only directory in an early layer never blocks a later
//! one. Until then every directory is `0700`.

use std::collections::{BTreeMap, HashSet};
use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;

use lazaret_hostfs::beneath::{self, open_beneath, open_dir_path};
use lazaret_hostfs::tree;
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, Timespec, Timestamps};
use rustix::io::Errno;
use tar::EntryType;

use super::ImageError;

/// The longest entry path accepted, in bytes.
const MAX_PATH_BYTES: usize = 16 * 1024;
/// The most components an entry path may have.
const MAX_DEPTH: usize = 1024;
/// The whiteout prefix.
const WHITEOUT: &[u8] = b".wh.";
/// The opaque-directory marker.
const OPAQUE: &[u8] = b".wh..wh..opq";
/// The most entries one image may have.
pub const MAX_ENTRIES: u64 = 4_000_000;
/// The most bytes of file contents one image may unpack to, unless
/// [`MAX_FILE_BYTES_VAR`] sets another bound.
pub const MAX_FILE_BYTES: u64 = 16 << 30;
/// The environment variable that sets another bound on an image's file
/// contents, in bytes.
pub const MAX_FILE_BYTES_VAR: &str = "LAZARET_IMAGE_MAX_BYTES";
/// Free space an unpack always leaves on its filesystem.
pub const FREE_RESERVE: u64 = 1 << 30;

/// What an unpack did, for the caller's report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnpackStats {
    /// Tar entries processed (whiteouts included).
    pub entries: u64,
    /// Regular files written.
    pub files: u64,
    /// Directories created or updated.
    pub directories: u64,
    /// Symbolic links created.
    pub symlinks: u64,
    /// Hard links created.
    pub hardlinks: u64,
    /// Device nodes and FIFOs skipped.
    pub skipped_nodes: u64,
    /// Whiteouts and opaque markers applied.
    pub whiteouts: u64,
    /// Entries whose setuid, setgid or (on non-directories) sticky bits
    /// were stripped.
    pub stripped_mode_bits: u64,
    /// Bytes of regular file content written.
    pub file_bytes: u64,
    /// Bytes the finished tree occupies on disk.
    pub disk_bytes: u64,
}

/// The mode and time a directory gets once unpacking is done.
#[derive(Clone, Copy, Debug)]
struct DirMeta {
    mode: u32,
    mtime: Option<u64>,
}

/// Applies layers to one root directory.
#[derive(Debug)]
pub struct Unpacker {
    root: OwnedFd,
    whiteouts: bool,
    dirs: BTreeMap<Vec<u8>, DirMeta>,
    layer_paths: HashSet<Vec<u8>>,
    stats: UnpackStats,
    /// The most bytes of file contents this unpack may write.
    byte_limit: u64,
    buffer: Vec<u8>,
}

/// Where the entry being applied came from, for errors.
struct At<'a> {
    layer: &'a str,
    entry: &'a [u8],
}

impl At<'_> {
    fn refuse(&self, reason: impl Into<String>) -> ImageError {
        ImageError::RefusedEntry {
            layer: self.layer.to_owned(),
            entry: self.entry.escape_ascii().to_string(),
            reason: reason.into(),
        }
    }

    fn too_large(&self, needed: u64, limit: u64) -> ImageError {
        ImageError::TooLarge {
            layer: self.layer.to_owned(),
            entry: self.entry.escape_ascii().to_string(),
            needed,
            limit,
        }
    }

    fn io(&self, operation: &'static str, errno: Errno) -> ImageError {
        ImageError::Unpack {
            layer: self.layer.to_owned(),
            entry: self.entry.escape_ascii().to_string(),
            operation,
            source: errno.into(),
        }
    }
}

/// Why an entry path is refused: `what` is how the entry names it ("has",
/// "is a hard link to").
#[derive(Debug, thiserror::Error)]
enum BadPath {
    #[error("{what} an absolute path, which could escape the image root")]
    Absolute { what: &'static str },
    #[error("{what} a path longer than {MAX_PATH_BYTES} bytes")]
    TooLong { what: &'static str },
    #[error("{what} a path with a `..` component, which could escape the image root")]
    Parent { what: &'static str },
    #[error("{what} more than {MAX_DEPTH} path components")]
    TooDeep { what: &'static str },
}

/// Splits an entry path into its components, refusing absolute paths and
/// `..`; `.` and empty components are dropped, so `./` is the root.
fn components<'p>(path: &'p [u8], what: &'static str) -> Result<Vec<&'p [u8]>, BadPath> {
    if path.starts_with(b"/") {
        return Err(BadPath::Absolute { what });
    }
    if path.len() > MAX_PATH_BYTES {
        return Err(BadPath::TooLong { what });
    }
    let mut out = Vec::new();
    for component in path.split(|&b| b == b'/') {
        match component {
            b"" | b"." => {}
            b".." => return Err(BadPath::Parent { what }),
            name => out.push(name),
        }
    }
    if out.len() > MAX_DEPTH {
        return Err(BadPath::TooDeep { what });
    }
    Ok(out)
}

fn join(components: &[&[u8]]) -> Vec<u8> {
    components.join(&b'/')
}

fn timestamps(mtime: u64) -> Timestamps {
    let time = Timespec {
        tv_sec: i64::try_from(mtime).unwrap_or(i64::MAX),
        tv_nsec: 0,
    };
    Timestamps {
        last_access: time,
        last_modification: time,
    }
}

/// The bound on an image's file contents: [`MAX_FILE_BYTES_VAR`] when it
/// holds a number of bytes, else [`MAX_FILE_BYTES`].
fn max_file_bytes() -> u64 {
    std::env::var(MAX_FILE_BYTES_VAR)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(MAX_FILE_BYTES)
}

/// Refuses a sparse file in the PAX format (`GNU.sparse.*` records): its
/// data holds a map the tar reader does not apply, so writing it as read
/// would give the file other contents.
fn refuse_pax_sparse<R: Read>(
    entry: &mut tar::Entry<'_, R>,
    at: &At<'_>,
) -> Result<(), ImageError> {
    let Ok(Some(extensions)) = entry.pax_extensions() else {
        return Ok(());
    };
    for extension in extensions {
        let key = extension
            .map(|e| e.key_bytes().to_vec())
            .unwrap_or_default();
        if key.starts_with(b"GNU.sparse.") {
            return Err(at.refuse(
                "is a sparse file in the PAX format, which Lazaret does not expand; \
                 build the image without sparse files (no `tar --sparse`)",
            ));
        }
    }
    Ok(())
}

impl Unpacker {
    /// An unpacker writing beneath `root` (any directory descriptor,
    /// `O_PATH` is enough). With `whiteouts` false (for `oci-archive`
    /// extraction, where they have no meaning), `.wh.` names and FIFOs are
    /// refused rather than applied. The root gets mode `0755` unless a layer has
    /// a `./` entry. File contents may take the free space of `root`'s
    /// filesystem less [`FREE_RESERVE`], and at most [`MAX_FILE_BYTES`] (or
    /// what [`MAX_FILE_BYTES_VAR`] sets).
    pub fn new(root: OwnedFd, whiteouts: bool) -> Self {
        let free = rustix::fs::fstatvfs(&root)
            .map(|s| s.f_bavail.saturating_mul(s.f_frsize))
            .unwrap_or(0);
        let mut dirs = BTreeMap::new();
        dirs.insert(
            Vec::new(),
            DirMeta {
                mode: 0o755,
                mtime: None,
            },
        );
        Self {
            root,
            whiteouts,
            dirs,
            layer_paths: HashSet::new(),
            stats: UnpackStats::default(),
            byte_limit: free.saturating_sub(FREE_RESERVE).min(max_file_bytes()),
            buffer: vec![0; 64 * 1024],
        }
    }

    /// Applies one uncompressed tar stream. `layer` names it in errors (the
    /// layer digest, or the archive path). The stream is read up to the
    /// tar end marker; the caller drains and verifies the rest.
    pub fn apply_layer<R: Read>(&mut self, reader: R, layer: &str) -> Result<(), ImageError> {
        self.layer_paths.clear();
        let mut archive = tar::Archive::new(reader);
        let entries = archive.entries().map_err(|source| ImageError::Layer {
            layer: layer.to_owned(),
            source,
        })?;
        for entry in entries {
            let mut entry = entry.map_err(|source| ImageError::Layer {
                layer: layer.to_owned(),
                source,
            })?;
            let path = entry.path_bytes().into_owned();
            let at = At {
                layer,
                entry: &path,
            };
            self.stats.entries += 1;
            if self.stats.entries > MAX_ENTRIES {
                return Err(at.refuse(format!(
                    "is past the {MAX_ENTRIES} entries one image may have"
                )));
            }
            self.apply_entry(&mut entry, &at)?;
        }
        Ok(())
    }

    fn apply_entry<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        at: &At<'_>,
    ) -> Result<(), ImageError> {
        let kind = entry.header().entry_type();
        if matches!(kind, EntryType::XGlobalHeader | EntryType::XHeader) {
            return Ok(());
        }
        let parts = components(at.entry, "has").map_err(|r| at.refuse(r.to_string()))?;
        let Some((&name, parents)) = parts.split_last() else {
            // The root itself (`./`).
            if kind != EntryType::Directory {
                return Err(at.refuse("names the image root but is not a directory"));
            }
            let mode = self.sanitize(entry, true, at)?;
            let mtime = entry.header().mtime().ok();
            self.dirs.insert(Vec::new(), DirMeta { mode, mtime });
            self.stats.directories += 1;
            return Ok(());
        };
        if name.starts_with(WHITEOUT) {
            return if self.whiteouts {
                self.apply_whiteout(parents, name, at)
            } else {
                Err(at.refuse("is a whiteout, which has no meaning here"))
            };
        }
        let key = join(&parts);
        let parent = self
            .open_parent(parents, true, at)?
            .ok_or_else(|| at.refuse("has a parent that could not be created"))?;
        let name = OsStr::from_bytes(name);
        match kind {
            EntryType::Directory => {
                let mode = self.sanitize(entry, true, at)?;
                let kept = self.clear(parent.as_fd(), name, &key, true, at)?;
                if !kept {
                    rustix::fs::mkdirat(&parent, name, Mode::RWXU)
                        .map_err(|e| at.io("create directory", e))?;
                }
                let mtime = entry.header().mtime().ok();
                self.dirs.insert(key.clone(), DirMeta { mode, mtime });
                self.stats.directories += 1;
            }
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                refuse_pax_sparse(entry, at)?;
                let size = if kind == EntryType::GNUSparse {
                    entry
                        .header()
                        .as_gnu()
                        .and_then(|gnu| gnu.real_size().ok())
                        .ok_or_else(|| at.refuse("is a GNU sparse file without a real size"))?
                } else {
                    entry.size()
                };
                let needed = self.stats.file_bytes.saturating_add(size);
                if needed > self.byte_limit {
                    return Err(at.too_large(needed, self.byte_limit));
                }
                let mode = self.sanitize(entry, false, at)?;
                self.clear(parent.as_fd(), name, &key, false, at)?;
                self.write_file(parent.as_fd(), name, entry, mode, at)?;
            }
            EntryType::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .ok_or_else(|| at.refuse("is a symbolic link without a target"))?
                    .into_owned();
                if target.is_empty() {
                    return Err(at.refuse("is a symbolic link with an empty target"));
                }
                self.clear(parent.as_fd(), name, &key, false, at)?;
                rustix::fs::symlinkat(OsStr::from_bytes(&target), &parent, name)
                    .map_err(|e| at.io("create symbolic link", e))?;
                if let Ok(mtime) = entry.header().mtime() {
                    // Best effort: a link's time is cosmetic.
                    let _ = rustix::fs::utimensat(
                        &parent,
                        name,
                        &timestamps(mtime),
                        AtFlags::SYMLINK_NOFOLLOW,
                    );
                }
                self.stats.symlinks += 1;
            }
            EntryType::Link => {
                let target = entry
                    .link_name_bytes()
                    .ok_or_else(|| at.refuse("is a hard link without a target"))?
                    .into_owned();
                self.hard_link(parent.as_fd(), name, &key, &target, at)?;
            }
            EntryType::Fifo if !self.whiteouts => {
                return Err(at.refuse("is a FIFO, which has no place in an OCI archive"));
            }
            EntryType::Char | EntryType::Block if !self.whiteouts => {
                return Err(at.refuse("is a device node, which has no place in an OCI archive"));
            }
            EntryType::Fifo | EntryType::Char | EntryType::Block => {
                // Whatever the path held before is gone, as the layer says;
                // the node itself is not made.
                self.clear(parent.as_fd(), name, &key, false, at)?;
                self.stats.skipped_nodes += 1;
                return Ok(());
            }
            other => {
                return Err(at.refuse(format!(
                    "has the unsupported tar entry type `{}`",
                    char::from(other.as_byte()).escape_default()
                )));
            }
        }
        self.layer_paths.insert(key);
        Ok(())
    }

    /// The mode an entry is created with: permission bits, plus the sticky
    /// bit on directories. Setuid, setgid and sticky-on-files are stripped
    /// and counted.
    fn sanitize<R: Read>(
        &mut self,
        entry: &tar::Entry<'_, R>,
        dir: bool,
        at: &At<'_>,
    ) -> Result<u32, ImageError> {
        let mode = entry
            .header()
            .mode()
            .map_err(|_| at.refuse("has an unreadable mode field"))?;
        let allowed = if dir { 0o1777 } else { 0o777 };
        if mode & 0o7000 & !allowed != 0 {
            self.stats.stripped_mode_bits += 1;
        }
        Ok(mode & allowed)
    }

    /// Opens (creating, when `create`, as `0700` directories) the parent
    /// directories of an entry. `None` when one is missing and not created.
    fn open_parent(
        &mut self,
        parents: &[&[u8]],
        create: bool,
        at: &At<'_>,
    ) -> Result<Option<OwnedFd>, ImageError> {
        let mut current =
            open_dir_path(self.root.as_fd(), ".").map_err(|e| at.io("open the root", e))?;
        for (depth, &component) in parents.iter().enumerate() {
            let name = OsStr::from_bytes(component);
            let next = match open_dir_path(current.as_fd(), name) {
                Ok(fd) => fd,
                Err(Errno::NOENT) if create => {
                    match rustix::fs::mkdirat(&current, name, Mode::RWXU) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(at.io("create parent directory", e)),
                    }
                    self.dirs
                        .entry(join(&parents[..=depth]))
                        .or_insert(DirMeta {
                            mode: 0o755,
                            mtime: None,
                        });
                    open_dir_path(current.as_fd(), name)
                        .map_err(|e| at.io("open parent directory", e))?
                }
                Err(Errno::NOENT) => return Ok(None),
                Err(Errno::NOTDIR | Errno::LOOP) => {
                    let prefix = join(&parents[..=depth]).escape_ascii().to_string();
                    let stat = beneath::lstat_at(current.as_fd(), name)
                        .map_err(|e| at.io("inspect parent", e))?;
                    return Err(match stat.map(|s| beneath::file_type(&s)) {
                        Some(FileType::Symlink) => at.refuse(format!(
                            "passes through the symbolic link `{prefix}`, which unpacking never follows"
                        )),
                        _ => at.refuse(format!("has the parent `{prefix}`, which is not a directory")),
                    });
                }
                Err(Errno::XDEV) => {
                    return Err(at.refuse("crosses a mount point"));
                }
                Err(e) => return Err(at.io("open parent directory", e)),
            };
            if create {
                self.layer_paths.insert(join(&parents[..=depth]));
            }
            current = next;
        }
        Ok(Some(current))
    }

    /// Makes room for an entry at `name`: an existing directory is kept when
    /// `keep_dir` (a directory entry over a directory merges), anything else
    /// is removed. Returns whether a directory was kept.
    fn clear(
        &mut self,
        parent: BorrowedFd<'_>,
        name: &OsStr,
        key: &[u8],
        keep_dir: bool,
        at: &At<'_>,
    ) -> Result<bool, ImageError> {
        let existing = beneath::lstat_at(parent, name).map_err(|e| at.io("inspect", e))?;
        match existing.map(|s| beneath::file_type(&s)) {
            None => Ok(false),
            Some(FileType::Directory) if keep_dir => Ok(true),
            Some(_) => {
                tree::remove_at(parent, name).map_err(|e| at.io("replace", e))?;
                self.forget_dirs(key);
                Ok(false)
            }
        }
    }

    /// Drops the recorded directory metadata at and beneath `key`.
    fn forget_dirs(&mut self, key: &[u8]) {
        self.dirs.remove(key);
        let mut low = key.to_vec();
        low.push(b'/');
        let mut high = key.to_vec();
        high.push(b'/' + 1);
        let doomed: Vec<Vec<u8>> = self.dirs.range(low..high).map(|(k, _)| k.clone()).collect();
        for k in doomed {
            self.dirs.remove(&k);
        }
    }

    fn write_file<R: Read>(
        &mut self,
        parent: BorrowedFd<'_>,
        name: &OsStr,
        entry: &mut tar::Entry<'_, R>,
        mode: u32,
        at: &At<'_>,
    ) -> Result<(), ImageError> {
        let fd = open_beneath(
            parent,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL,
            Mode::RUSR | Mode::WUSR,
        )
        .map_err(|e| at.io("create file", e))?;
        let mut file = std::fs::File::from(fd);
        loop {
            let n = match entry.read(&mut self.buffer) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(source) => {
                    return Err(ImageError::Layer {
                        layer: at.layer.to_owned(),
                        source,
                    });
                }
            };
            file.write_all(&self.buffer[..n])
                .map_err(|source| ImageError::Unpack {
                    layer: at.layer.to_owned(),
                    entry: at.entry.escape_ascii().to_string(),
                    operation: "write",
                    source,
                })?;
            self.stats.file_bytes += n as u64;
            if self.stats.file_bytes > self.byte_limit {
                return Err(at.too_large(self.stats.file_bytes, self.byte_limit));
            }
        }
        rustix::fs::fchmod(&file, Mode::from_raw_mode(mode))
            .map_err(|e| at.io("set the mode of", e))?;
        if let Ok(mtime) = entry.header().mtime() {
            rustix::fs::futimens(&file, &timestamps(mtime))
                .map_err(|e| at.io("set the time of", e))?;
        }
        self.stats.files += 1;
        Ok(())
    }

    fn hard_link(
        &mut self,
        parent: BorrowedFd<'_>,
        name: &OsStr,
        key: &[u8],
        target: &[u8],
        at: &At<'_>,
    ) -> Result<(), ImageError> {
        let target_parts =
            components(target, "is a hard link to").map_err(|r| at.refuse(r.to_string()))?;
        let shown = target.escape_ascii().to_string();
        let Some((&target_name, target_parents)) = target_parts.split_last() else {
            return Err(at.refuse("is a hard link to the image root"));
        };
        if join(&target_parts) == key {
            return Ok(());
        }
        let target_parent = self
            .open_parent(target_parents, false, at)
            .map_err(|e| match e {
                ImageError::RefusedEntry { reason, .. } => {
                    at.refuse(format!("is a hard link to `{shown}`, which {reason}"))
                }
                other => other,
            })?
            .ok_or_else(|| {
                at.refuse(format!("is a hard link to `{shown}`, which does not exist"))
            })?;
        let target_name = OsStr::from_bytes(target_name);
        match beneath::lstat_at(target_parent.as_fd(), target_name)
            .map_err(|e| at.io("inspect hard link target of", e))?
            .map(|s| beneath::file_type(&s))
        {
            None => {
                return Err(at.refuse(format!("is a hard link to `{shown}`, which does not exist")));
            }
            Some(FileType::Directory) => {
                return Err(at.refuse(format!("is a hard link to the directory `{shown}`")));
            }
            Some(_) => {}
        }
        self.clear(parent, name, key, false, at)?;
        rustix::fs::linkat(&target_parent, target_name, parent, name, AtFlags::empty())
            .map_err(|e| at.io("create hard link", e))?;
        self.stats.hardlinks += 1;
        Ok(())
    }

    fn apply_whiteout(
        &mut self,
        parents: &[&[u8]],
        name: &[u8],
        at: &At<'_>,
    ) -> Result<(), ImageError> {
        self.stats.whiteouts += 1;
        if name == OPAQUE {
            let dir = self
                .open_parent(parents, true, at)?
                .ok_or_else(|| at.refuse("has a parent that could not be created"))?;
            let readable =
                beneath::open_dir_read(dir.as_fd(), ".").map_err(|e| at.io("open", e))?;
            let prefix = join(parents);
            let mut doomed = Vec::new();
            for child in beneath::list_names(readable.as_fd()).map_err(|e| at.io("list", e))? {
                let key = if prefix.is_empty() {
                    child.clone()
                } else {
                    [prefix.as_slice(), b"/", &child].concat()
                };
                if !self.layer_paths.contains(&key) {
                    doomed.push((child, key));
                }
            }
            for (child, key) in doomed {
                tree::remove_at(readable.as_fd(), OsStr::from_bytes(&child))
                    .map_err(|e| at.io("remove (opaque directory)", e))?;
                self.forget_dirs(&key);
            }
            return Ok(());
        }
        let target = &name[WHITEOUT.len()..];
        if target.starts_with(WHITEOUT) {
            // Other `.wh..wh.` names are AUFS metadata; they hide nothing.
            return Ok(());
        }
        if target.is_empty() || target == b"." || target == b".." {
            return Err(at.refuse("is a whiteout of no valid name"));
        }
        let mut key_parts = parents.to_vec();
        key_parts.push(target);
        let key = join(&key_parts);
        if self.layer_paths.contains(&key) {
            // A whiteout hides lower layers only.
            return Ok(());
        }
        let Some(dir) = self.open_parent(parents, false, at)? else {
            return Ok(());
        };
        tree::remove_at(dir.as_fd(), OsStr::from_bytes(target))
            .map_err(|e| at.io("remove (whiteout)", e))?;
        self.forget_dirs(&key);
        Ok(())
    }

    /// Measures the tree, then applies directory modes and times, deepest
    /// first, and returns what was done.
    pub fn finish(mut self, label: &str) -> Result<UnpackStats, ImageError> {
        let at = At {
            layer: label,
            entry: b".",
        };
        let root = beneath::open_dir_read(self.root.as_fd(), ".").map_err(|e| at.io("open", e))?;
        self.stats.disk_bytes = tree::disk_usage(root.as_fd()).map_err(|e| at.io("measure", e))?;
        self.finish_unmeasured(label)
    }

    /// Applies directory modes and times, deepest first, without measuring
    /// the tree (`disk_bytes` stays 0), and returns what was done.
    pub fn finish_unmeasured(mut self, label: &str) -> Result<UnpackStats, ImageError> {
        let mut dirs: Vec<(Vec<u8>, DirMeta)> =
            std::mem::take(&mut self.dirs).into_iter().collect();
        dirs.sort_by_key(|(key, _)| {
            std::cmp::Reverse(
                key.iter().filter(|&&b| b == b'/').count() + usize::from(!key.is_empty()),
            )
        });
        for (key, meta) in dirs {
            let path = if key.is_empty() {
                b".".to_vec()
            } else {
                key.clone()
            };
            let at = At {
                layer: label,
                entry: &key,
            };
            let dir = match beneath::open_dir_read(self.root.as_fd(), OsStr::from_bytes(&path)) {
                Ok(dir) => dir,
                // Replaced by a later layer with something else.
                Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) => continue,
                Err(e) => return Err(at.io("open directory", e)),
            };
            if let Some(mtime) = meta.mtime {
                rustix::fs::futimens(&dir, &timestamps(mtime))
                    .map_err(|e| at.io("set the time of", e))?;
            }
            rustix::fs::fchmod(&dir, Mode::from_raw_mode(meta.mode))
                .map_err(|e| at.io("set the mode of", e))?;
        }
        Ok(self.stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_refuse_escapes() {
        assert_eq!(
            components(b"./a//b/./c", "has").unwrap(),
            vec![&b"a"[..], b"b", b"c"]
        );
        assert!(components(b"./", "has").unwrap().is_empty());
        assert!(components(b"/etc/passwd", "has").is_err());
        assert!(components(b"a/../../b", "has").is_err());
        assert!(components(b"..", "has").is_err());
    }
}
