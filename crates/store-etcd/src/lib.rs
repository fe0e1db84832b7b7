//! gangway's cluster store (DESIGN §7, docs/cluster.md): durable state (persistent instances
//! with their owner, service settings, offline marks) as etcd keys under a prefix, so that
//! several gangway nodes share one registry and etcd's Raft log keeps it.
//!
//! Why this crate is `gangway-store-etcd` and not `gangway-cluster`: it is a backend of the
//! [`Store`] trait first, beside `gangway-store-redb`, and the one crate whose build needs
//! protoc (through `etcd-client`), so every etcd call of gangway lives here; the node lease and
//! the prefix watch of cluster mode go here as modules when they are built, and the CLI reaches
//! them through its `etcd` feature only.
//!
//! - Layout: [`keys`] (one key per instance, service and offline mark; JSON values).
//! - [`Store::apply`]: one etcd transaction per batch, so a batch is all or nothing; writes to
//!   one key inside a batch collapse to the last one (etcd refuses a transaction that names a
//!   key twice); more distinct keys than [`EtcdConfig::max_txn_ops`] (etcd's `--max-txn-ops`,
//!   128 by default) are refused with [`StoreError::TooLarge`], and [`Store::max_batch`] tells
//!   the engine's group commit to stay under it. Acknowledged means committed by a quorum of
//!   etcd members, each having fsynced its log.
//! - [`Store::load`]: ranged reads of at most [`EtcdConfig::page_size`] keys, every page at the
//!   revision of the first one (one consistent snapshot); restarted, at most
//!   [`LOAD_ATTEMPTS`] times, when etcd compacted that revision meanwhile.
//! - Every call is bounded by [`EtcdConfig::request_timeout`], retries included, each attempt
//!   by a quarter of it ([`ATTEMPTS_PER_CALL`]). Calls go to one member (the last that
//!   answered); a call that meets an unavailable or frozen member or a leader election is
//!   retried on the next endpoint with backoff
//!   ([`RETRY_FIRST`] doubling to [`RETRY_MAX`]). A retried batch is safe: it only puts and
//!   deletes keys to final values, so applying it twice leaves the same state.
//!
//! The [`Store`] calls block (as the trait says): the store runs its own one-thread tokio
//! runtime for the etcd client, so it works from `spawn_blocking` and from plain threads.
//!
//! ```no_run
//! use gangway_store::Store;
//! use gangway_store_etcd::{EtcdConfig, EtcdStore};
//!
//! let config = EtcdConfig {
//!     endpoints: vec!["http://127.0.0.1:2379".into()],
//!     ..EtcdConfig::default()
//! };
//! let store = EtcdStore::connect(config)?;
//! let contents = store.load()?;
//! println!("{} services with settings", contents.services.len());
//! # Ok::<(), gangway_store::StoreError>(())
//! ```

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, GetOptions, Txn, TxnOp};
use gangway_core::model::{OfflineMark, ServiceSettings, StoredInstance};
use gangway_store::{Contents, Store, StoreError, Write};
use tokio::time::Instant;

pub mod cluster;
pub mod config;
pub mod keys;
pub mod lease;
pub mod watch;

pub use cluster::EtcdNode;
pub use config::{ConfigError, EtcdConfig};
pub use keys::{Layout, Space};
pub use lease::{LeaseState, NodeLease};
pub use watch::{PrefixWatch, WatchEvent};

/// First pause before a retry: 20 ms.
pub const RETRY_FIRST: Duration = Duration::from_millis(20);
/// Longest pause between retries: 500 ms.
pub const RETRY_MAX: Duration = Duration::from_millis(500);
/// One attempt of a call gets at most 1/4 of [`EtcdConfig::request_timeout`] (1.25 s by
/// default), so that a call whose first attempt meets a frozen member (its connection open,
/// nothing answered) is retried on another member within the call's deadline.
pub const ATTEMPTS_PER_CALL: u32 = 4;
/// Most starts of one `load` when etcd compacts the revision it reads at: 3.
pub const LOAD_ATTEMPTS: usize = 3;

/// The etcd-backed store. Cheap to share (`Arc`); dropping it stops its runtime, and with it
/// every [`NodeLease`] keep-alive and [`PrefixWatch`] it started.
pub struct EtcdStore {
    shared: Arc<Shared>,
    // An Option only so that Drop can shut it down without blocking (dropping a runtime inside
    // another runtime's task would panic).
    runtime: Option<tokio::runtime::Runtime>,
    /// This node's part of the cluster, once [`EtcdStore::join`] made it.
    pub(crate) node: std::sync::OnceLock<Arc<EtcdNode>>,
}

