//! The TLS layer of the Session Coordinator link between a host CLI and
//! the Host Coordinator, and the length-prefixed frames carried inside it.
//!
//! This module owns a generation's TLS material: a CA made fresh for each
//! generation, the `SessionCoordinator` server certificate and the
//! `ClientCLI` client certificate it signs, the rustls configurations built
//! from them (TLS 1.3 only, ring provider, a client certificate required),
//! and the three files through which the client credential reaches the CLI
//! (`client.pem`, `client.key`, `trust.bin`, each mode `0600`). The CA key
//! lives only in memory and is dropped once both certificates are signed,
//! so nothing else can ever be issued under a generation's CA; the server
//! key lives only in memory too.
//!
//! Trust: the server accepts only peers whose client certificate chains to
//! this generation's CA, and the client accepts only a server whose
//! certificate chains to the CA that `trust.bin` carries and whose SHA-256
//! equals the pin in the bundled [`TrustManifest`]. Credential files are
//! trusted only when they are regular files owned by the invoking user with
//! mode `0600`, opened beneath a retained directory without following any
//! symbolic link. Frames are trusted for nothing: a length over the
//! record's limit, a truncated frame or a body that does not decode is an
//! error. Comparing the manifest's Domain and generation with what the
//! caller expects is the caller's job ([`ClientCredential::manifest`]).

use std::fmt;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use lazaret_hostfs::beneath::open_beneath;
use lazaret_proto::codec::{self, DecodeError, EncodeError, MAX_RECORD_LEN, WireRecord};
use lazaret_proto::common::{HostPath, ProtocolVersion};
use lazaret_proto::ids::Sha256Digest;
use lazaret_proto::trust::{
    ClientTrustBundle, GenerationIdentity, ProtocolCredential, ProtocolCredentialRole,
    ProtocolPublicationIdentity, TrustManifest,
};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use sha2::{Digest, Sha256};

use crate::config::RetainedDir;

/// The DNS name in the server certificate, and the name a client asks for.
/// It is under `.invalid`, so it can never name a real host.
pub const SERVER_NAME: &str = "session-coordinator.lazaret.invalid";

/// The client certificate chain (the `ClientCLI` certificate, then the CA),
/// PEM.
pub const CLIENT_CERTIFICATE_FILE: &str = "client.pem";

/// The client certificate's private key, PKCS#8 PEM.
pub const CLIENT_KEY_FILE: &str = "client.key";

/// The [`ClientTrustBundle`] in the proto codec.
pub const CLIENT_TRUST_FILE: &str = "trust.bin";

/// The bytes in front of every frame: the body's length, big-endian.
pub const FRAME_PREFIX_LEN: usize = 4;

/// The three credential files, in the order they are written: the trust
/// bundle last, so its presence means the other two are complete.
const CLIENT_FILES: [&str; 3] = [CLIENT_CERTIFICATE_FILE, CLIENT_KEY_FILE, CLIENT_TRUST_FILE];

/// The file, beside the client credential, naming how the generation's
/// Session Coordinator is published (`ProtocolPublicationIdentity`).
pub const PUBLICATION_FILE: &str = "publication.bin";

/// No credential file is anywhere near this long.
const MAX_CREDENTIAL_FILE_LEN: u64 = 64 * 1024;

