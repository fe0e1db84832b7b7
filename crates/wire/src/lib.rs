//! What crosses gangway's wire, written once (STYLE: "a type that crosses the wire is written
//! once"):
//!
//! - [`rest`]: the REST API's request and response bodies (docs/api.md), sent and parsed by the
//!   server's handlers and read by every REST caller;
//! - [`ErrorCode`], [`ErrorDetail`], [`ErrorBody`]: the stable error codes and the refusal's
//!   shape, the same on REST and in the native protocol's `Reply`;
//! - [`proto`]: the conversions between the domain (`gangway_core`) and the native protocol's
//!   messages (`gangway_proto`), for the server, the Rust client and the bench;
//! - `client` (feature `client`): the typed async REST client of the CLI, the lab and the bench.
//!
//! Dependencies point inward: this crate knows the domain and the protocol, nothing of axum or
//! tonic's servers; the server, the SDK and the tools depend on it.
//!
//! ```
//! use gangway_wire::rest::RegisterRequest;
//! use gangway_wire::{ErrorBody, ErrorCode};
//!
//! // A registration that leaves the lease to the registry's defaults sends only what is set.
//! let body = RegisterRequest {
//!     ip: "10.0.0.5".into(),
//!     port: 8080,
//!     ..Default::default()
//! };
//! assert_eq!(serde_json::to_string(&body).unwrap(), r#"{"ip":"10.0.0.5","port":8080}"#);
//!
//! // A refusal reads back with its stable code.
//! let refusal: ErrorBody = serde_json::from_str(
//!     r#"{"error":{"code":"conflict","message":"last serving instance","field":null}}"#,
//! )
//! .unwrap();
//! assert_eq!(refusal.error.code, ErrorCode::Conflict);
//! assert_eq!(refusal.error.code.http_status(), 409);
//! ```

#[cfg(feature = "client")]
pub mod client;
mod error;
pub mod proto;
pub mod rest;

pub use error::{ErrorBody, ErrorCode, ErrorDetail};
