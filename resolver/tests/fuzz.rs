//! Fuzz targets of the resolver's DNS side ([`lazaret_resolver::answer`]):
//! the datagrams the sandbox sends it and the answers upstream sends back,
//! both parsed by hickory-proto and then decided on here.
//!
//! - `fuzz_dns_query`: a datagram from the sandbox, decided on under a
//!   policy of one name and one wildcard, with the resolver's own DNS and
//!   with the host's. Only an unparseable datagram or a response is
//!   dropped; every answer made at once parses, carries the query's id and
//!   question, and fits what the client takes (512 bytes without EDNS);
//!   only one A question in class IN for an allowed name goes upstream, as
//!   a lower-case query of its own with EDNS; only with the host's DNS is
//!   anything relayed; a refused name is named printably.
//! - `fuzz_dns_answer`: upstream's answer to the query for an allowed
//!   name. It is taken only with the query's id and question; what is
//!   passed on is the asked name's CNAME chain and its A records, with
//!   TTLs capped; an address the policy denies empties the answer; the
//!   answer made of it parses and fits; a relayed answer keeps the
//!   sandbox's id.
//!
//! Seeds live in `tests/__fuzz__/NAME/corpus/` (the input format is
//! `build-support/fuzz_input.rs`'s); rewrite them with
//! `cargo test -p lazaret-resolver --test fuzz -- --ignored write_seed_corpus`.
//! The default run (`cargo test`) replays the seeds and then tries random
//! inputs for one second per target; a long run:
//! `BOLERO_RANDOM_TEST_TIME_MS=600000 cargo test --release -p lazaret-resolver --test fuzz fuzz_ -- --test-threads=1`.
//! A failure prints `BOLERO_RANDOM_SEED=…`, which replays it.

#[allow(dead_code)]
#[path = "../../build-support/fuzz_input.rs"]
mod fuzz_input;

use std::net::Ipv4Addr;
use std::time::Duration;

use fuzz_input::{Fields, Framer, Tally};
use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, CNAME, TXT};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use lazaret_proto::names::{DnsMode, HostPattern};
use lazaret_proto::network::NamedEgress;
use lazaret_resolver::answer::{self, Decision, Upstream};

const DNS_QUERY: &str = "dns_query";
const DNS_ANSWER: &str = "dns_answer";

/// The most bytes of an answer to a client that offered no EDNS.
const PLAIN_UDP: usize = 512;
/// The most bytes of any answer.
const EDNS_UDP: usize = 1232;

/// Where the proxied host's answers point.
const PROXY: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 54);

fn names(dns: DnsMode) -> NamedEgress {
    NamedEgress::new(
        ["allowed.test.invalid", "*.wild.test.invalid"].map(|h| HostPattern::parse(h).unwrap()),
        dns,
    )
}

/// The policy's denials: private and loopback addresses.
fn admits(address: Ipv4Addr) -> bool {
    !(address.is_private() || address.is_loopback() || address.is_unspecified())
}

/// The most bytes an answer to `query` may have.
fn limit(query: &Message) -> usize {
    match query.extensions() {
        Some(edns) => usize::from(edns.max_payload()).clamp(PLAIN_UDP, EDNS_UDP),
        None => PLAIN_UDP,
    }
}

/// An answer made for `query`: it parses, is a response with the query's
/// id, and fits. Its answer records, unless it says it was cut short.
fn check_reply(query: &Message, bytes: &[u8]) -> Vec<Record> {
    assert!(
        bytes.len() <= limit(query),
        "an answer of {} bytes to a client taking {}",
        bytes.len(),
        limit(query)
    );
    let reply = Message::from_vec(bytes).expect("an answer made here parses");
    assert_eq!(reply.id(), query.id());
    assert_eq!(reply.message_type(), MessageType::Response);
    if reply.truncated() {
        assert!(reply.answers().is_empty());
    } else {
        assert_eq!(reply.queries(), query.queries());
    }
    reply.answers().to_vec()
}

// ---------------------------------------------------------------------------
// Queries from the sandbox.
// ---------------------------------------------------------------------------

