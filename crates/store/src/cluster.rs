//! Cluster mode (docs/cluster.md): what several gangway nodes on one shared store exchange
//! besides durable state. A store that backs a cluster (etcd) gives the engine a [`Cluster`]
//! through [`Store::cluster`](crate::Store::cluster); the embedded stores give none.
//!
//! - **Ephemeral instances** are records bound to the lease of the node that holds their
//!   session or heartbeat lease ([`EphemeralRecord`]): a node that dies loses its lease after
//!   its TTL and its records go, unless their clients re-registered on another node meanwhile,
//!   which rewrites the record under that node's lease (a takeover: no removal is published).
//! - **Node records** ([`NodeRecord`]) are bound to the node's lease too: the cluster's
//!   membership is the set of node records.
//! - **Drains across nodes** ([`DrainRecord`], [`DrainAnswer`]): the draining node writes one
//!   drain record; every other node answers once, when its own subscribers acked or at the
//!   timeout, so a drain costs O(nodes) store writes, not O(acks).
//! - **The watch** ([`ClusterEvent`]) delivers every change after a revision, in revision
//!   order, with the node that wrote it, so each node applies the others' changes to its
//!   in-memory view and every node names the same view by the same revision.

use std::collections::BTreeMap;

use gangway_core::drain::SubscriberAck;
use gangway_core::model::{Instance, InstanceKey, ServiceKey};
use serde::{Deserialize, Serialize};

use crate::{Contents, StoreError, Write};

/// What keeps an ephemeral instance alive on the node that holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Keeper {
    /// A session (gRPC stream) on that node: another session of the same client (same
    /// non-empty client id) may take it over on any node; another client is refused (409).
    Session,
    /// Heartbeats (Nacos v1 `beat`) to that node: a heartbeat or registration on another node
    /// takes it over.
    Lease,
}

/// An ephemeral instance as the cluster holds it (etcd: `P/v1/ephemeral/{ns}/{group}/{service}/
/// {ip}:{port}#{cluster}`, bound to the lease of `node`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EphemeralRecord {
    /// The instance as its consumers see it (an `enabled: false` set by a drain on any node
    /// included).
    pub instance: Instance,
    /// The principal that registered it (docs/security.md); `None` without auth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Name of the node holding its session or lease (`--node-name`).
    pub node: String,
    /// The client process's id given with its session (empty: none), so that the same client
    /// reconnecting to another node takes its instances over.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub client_id: String,
    /// What keeps it alive on `node`.
    pub keeper: Keeper,
}

/// An [`EphemeralRecord`] as read back: with the store lease it is bound to and the revision
/// that last wrote it.
#[derive(Debug, Clone, PartialEq)]
pub struct EphemeralEntry {
    /// The record.
    pub record: EphemeralRecord,
    /// The store lease the record is bound to (etcd lease id).
    pub lease: i64,
    /// The store revision that last wrote it (the compare of a revision-checked write).
    pub mod_revision: i64,
}

/// One change to an ephemeral record, written by [`Cluster::write_ephemeral`].
#[derive(Debug, Clone, PartialEq)]
pub enum EphemeralWrite {
    /// Write the record. `lease`: the store lease to bind it to, `None` for this node's
    /// current lease. `expect`: the revision the writer last saw the key at (0: absent); the
    /// write fails when the key moved on since (another node wrote it).
    Put {
        /// Service.
        service: ServiceKey,
        /// The record.
        record: EphemeralRecord,
        /// Lease to bind to; `None`: this node's.
        lease: Option<i64>,
        /// Expected revision of the key (0: absent).
        expect: i64,
    },
    /// Delete the record if the key is still at `expect`.
    Delete {
        /// Service.
        service: ServiceKey,
        /// Instance.
        key: InstanceKey,
        /// Expected revision of the key.
        expect: i64,
    },
}

