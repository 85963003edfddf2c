//! Renames, within a side and across the two.
//!
//! Owns `rename`: refusing an exchange or whiteout, a protected source or
//! target, a host directory holding a git directory of the host, and any
//! directory move that would change which side an entry beneath it is on
//! (`EXDEV`, so `mv` copies instead); moving a file across the sides as a
//! copy renamed into place; carrying a host directory's isolated side
//! along; and updating the inode table after. Trusts nothing in a
//! request.

use std::os::fd::{AsFd, OwnedFd};

use lazaret_routing::classify::{Protection, Route};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags, Timestamps};
use rustix::io::Errno;

use super::path::{join_rel, os, split};
use super::routing::{Found, HostListing, Plan, refuse_special_in_git};
use super::sides::{io_errno, list};
use super::{MODE_MASK, PROTECTED, RECLASSIFY_LIMIT, Result, Tree};
use crate::nodes::Kind;

impl Tree {
    /// `rename`. `RENAME_EXCHANGE` is refused: each side of an exchange
    /// would need both checks in both directions.
    pub fn rename(
        &self,
        parent: u64,
        name: &[u8],
        new_parent: u64,
        new_name: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        if flags.intersects(RenameFlags::EXCHANGE | RenameFlags::WHITEOUT) {
            return Err(Errno::INVAL);
        }
        let _names = self.lock_names();
        let (from_dir, from_state) = self.dir_node(parent)?;
        let (to_dir, to_state) = self.dir_node(new_parent)?;
        let source = self
            .find(&from_dir.path, &from_state, name)?
            .ok_or(Errno::NOENT)?;
        let is_dir = source.kind == Kind::Dir;
        if source.protection.is_pinned() || (is_dir && source.protection == Protection::Unmovable) {
            return Err(PROTECTED);
        }
        refuse_special_in_git(&to_state, source.kind)?;
        let mut plan = self.plan(&to_dir, &to_state, new_name, is_dir)?;
        if is_dir && plan.protection == Protection::Unmovable {
            return Err(PROTECTED);
        }
        if source.path == plan.path {
            return Ok(());
        }
        // A visible entry already at the target on the other side cannot
        // be replaced from this one.
        if let Some(existing) = self.find(&to_dir.path, &to_state, new_name)? {
            if existing.protection.is_pinned() {
                return Err(PROTECTED);
            }
            if existing.route != plan.route {
                return Err(Errno::XDEV);
            }
        }
        if is_dir && source.route == Route::Host {
            self.check_move(&source, &plan)?;
        }
        let from = self.open_dir(source.route, &from_dir.path, OFlags::PATH)?;
        let to = self.target_dir(&mut plan, &to_dir.path)?;
        if source.route != plan.route {
            if is_dir {
                return Err(Errno::XDEV);
            }
            move_across(&from, name, &to, new_name, source.kind, flags)?;
        } else if is_dir && source.route == Route::Host {
            let isolated = self.move_isolated_dir(&source.path, &plan.path)?;
            if let Err(e) = rustix::fs::renameat_with(&from, os(name), &to, os(new_name), flags) {
                if isolated {
                    let _ = self.move_isolated_dir(&plan.path, &source.path);
                }
                return Err(e);
            }
        } else {
            rustix::fs::renameat_with(&from, os(name), &to, os(new_name), flags)?;
        }
        self.moved(&source.path, &plan);
        Ok(())
    }

    /// Whether the host directory `source` may move to `plan`. Not when
    /// it holds a git directory of the host at any depth (a submodule's
    /// `.git` file, a nested repository's `.git`), which would no longer
    /// work where it went (`EROFS`: a directory cannot be moved whole to
    /// a place its `.git` file does not name). Not, either, when an entry
    /// beneath it would be seen on another side at its new place (a host
    /// file its rules hide would show, an isolated one vanish: the rules
    /// are the paths'), nor to the other side (`EXDEV`: `mv` then copies
    /// what the sandbox sees instead, which leaves a `.git` in place). Both
    /// classifications are walked together over what both sides hold;
    /// more than [`RECLASSIFY_LIMIT`] entries count as a change.
    fn check_move(&self, source: &Found, plan: &Plan) -> Result<()> {
        let Some(old) = source.state.clone() else {
            return Ok(());
        };
        let mut reclassified = source.route != plan.route;
        let mut pending = vec![(Vec::new(), old, plan.state.clone())];
        let mut seen = 0usize;
        while let Some((rel, old, new)) = pending.pop() {
            let old_path = join_rel(&source.path, &rel);
            let new_path = join_rel(&plan.path, &rel);
            let host = match self.open_dir(Route::Host, &old_path, OFlags::RDONLY) {
                Ok(fd) => list(fd.as_fd())?,
                Err(Errno::NOENT | Errno::NOTDIR) => Vec::new(),
                Err(e) => return Err(e),
            };
            let isolated = match self.isolated_dir_if_any(&old_path, OFlags::RDONLY)? {
                Some(fd) => list(fd.as_fd())?,
                None => Vec::new(),
            };
            let host_listing = HostListing::new(&host);
            let entries = host
                .iter()
                .map(|e| (e, Route::Host))
                .chain(isolated.iter().map(|e| (e, Route::Isolated)));
            for ((name, kind, _), side) in entries {
                seen += 1;
                if seen > RECLASSIFY_LIMIT {
                    return Err(Errno::XDEV);
                }
                let is_dir = *kind == Kind::Dir;
                let facts = host_listing.facts(name);
                let (before, old_child) =
                    self.classifier.child(&old, &old_path, name, is_dir, facts);
                // The host made it (the sandbox's `.git` is isolated).
                let git_dir = side == Route::Host
                    && before == Route::Host
                    && old_child.is_git_metadata()
                    && !old.is_git_metadata();
                if git_dir {
                    return Err(PROTECTED);
                }
                let (after, new_child) =
                    self.classifier.child(&new, &new_path, name, is_dir, facts);
                if (before == side) != (after == side) {
                    reclassified = true;
                }
                let inside_git = old_child.is_git_metadata() && new_child.is_git_metadata();
                if is_dir && before == side && !inside_git {
                    pending.push((join_rel(&rel, name), old_child, new_child));
                }
            }
        }
        if reclassified {
            Err(Errno::XDEV)
        } else {
            Ok(())
        }
    }

