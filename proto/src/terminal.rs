//! Session terminal records: what identifies a Client Session's PTY and its
//! guest process, and the events and messages that flow over the session's
//! TLS link between the host CLI and the Host Coordinator.
//!
//! Events ([`SessionTerminalEvent`]) go from the CLI to the Host
//! Coordinator: input, resize, signals and close. Messages
//! ([`SessionTerminalMessage`]) go back: merged output and the final exit.
//! This module trusts nothing it decodes; in particular a `session_id` in an
//! event is a claim the Host Coordinator checks against the connection that
//! carried it.

use serde::{Deserialize, Serialize};

use crate::codec::WireRecord;
use crate::common::UnixTimeNs;
use crate::ids::{ContainerId, RequestId, SessionId};
use crate::mailbox::{DeveloperDecisionKind, EscalationOutcome};

/// The most terminal bytes one input or output record carries. Larger
/// writes are split.
pub const MAX_TERMINAL_CHUNK: usize = 32 * 1024;

/// The host PTY of a session, held as a master descriptor by the Host
/// Coordinator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PtyIdentity {
    /// The master's descriptor number in the Host Coordinator that holds it.
    /// Meaningful only to that process while it lives; recovery never uses
    /// it as authority, only `device` and `inode`.
    pub master_fd: u32,
    /// The PTY slave's device number (`st_rdev`).
    pub device: u64,
    /// The PTY slave's inode on its devpts instance.
    pub inode: u64,
}

/// The process a session runs inside the sandbox, as the guest sees it.
///
/// The seed's field list is partial after `process_group_id`; the container
/// is added because the specification refuses a session on a container
/// mismatch.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GuestProcessIdentity {
    /// The gVisor container the process runs in.
    pub container_id: ContainerId,
    /// The session leader's pid in the sandbox's pid namespace.
    pub leader_pid: u32,
    /// The leader's start time in clock ticks since the sandbox booted.
    pub leader_start_time: u64,
    /// The foreground process group of the session.
    pub process_group_id: u32,
}

/// Bytes typed into a session's terminal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TerminalInput {
    /// The session the input is for.
    pub session_id: SessionId,
    /// The raw bytes, at most [`MAX_TERMINAL_CHUNK`].
    pub bytes: Vec<u8>,
}

/// A change of the client terminal's window size.
///
/// The seed's field list is partial after `columns`; the pixel sizes
/// complete the kernel's `struct winsize`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TerminalResize {
    /// The session to resize.
    pub session_id: SessionId,
    /// Rows of text.
    pub rows: u16,
    /// Columns of text.
    pub columns: u16,
    /// Width in pixels, zero when unknown.
    pub width_pixels: u16,
    /// Height in pixels, zero when unknown.
    pub height_pixels: u16,
}

/// A signal the client asks to deliver to the session's foreground process
/// group, for a client whose own terminal does not turn keys into bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TerminalSignal {
    /// The session to signal.
    pub session_id: SessionId,
    /// Which signal.
    pub signal: TerminalSignalKind,
}

/// The signals a client may forward. The set is closed: a client cannot
/// name an arbitrary signal number.
///
/// The seed's list is partial after `Quit`; `Terminate` is what a client
/// forwards when it is itself asked to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TerminalSignalKind {
    /// `SIGINT`, as from Ctrl-C.
    Interrupt,
    /// `SIGQUIT`, as from Ctrl-\.
    Quit,
    /// `SIGTERM`.
    Terminate,
    /// `SIGHUP`: the client's terminal went away, as a terminal's hangup
    /// tells the programs on it.
    Hangup,
}

/// The client is done with the session: the Host Coordinator hangs up the
/// PTY and finishes the session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SessionClose {
    /// The session to close.
    pub session_id: SessionId,
}

/// The developer's answer, typed at an [`EscalationPrompt`] in this
/// session's terminal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct EscalationAnswer {
    /// The session that was asked.
    pub session_id: SessionId,
    /// The request answered.
    pub request_id: RequestId,
    /// Approve or deny.
    pub decision: DeveloperDecisionKind,
}

/// Everything a client may send about its session's terminal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SessionTerminalEvent {
    /// Input bytes.
    Input(TerminalInput),
    /// A window-size change.
    Resize(TerminalResize),
    /// A forwarded signal.
    Signal(TerminalSignal),
    /// The end of the session from the client's side.
    Close(SessionClose),
    /// The developer's answer to a prompt.
    EscalationAnswer(EscalationAnswer),
}

