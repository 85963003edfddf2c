//! How `lazaret up` shows the coordinator's start-up progress: a bar with
//! bytes and the step's detail (layers) on a terminal, plain lines
//! elsewhere, nothing with `--quiet`, and one JSON object per event with
//! `--json` (the host paths the rules now share included; in the other
//! modes `cli/domain.rs` shows them and asks).
//!
//! Owns the output format of progress, never its content: details come
//! from the user's own coordinator and are escaped before they are shown.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use lazaret_proto::control::{IgnoreChangesOutcome, StartupEvent, StartupStep};
use serde::Serialize;

/// How progress is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Bars on a terminal, lines elsewhere.
    Human,
    /// Nothing.
    Quiet,
    /// JSON lines on standard output.
    Json,
}

/// One progress event as `--json` prints it.
#[derive(Serialize)]
pub struct ProgressView<'a> {
    pub event: &'static str,
    pub step: &'static str,
    pub detail: &'a str,
    /// Done and total units (bytes) when the step can tell.
    pub done: Option<u64>,
    pub total: Option<u64>,
}

/// The host paths the last generation kept from the sandbox that the rules
/// now share, as `--json` prints them.
#[derive(Serialize)]
pub struct IgnoreChangesView {
    pub event: &'static str,
    /// Relative to the workspace; `""` is the whole workspace.
    pub paths: Vec<String>,
    /// How many in all (`paths` may name fewer).
    pub count: u64,
    /// `asking`, `kept` or `accepted`.
    pub outcome: &'static str,
}

/// Start-up progress on its way to the user.
pub struct Progress {
    mode: Mode,
    terminal: bool,
    bar: Option<ProgressBar>,
    /// The last tenth of a measured step a plain line was printed for.
    shown_tenth: Option<(StartupStep, u64)>,
}

impl Progress {
    pub fn new(mode: Mode) -> Self {
        Self {
            mode,
            terminal: std::io::stderr().is_terminal(),
            bar: None,
            shown_tenth: None,
        }
    }

    /// Shows `event`; the end of start-up, and anything but progress,
    /// closes any bar.
    pub fn event(&mut self, event: &StartupEvent) {
        let StartupEvent::Progress {
            step,
            detail,
            fraction,
        } = event
        else {
            if let (Mode::Json, StartupEvent::IgnoreChanges(changes)) = (self.mode, event) {
                let view = IgnoreChangesView {
                    event: "ignore_changes",
                    paths: changes.paths.iter().map(super::view::path_text).collect(),
                    count: changes.count,
                    outcome: match changes.outcome {
                        IgnoreChangesOutcome::Asking => "asking",
                        IgnoreChangesOutcome::Kept => "kept",
                        IgnoreChangesOutcome::Accepted => "accepted",
                    },
                };
                let _ = super::print_json_line(&view);
            }
            return self.finish();
        };
        match self.mode {
            Mode::Quiet => {}
            Mode::Json => {
                let view = ProgressView {
                    event: "progress",
                    step: step.as_str(),
                    detail,
                    done: fraction.map(|f| f.0),
                    total: fraction.map(|f| f.1),
                };
                // A closed or failing standard output ends nothing here:
                // the outcome line reports it.
                let _ = super::print_json_line(&view);
            }
            Mode::Human => {
                let detail = super::printable(detail);
                match fraction {
                    Some((done, total)) if *total > 0 => {
                        self.measured(*step, &detail, *done, *total)
                    }
                    _ => self.line(*step, &detail),
                }
            }
        }
    }

    /// A step that reports done and total bytes.
    fn measured(&mut self, step: StartupStep, detail: &str, done: u64, total: u64) {
        if !self.terminal {
            // A line per tenth, so a log of a slow fetch stays short.
            let tenth = done.saturating_mul(10) / total;
            if self.shown_tenth != Some((step, tenth)) {
                self.shown_tenth = Some((step, tenth));
                print_line(step, detail);
            }
            return;
        }
        let bar = self.bar.get_or_insert_with(|| {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template(
                    "{prefix:>13}  [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {wide_msg}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("#> "),
            );
            bar
        });
        bar.set_prefix(step.as_str());
        bar.set_length(total);
        bar.set_position(done.min(total));
        bar.set_message(detail.to_owned());
    }

    /// A step's line, below any bar, which ends.
    fn line(&mut self, step: StartupStep, detail: &str) {
        self.finish();
        print_line(step, detail);
    }

    /// Leaves the last state of a bar on screen.
    fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Writes a step's line to standard error in one write, so that it is not
/// split (a padded field is otherwise written a character at a time).
fn print_line(step: StartupStep, detail: &str) {
    let line = format!("{:>13}  {detail}\n", step.as_str());
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
}
