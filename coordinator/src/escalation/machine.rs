//! The requests of one session and what may happen to each: a pure state
//! machine, with no I/O, that the session's mailbox service drives and the
//! protocol model (`tests/escalation_model.rs`) checks.
//!
//! Every input returns the [`Effect`]s the service must carry out. The
//! rules it keeps: a request id is admitted once; a command is launched
//! only after a rule or the developer approved it, and never after it was
//! cancelled or expired; only the prompt this session shows can be
//! answered, and only once; every admitted request ends with exactly one
//! result. Requests are this session's alone: an answer or cancellation
//! naming another session's request finds nothing here.

use std::collections::{HashMap, HashSet, VecDeque};

use lazaret_proto::common::UnixTimeNs;
use lazaret_proto::ids::RequestId;
use lazaret_proto::mailbox::{DeveloperDecisionKind, EscalationOutcome};

/// The most request ids one session may use.
pub const MAX_REQUESTS_PER_SESSION: usize = 4096;
/// The most requests of one session waiting for the developer at once.
pub const MAX_WAITING: usize = 16;
/// The most host commands of one session running at once.
pub const MAX_RUNNING: usize = 8;

/// How a request was admitted, as classified and checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Admission {
    /// A rule approves it: run it now.
    Approved,
    /// The developer decides, in this session's terminal, before `deadline`.
    Ask {
        /// When it expires unanswered.
        deadline: UnixTimeNs,
    },
    /// Ends at once with this outcome (refused, or denied without a
    /// terminal to ask in).
    End(EscalationOutcome),
}

/// Why a request was not admitted at all (and is answered with a refusal
/// only when its id is new).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// The id was used before: a replay. Nothing is answered.
    Replayed,
    /// Too many requests, waiting or running.
    Busy,
}

/// What the service must do.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Effect {
    /// Show this request's prompt in the session's terminal.
    Prompt(RequestId),
    /// Take the shown prompt down: the request ended otherwise.
    Withdraw(RequestId, EscalationOutcome),
    /// Record the approval and start the command.
    Launch(RequestId),
    /// End the running command.
    Kill(RequestId),
    /// Write the request's result with this outcome.
    Finish(RequestId, EscalationOutcome),
    /// Write the request's result `Refused`: too many of this session's
    /// requests wait or run.
    Busy(RequestId),
    /// Remove the request's files: its result was acknowledged.
    Forget(RequestId),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum State {
    Waiting { deadline: UnixTimeNs },
    Running,
    Cancelling,
    Finished,
}

/// The requests of one session. Equal and hashed by content, so a model
/// checker can tell states apart.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Requests {
    states: HashMap<RequestId, State>,
    seen: HashSet<RequestId>,
    /// Requests waiting for the developer, oldest first; the first is the
    /// one shown.
    queue: VecDeque<RequestId>,
}

impl std::hash::Hash for Requests {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let mut states: Vec<_> = self.states.iter().collect();
        states.sort();
        let mut seen: Vec<_> = self.seen.iter().collect();
        seen.sort();
        (states, seen, &self.queue).hash(state);
    }
}

impl Requests {
    /// An empty session.
    pub fn new() -> Self {
        Self::default()
    }

    fn count(&self, wanted: fn(&State) -> bool) -> usize {
        self.states.values().filter(|s| wanted(s)).count()
    }

    /// A new request, as classified.
    pub fn admit(&mut self, id: RequestId, admission: Admission) -> Result<Vec<Effect>, Rejection> {
        if self.seen.contains(&id) {
            return Err(Rejection::Replayed);
        }
        if self.seen.len() >= MAX_REQUESTS_PER_SESSION {
            return Err(Rejection::Busy);
        }
        let busy = match admission {
            Admission::Approved => {
                self.count(|s| matches!(s, State::Running | State::Cancelling)) >= MAX_RUNNING
            }
            Admission::Ask { .. } => self.queue.len() >= MAX_WAITING,
            Admission::End(_) => false,
        };
        self.seen.insert(id);
        if busy {
            self.states.insert(id, State::Finished);
            return Ok(vec![Effect::Busy(id)]);
        }
        Ok(match admission {
            Admission::Approved => {
                self.states.insert(id, State::Running);
                vec![Effect::Launch(id)]
            }
            Admission::Ask { deadline } => {
                self.states.insert(id, State::Waiting { deadline });
                self.queue.push_back(id);
                if self.queue.len() == 1 {
                    vec![Effect::Prompt(id)]
                } else {
                    Vec::new()
                }
            }
            Admission::End(outcome) => {
                self.states.insert(id, State::Finished);
                vec![Effect::Finish(id, outcome)]
            }
        })
    }

    /// The request whose prompt is shown: the oldest waiting one.
    fn shown(&self) -> Option<RequestId> {
        self.queue.front().copied()
    }

