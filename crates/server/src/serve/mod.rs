//! The serving layer of both ports: an accept loop on hyper-util's connection builder, so that
//! every connection is bounded (docs/operations.md, "Connections").
//!
//! - **Counts** ([`accept`]): at most N connections per port (derived from the open-file limit
//!   by default); beyond that a connection gets a clear refusal (REST: 503 with the JSON error
//!   `overloaded`; gRPC: status UNAVAILABLE) and is closed. Accept errors such as EMFILE back
//!   off instead of spinning.
//! - **Time** ([`activity`]): on the REST port a header read timeout, a request body timeout
//!   (the whole body within 10 s by default, or `408`) and an idle keep-alive timeout; on the gRPC port a handshake timeout (HTTP/2 keepalive pings, configured on the
//!   builder, cover established connections).
//! - **Size** ([`head`]): request heads over our limits, HTTP/1 or HTTP/2, get the JSON 414
//!   or 431 instead of hyper's empty ones.
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

use crate::config::{Connections, LivenessTiming, Security};
use crate::error::ApiError;

mod accept;
mod activity;
mod connection;
pub mod head;
mod metrics;
#[cfg(test)]
mod tests;

pub use accept::{BACKOFF_MAX, BACKOFF_MIN, REFUSAL_TIME, REFUSALS, raise_fd_limit};
pub(crate) use accept::{Budget, Caps, caps};
pub(crate) use activity::BodyTimeout;
pub use metrics::{ConnectionMetrics, PortLabel};

use activity::Policy;
use connection::{PortShared, PortTls};

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

/// The answers of a refused connection: the port holds its maximum, or both ports hold
/// their budget.
struct Refusals {
    full: axum::Router,
    over_budget: axum::Router,
    /// Most connections from one client IP address, and the answer beyond it.
    per_address: (usize, axum::Router),
}

impl Refusals {
    /// The answers of the `port` (`HTTP`, `gRPC`) holding `max` connections, its maximum set
    /// by `flag`, of a client address holding `per_address_max`, or of both ports holding their
    /// budget; `answer` makes a refusal of a message.
    fn new(
        port: &str,
        flag: &str,
        max: usize,
        per_address_max: usize,
        caps: &Caps,
        answer: impl Fn(String) -> axum::Router,
    ) -> Self {
        let limit = caps.fd_limit.map_or_else(String::new, |l| {
            format!(", three quarters of the open-file limit {l}")
        });
        Self {
            full: answer(format!(
                "the registry holds its maximum of {max} {port} connections; retry shortly (or \
                 raise {flag})"
            )),
            over_budget: answer(format!(
                "the registry holds its maximum of {} connections across its HTTP and gRPC \
                 ports{limit}; retry shortly (or raise ulimit -n)",
                caps.budget
            )),
            per_address: (
                per_address_max,
                answer(per_address_message(per_address_max)),
            ),
        }
    }
}

/// A port being served.
pub(crate) struct Serving {
    phase: watch::Sender<Phase>,
    task: JoinHandle<PortStop>,
}

impl Serving {
    /// Serves the REST API: HTTP/1.1 and HTTP/2 with prior knowledge (with TLS: HTTP/1.1 and
    /// HTTP/2 by ALPN), under the header and idle timeouts of `limits`, at most `caps.http`
    /// connections and within `budget`, shared with the gRPC port. With `security.tls` every
    /// connection starts with a TLS handshake, which must end within the header timeout of
    /// the accept.
    pub(crate) fn http(
        listener: TcpListener,
        router: axum::Router,
        limits: &Connections,
        caps: &Caps,
        budget: Budget,
        metrics: ConnectionMetrics,
        security: &Security,
    ) -> Self {
        let mut builder = auto::Builder::new(TokioExecutor::new());
        // Our own timeouts replace hyper's header read timeout (see `activity`).
        builder.http1().header_read_timeout(None);
        // HTTP/2 heads get the limits of HTTP/1 ones (`head::check`), with the JSON answers.
        builder
            .http2()
            .max_header_list_size(head::H2_MAX_HEADER_LIST);
        let max = caps.http;
        let refusals = Refusals::new(
            "HTTP",
            "--http-max-connections",
            max,
            limits.per_address_max,
            caps,
            http_refusal,
        );
        let policy = Policy::Http {
            header: limits.http_header_timeout,
            idle: limits.http_idle_timeout,
            body: limits.http_body_timeout,
        };
        let tls = port_tls(security, PortKind::Http);
        Self::spawn(
            listener, "http", builder, router, refusals, policy, caps, max, budget, metrics, tls,
        )
    }

    /// Serves gRPC: HTTP/2 only, keepalive pings as `liveness` says, the preface within the
    /// handshake timeout of `limits`, at most `caps.grpc` connections and within `budget`.
    /// With `security.tls` every connection starts with a TLS handshake (ALPN `h2`), which
    /// must end within that handshake timeout of the accept too.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn grpc(
        listener: TcpListener,
        router: axum::Router,
        liveness: &LivenessTiming,
        limits: &Connections,
        caps: &Caps,
        budget: Budget,
        metrics: ConnectionMetrics,
        security: &Security,
    ) -> Self {
        let mut builder = auto::Builder::new(TokioExecutor::new()).http2_only();
        builder
            .http2()
            .timer(TokioTimer::new())
            .keep_alive_interval(Some(liveness.keepalive_interval))
            .keep_alive_timeout(liveness.keepalive_timeout);
        let max = caps.grpc;
        let refusals = Refusals::new(
            "gRPC",
            "--grpc-max-connections",
            max,
            limits.per_address_max,
            caps,
            grpc_refusal,
        );
        let policy = Policy::Grpc {
            handshake: limits.grpc_handshake_timeout,
        };
        let tls = port_tls(security, PortKind::Grpc);
        Self::spawn(
            listener, "grpc", builder, router, refusals, policy, caps, max, budget, metrics, tls,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn spawn(
        listener: TcpListener,
        label: &'static str,
        builder: auto::Builder<TokioExecutor>,
        router: axum::Router,
        refusals: Refusals,
        policy: Policy,
        caps: &Caps,
        max: usize,
        budget: Budget,
        metrics: ConnectionMetrics,
        tls: PortTls,
    ) -> Self {
        let (phase, watching) = watch::channel(Phase::Serving);
        #[cfg(not(feature = "tls"))]
        let () = tls;
        let port = Arc::new(PortShared {
            label: PortLabel { port: label },
            builder,
            metrics,
            #[cfg(feature = "tls")]
            tls,
        });
        let task = tokio::spawn(
            accept::AcceptLoop {
                listener,
                port,
                router,
                refusal: refusals.full,
                over_budget: refusals.over_budget,
                policy,
                max,
                per_address: refusals.per_address,
                budget,
                refusals: caps.refusals,
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

/// Which port, for its TLS settings.
#[derive(Clone, Copy)]
enum PortKind {
    Http,
    Grpc,
}

/// The TLS settings of the `kind` port in `security`.
#[cfg(feature = "tls")]
fn port_tls(security: &Security, kind: PortKind) -> PortTls {
    let port = match kind {
        PortKind::Http => crate::tls::Port::Http,
        PortKind::Grpc => crate::tls::Port::Grpc,
    };
    security.tls.clone().map(|tls| (tls, port))
}

/// Without the `tls` feature no port has TLS settings.
#[cfg(not(feature = "tls"))]
fn port_tls(_: &Security, _: PortKind) -> PortTls {}

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
