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

use lazaret_proto::channel::Received;
use lazaret_proto::codec::{self, EncodeError};
use lazaret_proto::common::HostPath;
use lazaret_proto::control::{StartupStep, WorkspaceStatus};
use lazaret_proto::ids::Sha256Digest;
use lazaret_proto::ownership::{GitRoutingOwnership, ParticipantOwnership};
use lazaret_proto::router::RoutingSummary;
use lazaret_proto::store::ParticipantState;
use lazaret_proto::supervisor::SupervisorReport;
use lazaret_routing::gather::gather;
use lazaret_routing::gitconfig::UserConfig;
use lazaret_routing::watch::Watch;
use sha2::{Digest, Sha256};

use super::daemon::{Failure, Reporter, at, failure};
use super::record::{Became, Intent};
use super::supervisor::unexpected;
use crate::config::{HostEnvironment, ResolvedDomainConfiguration, RetainedDir};
use crate::process::HeldProcess;
use crate::store::Slot;

const STEP: StartupStep = StartupStep::Workspace;

/// The Domain's isolated directory, beneath its storage directory.
pub const ISOLATED_DIR: &str = "workspace/isolated";

/// The generation's rules, taken from the host and sealed.
pub(super) struct Rules {
    /// The sealed memfd of the encoded rules.
    memfd: OwnedFd,
    /// SHA-256 of the encoding, recorded with the participant.
    digest: Sha256Digest,
    summary: RoutingSummary,
    /// The repository the workspace is (or is in), and whether it ignores
    /// the whole workspace.
    repository: Option<(HostPath, bool)>,
    /// What the directories holding scripts git runs held when the rules
    /// were taken.
    watch: Watch,
}

/// A routing ready to hand to the supervisor.
pub(super) struct Prepared {
    /// The Domain's isolated directory.
    pub(super) isolated: RetainedDir,
    /// The sealed rules.
    pub(super) rules: OwnedFd,
    record: GitRoutingOwnership,
    summary: RoutingSummary,
    repository: Option<(HostPath, bool)>,
    watch: Watch,
}

/// The routing of a running generation.
pub(super) struct Routed {
    /// The Workspace Router.
    pub(super) router: HeldProcess,
    /// What `status` shows; `router_running` is kept current by the
    /// daemon.
    pub(super) status: WorkspaceStatus,
    /// What `down` compares the directories holding scripts git runs
    /// against.
    pub(super) watch: Watch,
}

