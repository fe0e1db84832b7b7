//! The Nacos 2.x/3.x SDK gRPC protocol: `Request/request` (unary) and
//! `BiRequestStream/requestBiStream`, each message a `Payload` whose JSON body is dispatched on
//! `metadata.type`.
//!
//! A *connection* is one HTTP/2 transport, recognised by its peer address: the unary calls and
//! the stream of one client share it (as in Nacos's `AddressTransportFilter`). The
//! `ConnectionSetupRequest` on the stream opens a gangway session for it; the connection's
//! ephemeral instances and subscriptions belong to that session and go the moment the stream
//! ends (process exit, kill, or the HTTP/2 keepalive timeout for a frozen peer). Naming requests
//! on a connection without a session get error 301, which makes SDKs reconnect.
//!
//! Subscriptions become gangway subscribers: each push is a `NotifySubscriberRequest` on the
//! stream with its own `requestId`; the client's `NotifySubscriberResponse` with that id is the
//! ack of the pushed revision, which is what `gangway offline --wait` waits for.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::{Stream, StreamExt};
use gangway_core::model::{DEFAULT_WEIGHT, Instance, InstanceKey, ProbeSpec, ServiceKey};
use gangway_core::validate;
use gangway_proto::nacos as pb;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

use super::model::{json_string, preserved_timing, service_key};
use super::{CLIENT_NAME_PREFIX, Nacos};
use crate::auth::{Caller, Credentials, Rule};
use crate::engine::{Liveness, LivenessRequest, RegistryError, SubscriberInfo, SubscriberKind};
use crate::error::ApiError;

/// Outbound buffer per connection stream, in messages.
const OUTBOUND: usize = 256;
/// Unacked push request ids remembered per connection before the oldest are forgotten.
const MAX_PENDING: usize = 1024;

/// Nacos error code: the server is starting.
pub const INVALID_SERVER_STATUS: i32 = 300;
/// Nacos error code: the connection is not registered (the client reconnects).
pub const UN_REGISTER: i32 = 301;
/// Nacos error code: no handler for the request type.
pub const NO_HANDLER: i32 = 302;
/// Nacos error code: invalid parameter.
pub const INVALID_PARAM: i32 = 400;
/// Nacos's error code for a missing, invalid or insufficient `accessToken`.
pub const NO_RIGHT: i32 = 403;
/// Nacos error code: the payload could not be parsed.
pub const BAD_GATEWAY: i32 = 502;

/// The abilities announced in `SetupAckRequest`.
fn server_abilities() -> Value {
    json!({
        "supportPersistentInstanceByGrpc": true,
        "supportDeltaPush": false,
        "supportRemoteMetrics": false,
        "fuzzyWatch": false,
        "lock": false,
        "mcp": false,
        "agent": false,
    })
}

/// The two tonic services, to add to the gRPC server.
pub fn services(
    nacos: Nacos,
) -> (
    pb::request_server::RequestServer<NacosGrpc>,
    pb::bi_request_stream_server::BiRequestStreamServer<NacosGrpc>,
) {
    let svc = NacosGrpc { nacos };
    (
        pb::request_server::RequestServer::new(svc.clone()),
        pb::bi_request_stream_server::BiRequestStreamServer::new(svc),
    )
}

/// The tonic service implementing both Nacos gRPC services.
#[derive(Clone)]
pub struct NacosGrpc {
    nacos: Nacos,
}

/// Connections that never opened their stream are forgotten after this.
const UNSET_CONN_EXPIRY: Duration = Duration::from_secs(60);

/// One Nacos gRPC connection (transport).
pub struct Conn {
    /// Nacos connection id: `<ms>_<ip>_<port>`.
    pub id: String,
    created: Instant,
    /// Asks the connection's stream to end (failed client detection).
    stop: Notify,
    state: Mutex<ConnState>,
}

#[derive(Default)]
struct ConnState {
    /// The gangway session, once `ConnectionSetupRequest` arrived.
    session: Option<String>,
    client_name: String,
    tx: Option<mpsc::Sender<pb::Payload>>,
    subs: HashMap<ServiceKey, Sub>,
    /// Push request id -> (subscriber id, revision pushed).
    pending: HashMap<String, (String, u64)>,
    /// Last request or stream message from the client.
    last_active: Option<Instant>,
    detector: Option<tokio::task::AbortHandle>,
}

