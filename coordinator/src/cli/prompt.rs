//! The developer's side of an escalation prompt in `lazaret attach`: the
//! request shown in this terminal, outside the sandbox's output, and the
//! answer read from this terminal's keyboard.
//!
//! Owns what a prompt looks like and which keys answer it. While a prompt
//! waits, the sandbox's output is held back (so it cannot scroll the
//! prompt away or paint over it) and every key goes to the prompt, not
//! the sandbox. Keys typed before the prompt appeared are discarded, and
//! only `y` or `yes` followed by Enter approves: a word typed into the
//! shell as the prompt arrives (`yarn`) denies. The command is shown with
//! every control or invisible character escaped, so what is approved is
//! what is seen. Trusts the Host Coordinator for what it shows; nothing
//! the sandbox prints.

use std::io::Write;

use lazaret_proto::common::UnixTimeNs;
use lazaret_proto::ids::{RequestId, SessionId};
use lazaret_proto::mailbox::{DeveloperDecisionKind, EscalationOutcome};
use lazaret_proto::terminal::{EscalationAnswer, EscalationPrompt, EscalationSettled};

use crate::escalation::classify::shown;

/// Output held back while a prompt waits; past this the CLI stops reading
/// the connection until the prompt is answered.
pub const MAX_HELD: usize = 4 * 1024 * 1024;

/// The longest answer kept.
const MAX_LINE: usize = 16;

/// How long past its expiry a prompt stays up when the Host Coordinator
/// does not take it down: then this side does.
const EXPIRY_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// What a prompt is drawn after, whatever state the sandbox's output left
/// the terminal in: cancel an escape sequence in progress (CAN), end a
/// string one (ST: an OSC title or DCS that would swallow the text), the
/// default character set (SI), default colours and attributes, a visible
/// cursor.
const TERMINAL_RESET: &str = "\x18\x1b\\\x0f\x1b[0m\x1b[?25h";

/// A prompt waiting for its answer, and the output held back meanwhile.
#[derive(Debug, Default)]
pub struct Prompter {
    waiting: Option<RequestId>,
    /// Whether the waiting prompt's command cannot run: any answer denies.
    deny_only: bool,
    /// When the waiting prompt expires.
    expires_at: Option<UnixTimeNs>,
    line: Vec<u8>,
    held: Vec<u8>,
}

/// `HH:MM:SS UTC` of an instant.
fn clock(at: UnixTimeNs) -> String {
    let day = at.as_secs() % 86_400;
    format!(
        "{:02}:{:02}:{:02} UTC",
        day / 3600,
        day % 3600 / 60,
        day % 60
    )
}

impl Prompter {
    /// Whether a prompt waits: keys are its, output is held.
    pub fn waiting(&self) -> bool {
        self.waiting.is_some()
    }

    /// Whether the held output reached its bound.
    pub fn full(&self) -> bool {
        self.held.len() >= MAX_HELD
    }

    /// Holds `bytes` of the sandbox's output back until the prompt ends.
    pub fn hold(&mut self, bytes: &[u8]) {
        self.held.extend_from_slice(bytes);
    }

    /// Shows `prompt` on `out` (the terminal, in raw mode), after the
    /// keys typed so far on `keyboard` are discarded.
    pub fn show(
        &mut self,
        out: &mut dyn Write,
        keyboard: std::os::fd::BorrowedFd<'_>,
        prompt: &EscalationPrompt,
    ) -> std::io::Result<()> {
        let _ = rustix::termios::tcflush(keyboard, rustix::termios::QueueSelector::IFlush);
        self.waiting = Some(prompt.request_id);
        self.expires_at = Some(prompt.expires_at);
        self.line.clear();
        self.deny_only = prompt.cannot_run.is_some();
        let wait = prompt.expires_at.since(UnixTimeNs::now()).as_secs();
        // A command that cannot run is still asked about (the sandbox
        // learns nothing of the host's files from the answer); only here
        // is it said why, and only a denial is possible.
        let (cannot_run, question) = match &prompt.cannot_run {
            Some(why) => (
                format!("\x20 cannot   run it: {}\r\n", crate::cli::printable(why)),
                "It cannot run on this host; press Enter to deny it: ",
            ),
            None => (
                String::new(),
                "Run it on the host? Type y and Enter to approve; anything else denies: ",
            ),
        };
        let text = format!(
            "{TERMINAL_RESET}\r\n\
             ── lazaret: the sandbox asks to run a command on this host ──\r\n\
             \x20 session  {session}, asked at {asked}\r\n\
             \x20 command  {command}\r\n\
             \x20 why      {reason}\r\n\
             {cannot_run}\
             \x20 expires  in {wait} s\r\n\
             {question}",
            session = &prompt.session_id.to_hex()[..8],
            asked = clock(prompt.requested_at),
            command = shown(&prompt.command_argv),
            reason = crate::cli::printable(&prompt.reason),
        );
        out.write_all(text.as_bytes())?;
        out.flush()
    }

