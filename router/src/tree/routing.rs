//! The routing decisions: which side holds the entry a name of a merged
//! directory shows, and where a new entry of that name goes.
//!
//! Owns finding a visible entry by name (the host's entry when the
//! [`Classifier`] routes it to the host, else the isolated side's when it
//! routes it there, else nothing), planning a new entry (refusing a
//! protected position, and a name that is empty, `.`, `..` or holds a
//! `/`), and refusing links and special files in git metadata. The
//! [`Classifier`] decides from the rules and from what the host holds
//! around the name; the kernel's answer for the chosen side is the only
//! other input. Trusts the rules the supervisor gave; every name here is
//! the sandbox's.
//!
//! [`Classifier`]: lazaret_routing::classify::Classifier

use std::collections::HashSet;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use lazaret_routing::classify::{
    DirState, HEAD_NAME, HostFacts, Protection, Route, join, needs_head,
};
use rustix::fs::{OFlags, Stat};
use rustix::io::Errno;

use super::sides::{Listed, Sides};
use super::{PROTECTED, Result, Tree, kind_of};
use crate::nodes::{Kind, Node};

impl Tree {
    /// What the host has around `name` in `host_dir`.
    fn facts(host_dir: Option<BorrowedFd<'_>>, name: &[u8], exists: bool) -> Result<HostFacts> {
        let dir_holds_head = match host_dir {
            Some(dir) if needs_head(name) => Self::exists_at(dir, HEAD_NAME)?.is_some(),
            _ => false,
        };
        Ok(HostFacts {
            exists,
            dir_holds_head,
        })
    }

    /// The visible entry `name` of the directory at `dir_path`.
    pub(super) fn find(
        &self,
        dir_path: &[u8],
        dir: &DirState,
        name: &[u8],
    ) -> Result<Option<Found>> {
        super::path::one_component(name)?;
        let mut sides = Sides::new(self, dir_path, dir)?;
        self.find_in(&mut sides, dir_path, dir, name)
    }

    /// [`find`](Self::find) in a directory whose sides are open.
    pub(super) fn find_in(
        &self,
        sides: &mut Sides,
        dir_path: &[u8],
        dir: &DirState,
        name: &[u8],
    ) -> Result<Option<Found>> {
        let path = join(dir_path, name);
        let host_stat = match &sides.host {
            Some(fd) => Self::exists_at(fd.as_fd(), name)?,
            None => None,
        };
        let facts = Self::facts(
            sides.host.as_ref().map(AsFd::as_fd),
            name,
            host_stat.is_some(),
        )?;
        if let Some(stat) = host_stat {
            let kind = kind_of(&stat);
            let (route, state, protection) =
                self.classifier
                    .entry(dir, dir_path, name, kind == Kind::Dir, facts);
            if route == Route::Host {
                return Ok(Some(Found {
                    path,
                    route,
                    stat,
                    kind,
                    state: (kind == Kind::Dir).then_some(state),
                    protection,
                }));
            }
        }
        let Some(isolated_dir) = sides.isolated(self, dir_path)? else {
            return Ok(None);
        };
        let Some(stat) = Self::exists_at(isolated_dir, name)? else {
            return Ok(None);
        };
        let kind = kind_of(&stat);
        let (route, state) = self
            .classifier
            .child(dir, dir_path, name, kind == Kind::Dir, facts);
        if route != Route::Isolated {
            // Kept from an earlier generation whose rules isolated it.
            return Ok(None);
        }
        Ok(Some(Found {
            path,
            route,
            stat,
            kind,
            state: (kind == Kind::Dir).then_some(state),
            protection: Protection::None,
        }))
    }

    /// Where a new entry `name` of the directory `parent` goes; refuses a
    /// protected position.
    pub(super) fn plan(
        &self,
        parent: &Node,
        dir: &DirState,
        name: &[u8],
        is_dir: bool,
    ) -> Result<Plan> {
        super::path::one_component(name)?;
        if dir.is_read_only() {
            return Err(PROTECTED);
        }
        let host_dir = if dir.is_isolated() {
            None
        } else {
            Some(self.open_dir(Route::Host, &parent.path, OFlags::PATH)?)
        };
        let exists = match &host_dir {
            Some(fd) => Self::exists_at(fd.as_fd(), name)?.is_some(),
            None => false,
        };
        let facts = Self::facts(host_dir.as_ref().map(AsFd::as_fd), name, exists)?;
        let (route, state, protection) =
            self.classifier
                .entry(dir, &parent.path, name, is_dir, facts);
        if protection.is_pinned() {
            return Err(PROTECTED);
        }
        Ok(Plan {
            path: join(&parent.path, name),
            route,
            state,
            protection,
            host_dir,
        })
    }

