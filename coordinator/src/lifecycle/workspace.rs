//! Routing a generation's workspace: the step between the State Anchor and
//! the Runtime Supervisor, and its end when the supervisor reports the
//! router.
//!
//! Owns the order that makes the routing a participant: the rules are
//! taken from the host (every `.gitignore`, `info/exclude`, the user's
//! excludes, the indexes) and sealed in a memfd, the Domain's isolated
//! directory exists, and the `GitRouting` participant is recorded as
//! intent, all before the supervisor is asked to mount anything; the
//! router's identity is recorded once the supervisor reports it. Trusts
//! the host's git files as data (they may have been edited by an earlier
//! sandbox; they are parsed, never run) and the supervisor's pidfd only
//! after proving it on pidfs.

use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;

use lazaret_proto::channel::Received;
use lazaret_proto::codec;
use lazaret_proto::common::HostPath;
use lazaret_proto::control::{StartupStep, WorkspaceStatus};
use lazaret_proto::ids::Sha256Digest;
use lazaret_proto::ownership::{GitRoutingOwnership, ParticipantOwnership};
use lazaret_proto::router::RoutingSummary;
use lazaret_proto::store::{Generation, ParticipantState};
use lazaret_proto::supervisor::SupervisorReport;
use lazaret_routing::gather::gather;
use lazaret_routing::gitconfig::UserConfig;
use sha2::{Digest, Sha256};

use super::daemon::{
    Failure, Reporter, Supervisor, at, await_report, failure, participant, unexpected,
};
use crate::config::{HostEnvironment, ResolvedDomainConfiguration, RetainedDir};
use crate::process::HeldProcess;
use crate::store::{DomainStore, Slot};

const STEP: StartupStep = StartupStep::Workspace;

/// The Domain's isolated directory, beneath its storage directory.
pub const ISOLATED_DIR: &str = "workspace/isolated";

/// A routing ready to hand to the supervisor.
pub(super) struct Prepared {
    /// The Domain's isolated directory.
    pub(super) isolated: RetainedDir,
    /// The sealed rules.
    pub(super) rules: OwnedFd,
    record: GitRoutingOwnership,
    summary: RoutingSummary,
    status: StatusParts,
}

/// What `status` shows before the router runs.
struct StatusParts {
    isolate_ignored: bool,
    repository: Option<HostPath>,
    workspace_ignored: bool,
    isolated_root: HostPath,
}

/// The routing of a running generation.
pub(super) struct Routed {
    /// The Workspace Router.
    pub(super) router: HeldProcess,
    /// What `status` shows; `router_running` is kept current by the
    /// daemon.
    pub(super) status: WorkspaceStatus,
}