struct Sub {
    id: String,
    task: tokio::task::AbortHandle,
}

impl Conn {
    fn lock(&self) -> MutexGuard<'_, ConnState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn touch(&self) {
        self.lock().last_active = Some(Instant::now());
    }
}

/// A request refused: Nacos `errorCode` and message.
#[derive(Debug)]
struct Refusal {
    code: i32,
    message: String,
}

impl Refusal {
    fn new(code: i32, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

impl From<RegistryError> for Refusal {
    /// The one place the Nacos gRPC layer maps an engine refusal (through its REST class).
    fn from(e: RegistryError) -> Self {
        ApiError::from(e).into()
    }
}

impl From<ApiError> for Refusal {
    fn from(e: ApiError) -> Self {
        let code = match &e {
            ApiError::Invalid(_)
            | ApiError::Conflict { .. }
            | ApiError::MethodNotAllowed
            | ApiError::UriTooLong { .. }
            | ApiError::HeadersTooLarge { .. } => INVALID_PARAM,
            ApiError::NotFound { .. } => 404,
            ApiError::PayloadTooLarge { .. } => INVALID_PARAM,
            ApiError::WarmingUp | ApiError::Overloaded { .. } | ApiError::RequestTimeout { .. } => {
                INVALID_SERVER_STATUS
            }
            ApiError::Store(_) => 500,
            ApiError::LimitExceeded { .. } => 429,
            // Nacos's answer to a missing or refused accessToken.
            ApiError::Unauthenticated { .. }
            | ApiError::Forbidden { .. }
            | ApiError::UnsupportedMediaType { .. } => NO_RIGHT,
        };
        Self::new(code, e.to_string())
    }
}

/// Rule `read` on `namespace`.
fn allow_read(caller: &Caller, namespace: &str) -> Result<(), Refusal> {
    Ok(caller
        .allow(Rule::Read, namespace, None)
        .map_err(ApiError::from)?)
}

/// A payload of `ty` with `body` as JSON.
pub fn payload(ty: &str, body: &Value) -> pb::Payload {
    raw_payload(ty, serde_json::to_vec(body).unwrap_or_default())
}

/// A payload of type `ty` whose JSON body is already encoded.
fn raw_payload(ty: &str, body: Vec<u8>) -> pb::Payload {
    pb::Payload {
        metadata: Some(pb::Metadata {
            r#type: ty.to_owned(),
            client_ip: String::new(),
            headers: HashMap::new(),
        }),
        body: Some(pb::Any {
            type_url: String::new(),
            value: body,
        }),
    }
}

/// The JSON body of a `NotifySubscriberRequest` (Nacos v2 protocol) carrying `service_info`,
/// already encoded and shared by every subscriber pushed the same revision.
fn notify_body(request_id: &str, service: &ServiceKey, service_info: &str) -> Vec<u8> {
    let head = json!({
        "requestId": request_id,
        "headers": {},
        "module": "naming",
        "namespace": service.namespace,
        "serviceName": service.service,
        "groupName": service.group,
    })
    .to_string();
    // `{...,"serviceInfo":<service_info>}`: the head without its closing brace, then the field.
    let mut body = Vec::with_capacity(head.len() + service_info.len() + 16);
    body.extend_from_slice(&head.as_bytes()[..head.len() - 1]);
    body.extend_from_slice(b",\"serviceInfo\":");
    body.extend_from_slice(service_info.as_bytes());
    body.push(b'}');
    body
}

/// A successful response of `ty`: the common fields plus `extra`'s.
fn ok(ty: &str, request_id: &str, extra: Value) -> pb::Payload {
    let mut body = json!({
        "resultCode": 200,
        "errorCode": 0,
        "success": true,
        "requestId": request_id,
    });
    if let (Value::Object(b), Value::Object(e)) = (&mut body, extra) {
        b.extend(e);
    }
    payload(ty, &body)
}

/// An `ErrorResponse`.
fn error(request_id: &str, r: Refusal) -> pb::Payload {
    payload(
        "ErrorResponse",
        &json!({
            "resultCode": 500,
            "errorCode": r.code,
            "message": r.message,
            "success": false,
            "requestId": request_id,
        }),
    )
}

/// Fields every naming request carries.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct NamingRequest {
    namespace: Option<String>,
    service_name: Option<String>,
    group_name: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
    instance: Option<WireInstance>,
    instances: Option<Vec<WireInstance>>,
    cluster: Option<String>,
    clusters: Option<String>,
    healthy_only: Option<bool>,
    /// The Python SDK's spelling.
    health_only: Option<bool>,
    subscribe: Option<bool>,
    page_no: Option<u64>,
    page_size: Option<u64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireInstance {
    #[serde(default)]
    ip: String,
    #[serde(default)]
    port: i64,
    weight: Option<f64>,
    enabled: Option<bool>,
    cluster_name: Option<String>,
    metadata: Option<HashMap<String, Value>>,
}

impl NamingRequest {
    fn service(&self) -> Result<ServiceKey, Refusal> {
        let name = self.service_name.as_deref().unwrap_or("");
        if name.is_empty() {
            return Err(Refusal::new(INVALID_PARAM, "serviceName must not be empty"));
        }
        let namespace = self.namespace.as_deref().unwrap_or("");
        let key =
            service_key(namespace, name, self.group_name.as_deref()).map_err(ApiError::from)?;
        Ok(key)
    }

    /// What an `InstanceRequest` or `PersistentInstanceRequest` carries: the service, the request
    /// type (`registerInstance`, `deregisterInstance`), the instance and whether it is disabled.
    fn single_instance(&self) -> Result<(ServiceKey, String, Instance, bool), Refusal> {
        let service = self.service()?;
        let kind = self.kind.clone().unwrap_or_default();
        let wire = self
            .instance
            .as_ref()
            .ok_or_else(|| Refusal::new(INVALID_PARAM, "instance is required"))?;
        let (instance, disabled) = wire.to_instance()?;
        Ok((service, kind, instance, disabled))
    }
}

impl WireInstance {
    /// The gangway instance and whether it asked to be disabled, every field checked (so a
    /// batch is refused whole, before any of it is registered): address, weight, metadata and
    /// its `preserved.*` timing keys ([`preserved_timing`]).
    fn to_instance(&self) -> Result<(Instance, bool), Refusal> {
        let port = u32::try_from(self.port).unwrap_or(0);
        let port = validate::port(port).map_err(ApiError::from)?;
        let key = InstanceKey::new(&self.ip, port, self.cluster_name.as_deref().unwrap_or(""));
        validate::instance_key(&key).map_err(ApiError::from)?;
        let mut instance = Instance::new(key);
        instance.weight = self.weight.unwrap_or(DEFAULT_WEIGHT);
        instance.metadata = self
            .metadata
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, json_string(v)))
            .collect();
        validate::weight(instance.weight).map_err(ApiError::from)?;
        validate::metadata(&instance.metadata).map_err(ApiError::from)?;
        preserved_timing(&instance.metadata).map_err(ApiError::from)?;
        Ok((instance, self.enabled == Some(false)))
    }
}

