//! The follower: applies the other nodes' changes, as the store's watch delivers them, to this
//! node's view (docs/cluster.md, "The prefix watch").
//!
//! - A revision written by this node is skipped (the view has it), except that its services
//!   take that revision, so every node names the view by the same number.
//! - Another node's (or a lease expiry's) changes are applied under the state lock and each
//!   changed service is published once, at the store's revision (or one above the service's
//!   current revision if that is not higher: revisions only grow).
//! - An ephemeral record of an instance this node keeps, written by another node under another
//!   lease, is a takeover (its client re-registered there): the instance becomes that node's,
//!   with no removal published. Under this node's lease it is a change (a drain's offline),
//!   applied with the instance staying this node's.
//! - A record of this node deleted by no node (this node's lease expired while it was paused or
//!   cut off) is written again under the new lease if a live session of this node still keeps
//!   it, checked against the key being absent, so an instance another node took over meanwhile
//!   is never brought back; so is a heartbeat-kept one, unless this node is recovering from
//!   its own stall (its client may be gone meanwhile). Any other instance of this node whose
//!   record went (in stall grace; heartbeat-kept after a stall) leaves this node's view too, as
//!   it left every other's: its client registers it again (a heartbeat answered 404 makes a
//!   Nacos v1 SDK do so).
//! - A re-list after a compaction replaces everything but this node's own instances.

use std::collections::BTreeMap;
use std::sync::Arc;

use gangway_core::model::{InstanceKey, ProbeSpec, ServiceKey};
use gangway_store::Cluster;
use gangway_store::Write;
use gangway_store::cluster::{ClusterChange, ClusterContents, ClusterEvent, EphemeralEntry};
use tokio::time::Instant;

use super::super::hold::ClockReading;
use super::super::service::Changed;
use super::super::state::{MarkEntry, State};
use super::super::{Liveness, Registry};
use super::Remote;
use super::replicate::mark_own;

/// What applying changes left to do outside the lock.
#[derive(Default)]
pub(crate) struct Aftermath {
    probes_started: Vec<(ServiceKey, InstanceKey, ProbeSpec)>,
    probes_stopped: Vec<(ServiceKey, InstanceKey)>,
    drains: Vec<gangway_store::cluster::DrainRecord>,
    drains_ended: Vec<String>,
}

impl Registry {
    /// Fills the state from everything the cluster holds (the start-up load).
    pub(crate) fn load_cluster(&self, all: ClusterContents) {
        let revisions = all.revisions.clone();
        let mut after = Aftermath::default();
        {
            let mut state = self.lock();
            let c = state.cluster.as_mut().expect("cluster mode");
            c.seen = all.revision;
            c.nodes = all.nodes.clone();
            let me = c.node.clone();
            c.nodes.remove(&me);
            for (svc, entries) in &all.ephemeral {
                for (key, entry) in entries {
                    insert_remote(&mut state, svc, key.clone(), entry.clone());
                }
            }
            for drain in all.drains.values() {
                after.drains.push(drain.clone());
            }
        }
        self.load(all.durable, Some(&revisions));
        self.aftermath(after);
    }

    /// Starts following the store's watch from after `revision`.
    pub(crate) fn spawn_follower(&self, cluster: Arc<dyn Cluster>, revision: i64) {
        let weak = Arc::downgrade(&self.inner);
        let mut events = cluster.watch(revision);
        tokio::spawn(async move {
            while let Some(event) = events.recv().await {
                let Some(inner) = weak.upgrade() else { return };
                let registry = Registry { inner };
                match event {
                    Ok(event) => registry.follow(&cluster, event).await,
                    Err(e) => {
                        tracing::warn!(error = %e, "a change in the store could not be read; skipped")
                    }
                }
            }
        });
    }

