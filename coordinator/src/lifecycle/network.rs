//! Bringing up a generation's network: the step between the Domain
//! namespaces existing and the sandbox running.
//!
//! Owns the order that makes the attestation mean something: the network
//! participant and the helper are recorded before anything starts; the
//! supervisor's Network Sidecar installs the sealed policy's packet filter
//! while slirp4netns attaches to the enforcement namespace, then its
//! routes once slirp4netns is attached, and probes them; the
//! attestation is verified against the identity this coordinator expects
//! (Domain, generation, sidecar, policy digest, namespace) and the policy
//! itself, and only then recorded. Trusts the supervisor's namespace
//! descriptors (already proven) and nothing in the attestation until it
//! verifies.

use std::os::fd::AsFd;

use lazaret_proto::control::{
    NamesStatus, NetworkRecheck, NetworkStatus, ProxyStatus, StartupStep,
};
use lazaret_proto::credproxy::ProxyReadiness;
use lazaret_proto::names::DnsMode;
use lazaret_proto::resolver::ResolverReadiness;
use lazaret_storage::store::Slot;

use crate::network::PlannedNetwork;
use lazaret_proto::ids::NetworkSidecarId;
use lazaret_proto::network::{
    ConnectivityLink, DnsOutcome, NamedEgress, NetworkReachabilityProbe, NetworkReadinessIdentity,
    NetworkReadinessIdentitySchemaId,
};
use lazaret_proto::ownership::{
    CredentialProxyOwnership, HelperOwnership, NetworkOwnership, ParticipantOwnership,
    ResolverOwnership,
};
use lazaret_proto::process::{PersistedHostProcessOwnership, PidfsProcessIdentityV1};
use lazaret_proto::sidecar::AttestParameters;
use lazaret_proto::store::ParticipantState;

use super::context::Context;
use super::failure::{Failure, at, failure, reported};
use super::record::{Became, Intent, Recorder};
use super::report::Reporter;
use super::supervisor::{Attested, Namespaces, Supervisor};
use crate::network::{ConnectivityHelper, policy_memfd};
use crate::process::HeldProcess;
use crate::session;

const STEP: StartupStep = StartupStep::Network;

/// The network once its attestation is asked for: what [`verify`] checks
/// the attestation against.
pub(super) struct Requested {
    policy: lazaret_proto::network::DerivedNetworkPolicy,
    platform_deny: Vec<lazaret_proto::network::IpPrefix>,
    expected: NetworkReadinessIdentity,
    network: NetworkOwnership,
    network_intent: Intent,
    link: ConnectivityLink,
    helper: PidfsProcessIdentityV1,
    names: Option<NamedEgress>,
    /// The Credential Proxy's hosts, sorted; empty without credentials.
    proxied: Vec<String>,
}

/// The connectivity helper's record, with the sidecar that attests the
/// network it carries and its process as far as it exists.
fn helper_record(
    sidecar: NetworkSidecarId,
    process: PersistedHostProcessOwnership,
) -> ParticipantOwnership {
    ParticipantOwnership::Helper(HelperOwnership {
        network_sidecar_id: Some(sidecar),
        connectivity_helper: process,
        ..HelperOwnership::default()
    })
}

/// The network participant ([`Slot::NETWORK`], its policy) and the
/// connectivity helper ([`Slot::CONNECTIVITY_HELPER`], with the sidecar
/// that will attest it) as intended, for the generation's first commit:
/// nothing of either exists until the Domain namespaces do.
pub(super) fn intended(
    planned: &PlannedNetwork,
) -> Result<(NetworkSidecarId, [(Slot, ParticipantOwnership); 2]), Failure> {
    let network = NetworkOwnership {
        derived_policy_digest: Some(planned.policy.digest().map_err(|e| at(STEP)(&e))?),
        ..NetworkOwnership::default()
    };
    let sidecar = NetworkSidecarId(session::random_bytes());
    Ok((
        sidecar,
        [
            (Slot::NETWORK, ParticipantOwnership::Network(network)),
            (
                Slot::CONNECTIVITY_HELPER,
                helper_record(sidecar, PersistedHostProcessOwnership::Unassigned),
            ),
        ],
    ))
}

