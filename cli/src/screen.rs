//! The developer's terminal as a session's output leaves it.
//!
//! Owns what `lazaret attach` knows of the terminal settings the sandbox's
//! output changed: modes (origin, insert, autowrap, reverse video, the
//! alternate screen, cursor keys and keypad, mouse reporting, bracketed
//! paste, synchronized output, ...), the scrolling region and margins,
//! colours set by OSC, character sets, the cursor's style and the keyboard
//! protocols. From that model come three sequences: the one that makes the
//! terminal legible before an escalation prompt is drawn (and draws it on
//! a cleared screen), the one that puts the sandbox's settings back after
//! the prompt, and the one that undoes them all when the session ends.
//!
//! Trusts nothing: the output is the sandbox's, read in chunks that may
//! split a sequence anywhere. It is parsed the way terminals parse it
//! (`vte`, DEC's VT500 state machine), with the parser's own bounds.
//! Whatever the model cannot follow exactly (8-bit controls, device
//! control strings it does not know, a restore of saved modes, an OSC
//! string cut at the parser's bound) makes it assume the worst: every
//! setting it knows of is then reset, and only what it saw exactly is put
//! back.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// DEC private modes followed, with their power-on value.
const PRIVATE: [(u16, bool); 22] = [
    (1, false),    // DECCKM: application cursor keys
    (5, false),    // DECSCNM: the whole screen in reverse video
    (6, false),    // DECOM: positions relative to the scrolling region
    (7, true),     // DECAWM: autowrap
    (8, true),     // DECARM: autorepeat
    (9, false),    // X10 mouse reporting
    (25, true),    // DECTCEM: the cursor shows
    (45, false),   // reverse wraparound
    (66, false),   // DECNKM: application keypad
    (67, false),   // DECBKM: the backarrow key sends backspace
    (69, false),   // DECLRMM: left and right margins
    (1000, false), // mouse: button presses
    (1001, false), // mouse: highlight tracking
    (1002, false), // mouse: button motion
    (1003, false), // mouse: any motion
    (1004, false), // focus events
    (1005, false), // mouse: UTF-8 coordinates
    (1006, false), // mouse: SGR coordinates
    (1015, false), // mouse: urxvt coordinates
    (1016, false), // mouse: SGR pixel coordinates
    (2004, false), // bracketed paste
    (2026, false), // synchronized output: the terminal shows nothing until it ends
];

/// The private modes that switch to the alternate screen.
const ALTERNATE: [u16; 3] = [47, 1047, 1049];

/// ANSI modes followed, with their power-on value.
const ANSI: [(u16, bool); 4] = [
    (2, false),  // KAM: the keyboard locked
    (4, false),  // IRM: insert
    (12, true),  // SRM: no local echo
    (20, false), // LNM: line feed is a new line
];

/// Modes put back after a prompt only if the output set them: never the
/// locked keyboard (it has no use but to keep the developer from typing)
/// nor synchronized output (it would freeze the screen).
const NOT_PUT_BACK: [u16; 2] = [2, 2026];

/// The OSC numbers that set colours, and the ones that reset them.
const PALETTE: u16 = 4;
const SPECIAL: u16 = 5;
const DYNAMIC: std::ops::RangeInclusive<u16> = 10..=19;
const PALETTE_RESET: u16 = 104;
const SPECIAL_RESET: u16 = 105;
const DYNAMIC_RESET: std::ops::RangeInclusive<u16> = 110..=119;

/// How many palette colours (OSC 4) and special colours (OSC 5) a terminal
/// has: the indices followed.
const PALETTE_SIZE: u16 = 256;
const SPECIAL_SIZE: u16 = 5;

/// xterm's key modifier resources (`CSI > Pp ; Pv m`) are numbered below
/// this.
const MODIFIER_RESOURCES: u16 = 8;

/// The parser passes at most this many OSC parameters, and this many
/// bytes of one OSC string: a string that reached either may have said
/// more than the model saw.
const OSC_PARAMS_SEEN: usize = 16;
const OSC_BYTES_SEEN: usize = 1000;

/// The deepest keyboard-protocol stack followed.
const MAX_KEYBOARD_STACK: usize = 64;

/// A mode's value as the output left it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Value {
    Set(bool),
    /// Changed in a way the model did not follow (a restore of saved
    /// modes): reset it, put nothing back.
    Unknown,
}

