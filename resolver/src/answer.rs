//! What Lazaret's resolver answers: the decision for one datagram from the
//! sandbox, the query it sends upstream for an allowed name, and the answer
//! it makes of upstream's.
//!
//! Owns the DNS side of the resolver and nothing else: no sockets, no set
//! ([`crate::serve`] does the I/O). Trusts nothing it reads: the sandbox's
//! queries and upstream's answers are parsed by hickory-proto, and only a
//! query of one A or AAAA question in class IN for an allowed name goes on;
//! only the records of the asked name's CNAME chain come back.

use std::net::Ipv4Addr;
use std::time::Duration;

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use lazaret_proto::names::DnsMode;
use lazaret_proto::network::NamedEgress;

/// The largest answer sent to a client that did not offer EDNS.
const PLAIN_UDP: usize = 512;
/// The largest answer sent at all: what fits a datagram everywhere.
const EDNS_UDP: usize = 1232;
/// The longest CNAME chain followed.
const MAX_CHAIN: usize = 16;

/// What to do with one datagram from the sandbox.
#[derive(Debug)]
pub enum Decision {
    /// Nothing: it is not a query (unparseable, or a response).
    Drop,
    /// Answer at once with these bytes; nothing goes upstream.
    Reply(Vec<u8>),
    /// Refuse a name the policy does not allow (named, for the log) with
    /// these bytes; nothing goes upstream.
    Refuse {
        /// The answer.
        reply: Vec<u8>,
        /// The name asked for.
        name: String,
    },
    /// Ask upstream for the A records of an allowed name, admit them, then
    /// answer ([`answer_allowed`]).
    Resolve(Message),
    /// With `dns = "host"`: relay a query for a name the policy does not
    /// allow, and its answer, unchanged but for the id; nothing admitted.
    Relay(Message),
}

/// Decides what `datagram` from the sandbox gets.
pub fn decide(names: &NamedEgress, datagram: &[u8]) -> Decision {
    let Ok(query) = Message::from_vec(datagram) else {
        return Decision::Drop;
    };
    if query.message_type() != MessageType::Query {
        return Decision::Drop;
    }
    let refuse = |code| Decision::Reply(reply(&query, code, Vec::new()));
    if query.op_code() != OpCode::Query {
        return refuse(ResponseCode::NotImp);
    }
    let [question] = query.queries() else {
        return refuse(ResponseCode::FormErr);
    };
    let allowed =
        question.query_class() == DNSClass::IN && names.allows(&question.name().to_ascii());
    match (allowed, question.query_type()) {
        (true, RecordType::A) => Decision::Resolve(query),
        // IPv6 is off in the sandbox: an allowed name has no address there.
        (true, RecordType::AAAA) => {
            Decision::Reply(reply(&query, ResponseCode::NoError, Vec::new()))
        }
        _ if names.dns == DnsMode::Host => Decision::Relay(query),
        _ => Decision::Refuse {
            reply: reply(&query, ResponseCode::Refused, Vec::new()),
            name: question.name().to_ascii(),
        },
    }
}

/// The query sent upstream for `asked`'s question: a fresh message with
/// its own `id`, recursion desired, the one question in lower case (the
/// case of letters in a name is no channel out), and EDNS offering
/// [`EDNS_UDP`] bytes, so answers seldom need truncating.
pub fn upstream_query(asked: &Message, id: u16) -> Vec<u8> {
    let mut query = Message::new();
    query
        .set_id(id)
        .set_message_type(MessageType::Query)
        .set_op_code(OpCode::Query)
        .set_recursion_desired(true);
    query.add_queries(asked.queries().iter().map(|q| {
        let mut q = q.clone();
        q.set_name(q.name().to_lowercase());
        q
    }));
    let mut edns = Edns::new();
    edns.set_max_payload(EDNS_UDP as u16);
    query.set_edns(edns);
    query.to_vec().unwrap_or_default()
}

/// Whether `datagram` is upstream's answer to the query with `id` for
/// `asked`'s question.
pub fn answers(datagram: &[u8], id: u16, asked: &Message) -> Option<Message> {
    let answer = Message::from_vec(datagram).ok()?;
    (answer.id() == id
        && answer.message_type() == MessageType::Response
        && answer.queries() == asked.queries())
    .then_some(answer)
}

