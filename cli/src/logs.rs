//! `lazaret logs PROFILE [-f] [--since WHEN]`: a Domain's log, wherever it
//! went.
//!
//! Owns reading the Domain's log file (the helper roles always write
//! there; the coordinator too when there is no journal), the one before
//! its last rotation first, filtering it by time and following it as it
//! grows and is rotated, and handing the coordinator's journal entries to
//! `journalctl` when the journal took them. Trusts the
//! log file's contents only as text to print: control bytes are escaped.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::Duration;

use super::{Failure, failure};
use crate::lifecycle::DomainPaths;

/// Where `journalctl` may be found.
const JOURNALCTL: &[&str] = &["/usr/bin/journalctl", "/bin/journalctl"];

/// How often a followed log file is read for more.
const FOLLOW_INTERVAL: Duration = Duration::from_millis(200);

/// A `--since` value that names no time.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "--since {text:?} is not a time: use a duration back from now (90s, 10m, 2h, 1d), \
     an RFC 3339 UTC time (2026-12-01T10:00:00Z) or @SECONDS"
)]
pub struct SinceError {
    /// The value as given.
    text: String,
}

/// Parses `--since`: a duration back from now (`90s`, `10m`, `2h`, `1d`),
/// an RFC 3339 UTC time (`2026-12-01T10:00:00Z`), or `@SECONDS` since the
/// epoch. Returns seconds since the epoch.
pub fn parse_since(text: &str, now_secs: u64) -> Result<u64, SinceError> {
    let invalid = || SinceError {
        text: text.to_owned(),
    };
    if let Some(secs) = text.strip_prefix('@') {
        return secs.parse().map_err(|_| invalid());
    }
    if let Some(at) = rfc3339_secs(text) {
        return Ok(at);
    }
    let (number, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .ok_or_else(invalid)?,
    );
    let number: u64 = number.parse().map_err(|_| invalid())?;
    let unit = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(invalid()),
    };
    Ok(now_secs.saturating_sub(number.saturating_mul(unit)))
}

/// Seconds since the epoch of an RFC 3339 UTC time as the log writes it
/// (`2026-12-01T10:00:00.123456Z`; the fraction is optional).
fn rfc3339_secs(text: &str) -> Option<u64> {
    let text = text.strip_suffix('Z')?;
    let (date, time) = text.split_once('T')?;
    let mut date = date.splitn(3, '-').map(str::parse::<i64>);
    let (year, month, day) = (date.next()?.ok()?, date.next()?.ok()?, date.next()?.ok()?);
    let time = time.split_once('.').map_or(time, |(whole, _)| whole);
    let mut time = time.splitn(3, ':').map(str::parse::<i64>);
    let (hour, minute, second) = (time.next()?.ok()?, time.next()?.ok()?, time.next()?.ok()?);
    let valid = (1..=12).contains(&month)
        && (1..=31).contains(&day)
        && (0..24).contains(&hour)
        && (0..60).contains(&minute)
        && (0..=60).contains(&second);
    if !valid {
        return None;
    }
    // Days from the civil date (proleptic Gregorian), after H. Hinnant.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(days * 86_400 + hour * 3600 + minute * 60 + second).ok()
}

/// The lines of `text` logged at or after `since` (all with `None`). A line
/// without a time of its own (a message's further lines) goes with the
/// line before it.
fn since_filter(text: &str, since: Option<u64>, keep: &mut bool) -> String {
    let mut out = String::new();
    for line in text.split_inclusive('\n') {
        if let Some(at) = line.split_whitespace().next().and_then(rfc3339_secs) {
            *keep = since.is_none_or(|since| at >= since);
        }
        if *keep {
            out.push_str(line);
        }
    }
    out
}

/// Prints text from the log with its control characters (but for tabs
/// and newlines) escaped: a line may hold what a sandbox process wrote.
fn print_escaped(text: &str) -> Result<(), Failure> {
    let mut printable = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() && c != '\n' && c != '\t' {
            printable.extend(c.escape_default());
        } else {
            printable.push(c);
        }
    }
    let mut out = std::io::stdout().lock();
    out.write_all(printable.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| failure(format!("cannot write the log: {e}")))
}

