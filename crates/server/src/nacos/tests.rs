//! The Nacos layer: v1/v3 HTTP through the `Router` (no sockets), and the gRPC protocol over a
//! real loopback socket with the generated Nacos client stubs.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum::http::{Method, Request, StatusCode, header};
use gangway_core::model::{InstanceKey, ServiceKey};
use gangway_proto::nacos as pb;
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tower::ServiceExt;

use gangway_testkit::eventually;

use super::Nacos;
use crate::config::Config;
use crate::engine::Registry;
use crate::metrics::Metrics;

fn registry() -> Registry {
    registry_with(Config::for_tests())
}

fn registry_with(config: Config) -> Registry {
    let mut prom = prometheus_client::registry::Registry::default();
    let metrics = Metrics::register(&mut prom);
    Registry::start(
        Arc::new(gangway_store::MemoryStore::default()),
        config,
        metrics,
    )
    .expect("registry starts")
}

struct App {
    router: Router,
    registry: Registry,
}

fn app() -> App {
    let registry = registry();
    let router = super::http::router(Nacos::new(registry.clone()))
        .layer(MockConnectInfo(SocketAddr::from(([127, 0, 0, 1], 40_000))));
    App { router, registry }
}

impl App {
    async fn call(&self, method: Method, uri: &str) -> (StatusCode, String) {
        self.send(
            Request::builder()
                .method(method)
                .uri(uri)
                .body(Body::empty())
                .unwrap(),
        )
        .await
    }

    async fn form(&self, method: Method, uri: &str, form: &str) -> (StatusCode, String) {
        self.send(
            Request::builder()
                .method(method)
                .uri(uri)
                .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
                .body(Body::from(form.to_owned()))
                .unwrap(),
        )
        .await
    }

    async fn send(&self, request: Request<Body>) -> (StatusCode, String) {
        let response = self
            .router
            .clone()
            .oneshot(request)
            .await
            .expect("infallible");
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8(bytes.to_vec()).unwrap())
    }

    async fn list(&self, query: &str) -> Value {
        let (status, body) = self
            .call(Method::GET, &format!("/nacos/v1/ns/instance/list?{query}"))
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        serde_json::from_str(&body).unwrap()
    }
}

const REG: &str = "/nacos/v1/ns/instance?serviceName=orders&ip=10.0.0.1&port=8080";

#[tokio::test]
async fn v1_register_then_list_in_nacos_shape() {
    let app = app();
    let (status, body) = app
        .call(
            Method::POST,
            &format!("{REG}&weight=2&metadata=%7B%22zone%22%3A%22a%22%7D"),
        )
        .await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "ok"));
    let v = app.list("serviceName=orders&clusters=DEFAULT").await;
    assert_eq!(v["name"], "DEFAULT_GROUP@@orders");
    assert_eq!(v["groupName"], "DEFAULT_GROUP");
    assert_eq!(
        v["clusters"], "DEFAULT",
        "echoed: clients key their cache on it"
    );
    assert_eq!(v["cacheMillis"], 10000);
    assert_eq!(v["checksum"], "");
    assert_eq!(v["reachProtectionThreshold"], false);
    let host = &v["hosts"][0];
    assert_eq!(host["ip"], "10.0.0.1");
    assert_eq!(host["weight"], 2.0);
    assert_eq!(host["metadata"]["zone"], "a");
    assert_eq!(
        host["instanceId"],
        "10.0.0.1#8080#DEFAULT#DEFAULT_GROUP@@orders"
    );
    // The same instance through the native view.
    let view = app.registry.view(&ServiceKey::named("orders"));
    assert_eq!(view.instances.len(), 1);
    assert!(view.instances[0].ephemeral);
}

#[tokio::test]
async fn v1_last_ref_time_grows_on_every_answer() {
    let app = app();
    let a = app.list("serviceName=nothing").await;
    let b = app.list("serviceName=nothing").await;
    assert!(b["lastRefTime"].as_u64() > a["lastRefTime"].as_u64());
    assert_eq!(
        a["hosts"],
        json!([]),
        "an unknown service is an empty list, not an error"
    );
}

#[tokio::test]
async fn v1_beat_codes_and_auto_reregister() {
    let app = app();
    let beat = "/nacos/v1/ns/instance/beat?serviceName=orders&ip=10.0.0.1&port=8080";
    let (_, body) = app.call(Method::PUT, beat).await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["code"], 20404, "unknown instance, light beat: {v}");
    assert_eq!(v["lightBeatEnabled"], true);
    let full = "beat=%7B%22ip%22%3A%2210.0.0.1%22%2C%22port%22%3A8080%2C%22weight%22%3A3%7D";
    let (_, body) = app
        .form(
            Method::PUT,
            "/nacos/v1/ns/instance/beat?serviceName=orders",
            full,
        )
        .await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["code"], 10200, "full beat re-registers: {v}");
    assert_eq!(v["clientBeatInterval"], 5000);
    let instance = app
        .registry
        .instance(
            &ServiceKey::named("orders"),
            &InstanceKey::new("10.0.0.1", 8080, ""),
        )
        .unwrap();
    assert_eq!(instance.weight, 3.0);
    let (_, body) = app.call(Method::PUT, beat).await;
    assert!(body.contains("\"code\":10200"), "{body}");
}

#[tokio::test]
async fn v1_modify_enabled_false_is_the_durable_offline() {
    let app = app();
    app.call(Method::POST, REG).await;
    app.call(
        Method::POST,
        "/nacos/v1/ns/instance?serviceName=orders&ip=10.0.0.2&port=8080",
    )
    .await;
    let (status, body) = app
        .form(
            Method::PUT,
            "/nacos/v1/ns/instance",
            "serviceName=orders&ip=10.0.0.1&port=8080&enabled=false",
        )
        .await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "ok"));
    let v = app.list("serviceName=orders").await;
    assert_eq!(v["hosts"].as_array().unwrap().len(), 1);
    assert_eq!(v["hosts"][0]["ip"], "10.0.0.2");
    // Deregister and register again: still offline (the mark is keyed by the instance).
    app.call(Method::DELETE, REG).await;
    app.call(Method::POST, REG).await;
    let instance = app
        .registry
        .instance(
            &ServiceKey::named("orders"),
            &InstanceKey::new("10.0.0.1", 8080, ""),
        )
        .unwrap();
    assert!(!instance.enabled);
}