/// What upstream's answer to an allowed name holds, checked.
#[derive(Debug, PartialEq, Eq)]
pub enum Upstream {
    /// The records to pass on (the CNAME chain and the final A records),
    /// and each address with how long to admit it.
    Addresses {
        /// Upstream's response code.
        code: ResponseCode,
        /// The records, TTLs no longer than the longest admission.
        records: Vec<Record>,
        /// The addresses and their admission timeouts.
        admit: Vec<(Ipv4Addr, Duration)>,
    },
    /// The name points where no allowed name may (the policy's denials,
    /// loopback): the answer is emptied.
    Rebinding(Ipv4Addr),
    /// Upstream cut its answer short: the client is told so (it may ask
    /// again over TCP, which this resolver does not serve).
    Truncated,
}

/// Follows `answer`'s CNAME chain from the asked name and takes the A
/// records at its end; any address `admits` refuses makes it a rebinding.
pub fn read_upstream(
    asked: &Message,
    answer: &Message,
    admits: impl Fn(Ipv4Addr) -> bool,
) -> Upstream {
    if answer.truncated() {
        return Upstream::Truncated;
    }
    let longest = NamedEgress::TTL_CLAMP.1.as_secs() as u32;
    let mut name: Name = asked.queries()[0].name().clone();
    let mut records = Vec::new();
    // The names of the chain so far: a CNAME back to one of them is a
    // loop, passed on once rather than followed round again.
    let mut chain = vec![name.clone()];
    for _ in 0..MAX_CHAIN {
        let next = answer.answers().iter().find_map(|r| match r.data() {
            RData::CNAME(target) if *r.name() == name => Some((r, target.0.clone())),
            _ => None,
        });
        let Some((record, target)) = next else { break };
        let mut record = record.clone();
        record.set_ttl(record.ttl().min(longest));
        records.push(record);
        let looped = chain.contains(&target);
        chain.push(target.clone());
        name = target;
        if looped {
            break;
        }
    }
    let mut admit = Vec::new();
    for record in answer.answers().iter().filter(|r| *r.name() == name) {
        if let RData::A(a) = record.data() {
            if !admits(a.0) {
                return Upstream::Rebinding(a.0);
            }
            let ttl = Duration::from_secs(record.ttl().into());
            admit.push((a.0, NamedEgress::admission_timeout(ttl)));
            let mut record = record.clone();
            record.set_ttl(record.ttl().min(longest));
            records.push(record);
        }
    }
    Upstream::Addresses {
        code: answer.response_code(),
        records,
        admit,
    }
}

/// The answer to `query` with `code` and `records`, truncated (no records,
/// the TC bit set) when it would not fit what the client takes.
pub fn reply(query: &Message, code: ResponseCode, records: Vec<Record>) -> Vec<u8> {
    let limit = limit(query);
    let mut message = response(query, code);
    message.add_answers(records);
    let whole = message.to_vec().unwrap_or_default();
    if whole.len() <= limit {
        whole
    } else {
        cut(query, code, limit)
    }
}

/// The answer to `query` that says it was cut short: no records, the TC
/// bit set.
pub fn truncated(query: &Message) -> Vec<u8> {
    cut(query, ResponseCode::NoError, limit(query))
}

/// The most bytes an answer to `query` may have: what its EDNS offers,
/// within [`PLAIN_UDP`] and [`EDNS_UDP`].
fn limit(query: &Message) -> usize {
    match query.extensions() {
        Some(edns) => usize::from(edns.max_payload()).clamp(PLAIN_UDP, EDNS_UDP),
        None => PLAIN_UDP,
    }
}

/// The header of the answer to `query`, with `code`, and its questions.
fn response(query: &Message, code: ResponseCode) -> Message {
    let mut message = Message::new();
    message
        .set_id(query.id())
        .set_message_type(MessageType::Response)
        .set_op_code(query.op_code())
        .set_recursion_desired(query.recursion_desired())
        .set_recursion_available(true)
        .set_response_code(code);
    message.add_queries(query.queries().iter().cloned());
    message
}

/// The answer to `query` with `code` and the TC bit, no records: with its
/// questions when they fit within `limit`, else (a query of many
/// questions, refused) with none.
fn cut(query: &Message, code: ResponseCode, limit: usize) -> Vec<u8> {
    let mut message = response(query, code);
    message.set_truncated(true);
    let bytes = message.to_vec().unwrap_or_default();
    if bytes.len() <= limit {
        return bytes;
    }
    message.take_queries();
    message.to_vec().unwrap_or_default()
}

