//! `lazaret state list|inspect|verify|reset` and `lazaret image list|prune`:
//! what each Domain keeps, and the images they share, shown, checked and
//! removed from the records alone.
//!
//! Owns how those commands select a Domain (PROFILE and the workspace, or
//! `--domain ID` for one whose profile no longer loads), what they print,
//! and the question `reset` asks. Trusts [`lazaret_coordinator::state`] for the records
//! and the files; asks before anything is removed unless told not to.

use std::io::{BufRead, IsTerminal, Write};

use lazaret_proto::control::{ControlRequest, ControlResponse};
use lazaret_proto::ids::{DomainId, GenerationId};
use serde::Serialize;

use super::args::{DomainArg, ImageCommand, StateCommand};
use super::{Failure, Globals, failure, print, print_json, printable};
use crate::config::HostEnvironment;
use crate::lifecycle::{DomainPaths, chain, client};
use lazaret_coordinator::state::{Access, DomainState, DomainSummary, Held, Roots, StateError};

fn failed(error: &StateError) -> Failure {
    failure(chain(error))
}

pub(super) fn roots(globals: &Globals) -> Result<Roots, Failure> {
    Roots::find(&HostEnvironment::capture(), globals.config.as_deref()).map_err(|e| match e {
        StateError::Config(config) => Failure::from(config),
        other => failed(&other),
    })
}

/// `1.2 MiB`.
fn size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// The Domain `arg` names.
fn domain_id(globals: &Globals, roots: &Roots, arg: &DomainArg) -> Result<DomainId, Failure> {
    if let Some(wanted) = &arg.domain {
        let wanted = wanted.to_ascii_lowercase();
        if wanted.len() < 8 || !wanted.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Failure {
                message: format!(
                    "--domain {wanted}: give at least 8 hex digits of a Domain ID, as \
                     `lazaret state list` shows them"
                ),
                status: 2,
            });
        }
        let ids = roots.domain_ids().map_err(|e| failed(&e))?;
        let matching: Vec<&DomainId> = ids
            .iter()
            .filter(|id| id.to_hex().starts_with(&wanted))
            .collect();
        return match matching.as_slice() {
            [one] => Ok(**one),
            [] => Err(failure(format!(
                "no Domain with state has an ID starting with {wanted}; `lazaret state list` \
                 shows them"
            ))),
            _ => Err(failure(format!(
                "{} Domains have IDs starting with {wanted}; give more digits",
                matching.len()
            ))),
        };
    }
    let profile = arg.profile.as_deref().unwrap_or_default();
    let workspace = globals.workspace_dir()?;
    Ok(DomainPaths::locate(profile, &workspace, &HostEnvironment::capture())?.domain_id)
}

fn which(arg: &DomainArg, id: DomainId) -> String {
    match &arg.profile {
        Some(profile) => format!("profile `{profile}` (Domain {})", &id.to_hex()[..12]),
        None => format!("Domain {}", id.to_hex()),
    }
}

/// Takes the Domain `arg` names, or says why not.
fn take(globals: &Globals, roots: &Roots, arg: &DomainArg) -> Result<Box<Held>, Failure> {
    let id = domain_id(globals, roots, arg)?;
    match roots.take(id).map_err(|e| failed(&e))? {
        Access::Held(held) => Ok(held),
        Access::Running(_) => Err(failure(format!(
            "{} is running (or another Lazaret command holds it); its state is in use: \
             `lazaret down` it first",
            which(arg, id)
        ))),
        Access::Absent => Err(failure(format!(
            "{} has no state under {}",
            which(arg, id),
            roots.storage.display()
        ))),
    }
}

/// `lazaret state ...`: its exit code.
pub(super) fn run(globals: &Globals, command: StateCommand) -> Result<u8, Failure> {
    let roots = roots(globals)?;
    match command {
        StateCommand::List { json: as_json } => list(&roots, as_json),
        StateCommand::Inspect(arg) => inspect(globals, &roots, &arg).map(|()| 0),
        StateCommand::Verify(arg) => verify(globals, &roots, &arg),
        StateCommand::Reset { domain, dirs, yes } => {
            reset(globals, &roots, &domain, &dirs, yes).map(|()| 0)
        }
    }
}

