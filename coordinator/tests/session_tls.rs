//! The Session Coordinator's TLS layer over real Unix stream socketpairs:
//! a client of the right generation gets through and exchanges frames, and
//! every other peer (another generation's certificate, no certificate, no
//! TLS at all, a client pinned to another CA) is refused with an error,
//! never a hang. Credential files are checked the way an attacker would
//! tamper with them.

use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt, symlink};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use lazaret_coordinator::config::RetainedDir;
use lazaret_coordinator::session::tls::{
    self, CLIENT_CERTIFICATE_FILE, CLIENT_KEY_FILE, CLIENT_TRUST_FILE, ClientCredential,
    FrameError, GenerationCredentials, TlsError, read_frame, remove_client_credential, write_frame,
};
use lazaret_hostfs::plan::ensure_root;
use lazaret_proto::codec::{self, WireRecord};
use lazaret_proto::common::{ProtocolVersion, UnixTimeNs};
use lazaret_proto::ids::{
    ConfigurationFingerprint, CredentialId, DomainId, GenerationId, GenerationNonce, SessionId,
};
use lazaret_proto::terminal::{
    SessionTerminalEvent, SessionTerminalMessage, TerminalInput, TerminalOutput,
};
use lazaret_proto::trust::{
    ClientTrustBundle, GenerationIdentity, ProtocolCredential, ProtocolCredentialRole,
    ProtocolPublicKey, ProtocolSigningKey,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, ServerConfig, ServerConnection};
use rustls::{StreamOwned, crypto::CryptoProvider};
use sha2::{Digest, Sha256};

/// Every socket read or write gives up after this long, so a bug shows as
/// a failure instead of a hung test.
const IO_TIMEOUT: Duration = Duration::from_secs(10);

const SESSION: SessionId = SessionId([0x5e; 16]);

fn identity(generation: u64, nonce: u8) -> GenerationIdentity {
    GenerationIdentity {
        agent_profile: "default".into(),
        domain_id: DomainId([0xd0; 32]),
        generation_id: GenerationId(generation),
        configuration_fingerprint: ConfigurationFingerprint([0xcf; 32]),
        generation_nonce: GenerationNonce([nonce; 16]),
        created_at: UnixTimeNs(1_700_000_000_000_000_000),
    }
}

fn protocol_credential(
    identity: &GenerationIdentity,
    role: ProtocolCredentialRole,
) -> ProtocolCredential {
    ProtocolCredential {
        protocol_version: ProtocolVersion::V1,
        credential_id: CredentialId([0xa5; 16]),
        generation_identity: identity.clone(),
        role,
        public_key: ProtocolPublicKey([0x11; 32]),
        signing_key: ProtocolSigningKey([0x22; 32]),
        issued_at: UnixTimeNs(3),
    }
}

fn credentials(generation: u64, nonce: u8) -> GenerationCredentials {
    let identity = identity(generation, nonce);
    let protocol = protocol_credential(&identity, ProtocolCredentialRole::SessionCoordinator);
    GenerationCredentials::create(identity, &protocol).unwrap()
}

/// A private (0700) directory of the invoking user's, retained.
struct Scratch {
    _root: tempfile::TempDir,
    path: PathBuf,
    dir: RetainedDir,
}

fn scratch() -> Scratch {
    let root = tempfile::Builder::new()
        .prefix("lazaret-tls-")
        .tempdir()
        .unwrap();
    let path = std::fs::canonicalize(root.path()).unwrap().join("cred");
    let dir = ensure_root(&path, rustix::process::getuid().as_raw()).unwrap();
    Scratch {
        _root: root,
        path,
        dir,
    }
}

/// A scratch directory holding `credentials`' client credential.
fn written(credentials: &GenerationCredentials) -> Scratch {
    let scratch = scratch();
    credentials.write_client_credential(&scratch.dir).unwrap();
    scratch
}

