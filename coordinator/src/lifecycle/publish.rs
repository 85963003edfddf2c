//! Publishing a generation: its control socket, and the Session
//! Coordinator's socket with the generation's session credentials.
//!
//! Owns the publications' intents (what recovery removes) and the binding
//! of both sockets in the Domain's runtime directory, through its
//! descriptor. Trusts the runtime directory, which the invoking user owns.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::sync::Arc;

use lazaret_proto::common::{HostPath, UnixTimeNs};
use lazaret_proto::control::StartupStep;
use lazaret_proto::ids::GenerationNonce;
use lazaret_proto::ownership::{ParticipantOwnership, PublicationOwnership};
use lazaret_proto::store::Generation;
use lazaret_proto::trust::{GenerationIdentity, ProtocolCredential, TrustManifest};
use lazaret_storage::store::Slot;

use super::failure::{Failure, at, failure};
use super::record::Intent;
use super::{CONTROL_SOCKET, chain};
use crate::config::ResolvedDomainConfiguration;
use crate::session;
use crate::session::tls::{GenerationCredentials, remove_client_credential};

/// What [`publish`] made: the control socket, and the Session
/// Coordinator's socket, server configuration and credentials, with their
/// records, which become active once the sandbox runs.
pub(super) struct Published {
    pub(super) listener: OwnedFd,
    pub(super) sessions: UnixListener,
    pub(super) session_server: Arc<rustls::ServerConfig>,
    pub(super) credential: ProtocolCredential,
    pub(super) manifest: TrustManifest,
    pub(super) records: [Intent; 2],
}

/// The intents to publish the control socket ([`Slot::PUBLICATION`]) and
/// the session socket with its client credential
/// ([`Slot::SESSION_PUBLICATION`]): what recovery removes.
pub(super) fn publications(
    auth: &crate::config::ConfinedAuthorities,
) -> [(Slot, ParticipantOwnership); 2] {
    let runtime = auth.domain_runtime.label();
    let published = |socket: &str, identity: Option<&str>| {
        ParticipantOwnership::Publication(PublicationOwnership {
            socket_path: Some(HostPath::from(&runtime.join(socket))),
            identity_path: identity.map(|dir| HostPath::from(&runtime.join(dir))),
        })
    };
    [
        (Slot::PUBLICATION, published(CONTROL_SOCKET, None)),
        (
            Slot::SESSION_PUBLICATION,
            published(session::SESSION_SOCKET, Some(session::CREDENTIAL_DIR)),
        ),
    ]
}

/// Binds the control socket, creates the generation's session
/// credentials, writes the client credential and binds the session socket;
/// `records` are their publications' intents, committed before.
pub(super) fn publish(
    resolved: &ResolvedDomainConfiguration,
    generation: &Generation,
    records: [Intent; 2],
) -> Result<Published, Failure> {
    let auth = resolved.authorities();
    let step = at(StartupStep::Sandbox);
    let socket = auth.domain_runtime.label().join(CONTROL_SOCKET);
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
        CONTROL_SOCKET,
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

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileTypeExt;
    use std::sync::Arc;

    use lazaret_proto::control::StartupStep;
    use lazaret_proto::ownership::{ParticipantOwnership, PublicationOwnership};
    use lazaret_proto::store::GenerationState;

    use super::{publications, publish};
    use crate::lifecycle::CONTROL_SOCKET;
    use crate::lifecycle::record::Recorder;
    use crate::lifecycle::testing::{Scratch, generation, store_of};
    use crate::session::{CREDENTIAL_DIR, SESSION_SOCKET};
    use lazaret_storage::store::Slot;

    fn is_socket(path: &std::path::Path) -> bool {
        std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket())
    }

    #[test]
    fn the_publications_are_the_two_sockets_and_the_credential_in_the_runtime_dir() {
        let scratch = Scratch::new();
        let resolved = scratch.load("");
        let runtime = resolved.authorities().domain_runtime.label().to_path_buf();
        let [(control_slot, control), (session_slot, session)] =
            publications(resolved.authorities());
        assert_eq!(control_slot, Slot::PUBLICATION);
        assert_eq!(session_slot, Slot::SESSION_PUBLICATION);
        let path = |p: &std::path::Path| Some(lazaret_proto::common::HostPath::from(p));
        assert_eq!(
            control,
            ParticipantOwnership::Publication(PublicationOwnership {
                socket_path: path(&runtime.join(CONTROL_SOCKET)),
                identity_path: None,
            })
        );
        assert_eq!(
            session,
            ParticipantOwnership::Publication(PublicationOwnership {
                socket_path: path(&runtime.join(SESSION_SOCKET)),
                identity_path: path(&runtime.join(CREDENTIAL_DIR)),
            })
        );
    }

    #[test]
    fn publishing_binds_both_sockets_over_stale_ones_and_writes_the_credential() {
        let scratch = Scratch::new();
        let resolved = scratch.load("");
        let runtime = resolved.authorities().domain_runtime.label().to_path_buf();
        // What an earlier generation left.
        std::fs::write(runtime.join(CONTROL_SOCKET), b"stale").unwrap();
        std::fs::write(runtime.join(SESSION_SOCKET), b"stale").unwrap();
        let store = store_of(&resolved);
        let starting = generation(&resolved, 1, GenerationState::Starting);
        let recorder = Recorder::new(Arc::clone(&store), starting.generation_id);
        let records = recorder
            .record(
                StartupStep::Sandbox,
                Vec::new(),
                publications(resolved.authorities()),
                None,
            )
            .unwrap();
        let published = match publish(&resolved, &starting, records) {
            Ok(published) => published,
            Err(failure) => panic!("{}", failure.account.to_string()),
        };
        assert!(is_socket(&runtime.join(CONTROL_SOCKET)));
        assert!(is_socket(&runtime.join(SESSION_SOCKET)));
        let credentials = std::fs::read_dir(runtime.join(CREDENTIAL_DIR))
            .unwrap()
            .count();
        assert!(credentials > 0, "the client credential is written");
        assert_eq!(
            published.manifest.generation_identity.generation_id,
            starting.generation_id
        );
        assert_eq!(
            published.manifest.generation_identity.domain_id,
            resolved.domain_id()
        );
        // A client reaches the session socket (through the directory's
        // descriptor: the scratch path is longer than a socket address).
        let auth = resolved.authorities();
        let socket =
            lazaret_proto::channel::socket_path_at(auth.domain_runtime.fd(), SESSION_SOCKET);
        std::os::unix::net::UnixStream::connect(socket).unwrap();
    }
}
