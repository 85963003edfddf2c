//! The second enforcement layer: an nftables filter in the enforcement
//! namespace, installed and read back over netlink ([`crate::nfnetlink`]).
//!
//! One table, `inet lazaret`, with two base chains that drop by default:
//! `output` holds the policy's [`FilterRule`]s in order (first match wins),
//! `input` accepts only loopback and replies to what left. A policy with
//! names adds the set `names` of IPv4 addresses with timeouts, which
//! Lazaret's resolver fills ([`admit`]) and [`FilterRule::AcceptNamed`]
//! looks up. The routes
//! already decide every destination; the filter decides again, so a route
//! changed from outside the sandbox (or a bug in how routes are installed)
//! opens nothing. The table, its chains and its rules are added in one
//! transaction. The readback dumps every table, chain, rule, set, stateful
//! object and flowtable of the namespace and turns the rules back into
//! [`FilterRule`]s, refusing anything it does not recognise: what the
//! attestation reports is what the kernel holds. Trusts only the kernel.

use std::net::{IpAddr, Ipv4Addr};

use lazaret_proto::network::{AdmittedAddress, FilterRule, IpPrefix, PolicyAction};
use lazaret_proto::sidecar::{SidecarError, SidecarStep};

use crate::failed;
use crate::nfnetlink::{
    Attrs, Batch, Failure, Kind, Malformed, NLM_F_APPEND, NLM_F_CREATE, NLM_F_EXCL, Socket, be_u32,
    parse, string,
};

const TABLE: &str = "lazaret";

/// `NFPROTO_INET` and `NFPROTO_IPV4`.
const FAMILY_INET: u8 = 1;
const NFPROTO_IPV4: u8 = 2;
/// The hooks of the two chains: `NF_INET_LOCAL_IN`, `NF_INET_LOCAL_OUT`.
const HOOK_INPUT: u32 = 1;
const HOOK_OUTPUT: u32 = 3;
/// Verdicts: `NF_DROP`, `NF_ACCEPT`.
const DROP: u32 = 0;
const ACCEPT: u32 = 1;

/// The attributes of tables, chains, hooks and rules (`NFTA_*`).
const TABLE_NAME: u16 = 1;
const CHAIN_TABLE: u16 = 1;
const CHAIN_NAME: u16 = 3;
const CHAIN_HOOK: u16 = 4;
const CHAIN_POLICY: u16 = 5;
const CHAIN_TYPE: u16 = 7;
const HOOK_NUMBER: u16 = 1;
const HOOK_PRIORITY: u16 = 2;
const RULE_TABLE: u16 = 1;
const RULE_CHAIN: u16 = 2;
const RULE_EXPRESSIONS: u16 = 4;
const LIST_ELEMENT: u16 = 1;
const EXPR_NAME: u16 = 1;
const EXPR_DATA: u16 = 2;
const DATA_VALUE: u16 = 1;
const DATA_VERDICT: u16 = 2;
const VERDICT_CODE: u16 = 1;

/// The one data register every match uses (`NFT_REG_1`), and the verdict
/// register (`NFT_REG_VERDICT`).
const REGISTER: u32 = 1;
const VERDICT_REGISTER: u32 = 0;

/// Meta keys (`NFT_META_*`), the conntrack state key (`NFT_CT_STATE`),
/// payload bases (`NFT_PAYLOAD_*_HEADER`), comparisons (`NFT_CMP_*`).
const META_IIFNAME: u32 = 6;
const META_OIFNAME: u32 = 7;
const META_NFPROTO: u32 = 15;
const META_L4PROTO: u32 = 16;
const CT_STATE: u32 = 0;
const NETWORK_HEADER: u32 = 1;
const TRANSPORT_HEADER: u32 = 2;
const EQ: u32 = 0;
const NEQ: u32 = 1;

/// The conntrack states `established` and `related` as a bit mask
/// (`NF_CT_STATE_BIT`), in host byte order as the kernel keeps it.
const ESTABLISHED_OR_RELATED: u32 = (1 << 1) | (1 << 2);

/// The set of admitted addresses, and its attributes (`NFTA_SET_*`,
/// `NFTA_SET_ELEM_*`): IPv4 addresses (`ipv4_addr`, key type 7) with
/// timeouts (`NFT_SET_TIMEOUT`).
const SET: &str = "names";
const SET_TABLE: u16 = 1;
const SET_NAME: u16 = 2;
const SET_FLAGS: u16 = 3;
const SET_KEY_TYPE: u16 = 4;
const SET_KEY_LEN: u16 = 5;
const SET_ID: u16 = 10;
const SET_TIMEOUT_FLAG: u32 = 0x10;
const IPV4_ADDR_TYPE: u32 = 7;
/// The set's transaction-local id, for the rule that looks it up in the
/// same batch.
const SET_ID_VALUE: u32 = 1;
const ELEMENTS_TABLE: u16 = 1;
const ELEMENTS_SET: u16 = 2;
const ELEMENTS_LIST: u16 = 3;
const ELEMENT_KEY: u16 = 1;
const ELEMENT_TIMEOUT: u16 = 4;
const ELEMENT_EXPIRATION: u16 = 5;
/// An element's user data, and in it (as libnftnl and `nft` write it: a
/// type byte, a length byte, the value) the comment, the name that
/// admitted it, NUL-terminated.
const ELEMENT_USERDATA: u16 = 6;
const USERDATA_COMMENT: u8 = 0;
/// `NFT_META_MARK`.
const META_MARK: u32 = 3;

fn error(detail: impl std::fmt::Display) -> SidecarError {
    failed(SidecarStep::Filter, detail)
}

