//! The tree's side of the inode table: the node an inode number the
//! kernel holds stands for, recorded when a lookup or a creation finds
//! it and forgotten when the kernel forgets it.
//!
//! Owns `lookup` and `forget` and the recording of what a lookup found
//! (the table itself is [`crate::nodes`]). A number the kernel sends that
//! names no node is `ESTALE`; a removed directory has no entries
//! (`ENOENT`). Trusts nothing in a number or name the sandbox sends.

use lazaret_routing::classify::DirState;
use rustix::fs::Stat;
use rustix::io::Errno;

use super::routing::{Found, Plan};
use super::{Result, Tree, kind_of};
use crate::nodes::{Kind, Node};

impl Tree {
    pub(super) fn node(&self, ino: u64) -> Result<Node> {
        self.nodes
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(ino)
            .cloned()
            .ok_or(Errno::STALE)
    }

    /// The node of a directory and its state. A removed directory's
    /// path may name another object now: it has no entries (`ENOENT` to
    /// any lookup or creation in it, as for a removed directory on disk).
    pub(super) fn dir_node(&self, ino: u64) -> Result<(Node, DirState)> {
        let node = self.node(ino)?;
        let state = node.state.clone().ok_or(Errno::NOTDIR)?;
        if node.removed {
            return Err(Errno::NOENT);
        }
        Ok((node, state))
    }

    pub(super) fn register(&self, found: &Found) -> u64 {
        self.nodes
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .lookup(found.node())
    }

    /// Registers a newly made entry and returns its number and attributes.
    pub(super) fn made(&self, plan: Plan, stat: Stat) -> (u64, Stat) {
        let kind = kind_of(&stat);
        let found = Found {
            path: plan.path,
            route: plan.route,
            stat,
            kind,
            state: (kind == Kind::Dir).then_some(plan.state),
            protection: plan.protection,
        };
        (self.register(&found), stat)
    }

    /// `lookup`: the entry `name` of directory `parent`.
    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<(u64, Stat)> {
        let _names = self.read_names();
        let (node, state) = self.dir_node(parent)?;
        let found = self.find(&node.path, &state, name)?.ok_or(Errno::NOENT)?;
        Ok((self.register(&found), found.stat))
    }

    /// `forget`: the kernel drops `count` lookups of `ino`.
    pub fn forget(&self, ino: u64, count: u64) {
        self.nodes
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .forget(ino, count);
    }

    /// The state of the directory node at `path`, if the kernel holds it.
    pub(super) fn state_of(&self, path: &[u8]) -> Option<DirState> {
        self.nodes
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .at(path)
            .and_then(|node| node.state.clone())
    }
}