fn dns_query(datagram: &[u8]) -> bool {
    let parsed = Message::from_vec(datagram).ok();
    let mut deep = false;
    for dns in [DnsMode::Lazaret, DnsMode::Host] {
        let names = names(dns);
        let decision = answer::decide(&names, datagram);
        let query = match (&decision, &parsed) {
            (Decision::Drop, None) => continue,
            (Decision::Drop, Some(m)) => {
                assert_ne!(m.message_type(), MessageType::Query, "a query dropped");
                continue;
            }
            (_, None) => panic!("an unparseable datagram got {decision:?}"),
            (_, Some(query)) => query,
        };
        assert_eq!(query.message_type(), MessageType::Query);
        match decision {
            Decision::Drop => unreachable!("handled above"),
            Decision::Reply(bytes) => {
                check_reply(query, &bytes);
            }
            Decision::Refuse { reply, name } => {
                assert_eq!(dns, DnsMode::Lazaret, "refused with the host's DNS");
                check_reply(query, &reply);
                assert!(
                    name.chars().all(|c| c.is_ascii_graphic()),
                    "a refused name logged as {name:?}"
                );
            }
            Decision::Resolve(asked) => {
                let [question] = query.queries() else {
                    panic!("resolved for {} questions", query.queries().len());
                };
                assert_eq!(asked.queries(), query.queries());
                assert_eq!(question.query_type(), RecordType::A);
                assert_eq!(question.query_class(), DNSClass::IN);
                assert!(names.allows(&question.name().to_ascii()));
                let sent = Message::from_vec(&answer::upstream_query(&asked, 0x4242))
                    .expect("the upstream query parses");
                assert_eq!(sent.id(), 0x4242);
                assert!(sent.recursion_desired() && sent.extensions().is_some());
                let [upstream] = sent.queries() else {
                    panic!("{} questions upstream", sent.queries().len());
                };
                let lower = question.name().to_lowercase();
                assert_eq!(upstream.name().to_ascii(), lower.to_ascii());
                assert!(
                    !upstream
                        .name()
                        .to_ascii()
                        .chars()
                        .any(|c| c.is_ascii_uppercase())
                );
                deep = true;
            }
            Decision::Relay(asked) => {
                assert_eq!(dns, DnsMode::Host, "relayed with the resolver's own DNS");
                let mut answered = asked.clone();
                answered
                    .set_id(asked.id().wrapping_add(1))
                    .set_message_type(MessageType::Response);
                let bytes = answer::relayed(&asked, answered);
                let relayed = Message::from_vec(&bytes).expect("a relayed answer parses");
                assert_eq!(relayed.id(), query.id());
            }
        }
    }
    deep
}

#[test]
fn fuzz_dns_query() {
    let seeds = fuzz_input::seeds(env!("CARGO_MANIFEST_DIR"), DNS_QUERY);
    let tally = Tally::new(DNS_QUERY);
    bolero::check!(name = DNS_QUERY).for_each(|data: &[u8]| {
        tally.count(dns_query(&fuzz_input::input(data, &seeds)));
    });
}

// ---------------------------------------------------------------------------
// Answers from upstream.
// ---------------------------------------------------------------------------

/// The queries for allowed names an answer may be to.
fn asked(pick: u8) -> Message {
    let (name, edns) = match pick % 4 {
        0 => ("allowed.test.invalid.", None),
        1 => ("ALLOWED.Test.invalid", Some(4096)),
        2 => ("a.b.wild.test.invalid.", Some(512)),
        _ => ("x.wild.test.invalid.", Some(1232)),
    };
    let mut query = Message::new();
    query
        .set_id(0x1d1d)
        .set_message_type(MessageType::Query)
        .set_op_code(OpCode::Query)
        .set_recursion_desired(true);
    query.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
    if let Some(size) = edns {
        let mut edns = Edns::new();
        edns.set_max_payload(size);
        query.set_edns(edns);
    }
    let bytes = query.to_vec().unwrap();
    let Decision::Resolve(query) = answer::decide(&names(DnsMode::Lazaret), &bytes) else {
        panic!("{name} is allowed");
    };
    query
}

