//! Network isolation end to end, as the unprivileged test user with real
//! runsc and slirp4netns: test hosts in a namespace of the test's own on
//! 198.18.0.0/15 behind a veth; from inside the sandbox an allowed host
//! answers, and a denied host, an unlisted host, host loopback (10.0.2.2)
//! and an IPv6 address do not, while a host under a deny prefix that a
//! longer allow prefix covers does; DNS resolves through the resolver the
//! policy keeps; under an allow of everything, the host's neighbours (a
//! subnet on one of its links) stay denied unless named; root in the
//! sandbox cannot add a route or address or open a raw socket; a connectivity helper that cannot start stops `up` with
//! nothing left; `down` leaves no slirp4netns and no namespace. Needs root,
//! runsc, slirp4netns and iproute2; CI provides them.

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use lazaret_tests::domain::{UserHost, busybox_image, lazaret_processes};
use lazaret_tests::net::{
    ALLOWED, ALLOWED_NET, ALLOWED_NET_HOST, DENIED, ROOT_SIDE, TestNet, UNLISTED,
};
use lazaret_tests::netprobe;
use libtest_mimic::Trial;
use serde_json::Value;

use crate::domain::{Result, assert_nothing_left, down, gated, text, wait_until};

pub fn trials() -> Vec<Trial> {
    let runnable = crate::domain::runnable() && Path::new("/usr/bin/slirp4netns").exists();
    if std::env::var_os("CI").is_some() {
        assert!(
            runnable,
            "CI must run the network tests with slirp4netns installed"
        );
    }
    gated(
        runnable,
        [
            Trial::test("network::the_policy_holds_inside_the_sandbox", policy_holds),
            Trial::test(
                "network::a_helper_that_cannot_start_stops_up",
                helper_cannot_start,
            ),
            Trial::test("network::a_dead_helper_ends_the_generation", dead_helper),
            Trial::test(
                "network::special_ranges_and_host_addresses_stay_denied_under_allow_all",
                platform_deny,
            ),
            Trial::test(
                "network::the_hosts_neighbours_stay_denied_unless_named",
                neighbours,
            ),
            Trial::test("network::names_are_the_way_out", names_are_the_way_out),
            Trial::test("network::host_dns_forwards_as_v1", host_dns_forwards_as_v1),
        ],
    )
}

const PORT: u16 = 7000;
const LOOPBACK_PORT: u16 = 7001;

/// Profile `p` allowing one host inside a denied /24 and one whole /24.
fn config() -> String {
    format!(
        "schema = \"lazaret-trusted-host-config-v1\"\n\
         [profiles.p]\nimage = \"{}\"\npersistent_dirs = []\n\
         allow_egress = [\"{ALLOWED}/32\", \"{ALLOWED_NET}\"]\n\
         deny_egress = [\"198.18.0.0/24\"]\n",
        busybox_image()
    )
}

/// `unshare` giving `lazaret` a private mount namespace prepared by
/// `script` (run as root with `$0` = `arg`) before it executes the rest.
pub(crate) fn private_mounts<'a>(script: &'a str, arg: &'a OsStr) -> Vec<&'a OsStr> {
    [
        "/usr/bin/unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        "/bin/sh",
        "-c",
    ]
    .into_iter()
    .map(OsStr::new)
    .chain([OsStr::new(script), arg])
    .collect()
}

/// A process of the test's own, killed by its handle when dropped.
struct Owned(Child);

impl Drop for Owned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `/workspace/netprobe ARGS` in the sandbox through `lazaret attach`.
fn probe(host: &UserHost, args: &[&str]) -> Output {
    let mut argv = vec!["attach", "p", "--", "/workspace/netprobe"];
    argv.extend_from_slice(args);
    host.lazaret(&host.workspace, &argv)
}

/// Runs a shell command in the sandbox through `lazaret attach`.
fn shell(host: &UserHost, script: &str) -> Output {
    host.lazaret(
        &host.workspace,
        &["attach", "p", "--", "/bin/sh", "-c", script],
    )
}

fn answers(host: &UserHost, target: &str) -> Result {
    let out = probe(host, &["talk", target]);
    if out.status.success() && out.stdout.starts_with(b"ok 6") {
        Ok(())
    } else {
        Err(format!("{target} should answer: {}", text(&out)).into())
    }
}