/// Why a generation's TLS material could not be made, written, loaded or
/// turned into a configuration.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// rcgen could not make a key or a certificate.
    #[error("cannot generate the {what}; the generation cannot start without it")]
    Generate {
        /// Which key or certificate.
        what: &'static str,
        /// What rcgen said.
        #[source]
        source: rcgen::Error,
    },
    /// The Session Coordinator's protocol credential belongs to another
    /// generation.
    #[error(
        "the session coordinator protocol credential belongs to another generation; \
         issue one for this generation"
    )]
    ForeignProtocolCredential,
    /// The protocol credential given for the Session Coordinator speaks
    /// for someone else.
    #[error(
        "the protocol credential given for the session coordinator has role {role:?}; \
         pass the SessionCoordinator credential"
    )]
    WrongProtocolRole {
        /// The role it has.
        role: ProtocolCredentialRole,
    },
    /// The CA certificate could not be made a trust anchor.
    #[error("cannot use the generation CA certificate as a trust anchor")]
    TrustAnchor {
        /// What rustls said.
        #[source]
        source: rustls::Error,
    },
    /// The client-certificate verifier could not be built.
    #[error("cannot build the client certificate verifier for the generation CA")]
    Verifier {
        /// What rustls said.
        #[source]
        source: rustls::server::VerifierBuilderError,
    },
    /// rustls refused a configuration.
    #[error("cannot build the TLS {side} configuration")]
    Config {
        /// `server` or `client`.
        side: &'static str,
        /// What rustls said.
        #[source]
        source: rustls::Error,
    },
    /// The trust bundle could not be encoded.
    #[error("cannot encode the client trust bundle")]
    Encode {
        /// What the codec said.
        #[source]
        source: EncodeError,
    },
    /// The credential directory is not the invoking user's private
    /// directory.
    #[error(
        "{path} is owned by uid {owner} with mode {mode:04o}; a credential directory must be \
         yours with mode 0700"
    )]
    DirectoryNotPrivate {
        /// The directory.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// Its permission bits.
        mode: u32,
    },
    /// A credential file already exists where a new one is to be written.
    #[error("{path} already exists; remove the old client credential before writing a new one")]
    AlreadyExists {
        /// The file.
        path: PathBuf,
    },
    /// A credential file is missing.
    #[error("{path} does not exist; is the Domain up?")]
    Missing {
        /// The file.
        path: PathBuf,
    },
    /// A credential file is a symbolic link or sits behind one.
    #[error("{path} is a symbolic link; a credential file must be a regular file, remove it")]
    Symlink {
        /// The file.
        path: PathBuf,
    },
    /// A credential file is not a regular file.
    #[error("{path} is a {found}, not a regular file; remove it")]
    NotRegular {
        /// The file.
        path: PathBuf,
        /// What it is.
        found: &'static str,
    },
    /// A credential file belongs to someone else.
    #[error("{path} is owned by uid {owner}, not by you (uid {uid}); refusing to use it")]
    NotOwned {
        /// The file.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// The invoking user.
        uid: u32,
    },
    /// A credential file may be read or written by others.
    #[error("{path} has mode {mode:04o}, not 0600; others may have read it, restart the Domain")]
    Mode {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// A credential file is larger than any credential.
    #[error("{path} is larger than {max} bytes; it is not a Lazaret credential file")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The largest size accepted.
        max: u64,
    },
    /// A credential file is not valid PEM of the expected kind.
    #[error("{path} is not a valid PEM credential file; restart the Domain to issue a new one")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What the PEM parser said.
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// The certificate file holds no certificate.
    #[error("{path} holds no certificate; restart the Domain to issue a new one")]
    NoCertificate {
        /// The file.
        path: PathBuf,
    },
    /// The trust bundle does not decode.
    #[error("{path} is not a valid client trust bundle; restart the Domain to issue a new one")]
    Decode {
        /// The file.
        path: PathBuf,
        /// What the codec said.
        #[source]
        source: DecodeError,
    },
    /// The CA certificate in the trust bundle is not the one its manifest
    /// pins.
    #[error(
        "the CA certificate in {path} does not match the trust manifest's pin; the credential \
         is damaged or forged, restart the Domain"
    )]
    CaPinMismatch {
        /// The trust bundle.
        path: PathBuf,
    },
    /// Any other system call on a credential file failed.
    #[error("cannot {operation} {path}")]
    Io {
        /// What was attempted.
        operation: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },
}

/// Why a frame could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The record could not be encoded (it does not fit its own limit, or
    /// postcard refused it).
    #[error("cannot encode a frame")]
    Encode {
        /// What the codec said.
        #[source]
        source: EncodeError,
    },
    /// Writing to the connection failed.
    #[error("cannot write a {record} frame to the session connection")]
    Write {
        /// The record being sent.
        record: &'static str,
        /// What the transport said.
        #[source]
        source: io::Error,
    },
    /// Reading from the connection failed.
    #[error("cannot read a {record} frame from the session connection")]
    Read {
        /// The record expected.
        record: &'static str,
        /// What the transport said.
        #[source]
        source: io::Error,
    },
    /// A length prefix larger than the record may ever be.
    #[error(
        "a {record} frame announces {len} bytes, over the limit of {max}; the peer is not a \
         compatible Lazaret, close the connection"
    )]
    Oversize {
        /// The record expected.
        record: &'static str,
        /// The announced length.
        len: usize,
        /// The record's limit.
        max: usize,
    },
    /// The connection ended inside a frame.
    #[error("the connection ended inside a {record} frame; the peer went away mid-message")]
    Truncated {
        /// The record expected.
        record: &'static str,
    },
    /// A complete frame whose body is not a valid record.
    #[error("a frame does not decode; the peer is not a compatible Lazaret")]
    Decode {
        /// What the codec said.
        #[source]
        source: DecodeError,
    },
}