/// One expression of a rule, of the kinds this filter writes. Every match
/// loads into and compares [`REGISTER`].
#[derive(Clone, Debug, PartialEq, Eq)]
enum Expr {
    /// Loads the packet's meta `key`.
    Meta(u32),
    /// Loads `len` bytes at `offset` of header `base`.
    Payload { base: u32, offset: u32, len: u32 },
    /// Masks the register: `(r & mask) ^ 0`, over the mask's length.
    Mask(Vec<u8>),
    /// Loads the conntrack `key`.
    Ct(u32),
    /// Compares the register with `data` by `op`.
    Cmp { op: u32, data: Vec<u8> },
    /// Matches when the register holds a member of the set [`SET`].
    Lookup,
    /// The rule's verdict.
    Verdict(u32),
}

impl Expr {
    /// Its name and attributes, as the kernel takes them.
    fn encode(&self) -> (&'static str, Attrs) {
        // Expression attribute numbers, by expression (`NFTA_<NAME>_*`).
        let mut data = Attrs::default();
        let name = match self {
            Expr::Meta(key) => {
                data.u32(1, REGISTER).u32(2, *key);
                "meta"
            }
            Expr::Payload { base, offset, len } => {
                data.u32(1, REGISTER)
                    .u32(2, *base)
                    .u32(3, *offset)
                    .u32(4, *len);
                "payload"
            }
            Expr::Mask(mask) => {
                let len = u32::try_from(mask.len()).expect("a short mask");
                data.u32(1, REGISTER).u32(2, REGISTER).u32(3, len);
                data.nested(4, |d| {
                    d.bytes(DATA_VALUE, mask);
                });
                data.nested(5, |d| {
                    d.bytes(DATA_VALUE, &vec![0; mask.len()]);
                });
                "bitwise"
            }
            Expr::Ct(key) => {
                data.u32(1, REGISTER).u32(2, *key);
                "ct"
            }
            Expr::Cmp { op, data: value } => {
                data.u32(1, REGISTER).u32(2, *op).nested(3, |d| {
                    d.bytes(DATA_VALUE, value);
                });
                "cmp"
            }
            Expr::Lookup => {
                data.str(1, SET).u32(2, REGISTER).u32(4, SET_ID_VALUE);
                "lookup"
            }
            Expr::Verdict(code) => {
                data.u32(1, VERDICT_REGISTER).nested(2, |d| {
                    d.nested(DATA_VERDICT, |v| {
                        v.u32(VERDICT_CODE, *code);
                    });
                });
                "immediate"
            }
        };
        (name, data)
    }

    /// Reads one dumped expression back, refusing any it does not write:
    /// another name, another register, an attribute it does not set.
    fn decode(name: &str, data: &[u8]) -> Result<Self, Malformed> {
        let attrs = parse(data)?;
        let get = |kind: u16| attrs.iter().find(|(k, _)| *k == kind).map(|(_, v)| *v);
        let number = |kind: u16| {
            get(kind)
                .ok_or(Malformed("an attribute is missing"))
                .and_then(be_u32)
        };
        let value = |kind: u16| -> Result<Vec<u8>, Malformed> {
            let nested = parse(get(kind).ok_or(Malformed("an attribute is missing"))?)?;
            match nested[..] {
                [(DATA_VALUE, bytes)] => Ok(bytes.to_vec()),
                _ => Err(Malformed("a data attribute is not a plain value")),
            }
        };
        let only = |allowed: &[u16]| {
            if attrs.iter().all(|(k, _)| allowed.contains(k)) {
                Ok(())
            } else {
                Err(Malformed(
                    "an expression holds an attribute the filter never sets",
                ))
            }
        };
        let register = |kind: u16, expected: u32| match number(kind)? {
            found if found == expected => Ok(()),
            _ => Err(Malformed("an expression uses another register")),
        };
        let expr = match name {
            "meta" => {
                only(&[1, 2])?;
                register(1, REGISTER)?;
                Expr::Meta(number(2)?)
            }
            "payload" => {
                only(&[1, 2, 3, 4])?;
                register(1, REGISTER)?;
                Expr::Payload {
                    base: number(2)?,
                    offset: number(3)?,
                    len: number(4)?,
                }
            }
            "bitwise" => {
                // Its operation (`NFTA_BITWISE_OP`), when dumped, must be
                // the mask-and-xor one.
                only(&[1, 2, 3, 4, 5, 6])?;
                register(1, REGISTER)?;
                register(2, REGISTER)?;
                if get(6).is_some() && number(6)? != 0 {
                    return Err(Malformed("a bitwise expression is not a mask"));
                }
                let mask = value(4)?;
                let xor = value(5)?;
                let len = number(3)? as usize;
                if mask.len() != len || xor != vec![0; len] {
                    return Err(Malformed("a bitwise expression is not a plain mask"));
                }
                Expr::Mask(mask)
            }
            "ct" => {
                only(&[1, 2])?;
                register(1, REGISTER)?;
                Expr::Ct(number(2)?)
            }
            "cmp" => {
                only(&[1, 2, 3])?;
                register(1, REGISTER)?;
                Expr::Cmp {
                    op: number(2)?,
                    data: value(3)?,
                }
            }
            "lookup" => {
                // The set by name (and, as written, by its id), its source
                // register, no flags: not inverted, not a map.
                only(&[1, 2, 4, 5])?;
                register(2, REGISTER)?;
                if string(get(1).ok_or(Malformed("a lookup names no set"))?)? != SET {
                    return Err(Malformed("a lookup names another set"));
                }
                if get(5).is_some() && number(5)? != 0 {
                    return Err(Malformed("a lookup is inverted"));
                }
                Expr::Lookup
            }
            "immediate" => {
                only(&[1, 2])?;
                register(1, VERDICT_REGISTER)?;
                let data = parse(get(2).ok_or(Malformed("an immediate holds no data"))?)?;
                let [(DATA_VERDICT, verdict)] = data[..] else {
                    return Err(Malformed("an immediate holds no verdict"));
                };
                let [(VERDICT_CODE, code)] = parse(verdict)?[..] else {
                    return Err(Malformed("a verdict jumps to a chain"));
                };
                Expr::Verdict(be_u32(code)?)
            }
            _ => {
                return Err(Malformed(
                    "a rule holds an expression the filter never writes",
                ));
            }
        };
        Ok(expr)
    }
}

