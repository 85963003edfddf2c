//! The Escalation Mailbox records: what the sandbox asks the host to run,
//! what the developer and the Host Coordinator answer, and the signed
//! envelope every one of them travels in.
//!
//! Each record is a file written by atomic rename into a session's mailbox.
//! The file holds a [`SignedProtocolRecord`]: the codec encoding of one
//! [`MailboxRecord`] and an Ed25519 signature over it. Requests,
//! cancellations and acknowledgements are signed by the session's
//! `AgentSandbox` credential; decisions, result chunks and results by the
//! `SessionCoordinator` credential.
//!
//! This module owns the shapes, the signed message's domain separator, and
//! the structural rules for `command_argv`. It trusts nothing it decodes:
//! a record means nothing until its signature, generation, session binding
//! and freshness have been checked by the receiver.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::codec::{self, DecodeError, WireRecord};
use crate::common::{ProtocolVersion, UnixTimeNs};
use crate::ids::{CapabilityId, RequestId, Sha256Digest};
use crate::trust::{ProtocolCredentialRole, ProtocolSignature, SessionBinding};

/// The most bytes a request's `command_argv` may hold, all elements
/// together.
pub const MAX_COMMAND_ARGV_BYTES: usize = 128 * 1024;

/// The most output bytes one result chunk carries.
pub const MAX_RESULT_CHUNK: usize = 32 * 1024;

/// The most bytes of a result's `detail`.
pub const MAX_RESULT_DETAIL: usize = 4 * 1024;

/// Where the sandbox sees the mailboxes of its sessions: one directory per
/// session, named by the session's id in hex, beneath it.
pub const MAILBOX_AREA: &str = "/run/lazaret/mailbox";

/// The environment variable naming a session process's session id (hex),
/// which selects its directory beneath [`MAILBOX_AREA`].
pub const SESSION_ENV: &str = "LAZARET_SESSION";

/// In a session's mailbox: the session's [`crate::trust::SandboxCredentialBundle`],
/// written by the host.
pub const CREDENTIAL_FILE: &str = "credential";

/// In a session's mailbox: the session leader's identity inside the
/// sandbox (`PID PGRP STARTTIME`), written once by the sandbox's pid 1
/// (`lazaret-init`) when it finds the leader; the sandbox's own claim,
/// recorded and never acted on.
pub const GUEST_FILE: &str = "guest";

/// In a session's mailbox: where the sandbox puts its records
/// (requests, cancellations, acknowledgements), each by atomic rename.
pub const REQUESTS_DIR: &str = "requests";

/// In a session's mailbox: where the host puts its records (decisions,
/// result chunks, results), each by atomic rename.
pub const RESULTS_DIR: &str = "results";

/// A record file's name in [`REQUESTS_DIR`] or [`RESULTS_DIR`]: the request
/// in hex, then what the record is. A name beginning with `.` is a file
/// still being written, which readers pass over.
pub fn record_file_name(request_id: RequestId, kind: RecordFile) -> String {
    let id = request_id.to_hex();
    match kind {
        RecordFile::Request => format!("{id}.request"),
        RecordFile::Cancellation => format!("{id}.cancel"),
        RecordFile::ResultAck => format!("{id}.ack"),
        RecordFile::Decision => format!("{id}.decision"),
        RecordFile::Chunk(sequence) => format!("{id}.{sequence:010}.chunk"),
        RecordFile::Result => format!("{id}.result"),
    }
}

/// Which record a mailbox file holds, as its name says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RecordFile {
    /// A [`MailboxRequest`].
    Request,
    /// A [`MailboxCancellation`].
    Cancellation,
    /// A [`MailboxResultAck`].
    ResultAck,
    /// A [`DeveloperDecision`].
    Decision,
    /// The [`MailboxResultChunk`] with this sequence number.
    Chunk(u64),
    /// A [`MailboxResult`].
    Result,
}

/// The most bytes a [`MailboxRecord`] encoding may hold.
pub const MAX_MAILBOX_RECORD_LEN: usize = MAX_COMMAND_ARGV_BYTES + 16 * 1024;

/// The separator prefixed to a record's payload bytes before signing, so a
/// mailbox signature can never be replayed as any other signature.
pub const SIGNATURE_CONTEXT: &[u8] = b"lazaret-signed-protocol-record-v1\0";

