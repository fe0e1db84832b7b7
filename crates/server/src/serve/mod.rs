//! The serving layer of both ports: an accept loop on hyper-util's connection builder, so that
//! every connection is bounded (docs/operations.md, "Connections").
//!
//! - **Counts** ([`accept`]): at most N connections per port (derived from the open-file limit
//!   by default); beyond that a connection gets a clear refusal (REST: 503 with the JSON error
//!   `overloaded`; gRPC: status UNAVAILABLE) and is closed. Accept errors such as EMFILE back
//!   off instead of spinning.
//! - **Time** ([`activity`]): on the REST port a header read timeout and an idle keep-alive
//!   timeout; on the gRPC port a handshake timeout (HTTP/2 keepalive pings, configured on the
//!   builder, cover established connections).
//! - **Size** ([`head`]): HTTP/1 request heads over our limits get the JSON 414 or 431 instead
//!   of hyper's empty ones.
//! - **Stop**: [`Serving::stop_accepting`] closes the listener; [`Serving::finish`] shuts every
//!   connection down gracefully and drops what is left at its deadline.
//!
//! Both ports serve an [`axum::Router`]; the gRPC services come as one through
//! `tonic::service::Routes` (tonic's own server has no connection count, no handshake bound, and
//! an accept loop that retries failed accepts at once).

use std::sync::Arc;

use axum::response::IntoResponse;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::config::{Connections, LivenessTiming};
use crate::error::ApiError;

mod accept;
mod activity;
mod connection;
pub mod head;
mod metrics;
#[cfg(test)]
mod tests;

pub(crate) use accept::caps;
pub use accept::{BACKOFF_MAX, BACKOFF_MIN, REFUSAL_TIME, REFUSALS, raise_fd_limit};
pub use metrics::{ConnectionMetrics, PortLabel};

use activity::Policy;
use connection::PortShared;

/// Where a port is in its stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Accepting and serving.
    Serving,
    /// Not accepting any more; connections are served as usual.
    Closed,
    /// Connections are shut down gracefully; whatever is left at the deadline is dropped.
    Draining(Instant),
}

/// What the stop of one port did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortStop {
    /// Connections that closed by themselves before the deadline.
    pub closed: usize,
    /// Connections dropped at the deadline.
    pub dropped: usize,
}

/// A port being served.
pub(crate) struct Serving {
    phase: watch::Sender<Phase>,
    task: JoinHandle<PortStop>,
}

impl Serving {
    /// Serves the REST API: HTTP/1.1 and HTTP/2 with prior knowledge, under the header and
    /// idle timeouts of `limits`, at most `max` connections.
    pub(crate) fn http(
        listener: TcpListener,
        router: axum::Router,
        limits: &Connections,
        max: usize,
        metrics: ConnectionMetrics,
    ) -> Self {
        let mut builder = auto::Builder::new(TokioExecutor::new());
        // Our own timeouts replace hyper's header read timeout (see `activity`).
        builder.http1().header_read_timeout(None);
        let refusal = http_refusal(format!(
            "the registry holds its maximum of {max} HTTP connections; retry shortly (or raise \
             --http-max-connections)"
        ));
        let per_address = (
            limits.per_address_max,
            http_refusal(per_address_message(limits.per_address_max)),
        );
        let policy = Policy::Http {
            header: limits.http_header_timeout,
            idle: limits.http_idle_timeout,
        };
        Self::spawn(
            listener,
            "http",
            builder,
            router,
            (refusal, per_address),
            policy,
            max,
            metrics,
        )
    }

    /// Serves gRPC: HTTP/2 only, keepalive pings as `liveness` says, the preface within the
    /// handshake timeout of `limits`, at most `max` connections.
    pub(crate) fn grpc(
        listener: TcpListener,
        router: axum::Router,
        liveness: &LivenessTiming,
        limits: &Connections,
        max: usize,
        metrics: ConnectionMetrics,
    ) -> Self {
        let mut builder = auto::Builder::new(TokioExecutor::new()).http2_only();
        builder
            .http2()
            .timer(TokioTimer::new())
            .keep_alive_interval(Some(liveness.keepalive_interval))
            .keep_alive_timeout(liveness.keepalive_timeout);
        let refusal = grpc_refusal(format!(
            "the registry holds its maximum of {max} gRPC connections; retry shortly (or raise \
             --grpc-max-connections)"
        ));
        let per_address = (
            limits.per_address_max,
            grpc_refusal(per_address_message(limits.per_address_max)),
        );
        let policy = Policy::Grpc {
            handshake: limits.grpc_handshake_timeout,
        };
        Self::spawn(
            listener,
            "grpc",
            builder,
            router,
            (refusal, per_address),
            policy,
            max,
            metrics,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn spawn(
        listener: TcpListener,
        label: &'static str,
        builder: auto::Builder<TokioExecutor>,
        router: axum::Router,
        (refusal, per_address): (axum::Router, (usize, axum::Router)),
        policy: Policy,
        max: usize,
        metrics: ConnectionMetrics,
    ) -> Self {
        let (phase, watching) = watch::channel(Phase::Serving);
        let port = Arc::new(PortShared {
            label: PortLabel { port: label },
            builder,
            metrics,
        });
        let task = tokio::spawn(
            accept::AcceptLoop {
                listener,
                port,
                router,
                refusal,
                policy,
                max,
                per_address,
                phase: watching,
            }
            .run(),
        );
        Self { phase, task }
    }

    /// Stops accepting: the listener closes at once (new connections are refused by the
    /// kernel); open connections are served as before.
    pub(crate) fn stop_accepting(&self) {
        self.phase.send_if_modified(|p| {
            let changed = *p == Phase::Serving;
            if changed {
                *p = Phase::Closed;
            }
            changed
        });
    }

    /// Shuts every connection down gracefully and waits for them until `deadline`; those left
    /// then are dropped. Also stops accepting.
    pub(crate) async fn finish(self, deadline: Instant) -> PortStop {
        self.phase.send_replace(Phase::Draining(deadline));
        self.task.await.unwrap_or_default()
    }

    /// Resolves if the accept loop ends by itself (it only does when it panicked).
    pub(crate) async fn ended(&mut self) -> PortStop {
        (&mut self.task).await.unwrap_or_default()
    }
}

/// The refusal beyond [`Connections::per_address_max`], naming the limit.
fn per_address_message(max: usize) -> String {
    format!(
        "limit connections-per-address reached: this client address holds {max} open \
         connections, the most one address may (close some, or raise \
         --max-connections-per-address)"
    )
}

/// A 503 `overloaded` with `message`, closing the connection.
fn http_refusal(message: String) -> axum::Router {
    axum::Router::new().fallback(move || {
        let error = ApiError::Overloaded {
            message: message.clone(),
        };
        async move {
            let mut response = error.into_response();
            response.headers_mut().insert(
                http::header::CONNECTION,
                http::HeaderValue::from_static("close"),
            );
            response
        }
    })
}

/// gRPC status UNAVAILABLE with `message`.
fn grpc_refusal(message: String) -> axum::Router {
    axum::Router::new().fallback(move || {
        let status = tonic::Status::unavailable(message.clone());
        async move { status.into_http::<axum::body::Body>() }
    })
}
