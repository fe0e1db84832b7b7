//! Closing the engine when the server stops (issue 9, part 4).
//!
//! The engine's clones live in many tasks (sessions, probes, timers, HTTP handlers), so dropping
//! the server's own [`Registry`] frees nothing. [`Registry::close`] therefore ends what the
//! engine itself runs and takes the store out of the engine: redb holds a file lock on the data
//! directory until its `RedbStore` is dropped, and a replacement server can only open it then.
//! The order of a stop is the server's (see `RunningServer::shutdown`); the engine offers the
//! pieces: [`Registry::hold_pushes`], [`Registry::stopping`] for the streams that must end, and
//! [`Registry::close`].

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

use gangway_store::Store;
use tokio::time::Instant;

use super::Registry;
use crate::error::ApiError;

/// The store, until the engine is closed.
pub(crate) struct StoreSlot(Mutex<Option<Arc<dyn Store>>>);

impl StoreSlot {
    pub(crate) fn new(store: Arc<dyn Store>) -> Self {
        Self(Mutex::new(Some(store)))
    }

    fn lock(&self) -> MutexGuard<'_, Option<Arc<dyn Store>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The store for one write. Errors: the engine is closed (500 `internal`: only a request
    /// that outlived the server's stop can get here).
    pub(crate) fn get(&self) -> Result<Arc<dyn Store>, ApiError> {
        self.lock().clone().ok_or_else(|| {
            ApiError::Store("the registry is stopping: its store is closed".to_owned())
        })
    }

    fn take(&self) -> Option<Arc<dyn Store>> {
        self.lock().take()
    }

    fn is_closed(&self) -> bool {
        self.lock().is_none()
    }
}

/// What [`Registry::close`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloseReport {
    /// Probe tasks stopped.
    pub probes_stopped: usize,
    /// Every store write in flight had finished before the deadline (false: one was still
    /// running; it completes or fails atomically on its own, and its client got no answer).
    pub writes_finished: bool,
    /// The store was dropped here, so its file lock is free now (false: the write still running
    /// holds it until it ends). Also false when the engine was already closed.
    pub store_released: bool,
}

impl Registry {
    /// Resolves once [`Registry::hold_pushes`] was called (the server is stopping): streams that
    /// would otherwise last as long as their clients (native sessions, SSE watches) end on it.
    /// Cancel-safe; resolves at once when pushes are already held for a stop.
    pub fn stopping(&self) -> impl Future<Output = ()> + Send + use<> {
        let mut holds = self.inner.holds.subscribe();
        async move {
            // Err only when the engine is gone, which is a stop too.
            let _ = holds.wait_for(|h| h.shutdown).await;
        }
    }

    /// True once pushes are held for a stop ([`Registry::hold_pushes`]).
    pub(crate) fn is_stopping(&self) -> bool {
        self.inner.holds.borrow().shutdown
    }

    /// True once [`Registry::close`] ran: the store is released and background work stopped.
    pub fn is_closed(&self) -> bool {
        self.inner.store.is_closed()
    }