/// An interface name as `meta iifname`/`oifname` loads it: `IFNAMSIZ`
/// bytes, NUL-padded.
fn interface(name: &str) -> Vec<u8> {
    let mut bytes = name.as_bytes().to_vec();
    bytes.resize(16, 0);
    bytes
}

/// `meta nfproto ipv4`: what `ip ...` matches need first in an `inet`
/// table.
fn ipv4() -> [Expr; 2] {
    [
        Expr::Meta(META_NFPROTO),
        Expr::Cmp {
            op: EQ,
            data: vec![NFPROTO_IPV4],
        },
    ]
}

/// `ip daddr NETWORK` (nothing for `/0`, which every IPv4 packet matches).
fn daddr(address: Ipv4Addr, prefix_len: u8) -> Vec<Expr> {
    let load = Expr::Payload {
        base: NETWORK_HEADER,
        offset: 16,
        len: 4,
    };
    let mask = u32::MAX
        .checked_shl(32 - u32::from(prefix_len))
        .unwrap_or(0);
    let compare = Expr::Cmp {
        op: EQ,
        data: (u32::from(address) & mask).to_be_bytes().to_vec(),
    };
    match prefix_len {
        0 => vec![],
        32 => vec![load, compare],
        _ => vec![load, Expr::Mask(mask.to_be_bytes().to_vec()), compare],
    }
}

/// The rules that implement one [`FilterRule`]: DNS takes two (UDP, then
/// TCP), the others one. Only IPv4 has rules: IPv6 is disabled in the
/// namespace and both chains drop it.
fn rules(rule: &FilterRule) -> Result<Vec<Vec<Expr>>, SidecarError> {
    let verdict = |action| {
        Expr::Verdict(match action {
            PolicyAction::Allow => ACCEPT,
            PolicyAction::Deny => DROP,
        })
    };
    Ok(match *rule {
        FilterRule::AcceptLoopback => vec![vec![
            Expr::Meta(META_OIFNAME),
            Expr::Cmp {
                op: EQ,
                data: interface("lo"),
            },
            Expr::Verdict(ACCEPT),
        ]],
        FilterRule::AcceptDns { resolver } => dns(resolver, None),
        FilterRule::AcceptMarkedDns { resolver, mark } => dns(resolver, Some(mark)),
        FilterRule::AcceptEstablished => vec![established()],
        FilterRule::AcceptNamed => {
            let mut exprs = ipv4().to_vec();
            exprs.extend([
                Expr::Payload {
                    base: NETWORK_HEADER,
                    offset: 16,
                    len: 4,
                },
                Expr::Lookup,
                Expr::Verdict(ACCEPT),
            ]);
            vec![exprs]
        }
        FilterRule::Prefix { network, action } => {
            let IpAddr::V4(address) = network.address else {
                return Err(error(format!(
                    "the filter holds IPv4 rules only, not one for {}/{}",
                    network.address, network.prefix_len
                )));
            };
            let mut exprs = ipv4().to_vec();
            exprs.extend(daddr(address, network.prefix_len));
            exprs.push(verdict(action));
            vec![exprs]
        }
    })
}

/// The two rules (UDP, then TCP) accepting DNS to `resolver`, only from
/// sockets carrying `mark` when one is given.
fn dns(resolver: Ipv4Addr, mark: Option<u32>) -> Vec<Vec<Expr>> {
    [17u8, 6]
        .map(|protocol| {
            let mut exprs = ipv4().to_vec();
            exprs.extend(daddr(resolver, 32));
            if let Some(mark) = mark {
                exprs.extend([
                    Expr::Meta(META_MARK),
                    Expr::Cmp {
                        op: EQ,
                        data: mark.to_ne_bytes().to_vec(),
                    },
                ]);
            }
            exprs.extend([
                Expr::Meta(META_L4PROTO),
                Expr::Cmp {
                    op: EQ,
                    data: vec![protocol],
                },
                Expr::Payload {
                    base: TRANSPORT_HEADER,
                    offset: 2,
                    len: 2,
                },
                Expr::Cmp {
                    op: EQ,
                    data: 53u16.to_be_bytes().to_vec(),
                },
                Expr::Verdict(ACCEPT),
            ]);
            exprs
        })
        .into()
}

/// `ct state established,related accept`.
fn established() -> Vec<Expr> {
    vec![
        Expr::Ct(CT_STATE),
        Expr::Mask(ESTABLISHED_OR_RELATED.to_ne_bytes().to_vec()),
        Expr::Cmp {
            op: NEQ,
            data: vec![0; 4],
        },
        Expr::Verdict(ACCEPT),
    ]
}

/// The `input` chain's rules: loopback, and replies.
fn input_rules() -> [Vec<Expr>; 2] {
    [
        vec![
            Expr::Meta(META_IIFNAME),
            Expr::Cmp {
                op: EQ,
                data: interface("lo"),
            },
            Expr::Verdict(ACCEPT),
        ],
        established(),
    ]
}

/// What to do about a kernel without nf_tables.
const NEEDS_NF_TABLES: &str = "the packet filter needs a kernel with nf_tables: load it \
    with `modprobe nf_tables` (`grep nf_tables /proc/modules` shows it), then run \
    `lazaret up` again";

