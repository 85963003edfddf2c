//! Preparing what the sandbox is made of on the host, and sending the
//! Runtime Supervisor its plan: the image leased, the State Anchor
//! directories made, the workspace routing prepared, each recorded as
//! intended before it exists and as what it became once it does.
//!
//! Owns the records of the lease, the State Anchors, the routing's and the
//! sandbox's intents, and the sealed environment memfd. Trusts the Storage
//! Catalog, the Domain Store and the resolved configuration.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use lazaret_proto::common::HostPath;
use lazaret_proto::control::{StartupEvent, StartupStep};
use lazaret_proto::ids::ContainerId;
use lazaret_proto::ownership::{
    ParticipantOwnership, PreparedLowerOwnership, SandboxOwnership, StateAnchorOwnership,
};
use lazaret_proto::store::ParticipantState;
use lazaret_storage::catalog::PreparedLower;
use lazaret_storage::store::Slot;

use super::beside::beside;
use super::context::Context;
use super::failure::{Failure, at, failure};
use super::live::Owned;
use super::record::{Became, Intent};
use super::supervisor::{PlanInputs, Supervisor};
use crate::config::{ResolvedDomainConfiguration, RetainedDir};
use lazaret_storage::anchor::{UPPER_DIR, WORK_DIR, anchor_dir};

/// What the sandbox is made of on the host: the leased image, the State
/// Anchor directories and the workspace's routing.
pub(super) struct Storage {
    pub(super) prepared: PreparedLower,
    anchor_dirs: Vec<RetainedDir>,
    pub(super) uppers: super::usage::Uppers,
    pub(super) workspace: super::workspace::Prepared,
}

/// The State Anchor directories [`lease_and_anchor`] made.
struct Anchors {
    dirs: Vec<RetainedDir>,
    uppers: super::usage::Uppers,
}

/// Leases the image (`lower`), makes the State Anchor directories
/// (`anchors`) and prepares the workspace routing; what the lease and the
/// anchors became (returned) and the routing's intent are left for
/// [`send_plan`] to record. The workspace's git rules, which take a walk
/// of the workspace, are taken on a thread of their own meanwhile.
pub(super) fn prepare_storage(
    cx: Context<'_>,
    owned: &Owned,
    source: &lazaret_storage::image::ImageSource,
    lower: Intent,
    anchors: Vec<Intent>,
) -> Result<(Storage, Vec<Became>), Failure> {
    std::thread::scope(|scope| {
        let rules = beside(
            scope,
            cx.reporter,
            (StartupStep::Workspace, "taking the workspace's git rules"),
            || {
                super::workspace::take_rules(
                    cx.reporter,
                    cx.resolved,
                    &owned.store,
                    cx.ignore_changes,
                )
            },
        );
        let (prepared, made, became) = lease_and_anchor(cx, owned, source, lower, anchors)?;
        let uid = rustix::process::getuid().as_raw();
        let workspace =
            super::workspace::prepare(cx.resolved, cx.generation_dir, rules.join()?, uid)?;
        let storage = Storage {
            prepared,
            anchor_dirs: made.dirs,
            uppers: made.uppers,
            workspace,
        };
        Ok((storage, became))
    })
}

/// The State Anchors' intents, one per persistent dir in the order of
/// `persistent_dirs`.
pub(super) fn anchor_intents(
    resolved: &ResolvedDomainConfiguration,
) -> Vec<(Slot, ParticipantOwnership)> {
    let dirs = resolved.record().persistent_dirs.iter();
    dirs.enumerate()
        .map(|(i, dir)| (Slot::state_anchor(i), anchor_record(resolved, dir, None)))
        .collect()
}

/// The State Anchor of persistent dir `dir`: a Domain-owned upper and work
/// dir in the Domain's storage, over the prepared artifact `lower`.
fn anchor_record(
    resolved: &ResolvedDomainConfiguration,
    dir: &str,
    lower: Option<lazaret_proto::ids::PreparedArtifactId>,
) -> ParticipantOwnership {
    let state_dir = resolved
        .authorities()
        .domain_storage
        .label()
        .join(anchor_dir(dir));
    ParticipantOwnership::StateAnchor(StateAnchorOwnership {
        lower_artifact_id: lower,
        upper_path: Some(HostPath::from(&state_dir.join(UPPER_DIR))),
        work_path: Some(HostPath::from(&state_dir.join(WORK_DIR))),
        sandbox_path: Some(dir.to_owned()),
        ..StateAnchorOwnership::default()
    })
}

