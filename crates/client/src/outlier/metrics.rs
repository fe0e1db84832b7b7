//! Prometheus metrics of outlier ejection, registered explicitly (no global recorder).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::EjectionReason;

/// Labels of the ejection counter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct EjectionLabels {
    /// `namespace/group/service`.
    pub service: String,
    /// `error_rate` or `consecutive` ([`EjectionReason::as_str`]).
    pub reason: String,
}

/// Labels of the per-service recovery counter and ejected gauge.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ServiceLabels {
    /// `namespace/group/service`.
    pub service: String,
}

/// Outlier-ejection metrics, shared by the detectors of every service of a process.
///
/// Cloning is cheap and clones update the same series. [`OutlierMetrics::default`] gives
/// unregistered metrics (counted, never exported).
///
/// | name (after [`register`](Self::register)) | type | labels |
/// |---|---|---|
/// | `gangway_outlier_ejections_total` | counter | `service`, `reason` |
/// | `gangway_outlier_recoveries_total` | counter | `service` |
/// | `gangway_outlier_ejected` | gauge | `service` |
#[derive(Debug, Clone, Default)]
pub struct OutlierMetrics {
    /// Ejections by service and reason.
    pub ejections: Family<EjectionLabels, Counter>,
    /// Ejected instances that passed a recovery check and returned.
    pub recoveries: Family<ServiceLabels, Counter>,
    /// Instances ejected right now. Incremented on ejection, decremented on recovery, when an
    /// ejected instance leaves the view, and when its detector is dropped.
    pub ejected: Family<ServiceLabels, Gauge>,
}

impl OutlierMetrics {
    /// Creates the metrics and registers them in `registry` under the `gangway_outlier_`
    /// prefix (see the table above). Call once per registry; detectors share the result.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        let r = registry.sub_registry_with_prefix("gangway_outlier");
        r.register(
            "ejections",
            "Instances ejected by outlier detection, by reason",
            metrics.ejections.clone(),
        );
        r.register(
            "recoveries",
            "Ejected instances that passed a recovery check",
            metrics.recoveries.clone(),
        );
        r.register(
            "ejected",
            "Instances currently ejected by outlier detection",
            metrics.ejected.clone(),
        );
        metrics
    }

    pub(crate) fn ejection(&self, service: &str, reason: EjectionReason) {
        self.ejections
            .get_or_create(&EjectionLabels {
                service: service.to_owned(),
                reason: reason.as_str().to_owned(),
            })
            .inc();
        self.ejected_gauge(service).inc();
    }

    pub(crate) fn recovery(&self, service: &str) {
        self.recoveries
            .get_or_create(&ServiceLabels {
                service: service.to_owned(),
            })
            .inc();
        self.ejected_gauge(service).dec();
    }

    pub(crate) fn forgotten(&self, service: &str, count: usize) {
        if count > 0 {
            self.ejected_gauge(service)
                .dec_by(i64::try_from(count).unwrap_or(i64::MAX));
        }
    }

    fn ejected_gauge(&self, service: &str) -> Gauge {
        self.ejected
            .get_or_create(&ServiceLabels {
                service: service.to_owned(),
            })
            .clone()
    }
}
