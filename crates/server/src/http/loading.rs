//! While the registry loads its store ([`Registry::start_loading`]), the HTTP port answers only
//! what tells a caller whether the server is up (`/v1/health`, `/metrics`): everything else gets
//! 503 `warming_up` in the one JSON error shape, so nothing reads or writes a half-loaded
//! registry.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::engine::Registry;
use crate::error::ApiError;

/// Paths that answer during loading.
const ALWAYS: [&str; 2] = ["/v1/health", "/metrics"];

/// The middleware (`axum::middleware::from_fn_with_state(registry, gate)`).
pub async fn gate(State(registry): State<Registry>, request: Request, next: Next) -> Response {
    if registry.is_loading() && !ALWAYS.contains(&request.uri().path()) {
        return ApiError::WarmingUp.into_response();
    }
    next.run(request).await
}
