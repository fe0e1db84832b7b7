//! The Nacos naming HTTP API on the HTTP port: v1 (`/nacos/v1/ns/...`, plain-text `ok` and
//! `caused: ...;` errors like Nacos), and the v3 client and admin instance paths
//! (`/nacos/v3/{client,admin}/ns/instance`, `{code, message, data}` envelope).
//!
//! Parameters come from the query string or an `application/x-www-form-urlencoded` body
//! (the query wins when both hold a name). Every parameter is checked before anything changes.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, FromRequest, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, put};
use gangway_core::model::{DEFAULT_CLUSTER, DEFAULT_NAMESPACE, Instance, InstanceKey, ServiceKey};
use gangway_core::validate::{self, ValidationError};
use serde::Serialize;
use serde_json::{Value, json};

use super::model::{
    beat_interval_for, grouped, instance_id, json_string, parse_metadata, preserved_timing,
    service_key,
};
use super::{CLIENT_NAME_PREFIX, Nacos};
use crate::auth::{Caller, Rule};
use crate::engine::{LivenessRequest, Patch, RegistryError, SubscriberInfo, SubscriberKind};
use crate::error::ApiError;
use crate::serve::BodyTimeout;

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

/// A Nacos-style failure: status and a message, rendered by v1 as `caused: <message>;` in
/// plain text and by v3 as `{code, message, data: null}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NacosError {
    /// HTTP status.
    pub status: StatusCode,
    /// Nacos v2/v3 error code (10000 missing parameter, 20004 not found, ...).
    pub code: u32,
    /// Message without the `caused:` framing.
    pub message: String,
}

impl NacosError {
    fn bad(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            code: 10001,
            message: message.into(),
        }
    }

    /// A 400 for a broken input rule, rendered `field: rule`.
    fn invalid(e: ValidationError) -> Self {
        Self::bad(e.to_string())
    }

    fn missing(name: &str) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            code: 10000,
            message: format!("Param '{name}' is required."),
        }
    }

    fn not_found(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            code: 20004,
            message: message.into(),
        }
    }
}

impl From<RegistryError> for NacosError {
    /// The one place the Nacos HTTP layer maps an engine refusal (through its REST class).
    fn from(e: RegistryError) -> Self {
        ApiError::from(e).into()
    }
}

impl From<ApiError> for NacosError {
    fn from(e: ApiError) -> Self {
        let message = e.to_string();
        match e {
            ApiError::Invalid(_) | ApiError::Conflict { .. } | ApiError::MethodNotAllowed => {
                Self::bad(message)
            }
            ApiError::NotFound { .. } => Self::not_found(message),
            ApiError::PayloadTooLarge { .. } => Self {
                status: StatusCode::PAYLOAD_TOO_LARGE,
                code: 10001,
                message,
            },
            ApiError::WarmingUp => Self {
                status: StatusCode::SERVICE_UNAVAILABLE,
                code: 30000,
                message,
            },
            ApiError::Store(_) => Self {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                code: 30000,
                message,
            },
            // Nacos answers 403 to both; gangway keeps 401 for missing or bad credentials.
            ApiError::Unauthenticated { .. }
            | ApiError::Forbidden { .. }
            | ApiError::UnsupportedMediaType { .. } => Self {
                status: e.status(),
                code: 403,
                message,
            },
            ApiError::LimitExceeded { .. } => Self {
                status: e.status(),
                code: 429,
                message,
            },
            // Only the serving layer raises these, before any route runs.
            ApiError::UriTooLong { .. }
            | ApiError::HeadersTooLarge { .. }
            | ApiError::RequestTimeout { .. }
            | ApiError::Overloaded { .. } => Self {
                status: e.status(),
                code: 30000,
                message,
            },
        }
    }
}

impl IntoResponse for NacosError {
    fn into_response(self) -> Response {
        (
            self.status,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!("caused: {};", self.message),
        )
            .into_response()
    }
}

/// A v3 answer: `{code, message, data}`.
struct V3(Result<Value, NacosError>);

impl IntoResponse for V3 {
    fn into_response(self) -> Response {
        match self.0 {
            Ok(data) => {
                axum::Json(json!({"code": 0, "message": "success", "data": data})).into_response()
            }
            Err(e) => (
                e.status,
                axum::Json(json!({"code": e.code, "message": e.message, "data": null})),
            )
                .into_response(),
        }
    }
}