/// The crypto provider of every configuration: ring, never aws-lc-rs.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A root store holding only `ca`.
fn only_root(ca: CertificateDer<'static>) -> Result<Arc<RootCertStore>, TlsError> {
    let mut roots = RootCertStore::empty();
    roots
        .add(ca)
        .map_err(|source| TlsError::TrustAnchor { source })?;
    Ok(Arc::new(roots))
}

/// The SHA-256 of a certificate's DER, as the manifest pins it.
fn certificate_digest(der: &[u8]) -> Sha256Digest {
    Sha256Digest(Sha256::digest(der).into())
}

/// A certificate subject naming the role, the Domain and the generation:
/// CN is the role, O the Domain ID in hex (64 characters, the longest an
/// organization name may be), OU the generation number.
fn subject(identity: &GenerationIdentity, role: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, format!("lazaret {role}"));
    name.push(DnType::OrganizationName, identity.domain_id.to_hex());
    name.push(
        DnType::OrganizationalUnitName,
        format!("generation {}", identity.generation_id),
    );
    name
}

fn generate_key(what: &'static str) -> Result<KeyPair, TlsError> {
    KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(|source| TlsError::Generate { what, source })
}

/// Parameters of a certificate issued by the generation CA.
///
/// Validity stays at rcgen's wide default: a generation's certificates are
/// bounded by the generation itself (its CA key dies with the coordinator
/// process), not by the clock.
fn leaf_params(
    identity: &GenerationIdentity,
    role: &str,
    usage: ExtendedKeyUsagePurpose,
) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = subject(identity, role);
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![usage];
    params.use_authority_key_identifier_extension = true;
    params
}

/// A generation's TLS material as the Host Coordinator holds it: the
/// server configuration (with its key) and the client credential still to
/// be handed to the CLI. Keys are kept in memory only; `Debug` shows the
/// manifest alone.
pub struct GenerationCredentials {
    manifest: TrustManifest,
    ca_der: CertificateDer<'static>,
    client_chain_pem: String,
    client_key: KeyPair,
    server_config: Arc<ServerConfig>,
}

impl fmt::Debug for GenerationCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GenerationCredentials")
            .field("manifest", &self.manifest)
            .finish_non_exhaustive()
    }
}

impl GenerationCredentials {
    /// Makes a generation's CA (ECDSA P-256), the `SessionCoordinator`
    /// server certificate for [`SERVER_NAME`] and the `ClientCLI` client
    /// certificate, and the server configuration that requires the latter.
    ///
    /// `session_coordinator` is the Session Coordinator's protocol signing
    /// credential of the same generation: the [`TrustManifest`] pins its
    /// public key beside the CA. The CA key is dropped before this returns.
    pub fn create(
        identity: GenerationIdentity,
        session_coordinator: &ProtocolCredential,
    ) -> Result<Self, TlsError> {
        if session_coordinator.role != ProtocolCredentialRole::SessionCoordinator {
            return Err(TlsError::WrongProtocolRole {
                role: session_coordinator.role,
            });
        }
        if session_coordinator.generation_identity != identity {
            return Err(TlsError::ForeignProtocolCredential);
        }

        let mut ca_params = CertificateParams::default();
        ca_params.distinguished_name = subject(&identity, "generation CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(ca_params, generate_key("generation CA key")?)
            .map_err(|source| TlsError::Generate {
                what: "generation CA certificate",
                source,
            })?;
        let ca_der = ca.der().clone();

        let mut server_params = leaf_params(
            &identity,
            "SessionCoordinator",
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        server_params.subject_alt_names =
            vec![rcgen::SanType::DnsName(SERVER_NAME.try_into().map_err(
                |source| TlsError::Generate {
                    what: "server certificate name",
                    source,
                },
            )?)];
        let server_key = generate_key("server key")?;
        let server_cert = server_params
            .signed_by(&server_key, &ca)
            .map_err(|source| TlsError::Generate {
                what: "server certificate",
                source,
            })?;

        let client_params =
            leaf_params(&identity, "ClientCLI", ExtendedKeyUsagePurpose::ClientAuth);
        let client_key = generate_key("client key")?;
        let client_cert = client_params
            .signed_by(&client_key, &ca)
            .map_err(|source| TlsError::Generate {
                what: "client certificate",
                source,
            })?;
        let client_chain_pem = format!("{}{}", client_cert.pem(), ca.pem());
        drop(ca);

        let provider = provider();
        let verifier = WebPkiClientVerifier::builder_with_provider(
            only_root(ca_der.clone())?,
            provider.clone(),
        )
        .build()
        .map_err(|source| TlsError::Verifier { source })?;
        let server_key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server_key.serialize_der()));
        let server_config = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .and_then(|builder| {
                builder
                    .with_client_cert_verifier(verifier)
                    .with_single_cert(vec![server_cert.der().clone()], server_key)
            })
            .map_err(|source| TlsError::Config {
                side: "server",
                source,
            })?;

        let manifest = TrustManifest {
            protocol_version: ProtocolVersion::V1,
            tls_ca_sha256: certificate_digest(&ca_der),
            session_coordinator_credential_id: session_coordinator.credential_id,
            session_coordinator_public_key: session_coordinator.public_key,
            generation_identity: identity,
        };
        Ok(Self {
            manifest,
            ca_der,
            client_chain_pem,
            client_key,
            server_config: Arc::new(server_config),
        })
    }

