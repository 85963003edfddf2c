//! The check a least-privilege role makes of itself before it acts: its
//! capability sets are exactly what its launcher was to leave it.
//!
//! Owns reading the sets from `/proc/self/status` and comparing them. Trusts
//! the kernel's report of this process and nothing else; a role whose
//! launcher left it more, or less, refuses to go on.

use rustix::thread::CapabilitySet;

/// Why a role refuses to act with the capabilities it has.
#[derive(Debug, thiserror::Error)]
pub enum PrivilegeError {
    /// The kernel's report of this process could not be read.
    #[error("cannot read /proc/self/status")]
    Status(#[source] std::io::Error),
    /// A capability set is not what the role's launcher was to leave it.
    #[error(
        "its {set} capability set is {}, not {}: {role}",
        found.map_or_else(|| "unreadable".to_owned(), |f| format!("{f:?}")),
        format!("{wanted:?}")
    )]
    Differs {
        /// Which set (`effective`, `permitted`, `bounding`, `inheritable`,
        /// `ambient`).
        set: &'static str,
        /// What the kernel reports; `None` when it is unreadable.
        found: Option<CapabilitySet>,
        /// What it must be.
        wanted: CapabilitySet,
        /// How the role must be started.
        role: String,
    },
}

/// Refuses unless the effective, permitted and bounding sets are exactly
/// `kept` and the inheritable and ambient sets are empty. The error says
/// which set differs and what `role` must be started with.
pub fn require_exactly(kept: CapabilitySet, role: &str) -> Result<(), PrivilegeError> {
    let status = std::fs::read_to_string("/proc/self/status").map_err(PrivilegeError::Status)?;
    let set = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
    };
    let kept = kept.bits();
    let sets = [
        ("effective", set("CapEff:"), kept),
        ("permitted", set("CapPrm:"), kept),
        ("bounding", set("CapBnd:"), kept),
        ("inheritable", set("CapInh:"), 0),
        ("ambient", set("CapAmb:"), 0),
    ];
    for (name, found, wanted) in sets {
        if found != Some(wanted) {
            return Err(PrivilegeError::Differs {
                set: name,
                found: found.map(CapabilitySet::from_bits_retain),
                wanted: CapabilitySet::from_bits_retain(wanted),
                role: role.to_owned(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_with_other_capabilities_is_refused() {
        // The test runs with whatever it runs with; asking for a set it
        // cannot exactly have (one capability alone, if it has all or none)
        // must fail and name the set.
        let error = require_exactly(CapabilitySet::NET_ADMIN, "started by a test")
            .unwrap_err()
            .to_string();
        assert!(error.contains("capability set"), "{error}");
        assert!(error.ends_with("started by a test"), "{error}");
    }
}
