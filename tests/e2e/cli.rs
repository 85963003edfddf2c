//! The `lazaret` CLI as a user meets it: `config init`, `config check` with
//! and without `--json`, exit codes, global options on either side of the
//! subcommand, `--help` everywhere, and honest refusals of what this version
//! does not do yet.

use std::os::unix::fs::PermissionsExt;
use std::process::Stdio;

use lazaret_tests::{Scratch, bin, run, text};
use libtest_mimic::Trial;
use serde_json::Value;

pub fn trials() -> Vec<Trial> {
    vec![
        Trial::test(
            "cli::init_writes_a_private_template_once",
            init_writes_a_private_template_once,
        ),
        Trial::test(
            "cli::init_writes_v2_and_agent_profiles_name_their_hosts",
            init_writes_v2,
        ),
        Trial::test(
            "cli::check_reports_the_resolved_profile_as_json",
            check_json,
        ),
        Trial::test("cli::check_prints_a_human_summary", check_human),
        Trial::test(
            "cli::check_shows_host_names_and_warns_that_host_dns_is_a_way_out",
            check_v2,
        ),
        Trial::test(
            "cli::global_options_go_before_or_after_the_subcommand",
            global_options,
        ),
        Trial::test(
            "cli::invalid_configuration_exits_2_naming_the_field",
            invalid_exits_2,
        ),
        Trial::test(
            "cli::configuration_errors_never_echo_control_bytes_or_huge_lines",
            errors_are_printable,
        ),
        Trial::test(
            "cli::environment_values_are_never_printed",
            env_values_hidden,
        ),
        Trial::test("cli::every_command_has_help_with_examples", help_everywhere),
        Trial::test(
            "cli::check_refuses_an_uninstallable_network_policy",
            uninstallable_policy,
        ),
        Trial::test(
            "cli::commands_outside_a_domain_say_what_to_do",
            outside_a_domain,
        ),
        Trial::test(
            "cli::export_kube_names_what_a_networkpolicy_cannot_allow",
            export_kube_names,
        ),
        Trial::test("cli::a_closed_stdout_is_not_an_error", closed_stdout),
        Trial::test("cli::missing_runtime_dir_is_named", missing_runtime_dir),
        Trial::test(
            "cli::an_unprivileged_user_loads_a_root_owned_configuration",
            unprivileged_user,
        )
        .with_ignored_flag(!can_switch_user()),
    ]
}

type Result = std::result::Result<(), libtest_mimic::Failed>;

const VALID: &str = r#"schema = "lazaret-trusted-host-config-v1"

[network]
default_allow = ["198.18.0.0/15"]

[profiles.dev]
image = "oci:/var/lib/images/base:1"
persistent_dirs = ["/root", "/opt"]
allow_egress = ["10.222.7.1/16"]
deny_egress = ["198.18.5.0/24"]
env = { TOKEN = "env:LAZARET_TEST_TOKEN" }
volumes = [
  { host = "{profile_dir}/cache", container = "/root/.cache", kind = "directory", create = true },
]

[profiles.other]
image = "oci:/elsewhere:2"
"#;

fn write_config(scratch: &Scratch, text: &str) {
    let path = scratch.config_path();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

fn init_writes_a_private_template_once() -> Result {
    let s = Scratch::new();
    let (code, out, err) = text(&run(s.lazaret(["config", "init"])));
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("wrote"), "{out}");
    let mode = std::fs::metadata(s.config_path())?.permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let before = std::fs::read(s.config_path())?;
    let (code, _, err) = text(&run(s.lazaret(["config", "init"])));
    assert_eq!(code, Some(1));
    assert!(err.contains("already exists"), "{err}");
    assert_eq!(
        std::fs::read(s.config_path())?,
        before,
        "an existing file is never overwritten"
    );
    // The template is a valid configuration as written.
    let (code, _, err) = text(&run(s.lazaret(["config", "check", "default"])));
    assert_eq!(code, Some(0), "{err}");
    Ok(())
}