/// Query string and form body parameters, merged (the query wins).
#[derive(Debug, Default)]
pub struct Params(HashMap<String, String>);

impl<S: Send + Sync> FromRequest<S> for Params {
    type Rejection = NacosError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let mut map = HashMap::new();
        if let Some(q) = req.uri().query() {
            for (k, v) in form_urlencoded::parse(q.as_bytes()) {
                map.entry(k.into_owned()).or_insert(v.into_owned());
            }
        }
        let is_form = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
        if is_form {
            let body = Bytes::from_request(req, state)
                .await
                .map_err(|e| match e.status() {
                    _ if BodyTimeout::find(&e).is_some() => NacosError::from(ApiError::from(e)),
                    StatusCode::PAYLOAD_TOO_LARGE => NacosError {
                        status: StatusCode::PAYLOAD_TOO_LARGE,
                        code: 10001,
                        message: format!("the request body is too large: {}", e.body_text()),
                    },
                    _ => NacosError::bad(format!("unreadable body: {e}")),
                })?;
            for (k, v) in form_urlencoded::parse(&body) {
                map.entry(k.into_owned()).or_insert(v.into_owned());
            }
        }
        Ok(Params(map))
    }
}

impl Params {
    /// Builds parameters from pairs (tests).
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        Params(
            pairs
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        )
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    fn required(&self, name: &str) -> Result<&str, NacosError> {
        self.get(name).ok_or_else(|| NacosError::missing(name))
    }

    fn bool(&self, name: &str) -> Result<Option<bool>, NacosError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) if v.eq_ignore_ascii_case("true") => Ok(Some(true)),
            Some(v) if v.eq_ignore_ascii_case("false") => Ok(Some(false)),
            Some(v) => Err(NacosError::bad(format!(
                "Param '{name}' must be true or false, got {v:?}"
            ))),
        }
    }

    fn f64(&self, name: &str) -> Result<Option<f64>, NacosError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|f| f.is_finite())
                .map(Some)
                .ok_or_else(|| {
                    NacosError::bad(format!("Param '{name}' must be a number, got {v:?}"))
                }),
        }
    }

    fn u64(&self, name: &str) -> Result<Option<u64>, NacosError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v.trim().parse::<u64>().map(Some).map_err(|_| {
                NacosError::bad(format!(
                    "Param '{name}' must be a non-negative integer, got {v:?}"
                ))
            }),
        }
    }

    /// The service: `serviceName` (plain or `group@@svc`), `groupName`, `namespaceId`
    /// ([`service_key`]'s rules).
    fn service(&self) -> Result<ServiceKey, NacosError> {
        let name = self.required("serviceName")?;
        let namespace = self
            .get("namespaceId")
            .or_else(|| self.get("namespace"))
            .unwrap_or(DEFAULT_NAMESPACE);
        service_key(namespace, name, self.get("groupName")).map_err(NacosError::invalid)
    }

    fn cluster(&self) -> &str {
        self.get("clusterName")
            .or_else(|| self.get("cluster"))
            .unwrap_or(DEFAULT_CLUSTER)
    }

    /// `ip`, `port` and cluster, all required but the cluster.
    fn instance_key(&self) -> Result<InstanceKey, NacosError> {
        let ip = self.required("ip")?;
        let port = self.required("port")?;
        let key = InstanceKey::new(ip, parse_port(port)?, self.cluster());
        validate::instance_key(&key).map_err(NacosError::invalid)?;
        Ok(key)
    }

    /// `weight`: [`validate::weight`] (0, or 0.001-10000).
    fn weight(&self) -> Result<Option<f64>, NacosError> {
        let w = self.f64("weight")?;
        if let Some(w) = w {
            validate::weight(w).map_err(NacosError::invalid)?;
        }
        Ok(w)
    }

    /// `metadata` of a service: [`validate::metadata`].
    fn metadata(&self) -> Result<Option<BTreeMap<String, String>>, NacosError> {
        match self.get("metadata") {
            None => Ok(None),
            Some(raw) => {
                let m = parse_metadata(raw).map_err(NacosError::bad)?;
                validate::metadata(&m).map_err(NacosError::invalid)?;
                Ok(Some(m))
            }
        }
    }

    /// `metadata` of an instance: [`Params::metadata`], and its `preserved.*` timing keys
    /// checked ([`preserved_timing`]).
    fn instance_metadata(&self) -> Result<Option<BTreeMap<String, String>>, NacosError> {
        let m = self.metadata()?;
        if let Some(m) = &m {
            preserved_timing(m).map_err(NacosError::invalid)?;
        }
        Ok(m)
    }

    /// `udpPort`: 0 (a one-off list) to 65535 (a subscribed client's UDP port).
    fn udp_port(&self) -> Result<u16, NacosError> {
        let port = self.u64("udpPort")?.unwrap_or(0);
        u16::try_from(port).map_err(|_| {
            NacosError::invalid(ValidationError::new(
                "udpPort",
                format!("must be 0-65535, got {port}"),
            ))
        })
    }

    fn enabled(&self) -> Result<Option<bool>, NacosError> {
        Ok(match self.bool("enabled")? {
            Some(v) => Some(v),
            None => self.bool("enable")?,
        })
    }
}

