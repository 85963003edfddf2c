//! The session link both ends share, on tokio over real Unix stream
//! socketpairs: the client `lazaret attach` makes ([`ClientLink`]) against
//! the server end the Host Coordinator runs (`tokio-rustls` over an
//! [`FdStream`]). Frames and descriptors get through; a refusal names the
//! TLS alert or certificate; a peer that goes away is `Closed`; a peer
//! that does not read never keeps its own frames from arriving.

use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use lazaret_coordinator::config::RetainedDir;
use lazaret_coordinator::session::link::{ClientLink, Exchanged, Link, LinkError};
use lazaret_coordinator::session::stream::FdStream;
use lazaret_coordinator::session::tls::{ClientCredential, GenerationCredentials};
use lazaret_hostfs::plan::ensure_root;
use lazaret_proto::common::{ProtocolVersion, UnixTimeNs};
use lazaret_proto::ids::{
    ConfigurationFingerprint, CredentialId, DomainId, GenerationId, GenerationNonce, SessionId,
};
use lazaret_proto::session::SessionOpened;
use lazaret_proto::terminal::{
    SessionExit, SessionExitOutcome, SessionTerminalEvent, SessionTerminalMessage, TerminalInput,
    TerminalOutput,
};
use lazaret_proto::trust::{
    GenerationIdentity, ProtocolCredential, ProtocolCredentialRole, ProtocolPublicKey,
    ProtocolSigningKey,
};

/// Every test gives up after this long, so a bug shows as a failure
/// instead of a hung test.
const TEST_TIMEOUT: Duration = Duration::from_secs(20);

const SESSION: SessionId = SessionId([0x5e; 16]);

type ServerLink = Link<tokio_rustls::server::TlsStream<FdStream>>;

fn credentials(generation: u64) -> GenerationCredentials {
    let identity = GenerationIdentity {
        agent_profile: "default".into(),
        domain_id: DomainId([0xd0; 32]),
        generation_id: GenerationId(generation),
        configuration_fingerprint: ConfigurationFingerprint([0xcf; 32]),
        generation_nonce: GenerationNonce([generation as u8; 16]),
        created_at: UnixTimeNs(1_700_000_000_000_000_000),
    };
    let protocol = ProtocolCredential {
        protocol_version: ProtocolVersion::V1,
        credential_id: CredentialId([0xa5; 16]),
        generation_identity: identity.clone(),
        role: ProtocolCredentialRole::SessionCoordinator,
        public_key: ProtocolPublicKey([0x11; 32]),
        signing_key: ProtocolSigningKey([0x22; 32]),
        issued_at: UnixTimeNs(3),
    };
    GenerationCredentials::create(identity, &protocol).unwrap()
}

/// `generation`'s client credential, loaded from a private scratch
/// directory the way the CLI loads it.
fn client_of(generation: &GenerationCredentials) -> ClientCredential {
    let root = tempfile::Builder::new()
        .prefix("lazaret-link-")
        .tempdir()
        .unwrap();
    let path: PathBuf = std::fs::canonicalize(root.path()).unwrap().join("cred");
    let dir: RetainedDir = ensure_root(&path, rustix::process::getuid().as_raw()).unwrap();
    generation.write_client_credential(&dir).unwrap();
    ClientCredential::load(&dir).unwrap()
}

fn run<F: std::future::Future<Output = ()>>(test: F) {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            tokio::time::timeout(TEST_TIMEOUT, test)
                .await
                .expect("the test hung");
        });
}

async fn accept(
    server: Arc<rustls::ServerConfig>,
    socket: tokio::net::UnixStream,
) -> std::io::Result<ServerLink> {
    let stream = tokio_rustls::TlsAcceptor::from(server)
        .accept(FdStream::new(socket))
        .await?;
    Ok(Link::new(stream))
}

fn input(bytes: &[u8]) -> SessionTerminalEvent {
    SessionTerminalEvent::Input(TerminalInput {
        session_id: SESSION,
        bytes: bytes.to_vec(),
    })
}

/// Queues 4 MiB of input on `link`: far more than the socket holds, so
/// the link must wait for the peer to read.
fn queue_more_than_the_socket_holds(link: &mut ClientLink) {
    for _ in 0..512 {
        link.queue(&input(&[b'x'; 8192])).unwrap();
    }
}

