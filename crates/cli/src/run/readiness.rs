//! `--readiness-port`: the wrapper's own HTTP endpoint for a Kubernetes readinessProbe.
//!
//! `GET /ready` answers 200 only once every live subscriber acked a revision that holds the
//! instance (ack-based readiness), and 503 before that, while the child is unhealthy, and from
//! the moment a stop signal came; the body says which (`{"state": "starting"}`). `GET /live`
//! answers 200 while the wrapper runs (a livenessProbe that never restarts a draining pod).

use std::net::SocketAddr;

use anyhow::Context as _;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use tokio::sync::watch;

/// What `/ready` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadyState {
    /// The child is not ready yet, or not every subscriber acked its registration.
    Starting,
    /// Every live subscriber acked a revision holding the instance.
    Ready,
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
            Self::Unhealthy => "unhealthy",
            Self::Draining => "draining",
        }
    }
}

/// The state `/ready` serves; a no-op without `--readiness-port`.
#[derive(Debug, Clone)]
pub struct Readiness {
    state: std::sync::Arc<watch::Sender<ReadyState>>,
}

impl Readiness {
    /// A state that is served by nobody (no `--readiness-port`).
    pub fn unserved() -> Self {
        Self {
            state: std::sync::Arc::new(watch::Sender::new(ReadyState::Starting)),
        }
    }

    /// Binds `addr` and serves `/ready` and `/live` until the process ends.
    ///
    /// # Errors
    /// The address cannot be bound.
    pub async fn serve(addr: SocketAddr) -> anyhow::Result<(Self, SocketAddr)> {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("--readiness-port: cannot listen on {addr}"))?;
        let bound = listener.local_addr()?;
        let readiness = Self::unserved();
        let app = axum::Router::new()
            .route("/ready", get(ready))
            .route("/live", get(|| async { "ok" }))
            .with_state(readiness.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
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