/// `config init` writes v2, which checks without a warning; an agent's
/// profile names its hosts, and one added to a v1 file is written in v1.
fn init_writes_v2() -> Result {
    let s = Scratch::new();
    let (code, _, err) = text(&run(s.lazaret(["config", "init"])));
    assert_eq!(code, Some(0), "{err}");
    let written = std::fs::read_to_string(s.config_path())?;
    assert!(
        written.contains("\nschema = \"lazaret-trusted-host-config-v2\"\n"),
        "{written}"
    );
    let (code, out, err) = text(&run(s.lazaret(["config", "check", "default", "--json"])));
    assert_eq!(code, Some(0), "{err}");
    let report: Value = serde_json::from_str(&out)?;
    assert_eq!(report["schema"], "lazaret-trusted-host-config-v2");
    assert_eq!(report["warnings"], serde_json::json!([]));
    let (code, _, err) = text(&run(s.lazaret(["config", "check", "default"])));
    assert_eq!(code, Some(0), "{err}");
    assert!(err.is_empty(), "the template checks cleanly: {err}");

    let s = Scratch::new();
    let (code, _, err) = text(&run(s.lazaret(["config", "init", "--agent", "claude"])));
    assert_eq!(code, Some(0), "{err}");
    let (code, out, err) = text(&run(s
        .lazaret(["config", "check", "claude", "--json"])
        .env("ANTHROPIC_API_KEY", "x")));
    assert_eq!(code, Some(0), "{err}");
    let report: Value = serde_json::from_str(&out)?;
    let hosts: Vec<&str> = report["allow_hosts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h.as_str().unwrap())
        .collect();
    for host in [
        "api.anthropic.com",
        "registry.npmjs.org",
        "pypi.org",
        "files.pythonhosted.org",
        "github.com",
        "codeload.github.com",
        "objects.githubusercontent.com",
    ] {
        assert!(hosts.contains(&host), "{host} in {hosts:?}");
    }
    assert_eq!(report["effective_allow"], serde_json::json!([]));
    assert_eq!(report["dns"], "lazaret");
    assert_eq!(report["warnings"], serde_json::json!([]));

    // An existing v1 file: the agent's profile is v1, with the range its
    // API publishes and the names to resolve.
    let s = Scratch::new();
    write_config(&s, VALID);
    let (code, out, err) = text(&run(s.lazaret(["config", "init", "--agent", "claude"])));
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("the file is v1"), "{out}");
    let written = std::fs::read_to_string(s.config_path())?;
    assert!(written.starts_with(VALID), "the existing text is kept");
    assert!(written.contains("\"160.79.104.0/23\""), "{written}");
    assert!(!written.contains("allow_hosts ="), "{written}");
    let (code, _, err) = text(&run(s
        .lazaret(["config", "check", "claude"])
        .env("ANTHROPIC_API_KEY", "x")));
    assert_eq!(code, Some(0), "{err}");
    Ok(())
}

