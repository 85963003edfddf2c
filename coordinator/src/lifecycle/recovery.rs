//! Releasing a generation from its records: the one path by which a
//! generation ends, whether its coordinator stops it in order or a later CLI
//! invocation finds it stale after a crash.
//!
//! Owns the release order (publication, sandbox, supervisor, network, workspace
//! routing, State Anchor, prepared-lower lease) and the rule that a recorded process is signalled
//! only after its pidfs identity is proven again. Trusts the Domain Store's
//! rows for what to look for, and the kernel for what is really there.

use std::time::Duration;

use std::ffi::OsStr;
use std::path::Path;

use lazaret_proto::common::{HostPath, UnixTimeNs};
use lazaret_proto::ids::{DomainId, GenerationId};
use lazaret_proto::ownership::ParticipantOwnership;
use lazaret_proto::process::{HostProcessIdentity, PersistedHostProcessOwnership};
use lazaret_proto::store::{
    Generation, GenerationState, Participant, ParticipantState, SessionTerminal,
    SessionTerminalState,
};
use lazaret_storage::catalog::StorageCatalog;
use lazaret_storage::store::{DomainStore, Slot, StoreError};

use crate::config::RetainedDir;
use crate::process::{Proof, kill_and_wait, prove};

use super::DomainPaths;

