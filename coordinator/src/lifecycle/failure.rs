//! A failed start-up step, as the CLI that started the coordinator is told
//! it: the step, whether the configuration or the host is to blame, and
//! what failed.
//!
//! Owns only the record and the ways of making one; every start-up module
//! below the daemon reports its failures with it. Trusts nothing.

use lazaret_proto::control::{FailureKind, StartupStep};

use super::chain;

/// A failed step, reported to the CLI.
#[derive(Debug)]
pub(super) struct Failure {
    pub(super) step: StartupStep,
    pub(super) kind: FailureKind,
    pub(super) message: String,
}

/// `step` failed on the host or in a participant.
pub(super) fn failure(step: StartupStep, message: impl Into<String>) -> Failure {
    Failure {
        step,
        kind: FailureKind::Failed,
        message: message.into(),
    }
}

/// The configuration cannot be used as written; `step` found out.
pub(super) fn invalid(step: StartupStep, message: impl Into<String>) -> Failure {
    Failure {
        step,
        kind: FailureKind::InvalidConfiguration,
        message: message.into(),
    }
}

/// What a failed operation of `step` becomes: its error chain.
pub(super) fn at(step: StartupStep) -> impl Fn(&dyn std::error::Error) -> Failure {
    move |e| failure(step, chain(e))
}

#[cfg(test)]
mod tests {
    use lazaret_proto::control::{FailureKind, StartupStep};

    use super::{at, failure, invalid};

    /// An error with a cause, as the stores and the catalog fail.
    #[derive(Debug, thiserror::Error)]
    #[error("cannot open the Domain Store")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn a_failed_operation_is_a_failure_of_its_step_with_its_whole_chain() {
        let error = Outer(std::io::Error::other("disk full"));
        let failed = at(StartupStep::Ownership)(&error);
        assert_eq!(failed.step, StartupStep::Ownership);
        assert_eq!(failed.kind, FailureKind::Failed);
        assert_eq!(failed.message, "cannot open the Domain Store: disk full");
    }

    #[test]
    fn the_configuration_is_to_blame_only_when_a_step_says_so() {
        let host = failure(StartupStep::Network, "no route");
        assert_eq!(host.kind, FailureKind::Failed);
        let configuration = invalid(StartupStep::Image, "not a reference");
        assert_eq!(configuration.step, StartupStep::Image);
        assert_eq!(configuration.kind, FailureKind::InvalidConfiguration);
        assert_eq!(configuration.message, "not a reference");
    }
}
