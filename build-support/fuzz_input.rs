//! The input side of every fuzz target (`#[path]`-included by each crate's
//! `tests/fuzz.rs`, not a crate): the checked-in seed corpus of a target,
//! and the bytes one run feeds the decoder.
//!
//! bolero's engine on the stable toolchain replays the files of
//! `tests/__fuzz__/NAME/corpus/` and then draws random byte strings; it
//! does not mutate the corpus and is not guided by coverage. Random bytes
//! seldom get past a decoder's first check, so a target's input is read
//! here as one of two things, chosen by its first byte:
//! - a multiple of 4: the rest is the decoder's input as it is (every seed
//!   file starts with byte 0 and holds one valid input);
//! - anything else: the next byte picks a seed, and the rest is a list of
//!   up to 16 small edits (flip, set, insert, delete, duplicate, cut,
//!   splice) made to a copy of that seed's input.
//!
//! So random runs spend most of their time near valid inputs, on the
//! decoder's deeper paths. Trusts nothing: any bytes make some input.

use std::path::{Path, PathBuf};

/// The byte that starts every seed file: the rest is the input as it is.
pub const RAW: u8 = 0;

/// Bytes that separate or quote fields in text formats (TOML, header
/// values, paths): an edit may put one anywhere.
const PUNCTUATION: &[u8] = b"\"'[]{}=.,:;#\\/-_ \t\n\r0";

/// Values at the edges of a byte's and a length's ranges.
const EDGES: &[u8] = &[
    0, 1, 2, 0x7e, 0x7f, 0x80, 0x81, 0xfe, 0xff, b'a', b'/', b'.',
];

/// The most edits one input makes.
const MAX_EDITS: usize = 16;

/// The seed corpus directory of target `name` of the crate at
/// `manifest_dir`.
pub fn corpus_dir(manifest_dir: &str, name: &str) -> PathBuf {
    Path::new(manifest_dir)
        .join("tests/__fuzz__")
        .join(name)
        .join("corpus")
}

/// The inputs of the seed files of target `name` (each file less its first
/// byte), in file-name order; files starting with another byte are left
/// out.
pub fn seeds(manifest_dir: &str, name: &str) -> Vec<Vec<u8>> {
    let dir = corpus_dir(manifest_dir, name);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("the seed corpus {}: {e}", dir.display()))
        .map(|entry| entry.expect("a corpus entry").path())
        .collect();
    files.sort();
    let seeds: Vec<Vec<u8>> = files
        .iter()
        .filter_map(
            |file| match std::fs::read(file).expect("a seed file").split_first() {
                Some((&RAW, input)) => Some(input.to_vec()),
                _ => None,
            },
        )
        .collect();
    assert!(!seeds.is_empty(), "no seeds in {}", dir.display());
    seeds
}

/// Writes `input` as seed file `file` of target `name`.
pub fn write_seed(manifest_dir: &str, name: &str, file: &str, input: &[u8]) {
    let dir = corpus_dir(manifest_dir, name);
    std::fs::create_dir_all(&dir).expect("the corpus directory");
    let mut bytes = vec![RAW];
    bytes.extend_from_slice(input);
    std::fs::write(dir.join(file), bytes).expect("a seed file");
}

/// The decoder's input that `data` stands for, with `seeds` to edit.
pub fn input(data: &[u8], seeds: &[Vec<u8>]) -> Vec<u8> {
    match data {
        [] => Vec::new(),
        [mode, rest @ ..] if mode % 4 == 0 => rest.to_vec(),
        [_] => seeds[0].clone(),
        [_, pick, edits @ ..] => {
            let mut bytes = seeds[usize::from(*pick) % seeds.len()].clone();
            for edit in edits.chunks_exact(4).take(MAX_EDITS) {
                apply(&mut bytes, edit, seeds);
            }
            bytes
        }
    }
}

/// Makes one edit, `[kind, position (2 bytes), value]`, to `bytes`.
fn apply(bytes: &mut Vec<u8>, edit: &[u8], seeds: &[Vec<u8>]) {
    let &[kind, high, low, value] = edit else {
        return;
    };
    let at = usize::from(u16::from_be_bytes([high, low])) % (bytes.len() + 1);
    let within = at < bytes.len();
    match kind % 10 {
        0 if within => bytes[at] ^= 1 << (value % 8),
        1 if within => bytes[at] = value,
        2 if within => bytes[at] = bytes[at].wrapping_add(value % 16).wrapping_sub(8),
        3 if within => bytes[at] = EDGES[usize::from(value) % EDGES.len()],
        4 => bytes.insert(at, PUNCTUATION[usize::from(value) % PUNCTUATION.len()]),
        5 => bytes.insert(at, value),
        6 => {
            let end = (at + 1 + usize::from(value % 16)).min(bytes.len());
            bytes.drain(at..end);
        }
        7 => {
            let end = (at + 1 + usize::from(value % 32)).min(bytes.len());
            let copy = bytes[at..end].to_vec();
            bytes.splice(at..at, copy);
        }
        8 => bytes.truncate(at),
        _ => {
            // Splice in a piece of a seed: a field of one record in
            // another's place.
            let other = &seeds[usize::from(value) % seeds.len()];
            let from = usize::from(high) % (other.len() + 1);
            let end = (from + 1 + usize::from(low % 32)).min(other.len());
            bytes.splice(at..at, other[from..end].iter().copied());
        }
    }
}

