//! Host escalation: the Host Coordinator's side of the Escalation Mailbox.
//!
//! A session's processes ask the host for one command by writing signed
//! records into that session's mailbox (`lazaret-escalate` inside the
//! sandbox). This module owns what the host does with them: it verifies
//! every record (signature under the session's own key, generation and
//! session binding, capability, freshness, a request id used once) before
//! anything else; classifies the command against the profile's rules;
//! asks the developer in the requesting session's terminal when no rule
//! approves it; launches an approved command with the descriptor-holding
//! launch; streams its output back as signed chunks; and logs every
//! request and decision as an audit event.
//!
//! [`Escalation`] holds what a generation shares: its Session Coordinator
//! signing key, the rules and their executables, the mailbox tmpfs (a
//! descriptor from the supervisor) and one inotify instance that wakes the
//! session whose mailbox changed. [`session::SessionEscalation`] is one
//! session's part, driven by that session's task. Trusts the resolved
//! configuration and its own keys; nothing the sandbox writes.

pub mod audit;
pub mod classify;
pub mod launch;
pub mod machine;
pub mod mailbox;
pub mod record;
pub mod report;
pub mod running;
mod seccomp;
pub mod session;
pub mod spawner;
pub mod subreaper;

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex};

use lazaret_proto::common::{ProtocolVersion, UnixTimeNs};
use lazaret_proto::config::ResolvedAutoApprovalRule;
use lazaret_proto::ids::{CapabilityId, CliId, SessionId};
use lazaret_proto::trust::{
    GenerationIdentity, ProtocolCredential, ProtocolCredentialRole, SandboxCredentialBundle,
    SessionBinding, SessionRequestCapability, TrustManifest,
};
use rustix::fs::inotify::{self, WatchFlags};
use tokio::sync::watch;

use crate::config::ResolvedDomainConfiguration;

/// How long a session's request capability lasts; the session's end
/// withdraws it sooner.
const CAPABILITY_LIFETIME: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

/// What a generation's escalation shares between its sessions.
#[derive(Debug)]
pub struct Escalation {
    enabled: bool,
    profile: String,
    rules: Vec<ResolvedAutoApprovalRule>,
    launcher: launch::Launcher,
    /// The generation's Session Coordinator key, made ready to sign.
    signer: lazaret_proto::signing::Signer,
    manifest: TrustManifest,
    root: OwnedFd,
    watcher: Arc<Watcher>,
}

impl Escalation {
    /// The escalation of a generation: `coordinator` is its Session
    /// Coordinator protocol credential, `manifest` the pins its sessions
    /// get, `root` the mailbox tmpfs. Must be called on the event loop.
    pub fn new(
        resolved: &ResolvedDomainConfiguration,
        coordinator: ProtocolCredential,
        manifest: TrustManifest,
        root: OwnedFd,
    ) -> std::io::Result<Arc<Self>> {
        let record = resolved.record();
        Ok(Arc::new(Self {
            enabled: record.escalation_enabled,
            profile: resolved.profile().as_str().to_owned(),
            rules: record.auto_approval_rules.clone(),
            launcher: launch::Launcher::new(resolved)?,
            signer: lazaret_proto::signing::Signer::new(&coordinator.signing_key),
            manifest,
            root,
            watcher: Arc::new(Watcher::new()?),
        }))
    }

    fn identity(&self) -> &GenerationIdentity {
        &self.manifest.generation_identity
    }

    /// Opens the mailbox of a new session: a fresh `AgentSandbox` key, the
    /// session's binding and capability, its credential bundle written
    /// into its directory, and a watch on that directory. `prompts`: a
    /// developer can answer prompts in the session's terminal.
    pub fn open_session(
        self: &Arc<Self>,
        session_id: SessionId,
        prompts: bool,
    ) -> std::io::Result<session::SessionEscalation> {
        let identity = self.identity().clone();
        let credential =
            lazaret_proto::signing::credential(&identity, ProtocolCredentialRole::AgentSandbox);
        let binding = SessionBinding {
            generation_identity: identity.clone(),
            cli_id: CliId(session_id.0),
            session_id,
            credential_id: credential.credential_id,
        };
        let capability = SessionRequestCapability {
            protocol_version: ProtocolVersion::V1,
            capability_id: CapabilityId(lazaret_proto::signing::random_bytes()),
            session_binding: binding,
            expires_at: UnixTimeNs::now().after(CAPABILITY_LIFETIME),
        };
        let sandbox_key = credential.public_key;
        let bundle = SandboxCredentialBundle {
            protocol_version: ProtocolVersion::V1,
            generation_identity: identity,
            trust_manifest: self.manifest.clone(),
            protocol_credential: credential,
            request_capability: capability.clone(),
        };
        let encoded = lazaret_proto::codec::encode(&bundle).map_err(std::io::Error::other)?;
        let mailbox = mailbox::SessionMailbox::create(self.root.as_fd(), session_id, &encoded)?;
        // A mailbox that cannot be watched is removed as it is dropped.
        let watch = Watcher::watch(&self.watcher, &mailbox)?;
        Ok(session::SessionEscalation::new(
            Arc::clone(self),
            capability,
            sandbox_key,
            prompts,
            mailbox,
            watch,
        ))
    }