fn parse_port(raw: &str) -> Result<u16, NacosError> {
    raw.trim()
        .parse::<u32>()
        .ok()
        .and_then(|p| validate::port(p).ok())
        .ok_or_else(|| {
            NacosError::bad(format!(
                "Param 'port' must be an integer 1-65535, got {raw:?}"
            ))
        })
}

/// A fully parsed registration.
struct Registration {
    service: ServiceKey,
    instance: Instance,
    ephemeral: bool,
    enabled: bool,
}

fn registration(p: &Params) -> Result<Registration, NacosError> {
    let service = p.service()?;
    let key = p.instance_key()?;
    let weight = p.weight()?.unwrap_or(gangway_core::model::DEFAULT_WEIGHT);
    let metadata = p.instance_metadata()?.unwrap_or_default();
    let enabled = p.enabled()?.unwrap_or(true);
    let ephemeral = p.bool("ephemeral")?.unwrap_or(true);
    p.bool("healthy")?;
    let mut instance = Instance::new(key);
    instance.weight = weight;
    instance.metadata = metadata;
    instance.ephemeral = ephemeral;
    Ok(Registration {
        service,
        instance,
        ephemeral,
        enabled,
    })
}

/// Registers a parsed registration: ephemeral ones on a lease (TTL and delete timeout from
/// the `preserved.*` metadata, checked by [`preserved_timing`], else the server's), persistent
/// ones with the default TCP probe.
async fn register_parsed(
    nacos: &Nacos,
    caller: &Caller,
    r: Registration,
) -> Result<(), NacosError> {
    let owner = nacos.registry().owner(&r.service, &r.instance.key);
    caller
        .allow(Rule::Register, &r.service.namespace, owner.as_deref())
        .map_err(ApiError::from)?;
    let timing = preserved_timing(&r.instance.metadata).map_err(NacosError::invalid)?;
    let liveness = if r.ephemeral {
        LivenessRequest::Lease {
            ttl: timing.beat_timeout,
            delete_timeout: timing.delete_timeout,
        }
    } else {
        LivenessRequest::Probe(gangway_core::model::ProbeSpec::default())
    };
    // Disabled from its first revision, with its offline mark: never published enabled.
    let mut instance = r.instance;
    instance.enabled = r.enabled;
    nacos
        .registry()
        .register_as(r.service, instance, liveness, caller.clone())
        .await?;
    Ok(())
}

async fn v1_register(
    State(nacos): State<Nacos>,
    caller: Caller,
    p: Params,
) -> Result<&'static str, NacosError> {
    let r = registration(&p)?;
    register_parsed(&nacos, &caller, r).await?;
    Ok("ok")
}

async fn v1_deregister(
    State(nacos): State<Nacos>,
    caller: Caller,
    p: Params,
) -> Result<&'static str, NacosError> {
    let service = p.service()?;
    let key = p.instance_key()?;
    allow_instance(&nacos, &caller, &service, &key)?;
    p.bool("ephemeral")?;
    match nacos.registry().deregister(&service, &key, false).await {
        // Nacos answers ok for an unknown instance too.
        Ok(_) | Err(RegistryError::UnknownInstance { .. }) => Ok("ok"),
        Err(e) => Err(e.into()),
    }
}

fn patch(p: &Params) -> Result<Patch, NacosError> {
    Ok(Patch {
        weight: p.weight()?,
        metadata: p.instance_metadata()?,
        enabled: p.enabled()?,
        until_gone: false,
        force: false,
    })
}

