mod support;

// Property tests of the trusted-host configuration loader and its digests.
//
// 1. `ConfigurationFingerprintV1` ignores presentation: comments, table,
//    key and list order, inline versus standard tables, string quoting and
//    escapes, defaults written out, nonselected profiles, duplicate and
//    host-bit-carrying prefixes, RFC 1918 prefixes listed explicitly, and
//    `~/`, absolute or symlinked spellings of the same canonical path.
// 2. It changes whenever an included field changes, and does not change
//    when only a referenced host variable's value changes.
// 3. Both digests equal SHA-256 of preimages framed by hand in this file,
//    from the schema's rules, independently of `proto::config`.
// 4. Random and damaged TOML never panics the decoder or the full loader.
//
// A "model" is a small valid selected profile; the renderer writes it as
// TOML with random presentation choices drawn from a seeded generator.

use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use lazaret_coordinator::config::{self, ConfigError, ResolvedDomainConfiguration};
use lazaret_proto::config::{
    ConfigurationFingerprintRecordV1, EnvironmentReference, HostAnchor, Ipv4Prefix, RFC1918,
    ResolvedAutoApprovalRule, ResolvedVolume, SCHEMA_ID, VolumeAccess, VolumeKind,
};
use proptest::prelude::*;
use proptest::sample::{Index, select, subsequence};
use proptest::test_runner::TestCaseError;
use sha2::{Digest, Sha256};
use support::{Fixture, write_file};

// ---------------------------------------------------------------------------
// A small deterministic generator for presentation choices.
// ---------------------------------------------------------------------------

/// SplitMix64. A `plain` generator makes every choice its first option and
/// never reorders, so it renders the canonical minimal document.
#[derive(Debug)]
struct Rng {
    state: u64,
    plain: bool,
}

impl Rng {
    fn plain() -> Self {
        Self {
            state: 0,
            plain: true,
        }
    }

    fn seeded(seed: u64) -> Self {
        Self {
            state: seed,
            plain: false,
        }
    }

    fn bits(&mut self) -> u64 {
        if self.plain {
            return 0;
        }
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        if n <= 1 {
            0
        } else {
            (self.bits() % n as u64) as usize
        }
    }

    fn chance(&mut self, percent: u64) -> bool {
        !self.plain && self.bits() % 100 < percent
    }

    fn shuffle<T>(&mut self, items: &mut [T]) {
        if self.plain {
            return;
        }
        for i in (1..items.len()).rev() {
            let j = self.below(i + 1);
            items.swap(i, j);
        }
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
}

// ---------------------------------------------------------------------------
// TOML presentation.
// ---------------------------------------------------------------------------

/// A TOML value as the renderer builds it.
#[derive(Debug, Clone)]
enum V {
    S(String),
    B(bool),
    A(Vec<V>),
    T(Vec<Entry>),
}

/// A (possibly dotted) key relative to its table, and its value.
type Entry = (Vec<String>, V);

/// A table header (`[[...]]` when `.0`) and its entries; the root has none.
#[derive(Debug)]
struct Section {
    header: Option<(bool, Vec<String>)>,
    entries: Vec<Entry>,
}

fn k(name: &str) -> Vec<String> {
    vec![name.to_owned()]
}

fn is_bare(key: &str) -> bool {
    !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn literal_ok(s: &str) -> bool {
    !s.contains('\'') && !s.chars().any(|c| c.is_control() && c != '\t')
}

/// One character as a TOML escape: `\xHH` (TOML 1.1), `\uXXXX` or
/// `\UXXXXXXXX`, in random hex case.
fn escape_char(r: &mut Rng, c: char) -> String {
    let n = u32::from(c);
    let text = match r.below(3) {
        0 if n < 0x100 => format!("\\x{n:02x}"),
        1 if n <= 0xFFFF => format!("\\u{n:04x}"),
        _ => format!("\\U{n:08x}"),
    };
    if r.chance(50) {
        // Upper-case only the hex digits, never the escape letter.
        let (head, digits) = text.split_at(2);
        format!("{head}{}", digits.to_ascii_uppercase())
    } else {
        text
    }
}

/// The body of a basic string: everything that must be escaped is, and any
/// other character may be.
fn basic_body(r: &mut Rng, s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        match c {
            '"' if r.chance(30) => out.push_str("\\u0022"),
            '"' => out.push_str("\\\""),
            '\\' if r.chance(30) => out.push_str("\\u005C"),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' if r.chance(50) => out.push_str("\\t"),
            '\t' => out.push('\t'),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\u{1b}' if r.chance(50) => out.push_str("\\e"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", u32::from(c))),
            c if r.chance(8) => out.push_str(&escape_char(r, c)),
            c => out.push(c),
        }
    }
    out
}

/// A string value as a basic, literal, multi-line basic or multi-line
/// literal string.
fn string_text(r: &mut Rng, s: &str) -> String {
    let literal = literal_ok(s);
    match r.below(5) {
        1 if literal => format!("'{s}'"),
        2 => {
            let newline = if r.chance(50) { "\n" } else { "" };
            format!("\"\"\"{newline}{}\"\"\"", basic_body(r, s))
        }
        3 if literal => {
            let newline = if r.chance(50) { "\n" } else { "" };
            format!("'''{newline}{s}'''")
        }
        _ => format!("\"{}\"", basic_body(r, s)),
    }
}

/// A key: bare when possible (and mostly), else quoted.
fn key_text(r: &mut Rng, key: &str) -> String {
    if is_bare(key) && !r.chance(15) {
        return key.to_owned();
    }
    if literal_ok(key) && r.chance(50) {
        format!("'{key}'")
    } else {
        format!("\"{}\"", basic_body(r, key))
    }
}

fn dotted(r: &mut Rng, path: &[String]) -> String {
    let sep = if r.chance(20) { " . " } else { "." };
    let parts: Vec<String> = path.iter().map(|p| key_text(r, p)).collect();
    parts.join(sep)
}

const COMMENTS: [&str; 9] = [
    "",
    " a comment",
    "#",
    " image = \"evil:latest\"",
    " [profiles.evil]",
    " env = { A = \"env:B\" }",
    " ünïcødé ✓ 日本語",
    " \t tab ] } \" ' \\ ,",
    " persistent_dirs = [\"/etc\"]",
];

fn comment(r: &mut Rng) -> String {
    format!("#{}", r.pick(&COMMENTS))
}

/// An optional comment to end a line with.
fn trailing(r: &mut Rng) -> String {
    if r.chance(25) {
        format!("{}{}", r.pick(&[" ", "\t", "  "]), comment(r))
    } else {
        String::new()
    }
}

/// Blank lines and whole-line comments.
fn filler(r: &mut Rng, out: &mut String) {
    while r.chance(20) {
        if r.chance(40) {
            out.push('\n');
        } else {
            out.push_str(r.pick(&["", "  ", "\t"]));
            out.push_str(&comment(r));
            out.push('\n');
        }
    }
}

fn eq(r: &mut Rng) -> &'static str {
    r.pick(&[" = ", "=", " =\t", "\t= ", "  =  "])
}