/// Issue 9 parts 1 and 7 over Nacos v1: `enabled=false` keeps the last serving instance, and an
/// instance a session keeps alive cannot be taken over or deleted by a v1 client.
#[tokio::test]
async fn v1_cannot_empty_the_view_nor_take_over_a_session_instance() {
    let app = app();
    app.call(Method::POST, REG).await;
    let (status, body) = app
        .form(
            Method::PUT,
            "/nacos/v1/ns/instance",
            "serviceName=orders&ip=10.0.0.1&port=8080&enabled=false",
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("last serving instance"), "{body}");
    assert_eq!(
        app.list("serviceName=orders").await["hosts"]
            .as_array()
            .unwrap()
            .len(),
        1
    );

    let session = app
        .registry
        .open_session("127.0.0.1:9".into(), "native".into(), "n1".into());
    let owned = InstanceKey::new("10.0.0.7", 8080, "");
    app.registry
        .register(
            ServiceKey::named("orders"),
            gangway_core::model::Instance::new(owned.clone()),
            crate::engine::LivenessRequest::Session(session),
        )
        .await
        .unwrap();
    let before = app.list("serviceName=orders").await;
    let (status, body) = app
        .call(
            Method::POST,
            "/nacos/v1/ns/instance?serviceName=orders&ip=10.0.0.7&port=8080&weight=5",
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("kept alive by session"), "{body}");
    let (status, body) = app
        .call(
            Method::DELETE,
            "/nacos/v1/ns/instance?serviceName=orders&ip=10.0.0.7&port=8080",
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let after = app.list("serviceName=orders").await;
    assert_eq!(before["hosts"], after["hosts"], "refusals changed nothing");
    let stored = app
        .registry
        .instance(&ServiceKey::named("orders"), &owned)
        .unwrap();
    assert_eq!(stored.weight, 1.0);
}

#[tokio::test]
async fn v1_malformed_input_is_a_nacos_400_and_changes_nothing() {
    let app = app();
    app.call(Method::POST, REG).await;
    let before = app.registry.entries(&ServiceKey::named("orders")).0;
    for uri in [
        "/nacos/v1/ns/instance?ip=10.0.0.1&port=8080",
        "/nacos/v1/ns/instance?serviceName=orders&ip=10.0.0.1&port=abc",
        "/nacos/v1/ns/instance?serviceName=orders&ip=10.0.0.1&port=8080&weight=x",
        "/nacos/v1/ns/instance?serviceName=orders&ip=10.0.0.1&port=8080&weight=10001",
        "/nacos/v1/ns/instance?serviceName=orders&ip=10.0.0.1&port=8080&metadata=%7B%22a%22%3A",
    ] {
        let (status, body) = app.call(Method::POST, uri).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}: {body}");
        assert!(
            body.starts_with("caused: ") && body.ends_with(';'),
            "{uri}: {body}"
        );
    }
    let (_, body) = app
        .call(Method::POST, "/nacos/v1/ns/instance?ip=1.2.3.4&port=1")
        .await;
    assert_eq!(body, "caused: Param 'serviceName' is required.;");
    assert_eq!(app.registry.entries(&ServiceKey::named("orders")).0, before);
}

#[tokio::test]
async fn v1_deregister_unknown_is_ok_and_service_crud_follows_nacos() {
    let app = app();
    let (status, body) = app.call(Method::DELETE, REG).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "ok"));
    let svc = "/nacos/v1/ns/service?serviceName=billing&protectThreshold=0.5";
    assert_eq!(app.call(Method::POST, svc).await.1, "ok");
    let (status, body) = app.call(Method::POST, svc).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains("already exists"), "{body}");
    let (_, body) = app
        .call(Method::GET, "/nacos/v1/ns/service?serviceName=billing")
        .await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["protectThreshold"], 0.5);
    app.call(
        Method::POST,
        "/nacos/v1/ns/instance?serviceName=billing&ip=10.0.0.1&port=1",
    )
    .await;
    let (status, body) = app
        .call(Method::DELETE, "/nacos/v1/ns/service?serviceName=billing")
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains("not empty"), "{body}");
    let (_, body) = app
        .call(
            Method::GET,
            "/nacos/v1/ns/service/list?pageNo=1&pageSize=10",
        )
        .await;
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap(),
        json!({"count": 1, "doms": ["billing"]})
    );
    let (_, body) = app.call(Method::GET, "/nacos/v1/ns/operator/metrics").await;
    assert!(body.contains("\"status\":\"UP\""), "{body}");
}

#[tokio::test]
async fn v1_list_with_udp_port_makes_a_poller_that_acks() {
    let app = app();
    app.call(Method::POST, REG).await;
    app.list("serviceName=orders").await;
    assert!(
        app.registry
            .subscribers(&ServiceKey::named("orders"))
            .is_empty()
    );
    app.list("serviceName=orders&clientIP=10.1.1.1&udpPort=5555")
        .await;
    app.list("serviceName=orders&clientIP=10.1.1.1&udpPort=5555")
        .await;
    let subs = app.registry.subscribers(&ServiceKey::named("orders"));
    assert_eq!(subs.len(), 1, "one poller per client and service");
    assert_eq!(subs[0].address, "10.1.1.1:5555");
    assert!(subs[0].client_name.starts_with("nacos-v1-"));
    assert_eq!(
        subs[0].acked_revision,
        app.registry.view(&ServiceKey::named("orders")).revision
    );
}

#[tokio::test]
async fn v3_envelope_and_unsupported_paths() {
    let app = app();
    let (status, body) = app
        .call(
            Method::POST,
            "/nacos/v3/client/ns/instance?serviceName=orders&ip=10.0.0.1&port=80",
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["code"], 0);
    let (status, body) = app
        .call(
            Method::POST,
            "/nacos/v3/client/ns/instance?serviceName=orders&ip=10.0.0.9&port=80&heartBeat=true",
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["code"], 21003);
    let (_, body) = app
        .call(
            Method::GET,
            "/nacos/v3/client/ns/instance/list?serviceName=orders",
        )
        .await;
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["data"][0]["port"],
        80
    );
    let (status, body) = app.call(Method::GET, "/nacos/v1/cs/configs?dataId=x").await;
    assert_eq!(status, StatusCode::NOT_IMPLEMENTED);
    assert!(body.contains("config center"), "{body}");
    let (status, _) = app.call(Method::GET, "/nacos/v2/ns/instance/list").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

