//! The `lazaret` host CLI: argument parsing, and the `config` commands; the
//! others are in the modules beside it.
//!
//! This module owns what the user sees: messages, `--json` output and exit
//! codes (0 success, 1 failure or findings, 2 invalid configuration or
//! usage). It trusts the user's arguments only after
//! clap and the configuration loader have checked them.

#![forbid(unsafe_code)]

// The Host Coordinator's library, by the names the CLI has always used
// (its `state` records are `lazaret_coordinator::state`: `state` here is
// the CLI's own commands).
use lazaret_coordinator::{config, escalation, lifecycle, network, session};
use lazaret_hostfs::programs;
use lazaret_storage::image;

mod agents;
mod args;
mod attach;
mod domain;
mod generate;
mod kube;
mod logs;
mod progress;
mod prompt;
mod screen;
mod state;
mod view;

use std::ffi::OsString;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

use crate::config::{ConfigError, HostEnvironment, LoadRequest, ResolvedDomainConfiguration};
use crate::lifecycle::chain;
use args::{Cli, Command, ConfigCommand, ExportCommand};

/// The commented v2 template `lazaret config init` writes.
pub const CONFIG_TEMPLATE: &str = include_str!("template.toml");

/// Exit status for an invalid configuration or invalid usage.
const EXIT_INVALID: u8 = 2;

/// A failure the CLI reports and the status it exits with.
#[derive(Debug)]
struct Failure {
    message: String,
    status: u8,
}

/// A failure with exit status 1.
fn failure(message: impl Into<String>) -> Failure {
    Failure {
        message: message.into(),
        status: 1,
    }
}

impl From<ConfigError> for Failure {
    fn from(error: ConfigError) -> Self {
        Failure {
            message: format!("invalid configuration: {}", chain(&error)),
            status: EXIT_INVALID,
        }
    }
}

/// `text` as it may reach the developer's terminal: control characters
/// other than newline and tab escaped (a configuration value, an image
/// name or a file name could otherwise set the terminal's title or worse).
/// Nothing is cut: an error's reason and what to do come whole, however
/// long the path before them. What could be huge (a value quoted from the
/// configuration) is shortened where it is quoted
/// ([`lazaret_proto::config::quoted`]).
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() && c != '\t' && c != '\n' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Runs the CLI with the process's arguments.
pub fn run() -> ExitCode {
    let cli = Cli::parse();
    match dispatch(cli) {
        Ok(code) => ExitCode::from(code),
        Err(failure) => {
            eprintln!("lazaret: {}", printable(&failure.message));
            ExitCode::from(failure.status)
        }
    }
}

/// Runs one command; its exit code on success.
fn dispatch(cli: Cli) -> Result<u8, Failure> {
    let globals = Globals {
        config: cli.config,
        workspace: cli.workspace,
    };
    let done = match cli.command {
        Command::Config { command } => match command {
            ConfigCommand::Check { profile, json } => {
                config_check(&globals, &profile.profile, json)
            }
            ConfigCommand::Init { agent, name, image } => {
                config_init(&globals, agent, name.as_deref(), image.as_deref())
            }
        },
        Command::Up {
            profile,
            quiet,
            json,
            accept_ignore_changes,
        } => {
            let mode = match (quiet, json) {
                (_, true) => progress::Mode::Json,
                (true, _) => progress::Mode::Quiet,
                _ => progress::Mode::Human,
            };
            domain::up(&globals, &profile.profile, mode, accept_ignore_changes)
        }
        Command::Down { profile, json } => domain::down(&globals, &profile.profile, json),
        Command::Attach { profile, command } => {
            let command = command
                .into_iter()
                .map(|arg| {
                    arg.into_string().map_err(|arg| Failure {
                        message: format!("the command argument {arg:?} is not valid UTF-8"),
                        status: EXIT_INVALID,
                    })
                })
                .collect::<Result<Vec<String>, Failure>>()?;
            return attach::attach(&globals, &profile.profile, command);
        }
        Command::Status { profile, all, json } => {
            domain::status(&globals, profile.as_deref(), all, json)
        }
        Command::Logs {
            profile,
            follow,
            since,
        } => domain::logs(&globals, &profile.profile, follow, since.as_deref()),
        Command::State { command } => return state::run(&globals, command),
        Command::Image { command } => return state::image(&globals, command),
        Command::Export {
            target:
                ExportCommand::Kube {
                    profile,
                    image,
                    fqdn_policy,
                },
        } => {
            let resolved = globals.load_with(&profile.profile, config::EnvValues::Skip)?;
            kube::export(&resolved, image.as_deref(), fqdn_policy)
        }
        Command::Completions { shell } => generate::completions(shell),
        Command::ManPages { dir } => generate::man_pages(&dir),
    };
    done.map(|()| 0)
}