    /// Moves the isolated side's directory of a host directory being
    /// renamed with it, so its isolated entries stay beneath it; refuses
    /// (`EXDEV`) to merge into one already at the target. Returns whether
    /// there was one to move.
    fn move_isolated_dir(&self, from: &[u8], to: &[u8]) -> Result<bool> {
        let (from_parent, from_name) = split(from);
        let Some(source) = self.isolated_dir_if_any(from_parent, OFlags::PATH)? else {
            return Ok(false);
        };
        if Self::exists_at(source.as_fd(), from_name)?.is_none() {
            return Ok(false);
        }
        let (to_parent, to_name) = split(to);
        let target = self.isolated_dir(to_parent)?;
        match rustix::fs::renameat_with(
            &source,
            os(from_name),
            &target,
            os(to_name),
            RenameFlags::NOREPLACE,
        ) {
            Ok(()) => Ok(true),
            Err(Errno::EXIST | Errno::NOTEMPTY) => Err(Errno::XDEV),
            Err(e) => Err(e),
        }
    }

    /// Updates the inode table after a rename: the moved subtree's paths,
    /// then the route, state and protection of every moved node the
    /// kernel holds, parents first, as a lookup at the new place would
    /// find them.
    fn moved(&self, from: &[u8], plan: &Plan) {
        let moved = {
            let mut nodes = self.nodes.write().unwrap_or_else(|e| e.into_inner());
            nodes.rename(from, &plan.path);
            nodes.update(&plan.path, |node| {
                node.route = plan.route;
                node.protection = plan.protection;
                if node.state.is_some() {
                    node.state = Some(plan.state.clone());
                }
            });
            nodes.below(&plan.path)
        };
        for path in moved {
            let (parent, name) = split(&path);
            let Some(parent_state) = self.state_of(parent) else {
                continue;
            };
            if let Ok(Some(found)) = self.find(parent, &parent_state, name) {
                let mut nodes = self.nodes.write().unwrap_or_else(|e| e.into_inner());
                nodes.update(&path, |node| {
                    node.route = found.route;
                    node.protection = found.protection;
                    node.state = found.state;
                });
            }
        }
    }
}

/// Moves a file, link or special file from one side to the other: a copy
/// under a temporary name, renamed into place, then the source removed.
fn move_across(
    from: &OwnedFd,
    name: &[u8],
    to: &OwnedFd,
    new_name: &[u8],
    kind: Kind,
    flags: RenameFlags,
) -> Result<()> {
    let temp = format!(".lazaret-move-{}", std::process::id()).into_bytes();
    let temp = [temp.as_slice(), b"-", new_name].concat();
    let temp = if temp.len() > 255 {
        temp[..255].to_vec()
    } else {
        temp
    };
    let stat = rustix::fs::statat(from, os(name), AtFlags::SYMLINK_NOFOLLOW)?;
    let mode = Mode::from_raw_mode(stat.st_mode & MODE_MASK);
    match kind {
        Kind::File => {
            let source = rustix::fs::openat(
                from,
                os(name),
                OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            let target = rustix::fs::openat(
                to,
                os(&temp),
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                mode,
            )?;
            let copied = copy(&source, &target);
            if let Err(e) = copied {
                let _ = rustix::fs::unlinkat(to, os(&temp), AtFlags::empty());
                return Err(e);
            }
            let times = Timestamps {
                last_access: stat_time(stat.st_atime, stat.st_atime_nsec),
                last_modification: stat_time(stat.st_mtime, stat.st_mtime_nsec),
            };
            let _ = rustix::fs::futimens(&target, &times);
        }
        Kind::Symlink => {
            let target = rustix::fs::readlinkat(from, os(name), Vec::new())?;
            rustix::fs::symlinkat(target.as_c_str(), to, os(&temp))?;
        }
        Kind::Special => {
            let file_type = FileType::from_raw_mode(stat.st_mode);
            if !matches!(file_type, FileType::Fifo | FileType::Socket) {
                return Err(Errno::XDEV);
            }
            rustix::fs::mknodat(to, os(&temp), file_type, mode, 0)?;
        }
        Kind::Dir => return Err(Errno::XDEV),
    }
    if let Err(e) = rustix::fs::renameat_with(to, os(&temp), to, os(new_name), flags) {
        let _ = rustix::fs::unlinkat(to, os(&temp), AtFlags::empty());
        return Err(e);
    }
    rustix::fs::unlinkat(from, os(name), AtFlags::empty())
}

fn stat_time(sec: i64, nsec: u64) -> rustix::fs::Timespec {
    rustix::fs::Timespec {
        tv_sec: sec,
        tv_nsec: i64::try_from(nsec).unwrap_or(0),
    }
}

/// Copies a whole file between two descriptors, from their current
/// offsets (the kernel copies in place where it can: `copy_file_range`).
fn copy(source: &OwnedFd, target: &OwnedFd) -> Result<()> {
    let mut reader = std::fs::File::from(rustix::io::dup(source)?);
    let mut writer = std::fs::File::from(rustix::io::dup(target)?);
    std::io::copy(&mut reader, &mut writer)
        .map(drop)
        .map_err(io_errno)
}
