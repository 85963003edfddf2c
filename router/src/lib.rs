//! The Workspace Router of one generation: the sandbox's `/workspace`,
//! served over FUSE.
//!
//! The Runtime Supervisor mounts a FUSE filesystem where the sandbox's
//! workspace is staged and starts this process in the Domain user
//! namespace, in a network namespace of its own with no interface, with
//! CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH and CAP_FOWNER alone (over the
//! invoking user's own files only, the one user the namespace maps) and
//! `no_new_privs`. It then, in order:
//! 1. refuses to go on with any other capability;
//! 2. takes its channel from standard input and receives one `Serve`
//!    request with four descriptors: the `/dev/fuse` connection, the host
//!    workspace, the Domain's isolated directory, and the sealed memfd of
//!    the [`WorkspaceRules`] the Host Coordinator took from the host;
//! 3. compiles the rules, reads its own id maps (which owners and groups
//!    it shows as they are: see [`ids`]), answers the kernel's `INIT` on
//!    the connection, and reports `Ready`;
//! 4. serves the connection until it ends (the mount namespace is gone),
//!    then exits.
//!
//! It holds nothing else: no path to the host but the two directories, no
//! network. If it dies, the connection is aborted and every workspace
//! operation in the sandbox fails; nothing falls through to the host.
//! It trusts the supervisor at the other end of its channel, and nothing
//! the sandbox sends beyond the fact that it asked.
//!
//! [`WorkspaceRules`]: lazaret_proto::router::WorkspaceRules

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod fuse;
pub mod ids;
mod nodes;
mod seccomp;
pub mod tree;

use std::os::fd::OwnedFd;
use std::process::ExitCode;

use lazaret_proto::channel::{Endpoint, Received};
use lazaret_proto::codec;
use lazaret_proto::error_chain as chain;
use lazaret_proto::failure::Failure;
use lazaret_proto::memfd;
use lazaret_proto::router::{
    MAX_RULES_LEN, ROUTER_CAPABILITIES, RouterError, RouterReport, RouterRequest, RouterStep,
    RoutingSummary, ServeRequest, WorkspaceRules,
};
use lazaret_routing::classify::Classifier;

type Channel = Endpoint<RouterReport, RouterRequest>;

/// How many threads serve the connection.
const THREADS: usize = 2;

fn failed(step: RouterStep, detail: impl std::fmt::Display) -> RouterError {
    RouterError {
        step,
        failure: Failure::check(detail),
    }
}

/// `error` and its chain as the failure of `step`, after `context`.
fn failed_by(
    step: RouterStep,
    context: &str,
    error: &(dyn std::error::Error + 'static),
) -> RouterError {
    RouterError {
        step,
        failure: Failure::of(error).within(context),
    }
}

/// Runs the router.
pub fn run() -> ExitCode {
    let channel = match Channel::start_role("lazaret-router") {
        Ok(channel) => channel,
        Err(code) => return code,
    };
    let started = start(&channel).and_then(|started| {
        seccomp::install().map_err(|e| failed_by(RouterStep::Privileges, "", &e))?;
        Ok(started)
    });
    let session = match started {
        Ok((session, summary)) => {
            if let Err(e) = channel.send(&RouterReport::Ready(summary), &[]) {
                tracing::error!("cannot report: {}", chain(&e));
                return ExitCode::FAILURE;
            }
            session
        }
        Err(error) => {
            tracing::error!("{:?}: {}", error.step, error.failure);
            let _ = channel.send(&RouterReport::Failed(error), &[]);
            return ExitCode::FAILURE;
        }
    };
    drop(channel);
    match session.run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(
                "serving /workspace failed ({e}); the workspace fails until `lazaret down`"
            );
            ExitCode::FAILURE
        }
    }
}

/// Steps 1 to 3: the served session, initialized.
fn start(channel: &Channel) -> Result<(fuser::Session<fuse::Router>, RoutingSummary), RouterError> {
    lazaret_proto::privilege::require_exactly(
        ROUTER_CAPABILITIES,
        "it must run with CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH and CAP_FOWNER alone, as \
         lazaret-supervisor starts it",
    )
    .map_err(|e| failed_by(RouterStep::Privileges, "", &e))?;
    // Modes are masked by the tree; the process's own mask must not add to it.
    rustix::process::umask(rustix::fs::Mode::empty());
    raise_open_file_limit();

    let Received { message, fds } = channel
        .recv()
        .map_err(|e| failed_by(RouterStep::Request, "", &e))?;
    let RouterRequest::Serve(ServeRequest {
        fuse,
        host,
        isolated,
        rules,
    }) = message;
    let mut fds: Vec<Option<OwnedFd>> = fds.into_iter().map(Some).collect();
    let mut take = |index: lazaret_proto::channel::FdIndex, what: &str| {
        index
            .take(&mut fds)
            .ok_or_else(|| failed(RouterStep::Request, format!("no descriptor for {what}")))
    };
    let fuse = take(fuse, "the FUSE connection")?;
    let host = take(host, "the host workspace")?;
    let isolated = take(isolated, "the isolated directory")?;
    let rules = take(rules, "the rules")?;

    let rules = read_rules(&rules)?;
    let summary = RoutingSummary::of(&rules);
    let tree = tree::Tree::new(host, isolated, Classifier::new(&rules)).map_err(|e| {
        failed_by(
            RouterStep::Request,
            "the host workspace and isolated descriptors must be directories",
            &e,
        )
    })?;
    let ids = ids::Ids::of_this_process().map_err(|e| {
        failed_by(
            RouterStep::Privileges,
            "cannot tell which owners and groups the namespace maps",
            &e,
        )
    })?;
    let mut config = fuser::Config::default();
    config.n_threads = Some(THREADS);
    config.clone_fd = true;
    let session = fuser::Session::from_fd(
        fuse::Router::new(tree, ids),
        fuse,
        fuser::SessionACL::All,
        config,
    )
    .map_err(|e| failed(RouterStep::Connection, e))?;
    Ok((session, summary))
}

/// Decodes and checks the sealed rules.
fn read_rules(fd: &OwnedFd) -> Result<WorkspaceRules, RouterError> {
    let bytes = memfd::read_sealed(std::os::fd::AsFd::as_fd(fd), MAX_RULES_LEN)
        .map_err(|e| failed_by(RouterStep::Rules, "", &e))?;
    let rules: WorkspaceRules =
        codec::decode(&bytes).map_err(|e| failed_by(RouterStep::Rules, "", &e))?;
    if let Some(path) = rules.invalid_path() {
        return Err(failed(
            RouterStep::Rules,
            format!("the rules name a path that is not plain and relative: {path}"),
        ));
    }
    Ok(rules)
}

/// Every file the sandbox holds open in the workspace is a descriptor
/// here: take the hard limit.
fn raise_open_file_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if let Some(hard) = limit.maximum {
        let _ = setrlimit(
            Resource::Nofile,
            rustix::process::Rlimit {
                current: Some(hard),
                maximum: Some(hard),
            },
        );
    }
}
