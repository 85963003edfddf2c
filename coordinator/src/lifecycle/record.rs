//! Recording a generation's participants in the Domain Store: the intent
//! before a participant is created, and what it became once it exists.
//!
//! Owns the order recovery relies on (docs/storage.md): a participant's
//! `Intent` record is committed before anything of it exists, so a crash at
//! any point leaves a record naming what may need cleaning up. The guard
//! [`Intent::record`] returns is the only way to record what the
//! participant became, and it is `#[must_use]`. Trusts the store.

use std::sync::Arc;

use lazaret_proto::control::StartupStep;
use lazaret_proto::ids::GenerationId;
use lazaret_proto::ownership::ParticipantOwnership;
use lazaret_proto::store::{Generation, Participant, ParticipantState};

use super::daemon::{Failure, at};
use crate::store::{DomainStore, Slot};

/// Records the participants of one generation.
#[derive(Debug, Clone)]
pub(super) struct Recorder {
    store: Arc<DomainStore>,
    generation: GenerationId,
}

/// A participant recorded as intended: record what it became with
/// [`Intent::active`] (or [`Intent::became`]) once it exists.
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

    /// Commits the intent to create the participant in `slot`, owned as
    /// `ownership` says so far; a failure is one of `step`.
    pub(super) fn intent(
        &self,
        slot: Slot,
        step: StartupStep,
        ownership: ParticipantOwnership,
    ) -> Result<Intent, Failure> {
        let [intent] = self.intents(step, [(slot, ownership)])?;
        Ok(intent)
    }

    /// Commits the intents to create several participants, in one
    /// transaction; a failure is one of `step`.
    pub(super) fn intents<const N: usize>(
        &self,
        step: StartupStep,
        participants: [(Slot, ParticipantOwnership); N],
    ) -> Result<[Intent; N], Failure> {
        self.commit(step, None, participants)
    }

    /// Commits, in one transaction, what `done` became (if any) and the
    /// intents to create `participants`.
    fn commit<const N: usize>(
        &self,
        step: StartupStep,
        done: Option<&Intent>,
        participants: [(Slot, ParticipantOwnership); N],
    ) -> Result<[Intent; N], Failure> {
        let intents = participants.map(|(slot, ownership)| Intent {
            recorder: self.clone(),
            slot,
            step,
            participant: Participant {
                generation_id: self.generation,
                role: ownership.role(),
                state: ParticipantState::Intent,
                ownership,
            },
        });
        let rows: Vec<_> = done
            .into_iter()
            .chain(&intents)
            .map(|i| (i.slot, &i.participant))
            .collect();
        self.store
            .put_participants(&rows)
            .map_err(|e| at(step)(&e))?;
        if let Some(done) = done {
            crate::fault::point("active", &done.slot.name());
        }
        for intent in &intents {
            crate::fault::point("intent", &intent.slot.name());
        }
        Ok(intents)
    }
}

impl Intent {
    fn put(&self) -> Result<(), Failure> {
        self.recorder
            .store
            .put_participant(self.slot, &self.participant)
            .map_err(|e| at(self.step)(&e))
    }

    /// Records the participant as created and active, owned as intended.
    pub(super) fn active(self) -> Result<(), Failure> {
        let ownership = self.participant.ownership.clone();
        self.became(ParticipantState::Active, ownership)
    }

    /// Records the participant as created, active and owned as `ownership`.
    pub(super) fn active_as(self, ownership: ParticipantOwnership) -> Result<(), Failure> {
        self.became(ParticipantState::Active, ownership)
    }

    /// Records the participant as created, active and owned as
    /// `ownership`, and commits the intents to create `next` in the same
    /// transaction (one disk flush instead of two, in the order recovery
    /// needs: nothing of `next` exists yet); a failure is one of `step`.
    pub(super) fn active_then<const N: usize>(
        mut self,
        ownership: ParticipantOwnership,
        step: StartupStep,
        next: [(Slot, ParticipantOwnership); N],
    ) -> Result<[Intent; N], Failure> {
        self.participant.state = ParticipantState::Active;
        self.participant.ownership = ownership;
        self.recorder.commit(step, Some(&self), next)
    }

    /// Records the participant as created, active and owned as
    /// `ownership`, and `generation` as it now is, in one transaction (one
    /// disk flush instead of two).
    pub(super) fn active_with(
        mut self,
        ownership: ParticipantOwnership,
        generation: &Generation,
    ) -> Result<(), Failure> {
        self.participant.state = ParticipantState::Active;
        self.participant.ownership = ownership;
        self.recorder
            .store
            .put_participant_and_generation(self.slot, &self.participant, generation)
            .map_err(|e| at(self.step)(&e))?;
        crate::fault::point("active", &self.slot.name());
        Ok(())
    }