/// Why a read-back that finds something the sidecar did not write stops
/// `up`, and what to do.
const NOT_WRITTEN_HERE: &str = "only the Network Sidecar writes the enforcement namespace's \
    ruleset, so `up` stops rather than attest one it did not write; run `lazaret up` again, \
    and report it if it recurs";

fn socket() -> Result<Socket, SidecarError> {
    Socket::open().map_err(|e| {
        error(format!(
            "cannot open an nf_tables netlink socket: {e}; {NEEDS_NF_TABLES}"
        ))
    })
}

/// A failure to `do` something with the filter, saying what to do when
/// the kernel has no nf_tables.
fn filter_failed(what: &str, failure: &Failure) -> SidecarError {
    match failure {
        _ if failure.no_nf_tables() => error(format!("{what}: {failure}; {NEEDS_NF_TABLES}")),
        Failure::Refused {
            what: refused,
            errno,
        } => SidecarError {
            step: SidecarStep::Filter,
            failure: lazaret_proto::failure::Failure::os(
                format!("{what}: the kernel refused {refused}"),
                errno,
                None,
            ),
        },
        _ => error(format!("{what}: {failure}")),
    }
}

/// Installs `filter` as the namespace's only ruleset, in one transaction:
/// the table (refused if it exists), its two chains, their rules.
pub fn install(filter: &[FilterRule]) -> Result<(), SidecarError> {
    let mut batch = Batch::new();
    let mut table = Attrs::default();
    table.str(TABLE_NAME, TABLE);
    let create = NLM_F_CREATE | NLM_F_EXCL;
    batch.add(
        Kind::Table,
        FAMILY_INET,
        create,
        table,
        format!("table inet {TABLE}"),
    );
    if filter.contains(&FilterRule::AcceptNamed) {
        let mut set = Attrs::default();
        set.str(SET_TABLE, TABLE)
            .str(SET_NAME, SET)
            .u32(SET_FLAGS, SET_TIMEOUT_FLAG)
            .u32(SET_KEY_TYPE, IPV4_ADDR_TYPE)
            .u32(SET_KEY_LEN, 4)
            .u32(SET_ID, SET_ID_VALUE);
        batch.add(Kind::Set, FAMILY_INET, create, set, format!("set {SET}"));
    }
    for (name, hook) in [("output", HOOK_OUTPUT), ("input", HOOK_INPUT)] {
        let mut chain = Attrs::default();
        chain
            .str(CHAIN_TABLE, TABLE)
            .str(CHAIN_NAME, name)
            .nested(CHAIN_HOOK, |h| {
                h.u32(HOOK_NUMBER, hook).u32(HOOK_PRIORITY, 0);
            })
            .u32(CHAIN_POLICY, DROP)
            .str(CHAIN_TYPE, "filter");
        batch.add(
            Kind::Chain,
            FAMILY_INET,
            create,
            chain,
            format!("chain {name}"),
        );
    }
    let mut add_rule = |chain: &str, exprs: &[Expr], what: String| {
        let mut rule = Attrs::default();
        rule.str(RULE_TABLE, TABLE).str(RULE_CHAIN, chain);
        rule.nested(RULE_EXPRESSIONS, |list| {
            for expr in exprs {
                let (name, data) = expr.encode();
                list.nested(LIST_ELEMENT, |e| {
                    e.str(EXPR_NAME, name);
                    e.nested(EXPR_DATA, |d| *d = data);
                });
            }
        });
        batch.add(
            Kind::Rule,
            FAMILY_INET,
            NLM_F_CREATE | NLM_F_APPEND,
            rule,
            what,
        );
    };
    for (i, exprs) in input_rules().iter().enumerate() {
        add_rule("input", exprs, format!("input rule {}", i + 1));
    }
    for rule in filter {
        for exprs in rules(rule)? {
            add_rule("output", &exprs, format!("the output rule for {rule:?}"));
        }
    }
    socket()?
        .apply(&batch)
        .map_err(|e| filter_failed("cannot install the filter", &e))
}