/// Takes the rules, makes the isolated directory and records the intent.
pub(super) fn prepare(
    reporter: &Reporter,
    store: &Arc<DomainStore>,
    generation: &Generation,
    resolved: &ResolvedDomainConfiguration,
    generation_dir: &RetainedDir,
) -> Result<Prepared, Failure> {
    let auth = resolved.authorities();
    let workspace = &auth.workspace;
    let isolate = resolved.record().isolate_gitignored;
    reporter.progress(
        STEP,
        if isolate {
            "reading the git ignore rules"
        } else {
            "git-ignored paths are not isolated (isolate_gitignored = false)"
        },
    );
    let host = HostEnvironment::capture();
    // The files git itself would read, as the environment tells it.
    let user = UserConfig {
        home: host.variable("HOME").map(Into::into),
        xdg_config_home: host.variable("XDG_CONFIG_HOME").map(Into::into),
        global: host.variable("GIT_CONFIG_GLOBAL").map(Into::into),
        system: host.variable("GIT_CONFIG_SYSTEM").map(Into::into),
        no_system: host
            .variable("GIT_CONFIG_NOSYSTEM")
            .is_some_and(|v| !matches!(v.to_str(), Some("" | "0" | "false" | "no" | "off"))),
    };
    let gathered = gather(workspace.fd(), workspace.label(), isolate, &user).map_err(|e| {
        failure(
            STEP,
            format!("cannot route the workspace: {}", super::chain(&e)),
        )
    })?;
    let summary = RoutingSummary::of(&gathered.rules);
    if let Some(repository) = &gathered.repository {
        reporter.progress(
            STEP,
            format!(
                "git repository {}: {} ignore files, {} tracked paths kept despite the rules",
                repository.display(),
                summary.ignore_files,
                summary.tracked_ignored
            ),
        );
    }
    if gathered.workspace_ignored {
        reporter.progress(
            STEP,
            format!(
                "note: the repository at {} ignores this whole workspace, so the sandbox sees \
                 none of its files and keeps what it writes in Domain storage; set \
                 isolate_gitignored = false in the profile to share them",
                gathered
                    .repository
                    .as_deref()
                    .unwrap_or(Path::new("?"))
                    .display()
            ),
        );
    }
    let bytes = codec::encode(&gathered.rules).map_err(|e| {
        failure(
            STEP,
            format!(
                "the workspace's ignore rules are too large to pass on ({}); split large \
                 .gitignore files or set isolate_gitignored = false",
                super::chain(&e)
            ),
        )
    })?;
    let routing_digest = Sha256Digest(Sha256::digest(&bytes).into());
    let rules = lazaret_proto::memfd::sealed_bytes("lazaret-workspace-rules", &bytes)
        .map_err(|e| at(STEP)(&e))?;

    let uid = rustix::process::getuid().as_raw();
    let isolated_path = auth.domain_storage.label().join(ISOLATED_DIR);
    let record = GitRoutingOwnership {
        mountpoint: Some(HostPath::from(
            &generation_dir.label().join("mnt/workspace"),
        )),
        host_root: Some(HostPath::from(workspace.label())),
        isolated_root: Some(HostPath::from(&isolated_path)),
        routing_digest: Some(routing_digest),
        ..GitRoutingOwnership::default()
    };
    store
        .put_participant(
            Slot::GIT_ROUTING,
            &participant(
                generation,
                ParticipantState::Intent,
                ParticipantOwnership::GitRouting(record.clone()),
            ),
        )
        .map_err(|e| at(STEP)(&e))?;
    let isolated = auth
        .domain_storage
        .ensure_child(Path::new(ISOLATED_DIR), uid)
        .map_err(|e| at(STEP)(&e))?;
    let status = StatusParts {
        isolate_ignored: isolate,
        repository: gathered.repository.as_deref().map(HostPath::from),
        workspace_ignored: gathered.workspace_ignored,
        isolated_root: HostPath::from(&isolated_path),
    };
    Ok(Prepared {
        isolated,
        rules,
        record,
        summary,
        status,
    })
}

/// Waits for the supervisor's report of the router and records it.
pub(super) fn await_router(
    supervisor: &Supervisor,
    store: &Arc<DomainStore>,
    generation: &Generation,
    prepared: Prepared,
) -> Result<Routed, Failure> {
    let Received { message, fds } = await_report(supervisor, STEP)?;
    let SupervisorReport::WorkspaceRouted { router, summary } = message else {
        return Err(unexpected(STEP, &message));
    };
    if summary != prepared.summary {
        return Err(failure(
            STEP,
            "the Workspace Router reports other rules than it was given",
        ));
    }
    let pidfd = router
        .pick(fds)
        .ok_or_else(|| failure(STEP, "the supervisor sent no router pidfd"))?;
    let router = HeldProcess::from_pidfd(pidfd).map_err(|e| at(STEP)(&e))?;
    let record = GitRoutingOwnership {
        router: router.committed(),
        ..prepared.record
    };
    store
        .put_participant(
            Slot::GIT_ROUTING,
            &participant(
                generation,
                ParticipantState::Active,
                ParticipantOwnership::GitRouting(record),
            ),
        )
        .map_err(|e| at(STEP)(&e))?;
    let parts = prepared.status;
    let status = WorkspaceStatus {
        isolate_ignored: parts.isolate_ignored,
        repository: parts.repository,
        workspace_ignored: parts.workspace_ignored,
        isolated_root: parts.isolated_root,
        summary,
        router: router.identity,
        router_running: true,
    };
    Ok(Routed { router, status })
}
