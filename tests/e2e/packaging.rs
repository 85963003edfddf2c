//! What ships beside the binaries, as a user meets it: `config init
//! --agent` (written, appended, never losing the file), shell completions
//! that complete, man pages that `man` renders, and `export kube` manifests
//! that a Kubernetes schema validator accepts and whose NetworkPolicy
//! decides as the profile's policy does.

use std::net::Ipv4Addr;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Command;

use lazaret_tests::{Scratch, run, text};
use libtest_mimic::Trial;
use serde_json::Value;

pub fn trials() -> Vec<Trial> {
    vec![
        Trial::test(
            "packaging::init_agent_writes_then_appends_profiles",
            init_agent,
        ),
        Trial::test("packaging::completions_complete_in_bash", bash_completion),
        Trial::test("packaging::man_pages_render", man_pages).with_ignored_flag(!has("man")),
        Trial::test(
            "packaging::export_kube_validates_and_keeps_the_policy",
            export_kube,
        )
        .with_ignored_flag(validator().is_none()),
        Trial::test("packaging::an_agent_image_runs_its_agent", agent_image)
            .with_ignored_flag(!crate::domain::runnable() || agent_image_ref().is_none()),
        Trial::test(
            "packaging::the_other_agent_images_run_their_agents",
            other_agents,
        )
        .with_ignored_flag(!crate::domain::runnable() || other_agent_images().is_none()),
    ]
}

/// The agent image CI builds (`LAZARET_AGENT_IMAGE=oci:DIR:claude`, made
/// with packaging/images/build-agent-image.sh and readable by every user).
pub(crate) fn agent_image_ref() -> Option<String> {
    let image = std::env::var("LAZARET_AGENT_IMAGE").ok();
    if std::env::var_os("CI").is_some() {
        assert!(
            image.is_some(),
            "CI must build an agent image and set LAZARET_AGENT_IMAGE"
        );
    }
    image
}

/// The serial lock of the tests that run Domains, and a fresh host of the
/// unprivileged test user, for an agent image's test.
fn agent_host() -> (
    std::sync::MutexGuard<'static, ()>,
    lazaret_tests::domain::UserHost,
) {
    use lazaret_tests::domain::{SERIAL, UserHost};
    let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    (serial, UserHost::new())
}