/// Why releasing a generation failed; its records stay for the next try.
#[derive(Debug, thiserror::Error)]
pub enum RecoveryError {
    /// The Domain Store failed.
    #[error("cannot update the Domain Store")]
    Store(#[from] StoreError),
    /// A recorded process could not be proven or stopped.
    #[error("cannot stop the {what} of generation {generation} (pid {pid})")]
    Process {
        /// Which process.
        what: &'static str,
        /// The generation.
        generation: u64,
        /// Its recorded pid.
        pid: u32,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// The prepared-lower lease could not be released.
    #[error("cannot release the image lease of generation {generation}")]
    Lease {
        /// The generation.
        generation: u64,
        /// What the catalog said.
        #[source]
        source: lazaret_storage::catalog::CatalogError,
    },
}

/// How long a killed process may take to exit.
const EXIT_TIMEOUT: Duration = Duration::from_secs(10);

/// Proves and, if alive, kills a recorded process.
fn stop_recorded(
    what: &'static str,
    generation: u64,
    ownership: &PersistedHostProcessOwnership,
) -> Result<bool, RecoveryError> {
    let record = match ownership {
        PersistedHostProcessOwnership::Unassigned => return Ok(false),
        PersistedHostProcessOwnership::Staged(r) | PersistedHostProcessOwnership::Committed(r) => r,
    };
    let pid = match record {
        HostProcessIdentity::PidfsV1 { identity, .. } => identity.host_pid,
        HostProcessIdentity::LegacyUnverifiedV1(identity) => identity.host_pid,
    };
    let fail = |source| RecoveryError::Process {
        what,
        generation,
        pid,
        source,
    };
    match prove(record).map_err(fail)? {
        Proof::Alive(pidfd) => {
            let exited =
                kill_and_wait(std::os::fd::AsFd::as_fd(&pidfd), EXIT_TIMEOUT).map_err(fail)?;
            if !exited {
                return Err(fail(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "it did not exit after SIGKILL",
                )));
            }
            Ok(true)
        }
        // A legacy identity is never acted on; it is only refused.
        Proof::Gone | Proof::Unprovable => Ok(false),
    }
}

/// Finishes the Domain's stale generation, if one is open (its coordinator
/// is gone: the caller holds the Domain lock): [`release_generation`],
/// logged. The generation it finished.
pub fn finish_stale(
    store: &DomainStore,
    catalog: &StorageCatalog,
    domain_id: DomainId,
    runtime_dir: &RetainedDir,
) -> Result<Option<GenerationId>, RecoveryError> {
    let Some(stale) = store.open_generation()? else {
        return Ok(None);
    };
    let id = stale.generation_id;
    tracing::warn!("finishing stale generation {id}");
    let killed = release_generation(store, catalog, domain_id, stale, runtime_dir)?;
    tracing::info!("stale generation {id} released; {killed} leftover processes stopped");
    Ok(Some(id))
}

/// Releases every participant of `generation` and records it closed. Safe to
/// run again on a half-released generation: each step checks what is left.
/// Returns how many live processes had to be killed.
pub fn release_generation(
    store: &DomainStore,
    catalog: &StorageCatalog,
    domain_id: DomainId,
    mut generation: Generation,
    runtime_dir: &RetainedDir,
) -> Result<usize, RecoveryError> {
    let n = generation.generation_id.0;
    if generation.state != GenerationState::Stopping {
        generation.state = GenerationState::Stopping;
        store.put_generation(&generation)?;
    }
    let mut participants = store.participants(generation.generation_id)?;
    // Release in the reverse order of creation.
    participants.sort_by_key(|(_, p)| std::cmp::Reverse(creation_rank(&p.ownership)));
    let mut killed = 0;
    for (slot, participant) in participants {
        if matches!(
            participant.state,
            ParticipantState::Released | ParticipantState::Retained
        ) {
            continue;
        }
        // The decision to release is durable before any of its effects.
        if participant.state != ParticipantState::ReleaseIntent {
            store.put_participant(
                slot,
                &Participant {
                    state: ParticipantState::ReleaseIntent,
                    ..participant.clone()
                },
            )?;
            lazaret_storage::fault::point("release", &slot.name());
        }
        let mut next = Participant {
            state: ParticipantState::Released,
            ..participant.clone()
        };
        match &participant.ownership {
            ParticipantOwnership::Publication(publication) => {
                // The socket, and the client credential whose keys never
                // outlive their generation.
                let recorded = [&publication.socket_path, &publication.identity_path];
                for path in recorded.into_iter().flatten() {
                    remove_in(runtime_dir, path);
                }
            }
            ParticipantOwnership::Sandbox(sandbox) => {
                killed += usize::from(stop_recorded("sandbox", n, &sandbox.container_process)?);
            }
            ParticipantOwnership::Helper(helper) => {
                // The namespace holder (the supervisor's pid 1) is recorded
                // in the same field as the supervisor.
                let process = if slot == Slot::NAMESPACE_HOLDER {
                    "namespace holder"
                } else {
                    "supervisor"
                };
                killed += usize::from(stop_recorded(process, n, &helper.runtime_supervisor)?);
                killed += usize::from(stop_recorded(
                    "connectivity helper",
                    n,
                    &helper.connectivity_helper,
                )?);
            }
            ParticipantOwnership::StateAnchor(_) => {
                // Its mounts lived in the Domain mount namespace and ended
                // with it; its upper is the Domain's persistent state.
                next.state = ParticipantState::Retained;
            }
            ParticipantOwnership::PreparedLower(_) => {
                catalog
                    .release_lease(domain_id, generation.generation_id)
                    .map_err(|source| RecoveryError::Lease {
                        generation: n,
                        source,
                    })?;
            }
            ParticipantOwnership::GitRouting(routing) => {
                // The router lives in the Domain pid namespace and ends
                // with it; one that outlived it is stopped here. Its mount
                // ended with the Domain mount namespace; the isolated
                // directory is the Domain's persistent state.
                killed += usize::from(stop_recorded("workspace router", n, &routing.router)?);
            }
            ParticipantOwnership::Network(_) => {}
            ParticipantOwnership::Resolver(resolver) => {
                // Lazaret's resolver, like the router, ends with the
                // Domain pid namespace; one that outlived it is stopped.
                killed += usize::from(stop_recorded("resolver", n, &resolver.process)?);
            }
            ParticipantOwnership::CredentialProxy(proxy) => {
                // So does the Credential Proxy.
                killed += usize::from(stop_recorded("credential proxy", n, &proxy.process)?);
            }
        }
        store.put_participant(slot, &next)?;
    }
    let generation_dir = DomainPaths::generation_dir_name(generation.generation_id);
    let _ = lazaret_hostfs::tree::remove_at(runtime_dir.fd(), OsStr::new(&generation_dir));
    close_sessions(store, generation.generation_id)?;
    generation.state = GenerationState::Closed;
    generation.closed_at = Some(UnixTimeNs::now());
    store.put_generation(&generation)?;
    Ok(killed)
}

/// Removes the recorded `path` if it is a direct child of `runtime_dir`,
/// through that directory's descriptor: a recorded absolute path is never
/// followed. Anything else is left, and logged.
fn remove_in(runtime_dir: &RetainedDir, path: &HostPath) {
    let path = Path::new(path.as_os_str());
    let name = match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) if parent == runtime_dir.label() => name,
        _ => {
            tracing::warn!(
                "a recorded path {} is not in the Domain's runtime directory; left alone",
                path.display()
            );
            return;
        }
    };
    let _ = lazaret_hostfs::tree::remove_at(runtime_dir.fd(), name);
}

