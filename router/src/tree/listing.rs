//! Directory listings: `opendir`, reads of an open directory and
//! `releasedir`.
//!
//! Owns the merged listing of a directory: the host entries the rules
//! route to the host, then the isolated side's entries they route there
//! and the host does not show, taken when the directory is opened (and
//! again when a read starts over). `readdirplus` finds each listed name
//! afresh, so nothing but the name is taken from the listing. Trusts
//! nothing in a request: a handle that names no open directory is
//! `EBADF`, and an offset past the last entry lists nothing.

use std::collections::HashSet;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use lazaret_routing::classify::{DirState, Route};
use rustix::fs::{OFlags, Stat};
use rustix::io::Errno;

use super::routing::HostListing;
use super::sides::{Listed, Sides, list};
use super::{Result, Tree};
use crate::nodes::Kind;

impl Tree {
    /// `opendir`: the merged listing, taken now.
    pub fn opendir(&self, ino: u64) -> Result<u64> {
        let listing = self.list_dir(ino)?;
        Ok(self.dirs.insert(listing))
    }

    /// Before a read from the start of an open directory: the first uses
    /// the listing `opendir` took; a later one (after `rewinddir`) takes
    /// it again, as it must see what the directory holds now.
    pub fn rewind(&self, handle: u64, ino: u64) -> Result<()> {
        if !self.listing(handle)?.read.swap(true, Ordering::Relaxed) {
            return Ok(());
        }
        let listing = self.list_dir(ino)?;
        listing.read.store(true, Ordering::Relaxed);
        self.dirs.replace(handle, listing)
    }