/// Options accepted before or after every subcommand.
struct Globals {
    config: Option<OsString>,
    workspace: Option<PathBuf>,
}

impl Globals {
    /// The workspace: `--workspace`, else the current directory; absolute.
    fn workspace_dir(&self) -> Result<PathBuf, Failure> {
        let cwd = || {
            std::env::current_dir().map_err(|e| Failure {
                message: format!("cannot determine the current directory to use as workspace: {e}"),
                status: 1,
            })
        };
        match &self.workspace {
            Some(dir) if dir.is_absolute() => Ok(dir.clone()),
            Some(dir) => Ok(cwd()?.join(dir)),
            None => cwd(),
        }
    }

    fn load(&self, profile: &str) -> Result<ResolvedDomainConfiguration, Failure> {
        self.load_with(profile, config::EnvValues::Read)
    }

    /// [`Self::load`], reading the `env:` values or not.
    fn load_with(
        &self,
        profile: &str,
        env_values: config::EnvValues,
    ) -> Result<ResolvedDomainConfiguration, Failure> {
        let workspace = self.workspace_dir()?;
        let host = HostEnvironment::capture();
        Ok(config::load_with(
            LoadRequest {
                profile,
                config: self.config.as_deref(),
                workspace: &workspace,
                host: &host,
            },
            env_values,
        )?)
    }
}

/// Writes `text` to stdout; a closed pipe is not an error.
/// Writes `value` as pretty JSON and a newline to standard output.
fn print_json(value: &impl serde::Serialize) -> Result<(), Failure> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| failure(format!("cannot encode the answer as JSON: {e}")))?;
    print(&format!("{text}\n"))
}

/// `value` as one line of JSON on standard output (a stream of events).
fn print_json_line(value: &impl serde::Serialize) -> Result<(), Failure> {
    let text = serde_json::to_string(value)
        .map_err(|e| failure(format!("cannot encode the answer as JSON: {e}")))?;
    print(&format!("{text}\n"))
}

fn print(text: &str) -> Result<(), Failure> {
    print_bytes(text.as_bytes())
}

fn print_bytes(bytes: &[u8]) -> Result<(), Failure> {
    let mut out = io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(Failure {
            message: format!("cannot write to standard output: {e}"),
            status: 1,
        }),
    }
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn config_check(globals: &Globals, profile: &str, as_json: bool) -> Result<(), Failure> {
    let resolved = globals.load(profile)?;
    // The network policy `up` would install: one that cannot be installed
    // is refused here too.
    let invalid = |error: &dyn std::error::Error| Failure {
        message: format!("invalid configuration: {}", chain(error)),
        status: EXIT_INVALID,
    };
    let host = crate::network::HostNetwork::read().map_err(|e| Failure {
        message: chain(&e),
        status: 1,
    })?;
    let planned =
        crate::network::PlannedNetwork::new(resolved.network(), &host).map_err(|e| invalid(&e))?;
    let policy_digest = planned.policy.digest().map_err(|e| invalid(&e))?;
    let report = ConfigReport::of(&resolved, &planned, &policy_digest);
    if as_json {
        return print_json(&report);
    }
    print(&report.text())?;
    for warning in &report.warnings {
        eprintln!("lazaret: warning: {}", printable(warning));
    }
    Ok(())
}