async fn v1_modify(
    State(nacos): State<Nacos>,
    caller: Caller,
    p: Params,
) -> Result<&'static str, NacosError> {
    let service = p.service()?;
    let key = p.instance_key()?;
    allow_instance(&nacos, &caller, &service, &key)?;
    let patch = patch(&p)?;
    p.bool("ephemeral")?;
    p.bool("healthy")?;
    nacos.registry().update(&service, &key, patch).await?;
    Ok("ok")
}

fn detail_json(nacos: &Nacos, p: &Params) -> Result<Value, NacosError> {
    let service = p.service()?;
    let key = p.instance_key()?;
    let (_, entries) = nacos.registry().entries(&service);
    let entry = entries
        .iter()
        .find(|e| e.instance.key == key)
        .ok_or_else(|| {
            NacosError::not_found(format!(
                "no ips found for cluster {} in service {}",
                key.cluster,
                grouped(&service)
            ))
        })?;
    let i = &entry.instance;
    Ok(json!({
        "service": grouped(&service),
        "serviceName": service.service,
        "groupName": service.group,
        "namespaceId": service.namespace,
        "ip": i.key.ip,
        "port": i.key.port,
        "clusterName": i.key.cluster,
        "weight": i.weight,
        "healthy": i.healthy,
        "enabled": i.enabled,
        "ephemeral": i.ephemeral,
        "instanceId": instance_id(&service, i),
        "metadata": i.metadata,
    }))
}

