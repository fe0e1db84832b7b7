//! Cluster mode on etcd (docs/cluster.md): [`EtcdNode`], this node's part of the cluster, is
//! gangway's [`Cluster`]: its lease (granted again when lost), ephemeral records bound to it
//! and written with revision-checked transactions, its node record, drain records and answers,
//! and the watch of every change under the prefix.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Compare, CompareOp, DeleteOptions, GetOptions, PutOptions, Txn, TxnOp};
use gangway_core::model::ServiceKey;
use gangway_store::StoreError;
use gangway_store::cluster::{
    Cluster, ClusterChange, ClusterContents, ClusterEvents, DrainAnswer, DrainRecord,
    EphemeralEntry, EphemeralOutcome, EphemeralRecord, EphemeralWrite, NodeRecord,
};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::keys::Space;
use crate::lease::{LeaseState, NodeLease};
use crate::{EtcdStore, RETRY_FIRST, RETRY_MAX, Shared, json, prefix_end, run_on};

/// The value of a revision mark (`P/v1/revisions/...`): the node whose transaction changed
/// the service last.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RevisionMark {
    pub(crate) node: String,
}

/// This node's part of a gangway cluster on etcd. Made by [`EtcdStore::join`]; the engine
/// reaches it as `Arc<dyn Cluster>` through `Store::cluster`.
pub struct EtcdNode {
    shared: Arc<Shared>,
    handle: tokio::runtime::Handle,
    name: String,
    /// The current lease id (0 while none is granted).
    lease: Arc<AtomicI64>,
    /// The current lease's state, followed across new grants.
    state: watch::Receiver<LeaseState>,
    /// Sends (old, new) when a lost lease was replaced.
    renewed: watch::Receiver<(i64, i64)>,
    /// The keeper task and the current lease (revoked when the node is dropped).
    keeper: tokio::task::JoinHandle<()>,
    current: Arc<Mutex<Option<NodeLease>>>,
}

impl std::fmt::Debug for EtcdNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdNode")
            .field("name", &self.name)
            .field("lease", &format_args!("{:016x}", self.lease()))
            .finish()
    }
}

impl EtcdStore {
    /// Joins the cluster on this store's prefix as node `name`: grants the node lease of
    /// `ttl` (kept alive; granted again, with backoff, when lost), and from then on every
    /// batch this store applies also writes the revision marks of the services it changes,
    /// naming this node. Blocks for the first grant. Joining twice is refused.
    ///
    /// Errors: as [`EtcdStore::grant_node_lease`]; an empty name, or one over 128 bytes.
    pub fn join(&self, name: &str, ttl: Duration) -> Result<Arc<EtcdNode>, StoreError> {
        if name.is_empty() || name.len() > 128 || name.contains(char::is_whitespace) {
            return Err(StoreError::Io(format!(
                "node name must be 1-128 bytes without spaces, got {name:?}"
            )));
        }
        self.wait_name_free(name, ttl)?;
        let first = self.grant_node_lease(ttl)?;
        let lease = Arc::new(AtomicI64::new(first.id()));
        let (state_tx, state) = watch::channel(first.state());
        let (renewed_tx, renewed) = watch::channel((0, first.id()));
        let current = Arc::new(Mutex::new(None));
        let keeper = self.handle().spawn(keep(
            self.shared(),
            first,
            ttl,
            lease.clone(),
            current.clone(),
            state_tx,
            renewed_tx,
        ));
        let node = Arc::new(EtcdNode {
            shared: self.shared(),
            handle: self.handle(),
            name: name.to_owned(),
            lease,
            state,
            renewed,
            keeper,
            current,
        });
        self.node
            .set(node.clone())
            .map_err(|_| StoreError::Io("this store joined a cluster already".into()))?;
        let _ = self.shared.writer.set(name.to_owned());
        Ok(node)
    }
}

