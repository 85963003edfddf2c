//! Each role confined to its system calls, end to end, as the
//! unprivileged test user with real runsc: during a running Domain every
//! long-lived role shows `Seccomp: 2` and `NoNewPrivs: 1` in
//! `/proc/PID/status`, and an approved host command runs unfiltered, as
//! the developer approved it, below a filtered launch process; and each
//! role, made by the debug builds' hook (`LAZARET_FORBIDDEN_CALL`) to
//! attempt a call outside its list right after installing it, is killed by
//! `SIGSYS`, which `up` or the session reports by name. Needs root and
//! runsc; CI provides them.

use std::path::Path;
use std::time::Duration;

use lazaret_tests::domain::{UserHost, busybox_image};
use lazaret_tests::net::{ALLOWED_NET_HOST, TestNet};
use libtest_mimic::Trial;

use crate::domain::{
    Result, assert_nothing_left, config, down, gated, host_with_config, text, up, wait_until,
};

pub fn trials() -> Vec<Trial> {
    let networked = crate::domain::runnable() && Path::new("/usr/bin/slirp4netns").exists();
    let mut trials = gated(
        networked,
        [Trial::test(
            "confinement::the_resolver_and_credential_proxy_run_confined",
            resolver_and_proxy,
        )],
    );
    trials.extend(gated(
        crate::domain::runnable(),
        [
            Trial::test(
                "confinement::every_role_runs_confined_and_approved_commands_do_not",
                every_role_confined,
            ),
            Trial::test(
                "confinement::a_forbidden_call_kills_each_role_by_sigsys",
                forbidden_calls,
            ),
        ],
    ));
    trials
}

/// A role binary's process of the test user: its pid, its program's name
/// (the mode, for the coordinator's), and its status fields.
#[derive(Debug)]
pub struct RoleProcess {
    pub pid: u32,
    pub role: String,
    pub seccomp: String,
    pub no_new_privs: String,
}

/// The roles Lazaret runs as.
const ROLES: &[&str] = &[
    "lazaret-coordinator",
    "lazaret-supervisor",
    "lazaret-router",
    "lazaret-resolver",
    "lazaret-credproxy",
    "lazaret-netsidecar",
];

/// Every process of `uid` running a role binary, named by the binary and,
/// for the coordinator's other modes, `lazaret-coordinator-MODE`.
pub fn role_processes(uid: u32) -> Vec<RoleProcess> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse().ok()) else {
            continue;
        };
        let dir = entry.path();
        let Ok(status) = std::fs::read_to_string(dir.join("status")) else {
            continue;
        };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.split_whitespace().next().unwrap_or("").to_owned())
                .unwrap_or_default()
        };
        if field("Uid:") != uid.to_string() {
            continue;
        }
        let Some(binary) = std::fs::read_link(dir.join("exe")).ok().and_then(|exe| {
            exe.file_name()
                .and_then(|n| n.to_str())
                .map(|n| n.trim_end_matches(" (deleted)").to_owned())
        }) else {
            continue;
        };
        if !ROLES.contains(&binary.as_str()) {
            continue;
        }
        let cmdline = std::fs::read(dir.join("cmdline")).unwrap_or_default();
        let mode = cmdline.split(|b| *b == 0).nth(1).unwrap_or_default();
        let role = match (binary.as_str(), mode) {
            ("lazaret-coordinator", b"spawn") => "lazaret-coordinator-spawn".to_owned(),
            ("lazaret-coordinator", b"launch") => "lazaret-coordinator-launch".to_owned(),
            _ => binary,
        };
        found.push(RoleProcess {
            pid,
            role,
            seccomp: field("Seccomp:"),
            no_new_privs: field("NoNewPrivs:"),
        });
    }
    found
}

