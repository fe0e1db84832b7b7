//! The native gRPC session service (`gangway.v1.Registry/Session`): one bidirectional stream
//! per client process carries its registrations, subscriptions, pushes and acks.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;

use futures::{Stream, StreamExt};
use gangway_core::ValidationError;
use gangway_core::model::{Instance, InstanceKey, ServiceKey};
use gangway_proto::v1 as pb;
use gangway_wire::proto;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::auth::{Caller, Rule};
use crate::engine::{
    DrainReport, LivenessRequest, Push, Registry, RegistryError, Snapshot, SubscriberInfo,
    SubscriberKind,
};
use crate::error::ApiError;

/// Outbound buffer per session, in messages.
const OUTBOUND: usize = 256;

/// The tonic service.
#[derive(Clone)]
pub struct SessionService {
    registry: Registry,
}

impl SessionService {
    /// Serves sessions on `registry`.
    pub fn new(registry: Registry) -> Self {
        Self { registry }
    }

    /// As a tonic server.
    pub fn into_server(self) -> pb::registry_server::RegistryServer<Self> {
        pb::registry_server::RegistryServer::new(self)
    }
}

/// The service a message names (a missing key is the empty one, refused by validation).
pub fn service_key(k: Option<pb::ServiceKey>) -> ServiceKey {
    proto::service_from_pb(&k.unwrap_or_default())
}

fn instance_key(k: Option<pb::InstanceKey>) -> Result<InstanceKey, RegistryError> {
    Ok(proto::instance_key_from_pb(&k.unwrap_or_default())?)
}

fn pb_snapshot(s: &Snapshot, request_id: u64) -> pb::ServerMessage {
    pb::ServerMessage {
        kind: Some(pb::server_message::Kind::Snapshot(proto::snapshot_to_pb(
            &s.service, &s.view, request_id,
        ))),
    }
}

fn pb_push(push: &Push) -> pb::ServerMessage {
    let d = match push {
        Push::Full(s) => return pb_snapshot(s, 0),
        Push::Delta(d) => d,
    };
    pb::ServerMessage {
        kind: Some(pb::server_message::Kind::Snapshot(pb::Snapshot {
            service: Some(proto::service_to_pb(&d.service)),
            revision: d.revision,
            instances: d.upserted.iter().map(proto::instance_to_pb).collect(),
            protection_triggered: d.protection_triggered,
            request_id: 0,
            delta: true,
            base_revision: d.base_revision,
            removed: d.removed.iter().map(proto::instance_key_to_pb).collect(),
        })),
    }
}

/// A wait's timeout from the request: 0 means the server's (`Config::drain_timeout`).
fn wait_timeout(registry: &Registry, timeout_ms: u64) -> Duration {
    if timeout_ms == 0 {
        registry.config().drain_timeout
    } else {
        Duration::from_millis(timeout_ms)
    }
}

/// The one place where the native protocol maps a [`RegistryError`]: its REST code, message
/// and field go into the `Reply`.
fn reply(request_id: u64, result: Result<pb::Reply, ApiError>) -> pb::ServerMessage {
    let reply = match result {
        Ok(r) => pb::Reply { request_id, ..r },
        Err(e) => proto::rejected_reply(request_id, e.detail()),
    };
    pb::ServerMessage {
        kind: Some(pb::server_message::Kind::Reply(reply)),
    }
}

type SessionStream = Pin<Box<dyn Stream<Item = Result<pb::ServerMessage, Status>> + Send>>;

#[tonic::async_trait]
impl pb::registry_server::Registry for SessionService {
    type SessionStream = SessionStream;

    async fn session(
        &self,
        request: Request<Streaming<pb::ClientMessage>>,
    ) -> Result<Response<SessionStream>, Status> {
        if self.registry.is_loading() {
            return Err(Status::unavailable(
                "the registry is loading its store; retry shortly",
            ));
        }
        // Metadata `authorization`, as the REST header (docs/security.md).
        let count = request.metadata().get_all("authorization").iter().count();
        crate::auth::layer::one_authorization(count).map_err(ApiError::from)?;
        let credentials = match request.metadata().get("authorization") {
            Some(v) => {
                let v = v
                    .to_str()
                    .map_err(|_| Status::unauthenticated("authorization metadata: not ASCII"))?;
                Some(crate::auth::layer::parse_authorization(v).map_err(ApiError::from)?)
            }
            None => None,
        };
        let caller = self
            .registry
            .config()
            .security
            .authority
            .authenticate(credentials)
            .await
            .map_err(ApiError::from)?;
        if caller == Caller::Anonymous {
            return Err(ApiError::from(caller.allow(Rule::Read, "", None).unwrap_err()).into());
        }
        let peer = request
            .remote_addr()
            .map(|a: SocketAddr| a.to_string())
            .unwrap_or_default();
        let mut inbound = request.into_inner();
        let first = inbound
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("empty session stream"))?;
        let Some(pb::client_message::Kind::Hello(hello)) = first.kind else {
            return Err(Status::invalid_argument(
                "the first message of a session must be Hello",
            ));
        };
        let (tx, rx) = mpsc::channel(OUTBOUND);
        let session = Session::open(
            self.registry.clone(),
            peer,
            hello.client_name,
            hello.client_id,
            caller,
            tx,
        );
        tokio::spawn(session.run(inbound));
        Ok(Response::new(Box::pin(outbound(
            ReceiverStream::new(rx),
            self.registry.stopping(),
        ))))
    }
}

