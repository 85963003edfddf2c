//! The router's inode table: which workspace path, on which side, each
//! inode number the kernel holds stands for.
//!
//! Owns inode numbers and their lookup counts. A number is handed out once
//! per (path, side, type) and forgotten when the kernel forgets it, so a
//! name that changes side or type gets a new number and the kernel never
//! mistakes one object for another. Renames move whole subtrees. Trusts
//! its callers (the tree layer) to pass plain relative paths.

use std::collections::HashMap;

use lazaret_routing::classify::{DirState, Protection, Route};

/// The root's inode number, fixed by FUSE.
pub const ROOT: u64 = 1;

/// What kind of object a node is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A directory.
    Dir,
    /// A regular file.
    File,
    /// A symbolic link.
    Symlink,
    /// A FIFO or socket.
    Special,
}

/// One inode the kernel knows.
#[derive(Clone, Debug)]
pub struct Node {
    /// The workspace-relative path.
    pub path: Vec<u8>,
    /// Which side holds it.
    pub route: Route,
    /// Its kind.
    pub kind: Kind,
    /// For a directory, what it passes to its entries.
    pub state: Option<DirState>,
    /// What the sandbox may do to it.
    pub protection: Protection,
    /// It was removed or replaced: its path names something else now, or
    /// nothing.
    pub removed: bool,
    /// How many lookups the kernel holds.
    lookups: u64,
}

impl Node {
    /// A node with no lookups yet.
    pub fn new(
        path: Vec<u8>,
        route: Route,
        kind: Kind,
        state: Option<DirState>,
        protection: Protection,
    ) -> Self {
        Node {
            path,
            route,
            kind,
            state,
            protection,
            removed: false,
            lookups: 0,
        }
    }
}

/// The table.
#[derive(Debug)]
pub struct Nodes {
    by_ino: HashMap<u64, Node>,
    by_path: HashMap<Vec<u8>, u64>,
    next: u64,
}

impl Nodes {
    /// A table holding only the root.
    pub fn new(root: Node) -> Self {
        let mut by_ino = HashMap::new();
        by_ino.insert(ROOT, root);
        let mut by_path = HashMap::new();
        by_path.insert(Vec::new(), ROOT);
        Nodes {
            by_ino,
            by_path,
            next: ROOT + 1,
        }
    }

    /// The node of an inode number.
    pub fn get(&self, ino: u64) -> Option<&Node> {
        self.by_ino.get(&ino)
    }

    /// Records one more lookup of `node`, reusing its number when the same
    /// path is known on the same side with the same kind; returns the
    /// number.
    pub fn lookup(&mut self, node: Node) -> u64 {
        if let Some(&ino) = self.by_path.get(&node.path) {
            if let Some(known) = self.by_ino.get_mut(&ino) {
                if known.route == node.route && known.kind == node.kind {
                    known.lookups += 1;
                    known.state = node.state;
                    known.protection = node.protection;
                    return ino;
                }
            }
            // Another object now has this path: the old number stays for
            // the kernel's remaining lookups but no longer names the path.
            self.by_path.remove(&node.path);
        }
        let ino = self.next;
        self.next += 1;
        self.by_path.insert(node.path.clone(), ino);
        self.by_ino.insert(ino, Node { lookups: 1, ..node });
        ino
    }

    /// The kernel forgets `count` lookups of `ino`.
    pub fn forget(&mut self, ino: u64, count: u64) {
        if ino == ROOT {
            return;
        }
        let Some(node) = self.by_ino.get_mut(&ino) else {
            return;
        };
        node.lookups = node.lookups.saturating_sub(count);
        if node.lookups == 0 {
            let node = self.by_ino.remove(&ino).expect("present above");
            if self.by_path.get(&node.path) == Some(&ino) {
                self.by_path.remove(&node.path);
            }
        }
    }

