//! nf_tables over netlink: the wire format of the requests that build the
//! packet filter and of the dumps that read it back.
//!
//! Owns the framing only — netlink headers, `nfgenmsg`, attributes — and
//! one `NETLINK_NETFILTER` socket to the kernel of the namespace the
//! sidecar runs in; what the attributes mean is [`crate::filter`]'s. A
//! batch is sent in one write, so the kernel applies it as one transaction
//! or not at all, and every message in it is acknowledged. Trusts only the
//! kernel at the other end, and its replies for nothing but their shape:
//! every length is checked before it is used, and every wait is bounded.

use std::io;
use std::time::Duration;

use netlink_sys::{Socket as NetlinkSocket, SocketAddr, protocols::NETLINK_NETFILTER};

/// The nf_tables subsystem's number in a message type's high byte.
const SUBSYS_NFTABLES: u16 = 10;
/// The batch delimiters (`NFNL_MSG_BATCH_BEGIN`, `NFNL_MSG_BATCH_END`).
const BATCH_BEGIN: u16 = 0x10;
const BATCH_END: u16 = 0x11;

/// `NLMSG_ERROR` and `NLMSG_DONE`.
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;

/// Header flags.
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;
const NLM_F_DUMP_INTR: u16 = 0x10;
/// Creation flags: fail on an object that exists, append a rule.
pub const NLM_F_EXCL: u16 = 0x200;
pub const NLM_F_CREATE: u16 = 0x400;
pub const NLM_F_APPEND: u16 = 0x800;

/// An attribute's nested flag, and the bits of its type.
const NLA_F_NESTED: u16 = 0x8000;
const NLA_TYPE_MASK: u16 = 0x3fff;

const HEADER_LEN: usize = 16;
const NFGEN_LEN: usize = 4;

/// How long the kernel may take to answer one request.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
/// A receive buffer: the kernel's dump messages are at most 32 KiB.
const RECEIVE_LEN: usize = 64 * 1024;

/// The nf_tables message kinds used here (`NFT_MSG_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// `NFT_MSG_NEWTABLE`: a table, added or dumped.
    Table = 0,
    /// `NFT_MSG_NEWCHAIN`.
    Chain = 3,
    /// `NFT_MSG_NEWRULE`.
    Rule = 6,
    /// `NFT_MSG_NEWSET`.
    Set = 9,
    /// `NFT_MSG_NEWSETELEM`: an element of a set.
    SetElement = 12,
    /// `NFT_MSG_NEWOBJ`.
    Object = 18,
    /// `NFT_MSG_NEWFLOWTABLE`.
    Flowtable = 22,
}

impl Kind {
    /// The message that adds an object of this kind.
    fn new_type(self) -> u16 {
        (SUBSYS_NFTABLES << 8) | self as u16
    }

    /// The message that asks for them (`NFT_MSG_GET*`, one above `NEW*`).
    fn get_type(self) -> u16 {
        self.new_type() + 1
    }

    /// What it is called in errors.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Table => "table",
            Kind::Chain => "chain",
            Kind::Rule => "rule",
            Kind::Set => "set",
            Kind::SetElement => "set element",
            Kind::Object => "stateful object",
            Kind::Flowtable => "flowtable",
        }
    }
}

/// Attributes being written: each a 4-byte header and its value, padded to
/// four bytes.
#[derive(Default)]
pub struct Attrs(Vec<u8>);

impl Attrs {
    /// Adds attribute `kind` holding `value`.
    pub fn bytes(&mut self, kind: u16, value: &[u8]) -> &mut Self {
        self.header(kind, value.len());
        self.0.extend_from_slice(value);
        self.pad();
        self
    }

    /// Adds a string attribute, NUL-terminated as nf_tables wants it.
    pub fn str(&mut self, kind: u16, value: &str) -> &mut Self {
        let mut bytes = value.as_bytes().to_vec();
        bytes.push(0);
        self.bytes(kind, &bytes)
    }

    /// Adds a 64-bit attribute in network byte order.
    pub fn u64(&mut self, kind: u16, value: u64) -> &mut Self {
        self.bytes(kind, &value.to_be_bytes())
    }

    /// Adds a 32-bit attribute in network byte order, as nf_tables wants
    /// every number.
    pub fn u32(&mut self, kind: u16, value: u32) -> &mut Self {
        self.bytes(kind, &value.to_be_bytes())
    }

    /// Adds a nested attribute holding what `fill` writes.
    pub fn nested(&mut self, kind: u16, fill: impl FnOnce(&mut Attrs)) -> &mut Self {
        let mut inner = Attrs::default();
        fill(&mut inner);
        self.header(kind | NLA_F_NESTED, inner.0.len());
        self.0.extend_from_slice(&inner.0);
        self
    }