/// What the blocking store, the lease keep-alive and the watch task share.
pub(crate) struct Shared {
    /// One client per endpoint, in `endpoints` order.
    clients: Vec<Client>,
    /// The endpoint calls go to first: the last one that answered.
    preferred: AtomicUsize,
    pub(crate) layout: Layout,
    pub(crate) config: EtcdConfig,
    /// The node name revision marks give (set by [`EtcdStore::join`]); unset, a batch writes
    /// no revision marks and checks no revisions.
    pub(crate) writer: std::sync::OnceLock<String>,
    /// Cluster mode: the revision at which this node last saw each durable key (from the load,
    /// the watch and its own writes), the compare of every batch (docs/cluster.md).
    pub(crate) seen: std::sync::Mutex<Seen>,
}

/// The durable keys' revisions a node last saw: key → (revision, present). An absent key
/// stays listed only while this node's own deletion has not come back through the watch.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    keys: std::collections::HashMap<String, (i64, bool)>,
}

impl Seen {
    /// A watch event or a load of `key` at `revision` (`present`: a put).
    pub(crate) fn observe(&mut self, key: &str, revision: i64, present: bool) {
        match self.keys.get(key) {
            Some((r, _)) if *r > revision => {}
            _ if present => {
                self.keys.insert(key.to_owned(), (revision, true));
            }
            _ => {
                self.keys.remove(key);
            }
        }
    }

    /// This node's own write of `key` at `revision`.
    pub(crate) fn wrote(&mut self, key: &str, revision: i64, present: bool) {
        self.keys.insert(key.to_owned(), (revision, present));
    }

    /// The `mod_revision` a write of `key` expects: 0 when absent.
    pub(crate) fn expect(&self, key: &str) -> i64 {
        match self.keys.get(key) {
            Some((r, true)) => *r,
            _ => 0,
        }
    }

    /// Replaces everything (a load).
    pub(crate) fn reset(&mut self, keys: impl IntoIterator<Item = (String, i64)>) {
        self.keys = keys.into_iter().map(|(k, r)| (k, (r, true))).collect();
    }
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.shared.config.endpoints)
            .field("prefix", &self.shared.config.prefix)
            .finish()
    }
}