    /// The generation's pins: protocol version, generation identity, the
    /// CA's SHA-256 and the Session Coordinator's protocol key.
    pub fn trust_manifest(&self) -> TrustManifest {
        self.manifest.clone()
    }

    /// The generation CA certificate, DER (what a
    /// `ProtocolPublicationIdentity` publishes).
    pub fn ca_certificate_der(&self) -> &[u8] {
        &self.ca_der
    }

    /// The server side of the link: TLS 1.3 only, presenting the
    /// `SessionCoordinator` certificate, requiring a client certificate
    /// issued by this generation's CA.
    pub fn server_config(&self) -> Arc<ServerConfig> {
        Arc::clone(&self.server_config)
    }

    /// Writes the client credential into `dir`, which must be the invoking
    /// user's directory with mode `0700`: [`CLIENT_CERTIFICATE_FILE`],
    /// [`CLIENT_KEY_FILE`] and [`CLIENT_TRUST_FILE`], each mode `0600`.
    ///
    /// Each file is created exclusively (`O_CREAT | O_EXCL | O_NOFOLLOW`,
    /// `openat2(2)` beneath the directory, no symbolic links) under a
    /// temporary name, synced, then renamed into place without replacing
    /// anything (`renameat2(2)` `RENAME_NOREPLACE`), so a reader never sees
    /// a half-written file. The trust bundle comes last. Refuses to
    /// overwrite an existing credential; on failure removes what it wrote.
    pub fn write_client_credential(&self, dir: &RetainedDir) -> Result<(), TlsError> {
        check_private_dir(dir)?;
        let bundle = ClientTrustBundle {
            manifest: self.manifest.clone(),
            ca_certificate_der: self.ca_der.to_vec(),
        };
        let trust = codec::encode(&bundle).map_err(|source| TlsError::Encode { source })?;
        let key_pem = self.client_key.serialize_pem();
        let contents: [&[u8]; 3] = [self.client_chain_pem.as_bytes(), key_pem.as_bytes(), &trust];
        let mut written = Vec::new();
        for (name, bytes) in CLIENT_FILES.into_iter().zip(contents) {
            if let Err(error) = write_new_file(dir, name, bytes) {
                for done in written {
                    let _ = rustix::fs::unlinkat(dir.fd(), done, AtFlags::empty());
                }
                return Err(error);
            }
            written.push(name);
        }
        Ok(())
    }

    /// Writes `publication.bin` into `dir`: the `ProtocolPublicationIdentity`
    /// of this generation's Session Coordinator at `socket_path`, so a CLI
    /// can check what it reaches before it connects.
    pub fn write_publication(&self, dir: &RetainedDir, socket_path: &Path) -> Result<(), TlsError> {
        check_private_dir(dir)?;
        let publication = ProtocolPublicationIdentity {
            protocol_version: ProtocolVersion::V1,
            generation_identity: self.manifest.generation_identity.clone(),
            tls_ca_certificate_der: self.ca_der.to_vec(),
            socket_path: HostPath::from(socket_path),
            client_credential_path: HostPath::from(dir.label()),
        };
        let bytes = codec::encode(&publication).map_err(|source| TlsError::Encode { source })?;
        write_new_file(dir, PUBLICATION_FILE, &bytes)
    }
}

