//! The gRPC port in process: the router `start` serves (native `Registry/Session`, Nacos
//! `Request/request` and `BiRequestStream/requestBiStream`), driven with `oneshot` on HTTP
//! requests whose bodies are gRPC frames and whose extensions carry the peer address, as a
//! connection's would. No sockets; the handlers, protobuf decoding included, are the server's.
//!
//! Nacos: a connection is set up on the stream (`ConnectionSetupRequest`), then each input is one
//! unary `Payload` from that peer (or, now and then, from a peer without a connection): a valid
//! request of each type with its JSON body mutated, its type or headers mutated, or the
//! protobuf bytes themselves mutated or random. The answer must be a `*Response` with
//! `success: true` or an `ErrorResponse` (or a gRPC status for bytes that are no `Payload`); a
//! refusal leaves the registry as it was.
//!
//! Native: one session is opened (`Hello`), then each input is one `ClientMessage`, generated
//! field by field or decoded with prost from mutated or random bytes, followed by a sentinel
//! `Pull` whose answer proves the input was handled. An error `Reply` must leave the registry
//! as it was. Random bytes are also decoded as `ServerMessage` and Nacos `Payload` (what the
//! clients parse).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use bytes::{Buf, Bytes, BytesMut};
use gangway_proto::nacos as npb;
use gangway_proto::v1 as pb;
use gangway_server::Registry;
use http::{Request, header};
use http_body_util::BodyExt;
use prost::Message;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::TcpConnectInfo;
use tower::ServiceExt;

use crate::{
    ANSWER_TIMEOUT, Case, Gen, Options, Outcome, Report, Runner, Target, digest, panics, registry,
    retire,
};

/// The peer of the harness's connection.
const PEER: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 40_001);
/// A peer that never set a connection up.
const STRANGER: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 40_002);

fn grpc_router(registry: &Registry) -> Router {
    let nacos = gangway_server::nacos::Nacos::new(registry.clone());
    let (request, bi) = gangway_server::nacos::grpc::services(nacos);
    tonic::service::Routes::new(
        gangway_server::grpc::SessionService::new(registry.clone()).into_server(),
    )
    .add_service(request)
    .add_service(bi)
    .prepare()
    .into_axum_router()
}

/// A gRPC message frame: uncompressed flag, big-endian length, the bytes.
fn frame(message: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(message.len() + 5);
    b.extend_from_slice(&[0]);
    b.extend_from_slice(&(message.len() as u32).to_be_bytes());
    b.extend_from_slice(message);
    b.freeze()
}

fn grpc_request(path: &str, peer: SocketAddr, body: Body) -> Request<Body> {
    let mut request = Request::builder()
        .method("POST")
        .uri(path)
        .header(header::CONTENT_TYPE, "application/grpc")
        .header("te", "trailers")
        .body(body)
        .expect("a valid request");
    request.extensions_mut().insert(TcpConnectInfo {
        local_addr: Some(SocketAddr::from(([127, 0, 0, 1], 9848))),
        remote_addr: Some(peer),
    });
    request
}

/// Reads gRPC messages from a streaming response body.
struct Frames {
    body: Body,
    buf: BytesMut,
}

impl Frames {
    /// The next message; `None` at the end of the stream.
    async fn next(&mut self) -> Option<Bytes> {
        loop {
            if self.buf.len() >= 5 {
                let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]])
                    as usize;
                if self.buf.len() >= 5 + len {
                    self.buf.advance(5);
                    return Some(self.buf.split_to(len).freeze());
                }
            }
            let frame = self.body.frame().await?.ok()?;
            match frame.into_data() {
                Ok(data) => self.buf.extend_from_slice(&data),
                Err(_) => return None, // trailers: the stream ended
            }
        }
    }
}

/// An open client stream: the sender of its request body and the reader of its answers.
struct Stream {
    tx: mpsc::Sender<Result<Bytes, Infallible>>,
    frames: Frames,
}

