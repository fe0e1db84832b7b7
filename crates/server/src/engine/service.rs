//! One service's state: its instances, the [`Tally`] its consumer view is derived from, the
//! snapshot of its latest revision (built once when first asked for, then shared by every push
//! and pull), and the log of recent changes that deltas are cut from (DESIGN §7: cost per change
//! independent of the service's size).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use gangway_core::model::{Instance, InstanceKey, Kind, ServiceKey, ServiceSettings};
use gangway_core::{Tally, View};
use tokio::sync::watch;
use tokio::time::Instant;

use super::Entry;

/// Changes kept per service for deltas; a subscriber further behind gets a full snapshot.
pub const CHANGE_LOG_LEN: usize = 1024;

/// A service's consumer view at one revision, as pushed.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// Which service.
    pub service: ServiceKey,
    /// The view (revision, instances, protection flag).
    pub view: View,
}

/// What changed in a consumer view between two revisions: every instance whose state changed,
/// as it is now. Applying it to the view at any revision from `base_revision` to `revision`
/// gives the view at `revision` (every key changed since the base is listed with its current
/// state, so changes the receiver already holds are only written again).
#[derive(Debug, Clone, PartialEq)]
pub struct Delta {
    /// Which service.
    pub service: ServiceKey,
    /// Revision this delta brings the view to.
    pub revision: u64,
    /// Oldest revision it applies to.
    pub base_revision: u64,
    /// The protect threshold fired at `revision`.
    pub protection_triggered: bool,
    /// Instances in the view at `revision` that changed (or joined) since the base.
    pub upserted: Vec<Instance>,
    /// Instances that left the view since the base.
    pub removed: Vec<InstanceKey>,
}

/// One push to a subscriber.
#[derive(Debug, Clone, PartialEq)]
pub enum Push {
    /// The whole view (shared by every subscriber it goes to).
    Full(Arc<Snapshot>),
    /// What changed since the revision the subscriber acked.
    Delta(Delta),
}

impl Push {
    /// The revision the push brings the subscriber to.
    pub fn revision(&self) -> u64 {
        match self {
            Push::Full(s) => s.view.revision,
            Push::Delta(d) => d.revision,
        }
    }
}

/// What one revision changed, for the change log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Changed {
    /// These instances.
    Keys(Vec<InstanceKey>),
    /// Possibly every instance's place in the view (settings changed, the protect threshold
    /// flipped): deltas across it are full snapshots.
    All,
}

pub(crate) struct ServiceEntry {
    pub(crate) key: ServiceKey,
    pub(crate) settings: ServiceSettings,
    pub(crate) instances: BTreeMap<InstanceKey, Entry>,
    pub(crate) revision: u64,
    tally: Tally,
    /// The revision, sent on every change: subscribers wake on it and ask for their push.
    pub(crate) tx: watch::Sender<u64>,
    /// Bumped on every ack by a subscriber of this service and every such subscriber that
    /// leaves: drains and readiness waits of this service wait on it, and only on it.
    pub(crate) acks: watch::Sender<u64>,
    /// Ids of its subscribers.
    pub(crate) subscribers: BTreeSet<String>,
    /// The snapshot at `revision`, once built.
    snapshot: Option<Arc<Snapshot>>,
    /// (revision, what changed, when), oldest first, at most [`CHANGE_LOG_LEN`].
    changes: VecDeque<(u64, Changed, Instant)>,
    /// Every change after this revision is in `changes`.
    log_floor: u64,
    /// Whether the protect threshold fired at the last publish.
    protection_published: bool,
}

impl ServiceEntry {
    pub(crate) fn new(key: &ServiceKey) -> Self {
        Self {
            key: key.clone(),
            settings: ServiceSettings::default(),
            instances: BTreeMap::new(),
            revision: 0,
            tally: Tally::default(),
            tx: watch::channel(0).0,
            acks: watch::channel(0).0,
            subscribers: BTreeSet::new(),
            snapshot: None,
            changes: VecDeque::new(),
            log_floor: 0,
            protection_published: false,
        }
    }

    pub(crate) fn kind(&self) -> Option<Kind> {
        self.instances.values().next().map(|e| {
            if e.instance.ephemeral {
                Kind::Ephemeral
            } else {
                Kind::Persistent
            }
        })
    }

    pub(crate) fn threshold(&self) -> f64 {
        self.settings.protect_threshold
    }

    pub(crate) fn tally(&self) -> Tally {
        self.tally
    }

    /// Whether the instance with `key` is in the consumer view. O(log n).
    pub(crate) fn in_view(&self, key: &InstanceKey) -> bool {
        self.instances
            .get(key)
            .is_some_and(|e| self.tally.in_view(&e.instance, self.threshold()))
    }

    /// Instances in the consumer view (serving ones, or every enabled one while the protect
    /// threshold fires). O(1).
    pub(crate) fn view_len(&self) -> usize {
        self.tally.view_len(self.threshold())
    }