fn unreachable(host: &UserHost, target: &str, errors: &[&str]) -> Result {
    let out = probe(host, &["talk", target, "--timeout-ms", "2000"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    if out.status.code() == Some(1)
        && errors
            .iter()
            .any(|e| stdout.starts_with(&format!("failed: {e}")))
    {
        Ok(())
    } else {
        Err(format!(
            "{target} should fail with one of {errors:?}: {}",
            text(&out)
        )
        .into())
    }
}

/// Whether any process still has the network namespace with this inode.
fn namespace_alive(inode: u64) -> bool {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::metadata(e.path().join("ns/net")).ok())
        .any(|m| std::os::unix::fs::MetadataExt::ino(&m) == inode)
}

/// The serial lock and a test host configured with [`config`].
fn policy_host() -> (std::sync::MutexGuard<'static, ()>, UserHost) {
    crate::domain::host_with_config(&config())
}

fn policy_holds() -> Result {
    let (_serial, host) = policy_host();
    TestNet::remove_stale()?;
    let net = TestNet::new()?;
    let target = |address| format!("{address}:{PORT}");
    let (allowed, denied, net_host, unlisted) = (
        target(ALLOWED),
        target(DENIED),
        target(ALLOWED_NET_HOST),
        target(UNLISTED),
    );
    let _servers = net.netprobe(&["serve", &allowed, &denied, &net_host, &unlisted])?;
    let _dns = net.netprobe(&["dns", &format!("{ALLOWED}:53"), "allowed.test=198.18.0.10"])?;
    // A server on the host's loopback, which the sandbox must not reach.
    let _loopback = Owned(
        Command::new(netprobe())
            .args(["serve", &format!("127.0.0.1:{LOOPBACK_PORT}")])
            .stdout(Stdio::null())
            .spawn()?,
    );

    up_under_test_dns(&host)?;
    let ws = host.workspace.clone();
    let status: Value = host.status(&ws, "p").ok_or("no status after up")?;
    let network = &status["network"];
    assert_eq!(network["state"], "attested", "{network}");
    assert_eq!(network["ipv6"], "disabled");
    assert!(
        network["dns"][0]["outcome"]
            .as_str()
            .is_some_and(|o| o.starts_with("answered")),
        "the readiness DNS probe went through slirp4netns to the test resolver: {network}"
    );
    let human = host.lazaret(&ws, &["status", "p"]);
    let human = String::from_utf8_lossy(&human.stdout);
    assert!(human.contains("network          attested"), "{human}");
    assert!(human.contains("slirp4netns pid"), "{human}");

    // The policy, by longest prefix.
    answers(&host, &allowed)?; // denied /24, but its own /32 is allowed
    answers(&host, &net_host)?; // an allowed /24
    unreachable(&host, &denied, &["EHOSTUNREACH"])?; // under the denied /24
    unreachable(&host, &unlisted, &["ENETUNREACH"])?; // no route at all
    unreachable(
        &host,
        &format!("10.0.2.2:{LOOPBACK_PORT}"),
        &["EHOSTUNREACH"],
    )?;
    unreachable(
        &host,
        &format!("[fd00::1]:{PORT}"),
        &[
            "ENETUNREACH",
            "EADDRNOTAVAIL",
            "EAFNOSUPPORT",
            "EHOSTUNREACH",
        ],
    )?;
    // DNS through the sandbox's resolv.conf, slirp4netns and the test's
    // resolver.
    let out = shell(&host, "cat /etc/resolv.conf; nslookup allowed.test");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("nameserver 10.0.2.3") && stdout.contains("198.18.0.10"),
        "{}",
        text(&out)
    );

    // Root in the sandbox cannot change the policy.
    for script in [
        "ip route add default via 10.0.2.2 dev tap0",
        "ip route add 198.18.0.20/32 via 10.0.2.2 dev tap0 onlink",
        "ip addr add 198.18.0.99/32 dev tap0",
        "echo 1 > /proc/sys/net/ipv4/ip_forward",
    ] {
        let out = shell(&host, &format!("id -u; {script}"));
        assert!(
            !out.status.success() && out.stdout.starts_with(b"0\n"),
            "root in the sandbox ran `{script}`: {}",
            text(&out)
        );
    }
    let out = probe(&host, &["raw"]);
    assert!(
        out.status.success(),
        "a raw socket opened in the sandbox: {}",
        text(&out)
    );
    unreachable(&host, &denied, &["EHOSTUNREACH"])?;
    unreachable(&host, &unlisted, &["ENETUNREACH"])?;

    // `status` reads the namespace back: the policy holds.
    let checked = host.status(&ws, "p").ok_or("not running")?;
    assert_eq!(
        checked["network"]["recheck"]["state"], "holds",
        "{}",
        checked["network"]["recheck"]
    );

    // The routes broken on purpose from outside the sandbox: routes to the
    // denied and the unlisted host now lead out, and the packet filter
    // still drops what they carry: the connection fails (EPERM, or a
    // timeout as gVisor retries the dropped SYN), where without the filter
    // the test's server there would answer.
    let holder = status["namespace_holder"]["pid"]
        .as_u64()
        .ok_or("no holder pid")?
        .to_string();
    for address in [DENIED, UNLISTED] {
        let added = Command::new("nsenter")
            .args(["-t", &holder, "-n", "ip", "route", "replace"])
            .arg(format!("{address}/32"))
            .args(["via", "10.0.2.2", "dev", "tap0", "onlink"])
            .output()?;
        assert!(added.status.success(), "{}", text(&added));
    }
    unreachable(&host, &denied, &["EPERM", "ETIMEDOUT"])?;
    unreachable(&host, &unlisted, &["EPERM", "ETIMEDOUT"])?;
    answers(&host, &allowed)?;
    // And `status` says the routes no longer show the policy.
    let checked = host.status(&ws, "p").ok_or("not running")?;
    let recheck = &checked["network"]["recheck"];
    assert_eq!(recheck["state"], "differs", "{recheck}");
    assert!(
        recheck["drift"].as_array().is_some_and(|d| d
            .iter()
            .any(|d| d.as_str().is_some_and(|d| d.contains("routes")))),
        "{recheck}"
    );
    assert_eq!(checked["state"], "degraded", "{checked}");

    let inode = network["enforcement_namespace"]["inode"]
        .as_u64()
        .ok_or("no namespace inode")?;
    assert!(namespace_alive(inode));
    down(&host, &ws)?;
    assert_nothing_left(&host);
    assert!(
        !namespace_alive(inode),
        "the enforcement namespace outlived down"
    );
    Ok(())
}