/// A request to run one host command.
///
/// The seed's field list is partial after `request_id`; the capability,
/// the argv and the freshness window are added.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MailboxRequest {
    /// Protocol version.
    pub protocol_version: ProtocolVersion,
    /// The session the request comes from.
    pub session_binding: SessionBinding,
    /// The request.
    pub request_id: RequestId,
    /// The capability it is made under.
    pub capability_id: CapabilityId,
    /// The command: an absolute executable path then its arguments. No
    /// shell and no `PATH` lookup ever interpret it.
    pub command_argv: Vec<String>,
    /// When the client made the request.
    pub issued_at: UnixTimeNs,
    /// After this instant the request is stale and refused.
    pub expires_at: UnixTimeNs,
}

/// Why a `command_argv` breaks the v1 request rules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandArgvError {
    /// No elements at all.
    #[error("command_argv is empty; give the absolute path of the executable first")]
    Empty,
    /// An element holds a NUL byte.
    #[error("command_argv[{0}] contains a NUL character")]
    ContainsNul(usize),
    /// Element zero is not an absolute path.
    #[error("command_argv[0] is not an absolute path; lazaret does no PATH lookup")]
    NotAbsolute,
    /// The elements together are too large.
    #[error("command_argv holds {0} bytes, more than the limit of {MAX_COMMAND_ARGV_BYTES}")]
    TooLarge(usize),
}

impl MailboxRequest {
    /// Checks the structural rules for `command_argv`: nonempty, every
    /// element NUL-free (UTF-8 holds by type), element zero absolute, and
    /// the whole within [`MAX_COMMAND_ARGV_BYTES`]. Matching element zero
    /// against a rule's canonical executable is the classifier's job.
    pub fn validate_command_argv(&self) -> Result<(), CommandArgvError> {
        Self::validate_argv(&self.command_argv)
    }

    /// [`Self::validate_command_argv`] for any argv.
    pub fn validate_argv(argv: &[String]) -> Result<(), CommandArgvError> {
        let first = argv.first().ok_or(CommandArgvError::Empty)?;
        if let Some(index) = argv.iter().position(|a| a.contains('\0')) {
            return Err(CommandArgvError::ContainsNul(index));
        }
        if !first.starts_with('/') {
            return Err(CommandArgvError::NotAbsolute);
        }
        let total: usize = argv.iter().map(String::len).sum();
        if total > MAX_COMMAND_ARGV_BYTES {
            return Err(CommandArgvError::TooLarge(total));
        }
        Ok(())
    }

    /// [`argv_digest`] of this request's argv.
    pub fn command_argv_digest(&self) -> Sha256Digest {
        argv_digest(&self.command_argv)
    }
}

/// SHA-256 of an argv: a separator, then the element count and each
/// element framed as a big-endian `u32` length and its bytes, in order. A
/// [`DeveloperDecision`] names the argv it approved by this digest.
pub fn argv_digest(argv: &[String]) -> Sha256Digest {
    let mut hasher = Sha256::new();
    hasher.update(b"lazaret-command-argv-v1\0");
    let len = |n: usize| u32::try_from(n).unwrap_or(u32::MAX).to_be_bytes();
    hasher.update(len(argv.len()));
    for arg in argv {
        hasher.update(len(arg.len()));
        hasher.update(arg.as_bytes());
    }
    Sha256Digest(hasher.finalize().into())
}

/// The client's request to stop a request it made (Ctrl-C in the client).
///
/// The seed's field list is partial after `request_id`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MailboxCancellation {
    /// Protocol version.
    pub protocol_version: ProtocolVersion,
    /// The session.
    pub session_binding: SessionBinding,
    /// The request to cancel.
    pub request_id: RequestId,
    /// The capability the request was made under.
    pub capability_id: CapabilityId,
    /// When the client cancelled.
    pub issued_at: UnixTimeNs,
}

/// The client's confirmation that it read a request's final result, after
/// which the host may remove the request's files.
///
/// The seed's field list is partial after `request_id`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MailboxResultAck {
    /// Protocol version.
    pub protocol_version: ProtocolVersion,
    /// The session.
    pub session_binding: SessionBinding,
    /// The request.
    pub request_id: RequestId,
    /// The capability the request was made under.
    pub capability_id: CapabilityId,
    /// How many result chunks the client received.
    pub chunks_received: u64,
    /// SHA-256 of the signed result's payload bytes.
    pub result_sha256: Sha256Digest,
    /// When the client acknowledged.
    pub acknowledged_at: UnixTimeNs,
}

