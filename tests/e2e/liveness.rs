//! Nothing hangs and nothing lies, end to end, as the unprivileged test
//! user with real runsc: `down` with sessions whose input is never read,
//! `up` with its coordinator killed at each start-up step, `status` and
//! `down` with a stopped coordinator, a session with a stopped router or
//! sandbox, the truth after the runsc sandbox is killed, a Network Sidecar
//! killed while it attests, and a supervisor stopped before its plan.
//! Every wait is bounded, and every bound is far below the hangs these
//! tests stand against.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use lazaret_tests::bin;
use lazaret_tests::domain::{UserHost, pid_exists, signal};
use libtest_mimic::Trial;
use serde_json::Value;

use crate::domain::{
    Result, assert_nothing_left, config, default_host, down, gated, host_with_config, runnable,
    text, up, wait_until,
};

/// How long one expected change may take.
const WAIT: Duration = Duration::from_secs(10);

pub fn trials() -> Vec<Trial> {
    gated(
        runnable(),
        [
            Trial::test(
                "liveness::down_ends_sessions_whose_input_is_never_read",
                down_with_unread_input,
            ),
            Trial::test(
                "liveness::up_fails_when_its_coordinator_dies_at_any_step",
                coordinator_killed_at_each_step,
            ),
            Trial::test(
                "liveness::status_names_a_stopped_coordinator_and_lists_the_rest",
                stopped_coordinator,
            ),
            Trial::test(
                "liveness::a_stopped_router_or_sandbox_fails_a_session_within_its_bound",
                stopped_participants,
            ),
            Trial::test(
                "liveness::a_killed_sandbox_ends_its_generation",
                killed_sandbox,
            ),
            Trial::test(
                "liveness::a_sidecar_killed_while_attesting_fails_up_at_once",
                killed_sidecar,
            ),
            Trial::test(
                "liveness::roles_close_the_descriptors_they_inherit",
                roles_close_inherited,
            ),
            Trial::test(
                "liveness::a_supervisor_reports_its_namespaces_at_once_and_stops_without_a_plan",
                supervisor_without_a_plan,
            ),
        ],
    )
}

/// The threads of a process.
fn threads(pid: u64) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, Iterator::count)
}

/// `lazaret attach p -- sleep 100` as the test user, its input an endless
/// `yes` it never reads, its output a file (so both are relayed): the
/// attach and the `yes`.
fn flooding_session(host: &UserHost, ws: &Path, log: &Path) -> std::io::Result<(Child, Child)> {
    let mut yes = Command::new("yes")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let input = yes.stdout.take().expect("piped");
    let out = std::fs::File::create(log)?;
    let attach = host
        .command(&bin("lazaret"), ws)
        .args(["attach", "p", "--", "sleep", "100"])
        .stdin(Stdio::from(input))
        .stdout(Stdio::from(out))
        .stderr(Stdio::piped())
        .spawn()?;
    Ok((attach, yes))
}