/// What a command printed, standard output then standard error.
fn said(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The agents besides claude, each with the version its image pins
/// (packaging/images/build-agent-image.sh).
const OTHER_AGENTS: [(&str, &str); 3] = [
    ("codex", "0.171.0"),
    ("gemini", "0.61.0"),
    ("opencode", "1.18.33"),
];

/// The images of [`OTHER_AGENTS`], tagged by agent in the layout that
/// holds the claude image (CI builds them all there): `oci:DIR:AGENT` for
/// each, or `None` where the layout lacks one (outside CI).
fn other_agent_images() -> Option<Vec<(&'static str, &'static str, String)>> {
    let claude = agent_image_ref()?;
    let layout = claude.strip_prefix("oci:")?.strip_suffix(":claude")?;
    let index = std::fs::read_to_string(format!("{layout}/index.json")).ok()?;
    let index: Value = serde_json::from_str(&index).ok()?;
    let tags: Vec<&str> = index["manifests"]
        .as_array()?
        .iter()
        .filter_map(|m| m["annotations"]["org.opencontainers.image.ref.name"].as_str())
        .collect();
    let missing: Vec<&str> = OTHER_AGENTS
        .iter()
        .map(|(agent, _)| *agent)
        .filter(|agent| !tags.contains(agent))
        .collect();
    if std::env::var_os("CI").is_some() {
        assert!(
            missing.is_empty(),
            "CI must build the {missing:?} agent images into {layout}"
        );
    }
    if !missing.is_empty() {
        return None;
    }
    Some(
        OTHER_AGENTS
            .iter()
            .map(|&(agent, version)| (agent, version, format!("oci:{layout}:{agent}")))
            .collect(),
    )
}

/// Each other agent's profile from `config init --agent`, on its image:
/// `up` with the key by reference, and the agent itself runs inside
/// gVisor (`AGENT --version` names the pinned version).
fn other_agents() -> Result {
    let images = other_agent_images().expect("gated on the images");
    let (_serial, host) = agent_host();
    let ws = host.workspace.clone();
    let key = "sk-e2e-dummy-0a7c55";
    let env = [
        ("OPENAI_API_KEY", key),
        ("GEMINI_API_KEY", key),
        ("ANTHROPIC_API_KEY", key),
    ];
    for (agent, version, image) in &images {
        let out = host.lazaret(&ws, &["config", "init", "--agent", agent, "--image", image]);
        assert!(out.status.success(), "{agent}: {}", said(&out));
        let out = host.lazaret_with_env(&ws, &["up", agent], &env);
        assert!(out.status.success(), "{agent}: {}", said(&out));
        let out = host.lazaret(&ws, &["attach", agent, "--", agent, "--version"]);
        let version_said = said(&out);
        assert!(out.status.success(), "{agent} --version: {version_said}");
        assert!(
            version_said.contains(version),
            "{agent} --version: {version_said}"
        );
        let out = host.lazaret(&ws, &["down", agent]);
        assert!(out.status.success(), "{agent}: {}", said(&out));
    }
    host.assert_nowhere_on_disk(key);
    Ok(())
}

/// A profile from `config init --agent claude` on the image CI built: the
/// agent, git and node run; the API key arrives by reference as a
/// credential (the sandbox holds a placeholder) and is nowhere on disk; a package installed with the image's own npm into
/// /root survives `down` and `up`.
fn agent_image() -> Result {
    let image = agent_image_ref().expect("gated on the image");
    let (_serial, host) = agent_host();
    let ws = host.workspace.clone();
    let out = host.lazaret(
        &ws,
        &["config", "init", "--agent", "claude", "--image", &image],
    );
    assert!(out.status.success(), "{}", said(&out));
    let key = "sk-ant-e2e-dummy-5c1e0a";
    let env = [("ANTHROPIC_API_KEY", key)];
    let out = host.lazaret_with_env(&ws, &["up", "claude"], &env);
    assert!(out.status.success(), "{}", said(&out));
    let attach = |command: &[&str]| {
        let mut args = vec!["attach", "claude", "--"];
        args.extend_from_slice(command);
        let out = host.lazaret(&ws, &args);
        assert!(out.status.success(), "{command:?}: {}", said(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let version = attach(&["claude", "--version"]);
    assert!(version.contains("Claude Code"), "{version}");
    assert!(attach(&["git", "--version"]).starts_with("git version"));
    assert!(attach(&["node", "--version"]).starts_with('v'));
    // The key is a credential: the sandbox holds a placeholder of its shape.
    let inside = attach(&["sh", "-c", "printf %s \"$ANTHROPIC_API_KEY\""]);
    assert!(inside.starts_with("sk-ant-") && inside != key, "{inside}");

    // Attached with no command, on a terminal, the image's login shell
    // starts the agent.
    let dir = host.user_dir("tmux");
    let tmux = crate::attach::Tmux {
        host: &host,
        dir,
        cwd: ws.clone(),
    };
    let pane = format!(
        "{} attach claude; sleep 60",
        lazaret_tests::bin("lazaret").display()
    );
    tmux.start(120, 40, &pane)?;
    let started = tmux.poll(std::time::Duration::from_secs(60), |s| {
        s.contains("Welcome to Claude Code")
    })?;
    if let Err(screen) = started {
        return Err(format!("the agent did not start; the pane shows:\n{screen}").into());
    }
    drop(tmux);

    // The image's own toolchain installs into a persistent dir, offline.
    let install = "set -e; mkdir -p /root/src/hello && cd /root/src/hello; \
        printf '%s' '{\"name\":\"hello-lazaret\",\"version\":\"1.0.0\",\"bin\":{\"hello-lazaret\":\"cli.js\"}}' > package.json; \
        printf '#!/usr/bin/env node\\nconsole.log(\"hello from npm\")\\n' > cli.js; \
        npm pack --silent >/dev/null; \
        npm install --global --prefix /root/.local --offline --no-audit --no-fund ./hello-lazaret-1.0.0.tgz >/dev/null; \
        /root/.local/bin/hello-lazaret";
    assert_eq!(attach(&["sh", "-c", install]).trim(), "hello from npm");
    let out = host.lazaret(&ws, &["down", "claude"]);
    assert!(out.status.success(), "{}", said(&out));
    let out = host.lazaret_with_env(&ws, &["up", "claude"], &env);
    assert!(out.status.success(), "{}", said(&out));
    assert_eq!(
        attach(&["/root/.local/bin/hello-lazaret"]).trim(),
        "hello from npm"
    );
    let out = host.lazaret(&ws, &["down", "claude"]);
    assert!(out.status.success(), "{}", said(&out));

    // The key is in no file the host keeps: stores, logs, state, runtime.
    host.assert_nowhere_on_disk(key);
    Ok(())
}

type Result = std::result::Result<(), libtest_mimic::Failed>;

fn has(program: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if std::env::var_os("CI").is_some() {
        assert!(found, "CI must install {program}");
    }
    found
}

/// `kubernetes-validate` (PyPI), on PATH or where CI installs it.
fn validator() -> Option<PathBuf> {
    let found = ["/opt/kubernetes-validate/bin/kubernetes-validate"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .or_else(|| has("kubernetes-validate").then(|| "kubernetes-validate".into()));
    if std::env::var_os("CI").is_some() {
        assert!(found.is_some(), "CI must install kubernetes-validate");
    }
    found
}

fn init_agent() -> Result {
    let s = Scratch::new();
    let (code, out, err) = text(&run(s.lazaret(["config", "init", "--agent", "claude"])));
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("wrote profile `claude`"), "{out}");
    assert!(out.contains("build-agent-image.sh claude"), "{out}");
    let mode = std::fs::metadata(s.config_path())?.permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let first = std::fs::read_to_string(s.config_path())?;
    assert!(
        first.contains(
            "[[profiles.\"claude\".credentials]]\nenv = \"ANTHROPIC_API_KEY\"\n\
             value = \"env:ANTHROPIC_API_KEY\"\nhosts = [\"api.anthropic.com\"]\n"
        ),
        "{first}"
    );
    assert!(
        first.contains("schema = \"lazaret-trusted-host-config-v2\""),
        "{first}"
    );
    assert!(
        first.contains("  \"api.anthropic.com\", # Claude Code's API\n"),
        "{first}"
    );

    // The key is a reference: without it the profile names it, with it
    // the profile loads and the value is never shown.
    let (code, _, err) = text(&run(s.lazaret(["config", "check", "claude"])));
    assert_eq!(code, Some(2));
    assert!(err.contains("ANTHROPIC_API_KEY"), "{err}");
    let mut check = s.lazaret(["config", "check", "claude", "--json"]);
    check.env("ANTHROPIC_API_KEY", "sk-test-not-a-key");
    let (code, out, err) = text(&run(check));
    assert_eq!(code, Some(0), "{err}");
    assert!(!out.contains("sk-test-not-a-key"), "{out}");
    let json: Value = serde_json::from_str(&out)?;
    assert_eq!(json["persistent_dirs"][0], "/root", "{json}");

    // A second agent is appended; what was there stays byte for byte.
    let (code, out, err) =
        text(&run(s.lazaret([
            "config", "init", "--agent", "codex", "--name", "work",
        ])));
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("added profile `work`"), "{out}");
    let second = std::fs::read_to_string(s.config_path())?;
    assert!(second.starts_with(&first), "the existing text is kept");
    assert!(second.contains("[profiles.\"work\"]"), "{second}");
    let mode = std::fs::metadata(s.config_path())?.permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    // A name taken, or a file that does not load: refused, file unchanged.
    let (code, _, err) =
        text(&run(s.lazaret([
            "config", "init", "--agent", "gemini", "--name", "work",
        ])));
    assert_eq!(code, Some(1));
    assert!(err.contains("already has profile `work`"), "{err}");
    let broken = format!("{second}\n[profiles.bad]\nimage = 7\n");
    std::fs::write(s.config_path(), &broken)?;
    let (code, _, err) = text(&run(s.lazaret(["config", "init", "--agent", "gemini"])));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("fix it before adding a profile"), "{err}");
    assert_eq!(std::fs::read_to_string(s.config_path())?, broken);
    let leftovers: Vec<_> = std::fs::read_dir(s.config_path().parent().unwrap())?
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers.len(), 1, "{leftovers:?}");
    Ok(())
}

fn bash_completion() -> Result {
    let s = Scratch::new();
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let (code, out, err) = text(&run(s.lazaret(["completions", shell])));
        assert_eq!(code, Some(0), "{shell}: {err}");
        assert!(out.contains("attach"), "{shell}: {out}");
    }
    let (code, _, err) = text(&run(s.lazaret(["completions", "tcsh"])));
    assert_eq!(code, Some(2), "{err}");

    // The bash script completes subcommands and their options.
    let (_, script, _) = text(&run(s.lazaret(["completions", "bash"])));
    let file = s.home.join("lazaret.bash");
    std::fs::write(&file, script)?;
    let complete = |words: &str| -> String {
        let program = format!(
            "source {}; COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); \
             _lazaret lazaret; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            file.display()
        );
        let (_, out, _) = text(&run(Command::new("bash").args(["-c", &program])));
        out
    };
    let top = complete("lazaret st");
    assert!(top.lines().any(|l| l == "status"), "{top}");
    assert!(top.lines().any(|l| l == "state"), "{top}");
    let status = complete("lazaret status --");
    assert!(status.lines().any(|l| l == "--json"), "{status}");
    Ok(())
}