/// `items` between `open` and `close`, one a line, each indented by one of
/// `indents`, with comments and blank lines between them and, at random, a
/// trailing comma.
fn multiline(
    r: &mut Rng,
    (open, close): (char, char),
    indents: &[&'static str],
    items: Vec<String>,
) -> String {
    let mut out = String::from(open);
    out.push_str(&trailing(r));
    out.push('\n');
    let n = items.len();
    for (i, item) in items.into_iter().enumerate() {
        filler(r, &mut out);
        out.push_str(r.pick(indents));
        out.push_str(&item);
        if i + 1 < n || r.chance(50) {
            out.push(',');
        }
        out.push_str(&trailing(r));
        out.push('\n');
    }
    filler(r, &mut out);
    out.push(close);
    out
}

fn array_text(r: &mut Rng, items: Vec<String>) -> String {
    if r.chance(40) {
        multiline(r, ('[', ']'), &["", "  ", "\t"], items)
    } else {
        let sep = r.pick(&[", ", ",", " , "]);
        let trail = if !items.is_empty() && r.chance(20) {
            ","
        } else {
            ""
        };
        let pad = if r.chance(20) { " " } else { "" };
        format!("[{pad}{}{trail}{pad}]", items.join(sep))
    }
}

/// An inline table; with TOML 1.1 (which the loader's parser implements)
/// it may span lines, hold comments and end with a comma.
fn inline_text(r: &mut Rng, items: Vec<String>) -> String {
    if items.is_empty() {
        return r.pick(&["{}", "{ }"]).to_owned();
    }
    if r.chance(25) {
        multiline(r, ('{', '}'), &["  "], items)
    } else {
        format!("{{ {} }}", items.join(", "))
    }
}

fn value_text(r: &mut Rng, v: &V) -> String {
    match v {
        V::S(s) => string_text(r, s),
        V::B(b) => b.to_string(),
        V::A(items) => {
            let texts = items.iter().map(|i| value_text(r, i)).collect();
            array_text(r, texts)
        }
        V::T(pairs) => {
            let mut texts: Vec<String> = pairs
                .iter()
                .map(|(key, v)| format!("{}{}{}", dotted(r, key), eq(r), value_text(r, v)))
                .collect();
            r.shuffle(&mut texts);
            inline_text(r, texts)
        }
    }
}

fn emit_entries(r: &mut Rng, out: &mut String, mut entries: Vec<Entry>) {
    r.shuffle(&mut entries);
    for (key, v) in entries {
        filler(r, out);
        let line = format!(
            "{}{}{}{}{}",
            r.pick(&["", "", "  ", "\t"]),
            dotted(r, &key),
            eq(r),
            value_text(r, &v),
            trailing(r)
        );
        out.push_str(&line);
        out.push('\n');
    }
}

/// Renders the root section (first) and every other section in random
/// order, with comments, blank lines and possibly CRLF line ends.
fn render_sections(r: &mut Rng, mut sections: Vec<Section>) -> String {
    let root = sections.remove(0);
    r.shuffle(&mut sections);
    let mut out = String::new();
    filler(r, &mut out);
    emit_entries(r, &mut out, root.entries);
    for section in sections {
        filler(r, &mut out);
        let (array, path) = section.header.expect("only the first section is the root");
        let pad = if r.chance(20) { " " } else { "" };
        let path = dotted(r, &path);
        if array {
            out.push_str(&format!("[[{pad}{path}{pad}]]"));
        } else {
            out.push_str(&format!("[{pad}{path}{pad}]"));
        }
        out.push_str(&trailing(r));
        out.push('\n');
        emit_entries(r, &mut out, section.entries);
    }
    filler(r, &mut out);
    if r.chance(20) {
        // A last comment without a final newline.
        out.push_str(&comment(r));
    }
    if r.chance(20) {
        // Strings never hold a raw newline, so every `\n` ends a line.
        out = out.replace('\n', "\r\n");
    }
    out
}

// ---------------------------------------------------------------------------
// The model of a profile.
// ---------------------------------------------------------------------------

/// Sandbox paths that never nest and never touch a protected destination.
const PERSIST_POOL: [&str; 6] = [
    "/root",
    "/home/agent",
    "/var/cache/tool",
    "/opt/tools",
    "/usr/local",
    "/srv/data",
];

/// Allow and deny prefixes: no allow prefix equals a deny prefix or an
/// RFC 1918 prefix once normalized, so no combination conflicts. Some
/// overlap at other lengths, which is valid.
const ALLOW_POOL: [([u8; 4], u8); 6] = [
    ([203, 0, 113, 10], 32),
    ([198, 51, 100, 0], 24),
    ([192, 0, 2, 53], 32),
    ([10, 222, 7, 0], 24),
    ([1, 1, 1, 1], 32),
    ([93, 184, 216, 0], 22),
];
const DENY_POOL: [([u8; 4], u8); 5] = [
    ([10, 222, 0, 0], 16),
    ([100, 64, 0, 0], 10),
    ([169, 254, 0, 0], 16),
    ([8, 8, 4, 0], 24),
    ([203, 0, 113, 128], 25),
];

/// Host variables the fixtures set. `LZ_A` and `LZ_B` share a value, so a
/// reference moved between them changes only the host name.
const HOST_VARS: [(&str, &str); 3] = [
    ("LZ_A", "same value"),
    ("LZ_B", "same value"),
    ("LZ_C", "another value ✓"),
];
const HOST_NAMES: [&str; 4] = ["LZ_A", "LZ_B", "LZ_C", "HOME"];

/// Names the renderer gives nonselected profiles.
const OTHER_NAMES: [&str; 5] = ["other", "q.1", "Alpha-2", "x_y", "9"];

#[derive(Debug, Clone, Copy, PartialEq)]
enum Storage {
    /// No `data_root`: `$HOME/.local/share/lazaret`.
    Default,
    /// `~/data-a`.
    Home,
    /// `<fixture>/data-b`.
    Absolute,
}

#[derive(Debug, Clone, PartialEq)]
enum Source {
    /// `{profile_dir}/<suffix>`.
    ProfileDir(String),
    /// `<home>/<suffix>`, an existing object outside every Lazaret tree.
    Home(String),
}

#[derive(Debug, Clone, PartialEq)]
struct Volume {
    parent: String,
    leaf: String,
    source: Source,
    kind: VolumeKind,
    access: VolumeAccess,
    create: bool,
}

#[derive(Debug, Clone, PartialEq)]
enum Exe {
    /// `<home>/bin/tool<i>`, a real 0755 executable.
    Tool(usize),
    /// A literal path (nonselected profiles only; never resolved).
    Path(&'static str),
}

#[derive(Debug, Clone, PartialEq)]
struct Rule {
    exe: Exe,
    args: Vec<String>,
    extra: bool,
}

#[derive(Debug, Clone)]
struct Model {
    name: String,
    image: String,
    isolate: bool,
    storage: Storage,
    persistent: Vec<String>,
    volumes: Vec<Volume>,
    allow: Vec<usize>,
    deny: Vec<usize>,
    env: BTreeMap<String, String>,
    escalation: bool,
    rules: Vec<Rule>,
}

impl Model {
    fn container(v: &Volume) -> String {
        format!("{}/{}", v.parent, v.leaf)
    }

    fn rules_unique(&self) -> bool {
        self.rules
            .iter()
            .enumerate()
            .all(|(i, r)| !self.rules[..i].contains(r))
    }
}

fn arg() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-z][a-z-]{0,6}",
        2 => "--[a-z]{1,5}(=[a-z0-9]{1,3})?",
        1 => "[ -~]{0,6}",
        1 => "\\PC{0,4}",
        1 => "[\t\n\r a-z\"'\\\\]{0,4}",
    ]
}

fn image() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-z][a-z0-9./:@_-]{0,24}",
        1 => "[a-z][ -~]{0,12}",
        1 => "[a-z]\\PC{0,8}",
    ]
}

fn model() -> impl Strategy<Value = Model> {
    let volume = (any::<Index>(), 0u8..4, any::<bool>());
    let rule = (0usize..2, prop::collection::vec(arg(), 0..4), any::<bool>());
    (
        "[A-Za-z0-9][A-Za-z0-9._-]{0,10}",
        image(),
        any::<bool>(),
        0u8..3,
        subsequence(PERSIST_POOL.to_vec(), 0..=4),
        prop::collection::vec(volume, 0..4),
        subsequence((0..ALLOW_POOL.len()).collect::<Vec<_>>(), 0..=4),
        subsequence((0..DENY_POOL.len()).collect::<Vec<_>>(), 0..=3),
        prop::collection::btree_map("[A-Za-z_][A-Za-z0-9_]{0,6}", 0..HOST_NAMES.len(), 0..4),
        any::<bool>(),
        prop::collection::vec(rule, 0..3),
    )
        .prop_map(
            |(
                name,
                image,
                isolate,
                storage,
                persistent,
                volumes,
                allow,
                deny,
                env,
                escalation,
                rules,
            )| {
                let persistent: Vec<String> = persistent.into_iter().map(String::from).collect();
                let volumes = if persistent.is_empty() {
                    Vec::new()
                } else {
                    volumes
                        .into_iter()
                        .enumerate()
                        .map(|(i, (parent, source, read_only))| {
                            let (source, kind, create) = match source {
                                0 => (
                                    Source::ProfileDir(format!("s{i}")),
                                    VolumeKind::Directory,
                                    true,
                                ),
                                1 => (
                                    Source::ProfileDir(format!("state/s{i}")),
                                    VolumeKind::Directory,
                                    true,
                                ),
                                2 => (
                                    Source::Home(format!("ext/src{i}")),
                                    VolumeKind::Directory,
                                    false,
                                ),
                                _ => (Source::Home(format!("ext/src{i}")), VolumeKind::File, false),
                            };
                            Volume {
                                parent: persistent[parent.index(persistent.len())].clone(),
                                leaf: format!("v{i}"),
                                source,
                                kind,
                                access: if read_only {
                                    VolumeAccess::ReadOnly
                                } else {
                                    VolumeAccess::ReadWrite
                                },
                                create,
                            }
                        })
                        .collect()
                };
                let mut model_rules: Vec<Rule> = Vec::new();
                if escalation {
                    for (exe, args, extra) in rules {
                        let rule = Rule {
                            exe: Exe::Tool(exe),
                            extra: extra && !args.is_empty(),
                            args,
                        };
                        if !model_rules.contains(&rule) {
                            model_rules.push(rule);
                        }
                    }
                }
                Model {
                    name,
                    image,
                    isolate,
                    storage: match storage {
                        0 => Storage::Default,
                        1 => Storage::Home,
                        _ => Storage::Absolute,
                    },
                    persistent,
                    volumes,
                    allow,
                    deny,
                    env: env
                        .into_iter()
                        .map(|(k, h)| (k, HOST_NAMES[h].to_owned()))
                        .collect(),
                    escalation,
                    rules: model_rules,
                }
            },
        )
}

/// A structurally valid nonselected profile that could never resolve: its
/// volume source is missing, its variable unset, its executable absent.
fn other_model(r: &mut Rng, name: &str) -> Model {
    let persistent: Vec<String> = PERSIST_POOL
        .iter()
        .filter(|_| r.chance(30))
        .map(|p| (*p).to_owned())
        .collect();
    let volumes = match persistent.first() {
        Some(parent) if r.chance(50) => vec![Volume {
            parent: parent.clone(),
            leaf: "nv".into(),
            source: Source::ProfileDir("never-created".into()),
            kind: if r.chance(50) {
                VolumeKind::File
            } else {
                VolumeKind::Directory
            },
            access: VolumeAccess::ReadOnly,
            create: false,
        }],
        _ => Vec::new(),
    };
    let escalation = r.chance(50);
    Model {
        name: name.to_owned(),
        image: r
            .pick(&["oci:/other", "docker.io/library/alpine:3", "x y \"z\""])
            .to_owned(),
        isolate: r.chance(50),
        storage: Storage::Default,
        persistent,
        volumes,
        allow: (0..ALLOW_POOL.len()).filter(|_| r.chance(30)).collect(),
        deny: (0..DENY_POOL.len()).filter(|_| r.chance(30)).collect(),
        env: if r.chance(50) {
            BTreeMap::from([("OTHER".to_owned(), "LZ_UNSET_VARIABLE".to_owned())])
        } else {
            BTreeMap::new()
        },
        escalation,
        rules: if escalation && r.chance(70) {
            vec![Rule {
                exe: Exe::Path("/nonexistent/lazaret-tool"),
                args: vec!["x".into()],
                extra: r.chance(50),
            }]
        } else {
            Vec::new()
        },
    }
}

// ---------------------------------------------------------------------------
// Rendering a model.
// ---------------------------------------------------------------------------

/// Where the fixture's objects are.
#[derive(Debug)]
struct Ctx {
    home: PathBuf,
    base: PathBuf,
}

impl Ctx {
    fn of(f: &Fixture) -> Self {
        Self {
            home: f.home.clone(),
            base: f.base().to_path_buf(),
        }
    }
}

fn path_text(p: &Path) -> String {
    p.to_str().expect("fixture paths are UTF-8").to_owned()
}

#[derive(Debug, Default)]
struct Globals {
    allow: Vec<String>,
    deny: Vec<String>,
}

/// A prefix written with random host bits set.
fn prefix_text(r: &mut Rng, (net, len): ([u8; 4], u8)) -> String {
    let host_mask = if len >= 32 { 0 } else { u32::MAX >> len };
    let address = u32::from_be_bytes(net) | (r.bits() as u32 & host_mask);
    let [a, b, c, d] = address.to_be_bytes();
    format!("{a}.{b}.{c}.{d}/{len}")
}

/// Puts a prefix in the profile list, the global list or both (only the
/// selected profile may use the global lists), sometimes twice.
fn place_prefix(
    r: &mut Rng,
    prefix: ([u8; 4], u8),
    selected: bool,
    local: &mut Vec<String>,
    global: &mut Vec<String>,
) {
    let copies = if r.chance(25) { 2 } else { 1 };
    for _ in 0..copies {
        match if selected { r.below(3) } else { 0 } {
            0 => local.push(prefix_text(r, prefix)),
            1 => global.push(prefix_text(r, prefix)),
            _ => {
                local.push(prefix_text(r, prefix));
                global.push(prefix_text(r, prefix));
            }
        }
    }
}

