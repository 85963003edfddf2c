//! `lazaret-netprobe`: the probe of Lazaret's network-isolation tests and
//! network benchmark. It owns only its own sockets and threads: TCP
//! listeners and a minimal DNS responder for test hosts, and TCP clients that
//! report what happened in one stable line (`ok …`, numbers, or
//! `failed: ERRNO (message)`), so a test can tell a refused connection from
//! an unreachable host or a timeout.
//!
//! Trusts its command line (written by the test) and nothing else: bytes
//! from peers are only counted, replies are read with a size cap, and DNS
//! queries are parsed with every length checked and dropped when malformed.
//! It is a static executable with no dependency beyond `std`, so it runs in
//! a busybox image without a C library, and it never resolves a name: every
//! address is a literal socket address.

#![deny(unsafe_code)]

#[allow(unsafe_code)]
mod sys;

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::ExitCode;
use std::time::{Duration, Instant};

const USAGE: &str = "usage: lazaret-netprobe serve ADDR:PORT...
       lazaret-netprobe dns ADDR:PORT NAME=IPV4...
       lazaret-netprobe talk ADDR:PORT [--timeout-ms N] [--hold-ms N]
       lazaret-netprobe connect ADDR:PORT COUNT
       lazaret-netprobe send ADDR:PORT MIB
       lazaret-netprobe raw
       lazaret-netprobe lookup ADDR:PORT NAME COUNT [--mark N]
addresses are literal: 198.18.0.10:7000 or [fd00::1]:7000";

/// The connect timeout of `talk` (unless `--timeout-ms`), `connect` and
/// `send`.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(3000);

/// How long `send` may wait for one write or for the reply before it gives
/// up: a stall guard, not part of the measurement.
const STALL: Duration = Duration::from_secs(60);

/// The size of one write of `send` and one read of `serve`.
const CHUNK: usize = 256 * 1024;

const MIB: u64 = 1024 * 1024;

/// The most bytes of a reply a client reads; a reply is one short line.
const REPLY_CAP: u64 = 4096;

/// The TTL of every DNS answer, in seconds.
const DNS_TTL: u32 = 5;

fn main() -> ExitCode {
    let mut args = Vec::new();
    for arg in std::env::args_os().skip(1) {
        match arg.into_string() {
            Ok(arg) => args.push(arg),
            Err(arg) => return usage(&format!("argument {arg:?} is not UTF-8")),
        }
    }
    match parse(&args) {
        Ok(command) => command.run(),
        Err(message) => usage(&message),
    }
}

fn usage(message: &str) -> ExitCode {
    eprintln!("lazaret-netprobe: {message}\n{USAGE}");
    ExitCode::from(2)
}

/// One validated invocation.
enum Command {
    Serve(Vec<SocketAddr>),
    Dns {
        addr: SocketAddr,
        names: Vec<DnsEntry>,
    },
    Talk {
        addr: SocketAddr,
        timeout: Duration,
        hold: Duration,
    },
    Connect {
        addr: SocketAddr,
        count: usize,
    },
    Send {
        addr: SocketAddr,
        mib: u64,
    },
    Raw,
    Lookup {
        addr: SocketAddr,
        name: String,
        count: usize,
        mark: Option<u32>,
    },
}

/// A name the DNS responder answers: its labels, lowercase, and its address.
struct DnsEntry {
    labels: Vec<Vec<u8>>,
    addr: Ipv4Addr,
}

