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

/// The Nacos 2.x/3.x SDK gRPC protocol (`Payload` with a JSON body, dispatched on
/// `Metadata.type`): the `Request` and `BiRequestStream` services, which have no proto package.
#[allow(non_camel_case_types)]
pub mod nacos {
    tonic::include_proto!("_");
}