/// Reads the `ProtocolPublicationIdentity` a coordinator wrote beside the
/// client credential in `dir`, with the same checks as the credential.
pub fn read_publication(dir: &RetainedDir) -> Result<ProtocolPublicationIdentity, TlsError> {
    let path = dir.label().join(PUBLICATION_FILE);
    codec::decode(&read_private_file(dir, PUBLICATION_FILE)?)
        .map_err(|source| TlsError::Decode { path, source })
}

/// The temporary name a credential file is written under.
fn partial_name(name: &str) -> String {
    format!(".{name}.partial")
}

/// Maps the errno of an open beneath a credential directory.
fn open_error(operation: &'static str, path: PathBuf, errno: rustix::io::Errno) -> TlsError {
    match errno {
        rustix::io::Errno::NOENT => TlsError::Missing { path },
        rustix::io::Errno::LOOP => TlsError::Symlink { path },
        rustix::io::Errno::EXIST => TlsError::AlreadyExists { path },
        errno => TlsError::Io {
            operation,
            path,
            source: errno.into(),
        },
    }
}

/// Checks the directory is owned by the invoking user with mode `0700`.
fn check_private_dir(dir: &RetainedDir) -> Result<(), TlsError> {
    let stat = rustix::fs::fstat(dir.fd()).map_err(|errno| TlsError::Io {
        operation: "stat",
        path: dir.label().to_path_buf(),
        source: errno.into(),
    })?;
    let uid = rustix::process::getuid().as_raw();
    let mode = stat.st_mode & 0o7777;
    if stat.st_uid != uid || mode != 0o700 {
        return Err(TlsError::DirectoryNotPrivate {
            path: dir.label().to_path_buf(),
            owner: stat.st_uid,
            mode,
        });
    }
    Ok(())
}

/// Creates `name` in `dir` with exactly `bytes`, mode `0600`, through a
/// temporary name and a no-replace rename, so a reader sees it whole or
/// not at all. It is not synced: the credential directory is in the
/// runtime directory, whose files do not outlive the login session (let
/// alone a power loss), and the generation they serve ends with the
/// machine too.
fn write_new_file(dir: &RetainedDir, name: &str, bytes: &[u8]) -> Result<(), TlsError> {
    let path = dir.label().join(name);
    let partial = partial_name(name);
    let fd = open_beneath(
        dir.fd(),
        &partial,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL,
        Mode::RUSR | Mode::WUSR,
    )
    .map_err(|errno| open_error("create", dir.label().join(&partial), errno))?;
    let result = (|| {
        // A umask never adds bits, but make the mode exact regardless.
        rustix::fs::fchmod(&fd, Mode::RUSR | Mode::WUSR)
            .map_err(|errno| io_error("set the mode of", &path, errno.into()))?;
        let mut file = std::fs::File::from(fd);
        file.write_all(bytes)
            .map_err(|source| io_error("write", &path, source))?;
        rustix::fs::renameat_with(dir.fd(), &partial, dir.fd(), name, RenameFlags::NOREPLACE)
            .map_err(|errno| open_error("rename into place", path.clone(), errno))
    })();
    if result.is_err() {
        let _ = rustix::fs::unlinkat(dir.fd(), &partial, AtFlags::empty());
    }
    result
}

fn io_error(operation: &'static str, path: &std::path::Path, source: io::Error) -> TlsError {
    TlsError::Io {
        operation,
        path: path.to_path_buf(),
        source,
    }
}

/// Removes a client credential written by
/// [`GenerationCredentials::write_client_credential`], including any file
/// left half-written by a crash. Files already gone are not an error.
pub fn remove_client_credential(dir: &RetainedDir) -> Result<(), TlsError> {
    for name in CLIENT_FILES.into_iter().chain([PUBLICATION_FILE]) {
        for entry in [name.to_owned(), partial_name(name)] {
            match rustix::fs::unlinkat(dir.fd(), entry.as_str(), AtFlags::empty()) {
                Ok(()) | Err(rustix::io::Errno::NOENT) => {}
                Err(errno) => {
                    return Err(io_error("remove", &dir.label().join(&entry), errno.into()));
                }
            }
        }
    }
    Ok(())
}