fn volume_entries(r: &mut Rng, ctx: &Ctx, v: &Volume) -> Vec<Entry> {
    let host = match &v.source {
        Source::ProfileDir(s) => format!("{{profile_dir}}/{s}"),
        Source::Home(s) if r.chance(50) => format!("~/{s}"),
        Source::Home(s) => path_text(&ctx.home.join(s)),
    };
    let mut entries = vec![
        (k("host"), V::S(host)),
        (k("container"), V::S(Model::container(v))),
        (k("kind"), V::S(v.kind.as_str().to_owned())),
    ];
    if v.access == VolumeAccess::ReadOnly || r.chance(40) {
        entries.push((k("access"), V::S(v.access.as_str().to_owned())));
    }
    if v.create || r.chance(40) {
        entries.push((k("create"), V::B(v.create)));
    }
    entries
}

fn rule_entries(r: &mut Rng, ctx: &Ctx, rule: &Rule) -> Vec<Entry> {
    let exe = match &rule.exe {
        Exe::Tool(i) => match r.below(3) {
            0 => path_text(&ctx.home.join(format!("bin/tool{i}"))),
            1 => format!("~/bin/tool{i}"),
            _ => format!("~/bin/tool{i}-link"),
        },
        Exe::Path(p) => (*p).to_owned(),
    };
    let mut entries = vec![(k("executable"), V::S(exe))];
    if !rule.args.is_empty() || r.chance(40) {
        entries.push((
            k("args"),
            V::A(rule.args.iter().cloned().map(V::S).collect()),
        ));
    }
    if rule.extra || r.chance(40) {
        entries.push((k("allow_extra_args"), V::B(rule.extra)));
    }
    entries
}

/// The sections of one profile: its main table and any subtables.
fn profile_sections(
    r: &mut Rng,
    ctx: &Ctx,
    m: &Model,
    selected: bool,
    globals: &mut Globals,
) -> Vec<Section> {
    let path = vec!["profiles".to_owned(), m.name.clone()];
    let sub = |names: &[&str]| {
        let mut p = path.clone();
        p.extend(names.iter().map(|n| (*n).to_owned()));
        p
    };
    let mut main: Vec<Entry> = Vec::new();
    let mut extra: Vec<Section> = Vec::new();

    main.push((k("image"), V::S(m.image.clone())));
    if !m.isolate || r.chance(40) {
        main.push((k("isolate_gitignored"), V::B(m.isolate)));
    }
    let mut dirs: Vec<V> = m.persistent.iter().cloned().map(V::S).collect();
    r.shuffle(&mut dirs);
    if !dirs.is_empty() || r.chance(30) {
        main.push((k("persistent_dirs"), V::A(dirs)));
    }

    let (mut allow, mut deny) = (Vec::new(), Vec::new());
    for &i in &m.allow {
        place_prefix(r, ALLOW_POOL[i], selected, &mut allow, &mut globals.allow);
    }
    for &i in &m.deny {
        place_prefix(r, DENY_POOL[i], selected, &mut deny, &mut globals.deny);
    }
    for p in RFC1918 {
        if r.chance(30) {
            let prefix = (p.network(), p.prefix_len());
            place_prefix(r, prefix, selected, &mut deny, &mut globals.deny);
        }
    }
    for (key, mut list) in [("allow_egress", allow), ("deny_egress", deny)] {
        r.shuffle(&mut list);
        if !list.is_empty() || r.chance(30) {
            main.push((k(key), V::A(list.into_iter().map(V::S).collect())));
        }
    }

    let env: Vec<Entry> = m
        .env
        .iter()
        .map(|(name, host)| (k(name), V::S(format!("env:{host}"))))
        .collect();
    match r.below(3) {
        0 => {
            if !env.is_empty() || r.chance(30) {
                main.push((k("env"), V::T(env)));
            }
        }
        1 => {
            if !env.is_empty() || r.chance(50) {
                extra.push(Section {
                    header: Some((false, sub(&["env"]))),
                    entries: env,
                });
            }
        }
        _ => {
            for (key, v) in env {
                let mut dotted = k("env");
                dotted.extend(key);
                main.push((dotted, v));
            }
        }
    }

    let mut volumes: Vec<Vec<Entry>> = m
        .volumes
        .iter()
        .map(|v| volume_entries(r, ctx, v))
        .collect();
    r.shuffle(&mut volumes);
    if r.below(2) == 0 {
        if !volumes.is_empty() || r.chance(30) {
            main.push((k("volumes"), V::A(volumes.into_iter().map(V::T).collect())));
        }
    } else {
        for entries in volumes {
            extra.push(Section {
                header: Some((true, sub(&["volumes"]))),
                entries,
            });
        }
    }

    let mut rules: Vec<Vec<Entry>> = m.rules.iter().map(|x| rule_entries(r, ctx, x)).collect();
    r.shuffle(&mut rules);
    let rules_value = |rules: Vec<Vec<Entry>>| V::A(rules.into_iter().map(V::T).collect());
    if m.escalation {
        let enabled = (k("enabled"), V::B(true));
        match r.below(4) {
            0 => {
                let mut esc = vec![enabled];
                if !rules.is_empty() || r.chance(30) {
                    esc.push((k("auto_approve"), rules_value(rules)));
                }
                extra.push(Section {
                    header: Some((false, sub(&["escalation"]))),
                    entries: esc,
                });
            }
            1 => {
                extra.push(Section {
                    header: Some((false, sub(&["escalation"]))),
                    entries: vec![enabled],
                });
                for entries in rules {
                    extra.push(Section {
                        header: Some((true, sub(&["escalation", "auto_approve"]))),
                        entries,
                    });
                }
            }
            2 => {
                let mut esc = vec![enabled];
                if !rules.is_empty() || r.chance(30) {
                    esc.push((k("auto_approve"), rules_value(rules)));
                }
                main.push((k("escalation"), V::T(esc)));
            }
            _ => {
                main.push((vec!["escalation".into(), "enabled".into()], V::B(true)));
                if !rules.is_empty() || r.chance(30) {
                    main.push((
                        vec!["escalation".into(), "auto_approve".into()],
                        rules_value(rules),
                    ));
                }
            }
        }
    } else {
        assert!(rules.is_empty(), "rules need escalation enabled");
        let mut esc = Vec::new();
        if r.chance(50) {
            esc.push((k("enabled"), V::B(false)));
        }
        if r.chance(30) {
            esc.push((k("auto_approve"), V::A(Vec::new())));
        }
        match r.below(4) {
            0 => {}
            1 => extra.push(Section {
                header: Some((false, sub(&["escalation"]))),
                entries: esc,
            }),
            2 => main.push((k("escalation"), V::T(esc))),
            _ => {
                for (key, v) in esc {
                    let mut dotted = k("escalation");
                    dotted.extend(key);
                    main.push((dotted, v));
                }
            }
        }
    }

    let mut sections = vec![Section {
        header: Some((false, path.clone())),
        entries: main,
    }];
    sections.extend(extra);
    sections
}

/// Places the `storage` or `network` table: a `[name]` section, an inline
/// table or dotted keys at the root; an empty one is omitted or written
/// empty.
fn place_table(
    r: &mut Rng,
    root: &mut Vec<Entry>,
    sections: &mut Vec<Section>,
    name: &str,
    entries: Vec<Entry>,
) {
    if entries.is_empty() {
        match r.below(3) {
            0 => {}
            1 => sections.push(Section {
                header: Some((false, k(name))),
                entries,
            }),
            _ => root.push((k(name), V::T(entries))),
        }
        return;
    }
    match r.below(3) {
        0 => sections.push(Section {
            header: Some((false, k(name))),
            entries,
        }),
        1 => root.push((k(name), V::T(entries))),
        _ => {
            for (key, v) in entries {
                let mut dotted = k(name);
                dotted.extend(key);
                root.push((dotted, v));
            }
        }
    }
}

/// The whole document: the selected profile, random nonselected profiles,
/// storage and network tables.
fn render_model(r: &mut Rng, ctx: &Ctx, m: &Model) -> String {
    let mut root: Vec<Entry> = vec![(k("schema"), V::S(SCHEMA_ID.to_owned()))];
    let mut globals = Globals::default();
    let mut sections = profile_sections(r, ctx, m, true, &mut globals);

    let others = r.below(4);
    let mut names: Vec<&str> = OTHER_NAMES
        .iter()
        .copied()
        .filter(|n| *n != m.name)
        .collect();
    r.shuffle(&mut names);
    for name in names.into_iter().take(others) {
        let other = other_model(r, name);
        sections.extend(profile_sections(r, ctx, &other, false, &mut globals));
    }

    let data_root = match m.storage {
        Storage::Default if r.chance(25) => Some("~/.local/share/lazaret".to_owned()),
        Storage::Default => None,
        Storage::Home if r.chance(50) => Some("~/data-a".to_owned()),
        Storage::Home => Some(path_text(&ctx.home.join("data-a"))),
        Storage::Absolute => Some(path_text(&ctx.base.join("data-b"))),
    };
    let storage = data_root
        .into_iter()
        .map(|d| (k("data_root"), V::S(d)))
        .collect();
    place_table(r, &mut root, &mut sections, "storage", storage);

    let mut network = Vec::new();
    for (key, mut list) in [
        ("default_allow", std::mem::take(&mut globals.allow)),
        ("default_deny", std::mem::take(&mut globals.deny)),
    ] {
        r.shuffle(&mut list);
        if !list.is_empty() || r.chance(20) {
            network.push((k(key), V::A(list.into_iter().map(V::S).collect())));
        }
    }
    place_table(r, &mut root, &mut sections, "network", network);

    sections.insert(
        0,
        Section {
            header: None,
            entries: root,
        },
    );
    render_sections(r, sections)
}

// ---------------------------------------------------------------------------
// Fixtures.
// ---------------------------------------------------------------------------

fn make_source(path: &Path, kind: VolumeKind) {
    match kind {
        VolumeKind::Directory => std::fs::create_dir_all(path).unwrap(),
        VolumeKind::File => write_file(path, "notes\n", 0o644),
    }
}

fn replace_source(path: &Path, kind: VolumeKind) {
    if path.is_dir() {
        std::fs::remove_dir_all(path).unwrap();
    } else {
        std::fs::remove_file(path).unwrap();
    }
    make_source(path, kind);
}

