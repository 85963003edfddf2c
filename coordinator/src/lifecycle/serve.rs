//! Serving a running generation: the Host Coordinator's one event loop,
//! then the generation's end.
//!
//! Owns the loop that waits, on one current-thread tokio runtime, for
//! control requests, supervisor reports, session connections, the exit of
//! every participant (supervisor, sandbox, gofer, slirp4netns, router) and
//! SIGTERM; and the ordered stop that follows: sessions told and ended
//! within a bound, the sandbox stopped, slirp4netns ended, the generation
//! released, the `down` client answered. Nothing here waits without a
//! bound. Trusts a control peer only after checking its uid, and what the
//! supervisor reports only as far as routing it to the session it names.

use std::os::fd::{AsFd, OwnedFd};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use lazaret_proto::channel::{ChannelError, Endpoint, Received};
use lazaret_proto::control::{ControlRequest, ControlResponse, NetworkRecheck, NetworkStatus};
use lazaret_proto::failure::Failure;
use lazaret_proto::network::ConnectivityLink;
use lazaret_proto::sidecar::ObserveParameters;
use lazaret_proto::store::{Generation, GenerationState};
use lazaret_proto::supervisor::{SupervisorError, SupervisorReport, SupervisorRequest};
use tokio::sync::mpsc;

use super::live::{Live, Owned};
use super::recovery::release_generation;
use super::{CONTROL_SOCKET, chain};
use crate::aio::{AsyncChannel, Exit, exited};
use crate::config::ResolvedDomainConfiguration;
use crate::process::{kill_and_wait, wait_exit};
use crate::session::hub::Hub;

type ControlPeer = AsyncChannel<ControlResponse, ControlRequest>;

/// How many changed paths below the script directories the log names.
const LOGGED_CHANGES: usize = 20;

/// How long a control client has to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a read-back of the network may take before `status` answers
/// without it.
const RECHECK_TIMEOUT: Duration = Duration::from_secs(3);

/// How long sessions have to hear that the Domain goes down before they
/// are cut off.
const SESSIONS_END_WITHIN: Duration = Duration::from_millis(500);

