//! The check a least-privilege role makes of itself before it acts: its
//! capability sets are exactly what its launcher was to leave it.
//!
//! Owns reading the sets from `/proc/self/status` and comparing them. Trusts
//! the kernel's report of this process and nothing else; a role whose
//! launcher left it more, or less, refuses to go on.

use rustix::thread::CapabilitySet;

/// Refuses unless the effective, permitted and bounding sets are exactly
/// `kept` and the inheritable and ambient sets are empty. The error says
/// which set differs and what `role` must be started with.
pub fn require_exactly(kept: CapabilitySet, role: &str) -> Result<(), String> {
    let status = std::fs::read_to_string("/proc/self/status")
        .map_err(|e| format!("cannot read /proc/self/status: {e}"))?;
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
            let named = |bits: u64| format!("{:?}", CapabilitySet::from_bits_retain(bits));
            return Err(format!(
                "its {name} capability set is {}, not {}: {role}",
                found.map_or("unreadable".into(), named),
                named(wanted)
            ));
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
        let error = require_exactly(CapabilitySet::NET_ADMIN, "started by a test").unwrap_err();
        assert!(error.contains("capability set"), "{error}");
        assert!(error.ends_with("started by a test"), "{error}");
    }
}
