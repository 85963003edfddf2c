//! What a record file from a session's sandbox must be before the host
//! believes a word of it, and when a believed record is too old or too new
//! to act on.
//!
//! Owns the checks made on every record taken from a session's
//! `requests/`: its signature under the session's own `AgentSandbox` key
//! (checked before anything is decoded), its kind, its binding to this
//! session and generation, its request capability, its file name; then
//! its freshness. Trusts the session's key and capability, which the host
//! made; nothing the record says until those checks passed.

use std::time::Duration;

use lazaret_proto::common::UnixTimeNs;
use lazaret_proto::mailbox::{MailboxRecord, MailboxRequest, RecordFile, record_file_name};
use lazaret_proto::signing::OpenError;
use lazaret_proto::trust::{ProtocolCredentialRole, ProtocolPublicKey, SessionRequestCapability};

/// How far in the future a request may say it was made (clock steps).
pub const FUTURE_SKEW: Duration = Duration::from_secs(30);
/// How old a request may be when the host reads it: older is stale (a
/// file kept back and dropped in later). [`Stale::Old`] says "a minute".
pub const MAX_AGE: Duration = Duration::from_secs(60);
/// The longest a request may wait for the developer.
pub const MAX_WAIT: Duration = Duration::from_secs(600);

/// Why a record file is not one of this session's sandbox.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// It is not a record signed by the session's key.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// Its binding names another session or generation.
    #[error("it is bound to another session or generation")]
    OtherSession,
    /// It is of a kind only the host signs.
    #[error("the host signs records of its kind")]
    HostKind,
    /// It names another request capability than the session's.
    #[error("it names another request capability")]
    OtherCapability,
    /// The session's request capability expired.
    #[error("this session's request capability expired")]
    CapabilityExpired,
    /// Its file name is not the one its kind and request id make.
    #[error("its file name does not match the record")]
    Misnamed,
}

/// Why a verified record is not acted on: its times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Stale {
    /// It says it was made past the clock skew allowed.
    #[error(
        "it says it was made more than {} s in the future (is the clock right?)",
        FUTURE_SKEW.as_secs()
    )]
    Future,
    /// It was made longer ago than [`MAX_AGE`].
    #[error("it was made more than a minute before the host read it")]
    Old,
    /// A request's own expiry had passed.
    #[error("it had expired when the host read it")]
    Expired,
    /// A request asks to wait longer than [`MAX_WAIT`].
    #[error("it asks to wait longer than the host allows ({} s)", MAX_WAIT.as_secs())]
    WaitTooLong,
}

/// Reads record file `name` as a record of this session's sandbox: signed
/// by its key (checked before anything is decoded), of a kind the sandbox
/// signs, bound to this session and generation, under its capability
/// while that lasts, in the file its name says. Why not, otherwise.
pub fn verify(
    name: &str,
    bytes: &[u8],
    key: &ProtocolPublicKey,
    capability: &SessionRequestCapability,
    now: UnixTimeNs,
) -> Result<MailboxRecord, RecordError> {
    let record = lazaret_proto::signing::open(bytes, key, ProtocolCredentialRole::AgentSandbox)?;
    if *record.session_binding() != capability.session_binding {
        return Err(RecordError::OtherSession);
    }
    let (capability_id, kind) = match &record {
        MailboxRecord::Request(r) => (r.capability_id, RecordFile::Request),
        MailboxRecord::Cancellation(r) => (r.capability_id, RecordFile::Cancellation),
        MailboxRecord::ResultAck(r) => (r.capability_id, RecordFile::ResultAck),
        _ => return Err(RecordError::HostKind),
    };
    if capability_id != capability.capability_id {
        return Err(RecordError::OtherCapability);
    }
    if now >= capability.expires_at {
        return Err(RecordError::CapabilityExpired);
    }
    if name != record_file_name(record.request_id(), kind) {
        return Err(RecordError::Misnamed);
    }
    Ok(record)
}

/// Why a record made at `issued_at` is stale when read at `now`: made in
/// the future (past the clock skew allowed), or longer ago than
/// [`MAX_AGE`] (a file kept back and dropped in later).
pub fn stale(issued_at: UnixTimeNs, now: UnixTimeNs) -> Option<Stale> {
    if issued_at > now.after(FUTURE_SKEW) {
        Some(Stale::Future)
    } else if now.since(issued_at) > MAX_AGE {
        Some(Stale::Old)
    } else {
        None
    }
}

