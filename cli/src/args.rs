//! The `lazaret` command line as clap parses it: raw arguments only. The
//! profile is positional everywhere; `--config` and `--workspace` are global
//! and accepted before or after the subcommand. Values are validated later,
//! by the configuration loader.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

const EXAMPLES: &str = "\
Examples:
  lazaret config init                     write a commented configuration template
  lazaret config check default            check profile `default` for this directory
  lazaret config check default --json     the same, as one JSON object
  lazaret up claude                       start the Domain of profile `claude` here
  lazaret attach claude                   open a shell inside it
  lazaret down claude                     stop it; persistent state stays";

/// Run an AI coding agent on your project inside a gVisor sandbox, without sudo.
#[derive(Debug, Parser)]
#[command(name = "lazaret", version, after_help = EXAMPLES, propagate_version = true)]
pub struct Cli {
    /// The configuration file (default: $XDG_CONFIG_HOME/lazaret/config.toml,
    /// else ~/.config/lazaret/config.toml). Absolute or starting with `~/`.
    #[arg(long, global = true, value_name = "PATH")]
    pub config: Option<OsString>,

    /// The project directory mounted at /workspace (default: the current
    /// directory).
    #[arg(long, global = true, value_name = "DIR")]
    pub workspace: Option<PathBuf>,

    #[command(subcommand)]
    pub command: Command,
}