/// Reads the namespace's whole ruleset back and turns the output chain
/// into [`FilterRule`]s, after checking that it holds nothing but this
/// table, its two chains as installed, and the input chain's two rules.
pub fn read_back() -> Result<Vec<FilterRule>, SidecarError> {
    let mut socket = socket()?;
    let mut dump = |kind: Kind| {
        socket
            .dump(kind)
            .map_err(|e| filter_failed("cannot read the filter back", &e))
    };
    let malformed =
        |what: &str, Malformed(why)| error(format!("a dumped {what} is malformed: {why}"));
    let foreign = |kind: Kind, detail: String| {
        error(format!(
            "the namespace holds another {}: {detail}; {NOT_WRITTEN_HERE}",
            kind.name()
        ))
    };

    let tables = dump(Kind::Table)?;
    for table in &tables {
        let attrs = parse(&table.attrs).map_err(|m| malformed("table", m))?;
        let name = field(&attrs, TABLE_NAME).map_err(|m| malformed("table", m))?;
        if table.family != FAMILY_INET || string(name).ok() != Some(TABLE) {
            return Err(foreign(
                Kind::Table,
                format!("family {} {:?}", table.family, string(name).unwrap_or("?")),
            ));
        }
    }
    if tables.len() != 1 {
        return Err(error(format!(
            "the namespace holds {} tables named inet {TABLE}, not one; {NOT_WRITTEN_HERE}",
            tables.len()
        )));
    }
    for kind in [Kind::Object, Kind::Flowtable] {
        if let Some(object) = dump(kind)?.first() {
            return Err(foreign(kind, format!("{} bytes", object.attrs.len())));
        }
    }
    let sets = dump(Kind::Set)?;
    let mut named = false;
    for set in &sets {
        let attrs = parse(&set.attrs).map_err(|m| malformed("set", m))?;
        match set_of(&attrs) {
            Ok(()) if set.family == FAMILY_INET && !named => named = true,
            Ok(()) => return Err(foreign(Kind::Set, format!("a second {SET}"))),
            Err(Malformed(why)) => return Err(foreign(Kind::Set, why.to_owned())),
        }
    }

    let mut chains = Vec::new();
    for chain in dump(Kind::Chain)? {
        let attrs = parse(&chain.attrs).map_err(|m| malformed("chain", m))?;
        chains.push(chain_of(&attrs).map_err(|m| malformed("chain", m))?);
    }
    chains.sort();
    let expected: Vec<_> = [("input", HOOK_INPUT), ("output", HOOK_OUTPUT)]
        .map(|(name, hook)| (name.to_owned(), hook, 0, DROP, "filter".to_owned()))
        .into();
    if chains != expected {
        return Err(error(format!(
            "the filter's chains are not the two drop-by-default base chains: {chains:?}; \
             {NOT_WRITTEN_HERE}"
        )));
    }

    let mut input = Vec::new();
    let mut output = Vec::new();
    for rule in dump(Kind::Rule)? {
        let attrs = parse(&rule.attrs).map_err(|m| malformed("rule", m))?;
        let (table, chain, exprs) = rule_of(&attrs).map_err(|m| malformed("rule", m))?;
        match (rule.family, table.as_str(), chain.as_str()) {
            (FAMILY_INET, TABLE, "input") => input.push(exprs),
            (FAMILY_INET, TABLE, "output") => output.push(exprs),
            _ => return Err(foreign(Kind::Rule, format!("in {table} {chain}"))),
        }
    }
    if input != input_rules() {
        return Err(error(format!(
            "the input chain holds other rules: {input:?}; {NOT_WRITTEN_HERE}"
        )));
    }
    let rules = rules_of(&output)?;
    if named != rules.contains(&FilterRule::AcceptNamed) {
        return Err(error(format!(
            "the set {SET} and the rule that looks it up do not come together; \
             {NOT_WRITTEN_HERE}"
        )));
    }
    Ok(rules)
}

/// The most members a read-back lists: what a status message carries.
pub const LISTED_ADMISSIONS: usize = 256;

/// The set's members and the time each has left, read from the kernel, at
/// most [`LISTED_ADMISSIONS`] of them (by name), and how many there are.
pub fn read_admitted() -> Result<(Vec<AdmittedAddress>, usize), SidecarError> {
    let mut attrs = Attrs::default();
    attrs.str(ELEMENTS_TABLE, TABLE).str(ELEMENTS_SET, SET);
    let dumped = socket()?
        .dump_of(Kind::SetElement, FAMILY_INET, &attrs)
        .map_err(|e| filter_failed("cannot read the set of admitted addresses", &e))?;
    let malformed = |Malformed(why)| error(format!("a dumped set element is malformed: {why}"));
    let mut admitted = Vec::new();
    for object in dumped {
        let attrs = parse(&object.attrs).map_err(malformed)?;
        let Ok(list) = field(&attrs, ELEMENTS_LIST) else {
            continue;
        };
        for (kind, element) in parse(list).map_err(malformed)? {
            if kind != LIST_ELEMENT {
                continue;
            }
            let element = parse(element).map_err(malformed)?;
            let key = parse(field(&element, ELEMENT_KEY).map_err(malformed)?).map_err(malformed)?;
            let address = field(&key, DATA_VALUE)
                .ok()
                .and_then(|v| <[u8; 4]>::try_from(v).ok())
                .ok_or_else(|| error("a set element is not an IPv4 address"))?;
            let expires_in_ms = field(&element, ELEMENT_EXPIRATION)
                .ok()
                .and_then(|v| <[u8; 8]>::try_from(v).ok())
                .map_or(0, u64::from_be_bytes);
            let name = field(&element, ELEMENT_USERDATA)
                .ok()
                .and_then(commented)
                .unwrap_or_default();
            admitted.push(AdmittedAddress {
                name,
                address: Ipv4Addr::from(address),
                expires_in_ms,
            });
        }
    }
    admitted.sort_by(|a, b| (&a.name, a.address).cmp(&(&b.name, b.address)));
    let total = admitted.len();
    admitted.truncate(LISTED_ADMISSIONS);
    Ok((admitted, total))
}

/// The element user data holding `name` as its comment (at most 254 bytes
/// of it: a DNS name is at most 253).
fn comment(name: &str) -> Vec<u8> {
    let mut text = name.as_bytes()[..name.len().min(254)].to_vec();
    text.push(0);
    let mut data = vec![
        USERDATA_COMMENT,
        u8::try_from(text.len()).unwrap_or(u8::MAX),
    ];
    data.extend(text);
    data
}

/// The comment in an element's user data, if it holds one.
fn commented(data: &[u8]) -> Option<String> {
    let mut rest = data;
    while let [kind, len, tail @ ..] = rest {
        let (value, next) = tail.split_at_checked(usize::from(*len))?;
        if *kind == USERDATA_COMMENT {
            let text = value.strip_suffix(&[0]).unwrap_or(value);
            return Some(String::from_utf8_lossy(text).into_owned());
        }
        rest = next;
    }
    None
}

