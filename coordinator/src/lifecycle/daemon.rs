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
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lazaret_proto::common::{HostPath, UnixTimeNs};
use lazaret_proto::config::ConfigurationRecord;
use lazaret_proto::control::{ControlRequest, ControlResponse, StartupEvent, StartupStep};
use lazaret_proto::ids::{ContainerId, GenerationId};
use lazaret_proto::ownership::{HelperOwnership, ParticipantOwnership, PreparedLowerOwnership};
use lazaret_proto::store::{Domain, Generation, GenerationState};
use lazaret_storage::catalog::StorageCatalog;
use lazaret_storage::image::parse_reference;
use lazaret_storage::store::{DomainStore, Slot};

pub use super::context::IgnoreChangesMode;

use super::beside::side_by_side;
use super::context::Context;
use super::failure::{Failure, at, failure, invalid, invalid_at};
use super::live::{EscalationParts, Live, Owned};
use super::prepare::{Planned, anchor_intents, prepare_storage, send_plan};
use super::publish::{Published, publications, publish};
use super::record::{Intent, Recorder};
use super::recovery::{finish_stale, release_generation};
use super::report::Reporter;
use super::supervisor::Supervisor;
use super::{DomainPaths, chain};
use crate::config::{self, HostEnvironment, LoadRequest, ResolvedDomainConfiguration, RetainedDir};
use crate::network::{ConnectivityHelper, PlannedNetwork};
use crate::process::HeldProcess;
use crate::session;

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