    /// The consumer view at the current revision, built now. O(n): for listings; pushes use
    /// the shared [`snapshot`](Self::snapshot).
    pub(crate) fn view(&self) -> View {
        let threshold = self.threshold();
        View {
            revision: self.revision,
            instances: self
                .instances
                .values()
                .filter(|e| self.tally.in_view(&e.instance, threshold))
                .map(|e| e.instance.clone())
                .collect(),
            protection_triggered: self.tally.protection_triggered(threshold),
        }
    }

    /// The snapshot at the current revision: built on the first call after a change, then
    /// shared.
    pub(crate) fn snapshot(&mut self) -> Arc<Snapshot> {
        if let Some(s) = &self.snapshot {
            return s.clone();
        }
        let s = Arc::new(Snapshot {
            service: self.key.clone(),
            view: self.view(),
        });
        self.snapshot = Some(s.clone());
        s
    }

    /// What to push to a subscriber that acked `base` (0: nothing): a delta when the log
    /// covers everything since `base` and the delta is smaller than the view, else the full
    /// snapshot.
    pub(crate) fn push_since(&mut self, base: u64) -> Push {
        let threshold = self.threshold();
        if base == 0 || base < self.log_floor || base >= self.revision {
            return Push::Full(self.snapshot());
        }
        let mut keys = BTreeSet::new();
        for (revision, changed, _) in self.changes.iter().rev() {
            if *revision <= base {
                break;
            }
            match changed {
                Changed::All => return Push::Full(self.snapshot()),
                Changed::Keys(k) => keys.extend(k.iter()),
            }
        }
        if keys.len() * 2 > self.view_len().max(1) {
            return Push::Full(self.snapshot());
        }
        let mut upserted = Vec::new();
        let mut removed = Vec::new();
        for key in keys {
            match self.instances.get(key) {
                Some(e) if self.tally.in_view(&e.instance, threshold) => {
                    upserted.push(e.instance.clone())
                }
                _ => removed.push(key.clone()),
            }
        }
        Push::Delta(Delta {
            service: self.key.clone(),
            revision: self.revision,
            base_revision: base,
            protection_triggered: self.tally.protection_triggered(threshold),
            upserted,
            removed,
        })
    }

    /// Inserts or replaces an entry. Does not publish.
    pub(crate) fn upsert(&mut self, entry: Entry) -> Option<Entry> {
        self.tally.add(&entry.instance);
        let old = self.instances.insert(entry.instance.key.clone(), entry);
        if let Some(old) = &old {
            self.tally.remove(&old.instance);
        }
        old
    }

    /// Removes an entry. Does not publish.
    pub(crate) fn remove(&mut self, key: &InstanceKey) -> Option<Entry> {
        let old = self.instances.remove(key)?;
        self.tally.remove(&old.instance);
        Some(old)
    }

    /// Changes an instance's fields through `change`; `true` when they changed. Does not
    /// publish.
    pub(crate) fn modify(&mut self, key: &InstanceKey, change: impl FnOnce(&mut Instance)) -> bool {
        let Some(entry) = self.instances.get_mut(key) else {
            return false;
        };
        let before = entry.instance.clone();
        change(&mut entry.instance);
        if entry.instance == before {
            return false;
        }
        self.tally.remove(&before);
        self.tally.add(&entry.instance);
        true
    }

    /// Records that `revision` changed `changed`: the new revision, the log, and the wake-up of
    /// every subscriber. A flip of the protect threshold moves every instance, so it is logged
    /// as [`Changed::All`].
    pub(crate) fn publish(&mut self, revision: u64, changed: Changed) {
        let protection = self.protection();
        let changed = if protection != self.protection_published {
            Changed::All
        } else {
            changed
        };
        self.protection_published = protection;
        self.revision = revision;
        self.snapshot = None;
        self.changes.push_back((revision, changed, Instant::now()));
        while self.changes.len() > CHANGE_LOG_LEN {
            if let Some((r, _, _)) = self.changes.pop_front() {
                self.log_floor = r;
            }
        }
        self.tx.send_replace(revision);
    }

    /// How far a subscriber that acked `acked` is behind: the revisions published since (at
    /// most [`CHANGE_LOG_LEN`]: a subscriber further behind counts as that many) and when the
    /// oldest of them was published (the log's oldest entry for one further behind). `None`
    /// when it acked the current revision. O(log n) in the log's length.
    pub(crate) fn behind(&self, acked: u64) -> Option<(usize, Instant)> {
        if acked >= self.revision {
            return None;
        }
        let first = self.changes.partition_point(|(r, _, _)| *r <= acked);
        let (_, _, at) = self.changes.get(first).or(self.changes.back())?;
        Some((self.changes.len() - first, *at))
    }

    /// Whether the protect threshold fires now.
    pub(crate) fn protection(&self) -> bool {
        self.tally.protection_triggered(self.threshold())
    }
}