/// Waits up to `timeout` for `child` to exit; kills it past that.
fn exited_within(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `lazaret ARGS` as the test user in `ws`, given `timeout` to exit
/// (killed past it): its exit status if it exited in time, and what it
/// printed.
fn lazaret_within(
    host: &UserHost,
    ws: &Path,
    args: &[&str],
    timeout: Duration,
) -> std::io::Result<(Option<ExitStatus>, Output)> {
    let mut child = host
        .command(&bin("lazaret"), ws)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let exited = exited_within(&mut child, timeout);
    Ok((exited, child.wait_with_output()?))
}

fn down_with_unread_input() -> Result {
    let (_serial, host) = default_host();
    let ws = host.workspace.clone();
    let status = up(&host, &ws)?;
    let coordinator = status["coordinator"]["pid"].as_u64().expect("pid");
    let idle_threads = threads(coordinator);

    let mut sessions = Vec::new();
    for n in 0..10 {
        sessions.push(flooding_session(
            &host,
            &ws,
            &host.base().join(format!("out-{n}.log")),
        )?);
    }
    let listed = wait_until(Duration::from_secs(30), "ten sessions listed", || {
        let listed = host.status(&ws, "p")?["sessions"].as_array()?.len();
        (listed == 10).then_some(listed)
    });
    // Let the input pile up: each session's buffer fills, then its CLI
    // is held back.
    std::thread::sleep(Duration::from_secs(1));
    let busy_threads = threads(coordinator);
    let started = Instant::now();
    let stopped = host.lazaret(&ws, &["down", "p"]);
    let took = started.elapsed();
    let mut outcomes = Vec::new();
    for (mut attach, mut yes) in sessions {
        let status = exited_within(&mut attach, WAIT);
        let mut stderr = String::new();
        if let Some(mut pipe) = attach.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
        }
        let _ = yes.kill();
        let _ = yes.wait();
        outcomes.push((status, stderr));
    }
    listed?;
    eprintln!(
        "down with ten flooded sessions took {} ms; coordinator threads idle {idle_threads}, \
         with ten sessions {busy_threads}",
        took.as_millis()
    );
    assert!(stopped.status.success(), "{}", text(&stopped));
    assert!(
        took < Duration::from_secs(10),
        "down took {took:?} with sessions flooding input"
    );
    assert!(
        busy_threads <= idle_threads,
        "the coordinator grew from {idle_threads} to {busy_threads} threads for ten sessions"
    );
    for (n, (status, stderr)) in outcomes.iter().enumerate() {
        let status = status.ok_or_else(|| format!("session {n} still ran {WAIT:?} after down"))?;
        assert!(!status.success(), "session {n} exited 0 after down");
        assert!(
            stderr.contains("the Domain went down"),
            "session {n} does not say why it ended: {stderr}"
        );
    }
    assert_nothing_left(&host);
    Ok(())
}

/// The children of `pid`.
fn children(pid: u32) -> Vec<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

