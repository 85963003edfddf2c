//! Credentials end to end, as the unprivileged test user with real runsc,
//! slirp4netns and the agent image CI builds (it has curl and Claude
//! Code): a test HTTPS API (`lazaret-testapi`, with a test CA the host
//! trusts through `SSL_CERT_FILE` for `up`) in a test network namespace,
//! its names served by the test's DNS server. Inside the sandbox a
//! credential's variable holds a placeholder; a request to the
//! credential's host arrives with the real value in place of the
//! placeholder in every header, a request to another allowed host
//! arrives as sent; the real value is in no process's environment and no
//! file, inside or on the host. Killing the Credential Proxy fails closed,
//! `status` says so, and `down` and `up` recover. Needs root, runsc,
//! slirp4netns, dnsmasq and the agent image; CI provides them.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;

use lazaret_tests::domain::UserHost;
use lazaret_tests::net::{ALLOWED_NET_HOST, TestNet, UNLISTED};
use libtest_mimic::Trial;
use serde_json::Value;

use crate::domain::{Result, assert_nothing_left, down, gated, text, wait_until};
use crate::network::{dns_server_for, up_under_test_dns_with};

pub fn trials() -> Vec<Trial> {
    let runnable = crate::domain::runnable()
        && Path::new("/usr/bin/slirp4netns").exists()
        && crate::packaging::agent_image_ref().is_some();
    gated(
        runnable,
        [
            Trial::test(
                "credentials::the_real_value_goes_only_to_its_hosts",
                only_to_its_hosts,
            ),
            Trial::test(
                "credentials::claude_code_works_with_its_key_as_a_credential",
                claude_code,
            ),
        ],
    )
}

/// The credential host and the other allowed host, at the test API's two
/// addresses.
const API: &str = "api.test.invalid";
const OTHER: &str = "other.test.invalid";

/// The real value of the test's credential: shaped like an Anthropic key,
/// so its placeholder keeps the prefix.
const REAL: &str = "sk-ant-api03-e2e-real-value-4b1d0c7a9e";

/// The test API, listening on both hosts' port 443, logging each request.
struct Api<'n> {
    _server: lazaret_tests::net::Server<'n>,
    log: PathBuf,
    ca: PathBuf,
}

impl<'n> Api<'n> {
    fn start(
        net: &'n TestNet,
        host: &UserHost,
        names: &str,
    ) -> std::result::Result<Self, Box<dyn std::error::Error>> {
        let log = host.base().join("testapi.log");
        let ca = host.base().join("testapi-ca.pem");
        let server = net.spawn([
            env!("CARGO_BIN_EXE_lazaret-testapi").to_owned(),
            "--listen".into(),
            format!("{ALLOWED_NET_HOST}:443"),
            "--listen".into(),
            format!("{UNLISTED}:443"),
            "--names".into(),
            names.into(),
            "--ca-out".into(),
            ca.display().to_string(),
            "--log".into(),
            log.display().to_string(),
        ])?;
        std::fs::set_permissions(&ca, std::fs::Permissions::from_mode(0o644))?;
        Ok(Self {
            _server: server,
            log,
            ca,
        })
    }

    /// The requests logged so far whose SNI was `host`.
    fn requests_to(&self, host: &str) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|r| r["host"] == host)
            .collect()
    }
}

/// The value of header `name` in a logged request.
fn header<'r>(request: &'r Value, name: &str) -> Option<&'r str> {
    request["headers"]
        .as_array()?
        .iter()
        .find(|h| h[0].as_str().is_some_and(|n| n.eq_ignore_ascii_case(name)))
        .and_then(|h| h[1].as_str())
}

/// A v2 profile `p` on the agent image naming both hosts, with one
/// credential for [`API`].
fn config(image: &str, extra_hosts: &str) -> String {
    format!(
        "schema = \"lazaret-trusted-host-config-v2\"\n\
         [profiles.p]\nimage = \"{image}\"\npersistent_dirs = []\n\
         allow_hosts = [\"{API}\", \"{OTHER}\"{extra_hosts}]\n\
         [[profiles.p.credentials]]\nenv = \"API_KEY\"\nvalue = \"env:LZ_E2E_KEY\"\n\
         hosts = [\"{API}\"]\n"
    )
}

/// Runs a shell command in the sandbox through `lazaret attach`.
fn shell(host: &UserHost, script: &str) -> Output {
    host.lazaret(
        &host.workspace,
        &["attach", "p", "--", "/bin/sh", "-c", script],
    )
}

