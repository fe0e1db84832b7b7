//! gangway's Rust client SDK (DESIGN §3–§5).
//!
//! One [`Client`] holds one session stream to the registry, to one of the nodes it is given
//! ([`ClientConfig::from_addresses`]; it fails over to the next with backoff, restoring
//! registrations and subscriptions there: docs/cluster.md, "Client failover"). Through it a
//! process
//! - registers its instances ([`Client::register`]); they live as long as the session, are
//!   restored after every reconnect, and leave through [`Registration::deregister`] or an
//!   ack-based [`Registration::drain`]; [`Registration::ready`] tells when every consumer has
//!   learnt of it;
//! - subscribes to services ([`Client::subscribe`]): pushes (with a pull fallback every
//!   [`ClientConfig::refresh`]) feed a `tokio::sync::watch` channel of
//!   [`View`](gangway_core::view::View)s; each applied snapshot is acked so drains know who has
//!   seen what;
//! - picks instances with a [`balance::Balancer`] ([`Subscription::pick`]).
//!
//! ```no_run
//! use std::collections::BTreeMap;
//! use std::time::Duration;
//!
//! use gangway_client::{Client, ClientConfig, balance::SmoothWeighted};
//! use gangway_core::model::{InstanceKey, ServiceKey};
//!
//! # async fn demo() -> Result<(), gangway_client::Error> {
//! let client = Client::connect(ClientConfig::new("127.0.0.1:9848")).await?;
//!
//! // Provider side: register, and on shutdown drain before exiting.
//! let me = client
//!     .register(ServiceKey::named("orders"), InstanceKey::new("10.0.0.7", 8080, ""), 1.0, BTreeMap::new())
//!     .await?;
//!
//! // Consumer side: follow a service and pick instances.
//! let mut payments = client
//!     .subscribe(ServiceKey::named("payments"))
//!     .await?
//!     .with_balancer(SmoothWeighted::new());
//! payments.wait_for(|view| !view.instances.is_empty(), Duration::from_secs(10)).await?;
//! if let Some(instance) = payments.pick() {
//!     println!("call {}", instance.key.addr());
//! }
//!
//! let report = me.drain(Duration::from_secs(35), false).await?;
//! println!("drained in {:?}, complete: {}", report.waited(), report.complete);
//! # Ok(())
//! # }
//! ```

pub mod balance;
mod client;
mod config;
mod error;
pub mod http;
pub mod outlier;
pub mod retry;
mod session;
mod subscription;
pub mod tower;

pub use client::{Client, ReadyReport, Registration, SessionInfo};
pub use config::{
    ClientConfig, ClientIdentity, ClientTls, DEFAULT_BACKOFF_INITIAL, DEFAULT_BACKOFF_MAX,
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_KEEPALIVE_INTERVAL, DEFAULT_KEEPALIVE_TIMEOUT,
    DEFAULT_REFRESH, DEFAULT_REQUEST_TIMEOUT, MAX_ADDRESSES, MAX_DURATION, Token,
};
pub use error::Error;
pub use gangway_core::drain::{DrainReport, SubscriberAck};
pub use gangway_wire::ErrorCode;
pub use subscription::Subscription;