    /// The directory to create an entry of `route` in.
    pub(super) fn target_dir(&self, plan: &mut Plan, path: &[u8]) -> Result<OwnedFd> {
        match plan.route {
            Route::Host => match plan.host_dir.take() {
                Some(dir) => Ok(dir),
                None => self.open_dir(Route::Host, path, OFlags::PATH),
            },
            Route::Isolated => self.isolated_dir(path),
        }
    }
}

/// A visible entry found by name.
#[derive(Debug)]
pub(super) struct Found {
    pub(super) path: Vec<u8>,
    pub(super) route: Route,
    pub(super) stat: Stat,
    pub(super) kind: Kind,
    pub(super) state: Option<DirState>,
    pub(super) protection: Protection,
}

impl Found {
    pub(super) fn node(&self) -> Node {
        Node::new(
            self.path.clone(),
            self.route,
            self.kind,
            self.state.clone(),
            self.protection,
        )
    }
}

/// Where a new entry goes.
#[derive(Debug)]
pub(super) struct Plan {
    pub(super) path: Vec<u8>,
    pub(super) route: Route,
    pub(super) state: DirState,
    pub(super) protection: Protection,
    /// The host side's parent directory, as opened to plan.
    pub(super) host_dir: Option<OwnedFd>,
}

/// Refuses a link, FIFO or socket in git metadata: git makes none there,
/// and host git would follow a link wherever the sandbox pointed it
/// (appending a reflog to a file outside the workspace, taking another
/// directory for a submodule's).
pub(super) fn refuse_special_in_git(dir: &DirState, kind: Kind) -> Result<()> {
    if dir.is_git_metadata() && matches!(kind, Kind::Symlink | Kind::Special) {
        return Err(Errno::PERM);
    }
    Ok(())
}

/// What a host directory's listing says about the names in it.
pub(super) struct HostListing<'a> {
    names: HashSet<&'a [u8]>,
    holds_head: bool,
}

impl<'a> HostListing<'a> {
    pub(super) fn new(listed: &'a [Listed]) -> Self {
        HostListing {
            names: listed.iter().map(|(n, _, _)| n.as_slice()).collect(),
            holds_head: listed.iter().any(|(n, _, _)| n == HEAD_NAME),
        }
    }

    pub(super) fn facts(&self, name: &[u8]) -> HostFacts {
        HostFacts {
            exists: self.names.contains(name),
            dir_holds_head: self.holds_head && needs_head(name),
        }
    }
}

#[cfg(test)]
mod tests {
    use rustix::fs::OFlags;

    use super::super::testing::{names, scratch};
    use super::*;

    #[test]
    fn a_new_entry_refuses_a_name_that_is_not_one_component() {
        let s = scratch();
        let t = &s.tree;
        let (dir, _) = t.mkdir(t.root(), b"d", 0o755, 0).unwrap();
        std::fs::write(s.host.join("d/f"), "host").unwrap();
        let wr = OFlags::WRONLY.bits() as i32;
        for bad in [&b""[..], b".", b"..", b"d/g", b"../escape", b"/abs", b"d/"] {
            assert_eq!(t.mkdir(t.root(), bad, 0o755, 0).unwrap_err(), Errno::INVAL);
            assert_eq!(
                t.create(t.root(), bad, 0o644, 0, wr).unwrap_err(),
                Errno::INVAL
            );
            assert_eq!(t.symlink(dir, bad, b"x").unwrap_err(), Errno::INVAL);
            assert_eq!(t.mknod(dir, bad, 0o100644, 0).unwrap_err(), Errno::INVAL);
            assert_eq!(
                t.rename(dir, b"f", t.root(), bad, rustix::fs::RenameFlags::empty())
                    .unwrap_err(),
                Errno::INVAL
            );
        }
        // Nothing was made or moved on either side.
        assert_eq!(names(&s.host), vec![b"d".to_vec()]);
        assert_eq!(names(&s.host.join("d")), vec![b"f".to_vec()]);
        assert!(names(&s.isolated).is_empty());
    }

