//! The opening of a Client Session on the Session Coordinator's TLS link:
//! what the CLI asks for before the terminal events and messages of
//! [`crate::terminal`] flow.
//!
//! This module owns those two messages. The Host Coordinator trusts a
//! request only from a peer whose client certificate its generation's CA
//! signed, on a socket whose peer uid is its own.

use serde::{Deserialize, Serialize};

use crate::codec::WireRecord;
use crate::failure::Failure;
use crate::ids::SessionId;

/// What the CLI asks for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenSession {
    /// The command to run; `None` for the sandbox's login shell.
    pub command: Option<Vec<String>>,
    /// Whether the CLI's standard input is a terminal: a PTY session, or a
    /// session over pipes with input forwarded until end of file.
    pub terminal: bool,
    /// Whether a developer can answer escalation prompts in this session:
    /// the CLI's standard input and output are both terminals. Without,
    /// only auto-approval rules apply.
    pub prompts: bool,
    /// The window's rows (terminal sessions).
    pub rows: u16,
    /// The window's columns (terminal sessions).
    pub columns: u16,
    /// The CLI's `TERM`, passed into terminal sessions.
    pub term: Option<String>,
    /// For a session without a terminal: the CLI attached its standard input
    /// and output to this request (`SCM_RIGHTS`), and the process uses them
    /// directly, its standard error merged into the output. No output then
    /// flows over the link; the exit still does.
    pub direct_stdio: bool,
}

impl WireRecord for OpenSession {
    const NAME: &'static str = "OpenSession";
}

/// The coordinator's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SessionOpened {
    /// The session runs; events and messages name this id.
    Opened {
        /// The session.
        session_id: SessionId,
    },
    /// The session could not start.
    Refused(SessionRefusal),
}

/// Why a session could not start; the CLI renders the sentence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum SessionRefusal {
    /// The Domain serves its most sessions at once.
    #[error("the Domain serves {max} sessions at once, its most; end one first")]
    Full {
        /// The bound.
        max: u32,
    },
    /// The Domain is going down.
    #[error("the Domain is going down")]
    GoingDown,
    /// The coordinator could not open the session's terminal.
    #[error("cannot open the session's terminal: {0}")]
    Terminal(Failure),
    /// The coordinator could not make the session's escalation mailbox.
    #[error("cannot make the session's escalation mailbox: {0}")]
    Mailbox(Failure),
    /// The Runtime Supervisor could not start the session's process.
    #[error("{0}")]
    Exec(Failure),
    /// The sandbox did not start the process within the bound.
    #[error(
        "the sandbox did not start the session's process within {seconds} s: the sandbox or \
         the Workspace Router does not answer (`lazaret status` names a stopped one)"
    )]
    NotStarted {
        /// The bound, in seconds.
        seconds: u64,
    },
}

impl WireRecord for SessionOpened {
    const NAME: &'static str = "SessionOpened";
}
