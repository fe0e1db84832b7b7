//! Outlier ejection as a tower layer around each per-instance service (DESIGN §5, issue 3 §3).
//!
//! [`Ejection`] wraps the service [`ViewDiscover`](super::ViewDiscover)'s `make` builds for
//! one instance. It
//! - **records** the outcome of every call into a shared
//!   [`OutlierDetector`](crate::outlier::OutlierDetector) (one per service), as the
//!   [`Classify`](super::Classify) classifier sees it (see
//!   [`outcome_of`](super::outcome_of)); the detector decides when the instance is ejected;
//! - **gates readiness**: while its instance is ejected, `poll_ready` returns `Pending`.
//!
//! # Why `Pending`, not an error
//!
//! tower's p2c `Balance` only picks among services whose `poll_ready` returned `Ready(Ok)`.
//! A service that returns an error is *dropped* from the balancer for good (until discovery
//! inserts its key again), so an ejected instance could never come back. A `Pending` service
//! stays in the balancer's pending set and is polled again when its waker fires: the
//! `Ejection` arms a timer for the instance's next recovery check (and re-evaluates at least
//! every [`RECHECK_INTERVAL`], 1 s), so p2c sees it ready again
//! - when its recovery check is due ([`RecoveryCheck::Request`](crate::outlier::RecoveryCheck),
//!   the default): the next request p2c sends to it is the probe, and its outcome decides;
//! - when a TCP check recovered it ([`RecoveryCheck::TcpConnect`](crate::outlier::RecoveryCheck):
//!   run [`OutlierDetector::due_tcp_checks`](crate::outlier::OutlierDetector::due_tcp_checks)
//!   yourself);
//! - when every pickable instance of the view is ejected (fail open, as
//!   [`OutlierDetector::admit`](crate::outlier::OutlierDetector::admit)): ejection never
//!   leaves a service without instances.
//!
//! The detector already bounds ejection (at most `floor(n x max_ejection_ratio)`, never the
//! last instance), so the balancer always keeps ready services while the view is stable.
//!
//! A `Discover` wrapper that removes ejected instances and inserts them back was the other
//! option; it throws the instance's connections away on every ejection and cannot send the
//! recovery probe through the balancer, so the readiness gate was preferred.

mod future;
mod layer;
mod service;
#[cfg(test)]
mod tests;

pub use future::ResponseFuture;
pub use layer::EjectionLayer;
pub use service::{Ejection, RECHECK_INTERVAL};