/// Brings `p` up under the test's DNS, the host trusting the test API's CA
/// and holding the real value.
fn up(host: &UserHost, api: &Api<'_>) -> Result {
    let ca = api.ca.display().to_string();
    up_under_test_dns_with(host, &[("LZ_E2E_KEY", REAL), ("SSL_CERT_FILE", &ca)])
}

fn only_to_its_hosts() -> Result {
    let image = crate::packaging::agent_image_ref().expect("gated on the image");
    let (_serial, host) = crate::domain::host_with_config(&config(&image, ""));
    TestNet::remove_stale()?;
    let net = TestNet::new()?;
    let dns_log = host.base().join("dnsmasq.log");
    let api_address = ALLOWED_NET_HOST.to_string();
    let other_address = UNLISTED.to_string();
    let _dns = dns_server_for(
        &net,
        &dns_log,
        &[(API, &api_address), (OTHER, &other_address)],
    )?;
    let api = Api::start(&net, &host, &format!("{API},{OTHER}"))?;
    // The sandbox trusts the test CA only where a request names it: the
    // other host is reached directly, not through the proxy.
    let ws = host.workspace.clone();
    std::fs::copy(&api.ca, ws.join("test-ca.pem"))?;
    std::fs::set_permissions(
        ws.join("test-ca.pem"),
        std::fs::Permissions::from_mode(0o644),
    )?;
    up(&host, &api)?;

    // The variable holds a placeholder of the value's shape; the trust
    // variables name the bundle.
    let out = shell(
        &host,
        "printf '%s\\n' \"$API_KEY\" \"$SSL_CERT_FILE\" \"$NODE_EXTRA_CA_CERTS\"",
    );
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines: Vec<&str> = said.lines().collect();
    assert!(out.status.success() && lines.len() == 3, "{}", text(&out));
    let placeholder = lines[0].to_owned();
    assert_ne!(placeholder, REAL);
    assert!(placeholder.starts_with("sk-ant-api03-"), "{placeholder}");
    assert!(placeholder.len() >= REAL.len(), "{placeholder}");
    assert_eq!(lines[1], "/run/lazaret/ca-certificates.pem");
    assert_eq!(lines[2], "/run/lazaret/ca-certificates.pem");

    // To the credential's host: the real value in every header that held
    // the placeholder, over HTTP/2 and HTTP/1.1. The API echoes what it
    // received; the sandbox reads the echo with the placeholder back in
    // the real value's place.
    for version in ["--http2", "--http1.1"] {
        let script = format!(
            "curl -sS --fail {version} -H \"x-api-key: $API_KEY\" \
             -H \"Authorization: Bearer $API_KEY\" -H 'x-other: untouched' \
             https://{API}/echo"
        );
        let out = shell(&host, &script);
        assert!(out.status.success(), "{version}: {}", text(&out));
        let echoed = String::from_utf8_lossy(&out.stdout);
        assert!(
            !echoed.contains(REAL),
            "{version}: the echo gave the sandbox the value"
        );
        assert!(
            echoed.contains(&format!("Bearer {placeholder}")),
            "{version}: {echoed}"
        );
    }
    let requests = api.requests_to(API);
    assert_eq!(requests.len(), 2, "{requests:?}");
    for request in &requests {
        assert_eq!(header(request, "x-api-key"), Some(REAL), "{request}");
        assert_eq!(
            header(request, "authorization"),
            Some(format!("Bearer {REAL}").as_str()),
            "{request}"
        );
        assert_eq!(header(request, "x-other"), Some("untouched"), "{request}");
    }
    assert_eq!(requests[0]["version"], "HTTP/2.0", "{requests:?}");

    // To another allowed host: as sent, placeholder and all.
    let script = format!(
        "curl -sS --fail --cacert /workspace/test-ca.pem -H \"x-api-key: $API_KEY\" \
         https://{OTHER}/echo"
    );
    let out = shell(&host, &script);
    assert!(out.status.success(), "{}", text(&out));
    let others = api.requests_to(OTHER);
    assert_eq!(others.len(), 1, "{others:?}");
    assert_eq!(header(&others[0], "x-api-key"), Some(placeholder.as_str()));

    // The real value is nowhere inside: no environment, no file.
    let script = format!(
        "cat /proc/[0-9]*/environ 2>/dev/null | grep -c -a -F '{REAL}'; \
         grep -r -l -s -a -F --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev '{REAL}' / ; \
         echo searched"
    );
    let out = shell(&host, &script);
    let found = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(found.trim(), "0\nsearched", "{}", text(&out));

    // Killing the proxy fails closed; status says so.
    let status = host.status(&ws, "p").ok_or("no status")?;
    let proxy = &status["network"]["names"]["credential_proxy"];
    assert_eq!(proxy["running"], true, "{status}");
    assert_eq!(proxy["hosts"][0], API, "{status}");
    let pid = proxy["pid"].as_u64().ok_or("no proxy pid")?;
    lazaret_tests::domain::signal(pid, "KILL")?;
    wait_until(
        std::time::Duration::from_secs(10),
        "status to say the proxy is gone",
        || {
            let status = host.status(&ws, "p")?;
            (status["network"]["names"]["credential_proxy"]["running"] == false).then_some(status)
        },
    )
    .and_then(|status| {
        if status["state"] == "degraded" {
            Ok(())
        } else {
            Err(format!("a dead proxy looks alive: {status}").into())
        }
    })?;
    let out = shell(
        &host,
        &format!(
            "curl -sS --max-time 5 -o /dev/null -H \"x-api-key: $API_KEY\" https://{API}/echo"
        ),
    );
    assert!(!out.status.success(), "{}", text(&out));
    assert_eq!(api.requests_to(API).len(), 2, "nothing more arrived");
    down(&host, &ws)?;
    assert_nothing_left(&host);
    up(&host, &api)?;
    let out = shell(
        &host,
        &format!("curl -sS --fail -o /dev/null -H \"x-api-key: $API_KEY\" https://{API}/echo"),
    );
    assert!(out.status.success(), "{}", text(&out));
    let requests = api.requests_to(API);
    assert_eq!(header(&requests[2], "x-api-key"), Some(REAL));
    down(&host, &ws)?;
    assert_nothing_left(&host);

    // Nor is it anywhere the host keeps: stores, logs, runtime.
    host.assert_nowhere_on_disk(REAL);
    Ok(())
}

