//! Removal: `unlink` and `rmdir`.
//!
//! Owns removing the visible entry of a name: never a protected one
//! (`EROFS`), never a host directory whose isolated side still shows an
//! entry (`ENOTEMPTY`), and the isolated shadow of a removed host
//! directory with it when it holds nothing. The inode table marks the
//! removed path's nodes. Trusts nothing in a request.

use lazaret_routing::classify::Route;
use rustix::fs::{AtFlags, OFlags};
use rustix::io::Errno;

use super::path::os;
use super::{PROTECTED, Result, Tree};
use crate::nodes::Kind;

impl Tree {
    /// `unlink` and `rmdir`.
    pub fn remove(&self, parent: u64, name: &[u8], dir: bool) -> Result<()> {
        let _names = self.lock_names();
        let (node, state) = self.dir_node(parent)?;
        let found = self.find(&node.path, &state, name)?.ok_or(Errno::NOENT)?;
        match (dir, found.kind == Kind::Dir) {
            (false, true) => return Err(Errno::ISDIR),
            (true, false) => return Err(Errno::NOTDIR),
            _ => {}
        }
        if found.protection.is_pinned() {
            return Err(PROTECTED);
        }
        if let (true, Route::Host, Some(state)) = (dir, found.route, &found.state) {
            if !self.isolated_entries(&found.path, state, None)?.is_empty() {
                return Err(Errno::NOTEMPTY);
            }
        }
        let parent_dir = self.open_dir(found.route, &node.path, OFlags::PATH)?;
        let flags = if dir {
            AtFlags::REMOVEDIR
        } else {
            AtFlags::empty()
        };
        rustix::fs::unlinkat(&parent_dir, os(name), flags)?;
        if dir && found.route == Route::Host {
            // The isolated side's directory of the same path holds nothing
            // visible; remove it if it holds nothing at all.
            if let Ok(shadow) = self.open_dir(Route::Isolated, &node.path, OFlags::PATH) {
                let _ = rustix::fs::unlinkat(&shadow, os(name), AtFlags::REMOVEDIR);
            }
        }
        self.nodes
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .unlink(&found.path);
        Ok(())
    }
}
