//! The startup channel to the CLI that started this coordinator, and the
//! start-up phase each thread has in progress.
//!
//! Owns what the CLI hears while a generation comes up (progress, the one
//! question, the failure) and the phases' spans and timings in the log.
//! Trusts the CLI's answer to its question as the developer's; a CLI that
//! has gone is not an error: start-up goes on without it.

use std::process::ExitCode;
use std::time::Instant;

use lazaret_proto::channel::Endpoint;
use lazaret_proto::control::{StartupEvent, StartupReply, StartupStep};

use super::chain;
use super::failure::Failure;

/// The coordinator's end of the startup channel.
pub(super) type Startup = Endpoint<StartupEvent, StartupReply>;

/// The startup channel to the CLI that started this coordinator, and the
/// start-up phase each thread has in progress (the connectivity helper
/// attaches on a thread of its own while the image and state are
/// prepared).
pub(super) struct Reporter {
    startup: Startup,
    phases: std::sync::Mutex<Vec<(std::thread::ThreadId, Phase)>>,
}

/// One start-up phase: its span and when it began. The span is not
/// entered (phases do not nest with the generation's span); its one event
/// says how long the phase took.
struct Phase {
    step: StartupStep,
    span: tracing::Span,
    began: Instant,
}

impl Phase {
    /// Ends the phase, logging how long it took inside its span.
    fn end(self) {
        let elapsed_ms = u64::try_from(self.began.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.span
            .in_scope(|| tracing::info!(elapsed_ms, "{} done", self.step.as_str()));
    }
}

impl Reporter {
    /// Reports on `startup`.
    pub(super) fn new(startup: Startup) -> Self {
        Reporter {
            startup,
            phases: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Reports on the startup channel the CLI passed as standard input.
    pub(super) fn take_stdin() -> Result<Self, ExitCode> {
        Startup::take_stdin().map(Reporter::new).map_err(|e| {
            eprintln!("lazaret-coordinator: {}", chain(&e));
            ExitCode::FAILURE
        })
    }

    pub(super) fn send(&self, event: StartupEvent) {
        // The CLI may have gone (Ctrl-C); the coordinator goes on regardless.
        let _ = self.startup.send(&event, &[]);
    }

    /// Sends `event`, a question, and waits for the CLI's reply: `None`
    /// when the CLI has gone or the channel failed. Only one thread asks,
    /// and only once; the others go on reporting meanwhile.
    pub(super) fn ask(&self, event: StartupEvent) -> Option<StartupReply> {
        self.startup.send(&event, &[]).ok()?;
        match self.startup.recv() {
            Ok(received) => Some(received.message),
            Err(e) => {
                tracing::warn!("no answer from the CLI: {}", chain(&e));
                None
            }
        }
    }

    /// This thread's phase, taken out of the list.
    fn take_phase(&self) -> Option<Phase> {
        let me = std::thread::current().id();
        let mut phases = self.phases.lock().unwrap_or_else(|e| e.into_inner());
        let i = phases.iter().position(|(thread, _)| *thread == me)?;
        Some(phases.swap_remove(i).1)
    }

    /// Enters `step`'s phase on this thread, ending the one before it if
    /// it was another.
    fn enter(&self, step: StartupStep) {
        let phase = match self.take_phase() {
            Some(phase) if phase.step == step => phase,
            done => {
                if let Some(done) = done {
                    done.end();
                }
                Phase {
                    step,
                    span: tracing::info_span!("phase", lazaret_phase = step.as_str()),
                    began: Instant::now(),
                }
            }
        };
        let me = std::thread::current().id();
        self.phases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((me, phase));
    }

    /// Ends this thread's phase in progress.
    pub(super) fn finish_phase(&self) {
        if let Some(done) = self.take_phase() {
            done.end();
        }
    }

    pub(super) fn progress(&self, step: StartupStep, detail: impl Into<String>) {
        let detail = detail.into();
        self.enter(step);
        tracing::info!("{}: {detail}", step.as_str());
        self.send(StartupEvent::Progress {
            step,
            detail,
            fraction: None,
        });
    }

    /// Reports `failure` to the CLI and logs it: the coordinator's end.
    pub(super) fn fail(&self, failure: Failure) -> ExitCode {
        tracing::error!("{} failed: {}", failure.step.as_str(), failure.account);
        self.finish_phase();
        self.send(StartupEvent::Failed {
            step: failure.step,
            kind: failure.kind,
            failure: failure.account,
        });
        ExitCode::FAILURE
    }
}

#[cfg(test)]
impl Reporter {
    /// How many threads have a phase in progress.
    pub(super) fn phases_in_progress(&self) -> usize {
        self.phases.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    //! The reporter against a scripted CLI on a socketpair.

    use lazaret_proto::channel::{Endpoint, pair};
    use lazaret_proto::control::{
        FailureKind, IgnoreChanges, IgnoreChangesOutcome, StartupEvent, StartupReply, StartupStep,
    };

    use super::Reporter;
    use crate::lifecycle::failure::invalid;

    /// The coordinator's reporter and the scripted CLI's end.
    fn reporter() -> (Reporter, Endpoint<StartupReply, StartupEvent>) {
        let (ours, theirs) = pair::<StartupEvent, StartupReply>().unwrap();
        (Reporter::new(ours), theirs)
    }

    fn question() -> StartupEvent {
        StartupEvent::IgnoreChanges(IgnoreChanges {
            paths: Vec::new(),
            count: 1,
            outcome: IgnoreChangesOutcome::Asking,
        })
    }

    #[test]
    fn progress_reaches_the_cli_and_opens_the_steps_phase() {
        let (reporter, cli) = reporter();
        reporter.progress(StartupStep::Image, "resolving img");
        match cli.recv().unwrap().message {
            StartupEvent::Progress {
                step,
                detail,
                fraction,
            } => {
                assert_eq!(step, StartupStep::Image);
                assert_eq!(detail, "resolving img");
                assert_eq!(fraction, None);
            }
            other => panic!("expected progress, got {other:?}"),
        }
        assert_eq!(reporter.phases.lock().unwrap().len(), 1);
        // The same step again stays in its phase; another step ends it.
        reporter.progress(StartupStep::Image, "prepared");
        reporter.progress(StartupStep::State, "generation 1");
        let phases = reporter.phases.lock().unwrap();
        assert_eq!(phases.len(), 1);
        assert_eq!(phases[0].1.step, StartupStep::State);
    }

    #[test]
    fn each_thread_has_its_own_phase_until_it_finishes_it() {
        let (reporter, _cli) = reporter();
        reporter.progress(StartupStep::Sandbox, "starting");
        std::thread::scope(|scope| {
            scope.spawn(|| {
                reporter.progress(StartupStep::Network, "attaching");
                assert_eq!(reporter.phases.lock().unwrap().len(), 2);
                reporter.finish_phase();
            });
        });
        let phases = reporter.phases.lock().unwrap();
        assert_eq!(phases.len(), 1, "the other thread's phase ended with it");
        assert_eq!(phases[0].1.step, StartupStep::Sandbox);
    }

    #[test]
    fn a_failure_is_reported_with_its_step_kind_and_message() {
        let (reporter, cli) = reporter();
        reporter.progress(StartupStep::Configuration, "loading");
        let _ = cli.recv().unwrap();
        let _ = reporter.fail(invalid(StartupStep::Configuration, "no such profile"));
        match cli.recv().unwrap().message {
            StartupEvent::Failed {
                step,
                kind,
                failure,
            } => {
                assert_eq!(step, StartupStep::Configuration);
                assert_eq!(kind, FailureKind::InvalidConfiguration);
                assert_eq!(failure.to_string(), "no such profile");
            }
            other => panic!("expected the failure, got {other:?}"),
        }
        assert!(reporter.phases.lock().unwrap().is_empty());
    }

    #[test]
    fn the_one_question_gets_the_clis_answer() {
        let (reporter, cli) = reporter();
        let answering = std::thread::spawn(move || {
            let asked = cli.recv().unwrap().message;
            assert!(matches!(asked, StartupEvent::IgnoreChanges(_)), "{asked:?}");
            cli.send(&StartupReply::ShareIgnoreChanges(true), &[])
                .unwrap();
            cli
        });
        assert_eq!(
            reporter.ask(question()),
            Some(StartupReply::ShareIgnoreChanges(true))
        );
        drop(answering.join().unwrap());
    }

    #[test]
    fn a_cli_that_went_away_answers_nothing_and_start_up_goes_on() {
        let (reporter, cli) = reporter();
        drop(cli);
        assert_eq!(reporter.ask(question()), None);
        // Neither reporting nor failing waits or panics without a CLI.
        reporter.progress(StartupStep::Sandbox, "starting");
        reporter.send(StartupEvent::Progress {
            step: StartupStep::Sandbox,
            detail: "still".into(),
            fraction: Some((1, 2)),
        });
        let _ = reporter.fail(invalid(StartupStep::Sandbox, "gone"));
    }
}