/// What `config check` warns about in a valid profile: where DNS is a way
/// out, and where names cannot resolve although the sandbox may connect.
fn config_warnings(resolved: &ResolvedDomainConfiguration) -> Vec<String> {
    use lazaret_proto::config::SCHEMA_ID_V2;
    use lazaret_proto::names::DnsMode;
    let profile = resolved.profile();
    let network = resolved.network();
    let mut warnings = Vec::new();
    match resolved.schema() {
        config::ConfigSchema::V1 => warnings.push(format!(
            "this is a v1 configuration: profile `{profile}` reaches hosts by address only, \
             and every name its sandbox looks up leaves through the host's resolver (DNS is a \
             way out of the sandbox). v2 (schema = \"{SCHEMA_ID_V2}\") adds allow_hosts, egress by \
             host name, and a resolver that answers only the allowed names; to migrate, change \
             the schema line and list the hosts each profile needs (docs/config.md, \
             \"Migrating from v1\")"
        )),
        config::ConfigSchema::V2 => match network.dns {
            DnsMode::Host => warnings.push(format!(
                "profile `{profile}` has dns = \"host\": DNS is a way out of the sandbox. \
                 Every name the sandbox looks up leaves through the host's resolver, so data \
                 can leave in the names themselves whatever the allow lists say; remove the \
                 line to let Lazaret's resolver answer only the names in allow_hosts"
            )),
            DnsMode::Lazaret if network.hosts.is_empty() && !network.allow.is_empty() => warnings
                .push(format!(
                    "profile `{profile}` may connect to {} but no name resolves in its sandbox \
                     (allow_hosts is empty): list the host names it needs in allow_hosts",
                    view::join_or_none(
                        &network
                            .allow
                            .iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                    )
                )),
            DnsMode::Lazaret => {}
        },
    }
    warnings
}

/// What `lazaret config check` reports: `--json` is its serialization and
/// the text is made from the same fields.
#[derive(serde::Serialize)]
struct ConfigReport {
    profile: String,
    config: String,
    /// The `schema` the document declared.
    schema: &'static str,
    domain_id: String,
    configuration_fingerprint: String,
    workspace: String,
    storage_root: String,
    runtime_root: String,
    profile_dir: String,
    image: String,
    isolate_gitignored: bool,
    persistent_dirs: Vec<String>,
    volumes: Vec<VolumeReport>,
    /// Sandbox name → `env:HOST_NAME`; never the value.
    env: std::collections::BTreeMap<String, String>,
    effective_allow: Vec<String>,
    effective_deny: Vec<String>,
    /// The host names allowed, sorted (none for v1).
    allow_hosts: Vec<String>,
    /// Who answers DNS: `lazaret` or `host` (always `host` for v1).
    dns: &'static str,
    /// The credentials, sorted by variable; never a value.
    credentials: Vec<CredentialReport>,
    platform_deny: Vec<String>,
    network_policy_digest: String,
    escalation: EscalationReport,
    /// What the profile allows that deserves a second look; the text
    /// report prints them on standard error.
    warnings: Vec<String>,
}

#[derive(serde::Serialize)]
struct VolumeReport {
    host: String,
    container: String,
    kind: &'static str,
    access: &'static str,
    create: bool,
}

#[derive(serde::Serialize)]
struct CredentialReport {
    /// The sandbox variable, which holds a placeholder.
    env: String,
    /// `env:HOST_NAME`.
    value: String,
    /// The hosts that get the real value.
    hosts: Vec<String>,
}

#[derive(serde::Serialize)]
struct EscalationReport {
    enabled: bool,
    auto_approve: Vec<RuleReport>,
}

#[derive(serde::Serialize)]
struct RuleReport {
    executable: String,
    args: Vec<String>,
    allow_extra_args: bool,
}