/// With `allow_egress = ["0.0.0.0/0"]`, what agents are given, the cloud
/// metadata address, carrier-grade NAT (Tailscale), multicast, broadcast
/// and the host's own addresses are still unreachable: the platform denies
/// them, and `config check` and `status` list them apart from the
/// profile's denials.
fn platform_deny() -> Result {
    let (_serial, host) = crate::domain::host_with_config(&format!(
        "schema = \"lazaret-trusted-host-config-v1\"\n\
         [profiles.p]\nimage = \"{}\"\npersistent_dirs = []\n\
         allow_egress = [\"0.0.0.0/0\"]\n",
        busybox_image()
    ));
    let ws = host.workspace.clone();
    let check = host.lazaret(&ws, &["config", "check", "p", "--json"]);
    assert!(check.status.success(), "{}", text(&check));
    let check: Value = serde_json::from_slice(&check.stdout)?;
    let listed = |value: &Value| -> Vec<String> {
        value
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect()
    };
    let platform = listed(&check["platform_deny"]);
    for range in [
        "169.254.0.0/16",
        "100.64.0.0/10",
        "224.0.0.0/4",
        "255.255.255.255/32",
    ] {
        assert!(
            platform.iter().any(|p| p == range),
            "{range} in {platform:?}"
        );
    }
    assert_eq!(
        listed(&check["effective_deny"]),
        ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"],
        "the configuration's own denials are unchanged"
    );
    let host_address = platform
        .iter()
        .find(|p| p.ends_with("/32") && *p != "255.255.255.255/32")
        .and_then(|p| p.strip_suffix("/32"))
        .ok_or(format!("no host address among {platform:?}"))?
        .to_owned();

    let probe_copy = ws.join("netprobe");
    std::fs::copy(netprobe(), &probe_copy)?;
    std::fs::set_permissions(&probe_copy, std::fs::Permissions::from_mode(0o755))?;
    let out = host.lazaret(&ws, &["up", "p"]);
    if !out.status.success() {
        return Err(format!("up failed: {}", text(&out)).into());
    }
    let status: Value = host.status(&ws, "p").ok_or("no status after up")?;
    assert_eq!(listed(&status["network"]["platform_deny"]), platform);
    for target in [
        "169.254.169.254:80",
        "100.100.100.200:80",
        "224.0.0.251:5353",
        "255.255.255.255:9",
        &format!("{host_address}:{PORT}"),
    ] {
        unreachable(&host, target, &["EHOSTUNREACH"])?;
    }

    // slirp4netns, which parses every packet of the sandbox, runs in a
    // sandbox of its own: a root of /etc and /run only, read-only, and no
    // capability but binding low ports.
    let helper = status["network"]["connectivity_helper"]["pid"]
        .as_u64()
        .ok_or("no connectivity helper pid")?;
    let root = Path::new("/proc").join(helper.to_string()).join("root");
    assert!(root.join("etc/resolv.conf").exists(), "it still reads /etc");
    let mut seen: Vec<String> = std::fs::read_dir(&root)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<std::io::Result<_>>()?;
    seen.sort();
    assert_eq!(seen, ["etc", "run"], "slirp4netns sees only these");
    let caps = std::fs::read_to_string(Path::new("/proc").join(helper.to_string()).join("status"))?;
    assert!(
        caps.lines().any(|l| l == "CapEff:\t0000000000000400"),
        "only CAP_NET_BIND_SERVICE: {caps}"
    );
    down(&host, &ws)?;
    assert_nothing_left(&host);
    Ok(())
}