/// The records [`attach`] completes: the supervisor and its pid 1, the
/// network and its connectivity helper, all recorded as intended.
pub(super) struct Records {
    pub(super) supervisor: Intent,
    pub(super) holder: Intent,
    pub(super) network: Intent,
    pub(super) helper: Intent,
    /// The sidecar the helper's intent names.
    pub(super) sidecar: NetworkSidecarId,
}

/// Asks the supervisor's Network Sidecar to install the policy and attest
/// it, and starts slirp4netns on the enforcement namespace; then records
/// the supervisor, the namespace holder (which reported `namespaces`, with
/// its pidfd) and slirp4netns as running, in one commit. The sidecar,
/// inside the Domain, installs the packet filter while slirp4netns
/// attaches and the records are committed, and configures its device once
/// slirp4netns says, on the ready pipe the sidecar holds, that it is
/// attached; the attestation comes while the supervisor stages the plan.
/// The helper is left in `helper` as soon as it runs, so a failure later
/// still stops it. Nothing of the sandbox runs yet.
pub(super) fn attach(
    cx: Context<'_>,
    supervisor: &Supervisor,
    namespaces: &Namespaces,
    records: Records,
    PlannedNetwork {
        policy,
        platform_deny,
        names,
    }: PlannedNetwork,
    helper: &mut Option<ConnectivityHelper>,
) -> Result<Requested, Failure> {
    let policy_digest = policy.digest().map_err(|e| at(STEP)(&e))?;
    let network = NetworkOwnership {
        derived_policy_digest: Some(policy_digest),
        enforcement_namespace: Some(namespaces.network_namespace),
        owning_user_namespace: Some(namespaces.user_namespace),
        ..NetworkOwnership::default()
    };
    let network_sidecar_id = records.sidecar;
    cx.reporter
        .progress(STEP, "installing and attesting the policy");
    let expected = NetworkReadinessIdentity {
        schema_id: NetworkReadinessIdentitySchemaId,
        domain_id: cx.resolved.domain_id(),
        generation_id: cx.generation.generation_id,
        network_sidecar_id,
        derived_policy_digest: policy_digest,
        enforcement_namespace: namespaces.network_namespace,
    };
    let link = ConnectivityLink::slirp4netns();
    let memfd = policy_memfd(&policy).map_err(|e| at(STEP)(&e))?;
    let proxied = cx.credentials.hosts();
    let credentials = (!cx.credentials.is_empty())
        .then(|| cx.credentials.proxy_memfd())
        .transpose()
        .map_err(|e| at(STEP)(&e).within("cannot hand the credentials to the Credential Proxy"))?;
    let (ready_read, ready_write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| {
            reported(
                STEP,
                lazaret_proto::failure::Failure::os("cannot make a pipe", e, None),
            )
        })?;
    supervisor.request_attestation(
        AttestParameters {
            probe: NetworkReachabilityProbe {
                domain_id: expected.domain_id,
                generation_id: expected.generation_id,
                enforcement_namespace: expected.enforcement_namespace,
            },
            network_sidecar_id,
            link: link.clone(),
            names: names.clone(),
        },
        memfd.as_fd(),
        ready_read.as_fd(),
        credentials.as_ref().map(|fd| (fd.as_fd(), proxied.clone())),
    )?;
    drop((ready_read, credentials));

    cx.reporter
        .progress(STEP, "attaching slirp4netns to the enforcement namespace");
    let started = ConnectivityHelper::start(
        namespaces.user_fd.as_fd(),
        namespaces.network_fd.as_fd(),
        &link,
        cx.generation_dir.fd(),
        ready_write,
    )
    .map_err(|e| at(STEP)(&e).within("the connectivity helper could not attach"))?;
    let running = helper.insert(started);
    // The supervisor and its pid 1 are recorded in the same field.
    let runs = |process: &crate::process::HeldProcess| {
        ParticipantOwnership::Helper(HelperOwnership {
            runtime_supervisor: process.committed(),
            ..HelperOwnership::default()
        })
    };
    cx.recorder.settle(
        STEP,
        vec![
            records
                .supervisor
                .becoming(ParticipantState::Active, runs(&supervisor.held)),
            records
                .holder
                .becoming(ParticipantState::Active, runs(&namespaces.holder)),
            records.helper.becoming(
                ParticipantState::Active,
                helper_record(network_sidecar_id, running.held.committed()),
            ),
        ],
    )?;
    Ok(Requested {
        policy,
        platform_deny,
        expected,
        network,
        network_intent: records.network,
        link,
        helper: running.held.identity,
        names,
        proxied,
    })
}