/// Opens the Domain Store and the Storage Catalog of the Domain this
/// process owns.
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
/// has removed it (stopping) is waited for, up to `wait` ([`PUBLISH_WAIT`]),
/// taking the lock again each time it may have been released.
fn own(
    runtime: &RetainedDir,
    resolved: &ResolvedDomainConfiguration,
    wait: Duration,
) -> Result<Ownership, Failure> {
    let paths = DomainPaths::new(resolved.domain_id(), runtime.label().to_path_buf());
    let deadline = Instant::now() + wait;
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
                        wait.as_secs(),
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
    let lock = match own(&auth.domain_runtime, &resolved, PUBLISH_WAIT) {
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
            let failure = match &starting.supervisor {
                Some(supervisor) => supervisor.explained(failure),
                None => failure,
            };
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

/// Refuses a host program `up` runs (its own role binaries, runsc,
/// slirp4netns, skopeo) that lies beneath the workspace or a volume.
fn programs_outside_the_sandbox(
    auth: &crate::config::ConfinedAuthorities,
) -> Result<(), lazaret_hostfs::programs::ProgramError> {
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
        .map(|name| lazaret_hostfs::programs::role_binary(name))
        .collect::<Result<Vec<_>, _>>()?;
    programs.push(lazaret_hostfs::programs::runsc()?);
    programs.push(lazaret_hostfs::programs::slirp4netns()?);
    programs.extend(lazaret_hostfs::programs::skopeo()?);
    programs
        .iter()
        .try_for_each(|program| lazaret_hostfs::programs::outside(program, &writable))
}

/// Brings the generation up, in the order the module's doc gives: what
/// can refuse `up` before anything starts ([`preflight`]), the generation
/// and its first intents ([`begin`]), the Runtime Supervisor, then the
/// network and the storage side by side ([`prepare_and_attach`]), then
/// the routed workspace, the verified network and the sandbox
/// ([`go_live`]). What it started is left in `starting`, so that a
/// failure stops it.
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
    let recorder = Recorder::new(Arc::clone(&owned.store), generation.generation_id);
    let (planned, source) = preflight(resolved)?;

    // The generation, and the intents of every participant made before
    // the plan is sent: one commit. The supervisor's pid 1 holds the
    // Domain namespaces; the supervisor starts it at once. Nothing of the
    // network exists until the namespaces do, nothing of the lease and the
    // State Anchors until the storage is prepared, nothing of the control
    // and session sockets until the network is attaching.
    reporter.progress(StartupStep::Sandbox, "starting the Runtime Supervisor");
    let sandbox_failure = |e: lazaret_hostfs::programs::ProgramError| at(StartupStep::Sandbox)(&e);
    let supervisor_path =
        lazaret_hostfs::programs::role_binary("lazaret-supervisor").map_err(sandbox_failure)?;
    let runsc = lazaret_hostfs::programs::runsc().map_err(sandbox_failure)?;
    let container_id = ContainerId(session::random_bytes());
    let begun = begin(&recorder, resolved, generation, &planned)?;
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
    starting.supervisor = Some(Supervisor::spawn(&supervisor_path)?);
    // Fresh placeholders for this generation's credentials.
    let credentials = super::credentials::Credentials::new(resolved);
    let cx = Context {
        reporter,
        recorder: &recorder,
        resolved,
        credentials: &credentials,
        generation,
        generation_dir: &generation_dir,
        ignore_changes,
    };
    let midway = prepare_and_attach(
        cx,
        owned,
        starting,
        begun,
        Sources {
            planned,
            image: &source,
            runsc: &runsc,
            container_id,
        },
    )?;
    confine()?;
    let held = Held {
        coordinator,
        container_id,
        store: Arc::clone(&owned.store),
    };
    go_live(
        reporter, &recorder, resolved, generation, starting, midway, held,
    )
}

/// Confines this process once it has started every program of its own:
/// the launch spawner first (approved host commands start through it,
/// unconfined), then this process's seccomp filter.
fn confine() -> Result<(), Failure> {
    crate::escalation::spawner::Spawner::start()
        .map_err(|e| at(StartupStep::Sandbox)(&e).within("cannot start the launch spawner"))?;
    crate::seccomp::install().map_err(|e| at(StartupStep::Sandbox)(&e))
}

/// What refuses `up` before anything starts: the policy first (one that
/// cannot be installed), then an image reference that is not one and a
/// host program the sandbox could replace. The workspace's git rules,
/// which take a walk of the workspace, are taken later, while the rest
/// starts.
fn preflight(
    resolved: &ResolvedDomainConfiguration,
) -> Result<(PlannedNetwork, lazaret_storage::image::ImageSource), Failure> {
    let auth = resolved.authorities();
    let host = crate::network::HostNetwork::read().map_err(|e| at(StartupStep::Network)(&e))?;
    let planned = PlannedNetwork::new(resolved.network(), &host)
        .map_err(|e| invalid_at(StartupStep::Network)(&e))?;
    let source = parse_reference(&resolved.record().image)
        .map_err(|e| invalid_at(StartupStep::Image)(&e))?;
    programs_outside_the_sandbox(auth).map_err(|e| invalid_at(StartupStep::Configuration)(&e))?;
    Ok((planned, source))
}

/// The generation as first committed: the intents of the participants
/// made before the plan is sent.
struct Begun {
    /// The supervisor, its pid 1, the network and its helper.
    network: super::network::Records,
    /// The prepared-lower lease.
    lower: Intent,
    /// The control and session sockets.
    publications: [Intent; 2],
    /// The State Anchors, in the order of `persistent_dirs`.
    anchors: Vec<Intent>,
}

/// Records `generation` as it begins with the intents of its first
/// participants, in one commit: the supervisor and its pid 1, the
/// prepared-lower lease, the control and session publications, the
/// network and its connectivity helper, and the State Anchors.
fn begin(
    recorder: &Recorder,
    resolved: &ResolvedDomainConfiguration,
    generation: &Generation,
    planned: &PlannedNetwork,
) -> Result<Begun, Failure> {
    let helper_record = || ParticipantOwnership::Helper(HelperOwnership::default());
    let [control_publication, session_publication] = publications(resolved.authorities());
    let (sidecar, [network, connectivity]) = super::network::intended(planned)?;
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
    Ok(Begun {
        network: super::network::Records {
            supervisor: supervisor_record,
            holder: holder_record,
            network: network_record,
            helper: connectivity_record,
            sidecar,
        },
        lower,
        publications: [control, sessions],
        anchors,
    })
}

/// What the sandbox is made from besides the records: the planned
/// network, the image, runsc and the container's ID.
struct Sources<'a> {
    planned: PlannedNetwork,
    image: &'a lazaret_storage::image::ImageSource,
    runsc: &'a Path,
    container_id: ContainerId,
}

/// What the two lines of start-up made, once both are done.
struct Midway {
    planned: Planned,
    namespaces: super::supervisor::Namespaces,
    requested: super::network::Requested,
    published: Result<Published, Failure>,
}