/// Shortens every record's TTL to at most `left`.
pub fn cap_ttls(records: &mut [Record], left: Duration) {
    let left = u32::try_from(left.as_secs()).unwrap_or(u32::MAX);
    for record in records {
        record.set_ttl(record.ttl().min(left));
    }
}

/// The records the sandbox gets for a proxied host: one A record of the
/// name it asked, at `address` (the Credential Proxy), with the shortest
/// TTL of `records`; `records` as they are when they hold no address (the
/// name does not exist, or has no A record).
pub fn proxied(query: &Message, records: Vec<Record>, address: Ipv4Addr) -> Vec<Record> {
    let ttl = records
        .iter()
        .filter(|r| matches!(r.data(), RData::A(_)))
        .map(Record::ttl)
        .min();
    match (ttl, query.queries().first()) {
        (Some(ttl), Some(question)) => vec![Record::from_rdata(
            question.name().clone(),
            ttl,
            RData::A(address.into()),
        )],
        _ => records,
    }
}

/// Upstream's answer to a relayed query, given back under the sandbox's id.
pub fn relayed(query: &Message, mut answer: Message) -> Vec<u8> {
    answer.set_id(query.id());
    answer.to_vec().unwrap_or_default()
}

/// A query for the A records of `name`, as a client sends it.
pub fn client_query(name: &str, id: u16) -> Option<Vec<u8>> {
    let mut query = Message::new();
    query
        .set_id(id)
        .set_message_type(MessageType::Query)
        .set_op_code(OpCode::Query)
        .set_recursion_desired(true);
    query.add_query(Query::query(Name::from_ascii(name).ok()?, RecordType::A));
    query.to_vec().ok()
}

/// The response code and A addresses of a client's answer.
pub fn client_answer(datagram: &[u8], id: u16) -> Option<(u8, Vec<Ipv4Addr>)> {
    let answer = Message::from_vec(datagram).ok()?;
    (answer.id() == id).then(|| {
        let addresses = answer
            .answers()
            .iter()
            .filter_map(|r| match r.data() {
                RData::A(a) => Some(a.0),
                _ => None,
            })
            .collect();
        (u16::from(answer.response_code()) as u8, addresses)
    })
}

#[cfg(test)]
mod tests {
    use hickory_proto::rr::rdata::{A, CNAME};

    use super::*;
    use lazaret_proto::names::HostPattern;

    #[test]
    fn a_proxied_host_is_answered_with_the_proxy_alone() {
        let query = Message::from_vec(&client_query("api.example.org", 7).unwrap()).unwrap();
        let name = Name::from_ascii("api.example.org.").unwrap();
        let edge = Name::from_ascii("edge.cdn.example.").unwrap();
        let records = vec![
            Record::from_rdata(name.clone(), 300, RData::CNAME(CNAME(edge.clone()))),
            Record::from_rdata(edge.clone(), 60, RData::A(A::new(198, 18, 2, 10))),
            Record::from_rdata(edge, 90, RData::A(A::new(198, 18, 2, 11))),
        ];
        let proxy = Ipv4Addr::new(127, 0, 0, 54);
        let answered = proxied(&query, records, proxy);
        assert_eq!(answered.len(), 1);
        assert_eq!(answered[0].name(), &name);
        assert_eq!(answered[0].ttl(), 60);
        assert_eq!(answered[0].data(), &RData::A(A(proxy)));
        // No address: nothing to point at the proxy.
        assert!(proxied(&query, vec![], proxy).is_empty());
    }

    fn names(dns: DnsMode) -> NamedEgress {
        NamedEgress::new(
            ["allowed.test.invalid", "*.wild.test.invalid"].map(|h| HostPattern::parse(h).unwrap()),
            dns,
        )
    }

    fn query(name: &str, kind: RecordType) -> Vec<u8> {
        let mut q = Message::new();
        q.set_id(7).set_recursion_desired(true);
        q.add_query(Query::query(Name::from_ascii(name).unwrap(), kind));
        q.to_vec().unwrap()
    }

    fn code(decision: &Decision) -> Option<ResponseCode> {
        match decision {
            Decision::Reply(bytes) | Decision::Refuse { reply: bytes, .. } => {
                Some(Message::from_vec(bytes).unwrap().response_code())
            }
            _ => None,
        }
    }

