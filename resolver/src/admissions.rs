//! The addresses this resolver admitted into the filter's set, and until
//! when.
//!
//! Owns the decision to touch the set: each change is an nf_tables
//! transaction, whose commit costs milliseconds, so an address that stays
//! admitted for at least half of a new answer's admission is left as it
//! is, and the answer's TTLs are shortened to what it has left: no client
//! caches an address longer than the filter lets it through. Trusts the set
//! ([`Fill`]) to hold what it was told, and nothing else.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use lazaret_netsidecar::NamedSet;
use lazaret_proto::sidecar::SidecarError;

/// How early an admission is taken to end, against the kernel's clock
/// having started it a moment later than this process's.
const MARGIN: Duration = Duration::from_secs(1);
/// Past this many remembered admissions, the expired ones are forgotten.
const REMEMBERED: usize = 4096;

/// What fills the set: the kernel's (the filter's `names`), or a test's.
pub trait Fill {
    /// Admits `address` for `timeout` as an answer for `name`, or renews it.
    fn admit(
        &mut self,
        address: Ipv4Addr,
        timeout: Duration,
        name: &str,
    ) -> Result<(), SidecarError>;
}

impl Fill for NamedSet {
    fn admit(
        &mut self,
        address: Ipv4Addr,
        timeout: Duration,
        name: &str,
    ) -> Result<(), SidecarError> {
        NamedSet::admit(self, address, timeout, name)
    }
}

/// The set, and until when each address this resolver put there stays.
#[derive(Debug)]
pub struct Admissions<F> {
    set: F,
    until: HashMap<Ipv4Addr, Instant>,
}

impl<F: Fill> Admissions<F> {
    /// Nothing admitted yet.
    pub fn new(set: F) -> Self {
        Self {
            set,
            until: HashMap::new(),
        }
    }

    /// Admits `address` for `timeout` as an answer for `name` at `now`,
    /// unless it stays admitted for half of that already; how long it
    /// stays admitted from `now`.
    pub fn admit(
        &mut self,
        address: Ipv4Addr,
        timeout: Duration,
        name: &str,
        now: Instant,
    ) -> Result<Duration, SidecarError> {
        let left = self
            .until
            .get(&address)
            .map_or(Duration::ZERO, |until| until.saturating_duration_since(now));
        if left >= timeout / 2 {
            return Ok(left);
        }
        self.set.admit(address, timeout, name)?;
        if self.until.len() >= REMEMBERED {
            self.until.retain(|_, until| *until > now);
        }
        self.until
            .insert(address, now + timeout.saturating_sub(MARGIN));
        Ok(timeout.saturating_sub(MARGIN))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Recorded(Vec<(Ipv4Addr, Duration)>);

    impl Fill for Recorded {
        fn admit(
            &mut self,
            address: Ipv4Addr,
            timeout: Duration,
            _: &str,
        ) -> Result<(), SidecarError> {
            self.0.push((address, timeout));
            Ok(())
        }
    }

    #[test]
    fn the_set_is_touched_only_when_an_admission_runs_low() {
        let a = Ipv4Addr::new(198, 18, 2, 10);
        let minute = Duration::from_secs(60);
        let start = Instant::now();
        let mut admissions = Admissions::new(Recorded::default());
        let left = admissions.admit(a, minute, "a.example", start).unwrap();
        assert_eq!(left, minute - MARGIN);
        // Half a minute later, more than half is left: nothing changes,
        // and the answer may be cached only for what is left.
        let later = start + Duration::from_secs(20);
        let left = admissions.admit(a, minute, "a.example", later).unwrap();
        assert_eq!(left, minute - MARGIN - Duration::from_secs(20));
        assert_eq!(admissions.set.0.len(), 1);
        // Less than half left: renewed for the whole timeout.
        let late = start + Duration::from_secs(40);
        let left = admissions.admit(a, minute, "a.example", late).unwrap();
        assert_eq!(left, minute - MARGIN);
        assert_eq!(admissions.set.0, [(a, minute), (a, minute)]);
        // A longer admission asked for than what is left renews too.
        let hour = Duration::from_secs(3600);
        admissions.admit(a, hour, "a.example", late).unwrap();
        assert_eq!(admissions.set.0.len(), 3);
    }
}