impl Drop for EtcdStore {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// A failure of one attempt: retry it, or give up.
pub(crate) enum Attempt {
    Retry(String),
    Fail(StoreError),
}

impl EtcdStore {
    /// Checks `config`, connects, and reads once under the prefix to prove that etcd answers
    /// (within [`EtcdConfig::connect_timeout`]). Blocks.
    ///
    /// Errors: [`StoreError::Io`] for a configuration [`EtcdConfig::validate`] refuses (the
    /// message names the fields) or an etcd that does not answer in time (naming the
    /// endpoints and the last error).
    pub fn connect(config: EtcdConfig) -> Result<Self, StoreError> {
        config
            .validate()
            .map_err(|e| StoreError::Io(format!("etcd configuration: {e}")))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("gangway-etcd")
            .enable_all()
            .build()
            .map_err(|e| StoreError::Io(format!("etcd client runtime: {e}")))?;
        let options = ConnectOptions::new()
            .with_connect_timeout(config.connect_timeout)
            .with_timeout(config.request_timeout / ATTEMPTS_PER_CALL)
            .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2))
            .with_require_leader(true);
        let endpoints = config.endpoints.clone();
        let deadline = config.connect_timeout;
        // The client connects lazily: a member down at start is no error here.
        let clients = run_on(runtime.handle(), async move {
            let mut clients = Vec::with_capacity(endpoints.len());
            for endpoint in &endpoints {
                let client = tokio::time::timeout(
                    deadline,
                    Client::connect([endpoint], Some(options.clone())),
                )
                .await
                .map_err(|_| format!("{endpoint}: no answer within {deadline:?}"))?
                .map_err(|e| format!("{endpoint}: {e}"))?;
                clients.push(client);
            }
            Ok::<_, String>(clients)
        })
        .and_then(|connected| connected)
        .map_err(|e| StoreError::Io(format!("etcd {}: {e}", config.endpoints.join(","))))?;
        let store = Self {
            shared: Arc::new(Shared {
                clients,
                preferred: AtomicUsize::new(0),
                layout: Layout::new(&config.prefix),
                config,
                writer: std::sync::OnceLock::new(),
                seen: std::sync::Mutex::new(Seen::default()),
            }),
            runtime: Some(runtime),
            node: std::sync::OnceLock::new(),
        };
        // One cheap read: etcd answers with a leader, or connect fails here, not at the first
        // write.
        let shared = store.shared.clone();
        let key = shared.layout.space(Space::Services);
        store
            .block(async move {
                shared
                    .call(shared.config.connect_timeout, move |mut c| {
                        let key = key.clone();
                        async move {
                            c.get(key, Some(GetOptions::new().with_count_only()))
                                .await
                                .map(|_| ())
                        }
                    })
                    .await
            })
            .map_err(|e| match e {
                StoreError::Io(m) => StoreError::Io(format!(
                    "etcd {} does not answer: {m}",
                    store.shared.config.endpoints.join(",")
                )),
                other => other,
            })?;
        Ok(store)
    }

    /// The key layout under this store's prefix.
    pub fn layout(&self) -> &Layout {
        &self.shared.layout
    }

    /// Everything stored, and the etcd revision it was read at (a watch of later changes
    /// starts at that revision + 1). Blocks.
    ///
    /// Errors: as [`Store::load`].
    pub fn load_at(&self) -> Result<(Contents, i64), StoreError> {
        let shared = self.shared.clone();
        self.block(async move { shared.load_at().await })
    }

    /// Runs `fut` on the store's runtime and waits for it (every future given is bounded by
    /// the deadlines of its calls).
    fn block<T: Send + 'static>(
        &self,
        fut: impl Future<Output = Result<T, StoreError>> + Send + 'static,
    ) -> Result<T, StoreError> {
        run_on(&self.handle(), fut).map_err(StoreError::Io)?
    }

    /// The store's runtime, for the tasks of [`NodeLease`] and [`PrefixWatch`].
    pub(crate) fn handle(&self) -> tokio::runtime::Handle {
        self.runtime
            .as_ref()
            .expect("runtime lives until drop")
            .handle()
            .clone()
    }

    pub(crate) fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// Whether every key holds the value a batch gave it (`None`: absent), and then the newest
    /// revision among them. One read per key; only after a failed compare.
    fn landed(&self, wanted: Vec<(String, Option<String>)>) -> Result<Option<i64>, StoreError> {
        let shared = self.shared.clone();
        self.block(async move {
            let mut newest = 0;
            for (key, value) in wanted {
                let got = shared
                    .call(shared.config.request_timeout, |mut c| {
                        let key = key.clone();
                        async move { c.get(key, None).await }
                    })
                    .await?;
                let kv = got.kvs().first();
                let same = match (&value, kv) {
                    (None, None) => true,
                    (Some(v), Some(kv)) => kv.value() == v.as_bytes(),
                    _ => false,
                };
                if !same {
                    return Ok(None);
                }
                let revision = kv.map_or_else(
                    || got.header().map_or(0, |h| h.revision()),
                    |kv| kv.mod_revision(),
                );
                newest = newest.max(revision);
            }
            Ok(Some(newest))
        })
    }
}

impl Shared {
    /// Everything stored and the revision it was read at: every page at the first page's
    /// revision, restarted at most [`LOAD_ATTEMPTS`] times when etcd compacted it meanwhile.
    pub(crate) async fn load_at(&self) -> Result<(Contents, i64), StoreError> {
        let mut last = None;
        for _ in 0..LOAD_ATTEMPTS {
            match self.load_once().await {
                Err(StoreError::Io(m)) if m.contains("compacted") => last = Some(m),
                other => return other,
            }
        }
        Err(StoreError::Io(format!(
            "load restarted {LOAD_ATTEMPTS} times, etcd compacted its revision each time: {}",
            last.unwrap_or_default()
        )))
    }

    async fn load_once(&self) -> Result<(Contents, i64), StoreError> {
        let mut revision = 0;
        let mut batch = Vec::new();
        for space in Space::DURABLE {
            for kv in self.read_space(space, &mut revision).await? {
                batch.push(self.decode(space, kv.key(), Some(kv.value()))?);
            }
        }
        let mut contents = Contents::default();
        contents.apply(&batch);
        Ok((contents, revision))
    }

