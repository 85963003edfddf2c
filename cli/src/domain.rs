//! `lazaret up`, `down`, `status` and `logs`: what the user sees of a
//! Domain's lifecycle. The work happens in the Host Coordinator; this module
//! starts it, follows it, prints, and asks the developer the one question
//! `up` may have: whether to share host paths the last generation kept
//! from the sandbox that the workspace's git rules now share.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Duration;

use lazaret_proto::control::{
    ControlRequest, ControlResponse, DomainStatus, FailureKind, IgnoreChanges,
    IgnoreChangesOutcome, StartupEvent, StartupReply,
};
use lazaret_proto::router::WorkspaceChanges;

use super::progress::{Mode, Progress};
use super::view::{SilentView, StatusList, StatusView, path_text, paths_text};
use super::{Failure, Globals, failure, print, print_json, print_json_line};
use crate::config::HostEnvironment;
use crate::lifecycle::client::{self, ClientError, RequestError};
use crate::lifecycle::daemon::IgnoreChangesMode;
use crate::lifecycle::{DomainPaths, chain};

impl From<ClientError> for Failure {
    fn from(error: ClientError) -> Self {
        failure(chain(&error))
    }
}

fn locate(globals: &Globals, profile: &str) -> Result<(PathBuf, DomainPaths), Failure> {
    let workspace = globals.workspace_dir()?;
    let paths = DomainPaths::locate(profile, &workspace, &HostEnvironment::capture())?;
    Ok((workspace, paths))
}

