//! The Nacos 2.x SDK gRPC protocol: `Payload`s with a JSON body named by `metadata.type`. One
//! [`NacosConn`] is one connection as a Nacos SDK opens it: server check, the bi-stream with
//! `ConnectionSetupRequest`, then unary requests; pushes (`NotifySubscriberRequest`) arrive on the
//! stream and are answered (gangway records that answer as the subscriber's ack).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use gangway_proto::nacos as pb;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use super::capability::{OnGangway, OnRnacos, OnUpdate, Register, SessionBound, Subscribe, Update};
use super::nacos_http::NacosV1;
use super::{GROUP, NAMESPACE};
use crate::load;
use crate::system::Server;

/// Called with the `serviceInfo` of every push, before it is answered.
pub type PushHandler = Arc<dyn Fn(&Value) + Send + Sync>;

/// One Nacos SDK connection. Dropping it closes the stream (the server then drops the
/// connection's instances and subscriptions).
pub struct NacosConn {
    channel: Channel,
    _tx: mpsc::Sender<pb::Payload>,
    next: AtomicU64,
    reader: tokio::task::JoinHandle<()>,
    resets: Arc<AtomicU64>,
}

/// A payload of type `ty` with `body` as JSON.
pub fn payload(ty: &str, body: &Value) -> pb::Payload {
    pb::Payload {
        metadata: Some(pb::Metadata {
            r#type: ty.to_owned(),
            client_ip: "127.0.0.1".into(),
            headers: HashMap::new(),
        }),
        body: Some(pb::Any {
            type_url: String::new(),
            value: serde_json::to_vec(body).unwrap_or_default(),
        }),
    }
}

