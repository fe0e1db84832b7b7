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

pub mod config;
pub mod keys;

pub use config::{ConfigError, EtcdConfig};
pub use keys::{Layout, Space};

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

/// The etcd-backed store. Cheap to share (`Arc`); dropping it stops its runtime.
pub struct EtcdStore {
    /// One client per endpoint, in `endpoints` order.
    clients: Vec<Client>,
    /// The endpoint calls go to first: the last one that answered.
    preferred: Arc<AtomicUsize>,
    layout: Layout,
    config: EtcdConfig,
    // An Option only so that Drop can shut it down without blocking (dropping a runtime inside
    // another runtime's task would panic).
    runtime: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.config.endpoints)
            .field("prefix", &self.config.prefix)
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
enum Attempt {
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
        let clients = run_on(&runtime, deadline, async move {
            let mut clients = Vec::with_capacity(endpoints.len());
            for endpoint in &endpoints {
                let client = Client::connect([endpoint], Some(options.clone()))
                    .await
                    .map_err(|e| format!("{endpoint}: {e}"))?;
                clients.push(client);
            }
            Ok::<_, String>(clients)
        })
        .and_then(|connected| connected)
        .map_err(|e| StoreError::Io(format!("etcd {}: {e}", config.endpoints.join(","))))?;
        let store = Self {
            clients,
            preferred: Arc::new(AtomicUsize::new(0)),
            layout: Layout::new(&config.prefix),
            config,
            runtime: Some(runtime),
        };
        // One cheap read: etcd answers with a leader, or connect fails here, not at the first
        // write.
        let key = store.layout.space(Space::Services);
        store
            .call(store.config.connect_timeout, move |mut c| {
                let key = key.clone();
                async move {
                    c.get(key, Some(GetOptions::new().with_count_only()))
                        .await
                        .map(|_| ())
                }
            })
            .map_err(|e| match e {
                StoreError::Io(m) => StoreError::Io(format!(
                    "etcd {} does not answer: {m}",
                    store.config.endpoints.join(",")
                )),
                other => other,
            })?;
        Ok(store)
    }

    /// The key layout under this store's prefix.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Everything stored, and the etcd revision it was read at (a watch of later changes
    /// starts at that revision + 1). Blocks.
    ///
    /// Errors: as [`Store::load`].
    pub fn load_at(&self) -> Result<(Contents, i64), StoreError> {
        let mut last = None;
        for _ in 0..LOAD_ATTEMPTS {
            match self.load_once() {
                Err(StoreError::Io(m)) if m.contains("compacted") => last = Some(m),
                other => return other,
            }
        }
        Err(StoreError::Io(format!(
            "load restarted {LOAD_ATTEMPTS} times, etcd compacted its revision each time: {}",
            last.unwrap_or_default()
        )))
    }

    fn load_once(&self) -> Result<(Contents, i64), StoreError> {
        let mut revision = 0;
        let mut batch = Vec::new();
        for space in Space::ALL {
            let start = self.layout.space(space);
            let end = prefix_end(start.as_bytes());
            let mut from = start.into_bytes();
            loop {
                let mut options = GetOptions::new()
                    .with_range(end.clone())
                    .with_limit(self.config.page_size as i64);
                if revision > 0 {
                    options = options.with_revision(revision);
                }
                let key = from.clone();
                let page = self.call(self.config.request_timeout, move |mut c| {
                    let (key, options) = (key.clone(), options.clone());
                    async move { c.get(key, Some(options)).await }
                })?;
                if revision == 0 {
                    revision = page.header().map_or(0, |h| h.revision());
                }
                for kv in page.kvs() {
                    batch.push(self.decode(space, kv.key(), kv.value())?);
                }
                match page.kvs().last() {
                    Some(last) if page.more() => {
                        from = last.key().to_vec();
                        from.push(0);
                    }
                    _ => break,
                }
            }
        }
        let mut contents = Contents::default();
        contents.apply(&batch);
        Ok((contents, revision))
    }

    /// One stored key and value as the write that would have made it.
    fn decode(&self, space: Space, key: &[u8], value: &[u8]) -> Result<Write, StoreError> {
        let table = match space {
            Space::Instances => "etcd instances",
            Space::Services => "etcd services",
            Space::Offline => "etcd offline marks",
        };
        let corrupt = |message: String| StoreError::Corrupt { table, message };
        let key = std::str::from_utf8(key)
            .map_err(|_| corrupt(format!("a key that is not UTF-8: {key:?}")))?;
        let unknown = || corrupt(format!("a key outside the layout: {key}"));
        let json = |e: serde_json::Error| corrupt(format!("{key}: {e}"));
        Ok(match space {
            Space::Instances => {
                let (service, ikey) = self.layout.parse_instance(space, key).ok_or_else(unknown)?;
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
                let settings: ServiceSettings = serde_json::from_slice(value).map_err(json)?;
                Write::PutService(service, settings)
            }
            Space::Offline => {
                let (service, ikey) = self.layout.parse_instance(space, key).ok_or_else(unknown)?;
                let mark: OfflineMark = serde_json::from_slice(value).map_err(json)?;
                Write::PutOfflineMark(service, ikey, mark)
            }
        })
    }

    /// The key and new value (`None`: delete) of one write.
    fn encode(&self, write: &Write) -> (String, Option<String>) {
        match write {
            Write::PutInstance(s, i) => (
                self.layout.instance(Space::Instances, s, &i.instance.key),
                json(i),
            ),
            Write::DeleteInstance(s, k) => (self.layout.instance(Space::Instances, s, k), None),
            Write::PutService(s, v) => (self.layout.service(s), json(v)),
            Write::DeleteService(s) => (self.layout.service(s), None),
            Write::PutOfflineMark(s, k, m) => (self.layout.instance(Space::Offline, s, k), json(m)),
            Write::DeleteOfflineMark(s, k) => (self.layout.instance(Space::Offline, s, k), None),
        }
    }

    /// Runs `op` on the store's runtime until it succeeds, fails for good, or `deadline`
    /// passes; retries unavailable members and leader elections with backoff. Each attempt
    /// goes to the member that answered last; one whose attempt failed hands over to the next
    /// endpoint (so a dead or frozen member costs one attempt, not one per call).
    fn call<T, F, Fut>(&self, deadline: Duration, op: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: Fn(Client) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, etcd_client::Error>> + Send,
    {
        let clients = self.clients.clone();
        let preferred = self.preferred.clone();
        let runtime = self.runtime.as_ref().expect("runtime lives until drop");
        let end = Instant::now() + deadline;
        let outcome = run_on(runtime, deadline, async move {
            let mut pause = RETRY_FIRST;
            loop {
                let at = preferred.load(Ordering::Relaxed) % clients.len();
                let attempt = match op(clients[at].clone()).await {
                    Ok(v) => return Ok(v),
                    Err(e) => classify(e),
                };
                if matches!(attempt, Attempt::Retry(_)) {
                    // Only if no other call moved on meanwhile.
                    let next = (at + 1) % clients.len();
                    let _ =
                        preferred.compare_exchange(at, next, Ordering::Relaxed, Ordering::Relaxed);
                }
                match attempt {
                    Attempt::Fail(e) => return Err(e),
                    Attempt::Retry(m) if Instant::now() + pause >= end => {
                        return Err(StoreError::Io(format!(
                            "etcd did not answer within {deadline:?}: {m}"
                        )));
                    }
                    Attempt::Retry(_) => {
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(RETRY_MAX);
                    }
                }
            }
        });
        match outcome {
            Ok(result) => result,
            Err(m) => Err(StoreError::Io(m)),
        }
    }
}