/// `lazaret logs PROFILE [-f] [--since WHEN]`.
pub fn logs(
    paths: &DomainPaths,
    profile: &str,
    follow: bool,
    since: Option<&str>,
) -> Result<(), Failure> {
    let now = lazaret_proto::common::UnixTimeNs::now().as_secs();
    let since = since
        .map(|text| parse_since(text, now))
        .transpose()
        .map_err(|e| failure(e.to_string()))?;
    let journal = crate::lifecycle::journal::socket_path().is_some();
    let log = paths.log_file();
    let open = |path: &Path| match std::fs::File::open(path) {
        Ok(file) => Ok(Some(file)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(failure(format!("cannot read {}: {e}", path.display()))),
    };
    // The file before the last rotation, then the current one (a rotation
    // between the two opens leaves out the lines of the file it renamed).
    let previous = open(&paths.previous_log_file())?;
    let mut file = open(&log)?;
    let mut keep = since.is_none();
    let read_more = |file: &mut std::fs::File, keep: &mut bool| -> Result<(), Failure> {
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(|e| {
            failure(format!(
                "cannot read the Domain log in {}: {e}",
                paths.runtime_dir.display()
            ))
        })?;
        print_escaped(&since_filter(&String::from_utf8_lossy(&bytes), since, keep))
    };
    if let Some(mut previous) = previous {
        read_more(&mut previous, &mut keep)?;
    }
    match file.as_mut() {
        Some(file) => read_more(file, &mut keep)?,
        None if !journal => {
            return super::print(&format!(
                "profile `{profile}` has no log in this workspace yet ({})\n",
                log.display()
            ));
        }
        None => {}
    }
    if journal {
        // The coordinator's own events went to the journal.
        return journal_entries(paths, follow, since);
    }
    if follow {
        let Some(mut file) = file else {
            return Ok(());
        };
        loop {
            std::thread::sleep(FOLLOW_INTERVAL);
            // A log that was cut short (a new generation) is read again
            // from its start; one that was rotated away is read to its end,
            // then the new one from its start.
            let len = file.metadata().map(|m| m.len()).unwrap_or(0);
            if file.stream_position().unwrap_or(0) > len {
                let _ = file.seek(SeekFrom::Start(0));
            }
            read_more(&mut file, &mut keep)?;
            if rotated(&file, &log)
                && let Some(new) = open(&log)?
            {
                file = new;
                read_more(&mut file, &mut keep)?;
            }
        }
    }
    Ok(())
}

/// Whether `path` names another file than `file` now (it was rotated).
fn rotated(file: &std::fs::File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(open), Ok(now)) => (open.dev(), open.ino()) != (now.dev(), now.ino()),
        _ => false,
    }
}

/// Shows the coordinator's journal entries of the Domain with `journalctl`.
fn journal_entries(paths: &DomainPaths, follow: bool, since: Option<u64>) -> Result<(), Failure> {
    let Some(journalctl) = JOURNALCTL.iter().map(Path::new).find(|p| p.exists()) else {
        return super::print(&format!(
            "the coordinator logs to the journal; see: journalctl LAZARET_DOMAIN={}\n",
            paths.domain_id
        ));
    };
    let journalctl = crate::programs::trusted(journalctl)
        .map_err(|e| failure(lazaret_proto::error_chain(&e)))?;
    let mut command = crate::programs::command(&journalctl, &["LANG", "LC_ALL", "TERM", "PAGER"]);
    command
        .args(["--no-pager", "--output=short-iso"])
        .arg(format!("LAZARET_DOMAIN={}", paths.domain_id));
    if let Some(since) = since {
        command.arg(format!("--since=@{since}"));
    }
    if follow {
        command.arg("--follow");
    }
    let status = command
        .status()
        .map_err(|e| failure(format!("cannot run {}: {e}", journalctl.display())))?;
    if status.success() {
        Ok(())
    } else {
        Err(failure(format!(
            "{} LAZARET_DOMAIN={} failed ({status})",
            journalctl.display(),
            paths.domain_id
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_takes_durations_times_and_epoch_seconds() {
        let now = 1_790_000_000;
        assert_eq!(parse_since("90s", now), Ok(now - 90));
        assert_eq!(parse_since("10m", now), Ok(now - 600));
        assert_eq!(parse_since("2h", now), Ok(now - 7200));
        assert_eq!(parse_since("1d", now), Ok(now - 86_400));
        assert_eq!(parse_since("@12345", now), Ok(12_345));
        assert_eq!(parse_since("1970-01-01T00:00:00Z", now), Ok(0));
        assert_eq!(parse_since("2000-03-01T00:00:00Z", now), Ok(951_868_800));
        assert_eq!(
            parse_since("2026-12-01T11:04:15.123456Z", now),
            Ok(1_796_123_055)
        );
        for bad in [
            "",
            "ten",
            "10",
            "10w",
            "2026-13-01T00:00:00Z",
            "@-1",
            "2026-12-01",
        ] {
            let error = parse_since(bad, now).unwrap_err().to_string();
            assert!(error.contains("--since"), "{error}");
        }
    }

    #[test]
    fn lines_without_a_time_follow_the_line_before() {
        let log = "2026-12-01T10:00:00.1Z  INFO old\n\
                   more of old\n\
                   2026-12-01T11:00:00.1Z  INFO new\n\
                   more of new\n";
        let since = rfc3339_secs("2026-12-01T10:30:00Z");
        let mut keep = false;
        assert_eq!(
            since_filter(log, since, &mut keep),
            "2026-12-01T11:00:00.1Z  INFO new\nmore of new\n"
        );
        let mut keep = true;
        assert_eq!(since_filter(log, None, &mut keep), log);
    }
}
