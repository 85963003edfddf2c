//! The Network Sidecar of one generation.
//!
//! The Runtime Supervisor starts it inside the Domain's enforcement network
//! namespace with CAP_NET_ADMIN in the Domain user namespace and no other
//! capability. It then:
//! 1. checks those are exactly its privileges;
//! 2. takes its channel, receives one [`AttestRequest`] with the namespace
//!    descriptor, the sealed policy memfd and the connectivity helper's
//!    ready pipe;
//! 3. proves the descriptor names the namespace it runs in and the one the
//!    probe names (it holds no CAP_SYS_ADMIN, so it cannot enter another);
//! 4. reads the policy from the memfd, refusing one that is not sealed or
//!    does not validate;
//! 5. over nf_tables netlink, installs the packet filter that enforces the
//!    policy a second time while the connectivity helper attaches; once the
//!    helper writes `1` to its ready pipe (within [`HELPER_READY_TIMEOUT`]),
//!    with rtnetlink: brings up loopback, disables IPv6, configures the
//!    helper's tap device, installs one route per policy rule and one per
//!    resolver, and reads the namespace back;
//! 6. sends a DNS query to each resolver, probes the policy's
//!    destinations, reads the filter back while the answers travel, then
//!    collects them;
//! 7. answers with a [`NetworkReadinessAttestation`] built only from what it
//!    observed, and exits.
//!
//! Asked to observe instead ([`ObserveRequest`], for `lazaret status`), it
//! proves the namespace the same way, reads the routes, rules, helper
//! device, IPv6 switches and packet filter back without changing anything,
//! answers with the [`NetworkObservation`], and exits.
//!
//! It trusts only the supervisor at the other end of its inherited channel,
//! and checks what that supervisor sends before acting on it.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod filter;
mod install;
mod nfnetlink;
mod probe;
mod seccomp;

pub use filter::NamedSet;

use std::os::fd::BorrowedFd;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use lazaret_proto::channel::FdIndex;
use lazaret_proto::channel::{Endpoint, Received};
use lazaret_proto::codec::{self, WireRecord};
use lazaret_proto::common::UnixTimeNs;
use lazaret_proto::error_chain as chain;
use lazaret_proto::failure::Failure;
use lazaret_proto::memfd;
use lazaret_proto::network::{
    DerivedNetworkPolicy, FilterRule, NetworkObservation, NetworkReadinessAttestation,
    NetworkReadinessAttestationSchemaId, Observed, PolicyDelivery,
};
use lazaret_proto::ownership::NamespaceIdentity;
use lazaret_proto::sidecar::{
    AttestRequest, ObserveRequest, SidecarError, SidecarReport, SidecarRequest, SidecarStep,
};
use rustix::thread::CapabilitySet;

type Channel = Endpoint<SidecarReport, SidecarRequest>;

/// How long the connectivity helper may take to attach its device.
pub const HELPER_READY_TIMEOUT: Duration = Duration::from_secs(10);

fn failed(step: SidecarStep, detail: impl std::fmt::Display) -> SidecarError {
    SidecarError {
        step,
        failure: Failure::check(detail),
    }
}

