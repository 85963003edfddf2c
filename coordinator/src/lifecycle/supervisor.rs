//! The Runtime Supervisor as the Host Coordinator sees it: starting it,
//! the requests it is sent by name (`start`, `attest`, `run_sandbox`,
//! `stop`), and the reports start-up waits for.
//!
//! The supervisor is our own role binary, started by this coordinator on a
//! socketpair; its reports are trusted as far as their types go, and every
//! wait for one is bounded and ends with a named failure of the start-up
//! step when the supervisor fails, exits or falls silent.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use lazaret_proto::channel::{ChannelError, Endpoint, Received};
use lazaret_proto::common::HostPath;
use lazaret_proto::control::StartupStep;
use lazaret_proto::ids::ContainerId;
use lazaret_proto::network::NetworkReadinessAttestation;
use lazaret_proto::ownership::NamespaceIdentity;
use lazaret_proto::sidecar::AttestParameters;
use lazaret_proto::store::Generation;
use lazaret_proto::supervisor::{
    AnchorMount, FdIndex, FdList, PLAN_LIMITS, ProxyPlan, SandboxPlan, SupervisorReport,
    SupervisorRequest, VolumeMount,
};
use lazaret_storage::catalog::PreparedLower;

use super::failure::{Failure, at, failure, reported};
use crate::config::{ResolvedDomainConfiguration, RetainedDir};
use crate::process::{HeldProcess, kill_and_wait, pidfd_of_child, readable, wait_exit};

/// The coordinator's end of the supervisor's channel.
pub(super) type SupervisorChannel = Endpoint<SupervisorRequest, SupervisorReport>;

/// How long the supervisor may take to answer `Stop`: it answers as soon
/// as it reads it, and one that does not is killed, which ends the Domain
/// pid namespace just the same. Short, so that every wait of stopping adds
/// up to less than `down`'s 30 s ([`super::client::DOWN_TIMEOUT`]).
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// How long start-up waits for any one supervisor report.
const REPORT_TIMEOUT: Duration = Duration::from_secs(60);

/// A running supervisor: its process, pidfd and channel.
pub(super) struct Supervisor {
    child: Child,
    pub(super) held: HeldProcess,
    pub(super) channel: Arc<SupervisorChannel>,
}

impl Supervisor {
    /// Starts `lazaret-supervisor` on a new socketpair and holds its pidfd.
    pub(super) fn spawn(program: &Path) -> Result<Self, Failure> {
        let step = StartupStep::Sandbox;
        let (ours, theirs) = lazaret_proto::channel::pair::<SupervisorRequest, SupervisorReport>()
            .map_err(|e| at(step)(&e))?;
        let mut command = Command::new(program);
        command
            .env_clear()
            .stdin(Stdio::from(theirs.into_fd()))
            .stdout(Stdio::null());
        lazaret_proto::seccomp::pass_debug_variables(&mut command);
        let child = command
            .spawn()
            .map_err(|e| at(step)(&e).within(format!("cannot start {}", program.display())))?;
        let held = pidfd_of_child(&child)
            .and_then(HeldProcess::from_pidfd)
            .map_err(|e| at(step)(&e).within("cannot hold the supervisor"))?;
        Ok(Supervisor {
            child,
            held,
            channel: Arc::new(ours.with_limits(PLAN_LIMITS)),
        })
    }

    /// Asks the supervisor to stop the sandbox, then makes sure it is gone.
    pub(super) fn stop(mut self) {
        let asked = self.channel.send(&SupervisorRequest::Stop, &[]).is_ok();
        if asked && readable(self.channel.as_fd(), STOP_TIMEOUT) {
            if let Ok(Received {
                message: SupervisorReport::Failed(error),
                ..
            }) = self.channel.recv()
            {
                tracing::warn!("the supervisor could not stop cleanly: {error}");
            }
        }
        if !wait_exit(self.held.pidfd.as_fd(), Duration::from_secs(5)).unwrap_or(false) {
            tracing::warn!("the supervisor did not exit; killing it");
            let _ = kill_and_wait(self.held.pidfd.as_fd(), Duration::from_secs(5));
        }
        let _ = self.child.wait();
    }
}

