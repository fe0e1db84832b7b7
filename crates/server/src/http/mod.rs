//! The REST/JSON API under `/v1/` (docs/api.md), `/metrics` and `/v1/openapi.json`.
//! Every error leaves through [`ApiError`], including malformed JSON and query strings.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::rejection::{BytesRejection, JsonRejection, PathRejection, QueryRejection};
use axum::extract::{ConnectInfo, DefaultBodyLimit, FromRequest, FromRequestParts, State};
use axum::http::{StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use futures::{Stream, StreamExt};
use gangway_core::model::{Instance, InstanceKey, ServiceKey};
use gangway_core::{View, validate};
use gangway_wire::rest;
use serde::Deserialize;

use crate::auth::{Caller, Rule};
use crate::engine::{
    Entry, LivenessRequest, Patch, Registry, ServiceSummary, SubscriberInfo, SubscriberKind,
    SubscriberRow,
};
use crate::error::ApiError;
use crate::serve::BodyTimeout;

/// The OpenAPI 3 description served at `/v1/openapi.json`.
pub const OPENAPI: &str = include_str!("openapi.json");

/// Largest request body on `/v1/`, in bytes: 2 MiB (axum's default, made explicit). A larger
/// body is refused with 413 `payload_too_large` before it is parsed. The largest valid body, a
/// registration with 16 KiB of metadata written with JSON escapes, stays far below it.
pub const MAX_BODY_BYTES: usize = 2 * 1024 * 1024;

#[derive(Clone)]
struct AppState {
    registry: Registry,
    /// `/metrics` needs credentials.
    metrics_auth: bool,
    prometheus: Arc<Mutex<prometheus_client::registry::Registry>>,
}

/// JSON body whose rejection is an [`ApiError`] (400, field `body`; 413 over
/// [`MAX_BODY_BYTES`]).
#[derive(FromRequest)]
#[from_request(via(axum::Json), rejection(ApiError))]
pub(crate) struct ApiJson<T>(pub(crate) T);

/// Query string whose rejection is an [`ApiError`] (400, field `query`).
#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
struct ApiQuery<T>(T);

/// Path parameters whose rejection is an [`ApiError`].
#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
struct ApiPath<T>(T);

/// A body that could not be read: 408 when it did not arrive in time ([`BodyTimeout`], the
/// serving layer's body bounds), 413 when it is over [`MAX_BODY_BYTES`], else 400 naming
/// `body` with the extractor's reason.
fn body_error(
    rejection: &(dyn std::error::Error + 'static),
    status: StatusCode,
    reason: String,
) -> ApiError {
    if let Some(timeout) = BodyTimeout::find(rejection) {
        ApiError::RequestTimeout {
            message: timeout.to_string(),
        }
    } else if status == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::PayloadTooLarge {
            limit_bytes: MAX_BODY_BYTES,
        }
    } else {
        ApiError::invalid("body", reason)
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        body_error(&r, r.status(), r.body_text())
    }
}

impl From<BytesRejection> for ApiError {
    fn from(r: BytesRejection) -> Self {
        body_error(&r, r.status(), r.body_text())
    }
}

impl From<QueryRejection> for ApiError {
    fn from(r: QueryRejection) -> Self {
        ApiError::invalid("query", r.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(r: PathRejection) -> Self {
        ApiError::invalid("path", r.body_text())
    }
}

/// Builds the router. `prometheus` holds the registry the server's metrics were registered in.
pub fn router(registry: Registry, prometheus: prometheus_client::registry::Registry) -> Router {
    let state = AppState {
        metrics_auth: registry.config().security.metrics_auth,
        registry,
        prometheus: Arc::new(Mutex::new(prometheus)),
    };
    Router::new()
        .route("/v1/health", get(health))
        .route("/v1/openapi.json", get(openapi))
        .route("/metrics", get(metrics))
        .route("/v1/services", get(list_services))
        .route("/v1/services/{service}", get(get_service).put(put_service))
        .route(
            "/v1/services/{service}/instances",
            get(list_instances).post(register),
        )
        .route(
            "/v1/services/{service}/instances/{addr}",
            axum::routing::patch(update).delete(deregister),
        )
        .route(
            "/v1/services/{service}/instances/{addr}/heartbeat",
            put(heartbeat),
        )
        .route(
            "/v1/services/{service}/instances/{addr}/offline",
            post(offline),
        )
        .route(
            "/v1/services/{service}/instances/{addr}/online",
            post(online),
        )
        .route("/v1/services/{service}/instances/{addr}/drain", post(drain))
        .route("/v1/services/{service}/subscribers", get(subscribers))
        .route("/v1/services/{service}/watch", get(watch))
        .route("/v1/services/{service}/liveness", get(liveness::liveness))
        .route("/v1/drains", get(drains::drains))
        .route("/v1/cluster", get(cluster))
        .fallback(|| async { ApiError::not_found("no such endpoint; see /v1/openapi.json") })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Scope {
    namespace: Option<String>,
    group: Option<String>,
    cluster: Option<String>,
    #[serde(default)]
    all: bool,
    subscriber: Option<String>,
}

/// An explicitly empty `namespace=`, `group=` or `cluster=` is refused: it would silently mean
/// the default (for example an unset shell variable writing into `public`).
fn present<'a>(field: &str, value: &'a Option<String>) -> Result<&'a str, ApiError> {
    match value.as_deref() {
        Some("") => Err(ApiError::invalid(
            field,
            "must not be empty (leave it out for the default)",
        )),
        Some(v) => Ok(v),
        None => Ok(""),
    }
}

impl Scope {
    fn service(&self, name: &str) -> Result<ServiceKey, ApiError> {
        present("namespace", &self.namespace)?;
        present("group", &self.group)?;
        let key = ServiceKey::new(
            self.namespace.as_deref().unwrap_or(""),
            self.group.as_deref().unwrap_or(""),
            name,
        );
        validate::service_key(&key)?;
        Ok(key)
    }

    /// [`Scope::service`] for a route about the whole service (its settings, its list, a
    /// registration, its subscribers, its watch), where `cluster` would address nothing: it is
    /// refused instead of being ignored (a registration names its cluster in the body).
    fn service_only(&self, name: &str) -> Result<ServiceKey, ApiError> {
        if self.cluster.is_some() {
            return Err(ApiError::invalid(
                "cluster",
                "is a parameter of instance paths (/instances/{ip}:{port}); a registration \
                 names its cluster in the body",
            ));
        }
        self.service(name)
    }

    fn instance(&self, addr: &str) -> Result<InstanceKey, ApiError> {
        present("cluster", &self.cluster)?;
        let (ip, port) = validate::addr(addr)?;
        let key = InstanceKey::new(&ip, port, self.cluster.as_deref().unwrap_or(""));
        validate::name("cluster", &key.cluster)?;
        Ok(key)
    }
}

/// `UP` (200), or `LOADING` (503) while the store is read at start.
async fn health(State(s): State<AppState>) -> Response {
    let loading = s.registry.is_loading();
    let body = Json(rest::Health {
        status: if loading { "LOADING" } else { "UP" }.to_owned(),
        boot_id: s.registry.boot_id().to_owned(),
        warming_up: s.registry.warming_up(),
        loading,
        auth: if s.registry.config().security.authority.is_on() {
            "on"
        } else {
            "off"
        }
        .to_owned(),
        tls: tls_mode(&s.registry.config().security).to_owned(),
        node_lease: s
            .registry
            .config()
            .node_lease
            .as_ref()
            .map(|lease| lease.borrow().clone()),
    });
    if loading {
        (axum::http::StatusCode::SERVICE_UNAVAILABLE, body).into_response()
    } else {
        body.into_response()
    }
}

/// `GET /v1/cluster` (docs/cluster.md): the nodes of the cluster as this node sees it, with
/// their store lease, sessions and subscribers; `{"mode": "single", "nodes": []}` for a node
/// alone. Rule `read` (any namespace): anonymous callers are refused when auth is on.
async fn cluster(State(s): State<AppState>, caller: Caller) -> Result<Response, ApiError> {
    allow_listing(&caller, &None, &[])?;
    Ok(
        Json(s.registry.cluster().unwrap_or_else(|| rest::ClusterView {
            mode: "single".into(),
            node: None,
            revision: None,
            nodes: Vec::new(),
        }))
        .into_response(),
    )
}

/// `"off"`, `"on"` or `"mutual"` (client certificates required).
fn tls_mode(security: &crate::config::Security) -> &'static str {
    #[cfg(feature = "tls")]
    if let Some(tls) = &security.tls {
        return tls.mode();
    }
    let _ = security;
    "off"
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

async fn metrics(State(s): State<AppState>, caller: Caller) -> Response {
    if let (true, Err(e)) = (s.metrics_auth, caller.allow(Rule::Metrics, "", None)) {
        return ApiError::from(e).into_response();
    }
    s.registry.refresh_gauges();
    let mut text = String::new();
    let prometheus = s.prometheus.lock().unwrap_or_else(|p| p.into_inner());
    if let Err(e) = prometheus_client::encoding::text::encode(&mut text, &prometheus) {
        return ApiError::Store(format!("metrics encoding failed: {e}")).into_response();
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

impl From<ServiceSummary> for rest::Service {
    fn from(s: ServiceSummary) -> Self {
        rest::Service {
            namespace: s.key.namespace,
            group: s.key.group,
            service: s.key.service,
            kind: s.kind,
            revision: s.revision,
            instances: s.instances as u64,
            serving: s.serving as u64,
            subscribers: s.subscribers as u64,
            states: rest::StateCounts {
                serving: s.tally.serving as u64,
                unhealthy: (s.tally.enabled - s.tally.healthy) as u64,
                offline: (s.instances - s.tally.enabled) as u64,
                zero_weight: (s.tally.healthy - s.tally.serving) as u64,
            },
            protect_threshold: s.settings.protect_threshold,
            metadata: s.settings.metadata,
        }
    }
}

/// The checks of a listing with optional exact-match `filters` (field, value): each given
/// one is a valid name; rule `read` on `namespace` when given, and a caller without
/// credentials is refused (401) when not (the listing is then filtered per namespace).
fn allow_listing(
    caller: &Caller,
    namespace: &Option<String>,
    filters: &[(&str, &Option<String>)],
) -> Result<(), ApiError> {
    for (field, value) in filters {
        if let Some(v) = value {
            present(field, value)?;
            validate::name(field, v)?;
        }
    }
    match namespace {
        Some(ns) => caller.allow(Rule::Read, ns, None)?,
        None if *caller == Caller::Anonymous => caller.allow(Rule::Read, "", None)?,
        None => {}
    }
    Ok(())
}

async fn list_services(
    State(s): State<AppState>,
    caller: Caller,
    ApiQuery(q): ApiQuery<Scope>,
) -> Result<Json<rest::ServiceList>, ApiError> {
    if q.cluster.is_some() {
        return Err(ApiError::invalid(
            "cluster",
            "is a parameter of instance paths, not of the service list",
        ));
    }
    allow_listing(
        &caller,
        &q.namespace,
        &[("namespace", &q.namespace), ("group", &q.group)],
    )?;
    let services = s
        .registry
        .services(q.namespace.as_deref(), q.group.as_deref())
        .into_iter()
        // Rule `read`, per namespace: a caller sees the namespaces it may read.
        .filter(|svc| caller.allow(Rule::Read, &svc.key.namespace, None).is_ok())
        .map(Into::into)
        .collect();
    Ok(Json(rest::ServiceList { services }))
}

async fn get_service(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
    ApiQuery(q): ApiQuery<Scope>,
) -> Result<Json<rest::Service>, ApiError> {
    let key = q.service_only(&name)?;
    caller.allow(Rule::Read, &key.namespace, None)?;
    Ok(Json(s.registry.service(&key)?.into()))
}

async fn put_service(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
    ApiQuery(q): ApiQuery<Scope>,
    ApiJson(body): ApiJson<rest::SettingsRequest>,
) -> Result<Json<rest::Service>, ApiError> {
    let key = q.service_only(&name)?;
    caller.allow(Rule::Service, &key.namespace, None)?;
    let mut settings = s.registry.settings(&key).unwrap_or_default();
    if let Some(t) = body.protect_threshold {
        settings.protect_threshold = t;
    }
    if let Some(m) = body.metadata {
        settings.metadata = m;
    }
    s.registry.put_settings(&key, settings).await?;
    Ok(Json(s.registry.service(&key)?.into()))
}

/// The REST view of `key` at `view`, each instance with who keeps it alive (from `entries`).
fn view_json(registry: &Registry, key: &ServiceKey, view: View, entries: &[Entry]) -> rest::View {
    let liveness: HashMap<&InstanceKey, &'static str> = entries
        .iter()
        .map(|e| (&e.instance.key, e.liveness.as_str()))
        .collect();
    rest::View {
        namespace: key.namespace.clone(),
        group: key.group.clone(),
        service: key.service.clone(),
        revision: view.revision,
        protection_triggered: view.protection_triggered,
        warming_up: registry.warming_up(),
        instances: view
            .instances
            .into_iter()
            .map(|i| {
                let liveness = liveness.get(&i.key).copied().unwrap_or("session");
                rest::Instance::from_domain(i, Some(liveness))
            })
            .collect(),
    }
}

async fn list_instances(
    State(s): State<AppState>,
    caller: Caller,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    ApiPath(name): ApiPath<String>,
    ApiQuery(q): ApiQuery<Scope>,
) -> Result<Json<rest::View>, ApiError> {
    let key = q.service_only(&name)?;
    caller.allow(Rule::Read, &key.namespace, None)?;
    let (revision, entries) = s.registry.entries(&key);
    if q.all && q.subscriber.is_some() {
        return Err(ApiError::invalid(
            "subscriber",
            "a poller fetches the consumer view; drop all=true",
        ));
    }
    let view = if q.all {
        let mut instances: Vec<Instance> = entries.iter().map(|e| e.instance.clone()).collect();
        instances.sort_by(|a, b| a.key.cmp(&b.key));
        let protection = s.registry.view(&key).protection_triggered;
        View {
            revision,
            instances,
            protection_triggered: protection,
        }
    } else if let Some(poller) = &q.subscriber {
        s.registry
            .poll(&key, &poller_name(&caller, poller), peer.to_string())?
    } else {
        s.registry.view(&key)
    };
    Ok(Json(view_json(&s.registry, &key, view, &entries)))
}

/// An instance change's answer: the revision and the instance as it now is.
fn change(revision: u64, instance: Instance) -> Json<rest::InstanceChange> {
    Json(rest::InstanceChange {
        revision,
        instance: instance.into(),
    })
}

async fn register(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
    ApiQuery(q): ApiQuery<Scope>,
    ApiJson(body): ApiJson<rest::RegisterRequest>,
) -> Result<Json<rest::InstanceChange>, ApiError> {
    let key = q.service_only(&name)?;
    validate::ip(&body.ip)?;
    let port = validate::port(body.port)?;
    present("cluster", &body.cluster)?;
    let mut instance = Instance::new(InstanceKey::new(
        &body.ip,
        port,
        body.cluster.as_deref().unwrap_or(""),
    ));
    instance.weight = body.weight.unwrap_or(gangway_core::model::DEFAULT_WEIGHT);
    instance.metadata = body.metadata;
    instance.enabled = body.enabled.unwrap_or(true);
    let ephemeral = body.ephemeral.unwrap_or(body.probe.is_none());
    let liveness = if ephemeral {
        if body.probe.is_some() {
            return Err(ApiError::invalid(
                "probe",
                "only persistent instances (ephemeral=false) are probed",
            ));
        }
        LivenessRequest::Lease {
            ttl: body.ttl_ms.map(Duration::from_millis),
            delete_timeout: body.delete_timeout_ms.map(Duration::from_millis),
        }
    } else {
        if body.ttl_ms.is_some() || body.delete_timeout_ms.is_some() {
            return Err(ApiError::invalid(
                "ttl_ms",
                "only ephemeral instances have a lease",
            ));
        }
        LivenessRequest::Probe(body.probe.map(rest::ProbeRequest::spec).unwrap_or_default())
    };
    caller.allow(
        Rule::Register,
        &key.namespace,
        s.registry.owner(&key, &instance.key).as_deref(),
    )?;
    // Checked again, against the owner at the moment it applies (a takeover in between).
    let (revision, instance) = s
        .registry
        .register_as(key, instance, liveness, caller)
        .await?;
    Ok(change(revision, instance))
}

async fn update(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath((name, addr)): ApiPath<(String, String)>,
    ApiQuery(q): ApiQuery<Scope>,
    ApiJson(body): ApiJson<rest::PatchRequest>,
) -> Result<Json<rest::InstanceChange>, ApiError> {
    let (key, instance) = (q.service(&name)?, q.instance(&addr)?);
    allow_instance(&s.registry, &caller, &key, &instance)?;
    let patch = Patch {
        weight: body.weight,
        metadata: body.metadata,
        enabled: body.enabled,
        until_gone: false,
        force: body.force,
    };
    let (revision, instance) = s.registry.update(&key, &instance, patch).await?;
    Ok(change(revision, instance))
}

/// The query of `DELETE .../instances/{addr}`: the scope, and `force` to remove an instance
/// that a session keeps alive.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeleteQuery {
    namespace: Option<String>,
    group: Option<String>,
    cluster: Option<String>,
    #[serde(default)]
    force: bool,
}

async fn deregister(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath((name, addr)): ApiPath<(String, String)>,
    ApiQuery(q): ApiQuery<DeleteQuery>,
) -> Result<Json<rest::Revision>, ApiError> {
    let scope = Scope {
        namespace: q.namespace,
        group: q.group,
        cluster: q.cluster,
        ..Scope::default()
    };
    let (key, instance) = (scope.service(&name)?, scope.instance(&addr)?);
    allow_instance(&s.registry, &caller, &key, &instance)?;
    let revision = s.registry.deregister(&key, &instance, q.force).await?;
    Ok(Json(rest::Revision { revision }))
}

async fn heartbeat(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath((name, addr)): ApiPath<(String, String)>,
    ApiQuery(q): ApiQuery<Scope>,
) -> Result<Json<rest::HeartbeatAnswer>, ApiError> {
    let (key, instance) = (q.service(&name)?, q.instance(&addr)?);
    allow_instance(&s.registry, &caller, &key, &instance)?;
    let ttl = s.registry.heartbeat(&key, &instance)?;
    Ok(Json(rest::HeartbeatAnswer {
        ttl_ms: ttl.as_millis() as u64,
        healthy: true,
    }))
}

/// Rule `instance` for a change to an existing instance: its owner, or `admin`.
fn allow_instance(
    registry: &Registry,
    caller: &Caller,
    key: &ServiceKey,
    instance: &InstanceKey,
) -> Result<(), ApiError> {
    Ok(caller.allow(
        Rule::Instance,
        &key.namespace,
        registry.owner(key, instance).as_deref(),
    )?)
}

/// A poller's or watcher's name bound to its principal (`alice:NAME`): another principal
/// polling with the same `subscriber=NAME` is another subscriber, and cannot ack for it.
fn poller_name(caller: &Caller, name: &str) -> String {
    match caller.owner() {
        Some(p) if !name.is_empty() => format!("{p}:{name}"),
        _ => name.to_owned(),
    }
}

/// An optional JSON body: empty (or only whitespace) takes `T::default()`; otherwise it must
/// parse, or the request gets a 400 naming `body` (413 when over [`MAX_BODY_BYTES`]).
struct OptionalJson<T>(T);

impl<S, T> FromRequest<S> for OptionalJson<T>
where
    S: Send + Sync,
    T: serde::de::DeserializeOwned + Default,
{
    type Rejection = ApiError;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, ApiError> {
        let bytes = axum::body::Bytes::from_request(req, state).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self(T::default()));
        }
        serde_json::from_slice(&bytes)
            .map(Self)
            .map_err(|e| ApiError::invalid("body", format!("invalid JSON body: {e}")))
    }
}

async fn offline(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath((name, addr)): ApiPath<(String, String)>,
    ApiQuery(q): ApiQuery<Scope>,
    OptionalJson(body): OptionalJson<rest::OfflineRequest>,
) -> Result<Json<rest::InstanceChange>, ApiError> {
    let (key, instance) = (q.service(&name)?, q.instance(&addr)?);
    allow_instance(&s.registry, &caller, &key, &instance)?;
    let (revision, instance) = s
        .registry
        .set_enabled(&key, &instance, false, body.force)
        .await?;
    Ok(change(revision, instance))
}

async fn online(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath((name, addr)): ApiPath<(String, String)>,
    ApiQuery(q): ApiQuery<Scope>,
    OptionalJson(body): OptionalJson<rest::OnlineRequest>,
) -> Result<Response, ApiError> {
    let (key, instance) = (q.service(&name)?, q.instance(&addr)?);
    allow_instance(&s.registry, &caller, &key, &instance)?;
    let timeout = drain_timeout(&s.registry, body.timeout_ms);
    if body.wait {
        // Refused before anything changes: a refused request leaves the registry as it was.
        s.registry.could_serve(&key, &instance)?;
    }
    let (revision, changed) = s.registry.set_enabled(&key, &instance, true, false).await?;
    if !body.wait {
        return Ok(change(revision, changed).into_response());
    }
    let report = s.registry.wait_ready(&key, &instance, timeout).await?;
    Ok(Json(report).into_response())
}

/// A wait's timeout from `timeout_ms` (default: the server's `Config::drain_timeout`).
fn drain_timeout(registry: &Registry, timeout_ms: Option<u64>) -> Duration {
    timeout_ms
        .map(Duration::from_millis)
        .unwrap_or(registry.config().drain_timeout)
}

async fn drain(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath((name, addr)): ApiPath<(String, String)>,
    ApiQuery(q): ApiQuery<Scope>,
    OptionalJson(body): OptionalJson<rest::DrainRequest>,
) -> Result<Json<rest::DrainReport>, ApiError> {
    let (key, instance) = (q.service(&name)?, q.instance(&addr)?);
    allow_instance(&s.registry, &caller, &key, &instance)?;
    let timeout = drain_timeout(&s.registry, body.timeout_ms);
    let report = s
        .registry
        .drain(&key, &instance, timeout, body.force)
        .await?;
    Ok(Json(report))
}

async fn subscribers(
    State(s): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
    ApiQuery(q): ApiQuery<Scope>,
) -> Result<Json<rest::Subscribers>, ApiError> {
    let key = q.service_only(&name)?;
    caller.allow(Rule::Read, &key.namespace, None)?;
    Ok(Json(rest::Subscribers {
        revision: s.registry.view(&key).revision,
        subscribers: s
            .registry
            .subscribers(&key)
            .into_iter()
            .map(subscriber)
            .collect(),
    }))
}

fn subscriber(row: SubscriberRow) -> rest::Subscriber {
    let kind = match row.kind {
        SubscriberKind::Session => "session",
        SubscriberKind::Watch => "watch",
        SubscriberKind::Poller => "poller",
    };
    rest::Subscriber {
        id: row.id,
        address: row.address,
        kind: kind.to_owned(),
        client_name: Some(row.client_name),
        acked_revision: row.acked_revision,
        acked_at_ms: row.acked_at_ms,
        pushed_revision: Some(row.pushed_revision),
        behind: row.behind as u64,
        lag_ms: row.lag_ms,
    }
}

/// Unsubscribes a watcher when its SSE stream is dropped (client gone).
struct WatchGuard {
    registry: Registry,
    id: String,
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        self.registry.unsubscribe(&self.id);
    }
}

