//! `lazaret up`, `down`, `status` and `logs`: what the user sees of a
//! Domain's lifecycle. The work happens in the Host Coordinator; this module
//! starts it, follows it, and prints.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Duration;

use lazaret_proto::control::{
    ControlRequest, ControlResponse, DomainStatus, NetworkRecheck, NetworkStatus, StartupEvent,
};
use lazaret_proto::ids::to_hex;
use lazaret_proto::network::{DnsOutcome, PolicyAction};
use serde_json::{Value, json};

use super::{Failure, Globals, failure, print};
use crate::config::HostEnvironment;
use crate::lifecycle::client::{self, ClientError, CoordinatorMode, RequestError};
use crate::lifecycle::{DomainPaths, chain};

/// How long `down` waits for the coordinator to exit after stopping.
const EXIT_WAIT: Duration = Duration::from_secs(30);

impl From<ClientError> for Failure {
    fn from(error: ClientError) -> Self {
        failure(chain(&error))
    }
}

/// Prints startup progress to standard error: one line per step, and a
/// bar redrawn in place for long steps on a terminal.
struct Progress {
    terminal: bool,
    bar_open: bool,
}

impl Progress {
    fn new() -> Self {
        Self {
            terminal: std::io::stderr().is_terminal(),
            bar_open: false,
        }
    }

    fn event(&mut self, event: &StartupEvent) {
        let StartupEvent::Progress {
            step,
            detail,
            fraction,
        } = event
        else {
            return self.close_bar();
        };
        let detail = super::printable(detail);
        let mut err = std::io::stderr().lock();
        match fraction {
            Some((done, total)) if self.terminal && *total > 0 => {
                let width = 30;
                let filled = usize::try_from(done.saturating_mul(width) / total)
                    .unwrap_or(0)
                    .min(30);
                let _ = write!(
                    err,
                    "\r\x1b[K{:>13}  [{}{}] {detail}",
                    step.as_str(),
                    "#".repeat(filled),
                    " ".repeat(30 - filled)
                );
                self.bar_open = true;
            }
            Some(_) => {}
            None => {
                if self.bar_open {
                    let _ = writeln!(err);
                    self.bar_open = false;
                }
                let _ = writeln!(err, "{:>13}  {detail}", step.as_str());
            }
        }
    }

    fn close_bar(&mut self) {
        if self.bar_open {
            eprintln!();
            self.bar_open = false;
        }
    }
}

fn locate(globals: &Globals, profile: &str) -> Result<(PathBuf, DomainPaths), Failure> {
    let workspace = globals.workspace_dir()?;
    let paths = DomainPaths::locate(profile, &workspace, &HostEnvironment::capture())?;
    Ok((workspace, paths))
}

/// The host variables the profile's `env:` references name, which the
/// coordinator is given; none when the configuration does not load (the
/// coordinator loads it again and reports why).
fn referenced_variables(globals: &Globals, profile: &str) -> Vec<String> {
    globals
        .load_with(profile, crate::config::EnvValues::Skip)
        .map(|resolved| {
            resolved
                .record()
                .environment_references
                .iter()
                .map(|r| r.host_name.clone())
                .collect()
        })
        .unwrap_or_default()
}