    #[test]
    fn only_allowed_names_go_upstream() {
        let lazaret = names(DnsMode::Lazaret);
        for name in [
            "allowed.test.invalid.",
            "ALLOWED.test.invalid",
            "a.b.wild.test.invalid",
        ] {
            assert!(
                matches!(
                    decide(&lazaret, &query(name, RecordType::A)),
                    Decision::Resolve(_)
                ),
                "{name}"
            );
        }
        for name in [
            "denied.test.invalid",
            "wild.test.invalid",
            "x.allowed.test.invalid",
        ] {
            let d = decide(&lazaret, &query(name, RecordType::A));
            assert_eq!(code(&d), Some(ResponseCode::Refused), "{name}");
        }
        let aaaa = decide(&lazaret, &query("allowed.test.invalid", RecordType::AAAA));
        assert_eq!(code(&aaaa), Some(ResponseCode::NoError));
        let txt = decide(&lazaret, &query("allowed.test.invalid", RecordType::TXT));
        assert_eq!(code(&txt), Some(ResponseCode::Refused));
        assert!(matches!(
            decide(&lazaret, b"\x00\x01garbage"),
            Decision::Drop
        ));
        // With the host's DNS, other names are relayed, never admitted.
        let host = names(DnsMode::Host);
        assert!(matches!(
            decide(&host, &query("denied.test.invalid", RecordType::TXT)),
            Decision::Relay(_)
        ));
    }

    #[test]
    fn a_name_with_any_bytes_under_a_wildcard_is_named_printably() {
        // Labels under a wildcard are the sandbox's: whatever bytes they
        // hold, the name the resolver logs and admits for is escaped text.
        let mut q = Message::new();
        q.set_id(3);
        let name = Name::from_labels([&b"\x1b[31m x"[..], b"wild", b"test", b"invalid"]).unwrap();
        q.add_query(Query::query(name, RecordType::A));
        let Decision::Resolve(query) = decide(&names(DnsMode::Lazaret), &q.to_vec().unwrap())
        else {
            panic!("an allowed name");
        };
        let text = query.queries()[0].name().to_ascii();
        assert!(text.chars().all(|c| c.is_ascii_graphic()), "{text:?}");
    }

    #[test]
    fn a_query_of_two_questions_is_refused() {
        let mut q = Message::new();
        q.set_id(9);
        for name in ["allowed.test.invalid", "denied.test.invalid"] {
            q.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
        }
        let d = decide(&names(DnsMode::Lazaret), &q.to_vec().unwrap());
        assert_eq!(code(&d), Some(ResponseCode::FormErr));
    }

    fn upstream(asked: &Message, records: Vec<Record>) -> Message {
        let mut m = Message::new();
        m.set_id(1).set_message_type(MessageType::Response);
        m.add_queries(asked.queries().iter().cloned());
        m.add_answers(records);
        m
    }

    fn a(name: &str, ttl: u32, address: [u8; 4]) -> Record {
        Record::from_rdata(
            Name::from_ascii(name).unwrap(),
            ttl,
            RData::A(A(address.into())),
        )
    }

    #[test]
    fn the_chain_is_followed_and_other_names_dropped() {
        let asked = Message::from_vec(&query("allowed.test.invalid.", RecordType::A)).unwrap();
        let cname = Record::from_rdata(
            Name::from_ascii("allowed.test.invalid.").unwrap(),
            7200,
            RData::CNAME(CNAME(Name::from_ascii("cdn.test.invalid.").unwrap())),
        );
        let answer = upstream(
            &asked,
            vec![
                cname,
                a("cdn.test.invalid.", 5, [198, 18, 0, 10]),
                a("other.test.invalid.", 5, [198, 18, 9, 9]),
            ],
        );
        let Upstream::Addresses { records, admit, .. } = read_upstream(&asked, &answer, |_| true)
        else {
            panic!("no addresses");
        };
        assert_eq!(
            admit,
            vec![(Ipv4Addr::new(198, 18, 0, 10), Duration::from_secs(30))],
            "clamped to the shortest admission"
        );
        assert_eq!(records.len(), 2, "the other name's record is not passed on");
        assert!(records.iter().all(|r| r.ttl() <= 3600));
    }