// --- gRPC --------------------------------------------------------------------------------

struct Grpc {
    registry: Registry,
    nacos: Nacos,
    channel: tonic::transport::Channel,
}

async fn grpc() -> Grpc {
    let registry = registry();
    grpc_with(Nacos::new(registry)).await
}

async fn grpc_with(nacos: Nacos) -> Grpc {
    let registry = nacos.registry().clone();
    let (request, bi) = super::grpc::services(nacos.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(request)
            .add_service(bi)
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    Grpc {
        registry,
        nacos,
        channel,
    }
}

fn body(p: &pb::Payload) -> Value {
    serde_json::from_slice(&p.body.as_ref().unwrap().value).unwrap()
}

fn ty(p: &pb::Payload) -> &str {
    &p.metadata.as_ref().unwrap().r#type
}

impl Grpc {
    async fn unary(&self, ty: &str, body: Value) -> pb::Payload {
        pb::request_client::RequestClient::new(self.channel.clone())
            .request(super::grpc::payload(ty, &body))
            .await
            .unwrap()
            .into_inner()
    }

    /// Opens the stream and sets the connection up; returns the sender and the server's stream.
    async fn setup(&self) -> (mpsc::Sender<pb::Payload>, tonic::Streaming<pb::Payload>) {
        let (tx, rx) = mpsc::channel(16);
        tx.send(super::grpc::payload(
            "ConnectionSetupRequest",
            &json!({"clientVersion": "test", "labels": {"module": "naming"}, "abilityTable": {}}),
        ))
        .await
        .unwrap();
        let mut inbound =
            pb::bi_request_stream_client::BiRequestStreamClient::new(self.channel.clone())
                .request_bi_stream(ReceiverStream::new(rx))
                .await
                .unwrap()
                .into_inner();
        let ack = inbound.message().await.unwrap().unwrap();
        assert_eq!(ty(&ack), "SetupAckRequest");
        assert_eq!(
            body(&ack)["abilityTable"]["supportPersistentInstanceByGrpc"],
            true
        );
        (tx, inbound)
    }
}

#[tokio::test]
async fn grpc_handshake_and_301_before_setup() {
    let g = grpc().await;
    let reply = g
        .unary("ServerCheckRequest", json!({"requestId": "1"}))
        .await;
    assert_eq!(ty(&reply), "ServerCheckResponse");
    let v = body(&reply);
    assert_eq!(v["resultCode"], 200);
    assert_eq!(v["requestId"], "1");
    assert!(v["connectionId"].as_str().unwrap().contains("_127.0.0.1_"));
    let reply = g
        .unary("HealthCheckRequest", json!({"requestId": "2"}))
        .await;
    assert_eq!(ty(&reply), "ErrorResponse");
    assert_eq!(body(&reply)["errorCode"], 301);
    let (_tx, _inbound) = g.setup().await;
    let reply = g
        .unary("HealthCheckRequest", json!({"requestId": "3"}))
        .await;
    assert_eq!(ty(&reply), "HealthCheckResponse");
    let reply = g
        .unary("ConfigQueryRequest", json!({"requestId": "4"}))
        .await;
    assert_eq!(body(&reply)["errorCode"], 302);
}

#[tokio::test]
async fn grpc_register_subscribe_push_ack_and_connection_end() {
    let g = grpc().await;
    let (tx, mut inbound) = g.setup().await;
    let instance = json!({"ip": "10.0.0.1", "port": 80, "weight": 1.0, "metadata": {"k": "v"}});
    let reply = g
        .unary(
            "InstanceRequest",
            json!({"requestId": "r", "serviceName": "orders", "groupName": "DEFAULT_GROUP",
                   "namespace": "", "type": "registerInstance", "instance": instance}),
        )
        .await;
    assert_eq!(ty(&reply), "InstanceResponse", "{:?}", body(&reply));
    assert_eq!(body(&reply)["type"], "registerInstance");
    let key = ServiceKey::named("orders");
    assert_eq!(g.registry.view(&key).instances.len(), 1);

    let reply = g
        .unary(
            "SubscribeServiceRequest",
            json!({"requestId": "s", "serviceName": "orders", "groupName": "DEFAULT_GROUP",
                   "subscribe": true, "clusters": ""}),
        )
        .await;
    let info = &body(&reply)["serviceInfo"];
    assert_eq!(info["name"], "orders", "gRPC answers the bare name");
    assert_eq!(info["hosts"][0]["metadata"]["k"], "v");

    let push = inbound.message().await.unwrap().unwrap();
    assert_eq!(ty(&push), "NotifySubscriberRequest");
    let pushed = body(&push);
    assert!(pushed["serviceInfo"]["lastRefTime"].as_u64() > info["lastRefTime"].as_u64());
    let subs = g.registry.subscribers(&key);
    assert_eq!(subs.len(), 1);
    assert_eq!(subs[0].acked_revision, 0);
    tx.send(super::grpc::payload(
        "NotifySubscriberResponse",
        &json!({"requestId": pushed["requestId"], "resultCode": 200}),
    ))
    .await
    .unwrap();
    let revision = g.registry.view(&key).revision;
    let registry = g.registry.clone();
    eventually("the push acked", || {
        registry.subscribers(&key)[0].acked_revision == revision
    })
    .await;

    // The connection's stream ends: its instance and its subscription go at once.
    drop(tx);
    drop(inbound);
    let registry = g.registry.clone();
    eventually("the condition", || {
        registry.view(&key).instances.is_empty() && registry.subscribers(&key).is_empty()
    })
    .await;
}

/// A subscribe during the warm-up is answered (an error would raise in the application, as
/// the Python SDK does) with an empty host list, which the SDKs leave their cache alone for.
#[tokio::test]
async fn grpc_subscribe_during_the_warm_up_succeeds_with_no_hosts() {
    let config = Config {
        warmup: Duration::from_secs(3600),
        ..Config::for_tests()
    };
    let g = grpc_with(Nacos::new(registry_with(config))).await;
    assert!(g.registry.warming_up());
    let (_tx, _inbound) = g.setup().await;
    register_one(&g).await;
    let reply = g
        .unary(
            "SubscribeServiceRequest",
            json!({"requestId": "s", "serviceName": "orders", "groupName": "DEFAULT_GROUP",
                   "subscribe": true, "clusters": ""}),
        )
        .await;
    assert_eq!(ty(&reply), "SubscribeServiceResponse", "{:?}", body(&reply));
    assert_eq!(body(&reply)["resultCode"], 200);
    assert_eq!(body(&reply)["serviceInfo"]["hosts"], json!([]));
    assert_eq!(
        g.registry.subscribers(&ServiceKey::named("orders")).len(),
        1
    );
}

#[tokio::test]
async fn grpc_refusals_are_error_responses() {
    let g = grpc().await;
    let (_tx, _inbound) = g.setup().await;
    let reply = g
        .unary(
            "InstanceRequest",
            json!({"requestId": "r", "serviceName": "orders", "type": "registerInstance",
                   "instance": {"ip": "10.0.0.1", "port": 0}}),
        )
        .await;
    assert_eq!(ty(&reply), "ErrorResponse");
    let v = body(&reply);
    assert_eq!(
        (v["resultCode"].clone(), v["errorCode"].clone()),
        (json!(500), json!(400))
    );
    assert!(v["message"].as_str().unwrap().contains("port"), "{v}");
    let mut bad = super::grpc::payload("InstanceRequest", &json!({}));
    bad.body.as_mut().unwrap().value = b"not json".to_vec();
    let reply = pb::request_client::RequestClient::new(g.channel.clone())
        .request(bad)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(body(&reply)["errorCode"], 502);
}

/// Subscribes to `orders` on a set-up connection and reads the first push (one host).
async fn subscribe_orders(
    g: &Grpc,
) -> (
    mpsc::Sender<pb::Payload>,
    tonic::Streaming<pb::Payload>,
    Value,
) {
    let (tx, mut inbound) = g.setup().await;
    register_one(g).await;
    let reply = g
        .unary(
            "SubscribeServiceRequest",
            json!({"requestId": "s", "serviceName": "orders", "groupName": "DEFAULT_GROUP",
                   "subscribe": true, "clusters": ""}),
        )
        .await;
    assert_eq!(ty(&reply), "SubscribeServiceResponse", "{:?}", body(&reply));
    let first = body(&inbound.message().await.unwrap().unwrap());
    assert_eq!(first["serviceInfo"]["hosts"].as_array().unwrap().len(), 1);
    (tx, inbound, first)
}

/// A server that re-sends unanswered pushes after `resend` and spaces pushes by nothing, with a
/// connection subscribed to `orders` ([`subscribe_orders`]).
async fn subscribed_with_resend(
    resend: Duration,
) -> (
    Grpc,
    mpsc::Sender<pb::Payload>,
    tonic::Streaming<pb::Payload>,
    Value,
) {
    let config = Config {
        resend_interval: resend,
        full_push_interval: Duration::ZERO,
        ..Config::for_tests()
    };
    let g = grpc_with(Nacos::new(registry_with(config))).await;
    let (tx, inbound, first) = subscribe_orders(&g).await;
    (g, tx, inbound, first)
}

/// Registers the lease instance 10.0.1.`i`:80 in `orders`.
async fn register_lease(registry: &Registry, i: u8) {
    {
        registry
            .register(
                ServiceKey::named("orders"),
                gangway_core::model::Instance::new(InstanceKey::new(
                    &format!("10.0.1.{i}"),
                    80,
                    "",
                )),
                crate::engine::LivenessRequest::Lease {
                    ttl: None,
                    delete_timeout: None,
                },
            )
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn grpc_pushes_wait_for_the_previous_answer_and_coalesce_meanwhile() {
    // Long enough that only an answer lets the next push go.
    let (g, tx, mut inbound, first) = subscribed_with_resend(Duration::from_secs(60)).await;
    // Three changes while the first push is unanswered, each followed by a request's round
    // trip (time for a push to go out): none is pushed yet.
    for i in 0..3u8 {
        register_lease(&g.registry, i).await;
        let reply = g
            .unary("HealthCheckRequest", json!({"requestId": format!("h{i}")}))
            .await;
        assert_eq!(ty(&reply), "HealthCheckResponse");
    }
    let key = ServiceKey::named("orders");
    let revision = g.registry.view(&key).revision;
    tx.send(super::grpc::payload(
        "NotifySubscriberResponse",
        &json!({"requestId": first["requestId"], "resultCode": 200}),
    ))
    .await
    .unwrap();
    // The next push is the latest view, the three changes in one.
    let next = body(&inbound.message().await.unwrap().unwrap());
    assert_eq!(
        next["serviceInfo"]["hosts"].as_array().unwrap().len(),
        4,
        "{next}"
    );
    tx.send(super::grpc::payload(
        "NotifySubscriberResponse",
        &json!({"requestId": next["requestId"], "resultCode": 200}),
    ))
    .await
    .unwrap();
    let registry = g.registry.clone();
    eventually("the latest acked", || {
        registry.subscribers(&key)[0].acked_revision == revision
    })
    .await;
}

#[tokio::test]
async fn grpc_an_unanswered_push_holds_the_next_for_the_resend_interval_only() {
    let (g, _tx, mut inbound, _first) = subscribed_with_resend(Duration::from_millis(200)).await;
    register_lease(&g.registry, 0).await;
    // Never answered: the latest still goes out after the resend interval.
    let next = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let push = body(&inbound.message().await.unwrap().unwrap());
            if push["serviceInfo"]["hosts"].as_array().unwrap().len() == 2 {
                break push;
            }
        }
    })
    .await
    .expect("the latest view pushed without an answer within 10 s");
    assert_eq!(next["serviceInfo"]["name"], "orders");
}