/// `lazaret up PROFILE`.
pub fn up(globals: &Globals, profile: &str) -> Result<(), Failure> {
    let (workspace, paths) = locate(globals, profile)?;
    let mut progress = Progress::new();
    let outcome = client::run_coordinator(
        CoordinatorMode::Start,
        profile,
        globals.config.as_ref(),
        &workspace,
        &referenced_variables(globals, profile),
        &paths.log_file(),
        &mut |event| progress.event(event),
    )?;
    match outcome {
        StartupEvent::Ready(status) => print(&format!(
            "Domain {} is up: profile `{profile}`, generation {}, image {}\n\
             open a shell inside with: lazaret attach {profile}\n",
            status.domain_id, status.generation_id, status.configuration.image
        )),
        StartupEvent::AlreadyRunning {
            status,
            differences,
        } if differences.is_empty() => print(&format!(
            "Domain {} is already up with this configuration (generation {})\n",
            status.domain_id, status.generation_id
        )),
        StartupEvent::AlreadyRunning {
            status,
            differences,
        } => Err(failure(format!(
            "Domain {} is up (generation {}) with another configuration: {} differ{}; \
             run `lazaret down {profile}` first, then `lazaret up {profile}`",
            status.domain_id,
            status.generation_id,
            differences.join(", "),
            if differences.len() == 1 { "s" } else { "" }
        ))),
        StartupEvent::Failed {
            step,
            message,
            invalid_configuration,
        } => Err(Failure {
            message: if invalid_configuration {
                message
            } else {
                format!(
                    "up failed at {}: {message}; nothing of the generation is left running \
                     (log: {})",
                    step.as_str(),
                    paths.log_file().display()
                )
            },
            status: if invalid_configuration { 2 } else { 1 },
        }),
        other => Err(failure(format!(
            "unexpected report from the coordinator: {other:?}"
        ))),
    }
}

/// `lazaret down PROFILE`.
pub fn down(globals: &Globals, profile: &str) -> Result<(), Failure> {
    let (workspace, paths) = locate(globals, profile)?;
    match client::request(&paths, ControlRequest::Down, client::DOWN_TIMEOUT) {
        Ok(ControlResponse::Stopped { generation_id }) => {
            client::wait_released(&paths, EXIT_WAIT)?;
            print(&format!(
                "Domain {} stopped (generation {generation_id}); persistent state kept\n",
                paths.domain_id
            ))
        }
        Ok(ControlResponse::Failed { message }) => Err(failure(message)),
        Ok(other) => Err(failure(format!(
            "unexpected answer from the coordinator: {other:?}"
        ))),
        Err(e @ (RequestError::NoAnswer { .. } | RequestError::Channel { .. })) => {
            Err(failure(format!(
                "cannot ask Domain {}'s coordinator to stop: {}",
                paths.domain_id,
                chain(&e)
            )))
        }
        Err(RequestError::NotRunning) => {
            // No coordinator answers: finish whatever a crashed one left.
            let outcome = client::run_coordinator(
                CoordinatorMode::Recover,
                profile,
                globals.config.as_ref(),
                &workspace,
                &referenced_variables(globals, profile),
                &paths.log_file(),
                &mut |_| {},
            )?;
            match outcome {
                StartupEvent::Recovered {
                    generation_id: Some(id),
                } => print(&format!(
                    "Domain {} was not running; cleaned up stale generation {id}\n",
                    paths.domain_id
                )),
                StartupEvent::Recovered {
                    generation_id: None,
                } => print(&format!("Domain {} is not running\n", paths.domain_id)),
                StartupEvent::AlreadyRunning { .. } => Err(failure(
                    "the Domain started while `down` ran; run `lazaret down` again",
                )),
                StartupEvent::Failed {
                    message,
                    invalid_configuration,
                    ..
                } => Err(Failure {
                    message,
                    status: if invalid_configuration { 2 } else { 1 },
                }),
                other => Err(failure(format!(
                    "unexpected report from the coordinator: {other:?}"
                ))),
            }
        }
    }
}

/// What the running Domains under the Runtime Root answered.
#[derive(Default)]
struct Running {
    /// The Domains that answered, by workspace and profile.
    answered: Vec<DomainStatus>,
    /// The Domains whose coordinator holds the socket but does not answer.
    silent: Vec<(DomainPaths, RequestError)>,
}

/// Asks every Domain under the Runtime Root for its status.
fn running_domains() -> Result<Running, Failure> {
    let root = HostEnvironment::capture()
        .runtime_root()?
        .join(crate::config::DOMAINS_DIR);
    let Ok(entries) = std::fs::read_dir(&root) else {
        return Ok(Running::default());
    };
    let mut out = Running::default();
    for entry in entries.flatten() {
        let Some(id) = entry
            .file_name()
            .to_str()
            .and_then(lazaret_proto::ids::DomainId::from_hex)
        else {
            continue;
        };
        let paths = DomainPaths::new(id, entry.path());
        match client::request(&paths, ControlRequest::Status, client::STATUS_TIMEOUT) {
            Ok(ControlResponse::Status(status)) => out.answered.push(*status),
            Ok(_) | Err(RequestError::NotRunning) => {}
            Err(e) => out.silent.push((paths, e)),
        }
    }
    out.answered
        .sort_by(|a, b| (&a.workspace, &a.profile).cmp(&(&b.workspace, &b.profile)));
    Ok(out)
}

