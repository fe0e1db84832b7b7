//! The proxy's own Prometheus metrics, registered explicitly beside the client crate's
//! (`gangway_outlier_*`, `gangway_http_attempts_total`).
//!
//! | name | type | labels |
//! |---|---|---|
//! | `gangway_proxy_requests_total` | counter | `service`, `status` |
//! | `gangway_proxy_errors_total` | counter | `service`, `error` (the proxy's own answers, [`ProxyError::code`](crate::error::ProxyError::code)) |
//! | `gangway_proxy_request_duration_seconds` | histogram | `service` (request in to answer head out) |
//! | `gangway_proxy_connections` | gauge | downstream connections open |
//! | `gangway_proxy_config_reloads_total` | counter | `result` (`ok`, `failed`) |
//!
//! `service` is `namespace/group/service`, empty when the request named none.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of the request counter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RequestLabels {
    /// `namespace/group/service`, or empty.
    pub service: String,
    /// The answer's status code.
    pub status: u16,
}

/// Labels of the error counter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ErrorLabels {
    /// `namespace/group/service`, or empty.
    pub service: String,
    /// The error code.
    pub error: String,
}

/// Labels with only the service.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ServiceLabels {
    /// `namespace/group/service`, or empty.
    pub service: String,
}

/// Labels of the reload counter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ReloadLabels {
    /// `ok` or `failed`.
    pub result: String,
}

fn latency_histogram() -> Histogram {
    // 100 µs to about 3.3 s.
    Histogram::new(exponential_buckets(0.000_1, 2.0, 16))
}

/// The proxy's metrics; clones update the same series. [`ProxyMetrics::default`] counts
/// without exporting.
#[derive(Debug, Clone)]
pub struct ProxyMetrics {
    /// Answers by service and status.
    pub requests: Family<RequestLabels, Counter>,
    /// The proxy's own error answers by service and code.
    pub errors: Family<ErrorLabels, Counter>,
    /// Time to the answer's head, by service.
    pub duration: Family<ServiceLabels, Histogram, fn() -> Histogram>,
    /// Downstream connections open.
    pub connections: Gauge,
    /// Config reloads by result.
    pub reloads: Family<ReloadLabels, Counter>,
}

impl Default for ProxyMetrics {
    fn default() -> Self {
        Self {
            requests: Family::default(),
            errors: Family::default(),
            duration: Family::new_with_constructor(latency_histogram),
            connections: Gauge::default(),
            reloads: Family::default(),
        }
    }
}

impl ProxyMetrics {
    /// Creates the metrics and registers them in `registry` under `gangway_proxy_`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        let r = registry.sub_registry_with_prefix("gangway_proxy");
        r.register(
            "requests",
            "Answers by service and status",
            m.requests.clone(),
        );
        r.register(
            "errors",
            "Answers the proxy made itself, by service and error code",
            m.errors.clone(),
        );
        r.register(
            "request_duration_seconds",
            "Time from the request to the answer's head",
            m.duration.clone(),
        );
        r.register(
            "connections",
            "Downstream connections open",
            m.connections.clone(),
        );
        r.register(
            "config_reloads",
            "Config reloads by result",
            m.reloads.clone(),
        );
        m
    }

    pub(crate) fn request(&self, service: &str, status: u16, took: Duration) {
        self.requests
            .get_or_create(&RequestLabels {
                service: service.to_owned(),
                status,
            })
            .inc();
        self.duration
            .get_or_create(&ServiceLabels {
                service: service.to_owned(),
            })
            .observe(took.as_secs_f64());
    }

    pub(crate) fn error(&self, service: &str, code: &str) {
        self.errors
            .get_or_create(&ErrorLabels {
                service: service.to_owned(),
                error: code.to_owned(),
            })
            .inc();
    }

    pub(crate) fn reload(&self, ok: bool) {
        self.reloads
            .get_or_create(&ReloadLabels {
                result: if ok { "ok" } else { "failed" }.to_owned(),
            })
            .inc();
    }
}