/// `error` and its chain as the failure of `step`, after `context`.
fn failed_by(
    step: SidecarStep,
    context: &str,
    error: &(dyn std::error::Error + 'static),
) -> SidecarError {
    SidecarError {
        step,
        failure: Failure::of(error).within(context),
    }
}

/// Runs the sidecar: one attestation, then exit.
pub fn run() -> ExitCode {
    let channel = match Channel::start_role("lazaret-netsidecar") {
        Ok(channel) => channel,
        Err(code) => return code,
    };
    let report = match serve(&channel) {
        Ok(report) => report,
        Err(error) => {
            tracing::error!("{:?}: {}", error.step, error.failure);
            SidecarReport::Failed(error)
        }
    };
    let ok = !matches!(report, SidecarReport::Failed(_));
    if let Err(e) = channel.send(&report, &[]) {
        tracing::error!("cannot answer: {}", chain(&e));
        return ExitCode::FAILURE;
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Takes the one request and carries it out.
fn serve(channel: &Channel) -> Result<SidecarReport, SidecarError> {
    check_privileges()?;
    seccomp::install().map_err(|e| failed_by(SidecarStep::Privileges, "", &e))?;
    let Received { message, fds } = channel
        .recv()
        .map_err(|e| failed_by(SidecarStep::Request, "", &e))?;
    match message {
        SidecarRequest::Attest(request) => {
            attest(request, &fds).map(|a| SidecarReport::Attested(Box::new(a)))
        }
        SidecarRequest::Observe(request) => {
            observe(request, &fds).map(|o| SidecarReport::Observed(Box::new(o)))
        }
    }
}

/// The descriptor at `index` of a request.
fn descriptor(
    fds: &[std::os::fd::OwnedFd],
    index: FdIndex,
) -> Result<BorrowedFd<'_>, SidecarError> {
    index.get(fds).ok_or_else(|| {
        failed(
            SidecarStep::Request,
            format!("descriptor {} is missing", index.0),
        )
    })
}

/// A current-thread runtime for the rtnetlink exchange.
fn netlink_runtime() -> Result<tokio::runtime::Runtime, SidecarError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| failed_by(SidecarStep::Link, "cannot start the netlink runtime", &e))
}

/// Reads the namespace back for a running policy, changing nothing.
fn observe(
    request: ObserveRequest,
    fds: &[std::os::fd::OwnedFd],
) -> Result<Observed, SidecarError> {
    let parameters = request.parameters;
    check_namespace(
        descriptor(fds, request.namespace)?,
        parameters.enforcement_namespace,
    )?;
    parameters
        .link
        .validate()
        .map_err(|e| failed(SidecarStep::Request, format!("link: {e}")))?;
    let readback = netlink_runtime()?.block_on(install::observe(&parameters.link))?;
    let observed_filter = filter::read_back()?;
    let (admitted, admitted_total) = if observed_filter.contains(&FilterRule::AcceptNamed) {
        filter::read_admitted()?
    } else {
        (Vec::new(), 0)
    };
    Ok(Observed {
        observation: NetworkObservation {
            policy_delivery: PolicyDelivery::SealedMemfd,
            helper_ready: readback.tap_up,
            observed_routes: readback.routes,
            ipv6_disabled: readback.ipv6_disabled,
            observed_filter,
        },
        admitted,
        admitted_total: admitted_total as u64,
    })
}

fn attest(
    request: AttestRequest,
    fds: &[std::os::fd::OwnedFd],
) -> Result<NetworkReadinessAttestation, SidecarError> {
    let AttestRequest {
        parameters,
        namespace,
        policy,
        helper_ready,
    } = request;
    let fd = |index: FdIndex| descriptor(fds, index);
    check_namespace(fd(namespace)?, parameters.probe.enforcement_namespace)?;
    let policy = read_policy(fd(policy)?)?;
    let policy_digest = policy
        .digest()
        .map_err(|e| failed_by(SidecarStep::Policy, "", &e))?;
    let link = &parameters.link;
    link.validate()
        .map_err(|e| failed(SidecarStep::Request, format!("link: {e}")))?;

    // The filter needs no device, so it is installed while the
    // connectivity helper attaches; the routes need the helper's device.
    let began = Instant::now();
    let names = parameters.names.as_ref();
    filter::install(&policy.expected_filter(names))?;
    await_helper(fd(helper_ready)?)?;
    let attached = began.elapsed();
    let readback = netlink_runtime()?.block_on(install::install(&policy, names, link))?;
    let installed = began.elapsed();
    // The filter is read back while the DNS probes' answers travel.
    let probing = probe::start(&policy, names, link);
    let observed_filter = filter::read_back()?;
    let probes = probing.finish();
    tracing::info!(
        helper_wait_us = attached.as_micros() as u64,
        install_us = installed.as_micros() as u64,
        probes_us = (began.elapsed() - installed).as_micros() as u64,
        "policy installed, probed and read back"
    );

    Ok(NetworkReadinessAttestation {
        schema_id: NetworkReadinessAttestationSchemaId,
        domain_id: parameters.probe.domain_id,
        generation_id: parameters.probe.generation_id,
        network_sidecar_id: parameters.network_sidecar_id,
        derived_policy_digest: policy_digest,
        enforcement_namespace: parameters.probe.enforcement_namespace,
        observation: NetworkObservation {
            policy_delivery: PolicyDelivery::SealedMemfd,
            helper_ready: readback.tap_up,
            observed_routes: readback.routes,
            ipv6_disabled: readback.ipv6_disabled,
            observed_filter,
        },
        denied_destinations: probes.denied,
        permitted_destinations: probes.permitted,
        dns_observations: probes.dns,
        observed_at: UnixTimeNs::now(),
    })
}