/// Reads a credential file beneath `dir`: a regular file (never through a
/// symbolic link), owned by the invoking user, mode `0600`, not larger than
/// any credential.
fn read_private_file(dir: &RetainedDir, name: &str) -> Result<Vec<u8>, TlsError> {
    let path = dir.label().join(name);
    // O_NONBLOCK: opening a FIFO planted here must not wait for a writer.
    let fd = open_beneath(
        dir.fd(),
        name,
        OFlags::RDONLY | OFlags::NONBLOCK,
        Mode::empty(),
    )
    .map_err(|errno| open_error("open", path.clone(), errno))?;
    let stat = rustix::fs::fstat(&fd).map_err(|errno| io_error("stat", &path, errno.into()))?;
    let found = FileType::from_raw_mode(stat.st_mode);
    if found != FileType::RegularFile {
        return Err(TlsError::NotRegular {
            path,
            found: lazaret_hostfs::plan::type_name(found),
        });
    }
    let uid = rustix::process::getuid().as_raw();
    if stat.st_uid != uid {
        return Err(TlsError::NotOwned {
            path,
            owner: stat.st_uid,
            uid,
        });
    }
    let mode = stat.st_mode & 0o7777;
    if mode != 0o600 {
        return Err(TlsError::Mode { path, mode });
    }
    let mut bytes = Vec::new();
    std::fs::File::from(fd)
        .take(MAX_CREDENTIAL_FILE_LEN + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| io_error("read", &path, source))?;
    if bytes.len() as u64 > MAX_CREDENTIAL_FILE_LEN {
        return Err(TlsError::TooLarge {
            path,
            max: MAX_CREDENTIAL_FILE_LEN,
        });
    }
    Ok(bytes)
}

/// The CLI's side of the link: its `ClientCLI` certificate and key, the
/// generation CA it trusts, and the manifest that pins that CA. `Debug`
/// shows the manifest alone.
pub struct ClientCredential {
    manifest: TrustManifest,
    client_config: Arc<ClientConfig>,
}

impl fmt::Debug for ClientCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientCredential")
            .field("manifest", &self.manifest)
            .finish_non_exhaustive()
    }
}

impl ClientCredential {
    /// Loads the client credential from `dir` (the invoking user's
    /// directory with mode `0700`), refusing any file that is a symbolic
    /// link, not a regular file, not the user's, or not mode `0600`, and a
    /// trust bundle whose CA does not match the manifest's SHA-256 pin.
    pub fn load(dir: &RetainedDir) -> Result<Self, TlsError> {
        check_private_dir(dir)?;
        let trust_path = dir.label().join(CLIENT_TRUST_FILE);
        let bundle: ClientTrustBundle = codec::decode(&read_private_file(dir, CLIENT_TRUST_FILE)?)
            .map_err(|source| TlsError::Decode {
                path: trust_path.clone(),
                source,
            })?;
        if certificate_digest(&bundle.ca_certificate_der) != bundle.manifest.tls_ca_sha256 {
            return Err(TlsError::CaPinMismatch { path: trust_path });
        }

        let chain_path = dir.label().join(CLIENT_CERTIFICATE_FILE);
        let chain =
            CertificateDer::pem_slice_iter(&read_private_file(dir, CLIENT_CERTIFICATE_FILE)?)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|source| TlsError::Pem {
                    path: chain_path.clone(),
                    source,
                })?;
        if chain.is_empty() {
            return Err(TlsError::NoCertificate { path: chain_path });
        }
        let key = PrivateKeyDer::from_pem_slice(&read_private_file(dir, CLIENT_KEY_FILE)?)
            .map_err(|source| TlsError::Pem {
                path: dir.label().join(CLIENT_KEY_FILE),
                source,
            })?;

        let roots = only_root(CertificateDer::from(bundle.ca_certificate_der))?;
        let client_config = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .and_then(|builder| {
                builder
                    .with_root_certificates(roots)
                    .with_client_auth_cert(chain, key)
            })
            .map_err(|source| TlsError::Config {
                side: "client",
                source,
            })?;
        Ok(Self {
            manifest: bundle.manifest,
            client_config: Arc::new(client_config),
        })
    }

    /// The generation's manifest, for the caller to compare its Domain and
    /// generation with the ones it means to reach.
    pub fn manifest(&self) -> &TrustManifest {
        &self.manifest
    }

    /// The client side of the link: TLS 1.3 only, trusting only the
    /// generation CA, presenting the `ClientCLI` certificate. Connect with
    /// [`server_name`].
    pub fn client_config(&self) -> Arc<ClientConfig> {
        Arc::clone(&self.client_config)
    }
}

/// [`SERVER_NAME`] as rustls takes it.
pub fn server_name() -> ServerName<'static> {
    ServerName::try_from(SERVER_NAME).expect("SERVER_NAME is a valid DNS name")
}