/// Why a verified request read at `now` is not admitted: [`stale`], or
/// expired, or asking to wait longer than [`MAX_WAIT`] (with the skew
/// allowed).
pub fn stale_request(request: &MailboxRequest, now: UnixTimeNs) -> Option<Stale> {
    stale(request.issued_at, now).or_else(|| {
        if request.expires_at <= now {
            Some(Stale::Expired)
        } else if request.expires_at.since(request.issued_at) > MAX_WAIT + FUTURE_SKEW {
            Some(Stale::WaitTooLong)
        } else {
            None
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use lazaret_proto::common::ProtocolVersion;
    use lazaret_proto::error_chain;
    use lazaret_proto::ids::{
        CapabilityId, CliId, ConfigurationFingerprint, CredentialId, DomainId, GenerationId,
        GenerationNonce, RequestId, SessionId,
    };
    use lazaret_proto::mailbox::{EscalationOutcome, MailboxResult};
    use lazaret_proto::trust::{GenerationIdentity, ProtocolSigningKey, SessionBinding};
    use proptest::prelude::*;

    fn capability() -> SessionRequestCapability {
        SessionRequestCapability {
            protocol_version: ProtocolVersion::V1,
            capability_id: CapabilityId([0xcc; 16]),
            session_binding: SessionBinding {
                generation_identity: GenerationIdentity {
                    agent_profile: "p".into(),
                    domain_id: DomainId([1; 32]),
                    generation_id: GenerationId(3),
                    configuration_fingerprint: ConfigurationFingerprint([2; 32]),
                    generation_nonce: GenerationNonce([3; 16]),
                    created_at: UnixTimeNs(1),
                },
                cli_id: CliId([4; 16]),
                session_id: SessionId([4; 16]),
                credential_id: CredentialId([5; 16]),
            },
            expires_at: UnixTimeNs(u64::MAX),
        }
    }

    fn request(capability: &SessionRequestCapability) -> MailboxRecord {
        MailboxRecord::Request(MailboxRequest {
            protocol_version: ProtocolVersion::V1,
            session_binding: capability.session_binding.clone(),
            request_id: RequestId([9; 16]),
            capability_id: capability.capability_id,
            command_argv: vec!["/usr/bin/id".into(), "-u".into()],
            issued_at: UnixTimeNs::now(),
            expires_at: UnixTimeNs::now().after(Duration::from_secs(60)),
        })
    }

    fn name() -> String {
        record_file_name(RequestId([9; 16]), RecordFile::Request)
    }

    fn sealed(key: &ProtocolSigningKey, record: &MailboxRecord) -> Vec<u8> {
        lazaret_proto::signing::seal(key, record).unwrap()
    }

    #[test]
    fn only_this_sessions_own_records_pass() {
        let (key, public) = lazaret_proto::signing::generate();
        let capability = capability();
        let now = UnixTimeNs::now();
        let good = sealed(&key, &request(&capability));
        assert!(verify(&name(), &good, &public, &capability, now).is_ok());

        // Another session's key (its own credential, stolen).
        let (other_key, _) = lazaret_proto::signing::generate();
        let stolen = sealed(&other_key, &request(&capability));
        let why = error_chain(&verify(&name(), &stolen, &public, &capability, now).unwrap_err());
        assert!(why.contains("signature"), "{why}");

        // This key, but bound to another generation or session.
        let mut other = capability.clone();
        other.session_binding.generation_identity.generation_id = GenerationId(2);
        let why = error_chain(
            &verify(
                &name(),
                &sealed(&key, &request(&other)),
                &public,
                &capability,
                now,
            )
            .unwrap_err(),
        );
        assert!(why.contains("another session or generation"), "{why}");
        let refused = |other: &SessionRequestCapability| {
            verify(
                &name(),
                &sealed(&key, &request(other)),
                &public,
                &capability,
                now,
            )
            .is_err()
        };
        let mut other = capability.clone();
        other.session_binding.session_id = SessionId([6; 16]);
        assert!(refused(&other));

        // Another capability, an expired one, another file name.
        let mut other = capability.clone();
        other.capability_id = CapabilityId([0xdd; 16]);
        assert!(refused(&other));
        let mut expired = capability.clone();
        expired.expires_at = now;
        assert!(verify(&name(), &good, &public, &expired, now).is_err());
        assert!(verify("x.request", &good, &public, &capability, now).is_err());

        // A record of the host's kind, signed with the sandbox's key.
        let result = MailboxRecord::Result(MailboxResult {
            protocol_version: ProtocolVersion::V1,
            session_binding: capability.session_binding.clone(),
            request_id: RequestId([9; 16]),
            outcome: EscalationOutcome::Completed,
            exit_code: Some(0),
            terminating_signal: None,
            chunk_count: 0,
            output_truncated: false,
            detail: String::new(),
            finished_at: now,
        });
        assert!(verify(&name(), &sealed(&key, &result), &public, &capability, now).is_err());
    }

    #[test]
    fn a_non_utf8_argument_is_refused_after_the_signature() {
        let (key, public) = lazaret_proto::signing::generate();
        let capability = capability();
        let MailboxRecord::Request(mut r) = request(&capability) else {
            unreachable!()
        };
        r.command_argv = vec!["/usr/bin/id".into(), "MARK".into()];
        let mut payload = lazaret_proto::codec::encode(&MailboxRecord::Request(r)).unwrap();
        let at = payload.windows(4).position(|w| w == b"MARK").unwrap();
        payload[at] = 0xff;
        let bytes = lazaret_proto::signing::seal_payload(&key, payload).unwrap();
        let why = error_chain(
            &verify(&name(), &bytes, &public, &capability, UnixTimeNs::now()).unwrap_err(),
        );
        assert!(why.contains("payload"), "{why}");
    }

    #[test]
    fn each_refusal_is_its_own_variant() {
        let (key, public) = lazaret_proto::signing::generate();
        let capability = capability();
        let now = UnixTimeNs::now();
        let good = sealed(&key, &request(&capability));
        let (other_key, _) = lazaret_proto::signing::generate();
        assert!(matches!(
            verify(
                &name(),
                &sealed(&other_key, &request(&capability)),
                &public,
                &capability,
                now
            ),
            Err(RecordError::Open(OpenError::Signature))
        ));
        assert!(matches!(
            verify(&name(), b"not a record", &public, &capability, now),
            Err(RecordError::Open(OpenError::Envelope(_)))
        ));
        let mut other = capability.clone();
        other.capability_id = CapabilityId([0xdd; 16]);
        assert!(matches!(
            verify(
                &name(),
                &sealed(&key, &request(&other)),
                &public,
                &capability,
                now
            ),
            Err(RecordError::OtherCapability)
        ));
        let mut expired = capability.clone();
        expired.expires_at = now;
        assert!(matches!(
            verify(&name(), &good, &public, &expired, now),
            Err(RecordError::CapabilityExpired)
        ));
        // The name of another kind of record of the same request.
        let cancellation = record_file_name(RequestId([9; 16]), RecordFile::Cancellation);
        assert!(matches!(
            verify(&cancellation, &good, &public, &capability, now),
            Err(RecordError::Misnamed)
        ));
    }

    #[test]
    fn a_cancellation_and_an_acknowledgement_pass_under_their_own_names() {
        let (key, public) = lazaret_proto::signing::generate();
        let capability = capability();
        let now = UnixTimeNs::now();
        let cancel = MailboxRecord::Cancellation(lazaret_proto::mailbox::MailboxCancellation {
            protocol_version: ProtocolVersion::V1,
            session_binding: capability.session_binding.clone(),
            request_id: RequestId([9; 16]),
            capability_id: capability.capability_id,
            issued_at: now,
        });
        let cancel_name = record_file_name(RequestId([9; 16]), RecordFile::Cancellation);
        let bytes = sealed(&key, &cancel);
        assert!(verify(&cancel_name, &bytes, &public, &capability, now).is_ok());
        assert!(matches!(
            verify(&name(), &bytes, &public, &capability, now),
            Err(RecordError::Misnamed)
        ));
    }

    #[test]
    fn records_out_of_their_time_are_stale() {
        let now = UnixTimeNs::now();
        assert_eq!(stale(now, now), None);
        assert_eq!(stale(now.after(FUTURE_SKEW), now), None);
        assert_eq!(
            stale(now.after(FUTURE_SKEW + Duration::from_secs(1)), now),
            Some(Stale::Future)
        );
        let old = UnixTimeNs(now.0 - (MAX_AGE + Duration::from_secs(1)).as_nanos() as u64);
        assert_eq!(stale(old, now), Some(Stale::Old));
        assert_eq!(
            Stale::Old.to_string(),
            "it was made more than a minute before the host read it"
        );
    }

    #[test]
    fn a_request_is_stale_once_expired_or_when_it_asks_too_long_a_wait() {
        let now = UnixTimeNs::now();
        let MailboxRecord::Request(mut r) = request(&capability()) else {
            unreachable!()
        };
        assert_eq!(stale_request(&r, now), None);
        r.expires_at = now;
        assert_eq!(stale_request(&r, now), Some(Stale::Expired));
        r.expires_at = r.issued_at.after(MAX_WAIT + FUTURE_SKEW);
        assert_eq!(stale_request(&r, now), None);
        r.expires_at = r
            .issued_at
            .after(MAX_WAIT + FUTURE_SKEW + Duration::from_secs(1));
        assert_eq!(stale_request(&r, now), Some(Stale::WaitTooLong));
        assert!(Stale::WaitTooLong.to_string().contains("600 s"));
        // Its own times come first: made in the future is that, whatever
        // its expiry says.
        r.issued_at = now.after(Duration::from_secs(3600));
        r.expires_at = r.issued_at.after(Duration::from_secs(60));
        assert_eq!(stale_request(&r, now), Some(Stale::Future));
    }

    proptest! {
        #[test]
        fn random_bytes_are_refused_without_panic(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
            let (_, public) = lazaret_proto::signing::generate();
            prop_assert!(verify(&name(), &bytes, &public, &capability(), UnixTimeNs::now()).is_err());
        }

        #[test]
        fn changed_records_are_refused_without_panic(
            at in any::<prop::sample::Index>(),
            xor in 1u8..,
            cut in any::<prop::sample::Index>(),
        ) {
            let (key, public) = lazaret_proto::signing::generate();
            let capability = capability();
            let good = sealed(&key, &request(&capability));
            let mut changed = good.clone();
            changed[at.index(good.len())] ^= xor;
            prop_assert!(verify(&name(), &changed, &public, &capability, UnixTimeNs::now()).is_err());
            let short = &good[..cut.index(good.len())];
            prop_assert!(verify(&name(), short, &public, &capability, UnixTimeNs::now()).is_err());
        }
    }
}