/// The Domain namespaces, as the supervisor reported them.
#[derive(Debug)]
pub(super) struct Namespaces {
    /// Their holder, the Domain pid namespace's init.
    pub(super) holder: HeldProcess,
    /// The Domain user namespace.
    pub(super) user_namespace: NamespaceIdentity,
    /// The enforcement network namespace.
    pub(super) network_namespace: NamespaceIdentity,
    /// A descriptor of the user namespace.
    pub(super) user_fd: OwnedFd,
    /// A descriptor of the network namespace, proven to be the one named.
    pub(super) network_fd: OwnedFd,
}

/// What a plan is built from: descriptors and the generation's paths.
pub(super) struct PlanInputs<'a> {
    /// The sealed environment memfd.
    pub(super) environment: BorrowedFd<'a>,
    /// The prepared lower.
    pub(super) prepared: &'a PreparedLower,
    /// Each persistent dir's state directory.
    pub(super) anchor_dirs: &'a [RetainedDir],
    /// The Domain's isolated workspace directory.
    pub(super) isolated: &'a RetainedDir,
    /// The sealed workspace rules memfd.
    pub(super) rules: BorrowedFd<'a>,
    /// The generation's runtime directory.
    pub(super) generation_dir: &'a RetainedDir,
    /// The runsc executable.
    pub(super) runsc: &'a Path,
    /// The runsc container ID.
    pub(super) container_id: ContainerId,
}

impl Supervisor {
    /// The namespaces, which the supervisor reports as soon as it runs.
    pub(super) fn namespaces(&self) -> Result<Namespaces, Failure> {
        await_namespaces(&self.channel)
    }

    /// `failure`, saying so when a seccomp filter killed the supervisor:
    /// stage one (killed by `SIGSYS`), or stage two (stage one then exits
    /// [`lazaret_proto::seccomp::PID1_KILLED_EXIT`]). Either has exited
    /// once the channel is closed, or does within the 200 ms waited.
    pub(super) fn explained(&self, failure: Failure) -> Failure {
        use lazaret_proto::seccomp::{KILLED, PID1_KILLED_EXIT};
        use rustix::process::{WaitId, WaitIdOptions};
        let pidfd = self.held.pidfd.as_fd();
        if !wait_exit(pidfd, Duration::from_millis(200)).unwrap_or(false) {
            return failure;
        }
        let status = rustix::process::waitid(
            WaitId::PidFd(pidfd),
            WaitIdOptions::EXITED | WaitIdOptions::NOWAIT,
        );
        let which = match status.ok().flatten() {
            Some(s) if s.terminating_signal() == Some(libc::SIGSYS) => "the Runtime Supervisor",
            Some(s) if s.exit_status() == Some(i32::from(PID1_KILLED_EXIT)) => {
                "the Runtime Supervisor's second stage, the Domain's pid 1,"
            }
            _ => return failure,
        };
        let said = format!("{which} {KILLED}");
        tracing::error!("{said}");
        failure.within(said)
    }

    /// Sends the plan: the supervisor builds the mounts and bundle, and
    /// waits for the network before it runs the sandbox.
    pub(super) fn send_plan(
        &self,
        resolved: &ResolvedDomainConfiguration,
        inputs: PlanInputs<'_>,
        generation: &Generation,
        nameservers: Vec<std::net::Ipv4Addr>,
    ) -> Result<(), Failure> {
        let auth = resolved.authorities();
        let mut fds = FdList::new();
        let rootfs = fds.push(inputs.prepared.rootfs.fd());
        let workspace = fds.push(auth.workspace.fd());
        let environment = fds.push(inputs.environment);
        let isolated = fds.push(inputs.isolated.fd());
        let workspace_rules = fds.push(inputs.rules);
        let anchors = resolved
            .record()
            .persistent_dirs
            .iter()
            .zip(inputs.anchor_dirs)
            .map(|(path, dir)| AnchorMount {
                sandbox_path: path.clone(),
                state_dir: fds.push(dir.fd()),
            })
            .collect();
        let volumes = auth
            .volumes
            .iter()
            .map(|v| VolumeMount {
                sandbox_path: v.volume.container_path.clone(),
                source: fds.push(v.opened.fd.as_fd()),
                kind: v.volume.kind,
                access: v.volume.access,
            })
            .collect();
        let plan = SandboxPlan {
            domain_id: resolved.domain_id(),
            generation_id: generation.generation_id,
            container_id: inputs.container_id,
            runtime_dir: HostPath::from(inputs.generation_dir.label()),
            runsc: HostPath::from(inputs.runsc),
            rootfs,
            workspace,
            environment,
            isolated,
            workspace_rules,
            anchors,
            volumes,
            resolvers: nameservers,
        };
        self.channel
            .send(&SupervisorRequest::Start(plan), fds.as_slice())
            .map_err(|e| at(StartupStep::Sandbox)(&e))
    }

