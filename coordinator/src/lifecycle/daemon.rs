//! The Host Coordinator daemon: one per running Domain.
//!
//! `start`, in order (docs/roles/coordinator.md):
//! 1. take the startup channel from standard input and leave the CLI's
//!    session;
//! 2. load the configuration (the one load of this generation);
//! 3. take Domain ownership with a non-blocking `flock`; if another
//!    coordinator holds it, ask that one for its status and report it;
//! 4. log to the Domain's log file; open the Domain Store and the Storage
//!    Catalog; finish a stale generation if the store records one;
//! 5. record a new generation with the intents of its first participants,
//!    then for each participant record intent before creating it: the
//!    Runtime Supervisor (which builds the namespaces while the rest is
//!    prepared, and starts runsc), the prepared-lower lease, the State
//!    Anchor directories, the network, the workspace routing (its rules
//!    taken from the host), the sandbox, and the control and session
//!    sockets;
//! 6. report the running Domain and serve `status` and `down` until told to
//!    stop or until the supervisor dies; then release the generation.
//!
//! A stale generation found at step 1 is finished from its records first;
//! `lazaret down` finishes one without a coordinator (`crate::state`).
//!
//! It runs as the invoking user with no capabilities and no namespaces of
//! its own. It trusts the CLI that started it only to name the profile and
//! workspace, and a control peer only after checking its uid.

use std::ffi::OsString;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lazaret_proto::channel::Endpoint;
use lazaret_proto::common::{HostPath, UnixTimeNs};
use lazaret_proto::config::ConfigurationRecord;
use lazaret_proto::control::{
    ControlRequest, ControlResponse, DomainStatus, FailureKind, NetworkStatus, StartupEvent,
    StartupReply, StartupStep, WorkspaceStatus,
};
use lazaret_proto::ids::{ContainerId, GenerationId, GenerationNonce};
use lazaret_proto::ownership::{
    HelperOwnership, ParticipantOwnership, PreparedLowerOwnership, PublicationOwnership,
    SandboxOwnership, StateAnchorOwnership,
};
use lazaret_proto::store::{Domain, Generation, GenerationState, ParticipantState};
use lazaret_proto::trust::{GenerationIdentity, ProtocolCredential, TrustManifest};

use super::record::{Became, Intent, Recorder};
use super::recovery::{finish_stale, release_generation};
use super::supervisor::{PlanInputs, Supervisor};
use super::{DomainPaths, chain};
use crate::catalog::{PreparedLower, StorageCatalog};
use crate::config::{self, HostEnvironment, LoadRequest, ResolvedDomainConfiguration, RetainedDir};
use crate::image::parse_reference;
use crate::network::{ConnectivityHelper, PlannedNetwork};
use crate::process::HeldProcess;
use crate::session;
use crate::session::hub::Hub;
use crate::session::tls::{GenerationCredentials, remove_client_credential};
use crate::state::{UPPER_DIR, WORK_DIR, anchor_dir};
use crate::store::{DomainStore, Slot};

type Startup = Endpoint<StartupEvent, StartupReply>;

/// How long a second `up` waits for a starting coordinator to publish.
const PUBLISH_WAIT: Duration = Duration::from_secs(120);

/// The arguments of `lazaret-coordinator start`.
#[derive(Debug)]
pub struct Args {
    /// The profile.
    pub profile: String,
    /// `--config`, if given.
    pub config: Option<OsString>,
    /// The workspace (absolute).
    pub workspace: PathBuf,
    /// What to do with host paths the last generation kept from the
    /// sandbox that the rules taken now would share.
    pub ignore_changes: IgnoreChangesMode,
}

/// What `up` does with host paths the Domain's last generation isolated
/// that the workspace's rules now share (`--ignore-changes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum IgnoreChangesMode {
    /// Ask the developer through the CLI (which has a terminal); keep
    /// them isolated unless the answer is yes.
    Ask,
    /// Keep them isolated for this generation, and say so.
    Keep,
    /// Share them, as `lazaret up --accept-ignore-changes` says.
    Accept,
}