/// Waits for the connectivity helper to write `1` to its ready pipe: its
/// device is attached. End of file means it exited first.
fn await_helper(ready: BorrowedFd<'_>) -> Result<(), SidecarError> {
    let step = SidecarStep::Link;
    let readable = lazaret_proto::channel::readable_within(ready, HELPER_READY_TIMEOUT)
        .map_err(|e| failed_by(step, "cannot wait for the connectivity helper", &e))?;
    if !readable {
        return Err(failed(
            step,
            format!(
                "the connectivity helper did not attach within {} s",
                HELPER_READY_TIMEOUT.as_secs()
            ),
        ));
    }
    let mut byte = [0u8; 1];
    match rustix::io::read(ready, &mut byte) {
        Ok(1) if byte[0] == b'1' => Ok(()),
        Ok(_) => Err(failed(
            step,
            "the connectivity helper exited before it attached",
        )),
        Err(e) => Err(failed_by(
            step,
            "cannot read the connectivity helper's ready pipe",
            &e,
        )),
    }
}

/// Refuses to act with any capability but CAP_NET_ADMIN, or without it.
fn check_privileges() -> Result<(), SidecarError> {
    lazaret_proto::privilege::require_exactly(
        CapabilitySet::NET_ADMIN,
        "it must run with CAP_NET_ADMIN alone, as lazaret-supervisor starts it",
    )
    .map_err(|e| failed_by(SidecarStep::Privileges, "", &e))
}

/// This thread's network namespace.
const OWN_NAMESPACE: &str = "/proc/thread-self/ns/net";

/// Proves the descriptor is the network namespace this process runs in and
/// the one the probe names.
fn check_namespace(fd: BorrowedFd<'_>, expected: NamespaceIdentity) -> Result<(), SidecarError> {
    let handed = rustix::fs::fstat(fd).map_err(|e| {
        failed_by(
            SidecarStep::Namespace,
            "cannot stat the namespace descriptor",
            &e,
        )
    })?;
    let own = rustix::fs::stat(OWN_NAMESPACE).map_err(|e| SidecarError {
        step: SidecarStep::Namespace,
        failure: Failure::os(
            "cannot stat its own namespace",
            e,
            Some(OWN_NAMESPACE.into()),
        ),
    })?;
    let identity = |dev, ino| NamespaceIdentity {
        device: dev,
        inode: ino,
    };
    let handed = identity(handed.st_dev, handed.st_ino);
    let own = identity(own.st_dev, own.st_ino);
    if handed != expected {
        return Err(failed(
            SidecarStep::Namespace,
            format!("the descriptor names namespace {handed:?}, the probe {expected:?}"),
        ));
    }
    if own != expected {
        return Err(failed(
            SidecarStep::Namespace,
            format!(
                "it runs in namespace {own:?}, not the enforcement namespace {expected:?}, \
                 and holds no privilege to enter another"
            ),
        ));
    }
    Ok(())
}

/// Reads and validates the policy from a memfd sealed against every change.
pub fn read_policy(fd: BorrowedFd<'_>) -> Result<DerivedNetworkPolicy, SidecarError> {
    let step = SidecarStep::Policy;
    let bytes = memfd::read_sealed(fd, DerivedNetworkPolicy::MAX_ENCODED_LEN)
        .map_err(|e| failed_by(step, "the policy", &e))?;
    let policy: DerivedNetworkPolicy =
        codec::decode(&bytes).map_err(|e| failed_by(step, "", &e))?;
    policy
        .validate()
        .map_err(|e| failed(step, format!("the policy is not installable: {e}")))?;
    Ok(policy)
}
