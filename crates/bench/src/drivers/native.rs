//! gangway's native gRPC session protocol with raw `gangway_proto` messages: one `Session`
//! stream per [`Session`], requests correlated by id so several can be in flight, snapshots handed
//! to a callback and acked at once (the ack is what a drain waits for).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{Context as _, bail};
use gangway_proto::v1 as pb;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use super::capability::{
    Deregister, OnGangway, OnGangwayCluster, OnUpdate, Register, SessionBound, Subscribe, Update,
};
use super::{GROUP, NAMESPACE};
use crate::load;
use crate::system::Server;

/// Called with the view a pushed snapshot or delta leaves, before it is acked.
pub type SnapshotHandler = Arc<dyn Fn(&View) + Send + Sync>;

/// A service's view as the session holds it: pushes replace it (full snapshots) or change it
/// (deltas), as a client does.
#[derive(Debug, Default)]
pub struct View {
    /// Revision held.
    pub revision: u64,
    /// Instances by (ip, port, cluster).
    pub instances: BTreeMap<(String, u32, String), pb::Instance>,
    /// Size of the last push applied, in bytes: the `Snapshot` message as protobuf encodes it
    /// (before gRPC's 5-byte prefix and HTTP/2 framing).
    pub last_push_bytes: usize,
}

impl View {
    /// The ports of the instances held.
    pub fn ports(&self) -> impl Iterator<Item = u64> + '_ {
        self.instances.keys().map(|(_, port, _)| u64::from(*port))
    }

    /// Applies a pushed snapshot: a whole view replaces, a delta from a base we hold changes.
    /// `false` when a delta does not apply (we hold less than its base).
    fn apply(&mut self, snap: &pb::Snapshot) -> bool {
        let key = |k: &pb::InstanceKey| (k.ip.clone(), k.port, k.cluster.clone());
        if snap.delta {
            if snap.base_revision > self.revision || snap.revision <= self.revision {
                return snap.revision <= self.revision;
            }
            for k in &snap.removed {
                self.instances.remove(&key(k));
            }
        } else {
            if snap.revision < self.revision {
                return true;
            }
            self.instances.clear();
        }
        for i in &snap.instances {
            if let Some(k) = &i.key {
                self.instances.insert(key(k), i.clone());
            }
        }
        self.revision = snap.revision;
        self.last_push_bytes = prost::Message::encoded_len(snap);
        true
    }
}

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<pb::Reply>>>>;

/// One gangway session (a `Registry/Session` stream). Dropping it ends the stream, and the
/// registry removes the session's instances.
pub struct Session {
    tx: mpsc::Sender<pb::ClientMessage>,
    pending: Pending,
    next: AtomicU64,
    reader: tokio::task::JoinHandle<()>,
}

/// The key of service `name` in the bench's namespace and group.
pub fn service(name: &str) -> pb::ServiceKey {
    pb::ServiceKey {
        namespace: NAMESPACE.into(),
        group: GROUP.into(),
        service: name.into(),
    }
}

