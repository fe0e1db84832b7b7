//! gangway's native gRPC protocol, generated from `proto/gangway.proto` at build time with
//! protox (no `protoc` needed).
//!
//! One bidirectional `Registry/Session` stream per client process carries the session's
//! registrations, its subscriptions, the server's pushes and the client's acks.

#![allow(missing_docs, clippy::all)]

/// Generated messages and the `Registry` client and server.
pub mod v1 {
    tonic::include_proto!("gangway.v1");
}