async fn open_stream(
    router: &Router,
    path: &str,
    peer: SocketAddr,
    first: Bytes,
) -> Option<Stream> {
    let (tx, rx) = mpsc::channel(16);
    tx.send(Ok(frame(&first))).await.ok()?;
    let request = grpc_request(path, peer, Body::from_stream(ReceiverStream::new(rx)));
    let response = router.clone().oneshot(request).await.ok()?;
    Some(Stream {
        tx,
        frames: Frames {
            body: response.into_body(),
            buf: BytesMut::new(),
        },
    })
}

// --- Nacos --------------------------------------------------------------------------------

struct Nacos {
    registry: Registry,
    router: Router,
    born: Instant,
    /// Held open: the connection lives as long as its stream.
    _stream: tokio::task::JoinHandle<()>,
}

async fn nacos() -> anyhow::Result<Nacos> {
    let (registry, _) = registry();
    let router = grpc_router(&registry);
    let setup = gangway_server::nacos::grpc::payload(
        "ConnectionSetupRequest",
        &json!({"clientVersion": "fuzz", "labels": {"module": "naming", "AppName": "fuzz"}, "abilityTable": {}}),
    );
    let mut stream = open_stream(
        &router,
        "/BiRequestStream/requestBiStream",
        PEER,
        setup.encode_to_vec().into(),
    )
    .await
    .ok_or_else(|| anyhow::anyhow!("the Nacos stream did not open"))?;
    let ack = stream
        .frames
        .next()
        .await
        .and_then(|b| npb::Payload::decode(b).ok())
        .ok_or_else(|| anyhow::anyhow!("no SetupAckRequest"))?;
    let ty = ack.metadata.map(|m| m.r#type).unwrap_or_default();
    anyhow::ensure!(
        ty == "SetupAckRequest",
        "the stream answered {ty:?} to the setup"
    );
    // Reads (and drops) pushes so the connection's outbound queue never fills.
    let task = tokio::spawn(async move {
        let _tx = stream.tx;
        while stream.frames.next().await.is_some() {}
    });
    Ok(Nacos {
        registry,
        router,
        born: Instant::now(),
        _stream: task,
    })
}

/// A valid request body of each naming type (and a few others).
fn nacos_request(g: &mut Gen) -> (String, Value) {
    let ip = *g.pick(&["127.0.0.1", "127.0.0.2", "::1"]);
    let instance = |g: &mut Gen, ephemeral: bool| {
        json!({
            "ip": ip, "port": *g.pick(&[8080, 8081]), "weight": 1.0, "enabled": true, "healthy": true,
            "ephemeral": ephemeral, "clusterName": "DEFAULT",
            "metadata": {"zone": "a", "preserved.heart.beat.timeout": "15000"},
        })
    };
    let service = *g.pick(&["orders", "pay"]);
    let head = |extra: Value| {
        let mut v = json!({
            "requestId": "1", "headers": {}, "module": "naming", "namespace": "public",
            "serviceName": service, "groupName": "DEFAULT_GROUP",
        });
        if let (Value::Object(v), Value::Object(e)) = (&mut v, extra) {
            v.extend(e);
        }
        v
    };
    let kind = *g.pick(&["registerInstance", "deregisterInstance"]);
    match g.below(10) {
        0 | 1 => (
            "InstanceRequest".into(),
            head(json!({"type": kind, "instance": instance(g, true)})),
        ),
        2 => (
            "BatchInstanceRequest".into(),
            head(json!({"type": "batchRegisterInstance",
                "instances": [instance(g, true), instance(g, true)]})),
        ),
        3 => (
            "PersistentInstanceRequest".into(),
            head(json!({"type": kind, "instance": instance(g, false)})),
        ),
        4 => (
            "ServiceQueryRequest".into(),
            head(json!({"cluster": "DEFAULT", "healthyOnly": false, "udpPort": 0})),
        ),
        5 => (
            "SubscribeServiceRequest".into(),
            head(json!({"subscribe": g.chance(0.7), "clusters": ""})),
        ),
        6 => (
            "ServiceListRequest".into(),
            head(json!({"pageNo": 1, "pageSize": 10, "selector": ""})),
        ),
        7 => ("HealthCheckRequest".into(), json!({"requestId": "1"})),
        8 => ("ServerCheckRequest".into(), json!({"requestId": "1"})),
        _ => (
            "ConfigQueryRequest".into(),
            json!({"requestId": "1", "dataId": "a"}),
        ),
    }
}

/// One Nacos input: the bytes of a unary request message and its description.
fn nacos_input(g: &mut Gen) -> (Vec<u8>, String) {
    let (mut ty, mut body) = nacos_request(g);
    let mut body_bytes = None;
    match g.below(10) {
        0 => {
            let b = g.bytes(512);
            return (b.clone(), format!("random bytes {b:?}"));
        }
        1 => ty = g.string(),
        2 => body_bytes = Some(g.bytes(256)),
        3 => {
            let mut b = serde_json::to_vec(&body).unwrap_or_default();
            g.mutate_bytes(&mut b);
            body_bytes = Some(b);
        }
        4 => {}
        _ => g.mutate_json(&mut body),
    }
    let body_bytes = body_bytes.unwrap_or_else(|| serde_json::to_vec(&body).unwrap_or_default());
    let mut headers = HashMap::new();
    if g.chance(0.1) {
        headers.insert("accessToken".to_owned(), g.string());
    }
    if g.chance(0.05) {
        headers.insert(g.string(), g.string());
    }
    let payload = npb::Payload {
        metadata: (!g.chance(0.02)).then(|| npb::Metadata {
            r#type: ty.clone(),
            client_ip: if g.chance(0.1) {
                g.string()
            } else {
                String::new()
            },
            headers,
        }),
        body: (!g.chance(0.02)).then(|| npb::Any {
            type_url: String::new(),
            value: body_bytes.clone(),
        }),
    };
    let mut bytes = payload.encode_to_vec();
    if g.chance(0.1) {
        g.mutate_bytes(&mut bytes);
    }
    let description = format!(
        "type: {ty:?}\nbody: {}\nprotobuf: {bytes:?}",
        String::from_utf8_lossy(&body_bytes)
    );
    (bytes, description)
}

/// Runs the Nacos gRPC target.
///
/// Errors: a fresh registry's connection could not be set up.
pub async fn run_nacos(options: &Options) -> anyhow::Result<Report> {
    let mut g = Gen::new(options.seed);
    let mut runner = Runner::new(Target::NacosGrpc, options);
    let mut app = nacos().await?;
    while runner.more() {
        if runner.reset_due(app.born) {
            retire(&app.registry).await;
            app = nacos().await?;
        }
        let (bytes, description) = nacos_input(&mut g);
        let peer = if g.chance(0.03) { STRANGER } else { PEER };
        let before = panics();
        let outcome = nacos_one(&app, peer, &bytes).await;
        if matches!(outcome, Outcome::TimedOut) {
            retire(&app.registry).await;
            app = nacos().await?;
        }
        let case = Case {
            description: format!("peer: {peer}\n{description}"),
            raw: bytes,
        };
        runner.record(&case, outcome, before);
    }
    retire(&app.registry).await;
    Ok(runner.finish())
}

async fn nacos_one(app: &Nacos, peer: SocketAddr, message: &[u8]) -> Outcome {
    let before = digest(&app.registry);
    let request = grpc_request("/Request/request", peer, Body::from(frame(message)));
    let call = async {
        let response = app
            .router
            .clone()
            .oneshot(request)
            .await
            .expect("infallible");
        let (parts, body) = response.into_parts();
        let collected = body.collect().await.ok();
        (parts, collected)
    };
    let (parts, collected) = match tokio::time::timeout(ANSWER_TIMEOUT, call).await {
        Err(_) => return Outcome::TimedOut,
        Ok(a) => a,
    };
    let Some(collected) = collected else {
        return Outcome::Broken("the response body could not be read".into());
    };
    let status_of = |h: &http::HeaderMap| {
        h.get("grpc-status")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<i32>().ok())
    };
    let trailers = collected.trailers().cloned();
    let data = collected.to_bytes();
    let grpc_status = status_of(&parts.headers).or_else(|| trailers.as_ref().and_then(status_of));
    let refused = if data.len() < 5 {
        // No message: a gRPC status, which must be an error (bytes that are no `Payload`).
        match grpc_status {
            Some(0) | None => {
                return Outcome::Broken(format!("no answer message, grpc-status {grpc_status:?}"));
            }
            Some(_) => true,
        }
    } else {
        let Ok(reply) = npb::Payload::decode(&data[5..]) else {
            return Outcome::Broken("the answer is not a Payload".into());
        };
        match check_nacos_reply(&reply) {
            Ok(refused) => refused,
            Err(why) => return Outcome::Broken(why),
        }
    };
    if !refused {
        return Outcome::Accepted;
    }
    let after = digest(&app.registry);
    if before != after {
        return Outcome::Broken(format!(
            "refused but the registry changed:\nbefore:\n{before}after:\n{after}"
        ));
    }
    Outcome::Rejected
}