fn output(bytes: &[u8]) -> SessionTerminalMessage {
    SessionTerminalMessage::Output(TerminalOutput {
        session_id: SESSION,
        bytes: bytes.to_vec(),
    })
}

#[test]
fn frames_and_descriptors_get_through_both_ways() {
    let generation = credentials(1);
    let client = client_of(&generation);
    run(async {
        let (a, b) = tokio::net::UnixStream::pair().unwrap();
        let (read, _write) = rustix::pipe::pipe().unwrap();
        let inode = rustix::fs::fstat(&read).unwrap().st_ino;
        let server = async {
            let mut link = accept(generation.server_config(), b).await.unwrap();
            let first = link.recv::<SessionTerminalEvent>().await.unwrap();
            assert_eq!(first, input(b"hello"));
            let fds = link.get_mut().get_mut().0.take_fds();
            assert_eq!(fds.len(), 1, "the descriptor came with the frame");
            assert_eq!(rustix::fs::fstat(fds[0].as_fd()).unwrap().st_ino, inode);
            // An answer and the next messages, in one write.
            link.queue(&SessionOpened::Opened {
                session_id: SESSION,
            })
            .unwrap();
            link.queue(&output(b"olleh")).unwrap();
            link.queue(&SessionTerminalMessage::Exit(SessionExit {
                session_id: SESSION,
                outcome: SessionExitOutcome::Exited,
                exit_code: 3,
            }))
            .unwrap();
            link.flush().await.unwrap();
            assert!(matches!(
                link.recv::<SessionTerminalEvent>().await,
                Err(LinkError::Closed)
            ));
        };
        let client = async {
            let mut link = ClientLink::connect(a, client.client_config())
                .await
                .unwrap();
            link.send_with_fds(&input(b"hello"), vec![read])
                .await
                .unwrap();
            let opened = link.recv::<SessionOpened>().await.unwrap();
            assert_eq!(
                opened,
                SessionOpened::Opened {
                    session_id: SESSION
                }
            );
            // What came with the answer is kept for the next frames.
            let mut messages = Vec::new();
            while messages.len() < 2 {
                match link.next_frame::<SessionTerminalMessage>().unwrap() {
                    Some(message) => messages.push(message),
                    None => {
                        assert_eq!(link.exchange(true).await.unwrap(), Exchanged::Read);
                    }
                }
            }
            assert_eq!(messages[0], output(b"olleh"));
            assert!(matches!(
                &messages[1],
                SessionTerminalMessage::Exit(exit) if exit.exit_code == 3
            ));
            link.close().await;
        };
        tokio::join!(server, client);
    });
}

#[test]
fn a_refused_client_certificate_is_named_by_the_alert() {
    let generation = credentials(1);
    let other = client_of(&credentials(2));
    // Trusts generation 1's CA, presents generation 2's certificate: TLS
    // 1.3 finishes the client's handshake before the server refuses it.
    let client = client_of(&generation);
    let mixed = mixed_config(&client, &other);
    // The client's first frame goes out before the server closes, or finds
    // it closed (a broken pipe): either way the alert says why.
    for after_the_close in [false, true] {
        let mixed = Arc::clone(&mixed);
        let server_config = generation.server_config();
        run(async move {
            let (a, b) = tokio::net::UnixStream::pair().unwrap();
            let (closed, heard) = tokio::sync::oneshot::channel::<()>();
            let server = async {
                let refused = accept(server_config, b).await;
                assert!(refused.is_err(), "the server refuses the certificate");
                let _ = closed.send(());
            };
            let client = async {
                let mut link = ClientLink::connect(a, mixed).await.unwrap();
                if after_the_close {
                    heard.await.unwrap();
                }
                let error = match link.send(&input(b"hello")).await {
                    Err(error) => error,
                    Ok(()) => link.recv::<SessionOpened>().await.unwrap_err(),
                };
                assert!(matches!(error, LinkError::Tls(_)), "{error:?}");
                let message = lazaret_proto::error_chain(&error);
                assert!(
                    message.contains("refused") && message.contains("alert"),
                    "{message}"
                );
            };
            tokio::join!(server, client);
        });
    }
}