/// The host's default gateways, from `ip -4 route show default` in the
/// root namespace (read only).
fn default_gateways() -> std::result::Result<Vec<String>, String> {
    let out = Command::new(lazaret_tests::net::ip_program())
        .args(["-4", "route", "show", "table", "all", "default"])
        .output()
        .map_err(|e| format!("ip route: {e}"))?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            words.find(|w| *w == "via")?;
            words.next().map(|g| format!("{g}/32"))
        })
        .collect())
}

/// Under `allow_egress = ["0.0.0.0/0"]`, the host's neighbours are denied:
/// the test network's veth puts 198.18.0.0/24 on a link of the host, so
/// its test host there (198.18.0.10) is unreachable from the sandbox,
/// while a host behind it, reached through a gateway (198.18.3.10), still
/// answers; the host's default gateway is listed too. An allow that names
/// the subnet reaches the neighbour again, but not the host's own address
/// on that link.
fn neighbours() -> Result {
    let profile = |allow: &str| {
        format!(
            "schema = \"lazaret-trusted-host-config-v1\"\n\
             [profiles.p]\nimage = \"{}\"\npersistent_dirs = []\n\
             allow_egress = [{allow}]\n",
            busybox_image()
        )
    };
    let (_serial, host) = crate::domain::host_with_config(&profile("\"0.0.0.0/0\""));
    TestNet::remove_stale()?;
    let net = TestNet::new()?;
    let target = |address| format!("{address}:{PORT}");
    let (neighbour, behind) = (target(ALLOWED), target(UNLISTED));
    let _servers = net.netprobe(&["serve", &neighbour, &behind])?;
    let ws = host.workspace.clone();
    let probe_copy = ws.join("netprobe");
    std::fs::copy(netprobe(), &probe_copy)?;
    std::fs::set_permissions(&probe_copy, std::fs::Permissions::from_mode(0o755))?;

    let check = host.lazaret(&ws, &["config", "check", "p", "--json"]);
    assert!(check.status.success(), "{}", text(&check));
    let check: Value = serde_json::from_slice(&check.stdout)?;
    let platform: Vec<String> = check["platform_deny"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    let mut expected = vec!["198.18.0.0/24".to_owned(), format!("{ROOT_SIDE}/32")];
    expected.extend(default_gateways()?);
    for prefix in &expected {
        assert!(
            platform.contains(prefix),
            "{prefix} among the platform's denials {platform:?}"
        );
    }

    let out = host.lazaret(&ws, &["up", "p"]);
    if !out.status.success() {
        return Err(format!("up failed: {}", text(&out)).into());
    }
    unreachable(&host, &neighbour, &["EHOSTUNREACH"])?;
    answers(&host, &behind)?;
    down(&host, &ws)?;

    host.write_config(&profile("\"0.0.0.0/0\", \"198.18.0.0/24\""));
    let check = host.lazaret(&ws, &["config", "check", "p", "--json"]);
    let check: Value = serde_json::from_slice(&check.stdout)?;
    assert!(
        !check["platform_deny"]
            .as_array()
            .is_some_and(|p| p.iter().any(|p| p == "198.18.0.0/24")),
        "a subnet the profile names is not denied: {check}"
    );
    let out = host.lazaret(&ws, &["up", "p"]);
    if !out.status.success() {
        return Err(format!("up failed: {}", text(&out)).into());
    }
    answers(&host, &neighbour)?;
    unreachable(&host, &target(ROOT_SIDE), &["EHOSTUNREACH"])?;
    down(&host, &ws)?;
    assert_nothing_left(&host);
    Ok(())
}

fn helper_cannot_start() -> Result {
    let (_serial, host) = policy_host();
    // Without a tun device slirp4netns cannot attach.
    let wrapper = private_mounts(
        "mount -t tmpfs none /dev/net && exec \"$@\"",
        OsStr::new("sh"),
    );
    let ws = host.workspace.clone();
    let out = host.lazaret_under(&wrapper, &ws, &["up", "p"], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.success()
        || !stderr.contains("connectivity helper could not attach")
        || !stderr.contains("/dev/net/tun")
    {
        return Err(format!("up should fail naming slirp4netns's error: {}", text(&out)).into());
    }
    assert_nothing_left(&host);
    assert!(
        host.status(&ws, "p").is_none(),
        "a Domain runs after a failed up"
    );
    Ok(())
}

fn dead_helper() -> Result {
    let (_serial, host) = policy_host();
    let ws = host.workspace.clone();
    let out = host.lazaret(&ws, &["up", "p"]);
    if !out.status.success() {
        return Err(format!("up failed: {}", text(&out)).into());
    }
    let status = host.status(&ws, "p").ok_or("no status after up")?;
    let network = &status["network"];
    let pid = network["connectivity_helper"]["pid"]
        .as_u64()
        .ok_or("no helper pid")?;
    let inode = network["enforcement_namespace"]["inode"]
        .as_u64()
        .ok_or("no namespace inode")?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))?;
    assert!(
        cmdline.starts_with(b"/usr/bin/slirp4netns\0"),
        "pid {pid} is not the helper"
    );
    Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while host.status(&ws, "p").is_some() {
        if std::time::Instant::now() > deadline {
            return Err("the generation outlived its connectivity helper".into());
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // The coordinator stops answering when the generation ends, and exits
    // once it has released it.
    wait_until(
        std::time::Duration::from_secs(10),
        "the generation's processes to exit",
        || lazaret_processes(host.uid()).is_empty().then_some(()),
    )?;
    assert_nothing_left(&host);
    assert!(
        !namespace_alive(inode),
        "the enforcement namespace outlived the generation"
    );
    Ok(())
}

/// The test zone: each name and the address the test's DNS server gives
/// it.
const ZONE: [(&str, &str); 4] = [
    ("allowed.test.invalid", "198.18.2.10"),
    ("wild.test.invalid", "198.18.3.10"),
    ("denied.test.invalid", "198.18.3.20"),
    ("rebind.test.invalid", "10.1.2.3"),
];

/// A v2 profile `p` that names hosts and no prefix.
fn names_config(extra: &str) -> String {
    format!(
        "schema = \"lazaret-trusted-host-config-v2\"\n\
         [profiles.p]\nimage = \"{}\"\npersistent_dirs = []\n\
         allow_hosts = [\"allowed.test.invalid\", \"*.wild.test.invalid\", \"rebind.test.invalid\"]\n\
         {extra}",
        busybox_image()
    )
}

/// The test's DNS server: Debian's dnsmasq in the test namespace at
/// `ALLOWED:53`, authoritative for [`ZONE`] with a TTL of 5 s, logging every
/// query it receives to `log`.
fn dns_server<'n>(
    net: &'n TestNet,
    log: &Path,
) -> std::result::Result<lazaret_tests::net::Server<'n>, Box<dyn std::error::Error>> {
    dns_server_for(net, log, &ZONE)
}