/// Records every session of a released generation closed: its sandbox is
/// gone, so its process is too (the runtime-absence check). A session
/// still recorded open would look alive.
fn close_sessions(store: &DomainStore, generation: GenerationId) -> Result<(), RecoveryError> {
    for (mut session, terminal) in store.sessions(generation)? {
        let open = session.closed_at.is_none()
            || terminal
                .as_ref()
                .is_some_and(|t| t.state != SessionTerminalState::Closed);
        if !open {
            continue;
        }
        session.closed_at.get_or_insert_with(UnixTimeNs::now);
        let terminal = SessionTerminal {
            state: SessionTerminalState::Closed,
            ..terminal.unwrap_or(SessionTerminal {
                generation_id: generation,
                session_id: session.session_id,
                state: SessionTerminalState::Closed,
                pty: None,
                guest_process: None,
            })
        };
        store.put_session_state(&session, &terminal)?;
    }
    Ok(())
}

/// The order participants are created in; they are released in reverse.
fn creation_rank(ownership: &ParticipantOwnership) -> u8 {
    match ownership {
        ParticipantOwnership::PreparedLower(_) => 0,
        ParticipantOwnership::StateAnchor(_) => 1,
        ParticipantOwnership::GitRouting(_) => 2,
        ParticipantOwnership::Network(_) => 3,
        ParticipantOwnership::Resolver(_) | ParticipantOwnership::CredentialProxy(_) => 3,
        ParticipantOwnership::Helper(_) => 4,
        ParticipantOwnership::Sandbox(_) => 5,
        ParticipantOwnership::Publication(_) => 6,
    }
}

#[cfg(test)]
mod tests {
    //! Releasing generations from what the store records, in every
    //! durable state, on a scratch host: no root, no runsc. The processes
    //! are this test's own children.

    use std::path::Path;
    use std::sync::Arc;

    use lazaret_proto::common::{HostPath, UnixTimeNs};
    use lazaret_proto::ids::{CliId, GenerationId, SessionId};
    use lazaret_proto::ownership::{
        CredentialProxyOwnership, HelperOwnership, ParticipantOwnership, PreparedLowerOwnership,
        PublicationOwnership, ResolverOwnership, SandboxOwnership, StateAnchorOwnership,
    };
    use lazaret_proto::process::{
        HostProcessIdentity, LegacyUnverifiedProcessIdentityV1, PersistedHostProcessOwnership,
    };
    use lazaret_proto::store::{
        GenerationState, Participant, ParticipantState, Session, SessionTerminal,
        SessionTerminalState,
    };

    use super::{RecoveryError, release_generation};
    use crate::config::ResolvedDomainConfiguration;
    use crate::lifecycle::testing::{Scratch, generation, store_of};
    use crate::process::HeldProcess;
    use lazaret_storage::catalog::StorageCatalog;
    use lazaret_storage::store::{DomainStore, STORE_FILE, Slot};

    /// A scratch Domain with its store, catalog and generation 2 running.
    struct Domain {
        scratch: Scratch,
        resolved: ResolvedDomainConfiguration,
        store: Arc<DomainStore>,
        catalog: StorageCatalog,
    }

    const GENERATION: GenerationId = GenerationId(2);

    impl Domain {
        fn new() -> Self {
            let scratch = Scratch::new();
            let resolved = scratch.load("");
            let store = store_of(&resolved);
            let catalog = StorageCatalog::open(
                &resolved.authorities().storage_root,
                rustix::process::getuid().as_raw(),
            )
            .unwrap();
            store
                .put_generation(&generation(
                    &resolved,
                    GENERATION.0,
                    GenerationState::Running,
                ))
                .unwrap();
            Self {
                scratch,
                resolved,
                store,
                catalog,
            }
        }