async fn register_one(g: &Grpc) {
    let reply = g
        .unary(
            "InstanceRequest",
            json!({"requestId": "r", "serviceName": "orders", "type": "registerInstance",
                   "instance": {"ip": "10.0.0.1", "port": 80}}),
        )
        .await;
    assert_eq!(ty(&reply), "InstanceResponse", "{:?}", body(&reply));
}

#[tokio::test]
async fn grpc_client_detection_keeps_answering_clients_and_closes_silent_ones() {
    let nacos = Nacos::with_detection(
        registry(),
        Duration::from_millis(200),
        Duration::from_millis(300),
    );
    let g = grpc_with(nacos).await;
    let (tx, mut inbound) = g.setup().await;
    register_one(&g).await;
    let key = ServiceKey::named("orders");
    // Answer two probes: the connection stays.
    for _ in 0..2 {
        let probe = inbound.message().await.unwrap().unwrap();
        assert_eq!(ty(&probe), "ClientDetectionRequest");
        tx.send(super::grpc::payload(
            "ClientDetectionResponse",
            &json!({"requestId": body(&probe)["requestId"], "resultCode": 200}),
        ))
        .await
        .unwrap();
    }
    assert_eq!(g.registry.view(&key).instances.len(), 1);
    // Stop answering: the next probe goes unanswered, the stream ends, the instance goes.
    let probe = inbound.message().await.unwrap().unwrap();
    assert_eq!(ty(&probe), "ClientDetectionRequest");
    let ended = tokio::time::timeout(Duration::from_secs(5), inbound.message()).await;
    // An error, not a clean end: the Python SDK reconnects only when its stream raises.
    match ended {
        Ok(Err(status)) => assert_eq!(status.code(), tonic::Code::Unavailable, "{status}"),
        other => panic!("the stream must end in UNAVAILABLE, got {other:?}"),
    }
    let registry = g.registry.clone();
    eventually("the connection's instance gone", || {
        registry.view(&key).instances.is_empty()
    })
    .await;
    drop(tx);
}