/// Claude Code, its key given only as a credential, completes a tool-using
/// exchange with the test API's scripted Messages API (streamed): its Bash
/// tool writes a file into /workspace. The API saw the real key; the
/// sandbox had only the placeholder.
fn claude_code() -> Result {
    const ANTHROPIC: &str = "api.anthropic.com";
    let image = crate::packaging::agent_image_ref().expect("gated on the image");
    let text_config = format!(
        "schema = \"lazaret-trusted-host-config-v2\"\n\
         [profiles.p]\nimage = \"{image}\"\npersistent_dirs = []\n\
         allow_hosts = [\"{ANTHROPIC}\"]\n\
         [[profiles.p.credentials]]\nenv = \"ANTHROPIC_API_KEY\"\nvalue = \"env:LZ_E2E_KEY\"\n\
         hosts = [\"{ANTHROPIC}\"]\n"
    );
    let (_serial, host) = crate::domain::host_with_config(&text_config);
    TestNet::remove_stale()?;
    let net = TestNet::new()?;
    let dns_log = host.base().join("dnsmasq.log");
    let api_address = ALLOWED_NET_HOST.to_string();
    let _dns = dns_server_for(&net, &dns_log, &[(ANTHROPIC, &api_address)])?;
    let api = Api::start(&net, &host, ANTHROPIC)?;
    let ws = host.workspace.clone();
    up(&host, &api)?;
    let out = host.lazaret(
        &ws,
        &[
            "attach",
            "p",
            "--",
            "sh",
            "-c",
            "cd /workspace && DISABLE_TELEMETRY=1 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 \
             DISABLE_AUTOUPDATER=1 timeout 120 claude -p 'Write the file, please.' \
             --allowedTools Bash --output-format text </dev/null",
        ],
    );
    let wrote = ws.join("agent-wrote.txt");
    assert!(
        out.status.success() && wrote.exists(),
        "claude did not complete the exchange: {}\nrequests: {:?}",
        text(&out),
        api.requests_to(ANTHROPIC)
    );
    assert_eq!(
        std::fs::read_to_string(&wrote)?.trim(),
        "credential-proxy-ok"
    );
    let messages: Vec<Value> = api
        .requests_to(ANTHROPIC)
        .into_iter()
        .filter(|r| {
            r["path"]
                .as_str()
                .is_some_and(|p| p.starts_with("/v1/messages"))
        })
        .collect();
    assert!(messages.len() >= 2, "{messages:?}");
    for request in &messages {
        assert_eq!(header(request, "x-api-key"), Some(REAL), "{request}");
    }
    let out = shell(&host, "printf %s \"$ANTHROPIC_API_KEY\"");
    let inside = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        inside.starts_with("sk-ant-api03-") && inside != REAL,
        "{inside}"
    );
    down(&host, &ws)?;
    assert_nothing_left(&host);
    host.assert_nowhere_on_disk(REAL);
    Ok(())
}
