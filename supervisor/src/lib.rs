//! The Runtime Supervisor of one generation.
//!
//! It runs as two processes of the same binary. The first, started by the
//! Host Coordinator:
//! 1. arms `PR_SET_PDEATHSIG` so it dies with the coordinator;
//! 2. enters a new user namespace mapping the invoking user to root, then
//!    mount, network, pid, ipc and uts namespaces owned by it;
//! 3. forks the init of the new pid namespace, which goes on with the
//!    channel (no `exec`: the same program, already loaded), and waits for
//!    it.
//!
//! The second, the Domain's pid 1 and namespace holder:
//! 4. arms `PR_SET_PDEATHSIG` and mounts a `/proc` of the Domain pid
//!    namespace;
//! 5. reports the namespaces, with descriptors of the user and network
//!    namespaces for the connectivity helper, and its own pidfd, at once:
//!    the coordinator prepares the image and state meanwhile;
//! 6. starts the first Network Sidecar and the Workspace Router, then
//!    serves the requests that come before the sandbox runs, in the order
//!    they come: `Start` with the
//!    [`SandboxPlan`] and its descriptors, and `AttestNetwork`, each on a
//!    thread of its own, so that the plan is staged while the sidecar
//!    attests;
//! 7. for `Start`: reopens every descriptor inside the Domain mount
//!    namespace, checking each is the object the coordinator opened;
//!    stages the filesystem (root overlay, State Anchor overlays, volumes,
//!    control area) on a private tmpfs while, beside it, the routed
//!    workspace's mount is made detached and its Workspace Router starts
//!    serving it; attaches that mount in the staging, reports the router,
//!    and writes the OCI bundle;
//! 8. for `AttestNetwork`: hands the sidecar (in the enforcement
//!    namespace, with CAP_NET_ADMIN alone) the policy and the connectivity
//!    helper's ready pipe, and relays its attestation; with names, starts
//!    Lazaret's resolver, and with credentials the Credential Proxy, and
//!    relays their readiness;
//! 9. on `RunSandbox`, and only with the plan staged and an attestation
//!    relayed, writes the sandbox's trust bundle (with credentials), makes
//!    the control area read-only and runs `runsc run -detach`;
//! 10. reports the pidfds of the runsc sandbox and gofer, which are now its
//!    children, and reaps every orphan at once from then on;
//! 11. on `Stop`, or when the coordinator vanishes, exits: the kernel ends
//!    every process left in the pid namespace, the sandbox included, and
//!    the mounts end with the mount namespace.
//!
//! It holds capabilities only inside the Domain user namespace. It trusts
//! only the coordinator at the other end of its inherited channel.

#![deny(missing_docs)]

mod bundle;
mod exec;
mod helper;
mod mounts;
mod namespaces;
mod network;
mod report;
mod runsc;
mod seccomp;
mod sys;
mod syscall;
mod workspace;

// Which platform a runsc gets, as the tests that depend on it ask.
pub use runsc::Platform;

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use lazaret_proto::channel::{ChannelError, Endpoint, Received};
use lazaret_proto::error_chain as chain;
use lazaret_proto::failure::Failure;
use lazaret_proto::supervisor::{
    ExecRequest, ExecStdio, FdIndex, FdList, PLAN_LIMITS, ProxyServed, SandboxPlan,
    SupervisorError, SupervisorReport, SupervisorRequest, SupervisorStep,
};
use report::{failed, reported};
use rustix::fs::{Mode, OFlags};
use rustix::process::{Pid, PidfdFlags, Signal, pidfd_open};

type Channel = Endpoint<SupervisorReport, SupervisorRequest>;

/// Runs the supervisor.
pub fn run() -> ExitCode {
    // Nothing inherited beyond the standard streams (the channel is
    // standard input) stays open in a role.
    if let Err(e) = lazaret_proto::sys::close_inherited_descriptors() {
        eprintln!("lazaret-supervisor: cannot close inherited descriptors: {e}");
        return ExitCode::FAILURE;
    }
    if std::env::args_os().len() > 1 {
        eprintln!(
            "lazaret-supervisor: started with unexpected arguments; it is started by \
             lazaret-coordinator, not by hand"
        );
        return ExitCode::from(2);
    }
    enter_namespaces()
}

/// Dies with the parent; false when the parent is already gone.
fn bind_to_parent() -> bool {
    rustix::process::set_parent_process_death_signal(Some(Signal::KILL)).is_ok()
        && rustix::process::getppid().is_none_or(|p| !p.is_init())
}

