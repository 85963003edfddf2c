//! The host side of one session's Escalation Mailbox: its directories on
//! the mailbox tmpfs, the credential written there, the records taken from
//! `requests/` and the records put in `results/`.
//!
//! Owns every file operation on the mailbox, each relative to a directory
//! descriptor held since the directory was made: a name the sandbox swaps
//! for a link or another directory is never followed. Everything in the
//! mailbox is the sandbox's to change, so what is read is read once,
//! without blocking, within a size bound, and removed; anything but a
//! regular file is refused and removed. Files are written under a `.`
//! name and renamed into place, so a reader never sees half a record.
//! Trusts nothing it reads; the service verifies every record.

use std::collections::HashSet;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use lazaret_hostfs::beneath::{self, list};
use lazaret_hostfs::read::{ReadError, read_small};
use lazaret_hostfs::tree;
use lazaret_proto::codec::WireRecord;
use lazaret_proto::ids::SessionId;
use lazaret_proto::mailbox::{
    CREDENTIAL_FILE, GUEST_FILE, REQUESTS_DIR, RESULTS_DIR, SignedProtocolRecord,
};
use rustix::fs::{AtFlags, FileType, Mode, OFlags};

use lazaret_hostfs::plan::type_name;

/// The most bytes of a record file taken from the sandbox.
const MAX_RECORD_FILE: u64 = SignedProtocolRecord::MAX_ENCODED_LEN as u64;

/// How old a `.`-named file in `requests/` (one being written) may get
/// before it is taken for litter and removed.
const PART_FILE_AGE: std::time::Duration = std::time::Duration::from_secs(60);

/// One session's mailbox; removed, with whatever the sandbox made in it,
/// when dropped.
#[derive(Debug)]
pub struct SessionMailbox {
    root: OwnedFd,
    name: String,
    dir: OwnedFd,
    requests: OwnedFd,
    results: OwnedFd,
}

impl Drop for SessionMailbox {
    fn drop(&mut self) {
        let _ = tree::remove_at(self.root.as_fd(), std::ffi::OsStr::new(&self.name));
    }
}

/// What a look into `requests/` found.
#[derive(Debug)]
pub enum Taken {
    /// A regular file's bytes (already removed from the mailbox).
    File {
        /// Its name.
        name: String,
        /// Its content.
        bytes: Vec<u8>,
    },
    /// Something that is not a record file; removed where it could be.
    Refused {
        /// Its name, escaped for the log.
        name: String,
        /// Why.
        why: Refusal,
    },
}

/// Why something in `requests/` is not taken as a record file.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// What was listed as a regular file was no longer one when opened.
    #[error("it changed into something else while read")]
    Changed,
    /// It could not be read within the bound.
    #[error("it cannot be read")]
    Unreadable(#[source] ReadError),
    /// It is a directory.
    #[error("it is a directory, not a record file")]
    Directory,
    /// It is a symbolic link, a FIFO, a socket or a device.
    #[error("it is a {}, not a regular file", type_name(*kind))]
    NotRegular {
        /// What it is.
        kind: FileType,
    },
}

/// A session leader's identity inside the sandbox, as it wrote it in
/// [`GUEST_FILE`]: the sandbox's own claim, recorded for the session and
/// never acted on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuestClaim {
    /// Its pid in the sandbox.
    pub pid: u32,
    /// Its process group.
    pub process_group: u32,
    /// Its start time, in clock ticks since the sandbox's boot.
    pub start_time: u64,
}

/// Writes `bytes` as `name` beneath `dir`: a new `.`-named file, then a
/// rename over `name`.
fn put(dir: BorrowedFd<'_>, name: &str, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let nonce = lazaret_proto::ids::to_hex(&lazaret_proto::signing::random_bytes::<8>());
    let temporary = format!(".{name}.{nonce}.part");
    let fd = rustix::fs::openat(
        dir,
        temporary.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(mode),
    )?;
    let written = std::fs::File::from(fd).write_all(bytes);
    let placed = written.and_then(|()| {
        rustix::fs::renameat(dir, temporary.as_str(), dir, name).map_err(std::io::Error::from)
    });
    if placed.is_err() {
        let _ = rustix::fs::unlinkat(dir, temporary.as_str(), AtFlags::empty());
    }
    placed
}