/// A client configuration trusting `trusting`'s CA and presenting
/// `presenting`'s certificate.
fn mixed_config(
    trusting: &ClientCredential,
    presenting: &ClientCredential,
) -> Arc<rustls::ClientConfig> {
    let mut config = (*trusting.client_config()).clone();
    config.client_auth_cert_resolver =
        Arc::clone(&presenting.client_config().client_auth_cert_resolver);
    Arc::new(config)
}

#[test]
fn a_server_of_another_generation_is_refused_in_the_handshake() {
    let generation = credentials(1);
    let stale = client_of(&credentials(2));
    run(async {
        let (a, b) = tokio::net::UnixStream::pair().unwrap();
        let server = async {
            assert!(accept(generation.server_config(), b).await.is_err());
        };
        let client = async {
            let error = ClientLink::connect(a, stale.client_config())
                .await
                .unwrap_err();
            assert!(
                matches!(error, LinkError::Tls(rustls::Error::InvalidCertificate(_))),
                "{error:?}"
            );
        };
        tokio::join!(server, client);
    });
}

#[test]
fn a_peer_that_goes_away_has_closed() {
    let generation = credentials(1);
    let client = client_of(&generation);
    run(async {
        let (a, b) = tokio::net::UnixStream::pair().unwrap();
        let server = async {
            let link = accept(generation.server_config(), b).await.unwrap();
            // Gone without a close_notify.
            drop(link);
        };
        let client = async {
            let mut link = ClientLink::connect(a, client.client_config())
                .await
                .unwrap();
            let error = link.recv::<SessionTerminalMessage>().await.unwrap_err();
            assert!(matches!(error, LinkError::Closed), "{error:?}");
        };
        tokio::join!(server, client);
    });
}

#[test]
fn frames_arrive_while_the_peer_does_not_read_ours() {
    let generation = credentials(1);
    let client = client_of(&generation);
    run(async {
        let (a, b) = tokio::net::UnixStream::pair().unwrap();
        let (told, heard) = tokio::sync::oneshot::channel::<()>();
        let server = async {
            let mut link = accept(generation.server_config(), b).await.unwrap();
            link.send(&output(b"while you write")).await.unwrap();
            // Reads nothing until the client saw the frame.
            let _ = heard.await;
            let mut got = 0;
            while got < 512 {
                link.recv::<SessionTerminalEvent>().await.unwrap();
                got += 1;
            }
        };
        let client = async {
            let mut link = ClientLink::connect(a, client.client_config())
                .await
                .unwrap();
            queue_more_than_the_socket_holds(&mut link);
            loop {
                if let Some(message) = link.next_frame::<SessionTerminalMessage>().unwrap() {
                    assert_eq!(message, output(b"while you write"));
                    break;
                }
                assert_eq!(link.exchange(true).await.unwrap(), Exchanged::Read);
            }
            assert!(link.sending(), "the peer has not read everything yet");
            told.send(()).unwrap();
            link.flush().await.unwrap();
            assert!(!link.sending());
        };
        tokio::join!(server, client);
    });
}

#[test]
fn what_a_peer_said_before_it_went_away_is_read_before_its_absence() {
    let generation = credentials(1);
    let client = client_of(&generation);
    run(async {
        let (a, b) = tokio::net::UnixStream::pair().unwrap();
        let server = async {
            let mut link = accept(generation.server_config(), b).await.unwrap();
            // Why the session ends, then gone, reading none of the input.
            link.send(&output(b"the Domain went down")).await.unwrap();
            drop(link);
        };
        let client = async {
            let mut link = ClientLink::connect(a, client.client_config())
                .await
                .unwrap();
            // So a write meets the closed connection before anything is read.
            queue_more_than_the_socket_holds(&mut link);
            let mut said = None;
            for _ in 0..1024 {
                if let Some(message) = link.next_frame::<SessionTerminalMessage>().unwrap() {
                    said = Some(message);
                    break;
                }
                if let Err(error) = link.exchange(false).await {
                    panic!("the connection failed before its last frame was read: {error:?}");
                }
            }
            assert_eq!(said, Some(output(b"the Domain went down")));
        };
        tokio::join!(server, client);
    });
}