/// Fails unless each of `roles` runs, and every role process of the test
/// user but the launch spawner (unconfined by design: approved commands
/// start through it) runs under a filter with `no_new_privs`.
pub fn assert_roles_confined(host: &UserHost, roles: &[&str]) -> Result {
    let processes = role_processes(host.uid());
    for role in roles {
        if !processes.iter().any(|p| p.role == *role) {
            return Err(format!("no {role} runs: {processes:?}").into());
        }
    }
    for process in &processes {
        let spawner = process.role == "lazaret-coordinator-spawn";
        let wanted = if spawner { ("0", "0") } else { ("2", "1") };
        if (process.seccomp.as_str(), process.no_new_privs.as_str()) != wanted {
            return Err(format!("{process:?}: wanted Seccomp {wanted:?}: {processes:?}").into());
        }
    }
    Ok(())
}

/// The `Seccomp:` field of `pid`'s status.
fn seccomp_of(pid: u32) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Seccomp:"))
        .map(|v| v.trim().to_owned())
}

/// The children of `pid`, from every thread's list.
fn children_of(pid: u32) -> Vec<u32> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten();
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|list| {
            list.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// The host's `sleep`, by the path an approval rule names.
fn sleep() -> String {
    let sleep = std::fs::canonicalize("/bin/sleep").expect("sleep is installed");
    sleep.display().to_string()
}

/// The default profile with escalation, auto-approving `sleep 30`.
fn sleeping_config() -> String {
    format!(
        "{}[profiles.p.escalation]\nenabled = true\n\
         auto_approve = [{{ executable = {:?}, args = [\"30\"], allow_extra_args = false }}]\n",
        config(&busybox_image(), "\"/root\""),
        sleep()
    )
}

fn every_role_confined() -> Result {
    let (_serial, host) = host_with_config(&sleeping_config());
    let ws = host.workspace.clone();
    up(&host, &ws)?;
    assert_roles_confined(
        &host,
        &[
            "lazaret-coordinator",
            "lazaret-coordinator-spawn",
            "lazaret-supervisor",
            "lazaret-router",
        ],
    )?;
    // Both supervisor stages.
    let supervisors = role_processes(host.uid())
        .into_iter()
        .filter(|p| p.role == "lazaret-supervisor")
        .count();
    assert_eq!(supervisors, 2, "{:?}", role_processes(host.uid()));

    // An approved command runs below a filtered launch process, itself
    // unfiltered.
    let sleep = sleep();
    let argv = ["attach", "p", "--", "lazaret-escalate", &sleep, "30"];
    let mut session = host.spawn_lazaret::<&str>(&ws, &argv, &[])?;
    let launcher = wait_until(Duration::from_secs(30), "the launch process", || {
        role_processes(host.uid())
            .into_iter()
            .find(|p| p.role == "lazaret-coordinator-launch")
    })?;
    assert_eq!(
        (launcher.seccomp.as_str(), launcher.no_new_privs.as_str()),
        ("2", "1"),
        "{launcher:?}"
    );
    let command = wait_until(Duration::from_secs(10), "the approved command", || {
        children_of(launcher.pid).first().copied()
    })?;
    assert_eq!(
        seccomp_of(command).as_deref(),
        Some("0"),
        "the command is filtered"
    );
    let _ = session.kill();
    let _ = session.wait();

    // Without its spawner the coordinator cannot start a command, and an
    // approved one fails saying so.
    let spawner = role_processes(host.uid())
        .into_iter()
        .find(|p| p.role == "lazaret-coordinator-spawn")
        .ok_or("no spawner")?;
    lazaret_tests::domain::signal(u64::from(spawner.pid), "KILL")?;
    let out = host.lazaret(
        &ws,
        &["attach", "p", "--", "lazaret-escalate", &sleep, "30"],
    );
    let told = text(&out);
    assert!(
        !out.status.success() && told.contains("launch spawner has exited"),
        "{told}"
    );
    down(&host, &ws)?;
    assert_nothing_left(&host);
    Ok(())
}

/// Waits until no role process of the test user is left (a failed `up`'s
/// end).
fn roles_gone(host: &UserHost) -> Result {
    wait_until(
        Duration::from_secs(30),
        "the failed up's processes to end",
        || role_processes(host.uid()).is_empty().then_some(()),
    )
}

/// `lazaret up p` with `LAZARET_FORBIDDEN_CALL` naming `role` and `call`.
fn up_attempting(host: &UserHost, ws: &Path, role: &str, call: &str) -> std::process::Output {
    let asked = format!("{role}:{call}");
    host.lazaret_with_env(ws, &["up", "p"], &[("LAZARET_FORBIDDEN_CALL", &asked)])
}

fn forbidden_calls() -> Result {
    let (_serial, host) = host_with_config(&sleeping_config());
    let ws = host.workspace.clone();
    // Each role that `up` starts, with a call its list leaves out; `up`
    // fails and says which role its filter killed.
    let cases = [
        (
            "lazaret-router",
            "execve",
            "the router was killed by SIGSYS",
        ),
        (
            "lazaret-netsidecar",
            "ptrace",
            "the sidecar was killed by SIGSYS",
        ),
        (
            "lazaret-supervisor-stage-one",
            "mount",
            "the Runtime Supervisor was killed by SIGSYS",
        ),
        (
            "lazaret-supervisor",
            "bpf",
            "the Domain's pid 1, was killed by SIGSYS",
        ),
        (
            "lazaret-coordinator",
            "kexec_load",
            "the Host Coordinator was killed by SIGSYS",
        ),
    ];
    for (role, call, said) in cases {
        let out = up_attempting(&host, &ws, role, call);
        let told = text(&out);
        if out.status.success() || !told.contains(said) {
            return Err(format!("{role} attempting {call}: {told}").into());
        }
        roles_gone(&host)?;
    }
    // The launch process, once the command it started runs.
    up(&host, &ws)?;
    down(&host, &ws)?;
    let out = up_attempting(&host, &ws, "lazaret-coordinator-launch", "execve");
    if !out.status.success() {
        return Err(format!("up failed: {}", text(&out)).into());
    }
    let sleep = sleep();
    let out = host.lazaret(
        &ws,
        &["attach", "p", "--", "lazaret-escalate", &sleep, "30"],
    );
    assert_eq!(out.status.code(), Some(128 + 31), "{}", text(&out));
    down(&host, &ws)?;
    assert_nothing_left(&host);
    Ok(())
}

/// The credential host of [`resolver_and_proxy`]'s profile.
const API: &str = "api.test.invalid";

fn resolver_and_proxy() -> Result {
    let profile = format!(
        "schema = \"lazaret-trusted-host-config-v2\"\n\
         [profiles.p]\nimage = \"{}\"\npersistent_dirs = []\nallow_hosts = [\"{API}\"]\n\
         [[profiles.p.credentials]]\nenv = \"API_KEY\"\nvalue = \"env:LZ_E2E_KEY\"\n\
         hosts = [\"{API}\"]\n",
        busybox_image()
    );
    let (_serial, host) = host_with_config(&profile);
    let ws = host.workspace.clone();
    TestNet::remove_stale()?;
    let net = TestNet::new()?;
    let address = ALLOWED_NET_HOST.to_string();
    let _dns =
        crate::network::dns_server_for(&net, &host.base().join("dnsmasq.log"), &[(API, &address)])?;
    let key = ("LZ_E2E_KEY", "sk-e2e-confinement-value-0123456789");
    crate::network::up_under_test_dns_with(&host, &[key])?;
    assert_roles_confined(&host, &["lazaret-resolver", "lazaret-credproxy"])?;
    down(&host, &ws)?;
    for (role, call, said) in [
        (
            "lazaret-resolver",
            "mount",
            "Lazaret's resolver was killed by SIGSYS",
        ),
        (
            "lazaret-credproxy",
            "ptrace",
            "the Credential Proxy was killed by SIGSYS",
        ),
    ] {
        let asked = format!("{role}:{call}");
        let env = [key, ("LAZARET_FORBIDDEN_CALL", &asked)];
        match crate::network::up_under_test_dns_with(&host, &env) {
            Ok(()) => return Err(format!("{role} attempting {call}: up succeeded").into()),
            Err(failed) => {
                let told = failed.message().unwrap_or_default().to_owned();
                if !told.contains(said) {
                    return Err(format!("{role} attempting {call}: {told}").into());
                }
            }
        }
        roles_gone(&host)?;
    }
    assert_nothing_left(&host);
    Ok(())
}
