//! The network test tooling itself, before any test relies on it: a
//! [`TestNet`] with `lazaret-netprobe` servers and its DNS responder,
//! reached from the root namespace; the probe's failure lines for a refused
//! connection, an unreachable host or network and a timeout; its raw-socket
//! check as root and as an unprivileged user; and nothing left behind after
//! a drop, even one during a panic. Needs root, iproute2, busybox and
//! setpriv; CI provides them. Sends traffic only on the test veth and inside
//! the test namespace.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use lazaret_tests::domain::pid_exists;
use lazaret_tests::net::{ALLOWED, ALLOWED_NET_HOST, DENIED, TestNet, ip_program};
use lazaret_tests::netprobe;
use libtest_mimic::{Failed, Trial};

use crate::domain::{Result, gated, text};

pub fn trials() -> Vec<Trial> {
    gated(
        runnable(),
        [
            Trial::test("net::the_test_network_and_its_probe_work", tooling),
            Trial::test(
                "net::a_panicking_test_leaves_no_test_network",
                panicking_test,
            ),
        ],
    )
}

/// Whether this machine can run the network tooling tests; in CI it must.
fn runnable() -> bool {
    let root = rustix::process::getuid().is_root();
    let any = |paths: &[&str]| paths.iter().any(|p| Path::new(p).exists());
    let tools = any(&["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"])
        && any(&["/bin/busybox", "/usr/bin/busybox"])
        && any(&["/usr/bin/setpriv"]);
    if std::env::var_os("CI").is_some() {
        assert!(
            root && tools,
            "CI must run the network tests as root with iproute2, busybox and setpriv installed"
        );
    }
    root && tools
}

fn tooling() -> Result {
    TestNet::remove_stale()?;
    let net = TestNet::new()?;
    let allowed = format!("{ALLOWED}:7000");
    let net_host = format!("{ALLOWED_NET_HOST}:7000");
    let server = net.netprobe(&["serve", &allowed, &net_host])?;
    let dns = net.netprobe(&["dns", &format!("{ALLOWED}:53"), "allowed.test=198.18.0.10"])?;

    // From the root namespace, through the veth and its routes.
    for target in [&allowed, &net_host] {
        let out = probe(&["talk", target]);
        check(&out, Some(0), |o| o == "ok 6\n", format!("talk {target}"))?;
    }
    let out = probe(&["send", &allowed, "8"]);
    check(
        &out,
        Some(0),
        |o| o.starts_with("send bytes=8388608 seconds=") && o.contains(" mib_per_s="),
        "send 8 MiB",
    )?;
    let out = probe(&["connect", &allowed, "20"]);
    check(
        &out,
        Some(0),
        |o| o.starts_with("connect count=20 median_us=") && o.contains(" p90_us="),
        "connect 20",
    )?;

    // The failure lines: nothing listens on DENIED; inside the namespace,
    // an unreachable route, no route at all, and an on-link address that
    // never answers.
    let out = probe(&["talk", &format!("{DENIED}:7000")]);
    check(
        &out,
        Some(1),
        |o| o == "failed: ECONNREFUSED (Connection refused)\n",
        "talk to a closed port",
    )?;
    net.ip(["route", "add", "unreachable", "198.18.5.0/24"])?;
    net.ip(["route", "add", "198.18.7.0/24", "dev", net.test_link()])?;
    for (target, expected) in [
        (
            "198.18.5.1:7000",
            "failed: EHOSTUNREACH (No route to host)\n",
        ),
        (
            "198.18.6.1:7000",
            "failed: ENETUNREACH (Network is unreachable)\n",
        ),
        (
            "198.18.7.1:7000",
            "failed: ETIMEDOUT (Connection timed out)\n",
        ),
    ] {
        let out = run(net
            .command(netprobe())
            .args(["talk", target, "--timeout-ms", "300"]));
        check(
            &out,
            Some(1),
            |o| o == expected,
            format!("talk {target} in the namespace"),
        )?;
    }

    // Raw sockets: root in the root namespace opens them all; an
    // unprivileged user is refused every one.
    let out = probe(&["raw"]);
    check(
        &out,
        Some(1),
        |o| o == "raw inet/icmp: OPENED\nraw inet/raw: OPENED\nraw packet/all: OPENED\n",
        "raw as root",
    )?;
    let (_dir, copy) = readable_copy(&netprobe());
    let out = run(Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(&copy)
        .arg("raw"));
    check(
        &out,
        Some(0),
        |o| {
            o == "raw inet/icmp: refused EPERM\nraw inet/raw: refused EPERM\n\
                  raw packet/all: refused EPERM\n"
        },
        "raw as nobody",
    )?;

    // The DNS responder, asked by busybox's resolver.
    for name in ["allowed.test", "ALLOWED.Test."] {
        let out = run(Command::new("busybox").args(["nslookup", name, "198.18.0.10"]));
        check(
            &out,
            Some(0),
            |o| o.contains("Address: 198.18.0.10\n"),
            format!("nslookup {name}"),
        )?;
    }
    let out = run(Command::new("busybox").args(["nslookup", "other.test", "198.18.0.10"]));
    check(
        &out,
        Some(1),
        |o| o.contains("can't find other.test: NXDOMAIN"),
        "nslookup other.test",
    )?;

    // A server that cannot start says why.
    match net.netprobe(&["serve", &format!("{ALLOWED}:7000")]) {
        Err(e)
            if e.to_string()
                .contains("exited (exit status: 1) before printing `ready`")
                && e.to_string().contains("EADDRINUSE") => {}
        Err(e) => return Err(format!("a second server on the port: unexpected error: {e}").into()),
        Ok(_) => return Err("a second server on a port in use started".into()),
    }

    let pids = [server.pid(), dns.pid()];
    if !server.stderr().is_empty() || !dns.stderr().is_empty() {
        return Err(format!(
            "the servers complained: {:?} {:?}",
            server.stderr(),
            dns.stderr()
        )
        .into());
    }
    let names = Names::of(&net);
    drop(server);
    drop(dns);
    drop(net);
    names.assert_gone()?;
    if let Some(pid) = pids.iter().find(|&&p| pid_exists(p.into())) {
        return Err(format!("server {pid} still runs after the drop").into());
    }
    Ok(())
}

