//! The gangway retry rules as a tower layer, for HTTP services (DESIGN §5, issue 3 §2).
//!
//! [`RetryLayer`] wraps a service of requests that can be replayed ([`Replay`]:
//! `http::Request<B>` with `B: Clone`, e.g. `Full<Bytes>` or `String`, or a
//! `reqwest::Request` with a buffered body). A failed attempt, as the
//! [`Classify`](super::Classify) classifier sees it, is sent again when
//! - [`may_retry`](crate::retry::may_retry) allows it: connection-level failures always,
//!   after-send failures and 502/503/504 only for idempotent requests (the method, or an
//!   [`Idempotent`] request extension);
//! - fewer than [`RetryConfig::max_attempts`](crate::retry::RetryConfig::max_attempts)
//!   attempts were made (default 2, the first included);
//! - the shared [`RetryBudget`](crate::retry::RetryBudget) has a retry left (20 % of
//!   requests over 10 s, at least 10 retries/s, by default).
//!
//! Every response carries an [`Attempts`] extension: how many attempts it took (1 = no
//! retry); only a request that cannot be replayed (a `reqwest::Request` with a streaming
//! body) is sent once and answered without it. Errors are returned as the inner service gave
//! them.
//!
//! The retry is immediate and goes back through the inner service, so put the balancer
//! *below* this layer (`Retry<Buffer<Balance<..>>>`): each attempt is a fresh pick. tower's
//! p2c does not know which instance failed, so a retry may land on the same one; with an
//! [`EjectionLayer`](super::EjectionLayer) per instance a failing instance stops being picked
//! once ejected. (The crate's [`HttpClient`](crate::http::HttpClient) excludes tried
//! instances itself.) `RetryConfig::per_try_timeout` is not applied here: add a
//! `tower::timeout::TimeoutLayer` below this layer.
//!
//! `tower::retry::Retry` needs a `Clone` inner service: wrap a `Balance` in a
//! `tower::buffer::Buffer`.

mod future;
mod layer;
mod policy;
mod service;
#[cfg(test)]
mod tests;

pub use future::ResponseFuture;
pub use layer::RetryLayer;
pub use policy::{Attempts, Idempotent, Policy, RecordAttempts, Replay};
pub use service::Retry;
