//! How the helper roles (the Runtime Supervisor, the Workspace Router, the
//! Network Sidecar) log: `tracing` events, one line each with its time,
//! level and module, to standard error, which the Host Coordinator points
//! at the Domain's log file; and the bounds every line of that file keeps.
//!
//! Owns the subscriber's set-up and what one process may write: a line
//! of at most [`MAX_LINE`] bytes (a longer event is cut, saying how much
//! was left out) and at most [`HELPER_BUDGET`] bytes in all, after which
//! one line says the limit was reached and nothing more is written. The
//! coordinator keeps the file itself to its size (it rotates it). Events
//! never carry secrets: callers log names and identifiers, never an
//! environment value.

use std::borrow::Cow;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// The most bytes of one line of the Domain log.
pub const MAX_LINE: usize = 8 * 1024;

/// The most bytes one helper role process writes to the Domain log.
pub const HELPER_BUDGET: u64 = 1024 * 1024;

/// `line` (one event, ending in a newline) cut to at most `max` bytes, on
/// a character boundary, with how many bytes were left out.
pub fn bounded_line(line: &[u8], max: usize) -> Cow<'_, [u8]> {
    if line.len() <= max {
        return Cow::Borrowed(line);
    }
    // Room for the note: "… (N bytes cut)\n".
    let keep = max.saturating_sub(40);
    let mut end = keep;
    // Back to the start of a UTF-8 character (not a continuation byte).
    while end > 0 && line.get(end).is_some_and(|b| b & 0xc0 == 0x80) {
        end -= 1;
    }
    let mut cut = line[..end].to_vec();
    cut.extend_from_slice(format!("… ({} bytes cut)\n", line.len() - end).as_bytes());
    Cow::Owned(cut)
}

/// What this process has written to standard error through its
/// subscriber.
static WRITTEN: AtomicU64 = AtomicU64::new(0);

/// The note written once when [`HELPER_BUDGET`] is reached.
const LIMIT_REACHED: &[u8] =
    b"log limit reached: this process writes nothing more to the Domain log\n";

/// Standard error, each event bounded to [`MAX_LINE`], all of them to
/// [`HELPER_BUDGET`].
#[derive(Debug, Clone, Copy, Default)]
struct BoundedStderr;

impl Write for BoundedStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let line = bounded_line(buf, MAX_LINE);
        let len = line.len() as u64;
        let before = WRITTEN.fetch_add(len, Ordering::Relaxed);
        let mut stderr = std::io::stderr().lock();
        if before + len <= HELPER_BUDGET {
            stderr.write_all(&line)?;
        } else if before <= HELPER_BUDGET {
            stderr.write_all(LIMIT_REACHED)?;
        }
        // Whatever was kept or dropped, the event is done with.
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// Installs the role's subscriber; a second call does nothing.
pub fn init() {
    let _ = tracing_subscriber::fmt()
        .with_writer(|| BoundedStderr)
        .with_ansi(false)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_line_is_cut_on_a_character_and_says_so() {
        assert_eq!(bounded_line(b"short\n", 64), Cow::Borrowed(b"short\n"));
        let long = "é".repeat(100) + "\n";
        let cut = bounded_line(long.as_bytes(), 64);
        let text = std::str::from_utf8(&cut).expect("still UTF-8");
        assert!(cut.len() <= 64, "{text}");
        assert!(
            text.starts_with("éé") && text.ends_with(" bytes cut)\n"),
            "{text}"
        );
        let kept = text.split('…').next().unwrap_or_default().len();
        assert!(
            text.contains(&format!("({} bytes cut)", long.len() - kept)),
            "{text}"
        );
    }
}
