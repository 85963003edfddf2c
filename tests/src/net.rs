//! A test network for Lazaret's network tests: a network namespace joined to
//! the root namespace by a veth pair, test hosts on addresses in
//! `198.18.0.0/15` (never in the machine's uplink or registry ranges), and
//! servers started inside the namespace. Everything a [`TestNet`] creates it
//! removes when dropped, even when the test panics; [`TestNet::remove_stale`]
//! removes what a crashed run left.
//!
//! Needs root: it runs `ip` from iproute2, which it trusts, and the programs
//! the test asks it to start. It only ever deletes names with its own
//! prefixes (`lzt-` namespaces, `lztr` links) and only kills processes it
//! started or that run inside a namespace of its own.
//!
//! The layout, with routes in the root namespace for the two extra
//! networks (they go with the veth):
//!
//! ```text
//! root namespace  lztr…  198.18.0.1/24          (ROOT_SIDE)
//!                        198.18.2.0/24 via 198.18.0.10
//!                        198.18.3.0/24 via 198.18.0.10
//! lzt-<pid>-<n>   lzth…  198.18.0.10/24         (ALLOWED)
//!                        198.18.0.20/32         (DENIED)
//!                        198.18.2.10/32         (ALLOWED_NET_HOST)
//!                        198.18.3.10/32         (UNLISTED)
//!                 lo     up
//! ```

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io::{BufRead, BufReader};
use std::marker::PhantomData;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::domain::pid_exists;

/// The root namespace's side of the veth.
pub const ROOT_SIDE: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
/// The test host a policy allows (`198.18.0.10/32`).
pub const ALLOWED: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 10);
/// A test host on the same link that a policy denies (`198.18.0.20/32`).
pub const DENIED: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 20);
/// A host inside [`ALLOWED_NET`], a network a policy allows as a whole.
pub const ALLOWED_NET_HOST: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 10);
/// A host inside [`UNLISTED_NET`], which a policy names in neither set.
pub const UNLISTED: Ipv4Addr = Ipv4Addr::new(198, 18, 3, 10);
/// The network of [`ALLOWED_NET_HOST`], routed to the test namespace.
pub const ALLOWED_NET: &str = "198.18.2.0/24";
/// The network of [`UNLISTED`], routed to the test namespace.
pub const UNLISTED_NET: &str = "198.18.3.0/24";

/// How long [`TestNet::spawn`] waits for a server's `ready` line.
pub const READY_TIMEOUT: Duration = Duration::from_secs(5);

/// Namespace names start with this, then `<pid>-<n>`.
const NAMESPACE_PREFIX: &str = "lzt-";
/// The root side of the veth: this, then the pid modulo 10000 in four
/// digits, then `<n>` (at most 15 characters for any `n` below 10^7).
const ROOT_LINK_PREFIX: &str = "lztr";
/// The namespace side of the veth, numbered as the root side.
const TEST_LINK_PREFIX: &str = "lzth";

/// One test network at a time in this process: every one uses the same
/// addresses and root-namespace routes. Held by each [`TestNet`].
static EXCLUSIVE: Mutex<()> = Mutex::new(());

/// One removal of stale networks at a time in this process.
static CLEANING: Mutex<()> = Mutex::new(());

/// The `<n>` of the next test network of this process.
static NEXT: AtomicU32 = AtomicU32::new(0);

/// A failed step of creating a test network or starting a server in it.
#[derive(Debug)]
pub enum NetError {
    /// The process is not root.
    NotRoot,
    /// An `ip` command failed.
    Ip {
        /// Its arguments.
        args: Vec<String>,
        /// Its exit code.
        status: Option<i32>,
        /// What it printed on standard error.
        stderr: String,
    },
    /// A program could not be started.
    Start {
        /// The program.
        program: String,
        /// Why.
        source: std::io::Error,
    },
    /// A server did not print `ready`.
    NotReady {
        /// The server's command line.
        command: String,
        /// What happened instead.
        why: String,
        /// What it printed on standard error.
        stderr: String,
    },
}