/// A fixture with the host variables, two executables (and a symlink to
/// each) in `~/bin`, a second runtime directory, and `m`'s external volume
/// sources.
fn prepared(m: &Model) -> Fixture {
    let mut f = Fixture::new();
    for (name, value) in HOST_VARS {
        f.vars.push((name.to_owned(), value.into()));
    }
    let bin = f.home.join("bin");
    for i in 0..2 {
        write_file(&bin.join(format!("tool{i}")), "#!/bin/sh\nexit 0\n", 0o755);
        std::os::unix::fs::symlink(format!("tool{i}"), bin.join(format!("tool{i}-link"))).unwrap();
    }
    let run2 = f.base().join("run2");
    std::fs::create_dir(&run2).unwrap();
    std::fs::set_permissions(&run2, std::fs::Permissions::from_mode(0o700)).unwrap();
    for v in &m.volumes {
        if let Source::Home(s) = &v.source {
            make_source(&f.home.join(s), v.kind);
        }
    }
    f
}

fn explain(e: &ConfigError) -> String {
    lazaret_proto::error_chain(e)
}

/// Renders `m` with `r` and loads it; a failure carries the document.
fn load_model(
    f: &Fixture,
    m: &Model,
    r: &mut Rng,
) -> Result<ResolvedDomainConfiguration, TestCaseError> {
    let text = render_model(r, &Ctx::of(f), m);
    f.load_text(&m.name, &text).map_err(|e| {
        TestCaseError::fail(format!(
            "loading profile `{}` failed: {}\n--- document ---\n{text}\n--- end ---",
            m.name,
            explain(&e)
        ))
    })
}

// ---------------------------------------------------------------------------
// Hand-framed digests (schema.md, "Domain and configuration digests").
// ---------------------------------------------------------------------------

/// `bytes(x)`: `u32be(length(x)) || x`.
fn frame(x: &[u8]) -> Vec<u8> {
    let mut out = u32::try_from(x.len()).unwrap().to_be_bytes().to_vec();
    out.extend_from_slice(x);
    out
}

/// `u32be(count)` then `bytes(item)` for every item, after sorting the
/// complete item encodings bytewise when `sorted`.
fn list(mut items: Vec<Vec<u8>>, sorted: bool) -> Vec<u8> {
    if sorted {
        items.sort();
    }
    let mut out = u32::try_from(items.len()).unwrap().to_be_bytes().to_vec();
    for item in &items {
        out.extend(frame(item));
    }
    out
}

fn prefix_item(p: &Ipv4Prefix) -> Vec<u8> {
    let mut item = p.network().to_vec();
    item.push(p.prefix_len());
    item
}

/// The `ConfigurationFingerprintV1` preimage of a record, framed here.
fn hand_preimage(rec: &ConfigurationFingerprintRecordV1) -> Vec<u8> {
    let mut p = b"lazaret-configuration-fingerprint-v1\0".to_vec();
    p.extend(frame(rec.selected_profile.as_bytes()));
    p.extend(frame(&rec.storage_root));
    p.extend(frame(&rec.runtime_root));
    p.extend(frame(rec.image.as_bytes()));
    p.push(u8::from(rec.isolate_gitignored));
    p.extend(list(
        rec.persistent_dirs
            .iter()
            .map(|d| frame(d.as_bytes()))
            .collect(),
        true,
    ));
    p.extend(list(
        rec.environment_references
            .iter()
            .map(|e| {
                [
                    frame(e.sandbox_name.as_bytes()),
                    frame(e.host_name.as_bytes()),
                ]
                .concat()
            })
            .collect(),
        true,
    ));
    p.extend(list(
        rec.volumes
            .iter()
            .map(|v| {
                let mut item = [
                    frame(&v.canonical_host_source),
                    frame(v.container_path.as_bytes()),
                ]
                .concat();
                item.push(match v.kind {
                    VolumeKind::File => 0,
                    VolumeKind::Directory => 1,
                });
                item.push(match v.access {
                    VolumeAccess::ReadOnly => 0,
                    VolumeAccess::ReadWrite => 1,
                });
                item.push(u8::from(v.create));
                item
            })
            .collect(),
        true,
    ));
    p.extend(list(
        rec.effective_allow_prefixes
            .iter()
            .map(prefix_item)
            .collect(),
        true,
    ));
    p.extend(list(
        rec.effective_deny_prefixes
            .iter()
            .map(prefix_item)
            .collect(),
        true,
    ));
    p.push(u8::from(rec.escalation_enabled));
    p.extend(list(
        rec.auto_approval_rules
            .iter()
            .map(|r| {
                let mut item = frame(&r.canonical_executable);
                item.extend(list(
                    r.args.iter().map(|a| frame(a.as_bytes())).collect(),
                    false,
                ));
                item.push(u8::from(r.allow_extra_args));
                item
            })
            .collect(),
        true,
    ));
    p
}