impl Store for EtcdStore {
    fn load(&self) -> Result<Contents, StoreError> {
        self.load_at().map(|(contents, _)| contents)
    }

    fn apply(&self, batch: &[Write]) -> Result<(), StoreError> {
        // Last write per key wins, as applying them in order would leave it.
        let final_values: BTreeMap<String, Option<String>> =
            batch.iter().map(|w| self.encode(w)).collect();
        if final_values.is_empty() {
            return Ok(());
        }
        if final_values.len() > self.config.max_txn_ops {
            return Err(StoreError::TooLarge {
                writes: final_values.len(),
                max: self.config.max_txn_ops,
            });
        }
        let ops: Vec<TxnOp> = final_values
            .into_iter()
            .map(|(key, value)| match value {
                Some(value) => TxnOp::put(key, value, None),
                None => TxnOp::delete(key, None),
            })
            .collect();
        let txn = Txn::new().and_then(ops);
        self.call(self.config.request_timeout, move |mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await.map(|_| ()) }
        })
    }

    fn max_batch(&self) -> Option<usize> {
        Some(self.config.max_txn_ops)
    }
}

/// Runs `fut` on `runtime` from a blocking thread and waits for it, at most `deadline` (plus
/// nothing: the future is dropped at the deadline).
fn run_on<T: Send + 'static>(
    runtime: &tokio::runtime::Runtime,
    deadline: Duration,
    fut: impl Future<Output = T> + Send + 'static,
) -> Result<T, String> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    runtime.spawn(async move {
        let _ = tx.send(tokio::time::timeout(deadline, fut).await);
    });
    match rx.recv() {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(_)) => Err(format!("no answer within {deadline:?}")),
        Err(_) => Err("the etcd client runtime stopped".into()),
    }
}

/// Transport failures, unavailable members, missing leaders and timeouts are retried; the
/// rest (a refused request, a compacted revision) fail at once.
fn classify(e: etcd_client::Error) -> Attempt {
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
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
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
fn json<T: serde::Serialize>(value: &T) -> Option<String> {
    Some(serde_json::to_string(value).expect("store types serialise to JSON"))
}

#[cfg(test)]
mod tests;