#[tokio::test]
async fn grpc_shutdown_resets_connections_and_ends_streams() {
    let g = grpc().await;
    let (_tx, mut inbound) = g.setup().await;
    register_one(&g).await;
    g.nacos.reset_all().await;
    let reset = inbound.message().await.unwrap().unwrap();
    assert_eq!(ty(&reset), "ConnectResetRequest");
    assert!(
        body(&reset)["connectionId"]
            .as_str()
            .unwrap()
            .contains("_127.0.0.1_")
    );
    let ended = tokio::time::timeout(Duration::from_secs(5), inbound.message()).await;
    // An error, not a clean end: the Python SDK reconnects only when its stream raises.
    match ended {
        Ok(Err(status)) => assert_eq!(status.code(), tonic::Code::Unavailable, "{status}"),
        other => panic!("the stream must end in UNAVAILABLE, got {other:?}"),
    }
    let registry = g.registry.clone();
    eventually("the condition", || {
        registry
            .view(&ServiceKey::named("orders"))
            .instances
            .is_empty()
    })
    .await;
}

/// What the Nacos v1 list's poller is to the registry: it ignores empty lists.
fn v1_poller() -> crate::engine::SubscriberInfo {
    crate::engine::SubscriberInfo {
        ignores_empty_lists: true,
        ..crate::engine::SubscriberInfo::new(crate::engine::SubscriberKind::Poller, "10.1.1.1:5555")
    }
}

#[tokio::test]
async fn drain_of_the_last_instance_notes_the_nacos_empty_list_quirk() {
    let app = app();
    app.call(Method::POST, REG).await;
    app.call(
        Method::POST,
        "/nacos/v1/ns/instance?serviceName=orders&ip=10.0.0.2&port=8080",
    )
    .await;
    let key = ServiceKey::named("orders");
    let drain = |ip: &'static str, registry: Registry, key: ServiceKey| async move {
        let instance = InstanceKey::new(ip, 8080, "");
        let registry2 = registry.clone();
        let key2 = key.clone();
        // The poller acks on its next poll.
        let poll = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            registry2
                .poll_as(&key2, "nacos-v1-test", v1_poller(), None)
                .unwrap();
        });
        let report = registry
            .drain(&key, &instance, Duration::from_secs(5), true)
            .await
            .unwrap();
        poll.await.unwrap();
        report
    };
    // A Nacos v1 poller, as the v1 list registers one from clientIP:udpPort.
    app.registry
        .poll_as(&key, "nacos-v1-test", v1_poller(), None)
        .unwrap();
    let first = drain("10.0.0.1", app.registry.clone(), key.clone()).await;
    assert!(first.complete);
    assert!(
        first
            .notes
            .iter()
            .all(|n| !n.contains("empty instance list")),
        "another instance still serves: {:?}",
        first.notes
    );
    let last = drain("10.0.0.2", app.registry.clone(), key.clone()).await;
    assert!(last.complete, "acked, yet unprovable: {last:?}");
    assert!(
        last.notes
            .iter()
            .any(|n| n.contains("ignore an empty instance list") && n.contains("10.0.0.2:8080")),
        "{:?}",
        last.notes
    );
}

#[tokio::test(start_paused = true)]
async fn v1_pollers_are_forgotten_after_three_missed_polls() {
    let app = app();
    let key = ServiceKey::named("orders");
    app.list("serviceName=orders&clientIP=10.1.1.1&udpPort=5555")
        .await;
    app.registry
        .poll(&key, "native", "10.2.2.2:1".into())
        .unwrap();
    assert_eq!(app.registry.subscribers(&key).len(), 2);
    // 3 x cacheMillis (30 s) plus the housekeeping period: the Nacos poller is gone, the
    // native one (server default, 90 s) is not.
    tokio::time::sleep(Duration::from_secs(36)).await;
    let ids: Vec<String> = app
        .registry
        .subscribers(&key)
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(ids, ["p-native@public/DEFAULT_GROUP/orders"]);
}

// --- odd values (issue #9) -----------------------------------------------------------------

/// Everything a refused request could have changed: each service with its revision, its
/// instances (with their leases) and its subscribers.
fn state(registry: &Registry) -> String {
    registry
        .services(None, None)
        .into_iter()
        .map(|s| {
            let (revision, mut entries) = registry.entries(&s.key);
            entries.sort_by(|a, b| a.instance.key.cmp(&b.instance.key));
            let subscribers = registry.subscribers(&s.key);
            format!("{} r{revision} {entries:?} {subscribers:?}\n", s.key)
        })
        .collect()
}

/// `metadata=` for a v1 form: the JSON object, percent-encoded.
fn meta(m: Value) -> String {
    form_urlencoded::byte_serialize(m.to_string().as_bytes()).collect()
}