/// The host variables the profile's `env:` references and credentials
/// name, which the coordinator is given; none when the configuration does
/// not load (the coordinator loads it again and reports why).
fn referenced_variables(globals: &Globals, profile: &str) -> Vec<String> {
    globals
        .load_with(profile, crate::config::EnvValues::Skip)
        .map(|resolved| {
            let credentials = resolved.fingerprint_record().credentials();
            resolved
                .record()
                .environment_references
                .iter()
                .map(|r| r.host_name.clone())
                .chain(credentials.iter().map(|c| c.host_name.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// The outcome of `up` as `--json` prints it, after the progress lines.
#[derive(serde::Serialize)]
struct UpView {
    event: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<StatusView>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    differences: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    step: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
}

/// `lazaret up PROFILE [--quiet | --json] [--accept-ignore-changes]`.
pub fn up(globals: &Globals, profile: &str, mode: Mode, accept: bool) -> Result<(), Failure> {
    let (workspace, paths) = locate(globals, profile)?;
    // Asked only where a developer can answer: a terminal, and no JSON
    // for a program to read.
    let ignore_changes = if accept {
        IgnoreChangesMode::Accept
    } else if mode != Mode::Json && std::io::stdin().is_terminal() {
        IgnoreChangesMode::Ask
    } else {
        IgnoreChangesMode::Keep
    };
    let mut progress = Progress::new(mode);
    let referenced = referenced_variables(globals, profile);
    let log_file = paths.log_file();
    let start = client::Start {
        profile,
        config: globals.config.as_ref(),
        workspace: &workspace,
        referenced: &referenced,
        log_hint: &log_file,
        ignore_changes,
    };
    let outcome = client::run_coordinator(&start, &mut |event| {
        progress.event(event);
        match event {
            StartupEvent::IgnoreChanges(changes) => show_ignore_changes(changes, profile, mode),
            _ => None,
        }
    })?;
    drop(progress);
    let view = |event, status: Option<&DomainStatus>| UpView {
        event,
        status: status.map(StatusView::of),
        differences: Vec::new(),
        step: None,
        message: None,
    };
    let show = |view: &UpView, text: String| match mode {
        Mode::Json => print_json_line(view),
        Mode::Quiet => Ok(()),
        Mode::Human => print(&text),
    };
    match outcome {
        StartupEvent::Ready(status) => show(
            &view("ready", Some(&status)),
            format!(
                "Domain {} is up: profile `{profile}`, generation {}, image {}\n\
                 open a shell inside with: lazaret attach {profile}\n",
                status.domain_id,
                status.generation_id,
                status.configuration.base().image
            ),
        ),
        StartupEvent::AlreadyRunning {
            status,
            differences,
        } if differences.is_empty() => show(
            &view("already_running", Some(&status)),
            format!(
                "Domain {} is already up with this configuration (generation {})\n",
                status.domain_id, status.generation_id
            ),
        ),
        StartupEvent::AlreadyRunning {
            status,
            differences,
        } => {
            let message = format!(
                "Domain {} is up (generation {}) with another configuration: {} differ{}; \
                 run `lazaret down {profile}` first, then `lazaret up {profile}`",
                status.domain_id,
                status.generation_id,
                differences.join(", "),
                if differences.len() == 1 { "s" } else { "" }
            );
            if mode == Mode::Json {
                print_json_line(&UpView {
                    differences,
                    message: Some(message.clone()),
                    ..view("already_running_differently", Some(&status))
                })?;
            }
            Err(failure(message))
        }
        StartupEvent::Failed {
            step,
            kind,
            failure: account,
        } => {
            let message = match kind {
                FailureKind::InvalidConfiguration => account.to_string(),
                FailureKind::Failed => format!(
                    "up failed at {}: {account}; nothing of the generation is left running \
                     (log: {})",
                    step.as_str(),
                    paths.log_file().display()
                ),
            };
            if mode == Mode::Json {
                print_json_line(&UpView {
                    step: Some(step.as_str()),
                    message: Some(message.clone()),
                    ..view("failed", None)
                })?;
            }
            Err(Failure {
                message,
                status: kind.exit_code(),
            })
        }
        other => Err(failure(format!(
            "unexpected report from the coordinator: {other:?}"
        ))),
    }
}

/// Shows the host paths the last generation kept from the sandbox that the
/// rules now share (`--json` shows them as progress does), and, when the
/// coordinator asks, asks the developer on this terminal: only `y` or
/// `yes` shares them.
fn show_ignore_changes(changes: &IgnoreChanges, profile: &str, mode: Mode) -> Option<StartupReply> {
    let asking = changes.outcome == IgnoreChangesOutcome::Asking;
    if mode == Mode::Json {
        // Never asked with `--json`; a question is answered no.
        return asking.then_some(StartupReply::ShareIgnoreChanges(false));
    }
    let named: Vec<String> = changes.paths.iter().map(path_text).collect();
    let text = match changes.outcome {
        IgnoreChangesOutcome::Asking => format!(
            "\nThe last generation of this Domain kept these host paths from the sandbox, and \
             the workspace's git rules now share them (a .gitignore was edited, or a path was \
             added to the index):\n  {}\nReview `git diff .gitignore` and `git diff --cached` \
             before you agree.\nShare them with the sandbox? [y/N] ",
            paths_text(&named, changes.count, "\n  ")
        ),
        IgnoreChangesOutcome::Kept => format!(
            "kept hidden from the sandbox for this generation, although the workspace's git \
             rules now share them: {}; to share them, review `git diff .gitignore` and `git \
             diff --cached`, then run `lazaret down {profile}` and `lazaret up {profile} \
             --accept-ignore-changes`\n",
            paths_text(&named, changes.count, ", ")
        ),
        IgnoreChangesOutcome::Accepted if mode == Mode::Quiet => return None,
        IgnoreChangesOutcome::Accepted => format!(
            "now shared with the sandbox, as accepted: {}\n",
            paths_text(&named, changes.count, ", ")
        ),
    };
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(text.as_bytes()).and_then(|()| err.flush());
    drop(err);
    if !asking {
        return None;
    }
    // Keys typed before the question are not its answer.
    let stdin = std::io::stdin();
    let _ = rustix::termios::tcflush(&stdin, rustix::termios::QueueSelector::IFlush);
    let mut line = String::new();
    let share = match stdin.read_line(&mut line) {
        Ok(_) => matches!(line.trim().to_ascii_lowercase().as_str(), "y" | "yes"),
        Err(_) => false,
    };
    Some(StartupReply::ShareIgnoreChanges(share))
}

/// How long `down` waits for a coordinator that holds the Domain but does
/// not answer yet (starting) or any more (stopping), as `up` waits.
const OWNER_WAIT: Duration = Duration::from_secs(120);

/// `lazaret down PROFILE [--json]`.
pub fn down(globals: &Globals, profile: &str, json: bool) -> Result<(), Failure> {
    let (_, paths) = locate(globals, profile)?;
    let deadline = std::time::Instant::now() + OWNER_WAIT;
    loop {
        // Asking, stopping and exiting share one bound.
        let bound = std::time::Instant::now() + client::DOWN_TIMEOUT;
        match client::request(&paths, ControlRequest::Down, client::DOWN_TIMEOUT) {
            Ok(ControlResponse::Stopped {
                generation_id,
                workspace_changes,
            }) => {
                client::wait_released(&paths, bound, client::DOWN_TIMEOUT)?;
                if json {
                    return print_json_line(&DownView::stopped(
                        &paths,
                        generation_id,
                        &workspace_changes,
                    ));
                }
                print(&format!(
                    "Domain {} stopped (generation {generation_id}); persistent state kept\n",
                    paths.domain_id
                ))?;
                warn_of_changes(&workspace_changes);
                return Ok(());
            }
            Ok(ControlResponse::Failed { failure: account }) => {
                return Err(failure(account.to_string()));
            }
            Ok(other) => {
                return Err(failure(format!(
                    "unexpected answer from the coordinator: {other:?}"
                )));
            }
            Err(e @ (RequestError::NoAnswer { .. } | RequestError::Channel { .. })) => {
                return Err(failure(format!(
                    "cannot ask Domain {}'s coordinator to stop: {}",
                    paths.domain_id,
                    chain(&e)
                )));
            }
            // No coordinator answers: finish whatever a crashed one left,
            // from the records alone (the profile need not load any more).
            // One that holds the Domain while starting or stopping is
            // waited for.
            Err(RequestError::NotRunning) => {
                let roots = super::state::roots(globals)?;
                match super::state::recover(&roots, paths.domain_id)? {
                    super::state::Recovered::Done(recovered) => {
                        return if json {
                            print_json_line(&DownView::recovered(&paths, recovered))
                        } else {
                            print(&match recovered {
                                Some(generation) => format!(
                                    "Domain {} was not running; cleaned up stale generation \
                                     {}\n",
                                    paths.domain_id, generation.0
                                ),
                                None => format!("Domain {} is not running\n", paths.domain_id),
                            })
                        };
                    }
                    super::state::Recovered::Busy if std::time::Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    super::state::Recovered::Busy => {
                        return Err(failure(format!(
                            "another Lazaret process has held Domain {} for {} s without \
                             answering; a `lazaret up` may be waiting for an answer to its \
                             question (answer it there); if it is stuck, end it and run \
                             `lazaret down {profile}` again",
                            paths.domain_id,
                            OWNER_WAIT.as_secs()
                        )));
                    }
                }
            }
        }
    }
}

/// The outcome of `down` as `--json` prints it.
#[derive(serde::Serialize)]
struct DownView {
    /// `stopped`, `recovered` (a stale generation was cleaned up) or
    /// `not_running`.
    event: &'static str,
    domain_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    generation_id: Option<u64>,
    /// What changed below directories holding scripts the host's git runs.
    workspace_changes: Vec<ChangeView>,
    /// How many changes there were in all (more than listed when the list
    /// was cut).
    workspace_changes_total: u64,
    /// Directories not compared: they hold more entries than Lazaret
    /// compares.
    workspace_unchecked: Vec<String>,
}

#[derive(serde::Serialize)]
struct ChangeView {
    path: String,
    change: &'static str,
}

impl DownView {
    fn stopped(
        paths: &DomainPaths,
        generation: lazaret_proto::ids::GenerationId,
        changes: &WorkspaceChanges,
    ) -> Self {
        DownView {
            event: "stopped",
            domain_id: paths.domain_id.to_string(),
            generation_id: Some(generation.0),
            workspace_changes: changes
                .changes
                .iter()
                .map(|c| ChangeView {
                    path: path_text(&c.path),
                    change: c.change.as_str(),
                })
                .collect(),
            workspace_changes_total: changes.total,
            workspace_unchecked: changes.unchecked.iter().map(path_text).collect(),
        }
    }

    fn recovered(
        paths: &DomainPaths,
        generation: Option<lazaret_proto::ids::GenerationId>,
    ) -> Self {
        DownView {
            event: if generation.is_some() {
                "recovered"
            } else {
                "not_running"
            },
            domain_id: paths.domain_id.to_string(),
            generation_id: generation.map(|g| g.0),
            workspace_changes: Vec::new(),
            workspace_changes_total: 0,
            workspace_unchecked: Vec::new(),
        }
    }
}

/// Tells the developer, on standard error, what changed below directories
/// holding scripts the host's git runs; nothing when nothing did.
fn warn_of_changes(changes: &WorkspaceChanges) {
    let mut text = String::new();
    if changes.total > 0 {
        text.push_str(
            "warning: these files changed since up below directories holding scripts your git \
             runs (a hook, a filter, a diff or merge driver), which your next git command may \
             run or load; review them first:\n",
        );
        for change in &changes.changes {
            text.push_str(&format!(
                "  {:<8} {}\n",
                change.change.as_str(),
                change.path
            ));
        }
        let listed = changes.changes.len() as u64;
        if changes.total > listed {
            text.push_str(&format!("  and {} more\n", changes.total - listed));
        }
    }
    for dir in &changes.unchecked {
        let shown = if dir.as_bytes().is_empty() {
            ".".to_owned()
        } else {
            dir.to_string()
        };
        text.push_str(&format!(
            "warning: {shown} holds scripts your git runs but more than {} entries, more than \
             Lazaret compares: review what changed there before your next git command\n",
            lazaret_routing::watch::MAX_ENTRIES
        ));
    }
    if !text.is_empty() {
        eprint!("{}", super::printable(&text));
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
            let workspace = lazaret_hostfs::plan::canonicalize(&globals.workspace_dir()?)
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
    let views: Vec<StatusView> = statuses.iter().map(StatusView::of).collect();
    if as_json {
        let list = StatusList {
            domains: views,
            not_answering: silent
                .iter()
                .map(|(paths, e)| SilentView {
                    domain_id: paths.domain_id.to_hex(),
                    error: chain(e),
                })
                .collect(),
        };
        print_json(&list)?;
        return silent_failure().map_or(Ok(()), Err);
    }
    if let Some(failure) = silent_failure() {
        if !views.is_empty() {
            print(&texts(&views))?;
        }
        return Err(failure);
    }
    if views.is_empty() {
        let scope = match (profile, all) {
            (Some(p), _) => format!("profile `{p}` is not running in this workspace"),
            (None, true) => "no Domain is running".into(),
            (None, false) => "no Domain is running in this workspace (try --all)".into(),
        };
        return print(&format!("{scope}\n"));
    }
    print(&texts(&views))
}

fn texts(views: &[StatusView]) -> String {
    views
        .iter()
        .map(StatusView::text)
        .collect::<Vec<_>>()
        .join("\n")
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
