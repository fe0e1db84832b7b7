//! In-band draining for providers (DESIGN §4, "belt and braces"): once a drain starts, every
//! response says so, so a consumer whose ack is late still stops sending new requests here.
//!
//! [`DrainSignal`] is the switch, shared by the server stack and the shutdown code;
//! [`DrainingLayer`] wraps the application's service. From the moment
//! [`DrainSignal::start`] is called, each response that leaves the service (including those of
//! requests that arrived earlier) carries
//! - the [`DRAINING_HEADER`](crate::http::DRAINING_HEADER) (`x-gangway-draining: 1`): the
//!   gangway HTTP client then skips the instance for 30 s and drops its pooled connections,
//!   whatever its cached view says;
//! - `Connection: close` on HTTP/1.x responses, so that the client does not reuse the
//!   keep-alive connection (hyper closes it after the response). HTTP/2 forbids that header;
//!   there the server ends the connection with GOAWAY, which hyper sends when the connection's
//!   graceful shutdown starts: pass [`DrainSignal::started`] to it (hyper-util's
//!   `GracefulShutdown::watch` or axum's `with_graceful_shutdown` once the drain completed).
//!
//! The sequence a provider runs on SIGTERM: `signal.start()`, then
//! [`Registration::drain`](crate::Registration::drain) (offline + every subscriber's ack), then
//! stop accepting, finish in-flight requests, exit.
//!
//! ```
//! use gangway_client::tower::{DrainSignal, DrainingLayer};
//! use tower::{Layer, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let signal = DrainSignal::new();
//! let app = tower::service_fn(|_: http::Request<()>| async {
//!     Ok::<_, std::convert::Infallible>(http::Response::new("pong"))
//! });
//! let svc = DrainingLayer::new(signal.clone()).layer(app);
//! signal.start();
//! let response = svc.oneshot(http::Request::new(())).await.unwrap();
//! assert_eq!(response.headers()["x-gangway-draining"], "1");
//! assert_eq!(response.headers()["connection"], "close");
//! # }
//! ```

mod future;
mod layer;
mod service;
#[cfg(test)]
mod tests;

pub use future::ResponseFuture;
pub use layer::{DrainSignal, DrainingLayer};
pub use service::Draining;