impl SessionTerminalEvent {
    /// The session the event claims to be about.
    pub fn session_id(&self) -> SessionId {
        match self {
            Self::Input(e) => e.session_id,
            Self::Resize(e) => e.session_id,
            Self::Signal(e) => e.session_id,
            Self::Close(e) => e.session_id,
            Self::EscalationAnswer(e) => e.session_id,
        }
    }
}

impl WireRecord for SessionTerminalEvent {
    const NAME: &'static str = "SessionTerminalEvent";
    const MAX_ENCODED_LEN: usize = MAX_TERMINAL_CHUNK + 64;
}

/// Bytes the session's terminal produced: stdout and stderr merged, as a
/// terminal shows them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TerminalOutput {
    /// The session that produced the output.
    pub session_id: SessionId,
    /// The raw bytes, at most [`MAX_TERMINAL_CHUNK`].
    pub bytes: Vec<u8>,
}

/// The end of a session's process; the last message of a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SessionExit {
    /// The session that ended.
    pub session_id: SessionId,
    /// How it ended.
    pub outcome: SessionExitOutcome,
    /// The status the CLI exits with: the process's exit status for
    /// `Exited`, 128 plus the signal number for `Terminated`, and 255 for
    /// `Lost`.
    pub exit_code: u8,
}

/// How a session's process ended.
///
/// The seed's list is partial after `Terminated`; `Lost` covers a session
/// whose end could not be observed or proven.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SessionExitOutcome {
    /// The process exited with a status.
    Exited,
    /// The process was killed by a signal.
    Terminated,
    /// The process's end was not observed (the runtime went away, or its
    /// identity could not be proven); the session is over regardless.
    Lost,
    /// The Domain was taken down (`lazaret down`) while the session ran.
    DomainDown,
}

/// The most argument bytes, all elements together, of a request the
/// developer is asked about: more is not reviewable at a prompt, and such
/// a request is refused instead.
pub const MAX_PROMPT_ARGV_BYTES: usize = 16 * 1024;

/// The most elements of a request the developer is asked about.
pub const MAX_PROMPT_ARGS: usize = 512;

/// The most bytes of a prompt's `reason`.
pub const MAX_PROMPT_REASON: usize = 1024;

/// A request from inside the sandbox that waits for the developer's answer,
/// shown by the CLI of the requesting session only, outside the sandbox's
/// output.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EscalationPrompt {
    /// The session that asked, whose terminal shows the prompt.
    pub session_id: SessionId,
    /// The request.
    pub request_id: RequestId,
    /// The exact command: the executable's absolute path, then its
    /// arguments; at most [`MAX_PROMPT_ARGS`] elements and
    /// [`MAX_PROMPT_ARGV_BYTES`] bytes.
    pub command_argv: Vec<String>,
    /// When the sandbox made the request.
    pub requested_at: UnixTimeNs,
    /// When the request expires unanswered.
    pub expires_at: UnixTimeNs,
    /// Why no rule approved it, at most [`MAX_PROMPT_REASON`] bytes.
    pub reason: String,
    /// Why its executable cannot run on this host (it is missing, not a
    /// regular file, not executable, or where a host command may not
    /// be), at most [`MAX_PROMPT_REASON`] bytes. Such a request is still
    /// shown, so the sandbox cannot tell from its answer what is on the
    /// host, but it can only be denied.
    pub cannot_run: Option<String>,
}

/// A prompt that no longer waits for an answer: the request expired, or
/// the sandbox cancelled it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct EscalationSettled {
    /// The session that was asked.
    pub session_id: SessionId,
    /// The request.
    pub request_id: RequestId,
    /// How it ended.
    pub outcome: EscalationOutcome,
}

/// Everything the Host Coordinator may send about a session's terminal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SessionTerminalMessage {
    /// Output bytes.
    Output(TerminalOutput),
    /// The session's end.
    Exit(SessionExit),
    /// A request for the developer to decide.
    EscalationPrompt(EscalationPrompt),
    /// A prompt withdrawn before it was answered.
    EscalationSettled(EscalationSettled),
}

impl SessionTerminalMessage {
    /// The session the message is about.
    pub fn session_id(&self) -> SessionId {
        match self {
            Self::Output(m) => m.session_id,
            Self::Exit(m) => m.session_id,
            Self::EscalationPrompt(m) => m.session_id,
            Self::EscalationSettled(m) => m.session_id,
        }
    }
}

impl WireRecord for SessionTerminalMessage {
    const NAME: &'static str = "SessionTerminalMessage";
    const MAX_ENCODED_LEN: usize = MAX_TERMINAL_CHUNK + 64;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{self, EncodeError};
    use crate::test_support::{
        assert_rejects_bad_envelopes, assert_rejects_unknown_discriminant, round_trip,
    };