fn running_summary(paths: &DomainPaths) -> Option<DomainSummary> {
    let answer = client::request(paths, ControlRequest::Status, client::STATUS_TIMEOUT).ok()?;
    let ControlResponse::Status(status) = answer else {
        return None;
    };
    Some(DomainSummary {
        profile: status.profile,
        workspace: status.workspace.to_string(),
        last_generation: Some(status.generation_id.0),
        image_digest: Some(status.manifest_digest.to_hex()),
        ..DomainSummary::unread(status.domain_id, DomainState::Running)
    })
}

#[derive(Serialize)]
struct Listed {
    storage_root: String,
    domains: Vec<DomainSummary>,
    /// Domains whose state could not be read, and why.
    unreadable: Vec<Unreadable>,
}

#[derive(Serialize)]
struct Unreadable {
    domain_id: String,
    error: String,
}

/// `state list`: every Domain, those that cannot be read said so (and the
/// exit code 1) without hiding the others.
fn list(roots: &Roots, as_json: bool) -> Result<u8, Failure> {
    let mut domains = Vec::new();
    let mut unreadable = Vec::new();
    for id in roots.domain_ids().map_err(|e| failed(&e))? {
        let summary = roots.take(id).and_then(|access| match access {
            Access::Held(held) => held.summary().map(Some),
            Access::Running(paths) => {
                Ok(Some(running_summary(&paths).unwrap_or_else(|| {
                    DomainSummary::unread(id, DomainState::Busy)
                })))
            }
            Access::Absent => Ok(None),
        });
        match summary {
            Ok(Some(summary)) => domains.push(summary),
            Ok(None) => {}
            Err(e) => unreadable.push(Unreadable {
                domain_id: id.to_hex(),
                error: chain(&e),
            }),
        }
    }
    let code = u8::from(!unreadable.is_empty());
    let listed = Listed {
        storage_root: roots.storage.display().to_string(),
        domains,
        unreadable,
    };
    if as_json {
        print_json(&listed)?;
        return Ok(code);
    }
    let mut text = String::new();
    if listed.domains.is_empty() && listed.unreadable.is_empty() {
        text.push_str(&format!(
            "no Domain has state under {}\n",
            listed.storage_root
        ));
    }
    for d in &listed.domains {
        text.push_str(&summary_text(d));
    }
    for u in &listed.unreadable {
        text.push_str(&format!(
            "Domain {}: cannot read its state: {}\n",
            u.domain_id, u.error
        ));
    }
    print(&printable(&text))?;
    Ok(code)
}

fn summary_text(d: &DomainSummary) -> String {
    let mut text = format!(
        "{} ({})\n  domain     {}\n  state      {}{}\n",
        if d.profile.is_empty() {
            "?"
        } else {
            &d.profile
        },
        d.workspace,
        d.domain_id,
        d.state.as_str(),
        d.last_generation
            .map(|g| format!(", last generation {g}"))
            .unwrap_or_default(),
    );
    if let Some(digest) = &d.image_digest {
        text.push_str(&format!("  image      sha256:{digest}\n"));
    }
    if matches!(d.state, DomainState::Running | DomainState::Busy) {
        text.push_str("  (running: `lazaret status` shows what it holds)\n");
        return text;
    }
    for anchor in &d.persistent_dirs {
        text.push_str(&format!(
            "  {:<10} {}\n",
            anchor.sandbox_path,
            size(anchor.bytes)
        ));
    }
    text.push_str(&format!(
        "  ignored    {}\n  total      {}\n",
        size(d.ignored_bytes),
        size(d.total_bytes)
    ));
    if d.state == DomainState::Stale {
        text.push_str("  a generation was never stopped; `lazaret down` finishes it\n");
    }
    text
}