    /// One stored key and value as the write that would have made it; `value` `None` is a
    /// deletion (of a watch event).
    pub(crate) fn decode(
        &self,
        space: Space,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Result<Write, StoreError> {
        let table = match space {
            Space::Instances => "etcd instances",
            Space::Services => "etcd services",
            Space::Offline => "etcd offline marks",
            _ => "etcd",
        };
        let corrupt = |message: String| StoreError::Corrupt { table, message };
        let key = std::str::from_utf8(key)
            .map_err(|_| corrupt(format!("a key that is not UTF-8: {key:?}")))?;
        let unknown = || corrupt(format!("a key outside the layout: {key}"));
        let json = |e: serde_json::Error| corrupt(format!("{key}: {e}"));
        Ok(match space {
            Space::Instances => {
                let (service, ikey) = self.layout.parse_instance(space, key).ok_or_else(unknown)?;
                let Some(value) = value else {
                    return Ok(Write::DeleteInstance(service, ikey));
                };
                let stored: StoredInstance = serde_json::from_slice(value).map_err(json)?;
                if stored.instance.key != ikey {
                    return Err(corrupt(format!(
                        "{key} holds instance {}#{}",
                        stored.instance.key.addr(),
                        stored.instance.key.cluster
                    )));
                }
                Write::PutInstance(service, stored)
            }
            Space::Services => {
                let service = self.layout.parse_service(key).ok_or_else(unknown)?;
                let Some(value) = value else {
                    return Ok(Write::DeleteService(service));
                };
                let settings: ServiceSettings = serde_json::from_slice(value).map_err(json)?;
                Write::PutService(service, settings)
            }
            Space::Offline => {
                let (service, ikey) = self.layout.parse_instance(space, key).ok_or_else(unknown)?;
                let Some(value) = value else {
                    return Ok(Write::DeleteOfflineMark(service, ikey));
                };
                let mark: OfflineMark = serde_json::from_slice(value).map_err(json)?;
                Write::PutOfflineMark(service, ikey, mark)
            }
            _ => return Err(corrupt(format!("{key} is not durable state"))),
        })
    }

    /// The key and new value (`None`: delete) of one write.
    fn encode(&self, write: &Write) -> (String, Option<String>) {
        let layout = &self.layout;
        match write {
            Write::PutInstance(s, i) => (
                layout.instance(Space::Instances, s, &i.instance.key),
                json(i),
            ),
            Write::DeleteInstance(s, k) => (layout.instance(Space::Instances, s, k), None),
            Write::PutService(s, v) => (layout.service(s), json(v)),
            Write::DeleteService(s) => (layout.service(s), None),
            Write::PutOfflineMark(s, k, m) => (layout.instance(Space::Offline, s, k), json(m)),
            Write::DeleteOfflineMark(s, k) => (layout.instance(Space::Offline, s, k), None),
        }
    }

    /// The client of the endpoint calls go to first.
    pub(crate) fn client(&self) -> (usize, Client) {
        let at = self.preferred.load(Ordering::Relaxed) % self.clients.len();
        (at, self.clients[at].clone())
    }

    /// Moves calls on from endpoint `at` to the next, unless another call did already.
    pub(crate) fn failed(&self, at: usize) {
        let next = (at + 1) % self.clients.len();
        let _ = self
            .preferred
            .compare_exchange(at, next, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Runs `op` until it succeeds, fails for good, or `deadline` passes; retries unavailable
    /// members and leader elections with backoff. Each attempt goes to the member that
    /// answered last; one whose attempt failed hands over to the next endpoint (so a dead or
    /// frozen member costs one attempt, not one per call).
    pub(crate) async fn call<T, F, Fut>(&self, deadline: Duration, op: F) -> Result<T, StoreError>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let end = Instant::now() + deadline;
        let mut pause = RETRY_FIRST;
        loop {
            let (at, client) = self.client();
            let attempt = match tokio::time::timeout_at(end, op(client)).await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(e)) => classify(e),
                Err(_) => Attempt::Retry(format!("no answer within {deadline:?}")),
            };
            match attempt {
                Attempt::Fail(e) => return Err(e),
                Attempt::Retry(m) => {
                    self.failed(at);
                    if Instant::now() + pause >= end {
                        return Err(StoreError::Io(format!(
                            "etcd did not answer within {deadline:?}: {m}"
                        )));
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(RETRY_MAX);
                }
            }
        }
    }
}

impl Store for EtcdStore {
    fn load(&self) -> Result<Contents, StoreError> {
        self.load_at().map(|(contents, _)| contents)
    }

    fn apply(&self, batch: &[Write]) -> Result<(), StoreError> {
        self.apply_at(batch).map(|_| ())
    }

