//! The developer's side of an escalation prompt in `lazaret attach`: the
//! request shown in this terminal, outside the sandbox's output, and the
//! answer read from this terminal's keyboard.
//!
//! Owns what a prompt looks like and which keys answer it. A prompt is
//! drawn on a screen of its own, cleared, after every setting that can
//! hide or move text was reset ([`Screen::prompt_frame`]), and taken away
//! with the sandbox's settings and screen put back. The Host Coordinator
//! sends no output while a prompt waits, and what reaches this side
//! anyway is held back until the prompt ends, so nothing the sandbox
//! prints lands on it. Every key goes to the prompt, none to the sandbox;
//! keys typed before it appeared are discarded, and only `y` or `yes`
//! followed by Enter approves, and only while the whole request is on the
//! screen. The request is shown in printable ASCII alone, every other
//! character escaped, so what is approved is what is seen. Trusts the Host
//! Coordinator for what it shows; nothing the sandbox prints.

use std::io::Write;

use lazaret_proto::common::UnixTimeNs;
use lazaret_proto::ids::{RequestId, SessionId};
use lazaret_proto::mailbox::{DeveloperDecisionKind, EscalationOutcome};
use lazaret_proto::terminal::{EscalationAnswer, EscalationPrompt, EscalationSettled};

use super::screen::{PromptFrame, Screen};
use crate::escalation::classify::shown_ascii;

/// Output held back while a prompt waits; past this the CLI stops reading
/// the connection until the prompt is answered.
pub const MAX_HELD: usize = 4 * 1024 * 1024;

/// The longest answer kept.
const MAX_LINE: usize = 16;

/// How long past its expiry a prompt stays up when the Host Coordinator
/// does not take it down: then this side does.
const EXPIRY_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// The labels' column: `  command  ` and the like.
const LABEL_WIDTH: usize = 11;

/// The prompt's first line.
const HEADER: &str = "-- lazaret: the sandbox asks to run a command on this host --";

/// A window's size: rows and columns.
pub type Size = (u16, u16);

/// A prompt on the screen.
#[derive(Debug)]
struct Waiting {
    prompt: EscalationPrompt,
    frame: PromptFrame,
    /// Whether the whole request fits the window, as last drawn: only then
    /// may it be approved.
    whole: bool,
}

/// Where the keyboard's bytes are: in text, or in an escape sequence, which
/// is dropped whole: one a key sent (an arrow, a function key, a focus
/// report), or a terminal's reply to a query the sandbox wrote before the
/// prompt (a cursor position, a colour, a title, a setting: control
/// sequences and strings, with 7-bit or 8-bit introducers), none of which
/// may become a typed answer.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Keys {
    #[default]
    Text,
    /// After ESC.
    Escape,
    /// In a control sequence (CSI or SS3), until its final byte.
    Sequence,
    /// In a string (OSC, DCS, APC, PM, SOS), until BEL or ST.
    String,
    /// In a string, after ESC: `\` ends it.
    StringEscape,
}

impl Keys {
    /// The state after `byte`, and whether `byte` is typed text.
    fn next(self, byte: u8) -> (Keys, bool) {
        match (self, byte) {
            (Keys::Text, 0x1b) => (Keys::Escape, false),
            // 8-bit CSI and SS3, and DCS, SOS, OSC, PM and APC.
            (Keys::Text, 0x9b | 0x8f) => (Keys::Sequence, false),
            (Keys::Text, 0x90 | 0x98 | 0x9d | 0x9e | 0x9f) => (Keys::String, false),
            (Keys::Text, _) => (Keys::Text, true),
            (Keys::Escape, b'[' | b'O') => (Keys::Sequence, false),
            (Keys::Escape, b']' | b'P' | b'_' | b'^' | b'X') => (Keys::String, false),
            (Keys::Escape, _) => (Keys::Text, false),
            (Keys::Sequence, 0x40..=0x7e) => (Keys::Text, false),
            (Keys::Sequence, _) => (Keys::Sequence, false),
            (Keys::String, 0x07 | 0x9c) => (Keys::Text, false),
            (Keys::String, 0x1b) => (Keys::StringEscape, false),
            (Keys::String, _) => (Keys::String, false),
            (Keys::StringEscape, b'\\') => (Keys::Text, false),
            (Keys::StringEscape, _) => (Keys::String, false),
        }
    }
}

