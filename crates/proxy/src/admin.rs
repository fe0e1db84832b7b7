//! The admin endpoints, on their own listener (docs/proxy.md has an example of each answer).
//!
//! | endpoint | answer |
//! |---|---|
//! | `GET /services` | every routed service: revision, instances, pickable, ejected, retry budget |
//! | `GET /services/{host}` | one service (named as in requests: `orders`, `orders.GROUP.NS`): its view with revision, each instance's state and request/error counts, ejected instances and why, retry budget, settings |
//! | `GET /config` | the config file, reload counts and the last reload error |
//! | `GET /metrics` | Prometheus text format |
//! | `GET /ready` | 200 while the registry session is up and the proxy is not shutting down, else 503 |

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use gangway_client::balance::pickable;
use gangway_client::http::{BalancerKind, ServiceState};
use gangway_client::outlier::{ErrorKinds, Outcome, RecoveryCheck};
use gangway_core::model::ServiceKey;
use prometheus_client::registry::Registry;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::config::ServiceSettings;
use crate::proxy::{Proxy, Route};

/// What the admin endpoints read.
#[derive(Clone)]
pub struct AdminState {
    /// The proxy.
    pub proxy: Proxy,
    /// Every metric of the process.
    pub registry: Arc<Registry>,
    /// Reload bookkeeping.
    pub reloads: Arc<Reloads>,
    /// Set once SIGTERM arrived: `/ready` answers 503.
    pub shutting_down: Arc<AtomicBool>,
}

/// Config reloads so far.
#[derive(Debug, Default)]
pub struct Reloads {
    inner: Mutex<ReloadInfo>,
}

#[derive(Debug, Default, Clone)]
struct ReloadInfo {
    file: Option<String>,
    ok: u64,
    failed: u64,
    last_error: Option<String>,
    last_at: Option<SystemTime>,
}

impl Reloads {
    /// Bookkeeping for a config read from `file`.
    pub fn new(file: Option<&std::path::Path>) -> Self {
        Self {
            inner: Mutex::new(ReloadInfo {
                file: file.map(|f| f.display().to_string()),
                ..ReloadInfo::default()
            }),
        }
    }

    /// Records a reload; `error` is its one-line failure.
    pub fn record(&self, error: Option<String>) {
        let mut info = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        match error {
            None => info.ok += 1,
            Some(e) => {
                info.failed += 1;
                info.last_error = Some(e);
            }
        }
        info.last_at = Some(SystemTime::now());
    }

