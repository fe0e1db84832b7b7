//! An HTTP client that resolves `http://<service>/path` through a subscription and applies the
//! whole consumer pipeline of DESIGN §5 (issue #3):
//!
//! subscription (pushed view) -> balancer -> retry on another instance (connect failures
//! always, others only when idempotent, within a budget) -> outlier ejection (local) ->
//! one connection pool per instance (idle timeout; the pool of an instance that leaves the
//! view, is ejected or answers "draining" is dropped, so its idle connections close and none
//! is reused, while requests already in flight finish).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use gangway_client::http::{HttpClient, HttpConfig};
//! use gangway_client::{Client, ClientConfig};
//!
//! let registry = Client::connect(ClientConfig::new("127.0.0.1:9848")).await?;
//! let http = HttpClient::new(registry, HttpConfig::default())?;
//! let response = http.get("http://orders/api/v1/orders/42").await?;
//! println!("{} after {} attempt(s) on {}", response.status, response.attempts, response.instance);
//! # Ok(()) }
//! ```

mod client;
mod config;
mod error;
mod metrics;
mod target;

pub use client::{
    DRAINING_HEADER, HttpClient, HttpRequest, HttpResponse, ResponseBody, ServiceState,
    StreamingResponse,
};
pub use config::{
    BalancerKind, DEFAULT_ATTEMPT_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_FIRST_VIEW_WAIT,
    DEFAULT_POOL_IDLE_TIMEOUT, DRAINING_HOLD, HttpConfig,
};
pub use error::RequestError;
pub use metrics::{AttemptLabels, AttemptMetrics};