fn ring() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn pair() -> (UnixStream, UnixStream) {
    let (a, b) = UnixStream::pair().unwrap();
    for sock in [&a, &b] {
        sock.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        sock.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    }
    (a, b)
}

/// The rustls error inside an I/O error, if that is what it is.
fn tls_error(error: &io::Error) -> Option<&rustls::Error> {
    error.get_ref()?.downcast_ref::<rustls::Error>()
}

/// What the server saw of a connection that got through the handshake.
#[derive(Debug)]
struct Served {
    version: Option<rustls::ProtocolVersion>,
    peer_certificates: Vec<CertificateDer<'static>>,
    first: Option<SessionTerminalEvent>,
    ended_cleanly: bool,
}

/// Runs the server side of one connection on its own thread: the
/// handshake, then it echoes the first input frame back as output and
/// waits for the client to close.
fn serve(config: Arc<ServerConfig>, mut sock: UnixStream) -> JoinHandle<io::Result<Served>> {
    std::thread::spawn(move || {
        let mut conn = ServerConnection::new(config).map_err(io::Error::other)?;
        while conn.is_handshaking() {
            conn.complete_io(&mut sock)?;
        }
        let version = conn.protocol_version();
        let peer_certificates = conn.peer_certificates().unwrap_or_default().to_vec();
        let mut stream = StreamOwned::new(conn, sock);
        let first: Option<SessionTerminalEvent> =
            read_frame(&mut stream).map_err(io::Error::other)?;
        if let Some(SessionTerminalEvent::Input(input)) = &first {
            let reply = SessionTerminalMessage::Output(TerminalOutput {
                session_id: input.session_id,
                bytes: input.bytes.iter().rev().copied().collect(),
            });
            write_frame(&mut stream, &reply).map_err(io::Error::other)?;
        }
        let ended_cleanly = matches!(read_frame::<_, SessionTerminalEvent>(&mut stream), Ok(None));
        Ok(Served {
            version,
            peer_certificates,
            first,
            ended_cleanly,
        })
    })
}

fn connect(
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
    sock: UnixStream,
) -> StreamOwned<ClientConnection, UnixStream> {
    StreamOwned::new(ClientConnection::new(config, name).unwrap(), sock)
}

fn input(bytes: &[u8]) -> SessionTerminalEvent {
    SessionTerminalEvent::Input(TerminalInput {
        session_id: SESSION,
        bytes: bytes.to_vec(),
    })
}

/// A client that trusts `ca` and presents the client credential found in
/// `dir` (possibly another generation's).
fn client_config_with(ca: &[u8], dir: &Path) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    roots.add(CertificateDer::from(ca.to_vec())).unwrap();
    let chain = CertificateDer::pem_file_iter(dir.join(CLIENT_CERTIFICATE_FILE))
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(dir.join(CLIENT_KEY_FILE)).unwrap();
    Arc::new(
        ClientConfig::builder_with_provider(ring())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .unwrap(),
    )
}

/// Asserts the server refused the connection with a TLS error matching
/// `expected`, promptly.
/// Asserts that the client refuses the server while sending its first
/// frame, with a TLS error `expected` accepts, and that the server then
/// fails too.
fn assert_client_refused(
    mut stream: StreamOwned<ClientConnection, UnixStream>,
    server: JoinHandle<io::Result<Served>>,
    expected: impl Fn(&rustls::Error) -> bool,
) {
    let error = write_frame(&mut stream, &input(b"hello")).unwrap_err();
    let FrameError::Write { source, .. } = &error else {
        panic!("{error:?}");
    };
    assert!(tls_error(source).is_some_and(expected), "{error:?}");
    drop(stream);
    assert!(server.join().unwrap().is_err());
}

fn assert_server_refused(
    server: JoinHandle<io::Result<Served>>,
    started: Instant,
    expected: impl Fn(&rustls::Error) -> bool,
) {
    let error = server
        .join()
        .unwrap()
        .expect_err("the server must refuse the connection");
    let tls = tls_error(&error).unwrap_or_else(|| panic!("not a TLS error: {error:?}"));
    assert!(expected(tls), "unexpected server error: {tls:?}");
    assert!(
        started.elapsed() < IO_TIMEOUT,
        "the refusal waited for a timeout"
    );
}