/// Which screen the terminal shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Shown {
    #[default]
    Main,
    /// The alternate screen, switched to by this private mode.
    Alternate(u16),
    /// Perhaps the alternate screen: a restore of saved modes named one.
    Unknown,
}

/// A colour an OSC string set, by what it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Colour {
    Palette(u16),
    Special(u16),
    Dynamic(u16),
}

/// What a saved cursor (DECSC) holds of the followed settings, and a
/// restore (DECRC) puts back.
#[derive(Debug, Clone, Default)]
struct Saved {
    origin: Option<Value>,
    charsets: Charsets,
}

/// The character sets designated as G0 to G3 (the designating sequence,
/// when it is not ASCII) and the one shifted in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Charsets {
    designated: [Option<Vec<u8>>; 4],
    /// G1, G2 or G3 shifted in (SO, LS2, LS3) instead of G0.
    shift: u8,
}

/// The kitty keyboard protocol's flags on one screen, and the stack of
/// flags pushed there.
#[derive(Debug, Clone, Default)]
struct Keyboard {
    flags: u32,
    stack: Vec<u32>,
    touched: bool,
}

impl Keyboard {
    fn push(&mut self, flags: u32) {
        if self.stack.len() == MAX_KEYBOARD_STACK {
            self.stack.remove(0);
        }
        self.stack.push(self.flags);
        self.flags = flags;
        self.touched = true;
    }

    fn pop(&mut self, count: u16) {
        for _ in 0..count.max(1) {
            match self.stack.pop() {
                Some(flags) => self.flags = flags,
                None => {
                    self.flags = 0;
                    break;
                }
            }
        }
        self.touched = true;
    }

    fn set(&mut self, flags: u32, how: u16) {
        self.flags = match how {
            2 => self.flags | flags,
            3 => self.flags & !flags,
            _ => flags,
        };
        self.touched = true;
    }
}

/// Everything the output changed, as the terminal applied it.
#[derive(Debug, Default)]
struct State {
    private: BTreeMap<u16, Value>,
    ansi: BTreeMap<u16, Value>,
    shown: Shown,
    /// The scrolling region's top and bottom, as given; `None`: the whole
    /// screen.
    region: Option<(u16, u16)>,
    /// The left and right margins, as given, while DECLRMM allows them.
    margins: Option<(u16, u16)>,
    /// Each colour set and not reset since, with the OSC string that set
    /// it (without its introducer and terminator).
    colours: BTreeMap<Colour, Vec<u8>>,
    charsets: Charsets,
    /// The cursor saved on the main and the alternate screen.
    saved: [Option<Saved>; 2],
    keypad: bool,
    cursor_style: Option<u16>,
    /// xterm's key modifier resources (`CSI > Pp ; Pv m`) set, by resource.
    modified_keys: BTreeMap<u16, u16>,
    /// The kitty keyboard protocol on the main and the alternate screen.
    keyboard: [Keyboard; 2],
    /// ISO 2022 chosen instead of UTF-8 (`ESC % @`).
    left_utf8: bool,
    /// Character attributes (colours, bold, concealed, ...) other than
    /// the defaults, as far as the last SGR says.
    attributes: bool,
    /// Something was changed that the model did not follow exactly.
    tainted: bool,
}

/// The terminal settings a session's output changed.
#[derive(Default)]
pub struct Screen {
    parser: vte::Parser,
    state: State,
}

impl std::fmt::Debug for Screen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Screen")
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

/// How to draw a prompt on the terminal and take it away again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptFrame {
    /// Makes the terminal legible and clears the screen the prompt is
    /// drawn on.
    pub begin: Vec<u8>,
    /// Clears the prompt and puts back the output's settings.
    pub end: Vec<u8>,
    /// The prompt was drawn over the program's own (alternate) screen,
    /// which the program must draw again.
    pub redraw: bool,
}

impl Screen {
    /// Follows `bytes` of output, as the terminal receives them.
    pub fn observe(&mut self, bytes: &[u8]) {
        self.parser.advance(&mut self.state, bytes);
    }