    /// Records what the participant became: `state`, owned as `ownership`.
    pub(super) fn became(
        mut self,
        state: ParticipantState,
        ownership: ParticipantOwnership,
    ) -> Result<(), Failure> {
        self.participant.state = state;
        self.participant.ownership = ownership;
        self.put()?;
        crate::fault::point("active", &self.slot.name());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lazaret_proto::common::HostPath;
    use lazaret_proto::ids::DomainId;
    use lazaret_proto::ownership::{PreparedLowerOwnership, PublicationOwnership};
    use lazaret_proto::store::Domain;

    fn store() -> (tempfile::TempDir, Arc<DomainStore>) {
        let dir = tempfile::tempdir().unwrap();
        let retained = crate::config::confined::ensure_root(
            &dir.path().join("domain"),
            rustix::process::getuid().as_raw(),
        )
        .unwrap();
        let domain = Domain {
            domain_id: DomainId([7; 32]),
            profile_name: "p".into(),
            canonical_workspace: HostPath::from(std::path::Path::new("/w")),
        };
        let store = DomainStore::open(&retained, &domain).unwrap();
        (dir, Arc::new(store))
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
        let intent = recorder
            .intent(
                Slot::PUBLICATION,
                StartupStep::Sandbox,
                publication("/run/a.sock"),
            )
            .unwrap();
        let first = recorded(&store, Slot::PUBLICATION);
        assert_eq!(first.state, ParticipantState::Intent);
        assert_eq!(first.ownership, publication("/run/a.sock"));
        intent.active().unwrap();
        let then = recorded(&store, Slot::PUBLICATION);
        assert_eq!(then.state, ParticipantState::Active);
        assert_eq!(then.ownership, publication("/run/a.sock"));

        let lower = recorder
            .intent(
                Slot::PREPARED_LOWER,
                StartupStep::Image,
                ParticipantOwnership::PreparedLower(PreparedLowerOwnership::default()),
            )
            .unwrap();
        assert_eq!(
            recorded(&store, Slot::PREPARED_LOWER).state,
            ParticipantState::Intent
        );
        lower
            .became(
                ParticipantState::LeaseHeld,
                ParticipantOwnership::PreparedLower(PreparedLowerOwnership::default()),
            )
            .unwrap();
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
            .intents(
                StartupStep::Sandbox,
                [
                    (Slot::SUPERVISOR, helper()),
                    (Slot::NAMESPACE_HOLDER, helper()),
                ],
            )
            .unwrap();
        for slot in [Slot::SUPERVISOR, Slot::NAMESPACE_HOLDER] {
            let row = recorded(&store, slot);
            assert_eq!(row.state, ParticipantState::Intent);
            assert_eq!(row.generation_id, GenerationId(3));
        }
        holder.active().unwrap();
        assert_eq!(
            recorded(&store, Slot::NAMESPACE_HOLDER).state,
            ParticipantState::Active
        );
        assert_eq!(
            recorded(&store, Slot::SUPERVISOR).state,
            ParticipantState::Intent
        );
        supervisor.active().unwrap();
        assert_eq!(
            recorded(&store, Slot::SUPERVISOR).state,
            ParticipantState::Active
        );
    }

    #[test]
    fn active_then_records_what_one_became_and_the_next_intents_together() {
        let (_dir, store) = store();
        let recorder = Recorder::new(Arc::clone(&store), GenerationId(3));
        let helper = |sidecar| {
            ParticipantOwnership::Helper(lazaret_proto::ownership::HelperOwnership {
                network_sidecar_id: sidecar,
                ..Default::default()
            })
        };
        let holder = recorder
            .intent(Slot::NAMESPACE_HOLDER, StartupStep::Sandbox, helper(None))
            .unwrap();
        let running = helper(Some(lazaret_proto::ids::NetworkSidecarId([9; 16])));
        let [network] = holder
            .active_then(
                running.clone(),
                StartupStep::Network,
                [(
                    Slot::NETWORK,
                    ParticipantOwnership::Network(Default::default()),
                )],
            )
            .unwrap();
        let row = recorded(&store, Slot::NAMESPACE_HOLDER);
        assert_eq!(row.state, ParticipantState::Active);
        assert_eq!(row.ownership, running);
        assert_eq!(
            recorded(&store, Slot::NETWORK).state,
            ParticipantState::Intent
        );
        network.active().unwrap();
        assert_eq!(
            recorded(&store, Slot::NETWORK).state,
            ParticipantState::Active
        );
    }

    #[test]
    fn active_with_records_the_participant_and_its_generation_together() {
        use lazaret_proto::common::UnixTimeNs;
        use lazaret_proto::ids::ConfigurationFingerprint;
        use lazaret_proto::process::PersistedHostProcessOwnership;
        use lazaret_proto::store::GenerationState;

        let (_dir, store) = store();
        let mut generation = Generation {
            domain_id: DomainId([7; 32]),
            generation_id: GenerationId(3),
            configuration_fingerprint: ConfigurationFingerprint([1; 32]),
            state: GenerationState::Starting,
            host_coordinator: PersistedHostProcessOwnership::Unassigned,
            started_at: UnixTimeNs::now(),
            closed_at: None,
        };
        store.put_generation(&generation).unwrap();
        let recorder = Recorder::new(Arc::clone(&store), GenerationId(3));
        let sandbox = recorder
            .intent(
                Slot::SANDBOX,
                StartupStep::Sandbox,
                ParticipantOwnership::Sandbox(Default::default()),
            )
            .unwrap();
        generation.state = GenerationState::Running;
        sandbox
            .active_with(
                ParticipantOwnership::Sandbox(Default::default()),
                &generation,
            )
            .unwrap();
        assert_eq!(
            recorded(&store, Slot::SANDBOX).state,
            ParticipantState::Active
        );
        let stored = store.latest_generation().unwrap().expect("the generation");
        assert_eq!(stored.state, GenerationState::Running);
    }
}