    fn snapshot(&self) -> ReloadInfo {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// The admin router.
pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/services", get(services))
        .route("/services/{host}", get(service))
        .route("/config", get(config))
        .route("/metrics", get(metrics))
        .route("/ready", get(ready))
        .with_state(state)
}

async fn services(State(s): State<AdminState>) -> Json<Value> {
    let list: Vec<Value> = s
        .proxy
        .routes()
        .iter()
        .map(|route| {
            let state = route.state();
            let view = state.as_ref().map(|st| st.view.clone());
            json!({
                "service": key_json(&route.key),
                "revision": view.as_ref().map_or(0, |v| v.revision),
                "instances": view.as_ref().map_or(0, |v| v.instances.len()),
                "pickable": view.as_ref().map_or(0, |v| pickable(v).len()),
                "ejected": state.as_ref().map_or(0, |st| st.ejected.len()),
                "retry_budget": state.as_ref().map(budget_json),
            })
        })
        .collect();
    Json(json!({ "services": list }))
}

async fn service(State(s): State<AdminState>, Path(host): Path<String>) -> Response {
    let routing = s.proxy.routing();
    let key = match routing.route(&host) {
        Ok((key, _)) => key,
        Err(reason) => return not_found("bad_host", &reason),
    };
    let Some(route) = s.proxy.route_of(&key) else {
        return not_found(
            "not_routed",
            &format!("no request has been routed to {key} yet"),
        );
    };
    Json(detail(&s, &route)).into_response()
}

fn not_found(code: &str, message: &str) -> Response {
    (
        StatusCode::NOT_FOUND,
        Json(json!({ "error": code, "message": message })),
    )
        .into_response()
}

fn detail(s: &AdminState, route: &Route) -> Value {
    let Some(state) = route.state() else {
        return json!({ "service": key_json(&route.key), "revision": 0, "instances": [] });
    };
    let now = Instant::now();
    let counts = s.proxy.attempt_metrics();
    let instances: Vec<Value> = state
        .view
        .instances
        .iter()
        .map(|i| {
            let count = |o: Outcome| counts.count(&route.label, &i.key, o);
            let outcomes = [
                Outcome::Success,
                Outcome::ConnectFailure,
                Outcome::NetworkError,
                Outcome::ServerError,
            ];
            let requests: u64 = outcomes.iter().map(|o| count(*o)).sum();
            json!({
                "instance": i.key.addr(),
                "cluster": i.key.cluster,
                "weight": i.weight,
                "enabled": i.enabled,
                "healthy": i.healthy,
                "metadata": i.metadata,
                "ejected": state.ejected.iter().any(|(k, _)| *k == i.key),
                "draining": state.draining.contains(&i.key),
                "pooled": state.pooled.contains(&i.key),
                "requests": requests,
                "errors": requests - count(Outcome::Success),
                "outcomes": outcomes
                    .iter()
                    .map(|o| (o.as_str().to_owned(), json!(count(*o))))
                    .collect::<serde_json::Map<_, _>>(),
            })
        })
        .collect();
    let ejected: Vec<Value> = state
        .ejected
        .iter()
        .map(|(key, info)| {
            json!({
                "instance": key.addr(),
                "reason": info.reason.as_str(),
                "ejected_for_ms": ms(now.saturating_duration_since(info.since)),
                "failed_checks": info.checks,
                "next_check_in_ms": ms(info.next_check_at.saturating_duration_since(now)),
                "check_in_flight": info.check_in_flight,
            })
        })
        .collect();
    json!({
        "service": key_json(&route.key),
        "revision": state.view.revision,
        "protection_triggered": state.view.protection_triggered,
        "instances": instances,
        "ejected": ejected,
        "retry_budget": budget_json(&state),
        "settings": settings_json(&route.settings),
    })
}

fn budget_json(state: &ServiceState) -> Value {
    json!({
        "requests": state.budget.requests,
        "retries": state.budget.retries,
        "refused": state.budget.refused,
    })
}

fn settings_json(s: &ServiceSettings) -> Value {
    let d = |d: Duration| gangway_core::duration::format(d);
    json!({
        "balancer": balancer_name(s.balancer),
        "idempotent_methods": s.idempotent_methods.iter().map(|m| m.as_str()).collect::<Vec<_>>(),
        "attempt_timeout": d(s.attempt_timeout),
        "connect_timeout": d(s.connect_timeout),
        "pool_idle_timeout": d(s.pool_idle_timeout),
        "first_view_wait": d(s.first_view_wait),
        "retry": {
            "max_attempts": s.retry.max_attempts,
            "per_try_timeout": s.retry.per_try_timeout.map(d),
            "budget_window": d(s.retry.budget_window),
            // f32 in the config: shown as written, not as its f64 widening.
            "retry_ratio": (f64::from(s.retry.retry_ratio) * 1e6).round() / 1e6,
            "min_retries_per_second": s.retry.min_retries_per_second,
        },
        "outlier": s.outlier.as_ref().map(|o| json!({
            "window": d(o.window),
            "min_request_rate": o.min_request_rate,
            "error_rate_threshold": o.error_rate_threshold,
            "errors": if o.errors == ErrorKinds::NetworkAndServerErrors { "network-and-5xx" } else { "network" },
            "consecutive_failures": o.consecutive_failures,
            "max_ejection_ratio": o.max_ejection_ratio,
            "recovery_unit": d(o.recovery_unit),
            "max_checks": o.max_checks,
            "check": if o.check == RecoveryCheck::TcpConnect { "tcp" } else { "request" },
            "check_timeout": d(o.check_timeout),
        })),
    })
}

/// The file's spelling of a balancer.
fn balancer_name(kind: BalancerKind) -> &'static str {
    match kind {
        BalancerKind::RoundRobin => "round-robin",
        BalancerKind::Weighted => "weighted",
        BalancerKind::Random => "random",
        BalancerKind::PowerOfTwoChoices => "p2c",
    }
}

fn key_json(key: &ServiceKey) -> Value {
    json!({ "namespace": key.namespace, "group": key.group, "name": key.service })
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

async fn config(State(s): State<AdminState>) -> Json<Value> {
    let routing = s.proxy.routing();
    let info = s.reloads.snapshot();
    Json(json!({
        "file": info.file,
        "reloads": info.ok,
        "reload_failures": info.failed,
        "last_reload_error": info.last_error,
        "last_reload_at_unix_ms": info.last_at.and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok()).map(ms),
        "namespace": routing.namespace,
        "group": routing.group,
        "max_request_body": routing.max_request_body,
        "max_services": routing.max_services,
        "defaults": settings_json(&routing.defaults),
        "services": routing.services.iter().map(|(name, e)| (name.clone(), json!({
            "service": key_json(&e.key),
            "settings": settings_json(&e.settings),
        }))).collect::<serde_json::Map<_, _>>(),
    }))
}

async fn metrics(State(s): State<AdminState>) -> Response {
    let mut text = String::new();
    match prometheus_client::encoding::text::encode(&mut text, &s.registry) {
        Ok(()) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

async fn ready(State(s): State<AdminState>) -> (StatusCode, &'static str) {
    if s.shutting_down.load(Ordering::Relaxed) {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down")
    } else if !s.proxy.is_connected() {
        (StatusCode::SERVICE_UNAVAILABLE, "registry session down")
    } else {
        (StatusCode::OK, "ready")
    }
}

#[cfg(test)]
mod tests;