type BiStream = Pin<Box<dyn Stream<Item = Result<pb::Payload, Status>> + Send>>;

#[tonic::async_trait]
impl pb::request_server::Request for NacosGrpc {
    async fn request(
        &self,
        request: tonic::Request<pb::Payload>,
    ) -> Result<tonic::Response<pb::Payload>, Status> {
        refuse_while_loading(&self.nacos)?;
        let peer = request.remote_addr();
        let reply = self.nacos.unary(peer, request.into_inner()).await;
        Ok(tonic::Response::new(reply))
    }
}

#[tonic::async_trait]
impl pb::bi_request_stream_server::BiRequestStream for NacosGrpc {
    type requestBiStreamStream = BiStream;

    async fn request_bi_stream(
        &self,
        request: tonic::Request<Streaming<pb::Payload>>,
    ) -> Result<tonic::Response<BiStream>, Status> {
        refuse_while_loading(&self.nacos)?;
        let peer = request
            .remote_addr()
            .ok_or_else(|| Status::internal("no peer address"))?;
        let inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(OUTBOUND);
        tokio::spawn(self.nacos.clone().run_stream(peer, inbound, tx));
        // The stream ends in an error, never with OK: the Python SDK (3.2.0) reconnects only
        // when its stream iterator raises; a stream that ends cleanly (the server stopping, a
        // connection closed by detection) left it talking to a registry that no longer knew
        // its connection, for good.
        let ended = futures::stream::once(async {
            Err(Status::unavailable(
                "the registry ended this connection; reconnect",
            ))
        });
        Ok(tonic::Response::new(Box::pin(
            ReceiverStream::new(rx).map(Ok).chain(ended),
        )))
    }
}

