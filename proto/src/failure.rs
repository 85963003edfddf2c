//! The typed cause of a failure a role reports across its channel: the
//! Runtime Supervisor, Network Sidecar, Workspace Router and resolver each
//! send one in their `Failed` record, beside the step that failed.
//!
//! This module owns that shared shape and the one sentence rendered from it.
//! A role builds a [`Failure`] from its own error at the point it reports
//! (walking the error's chain: the operating system's errno, the path the
//! role was working on, a child program's output); the receiver renders the
//! sentence at its edge and may act on the typed fields. It trusts no bytes
//! it decodes: a program's output longer than its bound is a decode error.

use std::error::Error;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::common::HostPath;

/// An operating system error number, as `errno(3)` holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Errno(pub i32);

impl fmt::Display for Errno {
    /// As the standard library renders an OS error:
    /// `Permission denied (os error 13)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        std::io::Error::from_raw_os_error(self.0).fmt(f)
    }
}

impl From<rustix::io::Errno> for Errno {
    fn from(errno: rustix::io::Errno) -> Self {
        Self(errno.raw_os_error())
    }
}

impl From<&std::io::Error> for Errno {
    /// The error's errno; `EIO` for an error the kernel did not give.
    fn from(error: &std::io::Error) -> Self {
        Self(
            error
                .raw_os_error()
                .unwrap_or(rustix::io::Errno::IO.raw_os_error()),
        )
    }
}

/// What a child program (runsc, a helper) printed: free text from outside
/// the role, kept to its last [`ProgramOutput::MAX_LEN`] bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ProgramOutput(String);

impl ProgramOutput {
    /// The most a record carries of a program's output, in bytes.
    pub const MAX_LEN: usize = 4096;

    /// The last [`Self::MAX_LEN`] bytes of `text` (cut at a character
    /// boundary), trimmed of surrounding white space.
    pub fn tail(text: &str) -> Self {
        let text = text.trim();
        let mut start = text.len().saturating_sub(Self::MAX_LEN);
        while !text.is_char_boundary(start) {
            start += 1;
        }
        Self(text[start..].to_owned())
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for ProgramOutput {
    type Error = ProgramOutputTooLong;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        if text.len() > Self::MAX_LEN {
            return Err(ProgramOutputTooLong(text.len()));
        }
        Ok(Self(text))
    }
}

impl From<ProgramOutput> for String {
    fn from(output: ProgramOutput) -> Self {
        output.0
    }
}

/// A decoded program output over its bound.
#[derive(Debug, thiserror::Error)]
#[error("a program's output of {0} bytes is over the bound of {max}", max = ProgramOutput::MAX_LEN)]
pub struct ProgramOutputTooLong(usize);

/// What lies beneath the role's own account of a failure.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailureCause {
    /// The role's own check refused (a malformed request, a state that
    /// differs from the policy): nothing beneath its sentence.
    Check,
    /// A system call failed.
    Os {
        /// What the kernel said.
        errno: Errno,
        /// The host path the role was working on, when it names one.
        path: Option<HostPath>,
    },
    /// A child program exited with a failure.
    Program {
        /// The program's name, e.g. `runsc`.
        program: String,
        /// What it printed.
        output: ProgramOutput,
    },
}

impl fmt::Display for FailureCause {
    /// The cause's part of the sentence: nothing for the role's own check,
    /// the errno's text, or what the program printed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FailureCause::Check => Ok(()),
            FailureCause::Os { errno, .. } => errno.fmt(f),
            FailureCause::Program { output, .. } => f.write_str(output.as_str()),
        }
    }
}

/// How a role's classifier reads one link of its error's chain.
#[derive(Debug)]
pub enum Link {
    /// Nothing more than its sentence.
    Text,
    /// Its sentence, about this host path: an errno beneath it is about it.
    About(HostPath),
    /// The rest of the account: a peer's own failure this link carries,
    /// already prefixed with this link's words, or a child program's.
    Ends(Failure),
}