        fn runtime(&self) -> &Path {
            self.resolved.authorities().domain_runtime.label()
        }

        fn record(&self, slot: Slot, state: ParticipantState, ownership: ParticipantOwnership) {
            let participant = Participant {
                generation_id: GENERATION,
                role: ownership.role(),
                state,
                ownership,
            };
            self.store.put_participant(slot, &participant).unwrap();
        }

        fn state(&self, slot: Slot) -> ParticipantState {
            self.store
                .participants(GENERATION)
                .unwrap()
                .into_iter()
                .find(|(s, _)| *s == slot)
                .map(|(_, p)| p.state)
                .expect("a record in the slot")
        }

        fn release(&self) -> Result<usize, RecoveryError> {
            let generation = self
                .store
                .open_generation()
                .unwrap()
                .unwrap_or_else(|| self.store.latest_generation().unwrap().unwrap());
            release_generation(
                &self.store,
                &self.catalog,
                self.resolved.domain_id(),
                generation,
                &self.resolved.authorities().domain_runtime,
            )
        }
    }

    fn publication(socket: &Path, identity: Option<&Path>) -> ParticipantOwnership {
        ParticipantOwnership::Publication(PublicationOwnership {
            socket_path: Some(HostPath::from(socket)),
            identity_path: identity.map(HostPath::from),
        })
    }

    fn helper(process: PersistedHostProcessOwnership) -> ParticipantOwnership {
        ParticipantOwnership::Helper(HelperOwnership {
            runtime_supervisor: process,
            ..HelperOwnership::default()
        })
    }

    /// A child of this test, held by its pidfd.
    fn child(program: &str, args: &[&str]) -> (std::process::Child, HeldProcess) {
        let child = std::process::Command::new(program)
            .args(args)
            .spawn()
            .unwrap();
        let pidfd = crate::process::pidfd_of_child(&child).unwrap();
        let held = HeldProcess::from_pidfd(pidfd).unwrap();
        (child, held)
    }

    #[test]
    fn every_durable_state_is_released_retained_or_left_as_it_is() {
        let domain = Domain::new();
        let lower = ParticipantOwnership::PreparedLower(PreparedLowerOwnership::default());
        let anchor = || ParticipantOwnership::StateAnchor(StateAnchorOwnership::default());
        let network = ParticipantOwnership::Network(Default::default());
        let unassigned = || helper(PersistedHostProcessOwnership::Unassigned);
        domain.record(Slot::PREPARED_LOWER, ParticipantState::LeaseHeld, lower);
        domain.record(Slot::state_anchor(0), ParticipantState::Active, anchor());
        domain.record(Slot::state_anchor(1), ParticipantState::Retained, anchor());
        domain.record(Slot::NETWORK, ParticipantState::Intent, network);
        domain.record(
            Slot::SUPERVISOR,
            ParticipantState::ReleaseIntent,
            unassigned(),
        );
        domain.record(
            Slot::NAMESPACE_HOLDER,
            ParticipantState::Released,
            unassigned(),
        );
        let killed = domain.release().unwrap();
        assert_eq!(killed, 0, "nothing recorded was running");
        for (slot, state) in [
            (Slot::PREPARED_LOWER, ParticipantState::Released),
            (Slot::state_anchor(0), ParticipantState::Retained),
            (Slot::state_anchor(1), ParticipantState::Retained),
            (Slot::NETWORK, ParticipantState::Released),
            (Slot::SUPERVISOR, ParticipantState::Released),
            (Slot::NAMESPACE_HOLDER, ParticipantState::Released),
        ] {
            assert_eq!(domain.state(slot), state, "{}", slot.name());
        }
        let closed = domain.store.latest_generation().unwrap().unwrap();
        assert_eq!(closed.state, GenerationState::Closed);
        assert!(closed.closed_at.is_some());
        assert!(domain.store.open_generation().unwrap().is_none());
    }