/// Stage one: create the namespaces, start pid 1 in them, wait for it.
fn enter_namespaces() -> ExitCode {
    lazaret_proto::logging::init();
    if !bind_to_parent() {
        tracing::error!("its coordinator is gone; exiting");
        return ExitCode::FAILURE;
    }
    let channel = match Channel::take_role_stdin("lazaret-supervisor", "lazaret") {
        Ok(channel) => channel,
        Err(e) => {
            tracing::error!("{}", chain(&e));
            return ExitCode::FAILURE;
        }
    };
    let uid = rustix::process::getuid().as_raw();
    let gid = rustix::process::getgid().as_raw();
    if let Err(e) = namespaces::enter(uid, gid) {
        let error = reported(SupervisorStep::Namespaces, &e);
        let _ = channel.send(&SupervisorReport::Failed(error), &[]);
        return ExitCode::FAILURE;
    }
    bound_domain_tasks();
    match sys::fork_single_threaded() {
        Ok(sys::Forked::Child) => pid1(channel),
        Ok(sys::Forked::Parent(child)) => {
            // Pid 1 is the channel's only holder from here on.
            drop(channel);
            if let Err(e) = seccomp::install_stage_one() {
                tracing::error!("{}", chain(&e));
                return ExitCode::FAILURE;
            }
            match rustix::process::waitid(
                rustix::process::WaitId::PidFd(child.as_fd()),
                rustix::process::WaitIdOptions::EXITED,
            ) {
                Ok(Some(status)) if status.exit_status() == Some(0) => ExitCode::SUCCESS,
                Ok(Some(status)) if status.terminating_signal() == Some(libc::SIGSYS) => {
                    tracing::error!("the Domain's pid 1 {}", lazaret_proto::seccomp::KILLED);
                    ExitCode::from(lazaret_proto::seccomp::PID1_KILLED_EXIT)
                }
                Ok(_) => ExitCode::FAILURE,
                Err(e) => {
                    tracing::error!("cannot wait for the Domain pid 1: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Err(e) => {
            tracing::error!("cannot start the Domain pid 1: {e}");
            let error = failed(
                SupervisorStep::Namespaces,
                format!(
                    "cannot fork the Domain's pid 1 ({e}); if the invoking user's process \
                     limit is reached (`ulimit -u`), end some of its processes and run \
                     `lazaret up` again"
                ),
            );
            let _ = channel.send(&SupervisorReport::Failed(error), &[]);
            ExitCode::FAILURE
        }
    }
}

/// The most host tasks (processes and threads) the Domain may have: the
/// kernel counts them per user namespace, so the sandbox, the router and
/// the supervisor share this bound, and a sandbox that reaches it cannot
/// take every pid of the host (a quarter of the usual `pid_max`). On
/// systrap a process inside costs about two host tasks, so a uid's
/// 512 processes (the sandbox's bound per uid) fit seven times over
/// (see `runsc::Platform`). Not enforced when the invoking user is root.
pub const DOMAIN_TASKS: u64 = 8192;

/// Sets `RLIMIT_NPROC` to [`DOMAIN_TASKS`] (or the lower hard limit this
/// process already has) for itself and everything it starts.
fn bound_domain_tasks() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let hard = getrlimit(Resource::Nproc).maximum.unwrap_or(u64::MAX);
    let bound = DOMAIN_TASKS.min(hard);
    let limit = Rlimit {
        current: Some(bound),
        maximum: Some(bound),
    };
    if let Err(e) = setrlimit(Resource::Nproc, limit) {
        tracing::warn!("cannot bound the Domain's tasks: {e}");
    }
}

/// Stage two: the Domain pid namespace's init, forked from stage one with
/// its channel.
fn pid1(channel: Channel) -> ExitCode {
    // Stage one's parent-death signal covers the coordinator; this one
    // covers stage one. Its parent is outside the pid namespace, so
    // `getppid` reads 0 here and cannot be checked.
    let _ = rustix::process::set_parent_process_death_signal(Some(Signal::KILL));
    let channel = channel.with_limits(PLAN_LIMITS);
    let net_fd = match report_namespaces(&channel) {
        Ok(net_fd) => net_fd,
        Err(error) => return fail(&channel, error),
    };
    let network = Arc::new(net_fd);
    match prepare_and_run(&channel, &network) {
        Ok(Some(running)) => serve(Arc::new(channel), Arc::new(running), exec::Reaper::start()),
        Ok(None) => {
            let _ = channel.send(&SupervisorReport::Stopped, &[]);
            ExitCode::SUCCESS
        }
        Err(error) => fail(&channel, error),
    }
}

/// Logs and reports `error`; the exit code of a failed supervisor.
fn fail(channel: &Channel, error: SupervisorError) -> ExitCode {
    report_failure(channel, error);
    ExitCode::FAILURE
}

/// Mounts the Domain's `/proc` and reports the namespaces: this process's
/// pidfd (the holder) and descriptors of the user and network namespaces.
/// Returns the network namespace's, for the sidecar.
fn report_namespaces(channel: &Channel) -> Result<OwnedFd, SupervisorError> {
    mounts::private_proc(&syscall::Host).map_err(|e| reported(SupervisorStep::Mounts, &e))?;
    let own_pidfd = pidfd_open(rustix::process::getpid(), PidfdFlags::empty()).map_err(|e| {
        failed(
            SupervisorStep::Identities,
            format!("pidfd of the supervisor: {e}"),
        )
    })?;
    let open = |file| namespaces::open(file).map_err(|e| reported(SupervisorStep::Namespaces, &e));
    let (user_fd, user_namespace) = open("/proc/self/ns/user")?;
    let (net_fd, network_namespace) = open("/proc/self/ns/net")?;
    let report = SupervisorReport::NamespacesReady {
        user_namespace,
        network_namespace,
        holder: FdIndex(0),
        user_namespace_fd: FdIndex(1),
        network_namespace_fd: FdIndex(2),
    };
    send(
        channel,
        SupervisorStep::Namespaces,
        &report,
        &[own_pidfd.as_fd(), user_fd.as_fd(), net_fd.as_fd()],
    )?;
    Ok(net_fd)
}

fn fd_at(fds: &[OwnedFd], index: FdIndex) -> Result<BorrowedFd<'_>, SupervisorError> {
    index.get(fds).ok_or_else(|| {
        failed(
            SupervisorStep::Request,
            format!("descriptor {} is missing", index.0),
        )
    })
}

/// What serving a running sandbox needs; shared with the threads that
/// signal sessions.
struct Running {
    runsc: PathBuf,
    platform: runsc::Platform,
    runsc_root: PathBuf,
    container_id: String,
    /// The enforcement network namespace, for the sidecar's read-backs.
    network: Arc<OwnedFd>,
}

impl Running {
    /// The runsc that serves this sandbox.
    fn runsc(&self) -> runsc::Runsc<'_> {
        runsc::Runsc {
            runsc: &self.runsc,
            platform: self.platform,
            root: &self.runsc_root,
            container_id: &self.container_id,
        }
    }
}

