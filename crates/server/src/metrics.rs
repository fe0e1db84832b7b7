//! Prometheus metrics, registered explicitly (no global recorder). Gauges that describe state
//! (instances by service and state, sessions, leases, subscribers) are computed at scrape time.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry as PromRegistry;

/// Labels of the per-service instance gauge.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct InstanceLabels {
    /// `namespace/group/service`.
    pub service: String,
    /// `serving`, `unhealthy`, `offline` or `zero_weight`.
    pub state: String,
}

/// Every metric of the server.
#[derive(Clone)]
pub struct Metrics {
    /// Instances by service and state.
    pub instances: Family<InstanceLabels, Gauge>,
    /// Live sessions.
    pub sessions: Gauge,
    /// Sessions opened since start.
    pub sessions_opened: Counter,
    /// Lease-kept instances.
    pub leases: Gauge,
    /// Live subscribers.
    pub subscribers: Gauge,
    /// Snapshots pushed (including resends).
    pub pushes_sent: Counter,
    /// Unacked snapshots re-sent.
    pub pushes_resent: Counter,
    /// Acks received.
    pub pushes_acked: Counter,
    /// Seconds from a push to its ack.
    pub push_to_ack: Histogram,
    /// Drains started.
    pub drains_started: Counter,
    /// Drains that saw every ack.
    pub drains_complete: Counter,
    /// Drains ended by their timeout.
    pub drains_timed_out: Counter,
    /// Seconds drains waited.
    pub drain_wait: Histogram,
    /// Stalls of the registry itself (its clock jumped; see `engine::hold`).
    pub stalls: Counter,
    /// Scans of a service's subscriber table by a waiting drain or readiness wait (one per
    /// wake-up): the cost of ack bookkeeping.
    pub ack_wait_scans: Counter,
    /// Pushes sent as deltas (a subset of `pushes_sent`).
    pub pushes_delta: Counter,
    /// Group commits: store transactions, each with one fsync, each holding one or more writes.
    pub store_batches: Counter,
}

impl Metrics {
    /// Creates the metrics and registers them in `registry` under the `gangway_` prefix.
    pub fn register(registry: &mut PromRegistry) -> Self {
        let m = Metrics {
            instances: Family::default(),
            sessions: Gauge::default(),
            sessions_opened: Counter::default(),
            leases: Gauge::default(),
            subscribers: Gauge::default(),
            pushes_sent: Counter::default(),
            pushes_resent: Counter::default(),
            pushes_acked: Counter::default(),
            push_to_ack: Histogram::new(exponential_buckets(0.0001, 2.0, 18)),
            drains_started: Counter::default(),
            drains_complete: Counter::default(),
            drains_timed_out: Counter::default(),
            drain_wait: Histogram::new(exponential_buckets(0.001, 2.0, 18)),
            stalls: Counter::default(),
            ack_wait_scans: Counter::default(),
            pushes_delta: Counter::default(),
            store_batches: Counter::default(),
        };
        let r = registry.sub_registry_with_prefix("gangway");
        r.register(
            "instances",
            "Instances by service and state",
            m.instances.clone(),
        );
        r.register(
            "sessions",
            "Live sessions (gRPC streams)",
            m.sessions.clone(),
        );
        r.register(
            "sessions_opened",
            "Sessions opened since start",
            m.sessions_opened.clone(),
        );
        r.register(
            "leases",
            "Lease-kept (heartbeat) instances",
            m.leases.clone(),
        );
        r.register("subscribers", "Live subscribers", m.subscribers.clone());
        r.register(
            "pushes_sent",
            "Snapshots pushed, resends included",
            m.pushes_sent.clone(),
        );
        r.register(
            "pushes_resent",
            "Unacked snapshots re-sent",
            m.pushes_resent.clone(),
        );
        r.register("pushes_acked", "Acks received", m.pushes_acked.clone());
        r.register(
            "push_to_ack_seconds",
            "Time from a push to its ack",
            m.push_to_ack.clone(),
        );
        r.register("drains_started", "Drains started", m.drains_started.clone());
        r.register(
            "drains_complete",
            "Drains that saw every subscriber ack",
            m.drains_complete.clone(),
        );
        r.register(
            "drains_timed_out",
            "Drains ended by their timeout",
            m.drains_timed_out.clone(),
        );
        r.register(
            "drain_wait_seconds",
            "Time drains waited for acks",
            m.drain_wait.clone(),
        );
        r.register(
            "stalls",
            "Stalls of the registry itself (clock jumped between two ticks)",
            m.stalls.clone(),
        );
        r.register(
            "ack_wait_scans",
            "Subscriber table scans by waiting drains and readiness waits (one per wake-up)",
            m.ack_wait_scans.clone(),
        );
        r.register(
            "pushes_delta",
            "Pushes sent as deltas against the subscriber's acked revision",
            m.pushes_delta.clone(),
        );
        r.register(
            "store_batches",
            "Group commits (one store transaction and one fsync each)",
            m.store_batches.clone(),
        );
        m
    }
}

impl crate::engine::Registry {
    /// Refreshes the state gauges from the registry's current state (call before encoding).
    pub fn refresh_gauges(&self) {
        let metrics = &self.inner.metrics;
        let state = self.lock();
        metrics.instances.clear();
        let mut leases = 0;
        for (key, s) in &state.services {
            for e in s.instances.values() {
                let i = &e.instance;
                let st = i.state_name();
                metrics
                    .instances
                    .get_or_create(&InstanceLabels {
                        service: key.to_string(),
                        state: st.into(),
                    })
                    .inc();
                if matches!(e.liveness, crate::engine::Liveness::Lease(_)) {
                    leases += 1;
                }
            }
        }
        metrics.sessions.set(state.sessions.len() as i64);
        metrics.leases.set(leases);
        metrics.subscribers.set(state.subscribers.len() as i64);
    }
}