    async fn follow(&self, cluster: &Arc<dyn Cluster>, event: ClusterEvent) {
        match event {
            ClusterEvent::Changes {
                revision,
                writer,
                services,
                changes,
            } => {
                let mine = writer.as_deref() == Some(cluster.node());
                let expired = writer.is_none()
                    && changes
                        .iter()
                        .any(|c| matches!(c, ClusterChange::Ephemeral(_, _, None)));
                // Recovering from its own stall (SIGSTOP), this node does not vouch for its
                // heartbeat-kept instances: their clients may be gone meanwhile.
                let recovering = self.observe_clock(Instant::now()) == ClockReading::Recovering;
                let after = {
                    let mut state = self.lock();
                    if mine {
                        own_echo(&mut state, revision, &changes);
                        Aftermath::default()
                    } else {
                        apply_changes(
                            &mut state,
                            revision,
                            writer.as_deref(),
                            &services,
                            changes,
                            recovering,
                        )
                    }
                };
                self.aftermath(after);
                if expired {
                    // Records went with a lease: name the services' views by a revision at
                    // least this new for nodes that load later (one node's write wins).
                    let cluster = cluster.clone();
                    tokio::task::spawn_blocking(move || {
                        if let Err(e) = cluster.touch(&services, revision) {
                            tracing::debug!(error = %e, "revision marks not touched");
                        }
                    });
                }
            }
            ClusterEvent::Relisted(all) => {
                tracing::warn!(
                    revision = all.revision,
                    "the store's history was compacted past this node's watch: re-listed"
                );
                let after = {
                    let mut state = self.lock();
                    relist(&mut state, *all)
                };
                self.aftermath(after);
            }
            ClusterEvent::LeaseRenewed { old, new } => {
                tracing::warn!(old = %format!("{old:016x}"), new = %format!("{new:016x}"), "this node's store lease was lost; its instances are written again under a new one");
                let recovering = self.observe_clock(Instant::now()) == ClockReading::Recovering;
                let mut state = self.lock();
                drop_unvouched(&mut state, recovering);
                mark_own(&mut state, !recovering);
                drop(state);
                self.write_node_record(cluster);
            }
        }
        self.notify_cluster();
    }

    /// Starts and stops probes and drain answers after a change was applied.
    fn aftermath(&self, after: Aftermath) {
        for (svc, key) in after.probes_stopped {
            self.stop_probe(&svc, &key);
        }
        for (svc, key, spec) in after.probes_started {
            self.start_probe(svc, key, spec);
        }
        for drain in after.drains {
            self.answer_drain(drain);
        }
        for id in after.drains_ended {
            self.stop_answering(&id);
        }
    }
}

/// This node's own transaction came back: the view has it already (the committer or the
/// replicator published it at this revision). The store's copies of its ephemeral records are
/// taken from it all the same: a write whose answer was lost (and whose retry then failed its
/// compare) is known from here, so the replicator's next compare holds.
fn own_echo(state: &mut State, revision: i64, changes: &[ClusterChange]) {
    let c = state.cluster.as_mut().expect("cluster mode");
    c.seen = c.seen.max(revision);
    for change in changes {
        if let ClusterChange::Ephemeral(svc, key, entry) = change {
            let id = (svc.clone(), key.clone());
            if c.known.get(&id).is_some_and(|k| k.mod_revision > revision) {
                continue;
            }
            match entry {
                Some(e) => {
                    c.known.insert(id, e.clone());
                }
                None => {
                    c.known.remove(&id);
                }
            }
        }
    }
}

/// After a lost lease: this node's instances it cannot vouch for (in stall grace; heartbeat-kept
/// while it recovers from its own stall) leave its view at once, as they left (or are leaving,
/// with the lease) every other node's; their records are deleted if still there.
fn drop_unvouched(state: &mut State, recovering: bool) {
    let gone = state.instances_where(|l| match l {
        Liveness::Grace { .. } => true,
        Liveness::Lease(_) => recovering,
        _ => false,
    });
    let mut by_service: BTreeMap<ServiceKey, Vec<InstanceKey>> = BTreeMap::new();
    for (svc, key) in gone {
        state.remove(&svc, &key);
        by_service.entry(svc).or_default().push(key);
    }
    for (svc, keys) in by_service {
        state.publish(&svc, Changed::Keys(keys));
    }
}

/// Applies another node's changes of one revision.
fn apply_changes(
    state: &mut State,
    revision: i64,
    writer: Option<&str>,
    services: &[ServiceKey],
    changes: Vec<ClusterChange>,
    recovering: bool,
) -> Aftermath {
    let mut after = Aftermath::default();
    let mut changed: BTreeMap<ServiceKey, Vec<InstanceKey>> = BTreeMap::new();
    let mut all_changed: Vec<ServiceKey> = Vec::new();
    {
        let c = state.cluster.as_mut().expect("cluster mode");
        c.seen = c.seen.max(revision);
        c.applying = true;
    }
    for change in changes {
        match change {
            ClusterChange::Durable(write) => {
                apply_durable(state, write, &mut changed, &mut all_changed, &mut after)
            }
            ClusterChange::Ephemeral(svc, key, entry) => {
                apply_ephemeral(state, &svc, key.clone(), entry, writer, recovering);
                changed.entry(svc).or_default().push(key);
            }
            ClusterChange::Node(name, record) => {
                let c = state.cluster.as_mut().expect("cluster mode");
                if name != c.node {
                    match record {
                        Some(r) => {
                            c.nodes.insert(name, r);
                        }
                        None => {
                            c.nodes.remove(&name);
                        }
                    }
                }
            }
            ClusterChange::Drain(_, Some(record)) => after.drains.push(record),
            ClusterChange::Drain(id, None) => after.drains_ended.push(id),
            ClusterChange::Answer {
                drain,
                node,
                answer,
            } => {
                let c = state.cluster.as_mut().expect("cluster mode");
                if let Some(answers) = c.answers.get_mut(&drain) {
                    match answer {
                        Some(a) => {
                            answers.insert(node, a);
                        }
                        None => {
                            answers.remove(&node);
                        }
                    }
                }
            }
        }
    }
    for svc in services {
        changed.entry(svc.clone()).or_default();
    }
    for (svc, keys) in changed {
        if !state.services.contains_key(&svc) {
            continue;
        }
        let what = if all_changed.contains(&svc) {
            Changed::All
        } else {
            Changed::Keys(keys)
        };
        state.publish(&svc, what);
    }
    {
        let c = state.cluster.as_mut().expect("cluster mode");
        c.applying = false;
        c.answers_tx.send_modify(|n| *n = n.wrapping_add(1));
    }
    after
}

