//! `gangway lab`: measure what an instance leaving costs, with real processes.
//!
//! One **scenario** ([`scenario::run`]) starts a registry in this process, N `gangway
//! demo-service` children and one consumer that sends an **open-loop** rate
//! ([`load::run_load_at`]) round robin through its cached view; at a fixed time one instance
//! leaves (crash, freeze, deregister then kill or graceful exit, drain). The registry is either
//! **classic** (REST leases with lazy expiry, a consumer that pulls every R: [`classic`]) or
//! **gangway** (sessions, push with acks). Every request is recorded; [`report`] turns the
//! results into the suite tables, a JSON file with one record per request, and SVG timelines.
//! [`suite`] holds the default suite (four tables), [`liveness`] the registry-side suite,
//! [`rollout`] rolling restarts by strategy (kill, deregister + sleep, `gangway run`),
//! [`cold_start`] an instance joining cold (registered at once, ready-gated, with warm-up), and
//! [`cli`] the `gangway lab` flags. docs/lab.md explains the tables.
//!
//! The load generator works with any view source, for example a fixed list:
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use gangway_client::http::{HttpClient, HttpConfig};
//! use gangway_core::{ServiceKey, View};
//! use gangway_lab::load::{Schedule, run_load};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> anyhow::Result<()> {
//! let schedule = Schedule { rate: 60.0, duration: Duration::from_secs(8) };
//! assert_eq!(schedule.total(), 480);
//! assert_eq!(schedule.at(30), Duration::from_millis(500)); // fixed in advance: open loop
//!
//! // No instance in the view: every request fails with "no instance", on schedule.
//! let empty = View { revision: 1, instances: vec![], protection_triggered: false };
//! let (_tx, rx) = tokio::sync::watch::channel(Arc::new(empty));
//! let http = HttpClient::from_views(vec![(ServiceKey::named("orders"), rx.clone())],
//!                                   HttpConfig::default())?;
//! let short = Schedule { rate: 100.0, duration: Duration::from_millis(50) };
//! let report = run_load(&http, "orders", rx, short, |_| {}).await?;
//! assert_eq!((report.sent, report.failed), (5, 5));
//! assert_eq!(report.requests[0].error.as_deref(), Some("no instance"));
//! # Ok(())
//! # }
//! ```

pub mod classic;
pub mod cli;
pub mod cold_start;
pub mod fleet;
pub mod liveness;
pub mod load;
pub mod process;
pub mod report;
pub mod rollout;
pub mod scenario;
pub mod suite;
