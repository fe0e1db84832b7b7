//! The lease deadline queue (STYLE: expiry costs what falls due, not a scan of every lease;
//! mini-redis `db.rs`): a min-heap of (deadline, service, instance). Each registration and
//! heartbeat pushes its next deadline; an entry whose lease was renewed meanwhile is skipped
//! when it falls due, so the heap holds a few entries per lease at most (one per heartbeat
//! within a TTL).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use gangway_core::model::{InstanceKey, ServiceKey};
use tokio::time::Instant;

/// Deadlines of lease-kept instances.
#[derive(Default)]
pub(crate) struct LeaseQueue {
    heap: BinaryHeap<Reverse<(Instant, ServiceKey, InstanceKey)>>,
}

impl LeaseQueue {
    /// Queues a check of `key`'s lease at `deadline`.
    pub(crate) fn push(&mut self, deadline: Instant, service: &ServiceKey, key: &InstanceKey) {
        self.heap
            .push(Reverse((deadline, service.clone(), key.clone())));
    }

    /// The next entry due at `now`, if any.
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<(ServiceKey, InstanceKey)> {
        if self.heap.peek().is_some_and(|Reverse((d, _, _))| *d <= now) {
            self.heap.pop().map(|Reverse((_, s, k))| (s, k))
        } else {
            None
        }
    }

    /// Replaces every entry (after a stall extended every lease).
    pub(crate) fn rebuild(
        &mut self,
        entries: impl IntoIterator<Item = (Instant, ServiceKey, InstanceKey)>,
    ) {
        self.heap = entries.into_iter().map(Reverse).collect();
    }
}
