//! Drains in progress, and the last few that ended, for listings (`GET /v1/drains`, the web
//! console): which revision each waits for, how many subscribers acked it, who lags. A drain
//! is tracked from its offline until its wait ends (complete, timed out, or its caller gone);
//! its progress is read from the subscriber table when listed, so tracking costs nothing per
//! ack.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use gangway_core::drain::{AckProgress, SubscriberAck};
use gangway_core::model::{InstanceKey, ServiceKey};
use serde::Serialize;
use tokio::time::Instant;

use super::Registry;
use super::state::State;

/// Ended drains kept for listings, newest first; older ones are forgotten.
pub const RECENT_DRAINS: usize = 32;

/// Laggards listed per drain (the first ones by subscriber id); `total - acked` counts them
/// all.
pub const LAGGARDS_LISTED: usize = 16;

/// Where a drain stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DrainState {
    /// Offline applied; waiting for acks.
    Waiting,
    /// Every live subscriber acked.
    Complete,
    /// The timeout ended the wait with laggards.
    TimedOut,
    /// The caller went away before the wait ended (the instance stays offline).
    Cancelled,
}

/// One drain, running or ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DrainProgress {
    /// Id, unique while the registry runs (ascending by start).
    pub id: u64,
    /// The service (`namespace`, `group`, `service`).
    #[serde(flatten)]
    pub service: ServiceKey,
    /// The instance drained.
    pub instance: InstanceKey,
    /// The revision without the instance that subscribers must ack.
    pub revision: u64,
    /// Where it stands.
    pub state: DrainState,
    /// Unix ms of its start.
    pub started_at_ms: u64,
    /// Time waited so far (running) or in all (ended), ms.
    pub waited_ms: u64,
    /// Its timeout, ms.
    pub timeout_ms: u64,
    /// Live subscribers that acked `revision` or later (ended: when it ended).
    pub acked: usize,
    /// Live subscribers of the service (ended: when it ended).
    pub total: usize,
    /// Subscribers behind `revision`, at most [`LAGGARDS_LISTED`].
    pub laggards: Vec<SubscriberAck>,
}

struct Running {
    service: ServiceKey,
    instance: InstanceKey,
    revision: u64,
    started: Instant,
    started_at_ms: u64,
    timeout: Duration,
}

/// The registry's drains: running ones by id, ended ones newest first.
#[derive(Default)]
pub(crate) struct LiveDrains {
    next_id: u64,
    running: BTreeMap<u64, Running>,
    ended: VecDeque<DrainProgress>,
    /// Bumped on every start and end (see [`Registry::activity`]).
    pub(crate) version: u64,
}

impl Running {
    fn progress(&self, id: u64, state: DrainState, acks: &AckProgress) -> DrainProgress {
        DrainProgress {
            id,
            service: self.service.clone(),
            instance: self.instance.clone(),
            revision: self.revision,
            state,
            started_at_ms: self.started_at_ms,
            waited_ms: self.started.elapsed().as_millis() as u64,
            timeout_ms: self.timeout.as_millis() as u64,
            acked: acks.acked.len(),
            total: acks.acked.len() + acks.laggards.len(),
            laggards: acks
                .laggards
                .iter()
                .take(LAGGARDS_LISTED)
                .cloned()
                .collect(),
        }
    }
}

impl State {
    /// The live subscribers of `service` with what they acked, by id.
    pub(crate) fn subscriber_acks(&self, service: &ServiceKey) -> Vec<SubscriberAck> {
        let Some(entry) = self.services.get(service) else {
            return Vec::new();
        };
        entry
            .subscribers
            .iter()
            .filter_map(|id| {
                self.subscribers.get(id).map(|s| SubscriberAck {
                    id: id.clone(),
                    address: s.info.address.clone(),
                    acked_revision: s.acked_revision,
                    node: String::new(),
                })
            })
            .collect()
    }

    fn drain_acks(&self, running: &Running) -> AckProgress {
        AckProgress::of(running.revision, &self.subscriber_acks(&running.service))
    }
}

/// A drain's entry in the table, from its offline until its wait ends: [`DrainTracker::end`]
/// records the outcome; dropped without it (the caller went away), it records a cancel.
pub(crate) struct DrainTracker {
    registry: Registry,
    id: u64,
    ended: bool,
}

impl DrainTracker {
    /// Records the wait's outcome: complete or timed out.
    pub(crate) fn end(mut self, progress: &AckProgress) {
        self.ended = true;
        let state = if progress.is_complete() {
            DrainState::Complete
        } else {
            DrainState::TimedOut
        };
        end(&mut self.registry.lock(), self.id, state, Some(progress));
    }
}

impl Drop for DrainTracker {
    fn drop(&mut self) {
        if !self.ended {
            end(
                &mut self.registry.lock(),
                self.id,
                DrainState::Cancelled,
                None,
            );
        }
    }
}

/// Moves drain `id` to the ended ones with `state` and its progress (`None`: as it is now).
fn end(state: &mut State, id: u64, outcome: DrainState, progress: Option<&AckProgress>) {
    let Some(running) = state.drains.running.remove(&id) else {
        return;
    };
    let now;
    let progress = match progress {
        Some(p) => p,
        None => {
            now = state.drain_acks(&running);
            &now
        }
    };
    let drains = &mut state.drains;
    drains
        .ended
        .push_front(running.progress(id, outcome, progress));
    drains.ended.truncate(RECENT_DRAINS);
    drains.version += 1;
}

impl Registry {
    /// Tracks a drain of `instance` waiting for `revision`, started at `started`.
    pub(crate) fn track_drain(
        &self,
        service: &ServiceKey,
        instance: &InstanceKey,
        revision: u64,
        started: Instant,
        timeout: Duration,
    ) -> DrainTracker {
        let mut state = self.lock();
        let drains = &mut state.drains;
        drains.next_id += 1;
        drains.version += 1;
        let id = drains.next_id;
        drains.running.insert(
            id,
            Running {
                service: service.clone(),
                instance: instance.clone(),
                revision,
                started,
                started_at_ms: super::now_ms(),
                timeout,
            },
        );
        DrainTracker {
            registry: self.clone(),
            id,
            ended: false,
        }
    }

    /// The drains waiting now (oldest first, their progress as of now), then the last
    /// [`RECENT_DRAINS`] that ended (newest first). O(running drains × their services'
    /// subscribers).
    pub fn drains(&self) -> Vec<DrainProgress> {
        let state = self.lock();
        let running = state
            .drains
            .running
            .iter()
            .map(|(id, r)| r.progress(*id, DrainState::Waiting, &state.drain_acks(r)));
        running.chain(state.drains.ended.iter().cloned()).collect()
    }

    /// What a live view of the registry needs to notice: it changes when any service gets a
    /// new revision, a subscriber acks a newer revision, joins or leaves, or a drain starts or
    /// ends. O(1).
    pub fn activity(&self) -> Activity {
        let state = self.lock();
        Activity {
            revision: state.revision,
            acks: state.acks_seen,
            drains: state.drains.version,
        }
    }
}

/// Counters that together change whenever something a listing shows does
/// ([`Registry::activity`]); compare two readings, the values mean nothing else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Activity {
    /// The registry's newest revision (any service).
    pub revision: u64,
    /// Acks, subscriber arrivals and departures seen.
    pub acks: u64,
    /// Drain starts and ends seen.
    pub drains: u64,
}