/// Why the loop ended.
#[derive(Debug)]
enum Ending {
    /// `lazaret down`, whose client waits for the answer.
    Down(ControlPeer),
    /// SIGTERM.
    Terminated,
    /// A participant the generation cannot run without exited.
    Died(&'static str),
    /// The loop itself failed.
    Broken(String),
}

/// The runsc sandbox and its gofer end together, each when the other
/// does, and their pidfds report it in either order.
const SANDBOX: &str = "the runsc sandbox";
const GOFER: &str = "the runsc gofer";
const SANDBOX_AND_GOFER: &str = "the runsc sandbox and its gofer";

/// How long the one of the pair still running has to follow the other.
const PAIR_FOLLOWS_WITHIN: Duration = Duration::from_millis(200);

/// A death of the sandbox or its gofer names both once the other is gone
/// as well: which pidfd reported first says nothing of which process the
/// cause struck.
fn name_the_pair(ending: Ending, live: &Live) -> Ending {
    let other = match ending {
        Ending::Died(SANDBOX) => live.gofer.as_ref().map(|gofer| gofer.pidfd.as_fd()),
        Ending::Died(GOFER) => Some(live.sandbox.pidfd.as_fd()),
        _ => return ending,
    };
    match other {
        Some(other) if wait_exit(other, PAIR_FOLLOWS_WITHIN).unwrap_or(false) => {
            Ending::Died(SANDBOX_AND_GOFER)
        }
        _ => ending,
    }
}

/// Serves the generation until it is told to stop or a participant dies,
/// then stops and releases it.
pub(super) fn serve(
    owned: &Owned,
    resolved: &ResolvedDomainConfiguration,
    mut generation: Generation,
    mut live: Live,
) -> ExitCode {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build();
    let (ending, runtime) = match runtime {
        Ok(runtime) => {
            let ending = runtime.block_on(run(resolved, &generation, &mut live));
            (ending, Some(runtime))
        }
        Err(e) => (
            Ending::Broken(format!("cannot start the event loop: {e}")),
            None,
        ),
    };
    let ending = name_the_pair(ending, &live);
    match &ending {
        Ending::Down(_) => tracing::info!("down requested"),
        Ending::Terminated => tracing::info!("SIGTERM received; stopping the Domain"),
        Ending::Died(what) => tracing::error!(
            "{what} exited unexpectedly; the generation cannot run without it and is released"
        ),
        Ending::Broken(why) => tracing::error!("{why}; releasing the generation"),
    }

    // No new client reaches a Domain that is going down: `status`, `up` and
    // `attach` see it as not running from here on.
    let runtime_dir = resolved.authorities().domain_runtime.fd();
    let _ = rustix::fs::unlinkat(runtime_dir, CONTROL_SOCKET, rustix::fs::AtFlags::empty());
    let _ = rustix::fs::unlinkat(
        runtime_dir,
        crate::session::SESSION_SOCKET,
        rustix::fs::AtFlags::empty(),
    );
    generation.state = GenerationState::Stopping;
    let _ = owned.store.put_generation(&generation);
    // Attached clients hear that the Domain goes down before it does.
    if let (Some(runtime), Some(hub)) = (&runtime, &live.hub) {
        runtime.block_on(hub.domain_down(SESSIONS_END_WITHIN));
    }
    live.hub = None;
    // Leave the loop's registrations before the loop goes.
    let down_client = match ending {
        Ending::Down(peer) => Some(peer.into_endpoint()),
        _ => None,
    };
    drop(runtime);

    live.supervisor.stop();
    // The sandbox ends with the Domain pid namespace; wait for it, and kill
    // it through its pidfd if it lingers.
    if !wait_exit(live.sandbox.pidfd.as_fd(), Duration::from_secs(2)).unwrap_or(false) {
        tracing::warn!("the sandbox outlived its namespace holder; killing it");
        let _ = kill_and_wait(live.sandbox.pidfd.as_fd(), Duration::from_secs(5));
    }
    live.helper.stop();
    // With the sandbox gone, what it changed where git runs scripts from
    // is all there is to compare.
    let workspace_changes = live
        .workspace_watch
        .changes(resolved.authorities().workspace.fd());
    if workspace_changes.total > 0 || !workspace_changes.unchecked.is_empty() {
        // Named in the log whatever ended the generation: only `down` is
        // answered with the list.
        let first: Vec<String> = workspace_changes
            .changes
            .iter()
            .take(LOGGED_CHANGES)
            .map(|c| format!("{:?} {:?}", c.change, String::from_utf8_lossy(&c.path.0)))
            .collect();
        tracing::warn!(
            changed = workspace_changes.total,
            unchecked = workspace_changes.unchecked.len(),
            first = %first.join(", "),
            "files changed below directories holding scripts git runs; review them before \
             the next git command"
        );
    }
    let id = generation.generation_id;
    let result = release_generation(
        &owned.store,
        &owned.catalog,
        resolved.domain_id(),
        generation,
        &resolved.authorities().domain_runtime,
    );
    let response = match &result {
        Ok(_) => {
            tracing::info!("generation {id} stopped");
            ControlResponse::Stopped {
                generation_id: id,
                workspace_changes,
            }
        }
        Err(e) => {
            tracing::error!("releasing generation {id}: {}", chain(e));
            ControlResponse::Failed {
                failure: Failure::of(e).within(format!("generation {id} did not release cleanly")),
            }
        }
    };
    if let Some(peer) = down_client {
        // The answer is small and the socket empty: it never waits.
        let _ = peer.try_send(&response, &[]);
    }
    if result.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The event loop.
async fn run(
    resolved: &ResolvedDomainConfiguration,
    generation: &Generation,
    live: &mut Live,
) -> Ending {
    match Watched::register(resolved, live) {
        Ok(watched) => watched.serve(resolved, generation, live).await,
        Err(e) => Ending::Broken(format!("cannot watch the Domain's descriptors: {e}")),
    }
}

/// Everything the loop waits on.
struct Watched {
    control: tokio::io::unix::AsyncFd<OwnedFd>,
    sessions: tokio::net::UnixListener,
    supervisor: Exit,
    sandbox: Exit,
    gofer: Option<Exit>,
    slirp4netns: Exit,
    router: Exit,
    resolver: Option<Exit>,
    proxy: Option<Exit>,
    terminate: tokio::signal::unix::Signal,
}

impl Watched {
    fn register(resolved: &ResolvedDomainConfiguration, live: &mut Live) -> std::io::Result<Self> {
        let control = live.listener.try_clone()?;
        rustix::fs::fcntl_setfl(&control, rustix::fs::OFlags::NONBLOCK)?;
        let sessions = live.sessions.try_clone()?;
        sessions.set_nonblocking(true)?;
        let supervisor = Arc::new(AsyncChannel::new(Arc::clone(&live.supervisor.channel))?);
        let escalation = crate::escalation::Escalation::new(
            resolved,
            live.escalation.credential.clone(),
            live.escalation.manifest.clone(),
            live.escalation.mailbox.try_clone()?,
        )?;
        let watching = Arc::clone(&escalation);
        tokio::spawn(async move { watching.watch().await });
        live.hub = Some(Hub::new(
            supervisor,
            escalation,
            live.container_id,
            live.environment.try_clone()?,
            Arc::clone(&live.store),
            live.generation_id,
            Arc::clone(&live.session_server),
        ));
        Ok(Self {
            control: crate::sys::register_owned(control)?,
            sessions: tokio::net::UnixListener::from_std(sessions)?,
            supervisor: Exit::watch(live.supervisor.held.pidfd.as_fd())?,
            sandbox: Exit::watch(live.sandbox.pidfd.as_fd())?,
            gofer: live
                .gofer
                .as_ref()
                .map(|gofer| Exit::watch(gofer.pidfd.as_fd()))
                .transpose()?,
            slirp4netns: Exit::watch(live.helper.held.pidfd.as_fd())?,
            router: Exit::watch(live.router.pidfd.as_fd())?,
            resolver: live
                .resolver
                .as_ref()
                .map(|resolver| Exit::watch(resolver.pidfd.as_fd()))
                .transpose()?,
            proxy: live
                .proxy
                .as_ref()
                .map(|proxy| Exit::watch(proxy.pidfd.as_fd()))
                .transpose()?,
            terminate: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?,
        })
    }

    async fn serve(
        mut self,
        resolved: &ResolvedDomainConfiguration,
        generation: &Generation,
        live: &mut Live,
    ) -> Ending {
        let hub = Arc::clone(live.hub.as_ref().expect("registered above"));
        let supervisor = hub.supervisor();
        let uid = rustix::process::getuid();
        let (requests, mut asked) = mpsc::channel::<(ControlRequest, ControlPeer)>(16);
        // Status requests wait for one read-back of the network, asked for
        // by the first of them and answered to all.
        let mut waiting: Vec<ControlPeer> = Vec::new();
        let mut recheck_due: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                () = self.supervisor.exited() => return Ending::Died("the Runtime Supervisor"),
                () = self.sandbox.exited() => return Ending::Died(SANDBOX),
                () = exited(self.gofer.as_ref()) => return Ending::Died(GOFER),
                () = self.slirp4netns.exited() => return Ending::Died("slirp4netns"),
                () = self.router.exited(), if live.workspace.router_running => {
                    // The workspace fails closed: the FUSE connection is
                    // aborted and every operation on it fails. The
                    // generation stays, so sessions can end in order;
                    // status says what happened.
                    live.workspace.router_running = false;
                    if let Some(problem) = live.workspace.problem(resolved.profile().as_str()) {
                        tracing::error!("{problem}");
                    }
                }
                () = exited(self.resolver.as_ref()), if resolver_running(live) => {
                    resolver_exited(live, resolved.profile().as_str());
                }
                () = exited(self.proxy.as_ref()), if proxy_running(live) => {
                    proxy_exited(live, resolved.profile().as_str());
                }
                _ = self.terminate.recv() => return Ending::Terminated,
                report = supervisor.recv() => match report {
                    Ok(report) => match hub.dispatch(report) {
                        None => {}
                        Some(SupervisorReport::NetworkObserved(observed)) => {
                            let recheck = recheck(&mut live.network, observed);
                            recheck_due = None;
                            answer(&mut waiting, live, resolved, generation, &hub, &recheck);
                        }
                        Some(other) => tracing::warn!("unexpected supervisor report: {other:?}"),
                    },
                    Err(e) => {
                        return Ending::Broken(format!(
                            "the Runtime Supervisor link failed ({})",
                            chain(&e)
                        ));
                    }
                },
                accepted = self.sessions.accept() => match accepted {
                    Ok((socket, _)) => hub.spawn_session(socket),
                    Err(e) => tracing::warn!("session accept failed: {e}"),
                },
                ready = self.control.readable() => match ready {
                    Ok(mut guard) => {
                        accept_control(guard.get_inner().as_fd(), uid, &requests);
                        guard.clear_ready();
                    }
                    Err(e) => return Ending::Broken(format!("the control socket failed: {e}")),
                },
                () = sleep_until(recheck_due) => {
                    recheck_due = None;
                    let recheck = NetworkRecheck::Failed(Failure::check(format!(
                        "the namespace was not read back within {} s",
                        RECHECK_TIMEOUT.as_secs()
                    )));
                    answer(&mut waiting, live, resolved, generation, &hub, &recheck);
                }
                Some((request, peer)) = asked.recv() => match request {
                    ControlRequest::Status => {
                        waiting.push(peer);
                        if recheck_due.is_none() {
                            let observe = SupervisorRequest::ObserveNetwork(ObserveParameters {
                                enforcement_namespace: live
                                    .network
                                    .attestation
                                    .enforcement_namespace,
                                link: ConnectivityLink::slirp4netns(),
                            });
                            recheck_due = Some(tokio::time::Instant::now() + RECHECK_TIMEOUT);
                            if let Err(e) = supervisor.send(&observe, &[]).await {
                                return Ending::Broken(format!(
                                    "the Runtime Supervisor link failed ({})",
                                    chain(&e)
                                ));
                            }
                        }
                    }
                    ControlRequest::Down => return Ending::Down(peer),
                },
            }
        }
    }
}

