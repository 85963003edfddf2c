//! A failed start-up step, as the CLI that started the coordinator is told
//! it: the step, whether the configuration or the host is to blame, and
//! what failed, with the errno, path or program output beneath typed.
//!
//! Owns only the record and the ways of making one; every start-up module
//! below the daemon reports its failures with it. Trusts nothing.

use std::error::Error;
use std::fmt;

use lazaret_proto::control::{FailureKind, StartupStep};
use lazaret_proto::failure::Failure as Account;

/// A failed step, reported to the CLI.
#[derive(Debug)]
pub(super) struct Failure {
    pub(super) step: StartupStep,
    pub(super) kind: FailureKind,
    pub(super) account: Account,
}

/// `step` failed on the host or in a participant, as `message` says.
pub(super) fn failure(step: StartupStep, message: impl fmt::Display) -> Failure {
    Failure {
        step,
        kind: FailureKind::Failed,
        account: Account::check(message),
    }
}

/// The configuration cannot be used as written; `step` found out.
pub(super) fn invalid(step: StartupStep, message: impl fmt::Display) -> Failure {
    Failure {
        step,
        kind: FailureKind::InvalidConfiguration,
        account: Account::check(message),
    }
}

/// `step` failed as `account` says: a participant's own report, or an
/// error with the coordinator's words around it.
pub(super) fn reported(step: StartupStep, account: Account) -> Failure {
    Failure {
        step,
        kind: FailureKind::Failed,
        account,
    }
}

impl Failure {
    /// This failure as the cause of `outer`: `outer` comes first in the
    /// sentence; the step, kind and typed cause stay.
    pub(super) fn within(self, outer: impl fmt::Display) -> Self {
        Self {
            account: self.account.within(outer),
            ..self
        }
    }
}

/// What a failed operation of `step` becomes: its error chain, the errno
/// beneath it typed.
pub(super) fn at(step: StartupStep) -> impl Fn(&(dyn Error + 'static)) -> Failure {
    move |e| Failure {
        step,
        kind: FailureKind::Failed,
        account: Account::of(e),
    }
}

/// As [`at`], for an error of the configuration: the user edits it.
pub(super) fn invalid_at(step: StartupStep) -> impl Fn(&(dyn Error + 'static)) -> Failure {
    move |e| Failure {
        step,
        kind: FailureKind::InvalidConfiguration,
        account: Account::of(e),
    }
}

#[cfg(test)]
mod tests {
    use lazaret_proto::control::{FailureKind, StartupStep};
    use lazaret_proto::failure::{Errno, FailureCause};

    use super::{at, failure, invalid, invalid_at};

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
        assert_eq!(
            failed.account.to_string(),
            "cannot open the Domain Store: disk full"
        );
    }

    #[test]
    fn the_errno_beneath_a_failed_operation_is_typed() {
        let error = Outer(std::io::Error::from_raw_os_error(28));
        let failed = at(StartupStep::State)(&error);
        assert_eq!(failed.account.context, "cannot open the Domain Store");
        assert_eq!(
            failed.account.cause,
            FailureCause::Os {
                errno: Errno(28),
                path: None
            }
        );
        let configuration = invalid_at(StartupStep::Image)(&error);
        assert_eq!(configuration.kind, FailureKind::InvalidConfiguration);
        assert_eq!(configuration.account, failed.account);
    }

    #[test]
    fn the_configuration_is_to_blame_only_when_a_step_says_so() {
        let host = failure(StartupStep::Network, "no route");
        assert_eq!(host.kind, FailureKind::Failed);
        let configuration = invalid(StartupStep::Image, "not a reference");
        assert_eq!(configuration.step, StartupStep::Image);
        assert_eq!(configuration.kind, FailureKind::InvalidConfiguration);
        assert_eq!(configuration.account.to_string(), "not a reference");
        assert_eq!(configuration.account.cause, FailureCause::Check);
    }
}