async fn watch(
    State(s): State<AppState>,
    caller: Caller,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    ApiPath(name): ApiPath<String>,
    ApiQuery(q): ApiQuery<Scope>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let key = q.service_only(&name)?;
    caller.allow(Rule::Read, &key.namespace, None)?;
    let info = SubscriberInfo {
        client_name: poller_name(&caller, q.subscriber.as_deref().unwrap_or_default()),
        ..SubscriberInfo::new(SubscriberKind::Watch, peer.to_string())
    };
    let (id, rx) = s.registry.subscribe(&key, info)?;
    let guard = WatchGuard {
        registry: s.registry.clone(),
        id: id.clone(),
    };
    let registry = s.registry.clone();
    // A stopping server ends every watch (the client reconnects, to the next server), and a
    // reload that removes or changes the caller's credential ends its watches.
    let stopping = s.registry.stopping();
    let revoked = s.registry.config().security.authority.revoked(&caller);
    let stream = s
        .registry
        .full_pushes(id, rx)
        .take_until(stopping)
        .take_until(revoked)
        .map(move |snapshot| {
            let _keep = &guard;
            // A watcher counts as having acked what it was sent (DESIGN §4).
            registry.ack(&guard.id, snapshot.view.revision);
            let (_, entries) = registry.entries(&snapshot.service);
            let json = view_json(
                &registry,
                &snapshot.service,
                snapshot.view.clone(),
                &entries,
            );
            Ok(Event::default()
                .event("snapshot")
                .json_data(json)
                .unwrap_or_default())
        });
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(1))))
}

mod drains;
mod liveness;
pub mod loading;

#[cfg(test)]
mod tests;