impl EtcdStore {
    /// Waits until no node record of `name` is left (a node that died keeps it until its lease
    /// expires: at most `ttl` plus 1 s); a live node of that name renews it, and is refused.
    fn wait_name_free(&self, name: &str, ttl: Duration) -> Result<(), StoreError> {
        let key = self.layout().node(name);
        let deadline = std::time::Instant::now() + ttl + Duration::from_secs(1);
        loop {
            let shared = self.shared();
            let probe = key.clone();
            let taken = self.block(async move {
                shared
                    .call(shared.config.request_timeout, move |mut c| {
                        let key = probe.clone();
                        async move {
                            c.get(key, Some(GetOptions::new().with_count_only()))
                                .await
                                .map(|r| r.count() > 0)
                        }
                    })
                    .await
            })?;
            if !taken {
                return Ok(());
            }
            if std::time::Instant::now() >= deadline {
                return Err(StoreError::Io(format!(
                    "node name {name:?} is in use by a live node of this cluster (its record \
                     {key} is still renewed after {ttl:?}): give each node its own --node-name"
                )));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// Keeps a node lease: follows its state, and when it is lost grants a new one (20 ms doubling
/// to 500 ms between attempts) and says so on `renewed`.
async fn keep(
    shared: Arc<Shared>,
    first: NodeLease,
    ttl: Duration,
    id: Arc<AtomicI64>,
    current: Arc<Mutex<Option<NodeLease>>>,
    state_tx: watch::Sender<LeaseState>,
    renewed: watch::Sender<(i64, i64)>,
) {
    let mut lease = first;
    loop {
        let mut states = lease.subscribe();
        let old = lease.id();
        *current.lock().expect("lease lock") = Some(lease);
        loop {
            let now = states.borrow_and_update().clone();
            let lost = matches!(now, LeaseState::Lost { .. });
            state_tx.send_replace(now);
            if lost || states.changed().await.is_err() {
                break;
            }
        }
        id.store(0, Ordering::Release);
        // Not revoked: etcd expires it (if it has not already), and keys still bound to it go
        // then; the node binds the keys of its live sessions to the new lease first.
        if let Some(lost) = current.lock().expect("lease lock").take() {
            lost.abandon();
        }
        let mut pause = RETRY_FIRST;
        lease = loop {
            match crate::lease::grant(&shared, ttl).await {
                Ok(lease) => break lease,
                Err(e) => {
                    tracing_warn(&e);
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(RETRY_MAX);
                }
            }
        };
        id.store(lease.id(), Ordering::Release);
        renewed.send_replace((old, lease.id()));
    }
}

fn tracing_warn(e: &StoreError) {
    tracing::warn!(error = %e, "etcd node lease not granted again yet");
}

impl Drop for EtcdNode {
    fn drop(&mut self) {
        self.keeper.abort();
        // Dropping the lease revokes it (best effort).
        drop(self.current.lock().expect("lease lock").take());
    }
}

impl EtcdNode {
    /// The current lease's state (for `/v1/health`), followed across new grants.
    pub fn lease_state(&self) -> watch::Receiver<LeaseState> {
        self.state.clone()
    }

    /// Revokes the current lease and waits for etcd's answer (at most the request timeout):
    /// this node's ephemeral records, node record, drains and answers go at once. For a clean
    /// stop, after the sessions were handed over or closed.
    ///
    /// Errors: etcd did not answer in time (the lease then expires after its TTL).
    pub fn leave(&self) -> Result<(), StoreError> {
        self.keeper.abort();
        match self.current.lock().expect("lease lock").take() {
            Some(lease) => lease.revoke(),
            None => Ok(()),
        }
    }

    fn block<T: Send + 'static>(
        &self,
        fut: impl Future<Output = Result<T, StoreError>> + Send + 'static,
    ) -> Result<T, StoreError> {
        run_on(&self.handle, fut).map_err(StoreError::Io)?
    }

    fn current_lease(&self) -> Result<i64, StoreError> {
        match self.lease.load(Ordering::Acquire) {
            0 => Err(StoreError::Io(
                "this node's etcd lease is lost and not granted again yet".into(),
            )),
            id => Ok(id),
        }
    }

    /// Runs one transaction; `Ok(true)` when its compares held.
    fn txn(&self, txn: Txn) -> Result<(bool, i64), StoreError> {
        let shared = self.shared.clone();
        self.block(async move {
            shared
                .call(shared.config.request_timeout, move |mut c| {
                    let txn = txn.clone();
                    async move {
                        c.txn(txn).await.map(|r| {
                            let revision = r.header().map_or(0, |h| h.revision());
                            (r.succeeded(), revision)
                        })
                    }
                })
                .await
        })
    }

    /// A put bound to `lease`.
    fn put_bound(&self, key: String, value: String, lease: i64) -> Result<(), StoreError> {
        let op = TxnOp::put(key, value, Some(PutOptions::new().with_lease(lease)));
        self.txn(Txn::new().and_then(vec![op])).map(|_| ())
    }
}

impl Cluster for EtcdNode {
    fn node(&self) -> &str {
        &self.name
    }

    fn lease(&self) -> i64 {
        self.lease.load(Ordering::Acquire)
    }

    fn load(&self) -> Result<ClusterContents, StoreError> {
        let shared = self.shared.clone();
        self.block(async move { shared.load_cluster().await })
    }

    fn watch(&self, after: i64) -> ClusterEvents {
        let (tx, rx) = tokio::sync::mpsc::channel(crate::watch::WATCH_BUFFER);
        self.handle.spawn(crate::watch::run_cluster(
            self.shared.clone(),
            after + 1,
            tx,
            self.renewed.clone(),
        ));
        rx
    }

    fn write_ephemeral(&self, writes: &[EphemeralWrite]) -> Result<EphemeralOutcome, StoreError> {
        if writes.is_empty() {
            return Ok(EphemeralOutcome::Written(0));
        }
        let layout = &self.shared.layout;
        let mut compares = Vec::with_capacity(writes.len());
        let mut ops = Vec::with_capacity(writes.len() * 2);
        let mut services = BTreeMap::new();
        for write in writes {
            let (service, key) = write.target();
            let etcd_key = layout.instance(Space::Ephemeral, service, key);
            match write {
                EphemeralWrite::Put {
                    record,
                    lease,
                    expect,
                    ..
                } => {
                    let lease = match lease {
                        Some(l) => *l,
                        None => self.current_lease()?,
                    };
                    compares.push(Compare::mod_revision(
                        etcd_key.clone(),
                        CompareOp::Equal,
                        *expect,
                    ));
                    ops.push(TxnOp::put(
                        etcd_key,
                        json(record).expect("json"),
                        Some(PutOptions::new().with_lease(lease)),
                    ));
                }
                EphemeralWrite::Delete { expect, .. } => {
                    compares.push(Compare::mod_revision(
                        etcd_key.clone(),
                        CompareOp::Equal,
                        *expect,
                    ));
                    ops.push(TxnOp::delete(etcd_key, None));
                }
            }
            services.insert(layout.revision(service), ());
        }
        let max = self.shared.config.max_txn_ops;
        if ops.len() + services.len() > max {
            return Err(StoreError::TooLarge {
                writes: ops.len() + services.len(),
                max,
            });
        }
        let mark = json(&RevisionMark {
            node: self.name.clone(),
        })
        .expect("json");
        ops.extend(
            services
                .into_keys()
                .map(|k| TxnOp::put(k, mark.clone(), None)),
        );
        let (succeeded, revision) = self.txn(Txn::new().when(compares).and_then(ops))?;
        Ok(if succeeded {
            EphemeralOutcome::Written(revision)
        } else {
            EphemeralOutcome::Conflict
        })
    }

    fn put_node(&self, node: &NodeRecord) -> Result<(), StoreError> {
        let lease = self.current_lease()?;
        let key = self.shared.layout.node(&node.name);
        self.put_bound(key, json(node).expect("json"), lease)
    }

    fn put_drain(&self, drain: &DrainRecord) -> Result<(), StoreError> {
        let lease = self.current_lease()?;
        let key = self.shared.layout.drain(&drain.id, None);
        self.put_bound(key, json(drain).expect("json"), lease)
    }

    fn answer_drain(&self, id: &str, answer: &DrainAnswer) -> Result<(), StoreError> {
        let lease = self.current_lease()?;
        let key = self.shared.layout.drain(id, Some(&answer.node));
        self.put_bound(key, json(answer).expect("json"), lease)
    }

    fn end_drain(&self, id: &str) -> Result<(), StoreError> {
        let key = self.shared.layout.drain(id, None);
        let answers = format!("{key}/");
        let end = prefix_end(answers.as_bytes());
        let txn = Txn::new().and_then(vec![
            TxnOp::delete(key, None),
            TxnOp::delete(answers, Some(DeleteOptions::new().with_range(end))),
        ]);
        self.txn(txn).map(|_| ())
    }

    fn lock_service(&self, service: &ServiceKey, wait: Duration) -> Result<i64, StoreError> {
        let key = self.shared.layout.lock(service);
        let deadline = std::time::Instant::now() + wait;
        let mut pause = RETRY_FIRST;
        loop {
            let lease = self.current_lease()?;
            let txn = Txn::new()
                .when(vec![Compare::create_revision(
                    key.clone(),
                    CompareOp::Equal,
                    0,
                )])
                .and_then(vec![TxnOp::put(
                    key.clone(),
                    self.name.clone(),
                    Some(PutOptions::new().with_lease(lease)),
                )]);
            let (taken, revision) = self.txn(txn)?;
            if taken {
                return Ok(revision);
            }
            if std::time::Instant::now() + pause >= deadline {
                return Err(StoreError::Conflict(format!(
                    "service {service} is being changed through another node (its lock was held \
                     for {wait:?})"
                )));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }

    fn mark_service(&self, service: &ServiceKey) -> Result<i64, StoreError> {
        let mark = json(&RevisionMark {
            node: self.name.clone(),
        })
        .expect("json");
        let key = self.shared.layout.revision(service);
        self.txn(Txn::new().and_then(vec![TxnOp::put(key, mark, None)]))
            .map(|(_, revision)| revision)
    }

    fn unlock_service(&self, service: &ServiceKey) -> Result<(), StoreError> {
        let key = self.shared.layout.lock(service);
        self.txn(Txn::new().and_then(vec![TxnOp::delete(key, None)]))
            .map(|_| ())
    }

    fn touch(&self, services: &[ServiceKey], after: i64) -> Result<(), StoreError> {
        let mark = json(&RevisionMark {
            node: self.name.clone(),
        })
        .expect("json");
        for service in services {
            let key = self.shared.layout.revision(service);
            let txn = Txn::new()
                .when(vec![Compare::mod_revision(
                    key.clone(),
                    CompareOp::Less,
                    after,
                )])
                .and_then(vec![TxnOp::put(key, mark.clone(), None)]);
            self.txn(txn)?;
        }
        Ok(())
    }
}

impl Shared {
    /// Everything under the prefix at one revision, restarted at most
    /// [`crate::LOAD_ATTEMPTS`] times when etcd compacts it meanwhile.
    pub(crate) async fn load_cluster(&self) -> Result<ClusterContents, StoreError> {
        let mut last = None;
        for _ in 0..crate::LOAD_ATTEMPTS {
            match self.load_cluster_once().await {
                Err(StoreError::Io(m)) if m.contains("compacted") => last = Some(m),
                other => return other,
            }
        }
        Err(StoreError::Io(format!(
            "load restarted {} times, etcd compacted its revision each time: {}",
            crate::LOAD_ATTEMPTS,
            last.unwrap_or_default()
        )))
    }

    async fn load_cluster_once(&self) -> Result<ClusterContents, StoreError> {
        let mut out = ClusterContents::default();
        let mut durable = Vec::new();
        let mut revision = 0;
        let mut durable_keys = Vec::new();
        for space in Space::ALL {
            let kvs = self.read_space(space, &mut revision).await?;
            for kv in kvs {
                let key = std::str::from_utf8(kv.key()).unwrap_or_default();
                if Space::DURABLE.contains(&space) {
                    durable_keys.push((key.to_owned(), kv.mod_revision()));
                }
                if let Some(service) = self.service_of(space, key) {
                    let r = out.revisions.entry(service).or_insert(0);
                    *r = (*r).max(kv.mod_revision());
                }
                match self.decode_change(space, &kv, true)? {
                    Some(ClusterChange::Durable(w)) => durable.push(w),
                    Some(ClusterChange::Ephemeral(s, k, Some(e))) => {
                        out.ephemeral.entry(s).or_default().insert(k, e);
                    }
                    Some(ClusterChange::Node(name, Some(n))) => {
                        out.nodes.insert(name, n);
                    }
                    Some(ClusterChange::Drain(id, Some(d))) => {
                        out.drains.insert(id, d);
                    }
                    _ => {}
                }
            }
        }
        out.durable.apply(&durable);
        out.revision = revision;
        self.seen.lock().expect("seen lock").reset(durable_keys);
        Ok(out)
    }

    /// Every key of `space` at `revision` (0: now, and `revision` is set to it), in pages.
    pub(crate) async fn read_space(
        &self,
        space: Space,
        revision: &mut i64,
    ) -> Result<Vec<etcd_client::KeyValue>, StoreError> {
        let start = self.layout.space(space);
        let end = prefix_end(start.as_bytes());
        let mut from = start.into_bytes();
        let mut out = Vec::new();
        loop {
            let mut options = GetOptions::new()
                .with_range(end.clone())
                .with_limit(self.config.page_size as i64);
            if *revision > 0 {
                options = options.with_revision(*revision);
            }
            let key = from.clone();
            let page = self
                .call(self.config.request_timeout, move |mut c| {
                    let (key, options) = (key.clone(), options.clone());
                    async move { c.get(key, Some(options)).await }
                })
                .await?;
            if *revision == 0 {
                *revision = page.header().map_or(0, |h| h.revision());
            }
            let more = page.more();
            let kvs = page.kvs().to_vec();
            let last = kvs.last().map(|kv| kv.key().to_vec());
            out.extend(kvs);
            match last {
                Some(mut last) if more => {
                    last.push(0);
                    from = last;
                }
                _ => break,
            }
        }
        Ok(out)
    }

    /// The service a key of `space` belongs to, for the per-service revision.
    pub(crate) fn service_of(&self, space: Space, key: &str) -> Option<ServiceKey> {
        match space {
            Space::Instances | Space::Offline | Space::Ephemeral => {
                self.layout.parse_instance(space, key).map(|(s, _)| s)
            }
            Space::Services | Space::Revisions => self.layout.parse_service_in(space, key),
            Space::Nodes | Space::Drains | Space::Locks => None,
        }
    }

    /// One key (put when `put`, else deleted) as the change it is; `None` for a revision mark.
    pub(crate) fn decode_change(
        &self,
        space: Space,
        kv: &etcd_client::KeyValue,
        put: bool,
    ) -> Result<Option<ClusterChange>, StoreError> {
        let value = put.then(|| kv.value());
        let table = match space {
            Space::Instances | Space::Services | Space::Offline => {
                return self
                    .decode(space, kv.key(), value)
                    .map(|w| Some(ClusterChange::Durable(w)));
            }
            Space::Revisions | Space::Locks => return Ok(None),
            Space::Ephemeral => "etcd ephemeral instances",
            Space::Nodes => "etcd nodes",
            Space::Drains => "etcd drains",
        };
        let corrupt = |message: String| StoreError::Corrupt { table, message };
        let key = std::str::from_utf8(kv.key())
            .map_err(|_| corrupt(format!("a key that is not UTF-8: {:?}", kv.key())))?;
        let unknown = || corrupt(format!("a key outside the layout: {key}"));
        let parse = |e: serde_json::Error| corrupt(format!("{key}: {e}"));
        Ok(Some(match space {
            Space::Ephemeral => {
                let (service, ikey) = self.layout.parse_instance(space, key).ok_or_else(unknown)?;
                let entry = match value {
                    None => None,
                    Some(v) => {
                        let record: EphemeralRecord = serde_json::from_slice(v).map_err(parse)?;
                        if record.instance.key != ikey {
                            return Err(corrupt(format!(
                                "{key} holds instance {}",
                                record.instance.key.addr()
                            )));
                        }
                        Some(EphemeralEntry {
                            record,
                            lease: kv.lease(),
                            mod_revision: kv.mod_revision(),
                        })
                    }
                };
                ClusterChange::Ephemeral(service, ikey, entry)
            }
            Space::Nodes => {
                let name = self.layout.parse_node(key).ok_or_else(unknown)?;
                let node = value
                    .map(|v| serde_json::from_slice(v).map_err(parse))
                    .transpose()?;
                ClusterChange::Node(name, node)
            }
            _ => {
                let (id, node) = self.layout.parse_drain(key).ok_or_else(unknown)?;
                match node {
                    None => ClusterChange::Drain(
                        id,
                        value
                            .map(|v| serde_json::from_slice(v).map_err(parse))
                            .transpose()?,
                    ),
                    Some(node) => ClusterChange::Answer {
                        drain: id,
                        node,
                        answer: value
                            .map(|v| serde_json::from_slice(v).map_err(parse))
                            .transpose()?,
                    },
                }
            }
        }))
    }

    /// The writer named by a revision mark's value.
    pub(crate) fn writer_of(value: &[u8]) -> Option<String> {
        serde_json::from_slice::<RevisionMark>(value)
            .ok()
            .map(|m| m.node)
    }
}