/// Takes the rules from the host and seals them: before anything of the
/// generation starts, so that a workspace that cannot be routed stops
/// `up` at once.
pub(super) fn take_rules(
    reporter: &Reporter,
    resolved: &ResolvedDomainConfiguration,
) -> Result<Rules, Failure> {
    let workspace = &resolved.authorities().workspace;
    let isolate = resolved.record().isolate_gitignored;
    reporter.progress(
        STEP,
        if isolate {
            "reading the git ignore rules"
        } else {
            "git-ignored paths are not isolated (isolate_gitignored = false)"
        },
    );
    // The files git itself would read, as the environment tells it.
    let host = HostEnvironment::capture();
    let user = UserConfig::from_env(host.home().ok(), |name| host.variable(name));
    let gathered = gather(workspace.fd(), workspace.label(), isolate, &user).map_err(|e| {
        failure(
            STEP,
            format!(
                "cannot take the git rules of the workspace {}: {}",
                workspace.label().display(),
                super::chain(&e)
            ),
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
        if gathered.workspace_ignored {
            reporter.progress(
                STEP,
                format!(
                    "note: the repository at {} ignores this whole workspace, so the sandbox \
                     sees none of its files and keeps what it writes in Domain storage; set \
                     isolate_gitignored = false in the profile to share them",
                    repository.display()
                ),
            );
        }
    }
    let bytes = codec::encode(&gathered.rules).map_err(|e| {
        let detail = match e {
            EncodeError::Oversize { len, max, .. } => format!(
                "the workspace's git rules take {len} bytes encoded, more than the {max} the \
                 Workspace Router takes ({} ignore files, {} tracked paths the rules ignore); \
                 set isolate_gitignored = false in the profile",
                summary.ignore_files, summary.tracked_ignored
            ),
            other => format!("cannot encode the workspace's git rules: {other}"),
        };
        failure(STEP, detail)
    })?;
    let memfd = lazaret_proto::memfd::sealed_bytes("lazaret-workspace-rules", &bytes)
        .map_err(|e| at(STEP)(&e))?;
    // What the sandbox could change where git runs scripts from, as it
    // is before the sandbox exists.
    let watch = Watch::take(workspace.fd(), &gathered.rules, &gathered.watched);
    Ok(Rules {
        memfd,
        digest: Sha256Digest(Sha256::digest(&bytes).into()),
        summary,
        repository: gathered
            .repository
            .map(|r| (HostPath::from(&r), gathered.workspace_ignored)),
        watch,
    })
}

/// Makes the isolated directory, with `rules`; what [`Prepared::intent`]
/// records before the plan is sent.
pub(super) fn prepare(
    resolved: &ResolvedDomainConfiguration,
    generation_dir: &RetainedDir,
    rules: Rules,
    uid: u32,
) -> Result<Prepared, Failure> {
    let auth = resolved.authorities();
    let isolated_path = auth.domain_storage.label().join(ISOLATED_DIR);
    let record = GitRoutingOwnership {
        mountpoint: Some(HostPath::from(
            &generation_dir.label().join("mnt/workspace"),
        )),
        host_root: Some(HostPath::from(auth.workspace.label())),
        isolated_root: Some(HostPath::from(&isolated_path)),
        routing_digest: Some(rules.digest),
        ..GitRoutingOwnership::default()
    };
    let isolated = auth
        .domain_storage
        .ensure_child(Path::new(ISOLATED_DIR), uid)
        .map_err(|e| at(STEP)(&e))?;
    Ok(Prepared {
        isolated,
        rules: rules.memfd,
        record,
        summary: rules.summary,
        repository: rules.repository,
        watch: rules.watch,
    })
}

impl Prepared {
    /// The routing participant's intent, to commit before the plan that
    /// mounts the workspace is sent.
    pub(super) fn intent(&self) -> (Slot, ParticipantOwnership) {
        (
            Slot::GIT_ROUTING,
            ParticipantOwnership::GitRouting(self.record.clone()),
        )
    }
}

/// Takes the supervisor's report of the router (`WorkspaceRouted`): the
/// routing `intent` became what it reports, for the caller to record.
pub(super) fn routed(
    resolved: &ResolvedDomainConfiguration,
    prepared: Prepared,
    intent: Intent,
    report: Received<SupervisorReport>,
) -> Result<(Routed, Became), Failure> {
    let Received { message, fds } = report;
    let SupervisorReport::WorkspaceRouted { router, summary } = message else {
        return Err(unexpected(STEP, &message));
    };
    if summary != prepared.summary {
        return Err(failure(
            STEP,
            format!(
                "the Workspace Router reports other rules ({summary:?}) than it was given \
                 ({:?}); lazaret-router and lazaret are from different builds: reinstall \
                 Lazaret",
                prepared.summary
            ),
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
    let became = intent.becoming(
        ParticipantState::Active,
        ParticipantOwnership::GitRouting(record.clone()),
    );
    let (repository, workspace_ignored) = prepared
        .repository
        .map_or((None, false), |(path, ignored)| (Some(path), ignored));
    let status = WorkspaceStatus {
        isolate_ignored: resolved.record().isolate_gitignored,
        repository,
        workspace_ignored,
        isolated_root: record.isolated_root.unwrap_or_default(),
        summary,
        router: router.identity,
        router_running: true,
    };
    let watch = prepared.watch;
    Ok((
        Routed {
            router,
            status,
            watch,
        },
        became,
    ))
}