    /// How to show a prompt now: on the alternate screen, switched to for
    /// it (so the main screen comes back as it was), or, when a program
    /// already shows the alternate screen, over that.
    pub fn prompt_frame(&self) -> PromptFrame {
        let s = &self.state;
        let own_screen = s.shown == Shown::Main;
        let mut begin = Vec::new();
        // An escape sequence or string left unfinished ends here (CAN,
        // ST), and a synchronized update ends, so what follows is shown.
        begin.extend_from_slice(b"\x18\x1b\\\x1b[?2026l");
        if own_screen {
            begin.extend_from_slice(b"\x1b[?1049h");
        }
        begin.extend_from_slice(&self.legible());
        begin.extend_from_slice(b"\x1b[H\x1b[2J");

        let mut end = b"\x1b[0m\x1b[H\x1b[2J".to_vec();
        end.extend_from_slice(&self.put_back());
        if own_screen {
            end.extend_from_slice(b"\x1b[?1049l");
        }
        PromptFrame {
            begin,
            end,
            redraw: !own_screen,
        }
    }

    /// What undoes every setting the output left changed, for when the
    /// session ends; empty when there is none. The cursor stays where it
    /// is unless origin mode was left on.
    pub fn reset(&self) -> Vec<u8> {
        let s = &self.state;
        let mut out = Vec::new();
        let changed_private = |mode: u16| s.tainted || s.private.contains_key(&mode);
        match s.shown {
            Shown::Main => {}
            Shown::Alternate(mode) => out.extend_from_slice(format!("\x1b[?{mode}l").as_bytes()),
            Shown::Unknown => out.extend_from_slice(b"\x1b[?1049l"),
        }
        if changed_private(6) {
            // Leaving origin mode homes the cursor: it goes to the last
            // row instead, below whatever the screen shows.
            out.extend_from_slice(b"\x1b[?6l\x1b[r\x1b[9999;1H\r\n");
        } else if s.region.is_some() || s.tainted {
            // Setting the region homes the cursor: saved and restored
            // around it.
            out.extend_from_slice(b"\x1b7\x1b[r\x1b8");
        }
        for (mode, default) in PRIVATE {
            if mode != 6 && changed_private(mode) {
                push_mode(&mut out, true, mode, default);
            }
        }
        for (mode, default) in ANSI {
            if s.tainted || s.ansi.contains_key(&mode) {
                push_mode(&mut out, false, mode, default);
            }
        }
        if s.tainted || s.charsets != Charsets::default() {
            out.extend_from_slice(b"\x1b(B\x1b)B\x1b*B\x1b+B\x0f");
        }
        if s.tainted || s.keypad {
            out.extend_from_slice(b"\x1b>");
        }
        if s.tainted || s.cursor_style.is_some() {
            out.extend_from_slice(b"\x1b[0 q");
        }
        for resource in s.modified_keys.keys() {
            out.extend_from_slice(format!("\x1b[>{resource}m").as_bytes());
        }
        if s.tainted || s.keyboard[0].touched || s.keyboard[1].touched {
            out.extend_from_slice(b"\x1b[<999u\x1b[=0;1u");
        }
        out.extend_from_slice(&self.colour_resets());
        if s.tainted || s.left_utf8 {
            out.extend_from_slice(b"\x1b%G");
        }
        if !out.is_empty() || s.attributes {
            out.extend_from_slice(b"\x1b[0m");
        }
        out
    }

    /// The settings under which text drawn next is seen, where it is
    /// drawn: those no program of the developer's leaves changed are set
    /// whatever the model says; the rest where the output changed them.
    fn legible(&self) -> Vec<u8> {
        let s = &self.state;
        let mut out = Vec::new();
        // Region and margins off, origin off, insert off, autowrap on, no
        // reverse video, the keyboard unlocked, the cursor shown, ASCII in
        // every character set, 7-bit replies (so that none can be taken for
        // typed text), default attributes.
        out.extend_from_slice(
            b"\x1b[?69l\x1b[?6l\x1b[r\x1b[4l\x1b[20l\x1b[2l\x1b[?7h\x1b[?5l\x1b[?25h\
              \x1b(B\x1b)B\x1b*B\x1b+B\x0f\x1b>\x1b[=0;1u\x1b F",
        );
        for (mode, default) in PRIVATE {
            if matches!(mode, 5 | 6 | 7 | 25 | 69 | 2026) {
                continue;
            }
            if s.tainted || s.private.contains_key(&mode) {
                push_mode(&mut out, true, mode, default);
            }
        }
        if s.tainted || s.ansi.contains_key(&12) {
            push_mode(&mut out, false, 12, true);
        }
        for resource in s.modified_keys.keys() {
            out.extend_from_slice(format!("\x1b[>{resource}m").as_bytes());
        }
        // Every colour the terminal lets a program set, whatever the model
        // saw: only what the sandbox set comes back afterwards.
        out.extend_from_slice(&colour_resets(true, |_| true));
        out.extend_from_slice(b"\x1b[0m");
        out
    }