/// The test's DNS server, authoritative for `zone` (name, address).
pub(crate) fn dns_server_for<'n>(
    net: &'n TestNet,
    log: &Path,
    zone: &[(&str, &str)],
) -> std::result::Result<lazaret_tests::net::Server<'n>, Box<dyn std::error::Error>> {
    let mut args = vec![
        "dnsmasq".to_owned(),
        "--keep-in-foreground".into(),
        "--conf-file=/dev/null".into(),
        "--no-resolv".into(),
        "--no-hosts".into(),
        "--bind-interfaces".into(),
        format!("--listen-address={ALLOWED}"),
        "--port=53".into(),
        "--local-ttl=5".into(),
        "--user=root".into(),
        "--pid-file=".into(),
        "--log-queries".into(),
        format!("--log-facility={}", log.display()),
    ];
    args.extend(
        zone.iter()
            .map(|(name, address)| format!("--address=/{name}/{address}")),
    );
    // dnsmasq says nothing when it serves: the server is announced, then
    // dnsmasq replaces the shell; `up` comes seconds later.
    let script = format!("echo ready; exec {}", args.join(" "));
    Ok(net.spawn(["/bin/sh", "-c", &script])?)
}

/// How many queries for names under `zone` the test's DNS server logged.
fn queries_for(log: &Path, zone: &str) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("query[") && l.contains(zone))
        .count()
}