fn inspect(globals: &Globals, roots: &Roots, arg: &DomainArg) -> Result<(), Failure> {
    let held = take(globals, roots, arg)?;
    let catalog = roots.catalog().map_err(|e| failed(&e))?;
    let inspection = held.inspect(&catalog).map_err(|e| failed(&e))?;
    if arg.json {
        return print_json(&inspection);
    }
    let mut text = summary_text(&inspection.summary);
    if !inspection.compared_with_image {
        text.push_str("  (the image of the last generation is gone: every path counts as added)\n");
    }
    for anchor in &inspection.anchors {
        let w = &anchor.walked;
        text.push_str(&format!(
            "\n{}  {}\n  upper      {}\n  added {}, modified {}, removed {}, replaced {}{}\n",
            anchor.sandbox_path,
            size(anchor.bytes),
            anchor.upper,
            w.added,
            w.modified,
            w.removed,
            w.replaced,
            if w.complete {
                ""
            } else {
                " (at least; the walk stopped at its bound)"
            }
        ));
        for change in w.changes.iter().take(50) {
            text.push_str(&format!(
                "    {:<9} {}{}\n",
                format!("{:?}", change.kind).to_ascii_lowercase(),
                anchor.sandbox_path.trim_end_matches('/'),
                change.path
            ));
        }
        let named = w.added + w.modified + w.removed + w.replaced;
        if named > 50 {
            text.push_str(&format!(
                "    ... and {} more (`--json` lists up to {})\n",
                named - 50,
                lazaret_coordinator::state::anchor::MAX_NAMED
            ));
        }
    }
    print(&printable(&text))
}

#[derive(Serialize)]
struct Verified {
    domain_id: String,
    clean: bool,
    findings: Vec<lazaret_coordinator::state::Finding>,
}

fn verify(globals: &Globals, roots: &Roots, arg: &DomainArg) -> Result<u8, Failure> {
    let held = take(globals, roots, arg)?;
    let findings = held.verify(roots).map_err(|e| failed(&e))?;
    let verified = Verified {
        domain_id: held.domain.domain_id.to_hex(),
        clean: findings.is_empty(),
        findings,
    };
    let code = u8::from(!verified.clean);
    if arg.json {
        print_json(&verified)?;
        return Ok(code);
    }
    if verified.clean {
        print(&format!(
            "Domain {} ({}): no findings\n",
            verified.domain_id, held.domain.profile_name
        ))?;
        return Ok(0);
    }
    let mut text = format!(
        "Domain {} ({}): {} finding(s)\n",
        verified.domain_id,
        held.domain.profile_name,
        verified.findings.len()
    );
    for f in &verified.findings {
        text.push_str(&format!("  {}: {}\n", f.kind, f.detail));
    }
    print(&printable(&text))?;
    Ok(code)
}

#[derive(Serialize)]
struct Reset {
    domain_id: String,
    recovered_generation: Option<u64>,
    removed: Vec<lazaret_coordinator::state::Removal>,
}

fn reset(
    globals: &Globals,
    roots: &Roots,
    arg: &DomainArg,
    dirs: &[String],
    yes: bool,
) -> Result<(), Failure> {
    let held = take(globals, roots, arg)?;
    // Nothing changes before the developer said yes: the stale generation
    // a reset finishes first is part of what is asked.
    let plan = held.reset_plan(dirs).map_err(|e| failed(&e))?;
    let stale = held.stale_generation().map_err(|e| failed(&e))?;
    if !yes {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return Err(Failure {
                message: "`state reset` deletes persistent state and asks first; without a \
                          terminal to ask in, add --yes"
                    .into(),
                status: 2,
            });
        }
        let mut question = format!(
            "This deletes, for profile `{}` in {}:\n",
            held.domain.profile_name, held.domain.canonical_workspace
        );
        if let Some(generation) = stale {
            question.push_str(&format!(
                "  (first, generation {} is finished: it was never stopped)\n",
                generation.0
            ));
        }
        for r in &plan {
            let what = if r.is_isolated() {
                "the workspace's ignored files kept for the sandbox".to_owned()
            } else {
                format!("everything the sandbox changed in {}", r.what)
            };
            question.push_str(&format!("  {what} ({})\n", size(r.bytes)));
        }
        question.push_str("The workspace itself is not touched. Delete? [y/N] ");
        eprint!("{}", printable(&question));
        let _ = std::io::stderr().flush();
        let mut answer = String::new();
        let _ = stdin.lock().read_line(&mut answer);
        if !matches!(answer.trim(), "y" | "Y" | "yes" | "YES") {
            return Err(failure("nothing deleted"));
        }
    }
    let catalog = roots.catalog().map_err(|e| failed(&e))?;
    let recovered = held.recover(&catalog).map_err(|e| failed(&e))?;
    held.reset(&plan).map_err(|e| failed(&e))?;
    let done = Reset {
        domain_id: held.domain.domain_id.to_hex(),
        recovered_generation: recovered.map(|g| g.0),
        removed: plan,
    };
    if arg.json {
        return print_json(&done);
    }
    let mut text = String::new();
    if let Some(g) = done.recovered_generation {
        text.push_str(&format!("finished stale generation {g}\n"));
    }
    for r in &done.removed {
        text.push_str(&format!("removed {} ({})\n", r.what, size(r.bytes)));
    }
    text.push_str("the next `lazaret up` starts these from the image\n");
    print(&printable(&text))
}