/// `Ok(true)`: a well-formed `ErrorResponse`; `Ok(false)`: a well-formed success.
fn check_nacos_reply(reply: &npb::Payload) -> Result<bool, String> {
    let ty = reply
        .metadata
        .as_ref()
        .map(|m| m.r#type.as_str())
        .unwrap_or("");
    let body = reply
        .body
        .as_ref()
        .map(|b| b.value.as_slice())
        .unwrap_or(b"");
    let v: Value =
        serde_json::from_slice(body).map_err(|e| format!("{ty}: body not JSON ({e})"))?;
    let success = v.get("success").and_then(Value::as_bool);
    if ty == "ErrorResponse" {
        if success != Some(false)
            || v.get("errorCode")
                .and_then(Value::as_i64)
                .is_none_or(|c| c == 0)
            || v.get("message").and_then(Value::as_str).is_none()
        {
            return Err(format!("malformed ErrorResponse: {v}"));
        }
        return Ok(true);
    }
    if !ty.ends_with("Response")
        || success != Some(true)
        || v.get("resultCode") != Some(&json!(200))
    {
        return Err(format!(
            "{ty:?} is neither a success nor an ErrorResponse: {v}"
        ));
    }
    Ok(false)
}

// --- native -------------------------------------------------------------------------------

struct Native {
    registry: Registry,
    born: Instant,
    stream: Stream,
    next_id: u64,
}

async fn native() -> anyhow::Result<Native> {
    let (registry, _) = registry();
    let router = grpc_router(&registry);
    let hello = pb::ClientMessage {
        request_id: 0,
        kind: Some(pb::client_message::Kind::Hello(pb::Hello {
            client_name: "fuzz".into(),
            client_id: "fuzz-1".into(),
        })),
    };
    let mut stream = open_stream(
        &router,
        "/gangway.v1.Registry/Session",
        PEER,
        hello.encode_to_vec().into(),
    )
    .await
    .ok_or_else(|| anyhow::anyhow!("the session did not open"))?;
    let welcome = stream
        .frames
        .next()
        .await
        .and_then(|b| pb::ServerMessage::decode(b).ok());
    anyhow::ensure!(
        matches!(
            welcome,
            Some(pb::ServerMessage {
                kind: Some(pb::server_message::Kind::Welcome(_))
            })
        ),
        "no Welcome: {welcome:?}"
    );
    Ok(Native {
        registry,
        born: Instant::now(),
        stream,
        next_id: 1,
    })
}

fn service_key(g: &mut Gen) -> Option<pb::ServiceKey> {
    if g.chance(0.03) {
        return None;
    }
    let odd = g.chance(0.15);
    let pick = |g: &mut Gen, valid: &[&str]| {
        if odd && g.chance(0.5) {
            g.string()
        } else {
            (*g.pick(valid)).to_owned()
        }
    };
    Some(pb::ServiceKey {
        namespace: pick(g, &["", "public", "dev"]),
        group: pick(g, &["", "DEFAULT_GROUP"]),
        service: pick(g, &["orders", "pay"]),
    })
}

fn instance_key(g: &mut Gen) -> Option<pb::InstanceKey> {
    if g.chance(0.03) {
        return None;
    }
    let odd = g.chance(0.15);
    Some(pb::InstanceKey {
        ip: if odd && g.chance(0.5) {
            g.string()
        } else {
            (*g.pick(&["127.0.0.1", "127.0.0.2", "::1"])).to_owned()
        },
        port: if odd && g.chance(0.5) {
            g.rng_u32()
        } else {
            *g.pick(&[8080, 8081])
        },
        cluster: if odd && g.chance(0.5) {
            g.string()
        } else {
            (*g.pick(&["", "DEFAULT", "b"])).to_owned()
        },
    })
}

fn metadata(g: &mut Gen) -> HashMap<String, String> {
    let mut m = HashMap::new();
    for _ in 0..g.below(3) {
        if g.chance(0.7) {
            m.insert(
                (*g.pick(&["zone", "version", "preserved.heart.beat.timeout"])).to_owned(),
                (*g.pick(&["a", "1", "15000"])).to_owned(),
            );
        } else {
            m.insert(g.string(), g.string());
        }
    }
    m
}

/// A `ClientMessage` built field by field, mostly valid.
fn client_message(g: &mut Gen) -> pb::ClientMessage {
    use pb::client_message::Kind;
    let kind = match g.below(12) {
        0 => Some(Kind::Hello(pb::Hello {
            client_name: g.string(),
            client_id: g.string(),
        })),
        1..=3 => Some(Kind::Register(pb::Register {
            service: service_key(g),
            instance: instance_key(g),
            weight: g.chance(0.5).then(|| {
                *g.pick(&[
                    0.0,
                    1.0,
                    2.5,
                    -1.0,
                    10_001.0,
                    f64::NAN,
                    f64::INFINITY,
                    0.0005,
                ])
            }),
            metadata: metadata(g),
        })),
        4 => Some(Kind::Deregister(pb::Deregister {
            service: service_key(g),
            instance: instance_key(g),
        })),
        5 => Some(Kind::Subscribe(pb::Subscribe {
            service: service_key(g),
        })),
        6 => Some(Kind::Unsubscribe(pb::Unsubscribe {
            service: service_key(g),
        })),
        7 => Some(Kind::Ack(pb::Ack {
            service: service_key(g),
            revision: g.rng_u64(),
        })),
        8 => Some(Kind::Pull(pb::Pull {
            service: service_key(g),
            known_revision: g.rng_u64() % 4,
        })),
        9 => Some(Kind::Drain(pb::Drain {
            service: service_key(g),
            instance: instance_key(g),
            timeout_ms: *g.pick(&[1, 5, 10]),
            force: g.chance(0.5),
        })),
        10 => Some(Kind::WaitReady(pb::WaitReady {
            service: service_key(g),
            instance: instance_key(g),
            timeout_ms: *g.pick(&[1, 5, 10]),
        })),
        _ => None,
    };
    pb::ClientMessage {
        request_id: 0,
        kind,
    }
}

/// Runs the native target.
///
/// Errors: a fresh registry's session could not be opened.
pub async fn run_native(options: &Options) -> anyhow::Result<Report> {
    let mut g = Gen::new(options.seed);
    let mut runner = Runner::new(Target::Native, options);
    let mut app = native().await?;
    while runner.more() {
        if runner.reset_due(app.born) {
            retire(&app.registry).await;
            app = native().await?;
        }
        let before = panics();
        // The clients' decoders see random bytes too.
        let noise = g.bytes(256);
        let _ = pb::ServerMessage::decode(noise.as_slice());
        let _ = npb::Payload::decode(noise.as_slice());
        let (message, raw) = match g.below(4) {
            0 => (pb::ClientMessage::decode(noise.as_slice()).ok(), noise),
            1 => {
                let mut b = client_message(&mut g).encode_to_vec();
                g.mutate_bytes(&mut b);
                (pb::ClientMessage::decode(b.as_slice()).ok(), b)
            }
            _ => {
                let m = client_message(&mut g);
                let b = m.encode_to_vec();
                (Some(m), b)
            }
        };
        let description = format!("{message:?}\nprotobuf: {raw:?}");
        let outcome = match message {
            // prost refused the bytes: a rejection before any handler.
            None => Outcome::Rejected,
            Some(m) => native_one(&mut app, m).await,
        };
        if matches!(outcome, Outcome::TimedOut) {
            retire(&app.registry).await;
            app = native().await?;
        }
        runner.record(&Case { description, raw }, outcome, before);
    }
    retire(&app.registry).await;
    Ok(runner.finish())
}

async fn native_one(app: &mut Native, mut message: pb::ClientMessage) -> Outcome {
    use pb::client_message::Kind;
    let id = app.next_id;
    let sentinel_id = id + 1;
    app.next_id += 2;
    message.request_id = id;
    let expects_reply = !matches!(message.kind, None | Some(Kind::Ack(_)));
    let sentinel = pb::ClientMessage {
        request_id: sentinel_id,
        kind: Some(Kind::Pull(pb::Pull {
            service: Some(pb::ServiceKey {
                namespace: String::new(),
                group: String::new(),
                service: "fuzz-sentinel".into(),
            }),
            known_revision: 0,
        })),
    };
    let before = digest(&app.registry);
    let exchange = async {
        app.stream
            .tx
            .send(Ok(frame(&message.encode_to_vec())))
            .await
            .ok()?;
        app.stream
            .tx
            .send(Ok(frame(&sentinel.encode_to_vec())))
            .await
            .ok()?;
        let (mut reply, mut sentinel_seen) = (None, false);
        while !(sentinel_seen && (reply.is_some() || !expects_reply)) {
            let bytes = app.stream.frames.next().await?;
            let Ok(m) = pb::ServerMessage::decode(bytes) else {
                return Some(Err(
                    "the server sent a message that is no ServerMessage".to_owned()
                ));
            };
            let rid = match &m.kind {
                Some(pb::server_message::Kind::Reply(r)) => r.request_id,
                Some(pb::server_message::Kind::Snapshot(s)) => s.request_id,
                _ => 0,
            };
            if rid == sentinel_id {
                sentinel_seen = true;
            } else if rid == id {
                reply = Some(m);
            }
        }
        Some(Ok(reply))
    };
    let reply = match tokio::time::timeout(ANSWER_TIMEOUT, exchange).await {
        Err(_) => return Outcome::TimedOut,
        Ok(None) => return Outcome::Broken("the session stream ended".into()),
        Ok(Some(Err(why))) => return Outcome::Broken(why),
        Ok(Some(Ok(reply))) => reply,
    };
    let refused = match reply.and_then(|m| m.kind) {
        Some(pb::server_message::Kind::Reply(r)) if !r.error_code.is_empty() => {
            if r.error_message.is_empty() {
                return Outcome::Broken(format!("error reply without a message: {r:?}"));
            }
            true
        }
        _ => false,
    };
    if !refused {
        return Outcome::Accepted;
    }
    let after = digest(&app.registry);
    if before != after {
        return Outcome::Broken(format!(
            "refused but the registry changed:\nbefore:\n{before}after:\n{after}"
        ));
    }
    Outcome::Rejected
}