impl fmt::Display for NetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NetError::NotRoot => write!(
                f,
                "a test network needs root (it runs `ip netns` and `ip link`); run the tests as root"
            ),
            NetError::Ip {
                args,
                status,
                stderr,
            } => write!(
                f,
                "`ip {}` failed (exit {status:?}): {}",
                args.join(" "),
                stderr.trim_end()
            ),
            NetError::Start { program, source } => write!(f, "start `{program}`: {source}"),
            NetError::NotReady {
                command,
                why,
                stderr,
            } => write!(
                f,
                "`{command}` in the test namespace {why}; its stderr: {:?}",
                stderr.trim_end()
            ),
        }
    }
}

impl std::error::Error for NetError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            NetError::Start { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// A network namespace with test hosts, joined to the root namespace by a
/// veth pair; removed, with its servers, when dropped.
///
/// Only one exists at a time in a process (a second `new` waits for the
/// first to be dropped). A test that also holds
/// [`crate::domain::SERIAL`] takes that first.
#[derive(Debug)]
pub struct TestNet {
    namespace: String,
    root_link: String,
    test_link: String,
    servers: Mutex<Vec<Arc<Mutex<Child>>>>,
    _exclusive: MutexGuard<'static, ()>,
}

impl TestNet {
    /// Removes what a crashed earlier run left, then creates the namespace,
    /// the veth pair, the addresses and the routes. On a failure, whatever
    /// was created is removed before the error is returned.
    pub fn new() -> Result<Self, NetError> {
        if !rustix::process::geteuid().is_root() {
            return Err(NetError::NotRoot);
        }
        let exclusive = EXCLUSIVE.lock().unwrap_or_else(|e| e.into_inner());
        Self::remove_stale()?;
        let pid = std::process::id();
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let net = Self {
            namespace: format!("{NAMESPACE_PREFIX}{pid}-{n}"),
            root_link: format!("{ROOT_LINK_PREFIX}{:04}{n}", pid % 10000),
            test_link: format!("{TEST_LINK_PREFIX}{:04}{n}", pid % 10000),
            servers: Mutex::default(),
            _exclusive: exclusive,
        };
        net.build()?;
        Ok(net)
    }

    fn build(&self) -> Result<(), NetError> {
        let (ns, root, test) = (&*self.namespace, &*self.root_link, &*self.test_link);
        ip(["netns", "add", ns])?;
        ip(["link", "add", root, "type", "veth", "peer", "name", test])?;
        ip(["link", "set", test, "netns", ns])?;
        ip(["addr", "add", &format!("{ROOT_SIDE}/24"), "dev", root])?;
        ip(["link", "set", root, "up"])?;
        ip([
            "-n",
            ns,
            "addr",
            "add",
            &format!("{ALLOWED}/24"),
            "dev",
            test,
        ])?;
        for host in [DENIED, ALLOWED_NET_HOST, UNLISTED] {
            ip(["-n", ns, "addr", "add", &format!("{host}/32"), "dev", test])?;
        }
        ip(["-n", ns, "link", "set", test, "up"])?;
        ip(["-n", ns, "link", "set", "lo", "up"])?;
        for net in [ALLOWED_NET, UNLISTED_NET] {
            let via = ALLOWED.to_string();
            ip(["route", "add", net, "via", &via, "dev", root])?;
        }
        Ok(())
    }

    /// The namespace's name (`lzt-<pid>-<n>`).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The root namespace's side of the veth.
    pub fn root_link(&self) -> &str {
        &self.root_link
    }

    /// The namespace's side of the veth.
    pub fn test_link(&self) -> &str {
        &self.test_link
    }

    /// `ip -n NAMESPACE ARGS`: changes the test namespace only (its routes,
    /// for instance), never the root namespace.
    pub fn ip<I, S>(&self, args: I) -> Result<String, NetError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut all = vec!["-n".to_owned(), self.namespace.clone()];
        all.extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        ip(all)
    }