fn decode(p: &pb::Payload) -> (String, Value) {
    let ty = p
        .metadata
        .as_ref()
        .map(|m| m.r#type.clone())
        .unwrap_or_default();
    let body = p
        .body
        .as_ref()
        .and_then(|b| serde_json::from_slice(&b.value).ok())
        .unwrap_or(Value::Null);
    (ty, body)
}

impl NacosConn {
    /// Connects to a Nacos gRPC port as an SDK does and waits until the server accepts requests
    /// on the connection (at most 10 s).
    pub async fn connect(addr: SocketAddr, on_push: Option<PushHandler>) -> anyhow::Result<Self> {
        let channel = super::channel(addr).await?;
        let check = pb::request_client::RequestClient::new(channel.clone())
            .request(payload(
                "ServerCheckRequest",
                &json!({"requestId": "0", "headers": {}}),
            ))
            .await
            .context("ServerCheckRequest")?
            .into_inner();
        let (ty, _) = decode(&check);
        if ty != "ServerCheckResponse" {
            bail!("server check answered {ty}");
        }
        let (tx, rx) = mpsc::channel(256);
        tx.send(payload(
            "ConnectionSetupRequest",
            &json!({"clientVersion": "Nacos-Rust-Client:v0.8.3", "tenant": "",
                    "labels": {"module": "naming", "source": "sdk"}, "abilityTable": {},
                    "headers": {}, "requestId": ""}),
        ))
        .await?;
        let mut inbound = pb::bi_request_stream_client::BiRequestStreamClient::new(channel.clone())
            .request_bi_stream(ReceiverStream::new(rx))
            .await
            .context("opening the bi-stream")?
            .into_inner();
        let resets = Arc::new(AtomicU64::new(0));
        let reader = {
            let tx = tx.clone();
            let resets = resets.clone();
            tokio::spawn(async move {
                while let Ok(Some(msg)) = inbound.message().await {
                    let (ty, body) = decode(&msg);
                    let answer = match ty.as_str() {
                        "NotifySubscriberRequest" => {
                            if let Some(h) = &on_push {
                                h(&body["serviceInfo"]);
                            }
                            "NotifySubscriberResponse"
                        }
                        "ClientDetectionRequest" => "ClientDetectionResponse",
                        "SetupAckRequest" => "SetupAckResponse",
                        "ConnectResetRequest" => {
                            resets.fetch_add(1, Ordering::Relaxed);
                            "ConnectResetResponse"
                        }
                        _ => continue,
                    };
                    let reply = json!({"requestId": body["requestId"], "resultCode": 200,
                                       "errorCode": 0, "success": true});
                    if tx.send(payload(answer, &reply)).await.is_err() {
                        break;
                    }
                }
            })
        };
        let conn = NacosConn {
            channel,
            _tx: tx,
            next: AtomicU64::new(1),
            reader,
            resets,
        };
        // Servers answer 301 until the stream's setup is registered (Nacos SDKs retry too).
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match conn.request("HealthCheckRequest", json!({})).await {
                Ok(_) => return Ok(conn),
                Err(e) if Instant::now() > deadline => return Err(e.context("connection setup")),
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    /// `ConnectResetRequest`s the server sent on the stream (a stopping server sends one).
    pub fn resets(&self) -> u64 {
        self.resets.load(Ordering::Relaxed)
    }

    /// Whether the server ended the stream (a Nacos SDK then reconnects).
    pub fn stream_ended(&self) -> bool {
        self.reader.is_finished()
    }

    /// Waits until the server ends the stream (or the connection fails).
    pub async fn ended(&mut self) {
        let _ = (&mut self.reader).await;
    }

    /// Sends a unary request; `body` gets a fresh `requestId`. Fails unless `resultCode` is 200.
    pub async fn request(&self, ty: &str, mut body: Value) -> anyhow::Result<Value> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        body["requestId"] = Value::String(id.to_string());
        if body.get("headers").is_none() {
            body["headers"] = json!({});
        }
        let reply = pb::request_client::RequestClient::new(self.channel.clone())
            .request(payload(ty, &body))
            .await?
            .into_inner();
        let (rty, v) = decode(&reply);
        if v["resultCode"] != 200 || rty == "ErrorResponse" {
            bail!("{ty} answered {rty}: {} {}", v["errorCode"], v["message"]);
        }
        Ok(v)
    }

    fn instance_request(kind: &str, svc: &str, ip: &str, port: u16) -> Value {
        json!({"namespace": NAMESPACE, "serviceName": svc, "groupName": GROUP, "type": kind,
               "instance": {"ip": ip, "port": port, "weight": 1.0, "healthy": true,
                            "enabled": true, "ephemeral": true, "clusterName": "DEFAULT",
                            "serviceName": format!("{GROUP}@@{svc}"), "metadata": {}}})
    }

    /// Registers an ephemeral instance bound to this connection. (In Nacos a second instance of
    /// the same service on one connection replaces the first.)
    pub async fn register(&self, svc: &str, ip: &str, port: u16) -> anyhow::Result<()> {
        self.request(
            "InstanceRequest",
            Self::instance_request("registerInstance", svc, ip, port),
        )
        .await
        .map(drop)
    }

    /// Deregisters an instance of this connection.
    pub async fn deregister(&self, svc: &str, ip: &str, port: u16) -> anyhow::Result<()> {
        self.request(
            "InstanceRequest",
            Self::instance_request("deregisterInstance", svc, ip, port),
        )
        .await
        .map(drop)
    }

    /// Subscribes the connection to `svc`; returns the `serviceInfo` of the answer. Pushes go to
    /// the handler given to [`NacosConn::connect`].
    pub async fn subscribe(&self, svc: &str) -> anyhow::Result<Value> {
        let v = self
            .request(
                "SubscribeServiceRequest",
                json!({"namespace": NAMESPACE, "serviceName": svc, "groupName": GROUP,
                       "subscribe": true, "clusters": ""}),
            )
            .await?;
        Ok(v["serviceInfo"].clone())
    }

    /// [`NacosConn::subscribe`], tried again every [`RECONNECT_PAUSE`] for at most
    /// [`SUBSCRIBE_RETRY_FOR`] while it fails, as the SDKs' redo does (rnacos answers 301
    /// "Connection is unregistered" to a subscription made just after the connection's setup).
    pub async fn subscribe_retrying(&self, svc: &str) -> anyhow::Result<Value> {
        let deadline = Instant::now() + SUBSCRIBE_RETRY_FOR;
        loop {
            match self.subscribe(svc).await {
                Err(_) if Instant::now() + RECONNECT_PAUSE < deadline => {
                    tokio::time::sleep(RECONNECT_PAUSE).await;
                }
                answer => return answer,
            }
        }
    }
}

/// How long [`NacosConn::subscribe_retrying`] tries: 10 s.
const SUBSCRIBE_RETRY_FOR: Duration = Duration::from_secs(10);

impl Drop for NacosConn {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// The ports of the instances a Nacos `serviceInfo` lists.
pub fn host_ports(service_info: &Value) -> impl Iterator<Item = u64> + '_ {
    service_info["hosts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|h| h["port"].as_u64())
}

/// The `nacos-grpc` driver: connections as a Nacos 2.x SDK opens them, one per worker; pushes
/// answered at once. Its subscribers' instances are made over Nacos v1 HTTP ([`NacosV1`]):
/// instances registered over rnacos's gRPC did not show in its lists in our runs
/// (docs/benchmarks.md).
pub struct NacosGrpc;

super::capability::driver!(NacosGrpc = "nacos-grpc", served by OnGangway, OnRnacos);

/// Opens `n` connections to `server`, with `handler(i)` as connection i's push handler.
async fn connections(
    server: &Server,
    n: usize,
    handler: impl Fn(usize) -> Option<PushHandler>,
) -> anyhow::Result<Vec<NacosConn>> {
    let addr = server.grpc;
    let handler = &handler;
    load::for_each(n, 128, &format!("{n} nacos connections"), |i| async move {
        NacosConn::connect(addr, handler(i)).await
    })
    .await
}

impl Register for NacosGrpc {
    type Client = Vec<NacosConn>;

    async fn connect(server: &Server, workers: usize) -> anyhow::Result<Vec<NacosConn>> {
        connections(server, workers.max(1), |_| None).await
    }

    async fn register(
        client: &Vec<NacosConn>,
        worker: usize,
        svc: &str,
        ip: &str,
        port: u16,
    ) -> anyhow::Result<()> {
        client[worker % client.len()].register(svc, ip, port).await
    }
}

impl SessionBound for NacosGrpc {}

/// How long a [`Resubscriber`] waits before it reconnects: 500 ms (the Nacos SDKs retry a lost
/// connection within a second, and redo their subscriptions on the new one).
const RECONNECT_PAUSE: Duration = Duration::from_millis(500);

/// A Nacos SDK's subscription as the SDKs keep it: when the server ends the connection, it
/// connects again and subscribes again (the SDKs' redo), after [`RECONNECT_PAUSE`], until
/// dropped. The ends it saw are counted in the shared counter.
pub struct Resubscriber {
    task: tokio::task::JoinHandle<()>,
}

impl Resubscriber {
    fn start(
        addr: SocketAddr,
        svc: String,
        mut conn: NacosConn,
        handler: PushHandler,
        reconnects: Arc<AtomicU64>,
    ) -> Self {
        let task = tokio::spawn(async move {
            loop {
                conn.ended().await;
                reconnects.fetch_add(1, Ordering::Relaxed);
                conn = loop {
                    tokio::time::sleep(RECONNECT_PAUSE).await;
                    let Ok(next) = NacosConn::connect(addr, Some(handler.clone())).await else {
                        continue;
                    };
                    if next.subscribe_retrying(&svc).await.is_ok() {
                        break next;
                    }
                };
            }
        });
        Resubscriber { task }
    }
}

impl Drop for Resubscriber {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The subscribers of a [`NacosGrpc`] run and how often the server ended one's connection.
pub struct Subscribers {
    _each: Vec<Resubscriber>,
    reconnects: Arc<AtomicU64>,
}

impl Subscribe for NacosGrpc {
    type Producer = NacosV1;
    type Held = Subscribers;
    const SENDS_LISTS: bool = true;
    const PRODUCED_VIA: &'static str = "v1 HTTP leases";

    async fn subscribe(
        server: &Server,
        svc: &str,
        n: usize,
        on_update: OnUpdate,
    ) -> anyhow::Result<Subscribers> {
        let handler = |i: usize| -> PushHandler {
            let on_update = on_update.clone();
            Arc::new(move |info: &Value| on_update(i, Update::Ports(&mut host_ports(info))))
        };
        let addr = server.grpc;
        let handler = &handler;
        // A subscription that keeps failing on its connection (rnacos unregisters connections
        // under this load) gets a new connection, as an SDK would, for up to 3 x 10 s.
        let conns = load::for_each(n, 128, &format!("{n} nacos subscribers"), |i| async move {
            let mut tries = 0;
            loop {
                tries += 1;
                let conn = NacosConn::connect(addr, Some(handler(i))).await?;
                match conn.subscribe_retrying(svc).await {
                    Ok(_) => return Ok(conn),
                    Err(e) if tries >= 3 => return Err(e),
                    Err(_) => continue,
                }
            }
        })
        .await?;
        let reconnects = Arc::new(AtomicU64::new(0));
        let each = conns
            .into_iter()
            .enumerate()
            .map(|(i, conn)| {
                let svc = svc.to_owned();
                Resubscriber::start(server.grpc, svc, conn, handler(i), reconnects.clone())
            })
            .collect();
        Ok(Subscribers {
            _each: each,
            reconnects,
        })
    }

    fn reconnects(held: &Subscribers) -> u64 {
        held.reconnects.load(Ordering::Relaxed)
    }
}