impl SessionMailbox {
    /// Makes the mailbox of `session_id` beneath `root` (the mailbox
    /// tmpfs): its directory, `requests/`, `results/`, and the credential
    /// bundle `credential` as given (encoded).
    pub fn create(
        root: BorrowedFd<'_>,
        session_id: SessionId,
        credential: &[u8],
    ) -> std::io::Result<Self> {
        let name = session_id.to_hex();
        rustix::fs::mkdirat(root, name.as_str(), Mode::from_raw_mode(0o700))?;
        let made = (|| {
            let dir = beneath::open_dir_read(root, name.as_str())?;
            for sub in [REQUESTS_DIR, RESULTS_DIR] {
                rustix::fs::mkdirat(&dir, sub, Mode::from_raw_mode(0o700))?;
            }
            let requests = beneath::open_dir_read(dir.as_fd(), REQUESTS_DIR)?;
            let results = beneath::open_dir_read(dir.as_fd(), RESULTS_DIR)?;
            put(dir.as_fd(), CREDENTIAL_FILE, credential, 0o400)?;
            Ok::<_, std::io::Error>((dir, requests, results))
        })();
        match made {
            Ok((dir, requests, results)) => Ok(Self {
                root: root.try_clone_to_owned()?,
                name,
                dir,
                requests,
                results,
            }),
            Err(e) => {
                // Half a mailbox is none.
                let _ = tree::remove_at(root, std::ffi::OsStr::new(&name));
                Err(e)
            }
        }
    }

