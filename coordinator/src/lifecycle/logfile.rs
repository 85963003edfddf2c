//! The Domain log file, `coordinator.log` in the Domain's runtime
//! directory: the coordinator's events when there is no journal, and
//! whatever the helper roles write to the standard error they inherit.
//!
//! Owns its size. Each event the coordinator writes is one line of at
//! most [`MAX_LINE`] bytes; before one would take the file past
//! [`FILE_LIMIT`] (lines of the helper roles counted), the file is
//! renamed to `coordinator.log.1`, replacing the one before, and a new
//! `coordinator.log` is opened and made the coordinator's standard output
//! and error, so the runtime directory's tmpfs never holds more than two
//! files of the limit. A helper role started earlier keeps writing to the
//! file it was given, within its own budget
//! ([`lazaret_proto::logging::HELPER_BUDGET`]). Every name is opened
//! beneath the retained runtime directory without following links.
//! Trusts that directory; writes only text it is given.

use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Mutex, OnceLock};

use lazaret_proto::logging::{MAX_LINE, bounded_line};
use rustix::fs::{Mode, OFlags};

use lazaret_hostfs::beneath::open_beneath;

/// The Domain log file's name in the runtime directory.
pub const LOG_FILE: &str = super::LOG_FILE;

/// What the log file is renamed to when it reaches its limit.
pub const PREVIOUS_LOG_FILE: &str = "coordinator.log.1";

/// The most bytes of the log file before it is rotated.
pub const FILE_LIMIT: u64 = 4 * 1024 * 1024;

/// The first line of a log file that follows a rotated one.
const CONTINUED: &str = "the Domain log continues here; the lines before are in coordinator.log.1, \
                         which is replaced when this file reaches its limit\n";

/// The open log file and the directory it rotates in.
#[derive(Debug)]
pub struct LogFile {
    dir: OwnedFd,
    file: Mutex<std::fs::File>,
    limit: u64,
    /// Whether the file is this process's standard output and error, and
    /// the new one becomes them at each rotation.
    streams: bool,
}

/// The log file events go to, once [`install`]ed.
static LOG: OnceLock<LogFile> = OnceLock::new();

impl LogFile {
    /// Opens the log file in `dir` (appending, created `0600`), rotated
    /// first when it is already at `limit`, and makes it standard output
    /// and error.
    pub fn open(dir: BorrowedFd<'_>, limit: u64) -> std::io::Result<Self> {
        let log = Self {
            dir: dir.try_clone_to_owned()?,
            file: Mutex::new(open_current(dir)?),
            limit,
            streams: true,
        };
        {
            let mut file = log.lock();
            if file.metadata()?.len() >= limit {
                log.rotate(&mut file)?;
            }
            rustix::stdio::dup2_stdout(file.as_fd())?;
            rustix::stdio::dup2_stderr(file.as_fd())?;
        }
        Ok(log)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::fs::File> {
        self.file.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes one event (a line, or a message of several): cut to
    /// [`MAX_LINE`], after a rotation when it would take the file past its
    /// limit. A failure is dropped: logging never stops the coordinator.
    /// An event that would take the file past its limit and cannot be
    /// rotated away (a full tmpfs, no descriptor left) is dropped too, so
    /// the file never outgrows its limit.
    pub fn write_event(&self, event: &[u8]) {
        let event = bounded_line(event, MAX_LINE);
        let mut file = self.lock();
        let Ok(len) = file.metadata().map(|m| m.len()) else {
            return;
        };
        if len + event.len() as u64 > self.limit
            && len > 0
            && (self.rotate(&mut file).is_err()
                || file_len(&file) + event.len() as u64 > self.limit)
        {
            return;
        }
        let _ = file.write_all(&event);
    }

    /// Renames the file to [`PREVIOUS_LOG_FILE`] and opens a new one, which
    /// becomes standard output and error.
    fn rotate(&self, file: &mut std::fs::File) -> std::io::Result<()> {
        // No current file: an earlier rotation renamed it and could not
        // open the next (it is made now).
        match rustix::fs::renameat(&self.dir, LOG_FILE, &self.dir, PREVIOUS_LOG_FILE) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => {}
            Err(e) => return Err(e.into()),
        }
        let mut new = open_current(self.dir.as_fd())?;
        if self.streams {
            rustix::stdio::dup2_stdout(new.as_fd())?;
            rustix::stdio::dup2_stderr(new.as_fd())?;
        }
        new.write_all(CONTINUED.as_bytes())?;
        *file = new;
        Ok(())
    }
}

/// The length of `file`; when it cannot be read, more than any limit.
fn file_len(file: &std::fs::File) -> u64 {
    file.metadata().map_or(u64::MAX / 2, |m| m.len())
}

fn open_current(dir: BorrowedFd<'_>) -> std::io::Result<std::fs::File> {
    let fd = open_beneath(
        dir,
        LOG_FILE,
        OFlags::WRONLY | OFlags::CREATE | OFlags::APPEND,
        Mode::RUSR | Mode::WUSR,
    )?;
    Ok(std::fs::File::from(fd))
}

/// Makes `log` the file every [`EventWriter`] writes to; a second call
/// does nothing.
pub fn install(log: LogFile) {
    let _ = LOG.set(log);
}

/// Where the `tracing` formatter writes one event: the installed log
/// file, or standard error before there is one.
#[derive(Debug, Clone, Copy, Default)]
pub struct EventWriter;

impl Write for EventWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match LOG.get() {
            Some(log) => log.write_event(buf),
            None => std::io::stderr().write_all(&bounded_line(buf, MAX_LINE))?,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_in(dir: &tempfile::TempDir, limit: u64) -> LogFile {
        let fd = rustix::fs::open(
            dir.path(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
        LogFile {
            file: Mutex::new(open_current(fd.as_fd()).unwrap()),
            dir: fd,
            limit,
            // The test's own standard streams stay as they are.
            streams: false,
        }
    }

    fn size(dir: &tempfile::TempDir, name: &str) -> u64 {
        std::fs::metadata(dir.path().join(name)).map_or(0, |m| m.len())
    }

    #[test]
    fn the_file_is_rotated_before_it_passes_its_limit() {
        let dir = tempfile::tempdir().unwrap();
        let log = log_in(&dir, 4096);
        let line = format!("{}\n", "x".repeat(99));
        for _ in 0..200 {
            log.write_event(line.as_bytes());
            assert!(size(&dir, LOG_FILE) <= 4096);
        }
        // Two files at most, the current one starting with the note.
        assert!(size(&dir, PREVIOUS_LOG_FILE) <= 4096);
        assert!(size(&dir, PREVIOUS_LOG_FILE) > 4096 - 100);
        let current = std::fs::read_to_string(dir.path().join(LOG_FILE)).unwrap();
        assert!(current.starts_with(CONTINUED), "{current}");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 2);
    }

    #[test]
    fn an_event_is_cut_to_one_bounded_line() {
        let dir = tempfile::tempdir().unwrap();
        let log = log_in(&dir, 1 << 20);
        let huge = format!("argv={}\n", "a".repeat(100_000));
        log.write_event(huge.as_bytes());
        let text = std::fs::read_to_string(dir.path().join(LOG_FILE)).unwrap();
        assert!(text.len() <= MAX_LINE, "{}", text.len());
        assert!(text.ends_with(" bytes cut)\n"), "{text}");
    }
}