/// A profile name, positional.
#[derive(Debug, Args)]
pub struct ProfileArg {
    /// The profile, as named in the configuration's [profiles.NAME] table.
    #[arg(value_name = "PROFILE")]
    pub profile: String,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check, create and show the configuration.
    #[command(after_help = "Examples:
  lazaret config init
  lazaret config check default
  lazaret config check default --workspace ~/src/app --json")]
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Start the Domain of PROFILE for the workspace.
    ///
    /// Host paths the Domain's last generation kept from the sandbox that
    /// the workspace's git rules now share (a .gitignore edited, a path
    /// added to the index) stay hidden until you agree: on a terminal `up`
    /// lists them and asks; otherwise it keeps them hidden and says so.
    #[command(
        after_help = "Examples:\n  lazaret up claude\n  lazaret up claude --json | jq -c 'select(.event == \"ready\")'\n  lazaret up claude --accept-ignore-changes"
    )]
    Up {
        #[command(flatten)]
        profile: ProfileArg,
        /// Print nothing but errors, and host paths kept hidden.
        #[arg(short, long)]
        quiet: bool,
        /// Print each progress event and the outcome as one JSON object per
        /// line on standard output; ask nothing.
        #[arg(long, conflicts_with = "quiet")]
        json: bool,
        /// Share, without asking, the host paths the last generation kept
        /// from the sandbox that the workspace's git rules now share.
        /// Review `git diff .gitignore` and `git diff --cached` first.
        #[arg(long)]
        accept_ignore_changes: bool,
    },
    /// Stop the Domain of PROFILE; persistent state stays. Warns of files
    /// that changed below directories holding scripts the host's git runs.
    #[command(after_help = "Examples:\n  lazaret down claude\n  lazaret down claude --json")]
    Down {
        #[command(flatten)]
        profile: ProfileArg,
        /// Print the outcome as one JSON object on standard output.
        #[arg(long)]
        json: bool,
    },
    /// Open a shell, or run COMMAND, inside the running sandbox.
    #[command(
        after_help = "Examples:\n  lazaret attach claude\n  lazaret attach claude -- make test"
    )]
    Attach {
        #[command(flatten)]
        profile: ProfileArg,
        /// The command to run instead of a login shell.
        #[arg(last = true, value_name = "COMMAND")]
        command: Vec<OsString>,
    },
    /// Show the running Domains of this workspace, or all of them.
    #[command(after_help = "Examples:\n  lazaret status\n  lazaret status --all --json")]
    Status {
        /// Only this profile's Domain.
        #[arg(value_name = "PROFILE")]
        profile: Option<String>,
        /// Every Domain of this user, not only this workspace's.
        #[arg(long)]
        all: bool,
        /// One JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Show the log of a Domain: the coordinator's (from the journal when it
    /// logs there) and the helper roles'.
    #[command(
        after_help = "Examples:\n  lazaret logs claude\n  lazaret logs claude -f --since 10m"
    )]
    Logs {
        #[command(flatten)]
        profile: ProfileArg,
        /// Keep showing what is logged, until interrupted.
        #[arg(short, long)]
        follow: bool,
        /// Only what was logged since WHEN: 90s, 10m, 2h, 1d back from now,
        /// an RFC 3339 UTC time (2026-12-01T10:00:00Z), or @SECONDS.
        #[arg(long, value_name = "WHEN")]
        since: Option<String>,
    },
    /// List, inspect, verify and reset the persistent state of Domains.
    #[command(after_help = "Examples:
  lazaret state list
  lazaret state inspect claude
  lazaret state verify claude
  lazaret state reset claude --dir /usr/local
  lazaret state reset --domain 3f2a9c01 --yes")]
    State {
        #[command(subcommand)]
        command: StateCommand,
    },
    /// List and prune the prepared images every Domain shares.
    #[command(after_help = "Examples:\n  lazaret image list\n  lazaret image prune")]
    Image {
        #[command(subcommand)]
        command: ImageCommand,
    },
    /// Print the profile as manifests for another platform.
    #[command(after_help = "Examples:
  lazaret export kube claude --image registry.example/lazaret-claude:1 > claude.yaml
  kubectl apply -f claude.yaml")]
    Export {
        #[command(subcommand)]
        target: ExportCommand,
    },
    /// Print the shell completion script for SHELL.
    #[command(after_help = "Examples:
  lazaret completions bash > ~/.local/share/bash-completion/completions/lazaret
  lazaret completions zsh > ~/.zfunc/_lazaret
  lazaret completions fish > ~/.config/fish/completions/lazaret.fish")]
    Completions {
        /// The shell.
        #[arg(value_enum, value_name = "SHELL")]
        shell: clap_complete::Shell,
    },
    /// Write the man pages (lazaret.1, lazaret-up.1, ...) into DIR.
    #[command(
        after_help = "Example:\n  lazaret man-pages /tmp/man && man -l /tmp/man/lazaret-up.1"
    )]
    ManPages {
        /// An existing directory; pages already in it are replaced.
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
pub enum ExportCommand {
    /// Kubernetes: a gVisor Pod, its claims and Secret references, and a
    /// NetworkPolicy with the profile's egress policy (docs/scale-out.md).
    #[command(after_help = "Examples:
  lazaret export kube claude --image registry.example/lazaret-claude:1
  lazaret export kube claude --image registry.example/lazaret-claude:1 --fqdn-policy cilium")]
    Kube {
        #[command(flatten)]
        profile: ProfileArg,
        /// The image as the cluster pulls it; required when the profile's
        /// is a local `oci:` or `oci-archive:` image.
        #[arg(long, value_name = "REF")]
        image: Option<String>,
        /// Allow the profile's host names too, with this CNI's policy
        /// instead of the NetworkPolicy (which allows addresses only):
        /// `cilium` writes a CiliumNetworkPolicy with `toFQDNs`.
        #[arg(long, value_enum, value_name = "CNI")]
        fqdn_policy: Option<super::kube::FqdnPolicy>,
    },
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Load PROFILE exactly as `lazaret up` will, and show the result.
    ///
    /// Exits 0 when the configuration is valid and 2 when it is not, naming
    /// the field and the rule it breaks. Creates the Storage and Runtime
    /// roots if they are missing, as `up` would.
    #[command(after_help = "Examples:
  lazaret config check default
  lazaret config check default --json | jq .configuration_fingerprint
  lazaret config check claude --config ~/lazaret-test.toml --workspace ~/src/app")]
    Check {
        #[command(flatten)]
        profile: ProfileArg,
        /// One JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Write a commented v1 template (mode 0600); never overwrites. With
    /// --agent, write (or add to an existing file) a ready profile for a
    /// coding agent instead.
    #[command(after_help = "Examples:
  lazaret config init
  lazaret config init --config ~/lazaret/config.toml
  lazaret config init --agent claude
  lazaret config init --agent codex --name codex-work --image oci:/srv/images:codex")]
    Init {
        /// Write a profile for this agent, named after it; appended when
        /// the configuration exists.
        #[arg(long, value_enum, value_name = "AGENT")]
        agent: Option<super::agents::Agent>,
        /// The profile's name instead of the agent's.
        #[arg(long, value_name = "PROFILE", requires = "agent")]
        name: Option<String>,
        /// The profile's image instead of
        /// `oci:$XDG_DATA_HOME/lazaret-images:AGENT`.
        #[arg(long, value_name = "REF", requires = "agent")]
        image: Option<String>,
    },
}

/// Which Domain: PROFILE for the workspace, or `--domain ID` from the
/// records alone (for a Domain whose profile no longer loads).
#[derive(Debug, Args)]
pub struct DomainArg {
    /// The profile, as named in the configuration's [profiles.NAME] table.
    #[arg(value_name = "PROFILE", required_unless_present = "domain")]
    pub profile: Option<String>,
    /// The Domain ID (as `lazaret state list` shows it; a unique prefix of
    /// at least 8 digits will do) instead of PROFILE and the workspace.
    #[arg(long, value_name = "ID", conflicts_with = "profile")]
    pub domain: Option<String>,
    /// One JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum StateCommand {
    /// List every Domain of this user with persistent state.
    List {
        /// One JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Show one Domain's State Anchor: each persistent dir's changes over
    /// the image, and sizes.
    Inspect(DomainArg),
    /// Check one Domain's records against its directories; exit 1 with
    /// findings.
    Verify(DomainArg),
    /// Delete one Domain's persistent state (or only some dirs'); refused
    /// while the Domain runs.
    Reset {
        #[command(flatten)]
        domain: DomainArg,
        /// Only this persistent dir's state (repeatable).
        #[arg(long = "dir", value_name = "PATH")]
        dirs: Vec<String>,
        /// Do not ask.
        #[arg(long)]
        yes: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// List the prepared images, their sizes and who leases them.
    List {
        /// One JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Remove every prepared image no generation leases.
    Prune {
        /// One JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
}