#[test]
fn a_client_of_the_generation_exchanges_frames() {
    let generation = credentials(7, 0x4e);
    let scratch = written(&generation);
    let client = ClientCredential::load(&scratch.dir).unwrap();
    assert_eq!(client.manifest(), &generation.trust_manifest());

    let (server_sock, client_sock) = pair();
    let server = serve(generation.server_config(), server_sock);
    let mut stream = connect(client.client_config(), tls::server_name(), client_sock);
    write_frame(&mut stream, &input(b"hello")).unwrap();
    let reply: SessionTerminalMessage = read_frame(&mut stream).unwrap().unwrap();
    assert_eq!(
        reply,
        SessionTerminalMessage::Output(TerminalOutput {
            session_id: SESSION,
            bytes: b"olleh".to_vec(),
        })
    );
    assert_eq!(
        stream.conn.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_3)
    );
    stream.conn.send_close_notify();
    stream.flush().unwrap();

    let served = server.join().unwrap().unwrap();
    assert_eq!(served.version, Some(rustls::ProtocolVersion::TLSv1_3));
    assert_eq!(served.first, Some(input(b"hello")));
    assert!(served.ended_cleanly);
    let presented = CertificateDer::pem_file_iter(scratch.path.join(CLIENT_CERTIFICATE_FILE))
        .unwrap()
        .next()
        .unwrap()
        .unwrap();
    assert_eq!(served.peer_certificates.first(), Some(&presented));
}

#[test]
fn the_manifest_pins_the_ca_and_the_protocol_key() {
    let generation = credentials(7, 0x4e);
    let manifest = generation.trust_manifest();
    assert_eq!(manifest.protocol_version, ProtocolVersion::V1);
    assert_eq!(manifest.generation_identity, identity(7, 0x4e));
    assert_eq!(
        manifest.tls_ca_sha256.0,
        <[u8; 32]>::from(Sha256::digest(generation.ca_certificate_der()))
    );
    assert_eq!(
        manifest.session_coordinator_credential_id,
        CredentialId([0xa5; 16])
    );
    assert_eq!(
        manifest.session_coordinator_public_key,
        ProtocolPublicKey([0x11; 32])
    );

    let scratch = written(&generation);
    let bundle: ClientTrustBundle =
        codec::decode(&std::fs::read(scratch.path.join(CLIENT_TRUST_FILE)).unwrap()).unwrap();
    assert_eq!(bundle.manifest, manifest);
    assert_eq!(bundle.ca_certificate_der, generation.ca_certificate_der());

    // Every generation has its own CA.
    assert_ne!(
        credentials(7, 0x4e).trust_manifest().tls_ca_sha256,
        manifest.tls_ca_sha256
    );
}

#[test]
fn create_refuses_a_foreign_protocol_credential() {
    let mine = identity(7, 0x4e);
    let other = protocol_credential(
        &identity(8, 0x4e),
        ProtocolCredentialRole::SessionCoordinator,
    );
    assert!(matches!(
        GenerationCredentials::create(mine.clone(), &other),
        Err(TlsError::ForeignProtocolCredential)
    ));
    let sandbox = protocol_credential(&mine, ProtocolCredentialRole::AgentSandbox);
    assert!(matches!(
        GenerationCredentials::create(mine, &sandbox),
        Err(TlsError::WrongProtocolRole {
            role: ProtocolCredentialRole::AgentSandbox
        })
    ));
}

