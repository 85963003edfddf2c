//! Recording a generation's participants in the Domain Store: the intent
//! before a participant is created, and what it became once it exists.
//!
//! Owns the order recovery relies on (docs/storage.md): a participant's
//! `Intent` record is committed before anything of it exists, so a crash at
//! any point leaves a record naming what may need cleaning up. The guard
//! [`Recorder::begin`] and [`Recorder::record`] return is the only way to
//! record what the participant became, and it is `#[must_use]`, as is
//! what [`Intent::becoming`] makes of it until a transaction records it.
//! Trusts the store.

use std::sync::Arc;

use lazaret_proto::control::StartupStep;
use lazaret_proto::ids::GenerationId;
use lazaret_proto::ownership::ParticipantOwnership;
use lazaret_proto::store::{Generation, Participant, ParticipantState};
use lazaret_storage::store::{DomainStore, Slot};

use super::failure::{Failure, at};

/// Records the participants of one generation.
#[derive(Debug, Clone)]
pub(super) struct Recorder {
    store: Arc<DomainStore>,
    generation: GenerationId,
}

/// A participant recorded as intended: once it exists, what it became
/// ([`Intent::becoming`]) is committed with others by [`Recorder::record`]
/// or [`Recorder::settle`], or with the generation by
/// [`Intent::active_with`].
#[must_use = "a participant recorded as intended must be recorded as what it became"]
#[derive(Debug)]
pub(super) struct Intent {
    recorder: Recorder,
    slot: Slot,
    step: StartupStep,
    participant: Participant,
}

impl Recorder {
    /// A recorder for `generation` in `store`.
    pub(super) fn new(store: Arc<DomainStore>, generation: GenerationId) -> Self {
        Self { store, generation }
    }

    /// Commits `generation` as it begins and the intents to create its
    /// first participants, those of `participants` and as many more as
    /// `also` holds, in one transaction; a failure is one of `step`.
    pub(super) fn begin<const N: usize>(
        &self,
        generation: &Generation,
        step: StartupStep,
        participants: [(Slot, ParticipantOwnership); N],
        also: Vec<(Slot, ParticipantOwnership)>,
    ) -> Result<([Intent; N], Vec<Intent>), Failure> {
        let mut intents = self.commit(
            step,
            Vec::new(),
            participants.into_iter().chain(also).collect(),
            Some(generation),
            None,
        )?;
        let also = intents.split_off(N);
        Ok((one_each(intents), also))
    }

    /// Commits, in one transaction, what each of `done` became, the
    /// intents to create `next` (one disk flush, in the order recovery
    /// needs: nothing of `next` exists yet) and, if given, the encoded
    /// `WorkspaceRules` this generation routes by, in place of those of
    /// the generations before it; a failure is one of `step`.
    pub(super) fn record<const N: usize>(
        &self,
        step: StartupStep,
        done: Vec<Became>,
        next: [(Slot, ParticipantOwnership); N],
        rules: Option<&[u8]>,
    ) -> Result<[Intent; N], Failure> {
        self.commit(step, done, next.into(), None, rules)
            .map(one_each)
    }

    /// Commits what each of `done` became, in one transaction; a failure
    /// is one of `step`.
    pub(super) fn settle(&self, step: StartupStep, done: Vec<Became>) -> Result<(), Failure> {
        self.commit(step, done, Vec::new(), None, None).map(drop)
    }

    /// Commits what each of `done` became, the intents to create `next`
    /// and, if given, `generation` as it now is and the workspace `rules`
    /// this generation routes by, in one transaction.
    fn commit(
        &self,
        step: StartupStep,
        done: Vec<Became>,
        next: Vec<(Slot, ParticipantOwnership)>,
        generation: Option<&Generation>,
        rules: Option<&[u8]>,
    ) -> Result<Vec<Intent>, Failure> {
        let intents: Vec<_> = next
            .into_iter()
            .map(|(slot, ownership)| Intent {
                recorder: self.clone(),
                slot,
                step,
                participant: Participant {
                    generation_id: self.generation,
                    role: ownership.role(),
                    state: ParticipantState::Intent,
                    ownership,
                },
            })
            .collect();
        let rows: Vec<_> = done
            .iter()
            .map(|b| &b.0)
            .chain(&intents)
            .map(|i| (i.slot, &i.participant))
            .collect();
        self.store
            .put_participants_and_rules(
                &rows,
                generation,
                rules.map(|rules| (self.generation, rules)),
            )
            .map_err(|e| at(step)(&e))?;
        for became in &done {
            lazaret_storage::fault::point("active", &became.0.slot.name());
        }
        for intent in &intents {
            lazaret_storage::fault::point("intent", &intent.slot.name());
        }
        Ok(intents)
    }
}