/// The largest frame body `T` may have.
fn frame_limit<T: WireRecord>() -> usize {
    T::MAX_ENCODED_LEN.min(MAX_RECORD_LEN)
}

/// Writes `record` as one frame: its codec length as a big-endian `u32`,
/// then the codec bytes, in a single write, then flushes.
pub fn write_frame<W: Write + ?Sized, T: WireRecord>(
    w: &mut W,
    record: &T,
) -> Result<(), FrameError> {
    let body = codec::encode(record).map_err(|source| FrameError::Encode { source })?;
    // `encode` keeps the body within `MAX_RECORD_LEN`, far below `u32::MAX`.
    let len = u32::try_from(body.len()).map_err(|_| FrameError::Oversize {
        record: T::NAME,
        len: body.len(),
        max: frame_limit::<T>(),
    })?;
    let mut frame = Vec::with_capacity(FRAME_PREFIX_LEN + body.len());
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(&body);
    w.write_all(&frame)
        .and_then(|()| w.flush())
        .map_err(|source| FrameError::Write {
            record: T::NAME,
            source,
        })
}

/// Reads one frame and decodes it as `T`.
///
/// Returns `None` when the stream ends cleanly before a frame starts. A
/// stream that ends inside a frame is [`FrameError::Truncated`]; a length
/// over `T`'s limit is refused before anything more is read.
pub fn read_frame<R: Read + ?Sized, T: WireRecord>(r: &mut R) -> Result<Option<T>, FrameError> {
    let read_error = |source| FrameError::Read {
        record: T::NAME,
        source,
    };
    let mut prefix = [0u8; FRAME_PREFIX_LEN];
    let mut filled = 0;
    while filled < FRAME_PREFIX_LEN {
        match r.read(&mut prefix[filled..]) {
            Ok(0) if filled == 0 => return Ok(None),
            Ok(0) => return Err(FrameError::Truncated { record: T::NAME }),
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(read_error(e)),
        }
    }
    let len = checked_len::<T>(prefix)?;
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            FrameError::Truncated { record: T::NAME }
        } else {
            read_error(e)
        }
    })?;
    codec::decode(&body)
        .map(Some)
        .map_err(|source| FrameError::Decode { source })
}

/// The body length a prefix announces, refused when over `T`'s limit.
fn checked_len<T: WireRecord>(prefix: [u8; FRAME_PREFIX_LEN]) -> Result<usize, FrameError> {
    let announced = u32::from_be_bytes(prefix);
    let max = frame_limit::<T>();
    match usize::try_from(announced) {
        Ok(len) if len <= max => Ok(len),
        _ => Err(FrameError::Oversize {
            record: T::NAME,
            len: announced as usize,
            max,
        }),
    }
}

/// Takes the first frame out of `bytes`, the stream read so far, decoded
/// as `T`: `None` when more bytes are needed. An oversize length is refused
/// as soon as its prefix is complete. An error leaves `bytes` unusable:
/// close the connection.
pub fn take_frame<T: WireRecord>(bytes: &mut Vec<u8>) -> Result<Option<T>, FrameError> {
    let Some(prefix) = bytes.first_chunk::<FRAME_PREFIX_LEN>() else {
        return Ok(None);
    };
    let len = checked_len::<T>(*prefix)?;
    let end = FRAME_PREFIX_LEN + len;
    if bytes.len() < end {
        return Ok(None);
    }
    let record = codec::decode(&bytes[FRAME_PREFIX_LEN..end])
        .map_err(|source| FrameError::Decode { source })?;
    bytes.drain(..end);
    Ok(Some(record))
}

#[cfg(test)]
mod tests {
    use super::*;
    use lazaret_proto::ids::SessionId;
    use lazaret_proto::terminal::{
        SessionClose, SessionTerminalEvent, TerminalInput, TerminalResize,
    };
    use proptest::prelude::*;

    fn input(bytes: Vec<u8>) -> SessionTerminalEvent {
        SessionTerminalEvent::Input(TerminalInput {
            session_id: SessionId([0x5e; 16]),
            bytes,
        })
    }

    fn frames(records: &[SessionTerminalEvent]) -> Vec<u8> {
        let mut out = Vec::new();
        for record in records {
            write_frame(&mut out, record).unwrap();
        }
        out
    }