/// `nslookup NAME` inside the sandbox; the addresses it printed for it.
fn lookup(host: &UserHost, name: &str) -> (Output, Vec<String>) {
    let out = shell(host, &format!("nslookup {name}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    // busybox prints the server first, then `Name:` and `Address:` lines.
    let answer = stdout.split("Name:").nth(1).unwrap_or("");
    let addresses = answer
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Address:"))
        .map(|a| a.trim().split(' ').next().unwrap_or("").to_owned())
        .collect();
    (out, addresses)
}

/// Brings `p` up under the test's DNS server at `ALLOWED:53`, with the
/// network probe in the workspace. slirp4netns forwards DNS to the
/// resolvers of its own /etc/resolv.conf: in a private mount namespace that
/// file names the test's server, so no query leaves the machine.
fn up_under_test_dns(host: &UserHost) -> Result {
    up_under_test_dns_with(host, &[])
}

/// [`up_under_test_dns`] with `env` in `lazaret up`'s environment.
pub(crate) fn up_under_test_dns_with(host: &UserHost, env: &[(&str, &str)]) -> Result {
    let probe_copy = host.workspace.join("netprobe");
    std::fs::copy(netprobe(), &probe_copy)?;
    std::fs::set_permissions(&probe_copy, std::fs::Permissions::from_mode(0o755))?;
    let resolv = host.base().join("resolv.conf");
    std::fs::write(&resolv, format!("nameserver {ALLOWED}\n"))?;
    std::fs::set_permissions(&resolv, std::fs::Permissions::from_mode(0o644))?;
    let wrapper = private_mounts(
        "mount --bind \"$0\" /etc/resolv.conf && exec \"$@\"",
        resolv.as_os_str(),
    );
    let ws = host.workspace.clone();
    let out = host.lazaret_under(&wrapper, &ws, &["up", "p"], env);
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("up failed: {}", text(&out)).into())
    }
}