/// Leases the image (`lower`, recorded as intended) and makes the State
/// Anchor directories (`anchors`, recorded as intended, in the order of
/// `persistent_dirs`); what the lease and the anchors became is returned
/// for the sandbox's intent.
fn lease_and_anchor(
    cx: Context<'_>,
    owned: &Owned,
    source: &lazaret_storage::image::ImageSource,
    lower: Intent,
    anchors: Vec<Intent>,
) -> Result<(PreparedLower, Anchors, Vec<Became>), Failure> {
    let Context {
        reporter,
        resolved,
        generation,
        generation_dir,
        ..
    } = cx;
    let auth = resolved.authorities();
    let uid = rustix::process::getuid().as_raw();
    // The image, leased for this generation.
    reporter.progress(
        StartupStep::Image,
        format!("resolving {}", resolved.record().image),
    );
    // This process prepares: recorded with the prepare operation.
    let preparer = crate::process::own_identity()
        .map_err(|source| lazaret_storage::catalog::CatalogError::Io {
            operation: "read the identity of this process from",
            path: "/proc/self".to_owned(),
            source,
        })
        .map_err(|e| at(StartupStep::Image)(&e))?;
    let prepared = owned
        .catalog
        .prepare_and_lease(
            source,
            resolved.domain_id(),
            generation.generation_id,
            preparer,
            &mut |p| {
                reporter.send(StartupEvent::Progress {
                    step: StartupStep::Image,
                    detail: p.to_string(),
                    fraction: p.fraction(),
                })
            },
        )
        .map_err(|e| at(StartupStep::Image)(&e))?;
    let leased = lower.becoming(
        ParticipantState::LeaseHeld,
        ParticipantOwnership::PreparedLower(PreparedLowerOwnership {
            prepared_artifact_id: Some(prepared.artifact_id),
            selected_manifest_digest: Some(prepared.manifest_digest),
            rootfs_path: Some(HostPath::from(&prepared.rootfs_path)),
            ..PreparedLowerOwnership::default()
        }),
    );
    reporter.progress(
        StartupStep::Image,
        format!("prepared {}", prepared.manifest_digest.to_oci_string()),
    );

    // The State Anchors, over this image.
    reporter.progress(
        StartupStep::State,
        format!("generation {}", generation.generation_id),
    );
    let persistent_dirs = &resolved.record().persistent_dirs;
    let dirs = persistent_dirs
        .iter()
        .map(|dir| {
            let dir = auth.domain_storage.ensure_child(&anchor_dir(dir), uid)?;
            dir.ensure_child(Path::new(UPPER_DIR), uid)?;
            dir.ensure_child(Path::new(WORK_DIR), uid)?;
            Ok(dir)
        })
        .collect::<Result<Vec<_>, crate::config::ConfinedError>>()
        .map_err(|e| at(StartupStep::State)(&e))?;
    let uppers = super::usage::Uppers::new(generation_dir, persistent_dirs, &dirs)
        .map_err(|e| at(StartupStep::State)(&e))?;
    let became = std::iter::once(leased)
        .chain(
            anchors
                .into_iter()
                .zip(persistent_dirs)
                .map(|(anchor, dir)| {
                    let record = anchor_record(resolved, dir, Some(prepared.artifact_id));
                    anchor.becoming(ParticipantState::Active, record)
                }),
        )
        .collect();
    Ok((prepared, Anchors { dirs, uppers }, became))
}

/// The storage, and the workspace routing and the sandbox recorded as
/// intended with the plan that makes them sent.
pub(super) struct Planned {
    pub(super) storage: Storage,
    pub(super) routing: Intent,
    pub(super) sandbox: Intent,
    pub(super) sandbox_record: SandboxOwnership,
    pub(super) environment: OwnedFd,
}