fn man_pages() -> Result {
    let s = Scratch::new();
    let dir = s.home.join("man");
    std::fs::create_dir(&dir)?;
    let (code, out, err) =
        text(&run(s.lazaret([
            std::ffi::OsStr::new("man-pages"),
            dir.as_os_str(),
        ])));
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("man pages"), "{out}");
    let mut man = Command::new("man");
    man.arg("-l")
        .arg(dir.join("lazaret-up.1"))
        .env("MANPAGER", "cat")
        .env("MANWIDTH", "80");
    let (code, page, err) = text(&run(man));
    assert_eq!(code, Some(0), "{err}");
    assert!(page.contains("lazaret-up"), "{page}");
    assert!(page.contains("PROFILE"), "{page}");
    Ok(())
}

/// What a NetworkPolicy's egress `ipBlock`s allow for `address`.
fn blocks_allow(policy: &Value, address: Ipv4Addr) -> bool {
    let inside = |cidr: &str| {
        let (net, len) = cidr.split_once('/').unwrap();
        let net = u32::from(net.parse::<Ipv4Addr>().unwrap());
        let len: u32 = len.parse().unwrap();
        let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
        u32::from(address) & mask == net
    };
    policy["spec"]["egress"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|rule| rule["to"].as_array().cloned().unwrap_or_default())
        .filter_map(|to| to.get("ipBlock").cloned())
        .any(|block| {
            inside(block["cidr"].as_str().unwrap())
                && !block["except"]
                    .as_array()
                    .map(|e| e.iter().any(|c| inside(c.as_str().unwrap())))
                    .unwrap_or(false)
        })
}

