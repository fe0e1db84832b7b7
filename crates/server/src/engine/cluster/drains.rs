//! Drains across nodes (docs/cluster.md, "Drains across nodes"). The draining node takes the
//! instance out (its record is written with `enabled: false`), writes a drain record naming the
//! store revision of that write, and waits for its own subscribers; every other node, on seeing
//! the record, waits for its own subscribers to ack a revision without the instance and writes
//! one answer (complete, or its laggards at the timeout). The drain ends when every node that
//! was in the cluster answered or left it, at most the timeout plus [`ANSWER_GRACE`]. A drain
//! costs O(nodes) store writes, whatever the number of subscribers and acks.

use std::collections::BTreeMap;
use std::time::Duration;

use gangway_core::drain::{AckProgress, SubscriberAck};
use gangway_core::model::{InstanceKey, ServiceKey};
use gangway_store::cluster::{DrainAnswer, DrainRecord};
use tokio::time::Instant;

use super::super::{Liveness, Registry};

/// How long past its timeout a drain waits for the other nodes' answers (they answer at the
/// same timeout, with their laggards): 1 s.
pub const ANSWER_GRACE: Duration = Duration::from_secs(1);

/// What the other nodes said about a drain.
pub(crate) struct Answers {
    /// Their subscribers that acked, each with its node.
    pub(crate) acked: Vec<SubscriberAck>,
    /// Their laggards, each with its node.
    pub(crate) laggards: Vec<SubscriberAck>,
    /// Remarks: nodes that did not answer, or left.
    pub(crate) notes: Vec<String>,
    /// A node still in the cluster did not answer: the drain is not complete.
    pub(crate) unanswered: bool,
}

impl Registry {
    /// The store revision at which the instance is in the store as the view has it now: the
    /// revision its record (ephemeral) was written at once the replicator caught up (for a
    /// drain: the first without it in the consumer view), or `local` (a persistent instance:
    /// the commit's revision). `None` without cluster mode or when the record was not written
    /// by `deadline`.
    pub(crate) async fn written_revision(
        &self,
        service: &ServiceKey,
        key: &InstanceKey,
        local: u64,
        deadline: Instant,
    ) -> Option<i64> {
        let mut written = {
            let state = self.lock();
            let c = state.cluster.as_ref()?;
            let ephemeral = state
                .services
                .get(service)
                .and_then(|s| s.instances.get(key))
                .is_some_and(|e| !matches!(e.liveness, Liveness::Probe(_)));
            if !ephemeral {
                return Some(local as i64);
            }
            c.written_tx.subscribe()
        };
        loop {
            {
                let state = self.lock();
                let c = state.cluster.as_ref()?;
                let id = (service.clone(), key.clone());
                // Written once the store's copy is the instance as the view has it now.
                let now = state
                    .services
                    .get(service)
                    .and_then(|s| s.instances.get(key))
                    .map(|e| &e.instance);
                match (c.known.get(&id), now) {
                    (Some(k), Some(now)) if k.record.instance == *now && !c.dirty.contains(&id) => {
                        return Some(k.mod_revision);
                    }
                    (None, None) if !c.dirty.contains(&id) => return Some(c.seen),
                    _ => {}
                }
            }
            if tokio::time::timeout_at(deadline, written.changed())
                .await
                .map_or(true, |r| r.is_err())
            {
                return None;
            }
        }
    }

    /// Starts a drain the other nodes take part in; returns its id and the nodes asked, or
    /// `None` when this node is alone (or not in cluster mode).
    pub(crate) fn announce_drain(
        &self,
        service: &ServiceKey,
        key: &InstanceKey,
        revision: i64,
        timeout: Duration,
    ) -> Option<(String, Vec<String>)> {
        let (record, asked, cluster) = {
            let mut state = self.lock();
            let c = state.cluster.as_mut()?;
            if c.nodes.is_empty() {
                return None;
            }
            let id = format!("{}-{}", c.node, self.next_id("d"));
            c.answers.insert(id.clone(), BTreeMap::new());
            let asked: Vec<String> = c.nodes.keys().cloned().collect();
            (
                DrainRecord {
                    id: id.clone(),
                    node: c.node.clone(),
                    service: service.clone(),
                    instance: key.clone(),
                    revision,
                    timeout_ms: timeout.as_millis() as u64,
                },
                asked,
                self.inner.cluster.clone()?,
            )
        };
        let id = record.id.clone();
        tokio::task::spawn_blocking(move || {
            if let Err(e) = cluster.put_drain(&record) {
                tracing::warn!(error = %e, drain = %record.id, "drain record not written: the other nodes are not asked");
            }
        });
        Some((id, asked))
    }