/// Checks a dumped set is the one [`install`] writes: this table's
/// [`SET`], of IPv4 addresses, with timeouts.
fn set_of(attrs: &[(u16, &[u8])]) -> Result<(), Malformed> {
    let text = |kind| field(attrs, kind).and_then(string);
    let number = |kind| field(attrs, kind).and_then(be_u32);
    if text(SET_TABLE)? != TABLE || text(SET_NAME)? != SET {
        return Err(Malformed("a set of another name"));
    }
    if number(SET_FLAGS)? != SET_TIMEOUT_FLAG
        || number(SET_KEY_TYPE)? != IPV4_ADDR_TYPE
        || number(SET_KEY_LEN)? != 4
    {
        return Err(Malformed("a set of other flags or keys"));
    }
    Ok(())
}

/// The set of admitted addresses, for Lazaret's resolver to fill.
pub struct NamedSet {
    socket: Socket,
}

impl std::fmt::Debug for NamedSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NamedSet")
    }
}

impl NamedSet {
    /// Opens the netlink socket that fills it (CAP_NET_ADMIN in the
    /// namespace is checked on every message, not only here).
    pub fn open() -> Result<Self, SidecarError> {
        Ok(Self { socket: socket()? })
    }

    /// Admits `address` for `timeout` as an answer for `name`, or renews
    /// it.
    pub fn admit(
        &mut self,
        address: Ipv4Addr,
        timeout: std::time::Duration,
        name: &str,
    ) -> Result<(), SidecarError> {
        admit(&mut self.socket, address, timeout, name)
            .map_err(|e| filter_failed(&format!("cannot admit {address}"), &e))
    }
}

/// Admits `address` into the set for `timeout`, or renews it there: a
/// fresh element, or, when one is there, the old one deleted and a fresh
/// one added in one transaction (an element's timeout cannot be changed
/// in place on every kernel Lazaret runs on).
fn admit(
    socket: &mut Socket,
    address: Ipv4Addr,
    timeout: std::time::Duration,
    name: &str,
) -> Result<(), Failure> {
    let elements = |with_timeout: bool| {
        let mut attrs = Attrs::default();
        attrs
            .str(ELEMENTS_TABLE, TABLE)
            .str(ELEMENTS_SET, SET)
            .nested(ELEMENTS_LIST, |list| {
                list.nested(LIST_ELEMENT, |e| {
                    e.nested(ELEMENT_KEY, |k| {
                        k.bytes(DATA_VALUE, &address.octets());
                    });
                    if with_timeout {
                        let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
                        e.u64(ELEMENT_TIMEOUT, ms);
                        e.bytes(ELEMENT_USERDATA, &comment(name));
                    }
                });
            });
        attrs
    };
    let what = format!("{address} in set {SET}");
    let mut fresh = Batch::new();
    fresh.add(
        Kind::SetElement,
        FAMILY_INET,
        NLM_F_CREATE | NLM_F_EXCL,
        elements(true),
        what.clone(),
    );
    match socket.apply(&fresh) {
        Err(Failure::Refused { errno, .. })
            if errno.raw_os_error() == Some(rustix::io::Errno::EXIST.raw_os_error()) =>
        {
            let mut renew = Batch::new();
            renew.delete(Kind::SetElement, FAMILY_INET, elements(false), what.clone());
            renew.add(
                Kind::SetElement,
                FAMILY_INET,
                NLM_F_CREATE | NLM_F_EXCL,
                elements(true),
                what,
            );
            socket.apply(&renew)
        }
        other => other,
    }
}

/// The value of attribute `kind`.
fn field<'a>(attrs: &[(u16, &'a [u8])], kind: u16) -> Result<&'a [u8], Malformed> {
    attrs
        .iter()
        .find(|(k, _)| *k == kind)
        .map(|(_, v)| *v)
        .ok_or(Malformed("an attribute is missing"))
}

/// A dumped chain as (name, hook, priority, policy, type), if it is a base
/// chain of this table; an error names any other.
fn chain_of(attrs: &[(u16, &[u8])]) -> Result<(String, u32, u32, u32, String), Malformed> {
    let text = |kind| field(attrs, kind).and_then(string).map(str::to_owned);
    if text(CHAIN_TABLE)? != TABLE {
        return Err(Malformed("a chain belongs to another table"));
    }
    let hook = parse(field(attrs, CHAIN_HOOK)?)?;
    Ok((
        text(CHAIN_NAME)?,
        be_u32(field(&hook, HOOK_NUMBER)?)?,
        be_u32(field(&hook, HOOK_PRIORITY)?)?,
        be_u32(field(attrs, CHAIN_POLICY)?)?,
        text(CHAIN_TYPE)?,
    ))
}

/// A dumped rule as (table, chain, expressions).
fn rule_of(attrs: &[(u16, &[u8])]) -> Result<(String, String, Vec<Expr>), Malformed> {
    let text = |kind| field(attrs, kind).and_then(string).map(str::to_owned);
    let mut exprs = Vec::new();
    for (kind, element) in parse(field(attrs, RULE_EXPRESSIONS)?)? {
        if kind != LIST_ELEMENT {
            return Err(Malformed("an expression list holds something else"));
        }
        let element = parse(element)?;
        let name = string(field(&element, EXPR_NAME)?)?;
        exprs.push(Expr::decode(name, field(&element, EXPR_DATA)?)?);
    }
    Ok((text(RULE_TABLE)?, text(RULE_CHAIN)?, exprs))
}

/// Turns the output chain's rules back into [`FilterRule`]s: each must be
/// exactly what [`rules`] writes for one.
fn rules_of(output: &[Vec<Expr>]) -> Result<Vec<FilterRule>, SidecarError> {
    let mut found = Vec::new();
    let mut rest = output;
    while !rest.is_empty() {
        let candidates = candidates(&rest[0]);
        let matched = candidates.into_iter().find_map(|rule| {
            let written = rules(&rule).ok()?;
            rest.starts_with(&written).then_some((rule, written.len()))
        });
        let Some((rule, taken)) = matched else {
            return Err(error(format!(
                "unrecognised output rule {:?}; {NOT_WRITTEN_HERE}",
                rest[0]
            )));
        };
        found.push(rule);
        rest = &rest[taken..];
    }
    Ok(found)
}