/// Serves the requests before the sandbox runs: `Start` once, with the
/// plan, staged on a thread of its own; `AttestNetwork` at any time, each
/// attested on a thread of its own, so the sidecar works while the plan is
/// staged; then `RunSandbox`, which needs the plan staged and an
/// attestation made. Each thread reports its own failure (the coordinator
/// then stops this supervisor). `None` when asked to stop first.
fn prepare_and_run(
    channel: &Channel,
    network: &Arc<OwnedFd>,
) -> Result<Option<Running>, SupervisorError> {
    // The first sidecar and the router start now, while nothing is asked
    // of them yet.
    let mut sidecar = Some(network::start_sidecar());
    let mut router = Some(workspace::start_router());
    std::thread::scope(|scope| {
        let mut preparing: Option<std::thread::ScopedJoinHandle<'_, Option<Prepared>>> = None;
        let mut attesting: Option<std::thread::ScopedJoinHandle<'_, Option<Attested>>> = None;
        let mut attested: Option<Attested> = None;
        loop {
            let Received { message, fds } = channel
                .recv()
                .map_err(|e| reported(SupervisorStep::Request, &e))?;
            match message {
                SupervisorRequest::Start(plan) if preparing.is_none() => {
                    let router = router.take().unwrap_or_else(workspace::start_router);
                    preparing = Some(scope.spawn(move || {
                        prepare(channel, &plan, &fds, router)
                            .map_err(|error| report_failure(channel, error))
                            .ok()
                    }));
                }
                SupervisorRequest::AttestNetwork {
                    parameters,
                    policy,
                    helper_ready,
                    proxy,
                } => {
                    let owned = |index: FdIndex, what: &str| {
                        fd_at(&fds, index)?
                            .try_clone_to_owned()
                            .map_err(|e| SupervisorError {
                                step: SupervisorStep::Request,
                                failure: Failure::os(what, &e, None),
                            })
                    };
                    let policy = owned(policy, "the policy memfd")?;
                    let helper_ready = owned(helper_ready, "the helper's ready pipe")?;
                    let proxy = proxy
                        .map(|plan| {
                            owned(plan.credentials, "the credentials memfd")
                                .map(|credentials| (credentials, plan.hosts))
                        })
                        .transpose()?;
                    // One attestation at a time, in the order asked.
                    if let Some(earlier) = attesting.take() {
                        attested = earlier.join().ok().flatten().or(attested);
                    }
                    let started = sidecar.take().unwrap_or_else(network::start_sidecar);
                    attesting = Some(scope.spawn(move || {
                        attest(
                            channel,
                            started,
                            network,
                            [&policy, &helper_ready],
                            parameters,
                            proxy,
                        )
                    }));
                }
                SupervisorRequest::RunSandbox => {
                    if let Some(last) = attesting.take() {
                        attested = last.join().ok().flatten().or(attested);
                    }
                    let prepared = preparing.take().and_then(|t| t.join().ok().flatten());
                    let Some(prepared) = prepared else {
                        return Err(failed(
                            SupervisorStep::Request,
                            "the sandbox cannot run before its plan is staged",
                        ));
                    };
                    let Some(attested) = attested else {
                        return Err(failed(
                            SupervisorStep::Request,
                            "the sandbox cannot run before its network is attested",
                        ));
                    };
                    return run_sandbox(channel, prepared, network, attested).map(Some);
                }
                SupervisorRequest::Stop => return Ok(None),
                other => {
                    return Err(failed(
                        SupervisorStep::Request,
                        format!("unexpected request before the sandbox runs: {other:?}"),
                    ));
                }
            }
        }
    })
}

/// What an attested network leaves for running the sandbox.
#[derive(Debug)]
struct Attested {
    /// The Credential Proxy's CA certificate (PEM), for the sandbox's
    /// trust, when the profile has credentials.
    proxy_ca: Option<String>,
}