impl ConfigReport {
    fn of(
        resolved: &ResolvedDomainConfiguration,
        planned: &crate::network::PlannedNetwork,
        policy_digest: &lazaret_proto::ids::Sha256Digest,
    ) -> Self {
        let record = resolved.record();
        let auth = resolved.authorities();
        let label = |dir: &config::RetainedDir| dir.label().display().to_string();
        let cidrs = |set: &[lazaret_proto::config::Ipv4Prefix]| -> Vec<String> {
            set.iter().map(ToString::to_string).collect()
        };
        ConfigReport {
            profile: resolved.profile().as_str().to_owned(),
            config: auth.config_file.canonical_label().display().to_string(),
            schema: resolved.schema().id(),
            domain_id: resolved.domain_id().to_hex(),
            configuration_fingerprint: resolved.fingerprint().to_hex(),
            workspace: label(&auth.workspace),
            storage_root: label(&auth.storage_root),
            runtime_root: label(&auth.runtime_root),
            profile_dir: label(&auth.profile_dir),
            image: record.image.clone(),
            isolate_gitignored: record.isolate_gitignored,
            persistent_dirs: record.persistent_dirs.clone(),
            volumes: record
                .volumes
                .iter()
                .map(|v| VolumeReport {
                    host: lossy(&v.canonical_host_source),
                    container: v.container_path.clone(),
                    kind: v.kind.as_str(),
                    access: v.access.as_str(),
                    create: v.create,
                })
                .collect(),
            env: record
                .environment_references
                .iter()
                .map(|r| (r.sandbox_name.clone(), format!("env:{}", r.host_name)))
                .collect(),
            effective_allow: cidrs(&resolved.network().allow),
            effective_deny: cidrs(&resolved.network().deny),
            allow_hosts: resolved
                .network()
                .hosts
                .iter()
                .map(ToString::to_string)
                .collect(),
            dns: lazaret_proto::config::dns_mode_spelling(resolved.network().dns),
            credentials: resolved
                .fingerprint_record()
                .credentials()
                .iter()
                .map(|c| CredentialReport {
                    env: c.sandbox_name.clone(),
                    value: format!("env:{}", c.host_name),
                    hosts: c.hosts.iter().map(ToString::to_string).collect(),
                })
                .collect(),
            platform_deny: planned
                .platform_deny
                .iter()
                .map(|p| format!("{}/{}", p.address, p.prefix_len))
                .collect(),
            network_policy_digest: policy_digest.to_hex(),
            escalation: EscalationReport {
                enabled: record.escalation_enabled,
                auto_approve: record
                    .auto_approval_rules
                    .iter()
                    .map(|r| RuleReport {
                        executable: lossy(&r.canonical_executable),
                        args: r.args.clone(),
                        allow_extra_args: r.allow_extra_args,
                    })
                    .collect(),
            },
            warnings: config_warnings(resolved),
        }
    }

    /// The report for people: one aligned line per field.
    fn text(&self) -> String {
        use view::join_or_none as list;
        let mut lines = vec![format!(
            "configuration valid: profile `{}` in {}",
            self.profile, self.config
        )];
        let mut row = |key: &str, value: String| lines.push(format!("  {key:<17}{value}"));
        row("schema", self.schema.into());
        row("domain id", self.domain_id.clone());
        row("fingerprint", self.configuration_fingerprint.clone());
        row("workspace", self.workspace.clone());
        row("storage root", self.storage_root.clone());
        row("runtime root", self.runtime_root.clone());
        row("profile dir", self.profile_dir.clone());
        row("image", self.image.clone());
        row("isolate ignored", self.isolate_gitignored.to_string());
        row("persistent dirs", list(&self.persistent_dirs));
        for v in &self.volumes {
            row(
                "volume",
                format!(
                    "{} -> {} ({}, {}{})",
                    v.host,
                    v.container,
                    v.kind,
                    v.access,
                    if v.create { ", created if missing" } else { "" },
                ),
            );
        }
        for (name, reference) in &self.env {
            row("env", format!("{name} = {reference}"));
        }
        row("egress allow", list(&self.effective_allow));
        row("egress deny", list(&self.effective_deny));
        if self.schema != lazaret_proto::config::SCHEMA_ID {
            row("egress hosts", list(&self.allow_hosts));
            row(
                "dns",
                match self.dns {
                    "host" => "host (the host's resolver answers every name)",
                    _ => "lazaret (answers only the names allowed)",
                }
                .into(),
            );
            for c in &self.credentials {
                row(
                    "credential",
                    format!(
                        "{} = {} (placeholder in the sandbox; the value goes to {})",
                        c.env,
                        c.value,
                        c.hosts.join(", ")
                    ),
                );
            }
        }
        row("platform deny", list(&self.platform_deny));
        row(
            "escalation",
            if self.escalation.enabled {
                "enabled"
            } else {
                "disabled"
            }
            .into(),
        );
        for r in &self.escalation.auto_approve {
            row(
                "auto-approve",
                format!(
                    "{} {}{}",
                    r.executable,
                    list(&r.args),
                    if r.allow_extra_args { " ..." } else { "" }
                ),
            );
        }
        let mut text = lines.join("\n");
        text.push('\n');
        text
    }
}

fn config_init(
    globals: &Globals,
    agent: Option<agents::Agent>,
    name: Option<&str>,
    image: Option<&str>,
) -> Result<(), Failure> {
    let host = HostEnvironment::capture();
    let path = host.config_path(globals.config.as_deref())?;
    if let Some(agent) = agent {
        return agents::init(&host, &path, agent, name, image);
    }
    create_config(&path, CONFIG_TEMPLATE.as_bytes())?;
    print(&format!(
        "wrote {}\nnext: edit it, then run `lazaret config check default` in your project\n",
        path.display()
    ))
}