/// The [`FilterRule`]s a rule could be written for, by the destination it
/// matches.
fn candidates(exprs: &[Expr]) -> Vec<FilterRule> {
    let mut candidates = vec![
        FilterRule::AcceptLoopback,
        FilterRule::AcceptNamed,
        FilterRule::AcceptEstablished,
    ];
    let network = match exprs {
        [_, _, Expr::Verdict(_)] => IpPrefix::ipv4([0; 4], 0),
        [_, _, Expr::Payload { .. }, Expr::Cmp { data, .. }, ..] => <[u8; 4]>::try_from(&data[..])
            .ok()
            .and_then(|a| IpPrefix::ipv4(a, 32)),
        [
            _,
            _,
            Expr::Payload { .. },
            Expr::Mask(mask),
            Expr::Cmp { data, .. },
            ..,
        ] => {
            let ones = mask.iter().map(|b| b.count_ones()).sum::<u32>();
            <[u8; 4]>::try_from(&data[..])
                .ok()
                .and_then(|a| IpPrefix::ipv4(a, u8::try_from(ones).ok()?))
        }
        _ => None,
    };
    if let Some(network) = network {
        if let IpAddr::V4(resolver) = network.address
            && network.prefix_len == 32
        {
            candidates.push(FilterRule::AcceptDns { resolver });
            if let Some(Expr::Cmp { data, .. }) = exprs.get(5)
                && let Ok(mark) = <[u8; 4]>::try_from(&data[..])
            {
                candidates.push(FilterRule::AcceptMarkedDns {
                    resolver,
                    mark: u32::from_ne_bytes(mark),
                });
            }
        }
        for action in [PolicyAction::Allow, PolicyAction::Deny] {
            candidates.push(FilterRule::Prefix { network, action });
        }
    }
    candidates
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefix(octets: [u8; 4], len: u8, action: PolicyAction) -> FilterRule {
        FilterRule::Prefix {
            network: IpPrefix::ipv4(octets, len).unwrap(),
            action,
        }
    }

    fn sample() -> Vec<FilterRule> {
        vec![
            FilterRule::AcceptLoopback,
            FilterRule::AcceptDns {
                resolver: Ipv4Addr::new(10, 0, 2, 3),
            },
            prefix([224, 0, 0, 0], 4, PolicyAction::Deny),
            prefix([255, 255, 255, 255], 32, PolicyAction::Deny),
            prefix([198, 18, 0, 10], 32, PolicyAction::Allow),
            prefix([10, 0, 0, 0], 8, PolicyAction::Deny),
            prefix([0, 0, 0, 0], 0, PolicyAction::Allow),
        ]
    }

    /// A filter with names: DNS only from the resolver's marked sockets,
    /// and the set of admitted addresses last.
    fn named() -> Vec<FilterRule> {
        vec![
            FilterRule::AcceptLoopback,
            FilterRule::AcceptMarkedDns {
                resolver: Ipv4Addr::new(10, 0, 2, 3),
                mark: 0x4c5a_0053,
            },
            prefix([224, 0, 0, 0], 4, PolicyAction::Deny),
            prefix([10, 0, 0, 0], 8, PolicyAction::Deny),
            FilterRule::AcceptEstablished,
            FilterRule::AcceptNamed,
        ]
    }

    /// What the kernel dumps back is what was encoded; decoding it gives
    /// the expression again.
    fn round_trip(expr: &Expr) -> Expr {
        let (name, data) = expr.encode();
        Expr::decode(name, data.as_bytes()).unwrap()
    }

    #[test]
    fn rules_read_back_as_written() {
        let filter = sample();
        let written: Vec<Vec<Expr>> = filter
            .iter()
            .flat_map(|r| rules(r).unwrap())
            .map(|exprs| exprs.iter().map(round_trip).collect())
            .collect();
        assert_eq!(written.len(), filter.len() + 1, "DNS takes two rules");
        assert_eq!(rules_of(&written).unwrap(), filter);
        let filter = named();
        let written: Vec<Vec<Expr>> = filter
            .iter()
            .flat_map(|r| rules(r).unwrap())
            .map(|exprs| exprs.iter().map(round_trip).collect())
            .collect();
        assert_eq!(rules_of(&written).unwrap(), filter);
        for exprs in input_rules() {
            let read: Vec<Expr> = exprs.iter().map(round_trip).collect();
            assert_eq!(read, exprs);
        }
    }

    #[test]
    fn unknown_rules_are_refused() {
        let accept = Expr::Verdict(ACCEPT);
        let to = |op| {
            let mut exprs = ipv4().to_vec();
            exprs.extend(daddr(Ipv4Addr::new(1, 2, 3, 4), 32));
            if let Some(Expr::Cmp { op: o, .. }) = exprs.last_mut() {
                *o = op;
            }
            exprs.push(accept.clone());
            exprs
        };
        let foreign = [
            vec![accept.clone()],
            to(NEQ),
            // A mask that is not a prefix.
            {
                let mut exprs = ipv4().to_vec();
                exprs.extend(daddr(Ipv4Addr::new(10, 0, 0, 0), 8));
                exprs[3] = Expr::Mask(vec![0xff, 0, 0xff, 0]);
                exprs.push(accept.clone());
                exprs
            },
        ];
        for rule in foreign {
            assert!(rules_of(std::slice::from_ref(&rule)).is_err(), "{rule:?}");
        }
        // Half of a DNS pair is not DNS.
        let dns = rules(&FilterRule::AcceptDns {
            resolver: Ipv4Addr::new(10, 0, 2, 3),
        })
        .unwrap();
        assert!(rules_of(&dns[..1]).is_err());
        // An expression the filter never writes, or with an attribute it
        // never sets, does not decode.
        assert!(Expr::decode("counter", &[]).is_err());
        let (name, mut data) = Expr::Meta(META_OIFNAME).encode();
        data.u32(3, REGISTER);
        assert!(Expr::decode(name, data.as_bytes()).is_err());
        let (name, _) = Expr::Verdict(ACCEPT).encode();
        let mut other = Attrs::default();
        other.u32(1, REGISTER).nested(2, |d| {
            d.nested(DATA_VERDICT, |v| {
                v.u32(VERDICT_CODE, ACCEPT);
            });
        });
        assert!(
            Expr::decode(name, other.as_bytes()).is_err(),
            "a verdict into a data register"
        );
    }

    /// In a user and network namespace of its own (the test re-runs itself
    /// under `unshare -Urn`), the filter installs, reads back as written,
    /// and `nft` lists it as the rules it means; a rule or table added
    /// beside it makes the read-back fail.
    #[test]
    fn the_kernel_holds_what_was_installed() {
        const INNER: &str = "LAZARET_FILTER_TEST_NAMESPACE";
        let name = "filter::tests::the_kernel_holds_what_was_installed";
        if std::env::var_os(INNER).is_none() {
            let out = std::process::Command::new("unshare")
                .args(["-Urn", "--"])
                .arg(std::env::current_exe().unwrap())
                .args(["--exact", name, "--nocapture", "--test-threads=1"])
                .env(INNER, "1")
                .output()
                .expect("run unshare");
            let text = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success() && text.contains("1 passed"), "{text}");
            return;
        }
        let filter = sample();
        install(&filter).unwrap();
        assert_eq!(read_back().unwrap(), filter);
        // A second install finds the table there and changes nothing.
        let again = install(&filter).unwrap_err();
        assert!(
            again.to_string().contains("table inet lazaret"),
            "{}",
            again.to_string()
        );
        assert_eq!(read_back().unwrap(), filter);

        let nft = |args: &[&str]| {
            let out = std::process::Command::new("nft")
                .args(args)
                .output()
                .expect("run nft");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8(out.stdout).unwrap()
        };
        let listed = nft(&["list", "ruleset"]);
        let lines: Vec<&str> = listed.lines().map(str::trim).collect();
        for expected in [
            "type filter hook output priority filter; policy drop;",
            "type filter hook input priority filter; policy drop;",
            "iifname \"lo\" accept",
            "ct state established,related accept",
            "oifname \"lo\" accept",
            "ip daddr 10.0.2.3 udp dport 53 accept",
            "ip daddr 10.0.2.3 tcp dport 53 accept",
            "ip daddr 224.0.0.0/4 drop",
            "ip daddr 255.255.255.255 drop",
            "ip daddr 198.18.0.10 accept",
            "ip daddr 10.0.0.0/8 drop",
        ] {
            assert!(
                lines.contains(&expected),
                "nft lists no `{expected}`:\n{listed}"
            );
        }

        nft(&[
            "add", "rule", "inet", "lazaret", "output", "counter", "accept",
        ]);
        let refused = read_back().unwrap_err();
        assert!(
            refused.to_string().contains("malformed")
                || refused.to_string().contains("unrecognised"),
            "{}",
            refused.to_string()
        );
        nft(&["delete", "table", "inet", "lazaret"]);
        install(&filter).unwrap();
        nft(&["add", "table", "ip", "other"]);
        let refused = read_back().unwrap_err();
        assert!(
            refused.to_string().contains("another table"),
            "{}",
            refused.to_string()
        );
        nft(&["delete", "table", "ip", "other"]);
        nft(&["delete", "table", "inet", "lazaret"]);

        // With names: the set, the marked DNS rules and the lookup.
        let filter = named();
        install(&filter).unwrap();
        assert_eq!(read_back().unwrap(), filter);
        let listed = nft(&["list", "ruleset"]);
        for expected in [
            "ip daddr @names accept",
            "ct state established,related accept",
            "meta mark 0x4c5a0053",
            "flags timeout",
        ] {
            assert!(
                listed.contains(expected),
                "nft lists no `{expected}`:\n{listed}"
            );
        }
        let mut socket = Socket::open().unwrap();
        let address = Ipv4Addr::new(198, 18, 0, 10);
        let thirty = std::time::Duration::from_secs(30);
        admit(&mut socket, address, thirty, "a.example").unwrap();
        // Admitted again, it is renewed with the new timeout and name.
        let ninety = std::time::Duration::from_secs(90);
        admit(&mut socket, address, ninety, "b.example").unwrap();
        let set = nft(&["list", "set", "inet", "lazaret", "names"]);
        assert!(
            set.contains("198.18.0.10 timeout 1m30s") && set.contains("comment \"b.example\""),
            "{set}"
        );
        let (admitted, total) = read_admitted().unwrap();
        assert_eq!(total, 1);
        assert!(
            matches!(&admitted[..], [AdmittedAddress { name, address, expires_in_ms }]
                if *address == Ipv4Addr::new(198, 18, 0, 10)
                    && name == "b.example"
                    && (60_000..=90_000).contains(expires_in_ms)),
            "{admitted:?}"
        );
        assert_eq!(read_back().unwrap(), filter, "elements are not rules");
        // A second set beside it is foreign.
        nft(&[
            "add",
            "set",
            "inet",
            "lazaret",
            "other",
            "{ type ipv4_addr; }",
        ]);
        let refused = read_back().unwrap_err();
        assert!(
            refused.to_string().contains("another set"),
            "{}",
            refused.to_string()
        );
    }
}