    /// Waits for the answers of `asked` to drain `id` until each answered or left the
    /// cluster, or `deadline`; then ends the drain in the store.
    pub(crate) async fn gather_answers(
        &self,
        id: &str,
        asked: &[String],
        deadline: Instant,
    ) -> Answers {
        let mut wake = match &self.lock().cluster {
            Some(c) => c.answers_tx.subscribe(),
            None => {
                return Answers {
                    acked: Vec::new(),
                    laggards: Vec::new(),
                    notes: Vec::new(),
                    unanswered: false,
                };
            }
        };
        loop {
            let done = {
                let state = self.lock();
                let c = state.cluster.as_ref().expect("cluster mode");
                let answers = c.answers.get(id);
                asked
                    .iter()
                    .all(|n| !c.nodes.contains_key(n) || answers.is_some_and(|a| a.contains_key(n)))
            };
            if done || Instant::now() >= deadline {
                break;
            }
            let _ = tokio::time::timeout_at(deadline, wake.changed()).await;
        }
        let (answers, nodes) = {
            let mut state = self.lock();
            let c = state.cluster.as_mut().expect("cluster mode");
            (c.answers.remove(id).unwrap_or_default(), c.nodes.clone())
        };
        if let Some(cluster) = self.inner.cluster.clone() {
            let id = id.to_owned();
            tokio::task::spawn_blocking(move || {
                if let Err(e) = cluster.end_drain(&id) {
                    tracing::debug!(error = %e, drain = %id, "drain record not deleted; it goes with this node's lease");
                }
            });
        }
        let mut out = Answers {
            acked: Vec::new(),
            laggards: Vec::new(),
            notes: Vec::new(),
            unanswered: false,
        };
        for node in asked {
            match answers.get(node) {
                Some(a) => {
                    out.acked.extend(a.acked.iter().cloned());
                    out.laggards.extend(a.laggards.iter().cloned());
                }
                None if !nodes.contains_key(node) => out
                    .notes
                    .push(format!("node {node} left the cluster during the drain")),
                None => {
                    out.unanswered = true;
                    out.notes.push(format!(
                        "node {node} did not answer by the timeout: its subscribers are not known to have acked"
                    ));
                }
            }
        }
        out
    }

    /// Takes part in another node's drain: waits for this node's subscribers, then answers.
    pub(crate) fn answer_drain(&self, drain: DrainRecord) {
        let node = match &self.lock().cluster {
            Some(c) if c.node != drain.node && !c.answering.contains_key(&drain.id) => {
                c.node.clone()
            }
            _ => return,
        };
        let registry = self.clone();
        let id = drain.id.clone();
        let task = tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_millis(drain.timeout_ms);
            let revision = registry.revision(&drain.service);
            let progress = registry
                .wait_acks(&drain.service, revision, deadline, None)
                .await;
            let answer = DrainAnswer {
                node: node.clone(),
                revision,
                complete: progress.is_complete(),
                acked: with_node(progress.acked, &node),
                laggards: with_node(progress.laggards, &node),
            };
            if let Some(cluster) = registry.inner.cluster.clone() {
                let id = drain.id.clone();
                let _ = tokio::task::spawn_blocking(move || {
                    if let Err(e) = cluster.answer_drain(&id, &answer) {
                        tracing::warn!(error = %e, drain = %id, "drain answer not written");
                    }
                })
                .await;
            }
            if let Some(c) = registry.lock().cluster.as_mut() {
                c.answering.remove(&drain.id);
            }
        });
        if let Some(c) = self.lock().cluster.as_mut() {
            c.answering.insert(id, task.abort_handle());
        }
    }

    /// Stops answering a drain that ended.
    pub(crate) fn stop_answering(&self, id: &str) {
        if let Some(task) = self
            .lock()
            .cluster
            .as_mut()
            .and_then(|c| c.answering.remove(id))
        {
            task.abort();
        }
    }

    /// This node's own progress with its name on every subscriber (cluster mode).
    pub(crate) fn name_progress(&self, progress: AckProgress) -> AckProgress {
        match self.lock().cluster.as_ref().map(|c| c.node.clone()) {
            Some(node) => AckProgress {
                acked: with_node(progress.acked, &node),
                laggards: with_node(progress.laggards, &node),
            },
            None => progress,
        }
    }
}

fn with_node(acks: Vec<SubscriberAck>, node: &str) -> Vec<SubscriberAck> {
    acks.into_iter()
        .map(|mut a| {
            a.node = node.to_owned();
            a
        })
        .collect()
}
