//! One connection's task: hyper serves it until it ends, until its [`Policy`] says it waited
//! too long (then it is dropped, which closes the socket), or until the port drains (then it
//! is shut down gracefully: HTTP/1 finishes the request in flight, HTTP/2 sends GOAWAY).

use std::net::SocketAddr;
use std::sync::Arc;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::Phase;
use super::activity::{Activity, Counted, Policy, TrackedIo};
use super::metrics::{ConnectionMetrics, PortLabel};

/// What every connection of one port shares.
pub(super) struct PortShared {
    pub(super) label: PortLabel,
    pub(super) builder: auto::Builder<TokioExecutor>,
    pub(super) metrics: ConnectionMetrics,
}

/// An accepted connection.
pub(super) struct Accepted {
    pub(super) stream: TcpStream,
    pub(super) local: SocketAddr,
    pub(super) peer: SocketAddr,
}

/// Serves one connection with `router` under `policy`. A refused connection (policy
/// [`Policy::Refusal`]) is shut down gracefully once its first answer is sent.
pub(super) async fn run(
    conn: Accepted,
    port: Arc<PortShared>,
    router: axum::Router,
    policy: Policy,
    mut phase: watch::Receiver<Phase>,
) {
    let activity = Arc::new(Activity::new(policy));
    let io = TokioIo::new(TrackedIo::new(conn.stream, activity.clone()));
    let service = TowerToHyperService::new(Counted::new(
        router,
        activity.clone(),
        conn.local,
        conn.peer,
    ));
    let serving = port.builder.serve_connection(io, service);
    tokio::pin!(serving);
    let expired = activity.expired();
    tokio::pin!(expired);
    let refusal = matches!(policy, Policy::Refusal { .. });
    let served = activity.served();
    tokio::pin!(served);
    let mut closing = false;
    if matches!(*phase.borrow_and_update(), Phase::Draining(_)) {
        if activity.closable_at_stop() {
            return;
        }
        closing = true;
        serving.as_mut().graceful_shutdown();
    }
    loop {
        tokio::select! {
            result = serving.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(peer = %conn.peer, port = port.label.port, error = %e, "connection ended with an error");
                }
                break;
            }
            () = &mut expired => {
                if !refusal {
                    port.metrics.timed_out.get_or_create(&port.label).inc();
                }
                tracing::debug!(peer = %conn.peer, port = port.label.port, "connection closed: it waited longer than its timeout");
                break;
            }
            () = &mut served, if refusal && !closing => {
                closing = true;
                serving.as_mut().graceful_shutdown();
            }
            changed = phase.changed(), if !closing => {
                if changed.is_err() || matches!(*phase.borrow(), Phase::Draining(_)) {
                    if activity.closable_at_stop() {
                        tracing::debug!(peer = %conn.peer, port = port.label.port, "connection closed at the stop: nothing in flight");
                        break;
                    }
                    closing = true;
                    serving.as_mut().graceful_shutdown();
                }
            }
        }
    }
    if activity.head_refused() {
        port.metrics.heads_refused.get_or_create(&port.label).inc();
    }
}
