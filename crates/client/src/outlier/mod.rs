//! Outlier ejection: a consumer stops sending to instances that fail (DESIGN §5, issue 3 §3).
//!
//! Ejection is local to each consumer and needs no registry round trip. An
//! [`OutlierDetector`] (one per service) ejects an instance on either trigger:
//!
//! - **error rate**: over a sliding [`window`](OutlierConfig::window) (10 s), once the
//!   instance saw at least [`min_request_rate`](OutlierConfig::min_request_rate) (1 req/s, so
//!   10 requests), when the share of errors exceeds
//!   [`error_rate_threshold`](OutlierConfig::error_rate_threshold) (0.5, strictly above).
//!   What an error is: [`ErrorKinds`] (network errors only by default, optionally 5xx);
//! - **consecutive failures**: [`consecutive_failures`](OutlierConfig::consecutive_failures)
//!   (5) connection failures in a row, so a crashed instance goes within a few requests.
//!
//! At most `floor(n x max_ejection_ratio)` (at least one unless the ratio is 0) of the service's `n` instances are ejected at once
//! (ratio 0.2; 6 x 0.6 = 3 may be, 4 x 0.2 = 0.8 means one, as Envoy), and never the last one that is
//! not: both are checked at ejection time.
//!
//! An ejected instance is checked for recovery on a linear schedule: the k-th check comes
//! `recovery_unit x k` after the previous one (30 s, 60 s, 90 s, ...), up to
//! `recovery_unit x max_checks` (10 min), then at that cap ([`RecoverySchedule`]). A check is
//! one real request ([`RecoveryCheck::Request`], default) or a TCP connect made by the caller
//! ([`RecoveryCheck::TcpConnect`]). A passed check returns the instance with a fresh window
//! and a reset schedule. Ejections and recoveries are logged (`tracing` warn / info, with
//! `service`, `instance` and `reason` fields) and counted in [`OutlierMetrics`].
//!
//! The module is pure and clock-driven: no task, no I/O; all time is
//! `tokio::time::Instant`, so it runs on a paused clock in tests.
//!
//! # The request loop
//!
//! ```
//! use gangway_client::outlier::{OutlierConfig, OutlierDetector, Outcome};
//! use gangway_core::model::{Instance, InstanceKey, ServiceKey};
//!
//! # fn main() -> Result<(), gangway_client::Error> {
//! let detector = OutlierDetector::new(ServiceKey::named("payments"), OutlierConfig::default())?;
//! let view: Vec<Instance> = (1..=5)
//!     .map(|i| Instance::new(InstanceKey::new(&format!("10.0.0.{i}"), 8080, "")))
//!     .collect();
//!
//! // On every view change: forget the instances that left.
//! let keys: Vec<InstanceKey> = view.iter().map(|i| i.key.clone()).collect();
//! detector.retain(&keys);
//!
//! // Per request (and per retry attempt): filter, balance, send, record.
//! let candidates = detector.admit(view.iter().collect());
//! let picked = candidates[0]; // your balancer picks among `candidates`
//! let outcome = Outcome::ConnectFailure; // what sending to `picked` gave
//! detector.record(&picked.key, outcome, view.len());
//! # Ok(())
//! # }
//! ```
//!
//! With [`RecoveryCheck::TcpConnect`], also poll [`OutlierDetector::due_tcp_checks`] (say
//! every second), connect to each instance listed and report with
//! [`OutlierDetector::check_result`].

mod config;
mod detector;
mod metrics;
mod outcome;
mod schedule;
mod window;

pub use config::{
    DEFAULT_CHECK_TIMEOUT, DEFAULT_CONSECUTIVE_FAILURES, DEFAULT_ERROR_RATE_THRESHOLD,
    DEFAULT_MAX_CHECKS, DEFAULT_MAX_EJECTION_RATIO, DEFAULT_MIN_REQUEST_RATE,
    DEFAULT_RECOVERY_UNIT, DEFAULT_WINDOW, ErrorKinds, OutlierConfig, RecoveryCheck,
};
pub use detector::OutlierDetector;
pub use metrics::{EjectionLabels, OutlierMetrics, ServiceLabels};
pub use outcome::Outcome;
pub use schedule::{EjectionInfo, EjectionReason, RecoverySchedule};

#[cfg(test)]
mod properties;
#[cfg(test)]
mod tests;