    /// A command that runs `program` inside the namespace
    /// (`ip netns exec`); the caller adds arguments and runs it.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut command = Command::new(ip_program());
        command
            .args(["netns", "exec", &self.namespace])
            .arg(program);
        command
    }

    /// Starts `args` (a program and its arguments) inside the namespace and
    /// waits up to [`READY_TIMEOUT`] for it to print a line `ready`. The
    /// server is killed when the returned [`Server`] or this network is
    /// dropped.
    pub fn spawn<I, S>(&self, args: I) -> Result<Server<'_>, NetError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let args: Vec<OsString> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
        let line = args
            .iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ");
        let Some((program, rest)) = args.split_first() else {
            return Err(NetError::Start {
                program: String::new(),
                source: std::io::Error::other("no program to start"),
            });
        };
        let mut child = self
            .command(program)
            .args(rest)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| NetError::Start {
                program: line.clone(),
                source,
            })?;
        let pid = child.id();
        let stdout = Arc::new(Mutex::new(String::new()));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let (ready_tx, ready_rx) = mpsc::channel();
        let out = child.stdout.take().expect("stdout is piped");
        let err = child.stderr.take().expect("stderr is piped");
        let out_reader = {
            let stdout = Arc::clone(&stdout);
            std::thread::spawn(move || {
                let mut ready = Some(ready_tx);
                for line in BufReader::new(out).lines() {
                    let Ok(line) = line else { break };
                    if line == "ready" {
                        if let Some(tx) = ready.take() {
                            let _ = tx.send(());
                        }
                    }
                    let mut stdout = stdout.lock().unwrap_or_else(|e| e.into_inner());
                    stdout.push_str(&line);
                    stdout.push('\n');
                }
            })
        };
        let err_reader = crate::collect(err, Arc::clone(&stderr));
        let child = Arc::new(Mutex::new(child));
        self.servers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::clone(&child));
        let server = Server {
            child,
            pid,
            stdout,
            stderr,
            readers: vec![out_reader, err_reader],
            _net: PhantomData,
        };
        let why = match ready_rx.recv_timeout(READY_TIMEOUT) {
            Ok(()) => return Ok(server),
            Err(RecvTimeoutError::Timeout) => {
                format!("did not print `ready` within {} s", READY_TIMEOUT.as_secs())
            }
            Err(RecvTimeoutError::Disconnected) => {
                match server.exited_within(Duration::from_secs(1)) {
                    Some(status) => format!("exited ({status}) before printing `ready`"),
                    None => "closed its standard output before printing `ready`".to_owned(),
                }
            }
        };
        let stderr = server.stop_and_collect();
        Err(NetError::NotReady {
            command: line,
            why,
            stderr,
        })
    }

    /// Starts `lazaret-netprobe ARGS` inside the namespace (see
    /// [`spawn`](Self::spawn)).
    pub fn netprobe(&self, args: &[&str]) -> Result<Server<'_>, NetError> {
        let mut all = vec![crate::netprobe().into_os_string()];
        all.extend(args.iter().map(OsString::from));
        self.spawn(all)
    }

    /// Deletes the test namespaces (`lzt-*`) and root-side veths (`lztr*`)
    /// that a crashed earlier run left, killing any process still inside
    /// such a namespace first. A namespace whose owning process is alive
    /// (another test run, or this process) is kept, and so is its veth.
    pub fn remove_stale() -> Result<(), NetError> {
        if !rustix::process::geteuid().is_root() {
            return Err(NetError::NotRoot);
        }
        let _cleaning = CLEANING.lock().unwrap_or_else(|e| e.into_inner());
        let mut kept = Vec::new();
        for line in ip(["netns", "list"])?.lines() {
            let Some(name) = line.split_whitespace().next() else {
                continue;
            };
            let Some(rest) = name.strip_prefix(NAMESPACE_PREFIX) else {
                continue;
            };
            let owner = rest
                .split_once('-')
                .and_then(|(pid, _)| pid.parse::<u32>().ok());
            if let Some(pid) = owner {
                if pid == std::process::id() || pid_exists(pid.into()) {
                    kept.push(format!("{:04}", pid % 10000));
                    continue;
                }
            }
            kill_inside(name);
            // Another run's cleanup may have removed it first.
            ip(["netns", "del", name]).or_else(|e| gone(e, !namespace_exists(name)))?;
        }
        for line in ip(["-o", "link", "show"])?.lines() {
            // `7: lztr12340@if6: <BROADCAST,…`
            let Some(name) = line
                .split_whitespace()
                .nth(1)
                .map(|n| n.trim_end_matches(':'))
                .map(|n| n.split_once('@').map_or(n, |(n, _)| n))
            else {
                continue;
            };
            let Some(numbers) = name.strip_prefix(ROOT_LINK_PREFIX) else {
                continue;
            };
            if kept.iter().any(|pid| numbers.starts_with(pid.as_str())) {
                continue;
            }
            ip(["link", "del", name]).or_else(|e| gone(e, !link_exists(name)))?;
        }
        Ok(())
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        let servers = std::mem::take(&mut *self.servers.lock().unwrap_or_else(|e| e.into_inner()));
        for server in servers {
            let mut child = server.lock().unwrap_or_else(|e| e.into_inner());
            let _ = child.kill();
            let _ = child.wait();
        }
        // Whatever else still runs in the namespace (a client the test
        // started there) is the test's own.
        kill_inside(&self.namespace);
        // Deleting the root side deletes the pair and the routes through
        // it; the namespace goes when its last process has.
        let mut failures = Vec::new();
        if link_exists(&self.root_link) {
            if let Err(e) = ip(["link", "del", &self.root_link]) {
                failures.push(e.to_string());
            }
        }
        if let Err(e) = ip(["netns", "del", &self.namespace]) {
            failures.push(e.to_string());
        }
        // A drop may run during a panic: report, do not panic again.
        for failure in failures {
            eprintln!("removing the test network {}: {failure}", self.namespace);
        }
    }
}