    /// The output's settings again, after a prompt: each one the model
    /// followed exactly, none it did not.
    fn put_back(&self) -> Vec<u8> {
        let s = &self.state;
        let mut out = Vec::new();
        for (&mode, value) in &s.private {
            if let Value::Set(on) = value {
                if !NOT_PUT_BACK.contains(&mode) {
                    push_mode(&mut out, true, mode, *on);
                }
            }
        }
        for (&mode, value) in &s.ansi {
            if let Value::Set(on) = value {
                if !NOT_PUT_BACK.contains(&mode) {
                    push_mode(&mut out, false, mode, *on);
                }
            }
        }
        if let Some((left, right)) = s.margins {
            out.extend_from_slice(format!("\x1b[{left};{right}s").as_bytes());
        }
        if let Some((top, bottom)) = s.region {
            out.extend_from_slice(format!("\x1b[{top};{bottom}r").as_bytes());
        }
        for designation in s.charsets.designated.iter().flatten() {
            out.push(0x1b);
            out.extend_from_slice(designation);
        }
        match s.charsets.shift {
            1 => out.push(0x0e),
            2 => out.extend_from_slice(b"\x1bn"),
            3 => out.extend_from_slice(b"\x1bo"),
            _ => {}
        }
        if s.keypad {
            out.extend_from_slice(b"\x1b=");
        }
        if let Some(style) = s.cursor_style {
            out.extend_from_slice(format!("\x1b[{style} q").as_bytes());
        }
        for (resource, value) in &s.modified_keys {
            out.extend_from_slice(format!("\x1b[>{resource};{value}m").as_bytes());
        }
        let keyboard = &s.keyboard[s.screen_index()];
        if keyboard.touched {
            out.extend_from_slice(format!("\x1b[={};1u", keyboard.flags).as_bytes());
        }
        for body in s.colours.values() {
            out.extend_from_slice(b"\x1b]");
            out.extend_from_slice(body);
            out.extend_from_slice(b"\x1b\\");
        }
        out
    }

    /// OSC strings that reset each colour the output set (every colour
    /// when the model is unsure).
    fn colour_resets(&self) -> Vec<u8> {
        let s = &self.state;
        colour_resets(s.tainted, |kind| s.colours.keys().any(kind))
    }
}

/// OSC strings that reset the palette, the special colours and each
/// dynamic colour: all of them with `all`, else those `set` says a colour
/// of was set (asked with a test of each kind).
fn colour_resets(all: bool, set: impl Fn(&dyn Fn(&Colour) -> bool) -> bool) -> Vec<u8> {
    let mut out = String::new();
    if all || set(&|c| matches!(c, Colour::Palette(_))) {
        out.push_str("\x1b]104\x1b\\");
    }
    if all || set(&|c| matches!(c, Colour::Special(_))) {
        out.push_str("\x1b]105\x1b\\");
    }
    for n in DYNAMIC {
        if all || set(&|c| *c == Colour::Dynamic(n)) {
            let _ = write!(out, "\x1b]{}\x1b\\", n + 100);
        }
    }
    out.into_bytes()
}

/// `CSI [?] mode h|l` setting `mode` to `value`.
fn push_mode(out: &mut Vec<u8>, private: bool, mode: u16, value: bool) {
    let marker = if private { "?" } else { "" };
    let action = if value { 'h' } else { 'l' };
    out.extend_from_slice(format!("\x1b[{marker}{mode}{action}").as_bytes());
}

/// The first value of each parameter, 0 where it was left out.
fn values(params: &vte::Params) -> impl Iterator<Item = u16> + '_ {
    params.iter().map(|p| p.first().copied().unwrap_or(0))
}

/// A decimal OSC parameter.
fn number(param: &[u8]) -> Option<u16> {
    std::str::from_utf8(param).ok()?.parse().ok()
}

impl State {
    fn screen_index(&self) -> usize {
        usize::from(self.shown != Shown::Main)
    }

    fn set_private(&mut self, mode: u16, on: bool) {
        if ALTERNATE.contains(&mode) {
            self.switch_screen(mode, on);
            return;
        }
        match mode {
            // Save and restore the cursor (as DECSC and DECRC).
            1048 if on => self.save_cursor(),
            1048 => self.restore_cursor(),
            _ => {
                let Some(&(_, default)) = PRIVATE.iter().find(|(m, _)| *m == mode) else {
                    return;
                };
                if on == default {
                    self.private.remove(&mode);
                } else {
                    self.private.insert(mode, Value::Set(on));
                }
                // Leaving DECLRMM drops the margins.
                if mode == 69 && !on {
                    self.margins = None;
                }
                // Origin mode is part of the saved cursor, not a setting
                // of its own; the model keeps it with the rest.
            }
        }
    }

