//! The Domain lifecycle end to end, as an unprivileged user with real runsc:
//! `up`, `status`, files inside the sandbox, `down`, `up` again; a second
//! `up`; a changed configuration; two Domains on one image; recovery after
//! the coordinator is killed; the lifecycle trials again in a project
//! directory of another group and under a setgid parent. Needs root (to
//! create the test user and group and switch to them) and runsc; CI
//! provides both.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use lazaret_tests::domain::{
    SERIAL, Shape, UserHost, busybox_image, large_image, lazaret_processes, pid_exists,
};
use libtest_mimic::{Failed, Trial};
use serde_json::Value;

pub fn trials() -> Vec<Trial> {
    let shaped: [(&str, ShapedTest); 4] = [
        (
            "domain::state_survives_down_and_up",
            state_survives_down_and_up,
        ),
        (
            "domain::a_second_up_joins_or_refuses",
            a_second_up_joins_or_refuses,
        ),
        (
            "domain::two_domains_share_one_prepared_lower",
            two_domains_share_one_lower,
        ),
        (
            "domain::a_killed_coordinator_is_recovered",
            a_killed_coordinator_is_recovered,
        ),
    ];
    gated(
        runnable(),
        shaped
            .into_iter()
            .flat_map(|(name, test)| in_every_shape(name, test))
            .chain([
                Trial::test(
                    "domain::down_when_not_running_says_so",
                    down_when_not_running,
                ),
                Trial::test(
                    "domain::a_bad_image_fails_cleanly",
                    a_bad_image_fails_cleanly,
                ),
                Trial::test(
                    "domain::a_skopeo_planted_on_path_never_runs",
                    a_planted_skopeo_never_runs,
                ),
                Trial::test("domain::volumes_mount_with_their_access", volumes),
                Trial::test(
                    "domain::name_resolution_works_with_a_persistent_etc",
                    persistent_etc,
                ),
                Trial::test(
                    "domain::loopback_works_beside_the_policy_tap_only",
                    loopback_only,
                ),
                Trial::test("domain::the_coordinator_logs_to_the_journal", journal),
                Trial::test(
                    "domain::environment_reaches_the_sandbox_not_the_disk",
                    environment,
                ),
                Trial::test(
                    "domain::a_killed_supervisor_ends_the_generation",
                    a_killed_supervisor,
                ),
                Trial::test(
                    "domain::unmodified_image_content_follows_the_image",
                    image_content_follows,
                ),
                Trial::test(
                    "domain::up_shows_progress_as_bars_lines_json_or_nothing",
                    up_progress,
                ),
                Trial::test(
                    "domain::tmp_is_bounded_and_full_inside_not_on_the_host",
                    tmp_is_bounded,
                ),
            ]),
    )
}

/// `test` as the trial `name` with the project in the user's own
/// directory, and as `name` with each other [`Shape`]'s suffix: a
/// directory of another group, and one under a setgid parent.
pub(crate) fn in_every_shape(name: &str, test: ShapedTest) -> Vec<Trial> {
    std::iter::once(Shape::Own)
        .chain(Shape::OTHERS)
        .map(|shape| Trial::test(format!("{name}{}", shape.suffix()), move || test(shape)))
        .collect()
}

/// Writes a file and a directory into the top of the workspace `ws` from
/// inside the Domain of `status`; fails unless both reach the host as the
/// user's, with the group the host gives them.
pub(crate) fn writes_reach_the_host(host: &UserHost, status: &Value, ws: &Path) -> Result {
    let out = host.exec(
        status,
        "echo made > /workspace/made-inside && mkdir /workspace/dir-inside && \
         echo deeper > /workspace/dir-inside/file",
    );
    if !out.status.success() {
        return Err(format!("writing the workspace: {}", text(&out)).into());
    }
    for made in ["made-inside", "dir-inside", "dir-inside/file"] {
        let meta = std::fs::metadata(ws.join(made))?;
        let owner = (
            std::os::unix::fs::MetadataExt::uid(&meta),
            std::os::unix::fs::MetadataExt::gid(&meta),
        );
        assert_eq!(owner, (host.uid(), made_group(host)), "{made}");
    }
    assert_eq!(std::fs::read_to_string(ws.join("made-inside"))?, "made\n");
    Ok(())
}

/// The group a file the sandbox makes in the top of `host`'s workspace
/// has on the host: the workspace's own group under a setgid parent (as
/// the host's kernel gives it), the user's primary group otherwise.
pub(crate) fn made_group(host: &UserHost) -> u32 {
    match host.shape() {
        Shape::SetgidParent => host.shape().group().expect("a shape of another group"),
        Shape::Own | Shape::OtherGroup => host.gid(),
    }
}

/// `trials`, ignored unless `runnable` (this machine can run them).
pub(crate) fn gated(runnable: bool, trials: impl IntoIterator<Item = Trial>) -> Vec<Trial> {
    trials
        .into_iter()
        .map(|t| t.with_ignored_flag(!runnable))
        .collect()
}