fn status_json(status: &DomainStatus) -> Value {
    let process = |p: &lazaret_proto::process::PidfsProcessIdentityV1| json!({"pid": p.host_pid, "start_time_ticks": p.start_time_ticks});
    let uptime = lazaret_proto::common::UnixTimeNs::now()
        .as_secs()
        .saturating_sub(status.started_at.as_secs());
    let routing = &status.workspace_routing;
    // A dead participant never looks alive: a generation whose router
    // exited serves no workspace.
    let mut problems: Vec<String> = routing.problem(&status.profile).into_iter().collect();
    problems.extend(recheck_problem(&status.network.recheck));
    let state = if problems.is_empty() {
        format!("{:?}", status.state).to_lowercase()
    } else {
        "degraded".to_owned()
    };
    json!({
        "profile": status.profile,
        "domain_id": status.domain_id.to_hex(),
        "workspace": String::from_utf8_lossy(&status.workspace.0),
        "state": state,
        "problems": problems,
        "generation": status.generation_id.0,
        "uptime_seconds": uptime,
        "configuration_fingerprint": status.configuration_fingerprint.to_hex(),
        "image": status.configuration.image,
        "manifest_digest": status.manifest_digest.to_oci_string(),
        "container_id": to_hex(&status.container_id.0),
        "runsc_root": String::from_utf8_lossy(&status.runtime_root.0),
        "persistent_dirs": status.configuration.persistent_dirs,
        "coordinator": process(&status.coordinator),
        "supervisor": process(&status.supervisor),
        "namespace_holder": process(&status.namespace_holder),
        "sandbox": process(&status.sandbox),
        "sessions": status.sessions.iter().map(|s| json!({
            "session_id": s.session_id.to_hex(),
            "command": s.command,
            "terminal": s.terminal,
            "opened_at_unix": s.opened_at.as_secs(),
        })).collect::<Vec<_>>(),
        "network": network_json(&status.network),
        "storage": {
            "ephemeral_upper": status.storage.ephemeral_upper.map(|t| json!({
                "used_bytes": t.used_bytes, "size_bytes": t.size_bytes,
            })),
            "persistent_uppers": status.storage.persistent_uppers.iter().map(|p| json!({
                "sandbox_path": p.sandbox_path, "bytes": p.bytes, "complete": p.complete,
            })).collect::<Vec<_>>(),
        },
        "workspace_routing": {
            "isolate_gitignored": routing.isolate_ignored,
            "repository": routing.repository.as_ref().map(|r| String::from_utf8_lossy(&r.0).into_owned()),
            "workspace_ignored": routing.workspace_ignored,
            "isolated_root": String::from_utf8_lossy(&routing.isolated_root.0),
            "scopes": routing.summary.scopes,
            "ignore_files": routing.summary.ignore_files,
            "tracked_ignored": routing.summary.tracked_ignored,
            "configured_read_only": routing.summary.read_only,
            "router": {
                "pid": routing.router.host_pid,
                "start_time_ticks": routing.router.start_time_ticks,
                "running": routing.router_running,
            },
        },
    })
}

/// What is wrong, if anything, with the network read back for this status.
fn recheck_problem(recheck: &NetworkRecheck) -> Option<String> {
    match recheck {
        NetworkRecheck::NotChecked | NetworkRecheck::Holds { .. } => None,
        NetworkRecheck::Differs { drift, .. } => Some(format!(
            "the sandbox's network no longer shows its attested policy: {}; run `lazaret down` \
             and `lazaret up` to install it again",
            drift
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        )),
        NetworkRecheck::Failed(detail) => Some(format!(
            "the sandbox's network could not be read back: {detail}"
        )),
    }
}