    /// Wakes the sessions whose mailboxes change, until the loop ends.
    pub async fn watch(&self) {
        self.watcher.run().await;
    }
}

/// A session's registration with the [`Watcher`]: the changes of its
/// mailbox, until dropped.
#[derive(Debug)]
pub struct Watch {
    watcher: Arc<Watcher>,
    descriptors: Vec<i32>,
    /// Bumped when `requests/` or the session's directory (its leader's
    /// identity) changed: something for the session to read.
    pub requests: watch::Receiver<u64>,
    /// Bumped when the client removed a file from `results/`: room for
    /// more output.
    pub results: watch::Receiver<u64>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut routes = self.watcher.routes();
        for wd in &self.descriptors {
            routes.remove(wd);
            let _ = inotify::remove_watch(self.watcher.fd.get_ref(), *wd);
        }
    }
}

/// One inotify instance for every mailbox of the generation (a user has
/// few instances; `fs.inotify.max_user_instances` is 128 by default), and
/// which session each watch wakes.
#[derive(Debug)]
struct Watcher {
    fd: tokio::io::unix::AsyncFd<OwnedFd>,
    routes: Mutex<HashMap<i32, watch::Sender<u64>>>,
}

impl Watcher {
    fn new() -> std::io::Result<Self> {
        let fd = inotify::init(inotify::CreateFlags::NONBLOCK | inotify::CreateFlags::CLOEXEC)?;
        Ok(Self {
            fd: crate::sys::register_owned(fd)?,
            routes: Mutex::new(HashMap::new()),
        })
    }

    fn routes(&self) -> std::sync::MutexGuard<'_, HashMap<i32, watch::Sender<u64>>> {
        self.routes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Watches `requests/` for records arriving (renamed in, written, or
    /// anything made there), the session's directory for its leader's
    /// identity, and `results/` for files the client removed.
    fn watch(this: &Arc<Self>, mailbox: &mailbox::SessionMailbox) -> std::io::Result<Watch> {
        let (requests_tx, requests) = watch::channel(0u64);
        let (results_tx, results) = watch::channel(0u64);
        let mut registered = Watch {
            watcher: Arc::clone(this),
            descriptors: Vec::new(),
            requests,
            results,
        };
        let record_arrives = WatchFlags::MOVED_TO | WatchFlags::CLOSE_WRITE | WatchFlags::CREATE;
        for (dir, flags, sender) in [
            (mailbox.requests_dir(), record_arrives, requests_tx.clone()),
            (mailbox.dir(), WatchFlags::MOVED_TO, requests_tx),
            (
                mailbox.results_dir(),
                WatchFlags::DELETE | WatchFlags::MOVED_FROM,
                results_tx,
            ),
        ] {
            // Dropping `registered` on an error removes what was added.
            let wd = inotify::add_watch(
                this.fd.get_ref(),
                lazaret_hostfs::beneath::proc_self_fd(dir),
                flags | WatchFlags::ONLYDIR,
            )?;
            registered.descriptors.push(wd);
            this.routes().insert(wd, sender);
        }
        Ok(registered)
    }

    /// Reads events as they come and bumps the change counter of each
    /// mailbox directory they name; an overflowed queue wakes every one.
    async fn run(&self) {
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
        loop {
            let mut guard = match self.fd.readable().await {
                Ok(guard) => guard,
                Err(e) => return tracing::error!("{}", Self::stopped(&e)),
            };
            let mut woken: Vec<i32> = Vec::new();
            let mut overflow = false;
            let mut reader = inotify::Reader::new(self.fd.get_ref(), &mut buf);
            loop {
                match reader.next() {
                    Ok(event) => {
                        if event.events().contains(inotify::ReadFlags::QUEUE_OVERFLOW) {
                            overflow = true;
                        }
                        woken.push(event.wd());
                    }
                    Err(rustix::io::Errno::AGAIN) => {
                        guard.clear_ready();
                        break;
                    }
                    Err(rustix::io::Errno::INTR) => {}
                    Err(e) => return tracing::error!("{}", Self::stopped(&e.into())),
                }
            }
            let routes = self.routes();
            let bump = |sender: &watch::Sender<u64>| sender.send_modify(|n| *n += 1);
            if overflow {
                routes.values().for_each(bump);
            } else {
                woken.iter().filter_map(|wd| routes.get(wd)).for_each(bump);
            }
        }
    }

    fn stopped(error: &std::io::Error) -> String {
        format!(
            "cannot read the mailboxes' inotify events ({error}); no session's escalation \
             requests are read from now on: run `lazaret down` and `lazaret up` to restore them"
        )
    }
}