/// A failure as a role reports it: its own sentence for what it was doing
/// and the typed cause beneath. Rendered, it reads as the role's error
/// chain always read: `cannot write /x: Permission denied (os error 13)`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// What the role was doing, as its own errors render it (`: `-separated,
    /// outermost first), without the cause.
    pub context: String,
    /// What lies beneath.
    pub cause: FailureCause,
}

impl Failure {
    /// A failure of the role's own check, with nothing beneath `context`.
    pub fn check(context: impl fmt::Display) -> Self {
        Self {
            context: context.to_string(),
            cause: FailureCause::Check,
        }
    }

    /// `error` and its chain of sources, the innermost OS error (a
    /// [`std::io::Error`] or [`rustix::io::Errno`]) taken as its cause.
    pub fn of(error: &(dyn Error + 'static)) -> Self {
        Self::classified(error, |_| Link::Text)
    }

    /// As [`Failure::of`], `classify` reading each link of the chain first:
    /// a link may name the path an errno beneath it is about, or be the
    /// cause itself (a child program's failure).
    pub fn classified(
        error: &(dyn Error + 'static),
        classify: impl Fn(&(dyn Error + 'static)) -> Link,
    ) -> Self {
        let mut parts: Vec<String> = Vec::new();
        let mut path = None;
        let mut link = Some(error);
        while let Some(current) = link {
            if let Some(errno) = os_errno(current) {
                let cause = FailureCause::Os { errno, path };
                return Self::joined(parts, cause);
            }
            match classify(current) {
                Link::Text => parts.push(current.to_string()),
                Link::About(at) => {
                    parts.push(current.to_string());
                    path = Some(at);
                }
                Link::Ends(rest) => {
                    if !rest.context.is_empty() {
                        parts.push(rest.context);
                    }
                    return Self::joined(parts, rest.cause);
                }
            }
            link = current.source();
        }
        Self::joined(parts, FailureCause::Check)
    }

    /// A failed system call: `context`, then the errno's text.
    pub fn os(context: impl fmt::Display, errno: impl Into<Errno>, path: Option<HostPath>) -> Self {
        Self {
            context: context.to_string(),
            cause: FailureCause::Os {
                errno: errno.into(),
                path,
            },
        }
    }

    /// This failure as the cause of `outer`: `outer` comes first in the
    /// sentence, the cause stays.
    pub fn within(self, outer: impl fmt::Display) -> Self {
        let outer = outer.to_string();
        let context = match (outer.is_empty(), self.context.is_empty()) {
            (_, true) => outer,
            (true, false) => self.context,
            (false, false) => format!("{outer}: {}", self.context),
        };
        Self {
            context,
            cause: self.cause,
        }
    }

    fn joined(parts: Vec<String>, cause: FailureCause) -> Self {
        Self {
            context: parts.join(": "),
            cause,
        }
    }

    /// The errno beneath, when a system call failed.
    pub fn errno(&self) -> Option<Errno> {
        match self.cause {
            FailureCause::Os { errno, .. } => Some(errno),
            _ => None,
        }
    }
}

/// The errno `error` carries, when it is an OS error.
fn os_errno(error: &(dyn Error + 'static)) -> Option<Errno> {
    if let Some(io) = error.downcast_ref::<std::io::Error>() {
        return io.raw_os_error().map(Errno);
    }
    error
        .downcast_ref::<rustix::io::Errno>()
        .map(|errno| Errno(errno.raw_os_error()))
}

impl fmt::Display for Failure {
    /// The sentence: the context, then `: ` and the cause's part when it
    /// has one.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.cause, self.context.is_empty()) {
            (FailureCause::Check, _) => f.write_str(&self.context),
            (cause, true) => cause.fmt(f),
            (cause, false) => write!(f, "{}: {cause}", self.context),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn causes() -> Vec<FailureCause> {
        vec![
            FailureCause::Check,
            FailureCause::Os {
                errno: Errno(13),
                path: Some(HostPath::from("/run/x")),
            },
            FailureCause::Os {
                errno: Errno(2),
                path: None,
            },
            FailureCause::Program {
                program: "runsc".into(),
                output: ProgramOutput::tail("  creating container: boom\n"),
            },
        ]
    }

    #[test]
    fn every_cause_round_trips() {
        for cause in causes() {
            let failure = Failure {
                context: "cannot do it".into(),
                cause,
            };
            let bytes = postcard::to_allocvec(&failure).unwrap();
            let back: Failure = postcard::from_bytes(&bytes).unwrap();
            assert_eq!(back, failure);
        }
    }

    #[test]
    fn every_cause_renders_its_part_of_the_sentence() {
        let rendered: Vec<String> = causes()
            .into_iter()
            .map(|cause| {
                Failure {
                    context: "cannot do it".into(),
                    cause,
                }
                .to_string()
            })
            .collect();
        assert_eq!(rendered[0], "cannot do it");
        assert_eq!(rendered[1], "cannot do it: Permission denied (os error 13)");
        assert_eq!(
            rendered[2],
            "cannot do it: No such file or directory (os error 2)"
        );
        assert_eq!(rendered[3], "cannot do it: creating container: boom");
        assert_eq!(FailureCause::Check.to_string(), "");
        assert_eq!(
            Failure {
                context: String::new(),
                cause: FailureCause::Os {
                    errno: Errno(1),
                    path: None
                }
            }
            .to_string(),
            "Operation not permitted (os error 1)"
        );
    }

    #[derive(Debug, thiserror::Error)]
    #[error("cannot write {path}")]
    struct WriteError {
        path: String,
        #[source]
        source: std::io::Error,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("the bundle")]
    struct Outer(#[source] WriteError);

    #[test]
    fn an_error_chain_keeps_its_sentence_errno_and_path() {
        let error = Outer(WriteError {
            path: "/b/config.json".into(),
            source: std::io::Error::from_raw_os_error(28),
        });
        let failure = Failure::classified(&error, |link| match link.downcast_ref::<WriteError>() {
            Some(write) => Link::About(HostPath::from(write.path.as_str())),
            None => Link::Text,
        });
        assert_eq!(failure.to_string(), crate::error_chain(&error));
        assert_eq!(
            failure.cause,
            FailureCause::Os {
                errno: Errno(28),
                path: Some(HostPath::from("/b/config.json")),
            }
        );
        let rustix: &(dyn Error + 'static) = &rustix::io::Errno::ACCESS;
        assert_eq!(Failure::of(rustix).errno(), Some(Errno(13)));
        assert_eq!(Failure::of(rustix).to_string(), crate::error_chain(rustix));
    }

    #[derive(Debug, thiserror::Error)]
    #[error("the helper failed: {0}")]
    struct Relayed(Failure);

    #[test]
    fn a_peers_failure_carried_in_a_chain_keeps_its_cause() {
        let peer = Failure::os(
            "cannot write /proc/x",
            Errno(30),
            Some(HostPath::from("/proc/x")),
        );
        let error = Relayed(peer.clone());
        let failure = Failure::classified(&error, |link| match link.downcast_ref::<Relayed>() {
            Some(Relayed(inner)) => Link::Ends(inner.clone().within("the helper failed")),
            None => Link::Text,
        });
        assert_eq!(failure.to_string(), error.to_string());
        assert_eq!(failure.cause, peer.cause);
        assert_eq!(
            Failure::os("", Errno(30), None).within("outer").to_string(),
            "outer: Read-only file system (os error 30)"
        );
    }

    #[test]
    fn a_programs_output_is_bounded() {
        let long = "x".repeat(ProgramOutput::MAX_LEN + 10) + "end";
        let tail = ProgramOutput::tail(&long);
        assert_eq!(tail.as_str().len(), ProgramOutput::MAX_LEN);
        assert!(tail.as_str().ends_with("end"));
        let over = Failure {
            context: String::new(),
            cause: FailureCause::Program {
                program: "runsc".into(),
                output: ProgramOutput(long),
            },
        };
        let bytes = postcard::to_allocvec(&over).unwrap();
        assert!(postcard::from_bytes::<Failure>(&bytes).is_err());
    }
}