/// The developer's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DeveloperDecisionKind {
    /// Run the command.
    Approve,
    /// Do not run it.
    Deny,
}

/// The developer's decision on a request, as asked in the requesting
/// session's terminal.
///
/// The seed's field list is partial after `request_id`; the decision, the
/// digest of the exact argv shown, and the time are added.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeveloperDecision {
    /// Protocol version.
    pub protocol_version: ProtocolVersion,
    /// The session.
    pub session_binding: SessionBinding,
    /// The request decided.
    pub request_id: RequestId,
    /// Approve or deny.
    pub decision: DeveloperDecisionKind,
    /// [`MailboxRequest::command_argv_digest`] of the argv the developer saw.
    pub command_argv_sha256: Sha256Digest,
    /// When the developer answered.
    pub decided_at: UnixTimeNs,
}

/// Which output stream a chunk comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ResultStream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// A piece of a running command's output.
///
/// The seed's field list is partial after `request_id`; the ordering
/// fields, stream and bytes are added.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MailboxResultChunk {
    /// Protocol version.
    pub protocol_version: ProtocolVersion,
    /// The session.
    pub session_binding: SessionBinding,
    /// The request.
    pub request_id: RequestId,
    /// The chunk's position among all chunks of the request, from 0.
    pub sequence: u64,
    /// Which stream.
    pub stream: ResultStream,
    /// Where `bytes` start within that stream.
    pub offset: u64,
    /// The output, at most [`MAX_RESULT_CHUNK`] bytes.
    pub bytes: Vec<u8>,
}

/// How a request ended.
///
/// The seed's list is partial after `Denied`; the rest are the other ends
/// the design brief and the escalation design describe (refused without
/// asking, cancelled by the client, failed to launch, expired unanswered).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EscalationOutcome {
    /// The command ran to its end.
    Completed,
    /// The developer denied it.
    Denied,
    /// Policy refused it without asking (escalation disabled, invalid
    /// request, or no developer to ask).
    Refused,
    /// The client cancelled it.
    Cancelled,
    /// It was approved but could not be started.
    LaunchFailed,
    /// Nobody decided before the request's deadline.
    Expired,
}

/// The final record of a request.
///
/// The seed's field list is partial after `request_id`; outcome and exit
/// status are what the brief requires, the chunk count and truncation let
/// the client check it has all output, and `detail` is the host's
/// explanation of an outcome other than `Completed`, for the client to
/// print.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MailboxResult {
    /// Protocol version.
    pub protocol_version: ProtocolVersion,
    /// The session.
    pub session_binding: SessionBinding,
    /// The request.
    pub request_id: RequestId,
    /// How it ended.
    pub outcome: EscalationOutcome,
    /// The exit status, if the command exited.
    pub exit_code: Option<u8>,
    /// The signal number, if a signal ended the command.
    pub terminating_signal: Option<u8>,
    /// How many chunks were written before this result.
    pub chunk_count: u64,
    /// Whether output beyond the host's limit was dropped.
    pub output_truncated: bool,
    /// Why the request ended as it did, for the user; at most
    /// [`MAX_RESULT_DETAIL`] bytes.
    pub detail: String,
    /// When the request ended.
    pub finished_at: UnixTimeNs,
}

/// Any record a mailbox file may carry: the signed payload's type.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MailboxRecord {
    /// From the sandbox: run a command.
    Request(MailboxRequest),
    /// From the sandbox: stop it.
    Cancellation(MailboxCancellation),
    /// From the sandbox: the result was received.
    ResultAck(MailboxResultAck),
    /// From the host: the developer's decision.
    Decision(DeveloperDecision),
    /// From the host: a piece of output.
    ResultChunk(MailboxResultChunk),
    /// From the host: the end.
    Result(MailboxResult),
}

impl MailboxRecord {
    /// The only credential role whose signature this record may carry.
    pub fn signer_role(&self) -> ProtocolCredentialRole {
        match self {
            Self::Request(_) | Self::Cancellation(_) | Self::ResultAck(_) => {
                ProtocolCredentialRole::AgentSandbox
            }
            Self::Decision(_) | Self::ResultChunk(_) | Self::Result(_) => {
                ProtocolCredentialRole::SessionCoordinator
            }
        }
    }

