//! The owners and groups the router shows: each object's own, or, when the
//! Domain user namespace cannot name it, the namespace's.
//!
//! The kernel turns the owner and group of every attribute a FUSE server
//! answers into ids of the user namespace that mounted the filesystem, the
//! Domain's, which maps the invoking user and their primary group alone.
//! Any other id (a project directory of a shared group, a file under a
//! setgid directory, a file another user made) reaches the router as the
//! overflow id (`nobody`, `nogroup`); answered as it is, the kernel holds
//! the inode's owner or group as unknown and refuses every write to it
//! (`EACCES`, before the router is asked), whatever its mode. The router
//! shows such an id as the namespace's own instead. What the sandbox may
//! then do to the object is still decided by the host's kernel when the
//! router acts as the invoking user: the router's capabilities do not
//! reach an object whose owner or group the namespace cannot map, so only
//! the permissions the user has on the host apply.
//!
//! Owns reading the router's own id maps (`/proc/self/uid_map`,
//! `gid_map`: the namespace the connection belongs to). Trusts the kernel.

use std::io;

/// One line of an id map: `count` ids from `inside` up are mapped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Range {
    inside: u32,
    count: u32,
}

/// The ids one map (`uid_map` or `gid_map`) names, and the id to show for
/// any other.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdMap {
    ranges: Vec<Range>,
    own: u32,
}

/// Why an id map could not be read.
#[derive(Debug, thiserror::Error)]
pub enum IdMapError {
    /// The map file could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The `/proc/self` file.
        path: String,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },
    /// A line is not three numbers.
    #[error("the id map line {line:?} is not three numbers")]
    Line {
        /// The line.
        line: String,
    },
    /// The map leaves out the process's own id.
    #[error("the id map does not map the process's own id {own}")]
    OwnUnmapped {
        /// The process's own id.
        own: u32,
    },
    /// A map file holds no valid map.
    #[error("{path}")]
    Invalid {
        /// The `/proc/self` file.
        path: String,
        /// What is wrong with it.
        #[source]
        source: Box<IdMapError>,
    },
}

impl IdMap {
    /// Parses the text of `/proc/self/uid_map` or `gid_map`; `own` is the
    /// id shown for an id it does not map (the process's own).
    pub fn parse(text: &str, own: u32) -> Result<Self, IdMapError> {
        let mut ranges = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let bad = || IdMapError::Line {
                line: line.to_owned(),
            };
            let fields: Vec<&str> = line.split_whitespace().collect();
            let number = |i: usize| -> Result<u32, IdMapError> {
                fields.get(i).and_then(|f| f.parse().ok()).ok_or_else(bad)
            };
            if fields.len() != 3 {
                return Err(bad());
            }
            ranges.push(Range {
                inside: number(0)?,
                count: number(2)?,
            });
        }
        let map = IdMap { ranges, own };
        if !map.maps(own) {
            return Err(IdMapError::OwnUnmapped { own });
        }
        Ok(map)
    }

    /// Reads `/proc/self/<file>` (`uid_map` or `gid_map`).
    pub fn read(file: &str, own: u32) -> Result<Self, IdMapError> {
        let path = format!("/proc/self/{file}");
        let text = std::fs::read_to_string(&path).map_err(|source| IdMapError::Read {
            path: path.clone(),
            source,
        })?;
        Self::parse(&text, own).map_err(|e| IdMapError::Invalid {
            path,
            source: Box::new(e),
        })
    }

    /// Whether the namespace maps `id`.
    fn maps(&self, id: u32) -> bool {
        self.ranges
            .iter()
            .any(|r| id >= r.inside && u64::from(id) < u64::from(r.inside) + u64::from(r.count))
    }

    /// `id` as the router shows it: itself when the namespace maps it, the
    /// process's own id otherwise.
    pub fn shown(&self, id: u32) -> u32 {
        if self.maps(id) { id } else { self.own }
    }
}

/// The owner and group maps of the router's namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ids {
    /// Owners.
    pub uids: IdMap,
    /// Groups.
    pub gids: IdMap,
}

impl Ids {
    /// The maps of this process's user namespace.
    pub fn of_this_process() -> Result<Self, IdMapError> {
        Ok(Ids {
            uids: IdMap::read("uid_map", rustix::process::getuid().as_raw())?,
            gids: IdMap::read("gid_map", rustix::process::getgid().as_raw())?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_the_namespace_maps_is_shown_as_it_is() {
        let map = IdMap::parse("         0       1000          1\n", 0).unwrap();
        assert_eq!(map.shown(0), 0);
        let wide = IdMap::parse("0 1000 1\n1 100000 65536\n", 0).unwrap();
        assert_eq!(wide.shown(1), 1);
        assert_eq!(wide.shown(65536), 65536);
    }

    #[test]
    fn an_id_the_namespace_cannot_map_is_shown_as_the_process_own() {
        // The kernel shows an unmapped id as the overflow id.
        let map = IdMap::parse("0 1000 1\n", 0).unwrap();
        assert_eq!(map.shown(65534), 0);
        assert_eq!(map.shown(1), 0);
        let wide = IdMap::parse("0 1000 1\n1 100000 10\n", 0).unwrap();
        assert_eq!(wide.shown(11), 0);
        assert_eq!(wide.shown(u32::MAX), 0);
    }

    #[test]
    fn the_initial_namespace_maps_every_id() {
        let map = IdMap::parse("0 0 4294967295\n", 1000).unwrap();
        assert_eq!(map.shown(65534), 65534);
        assert_eq!(map.shown(4_294_967_294), 4_294_967_294);
    }

    #[test]
    fn a_map_that_is_not_an_id_map_is_refused() {
        for text in ["0 1000\n", "a b c\n", "0 1000 1 2\n"] {
            let error = IdMap::parse(text, 0).unwrap_err().to_string();
            assert!(error.contains("not three numbers"), "{text:?}: {error}");
        }
        let error = IdMap::parse("1 1000 1\n", 0).unwrap_err().to_string();
        assert!(error.contains("own id 0"), "{error}");
    }

    #[test]
    fn this_process_maps_its_own_ids() {
        let ids = Ids::of_this_process().unwrap();
        let uid = rustix::process::getuid().as_raw();
        assert_eq!(ids.uids.shown(uid), uid);
    }
}