/// A reader of the fields of a target's own input format: each field
/// reads as zero or empty once the input runs out.
#[derive(Debug)]
pub struct Fields<'a> {
    rest: &'a [u8],
}

impl<'a> Fields<'a> {
    /// A reader over `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { rest: bytes }
    }

    /// Whether everything was read.
    pub fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }

    /// What is not read yet, left unread.
    pub fn remaining(&self) -> &'a [u8] {
        self.rest
    }

    /// One byte.
    pub fn byte(&mut self) -> u8 {
        let Some((&first, rest)) = self.rest.split_first() else {
            return 0;
        };
        self.rest = rest;
        first
    }

    /// A big-endian `u16`.
    pub fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.byte(), self.byte()])
    }

    /// A byte string of the length the next byte says.
    pub fn short(&mut self) -> &'a [u8] {
        let len = usize::from(self.byte());
        self.take(len)
    }

    /// A byte string of the length the next two bytes say.
    pub fn long(&mut self) -> &'a [u8] {
        let len = usize::from(self.u16());
        self.take(len)
    }

    /// Everything not read yet.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.rest)
    }

    fn take(&mut self, len: usize) -> &'a [u8] {
        let (taken, rest) = self.rest.split_at(len.min(self.rest.len()));
        self.rest = rest;
        taken
    }
}

/// Frames fields for [`Fields`]: what a seed writer uses.
#[derive(Debug, Default)]
pub struct Framer {
    bytes: Vec<u8>,
}

impl Framer {
    /// One byte.
    pub fn byte(mut self, byte: u8) -> Self {
        self.bytes.push(byte);
        self
    }

    /// A big-endian `u16`.
    pub fn u16(mut self, value: u16) -> Self {
        self.bytes.extend_from_slice(&value.to_be_bytes());
        self
    }

    /// A byte string of at most 255 bytes, for [`Fields::short`].
    pub fn short(mut self, bytes: &[u8]) -> Self {
        let len = u8::try_from(bytes.len()).expect("a short field");
        self.bytes.push(len);
        self.bytes.extend_from_slice(bytes);
        self
    }

    /// A byte string of at most 65535 bytes, for [`Fields::long`].
    pub fn long(mut self, bytes: &[u8]) -> Self {
        let len = u16::try_from(bytes.len()).expect("a long field");
        self.bytes.extend_from_slice(&len.to_be_bytes());
        self.bytes.extend_from_slice(bytes);
        self
    }

    /// Bytes as they are, for [`Fields::rest`].
    pub fn rest(mut self, bytes: &[u8]) -> Self {
        self.bytes.extend_from_slice(bytes);
        self
    }

    /// The framed input.
    pub fn done(self) -> Vec<u8> {
        self.bytes
    }
}

/// Counts a target's inputs and those that reached its deepest path (an
/// accepted record, say), and prints both when dropped at the end of the
/// run (shown with `--nocapture`): a target whose inputs never get deep
/// tests little.
#[derive(Debug)]
pub struct Tally {
    name: &'static str,
    runs: std::sync::atomic::AtomicUsize,
    deep: std::sync::atomic::AtomicUsize,
}

impl Tally {
    /// A tally of target `name`, `deep` saying what its deepest path is.
    pub fn new(name: &'static str) -> Self {
        Self {
            name,
            runs: 0.into(),
            deep: 0.into(),
        }
    }

    /// Counts one input, and whether it got to the deepest path.
    pub fn count(&self, deep: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        self.runs.fetch_add(1, Relaxed);
        if deep {
            self.deep.fetch_add(1, Relaxed);
        }
    }
}

impl Drop for Tally {
    fn drop(&mut self) {
        eprintln!(
            "fuzz target {}: {} inputs, {} of them to the deepest path",
            self.name,
            self.runs.get_mut(),
            self.deep.get_mut()
        );
    }
}