fn coordinator_killed_at_each_step() -> Result {
    let (_serial, host) = default_host();
    let ws = host.workspace.clone();
    // Prepare the image once, so each later `up` passes every step fast.
    up(&host, &ws)?;
    down(&host, &ws)?;
    for step in [
        "ownership",
        "image",
        "state",
        "sandbox",
        "workspace",
        "network",
    ] {
        let mut up = host
            .command(&bin("lazaret"), &ws)
            .args(["up", "p"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        let cli = up.id();
        let stderr = up.stderr.take().expect("piped");
        let mut lines = BufReader::new(stderr).lines();
        let mut seen = Vec::new();
        let mut killed = false;
        for line in lines.by_ref() {
            let line = line?;
            seen.push(line.clone());
            if !killed && line.trim_start().starts_with(step) {
                for child in children(cli) {
                    signal(child, "KILL")?;
                }
                killed = true;
                break;
            }
        }
        let status = exited_within(&mut up, WAIT);
        let rest: Vec<String> = lines.map_while(std::result::Result::ok).collect();
        let said = format!("{}\n{}", seen.join("\n"), rest.join("\n"));
        let status = status.ok_or_else(|| {
            format!("up hung after its coordinator was killed at `{step}`: {said}")
        })?;
        assert!(killed, "up never reached `{step}`: {said}");
        assert!(!status.success(), "up exited 0 at `{step}`: {said}");
        assert!(
            said.contains("exited without finishing"),
            "up does not say its coordinator died at `{step}`: {said}"
        );
        // What the dead coordinator left is cleaned up by `down`.
        down(&host, &ws)?;
        wait_until(WAIT, "nothing of the Domain left", || {
            lazaret_tests::domain::lazaret_processes(host.uid())
                .is_empty()
                .then_some(())
        })?;
    }
    Ok(())
}

fn stopped_coordinator() -> Result {
    let two = format!(
        "{}[profiles.q]\nimage = \"{}\"\n",
        config(&lazaret_tests::domain::busybox_image(), "\"/root\""),
        lazaret_tests::domain::busybox_image()
    );
    let (_serial, host) = host_with_config(&two);
    let ws = host.workspace.clone();
    let p = up(&host, &ws)?;
    let q = host.lazaret(&ws, &["up", "q"]);
    assert!(q.status.success(), "{}", text(&q));
    let coordinator = p["coordinator"]["pid"].as_u64().expect("pid");
    let domain = p["domain_id"].as_str().expect("domain id").to_owned();
    signal(coordinator, "STOP")?;

    let started = Instant::now();
    let (exited, output) =
        lazaret_within(&host, &ws, &["status", "--json"], Duration::from_secs(30))?;
    let took = started.elapsed();
    let asked_alone = host.lazaret(&ws, &["status", "p"]);
    // `down` gives up on it within its 30 s, asking and all.
    let (down_exited, down_output) =
        lazaret_within(&host, &ws, &["down", "p"], Duration::from_secs(40))?;
    signal(coordinator, "CONT")?;
    let down_exited = down_exited.ok_or("down hung on a stopped coordinator for 40 s")?;
    assert!(!down_exited.success(), "{}", text(&down_output));
    assert!(
        String::from_utf8_lossy(&down_output.stderr).contains("did not answer within 30 s"),
        "{}",
        text(&down_output)
    );

    let exited = exited.ok_or("status hung on a stopped coordinator")?;
    let listed: Value = serde_json::from_slice(&output.stdout)
        .map_err(|e| format!("status --json: {e}: {}", text(&output)))?;
    assert!(
        !exited.success(),
        "status exited 0 with a Domain not answering"
    );
    assert!(took < Duration::from_secs(20), "status took {took:?}");
    let profiles: Vec<&str> = listed["domains"]
        .as_array()
        .map(|d| d.iter().filter_map(|s| s["profile"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(profiles, ["q"], "the answering Domain is listed: {listed}");
    assert_eq!(
        listed["not_answering"][0]["domain_id"], domain,
        "the silent Domain is named: {listed}"
    );
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(
        said.contains(&domain) && said.contains("did not answer"),
        "status says which Domain does not answer: {said}"
    );
    assert!(!asked_alone.status.success(), "{}", text(&asked_alone));
    assert!(
        String::from_utf8_lossy(&asked_alone.stderr).contains("did not answer"),
        "{}",
        text(&asked_alone)
    );

    down(&host, &ws)?;
    let q = host.lazaret(&ws, &["down", "q"]);
    assert!(q.status.success(), "{}", text(&q));
    assert_nothing_left(&host);
    Ok(())
}

fn killed_sandbox() -> Result {
    let (_serial, host) = default_host();
    let ws = host.workspace.clone();
    let status = up(&host, &ws)?;
    let sandbox = status["sandbox"]["pid"].as_u64().expect("pid");
    let coordinator = status["coordinator"]["pid"].as_u64().expect("pid");
    signal(sandbox, "KILL")?;

    // The generation ends: its coordinator goes, and status says so.
    wait_until(WAIT, "the coordinator to end the generation", || {
        (!pid_exists(coordinator)).then_some(())
    })?;
    assert!(
        host.status(&ws, "p").is_none(),
        "status lists a dead sandbox"
    );
    let attached = host.lazaret(&ws, &["attach", "p", "--", "true"]);
    assert!(!attached.status.success(), "{}", text(&attached));
    assert!(
        String::from_utf8_lossy(&attached.stderr).contains("is not running"),
        "{}",
        text(&attached)
    );
    // Where the log is a file (no journal here), it names the cause.
    if !Path::new("/run/systemd/journal/socket").exists() {
        let log = host.lazaret(&ws, &["logs", "p"]);
        assert!(
            // Its gofer ends with it; whichever exit is seen first, the
            // log names the sandbox.
            [
                "the runsc sandbox exited unexpectedly",
                "the runsc sandbox and its gofer exited unexpectedly"
            ]
            .iter()
            .any(|cause| String::from_utf8_lossy(&log.stdout).contains(cause)),
            "the log names the cause: {}",
            text(&log)
        );
    }
    // `up` starts a new generation rather than saying "already up".
    let again = host.lazaret(&ws, &["up", "p"]);
    assert!(again.status.success(), "{}", text(&again));
    assert!(
        String::from_utf8_lossy(&again.stdout).contains("is up"),
        "{}",
        text(&again)
    );
    let ran = host.lazaret(&ws, &["attach", "p", "--", "true"]);
    assert!(ran.status.success(), "{}", text(&ran));
    down(&host, &ws)?;
    assert_nothing_left(&host);
    Ok(())
}

/// The pids of the test user's processes whose name starts with `name`.
fn named(uid: u32, name: &str) -> Vec<u64> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u64>().ok())
        .filter(|pid| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            let owner = std::fs::metadata(format!("/proc/{pid}"))
                .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
                .ok();
            comm.starts_with(name) && owner == Some(uid)
        })
        .collect()
}

fn killed_sidecar() -> Result {
    let (_serial, host) = default_host();
    let ws = host.workspace.clone();
    up(&host, &ws)?;
    down(&host, &ws)?;

    let started = Instant::now();
    let mut up = host
        .command(&bin("lazaret"), &ws)
        .args(["up", "p"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    // Kill the sidecar as soon as it exists (its name, cut to 15 bytes).
    let mut killed = false;
    while !killed && started.elapsed() < Duration::from_secs(30) {
        if let Ok(Some(_)) = up.try_wait() {
            break;
        }
        for pid in named(host.uid(), "lazaret-netside") {
            killed |= signal(pid, "KILL").is_ok();
        }
    }
    let status = exited_within(&mut up, Duration::from_secs(25));
    let took = started.elapsed();
    let output = up.wait_with_output()?;
    let said = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(killed, "the sidecar was never seen: {said}");
    let status = status.ok_or_else(|| format!("up hung after its sidecar died: {said}"))?;
    eprintln!(
        "up failed {} ms after start with its sidecar killed",
        took.as_millis()
    );
    assert!(!status.success(), "up exited 0 without its sidecar: {said}");
    assert!(
        said.contains("up failed at network") && said.contains("the sidecar"),
        "up names the dead sidecar: {said}"
    );
    assert!(
        took < Duration::from_secs(20),
        "a dead sidecar cost {took:?}"
    );
    wait_until(WAIT, "nothing of the Domain left", || {
        lazaret_tests::domain::lazaret_processes(host.uid())
            .is_empty()
            .then_some(())
    })?;
    Ok(())
}

/// What the descriptors of `pid` name.
fn open_files(pid: u64) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .map(|target| target.display().to_string())
        .collect()
}

fn roles_close_inherited() -> Result {
    let (_serial, host) = default_host();
    let ws = host.workspace.clone();
    let marker = host.base().join("inherited-marker");
    std::fs::write(&marker, "a descriptor the shell left open")?;
    std::fs::set_permissions(&marker, std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
    // A shell that leaves descriptor 7 open (not close-on-exec) for the
    // CLI, which hands it to the coordinator it starts.
    let script = format!(
        "exec 7<'{}'; exec '{}' up p",
        marker.display(),
        bin("lazaret").display()
    );
    let started = host
        .command(Path::new("/bin/sh"), &ws)
        .args(["-c", &script])
        .output()?;
    assert!(started.status.success(), "{}", text(&started));
    let status = host.status(&ws, "p").ok_or("status after up")?;
    let roles = [
        ("coordinator", status["coordinator"]["pid"].as_u64()),
        ("supervisor", status["supervisor"]["pid"].as_u64()),
        (
            "router",
            status["workspace_routing"]["router"]["pid"].as_u64(),
        ),
    ];
    let marker = marker.display().to_string();
    let mut leaks = Vec::new();
    for (role, pid) in roles {
        let pid = pid.ok_or_else(|| format!("no {role} pid in {status}"))?;
        if open_files(pid).contains(&marker) {
            leaks.push(role);
        }
    }
    down(&host, &ws)?;
    assert!(leaks.is_empty(), "still open in {leaks:?}");
    Ok(())
}

/// The Runtime Supervisor, driven by hand as its coordinator would: it
/// reports the Domain namespaces before it is sent anything (the
/// coordinator prepares the image and state meanwhile), and a `Stop`
/// before any plan (the coordinator failed first) is answered `Stopped`,
/// after which it exits 0 and its namespaces go with it.
fn supervisor_without_a_plan() -> Result {
    use lazaret_proto::channel::{Received, pair, readable_within};
    use lazaret_proto::supervisor::{SupervisorReport, SupervisorRequest};
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;

    let (ours, theirs) = pair::<SupervisorRequest, SupervisorReport>()?;
    let mut child = Command::new(bin("lazaret-supervisor"))
        .env_clear()
        .stdin(Stdio::from(theirs.into_fd()))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let next = |what: &str| -> std::result::Result<Received<SupervisorReport>, String> {
        if !readable_within(ours.as_fd(), WAIT).map_err(|e| e.to_string())? {
            return Err(format!("no {what} within {WAIT:?}"));
        }
        ours.recv().map_err(|e| format!("{what}: {e}"))
    };
    let ready = next("report of the namespaces")?;
    let SupervisorReport::NamespacesReady {
        user_namespace,
        network_namespace,
        ..
    } = ready.message
    else {
        return Err(format!("the first report is {:?}", ready.message).into());
    };
    assert_eq!(ready.fds.len(), 3, "the holder and both namespaces");
    let own_user = std::fs::metadata("/proc/self/ns/user")?;
    let own_net = std::fs::metadata("/proc/self/ns/net")?;
    assert_ne!(user_namespace.inode, own_user.ino(), "a new user namespace");
    assert_ne!(
        network_namespace.inode,
        own_net.ino(),
        "a new network namespace"
    );

    ours.send(&SupervisorRequest::Stop, &[])?;
    let stopped = next("answer to Stop")?;
    assert_eq!(stopped.message, SupervisorReport::Stopped);
    if !lazaret_tests::domain::ended(&mut child, WAIT) {
        let _ = child.kill();
        return Err("the supervisor did not exit after Stop".into());
    }
    let output = child.wait_with_output()?;
    assert!(
        output.status.success(),
        "{:?}: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

/// With the Workspace Router or the runsc sandbox stopped (SIGSTOP), a new
/// session fails within its bound and says why, and `status` names the
/// stopped process; once it runs again, sessions work.
fn stopped_participants() -> Result {
    let (_serial, host) = default_host();
    let ws = host.workspace.clone();
    let status = up(&host, &ws)?;
    let router = status["workspace_routing"]["router"]["pid"]
        .as_u64()
        .ok_or("status shows no router")?;
    let sandbox = status["sandbox"]["pid"]
        .as_u64()
        .ok_or("status shows no sandbox")?;
    for (pid, what) in [
        (router, "the Workspace Router"),
        (sandbox, "the runsc sandbox"),
    ] {
        signal(pid, "STOP")?;
        // Past the kernel's one-second cache of the workspace's names and
        // attributes, a session's start needs the router.
        std::thread::sleep(Duration::from_secs(2));
        let result = (|| -> Result {
            let now = host.status(&ws, "p").ok_or("no status")?;
            let problems = now["problems"].to_string();
            assert_eq!(now["state"], "degraded", "{now}");
            assert!(
                problems.contains(&format!("{what} (pid {pid}) is stopped")),
                "{problems}"
            );
            let started = Instant::now();
            let out =
                crate::attach::Running::start(crate::attach::attach(&host, &ws, &["true"]), None)?
                    .finish(Duration::from_secs(60))?;
            let took = started.elapsed();
            assert_ne!(out.status.code(), Some(0), "{}", text(&out));
            assert!(
                String::from_utf8_lossy(&out.stderr).contains("did not start the session"),
                "{}",
                text(&out)
            );
            assert!(took < Duration::from_secs(45), "took {took:?}");
            // A client killed while its session waits to start leaves
            // nothing behind once the start goes through.
            let mut waiting = crate::attach::Running::start(
                crate::attach::attach(&host, &ws, &["sleep", "100"]),
                None,
            )?;
            std::thread::sleep(Duration::from_secs(1));
            waiting.kill()?;
            drop(waiting);
            Ok(())
        })();
        signal(pid, "CONT")?;
        result?;
        wait_until(WAIT, "no session process to be left", || {
            (crate::attach::runsc_execs(host.uid()).is_empty()
                && crate::attach::sandbox_processes(&host, &status, "sleep 100").is_empty())
            .then_some(())
        })?;
        let out = host
            .command(&bin("lazaret"), &ws)
            .args(["attach", "p", "--", "echo", "running-again"])
            .output()?;
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "running-again",
            "{}",
            text(&out)
        );
    }
    down(&host, &ws)
}