/// Names are the way out, and DNS is not: only allowed names resolve, each
/// reachable once looked up and only until its admission expires; a name
/// the policy does not allow never reaches a DNS server; no resolver but
/// Lazaret's answers the sandbox; an allowed name pointing into a denied
/// range gets no address; `status` shows the names and what they admitted.
/// Then Lazaret's resolver is killed: lookups fail closed, `status` says
/// so, `down` cleans up and `up` works again.
fn names_are_the_way_out() -> Result {
    let (_serial, host) = crate::domain::host_with_config(&names_config(""));
    TestNet::remove_stale()?;
    let net = TestNet::new()?;
    // A third host, off the host's links, for the name the policy denies.
    net.command("ip")
        .args(["addr", "add", "198.18.3.20/32", "dev", net.test_link()])
        .status()?;
    let _servers = net.netprobe(&[
        "serve",
        &format!("{ALLOWED_NET_HOST}:{PORT}"),
        &format!("{UNLISTED}:{PORT}"),
        &format!("198.18.3.20:{PORT}"),
    ])?;
    let log = host.base().join("dnsmasq.log");
    let _dns = dns_server(&net, &log)?;
    up_under_test_dns(&host)?;
    let ws = host.workspace.clone();
    let (allowed, wild, denied) = (
        format!("{ALLOWED_NET_HOST}:{PORT}"),
        format!("{UNLISTED}:{PORT}"),
        format!("198.18.3.20:{PORT}"),
    );

    // Before any lookup, no address is reachable: names are learnt.
    // (The readiness probe looked up allowed.test.invalid already.)
    unreachable(&host, &wild, &["EPERM", "ETIMEDOUT"])?;
    let out = shell(&host, "cat /etc/resolv.conf");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("nameserver 127.0.0.53"),
        "{}",
        text(&out)
    );

    // Allowed names resolve, and their addresses answer.
    let (out, addresses) = lookup(&host, "allowed.test.invalid");
    assert_eq!(addresses, ["198.18.2.10"], "{}", text(&out));
    answers(&host, &allowed)?;
    let (out, addresses) = lookup(&host, "a.b.wild.test.invalid");
    assert_eq!(addresses, ["198.18.3.10"], "{}", text(&out));
    answers(&host, &wild)?;
    // The wildcard's own suffix is not allowed.
    let (_, addresses) = lookup(&host, "wild.test.invalid");
    assert!(addresses.is_empty(), "{addresses:?}");

    // A denied name does not resolve, and its address stays unreachable.
    let (_, addresses) = lookup(&host, "denied.test.invalid");
    assert!(addresses.is_empty(), "{addresses:?}");
    unreachable(&host, &denied, &["EPERM", "ETIMEDOUT"])?;
    // 100 lookups under a disallowed zone never reach a DNS server.
    let out = shell(
        &host,
        "i=0; while [ $i -lt 100 ]; do nslookup x$i-$$.denied.test.invalid >/dev/null 2>&1; \
         i=$((i+1)); done; echo done",
    );
    assert!(out.stdout.starts_with(b"done"), "{}", text(&out));
    assert_eq!(
        queries_for(&log, "denied.test.invalid"),
        0,
        "a disallowed name reached the DNS server"
    );
    assert!(
        queries_for(&log, "allowed.test.invalid") > 0,
        "the DNS server logs queries"
    );
    // No resolver but Lazaret's answers: neither the test's DNS server nor
    // slirp4netns's forwarder.
    for server in [ALLOWED.to_string(), "10.0.2.3".into()] {
        let out = shell(
            &host,
            &format!("timeout 8 nslookup allowed.test.invalid {server}"),
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            !stdout.contains("198.18.2.10"),
            "{server} answered the sandbox: {}",
            text(&out)
        );
    }
    // An allowed name that points into a denied range gets no address.
    let (out, addresses) = lookup(&host, "rebind.test.invalid");
    assert!(addresses.is_empty(), "{}", text(&out));

    // `status` shows the names, the resolver and what it admitted.
    let status = host.status(&ws, "p").ok_or("no status")?;
    let names = &status["network"]["names"];
    assert_eq!(names["dns"], "lazaret", "{names}");
    assert_eq!(names["resolver"]["running"], true, "{names}");
    let admitted: Vec<(&str, &str)> = names["admitted"]
        .as_array()
        .ok_or("no admitted list")?
        .iter()
        .filter_map(|a| Some((a["name"].as_str()?, a["address"].as_str()?)))
        .collect();
    assert_eq!(
        admitted,
        [
            ("a.b.wild.test.invalid", "198.18.3.10"),
            ("allowed.test.invalid", "198.18.2.10")
        ],
        "{names}"
    );
    assert_eq!(
        status["network"]["recheck"]["state"], "holds",
        "{}",
        status["network"]
    );
    let human = host.lazaret(&ws, &["status", "p"]);
    let human = String::from_utf8_lossy(&human.stdout);
    assert!(
        human.contains("*.wild.test.invalid, allowed.test.invalid, rebind.test.invalid")
            && human.contains("other names refused"),
        "{human}"
    );

    // The TTL (5 s) is clamped to 30 s: after it, a new connection fails
    // until the name is looked up again, and one opened before goes on.
    let held = std::thread::scope(|scope| {
        let held = scope.spawn(|| probe(&host, &["talk", &allowed, "--hold-ms", "34000"]));
        std::thread::sleep(std::time::Duration::from_secs(32));
        let fresh = unreachable(&host, &allowed, &["EPERM", "ETIMEDOUT"]);
        fresh.map(|()| held.join().expect("the held connection's thread"))
    })?;
    assert!(
        held.status.success() && held.stdout.starts_with(b"ok 6"),
        "a connection opened while its name was admitted broke at expiry: {}",
        text(&held)
    );
    let (_, addresses) = lookup(&host, "allowed.test.invalid");
    assert_eq!(addresses, ["198.18.2.10"]);
    answers(&host, &allowed)?;

    // Lazaret's resolver killed: lookups fail closed, status says so.
    let pid = names["resolver"]["pid"].as_u64().ok_or("no resolver pid")?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))?;
    assert!(
        cmdline.ends_with(b"lazaret-resolver\0"),
        "pid {pid} is not the resolver"
    );
    Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()?;
    wait_until(
        std::time::Duration::from_secs(10),
        "status to say the resolver is gone",
        || {
            let status = host.status(&ws, "p")?;
            (status["network"]["names"]["resolver"]["running"] == false).then_some(status)
        },
    )
    .and_then(|status| {
        if status["state"] == "degraded" {
            Ok(())
        } else {
            Err(format!("a dead resolver looks alive: {status}").into())
        }
    })?;
    let (out, addresses) = lookup(&host, "allowed.test.invalid");
    assert!(
        addresses.is_empty() && !out.status.success(),
        "{}",
        text(&out)
    );
    down(&host, &ws)?;
    assert_nothing_left(&host);
    up_under_test_dns(&host)?;
    let (out, addresses) = lookup(&host, "allowed.test.invalid");
    assert_eq!(addresses, ["198.18.2.10"], "{}", text(&out));
    down(&host, &ws)?;
    assert_nothing_left(&host);
    Ok(())
}

