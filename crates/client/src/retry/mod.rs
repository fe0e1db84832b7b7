//! Safe retry (DESIGN §5, issue #3): which failures may be retried, how often, and a budget
//! that keeps a dead backend from multiplying the load.
//!
//! - **Connection-level failures** ([`Failure::Connect`]: refused, reset before any request
//!   byte was written, connect timeout) are always retried: the request never reached the
//!   application.
//! - **Other failures** ([`Failure::AfterSend`]: timeout or reset after sending;
//!   [`Failure::Status`] 502/503/504) are retried only for idempotent requests (GET, HEAD, PUT,
//!   DELETE, OPTIONS, TRACE, or marked idempotent by the caller; RFC 9110 §9.2.2).
//! - Each attempt goes to a different instance while one is left; at most
//!   [`RetryConfig::max_attempts`] attempts (default 2).
//! - A [`RetryBudget`] caps extra attempts at 20 % of requests over a 10 s window, with a floor
//!   of 10 retries/s (Linkerd's and Finagle's defaults); when it is empty the failure is returned.

mod budget;
mod policy;
#[cfg(test)]
mod tests;

pub use budget::{BudgetStats, RetryBudget};
pub use policy::{Failure, RetryConfig, is_idempotent, may_retry};