    /// The merged listing of the directory `ino`.
    fn list_dir(&self, ino: u64) -> Result<Listing> {
        let (node, state) = match self.dir_node(ino) {
            Ok(dir) => dir,
            // A removed directory lists nothing.
            Err(Errno::NOENT) => {
                return Ok(Listing {
                    entries: Vec::new(),
                    read: std::sync::atomic::AtomicBool::new(false),
                });
            }
            Err(e) => return Err(e),
        };
        let entries = match node.route {
            Route::Isolated => {
                let dir = self.open_dir(Route::Isolated, &node.path, OFlags::RDONLY)?;
                list(dir.as_fd())?
                    .into_iter()
                    .map(|(name, kind, ino)| DirEntry { name, kind, ino })
                    .collect()
            }
            Route::Host => {
                let dir = self.open_dir(Route::Host, &node.path, OFlags::RDONLY)?;
                let listed = list(dir.as_fd())?;
                let host = HostListing::new(&listed);
                let mut entries = Vec::with_capacity(listed.len());
                for (name, kind, ino) in &listed {
                    let is_dir = *kind == Kind::Dir;
                    let (route, _) =
                        self.classifier
                            .child(&state, &node.path, name, is_dir, host.facts(name));
                    if route == Route::Host {
                        entries.push(DirEntry {
                            name: name.clone(),
                            kind: *kind,
                            ino: *ino,
                        });
                    }
                }
                let shown: HashSet<Vec<u8>> = entries.iter().map(|e| e.name.clone()).collect();
                for entry in self.isolated_entries(&node.path, &state, Some(&listed))? {
                    if !shown.contains(&entry.name) {
                        entries.push(entry);
                    }
                }
                entries
            }
        };
        Ok(Listing {
            entries,
            read: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The listing of an open directory.
    pub fn listing(&self, handle: u64) -> Result<Arc<Listing>> {
        self.dirs.get(handle)
    }

    /// `readdirplus`: the entries of an open directory from `from` on,
    /// each with its attributes and counted as a lookup, handed to `emit`
    /// (its inode, the offset of the next entry, its name, its attributes)
    /// until `emit` says the reply is full. An entry that vanished since the
    /// listing is skipped.
    pub fn readdirplus(
        &self,
        handle: u64,
        ino: u64,
        from: usize,
        mut emit: impl FnMut(u64, u64, &[u8], &Stat) -> bool,
    ) -> Result<()> {
        let listing = self.listing(handle)?;
        let _names = self.read_names();
        // The directory as it is now (it may have been renamed since it
        // was listed): each name is found afresh, nothing taken from the
        // listing but the name. A removed directory lists nothing more.
        let (node, state) = match self.dir_node(ino) {
            Ok(dir) => dir,
            Err(Errno::NOENT) => return Ok(()),
            Err(e) => return Err(e),
        };
        let mut sides = Sides::new(self, &node.path, &state)?;
        let mut emitted = false;
        for (i, entry) in listing.entries.iter().enumerate().skip(from) {
            let found = match self.find_in(&mut sides, &node.path, &state, &entry.name) {
                Ok(Some(found)) => found,
                // Gone since the listing: skipped.
                Ok(None) => continue,
                // What was added so far goes out; the kernel asks again.
                Err(_) if emitted => break,
                Err(e) => return Err(e),
            };
            let ino = self.register(&found);
            // Offsets 1 and 2 are `.` and `..`; entry i is at i + 3.
            if emit(ino, i as u64 + 3, &entry.name, &found.stat) {
                // It did not fit: the kernel never saw this lookup.
                self.forget(ino, 1);
                break;
            }
            emitted = true;
        }
        Ok(())
    }

    /// `releasedir`.
    pub fn releasedir(&self, handle: u64) {
        self.dirs.remove(handle);
    }

    /// The entries of the isolated side's directory of the host directory
    /// at `path` that the merged view shows, given the host directory's
    /// listing (listed here when not given).
    pub(super) fn isolated_entries(
        &self,
        path: &[u8],
        state: &DirState,
        host: Option<&[Listed]>,
    ) -> Result<Vec<DirEntry>> {
        let Some(fd) = self.isolated_dir_if_any(path, OFlags::RDONLY)? else {
            return Ok(Vec::new());
        };
        let listed_here;
        let host = match host {
            Some(host) => host,
            None => {
                listed_here = list(self.open_dir(Route::Host, path, OFlags::RDONLY)?.as_fd())?;
                &listed_here
            }
        };
        let host = HostListing::new(host);
        let mut out = Vec::new();
        for (name, kind, ino) in list(fd.as_fd())? {
            let facts = host.facts(&name);
            let (route, _) = self
                .classifier
                .child(state, path, &name, kind == Kind::Dir, facts);
            if route == Route::Isolated {
                out.push(DirEntry { name, kind, ino });
            }
        }
        Ok(out)
    }
}

/// One entry of a directory listing.
#[derive(Clone, Debug)]
pub struct DirEntry {
    /// Its name.
    pub name: Vec<u8>,
    /// Its kind.
    pub kind: Kind,
    /// An inode number for `d_ino` (never 0).
    pub ino: u64,
}

/// A directory's entries, as listed when it was opened.
#[derive(Debug)]
pub struct Listing {
    /// Its visible entries.
    pub entries: Vec<DirEntry>,
    /// Whether a read from its start has used it.
    read: std::sync::atomic::AtomicBool,
}

#[cfg(test)]
mod tests {
    use super::super::testing::scratch;
    use super::*;

    #[test]
    fn a_directory_handle_never_opened_or_released_names_nothing() {
        let s = scratch();
        let t = &s.tree;
        let handle = t.opendir(t.root()).unwrap();
        t.releasedir(handle);
        for bad in [0, handle, handle + 1] {
            assert_eq!(t.listing(bad).unwrap_err(), Errno::BADF);
            assert_eq!(t.rewind(bad, t.root()).unwrap_err(), Errno::BADF);
            let emitted = t.readdirplus(bad, t.root(), 0, |_, _, _, _| false);
            assert_eq!(emitted.unwrap_err(), Errno::BADF);
        }
        t.releasedir(handle);
    }

    #[test]
    fn a_read_from_past_the_last_entry_emits_nothing() {
        let s = scratch();
        let t = &s.tree;
        for name in ["a", "b"] {
            std::fs::write(s.host.join(name), name).unwrap();
        }
        let handle = t.opendir(t.root()).unwrap();
        let mut seen = Vec::new();
        t.readdirplus(handle, t.root(), 0, |_, next, name, _| {
            seen.push((next, name.to_vec()));
            false
        })
        .unwrap();
        seen.sort();
        assert_eq!(seen.len(), 2);
        // Offsets 1 and 2 are `.` and `..`: entries start at 3.
        assert_eq!(
            seen.iter().map(|(next, _)| *next).collect::<Vec<_>>(),
            vec![3, 4]
        );
        for from in [2, 3, usize::MAX] {
            let mut more = 0;
            t.readdirplus(handle, t.root(), from, |_, _, _, _| {
                more += 1;
                false
            })
            .unwrap();
            assert_eq!(more, 0, "from {from}");
        }
        t.releasedir(handle);
    }
}