async fn v1_detail(
    State(nacos): State<Nacos>,
    caller: Caller,
    p: Params,
) -> Result<Response, NacosError> {
    allow_read(&caller, &p.service()?)?;
    Ok(axum::Json(detail_json(&nacos, &p)?).into_response())
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct BeatReply {
    client_beat_interval: u64,
    code: u32,
    light_beat_enabled: bool,
}

async fn v1_beat(
    State(nacos): State<Nacos>,
    caller: Caller,
    p: Params,
) -> Result<Response, NacosError> {
    let beat: Option<serde_json::Map<String, Value>> = match p.get("beat") {
        None => None,
        Some(raw) => match serde_json::from_str::<Value>(raw) {
            Ok(Value::Object(m)) => Some(m),
            _ => {
                return Err(NacosError::bad(format!(
                    "Param 'beat' is not a JSON object: {raw}"
                )));
            }
        },
    };
    let from_beat = |k: &str| -> Option<String> {
        beat.as_ref()
            .and_then(|b| b.get(k))
            .filter(|v| !v.is_null())
            .map(|v| json_string(v.clone()))
            .filter(|v| !v.is_empty())
    };
    let service = p.service()?;
    let ip = from_beat("ip")
        .or_else(|| p.get("ip").map(str::to_owned))
        .ok_or_else(|| NacosError::missing("ip"))?;
    let port = from_beat("port")
        .or_else(|| p.get("port").map(str::to_owned))
        .ok_or_else(|| NacosError::missing("port"))?;
    let cluster = from_beat("cluster")
        .or_else(|| {
            p.get("clusterName")
                .or_else(|| p.get("cluster"))
                .map(str::to_owned)
        })
        .unwrap_or_else(|| DEFAULT_CLUSTER.to_owned());
    let key = InstanceKey::new(&ip, parse_port(&port)?, &cluster);
    validate::instance_key(&key).map_err(NacosError::invalid)?;
    // A beat for an unknown instance re-registers it (rule `register`, checked there).
    if nacos.registry().instance(&service, &key).is_ok() {
        allow_instance(&nacos, &caller, &service, &key)?;
    } else if beat.is_none() {
        allow_read(&caller, &service)?;
    }
    let registry = nacos.registry();
    let reply = |code: u32, ttl_ms: u64| {
        axum::Json(BeatReply {
            client_beat_interval: beat_interval_for(ttl_ms),
            code,
            light_beat_enabled: true,
        })
        .into_response()
    };
    let default_ttl = registry.config().liveness.lease_ttl.as_millis() as u64;
    match registry.heartbeat(&service, &key) {
        Ok(ttl) => Ok(reply(BEAT_OK, ttl.as_millis() as u64)),
        // Kept alive by a session or a probe: nothing to renew, and nothing wrong.
        Err(RegistryError::NotLeaseKept { .. }) => Ok(reply(BEAT_OK, default_ttl)),
        Err(RegistryError::UnknownInstance { .. }) => {
            let Some(beat) = &beat else {
                return Ok(reply(BEAT_NOT_FOUND, default_ttl));
            };
            // A full beat re-registers the instance (Nacos `handleBeat`).
            let mut instance = Instance::new(key.clone());
            if let Some(w) = beat.get("weight").and_then(Value::as_f64) {
                instance.weight = w;
            }
            if let Some(Value::Object(m)) = beat.get("metadata") {
                instance.metadata = m
                    .iter()
                    .map(|(k, v)| (k.clone(), json_string(v.clone())))
                    .collect();
            }
            let ephemeral = beat
                .get("ephemeral")
                .and_then(Value::as_bool)
                .unwrap_or(true);
            let r = Registration {
                service,
                instance,
                ephemeral,
                enabled: true,
            };
            register_parsed(&nacos, &caller, r).await?;
            tracing::info!(instance = %key, "nacos v1 beat re-registered an unknown instance");
            Ok(reply(BEAT_OK, default_ttl))
        }
        Err(e) => Err(e.into()),
    }
}

/// Registers the caller of a v1 list as a poller when it gave a `udpPort` > 0 (what a
/// subscribed 1.x or Node client sends; one-off lists send 0). The poller is identified by
/// `clientIP:udpPort` (the peer's IP when `clientIP` is absent) and the service, so one
/// client process polling one service is one subscriber. With auth on the identity is bound to
/// the principal (`<principal>:nacos-v1-...`, as `subscriber=NAME` is): another principal
/// polling with the same `clientIP` and `udpPort` is another subscriber and cannot ack for it.
fn register_poller(
    nacos: &Nacos,
    caller: &Caller,
    service: &ServiceKey,
    p: &Params,
    peer: SocketAddr,
) -> Result<(), NacosError> {
    let udp = p.udp_port()?;
    if udp == 0 {
        return Ok(());
    }
    let client_ip = p
        .get("clientIP")
        .map(str::to_owned)
        .unwrap_or_else(|| peer.ip().to_string());
    let identity = format!("{client_ip}:{udp}");
    let name = match caller.owner() {
        Some(p) => format!(
            "{p}:{CLIENT_NAME_PREFIX}-v1-{:016x}",
            fnv1a(&format!("{service}|{p}|{identity}"))
        ),
        None => format!(
            "{CLIENT_NAME_PREFIX}-v1-{:016x}",
            fnv1a(&format!("{service}|{identity}"))
        ),
    };
    let expiry = Duration::from_millis(POLLER_EXPIRY_POLLS * super::model::CACHE_MILLIS);
    let info = SubscriberInfo {
        // Nacos v1 clients keep their last list when they fetch one with no usable instance.
        ignores_empty_lists: true,
        ..SubscriberInfo::new(SubscriberKind::Poller, identity)
    };
    nacos
        .registry()
        .poll_as(service, &name, info, Some(expiry))?;
    Ok(())
}

fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

async fn v1_list(
    State(nacos): State<Nacos>,
    caller: Caller,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    p: Params,
) -> Result<Response, NacosError> {
    let service = p.service()?;
    allow_read(&caller, &service)?;
    let healthy_only = p.bool("healthyOnly")?.unwrap_or(false);
    let clusters = p.get("clusters").unwrap_or("").to_owned();
    // Poll first: the revision acked is then never newer than the content returned.
    register_poller(&nacos, &caller, &service, &p, peer)?;
    let (_, info) = nacos.service_info(&service, &clusters, healthy_only, true);
    Ok(axum::Json(info).into_response())
}

fn service_exists(nacos: &Nacos, key: &ServiceKey) -> Option<crate::engine::ServiceSummary> {
    nacos.registry().service(key).ok().filter(|s| {
        s.instances > 0 || s.settings != gangway_core::model::ServiceSettings::default()
    })
}

fn threshold(p: &Params) -> Result<Option<f64>, NacosError> {
    let t = p.f64("protectThreshold")?;
    if let Some(t) = t {
        validate::protect_threshold(t).map_err(NacosError::invalid)?;
    }
    Ok(t)
}

async fn v1_service_create(
    State(nacos): State<Nacos>,
    caller: Caller,
    p: Params,
) -> Result<&'static str, NacosError> {
    let key = p.service()?;
    caller
        .allow(Rule::Service, &key.namespace, None)
        .map_err(ApiError::from)?;
    let protect_threshold = threshold(&p)?.unwrap_or(0.0);
    let metadata = p.metadata()?.unwrap_or_default();
    if service_exists(&nacos, &key).is_some() {
        return Err(NacosError::bad(format!(
            "specified service already exists, serviceName : {}",
            grouped(&key)
        )));
    }
    let settings = gangway_core::model::ServiceSettings {
        protect_threshold,
        metadata,
    };
    nacos.registry().put_settings(&key, settings).await?;
    Ok("ok")
}

