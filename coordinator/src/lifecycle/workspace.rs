//! Routing a generation's workspace: the step between the State Anchor and
//! the Runtime Supervisor, and its end when the supervisor reports the
//! router.
//!
//! Owns the order that makes the routing a participant: the rules are
//! taken from the host (every `.gitignore`, `info/exclude`, the user's
//! excludes, the indexes) and sealed in a memfd, the Domain's isolated
//! directory exists, and the `GitRouting` participant is recorded as
//! intent, all before the supervisor is asked to mount anything; the
//! router's identity is recorded once the supervisor reports it.
//!
//! Owns too what happens to host paths the Domain's last generation
//! isolated that the rules taken now would share (a `.gitignore` the
//! sandbox edited, a path it added to the index): they stay isolated for
//! this generation unless the developer agrees, asked through the CLI, or
//! ran `up --accept-ignore-changes`; the rules this generation routes by
//! are recorded with its routing's intent for the next `up` to compare
//! with. Trusts the host's git files as data (they may have been edited
//! by an earlier sandbox; they are parsed, never run), the Domain Store,
//! the CLI's answer as the developer's, and the supervisor's pidfd only
//! after proving it on pidfs.

use std::os::fd::OwnedFd;
use std::path::Path;

use lazaret_proto::channel::Received;
use lazaret_proto::codec::{self, EncodeError};
use lazaret_proto::common::HostPath;
use lazaret_proto::control::{
    IgnoreChanges, IgnoreChangesOutcome, StartupEvent, StartupReply, StartupStep, WorkspaceStatus,
    named_paths,
};
use lazaret_proto::ids::Sha256Digest;
use lazaret_proto::ownership::{GitRoutingOwnership, ParticipantOwnership};
use lazaret_proto::router::{RelativePath, RoutingSummary, WorkspaceRules};
use lazaret_proto::store::ParticipantState;
use lazaret_proto::supervisor::SupervisorReport;
use lazaret_routing::gather::gather;
use lazaret_routing::gitconfig::UserConfig;
use lazaret_routing::watch::Watch;
use lazaret_storage::store::{DomainStore, Slot};
use sha2::{Digest, Sha256};

use super::context::IgnoreChangesMode;
use super::failure::{Failure, at, failure};
use super::record::{Became, Intent};
use super::report::Reporter;
use super::supervisor::unexpected;
use crate::config::{HostEnvironment, ResolvedDomainConfiguration, RetainedDir};
use crate::process::HeldProcess;

const STEP: StartupStep = StartupStep::Workspace;

/// The Domain's isolated directory, beneath its storage directory.
pub const ISOLATED_DIR: &str = "workspace/isolated";

/// The generation's rules, taken from the host and sealed.
pub(super) struct Rules {
    /// The sealed memfd of the encoded rules.
    memfd: OwnedFd,
    /// SHA-256 of the encoding, recorded with the participant.
    digest: Sha256Digest,
    /// The encoding, recorded with the participant's intent for the next
    /// `up` to compare with.
    encoded: Vec<u8>,
    /// The host paths kept isolated against the rules.
    kept: Vec<RelativePath>,
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
    encoded: Vec<u8>,
    kept: Vec<RelativePath>,
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
/// `up` at once. Host paths that the rules the last generation routed by
/// (in `store`) isolated and these would share are kept isolated, or
/// shared, as `mode` says.
pub(super) fn take_rules(
    reporter: &Reporter,
    resolved: &ResolvedDomainConfiguration,
    store: &DomainStore,
    mode: IgnoreChangesMode,
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
    let earlier = earlier_rules(reporter, resolved, store, mode)?;
    let mut gathered = gather(
        workspace.fd(),
        workspace.label(),
        isolate,
        &user,
        earlier.as_ref(),
    )
    .map_err(|e| {
        failure(
            STEP,
            format!(
                "cannot take the git rules of the workspace {}: {}",
                workspace.label().display(),
                super::chain(&e)
            ),
        )
    })?;
    let newly_shared = std::mem::take(&mut gathered.newly_shared);
    if !newly_shared.is_empty() && !share(reporter, &newly_shared, mode) {
        gathered.rules.kept_isolated = newly_shared;
    }
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
        kept: gathered.rules.kept_isolated,
        encoded: bytes,
        summary,
        repository: gathered
            .repository
            .map(|r| (HostPath::from(&r), gathered.workspace_ignored)),
        watch,
    })
}