    /// Closes the engine, the last step of a server stop: holds back every push (if
    /// [`Registry::hold_pushes`] was not called yet), stops the probes and the background timer
    /// (lease, mark and poller expiry), waits until `deadline` at most for the store write in
    /// flight (writes are fsync'd before they are acknowledged, so nothing else needs
    /// flushing), then drops the store, which releases its file lock.
    ///
    /// Afterwards the in-memory state still answers reads, and every write fails with
    /// [`ApiError::Store`]. Idempotent. Cancel-safe: dropping the future before it ends leaves
    /// the store open and the probes stopped.
    pub async fn close(&self, deadline: Instant) -> CloseReport {
        self.hold_pushes();
        let probes: Vec<tokio::task::AbortHandle> = {
            let mut probes = self.inner.probes.lock().unwrap_or_else(|p| p.into_inner());
            probes.drain().map(|(_, task)| task).collect()
        };
        for task in &probes {
            task.abort();
        }
        // Every write holds `durable` while it runs: once we hold it, none is in flight.
        let durable = tokio::time::timeout_at(deadline, self.inner.durable.lock())
            .await
            .ok();
        let writes_finished = durable.is_some();
        let store = self.inner.store.take();
        drop(durable);
        // A write whose caller was dropped mid-way may still hold a clone in its blocking task;
        // then that task drops the store, and with it the lock, when the write ends.
        let store_released = store.is_some_and(|s| Arc::strong_count(&s) == 1);
        tracing::info!(
            probes = probes.len(),
            writes_finished,
            store_released,
            "registry closed"
        );
        CloseReport {
            probes_stopped: probes.len(),
            writes_finished,
            store_released,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use gangway_core::model::{Instance, InstanceKey, ProbeSpec, ServiceKey};
    use gangway_store::MemoryStore;
    use tokio::time::Instant;

    use crate::config::Config;
    use crate::engine::{LivenessRequest, Registry};
    use crate::error::ApiError;

    fn registry() -> Registry {
        let mut prometheus = prometheus_client::registry::Registry::default();
        let metrics = crate::metrics::Metrics::register(&mut prometheus);
        Registry::start(
            Arc::new(MemoryStore::default()),
            Config::for_tests(),
            metrics,
        )
        .unwrap()
    }

    #[tokio::test]
    async fn close_stops_probes_releases_the_store_and_refuses_writes() {
        let r = registry();
        let svc = ServiceKey::named("stock");
        let probe = LivenessRequest::Probe(ProbeSpec::default());
        let instance = Instance::new(InstanceKey::new("127.0.0.1", 9, ""));
        r.register(svc.clone(), instance, probe.clone())
            .await
            .unwrap();
        assert_eq!(r.inner.probes.lock().unwrap().len(), 1);
        let stopping = r.stopping();
        assert!(!r.is_closed());

        let report = r.close(Instant::now() + Duration::from_secs(1)).await;
        assert_eq!(report.probes_stopped, 1);
        assert!(
            report.writes_finished && report.store_released,
            "{report:?}"
        );
        assert!(r.is_closed());
        tokio::time::timeout(Duration::from_secs(1), stopping)
            .await
            .expect("close holds pushes, which ends what waits on stopping()");

        // Reads still answer; writes fail with the store error and change nothing.
        let other = Instance::new(InstanceKey::new("127.0.0.1", 10, ""));
        let refused = r.register(svc.clone(), other, probe).await;
        match refused {
            Err(ApiError::Store(message)) => assert!(message.contains("stopping"), "{message}"),
            other => panic!("expected a store error, got {other:?}"),
        }
        assert_eq!(r.entries(&svc).1.len(), 1);
        assert!(r.inner.probes.lock().unwrap().is_empty());

        let again = r.close(Instant::now()).await;
        assert!(!again.store_released, "closing twice releases nothing more");
    }

    #[tokio::test]
    async fn sessions_ending_during_a_stop_publish_nothing() {
        let r = registry();
        let svc = ServiceKey::named("fleet");
        let mut sessions = Vec::new();
        for i in 1..=3 {
            let id = r.open_session("peer".into(), "c".into(), format!("c{i}"));
            let instance = Instance::new(InstanceKey::new(&format!("10.0.0.{i}"), 80, ""));
            r.register(svc.clone(), instance, LivenessRequest::Session(id.clone()))
                .await
                .unwrap();
            sessions.push(id);
        }
        let before = r.view(&svc);
        r.close_session(&sessions[0]);
        let normal = r.view(&svc);
        assert_eq!(
            normal.instances.len(),
            2,
            "a session ending normally takes its instance"
        );
        assert!(normal.revision > before.revision);
        r.hold_pushes();
        for id in &sessions[1..] {
            r.close_session(id);
        }
        let after = r.view(&svc);
        assert_eq!(r.session_count(), 0);
        assert_eq!(
            after.instances.len(),
            2,
            "kept: nothing is published any more"
        );
        assert_eq!(
            after.revision, normal.revision,
            "no revision while stopping"
        );
    }
}
