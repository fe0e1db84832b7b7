//! tower integration (DESIGN §5, issue 3 §5): plug gangway into a hyper, reqwest or tonic
//! stack with a few lines.
//!
//! - [`ViewDiscover`]: a `tower::discover::Discover` of a subscription's pickable instances,
//!   for `tower::balance::p2c::Balance`; [`tonic_endpoints`] and [`balance_channel`] feed
//!   tonic's `Channel::balance_channel` the same way.
//! - [`RetryLayer`] / [`Retry`]: the gangway retry rules (connect failures always, others only
//!   when idempotent, at most `max_attempts`, within a [`RetryBudget`](crate::retry::RetryBudget));
//!   responses carry an [`Attempts`] extension.
//! - [`EjectionLayer`] / [`Ejection`]: per-instance outcome recording into an
//!   [`OutlierDetector`](crate::outlier::OutlierDetector), and a readiness gate that keeps an
//!   ejected instance out of p2c's picks until its recovery check is due.
//! - [`Classify`] / [`DefaultClassify`]: how a result maps to a
//!   [`Failure`](crate::retry::Failure), shared by both layers.
//! - [`balanced`]: the whole stack below in one call.
//! - [`DrainingLayer`] / [`DrainSignal`]: the provider side, in-band draining (the draining
//!   header and `Connection: close` on every response once the drain started).
//!
//! The stack, outermost first: `Retry` → `Buffer` → p2c `Balance` → `ViewDiscover` of
//! `PendingRequests<Ejection<per-instance client>>`.
//!
//! ```
//! use std::sync::Arc;
//!
//! use gangway_client::Subscription;
//! use gangway_client::outlier::{OutlierConfig, OutlierDetector};
//! use gangway_client::retry::RetryConfig;
//! use gangway_client::tower::{EjectionLayer, RetryLayer, ViewDiscover};
//! use tower::balance::p2c::Balance;
//! use tower::buffer::Buffer;
//! use tower::load::{CompleteOnResponse, PendingRequestsDiscover};
//! use tower::{BoxError, Layer, Service, ServiceBuilder};
//!
//! # fn per_instance_client(_: &gangway_core::model::Instance)
//! #     -> impl Service<http::Request<String>, Response = http::Response<String>, Error = std::io::Error, Future: Send> + Send + use<>
//! # { tower::service_fn(|_: http::Request<String>| async { Ok(http::Response::new(String::new())) }) }
//! fn orders_stack(
//!     orders: &Subscription,
//! ) -> Result<
//!     impl Service<http::Request<String>, Response = http::Response<String>, Error = BoxError>,
//!     gangway_client::Error,
//! > {
//!     let detector = Arc::new(OutlierDetector::new(orders.service().clone(), OutlierConfig::default())?);
//!     let views = orders.receiver();
//!     let discover = ViewDiscover::new(orders, {
//!         let detector = detector.clone();
//!         move |instance| {
//!             EjectionLayer::new(detector.clone(), views.clone(), instance)
//!                 .layer(per_instance_client(instance))
//!         }
//!     })
//!     .with_detector(detector);
//!     let balance = Balance::new(PendingRequestsDiscover::new(discover, CompleteOnResponse::default()));
//!     Ok(ServiceBuilder::new()
//!         .layer(RetryLayer::new(&RetryConfig::default()))
//!         .service(Buffer::new(balance, 1024)))
//! }
//! ```
//!
//! Long-form examples (hyper-util, reqwest, tonic): `docs/tower.md`.

mod classify;
mod discover;
pub mod draining;
pub mod ejection;
pub mod retry;
mod stack;

pub use classify::{AsStdError, Classify, DefaultClassify, HasStatus, classify_error, outcome_of};
pub use discover::{Rebuild, ViewDiscover, balance_channel, tonic_endpoints};
pub use draining::{DrainSignal, Draining, DrainingLayer};
pub use ejection::{Ejection, EjectionLayer};
pub use retry::{Attempts, Idempotent, Retry, RetryLayer};
pub use stack::{Balanced, DEFAULT_BUFFER, StackConfig, balanced};

/// Compiles the examples of `docs/tower.md` as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../../../docs/tower.md")]
pub struct TowerDocs;

#[cfg(test)]
mod tests;