    /// The session the record claims.
    pub fn session_binding(&self) -> &SessionBinding {
        match self {
            Self::Request(r) => &r.session_binding,
            Self::Cancellation(r) => &r.session_binding,
            Self::ResultAck(r) => &r.session_binding,
            Self::Decision(r) => &r.session_binding,
            Self::ResultChunk(r) => &r.session_binding,
            Self::Result(r) => &r.session_binding,
        }
    }

    /// The request the record is about.
    pub fn request_id(&self) -> RequestId {
        match self {
            Self::Request(r) => r.request_id,
            Self::Cancellation(r) => r.request_id,
            Self::ResultAck(r) => r.request_id,
            Self::Decision(r) => r.request_id,
            Self::ResultChunk(r) => r.request_id,
            Self::Result(r) => r.request_id,
        }
    }
}

impl WireRecord for MailboxRecord {
    const NAME: &'static str = "MailboxRecord";
    const MAX_ENCODED_LEN: usize = MAX_MAILBOX_RECORD_LEN;
}

/// A mailbox file: a record's codec encoding and the sender's signature
/// over [`SIGNATURE_CONTEXT`] followed by those bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedProtocolRecord {
    /// The codec encoding of one [`MailboxRecord`].
    pub payload_bytes: Vec<u8>,
    /// The sender's Ed25519 signature.
    pub signature: ProtocolSignature,
}

impl SignedProtocolRecord {
    /// The exact bytes the signature covers.
    pub fn signed_message(&self) -> Vec<u8> {
        signed_message(&self.payload_bytes)
    }

    /// Decodes the payload. Only call this after the signature verified.
    pub fn payload(&self) -> Result<MailboxRecord, DecodeError> {
        codec::decode(&self.payload_bytes)
    }
}

/// The bytes a signature over `payload_bytes` covers.
pub fn signed_message(payload_bytes: &[u8]) -> Vec<u8> {
    let mut message = Vec::with_capacity(SIGNATURE_CONTEXT.len() + payload_bytes.len());
    message.extend_from_slice(SIGNATURE_CONTEXT);
    message.extend_from_slice(payload_bytes);
    message
}

impl WireRecord for SignedProtocolRecord {
    const NAME: &'static str = "SignedProtocolRecord";
    const MAX_ENCODED_LEN: usize = MAX_MAILBOX_RECORD_LEN + 128;
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::test_support::{
        assert_rejects_bad_envelopes, assert_rejects_unknown_discriminant, round_trip,
    };
    use crate::trust::tests::session_binding;

    pub(crate) fn request() -> MailboxRequest {
        MailboxRequest {
            protocol_version: ProtocolVersion::V1,
            session_binding: session_binding(),
            request_id: RequestId([0x7e; 16]),
            capability_id: CapabilityId([0xcc; 16]),
            command_argv: vec!["/usr/bin/gh".into(), "pr".into(), "create".into()],
            issued_at: UnixTimeNs(1_700_000_000_000_000_000),
            expires_at: UnixTimeNs(1_700_000_060_000_000_000),
        }
    }

    fn every_record() -> Vec<MailboxRecord> {
        let request = request();
        let digest = request.command_argv_digest();
        vec![
            MailboxRecord::Request(request),
            MailboxRecord::Cancellation(MailboxCancellation {
                protocol_version: ProtocolVersion::V1,
                session_binding: session_binding(),
                request_id: RequestId([0x7e; 16]),
                capability_id: CapabilityId([0xcc; 16]),
                issued_at: UnixTimeNs(2),
            }),
            MailboxRecord::ResultAck(MailboxResultAck {
                protocol_version: ProtocolVersion::V1,
                session_binding: session_binding(),
                request_id: RequestId([0x7e; 16]),
                capability_id: CapabilityId([0xcc; 16]),
                chunks_received: 3,
                result_sha256: Sha256Digest([0x33; 32]),
                acknowledged_at: UnixTimeNs(4),
            }),
            MailboxRecord::Decision(DeveloperDecision {
                protocol_version: ProtocolVersion::V1,
                session_binding: session_binding(),
                request_id: RequestId([0x7e; 16]),
                decision: DeveloperDecisionKind::Approve,
                command_argv_sha256: digest,
                decided_at: UnixTimeNs(5),
            }),
            MailboxRecord::ResultChunk(MailboxResultChunk {
                protocol_version: ProtocolVersion::V1,
                session_binding: session_binding(),
                request_id: RequestId([0x7e; 16]),
                sequence: 0,
                stream: ResultStream::Stderr,
                offset: 0,
                bytes: b"warning: \xff\n".to_vec(),
            }),
            MailboxRecord::Result(MailboxResult {
                protocol_version: ProtocolVersion::V1,
                session_binding: session_binding(),
                request_id: RequestId([0x7e; 16]),
                outcome: EscalationOutcome::Completed,
                exit_code: Some(0),
                terminating_signal: None,
                chunk_count: 1,
                output_truncated: false,
                detail: String::new(),
                finished_at: UnixTimeNs(6),
            }),
        ]
    }