/// The processes that serve the sandbox's names, once verified.
pub(super) struct NameServers {
    /// Lazaret's resolver, for a policy with names.
    pub(super) resolver: Option<HeldProcess>,
    /// The Credential Proxy, for a profile with credentials.
    pub(super) proxy: Option<HeldProcess>,
}

/// Verifies the Network Sidecar's attestation against the identity this
/// coordinator expects and the policy itself, and, for a policy with
/// names, Lazaret's resolver's readiness against the names, and for a
/// profile with credentials the Credential Proxy's against its hosts: the
/// network participant became attested, and the resolver and proxy
/// (recorded as intended here) running, for the caller to record before
/// the sandbox starts.
pub(super) fn verify(
    reporter: &Reporter,
    recorder: &Recorder,
    requested: Requested,
    Attested {
        attestation,
        resolver,
        proxy,
    }: Attested,
) -> Result<(NetworkStatus, NameServers, Vec<Became>), Failure> {
    let Requested {
        policy,
        platform_deny,
        expected,
        mut network,
        network_intent,
        link,
        helper,
        names,
        proxied,
    } = requested;
    attestation
        .verify(&expected, &policy, names.as_ref(), &link)
        .map_err(|e| {
            failure(
                STEP,
                format!("the Network Sidecar's attestation is refused: {e}"),
            )
        })?;
    let mut records = Vec::new();
    let (names, servers) = match (names, resolver) {
        (None, None) => (
            None,
            NameServers {
                resolver: None,
                proxy: None,
            },
        ),
        (Some(names), Some((pidfd, readiness))) => {
            readiness
                .verify(&names)
                .map_err(|e| failure(STEP, format!("Lazaret's resolver is refused: {e}")))?;
            let held = HeldProcess::from_pidfd(pidfd).map_err(|e| at(STEP)(&e))?;
            let record = |process| {
                ParticipantOwnership::Resolver(ResolverOwnership {
                    names_digest: Some(readiness.names_digest),
                    process,
                })
            };
            let [intent] = recorder.record(
                STEP,
                Vec::new(),
                [(
                    Slot::RESOLVER,
                    record(PersistedHostProcessOwnership::Unassigned),
                )],
                None,
            )?;
            records.push(intent.becoming(ParticipantState::Active, record(held.committed())));
            reporter.progress(STEP, resolver_summary(&names, &readiness));
            let (proxy_status, proxy) = verify_proxy(reporter, recorder, &proxied, proxy)?
                .map(|(status, became, held)| {
                    records.push(became);
                    (Some(status), Some(held))
                })
                .unwrap_or_default();
            let status = NamesStatus {
                names,
                resolver: held.identity,
                resolver_running: true,
                readiness,
                admitted: Vec::new(),
                admitted_total: 0,
                proxy: proxy_status,
            };
            (
                Some(status),
                NameServers {
                    resolver: Some(held),
                    proxy,
                },
            )
        }
        (Some(_), None) => {
            return Err(failure(
                STEP,
                "the policy has names but no resolver serves them",
            ));
        }
        (None, Some(_)) => {
            return Err(failure(
                STEP,
                "a resolver was started for a policy without names",
            ));
        }
    };
    let readiness_fingerprint = expected.fingerprint().map_err(|e| at(STEP)(&e))?;
    network.readiness_fingerprint = Some(readiness_fingerprint);
    network.readiness_evidence = Some(attestation.evidence().map_err(|e| at(STEP)(&e))?);
    records.push(network_intent.becoming(
        ParticipantState::Active,
        ParticipantOwnership::Network(network),
    ));
    reporter.progress(STEP, summary(&attestation));
    let status = NetworkStatus {
        policy,
        platform_deny,
        attestation,
        connectivity_helper: helper,
        recheck: NetworkRecheck::NotChecked,
        names,
    };
    Ok((status, servers, records))
}

