//! The supervisor's failures as it reports them to the Host Coordinator:
//! its own errors turned into the typed [`SupervisorError`] record, the
//! errno, the path and a child's output kept as fields.
//!
//! This module owns that conversion and nothing else; it trusts the errors
//! of its own modules, and carries the failures its helpers (sidecar,
//! router, resolver) reported as they reported them.

use std::error::Error;

use lazaret_proto::common::HostPath;
use lazaret_proto::failure::{Failure, FailureCause, Link, ProgramOutput};
use lazaret_proto::supervisor::{SupervisorError, SupervisorStep};

use crate::bundle::BundleError;
use crate::helper::HelperError;
use crate::mounts::MountError;
use crate::namespaces::NamespaceError;
use crate::network::NetworkError;
use crate::runsc::RunscError;
use crate::workspace::WorkspaceError;

/// A failure of the supervisor's own check at `step`.
pub(crate) fn failed(step: SupervisorStep, detail: impl std::fmt::Display) -> SupervisorError {
    SupervisorError {
        step,
        failure: Failure::check(detail),
    }
}

/// `error`, a failure at `step`, as the record reports it.
pub(crate) fn reported(step: SupervisorStep, error: &(dyn Error + 'static)) -> SupervisorError {
    SupervisorError {
        step,
        failure: failure_of(error),
    }
}

/// `error` and its chain as a typed failure.
pub(crate) fn failure_of(error: &(dyn Error + 'static)) -> Failure {
    Failure::classified(error, classify)
}

/// What one link of a supervisor error's chain says beyond its sentence.
fn classify(link: &(dyn Error + 'static)) -> Link {
    if let Some(error) = link.downcast_ref::<MountError>() {
        return match error {
            MountError::Mount { target: path, .. } | MountError::Create { path, .. } => {
                Link::About(HostPath::from(path.as_str()))
            }
            _ => Link::Text,
        };
    }
    if let Some(NamespaceError::Map { file, .. } | NamespaceError::Identify { file, .. }) =
        link.downcast_ref::<NamespaceError>()
    {
        return Link::About(HostPath::from(*file));
    }
    if let Some(BundleError::Write { path, .. }) = link.downcast_ref::<BundleError>() {
        return Link::About(HostPath::from(path));
    }
    if let Some(error) = link.downcast_ref::<RunscError>() {
        return match error {
            RunscError::Spawn { runsc: path, .. } | RunscError::Log { root: path, .. } => {
                Link::About(HostPath::from(path.as_str()))
            }
            RunscError::Failed { operation, stderr } => Link::Ends(Failure {
                context: format!("`runsc {operation}` failed"),
                cause: FailureCause::Program {
                    program: "runsc".into(),
                    output: ProgramOutput::tail(stderr),
                },
            }),
        };
    }
    if let Some(error) = link.downcast_ref::<NetworkError>() {
        return match error {
            NetworkError::Helper(helper) => helper_link(helper),
            NetworkError::Sidecar { step, failure } => {
                Link::Ends(failure.clone().within(format!("{step:?}")))
            }
            NetworkError::Resolver(error) => Link::Ends(
                error
                    .failure
                    .clone()
                    .within(format!("Lazaret's resolver: {:?}", error.step)),
            ),
            NetworkError::Proxy(error) => Link::Ends(
                error
                    .failure
                    .clone()
                    .within(format!("the Credential Proxy: {:?}", error.step)),
            ),
            NetworkError::Mismatched { .. } | NetworkError::ProxySocket { .. } => Link::Text,
        };
    }
    if let Some(error) = link.downcast_ref::<WorkspaceError>() {
        return match error {
            WorkspaceError::Helper(helper) => helper_link(helper),
            WorkspaceError::Router { step, failure } => Link::Ends(
                failure
                    .clone()
                    .within(format!("the router failed ({step:?})")),
            ),
            _ => Link::Text,
        };
    }
    match link.downcast_ref::<HelperError>() {
        Some(helper) => helper_link(helper),
        None => Link::Text,
    }
}

/// A helper's failure to start, reach or hear it; a link that wraps one
/// transparently shows the helper's words and chain.
fn helper_link(error: &HelperError) -> Link {
    match error {
        HelperError::Spawn { binary, source } => {
            Link::Ends(Failure::os(error, source, Some(HostPath::from(binary))))
        }
        _ => Link::Text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lazaret_proto::error_chain;
    use lazaret_proto::failure::Errno;

    #[test]
    fn a_mount_error_keeps_its_errno_and_path() {
        let error = MountError::Mount {
            what: "the workspace".into(),
            target: "/run/stage/workspace".into(),
            source: std::io::Error::from_raw_os_error(13),
        };
        let reported = reported(SupervisorStep::Mounts, &error);
        assert_eq!(reported.step, SupervisorStep::Mounts);
        assert_eq!(
            reported.failure.cause,
            FailureCause::Os {
                errno: Errno(13),
                path: Some(HostPath::from("/run/stage/workspace")),
            }
        );
        assert_eq!(reported.to_string(), error_chain(&error));
    }

    #[test]
    fn a_bundle_write_keeps_the_file_beneath_the_step() {
        let error = BundleError::Write {
            path: "/run/g/bundle/config.json".into(),
            source: std::io::Error::from_raw_os_error(28),
        };
        let failure = failure_of(&error);
        assert_eq!(failure.errno(), Some(Errno(28)));
        assert!(matches!(
            failure.cause,
            FailureCause::Os { path: Some(ref p), .. } if p.as_bytes() == b"/run/g/bundle/config.json"
        ));
        assert_eq!(failure.to_string(), error_chain(&error));
    }

    #[test]
    fn runscs_failure_is_a_programs_with_its_output() {
        let error = RunscError::Failed {
            operation: "create".into(),
            stderr: "creating container: permission denied".into(),
        };
        let failure = failure_of(&error);
        assert_eq!(
            failure.cause,
            FailureCause::Program {
                program: "runsc".into(),
                output: ProgramOutput::tail("creating container: permission denied"),
            }
        );
        assert_eq!(failure.to_string(), error_chain(&error));
    }

    #[test]
    fn a_relayed_sidecar_failure_keeps_its_cause_and_reads_as_before() {
        let sidecar = Failure::os(
            "cannot write /proc/sys/net/ipv6/conf/lo/disable_ipv6",
            Errno(30),
            Some(HostPath::from("/proc/sys/net/ipv6/conf/lo/disable_ipv6")),
        );
        let error = NetworkError::Sidecar {
            step: lazaret_proto::sidecar::SidecarStep::Ipv6,
            failure: sidecar.clone(),
        };
        let reported = reported(SupervisorStep::Network, &error);
        assert_eq!(reported.failure.cause, sidecar.cause);
        assert_eq!(reported.to_string(), error_chain(&error));
        assert!(reported.to_string().starts_with("Ipv6: cannot write "));
    }

    #[test]
    fn a_check_is_its_sentence_alone() {
        let error = failed(SupervisorStep::Request, "the sandbox is already started");
        assert_eq!(error.failure.cause, FailureCause::Check);
        assert_eq!(error.to_string(), "the sandbox is already started");
    }
}