/// The network and the storage, side by side. On a thread of its own,
/// slirp4netns attaches to the enforcement namespace as soon as the
/// supervisor reports it, and the control and session sockets are then
/// published while the sidecar waits for it to attach (no session is
/// served before `up` has finished, so a client that connects early
/// waits). Here, the image, state and workspace are prepared and the plan
/// is sent.
fn prepare_and_attach(
    cx: Context<'_>,
    owned: &Owned,
    starting: &mut Starting,
    begun: Begun,
    sources: Sources<'_>,
) -> Result<Midway, Failure> {
    let Begun {
        network: records,
        lower,
        publications: records_published,
        anchors,
    } = begun;
    let Sources {
        planned,
        image,
        runsc,
        container_id,
    } = sources;
    let supervisor = starting
        .supervisor
        .as_ref()
        .expect("the supervisor was started before");
    let helper_slot = &mut starting.helper;
    let nameservers = planned.nameservers();
    let (storage, network) = side_by_side(
        cx.reporter,
        (StartupStep::Network, "attaching the network"),
        || {
            let attached = attach_network(cx, supervisor, records, planned, helper_slot)?;
            Ok((
                attached,
                publish(cx.resolved, cx.generation, records_published),
            ))
        },
        || {
            prepare_storage(cx, owned, image, lower, anchors).and_then(|(storage, became)| {
                send_plan(
                    cx,
                    supervisor,
                    storage,
                    became,
                    runsc,
                    container_id,
                    nameservers,
                )
            })
        },
    );
    let planned = storage?;
    let ((namespaces, requested), published) = network?;
    Ok(Midway {
        planned,
        namespaces,
        requested,
        published,
    })
}

/// What the running generation holds from before bring-up.
struct Held {
    coordinator: HeldProcess,
    container_id: ContainerId,
    store: Arc<DomainStore>,
}

/// The rest of bring-up, once the network is attaching and the plan is
/// sent: the Workspace Router taken and the network verified as the
/// supervisor reports them, then the sandbox run, and the sandbox, the
/// generation, its router, its attested network and its published sockets
/// recorded running in one commit.
fn go_live(
    reporter: &Reporter,
    recorder: &Recorder,
    resolved: &ResolvedDomainConfiguration,
    generation: &mut Generation,
    starting: &mut Starting,
    midway: Midway,
    held: Held,
) -> Result<Live, Failure> {
    let Midway {
        planned:
            Planned {
                storage,
                routing,
                sandbox,
                mut sandbox_record,
                environment,
            },
        namespaces,
        requested,
        published,
    } = midway;
    let supervisor = starting
        .supervisor
        .as_ref()
        .expect("the supervisor was started before");
    let helper = starting.helper.as_ref();
    reporter.progress(StartupStep::Workspace, "starting the Workspace Router");
    let ((routed, router_record), attestation) = supervisor
        .two_reports(|report| {
            super::workspace::routed(resolved, storage.workspace, routing, report)
        })
        .map_err(|failure| helper_failed(failure, helper))?;
    let (network, servers, network_records) =
        super::network::verify(reporter, recorder, requested, attestation)?;
    let published = published?;

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
        .chain(published.records.map(Intent::becoming_active))
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
        coordinator: held.coordinator,
        holder,
        supervisor,
        sandbox: running.process,
        gofer: running.gofer,
        listener: published.listener,
        sessions: published.sessions,
        session_server: published.session_server,
        escalation: EscalationParts {
            credential: published.credential,
            manifest: published.manifest,
            mailbox: running.mailbox,
        },
        environment,
        store: held.store,
        generation_id: generation.generation_id,
        hub: None,
        prepared: storage.prepared,
        container_id: held.container_id,
        runtime_root: running.runtime_root,
        helper,
        network,
        resolver: servers.resolver,
        proxy: servers.proxy,
        router: routed.router,
        workspace: routed.status,
        workspace_watch: routed.watch,
        uppers: storage.uppers,
    })
}