    fn switch_screen(&mut self, mode: u16, on: bool) {
        if on {
            if self.shown == Shown::Main {
                if mode == 1049 {
                    self.save_cursor();
                }
                self.shown = Shown::Alternate(mode);
                // Entering the alternate screen starts its keyboard stack
                // afresh.
                self.keyboard[1] = Keyboard::default();
            }
        } else if self.shown != Shown::Main {
            self.shown = Shown::Main;
            if mode == 1049 {
                self.restore_cursor();
            }
        }
    }

    fn save_cursor(&mut self) {
        let index = self.screen_index();
        self.saved[index] = Some(Saved {
            origin: self.private.get(&6).copied(),
            charsets: self.charsets.clone(),
        });
    }

    fn restore_cursor(&mut self) {
        let index = self.screen_index();
        let saved = self.saved[index].clone().unwrap_or_default();
        match saved.origin {
            Some(value) => self.private.insert(6, value),
            None => self.private.remove(&6),
        };
        self.charsets = saved.charsets;
    }

    fn set_ansi(&mut self, mode: u16, on: bool) {
        let Some(&(_, default)) = ANSI.iter().find(|(m, _)| *m == mode) else {
            return;
        };
        if on == default {
            self.ansi.remove(&mode);
        } else {
            self.ansi.insert(mode, Value::Set(on));
        }
    }

    /// `ESC c`: the terminal's full reset. Colours are kept in the model
    /// (not every terminal resets them), and so is doubt.
    fn full_reset(&mut self) {
        let colours = std::mem::take(&mut self.colours);
        let tainted = self.tainted;
        *self = State {
            colours,
            tainted,
            ..State::default()
        };
    }

    /// `CSI ! p`: a soft reset, which also changes autowrap on some
    /// terminals.
    fn soft_reset(&mut self) {
        for mode in [1, 6, 25] {
            self.private.remove(&mode);
        }
        self.private.insert(7, Value::Unknown);
        for mode in [2, 4] {
            self.ansi.remove(&mode);
        }
        self.region = None;
        self.keypad = false;
        self.attributes = false;
        self.charsets = Charsets::default();
        self.saved = Default::default();
    }

    fn osc(&mut self, params: &[&[u8]]) {
        let Some(&first) = params.first() else {
            return;
        };
        let bytes: usize = params.iter().map(|p| p.len() + 1).sum();
        if params.len() >= OSC_PARAMS_SEEN || bytes >= OSC_BYTES_SEEN {
            self.tainted = true;
        }
        let Some(code) = number(first) else {
            return;
        };
        let rest = &params[1..];
        match code {
            PALETTE | SPECIAL => {
                for pair in rest.chunks(2) {
                    let [index, spec] = pair else {
                        continue;
                    };
                    // Indices beyond the terminal's colours change nothing
                    // the model needs to follow, and are not kept: what it
                    // keeps stays bounded.
                    let limit = if code == PALETTE {
                        PALETTE_SIZE
                    } else {
                        SPECIAL_SIZE
                    };
                    let Some(index) = number(index).filter(|i| *i < limit) else {
                        self.tainted = true;
                        continue;
                    };
                    if *spec == b"?" {
                        continue;
                    }
                    let key = if code == PALETTE {
                        Colour::Palette(index)
                    } else {
                        Colour::Special(index)
                    };
                    self.colours.insert(key, osc_body(code, &[pair[0], spec]));
                }
            }
            code if DYNAMIC.contains(&code) => {
                for (n, spec) in (code..=*DYNAMIC.end()).zip(rest) {
                    if *spec != b"?" {
                        self.colours
                            .insert(Colour::Dynamic(n), osc_body(n, &[spec]));
                    }
                }
            }
            PALETTE_RESET | SPECIAL_RESET => {
                // Without indices, every colour of the kind is reset.
                let everything = rest.iter().all(|p| p.is_empty());
                let listed: Vec<u16> = rest.iter().filter_map(|p| number(p)).collect();
                self.colours.retain(|key, _| match (code, key) {
                    (PALETTE_RESET, Colour::Palette(i)) | (SPECIAL_RESET, Colour::Special(i)) => {
                        !everything && !listed.contains(i)
                    }
                    _ => true,
                });
            }
            code if DYNAMIC_RESET.contains(&code) => {
                self.colours.remove(&Colour::Dynamic(code - 100));
            }
            _ => {}
        }
    }
}