/// A prompt waiting for its answer, and the output held back meanwhile.
#[derive(Debug, Default)]
pub struct Prompter {
    waiting: Option<Waiting>,
    line: Vec<u8>,
    keys: Keys,
    held: Vec<u8>,
    /// A prompt ended over a program's own screen, which it must draw
    /// again.
    redraw: bool,
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

/// `text` with every character outside printable ASCII escaped.
fn ascii(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            ' '..='~' => out.push(c),
            c if c.is_ascii() => out.extend(c.escape_default()),
            c => out.extend(c.escape_unicode()),
        }
    }
    out
}

/// Appends `text` to `lines`, cut into pieces that fit `width` columns,
/// the first after `first`, the rest after `rest` (both dropped when the
/// window is too narrow for them).
fn wrap(lines: &mut Vec<String>, first: &str, rest: &str, text: &str, width: usize) {
    let indent = first.len().max(rest.len());
    let (first, rest) = if indent + 8 <= width {
        (first, rest)
    } else {
        ("", "")
    };
    let chars: Vec<char> = text.chars().collect();
    let mut at = 0;
    let mut prefix = first;
    loop {
        let room = width.saturating_sub(prefix.len()).max(1);
        let end = (at + room).min(chars.len());
        lines.push(format!(
            "{prefix}{}",
            chars[at..end].iter().collect::<String>()
        ));
        at = end;
        prefix = rest;
        if at >= chars.len() {
            break;
        }
    }
}