    /// Takes typed `bytes` while a prompt waits: the answer once Enter (or
    /// Ctrl-C, Ctrl-D: deny) ends the line. Keys after the answer in the
    /// same read are dropped.
    pub fn key(
        &mut self,
        out: &mut dyn Write,
        session_id: SessionId,
        bytes: &[u8],
    ) -> std::io::Result<Option<EscalationAnswer>> {
        let Some(request_id) = self.waiting else {
            return Ok(None);
        };
        for &byte in bytes {
            match byte {
                b'\r' | b'\n' | 0x03 | 0x04 => {
                    let line = String::from_utf8_lossy(&self.line)
                        .trim()
                        .to_ascii_lowercase();
                    let approved = !self.deny_only
                        && byte != 0x03
                        && byte != 0x04
                        && (line == "y" || line == "yes");
                    let decision = if approved {
                        DeveloperDecisionKind::Approve
                    } else {
                        DeveloperDecisionKind::Deny
                    };
                    let said = if approved {
                        "\r\n  approved: running it on the host\r\n"
                    } else {
                        "\r\n  denied\r\n"
                    };
                    out.write_all(said.as_bytes())?;
                    self.end(out)?;
                    return Ok(Some(EscalationAnswer {
                        session_id,
                        request_id,
                        decision,
                    }));
                }
                0x7f | 0x08 if self.line.pop().is_some() => {
                    out.write_all(b"\x08 \x08")?;
                }
                b' '..=b'~' if self.line.len() < MAX_LINE => {
                    self.line.push(byte);
                    out.write_all(&[byte])?;
                }
                _ => {}
            }
        }
        out.flush()?;
        Ok(None)
    }

    /// The request behind the waiting prompt ended without an answer.
    pub fn settled(
        &mut self,
        out: &mut dyn Write,
        settled: &EscalationSettled,
    ) -> std::io::Result<()> {
        if self.waiting != Some(settled.request_id) {
            return Ok(());
        }
        let why = match settled.outcome {
            EscalationOutcome::Expired => "it expired",
            EscalationOutcome::Cancelled => "the sandbox cancelled it",
            _ => "it ended",
        };
        out.write_all(format!("\r\n  no answer needed: {why}\r\n").as_bytes())?;
        self.end(out)
    }

    /// How long until the waiting prompt is taken down here, if the Host
    /// Coordinator has not taken it down by then.
    pub fn time_left(&self) -> Option<std::time::Duration> {
        let expires_at = self.expires_at?;
        Some(expires_at.after(EXPIRY_GRACE).since(UnixTimeNs::now()))
    }

    /// Takes the waiting prompt down if it is past its expiry and grace.
    pub fn expire(&mut self, out: &mut dyn Write) -> std::io::Result<()> {
        if self.time_left() != Some(std::time::Duration::ZERO) {
            return Ok(());
        }
        out.write_all(b"\r\n  no answer needed: it expired\r\n")?;
        self.end(out)
    }

    /// The session ended while a prompt waited: the prompt goes, and the
    /// output held back is written.
    pub fn abandon(&mut self, out: &mut dyn Write) -> std::io::Result<()> {
        if self.waiting.is_none() {
            return Ok(());
        }
        out.write_all(b"\r\n  no answer needed: the session ended\r\n")?;
        self.end(out)
    }