/// A network failure the connectivity helper's exit explains says so, with
/// what the helper wrote: the sidecar sees only that it never attached.
fn helper_failed(failure: Failure, helper: Option<&ConnectivityHelper>) -> Failure {
    if failure.step == StartupStep::Network
        && let Some(why) = helper.and_then(ConnectivityHelper::explain)
    {
        return failure.within(format!("the connectivity helper could not attach: {why}"));
    }
    failure
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

#[cfg(test)]
mod tests {
    use lazaret_proto::config::{
        ConfigurationFingerprintRecordV1, ConfigurationFingerprintRecordV2, ConfigurationRecord,
        RFC1918,
    };
    use lazaret_proto::names::{DnsMode, HostPattern};

    use super::differences;

    mod bring_up {
        //! The steps of `start` and `bring_up` that run without root or
        //! runsc, on a scratch host.

        use std::os::fd::AsFd;
        use std::sync::Arc;
        use std::time::{Duration, Instant};

        use lazaret_proto::channel::Endpoint;
        use lazaret_proto::control::{ControlRequest, ControlResponse, FailureKind, StartupStep};
        use lazaret_proto::ownership::ParticipantOwnership;
        use lazaret_proto::store::{GenerationState, ParticipantState};

        use super::super::{
            Args, IgnoreChangesMode, Ownership, begin, load, new_generation, open_stores, own,
            recover_stale,
        };
        use crate::lifecycle::CONTROL_SOCKET;
        use crate::lifecycle::record::Recorder;
        use crate::lifecycle::testing::{Scratch, generation};
        use crate::network::{HostNetwork, PlannedNetwork};
        use lazaret_storage::store::Slot;

        #[test]
        fn a_profile_name_that_does_not_parse_is_an_invalid_configuration() {
            let scratch = Scratch::new();
            let failed = load(&Args {
                profile: "not a profile!".into(),
                config: Some(scratch.config.clone().into()),
                workspace: scratch.workspace.clone(),
                ignore_changes: IgnoreChangesMode::Keep,
            })
            .unwrap_err();
            assert_eq!(failed.step, StartupStep::Configuration);
            assert_eq!(failed.kind, FailureKind::InvalidConfiguration);
            assert!(
                failed
                    .account
                    .to_string()
                    .starts_with("invalid configuration: "),
                "{}",
                failed.account.to_string()
            );
        }

        #[test]
        fn a_domain_nobody_holds_is_taken() {
            let scratch = Scratch::new();
            let resolved = scratch.load("");
            let runtime = &resolved.authorities().domain_runtime;
            let owned = own(runtime, &resolved, Duration::ZERO).unwrap();
            assert!(matches!(owned, Ownership::Mine(_)));
            // Held now: a second lock is refused.
            assert!(crate::lifecycle::try_lock(runtime).unwrap().is_none());
        }

        #[test]
        fn a_domain_held_and_never_served_fails_ownership_once_the_wait_is_over() {
            let scratch = Scratch::new();
            let resolved = scratch.load("");
            let runtime = &resolved.authorities().domain_runtime;
            let _held = crate::lifecycle::try_lock(runtime).unwrap().expect("free");
            let started = Instant::now();
            let failed = match own(runtime, &resolved, Duration::from_millis(200)) {
                Err(failed) => failed,
                Ok(_) => panic!("a held Domain was taken"),
            };
            assert!(started.elapsed() >= Duration::from_millis(200));
            assert!(started.elapsed() < Duration::from_secs(10));
            assert_eq!(failed.step, StartupStep::Ownership);
            assert!(
                failed.account.to_string().contains("without serving it"),
                "{}",
                failed.account.to_string()
            );
            assert!(
                failed.account.to_string().contains("lazaret down p"),
                "{}",
                failed.account.to_string()
            );
        }

        #[test]
        fn an_owner_that_answers_status_with_something_else_is_refused() {
            let scratch = Scratch::new();
            let resolved = scratch.load("");
            let runtime = &resolved.authorities().domain_runtime;
            let _held = crate::lifecycle::try_lock(runtime).unwrap().expect("free");
            let listener = lazaret_proto::channel::listen(&lazaret_proto::channel::socket_path_at(
                runtime.fd(),
                CONTROL_SOCKET,
            ))
            .unwrap();
            let owner = std::thread::spawn(move || {
                let peer =
                    Endpoint::<ControlResponse, ControlRequest>::accept(listener.as_fd()).unwrap();
                let asked = peer.recv().unwrap().message;
                let answer = ControlResponse::Failed {
                    failure: lazaret_proto::failure::Failure::check("busy"),
                };
                peer.send(&answer, &[]).unwrap();
                asked
            });
            let failed = match own(runtime, &resolved, Duration::from_secs(5)) {
                Err(failed) => failed,
                Ok(_) => panic!("a held Domain was taken"),
            };
            assert_eq!(owner.join().unwrap(), ControlRequest::Status);
            assert_eq!(failed.step, StartupStep::Ownership);
            assert!(
                failed
                    .account
                    .to_string()
                    .contains("the running coordinator answered"),
                "{}",
                failed.account.to_string()
            );
        }

        #[test]
        fn a_new_generation_is_the_stores_next_held_by_this_process_and_starting() {
            let scratch = Scratch::new();
            let resolved = scratch.load("");
            let owned = open_stores(&resolved).unwrap();
            let earlier = generation(&resolved, 1, GenerationState::Closed);
            owned.store.put_generation(&earlier).unwrap();
            let (next, me) = new_generation(&owned, &resolved).unwrap();
            assert_eq!(next.generation_id.0, 2);
            assert_eq!(next.state, GenerationState::Starting);
            assert_eq!(next.domain_id, resolved.domain_id());
            assert_eq!(next.configuration_fingerprint, resolved.fingerprint());
            assert_eq!(next.host_coordinator, me.committed());
            assert_eq!(me.identity.host_pid, std::process::id());
            // Nothing is recorded until bring-up begins it.
            assert_eq!(
                owned
                    .store
                    .latest_generation()
                    .unwrap()
                    .unwrap()
                    .generation_id
                    .0,
                1
            );
        }

        #[test]
        fn a_stale_generation_is_finished_before_a_new_one_begins() {
            let scratch = Scratch::new();
            let resolved = scratch.load("");
            let owned = open_stores(&resolved).unwrap();
            assert_eq!(recover_stale(&owned, &resolved).unwrap(), None);
            let stale = generation(&resolved, 4, GenerationState::Running);
            owned.store.put_generation(&stale).unwrap();
            let finished = recover_stale(&owned, &resolved).unwrap();
            assert_eq!(finished.map(|id| id.0), Some(4));
            assert!(owned.store.open_generation().unwrap().is_none());
            let closed = owned.store.latest_generation().unwrap().unwrap();
            assert_eq!(closed.state, GenerationState::Closed);
            assert!(closed.closed_at.is_some());
            assert_eq!(recover_stale(&owned, &resolved).unwrap(), None);
        }

        #[test]
        fn begin_records_the_generation_with_every_first_intent_in_one_commit() {
            let scratch = Scratch::new();
            let resolved = scratch.load("persistent_dirs = ['/root', '/opt']");
            let store = crate::lifecycle::testing::store_of(&resolved);
            let host = HostNetwork {
                addresses: Vec::new(),
                on_link: Vec::new(),
                gateways: Vec::new(),
            };
            let planned = PlannedNetwork::new(resolved.network(), &host).unwrap();
            let starting = generation(&resolved, 1, GenerationState::Starting);
            let recorder = Recorder::new(Arc::clone(&store), starting.generation_id);
            let begun = begin(&recorder, &resolved, &starting, &planned).unwrap();
            assert_eq!(begun.anchors.len(), 2);
            let stored = store.latest_generation().unwrap().expect("recorded");
            assert_eq!(stored.state, GenerationState::Starting);
            let rows = store.participants(starting.generation_id).unwrap();
            let slots: Vec<Slot> = rows.iter().map(|(slot, _)| *slot).collect();
            for slot in [
                Slot::SUPERVISOR,
                Slot::NAMESPACE_HOLDER,
                Slot::PREPARED_LOWER,
                Slot::PUBLICATION,
                Slot::SESSION_PUBLICATION,
                Slot::NETWORK,
                Slot::CONNECTIVITY_HELPER,
                Slot::state_anchor(0),
                Slot::state_anchor(1),
            ] {
                assert!(slots.contains(&slot), "no intent in {}", slot.name());
            }
            assert_eq!(rows.len(), 9, "nothing else is recorded yet");
            assert!(
                rows.iter()
                    .all(|(_, row)| row.state == ParticipantState::Intent),
                "nothing exists before it is recorded as intended"
            );
            let network = rows
                .iter()
                .find(|(slot, _)| *slot == Slot::NETWORK)
                .map(|(_, row)| row.ownership.clone());
            let Some(ParticipantOwnership::Network(network)) = network else {
                panic!("the network's record");
            };
            assert_eq!(
                network.derived_policy_digest,
                Some(planned.policy.digest().unwrap())
            );
            assert_eq!(network.enforcement_namespace, None);
            drop(begun);
        }
    }

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
            credentials: Vec::new(),
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
