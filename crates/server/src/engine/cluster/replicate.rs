//! The replicator: writes this node's view of ephemeral instances to the store where it
//! differs from the store's copy (docs/cluster.md, "Ephemeral instances").
//!
//! One task per node. It takes the dirty instances, and for each one compares the record the
//! view gives with the store's copy ([`super::ClusterState::known`]): an instance of this node's
//! sessions or leases is written under this node's lease, an instance of another node that
//! this node changed (a drain's offline) under that node's lease; one gone from the view is
//! deleted. Every key is checked against the revision its copy was seen at, so a write that
//! raced another node's fails as a whole ([`EphemeralOutcome::Conflict`]) and is looked at
//! again once the watch brought the newer copy. At most [`BATCH`] instances per transaction;
//! a failed store call is retried after [`RETRY_FIRST`] doubling to [`RETRY_MAX`].

use std::sync::Arc;
use std::time::Duration;

use gangway_core::model::{InstanceKey, ServiceKey};
use gangway_store::Cluster;
use gangway_store::cluster::{EphemeralOutcome, EphemeralRecord, EphemeralWrite, Keeper};

use super::super::service::Changed;
use super::super::state::State;
use super::super::{Liveness, Registry};

/// Instances written in one transaction, at most (each may add its service's revision mark,
/// within etcd's 128 operations).
pub const BATCH: usize = 60;
/// First pause after a failed or conflicting write.
pub const RETRY_FIRST: Duration = Duration::from_millis(20);
/// Longest pause between retries.
pub const RETRY_MAX: Duration = Duration::from_secs(1);

/// The record the view gives for an instance, with the lease to bind it to; `None` when the
/// instance is not in the view or not ephemeral.
pub(crate) fn desired(
    state: &State,
    node: &str,
    lease: i64,
    service: &ServiceKey,
    key: &InstanceKey,
) -> Option<(EphemeralRecord, i64)> {
    let entry = state.services.get(service)?.instances.get(key)?;
    let (node, keeper, client_id, lease) = match &entry.liveness {
        Liveness::Session(id) => (
            node.to_owned(),
            Keeper::Session,
            state
                .sessions
                .get(id)
                .map(|s| s.client_id.clone())
                .unwrap_or_default(),
            lease,
        ),
        // Kept through this node's own stall, its session gone: the store's copy stays as it is
        // (never written again: after a lease expiry that would bring back an instance whose
        // client may be gone), until the grace ends and it is deleted.
        Liveness::Grace { .. } => {
            let c = state.cluster.as_ref()?;
            let known = c.known.get(&(service.clone(), key.clone()))?;
            return Some((known.record.clone(), known.lease));
        }
        Liveness::Lease(_) => (node.to_owned(), Keeper::Lease, String::new(), lease),
        Liveness::Remote(r) => (r.node.clone(), r.keeper, r.client_id.clone(), r.lease),
        Liveness::Probe(_) => return None,
    };
    Some((
        EphemeralRecord {
            instance: entry.instance.clone(),
            owner: entry.owner.clone(),
            node,
            client_id,
            keeper,
        },
        lease,
    ))
}

impl Registry {
    /// Starts the replicator over `cluster`.
    pub(crate) fn spawn_replicator(&self, cluster: Arc<dyn Cluster>) {
        let weak = Arc::downgrade(&self.inner);
        let wake = match &self.lock().cluster {
            Some(c) => c.wake.clone(),
            None => return,
        };
        tokio::spawn(async move {
            let mut pause = RETRY_FIRST;
            loop {
                wake.notified().await;
                loop {
                    let Some(inner) = weak.upgrade() else { return };
                    let registry = Registry { inner };
                    match registry.replicate_once(&cluster).await {
                        Pass::Done => {
                            pause = RETRY_FIRST;
                            registry.name_ahead(&cluster).await;
                            break;
                        }
                        Pass::More => pause = RETRY_FIRST,
                        Pass::Retry => {
                            drop(registry);
                            tokio::time::sleep(pause).await;
                            pause = (pause * 2).min(RETRY_MAX);
                        }
                    }
                }
            }
        });
    }