/// Replaces `target` by a rename from `staging`, a new file beside it that
/// holds `contents` with exactly `mode`: the file is the old one or the
/// whole new one. `still_current` runs just before the rename and may
/// refuse it. A staging file this made never outlives a failure; one that
/// already exists fails the create (`AlreadyExists`) and is left alone.
fn replace_by_rename(
    target: &std::path::Path,
    staging: &std::path::Path,
    contents: &[u8],
    mode: u32,
    still_current: impl FnOnce() -> io::Result<()>,
) -> io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(staging)?;
    // The umask may have taken bits `mode` asks for.
    let outcome = rustix::fs::fchmod(&file, rustix::fs::Mode::from_raw_mode(mode))
        .map_err(io::Error::from)
        .and_then(|()| file.write_all(contents))
        .and_then(|()| file.sync_all())
        .and_then(|()| still_current())
        .and_then(|()| std::fs::rename(staging, target));
    if outcome.is_err() {
        let _ = std::fs::remove_file(staging);
    }
    outcome
}

/// Creates the configuration file at `path` holding `contents`: its
/// missing parents 0700, the file 0600, never through a link, never over
/// an existing file.
fn create_config(path: &std::path::Path, contents: &[u8]) -> Result<(), Failure> {
    let fail = |what: &str, e: io::Error| Failure {
        message: format!("cannot {what} {}: {e}", path.display()),
        status: 1,
    };
    if let Some(parent) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(|e| fail("create the directory of", e))?;
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
        .map_err(|e| {
            if e.kind() == io::ErrorKind::AlreadyExists {
                Failure {
                    message: format!(
                        "{} already exists; edit it, or move it away to write a fresh template",
                        path.display()
                    ),
                    status: 1,
                }
            } else {
                fail("create", e)
            }
        })?;
    file.write_all(contents)
        .and_then(|()| file.sync_all())
        .map_err(|e| fail("write", e))
}

#[cfg(test)]
mod tests {
    #[test]
    fn printable_escapes_controls_and_never_cuts() {
        let shown = super::printable("a\x1b]0;t\x07b\n\tc\u{9b}d");
        assert_eq!(shown, "a\\u{1b}]0;t\\u{7}b\n\tc\\u{9b}d");
        // A reason after a path of 4,000 characters comes whole.
        let long = format!(
            "cannot read /w{}: make it readable\nnext",
            "/a".repeat(2000)
        );
        assert_eq!(super::printable(&long), long);
    }

    use super::*;