/// The input: which query was asked, the upstream query's id, then the
/// datagram upstream sent.
fn dns_answer(input: &[u8]) -> bool {
    let mut fields = Fields::new(input);
    let asked = asked(fields.byte());
    let id = fields.u16();
    let datagram = fields.rest();
    let _ = answer::client_answer(datagram, id);
    let answered = match answer::answers(datagram, id, &asked) {
        Some(answered) => answered,
        None => {
            // Made to match, as a spoofer who saw the query would.
            let Ok(mut answered) = Message::from_vec(datagram) else {
                return false;
            };
            answered.set_id(id).set_message_type(MessageType::Response);
            *answered.queries_mut() = asked.queries().to_vec();
            let Ok(bytes) = answered.to_vec() else {
                return false;
            };
            match answer::answers(&bytes, id, &asked) {
                Some(answered) => answered,
                None => return false,
            }
        }
    };
    assert_eq!(answered.id(), id);
    assert_eq!(answered.message_type(), MessageType::Response);
    assert_eq!(answered.queries(), asked.queries());

    let relayed = answer::relayed(&asked, answered.clone());
    if !relayed.is_empty() {
        let relayed = Message::from_vec(&relayed).expect("a relayed answer parses");
        assert_eq!(relayed.id(), asked.id());
    }

    let longest = NamedEgress::TTL_CLAMP.1.as_secs() as u32;
    match answer::read_upstream(&asked, &answered, admits) {
        Upstream::Truncated => {
            assert!(answered.truncated());
            let cut = answer::truncated(&asked);
            assert!(Message::from_vec(&cut).unwrap().truncated());
            check_reply(&asked, &cut);
            false
        }
        Upstream::Rebinding(address) => {
            assert!(!answered.truncated());
            assert!(!admits(address), "{address} refused yet admitted");
            let among = answered
                .answers()
                .iter()
                .any(|r| r.data() == &RData::A(A(address)));
            assert!(among, "{address} is not in the answer");
            true
        }
        Upstream::Addresses {
            code,
            mut records,
            admit,
        } => {
            assert!(!answered.truncated());
            assert_eq!(code, answered.response_code());
            assert!(records.len() <= answered.answers().len());
            let a_records = records
                .iter()
                .filter(|r| matches!(r.data(), RData::A(_)))
                .count();
            assert_eq!(a_records, admit.len());
            for (address, timeout) in &admit {
                assert!(admits(*address), "{address} admitted");
                assert!(
                    (NamedEgress::TTL_CLAMP.0..=NamedEgress::TTL_CLAMP.1).contains(timeout),
                    "{timeout:?}"
                );
            }
            // The chain from the asked name, and A records at its end.
            let mut name = asked.queries()[0].name().clone();
            for record in &records {
                assert!(record.ttl() <= longest);
                assert_eq!(record.name(), &name, "a record off the chain");
                match record.data() {
                    RData::CNAME(target) => name = target.0.clone(),
                    RData::A(_) => {}
                    other => panic!("a {other:?} record passed on"),
                }
            }
            let proxied = answer::proxied(&asked, records.clone(), PROXY);
            if a_records > 0 {
                let [one] = proxied.as_slice() else {
                    panic!("{} records for a proxied host", proxied.len());
                };
                assert_eq!(one.data(), &RData::A(A(PROXY)));
                assert_eq!(one.name(), asked.queries()[0].name());
            }
            answer::cap_ttls(&mut records, Duration::from_secs(45));
            assert!(records.iter().all(|r| r.ttl() <= 45));
            let sent = check_reply(&asked, &answer::reply(&asked, code, records.clone()));
            assert!(sent.is_empty() || sent.len() == records.len());
            !admit.is_empty()
        }
    }
}

#[test]
fn fuzz_dns_answer() {
    let seeds = fuzz_input::seeds(env!("CARGO_MANIFEST_DIR"), DNS_ANSWER);
    let tally = Tally::new(DNS_ANSWER);
    bolero::check!(name = DNS_ANSWER).for_each(|data: &[u8]| {
        tally.count(dns_answer(&fuzz_input::input(data, &seeds)));
    });
}

// ---------------------------------------------------------------------------
// Seeds.
// ---------------------------------------------------------------------------

fn query(name: &str, kind: RecordType, edns: Option<u16>) -> Vec<u8> {
    let mut q = Message::new();
    q.set_id(7).set_recursion_desired(true);
    q.add_query(Query::query(Name::from_ascii(name).unwrap(), kind));
    if let Some(size) = edns {
        let mut e = Edns::new();
        e.set_max_payload(size);
        q.set_edns(e);
    }
    q.to_vec().unwrap()
}