fn export_kube() -> Result {
    let s = Scratch::new();
    let path = s.config_path();
    std::fs::create_dir_all(path.parent().unwrap())?;
    std::fs::write(
        &path,
        r#"schema = "lazaret-trusted-host-config-v1"
[network]
default_allow = ["0.0.0.0/0"]
default_deny = ["8.8.8.0/24"]
[profiles.agent]
image = "docker.io/library/debian:trixie"
persistent_dirs = ["/root", "/usr/local"]
allow_egress = ["10.1.0.0/16"]
env = { API_KEY = "env:LAZARET_TEST_KEY" }
volumes = [
  { host = "{profile_dir}/state", container = "/root/.agent", kind = "directory", access = "read-write", create = true },
]
"#,
    )?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    let mut export = s.lazaret(["export", "kube", "agent"]);
    export.env("LAZARET_TEST_KEY", "secret-value-3e1f");
    let (code, yaml, err) = text(&run(export));
    assert_eq!(code, Some(0), "{err}");
    assert!(!yaml.contains("secret-value-3e1f"), "no value is printed");
    let file = s.home.join("agent.yaml");
    std::fs::write(&file, &yaml)?;
    let validator = validator().expect("gated on the validator");
    let mut validate = Command::new(&validator);
    validate.arg("--strict").arg(&file);
    let (code, out, err) = text(&run(validate));
    assert_eq!(code, Some(0), "{out}{err}\n{yaml}");
    assert_eq!(
        out.matches("passed").count() + err.matches("passed").count(),
        6,
        "{out}{err}"
    );

    // The same documents as JSON, through the validator's own YAML reader.
    let python = validator.with_file_name("python3");
    let python = if python.exists() {
        python
    } else {
        "python3".into()
    };
    let mut convert = Command::new(python);
    convert
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))",
        ])
        .arg(&file);
    let (code, json, err) = text(&run(convert));
    assert_eq!(code, Some(0), "{err}");
    let documents: Vec<Value> = serde_json::from_str(&json)?;
    let kinds: Vec<&str> = documents
        .iter()
        .map(|d| d["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "PersistentVolumeClaim",
            "PersistentVolumeClaim",
            "PersistentVolumeClaim",
            "PersistentVolumeClaim",
            "Pod",
            "NetworkPolicy"
        ]
    );
    let pod = &documents[4];
    assert_eq!(pod["spec"]["runtimeClassName"], "gvisor");
    // The persistent dirs' claims are filled from the image once.
    let seed = &pod["spec"]["initContainers"][0];
    assert_eq!(seed["image"], "docker.io/library/debian:trixie");
    let script = seed["command"][2].as_str().unwrap();
    assert!(
        script.contains("cp -a '/root'/. /lazaret-seed/1/"),
        "{script}"
    );
    assert!(
        script.contains("cp -a '/usr/local'/. /lazaret-seed/2/"),
        "{script}"
    );
    assert_eq!(seed["volumeMounts"].as_array().unwrap().len(), 2);
    assert_eq!(pod["spec"]["automountServiceAccountToken"], false);
    let container = &pod["spec"]["containers"][0];
    assert_eq!(container["image"], "docker.io/library/debian:trixie");
    assert_eq!(
        container["env"][0]["valueFrom"]["secretKeyRef"]["key"],
        "API_KEY"
    );
    let mounts: Vec<&str> = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["mountPath"].as_str().unwrap())
        .collect();
    assert_eq!(
        mounts,
        ["/workspace", "/root", "/usr/local", "/root/.agent"]
    );
    // Each mount names a volume of the pod, and each volume a claim
    // printed beside it.
    let claims: Vec<&str> = documents[..4]
        .iter()
        .map(|c| c["metadata"]["name"].as_str().unwrap())
        .collect();
    for (mount, volume) in container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .zip(pod["spec"]["volumes"].as_array().unwrap())
    {
        assert_eq!(mount["name"], volume["name"]);
        assert!(mount["name"].as_str().unwrap().len() <= 63);
        let claim = volume["persistentVolumeClaim"]["claimName"]
            .as_str()
            .unwrap();
        assert!(claims.contains(&claim), "{claim} in {claims:?}");
    }

    // Every destination is decided as the profile's policy decides it:
    // allowed by 0/0 and 10.1/16, RFC 1918 and the platform's special
    // ranges denied (but 10.1/16, allowed inside 10/8), 8.8.8/24 denied.
    let policy = &documents[5];
    assert_eq!(
        policy["spec"]["policyTypes"],
        serde_json::json!(["Ingress", "Egress"])
    );
    assert!(
        policy["spec"].get("ingress").is_none(),
        "no ingress is allowed"
    );
    for (address, allowed) in [
        ("1.1.1.1", true),
        ("8.8.4.4", true),
        ("8.8.8.8", false),
        ("10.1.2.3", true),
        ("10.2.0.1", false),
        ("172.16.0.1", false),
        ("192.168.1.1", false),
        ("169.254.169.254", false),
        ("100.64.0.1", false),
        ("224.0.0.251", false),
        ("255.255.255.255", false),
        ("0.1.2.3", false),
    ] {
        assert_eq!(
            blocks_allow(policy, address.parse()?),
            allowed,
            "{address}: {policy}"
        );
    }

    // A local image cannot be pulled by a cluster: it must be named.
    let local = std::fs::read_to_string(&path)?.replace(
        "docker.io/library/debian:trixie",
        "oci:/images/agents:claude",
    );
    std::fs::write(&path, local)?;
    let (code, _, err) = text(&run(s.lazaret(["export", "kube", "agent"])));
    assert_eq!(code, Some(2));
    assert!(err.contains("--image"), "{err}");
    let (code, yaml, err) = text(&run(s.lazaret([
        "export",
        "kube",
        "agent",
        "--image",
        "registry.example/claude:1",
    ])));
    assert_eq!(code, Some(0), "{err}");
    assert!(
        yaml.contains("image: \"registry.example/claude:1\""),
        "{yaml}"
    );
    let (code, _, err) = text(&run(s.lazaret([
        "export",
        "kube",
        "agent",
        "--image",
        "oci:/images/agents:claude",
    ])));
    assert_eq!(code, Some(2));
    assert!(err.contains("is local"), "{err}");
    Ok(())
}
