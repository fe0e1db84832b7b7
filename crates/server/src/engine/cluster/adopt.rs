//! Adoption on reconnect (docs/cluster.md, "Takeover"): a client whose node died reconnects to
//! this node before it registers again. Some SDKs register again only much later (the Nacos
//! Python SDK's redo runs every 30 s), past the dead node's lease TTL, so that their
//! instances would go meanwhile. When a session opens here with a client id that keeps
//! instances on another node, and that node does not accept a TCP connection on its REST
//! address within [`PROBE_TIMEOUT`] (or left the cluster), this session takes those instances
//! over at once: their records are written under this node's lease, so no consumer sees them
//! go. A live node is left alone: the client may hold another session there.

use std::collections::BTreeMap;
use std::time::Duration;

use gangway_core::model::{InstanceKey, ServiceKey};
use gangway_store::cluster::Keeper;

use super::super::service::Changed;
use super::super::{Liveness, Registry};

/// Another node's instances of one client, by node: the node's REST address (if it is in the
/// cluster) and the instances.
type ByNode = BTreeMap<String, (Option<String>, Vec<(ServiceKey, InstanceKey)>)>;

/// How long a node gets to accept a TCP connection on its REST address before its instances
/// are adopted by a reconnected client's new session: 300 ms.
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(300);

impl Registry {
    /// Cluster mode: checks, in the background, whether `session` (of `client_id`) should adopt
    /// instances its client keeps on a node that is gone.
    pub(crate) fn adopt_on_reconnect(&self, session: &str, client_id: &str) {
        if client_id.is_empty() {
            return;
        }
        // Other nodes' instances of this client, by node, with the node's REST address.
        let by_node: ByNode = {
            let state = self.lock();
            let Some(c) = state.cluster.as_ref() else {
                return;
            };
            let mut by_node = ByNode::new();
            for (svc, entry) in &state.services {
                for (key, e) in &entry.instances {
                    if let Liveness::Remote(r) = &e.liveness
                        && r.keeper == Keeper::Session
                        && r.client_id == client_id
                        && r.node != c.node
                    {
                        by_node
                            .entry(r.node.clone())
                            .or_insert_with(|| {
                                (c.nodes.get(&r.node).map(|n| n.http.clone()), Vec::new())
                            })
                            .1
                            .push((svc.clone(), key.clone()));
                    }
                }
            }
            by_node
        };
        if by_node.is_empty() {
            return;
        }
        let registry = self.clone();
        let session = session.to_owned();
        tokio::spawn(async move {
            for (node, (http, instances)) in by_node {
                let alive = match http {
                    Some(addr) => matches!(
                        tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect(&addr))
                            .await,
                        Ok(Ok(_))
                    ),
                    None => false,
                };
                if !alive {
                    registry.adopt(&session, &node, instances);
                }
            }
        });
    }

    /// Gives `instances` (still kept on `node`) to `session`, if it is still open.
    fn adopt(&self, session: &str, node: &str, instances: Vec<(ServiceKey, InstanceKey)>) {
        let mut state = self.lock();
        if !state.sessions.contains_key(session) {
            return;
        }
        let mut adopted: BTreeMap<ServiceKey, Vec<InstanceKey>> = BTreeMap::new();
        for (svc, key) in instances {
            let Some(entry) = state
                .services
                .get_mut(&svc)
                .and_then(|s| s.instances.get_mut(&key))
            else {
                continue;
            };
            if !matches!(&entry.liveness, Liveness::Remote(r) if r.node == node) {
                continue;
            }
            entry.liveness = Liveness::Session(session.to_owned());
            adopted.entry(svc).or_default().push(key);
        }
        let count: usize = adopted.values().map(Vec::len).sum();
        for (svc, keys) in adopted {
            if let Some(s) = state.sessions.get_mut(session) {
                s.instances
                    .extend(keys.iter().map(|k| (svc.clone(), k.clone())));
            }
            state.publish(&svc, Changed::Keys(keys));
        }
        if count > 0 {
            tracing::info!(
                session,
                node,
                count,
                "instances of a node that does not answer adopted by their client's new session"
            );
        }
    }
}