    #[test]
    fn frames_round_trip_and_end_cleanly() {
        let records = vec![
            input(b"ls -l\n".to_vec()),
            SessionTerminalEvent::Resize(TerminalResize {
                session_id: SessionId([1; 16]),
                rows: 24,
                columns: 80,
                width_pixels: 0,
                height_pixels: 0,
            }),
            SessionTerminalEvent::Close(SessionClose {
                session_id: SessionId([2; 16]),
            }),
        ];
        let bytes = frames(&records);
        let body_len = u32::from_be_bytes(bytes[..4].try_into().unwrap()) as usize;
        assert_eq!(
            &bytes[4..4 + body_len],
            codec::encode(&records[0]).unwrap().as_slice()
        );
        let mut reader = bytes.as_slice();
        for record in &records {
            assert_eq!(
                read_frame::<_, SessionTerminalEvent>(&mut reader)
                    .unwrap()
                    .as_ref(),
                Some(record)
            );
        }
        assert!(
            read_frame::<_, SessionTerminalEvent>(&mut reader)
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn truncated_frames_are_errors() {
        let bytes = frames(&[input(b"abc".to_vec())]);
        for cut in 1..bytes.len() {
            let mut reader = &bytes[..cut];
            let result = read_frame::<_, SessionTerminalEvent>(&mut reader);
            assert!(
                matches!(result, Err(FrameError::Truncated { .. })),
                "cut at {cut}: {result:?}"
            );
        }
    }

    #[test]
    fn oversize_lengths_are_refused_before_reading_the_body() {
        let max = SessionTerminalEvent::MAX_ENCODED_LEN;
        for announced in [max as u32 + 1, u32::MAX] {
            let mut bytes = announced.to_be_bytes().to_vec();
            // No body follows: the refusal must not wait for one.
            let mut reader = bytes.as_slice();
            let result = read_frame::<_, SessionTerminalEvent>(&mut reader);
            assert!(
                matches!(result, Err(FrameError::Oversize { len, max: m, .. }) if len == announced as usize && m == max),
                "{result:?}"
            );
            bytes.push(0);
            assert!(matches!(
                take_frame::<SessionTerminalEvent>(&mut bytes),
                Err(FrameError::Oversize { .. })
            ));
        }
        // A record too large for its own limit is never written.
        let mut out = Vec::new();
        let result = write_frame(&mut out, &input(vec![0; max]));
        assert!(
            matches!(result, Err(FrameError::Encode { .. })),
            "{result:?}"
        );
        assert!(out.is_empty());
    }

    #[test]
    fn garbage_bodies_do_not_decode() {
        let mut bytes = 3u32.to_be_bytes().to_vec();
        bytes.extend_from_slice(&[9, 9, 9]);
        let result = read_frame::<_, SessionTerminalEvent>(&mut bytes.as_slice());
        assert!(
            matches!(result, Err(FrameError::Decode { .. })),
            "{result:?}"
        );
        assert!(matches!(
            take_frame::<SessionTerminalEvent>(&mut bytes.clone()),
            Err(FrameError::Decode { .. })
        ));
    }

    #[test]
    fn a_cut_off_frame_is_kept_until_its_last_byte() {
        let bytes = frames(&[input(b"xyz".to_vec())]);
        let mut buffer = bytes[..bytes.len() - 1].to_vec();
        assert!(
            take_frame::<SessionTerminalEvent>(&mut buffer)
                .unwrap()
                .is_none()
        );
        assert_eq!(buffer.len(), bytes.len() - 1);
        buffer.push(bytes[bytes.len() - 1]);
        assert!(
            take_frame::<SessionTerminalEvent>(&mut buffer)
                .unwrap()
                .is_some()
        );
        assert!(buffer.is_empty());
    }

    #[test]
    fn server_name_parses() {
        assert!(matches!(server_name(), ServerName::DnsName(_)));
    }

    proptest! {
        #[test]
        fn frames_are_taken_whole_across_any_chunking(
            payloads in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..8),
            cuts in proptest::collection::vec(0usize..4000, 0..40),
        ) {
            let records: Vec<_> = payloads.into_iter().map(input).collect();
            let bytes = frames(&records);
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (bytes.len() + 1)).collect();
            cuts.push(0);
            cuts.push(bytes.len());
            cuts.sort_unstable();
            let mut buffer = Vec::new();
            let mut got = Vec::new();
            for pair in cuts.windows(2) {
                buffer.extend_from_slice(&bytes[pair[0]..pair[1]]);
                while let Some(record) = take_frame::<SessionTerminalEvent>(&mut buffer).unwrap() {
                    got.push(record);
                }
            }
            prop_assert!(buffer.is_empty());
            prop_assert_eq!(got, records);
        }
    }
}
