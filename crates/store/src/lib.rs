//! Durable state of gangway (DESIGN §7): persistent instances, service settings and offline
//! marks. Ephemeral state never comes here.
//!
//! A [`Store`] applies a batch of [`Write`]s atomically and durably: when
//! [`Store::apply`] returns `Ok`, the batch survives a crash (kill -9, power loss as far as
//! the disk honours fsync). [`Store::load`] returns everything at start-up.
//!
//! Backends: [`MemoryStore`] here (tests, `--data-dir` unset in unit tests), redb in
//! `gangway-store-redb`. Each backend runs [`conformance::run`].

use std::collections::BTreeMap;
use std::sync::Mutex;

use gangway_core::model::{InstanceKey, OfflineMark, ServiceKey, ServiceSettings, StoredInstance};

pub mod cluster;
pub mod conformance;

pub use cluster::Cluster;

/// One change to durable state.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    /// Insert or replace a persistent instance.
    PutInstance(ServiceKey, StoredInstance),
    /// Delete a persistent instance (absent: no-op).
    DeleteInstance(ServiceKey, InstanceKey),
    /// Insert or replace a service's settings.
    PutService(ServiceKey, ServiceSettings),
    /// Delete a service's settings (absent: no-op).
    DeleteService(ServiceKey),
    /// Set a manual-offline mark.
    PutOfflineMark(ServiceKey, InstanceKey, OfflineMark),
    /// Clear a manual-offline mark (absent: no-op).
    DeleteOfflineMark(ServiceKey, InstanceKey),
}

/// Everything a store holds, as loaded at start-up. Maps are ordered for stable listings.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Contents {
    /// Persistent instances by service, then instance key.
    pub instances: BTreeMap<ServiceKey, BTreeMap<InstanceKey, StoredInstance>>,
    /// Service settings.
    pub services: BTreeMap<ServiceKey, ServiceSettings>,
    /// Manual-offline marks.
    pub offline_marks: BTreeMap<(ServiceKey, InstanceKey), OfflineMark>,
}

impl Contents {
    /// Applies writes in order (the reference semantics every backend must match).
    pub fn apply(&mut self, batch: &[Write]) {
        for write in batch {
            match write {
                Write::PutInstance(s, i) => {
                    self.instances
                        .entry(s.clone())
                        .or_default()
                        .insert(i.instance.key.clone(), i.clone());
                }
                Write::DeleteInstance(s, k) => {
                    if let Some(m) = self.instances.get_mut(s) {
                        m.remove(k);
                        if m.is_empty() {
                            self.instances.remove(s);
                        }
                    }
                }
                Write::PutService(s, v) => {
                    self.services.insert(s.clone(), v.clone());
                }
                Write::DeleteService(s) => {
                    self.services.remove(s);
                }
                Write::PutOfflineMark(s, k, m) => {
                    self.offline_marks.insert((s.clone(), k.clone()), m.clone());
                }
                Write::DeleteOfflineMark(s, k) => {
                    self.offline_marks.remove(&(s.clone(), k.clone()));
                }
            }
        }
    }
}

/// A store failure: the batch was not applied (all-or-nothing).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Disk, database or lock failure.
    #[error("store I/O failed: {0}")]
    Io(String),
    /// The batch holds more distinct keys than the backend takes in one transaction
    /// ([`Store::max_batch`]); nothing of it was applied.
    #[error("store batch too large: {writes} distinct keys, at most {max} per transaction")]
    TooLarge {
        /// Distinct keys the batch writes (writes to one key count once).
        writes: usize,
        /// The backend's bound.
        max: usize,
    },
    /// A cluster store's revision-checked batch found a key written by another node since this
    /// node last saw it (docs/cluster.md, "Writes and reads"); nothing of it was applied. The
    /// caller's view catches up through the watch: the change can be decided again.
    #[error("store conflict: {0}")]
    Conflict(String),
    /// Stored bytes that do not decode.
    #[error("store holds undecodable data in {table}: {message}")]
    Corrupt {
        /// Table or key space.
        table: &'static str,
        /// Decoder message.
        message: String,
    },
}

/// Durable state. Calls block (they may fsync): async callers use `spawn_blocking`.
pub trait Store: Send + Sync + 'static {
    /// Everything stored.
    fn load(&self) -> Result<Contents, StoreError>;
    /// Applies `batch` atomically; durable when `Ok` is returned.
    ///
    /// Errors: [`StoreError::TooLarge`] (nothing applied) when the batch writes more distinct
    /// keys than [`max_batch`](Store::max_batch); I/O failures.
    fn apply(&self, batch: &[Write]) -> Result<(), StoreError>;

    /// Most writes one [`apply`](Store::apply) takes, or `None` (the default) for no bound.
    /// A group commit gathers whole callers' batches up to it (a single caller's larger batch
    /// still goes alone, and a backend may refuse it). The embedded stores have no bound; etcd
    /// takes at most `--max-txn-ops` operations (128 by default) in one transaction.
    fn max_batch(&self) -> Option<usize> {
        None
    }

    /// Like [`apply`](Store::apply), and the store revision the batch was committed at
    /// (`None`, the default, for a store without revisions: the embedded ones). A cluster
    /// store returns it so that every node names the change by the same revision.
    fn apply_at(&self, batch: &[Write]) -> Result<Option<i64>, StoreError> {
        self.apply(batch).map(|()| None)
    }

    /// The cluster this store is shared in (docs/cluster.md), or `None` (the default): the
    /// node is alone.
    fn cluster(&self) -> Option<std::sync::Arc<dyn Cluster>> {
        None
    }
}

/// A store in memory: not durable. For tests.
#[derive(Debug, Default)]
pub struct MemoryStore {
    contents: Mutex<Contents>,
}

impl Store for MemoryStore {
    fn load(&self) -> Result<Contents, StoreError> {
        Ok(self
            .contents
            .lock()
            .map_err(|e| StoreError::Io(e.to_string()))?
            .clone())
    }

    fn apply(&self, batch: &[Write]) -> Result<(), StoreError> {
        self.contents
            .lock()
            .map_err(|e| StoreError::Io(e.to_string()))?
            .apply(batch);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn memory_store_conforms() {
        super::conformance::run(super::MemoryStore::default);
    }
}