/// A test that panics with a server running still removes its network and
/// its server.
fn panicking_test() -> Result {
    let mut seen = None;
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let net = TestNet::new().expect("create a test network");
        let server = net
            .netprobe(&["serve", &format!("{ALLOWED}:7001")])
            .expect("start a server");
        seen = Some((Names::of(&net), server.pid()));
        // Unwinds as a failed assertion does, without the panic hook's
        // message and backtrace.
        std::panic::resume_unwind(Box::new("a deliberate panic"));
    }));
    if outcome.is_ok() {
        return Err("the closure did not panic".into());
    }
    let (names, pid) = seen.ok_or("the closure panicked before creating the network")?;
    names.assert_gone()?;
    if pid_exists(pid.into()) {
        return Err(format!("server {pid} still runs after the panic").into());
    }
    Ok(())
}

/// The names a test network used, to check that they are gone.
struct Names {
    namespace: String,
    links: [String; 2],
}

impl Names {
    fn of(net: &TestNet) -> Self {
        Self {
            namespace: net.namespace().to_owned(),
            links: [net.root_link().to_owned(), net.test_link().to_owned()],
        }
    }

    fn assert_gone(&self) -> Result {
        let namespaces = stdout(&run(Command::new(ip_program()).args(["netns", "list"])));
        if namespaces
            .lines()
            .any(|l| l.split_whitespace().next() == Some(self.namespace.as_str()))
        {
            return Err(format!("{} is still listed:\n{namespaces}", self.namespace).into());
        }
        let links = stdout(&run(Command::new(ip_program()).args(["-o", "link", "show"])));
        for link in &self.links {
            if links.contains(&format!(" {link}:")) || links.contains(&format!(" {link}@")) {
                return Err(format!("link {link} is still there:\n{links}").into());
            }
        }
        let routes = stdout(&run(Command::new(ip_program()).args(["route", "show"])));
        if let Some(route) = routes.lines().find(|r| r.contains(self.links[0].as_str())) {
            return Err(format!("a route through the test veth is still there: {route}").into());
        }
        Ok(())
    }
}

/// `lazaret-netprobe ARGS` in the root namespace.
fn probe(args: &[&str]) -> Output {
    run(Command::new(netprobe()).args(args))
}

fn run(command: &mut Command) -> Output {
    command.output().expect("start the command")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Fails unless the exit code is `code` and stdout passes `ok`.
fn check(
    output: &Output,
    code: Option<i32>,
    ok: impl Fn(&str) -> bool,
    what: impl std::fmt::Display,
) -> std::result::Result<(), Failed> {
    if output.status.code() == code && ok(&stdout(output)) {
        Ok(())
    } else {
        Err(format!("{what}: {}", text(output)).into())
    }
}

/// A copy of the probe that any user may run: the build directory may not
/// be reachable by nobody.
fn readable_copy(probe: &Path) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("lazaret-e2e-netprobe-")
        .tempdir()
        .expect("scratch directory");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod the scratch directory");
    let copy = dir.path().join("lazaret-netprobe");
    std::fs::copy(probe, &copy).expect("copy the probe");
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755))
        .expect("chmod the probe");
    (dir, copy)
}