/// Verifies the Credential Proxy's readiness against `proxied` (its
/// hosts) and records it as intended; its status, its record becoming
/// active, and its process. `None` when the profile has no credentials.
fn verify_proxy(
    reporter: &Reporter,
    recorder: &Recorder,
    proxied: &[String],
    proxy: Option<(std::os::fd::OwnedFd, ProxyReadiness)>,
) -> Result<Option<(ProxyStatus, Became, HeldProcess)>, Failure> {
    let (pidfd, readiness) = match (proxied.is_empty(), proxy) {
        (true, None) => return Ok(None),
        (false, Some(proxy)) => proxy,
        (true, Some(_)) => {
            return Err(failure(
                STEP,
                "a Credential Proxy was started for a profile without credentials",
            ));
        }
        (false, None) => {
            return Err(failure(
                STEP,
                "the profile has credentials but no Credential Proxy serves them",
            ));
        }
    };
    readiness
        .verify(proxied)
        .map_err(|e| failure(STEP, format!("the Credential Proxy is refused: {e}")))?;
    let held = HeldProcess::from_pidfd(pidfd).map_err(|e| at(STEP)(&e))?;
    let record = |process| {
        ParticipantOwnership::CredentialProxy(CredentialProxyOwnership {
            hosts: proxied.to_vec(),
            process,
        })
    };
    let [intent] = recorder.record(
        STEP,
        Vec::new(),
        [(
            Slot::CREDENTIAL_PROXY,
            record(PersistedHostProcessOwnership::Unassigned),
        )],
        None,
    )?;
    let became = intent.becoming(ParticipantState::Active, record(held.committed()));
    reporter.progress(
        STEP,
        format!(
            "the Credential Proxy serves {} on {}: the sandbox holds placeholders, the real \
             values go only to those hosts",
            proxied.join(", "),
            readiness.listen
        ),
    );
    let status = ProxyStatus {
        process: held.identity,
        running: true,
        readiness,
    };
    Ok(Some((status, became, held)))
}

/// One line saying what the resolver's probes showed.
fn resolver_summary(names: &NamedEgress, readiness: &ResolverReadiness) -> String {
    let allowed = match &readiness.allowed_probe {
        Some(probe) => format!(
            "{} answered (rcode {}, {} addresses)",
            probe.name,
            probe.response_code,
            probe.addresses.len()
        ),
        None => "no name allowed".into(),
    };
    format!(
        "Lazaret's resolver serves {} names on {}: {allowed}; others {}",
        names.hosts.len(),
        readiness.listen,
        match names.dns {
            DnsMode::Lazaret => "refused",
            DnsMode::Host => "forwarded to the host's resolver",
        }
    )
}

/// One line saying what the attestation showed.
fn summary(attestation: &lazaret_proto::network::NetworkReadinessAttestation) -> String {
    let dns = match attestation.dns_observations.first().map(|d| d.outcome) {
        Some(DnsOutcome::Answered { response_code }) => {
            format!("DNS answered (rcode {response_code})")
        }
        Some(DnsOutcome::TimedOut) => "DNS timed out (the host's resolver did not answer)".into(),
        Some(DnsOutcome::Unreachable) | None => "no DNS".into(),
    };
    format!(
        "attested: {} routes, {} denied destinations unreachable, {} permitted reachable, {dns}",
        attestation.observation.observed_routes.len(),
        attestation.denied_destinations.len(),
        attestation.permitted_destinations.len(),
    )
}