async fn v1_service_update(
    State(nacos): State<Nacos>,
    caller: Caller,
    p: Params,
) -> Result<&'static str, NacosError> {
    let key = p.service()?;
    caller
        .allow(Rule::Service, &key.namespace, None)
        .map_err(ApiError::from)?;
    let protect_threshold = threshold(&p)?;
    let metadata = p.metadata()?;
    let Some(summary) = service_exists(&nacos, &key) else {
        return Err(NacosError::bad(format!(
            "service {} not found",
            grouped(&key)
        )));
    };
    let mut settings = summary.settings;
    if let Some(t) = protect_threshold {
        settings.protect_threshold = t;
    }
    if let Some(m) = metadata {
        settings.metadata = m;
    }
    nacos.registry().put_settings(&key, settings).await?;
    Ok("ok")
}

async fn v1_service_delete(
    State(nacos): State<Nacos>,
    caller: Caller,
    p: Params,
) -> Result<&'static str, NacosError> {
    let key = p.service()?;
    caller
        .allow(Rule::Service, &key.namespace, None)
        .map_err(ApiError::from)?;
    let Some(summary) = service_exists(&nacos, &key) else {
        return Err(NacosError::bad(format!(
            "service {} not found",
            grouped(&key)
        )));
    };
    if summary.instances > 0 {
        return Err(NacosError::bad(format!(
            "service {} is not empty, can't be delete. Please unregister instance first",
            grouped(&key)
        )));
    }
    nacos.registry().delete_service(&key).await?;
    Ok("ok")
}

async fn v1_service_get(
    State(nacos): State<Nacos>,
    caller: Caller,
    p: Params,
) -> Result<Response, NacosError> {
    let key = p.service()?;
    allow_read(&caller, &key)?;
    let Some(summary) = service_exists(&nacos, &key) else {
        return Err(NacosError::not_found(format!(
            "service {} not found",
            grouped(&key)
        )));
    };
    let (_, entries) = nacos.registry().entries(&key);
    let mut clusters: Vec<&str> = entries
        .iter()
        .map(|e| e.instance.key.cluster.as_str())
        .collect();
    clusters.sort();
    clusters.dedup();
    let clusters: Vec<Value> = clusters
        .into_iter()
        .map(|c| json!({"name": c, "healthChecker": {"type": "NONE"}, "metadata": {}}))
        .collect();
    Ok(axum::Json(json!({
        "namespaceId": key.namespace,
        "groupName": key.group,
        "name": key.service,
        "protectThreshold": summary.settings.protect_threshold,
        "metadata": summary.settings.metadata,
        "selector": {"type": "none", "contextType": "NONE"},
        "clusters": clusters,
    }))
    .into_response())
}

async fn v1_service_list(
    State(nacos): State<Nacos>,
    caller: Caller,
    p: Params,
) -> Result<Response, NacosError> {
    let page_no = p
        .u64("pageNo")?
        .ok_or_else(|| NacosError::missing("pageNo"))?;
    let page_size = p
        .u64("pageSize")?
        .ok_or_else(|| NacosError::missing("pageSize"))?;
    let namespace = p.get("namespaceId").unwrap_or(DEFAULT_NAMESPACE);
    caller
        .allow(Rule::Read, namespace, None)
        .map_err(ApiError::from)?;
    let group = p
        .get("groupName")
        .unwrap_or(gangway_core::model::DEFAULT_GROUP);
    let (count, doms) = service_page(&nacos, namespace, group, page_no, page_size);
    Ok(axum::Json(json!({"count": count, "doms": doms})).into_response())
}

