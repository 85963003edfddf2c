//! The field a TOML syntax error lies in: the path of the key, table or
//! value at a byte of the document (`profiles.p.image`,
//! `profiles.p.volumes[1].host`), so that a syntax error names its field
//! as every other configuration error does, although the parser's own
//! message ("duplicate key") names none.
//!
//! Owns one walk of the document's events, as the TOML parser's own lexer
//! and event parser give them (they recover from an error and go on):
//! table and array-of-tables headers, dotted keys, inline tables and the
//! elements of arrays. Trusts nothing in the document; a name it returns
//! is shown through [`quoted`], so a huge or hostile key stays short and
//! printable.

use std::collections::HashMap;

use lazaret_proto::config::quoted;
use toml_parser::parser::{Event, EventKind, RecursionGuard};
use toml_parser::{Raw, Source};

/// How deep arrays and inline tables are followed: the TOML reader's own
/// bound.
const MAX_DEPTH: u32 = 80;

/// One step of a path.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Step {
    Key(String),
    Index(usize),
}

/// An array or inline table being read.
#[derive(Debug)]
enum Frame {
    /// An inline table at this path.
    Inline(Vec<Step>),
    /// An array at this path, at this element.
    Array(Vec<Step>, usize),
}

/// The path as configuration errors show one, `(document)` for the root.
fn shown(path: &[Step]) -> String {
    if path.is_empty() {
        return "(document)".to_owned();
    }
    let mut out = String::new();
    for step in path {
        match step {
            Step::Key(key) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(&quoted(key));
            }
            Step::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// The walk's state.
#[derive(Debug, Default)]
struct Walk {
    /// The path of the current `[table]` or `[[array]]` element.
    table: Vec<Step>,
    /// How many elements each array of tables has had so far.
    elements: HashMap<Vec<Step>, usize>,
    /// The keys of a header being read, and whether it is `[[...]]`.
    header: Option<(Vec<String>, bool)>,
    /// The keys of the dotted key being read.
    keys: Vec<String>,
    /// The path of the value after the last `=`.
    value: Vec<Step>,
    frames: Vec<Frame>,
    /// The path at each byte where one begins, in document order.
    marks: Vec<(usize, Vec<Step>)>,
}

impl Walk {
    /// The path `keys` of a header name: each array of tables on the way
    /// at its last element, and the header's own one at a new element
    /// when it is `[[...]]` and `close`.
    fn header_path(&mut self, keys: &[String], array: bool, close: bool) -> Vec<Step> {
        let mut path = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            path.push(Step::Key(key.clone()));
            let last = i + 1 == keys.len();
            if last && array && close {
                let count = self.elements.entry(path.clone()).or_insert(0);
                let index = *count;
                *count += 1;
                path.push(Step::Index(index));
            } else if let Some(count) = self.elements.get(&path).filter(|c| **c > 0) {
                path.push(Step::Index(count - 1));
            }
        }
        path
    }

    /// Where keys now go: the innermost inline table, else the table.
    fn base(&self) -> Vec<Step> {
        match self.frames.last() {
            Some(Frame::Inline(path)) => path.clone(),
            _ => self.table.clone(),
        }
    }

    /// The path of the value now being read.
    fn current_value(&self) -> Vec<Step> {
        match self.frames.last() {
            Some(Frame::Array(path, index)) => {
                let mut path = path.clone();
                path.push(Step::Index(*index));
                path
            }
            _ => self.value.clone(),
        }
    }

    fn event(&mut self, text: &str, event: &Event) {
        let span = event.span();
        match event.kind() {
            EventKind::StdTableOpen | EventKind::ArrayTableOpen => {
                let array = event.kind() == EventKind::ArrayTableOpen;
                self.header = Some((Vec::new(), array));
                self.keys.clear();
                self.frames.clear();
            }
            EventKind::StdTableClose | EventKind::ArrayTableClose => {
                if let Some((keys, array)) = self.header.take() {
                    self.table = self.header_path(&keys, array, true);
                }
            }
            EventKind::SimpleKey => {
                let raw = text
                    .get(span.start()..span.end())
                    .map(|raw| Raw::new_unchecked(raw, event.encoding(), span));
                let mut key = String::new();
                if let Some(raw) = raw {
                    raw.decode_key(&mut key, &mut ());
                }
                if let Some((mut keys, array)) = self.header.take() {
                    keys.push(key);
                    let path = self.header_path(&keys, array, false);
                    self.marks.push((span.start(), path));
                    self.header = Some((keys, array));
                } else {
                    self.keys.push(key);
                    let mut path = self.base();
                    path.extend(self.keys.iter().cloned().map(Step::Key));
                    self.marks.push((span.start(), path));
                }
            }
            EventKind::KeyValSep => {
                let mut path = self.base();
                path.extend(self.keys.drain(..).map(Step::Key));
                self.value = path;
            }
            EventKind::Scalar => self.marks.push((span.start(), self.current_value())),
            EventKind::ArrayOpen => {
                let path = self.current_value();
                self.marks.push((span.start(), path.clone()));
                self.frames.push(Frame::Array(path, 0));
            }
            EventKind::InlineTableOpen => {
                let path = self.current_value();
                self.marks.push((span.start(), path.clone()));
                self.frames.push(Frame::Inline(path));
            }
            EventKind::ArrayClose | EventKind::InlineTableClose => {
                self.frames.pop();
            }
            EventKind::ValueSep => {
                if let Some(Frame::Array(_, index)) = self.frames.last_mut() {
                    *index += 1;
                    self.marks.push((span.end(), self.current_value()));
                }
            }
            EventKind::Newline if self.frames.is_empty() && self.header.is_none() => {
                // What follows on the next line belongs to the table until
                // a key says otherwise.
                self.keys.clear();
                self.marks.push((span.end(), self.table.clone()));
            }
            _ => {}
        }
    }
}

/// The path of what `text` defines at byte `at`: the last key, table
/// header, value or line begun at or before it.
pub(super) fn path_at(text: &str, at: usize) -> String {
    let source = Source::new(text);
    let tokens: Vec<_> = source.lex().collect();
    let mut events: Vec<Event> = Vec::new();
    let mut guard = RecursionGuard::new(&mut events, MAX_DEPTH);
    toml_parser::parser::parse_document(&tokens, &mut guard, &mut ());
    let mut walk = Walk::default();
    for event in &events {
        if event.span().start() > at {
            break;
        }
        walk.event(text, event);
    }
    let found = walk
        .marks
        .iter()
        .rev()
        .find(|(start, _)| *start <= at)
        .map(|(_, path)| path.as_slice())
        .unwrap_or_default();
    shown(found)
}

#[cfg(test)]
mod tests {
    use super::path_at;

    /// The path at the first byte of `needle`'s `nth` occurrence.
    fn at(text: &str, needle: &str, nth: usize) -> String {
        let offset = text
            .match_indices(needle)
            .nth(nth)
            .map(|(i, _)| i)
            .unwrap_or_else(|| panic!("no {needle:?} #{nth} in {text:?}"));
        path_at(text, offset)
    }

    #[test]
    fn keys_tables_and_dotted_keys() {
        let text = "schema = 'x'\n[profiles.p]\nimage = 'a'\nimage = 'b'\nnet.allow = 1\n";
        assert_eq!(at(text, "schema", 0), "schema");
        assert_eq!(at(text, "p]", 0), "profiles.p");
        assert_eq!(at(text, "image", 1), "profiles.p.image");
        assert_eq!(at(text, "'b'", 0), "profiles.p.image");
        assert_eq!(at(text, "allow", 0), "profiles.p.net.allow");
        assert_eq!(path_at(text, 0), "schema");
    }

    #[test]
    fn arrays_inline_tables_and_arrays_of_tables() {
        let text = "[profiles.p]\nvolumes = [ { host = 'a' }, { host = 'b', kind = 'c' } ]\n\
                    [[profiles.p.rules]]\nx = 1\n[[profiles.p.rules]]\nx = [1, 2, 3]\n";
        assert_eq!(at(text, "host", 1), "profiles.p.volumes[1].host");
        assert_eq!(at(text, "'c'", 0), "profiles.p.volumes[1].kind");
        assert_eq!(at(text, "x", 1), "profiles.p.rules[1].x");
        assert_eq!(at(text, "3", 0), "profiles.p.rules[1].x[2]");
        // A quoted key with a dot stays one step; a control character is
        // escaped.
        let text = "[p]\n\"a.b\\u001b\" = 1\n";
        assert_eq!(at(text, "\"a", 0), "p.a.b\\u{1b}");
    }

    /// The path at the first error the TOML reader finds in `text`.
    fn at_error(text: &str) -> String {
        let error = text.parse::<toml::Table>().unwrap_err();
        path_at(text, error.span().map_or(text.len(), |s| s.start))
    }

    #[test]
    fn a_line_after_a_key_belongs_to_its_table() {
        let text = "[profiles.p]\nimage = 'a'\n# more\n";
        assert_eq!(at(text, "# more", 0), "profiles.p");
        assert_eq!(path_at("# only\n", 3), "(document)");
        // A malformed key is named as written.
        assert_eq!(
            at_error("[profiles.p]\nimage = 'a'\n!! = 1\n"),
            "profiles.p.!!"
        );
    }

    #[test]
    fn a_broken_document_still_names_its_fields() {
        for (text, field) in [
            ("[profiles.p]\nimage = 'unterminated\n", "profiles.p.image"),
            ("[profiles.p]\nother = [1,, 2]\n", "profiles.p.other[1]"),
            ("[profiles.p]\nimage = \n", "profiles.p.image"),
            ("[profiles.p]\nimage 'x'\n", "profiles.p.image"),
            ("[profiles.p\nimage = 'a'\n", "profiles.p"),
            ("[profiles.p]\nx = \"\\q\"\n", "profiles.p.x"),
            ("[profiles.p]\nx = 1979-13-01\n", "profiles.p.x"),
        ] {
            assert_eq!(at_error(text), field, "{text:?}");
        }
    }
}