fn check_json() -> Result {
    let s = Scratch::new();
    write_config(&s, VALID);
    let output = run(s
        .lazaret(["config", "check", "dev", "--json"])
        .env("LAZARET_TEST_TOKEN", "x"));
    let (code, out, err) = text(&output);
    assert_eq!(code, Some(0), "{err}");
    let report: Value = serde_json::from_str(&out)?;
    let hex64 = |v: &Value| {
        v.as_str().is_some_and(|s| {
            s.len() == 64
                && s.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
    };
    assert!(hex64(&report["domain_id"]), "{report}");
    assert!(hex64(&report["configuration_fingerprint"]), "{report}");
    assert!(hex64(&report["network_policy_digest"]), "{report}");
    assert_eq!(report["profile"], "dev");
    assert_eq!(
        report["workspace"],
        s.workspace.to_str().unwrap(),
        "the workspace defaults to the current directory"
    );
    let storage = s.home.join(".local/share/lazaret");
    assert_eq!(report["storage_root"], storage.to_str().unwrap());
    assert_eq!(
        report["runtime_root"],
        s.runtime.join("lazaret").to_str().unwrap()
    );
    assert_eq!(
        report["profile_dir"],
        storage.join("profiles/dev").to_str().unwrap()
    );
    assert_eq!(report["image"], "oci:/var/lib/images/base:1");
    assert_eq!(report["isolate_gitignored"], true);
    assert_eq!(
        report["persistent_dirs"],
        serde_json::json!(["/root", "/opt"])
    );
    assert_eq!(
        report["volumes"],
        serde_json::json!([{
            "host": storage.join("profiles/dev/cache").to_str().unwrap(),
            "container": "/root/.cache",
            "kind": "directory",
            "access": "read-write",
            "create": true,
        }])
    );
    assert_eq!(
        report["env"],
        serde_json::json!({ "TOKEN": "env:LAZARET_TEST_TOKEN" })
    );
    assert_eq!(
        report["effective_allow"],
        serde_json::json!(["10.222.0.0/16", "198.18.0.0/15"])
    );
    assert_eq!(
        report["effective_deny"],
        serde_json::json!([
            "10.0.0.0/8",
            "172.16.0.0/12",
            "192.168.0.0/16",
            "198.18.5.0/24"
        ])
    );
    assert_eq!(
        report["escalation"],
        serde_json::json!({ "enabled": false, "auto_approve": [] })
    );
    assert!(std::fs::metadata(storage.join("profiles/dev/cache"))?.is_dir());

    // The same load from another directory is another Domain.
    let elsewhere = s.base().join("other-project");
    std::fs::create_dir(&elsewhere)?;
    let other: Value = serde_json::from_slice(
        &run(s
            .lazaret(["config", "check", "dev", "--json"])
            .current_dir(&elsewhere)
            .env("LAZARET_TEST_TOKEN", "x"))
        .stdout,
    )?;
    assert_ne!(other["domain_id"], report["domain_id"]);
    assert_eq!(
        other["configuration_fingerprint"],
        report["configuration_fingerprint"]
    );
    Ok(())
}

fn check_human() -> Result {
    let s = Scratch::new();
    write_config(&s, VALID);
    let (code, out, err) = text(&run(s
        .lazaret(["config", "check", "dev"])
        .env("LAZARET_TEST_TOKEN", "x")));
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.starts_with("configuration valid: profile `dev`"),
        "{out}"
    );
    for needle in [
        "domain id",
        "fingerprint",
        "egress deny",
        "10.0.0.0/8",
        "TOKEN = env:LAZARET_TEST_TOKEN",
    ] {
        assert!(out.contains(needle), "missing {needle}: {out}");
    }
    Ok(())
}

/// A v2 profile's names and DNS mode are shown; `dns = "host"` and a v1
/// file are warned about on standard error (or in `warnings` with
/// `--json`), and the check still succeeds.
fn check_v2() -> Result {
    let s = Scratch::new();
    let v2 = VALID
        .replace(
            "lazaret-trusted-host-config-v1",
            "lazaret-trusted-host-config-v2",
        )
        .replace(
            "deny_egress = [\"198.18.5.0/24\"]\n",
            "deny_egress = [\"198.18.5.0/24\"]\n\
             allow_hosts = [\"registry.npmjs.org\", \"*.pkgs.example.org\"]\n\
             dns = \"host\"\n",
        );
    write_config(&s, &v2);
    let check = |args: &[&str]| text(&run(s.lazaret(args).env("LAZARET_TEST_TOKEN", "x")));
    let (code, out, err) = check(&["config", "check", "dev"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("egress hosts     *.pkgs.example.org, registry.npmjs.org\n"),
        "{out}"
    );
    assert!(out.contains("dns              host"), "{out}");
    assert!(
        err.starts_with("lazaret: warning: profile `dev` has dns = \"host\": DNS is a way out"),
        "{err}"
    );
    let (code, out, err) = check(&["config", "check", "dev", "--json"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.is_empty(), "warnings go in the JSON: {err}");
    let report: Value = serde_json::from_str(&out)?;
    assert_eq!(report["schema"], "lazaret-trusted-host-config-v2");
    assert_eq!(
        report["allow_hosts"],
        serde_json::json!(["*.pkgs.example.org", "registry.npmjs.org"])
    );
    assert_eq!(report["dns"], "host");
    assert!(
        report["warnings"][0]
            .as_str()
            .is_some_and(|w| w.contains("way out")),
        "{report}"
    );

    // Lazaret's resolver: no warning.
    write_config(&s, &v2.replace("dns = \"host\"\n", ""));
    let (code, out, err) = check(&["config", "check", "dev"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("dns              lazaret"), "{out}");
    assert!(err.is_empty(), "{err}");

    // A v1 file: what v2 adds.
    write_config(&s, VALID);
    let (code, _, err) = check(&["config", "check", "dev"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("v1 configuration"), "{err}");
    assert!(err.contains("allow_hosts, egress by host name"), "{err}");
    Ok(())
}

/// `export kube` of a profile with host names: the NetworkPolicy allows
/// its prefixes and the names are named, on standard error and in the
/// YAML; `--fqdn-policy cilium` writes a CiliumNetworkPolicy with them.
fn export_kube_names() -> Result {
    let s = Scratch::new();
    write_config(
        &s,
        "schema = \"lazaret-trusted-host-config-v2\"\n\
         [profiles.agent]\n\
         image = \"docker.io/library/debian:trixie\"\n\
         allow_egress = [\"203.0.113.10/32\"]\n\
         allow_hosts = [\"api.anthropic.com\", \"*.pkgs.example.org\"]\n",
    );
    let (code, yaml, err) = text(&run(s.lazaret(["export", "kube", "agent"])));
    assert_eq!(code, Some(0), "{err}");
    let names = "the host names `*.pkgs.example.org`, `api.anthropic.com`";
    assert!(
        err.contains(&format!("lazaret: Not exported: {names}")),
        "{err}"
    );
    assert!(yaml.contains(&format!("# Not exported: {names}")), "{yaml}");
    assert!(yaml.contains("kind: \"NetworkPolicy\""), "{yaml}");
    assert!(yaml.contains("cidr: \"203.0.113.10/32\""), "{yaml}");
    assert!(!yaml.contains("cilium.io/v2"), "{yaml}");

    let (code, yaml, err) = text(&run(s.lazaret([
        "export",
        "kube",
        "agent",
        "--fqdn-policy",
        "cilium",
    ])));
    assert_eq!(code, Some(0), "{err}");
    assert!(!err.contains("Not exported: the host names"), "{err}");
    assert!(err.contains("`**.`"), "the wildcard's depth: {err}");
    assert!(yaml.contains("apiVersion: \"cilium.io/v2\""), "{yaml}");
    assert!(!yaml.contains("kind: \"NetworkPolicy\""), "{yaml}");
    for line in [
        "- matchName: \"api.anthropic.com\"",
        "- matchPattern: \"*.pkgs.example.org\"",
        "- \"203.0.113.10/32\"",
        "- matchPattern: \"*\"",
        "port: \"53\"",
    ] {
        assert!(yaml.contains(line), "{line}: {yaml}");
    }
    let (code, _, err) = text(&run(s.lazaret([
        "export",
        "kube",
        "agent",
        "--fqdn-policy",
        "calico",
    ])));
    assert_eq!(code, Some(2), "{err}");
    Ok(())
}

fn global_options() -> Result {
    let s = Scratch::new();
    let config = s.base().join("elsewhere.toml");
    std::fs::write(
        &config,
        VALID.replace("env = { TOKEN = \"env:LAZARET_TEST_TOKEN\" }\n", ""),
    )?;
    let project = s.base().join("p2");
    std::fs::create_dir(&project)?;
    let config = config.to_str().unwrap();
    let project = project.to_str().unwrap();
    let orders: [&[&str]; 3] = [
        &[
            "--config",
            config,
            "--workspace",
            project,
            "config",
            "check",
            "dev",
            "--json",
        ],
        &[
            "config",
            "check",
            "dev",
            "--json",
            "--config",
            config,
            "--workspace",
            project,
        ],
        &[
            "config",
            "--config",
            config,
            "check",
            "--workspace",
            project,
            "dev",
            "--json",
        ],
    ];
    let mut ids = Vec::new();
    for args in orders {
        let (code, out, err) = text(&run(s.lazaret(args)));
        assert_eq!(code, Some(0), "{args:?}: {err}");
        let report: Value = serde_json::from_str(&out)?;
        assert_eq!(report["workspace"], project);
        assert_eq!(report["config"], config);
        ids.push(report["domain_id"].clone());
    }
    assert!(ids.windows(2).all(|w| w[0] == w[1]));
    Ok(())
}

/// A configuration error shows neither the terminal control sequences a
/// value holds nor a whole 400 KB line.
fn errors_are_printable() -> Result {
    let s = Scratch::new();
    let long = "A".repeat(400_000);
    for config in [
        // Not TOML: a long line with raw control bytes.
        format!(
            "schema = \"lazaret-trusted-host-config-v1\"\n[profiles.dev]\n\
             image = \"{long}\x1b]0;title\x07\" trailing\n"
        ),
        // TOML, with escaped control characters in an echoed value.
        VALID.replace(
            "lazaret-trusted-host-config-v1",
            &format!("\\u001b]0;title\\u0007\\u001b[2J{long}"),
        ),
    ] {
        write_config(&s, &config);
        let (code, out, err) = text(&run(s.lazaret(["config", "check", "dev"])));
        assert_eq!(code, Some(2), "{}", &err[..err.len().min(500)]);
        assert!(out.is_empty());
        assert!(err.len() < 2048, "a short message: {} bytes", err.len());
        assert!(
            !err.chars().any(|c| c.is_control() && c != '\n'),
            "no control character: {err:?}"
        );
    }
    Ok(())
}

fn invalid_exits_2() -> Result {
    let s = Scratch::new();
    let cases = [
        (
            VALID.replace("container = \"/root/.cache\"", "container = \"/srv/cache\""),
            "profiles.dev.volumes[0].container: ",
        ),
        (
            VALID.replace("kind = \"directory\"", "kind = \"dir\""),
            "profiles.dev.volumes[0].kind: ",
        ),
        (
            VALID.replace("image = \"oci:/elsewhere:2\"", "image = \"x\"\ncolour = 1"),
            "profiles.other.colour: ",
        ),
        (
            VALID.replace("10.222.7.1/16", "10.0.0.0/8"),
            "profiles.dev.allow_egress[0]: ",
        ),
        (
            VALID.replace(
                "lazaret-trusted-host-config-v1",
                "lazaret-trusted-host-config-v3",
            ),
            "schema: ",
        ),
    ];
    for (config, field) in cases {
        write_config(&s, &config);
        let (code, out, err) = text(&run(s
            .lazaret(["config", "check", "dev", "--json"])
            .env("LAZARET_TEST_TOKEN", "x")));
        assert_eq!(code, Some(2), "{field}: {err}");
        assert!(out.is_empty(), "nothing on stdout: {out}");
        assert_eq!(err.lines().count(), 1, "one error line: {err}");
        assert!(
            err.starts_with(&format!("lazaret: invalid configuration: {field}")),
            "{err}"
        );
    }
    Ok(())
}

fn env_values_hidden() -> Result {
    let s = Scratch::new();
    write_config(&s, VALID);
    let secret = "sk-very-secret-value-42";
    for args in [
        &["config", "check", "dev"][..],
        &["config", "check", "dev", "--json"],
    ] {
        let output = run(s.lazaret(args).env("LAZARET_TEST_TOKEN", secret));
        let (code, out, err) = text(&output);
        assert_eq!(code, Some(0), "{err}");
        assert!(
            !out.contains(secret) && !err.contains(secret),
            "the value leaked: {out}{err}"
        );
    }
    // Missing: refused, naming the field and the variable.
    let (code, _, err) = text(&run(s.lazaret(["config", "check", "dev"])));
    assert_eq!(code, Some(2));
    assert!(
        err.contains("profiles.dev.env.TOKEN: host variable LAZARET_TEST_TOKEN is not set"),
        "{err}"
    );
    Ok(())
}

fn help_everywhere() -> Result {
    let s = Scratch::new();
    let commands: [&[&str]; 12] = [
        &[],
        &["config"],
        &["config", "check"],
        &["config", "init"],
        &["up"],
        &["down"],
        &["attach"],
        &["status"],
        &["logs"],
        &["state"],
        &["state", "list"],
        &["state", "reset"],
    ];
    for command in commands {
        let mut args = command.to_vec();
        args.push("--help");
        let (code, out, err) = text(&run(s.lazaret(&args)));
        assert_eq!(code, Some(0), "{args:?}: {err}");
        assert!(out.contains("Usage:"), "{args:?}: {out}");
        if command.len() == 1 || command.starts_with(&["config"]) || command.is_empty() {
            assert!(out.contains("Example"), "{args:?} has no examples: {out}");
        }
    }
    Ok(())
}

fn uninstallable_policy() -> Result {
    let s = Scratch::new();
    // The resolver's own address may be neither allowed nor denied.
    write_config(
        &s,
        &VALID.replace(
            "deny_egress = [\"198.18.5.0/24\"]",
            "deny_egress = [\"10.0.2.3/32\"]",
        ),
    );
    let output = run(s
        .lazaret(["config", "check", "dev"])
        .env("LAZARET_TEST_TOKEN", "x"));
    let (code, _, err) = text(&output);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("network policy cannot be installed (10.0.2.3/32)")
            && err.contains("resolver"),
        "{err}"
    );
    Ok(())
}

fn outside_a_domain() -> Result {
    let s = Scratch::new();
    // With no Domain yet, `state` lists nothing and says where it looked.
    let (code, out, err) = text(&run(s.lazaret(["state", "list"])));
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("no Domain has state under"), "{out}");
    // A Domain that is not running cannot be attached to; the CLI says how
    // to start it.
    let (code, _, err) = text(&run(s.lazaret(["attach", "dev", "--", "true"])));
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("lazaret up dev"), "{err}");
    // The escalation client outside a session says where it must run, and
    // what its command line is.
    let (code, _, err) = text(&run(std::process::Command::new(bin("lazaret-escalate"))
        .args(["/usr/bin/id", "-u"])
        .env_remove("LAZARET_SESSION")));
    assert_eq!(code, Some(69), "{err}");
    assert!(err.contains("not a Lazaret session"), "{err}");
    let (code, _, err) = text(&run(&mut std::process::Command::new(bin(
        "lazaret-escalate",
    ))));
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("usage: lazaret-escalate"), "{err}");
    // The sidecar and the resolver are started by the supervisor, never by
    // hand.
    for role in ["lazaret-netsidecar", "lazaret-resolver"] {
        let (code, _, err) = text(&run(&mut std::process::Command::new(bin(role))));
        assert_eq!(code, Some(2), "{role}: {err}");
        assert!(
            err.contains("started by lazaret-supervisor"),
            "{role}: {err}"
        );
    }
    // The coordinator and supervisor are started by `lazaret`, never by hand.
    let (code, _, err) = text(&run(&mut std::process::Command::new(bin(
        "lazaret-coordinator",
    ))));
    assert_eq!(code, Some(2), "{err}");
    let (code, _, err) = text(&run(
        std::process::Command::new(bin("lazaret-supervisor")).arg("--by-hand")
    ));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("started by lazaret-coordinator"), "{err}");
    Ok(())
}