/// One page (from 1) of the service names in a namespace and group, and the total count.
pub fn service_page(
    nacos: &Nacos,
    namespace: &str,
    group: &str,
    page_no: u64,
    page_size: u64,
) -> (usize, Vec<String>) {
    let names: Vec<String> = nacos
        .registry()
        .services(Some(namespace), Some(group))
        .into_iter()
        .map(|s| s.key.service)
        .collect();
    let skip = page_no.saturating_sub(1).saturating_mul(page_size) as usize;
    let page = names
        .iter()
        .skip(skip)
        .take(page_size as usize)
        .cloned()
        .collect();
    (names.len(), page)
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

async fn v3_client_register(State(nacos): State<Nacos>, caller: Caller, p: Params) -> V3 {
    V3(async {
        if p.bool("heartBeat")?.unwrap_or(false) {
            let service = p.service()?;
            let key = p.instance_key()?;
            allow_instance(&nacos, &caller, &service, &key)?;
            return match nacos.registry().heartbeat(&service, &key) {
                Ok(_) | Err(RegistryError::NotLeaseKept { .. }) => Ok(json!("ok")),
                Err(RegistryError::UnknownInstance { .. }) => Err(NacosError {
                    status: StatusCode::NOT_FOUND,
                    code: 21003,
                    message: format!("instance {key} not found in {}", grouped(&service)),
                }),
                Err(e) => Err(e.into()),
            };
        }
        register_parsed(&nacos, &caller, registration(&p)?).await?;
        Ok(json!("ok"))
    }
    .await)
}

async fn v3_register(State(nacos): State<Nacos>, caller: Caller, p: Params) -> V3 {
    V3(async {
        register_parsed(&nacos, &caller, registration(&p)?).await?;
        Ok(json!("ok"))
    }
    .await)
}

async fn v3_deregister(State(nacos): State<Nacos>, caller: Caller, p: Params) -> V3 {
    V3(async {
        let service = p.service()?;
        let key = p.instance_key()?;
        allow_instance(&nacos, &caller, &service, &key)?;
        match nacos.registry().deregister(&service, &key, false).await {
            Ok(_) => Ok(json!("ok")),
            Err(RegistryError::UnknownInstance { .. }) => Err(NacosError {
                status: StatusCode::NOT_FOUND,
                code: 21003,
                message: format!("instance {key} not found in {}", grouped(&service)),
            }),
            Err(e) => Err(e.into()),
        }
    }
    .await)
}

async fn v3_modify(State(nacos): State<Nacos>, caller: Caller, p: Params) -> V3 {
    V3(async {
        let service = p.service()?;
        let key = p.instance_key()?;
        allow_instance(&nacos, &caller, &service, &key)?;
        let patch = patch(&p)?;
        nacos.registry().update(&service, &key, patch).await?;
        Ok(json!("ok"))
    }
    .await)
}

async fn v3_detail(State(nacos): State<Nacos>, caller: Caller, p: Params) -> V3 {
    V3(p.service()
        .and_then(|s| allow_read(&caller, &s))
        .and_then(|()| detail_json(&nacos, &p)))
}

/// v3 client list: the instance array with the protect threshold applied.
async fn v3_client_list(State(nacos): State<Nacos>, caller: Caller, p: Params) -> V3 {
    V3((|| {
        let service = p.service()?;
        let clusters = p
            .get("clusterName")
            .or_else(|| p.get("clusters"))
            .unwrap_or("");
        let healthy_only = p.bool("healthyOnly")?.unwrap_or(false);
        allow_read(&caller, &service)?;
        let (_, info) = nacos.service_info(&service, clusters, healthy_only, true);
        Ok(serde_json::to_value(info.hosts).unwrap_or(Value::Null))
    })())
}

/// v3 admin list: every instance (disabled ones too), real health flags, no threshold.
async fn v3_admin_list(State(nacos): State<Nacos>, caller: Caller, p: Params) -> V3 {
    V3((|| {
        let service = p.service()?;
        let healthy_only = p.bool("healthyOnly")?.unwrap_or(false);
        let clusters = p
            .get("clusterName")
            .or_else(|| p.get("clusters"))
            .unwrap_or("");
        allow_read(&caller, &service)?;
        let wanted = super::model::cluster_list(clusters);
        let (_, entries) = nacos.registry().entries(&service);
        let hosts: Vec<_> = entries
            .iter()
            .filter(|e| wanted.is_empty() || wanted.contains(&e.instance.key.cluster.as_str()))
            .filter(|e| !healthy_only || e.instance.healthy)
            .map(|e| super::model::nacos_instance(&service, e, false))
            .collect();
        Ok(serde_json::to_value(hosts).unwrap_or(Value::Null))
    })())
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
