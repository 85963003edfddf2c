//! The terminal modes a program inside the sandbox may leave set when its
//! session ends: the alternate screen, mouse reporting, bracketed paste, a
//! hidden cursor. `attach` watches the session's output for the control
//! sequences that set and reset them (`ESC [ ? N h` and `ESC [ ? N l`) and,
//! at the end, resets those left set, so the developer's shell gets its
//! terminal back as it was. Trusts nothing: the output is the sandbox's,
//! read in chunks that may split a sequence anywhere.

use std::collections::BTreeSet;

/// The private modes whose `h` (set) must be undone with `l`.
const UNDONE_BY_RESET: [u16; 10] = [47, 1047, 1049, 1000, 1002, 1003, 1005, 1006, 1015, 2004];

/// The cursor's visibility: `l` hides it, `h` shows it again.
const CURSOR: u16 = 25;

/// At most this many parameters of one sequence are looked at.
const MAX_PARAMS: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum State {
    #[default]
    Ground,
    Escape,
    Csi,
    Private,
}

/// What the output has left set so far.
#[derive(Debug, Default)]
pub struct Modes {
    set: BTreeSet<u16>,
    cursor_hidden: bool,
    state: State,
    params: Vec<u16>,
}

impl Modes {
    /// Follows `bytes` of output.
    pub fn observe(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.state = match (self.state, byte) {
                (_, 0x1b) => State::Escape,
                (State::Escape, b'[') => State::Csi,
                (State::Csi, b'?') => {
                    self.params.clear();
                    self.params.push(0);
                    State::Private
                }
                (State::Private, b'0'..=b'9') => {
                    if let Some(last) = self.params.last_mut() {
                        *last = last
                            .saturating_mul(10)
                            .saturating_add(u16::from(byte - b'0'));
                    }
                    State::Private
                }
                (State::Private, b';') if self.params.len() < MAX_PARAMS => {
                    self.params.push(0);
                    State::Private
                }
                (State::Private, b'h' | b'l') => {
                    let on = byte == b'h';
                    for &mode in &self.params {
                        if mode == CURSOR {
                            self.cursor_hidden = !on;
                        } else if UNDONE_BY_RESET.contains(&mode) {
                            if on {
                                self.set.insert(mode);
                            } else {
                                self.set.remove(&mode);
                            }
                        }
                    }
                    State::Ground
                }
                _ => State::Ground,
            };
        }
    }

    /// The control sequences that undo what is left set, most recently
    /// numbered last; empty when nothing is.
    pub fn reset(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for mode in self.set.iter().rev() {
            out.extend_from_slice(format!("\x1b[?{mode}l").as_bytes());
        }
        if self.cursor_hidden {
            out.extend_from_slice(b"\x1b[?25h");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::Modes;

    fn after(chunks: &[&[u8]]) -> String {
        let mut modes = Modes::default();
        for chunk in chunks {
            modes.observe(chunk);
        }
        String::from_utf8(modes.reset())
            .unwrap()
            .replace('\x1b', "ESC")
    }

    #[test]
    fn nothing_left_set_needs_nothing() {
        assert_eq!(after(&[b"plain text\r\n", b"\x1b[1;31mred\x1b[0m"]), "");
        assert_eq!(
            after(&[b"\x1b[?1049h\x1b[?25l", b"\x1b[?25h\x1b[?1049l"]),
            ""
        );
    }

    #[test]
    fn what_a_full_screen_program_leaves_is_reset() {
        assert_eq!(
            after(&[b"\x1b[?1049h\x1b[?1000;1006h\x1b[?2004h\x1b[?25l"]),
            "ESC[?2004lESC[?1049lESC[?1006lESC[?1000lESC[?25h"
        );
    }

    #[test]
    fn sequences_split_across_chunks_are_followed() {
        assert_eq!(after(&[b"ab\x1b", b"[?10", b"49h", b"x"]), "ESC[?1049l");
        assert_eq!(after(&[b"\x1b[?2004h", b"\x1b[", b"?2004", b"l"]), "");
    }

    #[test]
    fn other_sequences_and_garbage_change_nothing() {
        // Not private, unknown modes, interrupted sequences, huge numbers.
        assert_eq!(after(&[b"\x1b[1049h\x1b[?12h\x1b[?10x49h"]), "");
        assert_eq!(after(&[b"\x1b[?99999999999999h\x1b[?;;;;h"]), "");
        let many = format!("\x1b[?{}1049h", "1;".repeat(100));
        assert_eq!(after(&[many.as_bytes()]), "");
    }
}