fn recheck_json(recheck: &NetworkRecheck) -> Value {
    match recheck {
        NetworkRecheck::NotChecked => json!({"state": "not_checked"}),
        NetworkRecheck::Holds { at } => json!({"state": "holds", "at_unix": at.as_secs()}),
        NetworkRecheck::Differs { at, drift } => json!({
            "state": "differs",
            "at_unix": at.as_secs(),
            "drift": drift.iter().map(ToString::to_string).collect::<Vec<_>>(),
        }),
        NetworkRecheck::Failed(detail) => json!({"state": "failed", "detail": detail}),
    }
}

fn network_json(network: &NetworkStatus) -> Value {
    let a = &network.attestation;
    let shown = |p: &lazaret_proto::network::IpPrefix| format!("{}/{}", p.address, p.prefix_len);
    // The profile's rules; the platform's denials are listed apart.
    let prefixes = |action| {
        network
            .policy
            .prefix_rules
            .iter()
            .filter(|r| r.action == action && !network.platform_deny.contains(&r.network))
            .map(|r| shown(&r.network))
            .collect::<Vec<_>>()
    };
    let dns_outcome = |o: &DnsOutcome| match o {
        DnsOutcome::Answered { response_code } => format!("answered rcode {response_code}"),
        DnsOutcome::TimedOut => "timed out".into(),
        DnsOutcome::Unreachable => "unreachable".into(),
    };
    json!({
        "state": "attested",
        "policy_digest": a.derived_policy_digest.to_hex(),
        "readiness_fingerprint": a.readiness_identity().fingerprint().map(|d| d.to_hex()).unwrap_or_default(),
        "allow": prefixes(PolicyAction::Allow),
        "deny": prefixes(PolicyAction::Deny),
        "platform_deny": network.platform_deny.iter().map(shown).collect::<Vec<_>>(),
        "unlisted": "unreachable",
        "ipv6": "disabled",
        "resolvers": network.policy.resolvers.iter().map(|r| r.address.to_string()).collect::<Vec<_>>(),
        "connectivity_helper": {
            "program": "slirp4netns",
            "pid": network.connectivity_helper.host_pid,
            "start_time_ticks": network.connectivity_helper.start_time_ticks,
        },
        "enforcement_namespace": {
            "device": a.enforcement_namespace.device,
            "inode": a.enforcement_namespace.inode,
        },
        "attested_at_unix": a.observed_at.as_secs(),
        "recheck": recheck_json(&network.recheck),
        "observed_routes": a.observation.observed_routes.len(),
        "denied_probes": a.denied_destinations.iter().map(|d| json!({
            "destination": d.destination.to_string(), "unreachable": d.unreachable,
        })).collect::<Vec<_>>(),
        "permitted_probes": a.permitted_destinations.iter().map(|p| json!({
            "destination": p.destination.to_string(), "reachable": p.reachable,
        })).collect::<Vec<_>>(),
        "dns": a.dns_observations.iter().map(|d| json!({
            "resolver": d.resolver.to_string(),
            "query": d.query_name,
            "outcome": dns_outcome(&d.outcome),
            "addresses": d.resolved_addresses.iter().map(ToString::to_string).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

/// One line on how the workspace is routed, and whether it still is.
fn routing_text(status: &DomainStatus) -> String {
    let r = &status.workspace_routing;
    let router = match r.problem(&status.profile) {
        None => format!("router pid {}", r.router.host_pid),
        Some(problem) => format!("DEGRADED: {problem}"),
    };
    let repository = match &r.repository {
        Some(root) => format!("git repository {}", String::from_utf8_lossy(&root.0)),
        None => "no git repository".to_owned(),
    };
    let ignored = match (r.isolate_ignored, r.workspace_ignored) {
        (false, _) => "ignored paths shared (isolate_gitignored = false)".to_owned(),
        (true, true) => "the repository ignores the whole workspace: all isolated".to_owned(),
        (true, false) => format!(
            "ignored paths isolated ({} ignore files, {} tracked kept)",
            r.summary.ignore_files, r.summary.tracked_ignored
        ),
    };
    let configured = match r.summary.read_only {
        0 => String::new(),
        n => format!(" and {n} paths its configuration runs"),
    };
    format!("{repository}; {ignored}; git config and hooks{configured} read-only; {router}")
}

fn status_text(status: &DomainStatus) -> String {
    let v = status_json(status);
    format!(
        "{profile}  {state}  generation {generation}  up {uptime}s  {workspace}\n\
         \x20 domain id        {domain}\n\
         \x20 image            {image} ({digest})\n\
         \x20 sandbox          container {container}, pid {sandbox}\n\
         \x20 supervisor       pid {supervisor}; coordinator pid {coordinator}\n\
         \x20 persistent dirs  {dirs}\n\
         \x20 workspace        {routing}\n\
         \x20   isolated in    {isolated}\n\
         \x20 sessions         {sessions}\n\
         \x20 network          attested: {routes} routes read back, {denied} denied and \
         {permitted} permitted destinations probed (policy {policy})\n\
         \x20   re-verified    {recheck}\n\
         \x20   allow          {allow}\n\
         \x20   deny           {deny}; anything unlisted; IPv6\n\
         \x20   platform deny  {platform}\n\
         \x20   egress         slirp4netns pid {helper}, host loopback disabled\n\
         \x20   dns            {dns}\n",
        routing = routing_text(status),
        isolated = v["workspace_routing"]["isolated_root"]
            .as_str()
            .unwrap_or_default(),
        routes = v["network"]["observed_routes"],
        denied = status.network.attestation.denied_destinations.len(),
        permitted = status.network.attestation.permitted_destinations.len(),
        policy = &status.network.attestation.derived_policy_digest.to_hex()[..16],
        allow = join_or_none(&v["network"]["allow"]),
        deny = join_or_none(&v["network"]["deny"]),
        platform = join_or_none(&v["network"]["platform_deny"]),
        helper = status.network.connectivity_helper.host_pid,
        recheck = match &status.network.recheck {
            NetworkRecheck::Holds { .. } =>
                "routes, rules and filter read back now: they hold".into(),
            NetworkRecheck::NotChecked => "not yet".into(),
            other => format!("NO: {}", recheck_problem(other).unwrap_or_default()),
        },
        dns = v["network"]["dns"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|d| format!(
                "{} ({}); queries leave through the host's resolver",
                d["resolver"].as_str().unwrap_or_default(),
                d["outcome"].as_str().unwrap_or_default()
            ))
            .collect::<Vec<_>>()
            .join("; "),
        profile = status.profile,
        state = v["state"].as_str().unwrap_or_default(),
        generation = status.generation_id,
        uptime = v["uptime_seconds"],
        workspace = v["workspace"].as_str().unwrap_or_default(),
        domain = status.domain_id,
        image = status.configuration.image,
        digest = status.manifest_digest.to_oci_string(),
        container = v["container_id"].as_str().unwrap_or_default(),
        sandbox = status.sandbox.host_pid,
        supervisor = status.supervisor.host_pid,
        coordinator = status.coordinator.host_pid,
        sessions = if status.sessions.is_empty() {
            "(none)".to_owned()
        } else {
            status
                .sessions
                .iter()
                .map(|s| {
                    if s.command.is_empty() {
                        "shell".to_owned()
                    } else {
                        s.command.join(" ")
                    }
                })
                .collect::<Vec<_>>()
                .join("; ")
        },
        dirs = persistent_text(status),
    )
}

/// The persistent dirs with what each upper holds, and the root's
/// ephemeral upper.
fn persistent_text(status: &DomainStatus) -> String {
    let mib = |bytes: u64| format!("{:.1} MiB", bytes as f64 / f64::from(1u32 << 20));
    let mut parts: Vec<String> = status
        .configuration
        .persistent_dirs
        .iter()
        .map(|dir| {
            match status
                .storage
                .persistent_uppers
                .iter()
                .find(|p| &p.sandbox_path == dir)
            {
                Some(p) if p.complete => format!("{dir} ({} kept)", mib(p.bytes)),
                Some(p) => format!("{dir} (at least {} kept)", mib(p.bytes)),
                None => dir.clone(),
            }
        })
        .collect();
    if parts.is_empty() {
        parts.push("(none)".to_owned());
    }
    if let Some(t) = status.storage.ephemeral_upper {
        parts.push(format!(
            "the rest of / {} of {} until down",
            mib(t.used_bytes),
            mib(t.size_bytes)
        ));
    }
    parts.join(", ")
}

/// The strings of a JSON array, comma-separated, or `(none)`.
fn join_or_none(list: &Value) -> String {
    let items: Vec<&str> = list
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if items.is_empty() {
        "(none)".into()
    } else {
        items.join(", ")
    }
}

/// `lazaret status [PROFILE] [--all] [--json]`.
pub fn status(
    globals: &Globals,
    profile: Option<&str>,
    all: bool,
    as_json: bool,
) -> Result<(), Failure> {
    let (statuses, silent) = match profile {
        Some(profile) => {
            let (_, paths) = locate(globals, profile)?;
            match client::request(&paths, ControlRequest::Status, client::STATUS_TIMEOUT) {
                Ok(ControlResponse::Status(status)) => (vec![*status], Vec::new()),
                Ok(_) | Err(RequestError::NotRunning) => (Vec::new(), Vec::new()),
                Err(e) => (Vec::new(), vec![(paths, e)]),
            }
        }
        None => {
            let workspace = crate::config::confined::canonicalize(&globals.workspace_dir()?)
                .map_err(|e| failure(format!("cannot resolve the workspace: {}", chain(&e))))?;
            let here = workspace.as_os_str().as_encoded_bytes().to_vec();
            let running = running_domains()?;
            let answered = running
                .answered
                .into_iter()
                .filter(|s| all || s.workspace.0 == here)
                .collect();
            // A silent Domain's workspace is unknown: it is named wherever
            // it is.
            (answered, running.silent)
        }
    };
    // A Domain that does not answer is named, never left out: its
    // coordinator holds the Domain and something is wrong with it.
    let silent_failure = || {
        (!silent.is_empty()).then(|| {
            failure(
                silent
                    .iter()
                    .map(|(paths, e)| {
                        format!("Domain {} does not answer: {}", paths.domain_id, chain(e))
                    })
                    .collect::<Vec<_>>()
                    .join("\n"),
            )
        })
    };
    if as_json {
        let list: Vec<Value> = statuses.iter().map(status_json).collect();
        let silent_list: Vec<Value> = silent
            .iter()
            .map(|(paths, e)| json!({"domain_id": paths.domain_id.to_hex(), "error": chain(e)}))
            .collect();
        let mut text =
            serde_json::to_string_pretty(&json!({ "domains": list, "not_answering": silent_list }))
                .map_err(|e| failure(e.to_string()))?;
        text.push('\n');
        print(&text)?;
        return silent_failure().map_or(Ok(()), Err);
    }
    if let Some(failure) = silent_failure() {
        if !statuses.is_empty() {
            print(
                &statuses
                    .iter()
                    .map(status_text)
                    .collect::<Vec<_>>()
                    .join("\n"),
            )?;
        }
        return Err(failure);
    }
    if statuses.is_empty() {
        let scope = match (profile, all) {
            (Some(p), _) => format!("profile `{p}` is not running in this workspace"),
            (None, true) => "no Domain is running".into(),
            (None, false) => "no Domain is running in this workspace (try --all)".into(),
        };
        return print(&format!("{scope}\n"));
    }
    print(
        &statuses
            .iter()
            .map(status_text)
            .collect::<Vec<_>>()
            .join("\n"),
    )
}

/// `lazaret logs PROFILE [-f] [--since WHEN]`.
pub fn logs(
    globals: &Globals,
    profile: &str,
    follow: bool,
    since: Option<&str>,
) -> Result<(), Failure> {
    let (_, paths) = locate(globals, profile)?;
    super::logs::logs(&paths, profile, follow, since)
}
