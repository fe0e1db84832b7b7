//! Connection metrics of both ports, labelled `port="http"` or `port="grpc"`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry as PromRegistry;

/// The label of every connection metric.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct PortLabel {
    /// `http` or `grpc`.
    pub port: &'static str,
}

/// Connection metrics.
#[derive(Clone, Default)]
pub struct ConnectionMetrics {
    /// Open connections (refused ones not included).
    pub open: Family<PortLabel, Gauge>,
    /// Connections refused because the port held its maximum.
    pub refused: Family<PortLabel, Counter>,
    /// Connections closed for waiting too long (header, idle or handshake timeout).
    pub timed_out: Family<PortLabel, Counter>,
    /// Request heads refused for their size (414, 431).
    pub heads_refused: Family<PortLabel, Counter>,
    /// Failed accepts (for example EMFILE: out of file descriptors).
    pub accept_errors: Family<PortLabel, Counter>,
    /// TLS handshakes that failed: a plain-text client, no or an untrusted client
    /// certificate, no common protocol version or ALPN protocol (TLS ports only).
    pub tls_failed: Family<PortLabel, Counter>,
}

impl ConnectionMetrics {
    /// Creates the metrics and registers them in `registry` under the `gangway_` prefix.
    pub fn register(registry: &mut PromRegistry) -> Self {
        let m = Self::default();
        let r = registry.sub_registry_with_prefix("gangway");
        r.register("connections", "Open connections", m.open.clone());
        r.register(
            "connections_refused",
            "Connections refused because the port held its maximum",
            m.refused.clone(),
        );
        r.register(
            "connections_timed_out",
            "Connections closed by the header, idle or handshake timeout",
            m.timed_out.clone(),
        );
        r.register(
            "request_heads_refused",
            "Request heads refused for their size (414, 431)",
            m.heads_refused.clone(),
        );
        r.register(
            "accept_errors",
            "Failed accepts (e.g. out of file descriptors)",
            m.accept_errors.clone(),
        );
        r.register(
            "tls_handshake_failures",
            "TLS handshakes that failed (plain-text clients, missing or untrusted client certificates)",
            m.tls_failed.clone(),
        );
        m
    }
}