#[test]
fn a_client_certificate_of_another_generation_is_refused() {
    let generation = credentials(7, 0x4e);
    // Another generation of the same Domain, and one with the same number
    // but another nonce (after a store reset): both are strangers.
    for (number, nonce) in [(8, 0x4e), (7, 0x4f)] {
        let other = credentials(number, nonce);
        let other_files = written(&other);
        let config = client_config_with(generation.ca_certificate_der(), &other_files.path);

        let (server_sock, client_sock) = pair();
        let started = Instant::now();
        let server = serve(generation.server_config(), server_sock);
        let mut stream = connect(config, tls::server_name(), client_sock);
        // TLS 1.3: the client finishes its side before the server has
        // judged its certificate, so the refusal arrives on the next read.
        let _ = write_frame(&mut stream, &input(b"let me in"));
        assert!(read_frame::<_, SessionTerminalMessage>(&mut stream).is_err());
        assert_server_refused(server, started, |e| {
            matches!(e, rustls::Error::InvalidCertificate(_))
        });
    }
}

#[test]
fn a_client_without_a_certificate_is_refused() {
    let generation = credentials(7, 0x4e);
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from(
            generation.ca_certificate_der().to_vec(),
        ))
        .unwrap();
    let config = Arc::new(
        ClientConfig::builder_with_provider(ring())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    );

    let (server_sock, client_sock) = pair();
    let started = Instant::now();
    let server = serve(generation.server_config(), server_sock);
    let mut stream = connect(config, tls::server_name(), client_sock);
    let _ = write_frame(&mut stream, &input(b"anonymous"));
    assert!(read_frame::<_, SessionTerminalMessage>(&mut stream).is_err());
    assert_server_refused(server, started, |e| {
        matches!(e, rustls::Error::NoCertificatesPresented)
    });
}

#[test]
fn a_client_that_does_not_speak_tls_is_refused() {
    let generation = credentials(7, 0x4e);
    let garbage: [&[u8]; 2] = [
        b"GET / HTTP/1.1\r\nHost: session-coordinator\r\n\r\n",
        // A frame as if TLS were skipped.
        &[0, 0, 0, 3, 1, 0, 0],
    ];
    for bytes in garbage {
        let (server_sock, mut client_sock) = pair();
        let started = Instant::now();
        let server = serve(generation.server_config(), server_sock);
        client_sock.write_all(bytes).unwrap();
        // The socket stays open: the server must refuse on the bytes, not
        // on end of stream.
        assert_server_refused(server, started, |e| {
            matches!(e, rustls::Error::InvalidMessage(_))
        });
        drop(client_sock);
    }
}

#[test]
fn a_client_pinned_to_another_ca_refuses_the_server() {
    let generation = credentials(7, 0x4e);
    for (number, nonce) in [(8, 0x4e), (7, 0x4f)] {
        let other = credentials(number, nonce);
        let other_files = written(&other);
        let client = ClientCredential::load(&other_files.dir).unwrap();

        let (server_sock, client_sock) = pair();
        let server = serve(generation.server_config(), server_sock);
        let stream = connect(client.client_config(), tls::server_name(), client_sock);
        assert_client_refused(stream, server, |e| {
            matches!(e, rustls::Error::InvalidCertificate(_))
        });
    }
}

#[test]
fn the_server_certificate_names_only_the_session_coordinator() {
    let generation = credentials(7, 0x4e);
    let scratch = written(&generation);
    let client = ClientCredential::load(&scratch.dir).unwrap();
    let (server_sock, client_sock) = pair();
    let server = serve(generation.server_config(), server_sock);
    let name = ServerName::try_from("elsewhere.lazaret.invalid").unwrap();
    let stream = connect(client.client_config(), name, client_sock);
    assert_client_refused(stream, server, |e| {
        matches!(
            e,
            rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName
                    | rustls::CertificateError::NotValidForNameContext { .. }
            )
        )
    });
}

