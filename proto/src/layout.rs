//! `SandboxLayoutV1`: the sandbox destinations that Lazaret itself mounts and
//! that no configured persistent dir or volume may touch.
//!
//! This module owns the one production choice of those destinations. The
//! layout has no unchecked constructor and cannot be built without
//! `/workspace`; configuration resolution requires one. It is a runtime value:
//! it implements neither `Serialize` nor `Deserialize`.

use crate::config::SandboxPath;

/// Where the project is mounted in the sandbox.
pub const WORKSPACE: &str = "/workspace";

/// The product control area: the escalation client, the session's mailbox and
/// its credential live beneath it.
pub const CONTROL_AREA: &str = "/run/lazaret";

/// The capabilities of sandbox processes: what a package manager needs as
/// root (owners, modes, setuid programs' bits, switching users, signals, low
/// ports), and nothing else: not the network configuration or raw sockets,
/// not device nodes (`CAP_MKNOD`; the sandbox's `/dev` is gVisor's own),
/// file capabilities (`CAP_SETFCAP`, `CAP_SETPCAP`), `chroot` or the audit
/// log.
pub const SANDBOX_CAPABILITIES: [&str; 8] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_NET_BIND_SERVICE",
];

/// The kernel and device filesystems the runtime mounts.
const RUNTIME_MOUNTS: [&str; 3] = ["/proc", "/sys", "/dev"];

/// The closed set of product-owned sandbox mount destinations.
#[derive(Debug)]
pub struct SandboxLayoutV1 {
    protected: Vec<SandboxPath>,
}

impl SandboxLayoutV1 {
    /// The production layout: `/workspace`, the control area and the runtime
    /// mounts.
    pub fn production() -> Self {
        let protected = [WORKSPACE, CONTROL_AREA]
            .into_iter()
            .chain(RUNTIME_MOUNTS)
            .map(|p| SandboxPath::parse(p).expect("layout destinations are valid sandbox paths"))
            .collect();
        Self { protected }
    }

    /// The protected destinations, nonempty and free of duplicates.
    pub fn protected_destinations(&self) -> &[SandboxPath] {
        &self.protected
    }

    /// The first protected destination that `path` equals, lies beneath, or
    /// lies above.
    pub fn conflict(&self, path: &SandboxPath) -> Option<&SandboxPath> {
        self.protected.iter().find(|p| p.overlaps(path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn production_layout_protects_workspace_and_control_area() {
        let layout = SandboxLayoutV1::production();
        let names: Vec<_> = layout
            .protected_destinations()
            .iter()
            .map(|p| p.as_str())
            .collect();
        assert!(names.contains(&WORKSPACE));
        assert!(names.contains(&CONTROL_AREA));
        let mut dedup = names.clone();
        dedup.sort_unstable();
        dedup.dedup();
        assert_eq!(dedup.len(), names.len());
        let p = |s| SandboxPath::parse(s).unwrap();
        assert_eq!(
            layout.conflict(&p("/workspace/x")).map(|p| p.as_str()),
            Some(WORKSPACE)
        );
        assert_eq!(
            layout.conflict(&p("/run")).map(|p| p.as_str()),
            Some(CONTROL_AREA)
        );
        assert!(layout.conflict(&p("/root")).is_none());
        assert!(layout.conflict(&p("/workspaces")).is_none());
    }
}