    #[test]
    fn releasing_again_finds_nothing_left_to_do() {
        let domain = Domain::new();
        let network = ParticipantOwnership::Network(Default::default());
        domain.record(Slot::NETWORK, ParticipantState::Active, network);
        domain.release().unwrap();
        let first = domain.store.latest_generation().unwrap().unwrap();
        // A crash after the release, before anything else: the next one
        // finds every participant released and the generation closed.
        assert_eq!(domain.release().unwrap(), 0);
        assert_eq!(domain.state(Slot::NETWORK), ParticipantState::Released);
        let again = domain.store.latest_generation().unwrap().unwrap();
        assert_eq!(again.state, GenerationState::Closed);
        assert_eq!(again.generation_id, first.generation_id);
    }

    #[test]
    fn published_sockets_and_credentials_go_but_a_path_outside_the_runtime_dir_stays() {
        let domain = Domain::new();
        let runtime = domain.runtime().to_path_buf();
        let socket = runtime.join("control.sock");
        let credential = runtime.join("session");
        std::fs::write(&socket, b"").unwrap();
        std::fs::create_dir(&credential).unwrap();
        std::fs::write(credential.join("client.pem"), b"key").unwrap();
        let outside = domain.scratch.base().join("elsewhere.sock");
        std::fs::write(&outside, b"").unwrap();
        domain.record(
            Slot::PUBLICATION,
            ParticipantState::Active,
            publication(&socket, None),
        );
        domain.record(
            Slot::SESSION_PUBLICATION,
            ParticipantState::Intent,
            publication(&outside, Some(&credential)),
        );
        domain.release().unwrap();
        assert!(!socket.exists());
        assert!(!credential.exists(), "keys never outlive their generation");
        assert!(outside.exists(), "a recorded path is never followed out");
        assert_eq!(
            domain.state(Slot::SESSION_PUBLICATION),
            ParticipantState::Released
        );
    }