/// An OSC string's body: `code;param;param`.
fn osc_body(code: u16, params: &[&[u8]]) -> Vec<u8> {
    let mut body = code.to_string().into_bytes();
    for param in params {
        body.push(b';');
        body.extend_from_slice(param);
    }
    body
}

impl vte::Perform for State {
    fn execute(&mut self, byte: u8) {
        match byte {
            0x0e => self.charsets.shift = 1,
            0x0f => self.charsets.shift = 0,
            // An 8-bit control (CSI, OSC, DCS, ...) some terminals obey.
            0x80..=0x9f => self.tainted = true,
            _ => {}
        }
    }

    fn hook(&mut self, _params: &vte::Params, intermediates: &[u8], _ignore: bool, action: char) {
        // Queries (DECRQSS, XTGETTCAP) and sixel images change nothing;
        // any other device control string (a multiplexer's passthrough, a
        // key definition) may.
        let harmless = action == 'q' && matches!(intermediates, [] | [b'$'] | [b'+']);
        if !harmless {
            self.tainted = true;
        }
    }

    fn osc_dispatch(&mut self, params: &[&[u8]], _bell_terminated: bool) {
        self.osc(params);
    }

    fn csi_dispatch(
        &mut self,
        params: &vte::Params,
        intermediates: &[u8],
        ignore: bool,
        action: char,
    ) {
        if ignore {
            self.tainted = true;
            return;
        }
        let first = values(params).next().unwrap_or(0);
        match (intermediates, action) {
            ([b'?'], 'h' | 'l') => {
                for mode in values(params) {
                    self.set_private(mode, action == 'h');
                }
            }
            ([], 'h' | 'l') => {
                for mode in values(params) {
                    self.set_ansi(mode, action == 'h');
                }
            }
            // XTRESTORE: modes back as some earlier XTSAVE found them.
            ([b'?'], 'r') => {
                for mode in values(params) {
                    if ALTERNATE.contains(&mode) {
                        self.shown = Shown::Unknown;
                    } else if PRIVATE.iter().any(|(m, _)| *m == mode) {
                        self.private.insert(mode, Value::Unknown);
                    }
                }
                self.tainted = true;
            }
            ([], 'r') => {
                let mut v = values(params);
                let (top, bottom) = (v.next().unwrap_or(0), v.next().unwrap_or(0));
                self.region = (top > 1 || bottom != 0).then_some((top.max(1), bottom));
            }
            ([], 's') => {
                let margins = matches!(self.private.get(&69), Some(Value::Set(true)));
                let mut v = values(params);
                let (left, right) = (v.next().unwrap_or(0), v.next().unwrap_or(0));
                if margins {
                    self.margins = (left > 1 || right != 0).then_some((left.max(1), right));
                } else {
                    self.save_cursor();
                }
            }
            ([], 'u') => self.restore_cursor(),
            ([b'>'], 'u') => {
                let index = self.screen_index();
                self.keyboard[index].push(u32::from(first));
            }
            ([b'<'], 'u') => {
                let index = self.screen_index();
                self.keyboard[index].pop(first);
            }
            ([b'='], 'u') => {
                let how = values(params).nth(1).unwrap_or(1);
                let index = self.screen_index();
                self.keyboard[index].set(u32::from(first), how);
            }
            ([b' '], 'q') => {
                self.cursor_style = (first != 0).then_some(first);
            }
            ([b'>'], 'm') if first >= MODIFIER_RESOURCES => self.tainted = true,
            ([b'>'], 'm') => match values(params).nth(1) {
                Some(value) if params.len() > 1 => {
                    self.modified_keys.insert(first, value);
                }
                _ => {
                    self.modified_keys.remove(&first);
                }
            },
            // SGR: only a reset to the defaults alone is taken as one.
            ([], 'm') => self.attributes = values(params).any(|v| v != 0),
            ([b'!'], 'p') => self.soft_reset(),
            // DECSCL: a conformance level, with a soft reset of its own.
            ([b'"'], 'p') => self.tainted = true,
            _ => {}
        }
    }