/// Whether this machine can run the Domain tests; in CI it must.
pub(crate) fn runnable() -> bool {
    let root = rustix::process::getuid().is_root();
    let runsc = Path::new("/usr/bin/runsc").exists();
    if std::env::var_os("CI").is_some() {
        assert!(
            root && runsc,
            "CI must run the Domain tests as root with runsc installed"
        );
    }
    root && runsc
}

pub(crate) type Result = std::result::Result<(), Failed>;

/// A test run in every [`Shape`] of project (see [`in_every_shape`]).
pub(crate) type ShapedTest = fn(Shape) -> Result;

/// The serial lock and a test host with the default one-profile
/// configuration (profile `p`, the busybox image, `/root` persistent).
pub(crate) fn default_host() -> (std::sync::MutexGuard<'static, ()>, UserHost) {
    host_with_config(&config(&busybox_image(), "\"/root\""))
}

/// The serial lock and a test host whose configuration is `text`.
pub(crate) fn host_with_config(text: &str) -> (std::sync::MutexGuard<'static, ()>, UserHost) {
    shaped_host(text, Shape::Own)
}

/// The serial lock and a test host whose configuration is `text` and
/// whose projects have `shape`.
pub(crate) fn shaped_host(
    text: &str,
    shape: Shape,
) -> (std::sync::MutexGuard<'static, ()>, UserHost) {
    let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let host = UserHost::shaped(shape);
    host.write_config(text);
    (serial, host)
}

/// [`shaped_host`] with the default one-profile configuration.
fn default_shaped(shape: Shape) -> (std::sync::MutexGuard<'static, ()>, UserHost) {
    shaped_host(&config(&busybox_image(), "\"/root\""), shape)
}