#[test]
fn credential_files_are_private_and_written_once() {
    let generation = credentials(7, 0x4e);
    let scratch = written(&generation);
    let mut names: Vec<_> = std::fs::read_dir(&scratch.path)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [CLIENT_KEY_FILE, CLIENT_CERTIFICATE_FILE, CLIENT_TRUST_FILE] // sorted by name
    );
    for name in &names {
        let meta = std::fs::symlink_metadata(scratch.path.join(name)).unwrap();
        assert!(meta.file_type().is_file(), "{name}");
        assert_eq!(meta.permissions().mode() & 0o7777, 0o600, "{name}");
    }
    let key = std::fs::read_to_string(scratch.path.join(CLIENT_KEY_FILE)).unwrap();
    assert!(key.starts_with("-----BEGIN PRIVATE KEY-----"), "{key}");
    let chain = CertificateDer::pem_file_iter(scratch.path.join(CLIENT_CERTIFICATE_FILE))
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    assert_eq!(chain.len(), 2);
    assert_eq!(chain[1].as_ref(), generation.ca_certificate_der());

    // A second write refuses to replace the first and leaves it intact.
    let again = generation.write_client_credential(&scratch.dir);
    assert!(
        matches!(again, Err(TlsError::AlreadyExists { .. })),
        "{again:?}"
    );
    ClientCredential::load(&scratch.dir).unwrap();
    assert_eq!(std::fs::read_dir(&scratch.path).unwrap().count(), 3);

    remove_client_credential(&scratch.dir).unwrap();
    assert_eq!(std::fs::read_dir(&scratch.path).unwrap().count(), 0);
    remove_client_credential(&scratch.dir).unwrap();
    let missing = ClientCredential::load(&scratch.dir);
    assert!(
        matches!(missing, Err(TlsError::Missing { .. })),
        "{missing:?}"
    );
    generation.write_client_credential(&scratch.dir).unwrap();
    ClientCredential::load(&scratch.dir).unwrap();
}

#[test]
fn readable_credential_files_are_refused() {
    let generation = credentials(7, 0x4e);
    let scratch = written(&generation);
    for name in [CLIENT_CERTIFICATE_FILE, CLIENT_KEY_FILE, CLIENT_TRUST_FILE] {
        let path = scratch.path.join(name);
        for mode in [0o640, 0o604, 0o400, 0o700] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let result = ClientCredential::load(&scratch.dir);
            assert!(
                matches!(&result, Err(TlsError::Mode { mode: m, .. }) if *m == mode),
                "{name} {mode:o}: {result:?}"
            );
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    ClientCredential::load(&scratch.dir).unwrap();

    // The directory itself must be private too.
    std::fs::set_permissions(&scratch.path, std::fs::Permissions::from_mode(0o755)).unwrap();
    let result = ClientCredential::load(&scratch.dir);
    assert!(
        matches!(
            result,
            Err(TlsError::DirectoryNotPrivate { mode: 0o755, .. })
        ),
        "{result:?}"
    );
    remove_client_credential(&scratch.dir).unwrap();
    let result = generation.write_client_credential(&scratch.dir);
    assert!(
        matches!(result, Err(TlsError::DirectoryNotPrivate { .. })),
        "{result:?}"
    );
    assert_eq!(std::fs::read_dir(&scratch.path).unwrap().count(), 0);
}

#[test]
fn symlinked_and_special_credential_files_are_refused() {
    let generation = credentials(7, 0x4e);
    let outside = scratch();
    for name in [CLIENT_CERTIFICATE_FILE, CLIENT_KEY_FILE, CLIENT_TRUST_FILE] {
        let scratch = written(&generation);
        let path = scratch.path.join(name);
        let moved = outside.path.join(name);
        std::fs::rename(&path, &moved).unwrap();
        symlink(&moved, &path).unwrap();
        let result = ClientCredential::load(&scratch.dir);
        assert!(
            matches!(result, Err(TlsError::Symlink { .. })),
            "{name}: {result:?}"
        );
        std::fs::remove_file(&moved).unwrap();

        // A FIFO must be refused without waiting for a writer.
        std::fs::remove_file(&path).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &path,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
            0,
        )
        .unwrap();
        let result = ClientCredential::load(&scratch.dir);
        assert!(
            matches!(result, Err(TlsError::NotRegular { .. })),
            "{name}: {result:?}"
        );
    }

    // Writing never follows a symbolic link planted at a credential name.
    let scratch = scratch();
    let target = outside.path.join("target");
    symlink(&target, scratch.path.join(CLIENT_KEY_FILE)).unwrap();
    let result = generation.write_client_credential(&scratch.dir);
    assert!(result.is_err(), "{result:?}");
    assert!(!target.exists());
    let mut left: Vec<_> = std::fs::read_dir(&scratch.path)
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .collect();
    left.sort();
    assert_eq!(left, [CLIENT_KEY_FILE], "what it wrote must be removed");
}

