//! The demo programs: `demo-service` (a small HTTP service that registers itself and drains
//! on SIGTERM), `demo-client` (an open-loop load generator that routes through a
//! subscription), and `demo` (both, plus a registry, running a rolling restart).

pub mod client;
pub mod pipeline;
pub mod rolling;
pub mod service;
