//! What one session's escalation may put in the Domain log: every field
//! it takes from the sandbox bounded, and its refusals limited in rate.
//!
//! A sandbox chooses what its mailbox holds, and so how much would be
//! logged: files by the thousand a second, requests whose argv is
//! 128 KiB. So the argv is logged as its first [`MAX_ARGV_SHOWN`] bytes
//! (escaped) and what was left out, other text the sandbox chose as its
//! first [`MAX_FIELD`] bytes, and of what is refused without an answer or
//! ends at once (a mailbox file, a record, a request refused or denied
//! without asking), the first [`REFUSALS_PER_PERIOD`] of a
//! [`REFUSAL_PERIOD`] are logged, and the rest counted and summed up in
//! one line when the period ends. Pure: the session owns the clock and the
//! log calls. Trusts nothing it is given.

use std::borrow::Cow;
use std::time::{Duration, Instant};

use super::classify::shown;

/// The most bytes of an argv in a log event.
pub const MAX_ARGV_SHOWN: usize = 1024;

/// The most bytes of any other text from the sandbox in a log event (a
/// file name, a reason that quotes the request).
pub const MAX_FIELD: usize = 1024;

/// How many refusals of a session are logged in each period.
pub const REFUSALS_PER_PERIOD: u64 = 20;

/// The period of [`REFUSALS_PER_PERIOD`].
pub const REFUSAL_PERIOD: Duration = Duration::from_secs(10);

/// `argv` as [`shown`], cut to [`MAX_ARGV_SHOWN`] bytes, saying what was
/// left out.
pub fn argv(argv: &[String]) -> String {
    let words: Vec<String> = argv
        .iter()
        .map(|a| shown(std::slice::from_ref(a)))
        .collect();
    let total = words.iter().map(String::len).sum::<usize>() + words.len().saturating_sub(1);
    if total <= MAX_ARGV_SHOWN {
        return words.join(" ");
    }
    let mut out = String::new();
    let mut whole = 0;
    for word in &words {
        let sep = usize::from(!out.is_empty());
        if out.len() + sep + word.len() > MAX_ARGV_SHOWN {
            let room = MAX_ARGV_SHOWN.saturating_sub(out.len() + sep);
            if room > 0 {
                out.push_str(&" "[..sep]);
                out.push_str(cut(word, room));
            }
            break;
        }
        out.push_str(&" "[..sep]);
        out.push_str(word);
        whole += 1;
    }
    format!(
        "{out}… ({} more bytes not logged; {} of its {} words are whole above)",
        total - out.len(),
        whole,
        words.len()
    )
}

/// `text` cut to at most `max` bytes, on a character boundary.
fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// `text` as a log field: at most [`MAX_FIELD`] bytes, saying how many
/// were left out.
pub fn field(text: &str) -> Cow<'_, str> {
    if text.len() <= MAX_FIELD {
        return Cow::Borrowed(text);
    }
    let kept = cut(text, MAX_FIELD);
    Cow::Owned(format!(
        "{kept}… ({} more bytes not logged)",
        text.len() - kept.len()
    ))
}

/// What a refusal refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// A file in `requests/` that is not a regular file, or not readable.
    File,
    /// A record that failed verification, or a replay.
    Record,
    /// A request that ended at once: refused, or denied without a prompt.
    Request,
}

/// How many refusals of each kind went unlogged in a period.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Unlogged {
    /// Mailbox files.
    pub files: u64,
    /// Records.
    pub records: u64,
    /// Requests.
    pub requests: u64,
}

impl Unlogged {
    /// All of them.
    pub fn total(&self) -> u64 {
        self.files + self.records + self.requests
    }
}

/// One session's refusals in the current period.
#[derive(Debug, Default)]
pub struct Refusals {
    /// When the current period began: at the first refusal after a quiet
    /// one.
    began: Option<Instant>,
    logged: u64,
    unlogged: Unlogged,
}