/// Whether the generation's resolver is still taken to run.
fn resolver_running(live: &Live) -> bool {
    live.network
        .names
        .as_ref()
        .is_some_and(|n| n.resolver_running)
}

/// Whether the generation's Credential Proxy is still taken to run.
fn proxy_running(live: &Live) -> bool {
    live.network
        .names
        .as_ref()
        .and_then(|n| n.proxy.as_ref())
        .is_some_and(|p| p.running)
}

/// Names fail closed when the resolver exits: nothing answers the
/// sandbox's queries, and no address is admitted any more. The generation
/// stays; status says what happened.
fn resolver_exited(live: &mut Live, profile: &str) {
    if let Some(names) = live.network.names.as_mut() {
        names.resolver_running = false;
    }
    tracing::error!(
        "Lazaret's resolver exited unexpectedly: names no longer resolve in the sandbox, and \
         addresses already admitted expire; run `lazaret down {profile}` and `lazaret up \
         {profile}` to start a new one"
    );
}

/// Credentials fail closed when the Credential Proxy exits: nothing
/// listens for the credential hosts any more, so the sandbox's requests to
/// them are refused. The generation stays; status says what happened.
fn proxy_exited(live: &mut Live, profile: &str) {
    if let Some(proxy) = live.network.names.as_mut().and_then(|n| n.proxy.as_mut()) {
        proxy.running = false;
    }
    tracing::error!(
        "the Credential Proxy exited unexpectedly: requests to the credential hosts are \
         refused; run `lazaret down {profile}` and `lazaret up {profile}` to start a new one"
    );
}