/// A v2 profile with `dns = "host"` and no names keeps v1's network: the
/// sandbox's resolver is slirp4netns's forwarder, and any name resolves.
fn host_dns_forwards_as_v1() -> Result {
    let (_serial, host) = crate::domain::host_with_config(&names_config("dns = \"host\"\n")
        .replace("allow_hosts = [\"allowed.test.invalid\", \"*.wild.test.invalid\", \"rebind.test.invalid\"]\n", ""));
    TestNet::remove_stale()?;
    let net = TestNet::new()?;
    let log = host.base().join("dnsmasq.log");
    let _dns = dns_server(&net, &log)?;
    let ws = host.workspace.clone();
    let check = host.lazaret(&ws, &["config", "check", "p"]);
    assert!(
        String::from_utf8_lossy(&check.stderr).contains("way out"),
        "config check warns that DNS is a way out: {}",
        text(&check)
    );
    up_under_test_dns(&host)?;
    let out = shell(&host, "cat /etc/resolv.conf");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("nameserver 10.0.2.3"),
        "{}",
        text(&out)
    );
    let (out, addresses) = lookup(&host, "denied.test.invalid");
    assert_eq!(addresses, ["198.18.3.20"], "{}", text(&out));
    assert!(queries_for(&log, "denied.test.invalid") > 0);
    let status = host.status(&ws, "p").ok_or("no status")?;
    assert!(
        status["network"]["names"].is_null(),
        "{}",
        status["network"]
    );
    down(&host, &ws)?;
    assert_nothing_left(&host);
    Ok(())
}
