//! Start-up work run on a thread of its own beside the main line of
//! bring-up, in the same span.
//!
//! Owns the join: work that panicked fails its step, naming what it was,
//! and its phase ends when it is done. Trusts the work it runs.

use lazaret_proto::control::StartupStep;

use super::failure::{Failure, failure};
use super::report::Reporter;

/// Runs `side` on a thread of its own, in this thread's span, while `main`
/// runs here, and returns both results once both are done. A `side` that
/// panics fails `step`, naming `what`.
pub(super) fn side_by_side<A, B: Send>(
    reporter: &Reporter,
    step: (StartupStep, &'static str),
    side: impl FnOnce() -> Result<B, Failure> + Send,
    main: impl FnOnce() -> A,
) -> (A, Result<B, Failure>) {
    std::thread::scope(|scope| {
        let there = beside(scope, reporter, step, side);
        let here = main();
        (here, there.join())
    })
}

/// Work started on a thread of a scope by [`beside`].
pub(super) struct Beside<'scope, B> {
    thread: std::thread::ScopedJoinHandle<'scope, Result<B, Failure>>,
    step: StartupStep,
    what: &'static str,
}

impl<B> Beside<'_, B> {
    /// Waits for the work's result. Work that panicked fails its step,
    /// naming what it was.
    pub(super) fn join(self) -> Result<B, Failure> {
        self.thread.join().unwrap_or_else(|_| {
            Err(failure(
                self.step,
                format!(
                    "{} failed unexpectedly (its thread panicked); see the Domain log",
                    self.what
                ),
            ))
        })
    }
}

/// Starts `side` on a thread of `scope`, in this thread's span, its phase
/// ended when it is done.
pub(super) fn beside<'scope, B: Send + 'scope>(
    scope: &'scope std::thread::Scope<'scope, '_>,
    reporter: &'scope Reporter,
    (step, what): (StartupStep, &'static str),
    side: impl FnOnce() -> Result<B, Failure> + Send + 'scope,
) -> Beside<'scope, B> {
    let span = tracing::Span::current();
    let thread = scope.spawn(move || {
        let _span = span.enter();
        let done = side();
        reporter.finish_phase();
        done
    });
    Beside { thread, step, what }
}

#[cfg(test)]
mod tests {
    use lazaret_proto::channel::pair;
    use lazaret_proto::control::{StartupEvent, StartupReply, StartupStep};

    use super::side_by_side;
    use crate::lifecycle::failure::failure;
    use crate::lifecycle::report::Reporter;

    fn reporter() -> (
        Reporter,
        lazaret_proto::channel::Endpoint<StartupReply, StartupEvent>,
    ) {
        let (ours, theirs) = pair::<StartupEvent, StartupReply>().unwrap();
        (Reporter::new(ours), theirs)
    }

    #[test]
    fn both_lines_run_at_once_and_both_results_come_back() {
        let (reporter, _cli) = reporter();
        let (went, came) = std::sync::mpsc::channel();
        let (here, there) = side_by_side(
            &reporter,
            (StartupStep::Network, "attaching the network"),
            move || {
                // Waits for the main line: they run at the same time.
                came.recv_timeout(std::time::Duration::from_secs(10))
                    .map_err(|_| failure(StartupStep::Network, "the main line never ran"))?;
                Ok(7)
            },
            || {
                went.send(()).unwrap();
                "here"
            },
        );
        assert_eq!(here, "here");
        assert_eq!(there.unwrap(), 7);
    }

    #[test]
    fn the_sides_failure_is_its_own_and_its_phase_ends_with_it() {
        let (reporter, _cli) = reporter();
        let (_, there) = side_by_side(
            &reporter,
            (StartupStep::Network, "attaching the network"),
            || -> Result<(), _> {
                reporter.progress(StartupStep::Network, "attaching");
                Err(failure(StartupStep::Network, "no slirp4netns"))
            },
            || (),
        );
        let failed = there.unwrap_err();
        assert_eq!(failed.step, StartupStep::Network);
        assert_eq!(failed.account.to_string(), "no slirp4netns");
        assert_eq!(reporter.phases_in_progress(), 0);
    }

    #[test]
    fn a_side_that_panics_fails_its_step_naming_what_it_was() {
        let (reporter, _cli) = reporter();
        let (_, there) = side_by_side(
            &reporter,
            (StartupStep::Workspace, "taking the workspace's git rules"),
            || -> Result<(), _> { panic!("a bug") },
            || (),
        );
        let failed = there.unwrap_err();
        assert_eq!(failed.step, StartupStep::Workspace);
        assert!(
            failed
                .account
                .to_string()
                .contains("taking the workspace's git rules failed unexpectedly"),
            "{}",
            failed.account.to_string()
        );
    }
}