/// The rules the Domain's last generation routed by, to compare the new
/// ones with; `None` before the first generation that recorded them, and
/// with `--accept-ignore-changes` when they cannot be read. Rules that
/// cannot be read otherwise stop `up`: without them, what the last
/// generation kept from the sandbox is unknown.
fn earlier_rules(
    reporter: &Reporter,
    resolved: &ResolvedDomainConfiguration,
    store: &DomainStore,
    mode: IgnoreChangesMode,
) -> Result<Option<WorkspaceRules>, Failure> {
    match store.last_workspace_rules() {
        Ok(found) => Ok(found.map(|(_, rules)| rules)),
        Err(e) if mode == IgnoreChangesMode::Accept => {
            reporter.progress(
                STEP,
                format!(
                    "cannot read the workspace rules the last generation routed by ({}); \
                     taking the rules as they are now, as --accept-ignore-changes says",
                    super::chain(&e)
                ),
            );
            Ok(None)
        }
        Err(e) => Err(failure(
            STEP,
            format!(
                "cannot read the workspace rules the last generation routed by ({}), so Lazaret \
                 cannot tell which host paths it kept from the sandbox; `lazaret up {} \
                 --accept-ignore-changes` takes the workspace's rules as they are now",
                super::chain(&e),
                resolved.profile()
            ),
        )),
    }
}

/// Whether the host paths the last generation isolated that the new rules
/// would share (`newly_shared`) are shared in this generation: as `mode`
/// says, the developer asked through the CLI when it may ask. Says what
/// becomes of them either way.
fn share(reporter: &Reporter, newly_shared: &[RelativePath], mode: IgnoreChangesMode) -> bool {
    let changes = |outcome| {
        StartupEvent::IgnoreChanges(IgnoreChanges {
            paths: named_paths(newly_shared),
            count: u64::try_from(newly_shared.len()).unwrap_or(u64::MAX),
            outcome,
        })
    };
    let accepted = match mode {
        IgnoreChangesMode::Accept => true,
        IgnoreChangesMode::Keep => false,
        IgnoreChangesMode::Ask => {
            tracing::info!(
                "asking whether to share {} host paths the last generation kept from the sandbox",
                newly_shared.len()
            );
            // No answer (the CLI gone, Ctrl-C) keeps them isolated.
            reporter.ask(changes(IgnoreChangesOutcome::Asking))
                == Some(StartupReply::ShareIgnoreChanges(true))
        }
    };
    let shown: Vec<String> = newly_shared
        .iter()
        .take(20)
        .map(|p| p.to_string())
        .collect();
    if accepted {
        tracing::warn!(
            "sharing {} host paths the last generation kept from the sandbox, as the developer \
             accepted: {}",
            newly_shared.len(),
            shown.join(", ")
        );
        reporter.send(changes(IgnoreChangesOutcome::Accepted));
    } else {
        tracing::warn!(
            "keeping {} host paths isolated that the workspace's rules now share: {}",
            newly_shared.len(),
            shown.join(", ")
        );
        reporter.send(changes(IgnoreChangesOutcome::Kept));
    }
    accepted
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
        encoded: rules.encoded,
        kept: rules.kept,
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

    /// The encoded rules, to record with the intent: what the next `up`
    /// compares the rules it takes with.
    pub(super) fn encoded_rules(&self) -> &[u8] {
        &self.encoded
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
        kept_isolated: named_paths(&prepared.kept),
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