/// A program started inside a [`TestNet`]; killed (by its own handle) and
/// reaped when dropped.
#[derive(Debug)]
pub struct Server<'net> {
    child: Arc<Mutex<Child>>,
    pid: u32,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<Vec<u8>>>,
    readers: Vec<JoinHandle<()>>,
    _net: PhantomData<&'net TestNet>,
}

impl Server<'_> {
    /// Its process id (of the program itself: `ip netns exec` runs it in
    /// its own place).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// What it has printed on standard output so far, `ready` included.
    pub fn stdout(&self) -> String {
        self.stdout
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// What it has printed on standard error so far.
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }

    /// Its exit status if it exits within `wait`.
    fn exited_within(&self, wait: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + wait;
        loop {
            let status = self
                .child
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .try_wait()
                .ok()
                .flatten();
            if status.is_some() || Instant::now() >= deadline {
                return status;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills and reaps it, then returns its standard error (waiting at most
    /// a second for the pipe to close).
    fn stop_and_collect(mut self) -> String {
        self.stop();
        let deadline = Instant::now() + Duration::from_secs(1);
        while self.readers.iter().any(|r| !r.is_finished()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.stderr()
    }

    fn stop(&mut self) {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for Server<'_> {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The `ip` executable of iproute2, found in the usual places (the test
/// process's `PATH` may lack the sbin directories); `ip` through `PATH` if
/// none of them has it.
pub fn ip_program() -> &'static Path {
    static FOUND: OnceLock<PathBuf> = OnceLock::new();
    FOUND.get_or_init(|| {
        ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
            .unwrap_or_else(|| PathBuf::from("ip"))
    })
}

/// `ip ARGS`; its standard output, or the failure with its standard error.
fn ip<I, S>(args: I) -> Result<String, NetError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let args: Vec<String> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
    let output = Command::new(ip_program())
        .args(&args)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| NetError::Start {
            program: "ip".to_owned(),
            source,
        })?;
    if !output.status.success() {
        return Err(NetError::Ip {
            args,
            status: output.status.code(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Success if what a failed `ip` command was to delete is `gone` anyway.
fn gone(error: NetError, gone: bool) -> Result<String, NetError> {
    if gone { Ok(String::new()) } else { Err(error) }
}

/// Whether a network namespace of this name is listed.
fn namespace_exists(name: &str) -> bool {
    ip(["netns", "list"]).map_or(true, |list| {
        list.lines()
            .any(|l| l.split_whitespace().next() == Some(name))
    })
}

/// Whether a link of this name exists in the root namespace.
fn link_exists(name: &str) -> bool {
    ip(["link", "show", "dev", name]).is_ok()
}

/// Kills (SIGKILL, by pid) every process inside one of this module's
/// namespaces. Only called with `lzt-` names.
fn kill_inside(namespace: &str) {
    debug_assert!(namespace.starts_with(NAMESPACE_PREFIX));
    let Ok(pids) = ip(["netns", "pids", namespace]) else {
        return;
    };
    for pid in pids.lines().filter_map(|p| p.trim().parse::<i32>().ok()) {
        if let Some(pid) = rustix::process::Pid::from_raw(pid) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    }
}