    /// Asks the supervisor's Network Sidecar to install the policy (a
    /// sealed memfd) and attest it in the enforcement namespace once the
    /// connectivity helper writes to its ready pipe (`helper_ready`, the
    /// read end); the attestation comes as a report (see
    /// [`Supervisor::two_reports`]).
    pub(super) fn request_attestation(
        &self,
        parameters: AttestParameters,
        policy: BorrowedFd<'_>,
        helper_ready: BorrowedFd<'_>,
        proxy: Option<(BorrowedFd<'_>, Vec<String>)>,
    ) -> Result<(), Failure> {
        let request = SupervisorRequest::AttestNetwork {
            parameters,
            policy: FdIndex(0),
            helper_ready: FdIndex(1),
            proxy: proxy.as_ref().map(|(_, hosts)| ProxyPlan {
                credentials: FdIndex(2),
                hosts: hosts.clone(),
            }),
        };
        let fds: Vec<BorrowedFd<'_>> = [policy, helper_ready]
            .into_iter()
            .chain(proxy.map(|(credentials, _)| credentials))
            .collect();
        self.channel
            .send(&request, &fds)
            .map_err(|e| at(StartupStep::Network)(&e))
    }

    /// The router's report and the attestation, as
    /// [`await_routed_and_attested`] takes them.
    pub(super) fn two_reports<R>(
        &self,
        routed: impl FnOnce(Received<SupervisorReport>) -> Result<R, Failure>,
    ) -> Result<(R, Attested), Failure> {
        await_routed_and_attested(&self.channel, routed)
    }

    /// Runs the sandbox, now that its network is proven.
    pub(super) fn run_sandbox(&self) -> Result<RunningSandbox, Failure> {
        self.channel
            .send(&SupervisorRequest::RunSandbox, &[])
            .map_err(|e| at(StartupStep::Sandbox)(&e))?;
        await_sandbox(&self.channel)
    }
}

/// The network's report: the sidecar's attestation and, for a policy with
/// names, Lazaret's resolver (its pidfd) and what its probes saw.
#[derive(Debug)]
pub(super) struct Attested {
    pub(super) attestation: NetworkReadinessAttestation,
    pub(super) resolver: Option<(OwnedFd, lazaret_proto::resolver::ResolverReadiness)>,
    /// For a profile with credentials, the Credential Proxy (its pidfd)
    /// and what it reported.
    pub(super) proxy: Option<(OwnedFd, lazaret_proto::credproxy::ProxyReadiness)>,
}

/// The router's report (`WorkspaceRouted`), handed to `routed` as soon as
/// it comes, and the attestation (`NetworkAttested`). They come in either
/// order, since the supervisor stages the plan while its sidecar attests;
/// the router is usually ready first, so what `routed` does (recording the
/// router) is done while the attestation is awaited. A failure is one of
/// the step the supervisor names, or `routed`'s.
fn await_routed_and_attested<R>(
    supervisor: &SupervisorChannel,
    routed: impl FnOnce(Received<SupervisorReport>) -> Result<R, Failure>,
) -> Result<(R, Attested), Failure> {
    // The router, or what takes its report until it comes.
    let mut router = Err(routed);
    let mut attested = None;
    loop {
        let step = if router.is_err() {
            StartupStep::Workspace
        } else {
            StartupStep::Network
        };
        let received = await_report(supervisor, step)?;
        match received.message {
            SupervisorReport::WorkspaceRouted { .. } if router.is_err() => {
                router = match router {
                    Err(take) => Ok(take(received)?),
                    taken => taken,
                };
            }
            SupervisorReport::NetworkAttested(attestation) if attested.is_none() => {
                attested = Some(Attested {
                    attestation: *attestation,
                    resolver: None,
                    proxy: None,
                });
            }
            SupervisorReport::NamesServed {
                attestation,
                resolver,
                readiness,
                proxy,
            } if attested.is_none() => {
                let mut fds: Vec<Option<OwnedFd>> = received.fds.into_iter().map(Some).collect();
                let proxy = proxy
                    .map(|served| {
                        served
                            .pidfd
                            .take(&mut fds)
                            .map(|pidfd| (pidfd, served.readiness))
                            .ok_or_else(|| failure(step, "the supervisor sent no proxy pidfd"))
                    })
                    .transpose()?;
                let pidfd = resolver
                    .take(&mut fds)
                    .ok_or_else(|| failure(step, "the supervisor sent no resolver pidfd"))?;
                attested = Some(Attested {
                    attestation: *attestation,
                    resolver: Some((pidfd, readiness)),
                    proxy,
                });
            }
            other => return Err(unexpected(step, &other)),
        }
        (router, attested) = match (router, attested) {
            (Ok(router), Some(attestation)) => return Ok((router, attestation)),
            waiting => waiting,
        };
    }
}

/// The supervisor's next report during startup. A failure, a stop, an exit
/// or a minute of silence is a [`Failure`] of `step`.
pub(super) fn await_report(
    supervisor: &SupervisorChannel,
    step: StartupStep,
) -> Result<Received<SupervisorReport>, Failure> {
    if !readable(supervisor.as_fd(), REPORT_TIMEOUT) {
        return Err(failure(step, "the supervisor did not answer within 60 s"));
    }
    let received = supervisor.recv().map_err(|e| match e {
        ChannelError::Disconnected => failure(
            step,
            "the supervisor exited before the sandbox ran; see the Domain log",
        ),
        e => at(step)(&e),
    })?;
    match received.message {
        // The step the supervisor names, where it is one of start-up's
        // own: the sidecar attests while the plan is staged.
        SupervisorReport::Failed(error) => Err(reported(
            match error.step {
                lazaret_proto::supervisor::SupervisorStep::Network => StartupStep::Network,
                lazaret_proto::supervisor::SupervisorStep::Workspace => StartupStep::Workspace,
                _ => step,
            },
            error
                .failure
                .within(format!("the Runtime Supervisor failed ({:?})", error.step)),
        )),
        SupervisorReport::Stopped => Err(failure(step, "the supervisor stopped unasked")),
        _ => Ok(received),
    }
}

/// Fails with what the supervisor reported instead of what was expected.
pub(super) fn unexpected(step: StartupStep, report: &SupervisorReport) -> Failure {
    failure(
        step,
        format!("the supervisor sent an unexpected report: {report:?}"),
    )
}

fn await_namespaces(supervisor: &SupervisorChannel) -> Result<Namespaces, Failure> {
    let step = StartupStep::Sandbox;
    let Received { message, fds } = await_report(supervisor, step)?;
    let SupervisorReport::NamespacesReady {
        user_namespace,
        network_namespace,
        holder,
        user_namespace_fd,
        network_namespace_fd,
    } = message
    else {
        return Err(unexpected(step, &message));
    };
    let mut fds: Vec<Option<OwnedFd>> = fds.into_iter().map(Some).collect();
    let mut take = |index: FdIndex, what: &str| {
        index
            .take(&mut fds)
            .ok_or_else(|| failure(step, format!("the supervisor sent no {what}")))
    };
    let holder = take(holder, "holder pidfd")?;
    let user_fd = take(user_namespace_fd, "user namespace")?;
    let network_fd = take(network_namespace_fd, "network namespace")?;
    let holder = HeldProcess::from_pidfd(holder).map_err(|e| at(step)(&e))?;
    for (fd, identity, what) in [
        (&user_fd, user_namespace, "user"),
        (&network_fd, network_namespace, "network"),
    ] {
        let stat = rustix::fs::fstat(fd).map_err(|e| at(step)(&std::io::Error::from(e)))?;
        if (stat.st_dev, stat.st_ino) != (identity.device, identity.inode) {
            return Err(failure(
                step,
                format!("the {what} namespace descriptor is not the namespace reported"),
            ));
        }
    }
    Ok(Namespaces {
        holder,
        user_namespace,
        network_namespace,
        user_fd,
        network_fd,
    })
}

/// The sandbox, running.
#[derive(Debug)]
pub(super) struct RunningSandbox {
    /// runsc's state root for it.
    pub(super) runtime_root: HostPath,
    /// runsc-sandbox.
    pub(super) process: HeldProcess,
    /// Its gofer, when the supervisor found it.
    pub(super) gofer: Option<HeldProcess>,
    /// The Escalation Mailbox's tmpfs in the Domain mount namespace.
    pub(super) mailbox: OwnedFd,
}

/// Waits for the sandbox to run: its runtime root, its process and its
/// gofer's.
fn await_sandbox(supervisor: &SupervisorChannel) -> Result<RunningSandbox, Failure> {
    let step = StartupStep::Sandbox;
    let Received { message, fds } = await_report(supervisor, step)?;
    let SupervisorReport::SandboxRunning {
        sandbox,
        gofer,
        runtime_root,
        mailbox,
        ..
    } = message
    else {
        return Err(unexpected(step, &message));
    };
    let mut fds: Vec<Option<OwnedFd>> = fds.into_iter().map(Some).collect();
    let pidfd = sandbox
        .take(&mut fds)
        .ok_or_else(|| failure(step, "the supervisor sent no sandbox pidfd"))?;
    let sandbox = HeldProcess::from_pidfd(pidfd).map_err(|e| at(step)(&e))?;
    let gofer = gofer
        .and_then(|index| index.take(&mut fds))
        .map(HeldProcess::from_pidfd)
        .transpose()
        .map_err(|e| at(step)(&e))?;
    let mailbox = mailbox
        .take(&mut fds)
        .ok_or_else(|| failure(step, "the supervisor sent no mailbox directory"))?;
    Ok(RunningSandbox {
        runtime_root,
        process: sandbox,
        gofer,
        mailbox,
    })
}

#[cfg(test)]
mod tests {
    //! The start-up steps that wait on the supervisor, against a scripted
    //! peer on a socketpair: no root, no runsc.