#[tokio::test]
async fn v1_odd_values_are_nacos_400s_naming_the_field_and_change_nothing() {
    let app = app();
    app.call(Method::POST, REG).await;
    let max = u64::MAX.to_string();
    let reg = "/nacos/v1/ns/instance?ip=10.0.0.2&port=8080";
    let cases: Vec<(Method, String, &str)> = vec![
        (
            Method::POST,
            format!("{reg}&serviceName=%40%40orders"),
            "group",
        ),
        (Method::POST, format!("{reg}&serviceName=.."), "service"),
        (
            Method::POST,
            format!("{reg}&serviceName=orders&groupName=."),
            "group",
        ),
        (
            Method::POST,
            format!("{reg}&serviceName=orders&weight=-0.0"),
            "weight",
        ),
        (
            Method::POST,
            format!("{reg}&serviceName=orders&weight=5e-324"),
            "weight",
        ),
        (
            Method::POST,
            format!(
                "{reg}&serviceName=orders&metadata={}",
                meta(json!({"preserved.heart.beat.timeout": max}))
            ),
            "preserved.heart.beat.timeout",
        ),
        (
            Method::POST,
            format!("{reg}&serviceName=orders&metadata=preserved.ip.delete.timeout%3D{max}"),
            "preserved.ip.delete.timeout",
        ),
        (
            Method::POST,
            format!(
                "{reg}&serviceName=orders&metadata={}",
                meta(json!({"preserved.heart.beat.interval": max}))
            ),
            "preserved.heart.beat.interval",
        ),
        (
            Method::POST,
            format!(
                "{reg}&serviceName=orders&metadata={}",
                meta(json!({"preserved.heart.beat.timeout": "15s"}))
            ),
            "preserved.heart.beat.timeout",
        ),
        (
            Method::POST,
            format!(
                "{reg}&serviceName=orders&metadata={}",
                meta(json!({"preserved.heart.beat.timeout": 86_400_001}))
            ),
            "preserved.heart.beat.timeout",
        ),
        (
            // Nacos `checkInstanceIsLegal`: the interval is at most the timeout.
            Method::POST,
            format!(
                "{reg}&serviceName=orders&metadata={}",
                meta(
                    json!({"preserved.heart.beat.interval": 20_000, "preserved.heart.beat.timeout": 15_000})
                )
            ),
            "preserved.heart.beat.interval",
        ),
        (Method::PUT, format!("{REG}&weight=-0.0"), "weight"),
        (
            Method::PUT,
            format!(
                "{REG}&metadata={}",
                meta(json!({"preserved.heart.beat.timeout": max}))
            ),
            "preserved.heart.beat.timeout",
        ),
        (
            Method::PUT,
            "/nacos/v1/ns/instance/beat?serviceName=%40%40orders&ip=10.0.0.1&port=8080".to_owned(),
            "group",
        ),
        (
            Method::GET,
            "/nacos/v1/ns/instance/list?serviceName=orders&clientIP=10.1.1.1&udpPort=70000"
                .to_owned(),
            "udpPort",
        ),
    ];
    let total = cases.len();
    let mut before = state(&app.registry);
    let mut wrong = Vec::new();
    for (method, uri, field) in cases {
        let (status, body) = app.call(method.clone(), &uri).await;
        let shape = body.starts_with(&format!("caused: {field}: ")) && body.ends_with(';');
        let mut problems = Vec::new();
        if status != StatusCode::BAD_REQUEST || !shape {
            problems.push(format!("answered {status} {body}"));
        }
        let after = state(&app.registry);
        if after != before {
            problems.push("changed the registry".to_owned());
            before = after;
        }
        if !problems.is_empty() {
            wrong.push(format!("{method} {uri}\n    {}", problems.join("\n    ")));
        }
    }
    // The v3 envelope says the same.
    let (status, body) = app
        .call(
            Method::POST,
            "/nacos/v3/admin/ns/instance?serviceName=%40%40orders&ip=10.0.0.2&port=8080",
        )
        .await;
    let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    let shape = v["message"]
        .as_str()
        .is_some_and(|m| m.starts_with("group: "));
    let mut problems = Vec::new();
    if status != StatusCode::BAD_REQUEST || !shape {
        problems.push(format!("answered {status} {body}"));
    }
    if state(&app.registry) != before {
        problems.push("changed the registry".to_owned());
    }
    if !problems.is_empty() {
        wrong.push(format!(
            "v3 register of @@orders\n    {}",
            problems.join("\n    ")
        ));
    }
    assert!(
        wrong.is_empty(),
        "{} of {} cases wrong:\n{}",
        wrong.len(),
        total + 1,
        wrong.join("\n")
    );
}

#[tokio::test]
async fn v1_preserved_timing_at_its_bounds_is_the_lease() {
    let app = app();
    let m = meta(
        json!({"preserved.heart.beat.interval": 100, "preserved.heart.beat.timeout": 86_400_000,
                        "preserved.ip.delete.timeout": 86_400_000}),
    );
    let (status, body) = app
        .call(Method::POST, &format!("{REG}&metadata={m}&udpPort=65535"))
        .await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "ok"));
    let v = app
        .list("serviceName=orders&clientIP=10.1.1.1&udpPort=65535")
        .await;
    let host = &v["hosts"][0];
    assert_eq!(host["instanceHeartBeatInterval"], 100);
    assert_eq!(host["instanceHeartBeatTimeOut"], 86_400_000);
    assert_eq!(host["ipDeleteTimeout"], 86_400_000);
    assert_eq!(
        app.registry.subscribers(&ServiceKey::named("orders")).len(),
        1
    );
}

