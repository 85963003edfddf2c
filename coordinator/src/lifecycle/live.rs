//! What a generation holds while it runs, and the stores of the Domain
//! whose ownership this coordinator holds.
//!
//! Owns the running generation's processes, sockets and records in memory,
//! and the status they add up to. Trusts the supervisor's reports as far
//! as bring-up verified them.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixListener;
use std::sync::Arc;

use lazaret_proto::common::HostPath;
use lazaret_proto::control::{DomainStatus, NetworkStatus, WorkspaceStatus};
use lazaret_proto::ids::{ContainerId, GenerationId};
use lazaret_proto::store::Generation;
use lazaret_proto::trust::{ProtocolCredential, TrustManifest};
use lazaret_storage::catalog::{PreparedLower, StorageCatalog};
use lazaret_storage::store::DomainStore;

use super::supervisor::Supervisor;
use crate::config::ResolvedDomainConfiguration;
use crate::network::ConnectivityHelper;
use crate::process::HeldProcess;
use crate::session::hub::Hub;

/// The stores of a Domain whose ownership this process holds.
pub(super) struct Owned {
    pub(super) store: Arc<DomainStore>,
    pub(super) catalog: StorageCatalog,
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
    pub(super) coordinator: HeldProcess,
    pub(super) holder: HeldProcess,
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
    pub(super) prepared: PreparedLower,
    pub(super) container_id: ContainerId,
    pub(super) runtime_root: HostPath,
    pub(super) helper: ConnectivityHelper,
    pub(super) network: NetworkStatus,
    /// Lazaret's resolver, when the policy has names.
    pub(super) resolver: Option<HeldProcess>,
    /// The Credential Proxy, for a profile with credentials.
    pub(super) proxy: Option<HeldProcess>,
    pub(super) router: HeldProcess,
    pub(super) workspace: WorkspaceStatus,
    /// What the directories holding scripts git runs held at `up`, for
    /// `down` to compare.
    pub(super) workspace_watch: lazaret_routing::watch::Watch,
    pub(super) uppers: super::usage::Uppers,
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
            (P::CredentialProxy, self.proxy.as_ref()),
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
