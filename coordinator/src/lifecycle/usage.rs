//! What a running generation's uppers hold, for `lazaret status`: the root
//! filesystem's ephemeral upper (a tmpfs in the Domain mount namespace,
//! seen through the namespace holder's `/proc/PID/root`) and each
//! persistent dir's upper in Domain storage, walked without following a
//! link for at most [`WALK_BUDGET`] in all (the walk runs on the
//! coordinator's serve loop, which also carries the sessions' reports): a
//! figure cut short says so. `up`'s final report carries the ephemeral
//! upper's figure alone ([`Walk::EphemeralOnly`]). Trusts only the
//! kernel's answers; a figure it cannot read is left out, never guessed.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lazaret_proto::control::{PersistentUsage, StorageUsage, TmpfsUsage};

use crate::config::RetainedDir;

/// How long one `status` may spend walking the persistent uppers.
const WALK_BUDGET: Duration = Duration::from_millis(200);

/// Which uppers a measure covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Walk {
    /// The ephemeral upper and each persistent dir's, walked (`lazaret
    /// status`).
    Persistent,
    /// The ephemeral upper alone, one `statvfs`: for `up`'s final report,
    /// which a walk of a State Anchor of many files would delay by up to
    /// [`WALK_BUDGET`] (on the build machine, 30,000 files cost each `up`
    /// about 80 ms).
    EphemeralOnly,
}

/// Where a generation's uppers are.
#[derive(Debug)]
pub(super) struct Uppers {
    /// The ephemeral upper's mount point inside the Domain mount namespace.
    ephemeral: PathBuf,
    /// Each persistent dir and the Domain storage directory holding its
    /// `upper/`.
    persistent: Vec<(String, OwnedFd)>,
}

impl Uppers {
    /// The uppers of the generation whose runtime directory is
    /// `generation_dir`, with `anchors` the State Anchor directories of
    /// `persistent_dirs`, in the same order.
    pub(super) fn new(
        generation_dir: &RetainedDir,
        persistent_dirs: &[String],
        anchors: &[RetainedDir],
    ) -> std::io::Result<Self> {
        let persistent = persistent_dirs
            .iter()
            .zip(anchors)
            .map(|(path, anchor)| Ok((path.clone(), anchor.fd().try_clone_to_owned()?)))
            .collect::<std::io::Result<_>>()?;
        Ok(Self {
            ephemeral: generation_dir.label().join("mnt/root/ephemeral"),
            persistent,
        })
    }

    /// What they hold now, those `walk` covers; `holder` is the namespace
    /// holder's host pid.
    pub(super) fn measure(&self, holder: u32, walk: Walk) -> StorageUsage {
        let inside = Path::new("/proc")
            .join(holder.to_string())
            .join("root")
            .join(self.ephemeral.strip_prefix("/").unwrap_or(&self.ephemeral));
        let ephemeral_upper = rustix::fs::statvfs(&inside).ok().map(|s| TmpfsUsage {
            used_bytes: s
                .f_blocks
                .saturating_sub(s.f_bfree)
                .saturating_mul(s.f_frsize),
            size_bytes: s.f_blocks.saturating_mul(s.f_frsize),
        });
        StorageUsage {
            ephemeral_upper,
            persistent_uppers: match walk {
                Walk::Persistent => self.walk_persistent(),
                Walk::EphemeralOnly => Vec::new(),
            },
        }
    }

    /// What each persistent dir's upper holds, walked within
    /// [`WALK_BUDGET`] in all.
    fn walk_persistent(&self) -> Vec<PersistentUsage> {
        let deadline = Instant::now() + WALK_BUDGET;
        self.persistent
            .iter()
            .filter_map(|(path, anchor)| {
                let upper = lazaret_hostfs::beneath::open_dir_read(
                    anchor.as_fd(),
                    lazaret_storage::anchor::UPPER_DIR,
                )
                .ok()?;
                let (bytes, complete) =
                    lazaret_hostfs::tree::disk_usage_until(upper.as_fd(), Some(deadline)).ok()?;
                Some(PersistentUsage {
                    sandbox_path: path.clone(),
                    bytes,
                    complete,
                })
            })
            .collect()
    }
}