/// The reason a stopping server gives in its `GoAway`.
pub const GO_AWAY_REASON: &str = "the registry is stopping";

/// A session's outbound stream: its messages until the server stops, then a `GoAway` and the
/// end of the stream (the session's task then ends it). The client reconnects at once, without
/// backoff, and keeps its cached views meanwhile.
fn outbound(
    messages: impl Stream<Item = pb::ServerMessage> + Send + 'static,
    stopping: impl Future<Output = ()> + Send + 'static,
) -> impl Stream<Item = Result<pb::ServerMessage, Status>> + Send + 'static {
    async_stream::stream! {
        tokio::pin!(messages);
        tokio::pin!(stopping);
        loop {
            tokio::select! {
                biased;
                () = &mut stopping => {
                    yield Ok(pb::ServerMessage {
                        kind: Some(pb::server_message::Kind::GoAway(pb::GoAway {
                            reason: GO_AWAY_REASON.to_owned(),
                        })),
                    });
                    break;
                }
                message = messages.next() => match message {
                    Some(message) => yield Ok(message),
                    None => break,
                },
            }
        }
    }
}

struct Session {
    registry: Registry,
    id: String,
    peer: String,
    client_name: String,
    caller: Caller,
    tx: mpsc::Sender<pb::ServerMessage>,
    subscriptions: HashMap<ServiceKey, (String, tokio::task::JoinHandle<()>)>,
}

impl Session {
    fn open(
        registry: Registry,
        peer: String,
        client_name: String,
        client_id: String,
        caller: Caller,
        tx: mpsc::Sender<pb::ServerMessage>,
    ) -> Self {
        let id = registry.open_session(peer.clone(), client_name.clone(), client_id);
        Self {
            registry,
            id,
            peer,
            client_name,
            caller,
            tx,
            subscriptions: HashMap::new(),
        }
    }

    async fn run(mut self, mut inbound: Streaming<pb::ClientMessage>) {
        let welcome = pb::ServerMessage {
            kind: Some(pb::server_message::Kind::Welcome(pb::Welcome {
                session_id: self.id.clone(),
                boot_id: self.registry.boot_id().to_owned(),
                peer: self.peer.clone(),
            })),
        };
        // A reload that removes or changes the session's credential ends the session, and so
        // takes its instances out as for any closed session.
        let revoked = self
            .registry
            .config()
            .security
            .authority
            .revoked(&self.caller);
        tokio::pin!(revoked);
        if self.tx.send(welcome).await.is_ok() {
            tracing::debug!(session = %self.id, peer = %self.peer, "session open");
            loop {
                tokio::select! {
                    () = &mut revoked => {
                        tracing::info!(
                            session = %self.id,
                            principal = self.caller.owner().unwrap_or_default(),
                            "session ended: its credential was removed or changed at a reload"
                        );
                        break;
                    }
                    msg = inbound.message() => match msg {
                        Ok(Some(msg)) => self.handle(msg).await,
                        Ok(None) => break,
                        Err(status) => {
                            tracing::debug!(session = %self.id, %status, "session stream failed");
                            break;
                        }
                    },
                    _ = self.tx.closed() => break,
                }
            }
        }
        for (_, (sub, task)) in self.subscriptions.drain() {
            task.abort();
            self.registry.unsubscribe(&sub);
        }
        self.registry.close_session(&self.id);
    }