    #[test]
    fn a_name_that_is_not_one_component_is_never_resolved() {
        let s = scratch();
        let t = &s.tree;
        std::fs::create_dir(s.host.join("d")).unwrap();
        std::fs::write(s.host.join("d/f"), "host").unwrap();
        for bad in [&b""[..], b".", b"..", b"d/f", b"../escape", b"/abs", b"d/"] {
            assert_eq!(t.lookup(t.root(), bad).unwrap_err(), Errno::INVAL);
            assert_eq!(t.remove(t.root(), bad, false).unwrap_err(), Errno::INVAL);
            assert_eq!(t.remove(t.root(), bad, true).unwrap_err(), Errno::INVAL);
            assert_eq!(
                t.rename(
                    t.root(),
                    bad,
                    t.root(),
                    b"g",
                    rustix::fs::RenameFlags::empty()
                )
                .unwrap_err(),
                Errno::INVAL
            );
        }
        // Nothing moved or went; the file is still reached by its own name.
        assert_eq!(names(&s.host.join("d")), vec![b"f".to_vec()]);
        let (d, _) = t.lookup(t.root(), b"d").unwrap();
        assert!(t.lookup(d, b"f").is_ok());
    }

    #[test]
    fn a_name_with_a_nul_byte_finds_and_makes_nothing() {
        let s = scratch();
        let t = &s.tree;
        std::fs::write(s.host.join("a"), "host").unwrap();
        assert_eq!(t.lookup(t.root(), b"a\0b").unwrap_err(), Errno::INVAL);
        assert_eq!(
            t.mkdir(t.root(), b"a\0b", 0o755, 0).unwrap_err(),
            Errno::INVAL
        );
        assert_eq!(t.remove(t.root(), b"a\0", false).unwrap_err(), Errno::INVAL);
        assert_eq!(names(&s.host), vec![b"a".to_vec()]);
    }

    #[test]
    fn an_overlong_name_is_refused_by_the_kernel_and_makes_nothing() {
        let s = scratch();
        let t = &s.tree;
        let long = vec![b'x'; 256];
        let longest = vec![b'y'; 255];
        assert_eq!(t.lookup(t.root(), &long).unwrap_err(), Errno::NAMETOOLONG);
        assert_eq!(
            t.mkdir(t.root(), &long, 0o755, 0).unwrap_err(),
            Errno::NAMETOOLONG
        );
        assert!(names(&s.host).is_empty());
        // The longest name a directory entry holds works.
        let (ino, _) = t.mkdir(t.root(), &longest, 0o755, 0).unwrap();
        assert_eq!(t.lookup(t.root(), &longest).unwrap().0, ino);
        assert_eq!(names(&s.host), vec![longest]);
    }

    #[test]
    fn a_name_that_is_not_utf8_keeps_its_bytes() {
        let s = scratch();
        let t = &s.tree;
        let name = b"caf\xe9-\xff\xfe";
        let (ino, _) = t.mkdir(t.root(), name, 0o755, 0).unwrap();
        assert_eq!(names(&s.host), vec![name.to_vec()]);
        assert_eq!(t.lookup(t.root(), name).unwrap().0, ino);
        let handle = t.opendir(t.root()).unwrap();
        let listed: Vec<Vec<u8>> = t
            .listing(handle)
            .unwrap()
            .entries
            .iter()
            .map(|e| e.name.clone())
            .collect();
        assert_eq!(listed, vec![name.to_vec()]);
        t.releasedir(handle);
        t.remove(t.root(), name, true).unwrap();
        assert!(names(&s.host).is_empty());
    }

    #[test]
    fn an_inode_number_never_given_out_is_stale() {
        let s = scratch();
        let t = &s.tree;
        for bad in [0, 2, u64::MAX] {
            assert_eq!(t.lookup(bad, b"x").unwrap_err(), Errno::STALE);
            assert_eq!(t.getattr(bad, None).unwrap_err(), Errno::STALE);
            assert_eq!(t.opendir(bad).unwrap_err(), Errno::STALE);
            assert_eq!(t.open(bad, 0).unwrap_err(), Errno::STALE);
            assert_eq!(t.mkdir(bad, b"x", 0o755, 0).unwrap_err(), Errno::STALE);
        }
        assert!(names(&s.host).is_empty());
    }
}
