//! The open-handle tables: the files and directories the sandbox holds
//! open, by the handle number `open`, `create` and `opendir` gave it.
//!
//! Owns handle numbers: each is handed out once (from 1, never reused),
//! and one that was never given out or was released names nothing
//! (`EBADF`). Trusts nothing about a handle number the sandbox sends: it
//! is looked up, never used as an index or a descriptor.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rustix::io::Errno;

use super::Result;

/// Open files or directories by handle number.
#[derive(Debug)]
pub(super) struct Handles<T> {
    open: Mutex<HashMap<u64, Arc<T>>>,
    next: AtomicU64,
}

impl<T> Handles<T> {
    pub(super) fn new() -> Self {
        Handles {
            open: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<T>>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `value`; returns its handle.
    pub(super) fn insert(&self, value: T) -> u64 {
        let handle = self.next.fetch_add(1, Ordering::Relaxed);
        self.table().insert(handle, Arc::new(value));
        handle
    }

    /// What `handle` names.
    pub(super) fn get(&self, handle: u64) -> Result<Arc<T>> {
        self.table().get(&handle).cloned().ok_or(Errno::BADF)
    }

    /// Puts `value` in place of what `handle` names.
    pub(super) fn replace(&self, handle: u64, value: T) -> Result<()> {
        match self.table().get_mut(&handle) {
            Some(slot) => {
                *slot = Arc::new(value);
                Ok(())
            }
            None => Err(Errno::BADF),
        }
    }

    /// Forgets `handle`.
    pub(super) fn remove(&self, handle: u64) {
        self.table().remove(&handle);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_never_given_out_names_nothing() {
        let handles = Handles::new();
        let given = handles.insert("file");
        for never in [0, given + 1, u64::MAX] {
            assert_eq!(handles.get(never).unwrap_err(), Errno::BADF);
            assert_eq!(handles.replace(never, "other").unwrap_err(), Errno::BADF);
        }
        // Replacing a number that names nothing does not make it name
        // something.
        assert_eq!(handles.get(0).unwrap_err(), Errno::BADF);
        assert_eq!(*handles.get(given).unwrap(), "file");
    }

    #[test]
    fn a_released_handle_names_nothing_and_is_never_given_again() {
        let handles = Handles::new();
        let first = handles.insert(1);
        handles.remove(first);
        assert_eq!(handles.get(first).unwrap_err(), Errno::BADF);
        assert_eq!(handles.replace(first, 2).unwrap_err(), Errno::BADF);
        // Released twice: still nothing, and nothing else disturbed.
        let second = handles.insert(3);
        handles.remove(first);
        assert_ne!(second, first);
        assert_eq!(*handles.get(second).unwrap(), 3);
    }

    #[test]
    fn handles_start_at_one_and_a_replacement_keeps_its_number() {
        let handles = Handles::new();
        let a = handles.insert("a");
        let b = handles.insert("b");
        assert_eq!((a, b), (1, 2));
        let held = handles.get(a).unwrap();
        handles.replace(a, "c").unwrap();
        assert_eq!(*handles.get(a).unwrap(), "c");
        // What a reader took before the replacement stays what it was.
        assert_eq!(*held, "a");
        assert_eq!(*handles.get(b).unwrap(), "b");
    }
}