fn parse(args: &[String]) -> Result<Command, String> {
    let Some((command, rest)) = args.split_first() else {
        return Err("no subcommand".into());
    };
    let rest: Vec<&str> = rest.iter().map(String::as_str).collect();
    match (command.as_str(), rest.as_slice()) {
        ("serve", addrs) if !addrs.is_empty() => Ok(Command::Serve(
            addrs
                .iter()
                .map(|a| socket_addr(a))
                .collect::<Result<_, _>>()?,
        )),
        ("dns", [addr, names @ ..]) if !names.is_empty() => Ok(Command::Dns {
            addr: socket_addr(addr)?,
            names: names
                .iter()
                .map(|n| dns_entry(n))
                .collect::<Result<_, _>>()?,
        }),
        ("talk", [addr, options @ ..]) => {
            let (mut timeout, mut hold) = (CONNECT_TIMEOUT, Duration::ZERO);
            for pair in options.chunks(2) {
                match pair {
                    ["--timeout-ms", ms] => {
                        let ms: u64 = number(ms, "--timeout-ms")?;
                        if ms == 0 {
                            return Err("--timeout-ms must be at least 1".into());
                        }
                        timeout = Duration::from_millis(ms);
                    }
                    ["--hold-ms", ms] => hold = Duration::from_millis(number(ms, "--hold-ms")?),
                    _ => return Err("wrong arguments for talk".into()),
                }
            }
            Ok(Command::Talk {
                addr: socket_addr(addr)?,
                timeout,
                hold,
            })
        }
        ("connect", [addr, count]) => {
            let count: usize = number(count, "COUNT")?;
            if count == 0 {
                return Err("COUNT must be at least 1".into());
            }
            Ok(Command::Connect {
                addr: socket_addr(addr)?,
                count,
            })
        }
        ("send", [addr, mib]) => {
            let mib: u64 = number(mib, "MIB")?;
            if mib.checked_mul(MIB).is_none() {
                return Err(format!("MIB {mib} is too large"));
            }
            Ok(Command::Send {
                addr: socket_addr(addr)?,
                mib,
            })
        }
        ("raw", []) => Ok(Command::Raw),
        ("lookup", [addr, name, count, options @ ..]) => {
            let count: usize = number(count, "COUNT")?;
            let mark = match options {
                [] => None,
                ["--mark", mark] => Some(
                    u32::from_str_radix(mark.trim_start_matches("0x"), 16)
                        .map_err(|_| format!("--mark {mark:?} is not a hexadecimal number"))?,
                ),
                _ => return Err("wrong arguments for lookup".into()),
            };
            if count == 0 || name.is_empty() || name.split('.').any(|l| l.len() > 63) {
                return Err("COUNT must be at least 1 and NAME a DNS name".into());
            }
            Ok(Command::Lookup {
                addr: socket_addr(addr)?,
                name: (*name).to_owned(),
                count,
                mark,
            })
        }
        ("serve" | "dns" | "talk" | "connect" | "send" | "raw" | "lookup", _) => {
            Err(format!("wrong arguments for {command}"))
        }
        _ => Err(format!("unknown subcommand {command:?}")),
    }
}

fn socket_addr(text: &str) -> Result<SocketAddr, String> {
    text.parse()
        .map_err(|_| format!("{text:?} is not a literal socket address (ADDR:PORT)"))
}

fn number<T: std::str::FromStr>(text: &str, what: &str) -> Result<T, String> {
    text.parse()
        .map_err(|_| format!("{what} {text:?} is not a decimal number"))
}

/// `NAME=IPV4`: the name lowercased, with or without its trailing dot.
fn dns_entry(text: &str) -> Result<DnsEntry, String> {
    let bad = |why: &str| format!("{text:?} is not NAME=IPV4: {why}");
    let (name, addr) = text.split_once('=').ok_or_else(|| bad("no ="))?;
    let addr: Ipv4Addr = addr.parse().map_err(|_| bad("not an IPv4 address"))?;
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.is_empty() || name.len() > 253 {
        return Err(bad("the name must have 1 to 253 characters"));
    }
    let labels = name
        .split('.')
        .map(|label| {
            if label.is_empty() || label.len() > 63 {
                Err(bad("each label must have 1 to 63 characters"))
            } else {
                Ok(label.to_ascii_lowercase().into_bytes())
            }
        })
        .collect::<Result<_, _>>()?;
    Ok(DnsEntry { labels, addr })
}

impl Command {
    fn run(self) -> ExitCode {
        match self {
            Command::Serve(addrs) => serve(&addrs),
            Command::Dns { addr, names } => dns(addr, &names),
            Command::Talk {
                addr,
                timeout,
                hold,
            } => talk(addr, timeout, hold),
            Command::Connect { addr, count } => connect(addr, count),
            Command::Send { addr, mib } => send(addr, mib),
            Command::Raw => raw(),
            Command::Lookup {
                addr,
                name,
                count,
                mark,
            } => lookup(addr, &name, count, mark),
        }
    }
}