/// Replaces a credential file with `bytes`, mode 0600.
fn overwrite(path: &Path, bytes: &[u8]) {
    std::fs::remove_file(path).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .unwrap()
        .write_all(bytes)
        .unwrap();
}

#[test]
fn a_trust_bundle_whose_ca_misses_the_pin_is_refused() {
    let generation = credentials(7, 0x4e);
    let other = credentials(8, 0x4e);
    let scratch = written(&generation);
    let trust = scratch.path.join(CLIENT_TRUST_FILE);
    let swapped = ClientTrustBundle {
        manifest: generation.trust_manifest(),
        ca_certificate_der: other.ca_certificate_der().to_vec(),
    };
    overwrite(&trust, &codec::encode(&swapped).unwrap());
    let result = ClientCredential::load(&scratch.dir);
    assert!(
        matches!(result, Err(TlsError::CaPinMismatch { .. })),
        "{result:?}"
    );

    overwrite(&trust, b"not a bundle");
    let result = ClientCredential::load(&scratch.dir);
    assert!(matches!(result, Err(TlsError::Decode { .. })), "{result:?}");

    overwrite(&trust, &vec![0; 128 * 1024]);
    let result = ClientCredential::load(&scratch.dir);
    assert!(
        matches!(result, Err(TlsError::TooLarge { .. })),
        "{result:?}"
    );
}

#[test]
fn damaged_pem_files_are_refused() {
    let generation = credentials(7, 0x4e);
    let scratch = written(&generation);
    overwrite(
        &scratch.path.join(CLIENT_CERTIFICATE_FILE),
        b"no certificates here\n",
    );
    let result = ClientCredential::load(&scratch.dir);
    assert!(
        matches!(result, Err(TlsError::NoCertificate { .. })),
        "{result:?}"
    );

    let scratch = written(&generation);
    overwrite(
        &scratch.path.join(CLIENT_KEY_FILE),
        b"-----BEGIN PRIVATE KEY-----\n",
    );
    let result = ClientCredential::load(&scratch.dir);
    assert!(matches!(result, Err(TlsError::Pem { .. })), "{result:?}");
}

#[test]
fn oversize_frames_are_refused_on_the_wire() {
    let generation = credentials(7, 0x4e);
    let scratch = written(&generation);
    let client = ClientCredential::load(&scratch.dir).unwrap();
    let (mut server_sock, client_sock) = pair();
    let server = std::thread::spawn(move || {
        let mut conn = ServerConnection::new(generation.server_config()).unwrap();
        while conn.is_handshaking() {
            conn.complete_io(&mut server_sock).unwrap();
        }
        let mut stream = StreamOwned::new(conn, server_sock);
        read_frame::<_, SessionTerminalEvent>(&mut stream)
    });
    let mut stream = connect(client.client_config(), tls::server_name(), client_sock);
    let announced = (SessionTerminalEvent::MAX_ENCODED_LEN + 1) as u32;
    stream.write_all(&announced.to_be_bytes()).unwrap();
    stream.flush().unwrap();
    let result = server.join().unwrap();
    assert!(
        matches!(result, Err(FrameError::Oversize { len, .. }) if len == announced as usize),
        "{result:?}"
    );
}
