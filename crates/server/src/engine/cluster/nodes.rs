//! This node's record in the cluster and the cluster's membership (`GET /v1/cluster`): every
//! node writes its record, bound to its lease, at start, after a new lease, and, looked at every
//! [`REFRESH`], whenever it changed (its counts of sessions or subscribers, its lease) or the
//! last write failed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use gangway_store::Cluster;
use gangway_store::cluster::NodeRecord;
use gangway_wire::rest::{ClusterNode, ClusterView};
use tokio::time::Instant;

use super::super::{Registry, now_ms};

/// How often a node looks whether its record's counts changed: 2 s.
pub const REFRESH: Duration = Duration::from_secs(2);

fn info(r: &NodeRecord, this: bool) -> ClusterNode {
    ClusterNode {
        name: r.name.clone(),
        http: r.http.clone(),
        grpc: r.grpc.clone(),
        lease: format!("{:016x}", r.lease),
        started_ms: r.started_ms,
        sessions: r.sessions,
        subscribers: r.subscribers,
        this,
    }
}

impl Registry {
    /// The cluster as this node sees it (`GET /v1/cluster`): this node first, then the others
    /// by name; `None` without cluster mode.
    pub fn cluster(&self) -> Option<ClusterView> {
        let cluster = self.inner.cluster.as_ref()?;
        let me = self.node_record(cluster.as_ref())?;
        let state = self.lock();
        let c = state.cluster.as_ref()?;
        let mut nodes = vec![info(&me, true)];
        nodes.extend(c.nodes.values().map(|r| info(r, false)));
        Some(ClusterView {
            mode: "cluster".into(),
            node: Some(c.node.clone()),
            revision: Some(c.seen),
            nodes,
        })
    }

    /// This node's record now.
    fn node_record(&self, cluster: &dyn Cluster) -> Option<NodeRecord> {
        let (http, grpc, started_ms) = *self.inner.addresses.get()?;
        let state = self.lock();
        Some(NodeRecord {
            name: cluster.node().to_owned(),
            http: http.to_string(),
            grpc: grpc.to_string(),
            lease: cluster.lease(),
            started_ms,
            sessions: state.sessions.len(),
            subscribers: state.subscribers.len(),
        })
    }

    /// Tells the engine the addresses it serves on (for its node record) and, in cluster
    /// mode, writes the record and keeps it current. Called once, by `start`.
    pub fn set_addresses(&self, http: SocketAddr, grpc: SocketAddr) {
        if self.inner.addresses.set((http, grpc, now_ms())).is_err() {
            return;
        }
        let Some(cluster) = self.inner.cluster.clone() else {
            return;
        };
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            // What the last record written said: written again when it changed or failed.
            let mut last: Option<NodeRecord> = None;
            loop {
                let Some(inner) = weak.upgrade() else { return };
                let registry = Registry { inner };
                let Some(record) = registry.node_record(cluster.as_ref()) else {
                    return;
                };
                if last.as_ref() != Some(&record) && record.lease != 0 {
                    let cluster = cluster.clone();
                    let written = record.clone();
                    let put = tokio::task::spawn_blocking(move || cluster.put_node(&written)).await;
                    last = match put {
                        Ok(Ok(())) => Some(record),
                        Ok(Err(e)) => {
                            tracing::warn!(error = %e, "this node's record not written; retried");
                            None
                        }
                        Err(_) => None,
                    };
                }
                drop(registry);
                tokio::time::sleep(REFRESH).await;
            }
        });
    }

    /// Writes this node's record (in the background).
    pub(crate) fn write_node_record(&self, cluster: &Arc<dyn Cluster>) {
        let Some(record) = self.node_record(cluster.as_ref()) else {
            return;
        };
        let cluster = cluster.clone();
        tokio::task::spawn_blocking(move || {
            if let Err(e) = cluster.put_node(&record) {
                tracing::warn!(error = %e, "this node's record not written");
            }
        });
    }

    /// Records in the store that name this node (0 without cluster mode).
    pub fn own_records(&self) -> usize {
        let state = self.lock();
        state.cluster.as_ref().map_or(0, |c| {
            c.known.values().filter(|e| e.record.node == c.node).count()
        })
    }

    /// Waits until no record in the store names this node (other nodes took its instances
    /// over), woken by each change the watch applies, at most until `deadline`; `true` when
    /// none is left. A stopping node waits so before it revokes its lease.
    pub async fn own_records_gone(&self, deadline: Instant) -> bool {
        let Some(mut wake) = self
            .lock()
            .cluster
            .as_ref()
            .map(|c| c.answers_tx.subscribe())
        else {
            return true;
        };
        loop {
            if self.own_records() == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, wake.changed())
                .await
                .is_err()
            {
                return false;
            }
        }
    }

    /// Wakes what waits on the cluster's changes (drains waiting for answers).
    pub(crate) fn notify_cluster(&self) {
        if let Some(c) = self.lock().cluster.as_ref() {
            c.answers_tx.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}
