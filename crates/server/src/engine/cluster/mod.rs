//! Cluster mode (docs/cluster.md): several gangway nodes on one shared store (etcd), each
//! serving its own sessions and subscribers from its in-memory view.
//!
//! - `replicate`: this node's ephemeral instances (and changes it makes to other nodes'
//!   instances, such as a drain's offline) are written to the store as records bound to the
//!   node's lease, after the fact: every published change marks its instances dirty, and one
//!   task writes what differs from the store's copy, each key checked against the revision it
//!   was last seen at (no lost update between nodes).
//! - `follow`: the watch of the store, applying the other nodes' changes to the view, each at
//!   the store's revision, so every node names the same view by the same revision.
//! - `drains`: a drain on one node waits for the subscribers of every node.
//! - `nodes`: this node's record and the cluster's membership (`GET /v1/cluster`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use gangway_core::model::{InstanceKey, ServiceKey};
use gangway_store::cluster::{DrainAnswer, EphemeralEntry, Keeper, NodeRecord};
use tokio::sync::{Notify, watch};

mod adopt;
mod drains;
mod follow;
mod lock;
mod nodes;
mod replicate;

pub use drains::ANSWER_GRACE;
pub(crate) use lock::may_take_out;
pub(crate) use replicate::heartbeat_seen;

/// Who keeps an instance of another node alive: that node's session or lease.
#[derive(Debug, Clone, PartialEq)]
pub struct Remote {
    /// The node holding it.
    pub node: String,
    /// The store lease its record is bound to.
    pub lease: i64,
    /// What keeps it alive there.
    pub keeper: Keeper,
    /// The client id of its session (empty: none, or a lease).
    pub client_id: String,
}

/// The cluster part of the engine's state, under the state lock.
pub(crate) struct ClusterState {
    /// This node's name.
    pub(crate) node: String,
    /// The store's copy of every ephemeral record, as this node last saw it.
    pub(crate) known: HashMap<(ServiceKey, InstanceKey), EphemeralEntry>,
    /// Instances whose record may differ from the store's copy.
    pub(crate) dirty: HashSet<(ServiceKey, InstanceKey)>,
    /// Wakes the replicator.
    pub(crate) wake: Arc<Notify>,
    /// The newest store revision applied: the revision a change published now gets at least.
    pub(crate) seen: i64,
    /// The other nodes, by name.
    pub(crate) nodes: BTreeMap<String, NodeRecord>,
    /// Drains of other nodes this node takes part in, with the task answering each.
    pub(crate) answering: HashMap<String, tokio::task::AbortHandle>,
    /// Answers to this node's drains, by drain id, then node.
    pub(crate) answers: HashMap<String, BTreeMap<String, DrainAnswer>>,
    /// Bumped on every answer and node change: wakes this node's drains.
    pub(crate) answers_tx: watch::Sender<u64>,
    /// Bumped after every replicator write: wakes waits for a record to be written.
    pub(crate) written_tx: watch::Sender<u64>,
    /// True while a store revision is being applied (the follower, the committer, the
    /// replicator's write): what is published then is named by it on every node.
    pub(crate) applying: bool,
    /// Services published outside of that (a local change) and not yet named by a store
    /// revision: the replicator names them (its write, or a revision mark of its own).
    pub(crate) ahead: HashSet<ServiceKey>,
}

impl ClusterState {
    pub(crate) fn new(node: String) -> Self {
        ClusterState {
            node,
            known: HashMap::new(),
            dirty: HashSet::new(),
            wake: Arc::new(Notify::new()),
            seen: 0,
            nodes: BTreeMap::new(),
            answering: HashMap::new(),
            answers: HashMap::new(),
            answers_tx: watch::channel(0).0,
            written_tx: watch::channel(0).0,
            applying: false,
            ahead: HashSet::new(),
        }
    }

    /// Marks instances of `service` for the replicator.
    pub(crate) fn mark(
        &mut self,
        service: &ServiceKey,
        keys: impl IntoIterator<Item = InstanceKey>,
    ) {
        let before = self.dirty.len();
        self.dirty
            .extend(keys.into_iter().map(|k| (service.clone(), k)));
        if self.dirty.len() != before {
            self.wake.notify_one();
        }
    }
}
