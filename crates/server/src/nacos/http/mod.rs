//! The Nacos naming HTTP API on the HTTP port: v1 (`/nacos/v1/ns/...`, plain-text `ok` and
//! `caused: ...;` errors like Nacos), and the v3 client and admin instance paths
//! (`/nacos/v3/{client,admin}/ns/instance`, `{code, message, data}` envelope).
//!
//! Parameters come from the query string or an `application/x-www-form-urlencoded` body
//! (the query wins when both hold a name). Every parameter is checked before anything changes.

use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, put};
use gangway_core::model::{DEFAULT_NAMESPACE, InstanceKey, ServiceKey};
use serde_json::json;

use super::Nacos;
use crate::auth::{Caller, Rule};
use crate::error::ApiError;

mod beat;
mod error;
mod instance;
mod list;
mod params;
mod service;
mod v3;

use beat::v1_beat;
pub use error::NacosError;
use instance::{v1_deregister, v1_detail, v1_modify, v1_register};
use list::v1_list;
pub use params::Params;
pub use service::service_page;
use service::{
    v1_service_create, v1_service_delete, v1_service_get, v1_service_list, v1_service_update,
};
use v3::{
    v3_admin_list, v3_client_list, v3_client_register, v3_deregister, v3_detail, v3_modify,
    v3_register,
};

/// A v1 poller that missed this many polls (of `cacheMillis` each) is forgotten: 30 s.
pub const POLLER_EXPIRY_POLLS: u64 = 3;
/// Nacos's beat result code: OK.
pub const BEAT_OK: u32 = 10200;
/// Nacos's beat result code: unknown instance and no beat body (the client re-registers).
pub const BEAT_NOT_FOUND: u32 = 20404;

/// The Nacos routes, to merge into the main router.
pub fn router(nacos: Nacos) -> Router {
    Router::new()
        .route(
            "/nacos/v1/ns/instance",
            get(v1_detail)
                .post(v1_register)
                .put(v1_modify)
                .delete(v1_deregister),
        )
        .route("/nacos/v1/ns/instance/beat", put(v1_beat))
        .route("/nacos/v1/ns/instance/list", get(v1_list))
        .route(
            "/nacos/v1/ns/service",
            get(v1_service_get)
                .post(v1_service_create)
                .put(v1_service_update)
                .delete(v1_service_delete),
        )
        .route("/nacos/v1/ns/service/list", get(v1_service_list))
        .route("/nacos/v1/ns/operator/metrics", get(v1_metrics))
        .route("/nacos/v1/console/health/liveness", get(|| async { "OK" }))
        .route("/nacos/v1/console/health/readiness", get(v1_readiness))
        .route(
            "/nacos/v3/client/ns/instance",
            axum::routing::post(v3_client_register).delete(v3_deregister),
        )
        .route("/nacos/v3/client/ns/instance/list", get(v3_client_list))
        .route(
            "/nacos/v3/admin/ns/instance",
            get(v3_detail)
                .post(v3_register)
                .put(v3_modify)
                .delete(v3_deregister),
        )
        .route("/nacos/v3/admin/ns/instance/list", get(v3_admin_list))
        .route("/nacos/v1/auth/login", axum::routing::post(login))
        .route("/nacos/v1/auth/users/login", axum::routing::post(login))
        .route("/nacos/v3/auth/user/login", axum::routing::post(login))
        .route("/nacos/{*rest}", any(unsupported))
        .with_state(nacos)
}

async fn v1_metrics(State(nacos): State<Nacos>, caller: Caller) -> Response {
    if let Err(e) = caller.allow(Rule::Read, DEFAULT_NAMESPACE, None) {
        return NacosError::from(ApiError::from(e)).into_response();
    }
    let services = nacos.registry().services(None, None);
    let instances: usize = services.iter().map(|s| s.instances).sum();
    let subscribers: usize = services.iter().map(|s| s.subscribers).sum();
    axum::Json(json!({
        "status": "UP",
        "serviceCount": services.len(),
        "instanceCount": instances,
        "subscribeCount": subscribers,
        "clientCount": nacos.registry().session_count(),
    }))
    .into_response()
}

async fn v1_readiness(State(nacos): State<Nacos>) -> Response {
    if nacos.registry().warming_up() {
        (StatusCode::SERVICE_UNAVAILABLE, "warming up").into_response()
    } else {
        "OK".into_response()
    }
}

/// Rule `read` on the service's namespace.
fn allow_read(caller: &Caller, service: &ServiceKey) -> Result<(), NacosError> {
    Ok(caller
        .allow(Rule::Read, &service.namespace, None)
        .map_err(ApiError::from)?)
}

/// Rule `instance`: the instance's owner, or `admin`.
fn allow_instance(
    nacos: &Nacos,
    caller: &Caller,
    service: &ServiceKey,
    key: &InstanceKey,
) -> Result<(), NacosError> {
    let owner = nacos.registry().owner(service, key);
    Ok(caller
        .allow(Rule::Instance, &service.namespace, owner.as_deref())
        .map_err(ApiError::from)?)
}

/// `POST /nacos/v1/auth/login` (and `/v1/auth/users/login`, `/v3/auth/user/login`): form
/// `username` and `password`; answers `{accessToken, tokenTtl, globalAdmin, username}` as
/// Nacos does. The token is a login session ([`crate::auth::LOGIN_TTL`]) carried as
/// `accessToken` on v1 requests and in gRPC request headers. Wrong name or password: 403
/// `unknown user!`, Nacos's answer. With auth off every login succeeds with an empty token.
async fn login(State(nacos): State<Nacos>, p: Params) -> Response {
    let authority = nacos.registry().config().security.authority.clone();
    let ttl = crate::auth::LOGIN_TTL.as_secs();
    if !authority.is_on() {
        return axum::Json(json!({"accessToken": "", "tokenTtl": ttl, "globalAdmin": true}))
            .into_response();
    }
    let (Some(user), Some(password)) = (p.get("username"), p.get("password")) else {
        return NacosError::missing("username").into_response();
    };
    match authority.login(user, password).await {
        Ok((token, principal)) => axum::Json(json!({
            "accessToken": token,
            "tokenTtl": ttl,
            "globalAdmin": principal.global_admin(),
            "username": principal.name,
        }))
        .into_response(),
        // Too many checks waiting: 429 in the Nacos error shape, not a wrong password.
        Err(e @ crate::auth::AuthError::LimitExceeded { .. }) => {
            NacosError::from(ApiError::from(e)).into_response()
        }
        Err(_) => (StatusCode::FORBIDDEN, "unknown user!").into_response(),
    }
}

/// Everything else under `/nacos/`: the config center, auth, v2 HTTP and the rest.
async fn unsupported(req: Request) -> NacosError {
    let path = req.uri().path().to_owned();
    let what = if path.contains("/cs/") {
        "the config center"
    } else if path.contains("/auth/") {
        "authentication"
    } else {
        "this endpoint"
    };
    NacosError {
        status: if what == "this endpoint" {
            StatusCode::NOT_FOUND
        } else {
            StatusCode::NOT_IMPLEMENTED
        },
        code: 30000,
        message: format!(
            "gangway serves the Nacos naming API only; {what} ({} {path}) is not supported, see docs/compat.md",
            req.method()
        ),
    }
}