/// A failed step, reported to the CLI.
#[derive(Debug)]
pub(super) struct Failure {
    pub(super) step: StartupStep,
    kind: FailureKind,
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

pub(super) fn at(step: StartupStep) -> impl Fn(&dyn std::error::Error) -> Failure {
    move |e| failure(step, chain(e))
}

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
    fn take_stdin() -> Result<Self, ExitCode> {
        Startup::take_stdin()
            .map(|startup| Reporter {
                startup,
                phases: std::sync::Mutex::new(Vec::new()),
            })
            .map_err(|e| {
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

    fn fail(&self, failure: Failure) -> ExitCode {
        tracing::error!("{} failed: {}", failure.step.as_str(), failure.message);
        self.finish_phase();
        self.send(StartupEvent::Failed {
            step: failure.step,
            kind: failure.kind,
            message: failure.message,
        });
        ExitCode::FAILURE
    }
}

/// Loads the configuration for `args`.
fn load(args: &Args) -> Result<ResolvedDomainConfiguration, Failure> {
    let host = HostEnvironment::capture();
    config::load(LoadRequest {
        profile: &args.profile,
        config: args.config.as_deref(),
        workspace: &args.workspace,
        host: &host,
    })
    .map_err(|e| {
        invalid(
            StartupStep::Configuration,
            format!("invalid configuration: {}", chain(&e)),
        )
    })
}

/// Takes the Domain's lock without blocking; `None` when another process
/// holds it.
fn try_lock(runtime: &RetainedDir) -> Result<Option<OwnedFd>, Failure> {
    super::try_lock(runtime).map_err(|e| {
        failure(
            StartupStep::Ownership,
            format!("cannot lock the Domain: {e}"),
        )
    })
}

/// Sends standard output and error to the Domain log, kept to its size
/// ([`super::logfile`]).
fn redirect_to_log(runtime: &RetainedDir) -> Result<(), Failure> {
    let log =
        super::logfile::LogFile::open(runtime.fd(), super::logfile::FILE_LIMIT).map_err(|e| {
            failure(
                StartupStep::Ownership,
                format!("cannot open the Domain log: {e}"),
            )
        })?;
    super::logfile::install(log);
    Ok(())
}

/// The stores of a Domain whose ownership this process holds.
pub(super) struct Owned {
    pub(super) store: Arc<DomainStore>,
    pub(super) catalog: StorageCatalog,
}

fn open_stores(resolved: &ResolvedDomainConfiguration) -> Result<Owned, Failure> {
    let auth = resolved.authorities();
    let domain = Domain {
        domain_id: resolved.domain_id(),
        profile_name: resolved.profile().as_str().to_owned(),
        canonical_workspace: HostPath::from(auth.workspace.label()),
    };
    let store = DomainStore::open(&auth.domain_storage, &domain)
        .map_err(|e| at(StartupStep::Ownership)(&e))?;
    let catalog = StorageCatalog::open(&auth.storage_root, rustix::process::getuid().as_raw())
        .map_err(|e| at(StartupStep::Ownership)(&e))?;
    Ok(Owned {
        store: Arc::new(store),
        catalog,
    })
}

/// Finishes a stale generation, if the store records one.
fn recover_stale(
    owned: &Owned,
    resolved: &ResolvedDomainConfiguration,
) -> Result<Option<GenerationId>, Failure> {
    finish_stale(
        &owned.store,
        &owned.catalog,
        resolved.domain_id(),
        &resolved.authorities().domain_runtime,
    )
    .map_err(|e| at(StartupStep::Ownership)(&e))
}

/// Who owns the Domain.
enum Ownership {
    /// This process: the lock.
    Mine(OwnedFd),
    /// A running coordinator, which answered this.
    Theirs(StartupEvent),
}

/// Takes the Domain, or asks the coordinator that owns it for its status.
/// An owner that has not published its control socket yet (starting) or
/// has removed it (stopping) is waited for, up to [`PUBLISH_WAIT`], taking
/// the lock again each time it may have been released.
fn own(
    runtime: &RetainedDir,
    resolved: &ResolvedDomainConfiguration,
) -> Result<Ownership, Failure> {
    let paths = DomainPaths::new(resolved.domain_id(), runtime.label().to_path_buf());
    let deadline = Instant::now() + PUBLISH_WAIT;
    loop {
        if let Some(lock) = try_lock(runtime)? {
            return Ok(Ownership::Mine(lock));
        }
        let asked = super::client::request(
            &paths,
            ControlRequest::Status,
            super::client::STATUS_TIMEOUT,
        );
        match asked {
            Ok(ControlResponse::Status(status)) => {
                let differences = differences(&status.configuration, resolved.fingerprint_record());
                return Ok(Ownership::Theirs(StartupEvent::AlreadyRunning {
                    status,
                    differences,
                }));
            }
            Ok(other) => {
                return Err(failure(
                    StartupStep::Ownership,
                    format!("the running coordinator answered {other:?}"),
                ));
            }
            Err(super::client::RequestError::NotRunning) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            // Held, never served: still starting, or an `up` waiting for
            // the developer's answer to its question.
            Err(super::client::RequestError::NotRunning) => {
                return Err(failure(
                    StartupStep::Ownership,
                    format!(
                        "another Lazaret process has held this Domain for {} s without serving \
                         it; a `lazaret up` may be waiting for an answer to its question \
                         (answer it there); if it is stuck, end it and run `lazaret down {}`",
                        PUBLISH_WAIT.as_secs(),
                        resolved.profile()
                    ),
                ));
            }
            Err(e) => {
                return Err(failure(
                    StartupStep::Ownership,
                    format!(
                        "another Lazaret process owns this Domain but does not answer ({}); \
                         if it is stuck, end it and run `lazaret down {}`",
                        chain(&e),
                        resolved.profile()
                    ),
                ));
            }
        }
    }
}

/// The names of the configuration fields that differ between two records,
/// of either schema. Records of two schemas differ at least in `schema`
/// (their fingerprints never agree); a v1 record has no host names and the
/// host's resolver.
fn differences(running: &ConfigurationRecord, loaded: &ConfigurationRecord) -> Vec<String> {
    fn sorted<T: Ord + Clone>(items: &[T]) -> Vec<T> {
        let mut items = items.to_vec();
        items.sort();
        items
    }
    let mut out = Vec::new();
    let mut check = |name: &str, same: bool| {
        if !same {
            out.push(name.to_owned());
        }
    };
    let (r, l) = (running.base(), loaded.base());
    check("schema", running.schema() == loaded.schema());
    check("storage root", r.storage_root == l.storage_root);
    check("runtime root", r.runtime_root == l.runtime_root);
    check("image", r.image == l.image);
    check(
        "isolate_gitignored",
        r.isolate_gitignored == l.isolate_gitignored,
    );
    check(
        "persistent_dirs",
        sorted(&r.persistent_dirs) == sorted(&l.persistent_dirs),
    );
    check(
        "env",
        sorted(&r.environment_references) == sorted(&l.environment_references),
    );
    check("volumes", sorted(&r.volumes) == sorted(&l.volumes));
    check(
        "egress allow",
        sorted(&r.effective_allow_prefixes) == sorted(&l.effective_allow_prefixes),
    );
    check(
        "egress deny",
        sorted(&r.effective_deny_prefixes) == sorted(&l.effective_deny_prefixes),
    );
    check(
        "egress hosts",
        sorted(running.allow_hosts()) == sorted(loaded.allow_hosts()),
    );
    check("dns", running.dns() == loaded.dns());
    check(
        "escalation.enabled",
        r.escalation_enabled == l.escalation_enabled,
    );
    check(
        "escalation.auto_approve",
        sorted(&r.auto_approval_rules) == sorted(&l.auto_approval_rules),
    );
    out
}

/// `lazaret-coordinator start`: bring a generation up and serve it.
pub fn start(args: Args) -> ExitCode {
    let reporter = match Reporter::take_stdin() {
        Ok(reporter) => reporter,
        Err(code) => return code,
    };
    // Leave the CLI's session so its terminal closing does not end the Domain.
    let _ = rustix::process::setsid();

    reporter.progress(
        StartupStep::Configuration,
        format!("loading profile `{}`", args.profile),
    );
    let resolved = match load(&args) {
        Ok(resolved) => resolved,
        Err(failure) => return reporter.fail(failure),
    };
    let auth = resolved.authorities();
    let lock = match own(&auth.domain_runtime, &resolved) {
        Ok(Ownership::Mine(lock)) => lock,
        Ok(Ownership::Theirs(event)) => {
            reporter.send(event);
            return ExitCode::SUCCESS;
        }
        Err(failure) => return reporter.fail(failure),
    };
    // The log goes to the journal when there is one; the log file takes
    // standard error either way (the supervisor writes there too).
    if let Err(failure) = redirect_to_log(&auth.domain_runtime) {
        return reporter.fail(failure);
    }
    super::journal::init();
    let _domain =
        super::journal::domain_span(&resolved.domain_id().to_hex(), resolved.profile().as_str())
            .entered();
    tracing::info!(
        "coordinator for Domain {}\n  profile: {}\n  workspace: {}",
        resolved.domain_id(),
        resolved.profile(),
        auth.workspace.label().display()
    );
    let owned = match open_stores(&resolved) {
        Ok(owned) => owned,
        Err(failure) => return reporter.fail(failure),
    };
    reporter.progress(StartupStep::Ownership, "Domain owned");
    match recover_stale(&owned, &resolved) {
        Ok(Some(id)) => reporter.progress(
            StartupStep::Ownership,
            format!("finished stale generation {id}"),
        ),
        Ok(None) => {}
        Err(failure) => return reporter.fail(failure),
    }

    let (mut generation, coordinator) = match new_generation(&owned, &resolved) {
        Ok(begun) => begun,
        Err(failure) => return reporter.fail(failure),
    };
    let _generation = super::journal::generation_span(generation.generation_id.0).entered();
    let mut starting = Starting::default();
    let brought_up = bring_up(
        &reporter,
        &owned,
        &resolved,
        &mut generation,
        &mut starting,
        coordinator,
        args.ignore_changes,
    );
    let live = match brought_up {
        Ok(live) => live,
        Err(failure) => {
            starting.stop();
            if let Err(e) = release_generation(
                &owned.store,
                &owned.catalog,
                resolved.domain_id(),
                generation,
                &auth.domain_runtime,
            ) {
                tracing::error!("releasing the failed generation: {}", chain(&e));
            }
            return reporter.fail(failure);
        }
    };
    let status = live.status(
        &resolved,
        &generation,
        Vec::new(),
        lazaret_proto::control::NetworkRecheck::NotChecked,
        super::usage::Walk::EphemeralOnly,
    );
    reporter.finish_phase();
    reporter.send(StartupEvent::Ready(Box::new(status)));
    drop(reporter);
    tracing::info!("generation {} running", generation.generation_id);

    let code = super::serve::serve(&owned, &resolved, generation, live);
    // Close the stores before giving up ownership: the next owner opens them.
    drop(owned);
    drop(lock);
    code
}

/// A new generation owned by this coordinator, which it returns held. It
/// is recorded with the first participants' intents (`bring_up`), in one
/// commit.
fn new_generation(
    owned: &Owned,
    resolved: &ResolvedDomainConfiguration,
) -> Result<(Generation, HeldProcess), Failure> {
    let store_failure = at(StartupStep::State);
    let me = HeldProcess::current().map_err(|e| store_failure(&e))?;
    let generation = Generation {
        domain_id: resolved.domain_id(),
        generation_id: owned
            .store
            .next_generation_id()
            .map_err(|e| store_failure(&e))?,
        configuration_fingerprint: resolved.fingerprint(),
        state: GenerationState::Starting,
        host_coordinator: me.committed(),
        started_at: UnixTimeNs::now(),
        closed_at: None,
    };
    Ok((generation, me))
}

/// What every start-up step of one generation works with.
#[derive(Clone, Copy)]
pub(super) struct Context<'a> {
    pub(super) reporter: &'a Reporter,
    pub(super) recorder: &'a Recorder,
    pub(super) resolved: &'a ResolvedDomainConfiguration,
    pub(super) generation: &'a Generation,
    /// The generation's runtime directory, `gen-N`.
    pub(super) generation_dir: &'a RetainedDir,
    /// What to do with host paths the workspace's rules now share.
    pub(super) ignore_changes: IgnoreChangesMode,
}

/// What a generation that is still starting holds, for stopping it if
/// starting fails.
#[derive(Default)]
struct Starting {
    supervisor: Option<Supervisor>,
    helper: Option<ConnectivityHelper>,
}

impl Starting {
    /// Stops the supervisor (and with it the Domain namespaces), then the
    /// connectivity helper.
    fn stop(self) {
        if let Some(supervisor) = self.supervisor {
            supervisor.stop();
        }
        if let Some(helper) = self.helper {
            helper.stop();
        }
    }
}

/// The generation's Session Coordinator protocol credential, the trust
/// manifest its sessions pin, and the mailbox tmpfs.
#[derive(Debug)]
pub(super) struct EscalationParts {
    pub(super) credential: ProtocolCredential,
    pub(super) manifest: TrustManifest,
    pub(super) mailbox: OwnedFd,
}

/// Everything a running generation holds.
pub(super) struct Live {
    coordinator: HeldProcess,
    holder: HeldProcess,
    pub(super) supervisor: Supervisor,
    pub(super) sandbox: HeldProcess,
    /// The runsc gofer, when the supervisor found it.
    pub(super) gofer: Option<HeldProcess>,
    /// The control socket.
    pub(super) listener: OwnedFd,
    /// The session socket.
    pub(super) sessions: UnixListener,
    /// The TLS configuration sessions are served with.
    pub(super) session_server: Arc<rustls::ServerConfig>,
    /// What the generation's escalation is made of on the event loop.
    pub(super) escalation: EscalationParts,
    /// The sealed sandbox environment every session process gets.
    pub(super) environment: OwnedFd,
    pub(super) store: Arc<DomainStore>,
    pub(super) generation_id: GenerationId,
    /// The sessions' hub, once the event loop runs.
    pub(super) hub: Option<Arc<Hub>>,
    prepared: PreparedLower,
    pub(super) container_id: ContainerId,
    runtime_root: HostPath,
    pub(super) helper: ConnectivityHelper,
    pub(super) network: NetworkStatus,
    /// Lazaret's resolver, when the policy has names.
    pub(super) resolver: Option<HeldProcess>,
    pub(super) router: HeldProcess,
    pub(super) workspace: WorkspaceStatus,
    /// What the directories holding scripts git runs held at `up`, for
    /// `down` to compare.
    pub(super) workspace_watch: lazaret_routing::watch::Watch,
    uppers: super::usage::Uppers,
}

impl Live {
    pub(super) fn status(
        &self,
        resolved: &ResolvedDomainConfiguration,
        generation: &Generation,
        sessions: Vec<lazaret_proto::control::SessionSummary>,
        recheck: lazaret_proto::control::NetworkRecheck,
        walk: super::usage::Walk,
    ) -> DomainStatus {
        DomainStatus {
            domain_id: resolved.domain_id(),
            profile: resolved.profile().as_str().to_owned(),
            workspace: HostPath::from(resolved.authorities().workspace.label()),
            generation_id: generation.generation_id,
            state: generation.state,
            started_at: generation.started_at,
            configuration_fingerprint: resolved.fingerprint(),
            configuration: resolved.fingerprint_record().clone(),
            manifest_digest: self.prepared.manifest_digest,
            container_id: self.container_id,
            runtime_root: self.runtime_root.clone(),
            coordinator: self.coordinator.identity,
            supervisor: self.supervisor.held.identity,
            namespace_holder: self.holder.identity,
            sandbox: self.sandbox.identity,
            sessions,
            network: NetworkStatus {
                recheck,
                ..self.network.clone()
            },
            workspace_routing: self.workspace.clone(),
            storage: self.uppers.measure(self.holder.identity.host_pid, walk),
            stopped: self.stopped(),
        }
    }

    /// The generation's processes stopped now.
    pub(super) fn stopped(&self) -> Vec<lazaret_proto::control::StoppedProcess> {
        use lazaret_proto::control::{GenerationProcess as P, StoppedProcess};
        let processes = [
            (P::Supervisor, Some(&self.supervisor.held)),
            (P::NamespaceHolder, Some(&self.holder)),
            (P::Sandbox, Some(&self.sandbox)),
            (P::Gofer, self.gofer.as_ref()),
            (P::WorkspaceRouter, Some(&self.router)),
            (P::ConnectivityHelper, Some(&self.helper.held)),
            (P::Resolver, self.resolver.as_ref()),
        ];
        processes
            .into_iter()
            .filter_map(|(process, held)| {
                let held = held.filter(|h| h.stopped())?;
                Some(StoppedProcess {
                    process,
                    identity: held.identity,
                })
            })
            .collect()
    }
}

/// Refuses a host program `up` runs (its own role binaries, runsc,
/// slirp4netns, skopeo) that lies beneath the workspace or a volume.
fn programs_outside_the_sandbox(
    auth: &crate::config::ConfinedAuthorities,
) -> Result<(), crate::programs::ProgramError> {
    let mut writable = vec![auth.workspace.label()];
    writable.extend(auth.volumes.iter().map(|v| v.plan.canonical_label()));
    let roles = [
        "lazaret-coordinator",
        "lazaret-supervisor",
        "lazaret-router",
        "lazaret-netsidecar",
        "lazaret-resolver",
    ];
    let mut programs = roles
        .iter()
        .map(|name| crate::programs::role_binary(name))
        .collect::<Result<Vec<_>, _>>()?;
    programs.push(crate::programs::runsc()?);
    programs.push(crate::programs::slirp4netns()?);
    programs.extend(crate::programs::skopeo()?);
    programs
        .iter()
        .try_for_each(|program| crate::programs::outside(program, &writable))
}

fn bring_up(
    reporter: &Reporter,
    owned: &Owned,
    resolved: &ResolvedDomainConfiguration,
    generation: &mut Generation,
    starting: &mut Starting,
    coordinator: HeldProcess,
    ignore_changes: IgnoreChangesMode,
) -> Result<Live, Failure> {
    let auth = resolved.authorities();
    let uid = rustix::process::getuid().as_raw();
    let store = &owned.store;
    let recorder = Recorder::new(Arc::clone(store), generation.generation_id);
    // The policy first: one that cannot be installed stops `up` before
    // anything starts.
    let host = crate::network::HostNetwork::read()
        .map_err(|e| failure(StartupStep::Network, chain(&e)))?;
    let planned = PlannedNetwork::new(resolved.network(), &host)
        .map_err(|e| invalid(StartupStep::Network, chain(&e)))?;
    // So do a host program the sandbox could replace and an image
    // reference that is not one. The workspace's git rules, which take a
    // walk of the workspace, are taken below, while the rest starts.
    let source = parse_reference(&resolved.record().image)
        .map_err(|e| invalid(StartupStep::Image, chain(&e)))?;
    programs_outside_the_sandbox(auth)
        .map_err(|e| invalid(StartupStep::Configuration, chain(&e)))?;

    // The generation, and the intents of every participant made before
    // the plan is sent: one commit. The supervisor's pid 1 holds the
    // Domain namespaces; the supervisor starts it at once. Nothing of the
    // network exists until the namespaces do, nothing of the lease and the
    // State Anchors until the storage is prepared, nothing of the control
    // and session sockets until the network is attaching.
    reporter.progress(StartupStep::Sandbox, "starting the Runtime Supervisor");
    let sandbox_failure = |e: crate::programs::ProgramError| at(StartupStep::Sandbox)(&e);
    let supervisor_path =
        crate::programs::role_binary("lazaret-supervisor").map_err(sandbox_failure)?;
    let runsc = crate::programs::runsc().map_err(sandbox_failure)?;
    let container_id = ContainerId(session::random_bytes());
    let helper_record = || ParticipantOwnership::Helper(HelperOwnership::default());
    let [control_publication, session_publication] = publications(auth);
    let (sidecar, [network, connectivity]) = super::network::intended(&planned)?;
    let (
        [
            supervisor_record,
            holder_record,
            lower,
            control,
            sessions,
            network_record,
            connectivity_record,
        ],
        anchors,
    ) = recorder.begin(
        generation,
        StartupStep::Sandbox,
        [
            (Slot::SUPERVISOR, helper_record()),
            (Slot::NAMESPACE_HOLDER, helper_record()),
            (
                Slot::PREPARED_LOWER,
                ParticipantOwnership::PreparedLower(PreparedLowerOwnership::default()),
            ),
            control_publication,
            session_publication,
            network,
            connectivity,
        ],
        anchor_intents(resolved),
    )?;
    // The generation's runtime directory.
    let generation_dir = auth
        .domain_runtime
        .ensure_child(
            Path::new(&DomainPaths::generation_dir_name(generation.generation_id)),
            uid,
        )
        .map_err(|e| at(StartupStep::State)(&e))?;

    // The Runtime Supervisor, first: it builds the Domain namespaces while
    // the image and state are prepared. It is recorded as running with its
    // pid 1 and slirp4netns, once those run: until then it dies with this
    // process (its parent-death signal), and so does its pid 1 with it.
    let supervisor: &Supervisor = starting
        .supervisor
        .insert(Supervisor::spawn(&supervisor_path)?);

    // While the image, state and workspace are prepared and the plan is
    // sent, slirp4netns attaches to the enforcement namespace as soon as
    // the supervisor reports it.
    let nameservers = planned.nameservers();
    let helper_slot = &mut starting.helper;
    let cx = Context {
        reporter,
        recorder: &recorder,
        resolved,
        generation,
        generation_dir: &generation_dir,
        ignore_changes,
    };
    let network_records = super::network::Records {
        supervisor: supervisor_record,
        holder: holder_record,
        network: network_record,
        helper: connectivity_record,
        sidecar,
    };
    // Once slirp4netns is started, the control and session sockets are
    // published on the network's thread while the sidecar waits for it to
    // attach. No session is served before `up` has finished, so a client
    // that connects early waits.
    let (storage, network) = side_by_side(
        reporter,
        (StartupStep::Network, "attaching the network"),
        || {
            let attached = attach_network(cx, supervisor, network_records, planned, helper_slot)?;
            Ok((attached, publish(resolved, generation, [control, sessions])))
        },
        || {
            prepare_storage(cx, owned, &source, lower, anchors).and_then(|(storage, became)| {
                send_plan(
                    cx,
                    supervisor,
                    storage,
                    became,
                    &runsc,
                    container_id,
                    nameservers,
                )
            })
        },
    );
    let Planned {
        storage,
        routing,
        sandbox,
        mut sandbox_record,
        environment,
    } = storage?;
    let ((namespaces, requested), published) = network?;
    let helper = starting.helper.as_ref();
    reporter.progress(StartupStep::Workspace, "starting the Workspace Router");
    let ((routed, router_record), attestation) = supervisor
        .two_reports(|report| {
            super::workspace::routed(resolved, storage.workspace, routing, report)
        })
        .map_err(|failure| helper_failed(failure, helper))?;
    let (network, resolver, network_records) =
        super::network::verify(reporter, &recorder, requested, attestation)?;
    let Published {
        listener,
        sessions,
        session_server,
        credential,
        manifest,
        records: published,
    } = published?;

    // The sandbox, now that its network is proven.
    reporter.progress(StartupStep::Sandbox, "starting the sandbox");
    let running = supervisor.run_sandbox()?;
    let holder = namespaces.holder;
    sandbox_record.container_process = running.process.committed();
    sandbox_record.runtime_root = Some(running.runtime_root.clone());
    sandbox_record.user_namespace = Some(namespaces.user_namespace);
    // The sandbox runs, and so does the generation, its router, its
    // attested network and its published sockets: one commit. Until it
    // is made, the records say only what was intended, which recovery
    // undoes alike.
    generation.state = GenerationState::Running;
    let also = std::iter::once(router_record)
        .chain(network_records)
        .chain(published.map(Intent::becoming_active))
        .collect();
    sandbox.active_with(
        ParticipantOwnership::Sandbox(sandbox_record),
        generation,
        also,
    )?;
    let supervisor = starting
        .supervisor
        .take()
        .expect("the supervisor was started above");
    let helper = starting
        .helper
        .take()
        .expect("the connectivity helper was started above");
    Ok(Live {
        coordinator,
        holder,
        supervisor,
        sandbox: running.process,
        gofer: running.gofer,
        listener,
        sessions,
        session_server,
        escalation: EscalationParts {
            credential,
            manifest,
            mailbox: running.mailbox,
        },
        environment,
        store: Arc::clone(store),
        generation_id: generation.generation_id,
        hub: None,
        prepared: storage.prepared,
        container_id,
        runtime_root: running.runtime_root,
        helper,
        network,
        resolver,
        router: routed.router,
        workspace: routed.status,
        workspace_watch: routed.watch,
        uppers: storage.uppers,
    })
}

/// A network failure the connectivity helper's exit explains says so, with
/// what the helper wrote: the sidecar sees only that it never attached.
fn helper_failed(mut failure: Failure, helper: Option<&ConnectivityHelper>) -> Failure {
    if failure.step == StartupStep::Network
        && let Some(why) = helper.and_then(ConnectivityHelper::explain)
    {
        failure.message = format!(
            "the connectivity helper could not attach: {why} ({})",
            failure.message
        );
    }
    failure
}

/// Runs `side` on a thread of its own, in this thread's span, while `main`
/// runs here, and returns both results once both are done. A `side` that
/// panics fails `step`, naming `what`.
fn side_by_side<A, B: Send>(
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
struct Beside<'scope, B> {
    thread: std::thread::ScopedJoinHandle<'scope, Result<B, Failure>>,
    step: StartupStep,
    what: &'static str,
}

impl<B> Beside<'_, B> {
    /// Waits for the work's result. Work that panicked fails its step,
    /// naming what it was.
    fn join(self) -> Result<B, Failure> {
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
fn beside<'scope, B: Send + 'scope>(
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

/// What the sandbox is made of on the host: the leased image, the State
/// Anchor directories and the workspace's routing.
struct Storage {
    prepared: PreparedLower,
    anchor_dirs: Vec<RetainedDir>,
    uppers: super::usage::Uppers,
    workspace: super::workspace::Prepared,
}

/// The State Anchor directories [`lease_and_anchor`] made.
struct Anchors {
    dirs: Vec<RetainedDir>,
    uppers: super::usage::Uppers,
}

/// Leases the image (`lower`), makes the State Anchor directories
/// (`anchors`) and prepares the workspace routing; what the lease and the
/// anchors became (returned) and the routing's intent are left for
/// [`send_plan`] to record. The workspace's git rules, which take a walk
/// of the workspace, are taken on a thread of their own meanwhile.
fn prepare_storage(
    cx: Context<'_>,
    owned: &Owned,
    source: &crate::image::ImageSource,
    lower: Intent,
    anchors: Vec<Intent>,
) -> Result<(Storage, Vec<Became>), Failure> {
    std::thread::scope(|scope| {
        let rules = beside(
            scope,
            cx.reporter,
            (StartupStep::Workspace, "taking the workspace's git rules"),
            || {
                super::workspace::take_rules(
                    cx.reporter,
                    cx.resolved,
                    &owned.store,
                    cx.ignore_changes,
                )
            },
        );
        let (prepared, made, became) = lease_and_anchor(cx, owned, source, lower, anchors)?;
        let uid = rustix::process::getuid().as_raw();
        let workspace =
            super::workspace::prepare(cx.resolved, cx.generation_dir, rules.join()?, uid)?;
        let storage = Storage {
            prepared,
            anchor_dirs: made.dirs,
            uppers: made.uppers,
            workspace,
        };
        Ok((storage, became))
    })
}

/// The State Anchors' intents, one per persistent dir in the order of
/// `persistent_dirs`.
fn anchor_intents(resolved: &ResolvedDomainConfiguration) -> Vec<(Slot, ParticipantOwnership)> {
    let dirs = resolved.record().persistent_dirs.iter();
    dirs.enumerate()
        .map(|(i, dir)| (Slot::state_anchor(i), anchor_record(resolved, dir, None)))
        .collect()
}

/// The State Anchor of persistent dir `dir`: a Domain-owned upper and work
/// dir in the Domain's storage, over the prepared artifact `lower`.
fn anchor_record(
    resolved: &ResolvedDomainConfiguration,
    dir: &str,
    lower: Option<lazaret_proto::ids::PreparedArtifactId>,
) -> ParticipantOwnership {
    let state_dir = resolved
        .authorities()
        .domain_storage
        .label()
        .join(anchor_dir(dir));
    ParticipantOwnership::StateAnchor(StateAnchorOwnership {
        lower_artifact_id: lower,
        upper_path: Some(HostPath::from(&state_dir.join(UPPER_DIR))),
        work_path: Some(HostPath::from(&state_dir.join(WORK_DIR))),
        sandbox_path: Some(dir.to_owned()),
        ..StateAnchorOwnership::default()
    })
}

/// Leases the image (`lower`, recorded as intended) and makes the State
/// Anchor directories (`anchors`, recorded as intended, in the order of
/// `persistent_dirs`); what the lease and the anchors became is returned
/// for the sandbox's intent.
fn lease_and_anchor(
    cx: Context<'_>,
    owned: &Owned,
    source: &crate::image::ImageSource,
    lower: Intent,
    anchors: Vec<Intent>,
) -> Result<(PreparedLower, Anchors, Vec<Became>), Failure> {
    let Context {
        reporter,
        resolved,
        generation,
        generation_dir,
        ..
    } = cx;
    let auth = resolved.authorities();
    let uid = rustix::process::getuid().as_raw();
    // The image, leased for this generation.
    reporter.progress(
        StartupStep::Image,
        format!("resolving {}", resolved.record().image),
    );
    let prepared = owned
        .catalog
        .prepare_and_lease(
            source,
            resolved.domain_id(),
            generation.generation_id,
            &mut |p| {
                reporter.send(StartupEvent::Progress {
                    step: StartupStep::Image,
                    detail: p.to_string(),
                    fraction: p.fraction(),
                })
            },
        )
        .map_err(|e| at(StartupStep::Image)(&e))?;
    let leased = lower.becoming(
        ParticipantState::LeaseHeld,
        ParticipantOwnership::PreparedLower(PreparedLowerOwnership {
            prepared_artifact_id: Some(prepared.artifact_id),
            selected_manifest_digest: Some(prepared.manifest_digest),
            rootfs_path: Some(HostPath::from(&prepared.rootfs_path)),
            ..PreparedLowerOwnership::default()
        }),
    );
    reporter.progress(
        StartupStep::Image,
        format!("prepared {}", prepared.manifest_digest.to_oci_string()),
    );

    // The State Anchors, over this image.
    reporter.progress(
        StartupStep::State,
        format!("generation {}", generation.generation_id),
    );
    let persistent_dirs = &resolved.record().persistent_dirs;
    let dirs = persistent_dirs
        .iter()
        .map(|dir| {
            let dir = auth.domain_storage.ensure_child(&anchor_dir(dir), uid)?;
            dir.ensure_child(Path::new(UPPER_DIR), uid)?;
            dir.ensure_child(Path::new(WORK_DIR), uid)?;
            Ok(dir)
        })
        .collect::<Result<Vec<_>, crate::config::ConfinedError>>()
        .map_err(|e| at(StartupStep::State)(&e))?;
    let uppers = super::usage::Uppers::new(generation_dir, persistent_dirs, &dirs)
        .map_err(|e| at(StartupStep::State)(&e))?;
    let became = std::iter::once(leased)
        .chain(
            anchors
                .into_iter()
                .zip(persistent_dirs)
                .map(|(anchor, dir)| {
                    let record = anchor_record(resolved, dir, Some(prepared.artifact_id));
                    anchor.becoming(ParticipantState::Active, record)
                }),
        )
        .collect();
    Ok((prepared, Anchors { dirs, uppers }, became))
}

/// The storage, and the workspace routing and the sandbox recorded as
/// intended with the plan that makes them sent.
struct Planned {
    storage: Storage,
    routing: Intent,
    sandbox: Intent,
    sandbox_record: SandboxOwnership,
    environment: OwnedFd,
}

/// Records what the image's lease and the State Anchors became (`became`)
/// and the routing's and the sandbox's intents, and sends the supervisor
/// its plan.
fn send_plan(
    cx: Context<'_>,
    supervisor: &Supervisor,
    storage: Storage,
    became: Vec<Became>,
    runsc: &Path,
    container_id: ContainerId,
    nameservers: Vec<std::net::Ipv4Addr>,
) -> Result<Planned, Failure> {
    let Context {
        recorder,
        resolved,
        generation,
        generation_dir,
        ..
    } = cx;
    // The sandbox.
    let sandbox_record = SandboxOwnership {
        container_id: Some(container_id),
        bundle_path: Some(HostPath::from(&generation_dir.label().join("mnt/bundle"))),
        ..SandboxOwnership::default()
    };
    // What the lease and the State Anchors became, and the intents of the
    // routing and the sandbox the plan makes, with the rules the routing
    // takes (for the next `up` to compare with): one commit.
    let [routing, sandbox] = recorder.record(
        StartupStep::Sandbox,
        became,
        [
            storage.workspace.intent(),
            (
                Slot::SANDBOX,
                ParticipantOwnership::Sandbox(sandbox_record.clone()),
            ),
        ],
        Some(storage.workspace.encoded_rules()),
    )?;
    // One sealed memfd of the resolved environment serves the sandbox and
    // every session process.
    let environment = environment_memfd(resolved).map_err(|e| {
        failure(
            StartupStep::Sandbox,
            format!("cannot pass the sandbox environment: {e}"),
        )
    })?;
    supervisor.send_plan(
        resolved,
        PlanInputs {
            environment: environment.as_fd(),
            prepared: &storage.prepared,
            anchor_dirs: &storage.anchor_dirs,
            isolated: &storage.workspace.isolated,
            rules: storage.workspace.rules.as_fd(),
            generation_dir,
            runsc,
            container_id,
        },
        generation,
        nameservers,
    )?;
    Ok(Planned {
        storage,
        routing,
        sandbox,
        sandbox_record,
        environment,
    })
}

/// Takes the namespaces the supervisor reports, records their holder,
/// attaches the connectivity helper to the enforcement namespace, and asks
/// for the policy's attestation.
fn attach_network(
    cx: Context<'_>,
    supervisor: &Supervisor,
    records: super::network::Records,
    planned: PlannedNetwork,
    helper: &mut Option<ConnectivityHelper>,
) -> Result<(super::supervisor::Namespaces, super::network::Requested), Failure> {
    let namespaces = supervisor.namespaces()?;
    let requested = super::network::attach(cx, supervisor, &namespaces, records, planned, helper)?;
    Ok((namespaces, requested))
}

/// What [`publish`] made: the control socket, and the Session
/// Coordinator's socket, server configuration and credentials, with their
/// records, which become active once the sandbox runs.
struct Published {
    listener: OwnedFd,
    sessions: UnixListener,
    session_server: Arc<rustls::ServerConfig>,
    credential: ProtocolCredential,
    manifest: TrustManifest,
    records: [Intent; 2],
}

/// The intents to publish the control socket ([`Slot::PUBLICATION`]) and
/// the session socket with its client credential
/// ([`Slot::SESSION_PUBLICATION`]): what recovery removes.
fn publications(auth: &crate::config::ConfinedAuthorities) -> [(Slot, ParticipantOwnership); 2] {
    let runtime = auth.domain_runtime.label();
    let published = |socket: &str, identity: Option<&str>| {
        ParticipantOwnership::Publication(PublicationOwnership {
            socket_path: Some(HostPath::from(&runtime.join(socket))),
            identity_path: identity.map(|dir| HostPath::from(&runtime.join(dir))),
        })
    };
    [
        (Slot::PUBLICATION, published(super::CONTROL_SOCKET, None)),
        (
            Slot::SESSION_PUBLICATION,
            published(session::SESSION_SOCKET, Some(session::CREDENTIAL_DIR)),
        ),
    ]
}

/// Binds the control socket, creates the generation's session
/// credentials, writes the client credential and binds the session socket;
/// `records` are their publications' intents, committed before.
fn publish(
    resolved: &ResolvedDomainConfiguration,
    generation: &Generation,
    records: [Intent; 2],
) -> Result<Published, Failure> {
    let auth = resolved.authorities();
    let step = at(StartupStep::Sandbox);
    let socket = auth.domain_runtime.label().join(super::CONTROL_SOCKET);
    let _ = std::fs::remove_file(&socket);
    // What failed, where: a socket that cannot be bound (a full runtime
    // dir, a name too long for a socket address).
    let cannot_bind = |socket: &Path, detail: String| {
        failure(
            StartupStep::Sandbox,
            format!("cannot bind {}: {detail}", socket.display()),
        )
    };
    let listener = lazaret_proto::channel::listen(&lazaret_proto::channel::socket_path_at(
        auth.domain_runtime.fd(),
        super::CONTROL_SOCKET,
    ))
    .map_err(|e| cannot_bind(&socket, chain(&e)))?;

    let uid = rustix::process::getuid().as_raw();
    let identity = GenerationIdentity {
        agent_profile: resolved.profile().as_str().to_owned(),
        domain_id: resolved.domain_id(),
        generation_id: generation.generation_id,
        configuration_fingerprint: resolved.fingerprint(),
        generation_nonce: GenerationNonce(session::random_bytes()),
        created_at: UnixTimeNs::now(),
    };
    let protocol = session::coordinator_protocol_credential(&identity);
    let credentials = GenerationCredentials::create(identity, &protocol).map_err(|e| step(&e))?;
    let credential_dir = auth
        .domain_runtime
        .ensure_child(Path::new(session::CREDENTIAL_DIR), uid)
        .map_err(|e| step(&e))?;
    let socket = auth.domain_runtime.label().join(session::SESSION_SOCKET);
    // A stale credential of an earlier generation is replaced.
    let _ = remove_client_credential(&credential_dir);
    credentials
        .write_client_credential(&credential_dir)
        .and_then(|()| credentials.write_publication(&credential_dir, &socket))
        .map_err(|e| step(&e))?;
    let _ = std::fs::remove_file(&socket);
    let sessions = UnixListener::bind(lazaret_proto::channel::socket_path_at(
        auth.domain_runtime.fd(),
        session::SESSION_SOCKET,
    ))
    .map_err(|e| cannot_bind(&socket, e.to_string()))?;
    Ok(Published {
        listener,
        sessions,
        session_server: credentials.server_config(),
        credential: protocol,
        manifest: credentials.trust_manifest(),
        records,
    })
}

/// The resolved sandbox environment in a sealed memfd: `NAME=value\0`
/// entries. The values exist only in this process's memory and the memfd.
fn environment_memfd(resolved: &ResolvedDomainConfiguration) -> std::io::Result<OwnedFd> {
    lazaret_proto::memfd::sealed("lazaret-environment", |file| {
        for (name, value) in resolved.environment() {
            std::io::Write::write_all(file, name.as_str().as_bytes())?;
            std::io::Write::write_all(file, b"=")?;
            std::io::Write::write_all(file, value.expose().as_bytes())?;
            std::io::Write::write_all(file, b"\0")?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use lazaret_proto::config::{
        ConfigurationFingerprintRecordV1, ConfigurationFingerprintRecordV2, ConfigurationRecord,
        RFC1918,
    };
    use lazaret_proto::names::{DnsMode, HostPattern};

    use super::differences;

    fn base() -> ConfigurationFingerprintRecordV1 {
        ConfigurationFingerprintRecordV1 {
            selected_profile: "p".into(),
            storage_root: b"/s".to_vec(),
            runtime_root: b"/r".to_vec(),
            image: "img".into(),
            isolate_gitignored: true,
            persistent_dirs: vec!["/root".into()],
            environment_references: Vec::new(),
            volumes: Vec::new(),
            effective_allow_prefixes: Vec::new(),
            effective_deny_prefixes: RFC1918.to_vec(),
            escalation_enabled: false,
            auto_approval_rules: Vec::new(),
        }
    }

    fn v2(hosts: &[&str], dns: DnsMode) -> ConfigurationRecord {
        ConfigurationRecord::V2(ConfigurationFingerprintRecordV2 {
            base: base(),
            allow_hosts: hosts
                .iter()
                .map(|h| HostPattern::parse(h).unwrap())
                .collect(),
            dns,
        })
    }

    #[test]
    fn host_names_dns_and_the_schema_are_compared() {
        let v1 = ConfigurationRecord::V1(base());
        assert!(differences(&v1, &v1).is_empty());
        let running = v2(&["a.example", "*.b.example"], DnsMode::Lazaret);
        assert!(differences(&running, &running).is_empty());
        // Declared order is not a difference.
        assert!(
            differences(
                &running,
                &v2(&["*.b.example", "a.example"], DnsMode::Lazaret)
            )
            .is_empty()
        );
        assert_eq!(
            differences(&running, &v2(&["a.example"], DnsMode::Lazaret)),
            ["egress hosts"]
        );
        assert_eq!(
            differences(&running, &v2(&["a.example", "*.b.example"], DnsMode::Host)),
            ["dns"]
        );
        // A v1 record is a v2 one with no names and the host's resolver,
        // under another schema.
        assert_eq!(differences(&v1, &v2(&[], DnsMode::Host)), ["schema"]);
        assert_eq!(
            differences(&v1, &running),
            ["schema", "egress hosts", "dns"]
        );
        let mut other = base();
        other.image = "other".into();
        assert_eq!(
            differences(&running, &ConfigurationRecord::V1(other)),
            ["schema", "image", "egress hosts", "dns"]
        );
    }
}