    fn esc_dispatch(&mut self, intermediates: &[u8], ignore: bool, byte: u8) {
        if ignore {
            self.tainted = true;
            return;
        }
        match (intermediates, byte) {
            ([], b'7') => self.save_cursor(),
            ([], b'8') => self.restore_cursor(),
            ([], b'=') => self.keypad = true,
            ([], b'>') => self.keypad = false,
            ([], b'c') => self.full_reset(),
            ([], b'n') => self.charsets.shift = 2,
            ([], b'o') => self.charsets.shift = 3,
            ([b'%'], b'@') => self.left_utf8 = true,
            ([b'%'], b'G') => self.left_utf8 = false,
            ([first, ..], final_byte) if b"()*+-./".contains(first) => {
                let set = match first {
                    b'(' => 0,
                    b')' | b'-' => 1,
                    b'*' | b'.' => 2,
                    _ => 3,
                };
                let ascii = intermediates.len() == 1 && final_byte == b'B' && *first != b'-';
                self.charsets.designated[set] = (!ascii).then(|| {
                    let mut designation = intermediates.to_vec();
                    designation.push(final_byte);
                    designation
                });
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Screen;

    fn after(chunks: &[&[u8]]) -> Screen {
        let mut screen = Screen::default();
        for chunk in chunks {
            screen.observe(chunk);
        }
        screen
    }

    fn shown(bytes: &[u8]) -> String {
        String::from_utf8_lossy(bytes)
            .replace('\x1b', "ESC")
            .replace('\x0f', "SI")
            .replace('\x0e', "SO")
            .replace('\x18', "CAN")
    }

    fn reset(chunks: &[&[u8]]) -> String {
        shown(&after(chunks).reset())
    }

    #[test]
    fn nothing_left_set_needs_nothing() {
        assert_eq!(reset(&[b"plain text\r\n", b"\x1b[1;31mred\x1b[0m"]), "");
        assert_eq!(reset(&[b"\x1b[38;5;0mblack"]), "ESC[0m");
        assert_eq!(
            reset(&[b"\x1b[?1049h\x1b[?25l", b"\x1b[?25h\x1b[?1049l"]),
            ""
        );
        assert_eq!(
            reset(&[b"\x1b[3;5r\x1b[r\x1b[4h\x1b[4l\x1b[?7l\x1b[?7h"]),
            ""
        );
        assert_eq!(
            reset(&[b"\x1b]11;#000000\x07\x1b]111\x07\x1b]11;?\x07"]),
            ""
        );
        assert_eq!(reset(&[b"\x1b(0lqqk\x1b(B"]), "");
    }

    #[test]
    fn what_a_full_screen_program_leaves_is_reset() {
        assert_eq!(
            reset(&[b"\x1b[?1049h\x1b[?1000;1006h\x1b[?2004h\x1b[?25l"]),
            "ESC[?1049lESC[?25hESC[?1000lESC[?1006lESC[?2004lESC[0m"
        );
    }

    #[test]
    fn every_mode_the_issue_names_is_reset() {
        // Insert, origin, a scrolling region, no autowrap, application
        // cursor keys, a black background.
        let text = reset(&[b"\x1b[4h\x1b[?6h\x1b[3;5r\x1b[?7l\x1b[?1h\x1b]11;#000000\x1b\\"]);
        for part in [
            "ESC[4l",
            "ESC[?6l",
            "ESC[r",
            "ESC[?7h",
            "ESC[?1l",
            "ESC]111ESC\\",
        ] {
            assert!(text.contains(part), "{part} missing from {text}");
        }
        // A region without origin mode keeps the cursor where it is.
        assert_eq!(reset(&[b"\x1b[1;20r"]), "ESC7ESC[rESC8ESC[0m");
    }

    #[test]
    fn sequences_split_across_chunks_are_followed() {
        assert_eq!(
            reset(&[b"ab\x1b", b"[?10", b"49h", b"x"]),
            "ESC[?1049lESC[0m"
        );
        assert_eq!(reset(&[b"\x1b[?2004h", b"\x1b[", b"?2004", b"l"]), "");
        assert!(reset(&[b"\x1b]1", b"1;#0000", b"00\x07"]).contains("ESC]111"));
    }

    #[test]
    fn doubt_resets_everything() {
        // An 8-bit CSI, a device control string, a restore of saved modes.
        for chunk in [
            &b"\xc2\x9b4h"[..],
            b"\x1bPtmux;\x1b\x1b]11;#000\x07\x1b\\",
            b"\x1b[?6r",
        ] {
            let text = reset(&[chunk]);
            assert!(
                text.contains("ESC]111") && text.contains("ESC[4l") && text.contains("ESC[?6l"),
                "{chunk:?}: {text}"
            );
        }
        // Queries change nothing.
        assert_eq!(reset(&[b"\x1bP$qm\x1b\\\x1bP+q544e\x1b\\"]), "");
    }

    #[test]
    fn a_saved_cursor_brings_origin_mode_back() {
        // DECSC with origin on, origin off, DECRC: origin is on again.
        let text = reset(&[b"\x1b[?6h\x1b7\x1b[?6l\x1b8"]);
        assert!(text.contains("ESC[?6l"), "{text}");
        assert_eq!(reset(&[b"\x1b[?6h\x1b[?6l"]), "");
    }

    #[test]
    fn garbage_and_huge_numbers_change_nothing_followed() {
        assert_eq!(reset(&[b"\x1b[1049h\x1b[?12h\x1b[?10x49h"]), "");
        assert_eq!(reset(&[b"\x1b[?99999999999999h\x1b[?;;;;h"]), "");
    }

    #[test]
    fn a_prompt_on_the_main_screen_uses_its_own_screen_and_puts_everything_back() {
        let screen =
            after(&[b"\x1b[7;8r\x1b[?6h\x1b[4h\x1b]10;#000000\x07\x1b]11;#000000\x07\x1b(0"]);
        let frame = screen.prompt_frame();
        let begin = shown(&frame.begin);
        assert!(begin.starts_with("CANESC\\ESC[?2026lESC[?1049h"), "{begin}");
        for part in [
            "ESC[r", "ESC[?6l", "ESC[4l", "ESC]110", "ESC]111", "ESC(B", "ESC[H",
        ] {
            assert!(begin.contains(part), "{part} missing from {begin}");
        }
        assert!(begin.ends_with("ESC[HESC[2J"), "{begin}");
        let end = shown(&frame.end);
        for part in [
            "ESC[7;8r",
            "ESC[?6h",
            "ESC[4h",
            "ESC]10;#000000",
            "ESC]11;#000000",
            "ESC(0",
        ] {
            assert!(end.contains(part), "{part} missing from {end}");
        }
        assert!(end.ends_with("ESC[?1049l"), "{end}");
        assert!(!frame.redraw);
    }

    #[test]
    fn a_prompt_over_a_full_screen_program_asks_it_to_redraw() {
        let frame = after(&[b"\x1b[?1049h\x1b[?2026h"]).prompt_frame();
        let begin = shown(&frame.begin);
        assert!(!begin.contains("ESC[?1049h"), "{begin}");
        assert!(begin.contains("ESC[?2026l"), "{begin}");
        assert!(!shown(&frame.end).contains("1049"));
        assert!(!shown(&frame.end).contains("2026h"));
        assert!(frame.redraw);
    }

    #[test]
    fn the_kitty_keyboard_protocol_is_followed_per_screen() {
        let text = reset(&[b"\x1b[>1u"]);
        assert!(text.contains("ESC[<999uESC[=0;1u"), "{text}");
        let frame = after(&[b"\x1b[>11u"]).prompt_frame();
        assert!(shown(&frame.begin).contains("ESC[=0;1u"));
        assert!(shown(&frame.end).contains("ESC[=11;1u"));
    }

    #[test]
    fn what_the_model_keeps_is_bounded() {
        let mut flood = Vec::new();
        for index in 0..20_000u32 {
            flood.extend_from_slice(format!("\x1b]4;{index};rgb:00/00/00\x07").as_bytes());
            flood.extend_from_slice(format!("\x1b[>{index};1m").as_bytes());
        }
        let screen = after(&[&flood]);
        assert!(screen.state.colours.len() <= 256);
        assert!(screen.state.modified_keys.len() <= 8);
        assert!(screen.state.tainted);
        assert!(screen.prompt_frame().end.len() < 64 * 1024);
    }

    #[test]
    fn palette_resets_are_followed() {
        assert_eq!(reset(&[b"\x1b]4;1;red;2;blue\x07\x1b]104\x07"]), "");
        assert!(reset(&[b"\x1b]4;1;red;2;blue\x07\x1b]104;1\x07"]).contains("ESC]104"));
        assert_eq!(reset(&[b"\x1b]4;1;red\x07\x1b]104;1\x07"]), "");
    }
}