/// Completes at `due`, or never when there is nothing due.
async fn sleep_until(due: Option<tokio::time::Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}

/// What a read-back of the network says about the policy in force; the
/// addresses it found admitted for names are kept for the status. Why a
/// read-back failed is the supervisor's report, shown as it renders it.
fn recheck(
    network: &mut NetworkStatus,
    observed: Result<Box<lazaret_proto::network::Observed>, SupervisorError>,
) -> NetworkRecheck {
    let at = lazaret_proto::common::UnixTimeNs::now();
    match observed {
        Ok(observed) => {
            let lazaret_proto::network::Observed {
                observation,
                admitted,
                admitted_total,
            } = *observed;
            if let Some(names) = network.names.as_mut() {
                names.admitted = admitted;
                names.admitted_total = admitted_total;
            }
            let names = network.names.as_ref().map(|n| &n.names);
            let drift = observation.drift(&network.policy, names);
            if drift.is_empty() {
                NetworkRecheck::Holds { at }
            } else {
                tracing::error!(
                    "the enforcement namespace no longer shows the attested policy: {}",
                    drift
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("; ")
                );
                NetworkRecheck::Differs { at, drift }
            }
        }
        Err(error) => {
            if let Some(names) = network.names.as_mut() {
                names.admitted.clear();
                names.admitted_total = 0;
            }
            let failure = error.failure;
            tracing::error!("the enforcement namespace could not be read back: {failure}");
            NetworkRecheck::Failed(failure)
        }
    }
}