    /// What has been written.
    #[cfg(test)]
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    fn header(&mut self, kind: u16, len: usize) {
        let len = u16::try_from(4 + len).expect("an nf_tables attribute is small");
        self.0.extend_from_slice(&len.to_ne_bytes());
        self.0.extend_from_slice(&kind.to_ne_bytes());
    }

    fn pad(&mut self) {
        self.0.resize(self.0.len().next_multiple_of(4), 0);
    }
}

/// What a reply, or one attribute in it, did not hold.
#[derive(Debug)]
pub struct Malformed(pub &'static str);

/// The attributes in `bytes`, as (type without flags, value).
pub fn parse(bytes: &[u8]) -> Result<Vec<(u16, &[u8])>, Malformed> {
    let mut attrs = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let (Some(len), Some(kind)) = (read_u16(rest, 0), read_u16(rest, 2)) else {
            return Err(Malformed("an attribute header is cut short"));
        };
        let len = usize::from(len);
        if len < 4 || len > rest.len() {
            return Err(Malformed("an attribute's length is out of bounds"));
        }
        attrs.push((kind & NLA_TYPE_MASK, &rest[4..len]));
        rest = &rest[len.next_multiple_of(4).min(rest.len())..];
    }
    Ok(attrs)
}

fn read_u16(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}

fn read_u32(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

/// A 32-bit attribute value in network byte order.
pub fn be_u32(value: &[u8]) -> Result<u32, Malformed> {
    value
        .try_into()
        .map(u32::from_be_bytes)
        .map_err(|_| Malformed("a 32-bit attribute has another length"))
}

/// A NUL-terminated string attribute value.
pub fn string(value: &[u8]) -> Result<&str, Malformed> {
    let text = value.strip_suffix(&[0]).unwrap_or(value);
    std::str::from_utf8(text).map_err(|_| Malformed("a name is not UTF-8"))
}

/// One object of a dump: its family and its attributes' bytes.
#[derive(Debug)]
pub struct Object {
    /// The protocol family (`NFPROTO_*`) of its table.
    pub family: u8,
    /// Its attributes, for [`parse`].
    pub attrs: Vec<u8>,
}

/// Messages to apply as one transaction.
pub struct Batch {
    /// Each message's type, flags, family, attributes and what it adds.
    messages: Vec<(u16, u16, u8, Attrs, String)>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Self {
        Self {
            messages: Vec::new(),
        }
    }

    /// Adds an object of `kind` in `family` with `flags` (of
    /// [`NLM_F_CREATE`], [`NLM_F_EXCL`], [`NLM_F_APPEND`]); `what` names it
    /// in a refusal.
    pub fn add(&mut self, kind: Kind, family: u8, flags: u16, attrs: Attrs, what: String) {
        self.messages
            .push((kind.new_type(), flags, family, attrs, what));
    }

    /// Deletes an object of `kind` in `family` (`NFT_MSG_DEL*`, two above
    /// `NEW*`); `what` names it in a refusal.
    pub fn delete(&mut self, kind: Kind, family: u8, attrs: Attrs, what: String) {
        self.messages
            .push((kind.new_type() + 2, 0, family, attrs, what));
    }

    /// What the message with sequence number `seq` adds, in a batch whose
    /// first message (its begin delimiter) had `first`.
    fn what(&self, first: u32, seq: u32) -> String {
        let index = seq.wrapping_sub(first).wrapping_sub(1) as usize;
        self.messages
            .get(index)
            .map_or_else(|| "the batch".to_owned(), |m| m.4.clone())
    }
}

/// Why the kernel refused a batch or a dump, or could not be asked.
#[derive(Debug)]
pub enum Failure {
    /// The socket failed, or the kernel did not answer in time.
    Io(io::Error),
    /// The kernel refused what is named (a batch's message, or a dump).
    Refused { what: String, errno: io::Error },
    /// A reply did not have the shape netlink gives it.
    Malformed(&'static str),
    /// The ruleset changed while it was dumped.
    Interrupted,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Io(e) if e.kind() == io::ErrorKind::WouldBlock => write!(
                f,
                "the kernel did not answer within {} s",
                ANSWER_TIMEOUT.as_secs()
            ),
            Failure::Io(e) => write!(f, "netlink: {e}"),
            Failure::Refused { what, errno } => write!(f, "the kernel refused {what}: {errno}"),
            Failure::Malformed(what) => write!(f, "the kernel's reply is malformed: {what}"),
            Failure::Interrupted => write!(f, "the ruleset changed while it was read"),
        }
    }
}

