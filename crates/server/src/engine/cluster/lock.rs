//! The rules that must hold across nodes (docs/cluster.md, "Limits and choices"): a change that may take an instance out of a service's consumer view (offline, drain,
//! weight 0) takes the service's cluster-wide lock first (an etcd key bound to this node's
//! lease), waits until this node's view has applied the lock's revision (so it holds everything
//! the previous holder wrote), decides and applies as on a single node, waits until its record is
//! in etcd, and lets go. Two such changes through two nodes are then decided one after the
//! other, each on the other's outcome: of two racing drains of a service's last two instances
//! one is refused, as on one node. The first registration of a service takes it too (the kind
//! rule). Bounds: [`LOCK_WAIT`] for the lock, the catch-up and the
//! write each.

use std::sync::Arc;
use std::time::Duration;

use gangway_core::model::{InstanceKey, ServiceKey};
use gangway_store::Cluster;
use tokio::time::Instant;

use super::super::{Patch, Registry, RegistryError};

/// Longest wait for a service's lock held by another node, for this node's view to catch up
/// with it, and for the change's record to be written: 5 s each.
pub const LOCK_WAIT: Duration = Duration::from_secs(5);

/// A service's cluster-wide lock, released when dropped.
pub(crate) struct ServiceLock {
    registry: Registry,
    service: ServiceKey,
    cluster: Arc<dyn Cluster>,
}

/// Whether `patch` may take an instance out of the consumer view.
pub(crate) fn may_take_out(patch: &Patch) -> bool {
    patch.enabled == Some(false) || patch.weight.is_some_and(|w| w <= 0.0)
}

impl Registry {
    /// Cluster mode: the lock of `service`, with this node's view caught up to it; `None` for
    /// a node alone.
    ///
    /// Errors: [`RegistryError::ChangedElsewhere`] (409) when another node held the lock, or
    /// this node's view did not catch up, within [`LOCK_WAIT`]; the store's error.
    pub(crate) async fn lock_service(
        &self,
        service: &ServiceKey,
    ) -> Result<Option<ServiceLock>, RegistryError> {
        let Some(cluster) = self.inner.cluster.clone() else {
            return Ok(None);
        };
        let revision = {
            let (cluster, service) = (cluster.clone(), service.clone());
            tokio::task::spawn_blocking(move || cluster.lock_service(&service, LOCK_WAIT))
                .await
                .map_err(|e| RegistryError::Internal(format!("lock task failed: {e}")))??
        };
        let lock = ServiceLock {
            registry: self.clone(),
            service: service.clone(),
            cluster,
        };
        let mut wake = match &self.lock().cluster {
            Some(c) => c.answers_tx.subscribe(),
            None => return Ok(Some(lock)),
        };
        let deadline = Instant::now() + LOCK_WAIT;
        loop {
            let seen = self.lock().cluster.as_ref().map_or(i64::MAX, |c| c.seen);
            if seen >= revision {
                return Ok(Some(lock));
            }
            if tokio::time::timeout_at(deadline, wake.changed())
                .await
                .is_err()
            {
                return Err(RegistryError::ChangedElsewhere(format!(
                    "this node's view of {service} did not catch up with the cluster within \
                     {LOCK_WAIT:?}"
                )));
            }
        }
    }
}

impl ServiceLock {
    /// Waits (at most [`LOCK_WAIT`]) until the change that published `revision` for `key` is in
    /// etcd, so that the next holder's view has it.
    pub(crate) async fn wait_written(&self, key: &InstanceKey, revision: u64) {
        let _ = self
            .registry
            .written_revision(&self.service, key, revision, Instant::now() + LOCK_WAIT)
            .await;
    }
}

impl Drop for ServiceLock {
    fn drop(&mut self) {
        let (cluster, service) = (self.cluster.clone(), self.service.clone());
        tokio::task::spawn_blocking(move || {
            if let Err(e) = cluster.unlock_service(&service) {
                tracing::warn!(error = %e, %service, "service lock not released; it goes with this node's lease");
            }
        });
    }
}