    const SESSION: SessionId = SessionId([0x5e; 16]);

    #[test]
    fn events_round_trip() {
        let events = [
            SessionTerminalEvent::Input(TerminalInput {
                session_id: SESSION,
                bytes: b"ls -la\r".to_vec(),
            }),
            SessionTerminalEvent::Resize(TerminalResize {
                session_id: SESSION,
                rows: 50,
                columns: 132,
                width_pixels: 0,
                height_pixels: 0,
            }),
            SessionTerminalEvent::Signal(TerminalSignal {
                session_id: SESSION,
                signal: TerminalSignalKind::Interrupt,
            }),
            SessionTerminalEvent::Close(SessionClose {
                session_id: SESSION,
            }),
            SessionTerminalEvent::EscalationAnswer(EscalationAnswer {
                session_id: SESSION,
                request_id: RequestId([0x7e; 16]),
                decision: DeveloperDecisionKind::Deny,
            }),
        ];
        for event in &events {
            round_trip(event);
            assert_eq!(event.session_id(), SESSION);
        }
        assert_rejects_bad_envelopes(&events[0]);
    }

    #[test]
    fn messages_round_trip() {
        let messages = [
            SessionTerminalMessage::Output(TerminalOutput {
                session_id: SESSION,
                bytes: vec![0x1b, b'[', b'0', b'm'],
            }),
            SessionTerminalMessage::Exit(SessionExit {
                session_id: SESSION,
                outcome: SessionExitOutcome::Terminated,
                exit_code: 130,
            }),
            SessionTerminalMessage::EscalationPrompt(EscalationPrompt {
                session_id: SESSION,
                request_id: RequestId([0x7e; 16]),
                command_argv: vec!["/usr/bin/gh".into(), "pr".into()],
                requested_at: UnixTimeNs(1),
                expires_at: UnixTimeNs(2),
                reason: "no rule names /usr/bin/gh".into(),
                cannot_run: None,
            }),
            SessionTerminalMessage::EscalationSettled(EscalationSettled {
                session_id: SESSION,
                request_id: RequestId([0x7e; 16]),
                outcome: EscalationOutcome::Expired,
            }),
        ];
        for message in &messages {
            round_trip(message);
            assert_eq!(message.session_id(), SESSION);
        }
        assert_rejects_bad_envelopes(&messages[1]);
    }

    #[test]
    fn unknown_signal_and_outcome_are_refused() {
        let signal = codec::encode(&SessionTerminalEvent::Signal(TerminalSignal {
            session_id: SESSION,
            signal: TerminalSignalKind::Quit,
        }))
        .unwrap();
        // version, event variant, 16 session bytes, signal variant.
        assert_eq!(signal.len(), 19);
        assert_rejects_unknown_discriminant::<SessionTerminalEvent>(signal.clone(), 18);
        assert_rejects_unknown_discriminant::<SessionTerminalEvent>(signal, 1);

        let exit = codec::encode(&SessionTerminalMessage::Exit(SessionExit {
            session_id: SESSION,
            outcome: SessionExitOutcome::Exited,
            exit_code: 0,
        }))
        .unwrap();
        assert_rejects_unknown_discriminant::<SessionTerminalMessage>(exit, 18);
    }

    #[test]
    fn oversize_output_does_not_encode() {
        let message = SessionTerminalMessage::Output(TerminalOutput {
            session_id: SESSION,
            bytes: vec![b'x'; MAX_TERMINAL_CHUNK + 64],
        });
        assert!(matches!(
            codec::encode(&message),
            Err(EncodeError::Oversize { .. })
        ));
        let fits = SessionTerminalMessage::Output(TerminalOutput {
            session_id: SESSION,
            bytes: vec![b'x'; MAX_TERMINAL_CHUNK],
        });
        round_trip(&fits);
    }

    #[test]
    fn the_largest_prompt_encodes() {
        // As many elements as a prompt may hold, each as long as the byte
        // bound allows, and the longest reason.
        let element = "x".repeat(MAX_PROMPT_ARGV_BYTES / MAX_PROMPT_ARGS);
        let prompt = SessionTerminalMessage::EscalationPrompt(EscalationPrompt {
            session_id: SESSION,
            request_id: RequestId([0x7e; 16]),
            command_argv: vec![element; MAX_PROMPT_ARGS],
            requested_at: UnixTimeNs(u64::MAX),
            expires_at: UnixTimeNs(u64::MAX),
            reason: "r".repeat(MAX_PROMPT_REASON),
            cannot_run: Some("c".repeat(MAX_PROMPT_REASON)),
        });
        round_trip(&prompt);
    }
}