impl Failure {
    /// Whether the kernel has no nf_tables to answer: the netlink family
    /// or the subsystem is missing, or was not loaded.
    pub fn no_nf_tables(&self) -> bool {
        let errno = match self {
            Failure::Io(e) | Failure::Refused { errno: e, .. } => e.raw_os_error(),
            Failure::Malformed(_) | Failure::Interrupted => None,
        };
        let missing = [
            rustix::io::Errno::OPNOTSUPP,
            rustix::io::Errno::PROTONOSUPPORT,
        ];
        errno.is_some_and(|n| missing.map(rustix::io::Errno::raw_os_error).contains(&n))
    }
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Self {
        Failure::Io(e)
    }
}

impl From<Malformed> for Failure {
    fn from(Malformed(what): Malformed) -> Self {
        Failure::Malformed(what)
    }
}

/// A `NETLINK_NETFILTER` socket to the kernel.
pub struct Socket {
    socket: NetlinkSocket,
    seq: u32,
    buffer: Vec<u8>,
}

impl Socket {
    /// Opens one, bound and connected to the kernel, every receive bounded
    /// by [`ANSWER_TIMEOUT`].
    pub fn open() -> io::Result<Self> {
        let mut socket = NetlinkSocket::new(NETLINK_NETFILTER)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        rustix::net::sockopt::set_socket_timeout(
            &socket,
            rustix::net::sockopt::Timeout::Recv,
            Some(ANSWER_TIMEOUT),
        )?;
        Ok(Self {
            socket,
            seq: 0,
            buffer: Vec::with_capacity(RECEIVE_LEN),
        })
    }