/// The prompt's lines for a window of `size`, and whether the whole
/// request is among them.
fn render(prompt: &EscalationPrompt, now: UnixTimeNs, size: Size) -> (Vec<String>, bool) {
    let (rows, columns) = (usize::from(size.0), usize::from(size.1));
    // The last column stays free, so no line wraps by itself.
    let width = columns.saturating_sub(1).max(1);
    let continued = " ".repeat(LABEL_WIDTH);
    let mut lines = Vec::new();
    wrap(&mut lines, "", "", HEADER, width);
    let field = |lines: &mut Vec<String>, label: &str, text: &str| {
        wrap(lines, &format!("  {label:<7}  "), &continued, text, width);
    };
    let session = format!(
        "{}, asked at {}",
        &prompt.session_id.to_hex()[..8],
        clock(prompt.requested_at)
    );
    field(&mut lines, "session", &session);
    field(&mut lines, "command", &shown_ascii(&prompt.command_argv));
    field(&mut lines, "why", &ascii(&prompt.reason));
    // A command that cannot run is still asked about (so the sandbox
    // learns nothing of the host's files from the answer); only here is
    // it said why, and only a denial is possible.
    if let Some(why) = &prompt.cannot_run {
        field(&mut lines, "cannot", &format!("run it: {}", ascii(why)));
    }
    let wait = prompt.expires_at.since(now).as_secs();
    field(&mut lines, "expires", &format!("in {wait} s"));
    let question = match prompt.cannot_run {
        Some(_) => "It cannot run on this host; press Enter to deny it.",
        None => "Run it on the host? Type y and Enter to approve; anything else denies.",
    };
    wrap(&mut lines, "", "", question, width);
    lines.push("> ".into());
    if lines.len() <= rows {
        return (lines, true);
    }
    let needed = lines.len();
    let mut short = Vec::new();
    wrap(&mut short, "", "", HEADER, width);
    wrap(
        &mut short,
        "  ",
        "  ",
        &format!(
            "The request does not fit this window: it needs {needed} rows of {columns} \
             columns, the window has {rows}. Make the window larger to review it."
        ),
        width,
    );
    wrap(&mut short, "", "", "Enter denies it.", width);
    short.push("> ".into());
    (short, false)
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

    /// Whether a prompt just ended over a program's own screen, which it
    /// must now draw again (once).
    pub fn take_redraw(&mut self) -> bool {
        std::mem::take(&mut self.redraw)
    }

    /// Shows `prompt` on `out` (the terminal, in raw mode, of `size`), over
    /// whatever `screen` says the sandbox left there, after the keys typed
    /// so far on `keyboard` are discarded. A prompt already waiting stays.
    pub fn show(
        &mut self,
        out: &mut dyn Write,
        keyboard: std::os::fd::BorrowedFd<'_>,
        prompt: &EscalationPrompt,
        screen: &Screen,
        size: Size,
    ) -> std::io::Result<()> {
        if self.waiting.is_some() {
            return Ok(());
        }
        let _ = rustix::termios::tcflush(keyboard, rustix::termios::QueueSelector::IFlush);
        self.line.clear();
        self.keys = Keys::Text;
        let frame = screen.prompt_frame();
        out.write_all(&frame.begin)?;
        self.waiting = Some(Waiting {
            prompt: prompt.clone(),
            frame,
            whole: false,
        });
        self.draw(out, size)
    }

    /// Draws the waiting prompt again for a window now of `size`.
    pub fn resized(&mut self, out: &mut dyn Write, size: Size) -> std::io::Result<()> {
        if self.waiting.is_none() {
            return Ok(());
        }
        out.write_all(b"\x1b[0m\x1b[H\x1b[2J")?;
        self.draw(out, size)
    }

    /// Draws the waiting prompt from the top of its cleared screen, with
    /// the answer typed so far.
    fn draw(&mut self, out: &mut dyn Write, size: Size) -> std::io::Result<()> {
        let Some(waiting) = self.waiting.as_mut() else {
            return Ok(());
        };
        let (lines, whole) = render(&waiting.prompt, UnixTimeNs::now(), size);
        waiting.whole = whole;
        let mut text = lines.join("\r\n").into_bytes();
        text.extend_from_slice(&self.line);
        out.write_all(&text)?;
        out.flush()
    }

    /// Takes typed `bytes` while a prompt waits: the answer once Enter (or
    /// Ctrl-C, Ctrl-D: deny) ends the line. Keys after the answer in the
    /// same read are dropped, and so are the escape sequences keys send.
    pub fn key(
        &mut self,
        out: &mut dyn Write,
        session_id: SessionId,
        bytes: &[u8],
        screen: &mut Screen,
    ) -> std::io::Result<Option<EscalationAnswer>> {
        let Some(waiting) = self.waiting.as_ref() else {
            return Ok(None);
        };
        let request_id = waiting.prompt.request_id;
        let whole = waiting.whole;
        let can_run = waiting.prompt.cannot_run.is_none();
        for &byte in bytes {
            let (keys, typed) = self.keys.next(byte);
            self.keys = keys;
            if !typed {
                continue;
            }
            match byte {
                b'\r' | b'\n' | 0x03 | 0x04 => {
                    let line = String::from_utf8_lossy(&self.line)
                        .trim()
                        .to_ascii_lowercase();
                    let approved = whole
                        && can_run
                        && byte != 0x03
                        && byte != 0x04
                        && (line == "y" || line == "yes");
                    let decision = if approved {
                        DeveloperDecisionKind::Approve
                    } else {
                        DeveloperDecisionKind::Deny
                    };
                    self.end(out, screen)?;
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

    /// Denies the waiting prompt, whatever was typed: nobody is left to
    /// answer it (this side is ending its session).
    pub fn deny(
        &mut self,
        out: &mut dyn Write,
        session_id: SessionId,
        screen: &mut Screen,
    ) -> std::io::Result<Option<EscalationAnswer>> {
        let Some(request_id) = self.request() else {
            return Ok(None);
        };
        self.end(out, screen)?;
        Ok(Some(EscalationAnswer {
            session_id,
            request_id,
            decision: DeveloperDecisionKind::Deny,
        }))
    }

    /// The request behind the waiting prompt ended without an answer.
    pub fn settled(
        &mut self,
        out: &mut dyn Write,
        settled: &EscalationSettled,
        screen: &mut Screen,
    ) -> std::io::Result<()> {
        if self.request() != Some(settled.request_id) {
            return Ok(());
        }
        let why = match settled.outcome {
            EscalationOutcome::Expired => "it expired",
            EscalationOutcome::Cancelled => "the sandbox cancelled it",
            _ => "it ended",
        };
        self.end(out, screen)?;
        note(out, why)
    }

    fn request(&self) -> Option<RequestId> {
        self.waiting.as_ref().map(|w| w.prompt.request_id)
    }

    /// How long until the waiting prompt is taken down here, if the Host
    /// Coordinator has not taken it down by then.
    pub fn time_left(&self) -> Option<std::time::Duration> {
        let expires_at = self.waiting.as_ref()?.prompt.expires_at;
        Some(expires_at.after(EXPIRY_GRACE).since(UnixTimeNs::now()))
    }

    /// Takes the waiting prompt down if it is past its expiry and grace.
    pub fn expire(&mut self, out: &mut dyn Write, screen: &mut Screen) -> std::io::Result<()> {
        if self.time_left() != Some(std::time::Duration::ZERO) {
            return Ok(());
        }
        self.end(out, screen)?;
        note(out, "it expired")
    }

    /// The session ended while a prompt waited: the prompt goes, and the
    /// output held back is written.
    pub fn abandon(&mut self, out: &mut dyn Write, screen: &mut Screen) -> std::io::Result<()> {
        if self.waiting.is_none() {
            return Ok(());
        }
        self.end(out, screen)
    }

    /// Ends the prompt: its screen goes, the sandbox's settings come back,
    /// and the output held back meanwhile is written.
    fn end(&mut self, out: &mut dyn Write, screen: &mut Screen) -> std::io::Result<()> {
        let Some(waiting) = self.waiting.take() else {
            return Ok(());
        };
        self.line.clear();
        out.write_all(&waiting.frame.end)?;
        self.redraw |= waiting.frame.redraw;
        let held = std::mem::take(&mut self.held);
        screen.observe(&held);
        out.write_all(&held)?;
        out.flush()
    }
}

/// Says on standard error why a prompt went without an answer: the
/// prompt's screen is gone, and the developer may have looked away.
fn note(out: &mut dyn Write, why: &str) -> std::io::Result<()> {
    let _ = out.flush();
    let mut stderr = std::io::stderr().lock();
    let _ = write!(
        stderr,
        "\r\nlazaret: no answer needed: {why} (a host command the sandbox asked for)\r\n"
    );
    stderr.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt() -> EscalationPrompt {
        EscalationPrompt {
            session_id: SessionId([0xab; 16]),
            request_id: RequestId([1; 16]),
            command_argv: vec!["/usr/bin/gh".into(), "pr\u{1b}[8m".into(), "café".into()],
            requested_at: UnixTimeNs(3_661 * 1_000_000_000),
            expires_at: UnixTimeNs::now().after(std::time::Duration::from_secs(60)),
            reason: "no rule\u{7}\u{202e}".into(),
            cannot_run: None,
        }
    }

    fn shown_to(p: &mut Prompter, size: Size) -> String {
        let mut out = Vec::new();
        let null = std::fs::File::open("/dev/null").unwrap();
        p.show(
            &mut out,
            std::os::fd::AsFd::as_fd(&null),
            &prompt(),
            &Screen::default(),
            size,
        )
        .unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn the_prompt_shows_the_command_in_ascii_alone() {
        let mut p = Prompter::default();
        let text = shown_to(&mut p, (40, 120));
        assert!(
            text.contains(r#"/usr/bin/gh "pr\u{1b}[8m" "caf\u{e9}""#),
            "{text}"
        );
        assert!(text.contains(r"no rule\u{7}\u{202e}"), "{text}");
        assert!(text.contains("01:01:01 UTC"), "{text}");
        assert!(text.contains("abababab"), "{text}");
        // Only the frame's control sequences, and ASCII.
        let drawn = &text[text.rfind("\x1b[2J").unwrap() + 4..];
        assert!(
            drawn
                .bytes()
                .all(|b| b == b'\r' || b == b'\n' || (b' '..=b'~').contains(&b)),
            "{drawn:?}"
        );
        assert!(p.waiting());
    }

    #[test]
    fn every_line_fits_the_window() {
        let mut p = Prompter::default();
        let text = shown_to(&mut p, (40, 30));
        let drawn = &text[text.rfind("\x1b[2J").unwrap() + 4..];
        for line in drawn.split("\r\n") {
            assert!(line.len() < 30, "{line:?}");
        }
        assert!(drawn.contains(r"\u{e9}"), "{drawn}");
    }

    #[test]
    fn only_y_and_enter_approve() {
        let session = SessionId([0xab; 16]);
        for (keys, approved) in [
            (&b"y\r"[..], true),
            (b"YES\r", true),
            (b"yx\x7f\r", true),
            (b"\x1b[Ay\x1b[I\r", true),
            // Replies to queries: a colour, a title with a `y` in it, a
            // setting, a position, 8-bit ones; none is typed.
            (b"\x1b]11;rgb:0000/0000/0000\x1b\\y\r", true),
            (b"\x1b]lyes\x07\r", false),
            (b"\x1bP1$r0;1m\x1b\\\r", false),
            (b"\x1b[12;1R\x9d10;y\x9c\r", false),
            (b"yarn\r", false),
            (b"\r", false),
            (b"n\r", false),
            (b"y\x03", false),
        ] {
            let mut p = Prompter::default();
            shown_to(&mut p, (40, 120));
            p.hold(b"held output");
            let mut out = Vec::new();
            let mut screen = Screen::default();
            let answer = p
                .key(&mut out, session, keys, &mut screen)
                .unwrap()
                .expect("answered");
            assert_eq!(
                answer.decision == DeveloperDecisionKind::Approve,
                approved,
                "{keys:?}"
            );
            assert!(!p.waiting());
            let text = String::from_utf8_lossy(&out);
            assert!(text.ends_with("\x1b[?1049lheld output"), "{text:?}");
        }
        let mut p = Prompter::default();
        shown_to(&mut p, (40, 120));
        assert!(
            p.key(&mut Vec::new(), session, b"y", &mut Screen::default())
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn a_request_too_long_for_the_window_cannot_be_approved() {
        let session = SessionId([0xab; 16]);
        let mut p = Prompter::default();
        let text = shown_to(&mut p, (8, 40));
        assert!(text.contains("does not fit this window"), "{text}");
        assert!(!text.contains("/usr/bin/gh"), "{text}");
        let answer = p
            .key(&mut Vec::new(), session, b"y\r", &mut Screen::default())
            .unwrap()
            .expect("answered");
        assert_eq!(answer.decision, DeveloperDecisionKind::Deny);

        // Made larger, the same request is shown whole and may be approved.
        let mut p = Prompter::default();
        shown_to(&mut p, (8, 40));
        let mut out = Vec::new();
        p.resized(&mut out, (40, 120)).unwrap();
        assert!(String::from_utf8_lossy(&out).contains("/usr/bin/gh"));
        let answer = p
            .key(&mut Vec::new(), session, b"y\r", &mut Screen::default())
            .unwrap()
            .expect("answered");
        assert_eq!(answer.decision, DeveloperDecisionKind::Approve);
    }

    #[test]
    fn a_command_that_cannot_run_can_only_be_denied() {
        let session = SessionId([0xab; 16]);
        let mut p = Prompter::default();
        let mut out = Vec::new();
        let null = std::fs::File::open("/dev/null").unwrap();
        let prompt = EscalationPrompt {
            cannot_run: Some("/home/u/.ssh/id_ed25519 is not executable\u{1b}[2J".into()),
            ..prompt()
        };
        let mut screen = Screen::default();
        p.show(
            &mut out,
            std::os::fd::AsFd::as_fd(&null),
            &prompt,
            &screen,
            (40, 120),
        )
        .unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("cannot   run it: /home/u/.ssh/id_ed25519 is not executable"),
            "{text}"
        );
        assert!(text.contains("press Enter to deny"), "{text}");
        // What the host says is escaped like the rest of the prompt.
        assert!(text.contains(r"not executable\u{1b}[2J"), "{text}");
        let answer = p
            .key(&mut Vec::new(), session, b"y\r", &mut screen)
            .unwrap()
            .expect("answered");
        assert_eq!(answer.decision, DeveloperDecisionKind::Deny);
        // The next prompt is asked normally.
        shown_to(&mut p, (40, 120));
        let answer = p
            .key(&mut Vec::new(), session, b"y\r", &mut screen)
            .unwrap()
            .expect("answered");
        assert_eq!(answer.decision, DeveloperDecisionKind::Approve);
    }

    #[test]
    fn a_prompt_denied_for_its_ending_session_is_denied_mid_sequence_too() {
        let session = SessionId([0xab; 16]);
        let mut p = Prompter::default();
        shown_to(&mut p, (40, 120));
        let mut screen = Screen::default();
        // `y` typed, then the start of a terminal's reply.
        assert!(
            p.key(&mut Vec::new(), session, b"y\x1b]11;", &mut screen)
                .unwrap()
                .is_none()
        );
        p.hold(b"later");
        let mut out = Vec::new();
        let answer = p
            .deny(&mut out, session, &mut screen)
            .unwrap()
            .expect("denied");
        assert_eq!(answer.decision, DeveloperDecisionKind::Deny);
        assert!(!p.waiting());
        assert!(String::from_utf8_lossy(&out).ends_with("later"));
        assert!(p.deny(&mut out, session, &mut screen).unwrap().is_none());
    }

    #[test]
    fn a_settled_prompt_releases_the_output() {
        let mut p = Prompter::default();
        shown_to(&mut p, (40, 120));
        p.hold(b"later");
        let mut out = Vec::new();
        let mut screen = Screen::default();
        let other = EscalationSettled {
            session_id: SessionId([0xab; 16]),
            request_id: RequestId([9; 16]),
            outcome: EscalationOutcome::Expired,
        };
        p.settled(&mut out, &other, &mut screen).unwrap();
        assert!(p.waiting());
        p.settled(
            &mut out,
            &EscalationSettled {
                request_id: RequestId([1; 16]),
                ..other
            },
            &mut screen,
        )
        .unwrap();
        assert!(!p.waiting());
        let text = String::from_utf8(out).unwrap();
        assert!(text.ends_with("later"), "{text}");
    }

    #[test]
    fn held_output_is_followed_once_written() {
        let mut p = Prompter::default();
        shown_to(&mut p, (40, 120));
        p.hold(b"\x1b[?1049h");
        let mut screen = Screen::default();
        p.abandon(&mut Vec::new(), &mut screen).unwrap();
        assert_eq!(screen.reset(), b"\x1b[?1049l\x1b[0m");
    }
}