#[tokio::test]
async fn grpc_odd_values_are_error_responses_and_change_nothing() {
    let g = grpc().await;
    let (_tx, _inbound) = g.setup().await;
    let max = u64::MAX;
    let instance = |extra: Value| {
        let mut i = json!({"ip": "10.0.0.1", "port": 80});
        i.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        i
    };
    let cases = [
        ("InstanceRequest", "@@orders", instance(json!({})), "group"),
        ("InstanceRequest", "..", instance(json!({})), "service"),
        (
            "InstanceRequest",
            "orders",
            instance(json!({"weight": -0.0})),
            "weight",
        ),
        (
            "InstanceRequest",
            "orders",
            instance(json!({"weight": 5e-324})),
            "weight",
        ),
        (
            "InstanceRequest",
            "orders",
            instance(json!({"metadata": {"preserved.heart.beat.timeout": max}})),
            "preserved.heart.beat.timeout",
        ),
        (
            "PersistentInstanceRequest",
            "stock",
            instance(json!({"metadata": {"preserved.ip.delete.timeout": max.to_string()}})),
            "preserved.ip.delete.timeout",
        ),
        (
            "PersistentInstanceRequest",
            "stock",
            instance(json!({"metadata": {"preserved.heart.beat.interval": "soon"}})),
            "preserved.heart.beat.interval",
        ),
    ];
    let mut requests: Vec<(String, Value, &str)> = cases
        .into_iter()
        .map(|(ty_name, service, instance, field)| {
            let request = json!({"requestId": "r", "serviceName": service,
                                 "type": "registerInstance", "instance": instance});
            (ty_name.to_owned(), request, field)
        })
        .collect();
    // A refused batch registers none of it, not the instances before the bad one.
    requests.push((
        "BatchInstanceRequest".to_owned(),
        json!({"requestId": "b", "serviceName": "orders", "type": "batchRegisterInstance",
               "instances": [instance(json!({})), instance(json!({"ip": "10.0.0.2", "weight": -0.0}))]}),
        "weight",
    ));
    let total = requests.len();
    let mut before = state(&g.registry);
    let mut wrong = Vec::new();
    for (ty_name, request, field) in requests {
        let reply = g.unary(&ty_name, request.clone()).await;
        let v = body(&reply);
        let shape = v["message"]
            .as_str()
            .is_some_and(|m| m.starts_with(&format!("{field}: ")));
        let mut problems = Vec::new();
        if ty(&reply) != "ErrorResponse" || v["errorCode"] != 400 || !shape {
            problems.push(format!("answered {} {v}", ty(&reply)));
        }
        let after = state(&g.registry);
        if after != before {
            problems.push("changed the registry".to_owned());
            before = after;
        }
        if !problems.is_empty() {
            wrong.push(format!(
                "{ty_name} {request}\n    {}",
                problems.join("\n    ")
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {total} cases wrong:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// With auth on, each Nacos gRPC request is authenticated from its `accessToken` header: none
/// or a bad one is a Nacos error response (403), a `read` token cannot register, a `write`
/// token can.
#[tokio::test]
async fn grpc_access_token_header_decides_with_auth_on() {
    use crate::auth::file::grant;
    use crate::auth::{AuthFile, Authority, Role};

    let mut file = AuthFile::default();
    let reader = file.create_token("reader", vec![grant("public", Role::Read)]);
    let writer = file.create_token("writer", vec![grant("public", Role::Write)]);
    let mut config = Config::for_tests();
    config.security.authority = Authority::from_file(file);
    let g = grpc_with(Nacos::new(registry_with(config))).await;
    let (_tx, _inbound) = g.setup().await;
    let register = |token: Option<&str>| {
        let mut p = super::grpc::payload(
            "InstanceRequest",
            &json!({"requestId": "r", "serviceName": "orders", "type": "registerInstance",
                   "instance": {"ip": "10.0.0.1", "port": 80}}),
        );
        if let Some(t) = token {
            p.metadata
                .as_mut()
                .unwrap()
                .headers
                .insert("accessToken".into(), t.to_owned());
        }
        let channel = g.channel.clone();
        async move {
            pb::request_client::RequestClient::new(channel)
                .request(p)
                .await
                .unwrap()
                .into_inner()
        }
    };
    let key = ServiceKey::named("orders");
    let mut wrong = writer.clone();
    let last = wrong.pop().unwrap();
    wrong.push(if last == 'A' { 'B' } else { 'A' });
    for (token, what) in [
        (None, "no accessToken"),
        (Some(wrong.as_str()), "a changed token"),
        (Some(reader.as_str()), "a read token"),
    ] {
        let reply = register(token).await;
        assert_eq!(ty(&reply), "ErrorResponse", "{what}");
        let v = body(&reply);
        assert_eq!(
            (v["resultCode"].clone(), v["errorCode"].clone()),
            (json!(500), json!(super::grpc::NO_RIGHT)),
            "{what}: {v}"
        );
        assert!(g.registry.view(&key).instances.is_empty(), "{what}");
        if token == Some(reader.as_str()) {
            assert!(v["message"].as_str().unwrap().contains("register"), "{v}");
        }
    }
    let reply = register(Some(&writer)).await;
    assert_eq!(ty(&reply), "InstanceResponse", "{:?}", body(&reply));
    assert_eq!(g.registry.view(&key).instances.len(), 1);
    assert_eq!(
        g.registry
            .owner(&key, &InstanceKey::new("10.0.0.1", 80, ""))
            .as_deref(),
        Some(format!("token:{}", writer.split('_').nth(1).unwrap()).as_str())
    );
}

/// A Nacos connection is a session: beyond its limits an `ErrorResponse` names the limit.
#[tokio::test]
async fn grpc_session_limits_answer_an_error_naming_the_limit() {
    let mut config = Config::for_tests();
    config.session_limits.instances = 1;
    config.session_limits.subscriptions = 1;
    let g = grpc_with(Nacos::new(registry_with(config))).await;
    let (_tx, _inbound) = g.setup().await;
    let register = |service: &str| {
        json!({"requestId": "r", "serviceName": service, "type": "registerInstance",
               "instance": {"ip": "10.0.0.1", "port": 80}})
    };
    let subscribe = |service: &str| json!({"requestId": "s", "serviceName": service, "subscribe": true, "clusters": ""});
    let reply = g.unary("InstanceRequest", register("orders")).await;
    assert_eq!(ty(&reply), "InstanceResponse", "{:?}", body(&reply));
    let reply = g
        .unary("SubscribeServiceRequest", subscribe("orders"))
        .await;
    assert_eq!(ty(&reply), "SubscribeServiceResponse", "{:?}", body(&reply));
    for (request, payload, limit) in [
        (
            "InstanceRequest",
            register("billing"),
            "instances-per-session",
        ),
        (
            "SubscribeServiceRequest",
            subscribe("billing"),
            "subscriptions-per-session",
        ),
    ] {
        let reply = g.unary(request, payload).await;
        assert_eq!(ty(&reply), "ErrorResponse", "{request}");
        let v = body(&reply);
        assert_eq!(v["errorCode"], 429, "{v}");
        assert!(v["message"].as_str().unwrap().contains(limit), "{v}");
    }
    assert!(
        g.registry
            .view(&ServiceKey::named("billing"))
            .instances
            .is_empty()
    );
    assert!(
        g.registry
            .subscribers(&ServiceKey::named("billing"))
            .is_empty()
    );
}

#[tokio::test]
async fn a_refused_batch_keeps_the_instances_the_connection_had() {
    // Two instances per session: the connection holds one in "billing" and one in "orders";
    // a batch for "orders" of two others passes the batch's own size check, then its first
    // registration meets the session's limit.
    let mut config = Config::for_tests();
    config.session_limits.instances = 2;
    let g = grpc_with(Nacos::new(registry_with(config))).await;
    let (_tx, _inbound) = g.setup().await;
    let register = |service: &str, ip: &str| {
        json!({"requestId": "r", "serviceName": service, "type": "registerInstance",
               "instance": {"ip": ip, "port": 80}})
    };
    for service in ["billing", "orders"] {
        let reply = g
            .unary("InstanceRequest", register(service, "10.0.0.1"))
            .await;
        assert_eq!(ty(&reply), "InstanceResponse", "{:?}", body(&reply));
    }
    let reply = g
        .unary(
            "BatchInstanceRequest",
            json!({"requestId": "b", "serviceName": "orders", "type": "batchRegisterInstance",
                   "instances": [{"ip": "10.0.0.2", "port": 80}, {"ip": "10.0.0.3", "port": 80}]}),
        )
        .await;
    let v = body(&reply);
    assert_eq!(ty(&reply), "ErrorResponse", "{v}");
    assert_eq!(v["errorCode"], 429, "{v}");
    let orders: Vec<String> = g
        .registry
        .view(&ServiceKey::named("orders"))
        .instances
        .iter()
        .map(|i| i.key.to_string())
        .collect();
    assert_eq!(
        orders,
        ["10.0.0.1:80"],
        "the refused batch took nothing away"
    );
}

#[tokio::test]
async fn a_beat_body_is_taken_whole_or_refused_naming_the_field() {
    // A tester's beat bodies for unknown instances: `enabled: false` registered it enabled, a
    // string `metadata` registered it with none. Now enabled follows the body, and a field of
    // the wrong type is a 400 naming it, registering nothing.
    let app = app();
    let uri = "/nacos/v1/ns/instance/beat?serviceName=orders";
    let beat = |json: &str| format!("beat={}", urlencode(json));
    let (_, body) = app
        .form(
            Method::PUT,
            uri,
            &beat(r#"{"ip":"10.0.0.1","port":8080,"enabled":false}"#),
        )
        .await;
    assert!(body.contains("\"code\":10200"), "{body}");
    let key = InstanceKey::new("10.0.0.1", 8080, "");
    let instance = app
        .registry
        .instance(&ServiceKey::named("orders"), &key)
        .unwrap();
    assert!(!instance.enabled, "enabled: false is kept");
    for (json, field) in [
        (
            r#"{"ip":"10.0.0.2","port":8080,"metadata":"k=v"}"#,
            "beat.metadata",
        ),
        (
            r#"{"ip":"10.0.0.2","port":8080,"weight":"2"}"#,
            "beat.weight",
        ),
        (
            r#"{"ip":"10.0.0.2","port":8080,"enabled":"no"}"#,
            "beat.enabled",
        ),
        (
            r#"{"ip":"10.0.0.2","port":8080,"ephemeral":1}"#,
            "beat.ephemeral",
        ),
    ] {
        let (status, body) = app.form(Method::PUT, uri, &beat(json)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{json}: {body}");
        assert!(body.contains(field), "{json}: {body}");
        let unknown = InstanceKey::new("10.0.0.2", 8080, "");
        assert!(
            app.registry
                .instance(&ServiceKey::named("orders"), &unknown)
                .is_err()
        );
    }
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'.' | b'-' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// F2: a subscription made with a credential that a reload then removes ends (no more pushes,
/// no subscriber left); one made on the same connection with a still valid token keeps
/// getting pushes.
#[tokio::test]
async fn grpc_a_reload_ends_the_subscriptions_of_a_removed_token_only() {
    use crate::auth::file::grant;
    use crate::auth::{AuthFile, Authority, Role};

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("auth.toml");
    let mut file = AuthFile::default();
    let gone = file.create_token("gone", vec![grant("public", Role::Read)]);
    let kept = file.create_token("kept", vec![grant("public", Role::Read)]);
    file.save(&path).unwrap();
    let authority = Authority::load(&path).unwrap();
    let mut config = Config::for_tests();
    config.security.authority = authority.clone();
    let g = grpc_with(Nacos::new(registry_with(config))).await;
    let (_tx, mut inbound) = g.setup().await;
    let subscribe = |service: &str, token: &str| {
        let mut p = super::grpc::payload(
            "SubscribeServiceRequest",
            &json!({"requestId": "s", "serviceName": service, "groupName": "DEFAULT_GROUP",
                   "subscribe": true, "clusters": ""}),
        );
        p.metadata
            .as_mut()
            .unwrap()
            .headers
            .insert("accessToken".into(), token.to_owned());
        let channel = g.channel.clone();
        async move {
            pb::request_client::RequestClient::new(channel)
                .request(p)
                .await
                .unwrap()
                .into_inner()
        }
    };
    let (orders, billing) = (ServiceKey::named("orders"), ServiceKey::named("billing"));
    for (service, token) in [("orders", &gone), ("billing", &kept)] {
        let reply = subscribe(service, token).await;
        assert_eq!(ty(&reply), "SubscribeServiceResponse", "{:?}", body(&reply));
    }
    assert_eq!(
        (
            g.registry.subscribers(&orders).len(),
            g.registry.subscribers(&billing).len()
        ),
        (1, 1)
    );

    file.remove_token(gone.split('_').nth(1).unwrap()).unwrap();
    file.save(&path).unwrap();
    assert_eq!(authority.reload().unwrap(), (0, 1));
    let registry = g.registry.clone();
    eventually("the removed token's subscription ends", || {
        registry.subscribers(&orders).is_empty()
    })
    .await;
    assert_eq!(g.registry.subscribers(&billing).len(), 1, "the other stays");

    // A change in each service: only billing's subscription is pushed it.
    for service in [&orders, &billing] {
        g.registry
            .register(
                service.clone(),
                gangway_core::model::Instance::new(InstanceKey::new("10.0.9.1", 80, "")),
                crate::engine::LivenessRequest::Lease {
                    ttl: None,
                    delete_timeout: None,
                },
            )
            .await
            .unwrap();
    }
    let pushed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let push = body(&inbound.message().await.unwrap().unwrap());
            let info = &push["serviceInfo"];
            if info["hosts"].as_array().is_some_and(|h| !h.is_empty()) {
                return info["name"].as_str().unwrap().to_owned();
            }
        }
    })
    .await
    .expect("a push of the change within 10 s");
    assert_eq!(pushed, "billing");
}
