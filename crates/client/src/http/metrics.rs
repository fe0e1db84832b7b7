//! Prometheus metrics of the HTTP client's attempts, registered explicitly (no global
//! recorder).

use gangway_core::model::InstanceKey;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::outlier::Outcome;

/// Labels of the attempt counter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct AttemptLabels {
    /// `namespace/group/service`.
    pub service: String,
    /// The instance's `ip:port`.
    pub instance: String,
    /// [`Outcome::as_str`]: `success`, `connect_failure`, `network_error` or `server_error`.
    pub outcome: String,
}

/// Attempts of every [`HttpClient`](super::HttpClient) request, per service, instance and
/// outcome: a retried request counts once per attempt, on the instance each attempt went to,
/// so an instance that refuses connections shows its errors even when every request
/// succeeded on a retry.
///
/// Cloning is cheap and clones update the same series; [`AttemptMetrics::default`] counts
/// without exporting.
///
/// | name (after [`register`](Self::register)) | type | labels |
/// |---|---|---|
/// | `gangway_http_attempts_total` | counter | `service`, `instance`, `outcome` |
#[derive(Debug, Clone, Default)]
pub struct AttemptMetrics {
    /// Attempts by service, instance and outcome.
    pub attempts: Family<AttemptLabels, Counter>,
}

impl AttemptMetrics {
    /// Creates the metrics and registers them in `registry` under the `gangway_http_` prefix.
    /// Call once per registry; clients share the result.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.sub_registry_with_prefix("gangway_http").register(
            "attempts",
            "HTTP attempts by service, instance and outcome (retries count once each)",
            metrics.attempts.clone(),
        );
        metrics
    }

    /// Attempts so far to `instance` of `service` (`namespace/group/service`) that ended with
    /// `outcome`.
    pub fn count(&self, service: &str, instance: &InstanceKey, outcome: Outcome) -> u64 {
        self.attempts
            .get_or_create(&labels(service, instance, outcome))
            .get()
    }

    pub(crate) fn record(&self, service: &str, instance: &InstanceKey, outcome: Outcome) {
        self.attempts
            .get_or_create(&labels(service, instance, outcome))
            .inc();
    }
}

fn labels(service: &str, instance: &InstanceKey, outcome: Outcome) -> AttemptLabels {
    AttemptLabels {
        service: service.to_owned(),
        instance: instance.addr(),
        outcome: outcome.as_str().to_owned(),
    }
}