    use std::os::fd::{AsFd, OwnedFd};

    use lazaret_proto::ownership::NamespaceIdentity;
    use lazaret_proto::supervisor::{
        FdIndex, FdList, SupervisorError, SupervisorReport, SupervisorRequest, SupervisorStep,
    };

    use super::{await_namespaces, await_report, await_routed_and_attested, await_sandbox};
    use lazaret_proto::common::HostPath;
    use lazaret_proto::control::StartupStep;

    /// The coordinator's end and the scripted supervisor's.
    fn pair() -> (
        super::SupervisorChannel,
        lazaret_proto::channel::Endpoint<SupervisorReport, SupervisorRequest>,
    ) {
        lazaret_proto::channel::pair::<SupervisorRequest, SupervisorReport>().unwrap()
    }

    fn identity(fd: &OwnedFd) -> NamespaceIdentity {
        let stat = rustix::fs::fstat(fd).unwrap();
        NamespaceIdentity {
            device: stat.st_dev,
            inode: stat.st_ino,
        }
    }

    fn open(path: &str) -> OwnedFd {
        rustix::fs::open(
            path,
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .unwrap()
    }

    fn own_pidfd() -> OwnedFd {
        rustix::process::pidfd_open(
            rustix::process::getpid(),
            rustix::process::PidfdFlags::empty(),
        )
        .unwrap()
    }

    #[test]
    fn a_failed_report_is_a_failure_of_the_step_naming_the_supervisors() {
        let (ours, theirs) = pair();
        let error = SupervisorError {
            step: SupervisorStep::Mounts,
            failure: lazaret_proto::failure::Failure::check("cannot mount the workspace"),
        };
        theirs.send(&SupervisorReport::Failed(error), &[]).unwrap();
        let failure = await_report(&ours, StartupStep::Sandbox).unwrap_err();
        assert_eq!(failure.step, StartupStep::Sandbox);
        assert!(
            failure.account.to_string().contains("Mounts"),
            "{}",
            failure.account.to_string()
        );
        assert!(
            failure
                .account
                .to_string()
                .contains("cannot mount the workspace"),
            "{}",
            failure.account.to_string()
        );
    }

    #[test]
    fn a_supervisor_that_goes_away_is_named_at_once() {
        let (ours, theirs) = pair();
        drop(theirs);
        let started = std::time::Instant::now();
        let failure = await_report(&ours, StartupStep::Network).unwrap_err();
        assert_eq!(failure.step, StartupStep::Network);
        assert!(
            failure.account.to_string().contains("exited"),
            "{}",
            failure.account.to_string()
        );
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }

    #[test]
    fn a_stop_nobody_asked_for_fails_the_step() {
        let (ours, theirs) = pair();
        theirs.send(&SupervisorReport::Stopped, &[]).unwrap();
        let failure = await_report(&ours, StartupStep::Workspace).unwrap_err();
        assert!(
            failure.account.to_string().contains("unasked"),
            "{}",
            failure.account.to_string()
        );
    }

    #[test]
    fn namespaces_are_taken_only_when_their_descriptors_are_the_ones_reported() {
        let user = open("/proc/self/ns/user");
        let network = open("/proc/self/ns/net");
        let holder = own_pidfd();
        let report = |user_namespace, network_namespace| {
            let mut fds = FdList::new();
            let holder_index = fds.push(holder.as_fd());
            let user_index = fds.push(user.as_fd());
            let network_index = fds.push(network.as_fd());
            let (ours, theirs) = pair();
            let report = SupervisorReport::NamespacesReady {
                user_namespace,
                network_namespace,
                holder: holder_index,
                user_namespace_fd: user_index,
                network_namespace_fd: network_index,
            };
            theirs.send(&report, fds.as_slice()).unwrap();
            await_namespaces(&ours)
        };

        let taken = report(identity(&user), identity(&network)).unwrap();
        assert_eq!(taken.user_namespace, identity(&user));
        assert_eq!(taken.network_namespace, identity(&network));

        // A descriptor of another namespace than the one named (here the
        // user namespace handed where the network namespace is named).
        let refused = report(identity(&user), identity(&user)).unwrap_err();
        assert!(
            refused
                .account
                .to_string()
                .contains("network namespace descriptor is not"),
            "{}",
            refused.account.to_string()
        );
    }

    #[test]
    fn a_report_missing_its_descriptors_is_refused() {
        let (ours, theirs) = pair();
        let user = open("/proc/self/ns/user");
        let report = SupervisorReport::NamespacesReady {
            user_namespace: identity(&user),
            network_namespace: identity(&user),
            holder: FdIndex(0),
            user_namespace_fd: FdIndex(1),
            network_namespace_fd: FdIndex(2),
        };
        theirs.send(&report, &[user.as_fd()]).unwrap();
        let failure = await_namespaces(&ours).unwrap_err();
        assert!(
            failure.account.to_string().contains("sent no"),
            "{}",
            failure.account.to_string()
        );

        let (ours, theirs) = pair();
        let report = SupervisorReport::SandboxRunning {
            sandbox: FdIndex(0),
            gofer: None,
            runtime_root: HostPath::from(std::path::Path::new("/run/x")),
            bundle: HostPath::from(std::path::Path::new("/run/x/bundle")),
            mailbox: FdIndex(1),
        };
        theirs.send(&report, &[]).unwrap();
        let failure = await_sandbox(&ours).unwrap_err();
        assert!(
            failure.account.to_string().contains("no sandbox pidfd"),
            "{}",
            failure.account.to_string()
        );
    }

    #[test]
    fn another_report_than_the_one_awaited_is_named() {
        let (ours, theirs) = pair();
        theirs
            .send(
                &SupervisorReport::NetworkObserved(Err(SupervisorError {
                    step: SupervisorStep::Network,
                    failure: lazaret_proto::failure::Failure::check("x"),
                })),
                &[],
            )
            .unwrap();
        let failure = await_sandbox(&ours).unwrap_err();
        assert!(
            failure.account.to_string().contains("unexpected"),
            "{}",
            failure.account.to_string()
        );
    }

    /// An attestation as the sidecar's; nothing here verifies it.
    fn attestation() -> lazaret_proto::network::NetworkReadinessAttestation {
        use lazaret_proto::ids::{DomainId, GenerationId, NetworkSidecarId, Sha256Digest};
        use lazaret_proto::network::{
            NetworkObservation, NetworkReadinessAttestation, NetworkReadinessAttestationSchemaId,
            PolicyDelivery,
        };
        NetworkReadinessAttestation {
            schema_id: NetworkReadinessAttestationSchemaId,
            domain_id: DomainId([1; 32]),
            generation_id: GenerationId(2),
            network_sidecar_id: NetworkSidecarId([3; 16]),
            derived_policy_digest: Sha256Digest([4; 32]),
            enforcement_namespace: NamespaceIdentity {
                device: 5,
                inode: 6,
            },
            observation: NetworkObservation {
                policy_delivery: PolicyDelivery::SealedMemfd,
                helper_ready: true,
                observed_routes: Vec::new(),
                ipv6_disabled: true,
                observed_filter: Vec::new(),
            },
            denied_destinations: Vec::new(),
            permitted_destinations: Vec::new(),
            dns_observations: Vec::new(),
            observed_at: lazaret_proto::common::UnixTimeNs(7),
        }
    }

    fn routed_report() -> SupervisorReport {
        SupervisorReport::WorkspaceRouted {
            router: FdIndex(0),
            summary: lazaret_proto::router::RoutingSummary::default(),
        }
    }

    fn attested_report() -> SupervisorReport {
        SupervisorReport::NetworkAttested(Box::new(attestation()))
    }

    #[test]
    fn the_router_is_taken_when_its_report_comes_not_after_the_attestation() {
        let (ours, theirs) = pair();
        let (taken, was_taken) = std::sync::mpsc::channel();
        let peer = std::thread::spawn(move || {
            theirs.send(&routed_report(), &[]).unwrap();
            // The attestation only once the router is taken (or, if it
            // never is, after a while, which fails the test).
            let first = was_taken
                .recv_timeout(std::time::Duration::from_secs(10))
                .is_ok();
            theirs.send(&attested_report(), &[]).unwrap();
            first
        });
        let (router, attestation) = await_routed_and_attested(&ours, |report| {
            taken.send(()).unwrap();
            Ok(report.message)
        })
        .unwrap();
        assert!(
            peer.join().unwrap(),
            "the router was taken after the attestation"
        );
        assert!(matches!(router, SupervisorReport::WorkspaceRouted { .. }));
        assert_eq!(attestation.attestation, self::attestation());
    }

    #[test]
    fn the_two_reports_are_taken_in_either_order() {
        let (ours, theirs) = pair();
        theirs.send(&attested_report(), &[]).unwrap();
        theirs.send(&routed_report(), &[]).unwrap();
        let (router, attestation) =
            await_routed_and_attested(&ours, |report| Ok(report.message)).unwrap();
        assert!(matches!(router, SupervisorReport::WorkspaceRouted { .. }));
        assert_eq!(attestation.attestation, self::attestation());
    }

    #[test]
    fn a_router_that_cannot_be_taken_fails_without_waiting_for_the_attestation() {
        let (ours, theirs) = pair();
        theirs.send(&routed_report(), &[]).unwrap();
        let failure = await_routed_and_attested(&ours, |_| -> Result<(), _> {
            Err(super::failure(StartupStep::Workspace, "other rules"))
        })
        .unwrap_err();
        assert_eq!(failure.step, StartupStep::Workspace);
        assert_eq!(failure.account.to_string(), "other rules");
        drop(theirs);
    }

    #[test]
    fn a_second_attestation_instead_of_the_router_is_unexpected() {
        let (ours, theirs) = pair();
        theirs.send(&attested_report(), &[]).unwrap();
        theirs.send(&attested_report(), &[]).unwrap();
        let failure = await_routed_and_attested(&ours, |report| Ok(report.message)).unwrap_err();
        assert_eq!(failure.step, StartupStep::Workspace);
        assert!(
            failure.account.to_string().contains("unexpected"),
            "{}",
            failure.account.to_string()
        );
    }
}
