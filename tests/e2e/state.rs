//! `lazaret state` and `lazaret image` end to end, and recovery from the
//! records alone, as the unprivileged test user with real runsc: what a
//! Domain keeps, its changes over the image, the damage `verify` finds,
//! `reset` (refused while running, the bare image after it, the workspace
//! untouched), prepared images listed and pruned, and a crashed Domain
//! cleaned up when its profile no longer loads.

use std::path::{Path, PathBuf};
use std::time::Duration;

use lazaret_tests::domain::{UserHost, busybox_image, ended, other_image, pid_exists, signal};
use libtest_mimic::{Failed, Trial};
use serde_json::Value;

use crate::attach::{attach, run, stdout};
use crate::domain::{Result, down, gated, host_with_config, runnable, text, up, wait_until};

const WAIT: Duration = Duration::from_secs(20);

pub fn trials() -> Vec<Trial> {
    gated(
        runnable(),
        [
            Trial::test(
                "state::list_inspect_verify_and_reset_a_domain",
                list_inspect_reset,
            ),
            Trial::test("state::verify_names_each_kind_of_damage", verify_damage),
            Trial::test(
                "state::a_crashed_domain_recovers_without_its_profile",
                without_profile,
            ),
            Trial::test("state::images_are_listed_and_pruned", images),
            Trial::test("state::a_session_records_its_process_inside", guest_process),
        ],
    )
}

/// Profile `p` on `image` keeping `/root` and `/etc`, then `extra`.
fn config(image: &str, extra: &str) -> String {
    crate::domain::config(image, "\"/root\", \"/etc\"") + extra
}