    /// One transaction's worth of dirty instances.
    async fn replicate_once(&self, cluster: &Arc<dyn Cluster>) -> Pass {
        let lease = cluster.lease();
        let (writes, taken) = {
            let mut guard = self.lock();
            let state = &mut *guard;
            let Some(c) = state.cluster.as_mut() else {
                return Pass::Done;
            };
            let node = c.node.clone();
            let taken: Vec<(ServiceKey, InstanceKey)> =
                c.dirty.iter().take(BATCH).cloned().collect();
            for k in &taken {
                c.dirty.remove(k);
            }
            if taken.is_empty() {
                return Pass::Done;
            }
            let mut writes = Vec::new();
            let mut skipped_own = Vec::new();
            for (service, key) in &taken {
                let want = desired(state, &node, lease, service, key);
                let c = state.cluster.as_ref().expect("cluster");
                let known = c.known.get(&(service.clone(), key.clone()));
                let expect = known.map_or(0, |k| k.mod_revision);
                match (want, known) {
                    (Some((record, l)), known) => {
                        if known.is_some_and(|k| k.record == record && k.lease == l) {
                            continue;
                        }
                        if l == 0 {
                            // This node's lease is lost and not granted again yet.
                            skipped_own.push((service.clone(), key.clone()));
                            continue;
                        }
                        writes.push(EphemeralWrite::Put {
                            service: service.clone(),
                            record,
                            lease: Some(l),
                            expect,
                        });
                    }
                    (None, Some(_)) => writes.push(EphemeralWrite::Delete {
                        service: service.clone(),
                        key: key.clone(),
                        expect,
                    }),
                    (None, None) => {}
                }
            }
            if !skipped_own.is_empty() {
                let c = state.cluster.as_mut().expect("cluster");
                c.dirty.extend(skipped_own);
                if writes.is_empty() {
                    return Pass::Retry;
                }
            }
            (writes, taken)
        };
        if writes.is_empty() {
            return Pass::More;
        }
        let call = {
            let cluster = cluster.clone();
            let writes = writes.clone();
            tokio::task::spawn_blocking(move || cluster.write_ephemeral(&writes)).await
        };
        let mut state = self.lock();
        let Some(c) = state.cluster.as_mut() else {
            return Pass::Done;
        };
        match call {
            Ok(Ok(EphemeralOutcome::Written(revision))) => {
                let mut services: Vec<ServiceKey> = Vec::new();
                for write in &writes {
                    let (s, _) = write.target();
                    if !services.contains(s) {
                        services.push(s.clone());
                    }
                }
                for write in writes {
                    match write {
                        EphemeralWrite::Put {
                            service,
                            record,
                            lease,
                            ..
                        } => {
                            let key = (service, record.instance.key.clone());
                            c.known.insert(
                                key,
                                gangway_store::cluster::EphemeralEntry {
                                    record,
                                    lease: lease.unwrap_or(0),
                                    mod_revision: revision,
                                },
                            );
                        }
                        EphemeralWrite::Delete { service, key, .. } => {
                            c.known.remove(&(service, key));
                        }
                    }
                }
                c.seen = c.seen.max(revision);
                c.written_tx.send_modify(|n| *n = n.wrapping_add(1));
                // The view of these services is the store's at `revision` now: named by it on
                // this node too, as on every other.
                name_by(&mut state, &services, revision);
                Pass::More
            }
            Ok(Ok(EphemeralOutcome::Conflict)) | Ok(Err(_)) | Err(_) => {
                if let Ok(Err(e)) = &call {
                    tracing::warn!(error = %e, "ephemeral records not written; retrying");
                }
                // Looked at again after the pause, once the watch brought newer copies.
                c.dirty.extend(taken);
                Pass::Retry
            }
        }
    }
}

/// Publishes `services` at `revision` where their revision is older, as applied from the
/// store (no longer ahead of it).
fn name_by(state: &mut State, services: &[ServiceKey], revision: i64) {
    if let Some(c) = state.cluster.as_mut() {
        c.applying = true;
    }
    for service in services {
        let behind = state
            .services
            .get(service)
            .is_some_and(|s| s.revision < revision as u64);
        if behind {
            state.publish(service, Changed::Keys(Vec::new()));
        } else if let Some(c) = state.cluster.as_mut() {
            c.ahead.remove(service);
        }
    }
    if let Some(c) = state.cluster.as_mut() {
        c.applying = false;
    }
}

impl Registry {
    /// Services published here without a store write (nothing of their records changed):
    /// named by a revision mark of their own, so every node names them alike.
    async fn name_ahead(&self, cluster: &Arc<dyn Cluster>) {
        let ahead: Vec<ServiceKey> = {
            let mut state = self.lock();
            let Some(c) = state.cluster.as_mut() else {
                return;
            };
            if !c.dirty.is_empty() {
                return;
            }
            c.ahead.drain().collect()
        };
        for service in ahead {
            let marked = {
                let (cluster, service) = (cluster.clone(), service.clone());
                tokio::task::spawn_blocking(move || cluster.mark_service(&service)).await
            };
            match marked {
                Ok(Ok(revision)) => {
                    let mut state = self.lock();
                    if let Some(c) = state.cluster.as_mut() {
                        c.seen = c.seen.max(revision);
                    }
                    name_by(&mut state, &[service], revision);
                }
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, %service, "revision mark not written");
                }
                Err(_) => {}
            }
        }
    }
}

/// How one pass of the replicator ended.
enum Pass {
    /// Nothing dirty any more.
    Done,
    /// Wrote (or had nothing to write for) a batch; more may be dirty.
    More,
    /// The store refused or failed: pause, then look again.
    Retry,
}

/// Marks every instance a live session of this node keeps (and, with `leases`, every
/// heartbeat-kept one) for the replicator: after a new lease, so that their records are written
/// again under it. Without `leases` (the node recovers from its own stall) heartbeat-kept
/// instances are written again at their next heartbeat (a client gone meanwhile sends none);
/// instances in stall grace never.
pub(crate) fn mark_own(state: &mut State, leases: bool) {
    let own = state.instances_where(|l| match l {
        Liveness::Session(_) => true,
        Liveness::Lease(_) => leases,
        _ => false,
    });
    if let Some(c) = state.cluster.as_mut() {
        c.dirty.extend(own);
        c.wake.notify_one();
    }
}

/// A heartbeat of this node's instance: marks it for the replicator when the store has no
/// copy of it under this node (its record went with a lost lease).
pub(crate) fn heartbeat_seen(state: &mut State, service: &ServiceKey, key: &InstanceKey) {
    if let Some(c) = state.cluster.as_mut() {
        let id = (service.clone(), key.clone());
        if c.known.get(&id).is_none_or(|k| k.record.node != c.node) {
            c.dirty.insert(id);
            c.wake.notify_one();
        }
    }
}