    /// The prompt of the request shown now, after the one shown before
    /// went.
    fn show_next(&self) -> Vec<Effect> {
        self.shown().map(Effect::Prompt).into_iter().collect()
    }

    /// Takes `id` out of the queue (it is no longer waiting); if it was
    /// shown, its prompt comes down and the next one is shown.
    fn unqueue(&mut self, id: RequestId, outcome: EscalationOutcome) -> Vec<Effect> {
        let was_shown = self.shown() == Some(id);
        self.queue.retain(|q| *q != id);
        if !was_shown {
            return Vec::new();
        }
        let mut effects = vec![Effect::Withdraw(id, outcome)];
        effects.extend(self.show_next());
        effects
    }

    /// The developer answered the prompt for `id` in this session's
    /// terminal at `now`. Anything but the prompt shown now, or an answer
    /// past its deadline (the request expires instead), is ignored.
    pub fn answer(
        &mut self,
        id: RequestId,
        decision: DeveloperDecisionKind,
        now: UnixTimeNs,
    ) -> Vec<Effect> {
        let in_time =
            matches!(self.states.get(&id), Some(State::Waiting { deadline }) if now < *deadline);
        if self.shown() != Some(id) || !in_time {
            return Vec::new();
        }
        self.queue.pop_front();
        let mut effects = match decision {
            DeveloperDecisionKind::Approve => {
                self.states.insert(id, State::Running);
                vec![Effect::Launch(id)]
            }
            DeveloperDecisionKind::Deny => {
                self.states.insert(id, State::Finished);
                vec![Effect::Finish(id, EscalationOutcome::Denied)]
            }
        };
        effects.extend(self.show_next());
        effects
    }

    /// The sandbox cancelled `id`.
    pub fn cancel(&mut self, id: RequestId) -> Vec<Effect> {
        match self.states.get(&id).copied() {
            Some(State::Waiting { .. }) => {
                self.states.insert(id, State::Finished);
                let mut effects = self.unqueue(id, EscalationOutcome::Cancelled);
                effects.push(Effect::Finish(id, EscalationOutcome::Cancelled));
                effects
            }
            Some(State::Running) => {
                self.states.insert(id, State::Cancelling);
                vec![Effect::Kill(id)]
            }
            _ => Vec::new(),
        }
    }

    /// Expires every waiting request whose deadline is not after `now`.
    pub fn expire(&mut self, now: UnixTimeNs) -> Vec<Effect> {
        let expired: Vec<RequestId> = self
            .queue
            .iter()
            .copied()
            .filter(|id| matches!(self.states.get(id), Some(State::Waiting { deadline }) if *deadline <= now))
            .collect();
        let mut effects = Vec::new();
        for id in expired {
            self.states.insert(id, State::Finished);
            effects.extend(self.unqueue(id, EscalationOutcome::Expired));
            effects.push(Effect::Finish(id, EscalationOutcome::Expired));
        }
        effects
    }

    /// The earliest deadline of a waiting request (at most
    /// [`MAX_WAITING`] wait).
    pub fn next_deadline(&self) -> Option<UnixTimeNs> {
        self.queue
            .iter()
            .filter_map(|id| match self.states.get(id) {
                Some(State::Waiting { deadline }) => Some(*deadline),
                _ => None,
            })
            .min()
    }

    /// The command of `id` ended (or could not start) with `outcome`; a
    /// cancelled one ends as `Cancelled` whatever it exited with.
    pub fn ended(&mut self, id: RequestId, outcome: EscalationOutcome) -> Vec<Effect> {
        let outcome = match self.states.get(&id) {
            Some(State::Running) => outcome,
            Some(State::Cancelling) => EscalationOutcome::Cancelled,
            _ => return Vec::new(),
        };
        self.states.insert(id, State::Finished);
        vec![Effect::Finish(id, outcome)]
    }

    /// The sandbox acknowledged the result of `id`.
    pub fn acknowledged(&mut self, id: RequestId) -> Vec<Effect> {
        if self.states.get(&id) != Some(&State::Finished) {
            return Vec::new();
        }
        self.states.remove(&id);
        vec![Effect::Forget(id)]
    }

    /// Whether `id` was ever admitted (used ids are never used again).
    pub fn has_seen(&self, id: RequestId) -> bool {
        self.seen.contains(&id)
    }

    /// Whether `id` was admitted and has not ended.
    pub fn is_open(&self, id: RequestId) -> bool {
        matches!(
            self.states.get(&id),
            Some(State::Waiting { .. } | State::Running | State::Cancelling)
        )
    }

