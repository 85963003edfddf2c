//! Probes the installed policy from inside the enforcement namespace.
//!
//! Owns the readiness observations. A destination probe connects a
//! datagram socket, which makes the kernel choose a route and sends no
//! packet: a denied destination must fail with "no route", a permitted one
//! must succeed with the tap device's address as source. The DNS probe
//! sends one real query to each resolver through the connectivity helper
//! and records what came back, a timeout included. Trusts only the kernel
//! and, for the DNS answer's contents, nothing: it records them.

use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::time::Duration;

use lazaret_proto::network::{
    ConnectivityLink, DeniedDestinationObservation, DerivedNetworkPolicy, DnsObservation,
    DnsOutcome, NamedEgress, PermittedDestinationObservation,
};

/// The name every readiness DNS probe asks for: one a resolver answers
/// without asking anyone else, and that says nothing about the Domain.
pub const QUERY_NAME: &str = "localhost.";

/// How long the DNS probe waits for an answer.
const DNS_TIMEOUT: Duration = Duration::from_millis(1500);

/// Everything probed.
#[derive(Debug)]
pub struct Probes {
    /// Denied destinations.
    pub denied: Vec<DeniedDestinationObservation>,
    /// Permitted destinations.
    pub permitted: Vec<PermittedDestinationObservation>,
    /// DNS queries.
    pub dns: Vec<DnsObservation>,
}

/// What [`start`] observed of the destinations, and the DNS queries it
/// sent, whose answers [`Pending::finish`] collects.
#[derive(Debug)]
pub struct Pending {
    denied: Vec<DeniedDestinationObservation>,
    permitted: Vec<PermittedDestinationObservation>,
    queries: Vec<Query>,
}

/// Sends one DNS query to every resolver, then probes every destination
/// of the policy's probe plan while the answers travel; the caller may do
/// more meanwhile, and collects the answers with [`Pending::finish`].
///
/// With `names`, only Lazaret's resolver's marked sockets reach a
/// resolver, so the queries leave marked as its do.
pub fn start(
    policy: &DerivedNetworkPolicy,
    names: Option<&NamedEgress>,
    link: &ConnectivityLink,
) -> Pending {
    let mark = names.map(|_| NamedEgress::UPSTREAM_MARK);
    let queries = policy
        .resolvers
        .iter()
        .map(|r| Query::send(r.address, mark))
        .collect();
    let plan = policy.probe_plan(link.gateway, names);
    let denied = plan
        .denied
        .iter()
        .map(|&destination| DeniedDestinationObservation {
            destination,
            unreachable: matches!(route_source(destination), Err(e) if no_route(&e)),
        })
        .collect();
    let permitted = plan
        .permitted
        .iter()
        .map(|&destination| PermittedDestinationObservation {
            destination,
            reachable: matches!(
                route_source(destination),
                Ok(IpAddr::V4(source)) if source == link.guest_address
            ),
        })
        .collect();
    Pending {
        denied,
        permitted,
        queries,
    }
}

impl Pending {
    /// Waits for each query's answer, up to [`DNS_TIMEOUT`] from when it
    /// was sent.
    pub fn finish(self) -> Probes {
        Probes {
            denied: self.denied,
            permitted: self.permitted,
            dns: self.queries.into_iter().map(Query::answer).collect(),
        }
    }
}

/// The source address the kernel picks for `destination`, or why it has
/// no route there.
fn route_source(destination: IpAddr) -> std::io::Result<IpAddr> {
    let local: SocketAddr = match destination {
        IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        IpAddr::V6(_) => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = UdpSocket::bind(local)?;
    socket.connect((destination, 9))?;
    Ok(socket.local_addr()?.ip())
}

fn no_route(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::HostUnreachable | ErrorKind::NetworkUnreachable | ErrorKind::AddrNotAvailable
    ) || e.raw_os_error() == Some(rustix::io::Errno::AFNOSUPPORT.raw_os_error())
}

/// One DNS query for the A records of [`QUERY_NAME`], sent.
#[derive(Debug)]
struct Query {
    resolver: IpAddr,
    id: u16,
    /// The socket it left on, or why it could not leave.
    socket: std::io::Result<UdpSocket>,
    deadline: std::time::Instant,
}

impl Query {
    /// Sends the query to `resolver`, from a socket carrying `mark` when
    /// one is given.
    fn send(resolver: IpAddr, mark: Option<u32>) -> Self {
        let id = query_id();
        let socket = (|| {
            let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None)?;
            if let Some(mark) = mark {
                socket.set_mark(mark)?;
            }
            socket.bind(&SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)).into())?;
            let socket = UdpSocket::from(socket);
            socket.connect((resolver, 53))?;
            socket.send(&encode_query(id, QUERY_NAME))?;
            Ok(socket)
        })();
        Self {
            resolver,
            id,
            socket,
            deadline: std::time::Instant::now() + DNS_TIMEOUT,
        }
    }

    /// What came back before the deadline.
    fn answer(self) -> DnsObservation {
        let observation = |outcome, resolved_addresses| DnsObservation {
            resolver: self.resolver,
            query_name: QUERY_NAME.into(),
            resolved_addresses,
            outcome,
        };
        let Ok(socket) = self.socket else {
            return observation(DnsOutcome::Unreachable, Vec::new());
        };
        let mut buffer = [0u8; 1500];
        loop {
            // Past the deadline, an answer already there is still taken,
            // without waiting for another.
            let left = self
                .deadline
                .saturating_duration_since(std::time::Instant::now());
            let waited = if left.is_zero() {
                socket.set_nonblocking(true)
            } else {
                socket.set_read_timeout(Some(left))
            };
            if waited.is_err() {
                return observation(DnsOutcome::TimedOut, Vec::new());
            }
            match socket.recv(&mut buffer) {
                Ok(n) => {
                    if let Some((response_code, addresses)) = parse_response(self.id, &buffer[..n])
                    {
                        return observation(DnsOutcome::Answered { response_code }, addresses);
                    }
                    // Not our answer; keep waiting until the deadline.
                }
                // A refusal is no answer either: the query left and
                // nothing resolved it; nor is nothing by the deadline.
                Err(_) => return observation(DnsOutcome::TimedOut, Vec::new()),
            }
        }
    }
}