    /// The path `from` (and everything below it) is now `to`.
    pub fn rename(&mut self, from: &[u8], to: &[u8]) {
        // Whatever was at `to` is replaced.
        self.unlink(to);
        let moved: Vec<(Vec<u8>, u64)> = self
            .by_path
            .iter()
            .filter(|(path, _)| is_within(path, from))
            .map(|(path, ino)| (path.clone(), *ino))
            .collect();
        for (old, ino) in moved {
            self.by_path.remove(&old);
            let new = [to, &old[from.len()..]].concat();
            if let Some(node) = self.by_ino.get_mut(&ino) {
                node.path = new.clone();
            }
            self.by_path.insert(new, ino);
        }
    }

    /// The node now at `path`, if the kernel holds one.
    pub fn at(&self, path: &[u8]) -> Option<&Node> {
        self.by_path.get(path).and_then(|ino| self.by_ino.get(ino))
    }

    /// The paths strictly below `path` the kernel holds, parents first.
    pub fn below(&self, path: &[u8]) -> Vec<Vec<u8>> {
        let mut out: Vec<Vec<u8>> = self
            .by_path
            .keys()
            .filter(|p| p.as_slice() != path && is_within(p, path))
            .cloned()
            .collect();
        out.sort_by_key(|p| p.iter().filter(|b| **b == b'/').count());
        out
    }

    /// Changes the node now at `path`, if the kernel holds one.
    pub fn update(&mut self, path: &[u8], change: impl FnOnce(&mut Node)) {
        if let Some(node) = self
            .by_path
            .get(path)
            .and_then(|ino| self.by_ino.get_mut(ino))
        {
            change(node);
        }
    }

    /// The path no longer names the object it named (it was removed).
    pub fn unlink(&mut self, path: &[u8]) {
        if let Some(ino) = self.by_path.remove(path) {
            if let Some(node) = self.by_ino.get_mut(&ino) {
                node.removed = true;
            }
        }
    }

    /// Whether the table holds only the root.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.by_ino.len() <= 1
    }
}

/// Whether `path` is `prefix` or below it.
fn is_within(path: &[u8], prefix: &[u8]) -> bool {
    path == prefix || (path.starts_with(prefix) && path.get(prefix.len()) == Some(&b'/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(path: &str, route: Route, kind: Kind) -> Node {
        Node::new(
            path.as_bytes().to_vec(),
            route,
            kind,
            None,
            Protection::None,
        )
    }

    #[test]
    fn numbers_are_reused_only_for_the_same_object() {
        let mut nodes = Nodes::new(node("", Route::Host, Kind::Dir));
        let a = nodes.lookup(node("a", Route::Host, Kind::File));
        assert_eq!(nodes.lookup(node("a", Route::Host, Kind::File)), a);
        let b = nodes.lookup(node("a", Route::Isolated, Kind::Dir));
        assert_ne!(a, b);
        // The old number lives until the kernel forgets it.
        assert_eq!(nodes.get(a).unwrap().path, b"a");
        nodes.forget(a, 2);
        assert!(nodes.get(a).is_none());
        assert_eq!(nodes.get(b).unwrap().route, Route::Isolated);
        nodes.forget(b, 1);
        assert!(nodes.is_empty());
    }

    #[test]
    fn a_rename_moves_the_subtree() {
        let mut nodes = Nodes::new(node("", Route::Host, Kind::Dir));
        let d = nodes.lookup(node("d", Route::Host, Kind::Dir));
        let f = nodes.lookup(node("d/f", Route::Host, Kind::File));
        let other = nodes.lookup(node("dd", Route::Host, Kind::File));
        nodes.rename(b"d", b"e/x");
        assert_eq!(nodes.get(d).unwrap().path, b"e/x");
        assert_eq!(nodes.get(f).unwrap().path, b"e/x/f");
        assert_eq!(nodes.get(other).unwrap().path, b"dd");
        assert_eq!(nodes.lookup(node("e/x/f", Route::Host, Kind::File)), f);
    }
}