/// Writes one line to standard output and flushes it. A closed output is
/// not an error of the probe: the exit code still says what happened.
fn say(line: &str) {
    let mut out = io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

/// Reports a failed client operation and returns exit code 1.
fn fail(what: &str) -> ExitCode {
    say(&format!("failed: {what}"));
    ExitCode::from(1)
}

/// `ERRNO (message)` for an error: `EHOSTUNREACH (No route to host)`. A
/// timeout of `connect_timeout`, which is not an errno, is `ETIMEDOUT`.
fn describe(error: &io::Error) -> String {
    if let Some(code) = error.raw_os_error() {
        let text = error.to_string();
        let suffix = format!(" (os error {code})");
        let message = text.strip_suffix(&suffix).unwrap_or(&text);
        return format!("{} ({message})", errno_name(code));
    }
    if error.kind() == io::ErrorKind::TimedOut {
        return "ETIMEDOUT (Connection timed out)".into();
    }
    format!("{:?} ({error})", error.kind())
}

/// The symbolic name of a Linux errno (the generic numbering of x86_64 and
/// aarch64, errno(3)); `errno N` for one not listed.
fn errno_name(code: i32) -> String {
    let name = match code {
        1 => "EPERM",
        2 => "ENOENT",
        4 => "EINTR",
        5 => "EIO",
        9 => "EBADF",
        11 => "EAGAIN",
        12 => "ENOMEM",
        13 => "EACCES",
        14 => "EFAULT",
        16 => "EBUSY",
        22 => "EINVAL",
        23 => "ENFILE",
        24 => "EMFILE",
        32 => "EPIPE",
        38 => "ENOSYS",
        88 => "ENOTSOCK",
        91 => "EPROTOTYPE",
        92 => "ENOPROTOOPT",
        93 => "EPROTONOSUPPORT",
        94 => "ESOCKTNOSUPPORT",
        95 => "EOPNOTSUPP",
        97 => "EAFNOSUPPORT",
        98 => "EADDRINUSE",
        99 => "EADDRNOTAVAIL",
        100 => "ENETDOWN",
        101 => "ENETUNREACH",
        102 => "ENETRESET",
        103 => "ECONNABORTED",
        104 => "ECONNRESET",
        105 => "ENOBUFS",
        106 => "EISCONN",
        107 => "ENOTCONN",
        110 => "ETIMEDOUT",
        111 => "ECONNREFUSED",
        112 => "EHOSTDOWN",
        113 => "EHOSTUNREACH",
        114 => "EALREADY",
        115 => "EINPROGRESS",
        _ => return format!("errno {code}"),
    };
    name.to_owned()
}

/// `serve`: a listener on each address, a thread per connection that
/// counts the bytes up to EOF and answers `ok <n>`.
fn serve(addrs: &[SocketAddr]) -> ExitCode {
    let mut listeners = Vec::with_capacity(addrs.len());
    for addr in addrs {
        match TcpListener::bind(addr) {
            Ok(listener) => listeners.push(listener),
            Err(e) => {
                eprintln!("lazaret-netprobe: listen on {addr}: {}", describe(&e));
                return ExitCode::from(1);
            }
        }
    }
    let mut accepting = Vec::with_capacity(listeners.len());
    for listener in listeners {
        match std::thread::Builder::new().spawn(move || accept_loop(&listener)) {
            Ok(handle) => accepting.push(handle),
            Err(e) => {
                eprintln!("lazaret-netprobe: start a listener thread: {e}");
                return ExitCode::from(1);
            }
        }
    }
    say("ready");
    for handle in accepting {
        let _ = handle.join();
    }
    ExitCode::from(1)
}

fn accept_loop(listener: &TcpListener) {
    loop {
        match listener.accept() {
            // A connection whose thread cannot start is dropped (closed).
            Ok((stream, _)) => {
                drop(std::thread::Builder::new().spawn(move || count_and_answer(stream)))
            }
            // Out of descriptors or an aborted handshake: try again shortly.
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

fn count_and_answer(mut stream: TcpStream) {
    let mut buf = vec![0u8; CHUNK];
    let mut total: u64 = 0;
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => total += n as u64,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
    let _ = stream.write_all(format!("ok {total}\n").as_bytes());
}

/// `dns`: answers A queries for the listed names; NXDOMAIN for the rest.
fn dns(addr: SocketAddr, names: &[DnsEntry]) -> ExitCode {
    let socket = match UdpSocket::bind(addr) {
        Ok(socket) => socket,
        Err(e) => {
            eprintln!("lazaret-netprobe: bind {addr}: {}", describe(&e));
            return ExitCode::from(1);
        }
    };
    say("ready");
    let mut buf = [0u8; 1500];
    loop {
        let Ok((len, peer)) = socket.recv_from(&mut buf) else {
            continue;
        };
        if let Some(reply) = dns_reply(&buf[..len], names) {
            let _ = socket.send_to(&reply, peer);
        }
    }
}

/// The reply to one DNS query (RFC 1035 section 4), or `None` for anything
/// that is not a well-formed standard query with exactly one question.
fn dns_reply(query: &[u8], names: &[DnsEntry]) -> Option<Vec<u8>> {
    let header = query.get(..12)?;
    let flags = u16::from_be_bytes([header[2], header[3]]);
    let is_response = flags & 0x8000 != 0;
    let opcode = (flags >> 11) & 0xf;
    let qdcount = u16::from_be_bytes([header[4], header[5]]);
    if is_response || opcode != 0 || qdcount != 1 {
        return None;
    }
    let mut pos = 12;
    let mut labels: Vec<&[u8]> = Vec::new();
    let mut name_len = 0;
    loop {
        let len = usize::from(*query.get(pos)?);
        pos += 1;
        if len == 0 {
            break;
        }
        // Compression pointers (and the reserved label types) have no place
        // in a query's only question.
        if len > 63 {
            return None;
        }
        labels.push(query.get(pos..pos + len)?);
        pos += len;
        name_len += len + 1;
        if name_len > 255 {
            return None;
        }
    }
    let fixed = query.get(pos..pos + 4)?;
    let qtype = u16::from_be_bytes([fixed[0], fixed[1]]);
    let qclass = u16::from_be_bytes([fixed[2], fixed[3]]);
    let question = &query[12..pos + 4];

    let known = names
        .iter()
        .find(|entry| {
            entry.labels.len() == labels.len()
                && entry
                    .labels
                    .iter()
                    .zip(&labels)
                    .all(|(want, got)| want.eq_ignore_ascii_case(got))
        })
        .map(|entry| entry.addr);
    // A listed name asked for another type or class has no data (NOERROR,
    // no answer), as a real server says; an unlisted name does not exist.
    let answer = known.filter(|_| qtype == 1 && qclass == 1);
    let rcode = if known.is_some() { 0 } else { 3 };
    let recursion_desired = flags & 0x0100;
    let reply_flags: u16 = 0x8000 | 0x0400 | recursion_desired | rcode;

    let mut reply = Vec::with_capacity(12 + question.len() + 16);
    reply.extend_from_slice(&header[..2]);
    reply.extend_from_slice(&reply_flags.to_be_bytes());
    reply.extend_from_slice(&1u16.to_be_bytes());
    reply.extend_from_slice(&u16::from(answer.is_some()).to_be_bytes());
    reply.extend_from_slice(&[0, 0, 0, 0]);
    reply.extend_from_slice(question);
    if let Some(addr) = answer {
        // The name as a pointer to the question's, at offset 12.
        reply.extend_from_slice(&[0xc0, 0x0c]);
        reply.extend_from_slice(&1u16.to_be_bytes());
        reply.extend_from_slice(&1u16.to_be_bytes());
        reply.extend_from_slice(&DNS_TTL.to_be_bytes());
        reply.extend_from_slice(&4u16.to_be_bytes());
        reply.extend_from_slice(&addr.octets());
    }
    Some(reply)
}

/// Reads a reply up to EOF, at most `REPLY_CAP` bytes.
fn read_reply(stream: &TcpStream) -> io::Result<Vec<u8>> {
    let mut reply = Vec::new();
    stream.take(REPLY_CAP).read_to_end(&mut reply)?;
    Ok(reply)
}

/// `talk`: one short exchange; exit 0 iff the reply starts with `ok `.
fn talk(addr: SocketAddr, timeout: Duration, hold: Duration) -> ExitCode {
    let mut stream = match TcpStream::connect_timeout(&addr, timeout) {
        Ok(stream) => stream,
        Err(e) => return fail(&describe(&e)),
    };
    // With a hold, the connection stays open that long between the
    // greeting's two halves.
    let exchanged = stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .and_then(|()| stream.write_all(b"hel"))
        .map(|()| std::thread::sleep(hold))
        .and_then(|()| stream.write_all(b"lo\n"))
        .and_then(|()| stream.shutdown(Shutdown::Write));
    if let Err(e) = exchanged {
        return fail(&format!("write: {}", describe(&e)));
    }
    let reply = match read_reply(&stream) {
        Ok(reply) => reply,
        Err(e) => return fail(&format!("read: {}", describe(&e))),
    };
    if reply.is_empty() {
        return fail("empty reply");
    }
    let text = String::from_utf8_lossy(&reply);
    let mut out = io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
    drop(out);
    if reply.starts_with(b"ok ") {
        ExitCode::SUCCESS
    } else {
        if !reply.ends_with(b"\n") {
            say("");
        }
        fail("the reply does not start with \"ok \"")
    }
}

/// `connect`: COUNT sequential connect-then-close; the median and 90th
/// percentile of the connect times.
fn connect(addr: SocketAddr, count: usize) -> ExitCode {
    let mut times = Vec::with_capacity(count);
    for _ in 0..count {
        let start = Instant::now();
        match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
            Ok(stream) => {
                times.push(start.elapsed());
                drop(stream);
            }
            Err(e) => return fail(&describe(&e)),
        }
    }
    let (n, median) = (times.len(), median(&mut times));
    // Nearest rank: the smallest time at or above 90 % of the samples.
    let p90 = times[(n * 9).div_ceil(10) - 1];
    say(&format!(
        "connect count={n} median_us={} p90_us={}",
        median.as_micros(),
        p90.as_micros()
    ));
    ExitCode::SUCCESS
}

/// The median of `times` (not empty), which it sorts.
fn median(times: &mut [Duration]) -> Duration {
    times.sort_unstable();
    let n = times.len();
    if n % 2 == 1 {
        times[n / 2]
    } else {
        (times[n / 2 - 1] + times[n / 2]) / 2
    }
}

/// `lookup`: COUNT queries for the A records of NAME, one after another,
/// each timed from its send to its answer, from a socket carrying `mark`
/// when one is given (which takes CAP_NET_ADMIN).
fn lookup(addr: SocketAddr, name: &str, count: usize, mark: Option<u32>) -> ExitCode {
    let socket = match UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)) {
        Ok(socket) => socket,
        Err(e) => return fail(&describe(&e)),
    };
    if let Some(mark) = mark
        && let Err(e) = sys::set_mark(&socket, mark)
    {
        return fail(&describe(&e));
    }
    if let Err(e) = socket
        .connect(addr)
        .and_then(|()| socket.set_read_timeout(Some(CONNECT_TIMEOUT)))
    {
        return fail(&describe(&e));
    }
    let mut times = Vec::with_capacity(count);
    let mut answer = [0u8; 1500];
    for n in 0..count {
        let id = (n as u16).wrapping_mul(7919).wrapping_add(1);
        let mut query = id.to_be_bytes().to_vec();
        query.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
        for label in name.trim_end_matches('.').split('.') {
            query.push(label.len() as u8);
            query.extend_from_slice(label.as_bytes());
        }
        query.extend_from_slice(&[0, 0, 1, 0, 1]);
        let start = Instant::now();
        if let Err(e) = socket.send(&query) {
            return fail(&describe(&e));
        }
        loop {
            match socket.recv(&mut answer) {
                Ok(len) if len >= 2 && answer[..2] == id.to_be_bytes() => break,
                Ok(_) => {}
                Err(e) => return fail(&describe(&e)),
            }
        }
        times.push(start.elapsed());
    }
    let (n, median) = (times.len(), median(&mut times));
    say(&format!("lookup count={n} median_us={}", median.as_micros()));
    ExitCode::SUCCESS
}

/// `send`: MIB MiB of zeros in 256 KiB writes; the peer must count them
/// all. The time runs from before the connect to the reply.
fn send(addr: SocketAddr, mib: u64) -> ExitCode {
    let zeros = vec![0u8; CHUNK];
    let total = mib * MIB;
    let start = Instant::now();
    let mut stream = match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
        Ok(stream) => stream,
        Err(e) => return fail(&describe(&e)),
    };
    let mut written = stream
        .set_read_timeout(Some(STALL))
        .and_then(|()| stream.set_write_timeout(Some(STALL)));
    let mut left = total;
    while written.is_ok() && left > 0 {
        let n = usize::try_from(left).map_or(CHUNK, |left| left.min(CHUNK));
        written = stream.write_all(&zeros[..n]);
        left -= n as u64;
    }
    if let Err(e) = written.and_then(|()| stream.shutdown(Shutdown::Write)) {
        return fail(&format!("write: {}", describe(&e)));
    }
    let reply = match read_reply(&stream) {
        Ok(reply) => reply,
        Err(e) => return fail(&format!("read: {}", describe(&e))),
    };
    let seconds = start.elapsed().as_secs_f64();
    let text = String::from_utf8_lossy(&reply);
    let counted = text
        .strip_prefix("ok ")
        .and_then(|n| n.trim_end().parse::<u64>().ok());
    if counted != Some(total) {
        return fail(&format!(
            "the reply {:?} does not count the {total} bytes sent",
            text.trim_end()
        ));
    }
    let rate = total as f64 / MIB as f64 / seconds.max(f64::MIN_POSITIVE);
    say(&format!(
        "send bytes={total} seconds={seconds:.3} mib_per_s={rate:.1}"
    ));
    ExitCode::SUCCESS
}