/// Applies one change of durable state written by another node.
fn apply_durable(
    state: &mut State,
    write: Write,
    changed: &mut BTreeMap<ServiceKey, Vec<InstanceKey>>,
    all_changed: &mut Vec<ServiceKey>,
    after: &mut Aftermath,
) {
    match write {
        Write::PutInstance(svc, stored) => {
            let key = stored.instance.key.clone();
            let existing = state.services.get(&svc).and_then(|s| s.instances.get(&key));
            let probe_changed = !matches!(existing.map(|e| &e.liveness), Some(Liveness::Probe(p)) if *p == stored.probe);
            let mut instance = stored.instance;
            // Health is this node's probe's to say; a new instance starts healthy.
            instance.healthy = existing.is_none_or(|e| e.instance.healthy);
            if probe_changed {
                after
                    .probes_started
                    .push((svc.clone(), key.clone(), stored.probe.clone()));
            }
            state.insert(&svc, instance, Liveness::Probe(stored.probe), stored.owner);
            changed.entry(svc).or_default().push(key);
        }
        Write::DeleteInstance(svc, key) => {
            if state.remove(&svc, &key).is_some() {
                after.probes_stopped.push((svc.clone(), key.clone()));
            }
            changed.entry(svc).or_default().push(key);
        }
        Write::PutService(svc, settings) => {
            state.service(&svc).settings = settings;
            all_changed.push(svc.clone());
            changed.entry(svc).or_default();
        }
        Write::DeleteService(svc) => {
            state.service(&svc).settings = Default::default();
            all_changed.push(svc.clone());
            changed.entry(svc).or_default();
        }
        Write::PutOfflineMark(svc, key, mark) => {
            let present = state
                .services
                .get(&svc)
                .is_some_and(|s| s.instances.contains_key(&key));
            state.marks.insert(
                (svc.clone(), key.clone()),
                MarkEntry {
                    mark,
                    gone_since: (!present).then(Instant::now),
                    until_gone: false,
                },
            );
            let _ = state.modify(&svc, &key, |i| i.enabled = false);
            changed.entry(svc).or_default().push(key);
        }
        Write::DeleteOfflineMark(svc, key) => {
            let mark = state.marks.remove(&(svc.clone(), key.clone()));
            if mark.is_some() {
                let _ = state.modify(&svc, &key, |i| i.enabled = true);
            }
            changed.entry(svc).or_default().push(key);
        }
    }
}

/// Applies one ephemeral record written (or deleted) by another node or a lease expiry.
fn apply_ephemeral(
    state: &mut State,
    svc: &ServiceKey,
    key: InstanceKey,
    entry: Option<EphemeralEntry>,
    writer: Option<&str>,
    recovering: bool,
) {
    let current = state
        .services
        .get(svc)
        .and_then(|s| s.instances.get(&key))
        .map(|e| e.liveness.clone());
    let own = matches!(
        current,
        Some(Liveness::Session(_) | Liveness::Lease(_) | Liveness::Grace { .. })
    );
    // Kept alive here now: a live session, or (unless this node is recovering from its own
    // stall) a heartbeat lease.
    let vouched = match current {
        Some(Liveness::Session(_)) => true,
        Some(Liveness::Lease(_)) => !recovering,
        _ => false,
    };
    let c = state.cluster.as_mut().expect("cluster mode");
    let id = (svc.clone(), key.clone());
    match entry {
        Some(entry) => {
            let my_lease = entry.record.node == c.node;
            if own && my_lease {
                // insert_remote keeps the store's copy on the other path.
                c.known.insert(id, entry.clone());
                // Another node changed this node's instance (a drain's offline, an online).
                let enabled = entry.record.instance.enabled;
                let record = entry.record.instance;
                let _ = state.modify(svc, &key, |i| {
                    i.enabled = record.enabled;
                    i.weight = record.weight;
                    i.metadata = record.metadata;
                });
                let mark_key = (svc.clone(), key.clone());
                if !enabled {
                    state
                        .marks
                        .entry(mark_key)
                        .or_insert_with(|| MarkEntry::new(true));
                } else if state.marks.get(&mark_key).is_some_and(|m| m.until_gone) {
                    state.marks.remove(&mark_key);
                }
            } else {
                insert_remote(state, svc, key, entry);
            }
        }
        None => {
            c.known.remove(&id);
            if own && writer.is_none() && vouched {
                // This node's lease went while it still keeps the instance: written again under
                // the new lease (checked against the key being absent, so one that another node
                // took over meanwhile is not brought back).
                c.dirty.insert(id);
                c.wake.notify_one();
            } else if current.is_some() && !matches!(current, Some(Liveness::Probe(_))) {
                state.remove(svc, &key);
            }
        }
    }
}