/// The `DomainIdV1` preimage, framed here.
fn hand_domain_preimage(profile: &str, workspace: &[u8]) -> Vec<u8> {
    let mut p = b"lazaret-domain-id-v1\0".to_vec();
    p.extend(frame(profile.as_bytes()));
    p.extend(frame(workspace));
    p
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

fn path_bytes(p: &Path) -> Vec<u8> {
    p.as_os_str().as_bytes().to_vec()
}

fn storage_root(f: &Fixture, storage: Storage) -> PathBuf {
    match storage {
        Storage::Default => f.home.join(".local/share/lazaret"),
        Storage::Home => f.home.join("data-a"),
        Storage::Absolute => f.base().join("data-b"),
    }
}

/// The record the loader must produce for `m`, computed from the model and
/// the fixture alone (list order is irrelevant: the preimage sorts).
fn expected_record(f: &Fixture, m: &Model) -> ConfigurationFingerprintRecordV1 {
    let storage = storage_root(f, m.storage);
    let profile_dir = storage.join("profiles").join(&m.name);
    let prefix = |(net, len): ([u8; 4], u8)| Ipv4Prefix::new(net, len).unwrap();
    ConfigurationFingerprintRecordV1 {
        selected_profile: m.name.clone(),
        storage_root: path_bytes(&storage),
        runtime_root: path_bytes(&f.runtime.join("lazaret")),
        image: m.image.clone(),
        isolate_gitignored: m.isolate,
        persistent_dirs: m.persistent.clone(),
        environment_references: m
            .env
            .iter()
            .map(|(name, host)| EnvironmentReference {
                sandbox_name: name.clone(),
                host_name: host.clone(),
            })
            .collect(),
        volumes: m
            .volumes
            .iter()
            .map(|v| ResolvedVolume {
                canonical_host_source: path_bytes(&match &v.source {
                    Source::ProfileDir(s) => profile_dir.join(s),
                    Source::Home(s) => f.home.join(s),
                }),
                container_path: Model::container(v),
                kind: v.kind,
                access: v.access,
                create: v.create,
            })
            .collect(),
        effective_allow_prefixes: m.allow.iter().map(|&i| prefix(ALLOW_POOL[i])).collect(),
        effective_deny_prefixes: m
            .deny
            .iter()
            .map(|&i| prefix(DENY_POOL[i]))
            .chain(RFC1918)
            .collect(),
        escalation_enabled: m.escalation,
        auto_approval_rules: m
            .rules
            .iter()
            .map(|r| ResolvedAutoApprovalRule {
                canonical_executable: path_bytes(&match r.exe {
                    Exe::Tool(i) => f.home.join(format!("bin/tool{i}")),
                    Exe::Path(p) => PathBuf::from(p),
                }),
                args: r.args.clone(),
                allow_extra_args: r.extra,
            })
            .collect(),
    }
}

/// Both digests of a loaded configuration against hand-framed preimages.
fn check_digests(f: &Fixture, c: &ResolvedDomainConfiguration) -> Result<(), TestCaseError> {
    let rec = c.record();
    let preimage = hand_preimage(rec);
    prop_assert_eq!(
        &preimage,
        &rec.canonical_bytes().unwrap(),
        "hand-framed preimage differs from canonical_bytes for {:?}",
        rec
    );
    prop_assert_eq!(sha256(&preimage), c.fingerprint().0);
    prop_assert_eq!(&rec.selected_profile, c.profile().as_str());
    let workspace = c.authorities().workspace.label();
    prop_assert_eq!(workspace, f.workspace.as_path());
    let domain = hand_domain_preimage(c.profile().as_str(), &path_bytes(workspace));
    prop_assert_eq!(sha256(&domain), c.domain_id().0);
    Ok(())
}

/// The digests, and the record against the one the model predicts.
fn check_model(
    f: &Fixture,
    m: &Model,
    c: &ResolvedDomainConfiguration,
) -> Result<(), TestCaseError> {
    check_digests(f, c)?;
    let expected = expected_record(f, m);
    prop_assert!(
        hand_preimage(&expected) == hand_preimage(c.record()),
        "the loaded record differs from the model's\nexpected: {:?}\nloaded:   {:?}",
        expected,
        c.record()
    );
    // Values are resolved (though never fingerprinted).
    let host = f.host();
    for (name, value) in c.environment() {
        let wanted = host.variable(&m.env[name.as_str()]).unwrap();
        prop_assert_eq!(value.expose(), wanted.to_str().unwrap());
    }
    prop_assert_eq!(c.environment().len(), m.env.len());
    Ok(())
}

// ---------------------------------------------------------------------------
// Mutations of every included field.
// ---------------------------------------------------------------------------

fn prefix_set(c: &mut Model, deny: bool) -> &mut Vec<usize> {
    if deny { &mut c.deny } else { &mut c.allow }
}

fn first_unused(used: &[usize], pool_len: usize) -> Option<usize> {
    (0..pool_len).find(|i| !used.contains(i))
}

/// Every valid single-field change of `m`, named.
fn mutations(m: &Model) -> Vec<(&'static str, Model)> {
    let mut out = Vec::new();
    let mut add = |what: &'static str, edit: &dyn Fn(&mut Model) -> bool| {
        let mut c = m.clone();
        if edit(&mut c) {
            out.push((what, c));
        }
    };
    let profile_volume = |c: &Model| {
        c.volumes
            .iter()
            .position(|v| matches!(v.source, Source::ProfileDir(_)))
    };

    add("image", &|c| {
        c.image.push('x');
        true
    });
    add("isolate_gitignored", &|c| {
        c.isolate = !c.isolate;
        true
    });
    add("storage root", &|c| {
        c.storage = match c.storage {
            Storage::Default => Storage::Home,
            Storage::Home => Storage::Absolute,
            Storage::Absolute => Storage::Default,
        };
        true
    });
    add("selected profile name", &|c| {
        c.name.push('x');
        true
    });
    add("persistent dir added", &|c| match PERSIST_POOL
        .iter()
        .find(|p| !c.persistent.iter().any(|q| q == *p))
    {
        Some(p) => {
            c.persistent.push((*p).to_owned());
            true
        }
        None => false,
    });
    let without_volumes = |c: &Model| {
        c.persistent
            .iter()
            .position(|p| !c.volumes.iter().any(|v| &v.parent == p))
    };
    add("persistent dir removed", &|c| match without_volumes(c) {
        Some(i) => {
            c.persistent.remove(i);
            true
        }
        None => false,
    });
    add("persistent dir replaced", &|c| {
        let unused = PERSIST_POOL
            .iter()
            .find(|p| !c.persistent.iter().any(|q| q == *p));
        match (without_volumes(c), unused) {
            (Some(i), Some(p)) => {
                c.persistent[i] = (*p).to_owned();
                true
            }
            _ => false,
        }
    });
    add("env sandbox name", &|c| {
        let Some((name, host)) = c.env.iter().next().map(|(a, b)| (a.clone(), b.clone())) else {
            return false;
        };
        let renamed = format!("{name}_X");
        if c.env.contains_key(&renamed) {
            return false;
        }
        c.env.remove(&name);
        c.env.insert(renamed, host);
        true
    });
    add("env host name", &|c| {
        let Some(host) = c.env.values_mut().next() else {
            return false;
        };
        let i = HOST_NAMES.iter().position(|h| *h == host.as_str()).unwrap();
        *host = HOST_NAMES[(i + 1) % HOST_NAMES.len()].to_owned();
        true
    });
    add("env entry added", &|c| {
        c.env
            .insert("ADDED_ENV".to_owned(), "LZ_C".to_owned())
            .is_none()
    });
    add("env entry removed", &|c| c.env.pop_first().is_some());
    add("volume host", &|c| match profile_volume(c) {
        Some(i) => {
            if let Source::ProfileDir(s) = &mut c.volumes[i].source {
                s.push('x');
            }
            true
        }
        None => false,
    });
    add("volume container", &|c| match c.volumes.first_mut() {
        Some(v) => {
            v.leaf.push('x');
            true
        }
        None => false,
    });
    add("volume access", &|c| match c.volumes.first_mut() {
        Some(v) => {
            v.access = match v.access {
                VolumeAccess::ReadOnly => VolumeAccess::ReadWrite,
                VolumeAccess::ReadWrite => VolumeAccess::ReadOnly,
            };
            true
        }
        None => false,
    });
    // The base load created the source, so `create = false` still resolves.
    add("volume create", &|c| match profile_volume(c) {
        Some(i) => {
            c.volumes[i].create = false;
            true
        }
        None => false,
    });
    add("volume added", &|c| match c.persistent.first() {
        Some(parent) => {
            c.volumes.push(Volume {
                parent: parent.clone(),
                leaf: "added".into(),
                source: Source::ProfileDir("added".into()),
                kind: VolumeKind::Directory,
                access: VolumeAccess::ReadWrite,
                create: true,
            });
            true
        }
        None => false,
    });
    add("volume removed", &|c| {
        if c.volumes.is_empty() {
            return false;
        }
        c.volumes.remove(0);
        true
    });
    for deny in [false, true] {
        let pool = if deny {
            DENY_POOL.len()
        } else {
            ALLOW_POOL.len()
        };
        let names: [&'static str; 3] = if deny {
            [
                "deny prefix added",
                "deny prefix removed",
                "deny prefix replaced",
            ]
        } else {
            [
                "allow prefix added",
                "allow prefix removed",
                "allow prefix replaced",
            ]
        };
        add(names[0], &|c| {
            let s = prefix_set(c, deny);
            match first_unused(s, pool) {
                Some(i) => {
                    s.push(i);
                    true
                }
                None => false,
            }
        });
        add(names[1], &|c| {
            let s = prefix_set(c, deny);
            if s.is_empty() {
                return false;
            }
            s.remove(0);
            true
        });
        add(names[2], &|c| {
            let s = prefix_set(c, deny);
            match (s.is_empty(), first_unused(s, pool)) {
                (false, Some(i)) => {
                    s[0] = i;
                    true
                }
                _ => false,
            }
        });
    }
    add("escalation enabled", &|c| {
        if !c.rules.is_empty() {
            return false;
        }
        c.escalation = !c.escalation;
        true
    });
    add("rule argument changed", &|c| {
        let Some(arg) = c.rules.first_mut().and_then(|r| r.args.first_mut()) else {
            return false;
        };
        arg.push('x');
        c.rules_unique()
    });
    add("rule arguments swapped", &|c| {
        let Some(rule) = c
            .rules
            .iter_mut()
            .find(|r| r.args.windows(2).any(|w| w[0] != w[1]))
        else {
            return false;
        };
        let i = rule.args.windows(2).position(|w| w[0] != w[1]).unwrap();
        rule.args.swap(i, i + 1);
        c.rules_unique()
    });
    add("rule argument appended", &|c| {
        let Some(rule) = c.rules.first_mut() else {
            return false;
        };
        rule.args.push("appended".into());
        c.rules_unique()
    });
    add("rule allow_extra_args", &|c| {
        let Some(rule) = c.rules.iter_mut().find(|r| !r.args.is_empty()) else {
            return false;
        };
        rule.extra = !rule.extra;
        c.rules_unique()
    });
    add("rule executable", &|c| {
        let Some(rule) = c.rules.first_mut() else {
            return false;
        };
        if let Exe::Tool(i) = &mut rule.exe {
            *i = 1 - *i;
        }
        c.rules_unique()
    });
    add("rule added", &|c| {
        if !c.escalation {
            return false;
        }
        c.rules.push(Rule {
            exe: Exe::Tool(0),
            args: vec!["added-rule".into()],
            extra: false,
        });
        c.rules_unique()
    });
    add("rule removed", &|c| {
        if c.rules.is_empty() {
            return false;
        }
        c.rules.remove(0);
        true
    });
    out
}

/// Loads `m`, then every change of it in the same fixture: each changed
/// included field changes the fingerprint; a changed host value does not.
/// Returns how many changes were checked.
fn check_every_change(m: &Model, seed: u64) -> Result<usize, TestCaseError> {
    let mut f = prepared(m);
    let mut r = Rng::seeded(seed);
    let base = load_model(&f, m, &mut r)?;
    check_model(&f, m, &base)?;
    let fingerprint = base.fingerprint();
    drop(base);
    let mut checked = 0;

    for (what, changed) in mutations(m) {
        let c = load_model(&f, &changed, &mut r)
            .map_err(|e| TestCaseError::fail(format!("after changing {what}: {e}")))?;
        check_model(&f, &changed, &c)?;
        prop_assert_ne!(
            c.fingerprint(),
            fingerprint,
            "changing {} left the fingerprint unchanged",
            what
        );
        checked += 1;
    }

    // Host variable values are excluded: only the names are fingerprinted.
    let saved = f.vars.clone();
    for (_, value) in &mut f.vars {
        value.push("-changed");
    }
    let c = load_model(&f, m, &mut r)?;
    check_model(&f, m, &c)?;
    prop_assert_eq!(
        c.fingerprint(),
        fingerprint,
        "changing only host variable values changed the fingerprint"
    );
    drop(c);
    f.vars = saved;

    // The Runtime Root.
    let run2 = f.base().join("run2");
    let saved = std::mem::replace(&mut f.runtime, run2);
    let c = load_model(&f, m, &mut r)?;
    check_model(&f, m, &c)?;
    prop_assert_ne!(
        c.fingerprint(),
        fingerprint,
        "the runtime root is not fingerprinted"
    );
    drop(c);
    f.runtime = saved;
    checked += 1;

    // A volume's kind, with the source replaced by one of the new kind at
    // the same path.
    let external = m
        .volumes
        .iter()
        .enumerate()
        .find_map(|(i, v)| match &v.source {
            Source::Home(s) => Some((i, f.home.join(s))),
            Source::ProfileDir(_) => None,
        });
    if let Some((i, path)) = external {
        let old = m.volumes[i].kind;
        let new = match old {
            VolumeKind::File => VolumeKind::Directory,
            VolumeKind::Directory => VolumeKind::File,
        };
        let mut changed = m.clone();
        changed.volumes[i].kind = new;
        replace_source(&path, new);
        let c = load_model(&f, &changed, &mut r)?;
        check_model(&f, &changed, &c)?;
        prop_assert_ne!(
            c.fingerprint(),
            fingerprint,
            "a volume kind is not fingerprinted"
        );
        drop(c);
        replace_source(&path, old);
        checked += 1;
    }
    Ok(checked)
}

fn cases(n: u32) -> ProptestConfig {
    ProptestConfig {
        cases: n,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------------------
// 1 and 3: presentation invariance, with every load's digests checked.
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(cases(48))]

    #[test]
    fn fingerprint_ignores_presentation(m in model(), seeds in any::<[u64; 3]>()) {
        let f = prepared(&m);
        let plain = load_model(&f, &m, &mut Rng::plain())?;
        check_model(&f, &m, &plain)?;
        for seed in seeds {
            let c = load_model(&f, &m, &mut Rng::seeded(seed))?;
            check_model(&f, &m, &c)?;
            prop_assert_eq!(
                c.fingerprint(),
                plain.fingerprint(),
                "seed {} changed the fingerprint",
                seed
            );
            prop_assert_eq!(c.domain_id(), plain.domain_id());
        }
    }
}

// ---------------------------------------------------------------------------
// 2: every included field changes the fingerprint.
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(cases(24))]

    #[test]
    fn fingerprint_covers_every_included_field(m in model(), seed in any::<u64>()) {
        check_every_change(&m, seed)?;
    }
}