/// UNAVAILABLE while the registry loads its store (Nacos SDKs retry their server check).
fn refuse_while_loading(nacos: &Nacos) -> Result<(), Status> {
    if nacos.registry().is_loading() {
        return Err(Status::unavailable(
            "the registry is loading its store; retry shortly",
        ));
    }
    Ok(())
}

fn body_of(p: &pb::Payload) -> Option<Value> {
    let bytes = p.body.as_ref().map(|b| b.value.as_slice()).unwrap_or(b"{}");
    match serde_json::from_slice::<Value>(bytes) {
        Ok(v @ Value::Object(_)) => Some(v),
        _ => None,
    }
}

fn type_of(p: &pb::Payload) -> &str {
    p.metadata.as_ref().map(|m| m.r#type.as_str()).unwrap_or("")
}

impl Nacos {
    fn conn_or_new(&self, peer: SocketAddr) -> Arc<Conn> {
        let mut conns = self.conns();
        // Server checks whose stream never came (the client gave up) leave entries behind.
        conns.retain(|_, c| c.lock().session.is_some() || c.created.elapsed() < UNSET_CONN_EXPIRY);
        conns
            .entry(peer)
            .or_insert_with(|| {
                let ms = super::now_ms();
                Arc::new(Conn {
                    id: format!("{ms}_{}_{}", peer.ip(), peer.port()),
                    created: Instant::now(),
                    stop: Notify::new(),
                    state: Mutex::new(ConnState::default()),
                })
            })
            .clone()
    }

    /// The connection of `peer` and its session, if set up.
    fn registered(&self, peer: SocketAddr) -> Option<(Arc<Conn>, String)> {
        let conn = self.conns().get(&peer).cloned()?;
        let mut st = conn.lock();
        let session = st.session.clone()?;
        st.last_active = Some(Instant::now());
        drop(st);
        Some((conn, session))
    }

    /// Number of Nacos gRPC connections with a session.
    pub fn connection_count(&self) -> usize {
        self.conns()
            .values()
            .filter(|c| c.lock().session.is_some())
            .count()
    }

    async fn unary(&self, peer: Option<SocketAddr>, p: pb::Payload) -> pb::Payload {
        let ty = type_of(&p).to_owned();
        let Some(body) = body_of(&p) else {
            return error(
                "",
                Refusal::new(BAD_GATEWAY, "the payload body is not a JSON object"),
            );
        };
        let rid = body
            .get("requestId")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let Some(peer) = peer else {
            return error(&rid, Refusal::new(500, "no peer address"));
        };
        match ty.as_str() {
            "ServerCheckRequest" => {
                let conn = self.conn_or_new(peer);
                ok(
                    "ServerCheckResponse",
                    &rid,
                    json!({"connectionId": conn.id, "supportAbilityNegotiation": true}),
                )
            }
            "HealthCheckRequest" => match self.registered(peer) {
                Some(_) => ok("HealthCheckResponse", &rid, json!({})),
                None => error(
                    &rid,
                    Refusal::new(UN_REGISTER, "connection is not registered"),
                ),
            },
            "InstanceRequest"
            | "BatchInstanceRequest"
            | "PersistentInstanceRequest"
            | "ServiceQueryRequest"
            | "SubscribeServiceRequest"
            | "ServiceListRequest" => {
                let Some((conn, session)) = self.registered(peer) else {
                    return error(
                        &rid,
                        Refusal::new(UN_REGISTER, "connection is not registered"),
                    );
                };
                let request: NamingRequest = match serde_json::from_value(body) {
                    Ok(r) => r,
                    Err(e) => {
                        return error(
                            &rid,
                            Refusal::new(INVALID_PARAM, format!("malformed {ty}: {e}")),
                        );
                    }
                };
                let caller = match self.caller_of(&p).await {
                    Ok(c) => c,
                    Err(r) => return error(&rid, r),
                };
                match self
                    .naming(&ty, request, &caller, &conn, &session, peer)
                    .await
                {
                    Ok((reply_ty, extra)) => ok(reply_ty, &rid, extra),
                    Err(r) => error(&rid, r),
                }
            }
            other => error(
                &rid,
                Refusal::new(
                    NO_HANDLER,
                    format!(
                        "gangway serves the Nacos naming service only; {other} is not supported \
                         (config center, AI, lock and fuzzy watch are not), see docs/compat.md"
                    ),
                ),
            ),
        }
    }

    /// The caller of one request: its `accessToken` header (what the Nacos SDKs send on every
    /// request once logged in). Errors: an `accessToken` that is not valid.
    async fn caller_of(&self, p: &pb::Payload) -> Result<Caller, Refusal> {
        let token = p
            .metadata
            .as_ref()
            .and_then(|m| m.headers.get("accessToken"))
            .filter(|t| !t.is_empty())
            .cloned();
        Ok(self
            .registry()
            .config()
            .security
            .authority
            .authenticate(token.map(Credentials::Token))
            .await
            .map_err(ApiError::from)?)
    }

    async fn naming(
        &self,
        ty: &str,
        r: NamingRequest,
        caller: &Caller,
        conn: &Arc<Conn>,
        session: &str,
        peer: SocketAddr,
    ) -> Result<(&'static str, Value), Refusal> {
        let registry = self.registry();
        match ty {
            "InstanceRequest" => {
                let (service, kind, instance, disabled) = r.single_instance()?;
                match kind.as_str() {
                    "registerInstance" => {
                        self.register(
                            caller,
                            service,
                            instance,
                            disabled,
                            LivenessRequest::Session(session.to_owned()),
                        )
                        .await?;
                    }
                    "deregisterInstance" => {
                        // Nacos ignores a deregistration of what this connection does not own.
                        match registry.deregister_on_session(session, &service, &instance.key) {
                            Ok(_)
                            | Err(RegistryError::UnknownInstance { .. })
                            | Err(RegistryError::NotOnThisSession { .. }) => {}
                            Err(e) => return Err(e.into()),
                        }
                    }
                    other => {
                        return Err(Refusal::new(
                            INVALID_PARAM,
                            format!("unsupported InstanceRequest type {other:?}"),
                        ));
                    }
                }
                Ok(("InstanceResponse", json!({"type": kind})))
            }
            "BatchInstanceRequest" => {
                let service = r.service()?;
                let kind = r.kind.clone().unwrap_or_default();
                if kind != "batchRegisterInstance" {
                    return Err(Refusal::new(
                        INVALID_PARAM,
                        format!("unsupported BatchInstanceRequest type {kind:?}"),
                    ));
                }
                let mut wanted = Vec::new();
                for w in r.instances.as_deref().unwrap_or_default() {
                    wanted.push(w.to_instance()?);
                }
                // Refused whole before anything of the batch changes.
                let max = registry.config().session_limits.instances;
                if wanted.len() > max {
                    return Err(RegistryError::LimitExceeded {
                        limit: "instances-per-session",
                        max,
                    }
                    .into());
                }
                // The batch replaces what this connection holds in the service.
                let (_, entries) = registry.entries(&service);
                for e in entries {
                    let owned = matches!(&e.liveness, Liveness::Session(s) if s == session);
                    if owned && !wanted.iter().any(|(i, _)| i.key == e.instance.key) {
                        let _ = registry.deregister_on_session(session, &service, &e.instance.key);
                    }
                }
                for (instance, disabled) in wanted {
                    self.register(
                        caller,
                        service.clone(),
                        instance,
                        disabled,
                        LivenessRequest::Session(session.to_owned()),
                    )
                    .await?;
                }
                Ok(("BatchInstanceResponse", json!({"type": kind})))
            }
            "PersistentInstanceRequest" => {
                let (service, kind, instance, disabled) = r.single_instance()?;
                match kind.as_str() {
                    "registerInstance" => {
                        self.register(
                            caller,
                            service,
                            instance,
                            disabled,
                            LivenessRequest::Probe(ProbeSpec::default()),
                        )
                        .await?;
                    }
                    "deregisterInstance" => {
                        let owner = registry.owner(&service, &instance.key);
                        caller
                            .allow(Rule::Instance, &service.namespace, owner.as_deref())
                            .map_err(ApiError::from)?;
                        match registry.deregister(&service, &instance.key, false).await {
                            Ok(_) | Err(RegistryError::UnknownInstance { .. }) => {}
                            Err(e) => return Err(e.into()),
                        }
                    }
                    other => {
                        return Err(Refusal::new(
                            INVALID_PARAM,
                            format!("unsupported PersistentInstanceRequest type {other:?}"),
                        ));
                    }
                }
                Ok(("InstanceResponse", json!({"type": kind})))
            }
            "ServiceQueryRequest" => {
                let service = r.service()?;
                allow_read(caller, &service.namespace)?;
                // A restarted registry's view is partial until its clients re-registered: a
                // pull is refused meanwhile, as native pulls are (the SDK keeps its cache).
                if registry.warming_up() {
                    return Err(ApiError::WarmingUp.into());
                }
                let healthy_only = r.healthy_only.or(r.health_only).unwrap_or(false);
                let clusters = r.cluster.clone().unwrap_or_default();
                let (_, info) = self.service_info(&service, &clusters, healthy_only, false);
                Ok(("QueryServiceResponse", json!({"serviceInfo": info})))
            }
            "SubscribeServiceRequest" => {
                let service = r.service()?;
                allow_read(caller, &service.namespace)?;
                let clusters = r.clusters.clone().unwrap_or_default();
                if r.subscribe.unwrap_or(true) {
                    self.subscribe(conn, session, &service, &clusters, peer)?;
                    // Subscribed, but no partial view in the answer while the registry warms
                    // up: an empty host list, which the Python, Go and Rust SDKs ignore (their
                    // cache stays; nacos.md 3.6) and which does not raise in the application
                    // as an error answer would. The push after the warm-up brings the view.
                    if registry.warming_up() {
                        let (_, mut info) = self.service_info(&service, &clusters, false, false);
                        info.hosts.clear();
                        return Ok(("SubscribeServiceResponse", json!({"serviceInfo": info})));
                    }
                } else {
                    let sub = conn.lock().subs.remove(&service);
                    if let Some(sub) = sub {
                        sub.task.abort();
                        registry.unsubscribe(&sub.id);
                    }
                }
                let (_, info) = self.service_info(&service, &clusters, false, false);
                Ok(("SubscribeServiceResponse", json!({"serviceInfo": info})))
            }
            "ServiceListRequest" => {
                let namespace = r.namespace.as_deref().filter(|n| !n.is_empty());
                let group = r.group_name.as_deref().filter(|g| !g.is_empty());
                allow_read(
                    caller,
                    namespace.unwrap_or(gangway_core::model::DEFAULT_NAMESPACE),
                )?;
                let (count, names) = super::http::service_page(
                    self,
                    namespace.unwrap_or(gangway_core::model::DEFAULT_NAMESPACE),
                    group.unwrap_or(gangway_core::model::DEFAULT_GROUP),
                    r.page_no.unwrap_or(1).max(1),
                    r.page_size.unwrap_or(10),
                );
                Ok((
                    "ServiceListResponse",
                    json!({"count": count, "serviceNames": names}),
                ))
            }
            _ => Err(Refusal::new(NO_HANDLER, format!("no handler for {ty}"))),
        }
    }

    async fn register(
        &self,
        caller: &Caller,
        service: ServiceKey,
        instance: Instance,
        disabled: bool,
        liveness: LivenessRequest,
    ) -> Result<(), Refusal> {
        let owner = self.registry().owner(&service, &instance.key);
        caller
            .allow(Rule::Register, &service.namespace, owner.as_deref())
            .map_err(ApiError::from)?;
        // Disabled from its first revision, with its offline mark: never published enabled.
        let mut instance = instance;
        instance.enabled = !disabled;
        self.registry()
            .register_as(service, instance, liveness, caller.clone())
            .await?;
        Ok(())
    }

    fn subscribe(
        &self,
        conn: &Arc<Conn>,
        session: &str,
        service: &ServiceKey,
        clusters: &str,
        peer: SocketAddr,
    ) -> Result<(), Refusal> {
        let mut st = conn.lock();
        if st.subs.contains_key(service) {
            return Ok(());
        }
        let Some(tx) = st.tx.clone() else {
            return Err(Refusal::new(UN_REGISTER, "connection has no stream"));
        };
        let info = SubscriberInfo {
            client_name: st.client_name.clone(),
            session: Some(session.to_owned()),
            // Nacos SDKs keep their last list when pushed one with no usable instance.
            ignores_empty_lists: true,
            ..SubscriberInfo::new(SubscriberKind::Session, peer.to_string())
        };
        let (sub, rx) = self.registry().subscribe(service, info)?;
        let pushes = self.registry().full_pushes(sub.clone(), rx);
        let nacos = self.clone();
        let conn2 = conn.clone();
        let key = service.clone();
        let clusters = clusters.to_owned();
        let sub_id = sub.clone();
        let task = tokio::spawn(async move {
            futures::pin_mut!(pushes);
            while pushes.next().await.is_some() {
                let info = nacos.push_info(&key, &clusters);
                let rid = format!("push-{}", nacos.next_id());
                {
                    let mut st = conn2.lock();
                    if st.pending.len() >= MAX_PENDING {
                        st.pending.clear();
                    }
                    st.pending
                        .insert(rid.clone(), (sub_id.clone(), info.revision));
                }
                let body = notify_body(&rid, &key, &info.json);
                if tx
                    .send(raw_payload("NotifySubscriberRequest", body))
                    .await
                    .is_err()
                {
                    break;
                }
            }
        });
        st.subs.insert(
            service.clone(),
            Sub {
                id: sub,
                task: task.abort_handle(),
            },
        );
        Ok(())
    }

    async fn run_stream(
        self,
        peer: SocketAddr,
        mut inbound: Streaming<pb::Payload>,
        tx: mpsc::Sender<pb::Payload>,
    ) {
        let mut conn: Option<Arc<Conn>> = None;
        let mut closing = self.inner.closing.subscribe();
        loop {
            if *closing.borrow_and_update() {
                break;
            }
            let stop = async {
                match &conn {
                    Some(c) => c.stop.notified().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                msg = inbound.message() => match msg {
                    Ok(Some(p)) => self.on_stream(peer, p, &tx, &mut conn).await,
                    Ok(None) => break,
                    Err(status) => {
                        tracing::debug!(%peer, %status, "nacos stream failed");
                        break;
                    }
                },
                _ = tx.closed() => break,
                _ = stop => break,
                changed = closing.changed() => {
                    if changed.is_err() || *closing.borrow_and_update() {
                        break;
                    }
                }
            }
        }
        if let Some(conn) = conn {
            self.close(peer, &conn);
        }
    }

    async fn on_stream(
        &self,
        peer: SocketAddr,
        p: pb::Payload,
        tx: &mpsc::Sender<pb::Payload>,
        conn: &mut Option<Arc<Conn>>,
    ) {
        let ty = type_of(&p).to_owned();
        if let Some(c) = conn.as_ref() {
            c.touch();
        }
        let Some(body) = body_of(&p) else {
            tracing::debug!(%peer, %ty, "nacos stream message without a JSON body");
            return;
        };
        match ty.as_str() {
            "ConnectionSetupRequest" => {
                let c = self.conn_or_new(peer);
                let label = |k: &str| {
                    body.get("labels")
                        .and_then(|l| l.get(k))
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_owned()
                };
                let version = body
                    .get("clientVersion")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned();
                let app = label("AppName");
                let client_name = [CLIENT_NAME_PREFIX.to_owned() + "-grpc", version, app]
                    .into_iter()
                    .filter(|s| !s.is_empty())
                    .collect::<Vec<_>>()
                    .join(" ");
                {
                    let mut st = c.lock();
                    if st.session.is_none() {
                        let session = self.registry().open_session(
                            peer.to_string(),
                            client_name.clone(),
                            // Nacos has no client id: one host's connections are one client.
                            format!("nacos@{}", peer.ip()),
                        );
                        tracing::debug!(%peer, session, client = %client_name, "nacos connection set up");
                        st.session = Some(session);
                    }
                    st.client_name = client_name;
                    st.tx = Some(tx.clone());
                    st.last_active = Some(Instant::now());
                    if st.detector.is_none() {
                        let task = tokio::spawn(self.clone().detect(c.clone(), tx.clone()));
                        st.detector = Some(task.abort_handle());
                    }
                }
                *conn = Some(c);
                let ack = json!({
                    "requestId": format!("setup-{}", self.next_id()),
                    "headers": {},
                    "module": "internal",
                    "abilityTable": server_abilities(),
                });
                let _ = tx.send(payload("SetupAckRequest", &ack)).await;
            }
            "NotifySubscriberResponse" => {
                let Some(c) = conn.as_ref() else { return };
                let rid = body.get("requestId").and_then(Value::as_str).unwrap_or("");
                let success = body
                    .get("resultCode")
                    .and_then(Value::as_i64)
                    .is_none_or(|code| code == 200);
                let pending = c.lock().pending.remove(rid);
                if let (Some((sub, revision)), true) = (pending, success) {
                    self.registry().ack(&sub, revision);
                }
            }
            // Answers to what the server sent (setup ack, detection, reset): nothing to do.
            _ => tracing::trace!(%peer, %ty, "nacos stream message ignored"),
        }
    }

    /// Client detection (Nacos's `ClientDetectionRequest`): a connection silent for
    /// `detect_after` is probed; without any answer within `detect_timeout` its stream is ended,
    /// which releases its instances and subscriptions.
    async fn detect(self, conn: Arc<Conn>, tx: mpsc::Sender<pb::Payload>) {
        let (after, timeout) = (self.inner.detect_after, self.inner.detect_timeout);
        let tick = (after / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
        loop {
            tokio::time::sleep(tick).await;
            let last = conn.lock().last_active.unwrap_or(conn.created);
            if last.elapsed() < after {
                continue;
            }
            let probe = json!({
                "requestId": format!("detect-{}", self.next_id()),
                "headers": {},
                "module": "internal",
            });
            let sent = Instant::now();
            if tx
                .send(payload("ClientDetectionRequest", &probe))
                .await
                .is_err()
            {
                return;
            }
            tokio::time::sleep(timeout).await;
            if conn.lock().last_active.is_none_or(|t| t < sent) {
                tracing::info!(connection = %conn.id, "nacos client detection: no answer, closing the connection");
                conn.stop.notify_one();
                return;
            }
        }
    }

    /// Server shutdown: sends every connection a `ConnectResetRequest` (the client reconnects,
    /// to another server of its list if it has one) and ends every stream, so the gRPC server's
    /// graceful shutdown does not wait on them.
    pub async fn reset_all(&self) {
        let conns: Vec<Arc<Conn>> = self.conns().values().cloned().collect();
        for conn in conns {
            let tx = conn.lock().tx.clone();
            if let Some(tx) = tx {
                let reset = json!({
                    "requestId": format!("reset-{}", self.next_id()),
                    "headers": {},
                    "module": "internal",
                    "serverIp": "",
                    "serverPort": "",
                    "connectionId": conn.id,
                });
                let _ = tx.try_send(payload("ConnectResetRequest", &reset));
            }
        }
        self.inner.closing.send_replace(true);
    }

    /// Ends a connection: its subscriptions, then its session (its instances go at once).
    fn close(&self, peer: SocketAddr, conn: &Arc<Conn>) {
        let (subs, session) = {
            let mut st = conn.lock();
            st.tx = None;
            st.pending.clear();
            if let Some(d) = st.detector.take() {
                d.abort();
            }
            (std::mem::take(&mut st.subs), st.session.take())
        };
        for (_, sub) in subs {
            sub.task.abort();
            self.registry().unsubscribe(&sub.id);
        }
        if let Some(session) = session {
            self.registry().close_session(&session);
            tracing::debug!(%peer, session, "nacos connection closed");
        }
        let mut conns = self.conns();
        if conns.get(&peer).is_some_and(|c| Arc::ptr_eq(c, conn)) {
            conns.remove(&peer);
        }
    }
}
