//! A model of the escalation protocol, checked exhaustively with
//! stateright: two sessions, two requests each, and every interleaving of
//! what the sandbox, the developer, the clock and the host commands can do
//! to them, driven through the coordinator's own request machine
//! ([`Requests`]), one per session, as the service drives it.
//!
//! The actions include the hostile ones: answers and cancellations that
//! name another session's request (a session's terminal answering for
//! another, a sandbox cancelling what is not its own), replayed request
//! ids, answers after the end. The properties are the protocol's promises:
//! no command runs without its rule's or its own session's developer's
//! approval; none runs after it was cancelled or expired; every result and
//! prompt goes to the session the request came from; no request gets two
//! results.

use std::collections::BTreeSet;

use lazaret_coordinator::escalation::machine::{Admission, Effect, Requests};
use lazaret_proto::common::UnixTimeNs;
use lazaret_proto::ids::RequestId;
use lazaret_proto::mailbox::{DeveloperDecisionKind, EscalationOutcome};
use stateright::{Checker, Model, Property};

const SESSIONS: usize = 2;
/// How many requests each session makes: two in the first (so prompts
/// queue), one in the second (so the sessions can cross).
const REQUESTS: [u8; SESSIONS] = [2, 1];

/// Request `n` of session `s`.
fn request(s: usize, n: u8) -> RequestId {
    RequestId([s as u8, n + 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
}

fn owner(id: RequestId) -> usize {
    usize::from(id.0[0])
}

fn all_requests() -> Vec<RequestId> {
    (0..SESSIONS)
        .flat_map(|s| (0..REQUESTS[s]).map(move |n| request(s, n)))
        .collect()
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Action {
    /// Session `s`'s mailbox yields request `id` (verified as its own).
    Admit(usize, RequestId, Admission),
    /// Session `s`'s terminal answers for `id`, in time or (`true`) after
    /// its deadline.
    Answer(usize, RequestId, DeveloperDecisionKind, bool),
    /// Session `s`'s sandbox cancels `id`.
    Cancel(usize, RequestId),
    /// Every deadline of session `s` passes.
    Expire(usize),
    /// The command of `id`, run for session `s`, exits.
    Exited(usize, RequestId),
    /// Session `s`'s sandbox acknowledges `id`'s result.
    Ack(usize, RequestId),
    /// Session `s` ends.
    Close(usize),
}

/// What the spec remembers about what happened, kept beside the machines.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct Ghost {
    /// (session, request) approved by a rule at admission.
    rule_approved: BTreeSet<(usize, RequestId)>,
    /// (session, request) prompted in that session's terminal.
    prompted: BTreeSet<(usize, RequestId)>,
    /// (session, request) the developer approved while its prompt showed.
    developer_approved: BTreeSet<(usize, RequestId)>,
    /// Requests cancelled or expired before they launched.
    stopped_before_launch: BTreeSet<RequestId>,
    launched: BTreeSet<RequestId>,
    /// Results: the session that wrote it, the request, the outcome.
    results: Vec<(usize, RequestId, EscalationOutcome)>,
    /// A property broke: what.
    broken: Option<&'static str>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct World {
    sessions: Vec<Requests>,
    shown: Vec<Option<RequestId>>,
    ghost: Ghost,
}

struct Protocol;

impl World {
    fn effects(&mut self, s: usize, effects: Vec<Effect>) {
        let ghost = &mut self.ghost;
        for effect in effects {
            match effect {
                Effect::Prompt(id) => {
                    if owner(id) != s {
                        ghost.broken = Some("a prompt was shown in another session");
                    }
                    self.shown[s] = Some(id);
                    ghost.prompted.insert((s, id));
                }
                Effect::Withdraw(id, outcome) => {
                    if self.shown[s] == Some(id) {
                        self.shown[s] = None;
                    }
                    if matches!(
                        outcome,
                        EscalationOutcome::Cancelled | EscalationOutcome::Expired
                    ) && !ghost.launched.contains(&id)
                    {
                        ghost.stopped_before_launch.insert(id);
                    }
                }
                Effect::Launch(id) => {
                    let approved = ghost.rule_approved.contains(&(s, id))
                        || ghost.developer_approved.contains(&(s, id));
                    if !approved {
                        ghost.broken = Some("a command ran without approval");
                    }
                    if ghost.stopped_before_launch.contains(&id) {
                        ghost.broken = Some("a command ran after it was cancelled or expired");
                    }
                    if owner(id) != s {
                        ghost.broken = Some("a command ran for another session");
                    }
                    if !ghost.launched.insert(id) {
                        ghost.broken = Some("a command ran twice");
                    }
                }
                Effect::Kill(_) | Effect::Forget(_) => {}
                Effect::Busy(_) => ghost.broken = Some("a request was refused as busy"),
                Effect::Finish(id, outcome) => {
                    if owner(id) != s {
                        ghost.broken = Some("a result went to another session");
                    }
                    if ghost.results.iter().any(|(_, r, _)| *r == id) {
                        ghost.broken = Some("a request got two results");
                    }
                    if matches!(
                        outcome,
                        EscalationOutcome::Cancelled | EscalationOutcome::Expired
                    ) && !ghost.launched.contains(&id)
                    {
                        ghost.stopped_before_launch.insert(id);
                    }
                    ghost.results.push((s, id, outcome));
                }
            }
        }
    }
}

impl Model for Protocol {
    type State = World;
    type Action = Action;

    fn init_states(&self) -> Vec<World> {
        vec![World {
            sessions: vec![Requests::new(); SESSIONS],
            shown: vec![None; SESSIONS],
            ghost: Ghost::default(),
        }]
    }

    fn actions(&self, world: &World, actions: &mut Vec<Action>) {
        if world.ghost.broken.is_some() {
            return;
        }
        let ask = Admission::Ask {
            deadline: UnixTimeNs(10),
        };
        for (s, &count) in REQUESTS.iter().enumerate() {
            for n in 0..count {
                let id = request(s, n);
                for admission in [Admission::Approved, ask] {
                    actions.push(Action::Admit(s, id, admission));
                }
            }
            for id in all_requests() {
                for decision in [DeveloperDecisionKind::Approve, DeveloperDecisionKind::Deny] {
                    actions.push(Action::Answer(s, id, decision, false));
                    actions.push(Action::Answer(s, id, decision, true));
                }
                actions.push(Action::Cancel(s, id));
                actions.push(Action::Exited(s, id));
                actions.push(Action::Ack(s, id));
            }
            actions.push(Action::Expire(s));
            actions.push(Action::Close(s));
        }
    }

    fn next_state(&self, world: &World, action: Action) -> Option<World> {
        let mut next = world.clone();
        let (s, effects) = match action {
            Action::Admit(s, id, admission) => {
                if admission == Admission::Approved
                    && !next.ghost.results.iter().any(|(_, r, _)| *r == id)
                    && !next.ghost.launched.contains(&id)
                {
                    next.ghost.rule_approved.insert((s, id));
                }
                let effects = next.sessions[s].admit(id, admission).ok()?;
                (s, effects)
            }
            Action::Answer(s, id, decision, late) => {
                // The spec: an approval counts only for the prompt this
                // session's terminal shows now, before its deadline.
                if decision == DeveloperDecisionKind::Approve && next.shown[s] == Some(id) && !late
                {
                    next.ghost.developer_approved.insert((s, id));
                }
                let now = UnixTimeNs(if late { 100 } else { 0 });
                let effects = next.sessions[s].answer(id, decision, now);
                if next.shown[s] == Some(id) && !effects.is_empty() {
                    next.shown[s] = None;
                }
                (s, effects)
            }
            Action::Cancel(s, id) => (s, next.sessions[s].cancel(id)),
            Action::Expire(s) => (s, next.sessions[s].expire(UnixTimeNs(100))),
            Action::Exited(s, id) => {
                if !next.ghost.launched.contains(&id) {
                    return None;
                }
                (s, next.sessions[s].ended(id, EscalationOutcome::Completed))
            }
            Action::Ack(s, id) => (s, next.sessions[s].acknowledged(id)),
            Action::Close(s) => (s, next.sessions[s].close()),
        };
        next.effects(s, effects);
        // An action that changed nothing (an answer nobody asked for, a
        // second cancel) leads nowhere new.
        (next != *world).then_some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("no property breaks", |_, world: &World| {
                world.ghost.broken.is_none()
            }),
            Property::always("only approved commands run", |_, world: &World| {
                world.ghost.launched.iter().all(|id| {
                    let s = owner(*id);
                    world.ghost.rule_approved.contains(&(s, *id))
                        || world.ghost.developer_approved.contains(&(s, *id))
                })
            }),
            Property::always("results go to their own session", |_, world: &World| {
                world
                    .ghost
                    .results
                    .iter()
                    .all(|(s, id, _)| owner(*id) == *s)
            }),
            Property::sometimes("a developer-approved command runs", |_, world: &World| {
                world
                    .ghost
                    .launched
                    .iter()
                    .any(|id| world.ghost.developer_approved.contains(&(owner(*id), *id)))
            }),
            Property::sometimes("a running command ends cancelled", |_, world: &World| {
                world.ghost.results.iter().any(|(_, id, outcome)| {
                    *outcome == EscalationOutcome::Cancelled && world.ghost.launched.contains(id)
                })
            }),
            Property::sometimes("a prompt expires", |_, world: &World| {
                world
                    .ghost
                    .results
                    .iter()
                    .any(|(_, _, outcome)| *outcome == EscalationOutcome::Expired)
            }),
        ]
    }
}

#[test]
fn the_escalation_protocol_keeps_its_promises() {
    let checker = Protocol.checker().threads(2).spawn_bfs().join();
    checker.assert_properties();
    let states = checker.unique_state_count();
    eprintln!("escalation model: {states} states checked");
    assert!(states > 1_000, "the model explored only {states} states");
}
