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

use tokio::time::Instant;

use super::Registry;

/// What [`Registry::close`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloseReport {
    /// Probe tasks stopped.
    pub probes_stopped: usize,
    /// The group commit in flight finished and the store was dropped before the deadline, so
    /// its file lock is free now (false: a batch was still being written; it completes or
    /// fails atomically on its own, and drops the store when it ends).
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

    /// True once [`Registry::close`] ran: background work stopped, writes refused.
    pub fn is_closed(&self) -> bool {
        self.inner.committer.is_closing()
    }

    /// Closes the engine, the last step of a server stop: holds back every push (if
    /// [`Registry::hold_pushes`] was not called yet), stops the probes and the background timer
    /// (lease, mark and poller expiry), lets the group commit in flight finish (writes are
    /// fsync'd before they are acknowledged, so nothing else needs flushing), refuses later
    /// writes, and drops the store, which releases its file lock; waits until `deadline` at
    /// most.
    ///
    /// Afterwards the in-memory state still answers reads, and every write fails with
    /// [`RegistryError::Internal`](super::RegistryError::Internal). Idempotent. Cancel-safe:
    /// dropping the future leaves the close under way.
    pub async fn close(&self, deadline: Instant) -> CloseReport {
        self.hold_pushes();
        let probes: Vec<tokio::task::AbortHandle> = {
            let mut probes = self.inner.probes.lock().unwrap_or_else(|p| p.into_inner());
            probes.drain().map(|(_, task)| task).collect()
        };
        for task in &probes {
            task.abort();
        }
        let store_released = self.inner.committer.close(deadline).await;
        tracing::info!(probes = probes.len(), store_released, "engine closed");
        CloseReport {
            probes_stopped: probes.len(),
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
    use crate::engine::{LivenessRequest, Registry, RegistryError};

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
        assert!(report.store_released, "{report:?}");
        assert!(r.is_closed());
        tokio::time::timeout(Duration::from_secs(1), stopping)
            .await
            .expect("close holds pushes, which ends what waits on stopping()");

        // Reads still answer; writes fail with the store error and change nothing.
        let other = Instance::new(InstanceKey::new("127.0.0.1", 10, ""));
        let refused = r.register(svc.clone(), other, probe).await;
        match refused {
            Err(RegistryError::Internal(message)) => {
                assert!(message.contains("stopping"), "{message}")
            }
            other => panic!("expected a store error, got {other:?}"),
        }
        assert_eq!(r.entries(&svc).1.len(), 1);
        assert!(r.inner.probes.lock().unwrap().is_empty());

        let again = r.close(Instant::now() + Duration::from_secs(1)).await;
        assert!(again.store_released, "closing twice is harmless");
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