fn write_query_seeds() {
    let mut seeds = vec![
        (
            "allowed-a",
            query("allowed.test.invalid", RecordType::A, None),
        ),
        (
            "wild-a-edns",
            query("A.b.Wild.test.invalid.", RecordType::A, Some(1232)),
        ),
        (
            "allowed-aaaa",
            query("allowed.test.invalid", RecordType::AAAA, None),
        ),
        (
            "denied-a",
            query("denied.test.invalid", RecordType::A, None),
        ),
        (
            "allowed-txt",
            query("allowed.test.invalid", RecordType::TXT, Some(4096)),
        ),
    ];
    let mut two = Message::new();
    two.set_id(9);
    for name in ["allowed.test.invalid", "denied.test.invalid"] {
        two.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
    }
    seeds.push(("two-questions", two.to_vec().unwrap()));
    // Questions longer together than any answer may be.
    let mut many = Message::new();
    many.set_id(11);
    for i in 0..40 {
        let name = Name::from_ascii(format!("name{i}.distinct{i}.example")).unwrap();
        many.add_query(Query::query(name, RecordType::A));
    }
    seeds.push(("many-questions", many.to_vec().unwrap()));
    let mut odd = Message::new();
    odd.set_id(3);
    let name = Name::from_labels([&b"\x1b[31m x"[..], b"wild", b"test", b"invalid"]).unwrap();
    odd.add_query(Query::query(name, RecordType::A));
    seeds.push(("wild-odd-bytes", odd.to_vec().unwrap()));
    let mut notify =
        Message::from_vec(&query("allowed.test.invalid", RecordType::A, None)).unwrap();
    notify.set_op_code(OpCode::Notify);
    seeds.push(("notify", notify.to_vec().unwrap()));
    for (file, bytes) in seeds {
        dns_query(&bytes);
        fuzz_input::write_seed(env!("CARGO_MANIFEST_DIR"), DNS_QUERY, file, &bytes);
    }
}

fn a(name: &str, ttl: u32, address: [u8; 4]) -> Record {
    Record::from_rdata(
        Name::from_ascii(name).unwrap(),
        ttl,
        RData::A(A(address.into())),
    )
}

fn cname(name: &str, ttl: u32, target: &str) -> Record {
    Record::from_rdata(
        Name::from_ascii(name).unwrap(),
        ttl,
        RData::CNAME(CNAME(Name::from_ascii(target).unwrap())),
    )
}

fn write_answer_seeds() {
    let upstream = |pick: u8, records: Vec<Record>, edit: &dyn Fn(&mut Message)| {
        let asked = asked(pick);
        let mut m = Message::new();
        m.set_id(0x5151)
            .set_message_type(MessageType::Response)
            .set_recursion_available(true);
        m.add_queries(asked.queries().iter().cloned());
        m.add_answers(records);
        edit(&mut m);
        Framer::default()
            .byte(pick)
            .u16(0x5151)
            .rest(&m.to_vec().unwrap())
            .done()
    };
    let none = |_: &mut Message| {};
    let seeds = [
        (
            "one-address",
            upstream(
                0,
                vec![a("allowed.test.invalid.", 300, [198, 18, 0, 10])],
                &none,
            ),
        ),
        (
            "chain",
            upstream(
                1,
                vec![
                    cname("allowed.test.invalid.", 7200, "cdn.test.invalid."),
                    cname("cdn.test.invalid.", 60, "edge.test.invalid."),
                    a("edge.test.invalid.", 5, [198, 18, 0, 11]),
                    a("edge.test.invalid.", 90000, [198, 18, 0, 12]),
                    a("other.test.invalid.", 5, [198, 18, 9, 9]),
                ],
                &none,
            ),
        ),
        (
            "rebinding",
            upstream(
                2,
                vec![
                    a("a.b.wild.test.invalid.", 60, [198, 18, 0, 10]),
                    a("a.b.wild.test.invalid.", 60, [10, 1, 2, 3]),
                ],
                &none,
            ),
        ),
        (
            "truncated",
            upstream(3, vec![], &|m: &mut Message| {
                m.set_truncated(true);
            }),
        ),
        (
            "nxdomain",
            upstream(0, vec![], &|m: &mut Message| {
                m.set_response_code(ResponseCode::NXDomain);
            }),
        ),
        (
            "many",
            upstream(
                0,
                (0..60)
                    .map(|i| a("allowed.test.invalid.", 60, [198, 18, 1, i]))
                    .collect(),
                &none,
            ),
        ),
        (
            "txt",
            upstream(
                1,
                vec![Record::from_rdata(
                    Name::from_ascii("allowed.test.invalid.").unwrap(),
                    60,
                    RData::TXT(TXT::new(vec!["v=spf1 -all".into()])),
                )],
                &none,
            ),
        ),
    ];
    for (file, input) in seeds {
        dns_answer(&input);
        fuzz_input::write_seed(env!("CARGO_MANIFEST_DIR"), DNS_ANSWER, file, &input);
    }
}

/// Writes the seed corpora of both targets.
#[test]
#[ignore = "writes the checked-in seed corpora"]
fn write_seed_corpus() {
    write_query_seeds();
    write_answer_seeds();
}