    #[test]
    fn a_cname_loop_is_passed_on_once() {
        let asked = Message::from_vec(&query("allowed.test.invalid.", RecordType::A)).unwrap();
        let cname = |from: &str, to: &str| {
            Record::from_rdata(
                Name::from_ascii(from).unwrap(),
                60,
                RData::CNAME(CNAME(Name::from_ascii(to).unwrap())),
            )
        };
        let answer = upstream(
            &asked,
            vec![
                cname("allowed.test.invalid.", "loop.test.invalid."),
                cname("loop.test.invalid.", "allowed.test.invalid."),
            ],
        );
        let Upstream::Addresses { records, admit, .. } = read_upstream(&asked, &answer, |_| true)
        else {
            panic!("not cut, no address");
        };
        assert_eq!(records.len(), 2, "each record of the loop once");
        assert!(admit.is_empty());
    }

    #[test]
    fn an_address_the_policy_denies_empties_the_answer() {
        let asked = Message::from_vec(&query("allowed.test.invalid", RecordType::A)).unwrap();
        let answer = upstream(
            &asked,
            vec![
                a("allowed.test.invalid.", 60, [198, 18, 0, 10]),
                a("allowed.test.invalid.", 60, [10, 1, 2, 3]),
            ],
        );
        let denied = |ip: Ipv4Addr| ip.octets()[0] != 10;
        assert_eq!(
            read_upstream(&asked, &answer, denied),
            Upstream::Rebinding(Ipv4Addr::new(10, 1, 2, 3))
        );
    }

    #[test]
    fn upstream_is_asked_in_lower_case_and_a_cut_answer_is_passed_on_as_cut() {
        let asked = Message::from_vec(&query("ALLOWED.Test.invalid", RecordType::A)).unwrap();
        let sent = Message::from_vec(&upstream_query(&asked, 5)).unwrap();
        assert_eq!(sent.queries()[0].name().to_ascii(), "allowed.test.invalid.");
        assert!(sent.extensions().is_some(), "EDNS offered");
        // Its answer still matches the sandbox's question.
        let mut answer = upstream(&asked, vec![]);
        answer.set_id(5);
        answer.set_truncated(true);
        let bytes = answer.to_vec().unwrap();
        let answer = answers(&bytes, 5, &asked).expect("the answer matches");
        assert_eq!(
            read_upstream(&asked, &answer, |_| true),
            Upstream::Truncated
        );
        let cut = Message::from_vec(&truncated(&asked)).unwrap();
        assert!(cut.truncated() && cut.answers().is_empty() && cut.id() == asked.id());
    }

    #[test]
    fn an_answer_must_match_the_query() {
        let asked = Message::from_vec(&query("allowed.test.invalid", RecordType::A)).unwrap();
        let bytes = upstream(&asked, vec![]).to_vec().unwrap();
        assert!(answers(&bytes, 1, &asked).is_some());
        assert!(answers(&bytes, 2, &asked).is_none(), "another id");
        let other = Message::from_vec(&query("denied.test.invalid", RecordType::A)).unwrap();
        assert!(answers(&bytes, 1, &other).is_none(), "another question");
    }

    #[test]
    fn a_query_of_many_questions_is_refused_within_the_size_limit() {
        // Its questions alone are longer than an answer may be: they are
        // left out (this once recursed until the stack overflowed).
        let mut q = Message::new();
        q.set_id(9);
        for i in 0..40 {
            let name = Name::from_ascii(format!("name{i}.distinct{i}.example")).unwrap();
            q.add_query(Query::query(name, RecordType::A));
        }
        let bytes = q.to_vec().unwrap();
        assert!(bytes.len() > PLAIN_UDP);
        let Decision::Reply(reply) = decide(&names(DnsMode::Lazaret), &bytes) else {
            panic!("refused at once");
        };
        assert!(reply.len() <= PLAIN_UDP);
        let reply = Message::from_vec(&reply).unwrap();
        assert!(reply.truncated() && reply.queries().is_empty() && reply.id() == 9);
        assert_eq!(reply.response_code(), ResponseCode::FormErr);
    }

    #[test]
    fn an_answer_too_long_for_plain_udp_is_truncated() {
        let asked = Message::from_vec(&query("allowed.test.invalid", RecordType::A)).unwrap();
        let many: Vec<Record> = (0..60)
            .map(|i| a("allowed.test.invalid.", 60, [198, 18, 1, i]))
            .collect();
        let bytes = reply(&asked, ResponseCode::NoError, many);
        let message = Message::from_vec(&bytes).unwrap();
        assert!(message.truncated() && message.answers().is_empty());
    }
}