    /// Ends the prompt and writes the output held back meanwhile.
    fn end(&mut self, out: &mut dyn Write) -> std::io::Result<()> {
        self.waiting = None;
        self.deny_only = false;
        self.expires_at = None;
        self.line.clear();
        let held = std::mem::take(&mut self.held);
        out.write_all(&held)?;
        out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt() -> EscalationPrompt {
        EscalationPrompt {
            session_id: SessionId([0xab; 16]),
            request_id: RequestId([1; 16]),
            command_argv: vec!["/usr/bin/gh".into(), "pr\u{1b}[8m".into()],
            requested_at: UnixTimeNs(3_661 * 1_000_000_000),
            expires_at: UnixTimeNs::now().after(std::time::Duration::from_secs(60)),
            reason: "no rule\u{7}".into(),
            cannot_run: None,
        }
    }

    fn shown_to(p: &mut Prompter) -> String {
        let mut out = Vec::new();
        let null = std::fs::File::open("/dev/null").unwrap();
        p.show(&mut out, std::os::fd::AsFd::as_fd(&null), &prompt())
            .unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn the_prompt_shows_the_command_escaped() {
        let mut p = Prompter::default();
        let text = shown_to(&mut p);
        assert!(text.contains("/usr/bin/gh \"pr\\u{1b}[8m\""), "{text}");
        assert!(text.contains("01:01:01 UTC"), "{text}");
        assert!(text.contains("abababab"), "{text}");
        assert!(!text.contains('\u{7}'), "{text}");
        assert!(p.waiting());
    }

    #[test]
    fn only_y_and_enter_approve() {
        let session = SessionId([0xab; 16]);
        for (keys, approved) in [
            (&b"y\r"[..], true),
            (b"YES\r", true),
            (b"yx\x7f\r", true),
            (b"yarn\r", false),
            (b"\r", false),
            (b"n\r", false),
            (b"y\x03", false),
        ] {
            let mut p = Prompter::default();
            shown_to(&mut p);
            p.hold(b"held output");
            let mut out = Vec::new();
            let answer = p.key(&mut out, session, keys).unwrap().expect("answered");
            assert_eq!(
                answer.decision == DeveloperDecisionKind::Approve,
                approved,
                "{keys:?}"
            );
            assert!(!p.waiting());
            assert!(String::from_utf8_lossy(&out).ends_with("held output"));
        }
        let mut p = Prompter::default();
        shown_to(&mut p);
        assert!(p.key(&mut Vec::new(), session, b"y").unwrap().is_none());
    }

    #[test]
    fn a_command_that_cannot_run_can_only_be_denied() {
        let mut p = Prompter::default();
        let mut out = Vec::new();
        let null = std::fs::File::open("/dev/null").unwrap();
        let prompt = EscalationPrompt {
            cannot_run: Some("/home/u/.ssh/id_ed25519 is not executable\u{1b}[2J".into()),
            ..prompt()
        };
        p.show(&mut out, std::os::fd::AsFd::as_fd(&null), &prompt)
            .unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("cannot   run it: /home/u/.ssh/id_ed25519 is not executable"),
            "{text}"
        );
        assert!(text.contains("press Enter to deny"), "{text}");
        // What the host says is escaped like the rest of the prompt.
        assert!(text.contains("not executable\\u{1b}[2J"), "{text}");
        let answer = p
            .key(&mut Vec::new(), SessionId([0xab; 16]), b"y\r")
            .unwrap()
            .expect("answered");
        assert_eq!(answer.decision, DeveloperDecisionKind::Deny);
        // The next prompt is asked normally.
        shown_to(&mut p);
        let answer = p
            .key(&mut Vec::new(), SessionId([0xab; 16]), b"y\r")
            .unwrap()
            .expect("answered");
        assert_eq!(answer.decision, DeveloperDecisionKind::Approve);
    }

    #[test]
    fn a_settled_prompt_releases_the_output() {
        let mut p = Prompter::default();
        shown_to(&mut p);
        p.hold(b"later");
        let mut out = Vec::new();
        let other = EscalationSettled {
            session_id: SessionId([0xab; 16]),
            request_id: RequestId([9; 16]),
            outcome: EscalationOutcome::Expired,
        };
        p.settled(&mut out, &other).unwrap();
        assert!(p.waiting());
        p.settled(
            &mut out,
            &EscalationSettled {
                request_id: RequestId([1; 16]),
                ..other
            },
        )
        .unwrap();
        assert!(!p.waiting());
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("expired") && text.ends_with("later"),
            "{text}"
        );
    }
}