/// A model in which every mutation applies.
fn rich_model() -> Model {
    Model {
        name: "dev".into(),
        image: "docker.io/library/debian:trixie".into(),
        isolate: true,
        storage: Storage::Default,
        persistent: vec!["/root".into(), "/home/agent".into(), "/opt/tools".into()],
        volumes: vec![
            Volume {
                parent: "/root".into(),
                leaf: "state".into(),
                source: Source::ProfileDir("agent-state".into()),
                kind: VolumeKind::Directory,
                access: VolumeAccess::ReadWrite,
                create: true,
            },
            Volume {
                parent: "/home/agent".into(),
                leaf: "notes.txt".into(),
                source: Source::Home("ext/notes.txt".into()),
                kind: VolumeKind::File,
                access: VolumeAccess::ReadOnly,
                create: false,
            },
            Volume {
                parent: "/home/agent".into(),
                leaf: "cache".into(),
                source: Source::Home("ext/cache".into()),
                kind: VolumeKind::Directory,
                access: VolumeAccess::ReadWrite,
                create: false,
            },
        ],
        allow: vec![0, 3],
        deny: vec![0, 1],
        env: BTreeMap::from([
            ("TOKEN".to_owned(), "LZ_A".to_owned()),
            ("OTHER".to_owned(), "LZ_C".to_owned()),
        ]),
        escalation: true,
        rules: vec![
            Rule {
                exe: Exe::Tool(0),
                args: vec!["status".into(), "--short".into()],
                extra: false,
            },
            Rule {
                exe: Exe::Tool(1),
                args: vec!["log".into()],
                extra: true,
            },
        ],
    }
}

#[test]
fn every_included_field_changes_the_fingerprint() {
    let rich = rich_model();
    let mut no_rules = rich.clone();
    no_rules.rules.clear();
    let mut disabled = no_rules.clone();
    disabled.escalation = false;
    for (model, expected) in [(&rich, 32), (&no_rules, 27), (&disabled, 26)] {
        for seed in [0, 1, 2] {
            let checked = check_every_change(model, seed).unwrap();
            assert_eq!(checked, expected, "mutations checked for {model:?}");
        }
    }
}

// ---------------------------------------------------------------------------
// 3: digests of one configuration, framed entirely by hand.
// ---------------------------------------------------------------------------

#[test]
fn digests_match_preimages_framed_by_hand() {
    let f = prepared(&rich_model());
    let text = r#"
schema = "lazaret-trusted-host-config-v1"

[storage]
data_root = "~/state"

[network]
default_allow = ["198.51.100.7/24"]
default_deny = ["100.64.0.0/10", "10.222.0.0/16"]

[profiles.dev]
image = "docker.io/library/debian:trixie"
isolate_gitignored = false
persistent_dirs = ["/home/agent", "/root"]
allow_egress = ["203.0.113.10/32"]
deny_egress = ["10.222.7.9/16", "10.0.0.0/8"]
env = { TOKEN = "env:LZ_A", B = "env:LZ_B" }
volumes = [
  { host = "{profile_dir}/agent-state", container = "/root/.local/state/agent", kind = "directory", create = true },
  { host = "~/ext/notes.txt", container = "/home/agent/notes.txt", kind = "file", access = "read-only" },
]

[profiles.dev.escalation]
enabled = true
auto_approve = [
  { executable = "~/bin/tool0", args = ["status", "--short"], allow_extra_args = true },
  { executable = "~/bin/tool0-link" },
]
"#;
    let c = f
        .load_text("dev", text)
        .unwrap_or_else(|e| panic!("{}", explain(&e)));

    let u32be = |n: usize| u32::try_from(n).unwrap().to_be_bytes();
    let bytes = |out: &mut Vec<u8>, x: &[u8]| {
        out.extend_from_slice(&u32be(x.len()));
        out.extend_from_slice(x);
    };
    let storage = f.home.join("state");
    let profile_dir = storage.join("profiles/dev");
    let exe = path_bytes(&f.home.join("bin/tool0"));

    let mut p = Vec::new();
    p.extend_from_slice(b"lazaret-configuration-fingerprint-v1\0");
    bytes(&mut p, b"dev");
    bytes(&mut p, &path_bytes(&storage));
    bytes(&mut p, &path_bytes(&f.runtime.join("lazaret")));
    bytes(&mut p, b"docker.io/library/debian:trixie");
    p.push(0x00); // isolate_gitignored = false
    // persistent_dirs: items bytes(path), framed again; sorted by the
    // complete item encoding, whose length prefix puts "/root" first.
    p.extend_from_slice(&[0, 0, 0, 2]);
    p.extend_from_slice(&[0, 0, 0, 9, 0, 0, 0, 5]);
    p.extend_from_slice(b"/root");
    p.extend_from_slice(&[0, 0, 0, 15, 0, 0, 0, 11]);
    p.extend_from_slice(b"/home/agent");
    // environment references: bytes(sandbox) || bytes(host); "B" first.
    p.extend_from_slice(&[0, 0, 0, 2]);
    p.extend_from_slice(&[0, 0, 0, 13, 0, 0, 0, 1]);
    p.extend_from_slice(b"B");
    p.extend_from_slice(&[0, 0, 0, 4]);
    p.extend_from_slice(b"LZ_B");
    p.extend_from_slice(&[0, 0, 0, 17, 0, 0, 0, 5]);
    p.extend_from_slice(b"TOKEN");
    p.extend_from_slice(&[0, 0, 0, 4]);
    p.extend_from_slice(b"LZ_A");
    // volumes: bytes(host) || bytes(container) || kind || access || create.
    let mut state = Vec::new();
    bytes(&mut state, &path_bytes(&profile_dir.join("agent-state")));
    bytes(&mut state, b"/root/.local/state/agent");
    state.extend_from_slice(&[0x01, 0x01, 0x01]);
    let mut notes = Vec::new();
    bytes(&mut notes, &path_bytes(&f.home.join("ext/notes.txt")));
    bytes(&mut notes, b"/home/agent/notes.txt");
    notes.extend_from_slice(&[0x00, 0x00, 0x00]);
    let mut volumes = [state, notes];
    volumes.sort();
    p.extend_from_slice(&[0, 0, 0, 2]);
    for item in &volumes {
        bytes(&mut p, item);
    }
    // effective allow: the global and profile prefixes, host bits cleared.
    p.extend_from_slice(&[0, 0, 0, 2]);
    p.extend_from_slice(&[0, 0, 0, 5, 198, 51, 100, 0, 24]);
    p.extend_from_slice(&[0, 0, 0, 5, 203, 0, 113, 10, 32]);
    // effective deny: deduplicated, with RFC 1918.
    p.extend_from_slice(&[0, 0, 0, 5]);
    p.extend_from_slice(&[0, 0, 0, 5, 10, 0, 0, 0, 8]);
    p.extend_from_slice(&[0, 0, 0, 5, 10, 222, 0, 0, 16]);
    p.extend_from_slice(&[0, 0, 0, 5, 100, 64, 0, 0, 10]);
    p.extend_from_slice(&[0, 0, 0, 5, 172, 16, 0, 0, 12]);
    p.extend_from_slice(&[0, 0, 0, 5, 192, 168, 0, 0, 16]);
    p.push(0x01); // escalation enabled
    // rules: bytes(exe) || declared-order list of bytes(arg) || extra. The
    // rule without arguments sorts first (its count is 0).
    let mut bare = Vec::new();
    bytes(&mut bare, &exe);
    bare.extend_from_slice(&[0, 0, 0, 0]);
    bare.push(0x00);
    let mut status = Vec::new();
    bytes(&mut status, &exe);
    status.extend_from_slice(&[0, 0, 0, 2]);
    status.extend_from_slice(&[0, 0, 0, 10, 0, 0, 0, 6]);
    status.extend_from_slice(b"status");
    status.extend_from_slice(&[0, 0, 0, 11, 0, 0, 0, 7]);
    status.extend_from_slice(b"--short");
    status.push(0x01);
    p.extend_from_slice(&[0, 0, 0, 2]);
    bytes(&mut p, &bare);
    bytes(&mut p, &status);

    assert_eq!(p, c.record().canonical_bytes().unwrap());
    assert_eq!(p, hand_preimage(c.record()));
    assert_eq!(sha256(&p), c.fingerprint().0);

    let workspace = c.authorities().workspace.label();
    assert_eq!(workspace, f.workspace.as_path());
    let mut d = Vec::new();
    d.extend_from_slice(b"lazaret-domain-id-v1\0");
    assert_eq!(d.len(), 21);
    bytes(&mut d, b"dev");
    bytes(&mut d, &path_bytes(workspace));
    assert_eq!(sha256(&d), c.domain_id().0);
    // The Domain trees are named by that digest.
    let hex: String = sha256(&d).iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        c.authorities().domain_storage.label(),
        storage.join("domains").join(&hex)
    );
}

// ---------------------------------------------------------------------------
// 4: random input never panics the decoder or the loader.
// ---------------------------------------------------------------------------

/// A fuzzed TOML value.
#[derive(Debug, Clone)]
enum Frag {
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
    Raw(&'static str),
    Arr(Vec<Frag>),
    Table(Vec<(String, Frag)>),
}

const FUZZ_KEYS: &[&str] = &[
    "schema",
    "storage",
    "network",
    "profiles",
    "data_root",
    "default_allow",
    "default_deny",
    "image",
    "isolate_gitignored",
    "persistent_dirs",
    "allow_egress",
    "deny_egress",
    "env",
    "volumes",
    "escalation",
    "host",
    "container",
    "kind",
    "access",
    "create",
    "enabled",
    "auto_approve",
    "executable",
    "args",
    "allow_extra_args",
    "p",
    "default",
    "LZ_A",
    "A_1",
];
const FUZZ_STRINGS: &[&str] = &[
    "lazaret-trusted-host-config-v1",
    "lazaret-trusted-host-config-v3",
    "",
    " ",
    "/root",
    "/home/agent",
    "/home/agent/x",
    "/workspace",
    "/workspace/x",
    "/run",
    "/run/lazaret/x",
    "/proc",
    "/",
    "//root",
    "/root/",
    "/root/../etc",
    "/root/./x",
    "~/x",
    "~/data",
    "~/",
    "~//etc",
    "~user/x",
    "{profile_dir}/s",
    "{profile_dir}/a/b",
    "{profile_dir}/",
    "{profile_dir}//x",
    "$HOME/x",
    "/a/*",
    "/proc/lazaret-fuzz/x",
    "/proc/version",
    "/bin/sh",
    "/usr/bin/env",
    "~/bin/tool0",
    "~/bin/tool0-link",
    "a\0b",
    "env:LZ_A",
    "env:LZ_UNSET",
    "env:",
    "env:1X",
    "env:HOME",
    "ENV:LZ_A",
    "literal",
    "file",
    "directory",
    "dir",
    "read-only",
    "read-write",
    "rw",
    "10.0.0.0/8",
    "10.0.0.1/8",
    "203.0.113.10/32",
    "1.2.3.4/33",
    "1.2.3.4/",
    "1.2.3/8",
    "01.2.3.4/8",
    "1.2.3.4/08",
    "::1/128",
    "0.0.0.0/0",
    "255.255.255.255/32",
    "docker.io/library/debian:trixie",
    "oci:/images/base:1",
    "--flag",
    "p",
    "default",
];
const RAWS: &[&str] = &[
    "1979-05-27T07:32:00Z",
    "1979-05-27",
    "07:32:00",
    "07:32",
    "1979-05-27T00:32:00.999999-07:00",
    "0x1F",
    "0o17",
    "0b101",
    "+inf",
    "-nan",
    "1_000",
    "1e400",
    "\"unterminated",
    "[",
    "{",
    "= 1",
    "'''",
    "true false",
    "[1, \"a\"]",
    "{ a = 1, a = 2 }",
];

fn leaf() -> BoxedStrategy<Frag> {
    prop_oneof![
        6 => select(FUZZ_STRINGS).prop_map(|s| Frag::Str(s.to_owned())),
        2 => "\\PC{0,12}".prop_map(Frag::Str),
        1 => any::<String>().prop_map(Frag::Str),
        1 => any::<i64>().prop_map(Frag::Int),
        1 => any::<f64>().prop_map(Frag::Float),
        2 => any::<bool>().prop_map(Frag::Bool),
        1 => select(RAWS).prop_map(Frag::Raw),
    ]
    .boxed()
}

fn fuzz_key() -> impl Strategy<Value = String> {
    prop_oneof![
        5 => select(FUZZ_KEYS).prop_map(String::from),
        1 => "\\PC{0,6}",
    ]
}

fn frag() -> BoxedStrategy<Frag> {
    leaf()
        .prop_recursive(4, 40, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Frag::Arr),
                prop::collection::vec((fuzz_key(), inner), 0..6).prop_map(Frag::Table),
            ]
        })
        .boxed()
}

