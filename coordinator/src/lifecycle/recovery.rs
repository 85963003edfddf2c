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

use crate::config::RetainedDir;
use crate::process::{Proof, kill_and_wait, prove};
use lazaret_storage::catalog::StorageCatalog;
use lazaret_storage::store::{DomainStore, Slot, StoreError};

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
        ParticipantOwnership::Resolver(_) => 3,
        ParticipantOwnership::Helper(_) => 4,
        ParticipantOwnership::Sandbox(_) => 5,
        ParticipantOwnership::Publication(_) => 6,
    }
}