/// `lazaret ARGS` as the test user, which must succeed; its JSON answer.
fn json(host: &UserHost, ws: &Path, args: &[&str]) -> std::result::Result<Value, Failed> {
    let out = host.lazaret(ws, args);
    if !out.status.success() {
        return Err(format!("lazaret {args:?}: {}", text(&out)).into());
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

fn inside(host: &UserHost, script: &str) -> std::result::Result<String, Failed> {
    let out = run(attach(host, &host.workspace, &["sh", "-c", script]), None)?;
    if !out.status.success() {
        return Err(format!("`{script}` inside: {}", text(&out)).into());
    }
    Ok(stdout(&out))
}

fn domain_dir(host: &UserHost, id: &str) -> PathBuf {
    host.storage().join("domains").join(id)
}

fn list_inspect_reset() -> Result {
    let (_serial, host) = host_with_config(&config(&busybox_image(), ""));
    let ws = host.workspace.clone();
    std::fs::write(ws.join("kept.txt"), b"the developer's\n")?;
    up(&host, &ws)?;
    inside(
        &host,
        "echo tool > /root/tool && rm /etc/group && echo x >> /etc/passwd && echo n > /etc/new",
    )?;

    // Refused while running, and listed as running.
    let out = host.lazaret(&ws, &["state", "reset", "p", "--yes"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is running"),
        "{}",
        text(&out)
    );
    let listed = json(&host, &ws, &["state", "list", "--json"])?;
    assert_eq!(listed["domains"][0]["state"], "running", "{listed}");
    down(&host, &ws)?;

    let listed = json(&host, &ws, &["state", "list", "--json"])?;
    let domain = &listed["domains"][0];
    assert_eq!(domain["profile"], "p", "{listed}");
    assert_eq!(domain["state"], "stopped", "{listed}");
    let dirs: Vec<&str> = domain["persistent_dirs"]
        .as_array()
        .ok_or("no persistent dirs")?
        .iter()
        .filter_map(|d| d["sandbox_path"].as_str())
        .collect();
    assert_eq!(dirs, ["/etc", "/root"], "{listed}");
    assert!(
        domain["image_digest"]
            .as_str()
            .is_some_and(|d| d.len() == 64)
    );

    let inspected = json(&host, &ws, &["state", "inspect", "p", "--json"])?;
    assert_eq!(inspected["compared_with_image"], true, "{inspected}");
    let changes = |path: &str| -> Vec<(String, String)> {
        inspected["anchors"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|a| a["sandbox_path"] == path)
            .flat_map(|a| a["changes"].as_array().cloned().unwrap_or_default())
            .map(|c| {
                (
                    c["kind"].as_str().unwrap_or_default().to_owned(),
                    c["path"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    };
    let etc = changes("/etc");
    for (kind, path) in [
        ("removed", "/group"),
        ("modified", "/passwd"),
        ("added", "/new"),
    ] {
        assert!(
            etc.contains(&(kind.to_owned(), path.to_owned())),
            "/etc{path} is not {kind}: {etc:?}"
        );
    }
    assert!(changes("/root").contains(&("added".into(), "/tool".into())));

    let out = host.lazaret(&ws, &["state", "verify", "p"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    // Without a terminal, reset asks for --yes rather than guessing.
    let out = host.lazaret(&ws, &["state", "reset", "p"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let out = host.lazaret(&ws, &["state", "reset", "p", "--dir", "/usr"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("keeps: /etc, /root"));

    // One dir, then everything; the next `up` has the image's.
    let reset = json(
        &host,
        &ws,
        &["state", "reset", "p", "--dir", "/root", "--yes", "--json"],
    )?;
    assert_eq!(reset["removed"][0]["what"], "/root", "{reset}");
    up(&host, &ws)?;
    let seen = inside(&host, "ls /root; cat /etc/new")?;
    assert_eq!(seen.trim(), "n", "/root is bare again, /etc kept: {seen}");
    down(&host, &ws)?;
    json(&host, &ws, &["state", "reset", "p", "--yes", "--json"])?;
    up(&host, &ws)?;
    let seen = inside(&host, "ls /etc/new 2>&1; grep -c root /etc/group")?;
    assert!(
        seen.contains("No such file") && seen.trim_end().ends_with('1'),
        "{seen}"
    );
    down(&host, &ws)?;
    assert_eq!(std::fs::read(ws.join("kept.txt"))?, b"the developer's\n");
    Ok(())
}

/// The pid of the coordinator `status` reports.
fn coordinator_pid(host: &UserHost, ws: &Path) -> std::result::Result<u64, Failed> {
    host.status(ws, "p")
        .and_then(|s| s["coordinator"]["pid"].as_u64())
        .ok_or_else(|| "no coordinator".into())
}

/// Kills a process of the test user's and waits until it is gone.
fn crash(pid: u64) -> Result {
    signal(pid, "KILL")?;
    wait_until(WAIT, "the killed process to end", || {
        (!pid_exists(pid)).then_some(())
    })
}

fn verify_damage() -> Result {
    let (_serial, host) = host_with_config(&config(&busybox_image(), ""));
    let ws = host.workspace.clone();
    let status = up(&host, &ws)?;
    let id = status["domain_id"]
        .as_str()
        .ok_or("no domain id")?
        .to_owned();
    inside(&host, "echo x > /root/x")?;
    down(&host, &ws)?;

    // A second Domain that crashed and whose state was then deleted: its
    // lease is left without a Domain.
    let other = host.user_dir("other");
    up(&host, &other)?;
    let other_id = host.status(&other, "p").ok_or("other not running")?["domain_id"]
        .as_str()
        .ok_or("no id")?
        .to_owned();
    crash(coordinator_pid(&host, &other)?)?;
    wait_until(WAIT, "the other Domain to stop", || {
        host.status(&other, "p").is_none().then_some(())
    })?;
    std::fs::remove_dir_all(domain_dir(&host, &other_id))?;

    // A preparation whose preparer died: `up` of a new image, killed once
    // its operation is recorded.
    host.write_config(&config(&other_image(), ""));
    let marker = host.user_dir("fault").join("marker");
    let third = host.user_dir("third");
    let marker_arg = marker.display().to_string();
    let mut paused_up = host.spawn_lazaret(
        &third,
        &["up", "p"],
        &[
            ("LAZARET_FAULT_PAUSE", "image:staged"),
            ("LAZARET_FAULT_MARKER", &marker_arg),
        ],
    )?;
    let paused = wait_until(WAIT, "the preparation to pause", || {
        std::fs::read_to_string(&marker).ok()
    });
    if let Ok(pid) = &paused
        && let Ok(pid) = pid.trim().parse::<u64>()
    {
        let _ = signal(pid, "KILL");
    }
    ended(&mut paused_up, WAIT);
    paused?;

    // Damage of this Domain's own: an upper gone, a file someone else owns.
    let anchors = domain_dir(&host, &id).join("anchors");
    std::fs::remove_dir_all(anchors.join("2f726f6f74/upper"))?;
    let foreign = anchors.join("2f657463/upper/planted");
    std::fs::write(&foreign, b"not the sandbox's")?;
    std::os::unix::fs::chown(&foreign, Some(0), Some(0))?;

    host.write_config(&config(&busybox_image(), ""));
    let out = host.lazaret(&ws, &["state", "verify", "p", "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let verified: Value = serde_json::from_slice(&out.stdout)?;
    let kinds: Vec<&str> = verified["findings"]
        .as_array()
        .ok_or("no findings")?
        .iter()
        .filter_map(|f| f["kind"].as_str())
        .collect();
    for kind in [
        "missing-upper",
        "foreign-owner",
        "lease-without-domain",
        "stale-operation",
    ] {
        assert!(kinds.contains(&kind), "no {kind}: {verified}");
    }
    let out = host.lazaret(&ws, &["state", "verify", "p"]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("/etc/planted") && said.contains("uid 0"),
        "{said}"
    );

    // Reset mends what this Domain holds; the next `up` cleans the
    // preparation.
    std::fs::remove_file(&foreign)?;
    json(&host, &ws, &["state", "reset", "p", "--yes", "--json"])?;
    up(&host, &ws)?;
    down(&host, &ws)?;
    let out = host.lazaret(&ws, &["state", "verify", "p", "--json"]);
    let verified: Value = serde_json::from_slice(&out.stdout)?;
    let kinds: Vec<&str> = verified["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f["kind"].as_str())
        .collect();
    assert!(
        !kinds.contains(&"missing-upper") && !kinds.contains(&"stale-operation"),
        "{verified}"
    );
    Ok(())
}

fn without_profile() -> Result {
    let env = "env = { T = \"env:LAZARET_E2E_SECRET\" }\n";
    let (_serial, host) = host_with_config(&config(&busybox_image(), env));
    let ws = host.workspace.clone();
    let out = host.lazaret_with_env(&ws, &["up", "p"], &[("LAZARET_E2E_SECRET", "s")]);
    assert!(out.status.success(), "{}", text(&out));
    let id = host.status(&ws, "p").ok_or("not running")?["domain_id"]
        .as_str()
        .ok_or("no id")?
        .to_owned();
    inside(&host, "echo kept > /root/kept")?;

    // Crashed, then `down` in a shell without the secret.
    crash(coordinator_pid(&host, &ws)?)?;
    let out = host.lazaret(&ws, &["down", "p"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("cleaned up stale generation 1"));
    assert!(lazaret_tests::domain::lazaret_processes(host.uid()).is_empty());

    // Crashed again, then the profile is removed from the configuration.
    let out = host.lazaret_with_env(&ws, &["up", "p"], &[("LAZARET_E2E_SECRET", "s")]);
    assert!(out.status.success(), "{}", text(&out));
    crash(coordinator_pid(&host, &ws)?)?;
    host.write_config("schema = \"lazaret-trusted-host-config-v1\"\n[profiles.q]\nimage = \"x\"\n");
    let listed = json(&host, &ws, &["state", "list", "--json"])?;
    assert_eq!(listed["domains"][0]["state"], "stale", "{listed}");
    let out = host.lazaret(&ws, &["down", "p"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("cleaned up stale generation 2"));
    assert!(lazaret_tests::domain::lazaret_processes(host.uid()).is_empty());

    // By Domain ID alone.
    let prefix = &id[..10];
    let inspected = json(
        &host,
        &ws,
        &["state", "inspect", "--domain", prefix, "--json"],
    )?;
    assert_eq!(inspected["profile"], "p", "{inspected}");
    let reset = json(
        &host,
        &ws,
        &[
            "state", "reset", "--domain", &id, "--dir", "/root", "--yes", "--json",
        ],
    )?;
    assert_eq!(reset["removed"][0]["what"], "/root", "{reset}");
    let out = host.lazaret(&ws, &["state", "inspect", "--domain", "zz"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    Ok(())
}

/// How many images a `image list|prune --json` answer names.
fn image_count(answer: &Value) -> Option<usize> {
    answer["images"].as_array().map(Vec::len)
}

fn images() -> Result {
    let (_serial, host) = host_with_config(&config(&busybox_image(), ""));
    let ws = host.workspace.clone();
    up(&host, &ws)?;
    let listed = json(&host, &ws, &["image", "list", "--json"])?;
    let image = &listed["images"][0];
    assert_eq!(
        image["leased_by"].as_array().map(Vec::len),
        Some(1),
        "{listed}"
    );
    // A leased image stays.
    let pruned = json(&host, &ws, &["image", "prune", "--json"])?;
    assert_eq!(image_count(&pruned), Some(0), "{pruned}");
    down(&host, &ws)?;
    let pruned = json(&host, &ws, &["image", "prune", "--json"])?;
    assert_eq!(image_count(&pruned), Some(1), "{pruned}");
    let listed = json(&host, &ws, &["image", "list", "--json"])?;
    assert_eq!(image_count(&listed), Some(0), "{listed}");
    // The next `up` prepares it again.
    up(&host, &ws)?;
    down(&host, &ws)
}

/// A session's record names its leader inside the sandbox: the pid the
/// process itself sees, shown by `status`.
fn guest_process() -> Result {
    let (_serial, host) = host_with_config(&config(&busybox_image(), ""));
    let ws = host.workspace.clone();
    up(&host, &ws)?;
    let mut session = crate::attach::Running::start(
        attach(&host, &ws, &["sh", "-c", "echo $$ > /root/pid; sleep 20"]),
        None,
    )?;
    let recorded = match wait_until(WAIT, "the session's pid inside", || {
        host.status(&ws, "p")?["sessions"][0]["guest_pid"].as_u64()
    }) {
        Ok(pid) => pid,
        Err(e) => {
            session.kill()?;
            let out = session.finish(WAIT)?;
            return Err(format!("{e:?}; the session: {}", text(&out)).into());
        }
    };
    let seen = inside(&host, "cat /root/pid")?;
    assert_eq!(seen.trim(), recorded.to_string(), "status says {recorded}");
    session.kill()?;
    drop(session);
    down(&host, &ws)
}