/// Values for one role: valid ones, and near misses used only when a
/// generator is allowed junk.
#[derive(Debug)]
struct Vocab {
    valid: &'static [&'static str],
    invalid: &'static [&'static str],
}

const SANDBOX_WORDS: Vocab = Vocab {
    valid: &[
        "/root",
        "/root/x",
        "/home/agent",
        "/home/agent/cache",
        "/home/agent/notes.txt",
        "/opt/tools",
    ],
    invalid: &[
        "/workspace",
        "/workspace/x",
        "/run",
        "/run/lazaret/x",
        "/proc",
        "/",
        "/root/",
        "//root",
        "/root/../x",
        "/root/./x",
        "relative",
        "/a*",
    ],
};
const HOST_WORDS: Vocab = Vocab {
    valid: &[
        "{profile_dir}/s",
        "{profile_dir}/a/b",
        "~/ext/cache",
        "~/ext/notes.txt",
        "~/ext/missing",
    ],
    invalid: &[
        "{profile_dir}/",
        "{profile_dir}//x",
        "~/bin/tool0",
        "~/bin/tool0-link",
        "~//etc",
        "~user/x",
        "~/",
        "$HOME/x",
        "/proc/version",
        "/proc/lazaret-fuzz/x",
        "/bin/sh",
        "relative/x",
    ],
};
const DATA_ROOT_WORDS: Vocab = Vocab {
    valid: &["~/data", "~/.local/share/lazaret"],
    invalid: &[
        "~/ext/notes.txt",
        "~/bin",
        "~/.config/lazaret",
        "~/ext",
        "{profile_dir}/x",
        "/proc/lazaret-fuzz",
        "~//x",
    ],
};
const EXE_WORDS: Vocab = Vocab {
    valid: &["~/bin/tool0", "~/bin/tool1", "~/bin/tool0-link", "/bin/sh"],
    invalid: &[
        "~/ext/notes.txt",
        "~/ext/cache",
        "/nonexistent/lazaret-tool",
        "{profile_dir}/tool",
        "tool",
    ],
};
const PREFIX_WORDS: Vocab = Vocab {
    valid: &[
        "203.0.113.10/32",
        "198.51.100.7/24",
        "10.222.7.0/24",
        "10.222.0.0/16",
        "10.0.0.0/8",
        "10.0.0.1/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "0.0.0.0/0",
        "255.255.255.255/32",
    ],
    invalid: &[
        "1.2.3.4/33",
        "1.2.3.4/",
        "1.2.3.4",
        "1.2.3/8",
        "01.2.3.4/8",
        "1.2.3.4/08",
        "::1/128",
    ],
};
const ENV_WORDS: Vocab = Vocab {
    valid: &["env:LZ_A", "env:LZ_C", "env:HOME", "env:LZ_UNSET"],
    invalid: &["env:", "env:1X", "ENV:LZ_A", "literal", "file:/etc/passwd"],
};
const ENV_NAMES: Vocab = Vocab {
    valid: &["TOKEN", "_X", "A1", "PATH"],
    invalid: &["1A", "A-B", ""],
};
const PROFILE_NAMES: Vocab = Vocab {
    valid: &["p", "p", "p", "other", "q.1"],
    invalid: &[".", "..", "-x", ""],
};
const IMAGE_WORDS: Vocab = Vocab {
    valid: &["oci:/images/base:1", "docker.io/library/debian:trixie"],
    invalid: &["", " ", "a\0b"],
};
const KIND_WORDS: Vocab = Vocab {
    valid: &["file", "directory"],
    invalid: &["dir", "File"],
};
const ACCESS_WORDS: Vocab = Vocab {
    valid: &["read-only", "read-write"],
    invalid: &["rw", "ro"],
};
const ARG_WORDS: Vocab = Vocab {
    valid: &["status", "--short", "", "-c"],
    invalid: &["a\0b"],
};
const SCHEMA_WORDS: Vocab = Vocab {
    valid: &[SCHEMA_ID],
    invalid: &["lazaret-trusted-host-config-v3", ""],
};

/// Mostly `typed`; with `junk`, sometimes a random value of any type.
fn or_junk(junk: bool, typed: BoxedStrategy<Frag>) -> BoxedStrategy<Frag> {
    if junk {
        prop_oneof![8 => typed, 1 => frag()].boxed()
    } else {
        typed
    }
}

fn word(vocab: &Vocab, junk: bool) -> BoxedStrategy<String> {
    let valid = select(vocab.valid).prop_map(String::from);
    if junk {
        prop_oneof![
            8 => valid,
            3 => select(vocab.invalid).prop_map(String::from),
            1 => "\\PC{0,8}",
        ]
        .boxed()
    } else {
        valid.boxed()
    }
}

fn words(vocab: &Vocab, junk: bool) -> BoxedStrategy<Frag> {
    or_junk(junk, word(vocab, junk).prop_map(Frag::Str).boxed())
}

fn boolean(junk: bool) -> BoxedStrategy<Frag> {
    or_junk(junk, any::<bool>().prop_map(Frag::Bool).boxed())
}

fn array(junk: bool, item: BoxedStrategy<Frag>, max: usize) -> BoxedStrategy<Frag> {
    or_junk(
        junk,
        prop::collection::vec(item, 0..=max)
            .prop_map(Frag::Arr)
            .boxed(),
    )
}

/// A table holding each field with its probability, in random order; with
/// `junk`, now and then an unknown field too.
fn table(junk: bool, fields: Vec<(&'static str, f64, BoxedStrategy<Frag>)>) -> BoxedStrategy<Frag> {
    let parts: Vec<BoxedStrategy<Option<(String, Frag)>>> = fields
        .into_iter()
        .map(|(key, p, value)| {
            prop::option::weighted(p, value.prop_map(move |v| (key.to_owned(), v))).boxed()
        })
        .collect();
    let extra: BoxedStrategy<Option<(String, Frag)>> = if junk {
        prop::option::weighted(0.1, (fuzz_key(), frag())).boxed()
    } else {
        Just(None).boxed()
    };
    let typed = (parts, extra, any::<u64>())
        .prop_map(|(parts, extra, seed)| {
            let mut entries: Vec<(String, Frag)> = parts.into_iter().flatten().collect();
            entries.extend(extra);
            Rng::seeded(seed).shuffle(&mut entries);
            Frag::Table(entries)
        })
        .boxed();
    or_junk(junk, typed)
}

fn volume_frag(junk: bool) -> BoxedStrategy<Frag> {
    table(
        junk,
        vec![
            ("host", 0.95, words(&HOST_WORDS, junk)),
            ("container", 0.95, words(&SANDBOX_WORDS, junk)),
            ("kind", 0.95, words(&KIND_WORDS, junk)),
            ("access", 0.4, words(&ACCESS_WORDS, junk)),
            ("create", 0.4, boolean(junk)),
        ],
    )
}

fn rule_frag(junk: bool) -> BoxedStrategy<Frag> {
    table(
        junk,
        vec![
            ("executable", 0.95, words(&EXE_WORDS, junk)),
            ("args", 0.6, array(junk, words(&ARG_WORDS, junk), 3)),
            ("allow_extra_args", 0.4, boolean(junk)),
        ],
    )
}

fn profile_frag(junk: bool) -> BoxedStrategy<Frag> {
    let env = or_junk(
        junk,
        prop::collection::vec((word(&ENV_NAMES, junk), words(&ENV_WORDS, junk)), 0..3)
            .prop_map(Frag::Table)
            .boxed(),
    );
    let escalation = table(
        junk,
        vec![
            ("enabled", 0.7, boolean(junk)),
            ("auto_approve", 0.6, array(junk, rule_frag(junk), 3)),
        ],
    );
    table(
        junk,
        vec![
            ("image", 0.95, words(&IMAGE_WORDS, junk)),
            ("isolate_gitignored", 0.4, boolean(junk)),
            (
                "persistent_dirs",
                0.6,
                array(junk, words(&SANDBOX_WORDS, junk), 3),
            ),
            (
                "allow_egress",
                0.5,
                array(junk, words(&PREFIX_WORDS, junk), 3),
            ),
            (
                "deny_egress",
                0.5,
                array(junk, words(&PREFIX_WORDS, junk), 3),
            ),
            ("env", 0.4, env),
            ("volumes", 0.5, array(junk, volume_frag(junk), 3)),
            ("escalation", 0.5, escalation),
        ],
    )
}

/// A schema-shaped document: fields from the schema's vocabulary; with
/// `junk`, also wrong types, unknown keys and near-miss values.
fn shaped_doc(junk: bool) -> BoxedStrategy<Vec<(String, Frag)>> {
    let profiles = or_junk(
        junk,
        prop::collection::vec((word(&PROFILE_NAMES, junk), profile_frag(junk)), 1..4)
            .prop_map(Frag::Table)
            .boxed(),
    );
    let storage = table(
        junk,
        vec![("data_root", 0.7, words(&DATA_ROOT_WORDS, junk))],
    );
    let network = table(
        junk,
        vec![
            (
                "default_allow",
                0.6,
                array(junk, words(&PREFIX_WORDS, junk), 3),
            ),
            (
                "default_deny",
                0.6,
                array(junk, words(&PREFIX_WORDS, junk), 3),
            ),
        ],
    );
    table(
        junk,
        vec![
            (
                "schema",
                0.97,
                prop_oneof![
                    8 => words(&SCHEMA_WORDS, false),
                    1 => words(&SCHEMA_WORDS, junk),
                ]
                .boxed(),
            ),
            ("storage", 0.3, storage),
            ("network", 0.4, network),
            ("profiles", 0.97, profiles),
        ],
    )
    .prop_map(|root| match root {
        Frag::Table(entries) => entries,
        other => vec![("schema".to_owned(), other)],
    })
    .boxed()
}

/// Random keys from the schema's vocabulary with random values of random
/// types and random nesting, usually behind a valid `schema` line.
fn random_doc() -> impl Strategy<Value = Vec<(String, Frag)>> {
    (
        any::<bool>(),
        prop::collection::vec((fuzz_key(), frag()), 0..6),
    )
        .prop_map(|(schema, mut entries)| {
            if schema {
                entries.insert(0, ("schema".to_owned(), Frag::Str(SCHEMA_ID.to_owned())));
            }
            entries
        })
}

/// A fuzzed document: schema-shaped (clean or with junk) or random.
fn frag_doc() -> impl Strategy<Value = Vec<(String, Frag)>> {
    prop_oneof![
        2 => shaped_doc(false),
        2 => shaped_doc(true),
        1 => random_doc(),
    ]
}

fn float_text(x: f64) -> String {
    if x.is_nan() {
        "nan".to_owned()
    } else if x.is_infinite() {
        if x > 0.0 { "inf" } else { "-inf" }.to_owned()
    } else {
        format!("{x:?}")
    }
}

/// Keeps the first entry of each key, and occasionally a duplicate.
fn mostly_unique<'a>(r: &mut Rng, entries: &'a [(String, Frag)]) -> Vec<&'a (String, Frag)> {
    let mut seen = std::collections::BTreeSet::new();
    entries
        .iter()
        .filter(|(key, _)| seen.insert(key.as_str()) || r.chance(10))
        .collect()
}