    #[test]
    fn a_recorded_process_still_running_is_killed_and_one_gone_is_not() {
        let domain = Domain::new();
        let (mut running, held_running) = child("sleep", &["60"]);
        let (mut done, held_done) = child("true", &[]);
        done.wait().unwrap();
        domain.record(
            Slot::SANDBOX,
            ParticipantState::Active,
            ParticipantOwnership::Sandbox(SandboxOwnership {
                container_process: held_running.committed(),
                ..SandboxOwnership::default()
            }),
        );
        domain.record(
            Slot::SUPERVISOR,
            ParticipantState::Active,
            helper(held_done.committed()),
        );
        assert_eq!(domain.release().unwrap(), 1);
        let status = running.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9)
        );
        assert_eq!(domain.state(Slot::SANDBOX), ParticipantState::Released);
        assert_eq!(domain.state(Slot::SUPERVISOR), ParticipantState::Released);
    }

    #[test]
    fn a_resolver_and_a_credential_proxy_that_outlived_their_domain_are_killed() {
        // They end with the Domain pid namespace; recovery still stops
        // ones that did not, so no proxy holding real values outlives it.
        let domain = Domain::new();
        let (mut resolver, held_resolver) = child("sleep", &["60"]);
        let (mut proxy, held_proxy) = child("sleep", &["60"]);
        domain.record(
            Slot::RESOLVER,
            ParticipantState::Active,
            ParticipantOwnership::Resolver(ResolverOwnership {
                names_digest: None,
                process: held_resolver.committed(),
            }),
        );
        domain.record(
            Slot::CREDENTIAL_PROXY,
            ParticipantState::Active,
            ParticipantOwnership::CredentialProxy(CredentialProxyOwnership {
                hosts: vec!["api.example.invalid".into()],
                process: held_proxy.committed(),
            }),
        );
        assert_eq!(domain.release().unwrap(), 2);
        for child in [&mut resolver, &mut proxy] {
            let status = child.wait().unwrap();
            assert_eq!(
                std::os::unix::process::ExitStatusExt::signal(&status),
                Some(9)
            );
        }
        assert_eq!(domain.state(Slot::RESOLVER), ParticipantState::Released);
        assert_eq!(
            domain.state(Slot::CREDENTIAL_PROXY),
            ParticipantState::Released
        );
    }

    #[test]
    fn a_legacy_identity_is_never_acted_on() {
        let domain = Domain::new();
        // This very process, named the old way: refused, never signalled.
        let me = HostProcessIdentity::LegacyUnverifiedV1(LegacyUnverifiedProcessIdentityV1 {
            host_pid: std::process::id(),
            start_time_ticks: 0,
        });
        domain.record(
            Slot::SUPERVISOR,
            ParticipantState::Active,
            helper(PersistedHostProcessOwnership::Committed(me)),
        );
        assert_eq!(domain.release().unwrap(), 0);
        assert_eq!(domain.state(Slot::SUPERVISOR), ParticipantState::Released);
    }

    #[test]
    fn the_generation_dir_goes_and_open_sessions_are_recorded_closed() {
        let domain = Domain::new();
        let generation_dir = domain.runtime().join("gen-2");
        std::fs::create_dir_all(generation_dir.join("mnt")).unwrap();
        let session = Session {
            generation_id: GENERATION,
            session_id: SessionId([5; 16]),
            cli_id: CliId([5; 16]),
            opened_at: UnixTimeNs::now(),
            closed_at: None,
        };
        let terminal = SessionTerminal {
            generation_id: GENERATION,
            session_id: session.session_id,
            state: SessionTerminalState::Running,
            pty: None,
            guest_process: None,
        };
        domain.store.put_session_state(&session, &terminal).unwrap();
        domain.release().unwrap();
        assert!(!generation_dir.exists());
        let sessions = domain.store.sessions(GENERATION).unwrap();
        assert_eq!(sessions.len(), 1);
        let (session, terminal) = &sessions[0];
        assert!(session.closed_at.is_some(), "no session looks alive");
        assert_eq!(
            terminal.as_ref().map(|t| t.state),
            Some(SessionTerminalState::Closed)
        );
    }

    /// Rewrites the stored record of `slot` with what `damage` makes of it,
    /// with the store closed, as a crash or a bad disk would leave it.
    fn damage_record(domain: Domain, slot: Slot, damage: impl Fn(&[u8]) -> Vec<u8>) -> Domain {
        let Domain {
            scratch,
            resolved,
            store,
            catalog,
        } = domain;
        drop(store);
        use redb::ReadableTable;
        const PARTICIPANTS: redb::TableDefinition<(u64, u32), &[u8]> =
            redb::TableDefinition::new("participants");
        let path = resolved
            .authorities()
            .domain_storage
            .label()
            .join(STORE_FILE);
        {
            let db = redb::Database::open(&path).unwrap();
            let txn = db.begin_write().unwrap();
            {
                let mut table = txn.open_table(PARTICIPANTS).unwrap();
                let stored = table
                    .get((GENERATION.0, slot.0))
                    .unwrap()
                    .expect("the record")
                    .value()
                    .to_vec();
                table
                    .insert((GENERATION.0, slot.0), damage(&stored).as_slice())
                    .unwrap();
            }
            txn.commit().unwrap();
        }
        let store = store_of(&resolved);
        Domain {
            scratch,
            resolved,
            store,
            catalog,
        }
    }

    /// A damaged record stops the release before anything is released:
    /// the generation stays open, for `lazaret state verify` to name and
    /// the next try once it is repaired.
    fn refused(damage: impl Fn(&[u8]) -> Vec<u8>) {
        let domain = Domain::new();
        let runtime = domain.runtime().to_path_buf();
        let socket = runtime.join("control.sock");
        std::fs::write(&socket, b"").unwrap();
        domain.record(
            Slot::PUBLICATION,
            ParticipantState::Active,
            publication(&socket, None),
        );
        let network = ParticipantOwnership::Network(Default::default());
        domain.record(Slot::NETWORK, ParticipantState::Active, network);
        let domain = damage_record(domain, Slot::NETWORK, damage);
        let failed = domain.release().unwrap_err();
        assert!(matches!(failed, RecoveryError::Store(_)), "{failed:?}");
        assert!(socket.exists(), "nothing was released");
        let open = domain.store.open_generation().unwrap().expect("still open");
        assert_eq!(open.generation_id, GENERATION);
    }

    #[test]
    fn a_garbled_record_stops_the_release_and_keeps_the_generation_open() {
        refused(|stored| {
            let mut garbled = stored.to_vec();
            garbled[0] = 0xff;
            garbled
        });
    }

    #[test]
    fn a_torn_record_stops_the_release_and_keeps_the_generation_open() {
        refused(|stored| stored[..stored.len() / 2].to_vec());
    }
}