impl EphemeralWrite {
    /// The service and instance the write is about.
    pub fn target(&self) -> (&ServiceKey, &InstanceKey) {
        match self {
            EphemeralWrite::Put {
                service, record, ..
            } => (service, &record.instance.key),
            EphemeralWrite::Delete { service, key, .. } => (service, key),
        }
    }
}

/// How a batch of [`EphemeralWrite`]s ended.
#[derive(Debug, Clone, PartialEq)]
pub enum EphemeralOutcome {
    /// All written, at this store revision.
    Written(i64),
    /// Nothing written: at least one key had moved on from its expected revision (another node
    /// wrote it). The writer waits for the watch to bring the newer value and looks again.
    Conflict,
}

/// A gangway node as the cluster lists it (etcd: `P/v1/nodes/{name}`, bound to its lease).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    /// The node's name (`--node-name`).
    pub name: String,
    /// Its REST address as it listens, `HOST:PORT`.
    pub http: String,
    /// Its gRPC address, `HOST:PORT`.
    pub grpc: String,
    /// Its store lease (etcd lease id); the record goes with it.
    pub lease: i64,
    /// Unix ms when the node started.
    pub started_ms: u64,
    /// Open sessions when the record was last written.
    pub sessions: usize,
    /// Live subscribers when the record was last written.
    pub subscribers: usize,
}

/// A drain in progress on one node that the others take part in (etcd: `P/v1/drains/{id}`,
/// bound to the draining node's lease, so a drain whose node died goes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainRecord {
    /// Drain id, unique in the cluster (`{node}-{n}`).
    pub id: String,
    /// The node that drains and waits for the answers.
    pub node: String,
    /// Service of the instance.
    pub service: ServiceKey,
    /// The instance taken out.
    pub instance: InstanceKey,
    /// The store revision from which the instance is out of the consumer view: a node answers
    /// about the service's revision once it applied this one.
    pub revision: i64,
    /// How long the answering nodes wait for their subscribers, ms.
    pub timeout_ms: u64,
}

/// One node's answer to a drain (etcd: `P/v1/drains/{id}/{node}`, bound to the answering
/// node's lease).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainAnswer {
    /// The answering node.
    pub node: String,
    /// Its service revision that excludes the instance.
    pub revision: u64,
    /// Every subscriber on that node acked it.
    pub complete: bool,
    /// Its subscribers that acked.
    pub acked: Vec<SubscriberAck>,
    /// Its subscribers that had not when it answered.
    pub laggards: Vec<SubscriberAck>,
}

/// One change the watch saw.
#[derive(Debug, Clone, PartialEq)]
pub enum ClusterChange {
    /// Durable state, as the store write that made it.
    Durable(Write),
    /// An ephemeral record written (`Some`) or gone (`None`: deleted, or its lease expired).
    Ephemeral(ServiceKey, InstanceKey, Option<EphemeralEntry>),
    /// A node record written or gone.
    Node(String, Option<NodeRecord>),
    /// A drain started (`Some`) or ended.
    Drain(String, Option<DrainRecord>),
    /// A node answered a drain (`Some`), or its answer went.
    Answer {
        /// Drain id.
        drain: String,
        /// Answering node.
        node: String,
        /// The answer.
        answer: Option<DrainAnswer>,
    },
}

/// Everything the cluster holds at one revision.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClusterContents {
    /// Durable state.
    pub durable: Contents,
    /// Ephemeral records by service, then instance.
    pub ephemeral: BTreeMap<ServiceKey, BTreeMap<InstanceKey, EphemeralEntry>>,
    /// Per service, the newest store revision of a change to it (its revision in every node's
    /// view).
    pub revisions: BTreeMap<ServiceKey, i64>,
    /// Node records by name.
    pub nodes: BTreeMap<String, NodeRecord>,
    /// Drains in progress by id.
    pub drains: BTreeMap<String, DrainRecord>,
    /// The store revision all of it was read at.
    pub revision: i64,
}