/// `raw`: tries the raw socket kinds a sandbox must not have; exit 0 iff
/// every one was refused.
fn raw() -> ExitCode {
    let kinds = [
        ("inet/icmp", sys::AF_INET, sys::SOCK_RAW, sys::IPPROTO_ICMP),
        ("inet/raw", sys::AF_INET, sys::SOCK_RAW, sys::IPPROTO_RAW),
        (
            "packet/all",
            sys::AF_PACKET,
            sys::SOCK_RAW,
            i32::from(sys::ETH_P_ALL.to_be()),
        ),
    ];
    let mut all_refused = true;
    for (name, domain, ty, protocol) in kinds {
        match sys::socket(domain, ty, protocol) {
            Ok(fd) => {
                drop(fd);
                all_refused = false;
                say(&format!("raw {name}: OPENED"));
            }
            Err(e) => {
                let errno = e.raw_os_error().map_or_else(|| e.to_string(), errno_name);
                say(&format!("raw {name}: refused {errno}"));
            }
        }
    }
    if all_refused {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(name: &[&str], qtype: u16) -> Vec<u8> {
        let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        for label in name {
            q.push(label.len() as u8);
            q.extend_from_slice(label.as_bytes());
        }
        q.push(0);
        q.extend_from_slice(&qtype.to_be_bytes());
        q.extend_from_slice(&1u16.to_be_bytes());
        q
    }

    fn entries() -> Vec<DnsEntry> {
        vec![dns_entry("Allowed.test.=198.18.0.10").unwrap()]
    }

    #[test]
    fn answers_a_listed_name_in_any_case() {
        let reply = dns_reply(&query(&["ALLOWED", "test"], 1), &entries()).unwrap();
        assert_eq!(&reply[..4], &[0x12, 0x34, 0x85, 0x00]);
        assert_eq!(&reply[6..8], &[0, 1]);
        assert_eq!(&reply[reply.len() - 4..], &[198, 18, 0, 10]);
    }

    #[test]
    fn an_unlisted_name_is_nxdomain_and_another_type_has_no_data() {
        let reply = dns_reply(&query(&["other", "test"], 1), &entries()).unwrap();
        assert_eq!(reply[3] & 0xf, 3);
        assert_eq!(&reply[6..8], &[0, 0]);
        let reply = dns_reply(&query(&["allowed", "test"], 28), &entries()).unwrap();
        assert_eq!(reply[3] & 0xf, 0);
        assert_eq!(&reply[6..8], &[0, 0]);
    }

    #[test]
    fn malformed_queries_are_ignored() {
        let good = query(&["allowed", "test"], 1);
        for cut in 0..good.len() {
            assert!(dns_reply(&good[..cut], &entries()).is_none(), "cut {cut}");
        }
        let mut pointer = good.clone();
        pointer[12] = 0xc0;
        assert!(dns_reply(&pointer, &entries()).is_none());
        let mut response = good;
        response[2] |= 0x80;
        assert!(dns_reply(&response, &entries()).is_none());
    }

    #[test]
    fn usage_errors() {
        let args = |s: &str| s.split(' ').map(str::to_owned).collect::<Vec<_>>();
        assert!(parse(&args("talk 198.18.0.10:7000")).is_ok());
        assert!(parse(&args("talk 198.18.0.10:7000 --timeout-ms 0")).is_err());
        assert!(parse(&args("talk 198.18.0.10:7000 --hold-ms 10 --timeout-ms 9")).is_ok());
        assert!(parse(&args("talk 198.18.0.10:7000 --hold-ms")).is_err());
        assert!(parse(&args("talk localhost:7000")).is_err());
        assert!(parse(&args("connect 198.18.0.10:7000 0")).is_err());
        assert!(parse(&args("dns 198.18.0.10:53 a..b=1.2.3.4")).is_err());
        assert!(parse(&args("raw x")).is_err());
        assert!(parse(&args("fly")).is_err());
    }
}
