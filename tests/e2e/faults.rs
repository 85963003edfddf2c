//! The fault-injection matrix: at every durable step of `up` and `down`
//! (each participant's intent, what it became, each release intent, an
//! image preparation under way), each participant that is alive then (the
//! CLI, the coordinator, the supervisor, the Workspace Router, slirp4netns,
//! the runsc sandbox and gofer) is killed with SIGKILL; then `down` must
//! clean up and the next `up` must work, with nothing of the Domain left
//! running, no generation directory or mount left, and persistent state
//! intact. The steps are the ones this build reaches, learned from a traced
//! `up` and `down` (debug builds have the pause points; release builds
//! none). Prints the matrix. A second, smaller matrix does the same for a
//! profile with names and a credential, at the steps of Lazaret's
//! resolver and the Credential Proxy, killing those too. Also: ten
//! concurrent `up`s give one generation, and `up` racing `down` ends
//! consistent.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use lazaret_tests::domain::{UserHost, busybox_image, ended, lazaret_processes, signal};
use libtest_mimic::{Failed, Trial};

use crate::attach::{attach, run};
use crate::domain::{Result, down, gated, host_with_config, runnable, text, up, wait_until};

pub fn trials() -> Vec<Trial> {
    gated(
        runnable(),
        [
            Trial::test("faults::every_step_and_participant_recovers", || {
                matrix(&Plan {
                    config: config(),
                    roles: &ROLES,
                    step: |_| true,
                    at_least: 20,
                })
            }),
            Trial::test(
                "faults::the_resolver_and_credential_proxy_steps_recover",
                || {
                    matrix(&Plan {
                        config: names_config(),
                        roles: &NAMES_ROLES,
                        step: |s| s.ends_with(":resolver") || s.ends_with(":credential-proxy"),
                        at_least: 8,
                    })
                },
            ),
            Trial::test("faults::ten_concurrent_ups_make_one_generation", ten_ups),
            Trial::test("faults::up_racing_down_ends_consistent", up_racing_down),
        ],
    )
}

const ROLES: [(&str, &str); 7] = [
    ("cli", ""),
    ("coordinator", "lazaret-coordinator"),
    ("supervisor", "lazaret-supervisor"),
    ("router", "lazaret-router"),
    ("slirp4netns", "slirp4netns"),
    ("sandbox", "runsc-sandbox"),
    ("gofer", "runsc-gofer"),
];

/// The participants a generation with names and credentials adds, and
/// those that start them.
const NAMES_ROLES: [(&str, &str); 5] = [
    ("coordinator", "lazaret-coordinator"),
    ("supervisor", "lazaret-supervisor"),
    ("resolver", "lazaret-resolver"),
    ("proxy", "lazaret-credproxy"),
    ("slirp4netns", "slirp4netns"),
];

fn config() -> String {
    crate::domain::config(&busybox_image(), "\"/root\"")
}

/// A v2 profile with a name and a credential, so that `up` starts
/// Lazaret's resolver and the Credential Proxy. The credential's value is
/// `HOME`, which every `lazaret` the test runs has: recovery's `up`s need
/// no environment of their own.
fn names_config() -> String {
    format!(
        "schema = \"lazaret-trusted-host-config-v2\"\n\
         [profiles.p]\nimage = \"{}\"\npersistent_dirs = [\"/root\"]\n\
         allow_hosts = [\"api.test.invalid\"]\n\
         [[profiles.p.credentials]]\nenv = \"API_KEY\"\nvalue = \"env:HOME\"\n\
         hosts = [\"api.test.invalid\"]\n",
        busybox_image()
    )
}

/// One matrix: the profile, the participants to kill at each step, the
/// steps it pauses at, and the fewest participants it must have killed.
struct Plan {
    config: String,
    roles: &'static [(&'static str, &'static str)],
    step: fn(&str) -> bool,
    at_least: usize,
}