/// The intents of a commit of `N` participants, as an array.
fn one_each<const N: usize>(intents: Vec<Intent>) -> [Intent; N] {
    intents
        .try_into()
        .unwrap_or_else(|_| unreachable!("one intent per participant"))
}

/// What a participant became, to be committed with others by
/// [`Recorder::record`].
#[must_use = "what a participant became must be recorded"]
#[derive(Debug)]
pub(super) struct Became(Intent);

impl Intent {
    /// The participant as it became, `state` and owned as `ownership`, for
    /// [`Recorder::record`] to commit.
    pub(super) fn becoming(
        mut self,
        state: ParticipantState,
        ownership: ParticipantOwnership,
    ) -> Became {
        self.participant.state = state;
        self.participant.ownership = ownership;
        Became(self)
    }

    /// The participant as created and active, owned as intended.
    pub(super) fn becoming_active(self) -> Became {
        let ownership = self.participant.ownership.clone();
        self.becoming(ParticipantState::Active, ownership)
    }

    /// Records the participant as created, active and owned as
    /// `ownership`, what each of `also` became, and `generation` as it now
    /// is, in one transaction (one disk flush instead of several).
    pub(super) fn active_with(
        self,
        ownership: ParticipantOwnership,
        generation: &Generation,
        mut also: Vec<Became>,
    ) -> Result<(), Failure> {
        let (recorder, step) = (self.recorder.clone(), self.step);
        also.insert(0, self.becoming(ParticipantState::Active, ownership));
        recorder
            .commit(step, also, Vec::new(), Some(generation), None)
            .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lazaret_proto::common::{HostPath, UnixTimeNs};
    use lazaret_proto::ids::{ConfigurationFingerprint, DomainId};
    use lazaret_proto::ownership::{PreparedLowerOwnership, PublicationOwnership};
    use lazaret_proto::process::PersistedHostProcessOwnership;
    use lazaret_proto::store::GenerationState;

    /// The Domain Store of a made-up Domain in a scratch directory.
    fn store() -> (tempfile::TempDir, Arc<DomainStore>) {
        let dir = tempfile::tempdir().unwrap();
        let retained = lazaret_hostfs::plan::ensure_root(
            &dir.path().join("domain"),
            rustix::process::getuid().as_raw(),
        )
        .unwrap();
        let domain = lazaret_proto::store::Domain {
            domain_id: DomainId([7; 32]),
            profile_name: "p".into(),
            canonical_workspace: HostPath::from(std::path::Path::new("/w")),
        };
        let store = DomainStore::open(&retained, &domain).unwrap();
        (dir, Arc::new(store))
    }

    /// One participant's intent, committed.
    fn intent(recorder: &Recorder, slot: Slot, ownership: ParticipantOwnership) -> Intent {
        let [intent] = recorder
            .record(StartupStep::Sandbox, Vec::new(), [(slot, ownership)], None)
            .unwrap();
        intent
    }

    /// Generation 3, starting.
    fn starting() -> Generation {
        Generation {
            domain_id: DomainId([7; 32]),
            generation_id: GenerationId(3),
            configuration_fingerprint: ConfigurationFingerprint([1; 32]),
            state: GenerationState::Starting,
            host_coordinator: PersistedHostProcessOwnership::Unassigned,
            started_at: UnixTimeNs::now(),
            closed_at: None,
        }
    }

    fn recorded(store: &DomainStore, slot: Slot) -> Participant {
        store
            .participants(GenerationId(3))
            .unwrap()
            .into_iter()
            .find(|(s, _)| *s == slot)
            .map(|(_, p)| p)
            .expect("a record in the slot")
    }

    #[test]
    fn intent_is_committed_before_the_participant_and_the_guard_records_what_it_became() {
        let (_dir, store) = store();
        let recorder = Recorder::new(Arc::clone(&store), GenerationId(3));
        let publication = |path: &str| {
            ParticipantOwnership::Publication(PublicationOwnership {
                socket_path: Some(HostPath::from(std::path::Path::new(path))),
                identity_path: None,
            })
        };
        let published = intent(&recorder, Slot::PUBLICATION, publication("/run/a.sock"));
        let first = recorded(&store, Slot::PUBLICATION);
        assert_eq!(first.state, ParticipantState::Intent);
        assert_eq!(first.ownership, publication("/run/a.sock"));
        let became = published.becoming(ParticipantState::Active, publication("/run/a.sock"));
        recorder.settle(StartupStep::Sandbox, vec![became]).unwrap();
        let then = recorded(&store, Slot::PUBLICATION);
        assert_eq!(then.state, ParticipantState::Active);
        assert_eq!(then.ownership, publication("/run/a.sock"));

        let lower = intent(
            &recorder,
            Slot::PREPARED_LOWER,
            ParticipantOwnership::PreparedLower(PreparedLowerOwnership::default()),
        );
        assert_eq!(
            recorded(&store, Slot::PREPARED_LOWER).state,
            ParticipantState::Intent
        );
        let leased = lower.becoming(
            ParticipantState::LeaseHeld,
            ParticipantOwnership::PreparedLower(PreparedLowerOwnership::default()),
        );
        recorder.settle(StartupStep::Image, vec![leased]).unwrap();
        assert_eq!(
            recorded(&store, Slot::PREPARED_LOWER).state,
            ParticipantState::LeaseHeld
        );
    }

    #[test]
    fn intents_recorded_together_are_each_recorded_and_each_guarded() {
        let (_dir, store) = store();
        let recorder = Recorder::new(Arc::clone(&store), GenerationId(3));
        let helper = || ParticipantOwnership::Helper(Default::default());
        let [supervisor, holder] = recorder
            .record(
                StartupStep::Sandbox,
                Vec::new(),
                [
                    (Slot::SUPERVISOR, helper()),
                    (Slot::NAMESPACE_HOLDER, helper()),
                ],
                None,
            )
            .unwrap();
        for slot in [Slot::SUPERVISOR, Slot::NAMESPACE_HOLDER] {
            let row = recorded(&store, slot);
            assert_eq!(row.state, ParticipantState::Intent);
            assert_eq!(row.generation_id, GenerationId(3));
        }
        let active = |intent: Intent| intent.becoming(ParticipantState::Active, helper());
        recorder
            .settle(StartupStep::Sandbox, vec![active(holder)])
            .unwrap();
        assert_eq!(
            recorded(&store, Slot::NAMESPACE_HOLDER).state,
            ParticipantState::Active
        );
        assert_eq!(
            recorded(&store, Slot::SUPERVISOR).state,
            ParticipantState::Intent
        );
        recorder
            .settle(StartupStep::Sandbox, vec![active(supervisor)])
            .unwrap();
        assert_eq!(
            recorded(&store, Slot::SUPERVISOR).state,
            ParticipantState::Active
        );
    }

    #[test]
    fn begin_records_the_generation_with_the_first_intents_in_their_order() {
        let (_dir, store) = store();
        let generation = starting();
        let recorder = Recorder::new(Arc::clone(&store), GenerationId(3));
        let helper = || ParticipantOwnership::Helper(Default::default());
        let anchor = || ParticipantOwnership::StateAnchor(Default::default());
        let ([supervisor], anchors) = recorder
            .begin(
                &generation,
                StartupStep::Sandbox,
                [(Slot::SUPERVISOR, helper())],
                vec![
                    (Slot::state_anchor(0), anchor()),
                    (Slot::state_anchor(1), anchor()),
                ],
            )
            .unwrap();
        let stored = store.latest_generation().unwrap().expect("the generation");
        assert_eq!(stored.state, GenerationState::Starting);
        for slot in [
            Slot::SUPERVISOR,
            Slot::state_anchor(0),
            Slot::state_anchor(1),
        ] {
            assert_eq!(recorded(&store, slot).state, ParticipantState::Intent);
        }
        assert_eq!(supervisor.slot, Slot::SUPERVISOR);
        let slots: Vec<Slot> = anchors.iter().map(|a| a.slot).collect();
        assert_eq!(slots, [Slot::state_anchor(0), Slot::state_anchor(1)]);
        let made = anchors.into_iter().map(Intent::becoming_active).collect();
        recorder.settle(StartupStep::State, made).unwrap();
        assert_eq!(
            recorded(&store, Slot::state_anchor(1)).state,
            ParticipantState::Active
        );
        assert_eq!(
            recorded(&store, Slot::SUPERVISOR).state,
            ParticipantState::Intent
        );
        drop(supervisor);
    }

    #[test]
    fn active_with_records_the_participants_and_their_generation_together() {
        let (_dir, store) = store();
        let mut generation = starting();
        store.put_generation(&generation).unwrap();
        let recorder = Recorder::new(Arc::clone(&store), GenerationId(3));
        let sandbox = intent(
            &recorder,
            Slot::SANDBOX,
            ParticipantOwnership::Sandbox(Default::default()),
        );
        let published = PublicationOwnership {
            socket_path: Some(HostPath::from(std::path::Path::new("/run/x/session.sock"))),
            identity_path: None,
        };
        let publication = intent(
            &recorder,
            Slot::SESSION_PUBLICATION,
            ParticipantOwnership::Publication(published.clone()),
        );
        generation.state = GenerationState::Running;
        sandbox
            .active_with(
                ParticipantOwnership::Sandbox(Default::default()),
                &generation,
                vec![publication.becoming_active()],
            )
            .unwrap();
        assert_eq!(
            recorded(&store, Slot::SANDBOX).state,
            ParticipantState::Active
        );
        let row = recorded(&store, Slot::SESSION_PUBLICATION);
        assert_eq!(row.state, ParticipantState::Active);
        assert_eq!(
            row.ownership,
            ParticipantOwnership::Publication(published),
            "owned as intended"
        );
        let stored = store.latest_generation().unwrap().expect("the generation");
        assert_eq!(stored.state, GenerationState::Running);
    }

    #[test]
    fn what_several_became_is_committed_only_when_recorded_and_then_together() {
        let (_dir, store) = store();
        let recorder = Recorder::new(Arc::clone(&store), GenerationId(3));
        let anchor = || ParticipantOwnership::StateAnchor(Default::default());
        let [lower, first] = recorder
            .record(
                StartupStep::State,
                Vec::new(),
                [
                    (
                        Slot::PREPARED_LOWER,
                        ParticipantOwnership::PreparedLower(PreparedLowerOwnership::default()),
                    ),
                    (Slot::state_anchor(0), anchor()),
                ],
                None,
            )
            .unwrap();
        let leased = lower.becoming(
            ParticipantState::LeaseHeld,
            ParticipantOwnership::PreparedLower(PreparedLowerOwnership::default()),
        );
        let made = first.becoming_active();
        // Nothing is written until the caller records it.
        assert_eq!(
            recorded(&store, Slot::PREPARED_LOWER).state,
            ParticipantState::Intent
        );
        let [second] = recorder
            .record(
                StartupStep::State,
                vec![leased, made],
                [(Slot::state_anchor(1), anchor())],
                None,
            )
            .unwrap();
        assert_eq!(
            recorded(&store, Slot::PREPARED_LOWER).state,
            ParticipantState::LeaseHeld
        );
        assert_eq!(
            recorded(&store, Slot::state_anchor(0)).state,
            ParticipantState::Active
        );
        assert_eq!(
            recorded(&store, Slot::state_anchor(1)).state,
            ParticipantState::Intent
        );
        recorder
            .settle(StartupStep::State, vec![second.becoming_active()])
            .unwrap();
        assert_eq!(
            recorded(&store, Slot::state_anchor(1)).state,
            ParticipantState::Active
        );
    }

    /// Rules that route everything to the host but `path`.
    fn rules_keeping(path: &str) -> lazaret_proto::router::WorkspaceRules {
        lazaret_proto::router::WorkspaceRules {
            isolate_ignored: true,
            global_excludes: Vec::new(),
            scopes: Vec::new(),
            read_only: Vec::new(),
            read_only_prefixes: Vec::new(),
            git_dirs: Vec::new(),
            kept_isolated: vec![lazaret_proto::router::RelativePath(path.into())],
        }
    }

    #[test]
    fn the_rules_a_generation_routes_by_are_recorded_with_its_routing() {
        let (_dir, store) = store();
        assert!(store.last_workspace_rules().unwrap().is_none());
        let routing = || ParticipantOwnership::GitRouting(Default::default());
        for (generation, path) in [(3, ".env"), (4, "node_modules")] {
            let recorder = Recorder::new(Arc::clone(&store), GenerationId(generation));
            let encoded = lazaret_proto::codec::encode(&rules_keeping(path)).unwrap();
            let [routed] = recorder
                .record(
                    StartupStep::Sandbox,
                    Vec::new(),
                    [(Slot::GIT_ROUTING, routing())],
                    Some(&encoded),
                )
                .unwrap();
            // In the same commit as the routing's intent.
            let intended = store
                .participants(GenerationId(generation))
                .unwrap()
                .into_iter()
                .find(|(slot, _)| *slot == Slot::GIT_ROUTING)
                .expect("the routing's intent");
            assert_eq!(intended.1.state, ParticipantState::Intent);
            let (by, rules) = store.last_workspace_rules().unwrap().expect("recorded");
            assert_eq!(by, GenerationId(generation));
            assert_eq!(rules, rules_keeping(path));
            recorder
                .settle(StartupStep::Sandbox, vec![routed.becoming_active()])
                .unwrap();
        }
        // Settling leaves them as they are.
        let (by, rules) = store.last_workspace_rules().unwrap().expect("recorded");
        assert_eq!(by, GenerationId(4));
        assert_eq!(rules, rules_keeping("node_modules"));
    }
}