impl Session {
    /// Opens a session on `channel` (several sessions may share one channel) and waits for the
    /// server's `Welcome`. `on_snapshot` sees every pushed snapshot; each is then acked.
    pub async fn open(
        channel: Channel,
        name: &str,
        on_snapshot: Option<SnapshotHandler>,
    ) -> anyhow::Result<Session> {
        let (tx, rx) = mpsc::channel(1024);
        tx.send(pb::ClientMessage {
            request_id: 0,
            kind: Some(pb::client_message::Kind::Hello(pb::Hello {
                client_name: name.into(),
                client_id: String::new(),
            })),
        })
        .await?;
        let mut inbound = pb::registry_client::RegistryClient::new(channel)
            .session(ReceiverStream::new(rx))
            .await
            .context("opening a session")?
            .into_inner();
        match inbound.message().await? {
            Some(pb::ServerMessage {
                kind: Some(pb::server_message::Kind::Welcome(_)),
            }) => {}
            other => bail!("expected Welcome, got {other:?}"),
        }
        let pending: Pending = Arc::default();
        let reader = {
            let pending = pending.clone();
            let ack_tx = tx.clone();
            tokio::spawn(async move {
                let mut views: HashMap<String, View> = HashMap::new();
                while let Ok(Some(msg)) = inbound.message().await {
                    match msg.kind {
                        Some(pb::server_message::Kind::Reply(reply)) => {
                            let waiter = pending.lock().unwrap().remove(&reply.request_id);
                            if let Some(w) = waiter {
                                let _ = w.send(reply);
                            }
                        }
                        Some(pb::server_message::Kind::Snapshot(snap)) => {
                            let name = snap
                                .service
                                .as_ref()
                                .map(|s| s.service.clone())
                                .unwrap_or_default();
                            let view = views.entry(name).or_default();
                            if !view.apply(&snap) {
                                continue; // a delta we cannot apply; the server resends
                            }
                            if let Some(h) = &on_snapshot {
                                h(view);
                            }
                            let ack = pb::ClientMessage {
                                request_id: 0,
                                kind: Some(pb::client_message::Kind::Ack(pb::Ack {
                                    service: snap.service.clone(),
                                    revision: view.revision,
                                })),
                            };
                            if ack_tx.send(ack).await.is_err() {
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                // Fail whoever still waits.
                pending.lock().unwrap().clear();
            })
        };
        Ok(Session {
            tx,
            pending,
            next: AtomicU64::new(1),
            reader,
        })
    }

    async fn call(&self, kind: pb::client_message::Kind) -> anyhow::Result<pb::Reply> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (w, r) = oneshot::channel();
        self.pending.lock().unwrap().insert(id, w);
        self.tx
            .send(pb::ClientMessage {
                request_id: id,
                kind: Some(kind),
            })
            .await
            .context("session closed")?;
        let reply = r.await.context("session closed before the reply")?;
        if !reply.error_code.is_empty() {
            bail!("{}: {}", reply.error_code, reply.error_message);
        }
        Ok(reply)
    }

    /// Registers an ephemeral instance bound to this session; returns the service revision.
    pub async fn register(&self, svc: &str, ip: &str, port: u16) -> anyhow::Result<u64> {
        let reply = self
            .call(pb::client_message::Kind::Register(pb::Register {
                service: Some(service(svc)),
                instance: Some(pb::InstanceKey {
                    ip: ip.into(),
                    port: port.into(),
                    cluster: String::new(),
                }),
                weight: None,
                metadata: HashMap::new(),
            }))
            .await?;
        Ok(reply.revision)
    }

    /// Deregisters one of this session's instances.
    pub async fn deregister(&self, svc: &str, ip: &str, port: u16) -> anyhow::Result<u64> {
        let reply = self
            .call(pb::client_message::Kind::Deregister(pb::Deregister {
                service: Some(service(svc)),
                instance: Some(pb::InstanceKey {
                    ip: ip.into(),
                    port: port.into(),
                    cluster: String::new(),
                }),
            }))
            .await?;
        Ok(reply.revision)
    }

    /// Subscribes to `svc`; snapshots then arrive at the handler given to [`Session::open`].
    pub async fn subscribe(&self, svc: &str) -> anyhow::Result<()> {
        self.call(pb::client_message::Kind::Subscribe(pb::Subscribe {
            service: Some(service(svc)),
        }))
        .await?;
        Ok(())
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// The `native-grpc` driver: gangway's own gRPC sessions, one per worker, each on its own
/// connection; subscribers hold the pushed views and ack each one at once.
pub struct NativeGrpc;

/// The `max-sessions` driver: idle native sessions multiplexed on shared connections, to find
/// how many sessions one gangway holds (the scale workload's probe, in the scale module).
pub struct MaxSessions;

super::capability::driver!(NativeGrpc = "native-grpc", served by OnGangway, OnGangwayCluster);
super::capability::driver!(MaxSessions = "max-sessions", served by OnGangway);

/// Opens `n` sessions on `server`, each on its own connection, named `{prefix}-{i}`, with
/// `handler(i)` as session i's snapshot handler. Session `i` is on node `i` of a cluster
/// (round robin, [`Server::node`]), so workers and subscribers spread evenly over the nodes
/// and session 0 (a producer's) is on the first node.
async fn sessions(
    server: &Server,
    n: usize,
    prefix: &str,
    handler: impl Fn(usize) -> Option<SnapshotHandler>,
) -> anyhow::Result<Vec<Session>> {
    let handler = &handler;
    load::for_each(
        n,
        128,
        &format!("{n} native sessions ({prefix})"),
        |i| async move {
            let ch = super::channel(server.node(i).grpc).await?;
            Session::open(ch, &format!("{prefix}-{i}"), handler(i)).await
        },
    )
    .await
}

impl Register for NativeGrpc {
    type Client = Vec<Session>;

    async fn connect(server: &Server, workers: usize) -> anyhow::Result<Vec<Session>> {
        sessions(server, workers.max(1), "bench", |_| None).await
    }

    async fn register(
        client: &Vec<Session>,
        worker: usize,
        svc: &str,
        ip: &str,
        port: u16,
    ) -> anyhow::Result<()> {
        client[worker % client.len()]
            .register(svc, ip, port)
            .await
            .map(drop)
    }
}

impl Deregister for NativeGrpc {
    async fn deregister(
        client: &Vec<Session>,
        worker: usize,
        svc: &str,
        ip: &str,
        port: u16,
    ) -> anyhow::Result<()> {
        client[worker % client.len()]
            .deregister(svc, ip, port)
            .await
            .map(drop)
    }
}

impl SessionBound for NativeGrpc {}

impl Subscribe for NativeGrpc {
    type Producer = NativeGrpc;
    type Held = Vec<Session>;
    const SENDS_LISTS: bool = true;
    const PRODUCED_VIA: &'static str = "";

    async fn subscribe(
        server: &Server,
        svc: &str,
        n: usize,
        on_update: OnUpdate,
    ) -> anyhow::Result<Vec<Session>> {
        let subs = sessions(server, n, "bench-sub", |i| {
            let on_update = on_update.clone();
            let h: SnapshotHandler =
                Arc::new(move |view| on_update(i, Update::Ports(&mut view.ports())));
            Some(h)
        })
        .await?;
        load::for_each(n, 128, "subscribe", |i| subs[i].subscribe(svc)).await?;
        Ok(subs)
    }
}