/// Has the Network Sidecar install and attest the policy, then Lazaret's
/// resolver serve its names and, with credentials, the Credential Proxy
/// serve them; reports what it attested or why it could not (the
/// coordinator then stops this supervisor). `None` when it did not attest.
fn attest(
    channel: &Channel,
    sidecar: Result<network::Sidecar, helper::HelperError>,
    network: &OwnedFd,
    [policy, helper_ready]: [&OwnedFd; 2],
    parameters: lazaret_proto::sidecar::AttestParameters,
    proxy: Option<(OwnedFd, Vec<String>)>,
) -> Option<Attested> {
    let names = parameters.names.clone();
    let resolver = names.as_ref().map(|_| network::start_resolver());
    let started_proxy = proxy.as_ref().map(|_| network::start_proxy());
    let attested = sidecar
        .map_err(network::NetworkError::from)
        .and_then(|sidecar| {
            network::attest(
                sidecar,
                parameters,
                [network, policy, helper_ready].map(AsFd::as_fd),
            )
        });
    // A policy with names: Lazaret's resolver, once the filter holds its
    // set; then the Credential Proxy, whose lookups it answers.
    let served = attested.and_then(|attestation| match (names, resolver) {
        (Some(names), Some(resolver)) => {
            let sockets = proxy
                .as_ref()
                .map(|_| network::ProxySockets::new())
                .transpose()?;
            let proxied = proxy
                .as_ref()
                .map(|(_, hosts)| hosts.clone())
                .unwrap_or_default();
            let lookups = sockets.as_ref().map(|s| s.resolver_end.as_fd());
            let resolver =
                network::serve_names(resolver?, names, policy.as_fd(), proxied, lookups)?;
            let served = match (proxy, started_proxy, sockets) {
                (Some((credentials, _)), Some(started), Some(sockets)) => {
                    Some(network::serve_credentials(
                        started?,
                        credentials.as_fd(),
                        sockets.listener.as_fd(),
                        sockets.proxy_end.as_fd(),
                    )?)
                }
                _ => None,
            };
            Ok((attestation, Some((resolver, served))))
        }
        _ => Ok((attestation, None)),
    });
    let sent = match served {
        Ok((attestation, None)) => {
            let report = SupervisorReport::NetworkAttested(Box::new(attestation));
            send(channel, SupervisorStep::Network, &report, &[]).map(|()| None)
        }
        Ok((attestation, Some(((resolver, readiness), proxy)))) => {
            let mut fds = FdList::new();
            let resolver_index = fds.push(resolver.as_fd());
            let proxy_ca = proxy.as_ref().map(|(_, r)| r.ca_certificate.clone());
            let report = SupervisorReport::NamesServed {
                attestation: Box::new(attestation),
                resolver: resolver_index,
                readiness,
                proxy: proxy.as_ref().map(|(pidfd, readiness)| ProxyServed {
                    pidfd: fds.push(pidfd.as_fd()),
                    readiness: readiness.clone(),
                }),
            };
            send(channel, SupervisorStep::Network, &report, fds.as_slice()).map(|()| proxy_ca)
        }
        Err(e) => Err(reported(SupervisorStep::Network, &e)),
    };
    match sent {
        Ok(proxy_ca) => Some(Attested { proxy_ca }),
        Err(error) => {
            report_failure(channel, error);
            None
        }
    }
}

/// Logs and reports the failure of a step that runs beside the request
/// loop; the coordinator then stops this supervisor.
fn report_failure(channel: &Channel, error: SupervisorError) {
    tracing::error!("{:?} failed: {}", error.step, error.failure);
    let _ = channel.send(&SupervisorReport::Failed(error), &[]);
}

/// The plan, staged: what running the sandbox needs.
struct Prepared {
    staged: mounts::Staged,
    runsc: PathBuf,
    container_id: String,
}