/// One item of the cluster watch.
#[derive(Debug, Clone, PartialEq)]
pub enum ClusterEvent {
    /// The changes of one store revision (one transaction, or one lease expiry).
    Changes {
        /// The store revision.
        revision: i64,
        /// The node whose transaction it was; `None` when no node wrote it (a lease expired).
        writer: Option<String>,
        /// Services the transaction named as changed (their revision becomes `revision`).
        services: Vec<ServiceKey>,
        /// What changed.
        changes: Vec<ClusterChange>,
    },
    /// The history was compacted past the point to resume from: this is everything, to
    /// replace what the node holds (diffing it to publish what changed).
    Relisted(Box<ClusterContents>),
    /// This node's store lease was lost (expired, or not renewed within its TTL) and a new one
    /// granted: every record bound to the old one is gone; the node writes its own again.
    LeaseRenewed {
        /// The lost lease.
        old: i64,
        /// The new one.
        new: i64,
    },
}

/// A receiver of [`ClusterEvent`]s; `None` once the store is gone. Bounded by the store.
pub type ClusterEvents = tokio::sync::mpsc::Receiver<Result<ClusterEvent, StoreError>>;

/// What a cluster store offers the engine beyond [`Store`](crate::Store). Calls block (they
/// wait for the store's answer, bounded by its request timeout): async callers use
/// `spawn_blocking`.
pub trait Cluster: Send + Sync + 'static {
    /// This node's name.
    fn node(&self) -> &str;
    /// This node's current store lease.
    fn lease(&self) -> i64;
    /// Everything, at one revision.
    fn load(&self) -> Result<ClusterContents, StoreError>;
    /// Every change after revision `after`, in order (and [`ClusterEvent::LeaseRenewed`]).
    fn watch(&self, after: i64) -> ClusterEvents;
    /// Writes ephemeral records in one transaction, each checked against its expected
    /// revision.
    fn write_ephemeral(&self, writes: &[EphemeralWrite]) -> Result<EphemeralOutcome, StoreError>;
    /// Writes this node's record (bound to its lease).
    fn put_node(&self, node: &NodeRecord) -> Result<(), StoreError>;
    /// Starts a drain others take part in (bound to this node's lease).
    fn put_drain(&self, drain: &DrainRecord) -> Result<(), StoreError>;
    /// This node's answer to drain `id` (bound to its lease).
    fn answer_drain(&self, id: &str, answer: &DrainAnswer) -> Result<(), StoreError>;
    /// Ends drain `id`: its record and every answer.
    fn end_drain(&self, id: &str) -> Result<(), StoreError>;
    /// Writes the revision marks of `services` if they are older than `after` (one node does,
    /// the others' compares fail): after a lease expiry deleted records, so that a node loading
    /// later names the view by a revision at least as new as the deletion.
    fn touch(&self, services: &[ServiceKey], after: i64) -> Result<(), StoreError>;
    /// Writes the revision mark of `service` naming this node and returns its store revision:
    /// a change this node published without writing anything (a re-registration with the
    /// record the store has) is then named by a store revision on every node.
    fn mark_service(&self, service: &ServiceKey) -> Result<i64, StoreError>;
    /// Takes the cluster-wide lock of `service` (bound to this node's lease, so a node that
    /// dies releases it), waiting at most `wait` while another node holds it. Returns the store
    /// revision it was taken at: a node whose view has applied that revision decides on
    /// everything the previous holder wrote. For the changes whose rule must hold across nodes
    /// (the last serving instance).
    ///
    /// Errors: [`StoreError::Conflict`] when another node held it for all of `wait`.
    fn lock_service(
        &self,
        service: &ServiceKey,
        wait: std::time::Duration,
    ) -> Result<i64, StoreError>;
    /// Releases the lock of `service` (absent: nothing).
    fn unlock_service(&self, service: &ServiceKey) -> Result<(), StoreError>;
}