    /// Loads profile `p` of `text` in a scratch host.
    pub(super) fn scratch_load(text: &str) -> (tempfile::TempDir, ResolvedDomainConfiguration) {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        let (home, run, work) = (base.join("home"), base.join("run"), base.join("work"));
        for d in [&home, &run, &work] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o700)).unwrap();
        let file = base.join("config.toml");
        std::fs::write(&file, text).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let host = HostEnvironment::from_vars(
            rustix::process::getuid().as_raw(),
            [
                ("HOME", home.as_os_str()),
                ("XDG_RUNTIME_DIR", run.as_os_str()),
            ],
        );
        let resolved = config::load(LoadRequest {
            profile: "p",
            config: Some(file.as_os_str()),
            workspace: &work,
            host: &host,
        })
        .unwrap_or_else(|e| panic!("{}\n{text}", chain(&e)));
        (dir, resolved)
    }

    fn report(text: &str) -> ConfigReport {
        let (_dir, resolved) = scratch_load(text);
        let planned = crate::network::PlannedNetwork::new(
            resolved.network(),
            &crate::network::HostNetwork::default(),
        )
        .unwrap();
        let digest = planned.policy.digest().unwrap();
        ConfigReport::of(&resolved, &planned, &digest)
    }

    const V2: &str = "schema = \"lazaret-trusted-host-config-v2\"\n[profiles.p]\nimage = \"x\"\n";

    #[test]
    fn check_shows_names_and_dns_of_a_v2_profile() {
        let r = report(&format!(
            "{V2}allow_hosts = [\"registry.npmjs.org\", \"*.pkgs.example.org\"]\n"
        ));
        assert_eq!(r.schema, "lazaret-trusted-host-config-v2");
        assert_eq!(r.allow_hosts, ["*.pkgs.example.org", "registry.npmjs.org"]);
        assert_eq!(r.dns, "lazaret");
        assert!(r.warnings.is_empty(), "{:?}", r.warnings);
        let text = r.text();
        assert!(
            text.contains("\n  egress hosts     *.pkgs.example.org, registry.npmjs.org\n"),
            "{text}"
        );
        assert!(text.contains("\n  dns              lazaret"), "{text}");
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["allow_hosts"][1], "registry.npmjs.org");
        assert_eq!(json["dns"], "lazaret");
        assert_eq!(json["warnings"], serde_json::json!([]));
    }

    #[test]
    fn check_shows_credentials_and_never_a_value() {
        let r = report(&format!(
            "{V2}allow_hosts = [\"api.anthropic.com\"]\n\
             [[profiles.p.credentials]]\n\
             env = \"ANTHROPIC_API_KEY\"\n\
             value = \"env:HOME\"\n\
             hosts = [\"api.anthropic.com\"]\n"
        ));
        let text = r.text();
        assert!(
            text.contains(
                "\n  credential       ANTHROPIC_API_KEY = env:HOME (placeholder in the \
                 sandbox; the value goes to api.anthropic.com)\n"
            ),
            "{text}"
        );
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(
            json["credentials"],
            serde_json::json!([{
                "env": "ANTHROPIC_API_KEY",
                "value": "env:HOME",
                "hosts": ["api.anthropic.com"],
            }])
        );
    }

    #[test]
    fn check_warns_that_host_dns_is_a_way_out() {
        let r = report(&format!(
            "{V2}allow_hosts = [\"a.example\"]\ndns = \"host\"\n"
        ));
        assert_eq!(r.dns, "host");
        assert!(r.text().contains("dns              host"), "{}", r.text());
        assert_eq!(r.warnings.len(), 1, "{:?}", r.warnings);
        let w = &r.warnings[0];
        for words in [
            "dns = \"host\"",
            "DNS is a way out of the sandbox",
            "leaves through the host's resolver",
        ] {
            assert!(w.contains(words), "{w}");
        }
        // The warning goes to standard error: the report is unchanged by it.
        assert!(!r.text().contains("way out"), "{}", r.text());
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["warnings"][0].as_str(), Some(w.as_str()));
    }

    #[test]
    fn check_says_what_v2_adds_to_a_v1_file() {
        let r =
            report("schema = \"lazaret-trusted-host-config-v1\"\n[profiles.p]\nimage = \"x\"\n");
        assert_eq!(r.schema, "lazaret-trusted-host-config-v1");
        assert!(r.allow_hosts.is_empty());
        assert_eq!(r.dns, "host");
        assert!(!r.text().contains("egress hosts"), "{}", r.text());
        assert_eq!(r.warnings.len(), 1, "{:?}", r.warnings);
        let w = &r.warnings[0];
        for words in [
            "v1 configuration",
            "lazaret-trusted-host-config-v2",
            "allow_hosts, egress by host name",
            "a resolver that answers only the allowed names",
        ] {
            assert!(w.contains(words), "{w}");
        }
    }

    #[test]
    fn check_warns_when_no_name_resolves_beside_allowed_prefixes() {
        let r = report(&format!("{V2}allow_egress = [\"203.0.113.0/24\"]\n"));
        assert_eq!(r.warnings.len(), 1, "{:?}", r.warnings);
        assert!(
            r.warnings[0].contains("203.0.113.0/24 but no name resolves"),
            "{:?}",
            r.warnings
        );
        // An offline profile is not warned about.
        assert!(report(V2).warnings.is_empty());
    }

    #[test]
    fn template_is_a_valid_document() {
        let config = config::decode_document(CONFIG_TEMPLATE.as_bytes()).unwrap();
        assert!(config.profiles.keys().any(|p| p.as_str() == "default"));
    }

    #[test]
    fn the_template_is_v2_and_checks_without_warnings() {
        let text = CONFIG_TEMPLATE.replace("[profiles.default]", "[profiles.p]");
        let text = text.replace("[profiles.default.", "[profiles.p.");
        let r = report(&text);
        assert_eq!(r.schema, "lazaret-trusted-host-config-v2");
        assert_eq!(r.allow_hosts, ["deb.debian.org"]);
        assert_eq!(r.dns, "lazaret");
        assert!(r.warnings.is_empty(), "{:?}", r.warnings);
        // The agent header keeps the schema line.
        let (head, _) = CONFIG_TEMPLATE.split_once("\n[network]").unwrap();
        assert!(head.contains("schema = \"lazaret-trusted-host-config-v2\""));
    }
}