/// Stages the plan: the mounts, the Workspace Router (reported) and the
/// bundle.
fn prepare(
    channel: &Channel,
    plan: &SandboxPlan,
    fds: &[OwnedFd],
    router: Result<workspace::Router, helper::HelperError>,
) -> Result<Prepared, SupervisorError> {
    // The coordinator's descriptors name host mounts; reopen each mount
    // source as the same object inside the Domain mount namespace.
    let rebased = |index: FdIndex, what: &str| {
        mounts::rebase(fd_at(fds, index)?, what).map_err(|e| reported(SupervisorStep::Mounts, &e))
    };
    let rootfs = rebased(plan.rootfs, "the image's root filesystem")?;
    let workspace = rebased(plan.workspace, "the workspace")?;
    let isolated = rebased(plan.isolated, "the Domain's isolated workspace directory")?;
    let anchor_dirs = plan
        .anchors
        .iter()
        .map(|a| rebased(a.state_dir, &format!("the state of {}", a.sandbox_path)))
        .collect::<Result<Vec<_>, _>>()?;
    let volume_sources = plan
        .volumes
        .iter()
        .map(|v| {
            rebased(
                v.source,
                &format!("the source of volume {}", v.sandbox_path),
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let sources = mounts::Sources {
        rootfs: rootfs.as_fd(),
        anchors: plan
            .anchors
            .iter()
            .zip(&anchor_dirs)
            .map(|(a, fd)| mounts::AnchorSource {
                sandbox_path: &a.sandbox_path,
                state_dir: fd.as_fd(),
            })
            .collect(),
        volumes: plan
            .volumes
            .iter()
            .zip(&volume_sources)
            .map(|(v, fd)| mounts::VolumeSource {
                sandbox_path: &v.sandbox_path,
                source: fd.as_fd(),
                kind: v.kind,
                access: v.access,
            })
            .collect(),
    };
    let environment = bundle::read_environment(fd_at(fds, plan.environment)?)
        .map_err(|e| reported(SupervisorStep::Bundle, &e))?;
    let runtime_dir = Path::new(plan.runtime_dir.as_os_str());
    let runsc = PathBuf::from(plan.runsc.as_os_str());

    // The router serves the workspace's mount, attached nowhere yet,
    // while the rest is staged.
    let (staged, served) = std::thread::scope(|scope| {
        let serving = scope.spawn(|| {
            workspace::serve(
                router,
                workspace.as_fd(),
                isolated.as_fd(),
                fd_at(fds, plan.workspace_rules)?,
            )
            .map_err(|e| reported(SupervisorStep::Workspace, &e))
        });
        let staged = mounts::stage(&syscall::Host, runtime_dir, &sources, &plan.resolvers)
            .map_err(|e| reported(SupervisorStep::Mounts, &e));
        let served = serving.join().unwrap_or_else(|_| {
            Err(failed(
                SupervisorStep::Workspace,
                "serving the workspace failed unexpectedly (its thread panicked); see the Domain log",
            ))
        });
        (staged, served)
    });
    let staged = staged?;
    let routed = served?
        .attach(&staged.workspace)
        .map_err(|e| reported(SupervisorStep::Workspace, &e))?;
    let report = SupervisorReport::WorkspaceRouted {
        router: FdIndex(0),
        summary: routed.summary,
    };
    send(
        channel,
        SupervisorStep::Workspace,
        &report,
        &[routed.pidfd.as_fd()],
    )?;
    drop(routed);
    bundle::write(&staged, "lazaret", &environment)
        .map_err(|e| reported(SupervisorStep::Bundle, &e))?;
    Ok(Prepared {
        staged,
        runsc,
        container_id: plan.container_id.to_string(),
    })
}

/// Completes the control area, runs the sandbox and reports its processes
/// and mailbox.
fn run_sandbox(
    channel: &Channel,
    prepared: Prepared,
    network: &Arc<OwnedFd>,
    attested: Attested,
) -> Result<Running, SupervisorError> {
    let Prepared {
        staged,
        runsc,
        container_id,
    } = prepared;
    // With credentials, the sandbox trusts what it trusted, and the
    // Credential Proxy's CA after it.
    let trust = attested
        .proxy_ca
        .map(|ca| {
            mounts::image_trust(&staged.rootfs).map(|mut bundle| {
                if !bundle.is_empty() && !bundle.ends_with(b"\n") {
                    bundle.push(b'\n');
                }
                bundle.extend_from_slice(ca.as_bytes());
                bundle
            })
        })
        .transpose()
        .map_err(|e| reported(SupervisorStep::Mounts, &e))?;
    mounts::seal_control(&syscall::Host, &staged.control, trust.as_deref())
        .map_err(|e| reported(SupervisorStep::Mounts, &e))?;
    let platform = runsc::Platform::of(&runsc);
    if platform == runsc::Platform::Ptrace {
        tracing::warn!(
            "{} offers no systrap platform: the sandbox runs on ptrace, whose host threads \
             grow with every process started inside and are never given back, so a sandbox \
             that starts many processes over its life can reach the Domain's bound of {} \
             host tasks and end; install runsc 2023 or later (Debian: bookworm-backports)",
            runsc.display(),
            DOMAIN_TASKS
        );
    }
    let running = Running {
        runsc,
        platform,
        runsc_root: staged.runsc_root.clone(),
        container_id,
        network: Arc::clone(network),
    };
    let began = std::time::Instant::now();
    running
        .runsc()
        .run_detached(&staged.bundle)
        .map_err(|e| reported(SupervisorStep::Runtime, &e))?;
    let elapsed_ms = u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX);
    tracing::info!(
        elapsed_ms,
        platform = running.platform.name(),
        "runsc run -detach returned"
    );

    let (sandbox, gofer) =
        runsc_processes().map_err(|e| reported(SupervisorStep::Identities, &e))?;
    let mailbox = rustix::fs::open(
        &staged.mailbox,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| SupervisorError {
        step: SupervisorStep::Mounts,
        failure: Failure::os(
            "cannot open the mailbox",
            e,
            Some(staged.mailbox.as_path().into()),
        ),
    })?;
    let mut fds = FdList::new();
    let sandbox_index = fds.push(sandbox.as_fd());
    let gofer_index = gofer.as_ref().map(|g| fds.push(g.as_fd()));
    let mailbox_index = fds.push(mailbox.as_fd());
    let report = SupervisorReport::SandboxRunning {
        sandbox: sandbox_index,
        gofer: gofer_index,
        runtime_root: staged.runsc_root.as_path().into(),
        bundle: staged.bundle.as_path().into(),
        mailbox: mailbox_index,
    };
    // Everything this process does from here on is in its list.
    seccomp::install_stage_two().map_err(|e| reported(SupervisorStep::Runtime, &e))?;
    send(channel, SupervisorStep::Identities, &report, fds.as_slice())?;
    Ok(running)
}

/// Sends a report made at `step`; a failure to send fails that step.
fn send(
    channel: &Channel,
    step: SupervisorStep,
    report: &SupervisorReport,
    fds: &[BorrowedFd<'_>],
) -> Result<(), SupervisorError> {
    channel.send(report, fds).map_err(|e| SupervisorError {
        step,
        failure: report::failure_of(&e).within("cannot report to the coordinator"),
    })
}

/// A pidfd for a child of this process.
pub(crate) fn pidfd_of(pid: u32) -> std::io::Result<OwnedFd> {
    let pid = i32::try_from(pid)
        .ok()
        .and_then(Pid::from_raw)
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    pidfd_open(pid, PidfdFlags::empty()).map_err(Into::into)
}

/// Why the runsc sandbox's processes could not be found.
#[derive(Debug, thiserror::Error)]
enum ProcessesError {
    /// The supervisor's children could not be listed.
    #[error("cannot list the supervisor's children")]
    Children(#[source] std::io::Error),
    /// None of them is the sandbox.
    #[error("runsc started no sandbox process")]
    NoSandbox,
}

/// The pidfds of the runsc sandbox and gofer: after `run -detach` returns,
/// they are children of this process, the pid namespace's init.
fn runsc_processes() -> Result<(OwnedFd, Option<OwnedFd>), ProcessesError> {
    let children =
        std::fs::read_to_string("/proc/self/task/1/children").map_err(ProcessesError::Children)?;
    let mut sandbox = None;
    let mut gofer = None;
    for pid in children
        .split_whitespace()
        .filter_map(|p| p.parse::<u32>().ok())
    {
        // Open the pidfd first, then read its name: the pidfd pins the
        // process, so the name cannot belong to a successor.
        let Ok(pidfd) = pidfd_of(pid) else { continue };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let name = cmdline.split(|b| *b == 0).next().unwrap_or_default();
        if name.ends_with(b"runsc-sandbox") {
            sandbox = Some(pidfd);
        } else if name.ends_with(b"runsc-gofer") {
            gofer = Some(pidfd);
        }
    }
    let sandbox = sandbox.ok_or(ProcessesError::NoSandbox)?;
    Ok((sandbox, gofer))
}

/// Serves the running sandbox: session processes until `Stop`.
fn serve(
    channel: Arc<Channel>,
    running: Arc<Running>,
    reaper: Arc<dyn syscall::Processes>,
) -> ExitCode {
    loop {
        match channel.recv() {
            Ok(Received {
                message: SupervisorRequest::Stop,
                ..
            }) => {
                // Exiting as the pid namespace's init makes the kernel kill
                // every process left in it, the runsc sandbox and gofer
                // included; the mounts end with the mount namespace.
                let _ = channel.send(&SupervisorReport::Stopped, &[]);
                return ExitCode::SUCCESS;
            }
            Ok(Received {
                message: SupervisorRequest::Exec(request),
                fds,
            }) => {
                let session_id = request.session_id;
                let started = start_exec(&running, reaper.as_ref(), &request, &fds);
                match started {
                    Ok(started) => {
                        let (channel, reaper) = (Arc::clone(&channel), Arc::clone(&reaper));
                        std::thread::spawn(move || {
                            // Started means running inside: a sandbox or
                            // workspace that does not answer keeps the
                            // session from opening, within the
                            // coordinator's bound, instead of opening one
                            // that never runs.
                            exec::wait_running(&started);
                            let report = SupervisorReport::ExecStarted {
                                session_id,
                                process: FdIndex(0),
                            };
                            let _ = channel.send(&report, &[started.pidfd.as_fd()]);
                            let exit = exec::wait(reaper.as_ref(), started);
                            let report = SupervisorReport::ExecExited {
                                session_id,
                                exit_code: exit.code,
                                signaled: exit.signaled,
                            };
                            let _ = channel.send(&report, &[]);
                        });
                    }
                    Err(e) => {
                        let failure = report::failure_of(&e);
                        let _ = channel.send(
                            &SupervisorReport::ExecFailed {
                                session_id,
                                failure,
                            },
                            &[],
                        );
                    }
                }
            }
            Ok(Received {
                message: SupervisorRequest::SignalExec { session_id, signal },
                ..
            }) => {
                // On a thread of its own: a sandbox that does not answer
                // holds up its `runsc kill` (within the bound), not the
                // other sessions' requests.
                let (running, reaper) = (Arc::clone(&running), Arc::clone(&reaper));
                std::thread::spawn(move || {
                    if let Err(e) =
                        exec::signal(reaper.as_ref(), &running.runsc(), session_id, signal)
                    {
                        tracing::warn!("signal for session {session_id}: {}", chain(&e));
                    }
                });
            }
            Ok(Received {
                message: SupervisorRequest::ObserveNetwork(parameters),
                ..
            }) => {
                // The sidecar runs beside the sessions' requests, not in
                // their way.
                let (channel, namespace) = (Arc::clone(&channel), Arc::clone(&running.network));
                std::thread::spawn(move || {
                    let observed = network::observe(parameters, namespace.as_fd())
                        .map(Box::new)
                        .map_err(|e| reported(SupervisorStep::Network, &e));
                    let _ = channel.send(&SupervisorReport::NetworkObserved(observed), &[]);
                });
            }
            Ok(Received {
                message:
                    SupervisorRequest::Start(_)
                    | SupervisorRequest::AttestNetwork { .. }
                    | SupervisorRequest::RunSandbox,
                ..
            }) => {
                let error = failed(SupervisorStep::Request, "the sandbox is already started");
                let _ = channel.send(&SupervisorReport::Failed(error), &[]);
            }
            Err(ChannelError::Disconnected) => return ExitCode::FAILURE,
            Err(e) => {
                tracing::error!("channel failed: {}", chain(&e));
                return ExitCode::FAILURE;
            }
        }
    }
}

/// Starts one session process from an `Exec` request and its descriptors.
fn start_exec(
    running: &Running,
    reaper: &dyn syscall::Processes,
    request: &ExecRequest,
    fds: &[OwnedFd],
) -> Result<exec::Started, exec::ExecError> {
    let at = |index: FdIndex| {
        index
            .get(fds)
            .ok_or(exec::ExecError::MissingDescriptor { index: index.0 })
    };
    let environment = bundle::read_environment(at(request.environment)?)?;
    let stdio = match request.stdio {
        ExecStdio::Terminal { slave, .. } => (at(slave)?, at(slave)?),
        ExecStdio::Pipes { input, output } => (at(input)?, at(output)?),
    };
    exec::spawn(reaper, &running.runsc(), request, &environment, stdio)
}

#[cfg(test)]
mod tests {
    //! The request loops, driven by a scripted coordinator on a
    //! socketpair, with session processes through the recording double.

    use std::os::fd::AsRawFd;
    use std::time::Duration;

    use lazaret_proto::channel::pair;
    use lazaret_proto::ids::SessionId;
    use lazaret_proto::supervisor::{ExecSignal, ExecStdio};

    use super::*;
    use crate::syscall::ProcessStatus;
    use crate::syscall::recording::{Call, Recording};

    type Peer = Endpoint<SupervisorRequest, SupervisorReport>;

    const SESSION: SessionId = SessionId([3; 16]);

    /// The next report, within a bound, so a broken loop fails the test
    /// instead of hanging it.
    fn next(peer: &Peer) -> Received<SupervisorReport> {
        let ready =
            lazaret_proto::channel::readable_within(peer.as_fd(), Duration::from_secs(10)).unwrap();
        assert!(ready, "no report within 10 s");
        peer.recv().unwrap()
    }

    fn running(root: &Path) -> Running {
        let network = rustix::fs::open("/", OFlags::PATH | OFlags::CLOEXEC, Mode::empty()).unwrap();
        Running {
            runsc: PathBuf::from("/opt/runsc"),
            platform: runsc::Platform::Systrap,
            runsc_root: root.to_owned(),
            container_id: "lazaret-c1".into(),
            network: Arc::new(network),
        }
    }

    /// Serves on a thread; the peer, the double and the loop's exit code.
    fn serving(root: &Path) -> (Peer, Arc<Recording>, std::thread::JoinHandle<ExitCode>) {
        let (peer, channel) = pair::<SupervisorRequest, SupervisorReport>().unwrap();
        let sys = Arc::new(Recording::default());
        let running = Arc::new(running(root));
        let processes: Arc<dyn syscall::Processes> = sys.clone();
        let handle = std::thread::spawn(move || serve(Arc::new(channel), running, processes));
        (peer, sys, handle)
    }

    fn code(code: ExitCode) -> String {
        format!("{code:?}")
    }

    fn exec_request(environment: u16) -> ExecRequest {
        ExecRequest {
            session_id: SESSION,
            args: vec!["true".into()],
            cwd: "/workspace".into(),
            term: None,
            environment: FdIndex(environment),
            stdio: ExecStdio::Pipes {
                input: FdIndex(1),
                output: FdIndex(2),
            },
        }
    }

    #[test]
    fn stop_is_answered_and_ends_the_loop_successfully() {
        let root = tempfile::tempdir().unwrap();
        let (peer, _, handle) = serving(root.path());
        peer.send(&SupervisorRequest::Stop, &[]).unwrap();
        assert_eq!(next(&peer).message, SupervisorReport::Stopped);
        assert_eq!(code(handle.join().unwrap()), code(ExitCode::SUCCESS));
    }

    #[test]
    fn a_vanished_coordinator_ends_the_loop_as_a_failure() {
        let root = tempfile::tempdir().unwrap();
        let (peer, _, handle) = serving(root.path());
        drop(peer);
        assert_eq!(code(handle.join().unwrap()), code(ExitCode::FAILURE));
    }

    #[test]
    fn starting_again_is_refused_and_the_loop_goes_on() {
        let root = tempfile::tempdir().unwrap();
        let (peer, _, handle) = serving(root.path());
        peer.send(&SupervisorRequest::RunSandbox, &[]).unwrap();
        let SupervisorReport::Failed(error) = next(&peer).message else {
            panic!("not a failure")
        };
        assert_eq!(error.step, SupervisorStep::Request);
        assert_eq!(error.to_string(), "the sandbox is already started");
        peer.send(&SupervisorRequest::Stop, &[]).unwrap();
        assert_eq!(next(&peer).message, SupervisorReport::Stopped);
        assert_eq!(code(handle.join().unwrap()), code(ExitCode::SUCCESS));
    }

    #[test]
    fn an_exec_without_its_descriptors_fails_that_session_only() {
        let root = tempfile::tempdir().unwrap();
        let (peer, sys, handle) = serving(root.path());
        let request = SupervisorRequest::Exec(exec_request(0));
        peer.send(&request, &[]).unwrap();
        assert_eq!(
            next(&peer).message,
            SupervisorReport::ExecFailed {
                session_id: SESSION,
                failure: Failure::check("descriptor 0 is missing"),
            }
        );
        assert!(sys.calls().is_empty());
        peer.send(&SupervisorRequest::Stop, &[]).unwrap();
        assert_eq!(next(&peer).message, SupervisorReport::Stopped);
        handle.join().unwrap();
    }

    #[test]
    fn an_exec_whose_environment_is_not_sealed_fails_naming_it() {
        let root = tempfile::tempdir().unwrap();
        let (peer, sys, handle) = serving(root.path());
        let (input, output) = rustix::pipe::pipe().unwrap();
        // A pipe, not a sealed memfd.
        let request = SupervisorRequest::Exec(exec_request(0));
        peer.send(&request, &[input.as_fd(), input.as_fd(), output.as_fd()])
            .unwrap();
        let SupervisorReport::ExecFailed { failure, .. } = next(&peer).message else {
            panic!("not ExecFailed")
        };
        let detail = failure.to_string();
        assert!(detail.starts_with("the sandbox environment: "), "{detail}");
        assert!(sys.calls().is_empty());
        drop(peer);
        handle.join().unwrap();
    }

    #[test]
    fn an_exec_is_reported_started_with_its_pidfd_then_exited_with_its_code() {
        let root = tempfile::tempdir().unwrap();
        let (peer, sys, handle) = serving(root.path());
        // The double numbers its children from 1001.
        sys.statuses.lock().unwrap().insert(
            1001,
            ProcessStatus {
                exit: None,
                signal: Some(15),
            },
        );
        let environment = lazaret_proto::memfd::sealed_bytes("env", b"EDITOR=vi\0").unwrap();
        let (input, output) = rustix::pipe::pipe().unwrap();
        let request = SupervisorRequest::Exec(exec_request(0));
        peer.send(
            &request,
            &[environment.as_fd(), input.as_fd(), output.as_fd()],
        )
        .unwrap();
        let started = next(&peer);
        assert_eq!(
            started.message,
            SupervisorReport::ExecStarted {
                session_id: SESSION,
                process: FdIndex(0),
            }
        );
        assert_eq!(started.fds.len(), 1);
        assert_eq!(
            next(&peer).message,
            SupervisorReport::ExecExited {
                session_id: SESSION,
                exit_code: 128 + 15,
                signaled: true,
            }
        );
        let spawned = sys.spawned();
        assert_eq!(spawned.len(), 1);
        assert_eq!(spawned[0][6], "exec");
        assert_eq!(spawned[0].last().map(String::as_str), Some("lazaret-c1"));
        peer.send(&SupervisorRequest::Stop, &[]).unwrap();
        assert_eq!(next(&peer).message, SupervisorReport::Stopped);
        handle.join().unwrap();
    }

    #[test]
    fn a_signal_is_passed_to_runsc_kill_beside_the_loop() {
        let root = tempfile::tempdir().unwrap();
        let (peer, sys, handle) = serving(root.path());
        let request = SupervisorRequest::SignalExec {
            session_id: SESSION,
            signal: ExecSignal::WindowChanged,
        };
        peer.send(&request, &[]).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while sys.spawned().is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(
            sys.spawned()[0][6..],
            ["kill", "--all", "lazaret-c1", "WINCH"]
        );
        // Nothing is reported for a signal; the loop still answers.
        peer.send(&SupervisorRequest::Stop, &[]).unwrap();
        assert_eq!(next(&peer).message, SupervisorReport::Stopped);
        handle.join().unwrap();
        assert!(matches!(sys.calls()[0], Call::Spawn { .. }));
    }

    #[test]
    fn a_read_back_that_cannot_start_the_sidecar_is_a_network_failure() {
        let root = tempfile::tempdir().unwrap();
        let (peer, _, handle) = serving(root.path());
        let parameters = lazaret_proto::sidecar::ObserveParameters {
            enforcement_namespace: lazaret_proto::ownership::NamespaceIdentity {
                device: 1,
                inode: 2,
            },
            link: lazaret_proto::network::ConnectivityLink::slirp4netns(),
        };
        peer.send(&SupervisorRequest::ObserveNetwork(parameters), &[])
            .unwrap();
        // The test binary has no sidecar beside it.
        let SupervisorReport::NetworkObserved(Err(error)) = next(&peer).message else {
            panic!("not a failed read-back")
        };
        assert_eq!(error.step, SupervisorStep::Network);
        assert!(
            error
                .to_string()
                .starts_with("lazaret-netsidecar is not installed beside "),
            "{}",
            error.to_string()
        );
        drop(peer);
        handle.join().unwrap();
    }

    /// Runs the loop before the sandbox runs on a thread, with `requests`.
    fn before_running(
        requests: Vec<SupervisorRequest>,
    ) -> (Peer, Result<Option<Running>, SupervisorError>) {
        let (peer, channel) = pair::<SupervisorRequest, SupervisorReport>().unwrap();
        for request in &requests {
            peer.send(request, &[]).unwrap();
        }
        let network =
            Arc::new(rustix::fs::open("/", OFlags::PATH | OFlags::CLOEXEC, Mode::empty()).unwrap());
        let result = prepare_and_run(&channel, &network);
        (peer, result)
    }

    #[test]
    fn stop_before_the_plan_ends_without_running() {
        let (_, result) = before_running(vec![SupervisorRequest::Stop]);
        assert!(matches!(result, Ok(None)));
    }

    #[test]
    fn the_sandbox_does_not_run_before_its_plan_is_staged() {
        let (_, result) = before_running(vec![SupervisorRequest::RunSandbox]);
        let Err(error) = result else {
            panic!("ran without a plan")
        };
        assert_eq!(error.step, SupervisorStep::Request);
        assert_eq!(
            error.to_string(),
            "the sandbox cannot run before its plan is staged"
        );
    }

    #[test]
    fn a_session_before_the_sandbox_runs_is_refused() {
        let (_, result) = before_running(vec![SupervisorRequest::Exec(exec_request(0))]);
        let Err(error) = result else {
            panic!("accepted")
        };
        assert_eq!(error.step, SupervisorStep::Request);
        assert!(
            error
                .to_string()
                .starts_with("unexpected request before the sandbox runs: Exec("),
            "{}",
            error.to_string()
        );
    }

    #[test]
    fn an_attestation_without_its_descriptors_is_refused() {
        let parameters = lazaret_proto::sidecar::AttestParameters {
            probe: lazaret_proto::network::NetworkReachabilityProbe {
                domain_id: lazaret_proto::ids::DomainId([1; 32]),
                generation_id: lazaret_proto::ids::GenerationId(1),
                enforcement_namespace: lazaret_proto::ownership::NamespaceIdentity {
                    device: 1,
                    inode: 2,
                },
            },
            network_sidecar_id: lazaret_proto::ids::NetworkSidecarId([2; 16]),
            link: lazaret_proto::network::ConnectivityLink::slirp4netns(),
            names: None,
        };
        let (_, result) = before_running(vec![SupervisorRequest::AttestNetwork {
            parameters,
            policy: FdIndex(0),
            helper_ready: FdIndex(1),
            proxy: None,
        }]);
        let Err(error) = result else {
            panic!("accepted")
        };
        assert_eq!(error.step, SupervisorStep::Request);
        assert_eq!(error.to_string(), "descriptor 0 is missing");
    }

    #[test]
    fn a_missing_descriptor_is_named_by_its_index() {
        let fd = rustix::fs::open("/", OFlags::PATH | OFlags::CLOEXEC, Mode::empty()).unwrap();
        let fds = [fd];
        assert_eq!(
            fd_at(&fds, FdIndex(0)).unwrap().as_raw_fd(),
            fds[0].as_raw_fd()
        );
        let error = fd_at(&fds, FdIndex(1)).unwrap_err();
        assert_eq!(
            (error.step, error.to_string().as_str()),
            (SupervisorStep::Request, "descriptor 1 is missing")
        );
    }
}