    /// The session's directory, for watching.
    pub fn dir(&self) -> BorrowedFd<'_> {
        self.dir.as_fd()
    }

    /// The `requests/` directory, for watching.
    pub fn requests_dir(&self) -> BorrowedFd<'_> {
        self.requests.as_fd()
    }

    /// The `results/` directory, for watching.
    pub fn results_dir(&self) -> BorrowedFd<'_> {
        self.results.as_fd()
    }

    /// Takes every finished file out of `requests/`: regular files are read
    /// (within the bound) and removed; anything else is refused and
    /// removed. Names beginning with `.` are files still being written.
    /// `complained` holds the names already refused that could not be
    /// removed (a directory with content), so each is reported once.
    pub fn take(&self, complained: &mut HashSet<Vec<u8>>) -> std::io::Result<Vec<Taken>> {
        let dir = self.requests.as_fd();
        let mut taken = Vec::new();
        for entry in list(dir)? {
            if entry.name.starts_with(b".") {
                // Being written; left too long, it is litter that would
                // fill the mailbox.
                let name = std::ffi::OsStr::from_bytes(&entry.name);
                let old = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
                    .ok()
                    .and_then(|s| {
                        let modified = std::time::UNIX_EPOCH
                            + std::time::Duration::from_secs(u64::try_from(s.st_mtime).ok()?);
                        modified.elapsed().ok()
                    })
                    .is_some_and(|age| age > PART_FILE_AGE);
                if old {
                    let _ = tree::remove_at(dir, name);
                }
                continue;
            }
            let shown = String::from_utf8_lossy(&entry.name)
                .escape_debug()
                .to_string();
            let name = std::ffi::OsStr::from_bytes(&entry.name);
            let refused = |why: Refusal| Taken::Refused {
                name: shown.clone(),
                why,
            };
            match entry.file_type {
                FileType::RegularFile => {
                    let read = read_small(Some(dir), Path::new(name), false, MAX_RECORD_FILE);
                    let _ = rustix::fs::unlinkat(dir, name, AtFlags::empty());
                    taken.push(match read {
                        Ok(Some(bytes)) => Taken::File { name: shown, bytes },
                        Ok(None) => refused(Refusal::Changed),
                        Err(e) => refused(Refusal::Unreadable(e)),
                    });
                }
                FileType::Directory => {
                    let removed = rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR).is_ok();
                    if removed || complained.insert(entry.name.clone()) {
                        taken.push(refused(Refusal::Directory));
                    }
                }
                other => {
                    let _ = rustix::fs::unlinkat(dir, name, AtFlags::empty());
                    taken.push(refused(Refusal::NotRegular { kind: other }));
                }
            }
        }
        Ok(taken)
    }

    /// What the session's leader wrote as its identity inside the
    /// sandbox, if it did.
    pub fn guest(&self) -> Option<GuestClaim> {
        let bytes = read_small(Some(self.dir.as_fd()), Path::new(GUEST_FILE), false, 64).ok()??;
        let text = std::str::from_utf8(&bytes).ok()?;
        let mut fields = text.split_ascii_whitespace();
        Some(GuestClaim {
            pid: fields.next()?.parse().ok()?,
            process_group: fields.next()?.parse().ok()?,
            start_time: fields.next()?.parse().ok()?,
        })
    }

    /// Puts a record file in `results/`.
    pub fn put_result(&self, name: &str, bytes: &[u8]) -> std::io::Result<()> {
        put(self.results.as_fd(), name, bytes, 0o400)
    }

    /// Whether `results/` still holds `name` (the client removes chunks it
    /// has read).
    pub fn holds_result(&self, name: &str) -> bool {
        rustix::fs::statat(&self.results, name, AtFlags::SYMLINK_NOFOLLOW).is_ok()
    }

    /// Removes `name` from `results/`, if there.
    pub fn remove_result(&self, name: &str) {
        let _ = rustix::fs::unlinkat(&self.results, name, AtFlags::empty());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> (tempfile::TempDir, OwnedFd) {
        let dir = tempfile::tempdir().unwrap();
        let fd = rustix::fs::open(
            dir.path(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
        (dir, fd)
    }

    #[test]
    fn records_are_taken_once_and_oddities_refused() {
        let (tmp, fd) = root();
        let mailbox = SessionMailbox::create(fd.as_fd(), SessionId([7; 16]), b"bundle").unwrap();
        let base = tmp.path().join(SessionId([7; 16]).to_hex());
        assert_eq!(
            std::fs::read(base.join(CREDENTIAL_FILE)).unwrap(),
            b"bundle"
        );
        let requests = base.join(REQUESTS_DIR);
        std::fs::write(requests.join("a.request"), b"one").unwrap();
        std::fs::write(requests.join(".b.request.part"), b"half").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", requests.join("c.request")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            requests.join("d.request"),
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        std::fs::create_dir_all(requests.join("e/f")).unwrap();
        std::fs::write(
            requests.join("big"),
            vec![0u8; MAX_RECORD_FILE as usize + 1],
        )
        .unwrap();

        let mut complained = HashSet::new();
        let mut taken = mailbox.take(&mut complained).unwrap();
        taken.sort_by_key(|t| match t {
            Taken::File { name, .. } | Taken::Refused { name, .. } => name.clone(),
        });
        let summary: Vec<String> = taken
            .iter()
            .map(|t| match t {
                Taken::File { name, bytes } => format!("{name}={}", String::from_utf8_lossy(bytes)),
                Taken::Refused { name, why } => {
                    format!("{name}: {}", lazaret_proto::error_chain(why))
                }
            })
            .collect();
        assert_eq!(summary[0], "a.request=one");
        assert!(
            summary[1].starts_with("big: it cannot be read"),
            "{summary:?}"
        );
        assert!(summary[2].contains("symbolic link"), "{summary:?}");
        assert!(
            summary[3].contains("FIFO") || summary[3].contains("fifo"),
            "{summary:?}"
        );
        assert!(summary[4].contains("directory"), "{summary:?}");
        // What could be removed is gone; the half-written file is left.
        let left: HashSet<String> = std::fs::read_dir(&requests)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(left, HashSet::from([".b.request.part".into(), "e".into()]));
        // The directory that stays is reported once.
        assert!(mailbox.take(&mut complained).unwrap().is_empty());

        mailbox.put_result("x.result", b"r").unwrap();
        assert!(mailbox.holds_result("x.result"));
        assert_eq!(
            std::fs::read(base.join(RESULTS_DIR).join("x.result")).unwrap(),
            b"r"
        );
        drop(mailbox);
        assert!(!base.exists());
    }

    #[test]
    fn a_swapped_directory_is_not_followed() {
        let (tmp, fd) = root();
        let mailbox = SessionMailbox::create(fd.as_fd(), SessionId([8; 16]), b"b").unwrap();
        let base = tmp.path().join(SessionId([8; 16]).to_hex());
        let outside = tempfile::tempdir().unwrap();
        // The sandbox moves results/ away and puts a link in its place.
        std::fs::rename(base.join(RESULTS_DIR), base.join("moved")).unwrap();
        std::os::unix::fs::symlink(outside.path(), base.join(RESULTS_DIR)).unwrap();
        mailbox.put_result("x.result", b"r").unwrap();
        assert!(std::fs::read_dir(outside.path()).unwrap().next().is_none());
        assert!(base.join("moved/x.result").exists());
    }

    /// A mailbox on a scratch root, and its `requests/` path.
    fn scratch(id: u8) -> (tempfile::TempDir, SessionMailbox, std::path::PathBuf) {
        let (tmp, fd) = root();
        let mailbox = SessionMailbox::create(fd.as_fd(), SessionId([id; 16]), b"b").unwrap();
        let requests = tmp
            .path()
            .join(SessionId([id; 16]).to_hex())
            .join(REQUESTS_DIR);
        (tmp, mailbox, requests)
    }

    fn take_all(mailbox: &SessionMailbox) -> Vec<Taken> {
        let mut taken = mailbox.take(&mut HashSet::new()).unwrap();
        taken.sort_by_key(|t| match t {
            Taken::File { name, .. } | Taken::Refused { name, .. } => name.clone(),
        });
        taken
    }

    #[test]
    fn a_record_file_of_exactly_the_bound_is_taken_and_one_byte_more_is_not() {
        let (_tmp, mailbox, requests) = scratch(1);
        let bound = MAX_RECORD_FILE as usize;
        std::fs::write(requests.join("a"), vec![7u8; bound]).unwrap();
        std::fs::write(requests.join("b"), vec![7u8; bound + 1]).unwrap();
        std::fs::write(requests.join("c"), b"").unwrap();
        let taken = take_all(&mailbox);
        assert!(
            matches!(&taken[0], Taken::File { name, bytes } if name == "a" && bytes.len() == bound)
        );
        match &taken[1] {
            Taken::Refused {
                name,
                why: Refusal::Unreadable(ReadError::TooLarge { max }),
            } => {
                assert_eq!(name, "b");
                assert_eq!(*max, MAX_RECORD_FILE);
            }
            other => panic!("{other:?}"),
        }
        // An empty file is taken as it is; the record's checks refuse it.
        assert!(
            matches!(&taken[2], Taken::File { name, bytes } if name == "c" && bytes.is_empty())
        );
        // Every one of them is gone, whatever became of it.
        assert_eq!(std::fs::read_dir(&requests).unwrap().count(), 0);
    }

    #[test]
    fn a_socket_and_a_link_to_a_directory_are_refused_by_their_kind() {
        let (tmp, mailbox, requests) = scratch(2);
        let _socket = std::os::unix::net::UnixListener::bind(requests.join("s")).unwrap();
        std::os::unix::fs::symlink(tmp.path(), requests.join("l")).unwrap();
        let taken = take_all(&mailbox);
        let kinds: Vec<_> = taken
            .iter()
            .map(|t| match t {
                Taken::Refused {
                    why: Refusal::NotRegular { kind },
                    ..
                } => *kind,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(kinds, [FileType::Symlink, FileType::Socket]);
        let said = lazaret_proto::error_chain(match &taken[1] {
            Taken::Refused { why, .. } => why,
            Taken::File { .. } => unreachable!(),
        });
        assert_eq!(said, "it is a socket, not a regular file");
        // The link is gone, and what it named is not.
        assert!(tmp.path().exists());
        assert_eq!(std::fs::read_dir(&requests).unwrap().count(), 0);
    }

    #[test]
    fn a_file_no_one_may_read_is_taken_only_by_root() {
        let (_tmp, mailbox, requests) = scratch(3);
        let path = requests.join("locked");
        std::fs::write(&path, b"x").unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o000))
            .unwrap();
        let taken = take_all(&mailbox);
        if rustix::process::geteuid().is_root() {
            assert!(matches!(&taken[..], [Taken::File { bytes, .. }] if bytes == b"x"));
        } else {
            assert!(
                matches!(
                    &taken[..],
                    [Taken::Refused {
                        why: Refusal::Unreadable(ReadError::Io(_)),
                        ..
                    }]
                ),
                "{taken:?}"
            );
        }
        // Either way it is removed: it cannot fill the mailbox.
        assert!(!path.exists());
    }

    #[test]
    fn names_are_escaped_and_only_old_part_files_are_litter() {
        let (_tmp, mailbox, requests) = scratch(4);
        let odd = std::ffi::OsStr::from_bytes(b"x\xff\n\x1b[31m");
        std::fs::write(requests.join(odd), b"r").unwrap();
        let old = requests.join(".old.part");
        let new = requests.join(".new.part");
        std::fs::write(&old, b"").unwrap();
        std::fs::write(&new, b"").unwrap();
        let long_ago = rustix::fs::Timestamps {
            last_access: rustix::fs::Timespec {
                tv_sec: 1,
                tv_nsec: 0,
            },
            last_modification: rustix::fs::Timespec {
                tv_sec: 1,
                tv_nsec: 0,
            },
        };
        rustix::fs::utimensat(rustix::fs::CWD, &old, &long_ago, AtFlags::empty()).unwrap();
        let taken = take_all(&mailbox);
        match &taken[..] {
            [Taken::File { name, bytes }] => {
                assert_eq!(bytes, b"r");
                assert!(!name.contains('\n') && !name.contains('\x1b'), "{name:?}");
                assert!(name.starts_with('x'), "{name:?}");
            }
            other => panic!("{other:?}"),
        }
        assert!(!old.exists());
        assert!(new.exists());
    }

    #[test]
    fn the_guest_claim_is_read_only_when_well_formed() {
        let (tmp, mailbox, _) = scratch(5);
        let dir = tmp.path().join(SessionId([5; 16]).to_hex());
        let guest = dir.join(GUEST_FILE);
        assert_eq!(mailbox.guest(), None);
        std::fs::write(&guest, b"12 12 99887766\n").unwrap();
        assert_eq!(
            mailbox.guest(),
            Some(GuestClaim {
                pid: 12,
                process_group: 12,
                start_time: 99_887_766
            })
        );
        for bad in [
            &b"12 12"[..],
            b"-1 12 5",
            b"12 x 5",
            b"4294967296 1 1",
            b"\xff 1 1",
        ] {
            std::fs::write(&guest, bad).unwrap();
            assert_eq!(mailbox.guest(), None, "{:?}", String::from_utf8_lossy(bad));
        }
        // More than the bound is not read at all.
        let mut long = b"1 1 1".to_vec();
        long.extend(std::iter::repeat_n(b' ', 64));
        std::fs::write(&guest, &long).unwrap();
        assert_eq!(mailbox.guest(), None);
        // A link in its place is not followed.
        std::fs::remove_file(&guest).unwrap();
        let elsewhere = tmp.path().join("claim");
        std::fs::write(&elsewhere, b"1 1 1").unwrap();
        std::os::unix::fs::symlink(&elsewhere, &guest).unwrap();
        assert_eq!(mailbox.guest(), None);
    }

    #[test]
    fn results_are_written_whole_and_removed_by_name() {
        let (tmp, mailbox, _) = scratch(6);
        let results = tmp
            .path()
            .join(SessionId([6; 16]).to_hex())
            .join(RESULTS_DIR);
        mailbox.put_result("r", b"first").unwrap();
        mailbox.put_result("r", b"second").unwrap();
        assert_eq!(std::fs::read(results.join("r")).unwrap(), b"second");
        let mode = std::fs::metadata(results.join("r")).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
            0o400
        );
        // No `.part` file is left behind.
        assert_eq!(std::fs::read_dir(&results).unwrap().count(), 1);
        mailbox.remove_result("r");
        assert!(!mailbox.holds_result("r"));
        mailbox.remove_result("r");
    }
}