    async fn handle(&mut self, msg: pb::ClientMessage) {
        use pb::client_message::Kind;
        let rid = msg.request_id;
        let Some(kind) = msg.kind else { return };
        let result: Result<pb::Reply, ApiError> = match kind {
            Kind::Hello(_) => {
                Err(ValidationError::new("hello", "sent twice on one session").into())
            }
            Kind::Register(r) => self.register(r).await,
            Kind::Deregister(d) => self.deregister(d),
            Kind::Subscribe(s) => self.subscribe(service_key(s.service)),
            Kind::Unsubscribe(s) => {
                if let Some((sub, task)) = self.subscriptions.remove(&service_key(s.service)) {
                    task.abort();
                    self.registry.unsubscribe(&sub);
                }
                Ok(pb::Reply::default())
            }
            Kind::Ack(a) => {
                if let Some((sub, _)) = self.subscriptions.get(&service_key(a.service)) {
                    self.registry.ack(sub, a.revision);
                }
                return;
            }
            Kind::Pull(p) => {
                let service = service_key(p.service);
                if let Err(e) = self.caller.allow(Rule::Read, &service.namespace, None) {
                    Err(e.into())
                } else if self.registry.warming_up() {
                    Err(RegistryError::WarmingUp.into())
                } else {
                    let view = self.registry.view(&service);
                    if view.revision == p.known_revision {
                        Ok(pb::Reply {
                            not_modified: true,
                            revision: view.revision,
                            ..Default::default()
                        })
                    } else {
                        let snapshot = Snapshot { service, view };
                        let _ = self.tx.send(pb_snapshot(&snapshot, rid)).await;
                        return;
                    }
                }
            }
            Kind::Drain(d) => {
                // Drains wait on acks, which arrive on this very stream: never block the reader.
                let registry = self.registry.clone();
                let caller = self.caller.clone();
                self.reply_later(rid, async move {
                    let key = instance_key(d.instance)?;
                    let service = service_key(d.service);
                    let owner = registry.owner(&service, &key);
                    caller.allow(Rule::Instance, &service.namespace, owner.as_deref())?;
                    let timeout = wait_timeout(&registry, d.timeout_ms);
                    Ok::<_, ApiError>(registry.drain(&service, &key, timeout, d.force).await?)
                });
                return;
            }
            Kind::WaitReady(w) => {
                let registry = self.registry.clone();
                let caller = self.caller.clone();
                self.reply_later(rid, async move {
                    let key = instance_key(w.instance)?;
                    let service = service_key(w.service);
                    caller.allow(Rule::Read, &service.namespace, None)?;
                    let timeout = wait_timeout(&registry, w.timeout_ms);
                    Ok::<_, ApiError>(registry.wait_ready(&service, &key, timeout).await?)
                });
                return;
            }
        };
        let _ = self.tx.send(reply(rid, result)).await;
    }

    /// Answers request `rid` with the report of a wait that runs in its own task (the acks it
    /// waits for arrive on this session's stream, whose reader must not block).
    fn reply_later(
        &self,
        rid: u64,
        wait: impl Future<Output = Result<DrainReport, ApiError>> + Send + 'static,
    ) {
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let result = wait.await.map(|report| pb::Reply {
                revision: report.revision,
                drain: Some(proto::drain_to_pb(&report)),
                ..Default::default()
            });
            let _ = tx.send(reply(rid, result)).await;
        });
    }

    async fn register(&mut self, r: pb::Register) -> Result<pb::Reply, ApiError> {
        let key = instance_key(r.instance)?;
        let service = service_key(r.service);
        let owner = self.registry.owner(&service, &key);
        self.caller
            .allow(Rule::Register, &service.namespace, owner.as_deref())?;
        let mut instance = Instance::new(key);
        instance.weight = r.weight.unwrap_or(gangway_core::model::DEFAULT_WEIGHT);
        instance.metadata = r.metadata.into_iter().collect();
        let (revision, _) = self
            .registry
            .register_as(
                service,
                instance,
                LivenessRequest::Session(self.id.clone()),
                self.caller.clone(),
            )
            .await?;
        Ok(pb::Reply {
            revision,
            ..Default::default()
        })
    }

    /// Deregisters an instance this session keeps alive (the engine refuses others).
    fn deregister(&mut self, d: pb::Deregister) -> Result<pb::Reply, ApiError> {
        let key = instance_key(d.instance)?;
        let service = service_key(d.service);
        let revision = self
            .registry
            .deregister_on_session(&self.id, &service, &key)?;
        Ok(pb::Reply {
            revision,
            ..Default::default()
        })
    }

    fn subscribe(&mut self, service: ServiceKey) -> Result<pb::Reply, ApiError> {
        self.caller.allow(Rule::Read, &service.namespace, None)?;
        if self.subscriptions.contains_key(&service) {
            return Ok(pb::Reply::default());
        }
        let info = SubscriberInfo {
            client_name: self.client_name.clone(),
            session: Some(self.id.clone()),
            deltas: true,
            ..SubscriberInfo::new(SubscriberKind::Session, self.peer.clone())
        };
        let (sub, rx) = self.registry.subscribe(&service, info)?;
        let pushes = self.registry.pushes(sub.clone(), rx);
        let tx = self.tx.clone();
        let task = tokio::spawn(async move {
            futures::pin_mut!(pushes);
            while let Some(push) = pushes.next().await {
                if tx.send(pb_push(&push)).await.is_err() {
                    break;
                }
            }
        });
        self.subscriptions.insert(service, (sub, task));
        Ok(pb::Reply::default())
    }
}
