//! `lazaret-coordinator`: the Host Coordinator of one Domain. It is started
//! by `lazaret up` (mode `start`) with its startup channel on standard
//! input, never by hand; the coordinator starts its own executable in mode
//! `spawn` before it confines itself (`escalation::spawner`), which starts
//! it in mode `launch` between the coordinator and each approved host
//! command (`escalation::subreaper`).

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use lazaret_coordinator::escalation::{spawner, subreaper};
use lazaret_coordinator::lifecycle::daemon::{self, Args, IgnoreChangesMode};

/// The Host Coordinator of one Lazaret Domain (started by `lazaret up`).
#[derive(Debug, Parser)]
#[command(name = "lazaret-coordinator", version)]
struct Cli {
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Debug, Subcommand)]
enum Mode {
    /// Bring the Domain up and serve it until `lazaret down`.
    Start(ModeArgs),
}

#[derive(Debug, clap::Args)]
struct ModeArgs {
    /// The profile.
    profile: String,
    /// The workspace directory.
    #[arg(long)]
    workspace: PathBuf,
    /// The configuration file.
    #[arg(long)]
    config: Option<OsString>,
    /// What to do with host paths the last generation kept from the
    /// sandbox that the workspace's git rules now share.
    #[arg(long, value_enum, default_value = "keep")]
    ignore_changes: IgnoreChangesMode,
}

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    if args.first().is_some_and(|mode| mode == subreaper::MODE) {
        // Takes the descriptors it is handed by number, first.
        return subreaper::main(&args);
    }
    if args.first().is_some_and(|mode| mode == spawner::MODE) {
        return spawner::main();
    }
    // Nothing inherited beyond the standard streams (the channel is
    // standard input) stays open in a role.
    if let Err(e) = lazaret_proto::sys::close_inherited_descriptors() {
        eprintln!("lazaret-coordinator: cannot close inherited descriptors: {e}");
        return ExitCode::FAILURE;
    }
    let cli = Cli::parse();
    let Mode::Start(args) = cli.mode;
    daemon::start(Args {
        profile: args.profile,
        config: args.config,
        workspace: args.workspace,
        ignore_changes: args.ignore_changes,
    })
}