fn closed_stdout() -> Result {
    let s = Scratch::new();
    write_config(&s, VALID);
    let mut child = s
        .lazaret(["config", "check", "dev", "--json"])
        .env("LAZARET_TEST_TOKEN", "x")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    drop(child.stdout.take());
    let output = child.wait_with_output()?;
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

fn missing_runtime_dir() -> Result {
    let s = Scratch::new();
    write_config(&s, VALID);
    let (code, _, err) = text(&run(s
        .lazaret(["config", "check", "dev"])
        .env("LAZARET_TEST_TOKEN", "x")
        .env_remove("XDG_RUNTIME_DIR")));
    assert_eq!(code, Some(2));
    assert!(err.contains("XDG_RUNTIME_DIR is not set"), "{err}");
    Ok(())
}

/// Whether this run may switch to an unprivileged user (root with setpriv).
fn can_switch_user() -> bool {
    let root = rustix::process::getuid().is_root();
    let ci = std::env::var_os("CI").is_some();
    assert!(root || !ci, "CI must run the end-to-end tests as root");
    root && std::path::Path::new("/usr/bin/setpriv").exists()
}

fn unprivileged_user() -> Result {
    // The invoking user is nobody (65534); the configuration belongs to root,
    // which the secure read accepts; the roots are created as nobody's.
    let s = Scratch::new();
    write_config(&s, VALID);
    std::fs::set_permissions(s.config_path(), std::fs::Permissions::from_mode(0o644))?;
    let nobody = 65534;
    for dir in [&s.home, &s.runtime, &s.workspace] {
        std::os::unix::fs::chown(dir, Some(nobody), Some(nobody))?;
    }
    std::fs::set_permissions(s.base(), std::fs::Permissions::from_mode(0o755))?;
    std::fs::set_permissions(&s.home, std::fs::Permissions::from_mode(0o755))?;
    let mut command = std::process::Command::new("/usr/bin/setpriv");
    command
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(bin("lazaret"))
        .args(["config", "check", "dev", "--json"])
        .current_dir(&s.workspace)
        .env_clear()
        .env("HOME", &s.home)
        .env("XDG_RUNTIME_DIR", &s.runtime)
        .env("LAZARET_TEST_TOKEN", "x");
    let (code, out, err) = text(&run(&mut command));
    assert_eq!(code, Some(0), "{err}");
    let report: Value = serde_json::from_str(&out)?;
    let storage = std::fs::metadata(report["storage_root"].as_str().unwrap())?;
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&storage), nobody);

    // A configuration owned by another unprivileged user is refused.
    std::os::unix::fs::chown(s.config_path(), Some(65533), None)?;
    let (code, _, err) = text(&run(&mut command));
    assert_eq!(code, Some(2));
    assert!(err.contains("owned by uid 65533"), "{err}");
    Ok(())
}
