//! `--readiness-port`: the wrapper's own HTTP endpoint for a Kubernetes readinessProbe.
//!
//! `GET /ready` answers 200 only while the instance is in the consumer view (as the wrapper's
//! own subscription to its service sees it) and every live subscriber acked a revision that
//! holds it (ack-based readiness); 503 before that, while the child is unhealthy, while someone
//! else has taken the instance offline (`gangway offline`, `drain`; 200 again once it is back
//! and acked), and from the moment a stop signal came. The body says which
//! (`{"state": "starting"}`). `GET /live` answers 200 while the wrapper runs (a livenessProbe
//! that never restarts a draining pod).
//!
//! The port is bounded as the registry's REST port is (docs/operations.md): HTTP/1.1 only, a
//! request head must arrive within [`HEADER_TIMEOUT`] of the accept or of the end of the
//! previous answer (so an idle keep-alive connection is closed after that long too), and at
//! most [`MAX_CONNECTIONS`] connections are open at once (more wait in the listen backlog).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

/// A request head must arrive within this, counted from the accept or from the end of the
/// previous answer on the connection: 5 s (a kubelet probe sends its head at once). It is also
/// the idle timeout of a keep-alive connection.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Most connections open at once: 32 (a kubelet opens one per probe and closes it).
pub const MAX_CONNECTIONS: usize = 32;
/// Pause after a failed accept (out of file descriptors, say) before the next: 50 ms.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// What `/ready` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadyState {
    /// The child is not ready yet, or not every subscriber acked its registration.
    Starting,
    /// In the consumer view, and every live subscriber acked a revision holding it.
    Ready,
    /// Registered, but out of the consumer view: someone took it offline (or set its weight to
    /// 0); it comes back once it is in the view again and acked.
    Offline,
    /// The child failed its checks; the instance left the registry.
    Unhealthy,
    /// A stop signal came: draining, then stopping.
    Draining,
}

impl ReadyState {
    fn name(self) -> &'static str {
        match self {
            Self::Starting => "starting",
            Self::Ready => "ready",
            Self::Offline => "offline",
            Self::Unhealthy => "unhealthy",
            Self::Draining => "draining",
        }
    }
}

/// The state `/ready` serves; a no-op without `--readiness-port`.
#[derive(Debug, Clone)]
pub struct Readiness {
    state: Arc<watch::Sender<ReadyState>>,
}

impl Readiness {
    /// A state that is served by nobody (no `--readiness-port`).
    pub fn unserved() -> Self {
        Self {
            state: Arc::new(watch::Sender::new(ReadyState::Starting)),
        }
    }

    /// Binds `addr` and serves `/ready` and `/live` until the process ends, under
    /// [`HEADER_TIMEOUT`] and [`MAX_CONNECTIONS`].
    ///
    /// # Errors
    /// The address cannot be bound.
    pub async fn serve(addr: SocketAddr) -> anyhow::Result<(Self, SocketAddr)> {
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("--readiness-port: cannot listen on {addr}"))?;
        let bound = listener.local_addr()?;
        let readiness = Self::unserved();
        tokio::spawn(serve_on(
            listener,
            readiness.router(),
            HEADER_TIMEOUT,
            MAX_CONNECTIONS,
        ));
        Ok((readiness, bound))
    }

    /// Sets what `/ready` says.
    pub fn set(&self, state: ReadyState) {
        self.state.send_replace(state);
    }

    /// What `/ready` says now.
    pub fn get(&self) -> ReadyState {
        *self.state.borrow()
    }

    fn router(&self) -> axum::Router {
        axum::Router::new()
            .route("/ready", get(ready))
            .route("/live", get(|| async { "ok" }))
            .with_state(self.clone())
    }
}

/// The accept loop: each connection under the header (and idle) timeout `header`, at most
/// `max` at once. Runs until the process ends.
async fn serve_on(listener: TcpListener, app: axum::Router, header: Duration, max: usize) {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(header);
    let permits = Arc::new(Semaphore::new(max.max(1)));
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::debug!(error = %e, "readiness port: accept failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let connection =
            builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        tokio::spawn(async move {
            let _ = connection.await;
            drop(permit);
        });
    }
}

async fn ready(State(r): State<Readiness>) -> (StatusCode, Json<serde_json::Value>) {
    let state = r.get();
    let status = if state == ReadyState::Ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(serde_json::json!({ "state": state.name() })))
}

#[cfg(test)]
mod tests;