/// Puts another node's instance into the view (taking it from this node's session if one held
/// it: its client re-registered there), and keeps the store's copy of its record.
fn insert_remote(state: &mut State, svc: &ServiceKey, key: InstanceKey, entry: EphemeralEntry) {
    let c = state.cluster.as_mut().expect("cluster mode");
    c.known.insert((svc.clone(), key.clone()), entry.clone());
    let record = entry.record;
    let mut instance = record.instance;
    instance.key = key.clone();
    instance.ephemeral = true;
    // The record says whether it serves: a drain's until-gone mark is its holder's to keep (it
    // mirrors one set through another node), so none stays here; an operator's durable mark
    // applies everywhere.
    let mark_key = (svc.clone(), key.clone());
    if state.marks.get(&mark_key).is_some_and(|m| m.until_gone) {
        state.marks.remove(&mark_key);
    }
    if state.marks.contains_key(&mark_key) {
        instance.enabled = false;
    }
    state.insert(
        svc,
        instance,
        Liveness::Remote(Remote {
            node: record.node,
            lease: entry.lease,
            keeper: record.keeper,
            client_id: record.client_id,
        }),
        record.owner,
    );
}

/// Replaces everything but this node's own instances with a re-listing.
fn relist(state: &mut State, all: ClusterContents) -> Aftermath {
    let mut after = Aftermath::default();
    let c = state.cluster.as_mut().expect("cluster mode");
    c.seen = c.seen.max(all.revision);
    c.nodes = all.nodes.clone();
    let me = c.node.clone();
    c.nodes.remove(&me);
    c.known.clear();
    let services: Vec<ServiceKey> = state.services.keys().cloned().collect();
    for svc in &services {
        let keys: Vec<InstanceKey> = state.services[svc]
            .instances
            .iter()
            .filter(|(k, e)| match &e.liveness {
                Liveness::Remote(_) => !all.ephemeral.get(svc).is_some_and(|m| m.contains_key(*k)),
                Liveness::Probe(_) => !all
                    .durable
                    .instances
                    .get(svc)
                    .is_some_and(|m| m.contains_key(*k)),
                _ => false,
            })
            .map(|(k, _)| k.clone())
            .collect();
        for key in keys {
            if let Some(e) = state.remove(svc, &key)
                && matches!(e.liveness, Liveness::Probe(_))
            {
                after.probes_stopped.push((svc.clone(), key));
            }
        }
    }
    for (svc, settings) in &all.durable.services {
        state.service(svc).settings = settings.clone();
    }
    for (svc, instances) in all.durable.instances {
        for (key, stored) in instances {
            let known = state
                .services
                .get(&svc)
                .is_some_and(|s| s.instances.contains_key(&key));
            if !known {
                after
                    .probes_started
                    .push((svc.clone(), key.clone(), stored.probe.clone()));
            }
            let mut instance = stored.instance;
            instance.healthy = true;
            state.insert(&svc, instance, Liveness::Probe(stored.probe), stored.owner);
        }
    }
    for (svc, entries) in all.ephemeral {
        for (key, entry) in entries {
            let own = state
                .services
                .get(&svc)
                .and_then(|s| s.instances.get(&key))
                .is_some_and(|e| {
                    matches!(
                        e.liveness,
                        Liveness::Session(_) | Liveness::Lease(_) | Liveness::Grace { .. }
                    )
                });
            let c = state.cluster.as_mut().expect("cluster mode");
            c.known.insert((svc.clone(), key.clone()), entry.clone());
            if !(own && entry.record.node == me) {
                insert_remote(state, &svc, key, entry);
            }
        }
    }
    for drain in all.drains.into_values() {
        after.drains.push(drain);
    }
    let services: Vec<ServiceKey> = state.services.keys().cloned().collect();
    if let Some(c) = state.cluster.as_mut() {
        c.applying = true;
    }
    for svc in services {
        state.publish(&svc, Changed::All);
    }
    if let Some(c) = state.cluster.as_mut() {
        c.applying = false;
    }
    mark_own(state, true);
    after
}