/// The oldest live process of the test user whose command line holds
/// `pattern`.
fn process(uid: u32, pattern: &str) -> Option<u32> {
    let out = Command::new("pgrep")
        .args(["-o", "-u", &uid.to_string(), "-f", pattern])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

/// What a case left behind: processes, generation directories, mounts.
fn leaks(host: &UserHost) -> Vec<String> {
    let mut left = Vec::new();
    // A killed participant's children take a moment to follow it.
    let _ = wait_until(
        Duration::from_secs(5),
        "the Domain's processes to end",
        || lazaret_processes(host.uid()).is_empty().then_some(()),
    );
    left.extend(lazaret_processes(host.uid()));
    let domains = host.runtime.join("lazaret/domains");
    for domain in std::fs::read_dir(&domains).into_iter().flatten().flatten() {
        for entry in std::fs::read_dir(domain.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("gen-") {
                left.push(format!("runtime directory {name}"));
            }
        }
    }
    let base = host.base().display().to_string();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    left.extend(
        mounts
            .lines()
            .filter(|l| l.contains(&base))
            .map(|l| format!("mount {l}")),
    );
    left
}

/// The steps a traced run of `args` reaches, in order.
fn trace(
    host: &UserHost,
    ws: &Path,
    args: &[&str],
    file: &Path,
) -> std::result::Result<Vec<String>, Failed> {
    let _ = std::fs::remove_file(file);
    let env = [("LAZARET_FAULT_TRACE", file.display().to_string())];
    let mut child = host.spawn_lazaret(ws, args, &env)?;
    if !ended(&mut child, Duration::from_secs(60)) {
        return Err(format!("the traced `lazaret {args:?}` did not end").into());
    }
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let mut steps: Vec<String> = Vec::new();
    for step in text.lines() {
        if !steps.iter().any(|s| s == step) {
            steps.push(step.to_owned());
        }
    }
    Ok(steps)
}

struct Case {
    step: String,
    role: &'static str,
    outcome: String,
    leaked: Vec<String>,
}

fn matrix(plan: &Plan) -> Result {
    let (_serial, host) = host_with_config(&plan.config);
    let ws = host.workspace.clone();
    let faults = host.user_dir("faults");
    let marker = faults.join("marker");
    let uid = host.uid();
    // Persistent state every case must keep.
    up(&host, &ws)?;
    let out = run(
        attach(&host, &ws, &["sh", "-c", "echo kept > /root/keep"]),
        None,
    )?;
    assert!(out.status.success(), "{}", text(&out));
    down(&host, &ws)?;
    let keep = host
        .storage()
        .join("domains")
        .read_dir()?
        .flatten()
        .next()
        .ok_or("no Domain state")?
        .path()
        .join("anchors/2f726f6f74/upper/keep");

    // The steps this build has: a traced `up` (with the image prepared
    // again, so its preparation is a step too) and a traced `down`.
    let out = host.lazaret(&ws, &["image", "prune"]);
    assert!(out.status.success(), "{}", text(&out));
    let mut steps: Vec<(String, bool)> = trace(&host, &ws, &["up", "p"], &faults.join("up"))?
        .into_iter()
        .map(|s| (s, false))
        .collect();
    down(&host, &ws)?;
    // A `down`'s release steps happen in the coordinator: learn them from
    // a Domain whose coordinator traces.
    up_traced_down(&host, &ws, &faults.join("release"))?
        .into_iter()
        .for_each(|s| steps.push((s, true)));
    assert!(
        steps.iter().any(|(s, _)| s.starts_with("intent:"))
            && steps.iter().any(|(s, _)| s.starts_with("release:")),
        "the trace names no steps: {steps:?} (is this a debug build?)"
    );

    steps.retain(|(step, _)| (plan.step)(step));
    assert!(
        !steps.is_empty(),
        "the traces reach none of this matrix's steps"
    );
    let mut cases: Vec<Case> = Vec::new();
    for (step, in_down) in &steps {
        if step == "image:staged" {
            let out = host.lazaret(&ws, &["image", "prune"]);
            assert!(out.status.success(), "{}", text(&out));
        }
        for &(role, pattern) in plan.roles {
            let _ = std::fs::remove_file(&marker);
            let env = vec![
                ("LAZARET_FAULT_PAUSE", step.clone()),
                ("LAZARET_FAULT_MARKER", marker.display().to_string()),
            ];
            // The run that reaches the step: `up`, or `down` of a Domain
            // brought up with the pause in its coordinator's environment.
            let mut cli = if *in_down {
                let mut up_cli = host.spawn_lazaret(&ws, &["up", "p"], &env)?;
                if !ended(&mut up_cli, Duration::from_secs(60)) {
                    return Err(format!("up before {step} did not end").into());
                }
                host.spawn_lazaret(&ws, &["down", "p"], &[] as &[(&str, &str)])?
            } else {
                if step == "image:staged" {
                    let _ = host.lazaret(&ws, &["image", "prune"]);
                }
                host.spawn_lazaret(&ws, &["up", "p"], &env)?
            };
            let paused = wait_until(
                Duration::from_secs(30),
                &format!("the pause at {step}"),
                || {
                    std::fs::read_to_string(&marker)
                        .ok()
                        .and_then(|t| t.trim().parse::<u32>().ok())
                },
            );
            let outcome = match paused {
                Err(_) => {
                    let _ = ended(&mut cli, Duration::from_secs(30));
                    "not reached".to_owned()
                }
                Ok(paused) => {
                    let victim = if role == "cli" {
                        Some(cli.id())
                    } else {
                        process(uid, pattern)
                    };
                    let outcome = match victim {
                        Some(pid) => {
                            let _ = signal(u64::from(pid), "KILL");
                            "killed".to_owned()
                        }
                        None => "not running".to_owned(),
                    };
                    if role != "coordinator" {
                        let _ = signal(u64::from(paused), "CONT");
                    }
                    if !ended(&mut cli, Duration::from_secs(60)) {
                        cases.push(Case {
                            step: step.clone(),
                            role,
                            outcome: "the CLI hung".into(),
                            leaked: Vec::new(),
                        });
                    }
                    outcome
                }
            };
            // Recovery: `down`, then a working `up`.
            let mut recovered = true;
            let mut leaked = Vec::new();
            let out = host.lazaret(&ws, &["down", "p"]);
            if !out.status.success() {
                recovered = false;
                leaked.push(format!("down failed: {}", text(&out)));
            }
            leaked.extend(leaks(&host));
            if !keep.exists() {
                leaked.push("persistent state lost".into());
            }
            let out = host.lazaret(&ws, &["up", "p"]);
            if !out.status.success() {
                recovered = false;
                leaked.push(format!("the next up failed: {}", text(&out)));
            }
            let out = host.lazaret(&ws, &["down", "p"]);
            if !out.status.success() {
                recovered = false;
                leaked.push(format!("the next down failed: {}", text(&out)));
            }
            cases.push(Case {
                step: step.clone(),
                role,
                outcome: if recovered {
                    outcome
                } else {
                    format!("{outcome}, not recovered")
                },
                leaked,
            });
            if paused_role_irrelevant(&cases) {
                break;
            }
        }
    }

    println!("\nfault-injection matrix: {} cases", cases.len());
    println!("{:<34} {:<12} {:<26} leaked", "step", "killed", "outcome");
    for case in &cases {
        println!(
            "{:<34} {:<12} {:<26} {}",
            case.step,
            case.role,
            case.outcome,
            if case.leaked.is_empty() {
                "nothing".to_owned()
            } else {
                case.leaked.join("; ")
            }
        );
    }
    let killed = cases
        .iter()
        .filter(|c| c.outcome.starts_with("killed"))
        .count();
    let bad: Vec<&Case> = cases
        .iter()
        .filter(|c| {
            !c.leaked.is_empty()
                || c.outcome.contains("not recovered")
                || c.outcome.contains("hung")
        })
        .collect();
    println!(
        "{killed} participants killed; {} cases leaked or did not recover",
        bad.len()
    );
    if !bad.is_empty() {
        return Err(format!(
            "{} of {} cases did not recover cleanly: {}",
            bad.len(),
            cases.len(),
            bad.iter()
                .map(|c| format!("{} / {}: {} {:?}", c.step, c.role, c.outcome, c.leaked))
                .collect::<Vec<_>>()
                .join(" | ")
        )
        .into());
    }
    assert!(
        killed >= plan.at_least,
        "only {killed} participants were killed: {} cases",
        cases.len()
    );
    Ok(())
}

/// A step not reached once is not reached for any participant: the rest
/// of its row is skipped.
fn paused_role_irrelevant(cases: &[Case]) -> bool {
    cases.last().is_some_and(|c| c.outcome == "not reached")
}

/// The release steps of a `down`, from a Domain whose coordinator traces.
fn up_traced_down(
    host: &UserHost,
    ws: &Path,
    file: &Path,
) -> std::result::Result<Vec<String>, Failed> {
    let _ = std::fs::remove_file(file);
    let env = [("LAZARET_FAULT_TRACE", file.display().to_string())];
    let mut cli = host.spawn_lazaret(ws, &["up", "p"], &env)?;
    if !ended(&mut cli, Duration::from_secs(60)) {
        return Err("the traced up did not end".into());
    }
    let _ = std::fs::remove_file(file);
    down(host, ws)?;
    let text = std::fs::read_to_string(file).unwrap_or_default();
    Ok(text.lines().map(str::to_owned).collect())
}

fn ten_ups() -> Result {
    let (_serial, host) = host_with_config(&config());
    let ws = host.workspace.clone();
    let outputs: Vec<std::process::Output> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..10)
            .map(|_| scope.spawn(|| host.lazaret(&ws, &["up", "p"])))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("up thread"))
            .collect()
    });
    for out in &outputs {
        assert!(out.status.success(), "{}", text(out));
    }
    let started = outputs
        .iter()
        .filter(|o| String::from_utf8_lossy(&o.stdout).contains("is up:"))
        .count();
    assert_eq!(started, 1, "exactly one of ten ups starts a generation");
    let status = host.status(&ws, "p").ok_or("not running")?;
    assert_eq!(status["generation"], 1);
    down(&host, &ws)?;
    assert!(leaks(&host).is_empty());
    Ok(())
}

fn up_racing_down() -> Result {
    let (_serial, host) = host_with_config(&config());
    let ws = host.workspace.clone();
    up(&host, &ws)?;
    for _ in 0..3 {
        let (a, b) = std::thread::scope(|scope| {
            let d = scope.spawn(|| host.lazaret(&ws, &["down", "p"]));
            let u = scope.spawn(|| host.lazaret(&ws, &["up", "p"]));
            (d.join().expect("down"), u.join().expect("up"))
        });
        // Either order is fine; what is left must be one consistent state.
        let running = host.status(&ws, "p").is_some();
        let listed = host.lazaret(&ws, &["state", "list", "--json"]);
        let state: serde_json::Value = serde_json::from_slice(&listed.stdout)?;
        let recorded = state["domains"][0]["state"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(
            (running && recorded == "running") || (!running && recorded == "stopped"),
            "running {running}, recorded {recorded}; down: {}; up: {}",
            text(&a),
            text(&b)
        );
        if running {
            down(&host, &ws)?;
        }
        assert!(leaks(&host).is_empty(), "{:?}", leaks(&host));
        up(&host, &ws)?;
    }
    down(&host, &ws)
}
