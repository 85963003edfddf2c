//! `lazaret up`, `down`, `status` and `logs`: what the user sees of a
//! Domain's lifecycle. The work happens in the Host Coordinator; this module
//! starts it, follows it, and prints.

use std::path::PathBuf;
use std::time::Duration;

use lazaret_proto::control::{
    ControlRequest, ControlResponse, DomainStatus, FailureKind, StartupEvent,
};

use super::progress::{Mode, Progress};
use super::view::{SilentView, StatusList, StatusView};
use super::{Failure, Globals, failure, print, print_json, print_json_line};
use crate::config::HostEnvironment;
use crate::lifecycle::client::{self, ClientError, RequestError};
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

/// `lazaret up PROFILE [--quiet | --json]`.
pub fn up(globals: &Globals, profile: &str, mode: Mode) -> Result<(), Failure> {
    let (workspace, paths) = locate(globals, profile)?;
    let mut progress = Progress::new(mode);
    let outcome = client::run_coordinator(
        profile,
        globals.config.as_ref(),
        &workspace,
        &referenced_variables(globals, profile),
        &paths.log_file(),
        &mut |event| progress.event(event),
    )?;
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
                status.domain_id, status.generation_id, status.configuration.image
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
            message,
        } => {
            let message = match kind {
                FailureKind::InvalidConfiguration => message,
                FailureKind::Failed => format!(
                    "up failed at {}: {message}; nothing of the generation is left running \
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

/// How long `down` waits for a coordinator that holds the Domain but does
/// not answer yet (starting) or any more (stopping), as `up` waits.
const OWNER_WAIT: Duration = Duration::from_secs(120);

/// `lazaret down PROFILE`.
pub fn down(globals: &Globals, profile: &str) -> Result<(), Failure> {
    let (_, paths) = locate(globals, profile)?;
    let deadline = std::time::Instant::now() + OWNER_WAIT;
    loop {
        // Asking, stopping and exiting share one bound.
        let bound = std::time::Instant::now() + client::DOWN_TIMEOUT;
        match client::request(&paths, ControlRequest::Down, client::DOWN_TIMEOUT) {
            Ok(ControlResponse::Stopped { generation_id }) => {
                client::wait_released(&paths, bound, client::DOWN_TIMEOUT)?;
                return print(&format!(
                    "Domain {} stopped (generation {generation_id}); persistent state kept\n",
                    paths.domain_id
                ));
            }
            Ok(ControlResponse::Failed { message }) => return Err(failure(message)),
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
                    super::state::Recovered::Done => return Ok(()),
                    super::state::Recovered::Busy if std::time::Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    super::state::Recovered::Busy => {
                        return Err(failure(format!(
                            "another Lazaret process has held Domain {} for {} s without \
                         answering; if it is stuck, end it and run `lazaret down {profile}` again",
                            paths.domain_id,
                            OWNER_WAIT.as_secs()
                        )));
                    }
                }
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
