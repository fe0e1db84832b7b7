//! One module per family of parsers; each has a `run` that drives the loop of [`crate::Runner`].

pub mod cli;
pub mod grpc;
pub mod rest;