fn frag_value(r: &mut Rng, v: &Frag) -> String {
    match v {
        Frag::Str(s) => string_text(r, s),
        Frag::Int(i) => i.to_string(),
        Frag::Float(x) => float_text(*x),
        Frag::Bool(b) => b.to_string(),
        Frag::Raw(t) => (*t).to_owned(),
        Frag::Arr(items) => {
            let texts = items.iter().map(|i| frag_value(r, i)).collect();
            array_text(r, texts)
        }
        Frag::Table(entries) => {
            let texts = mostly_unique(r, entries)
                .into_iter()
                .map(|(key, v)| format!("{}{}{}", key_text(r, key), eq(r), frag_value(r, v)))
                .collect();
            inline_text(r, texts)
        }
    }
}

type Pending<'a> = Vec<(Vec<String>, bool, &'a [(String, Frag)])>;

fn emit_frag_table<'a>(
    r: &mut Rng,
    out: &mut String,
    path: &[String],
    entries: &'a [(String, Frag)],
    pending: &mut Pending<'a>,
) {
    for (key, value) in mostly_unique(r, entries) {
        let mut sub = path.to_vec();
        sub.push(key.clone());
        match value {
            Frag::Table(t) if r.chance(60) => pending.push((sub, false, t.as_slice())),
            Frag::Arr(items)
                if !items.is_empty()
                    && items.iter().all(|i| matches!(i, Frag::Table(_)))
                    && r.chance(60) =>
            {
                for item in items {
                    if let Frag::Table(t) = item {
                        pending.push((sub.clone(), true, t.as_slice()));
                    }
                }
            }
            _ => {
                let line = format!("{}{}{}", key_text(r, key), eq(r), frag_value(r, value));
                out.push_str(&line);
                out.push_str(&trailing(r));
                out.push('\n');
            }
        }
    }
}

/// Renders a fuzzed document: tables as sections, inline tables or arrays
/// of tables, sections in random order.
fn render_frag_doc(r: &mut Rng, root: &[(String, Frag)]) -> String {
    let mut out = String::new();
    let mut pending: Pending<'_> = Vec::new();
    emit_frag_table(r, &mut out, &[], root, &mut pending);
    while !pending.is_empty() {
        let (path, array, entries) = pending.remove(r.below(pending.len()));
        let path_text = dotted(r, &path);
        if array {
            out.push_str(&format!("[[{path_text}]]\n"));
        } else {
            out.push_str(&format!("[{path_text}]\n"));
        }
        emit_frag_table(r, &mut out, &path, entries, &mut pending);
    }
    out
}

/// One damage to a document.
#[derive(Debug, Clone)]
enum Edit {
    Delete(Index, usize),
    Insert(Index, &'static str),
    DuplicateLine(Index),
    SwapLines(Index, Index),
    Byte(Index, u8),
}

const TOKENS: &[&str] = &[
    "\"",
    "'",
    "[",
    "]",
    "{",
    "}",
    "=",
    ",",
    "\n",
    "#",
    "[[",
    "]]",
    ".",
    "\\",
    "\"\"\"",
    "true",
    "1",
    "x = 1\n",
    "\n[profiles.p]\n",
    "\0",
    "\u{FEFF}",
    "é",
    "\r",
    "\t",
    "~/",
    "..",
    "/",
];

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<Index>(), 1usize..16).prop_map(|(i, n)| Edit::Delete(i, n)),
        (any::<Index>(), select(TOKENS)).prop_map(|(i, t)| Edit::Insert(i, t)),
        any::<Index>().prop_map(Edit::DuplicateLine),
        (any::<Index>(), any::<Index>()).prop_map(|(a, b)| Edit::SwapLines(a, b)),
        (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Edit::Byte(i, b)),
    ]
}

fn split_lines(bytes: &[u8]) -> Vec<Vec<u8>> {
    bytes.split(|c| *c == b'\n').map(<[u8]>::to_vec).collect()
}

fn apply_edits(mut bytes: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
    for e in edits {
        match e {
            Edit::Delete(i, n) if !bytes.is_empty() => {
                let at = i.index(bytes.len());
                let end = (at + n).min(bytes.len());
                bytes.drain(at..end);
            }
            Edit::Insert(i, token) => {
                let at = i.index(bytes.len() + 1);
                bytes.splice(at..at, token.bytes());
            }
            Edit::DuplicateLine(i) => {
                let mut lines = split_lines(&bytes);
                let at = i.index(lines.len());
                let line = lines[at].clone();
                lines.insert(at, line);
                bytes = lines.join(&b'\n');
            }
            Edit::SwapLines(a, b) => {
                let mut lines = split_lines(&bytes);
                let (a, b) = (a.index(lines.len()), b.index(lines.len()));
                lines.swap(a, b);
                bytes = lines.join(&b'\n');
            }
            Edit::Byte(i, b) if !bytes.is_empty() => {
                let at = i.index(bytes.len());
                bytes[at] = *b;
            }
            Edit::Delete(..) | Edit::Byte(..) => {}
        }
    }
    bytes
}

/// Whether a full load of `text` may touch only the fixture. The loader
/// creates a missing Storage Root, and this suite may run as root, so a
/// fuzzed `data_root` must not name a path outside the fixture.
fn safe_to_load(f: &Fixture, text: &str) -> bool {
    let Ok(doc) = config::decode_document(text.as_bytes()) else {
        return true;
    };
    match &doc.storage.data_root {
        None => true,
        Some(d) => match d.anchor() {
            HostAnchor::Home => true,
            HostAnchor::Root => Path::new(d.as_str()).starts_with(f.base()),
            HostAnchor::ProfileDir => false,
        },
    }
}

/// A fake host layout for decoder-only runs.
fn fake_ctx() -> Ctx {
    Ctx {
        home: PathBuf::from("/home/user"),
        base: PathBuf::from("/tmp/lazaret-fuzz"),
    }
}

proptest! {
    #![proptest_config(cases(256))]

    #[test]
    fn decoder_survives_arbitrary_bytes(
        header in any::<bool>(),
        bytes in prop::collection::vec(any::<u8>(), 0..512),
    ) {
        let mut input = if header {
            format!("schema = \"{SCHEMA_ID}\"\n").into_bytes()
        } else {
            Vec::new()
        };
        input.extend(bytes);
        let _ = config::decode_document(&input);
    }

    #[test]
    fn decoder_survives_arbitrary_text(header in any::<bool>(), text in any::<String>()) {
        let input = if header {
            format!("schema = \"{SCHEMA_ID}\"\n[profiles.p]\n{text}")
        } else {
            text
        };
        let _ = config::decode_document(input.as_bytes());
    }

    #[test]
    fn decoder_survives_structured_fragments(doc in frag_doc(), seed in any::<u64>()) {
        let text = render_frag_doc(&mut Rng::seeded(seed), &doc);
        let _ = config::decode_document(text.as_bytes());
    }

    #[test]
    fn decoder_survives_damaged_documents(
        m in model(),
        seed in any::<u64>(),
        edits in prop::collection::vec(edit(), 1..6),
    ) {
        let text = render_model(&mut Rng::seeded(seed), &fake_ctx(), &m);
        prop_assert!(config::decode_document(text.as_bytes()).is_ok(), "{}", text);
        let _ = config::decode_document(&apply_edits(text.into_bytes(), &edits));
    }
}

proptest! {
    #![proptest_config(cases(32))]

    #[test]
    fn loader_survives_structured_fragments(doc in frag_doc(), seed in any::<u64>()) {
        let f = prepared(&rich_model());
        let text = render_frag_doc(&mut Rng::seeded(seed), &doc);
        if safe_to_load(&f, &text) {
            if let Ok(c) = f.load_text("p", &text) {
                check_digests(&f, &c)?;
            }
        }
    }

    #[test]
    fn loader_survives_damaged_documents(
        m in model(),
        seed in any::<u64>(),
        edits in prop::collection::vec(edit(), 1..6),
    ) {
        let f = prepared(&m);
        let text = render_model(&mut Rng::seeded(seed), &Ctx::of(&f), &m);
        let damaged = apply_edits(text.into_bytes(), &edits);
        let text = String::from_utf8_lossy(&damaged);
        if safe_to_load(&f, &text) {
            if let Ok(c) = f.load_text(&m.name, &text) {
                check_digests(&f, &c)?;
            }
        }
    }
}