    /// The session ends: every command is killed and every waiting request
    /// cancelled.
    pub fn close(&mut self) -> Vec<Effect> {
        let open: Vec<RequestId> = self
            .states
            .iter()
            .filter(|(_, s)| **s != State::Finished)
            .map(|(id, _)| *id)
            .collect();
        open.into_iter().flat_map(|id| self.cancel(id)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: RequestId = RequestId([1; 16]);
    const NOW: UnixTimeNs = UnixTimeNs(0);
    const B: RequestId = RequestId([2; 16]);

    fn ask(at: u64) -> Admission {
        Admission::Ask {
            deadline: UnixTimeNs(at),
        }
    }

    #[test]
    fn approved_requests_run_and_end_once() {
        let mut r = Requests::new();
        assert_eq!(r.admit(A, Admission::Approved), Ok(vec![Effect::Launch(A)]));
        assert_eq!(r.admit(A, Admission::Approved), Err(Rejection::Replayed));
        assert_eq!(
            r.ended(A, EscalationOutcome::Completed),
            vec![Effect::Finish(A, EscalationOutcome::Completed)]
        );
        assert!(r.ended(A, EscalationOutcome::Completed).is_empty());
        assert_eq!(r.acknowledged(A), vec![Effect::Forget(A)]);
        // Forgotten, but never admitted again.
        assert_eq!(r.admit(A, Admission::Approved), Err(Rejection::Replayed));
    }

    #[test]
    fn prompts_are_shown_one_at_a_time_and_answered_once() {
        let mut r = Requests::new();
        assert_eq!(r.admit(A, ask(10)), Ok(vec![Effect::Prompt(A)]));
        assert_eq!(r.admit(B, ask(10)), Ok(vec![]));
        // B is not shown: its answer does nothing.
        assert!(r.answer(B, DeveloperDecisionKind::Approve, NOW).is_empty());
        assert_eq!(
            r.answer(A, DeveloperDecisionKind::Deny, NOW),
            vec![
                Effect::Finish(A, EscalationOutcome::Denied),
                Effect::Prompt(B)
            ]
        );
        assert!(r.answer(A, DeveloperDecisionKind::Approve, NOW).is_empty());
        assert_eq!(
            r.answer(B, DeveloperDecisionKind::Approve, NOW),
            vec![Effect::Launch(B)]
        );
    }

    #[test]
    fn cancelling_and_expiring_never_launch() {
        let mut r = Requests::new();
        r.admit(A, ask(10)).unwrap();
        r.admit(B, ask(20)).unwrap();
        assert_eq!(
            r.cancel(A),
            vec![
                Effect::Withdraw(A, EscalationOutcome::Cancelled),
                Effect::Prompt(B),
                Effect::Finish(A, EscalationOutcome::Cancelled)
            ]
        );
        assert!(r.answer(A, DeveloperDecisionKind::Approve, NOW).is_empty());
        assert_eq!(r.next_deadline(), Some(UnixTimeNs(20)));
        assert!(r.expire(UnixTimeNs(19)).is_empty());
        assert_eq!(
            r.expire(UnixTimeNs(20)),
            vec![
                Effect::Withdraw(B, EscalationOutcome::Expired),
                Effect::Finish(B, EscalationOutcome::Expired)
            ]
        );
        assert!(r.answer(B, DeveloperDecisionKind::Approve, NOW).is_empty());
    }

    #[test]
    fn an_answer_after_the_deadline_launches_nothing() {
        let mut r = Requests::new();
        r.admit(A, ask(10)).unwrap();
        assert!(
            r.answer(A, DeveloperDecisionKind::Approve, UnixTimeNs(10))
                .is_empty()
        );
        assert_eq!(
            r.expire(UnixTimeNs(10)),
            vec![
                Effect::Withdraw(A, EscalationOutcome::Expired),
                Effect::Finish(A, EscalationOutcome::Expired)
            ]
        );
    }

    #[test]
    fn a_cancelled_command_ends_cancelled() {
        let mut r = Requests::new();
        r.admit(A, Admission::Approved).unwrap();
        assert_eq!(r.cancel(A), vec![Effect::Kill(A)]);
        assert!(r.cancel(A).is_empty());
        assert_eq!(
            r.ended(A, EscalationOutcome::Completed),
            vec![Effect::Finish(A, EscalationOutcome::Cancelled)]
        );
    }

    #[test]
    fn bounds_refuse_rather_than_queue() {
        let mut r = Requests::new();
        for i in 0..MAX_RUNNING {
            let id = RequestId([i as u8 + 10; 16]);
            assert_eq!(
                r.admit(id, Admission::Approved),
                Ok(vec![Effect::Launch(id)])
            );
        }
        assert_eq!(r.admit(A, Admission::Approved), Ok(vec![Effect::Busy(A)]));
        let closed = r.close();
        assert_eq!(closed.len(), MAX_RUNNING);
        assert!(closed.iter().all(|e| matches!(e, Effect::Kill(_))));
    }
}