impl Refusals {
    /// A refusal at `now`: whether it is logged (else it is counted).
    /// Call [`Self::summary`] first, so a period that ended is summed up
    /// before the next begins.
    pub fn admit(&mut self, kind: Refused, now: Instant) -> bool {
        let current = self
            .began
            .is_some_and(|began| now.saturating_duration_since(began) < REFUSAL_PERIOD);
        if !current {
            self.began = Some(now);
            self.logged = 0;
            self.unlogged = Unlogged::default();
        }
        if self.logged < REFUSALS_PER_PERIOD {
            self.logged += 1;
            return true;
        }
        match kind {
            Refused::File => self.unlogged.files += 1,
            Refused::Record => self.unlogged.records += 1,
            Refused::Request => self.unlogged.requests += 1,
        }
        false
    }

    /// When the current period's summary is due: its end, if something
    /// went unlogged in it.
    pub fn due(&self) -> Option<Instant> {
        let began = self.began?;
        (self.unlogged.total() > 0).then(|| began + REFUSAL_PERIOD)
    }

    /// What went unlogged in a period that ended by `now` (or, with
    /// `closing`, in the current one), once: the count starts again.
    pub fn summary(&mut self, now: Instant, closing: bool) -> Option<Unlogged> {
        let due = self.due()?;
        if now < due && !closing {
            return None;
        }
        Some(std::mem::take(&mut self.unlogged))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_argv_is_cut_and_says_what_was_left_out() {
        let short = vec!["/usr/bin/id".to_owned(), "-u".to_owned()];
        assert_eq!(argv(&short), "/usr/bin/id -u");
        let long = vec![
            "/usr/bin/id".to_owned(),
            "a".repeat(100_000),
            "b".to_owned(),
        ];
        let text = argv(&long);
        assert!(text.len() < MAX_ARGV_SHOWN + 100, "{}", text.len());
        assert!(text.starts_with("/usr/bin/id aaaa"), "{text}");
        let total = 11 + 1 + 100_000 + 1 + 1;
        let left = total - (MAX_ARGV_SHOWN);
        assert!(
            text.ends_with(&format!(
                "… ({left} more bytes not logged; 1 of its 3 words are whole above)"
            )),
            "{text}"
        );
        // Escaping counts: a control character takes its escaped width.
        let escaped = vec!["/bin/echo".to_owned(), "\u{1b}".repeat(1000)];
        let text = argv(&escaped);
        assert!(!text.contains('\u{1b}'), "{text}");
        assert!(text.len() < MAX_ARGV_SHOWN + 100, "{}", text.len());
        let long = "é".repeat(1000);
        let field = field(&long);
        assert!(field.len() < MAX_FIELD + 60, "{}", field.len());
        assert!(field.ends_with("(976 more bytes not logged)"), "{field}");
    }

    #[test]
    fn refusals_past_the_first_of_a_period_are_counted_and_summed_up_once() {
        let mut r = Refusals::default();
        let t0 = Instant::now();
        for i in 0..REFUSALS_PER_PERIOD {
            assert!(r.admit(Refused::File, t0), "{i}");
        }
        assert_eq!(r.due(), None);
        assert!(!r.admit(Refused::File, t0));
        assert!(!r.admit(Refused::Record, t0 + Duration::from_secs(1)));
        assert!(!r.admit(Refused::Request, t0 + Duration::from_secs(2)));
        assert_eq!(r.due(), Some(t0 + REFUSAL_PERIOD));
        assert_eq!(r.summary(t0 + Duration::from_secs(9), false), None);
        let end = t0 + REFUSAL_PERIOD;
        assert_eq!(
            r.summary(end, false),
            Some(Unlogged {
                files: 1,
                records: 1,
                requests: 1
            })
        );
        assert_eq!(r.summary(end, false), None);
        // The next period logs its first ones again.
        assert!(r.admit(Refused::Record, end));
        // On closing, what the current period holds is summed up at once.
        let mut r = Refusals::default();
        for _ in 0..=REFUSALS_PER_PERIOD {
            r.admit(Refused::Request, t0);
        }
        assert_eq!(r.summary(t0, true).map(|u| u.requests), Some(1));
    }
}