/// Polls `probe` every 100 ms until it yields a value, for at most
/// `timeout`; the error names `what` was awaited.
pub(crate) fn wait_until<T>(
    timeout: Duration,
    what: &str,
    mut probe: impl FnMut() -> Option<T>,
) -> std::result::Result<T, Failed> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = probe() {
            return Ok(value);
        }
        if Instant::now() >= deadline {
            return Err(format!("timed out after {timeout:?} waiting for {what}").into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Fails when a live process of the test user still runs Lazaret or runsc.
pub(crate) fn assert_nothing_left(host: &UserHost) {
    let left = lazaret_processes(host.uid());
    assert!(left.is_empty(), "left running: {left:?}");
}

pub(crate) fn config(image: &str, persistent: &str) -> String {
    format!(
        "schema = \"lazaret-trusted-host-config-v1\"\n\
         [profiles.p]\nimage = \"{image}\"\npersistent_dirs = [{persistent}]\n"
    )
}

pub(crate) fn text(output: &std::process::Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

pub(crate) fn up(host: &UserHost, cwd: &Path) -> std::result::Result<Value, Failed> {
    let out = host.lazaret(cwd, &["up", "p"]);
    if !out.status.success() {
        return Err(format!("up failed: {}", text(&out)).into());
    }
    host.status(cwd, "p")
        .ok_or_else(|| "status shows no running Domain after up".into())
}

pub(crate) fn down(host: &UserHost, cwd: &Path) -> Result {
    let out = host.lazaret(cwd, &["down", "p"]);
    if !out.status.success() {
        return Err(format!("down failed: {}", text(&out)).into());
    }
    Ok(())
}

fn state_survives_down_and_up(shape: Shape) -> Result {
    let (_serial, host) = default_shaped(shape);
    let ws = host.workspace.clone();

    let status = up(&host, &ws)?;
    assert_eq!(status["state"], "running", "{status}");
    assert_eq!(status["generation"], 1);
    assert_eq!(status["persistent_dirs"], serde_json::json!(["/root"]));
    let out = host.exec(
        &status,
        "echo kept > /root/persist.txt && echo gone > /tmp/ephemeral.txt && \
         echo shared > /workspace/from-sandbox.txt && id -u",
    );
    assert!(out.status.success(), "exec: {}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "0",
        "root inside the sandbox"
    );

    down(&host, &ws)?;
    // `down` returns once the coordinator has released the generation and
    // answered; the coordinator then exits, within a bound.
    for process in ["coordinator", "supervisor", "sandbox"] {
        let pid = status[process]["pid"].as_u64().unwrap();
        wait_until(
            Duration::from_secs(2),
            &format!("the {process} (pid {pid}) to end after down"),
            || (!pid_exists(pid)).then_some(()),
        )?;
    }
    let host_file = ws.join("from-sandbox.txt");
    assert_eq!(std::fs::read_to_string(&host_file)?, "shared\n");
    let made = std::fs::metadata(&host_file)?;
    assert_eq!(
        std::os::unix::fs::MetadataExt::uid(&made),
        host.uid(),
        "workspace files belong to the invoking user"
    );
    assert_eq!(
        std::os::unix::fs::MetadataExt::gid(&made),
        made_group(&host),
        "workspace files have the group the host gives them"
    );

    let status = up(&host, &ws)?;
    assert_eq!(status["generation"], 2);
    let out = host.exec(
        &status,
        "cat /root/persist.txt; test -e /tmp/ephemeral.txt && echo tmp-kept || echo tmp-gone",
    );
    assert!(out.status.success(), "exec: {}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "kept\ntmp-gone\n");
    down(&host, &ws)?;
    assert_nothing_left(&host);
    Ok(())
}

fn a_second_up_joins_or_refuses(shape: Shape) -> Result {
    let image = busybox_image();
    let (_serial, host) = shaped_host(&config(&image, "\"/root\""), shape);
    let ws = host.workspace.clone();
    let first = up(&host, &ws)?;
    writes_reach_the_host(&host, &first, &ws)?;

    let again = host.lazaret(&ws, &["up", "p"]);
    assert!(again.status.success(), "{}", text(&again));
    assert!(
        String::from_utf8_lossy(&again.stdout).contains("already up"),
        "{}",
        text(&again)
    );
    let status = host.status(&ws, "p").ok_or("not running")?;
    assert_eq!(status["generation"], first["generation"]);

    host.write_config(&config(&image, "\"/root\", \"/opt\""));
    let changed = host.lazaret(&ws, &["up", "p"]);
    assert_eq!(changed.status.code(), Some(1), "{}", text(&changed));
    let err = String::from_utf8_lossy(&changed.stderr);
    assert!(
        err.contains("persistent_dirs"),
        "the difference is named: {err}"
    );
    assert!(err.contains("lazaret down p"), "{err}");
    down(&host, &ws)?;
    Ok(())
}

fn two_domains_share_one_lower(shape: Shape) -> Result {
    let (_serial, host) = default_shaped(shape);
    let first_ws = host.workspace.clone();
    let second_ws = host.project("second-project");
    let first = up(&host, &first_ws)?;
    let second = up(&host, &second_ws)?;
    writes_reach_the_host(&host, &first, &first_ws)?;
    writes_reach_the_host(&host, &second, &second_ws)?;
    assert_ne!(first["domain_id"], second["domain_id"]);
    assert_eq!(first["manifest_digest"], second["manifest_digest"]);
    let artifacts = host.storage().join("catalog/artifacts");
    let count = std::fs::read_dir(&artifacts)?.count();
    assert_eq!(count, 1, "one prepared lower in {}", artifacts.display());
    let all = host.lazaret(&first_ws, &["status", "--all", "--json"]);
    let listed: Value = serde_json::from_slice(&all.stdout)?;
    assert_eq!(
        listed["domains"].as_array().map(Vec::len),
        Some(2),
        "{listed}"
    );
    down(&host, &first_ws)?;
    down(&host, &second_ws)?;
    Ok(())
}

fn a_killed_coordinator_is_recovered(shape: Shape) -> Result {
    let (_serial, host) = default_shaped(shape);
    let ws = host.workspace.clone();
    let status = up(&host, &ws)?;
    let coordinator = status["coordinator"]["pid"].as_u64().unwrap();
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &coordinator.to_string()])
        .status()?;
    assert!(killed.success());
    let out = host.lazaret(&ws, &["down", "p"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("cleaned up stale generation 1"),
        "{}",
        text(&out)
    );
    for process in ["coordinator", "supervisor", "sandbox"] {
        let pid = status[process]["pid"].as_u64().unwrap();
        assert!(
            !pid_exists(pid),
            "the {process} (pid {pid}) survived recovery"
        );
    }
    assert_nothing_left(&host);
    let again = up(&host, &ws)?;
    assert_eq!(again["generation"], 2);
    writes_reach_the_host(&host, &again, &ws)?;
    down(&host, &ws)?;
    Ok(())
}

fn down_when_not_running() -> Result {
    let (_serial, host) = default_host();
    let out = host.lazaret(&host.workspace, &["down", "p"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("is not running"),
        "{}",
        text(&out)
    );
    Ok(())
}

fn a_bad_image_fails_cleanly() -> Result {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let host = UserHost::new();
    let missing = host.base().join("no-such-layout");
    host.write_config(&config(
        &format!("oci:{}:latest", missing.display()),
        "\"/root\"",
    ));
    let out = host.lazaret(&host.workspace, &["up", "p"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("up failed at image"), "{err}");
    assert!(host.status(&host.workspace, "p").is_none(), "nothing runs");
    assert_nothing_left(&host);
    Ok(())
}

/// Host programs are found at fixed paths, never through `PATH`: a
/// `skopeo` first on the developer's `PATH` (a workspace's `.venv/bin`,
/// which the sandbox can write) is never run for a registry image.
fn a_planted_skopeo_never_runs() -> Result {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let host = UserHost::new();
    host.write_config(&config("registry.invalid/lazaret/planted:1", "\"/root\""));
    let planted = host.workspace.join(".venv/bin");
    std::fs::create_dir_all(&planted)?;
    let ran = host.user_dir("marks").join("planted-skopeo-ran");
    let skopeo = planted.join("skopeo");
    std::fs::write(
        &skopeo,
        format!("#!/bin/sh\ntouch {}\nexit 1\n", ran.display()),
    )?;
    std::fs::set_permissions(&skopeo, std::fs::Permissions::from_mode(0o755))?;
    let path = format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", planted.display());

    let out = host.lazaret_with_env(&host.workspace, &["up", "p"], &[("PATH", &path)]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(!ran.exists(), "the planted skopeo ran: {}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("registry.invalid"), "{err}");
    assert_nothing_left(&host);
    Ok(())
}

fn a_killed_supervisor() -> Result {
    let (_serial, host) = default_host();
    let ws = host.workspace.clone();
    let status = up(&host, &ws)?;
    let supervisor = status["supervisor"]["pid"].as_u64().unwrap();
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &supervisor.to_string()])
        .status()?;
    assert!(killed.success());
    // The coordinator sees its supervisor die, releases the generation and
    // exits; nothing of the Domain remains.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while ["coordinator", "namespace_holder", "sandbox"]
        .iter()
        .any(|p| pid_exists(status[*p]["pid"].as_u64().unwrap()))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the Domain outlived its supervisor"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(host.status(&ws, "p").is_none());
    assert_nothing_left(&host);
    let again = up(&host, &ws)?;
    assert_eq!(again["generation"], 2);
    down(&host, &ws)?;
    Ok(())
}

fn image_content_follows() -> Result {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let host = UserHost::new();
    // Two images that differ in /root: the Domain's own file under /root
    // stays, and the image's file follows the image.
    let image_dir = host.base().join("images");
    let build = |tag: &str, marker: &str| -> Result {
        let rootfs_extra = host.base().join(format!("extra-{tag}"));
        std::fs::create_dir_all(rootfs_extra.join("root"))?;
        std::fs::write(rootfs_extra.join("root/image-marker"), marker)?;
        let out = std::process::Command::new("bash")
            .arg(lazaret_tests::domain::repo_root().join("packaging/build-busybox-image.sh"))
            .arg(&image_dir)
            .arg(tag)
            .env("LAZARET_IMAGE_EXTRA", &rootfs_extra)
            .output()?;
        if !out.status.success() {
            return Err(format!("image build: {}", text(&out)).into());
        }
        Ok(())
    };
    build("one", "first")?;
    build("two", "second")?;
    let _ = std::process::Command::new("chmod")
        .args(["-R", "a+rX"])
        .arg(&image_dir)
        .status();
    let ws = host.workspace.clone();
    let image = |tag: &str| format!("oci:{}:{tag}", image_dir.display());

    host.write_config(&config(&image("one"), "\"/root\""));
    let status = up(&host, &ws)?;
    let out = host.exec(&status, "cat /root/image-marker; echo mine > /root/own");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "first",
        "{}",
        text(&out)
    );
    down(&host, &ws)?;

    host.write_config(&config(&image("two"), "\"/root\""));
    let status = up(&host, &ws)?;
    let out = host.exec(&status, "cat /root/image-marker; echo; cat /root/own");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "second\nmine\n",
        "{}",
        text(&out)
    );
    down(&host, &ws)?;
    Ok(())
}

fn environment() -> Result {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let host = UserHost::new();
    let secret = "sk-e2e-secret-7f3a9c";
    host.write_config(&format!(
        "{}env = {{ API_TOKEN = \"env:E2E_API_TOKEN\" }}\n",
        config(&busybox_image(), "\"/root\"")
    ));
    let ws = host.workspace.clone();
    let out = host.lazaret_with_env(
        &ws,
        &["up", "p"],
        &[
            ("E2E_API_TOKEN", secret),
            ("E2E_UNRELATED", "not-passed-on"),
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(!text(&out).contains(secret), "up printed the value");
    let status = host.status(&ws, "p").ok_or("not running")?;
    // The coordinator sees the variables the profile references and its
    // allow-list, not the rest of the CLI's environment.
    let coordinator = status["coordinator"]["pid"]
        .as_u64()
        .ok_or("no coordinator pid")?;
    let environ = std::fs::read(format!("/proc/{coordinator}/environ"))?;
    let names: Vec<String> = environ
        .split(|&b| b == 0)
        .filter_map(|v| v.split(|&b| b == b'=').next())
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .collect();
    assert!(names.iter().any(|n| n == "E2E_API_TOKEN"), "{names:?}");
    assert!(names.iter().any(|n| n == "HOME"), "{names:?}");
    assert!(
        !names.iter().any(|n| n == "E2E_UNRELATED" || n == "PATH"),
        "{names:?}"
    );
    let inside = host.exec(&status, "tr '\\0' '\\n' < /proc/1/environ");
    let environ = String::from_utf8_lossy(&inside.stdout).into_owned();
    assert!(
        environ.lines().any(|l| l == format!("API_TOKEN={secret}")),
        "{}",
        text(&inside)
    );
    // Nothing the host can read on disk holds the value: not the stores,
    // not the logs, not the runtime directory.
    host.assert_nowhere_on_disk(secret);
    down(&host, &ws)?;
    Ok(())
}

fn volumes() -> Result {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let host = UserHost::new();
    let shared = host.user_dir("shared");
    let notes = shared.join("notes.txt");
    std::fs::write(&notes, "read me\n")?;
    host.write_config(&format!(
        "{}volumes = [\n\
         {{ host = \"{{profile_dir}}/state\", container = \"/root/state\", kind = \"directory\", create = true }},\n\
         {{ host = \"{}\", container = \"/root/notes.txt\", kind = \"file\", access = \"read-only\" }},\n]\n",
        config(&busybox_image(), "\"/root\""),
        notes.display()
    ));
    let ws = host.workspace.clone();
    let status = up(&host, &ws)?;
    let out = host.exec(
        &status,
        "echo kept > /root/state/file && cat /root/notes.txt && \
         (echo no >> /root/notes.txt 2>/dev/null && echo WRITABLE || echo read-only)",
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "read me\nread-only\n",
        "{}",
        text(&out)
    );
    let state = host.storage().join("profiles/p/state/file");
    assert_eq!(std::fs::read_to_string(&state)?, "kept\n");
    assert_eq!(std::fs::read_to_string(&notes)?, "read me\n");

    // Read-only in the Domain mount namespace too, not only in the
    // sandbox's view: the read-only volume and the control area.
    let holder = status["namespace_holder"]["pid"]
        .as_u64()
        .ok_or("no holder pid")?;
    let mountinfo = std::fs::read_to_string(format!("/proc/{holder}/mountinfo"))?;
    let options = |suffix: &str| -> std::result::Result<String, String> {
        mountinfo
            .lines()
            .map(|l| l.split(' ').collect::<Vec<_>>())
            .find(|f| f.len() > 5 && f[4].ends_with(suffix))
            .map(|f| f[5].to_owned())
            .ok_or(format!("no mount at *{suffix} in:\n{mountinfo}"))
    };
    for (suffix, access) in [
        ("/mnt/volume/0", "rw"),
        ("/mnt/volume/1", "ro"),
        ("/mnt/control", "ro"),
    ] {
        let options = options(suffix)?;
        assert!(options.starts_with(access), "{suffix}: {options}");
    }

    // The root filesystem's ephemeral upper is bounded: a 2 GiB write
    // stops at it, and the sandbox goes on.
    let out = host.exec(
        &status,
        "dd if=/dev/zero of=/fill bs=1M count=2048 2>&1; echo rc=$?; \
         du -m /fill | cut -f1; rm -f /fill; echo ok > /after && cat /after",
    );
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains("No space left") && !shown.contains("rc=0"),
        "{}",
        text(&out)
    );
    assert!(shown.ends_with("ok\n"), "{}", text(&out));

    // `status` shows what the uppers hold: 3 MiB kept in /root, 2 MiB in
    // the rest of the root until `down`, of its 1 GiB.
    let out = host.exec(
        &status,
        "head -c 3145728 /dev/zero > /root/kept && head -c 2097152 /dev/zero > /scratch",
    );
    assert!(out.status.success(), "{}", text(&out));
    let storage = host.status(&ws, "p").ok_or("not running")?["storage"].clone();
    let ephemeral = &storage["ephemeral_upper"];
    assert_eq!(ephemeral["size_bytes"], 1u64 << 30, "{storage}");
    assert!(
        ephemeral["used_bytes"].as_u64() >= Some(2 << 20),
        "{storage}"
    );
    let root = storage["persistent_uppers"]
        .as_array()
        .and_then(|a| a.iter().find(|p| p["sandbox_path"] == "/root"))
        .ok_or(format!("no /root upper in {storage}"))?;
    assert!(root["bytes"].as_u64() >= Some(3 << 20), "{storage}");

    // `up` reports without walking the State Anchor (which would delay it
    // by up to 200 ms): its final status has the ephemeral upper's figure
    // alone, and `status` walks.
    down(&host, &ws)?;
    let out = host.lazaret(&ws, &["up", "p", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let ready: Value = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .and_then(|line| serde_json::from_str(line).ok())
        .ok_or(format!("no outcome line: {}", text(&out)))?;
    assert_eq!(ready["event"], "ready", "{ready}");
    let storage = &ready["status"]["storage"];
    assert_eq!(
        storage["persistent_uppers"],
        serde_json::json!([]),
        "{ready}"
    );
    assert_eq!(
        storage["ephemeral_upper"]["size_bytes"],
        1u64 << 30,
        "{ready}"
    );
    let storage = host.status(&ws, "p").ok_or("not running")?["storage"].clone();
    assert!(
        storage["persistent_uppers"].as_array().is_some_and(|a| a
            .iter()
            .any(|p| p["sandbox_path"] == "/root" && p["bytes"].as_u64() >= Some(3 << 20))),
        "{storage}"
    );
    down(&host, &ws)?;
    Ok(())
}

/// `/etc/resolv.conf` is a link to the control area's read-only
/// `resolv.conf`, so a persistent `/etc` is accepted and keeps what the
/// sandbox writes there, while every `up` puts the link back.
fn persistent_etc() -> Result {
    let (_serial, host) = host_with_config(&config(&busybox_image(), "\"/root\", \"/etc\""));
    let ws = host.workspace.clone();
    let status = up(&host, &ws)?;
    let out = host.exec(
        &status,
        "readlink /etc/resolv.conf; cat /etc/resolv.conf; \
         (echo x > /run/lazaret/resolv.conf) 2>/dev/null && echo WRITABLE; \
         echo kept > /etc/kept; rm /etc/resolv.conf; \
         echo 'nameserver 198.18.0.1' > /etc/resolv.conf",
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "../run/lazaret/resolv.conf\nnameserver 10.0.2.3\n",
        "{}",
        text(&out)
    );
    down(&host, &ws)?;
    let status = up(&host, &ws)?;
    let out = host.exec(&status, "cat /etc/kept /etc/resolv.conf");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "kept\nnameserver 10.0.2.3\n",
        "{}",
        text(&out)
    );
    down(&host, &ws)?;
    Ok(())
}

fn loopback_only() -> Result {
    let (_serial, host) = default_host();
    let ws = host.workspace.clone();
    let status = up(&host, &ws)?;
    // A server on loopback answers; the only other interface is the
    // connectivity helper's tap device.
    let out = host.exec(
        &status,
        "(nc -l -p 4444 -e echo pong &) ; sleep 0.5; echo ping | nc 127.0.0.1 4444; \
         ls /sys/class/net 2>/dev/null || ip -o link | cut -d: -f2",
    );
    let text_out = String::from_utf8_lossy(&out.stdout);
    assert!(text_out.starts_with("pong\n"), "{}", text(&out));
    // gVisor lists the interfaces in no fixed order.
    let mut interfaces = text_out.lines().skip(1).map(str::trim).collect::<Vec<_>>();
    interfaces.sort_unstable();
    assert_eq!(interfaces, ["lo", "tap0"], "{}", text(&out));
    down(&host, &ws)?;
    Ok(())
}

/// The fields of one journal datagram in the native protocol: `NAME=value`
/// lines, or `NAME`, a little-endian 64-bit length and the bytes for a
/// value that may hold newlines.
fn journal_fields(mut datagram: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut fields = Vec::new();
    while !datagram.is_empty() {
        let Some(end) = datagram.iter().position(|&b| b == b'\n') else {
            break;
        };
        let line = &datagram[..end];
        if let Some(eq) = line.iter().position(|&b| b == b'=') {
            let name = String::from_utf8_lossy(&line[..eq]).into_owned();
            fields.push((name, line[eq + 1..].to_vec()));
            datagram = &datagram[end + 1..];
        } else {
            let name = String::from_utf8_lossy(line).into_owned();
            let rest = &datagram[end + 1..];
            let Some((len, rest)) = rest.split_first_chunk::<8>() else {
                break;
            };
            let len = usize::try_from(u64::from_le_bytes(*len)).unwrap_or(usize::MAX);
            let Some(value) = rest.get(..len) else { break };
            fields.push((name, value.to_vec()));
            datagram = rest.get(len + 1..).unwrap_or_default();
        }
    }
    fields
}

fn field<'a>(fields: &'a [(String, Vec<u8>)], name: &str) -> Option<&'a [u8]> {
    fields
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_slice())
}

fn journal() -> Result {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let host = UserHost::new();
    let secret = "sk-journal-secret-4b1d";
    host.write_config(&format!(
        "{}env = {{ API_TOKEN = \"env:E2E_API_TOKEN\" }}\n",
        config(&busybox_image(), "\"/root\"")
    ));
    let ws = host.workspace.clone();
    // A journal socket this test owns stands in for systemd's: the
    // coordinator runs in a mount namespace where it sits at the system
    // path.
    let socket_path = host.base().join("journal.socket");
    let journal = std::os::unix::net::UnixDatagram::bind(&socket_path)?;
    std::os::unix::fs::chown(&socket_path, Some(host.uid()), None)?;
    journal.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
    // The journal reads as the coordinator writes, as systemd's does.
    let reader = std::thread::spawn(move || {
        let mut entries = Vec::new();
        let mut buf = vec![0u8; 65536];
        while !entries
            .iter()
            .any(|e: &Vec<u8>| String::from_utf8_lossy(e).contains("session ended"))
        {
            let Ok(n) = journal.recv(&mut buf) else { break };
            entries.push(buf[..n].to_vec());
        }
        entries
    });
    let script = format!(
        "mount -t tmpfs -o mode=755 tmpfs /run && mkdir -p /run/systemd/journal && \
         touch /run/systemd/journal/socket && \
         mount --bind '{}' /run/systemd/journal/socket && exec \"$@\"",
        socket_path.display()
    );
    let token = format!("E2E_API_TOKEN={secret}");
    let words = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        script.as_str(),
        "sh",
        "env",
        token.as_str(),
    ];
    let wrapper: Vec<&std::ffi::OsStr> = words.iter().map(std::ffi::OsStr::new).collect();
    let out = host.lazaret_under(&wrapper, &ws, &["up", "p"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let status = host.status(&ws, "p").ok_or("not running")?;
    let domain = status["domain_id"].as_str().unwrap().to_owned();
    let attached = host.lazaret(&ws, &["attach", "p", "--", "true"]);
    assert!(attached.status.success(), "{}", text(&attached));
    let logs = host.lazaret_under(&wrapper, &ws, &["logs", "p"], &[]);
    let out = host.lazaret(&ws, &["down", "p"]);
    assert!(out.status.success(), "{}", text(&out));
    let entries = reader.join().map_err(|_| "the journal reader failed")?;

    let parsed: Vec<Vec<(String, Vec<u8>)>> = entries.iter().map(|e| journal_fields(e)).collect();
    let message = |fields: &[(String, Vec<u8>)]| {
        field(fields, "MESSAGE").map(|m| String::from_utf8_lossy(m).into_owned())
    };
    // One record per event.
    let running: Vec<_> = parsed
        .iter()
        .filter(|f| message(f).as_deref() == Some("generation 1 running"))
        .collect();
    assert_eq!(running.len(), 1, "{parsed:?}");
    let running = running[0];
    assert_eq!(field(running, "LAZARET_DOMAIN"), Some(domain.as_bytes()));
    assert_eq!(field(running, "LAZARET_PROFILE"), Some(&b"p"[..]));
    assert_eq!(field(running, "LAZARET_GENERATION"), Some(&b"1"[..]));
    assert_eq!(
        field(running, "SYSLOG_IDENTIFIER"),
        Some(&b"lazaret-coordinator"[..])
    );
    assert!(field(running, "PRIORITY").is_some(), "{running:?}");
    // A session's events carry its id as well.
    let opened = parsed
        .iter()
        .find(|f| message(f).as_deref() == Some("session opened"))
        .ok_or_else(|| format!("no session entry: {parsed:?}"))?;
    let session = field(opened, "LAZARET_SESSION").ok_or("no session field")?;
    assert_eq!(session.len(), 32, "{opened:?}");
    assert_eq!(field(opened, "LAZARET_DOMAIN"), Some(domain.as_bytes()));
    assert_eq!(field(opened, "LAZARET_GENERATION"), Some(&b"1"[..]));
    // Newlines stay inside one field.
    let started = parsed
        .iter()
        .filter_map(|f| message(f))
        .find(|m| m.starts_with("coordinator for Domain"))
        .ok_or("no start entry")?;
    assert!(started.contains("\n  workspace: "), "{started:?}");
    // No entry holds the value of an `env:` reference.
    for entry in &entries {
        assert!(
            !String::from_utf8_lossy(entry).contains(secret),
            "the journal got the secret"
        );
    }
    assert!(
        String::from_utf8_lossy(&logs.stdout).contains("journalctl LAZARET_DOMAIN=")
            || logs.status.success(),
        "{}",
        text(&logs)
    );
    Ok(())
}

/// `up` preparing an image: a bar with bytes on a terminal, plain lines
/// on a pipe, JSON lines with `--json`, nothing with `--quiet`. Each mode
/// gets a fresh host, so each prepares the image.
fn up_progress() -> Result {
    let image = large_image();
    let fresh = || host_with_config(&config(&image, "\"/root\""));

    // A pipe: one line per step and per tenth of a measured one, no
    // terminal control.
    {
        let (_serial, host) = fresh();
        let ws = host.workspace.clone();
        let out = host.lazaret(&ws, &["up", "p"]);
        let (_, stdout, stderr) = (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(out.status.success(), "{stderr}");
        assert!(stdout.contains("is up"), "{stdout}");
        assert!(
            !stderr.contains('\r') && !stderr.contains('\x1b'),
            "{stderr:?}"
        );
        let image_lines = stderr
            .lines()
            .filter(|l| l.trim_start().starts_with("image"))
            .count();
        assert!(
            (3..=40).contains(&image_lines),
            "{image_lines} image lines: {stderr}"
        );
        assert!(stderr.contains("MiB"), "{stderr}");
        down(&host, &ws)?;
    }

    // --json: every line an object; progress with bytes, then the outcome.
    {
        let (_serial, host) = fresh();
        let ws = host.workspace.clone();
        let out = host.lazaret(&ws, &["up", "p", "--json"]);
        assert!(out.status.success(), "{}", text(&out));
        assert!(out.stderr.is_empty(), "{}", text(&out));
        let events: Vec<Value> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(serde_json::from_str)
            .collect::<std::result::Result<_, _>>()?;
        let measured = events
            .iter()
            .filter(|e| {
                e["event"] == "progress"
                    && e["step"] == "image"
                    && e["total"].as_u64() > Some(8 << 20)
            })
            .count();
        assert!(measured >= 2, "{events:?}");
        let last = events.last().ok_or("no events")?;
        assert_eq!(last["event"], "ready", "{last}");
        assert_eq!(last["status"]["state"], "running", "{last}");
        let again = host.lazaret(&ws, &["up", "p", "--json"]);
        let last = String::from_utf8_lossy(&again.stdout)
            .lines()
            .last()
            .unwrap_or_default()
            .to_owned();
        let line: Value = serde_json::from_str(&last)?;
        assert_eq!(line["event"], "already_running", "{line}");
        down(&host, &ws)?;
    }

    // --quiet: nothing at all on success.
    {
        let (_serial, host) = fresh();
        let ws = host.workspace.clone();
        let out = host.lazaret(&ws, &["up", "p", "--quiet"]);
        assert!(out.status.success(), "{}", text(&out));
        assert!(
            out.stdout.is_empty() && out.stderr.is_empty(),
            "{}",
            text(&out)
        );
        down(&host, &ws)?;
    }

    // A terminal: the bar, with bytes done of the total.
    {
        let (_serial, host) = fresh();
        let ws = host.workspace.clone();
        let dir = host.user_dir("tmux");
        let tmux = crate::attach::Tmux {
            host: &host,
            dir: dir.clone(),
            cwd: ws.clone(),
        };
        let pane = format!(
            "{} up p; echo UP=$?; sleep 60",
            lazaret_tests::bin("lazaret").display()
        );
        tmux.start(160, 30, &pane)?;
        let screen = tmux
            .poll(Duration::from_secs(60), |s| s.contains("UP="))?
            .map_err(|s| format!("no outcome: {s}"))?;
        assert!(screen.contains("UP=0"), "{screen}");
        let bar = screen
            .lines()
            .find(|l| l.trim_start().starts_with("image") && l.contains('['))
            .ok_or_else(|| format!("no bar: {screen}"))?;
        assert!(bar.contains('#') && bar.contains("MiB/"), "{bar}");
        drop(tmux);
        down(&host, &ws)?;
    }
    Ok(())
}

/// The memory the runsc sandbox process holds in memory files (gVisor's
/// memory for everything inside, its tmpfs pages included): the allocated
/// bytes of each memfd it has open, counted once.
fn sandbox_memory(pid: u64) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut seen = std::collections::BTreeSet::new();
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().starts_with("/memfd:"))
        })
        .filter_map(|e| std::fs::metadata(e.path()).ok())
        .filter(|m| seen.insert(m.ino()))
        .map(|m| m.blocks() * 512)
        .sum()
}