/// Answers every waiting status request, each on a task bounded by
/// [`REQUEST_TIMEOUT`].
fn answer(
    waiting: &mut Vec<ControlPeer>,
    live: &Live,
    resolved: &ResolvedDomainConfiguration,
    generation: &Generation,
    hub: &Hub,
    recheck: &NetworkRecheck,
) {
    if waiting.is_empty() {
        return;
    }
    let status = live.status(
        resolved,
        generation,
        hub.sessions(),
        recheck.clone(),
        super::usage::Walk::Persistent,
    );
    for peer in waiting.drain(..) {
        let response = ControlResponse::Status(Box::new(status.clone()));
        tokio::spawn(async move {
            let _ = tokio::time::timeout(REQUEST_TIMEOUT, peer.send(&response, &[])).await;
        });
    }
}

/// Accepts every control connection waiting, each on a task that reads its
/// request within [`REQUEST_TIMEOUT`] and hands it to the loop.
fn accept_control(
    listener: std::os::fd::BorrowedFd<'_>,
    uid: rustix::process::Uid,
    requests: &mpsc::Sender<(ControlRequest, ControlPeer)>,
) {
    loop {
        let peer = match Endpoint::<ControlResponse, ControlRequest>::accept(listener) {
            Ok(peer) => peer,
            Err(ChannelError::Socket {
                source: rustix::io::Errno::AGAIN,
                ..
            }) => return,
            Err(e) => {
                tracing::warn!("accept failed: {}", chain(&e));
                return;
            }
        };
        if let Err(e) = peer.require_peer_uid(uid) {
            tracing::warn!("refused a control connection: {}", chain(&e));
            continue;
        }
        let requests = requests.clone();
        tokio::spawn(async move {
            let peer = match AsyncChannel::new(Arc::new(peer)) {
                Ok(peer) => peer,
                Err(e) => return tracing::warn!("control connection: {e}"),
            };
            match tokio::time::timeout(REQUEST_TIMEOUT, peer.recv()).await {
                Ok(Ok(Received { message, .. })) => {
                    let _ = requests.send((message, peer)).await;
                }
                Ok(Err(e)) => tracing::warn!("bad control request: {}", chain(&e)),
                Err(_) => tracing::warn!("a control client sent no request within 5 s"),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    //! The control socket as the loop serves it, against scripted clients:
    //! no root, no runsc.

    use std::os::fd::{AsFd, OwnedFd};
    use std::path::PathBuf;
    use std::time::Duration;

    use lazaret_proto::channel::{ChannelError, Endpoint};
    use lazaret_proto::control::{ControlRequest, ControlResponse};
    use tokio::sync::mpsc;

    use super::{ControlPeer, REQUEST_TIMEOUT, accept_control, sleep_until};

    type Client = Endpoint<ControlRequest, ControlResponse>;
    type Requests = (
        mpsc::Sender<(ControlRequest, ControlPeer)>,
        mpsc::Receiver<(ControlRequest, ControlPeer)>,
    );

    /// A non-blocking control listener in a scratch directory.
    fn listener() -> (tempfile::TempDir, OwnedFd, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("control.sock");
        let listener = lazaret_proto::channel::listen(&path).unwrap();
        rustix::fs::fcntl_setfl(&listener, rustix::fs::OFlags::NONBLOCK).unwrap();
        (dir, listener, path)
    }

    fn requests() -> Requests {
        mpsc::channel(16)
    }

    fn me() -> rustix::process::Uid {
        rustix::process::getuid()
    }

    /// Sends `bytes` as one packet, whatever they decode to.
    fn send_raw(client: &Client, bytes: &[u8]) {
        rustix::net::send(client.as_fd(), bytes, rustix::net::SendFlags::empty()).unwrap();
    }

    /// Whether the loop heard nothing more within a moment.
    async fn nothing_more(asked: &mut mpsc::Receiver<(ControlRequest, ControlPeer)>) -> bool {
        tokio::time::timeout(Duration::from_millis(300), asked.recv())
            .await
            .is_err()
    }

    #[tokio::test(flavor = "current_thread")]
    async fn status_and_down_reach_the_loop_with_peers_it_can_answer() {
        let (_dir, listener, path) = listener();
        let (requests, mut asked) = requests();
        let status = Client::connect(&path).unwrap();
        let down = Client::connect(&path).unwrap();
        status.send(&ControlRequest::Status, &[]).unwrap();
        down.send(&ControlRequest::Down, &[]).unwrap();
        accept_control(listener.as_fd(), me(), &requests);
        let mut heard = Vec::new();
        for _ in 0..2 {
            let (request, peer) = tokio::time::timeout(Duration::from_secs(10), asked.recv())
                .await
                .expect("a request within the bound")
                .expect("the sender lives");
            if request == ControlRequest::Status {
                let answer = ControlResponse::Failed {
                    failure: lazaret_proto::failure::Failure::check("answered"),
                };
                peer.send(&answer, &[]).await.unwrap();
            }
            heard.push(request);
        }
        heard.sort_by_key(|r| format!("{r:?}"));
        assert_eq!(heard, [ControlRequest::Down, ControlRequest::Status]);
        assert_eq!(
            status.recv().unwrap().message,
            ControlResponse::Failed {
                failure: lazaret_proto::failure::Failure::check("answered")
            }
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_peer_of_another_uid_is_refused_before_it_is_heard() {
        let (_dir, listener, path) = listener();
        let (requests, mut asked) = requests();
        let client = Client::connect(&path).unwrap();
        client.send(&ControlRequest::Down, &[]).unwrap();
        let someone_else = rustix::process::Uid::from_raw(me().as_raw().wrapping_add(1));
        accept_control(listener.as_fd(), someone_else, &requests);
        assert!(nothing_more(&mut asked).await, "a refused peer was heard");
        // Closed unread: the client hears the connection end (reset, as
        // its request was never read).
        assert!(client.recv().is_err());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn malformed_and_unknown_requests_are_dropped_and_the_next_peer_is_served() {
        let (_dir, listener, path) = listener();
        let (requests, mut asked) = requests();
        let garbled = Client::connect(&path).unwrap();
        send_raw(&garbled, &[0xff, 0x01, 0x02]);
        // The current envelope version, then a variant no request has.
        let unknown = Client::connect(&path).unwrap();
        send_raw(&unknown, &[1, 7]);
        // A request with bytes after it.
        let trailing = Client::connect(&path).unwrap();
        send_raw(&trailing, &[1, 0, 0]);
        let good = Client::connect(&path).unwrap();
        good.send(&ControlRequest::Status, &[]).unwrap();
        accept_control(listener.as_fd(), me(), &requests);
        let (request, _peer) = tokio::time::timeout(Duration::from_secs(10), asked.recv())
            .await
            .expect("the good request within the bound")
            .unwrap();
        assert_eq!(request, ControlRequest::Status);
        assert!(nothing_more(&mut asked).await, "a bad request was heard");
        for bad in [&garbled, &unknown, &trailing] {
            assert!(matches!(bad.recv(), Err(ChannelError::Disconnected)));
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_peer_that_vanishes_before_asking_is_forgotten() {
        let (_dir, listener, path) = listener();
        let (requests, mut asked) = requests();
        // Nobody waits: the accept returns at once.
        accept_control(listener.as_fd(), me(), &requests);
        drop(Client::connect(&path).unwrap());
        accept_control(listener.as_fd(), me(), &requests);
        assert!(nothing_more(&mut asked).await);
        // The socket still serves the next client.
        let next = Client::connect(&path).unwrap();
        next.send(&ControlRequest::Down, &[]).unwrap();
        accept_control(listener.as_fd(), me(), &requests);
        let (request, _peer) = tokio::time::timeout(Duration::from_secs(10), asked.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(request, ControlRequest::Down);
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_silent_peer_is_given_up_once_the_request_bound_passes() {
        let (_dir, listener, path) = listener();
        let (requests, mut asked) = requests();
        let silent = Client::connect(&path).unwrap();
        accept_control(listener.as_fd(), me(), &requests);
        tokio::time::sleep(REQUEST_TIMEOUT - Duration::from_millis(100)).await;
        assert!(asked.try_recv().is_err());
        // Still held just before the bound.
        assert!(matches!(silent.try_recv(), Ok(None)));
        tokio::time::sleep(Duration::from_millis(200)).await;
        tokio::task::yield_now().await;
        assert!(matches!(silent.recv(), Err(ChannelError::Disconnected)));
        assert!(asked.try_recv().is_err());
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_recheck_is_due_only_when_one_was_asked_for() {
        let never = tokio::time::timeout(Duration::from_secs(3600), sleep_until(None)).await;
        assert!(never.is_err());
        let due = tokio::time::Instant::now() + Duration::from_secs(3);
        tokio::time::timeout(Duration::from_secs(4), sleep_until(Some(due)))
            .await
            .expect("due within its time");
        assert!(tokio::time::Instant::now() >= due);
    }
}