/// `lazaret image ...`: its exit code.
pub(super) fn image(globals: &Globals, command: ImageCommand) -> Result<u8, Failure> {
    let roots = roots(globals)?;
    let catalog = roots.catalog().map_err(|e| failed(&e))?;
    let (as_json, images, pruned) = match command {
        ImageCommand::List { json } => (
            json,
            lazaret_coordinator::state::images(&catalog).map_err(|e| failed(&e))?,
            false,
        ),
        ImageCommand::Prune { json } => (
            json,
            lazaret_coordinator::state::prune(&catalog).map_err(|e| failed(&e))?,
            true,
        ),
    };
    if as_json {
        #[derive(Serialize)]
        struct Images<'a> {
            pruned: bool,
            images: &'a [lazaret_coordinator::state::ImageSummary],
        }
        print_json(&Images {
            pruned,
            images: &images,
        })?;
        return Ok(0);
    }
    let mut text = String::new();
    if images.is_empty() {
        text.push_str(if pruned {
            "no image was unleased; nothing removed\n"
        } else {
            "no prepared image\n"
        });
    }
    for i in &images {
        text.push_str(&format!(
            "{}{}  {}\n  digest     sha256:{}\n  size       {}\n",
            if pruned { "removed " } else { "" },
            &i.artifact_id,
            i.source,
            i.manifest_digest,
            size(i.bytes)
        ));
        if !pruned {
            if i.leased_by.is_empty() {
                text.push_str("  leased by  nothing (`lazaret image prune` removes it)\n");
            }
            for (domain, generation) in &i.leased_by {
                text.push_str(&format!(
                    "  leased by  Domain {} generation {generation}\n",
                    &domain[..16]
                ));
            }
        }
    }
    print(&printable(&text))?;
    Ok(0)
}

/// What `down`'s recovery did.
pub(super) enum Recovered {
    /// It finished the stale generation it names, or there was none: the
    /// Domain was not running.
    Done(Option<GenerationId>),
    /// Another process holds the Domain (a coordinator starting or
    /// stopping): ask again.
    Busy,
}

/// `lazaret down` when no coordinator answers: finishes Domain `id`'s
/// stale generation, if it has one, from its records alone.
pub(super) fn recover(roots: &Roots, id: DomainId) -> Result<Recovered, Failure> {
    let held = match roots.take(id).map_err(|e| failed(&e))? {
        Access::Held(held) => held,
        Access::Running(_) => return Ok(Recovered::Busy),
        Access::Absent => return Ok(Recovered::Done(None)),
    };
    // The catalog (whose opening cleans what crashed preparers left) only
    // when there is a generation to finish.
    if held.stale_generation().map_err(|e| failed(&e))?.is_none() {
        return Ok(Recovered::Done(None));
    }
    let catalog = roots.catalog().map_err(|e| failed(&e))?;
    let generation = held.recover(&catalog).map_err(|e| failed(&e))?;
    Ok(Recovered::Done(generation))
}