    #[test]
    fn every_record_round_trips_signed_and_unsigned() {
        for record in every_record() {
            assert_eq!(record.request_id(), RequestId([0x7e; 16]));
            assert_eq!(record.session_binding(), &session_binding());
            let payload_bytes = round_trip(&record);
            let signed = SignedProtocolRecord {
                payload_bytes,
                signature: ProtocolSignature([0x51; 64]),
            };
            round_trip(&signed);
            assert_eq!(signed.payload().unwrap(), record);
            assert!(signed.signed_message().starts_with(SIGNATURE_CONTEXT));
        }
        let records = every_record();
        assert_eq!(
            records[0].signer_role(),
            ProtocolCredentialRole::AgentSandbox
        );
        assert_eq!(
            records[5].signer_role(),
            ProtocolCredentialRole::SessionCoordinator
        );
        assert_rejects_bad_envelopes(&records[0]);
        assert_rejects_bad_envelopes(&SignedProtocolRecord {
            payload_bytes: vec![1, 2, 3],
            signature: ProtocolSignature([0; 64]),
        });
    }

    #[test]
    fn unknown_record_kind_and_outcome_are_refused() {
        let records = every_record();
        let bytes = codec::encode(&records[5]).unwrap();
        assert_eq!(bytes[1], 5);
        assert_rejects_unknown_discriminant::<MailboxRecord>(bytes.clone(), 1);
        // The result ends with: outcome, Some(0), None, chunk count 1,
        // false, an empty detail, finished_at 6.
        let outcome_at = bytes.len() - 8;
        assert_eq!(
            &bytes[outcome_at..],
            &[0, 1, 0, 0, 1, 0, 0, 6],
            "layout of the result's tail"
        );
        assert_rejects_unknown_discriminant::<MailboxRecord>(bytes, outcome_at);
    }

    #[test]
    fn argv_rules() {
        let mut r = request();
        r.validate_command_argv().unwrap();
        r.command_argv = vec![];
        assert_eq!(r.validate_command_argv(), Err(CommandArgvError::Empty));
        r.command_argv = vec!["gh".into(), "pr".into()];
        assert_eq!(
            r.validate_command_argv(),
            Err(CommandArgvError::NotAbsolute)
        );
        r.command_argv = vec!["/bin/echo".into(), "a\0b".into()];
        assert_eq!(
            r.validate_command_argv(),
            Err(CommandArgvError::ContainsNul(1))
        );
        r.command_argv = vec!["/bin/echo".into(), "x".repeat(MAX_COMMAND_ARGV_BYTES)];
        assert!(matches!(
            r.validate_command_argv(),
            Err(CommandArgvError::TooLarge(_))
        ));
    }

    #[test]
    fn record_file_names_sort_chunks_in_order() {
        let id = RequestId([0xab; 16]);
        let name = |kind| record_file_name(id, kind);
        assert_eq!(
            name(RecordFile::Request),
            format!("{}.request", id.to_hex())
        );
        assert!(name(RecordFile::Chunk(9)) < name(RecordFile::Chunk(10)));
        let names: std::collections::HashSet<_> = [
            RecordFile::Request,
            RecordFile::Cancellation,
            RecordFile::ResultAck,
            RecordFile::Decision,
            RecordFile::Chunk(0),
            RecordFile::Result,
        ]
        .into_iter()
        .map(name)
        .collect();
        assert_eq!(names.len(), 6);
        assert!(
            names
                .iter()
                .all(|n| !n.starts_with('.') && !n.contains('/'))
        );
    }

    #[test]
    fn argv_digest_frames_elements() {
        let mut a = request();
        let mut b = request();
        a.command_argv = vec!["/bin/echo".into(), "ab".into(), "c".into()];
        b.command_argv = vec!["/bin/echo".into(), "a".into(), "bc".into()];
        assert_ne!(a.command_argv_digest(), b.command_argv_digest());
        assert_eq!(a.command_argv_digest(), a.clone().command_argv_digest());
    }
}
