//! `gangway proxy` (issue 14): a small local HTTP proxy that gives programs in any language
//! the consumer pipeline of the Rust client (DESIGN §5) — no second implementation: each
//! service is served by a [`gangway_client::http::HttpClient`] built with that service's
//! settings, so subscription (pushes, acks, pull fallback), balancing, safe retry within a
//! budget, outlier ejection, per-instance pools and the draining header are the client's.
//!
//! - [`config`]: the TOML file (`[defaults]`, `[services.NAME]`) and the flags; reloaded on
//!   SIGHUP.
//! - [`naming`]: host names to services (`SERVICE[.GROUP[.NAMESPACE]]`).
//! - [`proxy`]: the data plane ([`Proxy::handle`]); [`error`]: its own answers (JSON, 4xx/5xx).
//! - [`admin`]: views, ejections, budgets, counts, `/metrics`; [`metrics`]: its series.
//! - [`server`]: listeners, signals, drain on SIGTERM ([`run`]).
//!
//! The proxy in a test, over fixed views instead of a registry:
//!
//! ```
//! use std::sync::Arc;
//!
//! use gangway_core::model::ServiceKey;
//! use gangway_core::view::View;
//! use gangway_proxy::config::{Config, Overrides};
//! use gangway_proxy::metrics::ProxyMetrics;
//! use gangway_proxy::{Proxy, Source};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let config = Config::from_overrides(&Overrides::default()).unwrap();
//! let view = View { revision: 1, instances: vec![], protection_triggered: false };
//! let (_tx, rx) = tokio::sync::watch::channel(Arc::new(view));
//! let proxy = Proxy::new(
//!     Source::Views(vec![(ServiceKey::named("orders"), rx)]),
//!     config.routing.clone(),
//!     ProxyMetrics::default(),
//!     Default::default(),
//!     Default::default(),
//! );
//! let request = http::Request::get("http://orders/x").body(http_body_util::Empty::<bytes::Bytes>::new()).unwrap();
//! let answer = proxy.handle(request).await;
//! assert_eq!(answer.status(), 503); // orders has no serving instance
//! assert_eq!(answer.headers()["x-gangway-error"], "no_instance");
//! # }
//! ```
//!
//! Setup, every setting with its default, the admin answers and the measured overhead beside
//! HAProxy: `docs/proxy.md`.

pub mod admin;
pub mod cli;
pub mod config;
pub mod error;
pub mod metrics;
pub mod naming;
pub mod proxy;
pub mod server;

pub use cli::ProxyArgs;
pub use proxy::{Proxy, Source};
pub use server::{RunOptions, run};