    /// Applies `batch` as one transaction: sent in one write, every
    /// message acknowledged, or the first refusal returned (and then the
    /// kernel applied none of it).
    pub fn apply(&mut self, batch: &Batch) -> Result<(), Failure> {
        let first = self.seq.wrapping_add(1);
        let mut out = Vec::new();
        let mut frame = |out: &mut Vec<u8>, kind, flags, family, res_id: u16, attrs: &[u8]| {
            self.seq = self.seq.wrapping_add(1);
            message(out, kind, flags, self.seq, family, res_id, attrs);
        };
        frame(
            &mut out,
            BATCH_BEGIN,
            NLM_F_REQUEST,
            0,
            SUBSYS_NFTABLES,
            &[],
        );
        for (kind, flags, family, attrs, _) in &batch.messages {
            let flags = NLM_F_REQUEST | NLM_F_ACK | flags;
            frame(&mut out, *kind, flags, *family, 0, &attrs.0);
        }
        frame(&mut out, BATCH_END, NLM_F_REQUEST, 0, SUBSYS_NFTABLES, &[]);
        self.socket.send(&out, 0)?;

        // Each of the batch's messages is acknowledged.
        let mut pending = batch.messages.len();
        while pending > 0 {
            self.receive()?;
            for reply in replies(&self.buffer) {
                let reply = reply?;
                if reply.kind != NLMSG_ERROR {
                    continue;
                }
                match error_code(reply.payload)? {
                    0 => pending = pending.saturating_sub(1),
                    errno => {
                        return Err(Failure::Refused {
                            what: batch.what(first, reply.seq),
                            errno: io::Error::from_raw_os_error(errno),
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// Every object of `kind` in every family.
    pub fn dump(&mut self, kind: Kind) -> Result<Vec<Object>, Failure> {
        self.dump_of(kind, 0, &Attrs::default())
    }

    /// Every object of `kind` that `attrs` select in `family` (the
    /// elements of one set).
    pub fn dump_of(
        &mut self,
        kind: Kind,
        family: u8,
        attrs: &Attrs,
    ) -> Result<Vec<Object>, Failure> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut out = Vec::new();
        message(
            &mut out,
            kind.get_type(),
            NLM_F_REQUEST | NLM_F_DUMP,
            seq,
            family,
            0,
            &attrs.0,
        );
        self.socket.send(&out, 0)?;
        let mut objects = Vec::new();
        loop {
            self.receive()?;
            for reply in replies(&self.buffer) {
                let reply = reply?;
                if reply.seq != seq {
                    continue;
                }
                if reply.flags & NLM_F_DUMP_INTR != 0 {
                    return Err(Failure::Interrupted);
                }
                match reply.kind {
                    NLMSG_DONE => return Ok(objects),
                    NLMSG_ERROR => match error_code(reply.payload)? {
                        0 => return Ok(objects),
                        errno => {
                            return Err(Failure::Refused {
                                what: format!("the dump of every {}", kind.name()),
                                errno: io::Error::from_raw_os_error(errno),
                            });
                        }
                    },
                    found if found == kind.new_type() => {
                        let (&family, _) = reply
                            .payload
                            .split_first()
                            .ok_or(Malformed("a dumped object has no nfgenmsg"))?;
                        let attrs = reply
                            .payload
                            .get(NFGEN_LEN..)
                            .ok_or(Malformed("a dumped object has no nfgenmsg"))?;
                        objects.push(Object {
                            family,
                            attrs: attrs.to_vec(),
                        });
                    }
                    _ => return Err(Failure::Malformed("a dump holds another message")),
                }
            }
        }
    }

    fn receive(&mut self) -> io::Result<()> {
        self.buffer.clear();
        self.buffer.reserve(RECEIVE_LEN);
        self.socket.recv(&mut self.buffer, 0)?;
        Ok(())
    }
}

/// Appends one message: the netlink header, `nfgenmsg`, the attributes.
fn message(
    out: &mut Vec<u8>,
    kind: u16,
    flags: u16,
    seq: u32,
    family: u8,
    res_id: u16,
    attrs: &[u8],
) {
    let len = u32::try_from(HEADER_LEN + NFGEN_LEN + attrs.len()).expect("a small message");
    out.extend_from_slice(&len.to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(&flags.to_ne_bytes());
    out.extend_from_slice(&seq.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes());
    // nfgenmsg: the family, NFNETLINK_V0, the resource id (big-endian).
    out.extend_from_slice(&[family, 0]);
    out.extend_from_slice(&res_id.to_be_bytes());
    out.extend_from_slice(attrs);
}

/// One message of a reply.
struct Reply<'a> {
    kind: u16,
    flags: u16,
    seq: u32,
    payload: &'a [u8],
}

/// The messages in one received datagram.
fn replies(bytes: &[u8]) -> impl Iterator<Item = Result<Reply<'_>, Malformed>> {
    let mut rest = bytes;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let header = (
            read_u32(rest, 0),
            read_u16(rest, 4),
            read_u16(rest, 6),
            read_u32(rest, 8),
        );
        let (Some(len), Some(kind), Some(flags), Some(seq)) = header else {
            rest = &[];
            return Some(Err(Malformed("a message header is cut short")));
        };
        let len = len as usize;
        if len < HEADER_LEN || len > rest.len() {
            rest = &[];
            return Some(Err(Malformed("a message's length is out of bounds")));
        }
        let payload = &rest[HEADER_LEN..len];
        rest = &rest[len.next_multiple_of(4).min(rest.len())..];
        Some(Ok(Reply {
            kind,
            flags,
            seq,
            payload,
        }))
    })
}

/// The errno of an `NLMSG_ERROR` (0 for an acknowledgement).
fn error_code(payload: &[u8]) -> Result<i32, Malformed> {
    let code = read_u32(payload, 0).ok_or(Malformed("an error message is cut short"))?;
    Ok((code as i32).saturating_neg())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_read_back_as_written() {
        let mut attrs = Attrs::default();
        attrs
            .str(1, "lazaret")
            .u32(2, 0xdead_beef)
            .nested(3, |inner| {
                inner.bytes(1, &[1, 2, 3]);
            });
        let parsed = parse(&attrs.0).unwrap();
        assert_eq!(parsed.len(), 3);
        assert_eq!((parsed[0].0, string(parsed[0].1).unwrap()), (1, "lazaret"));
        assert_eq!(be_u32(parsed[1].1).unwrap(), 0xdead_beef);
        assert_eq!(parsed[2].0, 3, "the nested flag is masked off");
        assert_eq!(parse(parsed[2].1).unwrap(), vec![(1, &[1u8, 2, 3][..])]);
    }

    #[test]
    fn lengths_out_of_bounds_are_refused() {
        // An attribute claiming more than there is, or less than a header.
        for bytes in [&[9u8, 0, 1, 0, 0][..], &[2, 0, 1, 0], &[8, 0]] {
            assert!(parse(bytes).is_err(), "{bytes:?}");
        }
        let mut out = Vec::new();
        message(&mut out, 1, 0, 1, 0, 0, &[]);
        out[0] = 200;
        assert!(replies(&out).next().unwrap().is_err());
    }

    #[test]
    fn a_kernel_without_nf_tables_is_told_from_other_refusals() {
        let refused = |errno: rustix::io::Errno| Failure::Refused {
            what: "table inet lazaret".into(),
            errno: io::Error::from_raw_os_error(errno.raw_os_error()),
        };
        assert!(refused(rustix::io::Errno::OPNOTSUPP).no_nf_tables());
        assert!(!refused(rustix::io::Errno::EXIST).no_nf_tables());
        assert!(!Failure::Interrupted.no_nf_tables());
    }

    #[test]
    fn an_error_message_carries_a_negative_errno() {
        let mut payload = (-1i32).to_ne_bytes().to_vec();
        payload.extend_from_slice(&[0; 16]);
        assert_eq!(error_code(&payload).unwrap(), 1);
        assert_eq!(error_code(&0i32.to_ne_bytes()).unwrap(), 0);
        assert!(error_code(&[0, 0]).is_err());
    }
}