    fn apply_at(&self, batch: &[Write]) -> Result<Option<i64>, StoreError> {
        // Last write per key wins, as applying them in order would leave it.
        let mut final_values: BTreeMap<String, Option<String>> =
            batch.iter().map(|w| self.shared.encode(w)).collect();
        if final_values.is_empty() {
            return Ok(None);
        }
        let max = self.max_batch().unwrap_or(usize::MAX);
        if final_values.len() > max {
            return Err(StoreError::TooLarge {
                writes: final_values.len(),
                max,
            });
        }
        // A cluster node checks every key against the revision it last saw it at.
        let compares: Vec<etcd_client::Compare> = match self.shared.writer.get() {
            Some(_) => {
                let seen = self.shared.seen.lock().expect("seen lock");
                final_values
                    .keys()
                    .map(|k| {
                        etcd_client::Compare::mod_revision(
                            k.clone(),
                            etcd_client::CompareOp::Equal,
                            seen.expect(k),
                        )
                    })
                    .collect()
            }
            None => Vec::new(),
        };
        let written: Vec<(String, bool)> = final_values
            .iter()
            .map(|(k, v)| (k.clone(), v.is_some()))
            .collect();
        let wanted: Vec<(String, Option<String>)> = final_values
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        // A cluster node names itself on the revision mark of every service it changes.
        if let Some(writer) = self.shared.writer.get() {
            let mark = json(&cluster::RevisionMark {
                node: writer.clone(),
            });
            for write in batch {
                final_values.insert(
                    self.shared.layout.revision(write_service(write)),
                    mark.clone(),
                );
            }
        }
        let ops: Vec<TxnOp> = final_values
            .into_iter()
            .map(|(key, value)| match value {
                Some(value) => TxnOp::put(key, value, None),
                None => TxnOp::delete(key, None),
            })
            .collect();
        let checked = !compares.is_empty();
        let txn = Txn::new().when(compares).and_then(ops);
        let shared = self.shared.clone();
        let (succeeded, revision) = self.block(async move {
            shared
                .call(shared.config.request_timeout, move |mut c| {
                    let txn = txn.clone();
                    async move {
                        c.txn(txn)
                            .await
                            .map(|r| (r.succeeded(), r.header().map(|h| h.revision())))
                    }
                })
                .await
        })?;
        let revision = if succeeded {
            revision
        } else {
            // A retried attempt fails its compare when the first one committed and only its
            // answer was lost: the batch is in etcd then, value for value.
            match self.landed(wanted)? {
                Some(revision) => Some(revision),
                None => {
                    return Err(StoreError::Conflict(
                        "a key of the batch was written by another node since this node last saw it"
                            .into(),
                    ));
                }
            }
        };
        if checked && let Some(revision) = revision {
            let mut seen = self.shared.seen.lock().expect("seen lock");
            for (key, present) in written {
                seen.wrote(&key, revision, present);
            }
        }
        Ok(revision)
    }

    /// Half of etcd's `--max-txn-ops`: each write of a batch may add its service's revision
    /// mark in cluster mode.
    fn max_batch(&self) -> Option<usize> {
        Some(self.shared.config.max_txn_ops / 2)
    }

    fn cluster(&self) -> Option<Arc<dyn gangway_store::Cluster>> {
        self.node
            .get()
            .map(|n| n.clone() as Arc<dyn gangway_store::Cluster>)
    }
}

/// The service a write changes.
fn write_service(write: &Write) -> &gangway_core::model::ServiceKey {
    match write {
        Write::PutInstance(s, _)
        | Write::DeleteInstance(s, _)
        | Write::PutService(s, _)
        | Write::DeleteService(s)
        | Write::PutOfflineMark(s, _, _)
        | Write::DeleteOfflineMark(s, _) => s,
    }
}

/// Runs `fut` on `runtime` from a blocking thread and waits for it.
pub(crate) fn run_on<T: Send + 'static>(
    runtime: &tokio::runtime::Handle,
    fut: impl Future<Output = T> + Send + 'static,
) -> Result<T, String> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    runtime.spawn(async move {
        let _ = tx.send(fut.await);
    });
    rx.recv()
        .map_err(|_| "the etcd client runtime stopped".to_owned())
}

/// Transport failures, unavailable members, missing leaders and timeouts are retried; the
/// rest (a refused request, a compacted revision) fail at once.
pub(crate) fn classify(e: etcd_client::Error) -> Attempt {
    use etcd_client::Error as E;
    use tonic::Code;
    match e {
        E::TransportError(_) | E::IoError(_) => Attempt::Retry(e.to_string()),
        E::GRpcStatus(ref s)
            if matches!(
                s.code(),
                Code::Unavailable | Code::DeadlineExceeded | Code::Unknown | Code::Cancelled
            ) =>
        {
            Attempt::Retry(e.to_string())
        }
        other => Attempt::Fail(StoreError::Io(other.to_string())),
    }
}

/// The smallest key greater than every key starting with `prefix` (etcd's range end of a
/// prefix).
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// The JSON value of a put.
pub(crate) fn json<T: serde::Serialize>(value: &T) -> Option<String> {
    Some(serde_json::to_string(value).expect("store types serialise to JSON"))
}

#[cfg(test)]
mod tests;