fn query_id() -> u16 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    (nanos ^ std::process::id()) as u16
}

/// A standard query with recursion desired, one question: `name` A IN.
fn encode_query(id: u16, name: &str) -> Vec<u8> {
    let mut message = Vec::with_capacity(32);
    message.extend_from_slice(&id.to_be_bytes());
    message.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.').filter(|l| !l.is_empty()) {
        message.push(label.len() as u8);
        message.extend_from_slice(label.as_bytes());
    }
    message.extend_from_slice(&[0, 0, 1, 0, 1]);
    message
}

/// The response code and A-record addresses of a response to query `id`;
/// `None` for anything else.
fn parse_response(id: u16, message: &[u8]) -> Option<(u8, Vec<IpAddr>)> {
    let u16_at = |i: usize| {
        message
            .get(i..i + 2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]))
    };
    if u16_at(0)? != id || message.get(2)? & 0x80 == 0 {
        return None;
    }
    let response_code = message.get(3)? & 0x0f;
    let questions = u16_at(4)?;
    let answers = u16_at(6)?;
    let mut at = 12;
    for _ in 0..questions {
        at = skip_name(message, at)? + 4;
    }
    let mut addresses = Vec::new();
    for _ in 0..answers {
        at = skip_name(message, at)?;
        let kind = u16_at(at)?;
        let length = usize::from(u16_at(at + 8)?);
        let data = message.get(at + 10..at + 10 + length)?;
        if kind == 1 && length == 4 {
            addresses.push(IpAddr::V4(Ipv4Addr::new(
                data[0], data[1], data[2], data[3],
            )));
        }
        at += 10 + length;
    }
    Some((response_code, addresses))
}

/// The offset after the (possibly compressed) name at `at`.
fn skip_name(message: &[u8], mut at: usize) -> Option<usize> {
    loop {
        let length = *message.get(at)?;
        match length {
            0 => return Some(at + 1),
            l if l & 0xc0 == 0xc0 => return Some(at + 2),
            l => at += 1 + usize::from(l),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_already_there_at_the_deadline_is_taken_and_none_is_not_waited_for() {
        let resolver = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let sent = |id: u16| {
            let socket = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
            socket.connect(resolver.local_addr().unwrap()).unwrap();
            socket.send(&encode_query(id, QUERY_NAME)).unwrap();
            Query {
                resolver: IpAddr::V4(Ipv4Addr::LOCALHOST),
                id,
                socket: Ok(socket),
                deadline: std::time::Instant::now(),
            }
        };
        let answered = sent(7);
        let mut buffer = [0u8; 512];
        let (n, from) = resolver.recv_from(&mut buffer).unwrap();
        let mut nxdomain = buffer[..n].to_vec();
        nxdomain[2] = 0x81;
        nxdomain[3] = 0x83;
        resolver.send_to(&nxdomain, from).unwrap();
        // Local datagrams are delivered before `send_to` returns.
        assert_eq!(
            answered.answer().outcome,
            DnsOutcome::Answered { response_code: 3 }
        );
        let unanswered = sent(8);
        let began = std::time::Instant::now();
        assert_eq!(unanswered.answer().outcome, DnsOutcome::TimedOut);
        assert!(began.elapsed() < DNS_TIMEOUT, "it waited past the deadline");
    }

    #[test]
    fn a_query_and_its_answer_round_trip() {
        let query = encode_query(0x1234, "localhost.");
        assert_eq!(&query[12..23], b"\x09localhost\x00");
        // The same message as a response with one compressed A answer.
        let mut response = query.clone();
        response[2] = 0x81;
        response[3] = 0x80;
        response[7] = 1;
        response.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 5, 0, 4, 127, 0, 0, 1]);
        assert_eq!(
            parse_response(0x1234, &response),
            Some((0, vec![IpAddr::V4(Ipv4Addr::LOCALHOST)]))
        );
        assert_eq!(parse_response(0x4321, &response), None);
        // NXDOMAIN, no answers.
        let mut nxdomain = query.clone();
        nxdomain[2] = 0x81;
        nxdomain[3] = 0x83;
        assert_eq!(parse_response(0x1234, &nxdomain), Some((3, vec![])));
        // A truncated answer is refused, not read past its end.
        assert_eq!(
            parse_response(0x1234, &response[..response.len() - 2]),
            None
        );
        // The query itself is not a response.
        assert_eq!(parse_response(0x1234, &query), None);
    }
}