/// `/tmp` inside is a tmpfs of 1 GiB: writing 1.3 GB there fails with
/// ENOSPC inside, and the sandbox's memory grows by no more than the
/// bound; removing the file makes room again.
fn tmp_is_bounded() -> Result {
    const GIB: u64 = 1 << 30;
    let (_serial, host) = default_host();
    let ws = host.workspace.clone();
    let status = up(&host, &ws)?;
    let sandbox = status["sandbox"]["pid"].as_u64().ok_or("no sandbox pid")?;
    let before = sandbox_memory(sandbox);
    let out = host.exec(
        &status,
        "df -k /tmp | tail -1; dd if=/dev/zero of=/tmp/fill bs=1M count=1300 2>&1; \
         ls -l /tmp/fill",
    );
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    let grew = sandbox_memory(sandbox).saturating_sub(before);
    eprintln!("/tmp: {said}; the sandbox's memory grew by {grew} bytes");
    assert!(
        said.contains("No space left on device"),
        "writing past the bound fails inside: {}",
        text(&out)
    );
    let size_kib: u64 = said
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .ok_or(format!("no size in `df`: {said}"))?;
    assert_eq!(size_kib, GIB / 1024, "df shows the bound: {said}");
    assert!(
        (GIB / 2..GIB + GIB / 10).contains(&grew),
        "the sandbox's memory grew by {grew} bytes for a 1 GiB /tmp (the measure must see the \
         file's memory, and no more than the bound)"
    );
    let out = host.exec(
        &status,
        "rm /tmp/fill && echo room > /tmp/again && cat /tmp/again",
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "room\n",
        "{}",
        text(&out)
    );
    down(&host, &ws)?;
    Ok(())
}