/// Records what the image's lease and the State Anchors became (`became`)
/// and the routing's and the sandbox's intents, and sends the supervisor
/// its plan.
pub(super) fn send_plan(
    cx: Context<'_>,
    supervisor: &Supervisor,
    storage: Storage,
    became: Vec<Became>,
    runsc: &Path,
    container_id: ContainerId,
    nameservers: Vec<std::net::Ipv4Addr>,
) -> Result<Planned, Failure> {
    let Context {
        recorder,
        resolved,
        credentials,
        generation,
        generation_dir,
        ..
    } = cx;
    // The sandbox.
    let sandbox_record = SandboxOwnership {
        container_id: Some(container_id),
        bundle_path: Some(HostPath::from(&generation_dir.label().join("mnt/bundle"))),
        ..SandboxOwnership::default()
    };
    // What the lease and the State Anchors became, and the intents of the
    // routing and the sandbox the plan makes, with the rules the routing
    // takes (for the next `up` to compare with): one commit.
    let [routing, sandbox] = recorder.record(
        StartupStep::Sandbox,
        became,
        [
            storage.workspace.intent(),
            (
                Slot::SANDBOX,
                ParticipantOwnership::Sandbox(sandbox_record.clone()),
            ),
        ],
        Some(storage.workspace.encoded_rules()),
    )?;
    // One sealed memfd of the resolved environment serves the sandbox and
    // every session process.
    let environment = environment_memfd(resolved, &credentials.environment()).map_err(|e| {
        failure(
            StartupStep::Sandbox,
            format!("cannot pass the sandbox environment: {e}"),
        )
    })?;
    supervisor.send_plan(
        resolved,
        PlanInputs {
            environment: environment.as_fd(),
            prepared: &storage.prepared,
            anchor_dirs: &storage.anchor_dirs,
            isolated: &storage.workspace.isolated,
            rules: storage.workspace.rules.as_fd(),
            generation_dir,
            runsc,
            container_id,
        },
        generation,
        nameservers,
    )?;
    Ok(Planned {
        storage,
        routing,
        sandbox,
        sandbox_record,
        environment,
    })
}

/// The resolved sandbox environment in a sealed memfd: `NAME=value\0`
/// entries, the profile's `env` then `credentials` (each a placeholder,
/// and the trust bundle's variables). The values exist only in this
/// process's memory and the memfd.
fn environment_memfd(
    resolved: &ResolvedDomainConfiguration,
    credentials: &[(String, String)],
) -> std::io::Result<OwnedFd> {
    let env = resolved
        .environment()
        .iter()
        .map(|(name, value)| (name.as_str(), value.expose()));
    let credentials = credentials.iter().map(|(n, v)| (n.as_str(), v.as_str()));
    lazaret_proto::memfd::sealed("lazaret-environment", |file| {
        for (name, value) in env.chain(credentials) {
            std::io::Write::write_all(file, name.as_bytes())?;
            std::io::Write::write_all(file, b"=")?;
            std::io::Write::write_all(file, value.as_bytes())?;
            std::io::Write::write_all(file, b"\0")?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileExt;

    use lazaret_proto::ownership::ParticipantOwnership;

    use super::{anchor_intents, environment_memfd};
    use crate::lifecycle::testing::Scratch;
    use lazaret_storage::anchor::{UPPER_DIR, WORK_DIR, anchor_dir};
    use lazaret_storage::store::Slot;

    #[test]
    fn each_persistent_dir_has_its_state_anchor_intent_in_order() {
        let scratch = Scratch::new();
        let resolved = scratch.load("persistent_dirs = ['/root', '/opt']");
        let storage = resolved.authorities().domain_storage.label().to_path_buf();
        let intents = anchor_intents(&resolved);
        assert_eq!(intents.len(), 2);
        for (i, (dir, (slot, record))) in ["/root", "/opt"].iter().zip(intents).enumerate() {
            assert_eq!(slot, Slot::state_anchor(i));
            let ParticipantOwnership::StateAnchor(anchor) = record else {
                panic!("a State Anchor record");
            };
            let state = storage.join(anchor_dir(dir));
            assert_eq!(anchor.sandbox_path.as_deref(), Some(*dir));
            assert_eq!(
                anchor.upper_path,
                Some(lazaret_proto::common::HostPath::from(
                    &state.join(UPPER_DIR)
                ))
            );
            assert_eq!(
                anchor.work_path,
                Some(lazaret_proto::common::HostPath::from(&state.join(WORK_DIR)))
            );
            assert_eq!(anchor.lower_artifact_id, None, "no image is leased yet");
        }
    }

    #[test]
    fn the_sandbox_environment_is_sealed_as_name_value_entries() {
        let scratch = Scratch::new();
        let resolved = scratch.load("env = { TOKEN = \"env:LZ_TOKEN\" }");
        let memfd =
            environment_memfd(&resolved, &[("KEY".into(), "sk-placeholder".into())]).unwrap();
        let file = std::fs::File::from(memfd);
        let mut bytes = vec![0u8; 64];
        let n = file.read_at(&mut bytes, 0).unwrap();
        assert_eq!(&bytes[..n], b"TOKEN=secret\0KEY=sk-placeholder\0");
        // Sealed: nothing can be added.
        assert!(file.write_at(b"X=y\0", n as u64).is_err());
    }
}
