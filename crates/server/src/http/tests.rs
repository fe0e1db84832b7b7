//! Handler tests through the `Router`, without sockets (`oneshot`, `MockConnectInfo`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum::http::{Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

use gangway_core::model::{Instance, InstanceKey, ServiceKey};

use crate::config::Config;
use crate::engine::{LivenessRequest, Registry};
use crate::metrics::Metrics;

const PEER: ([u8; 4], u16) = ([127, 0, 0, 1], 40_000);

struct App {
    router: Router,
    registry: Registry,
}

fn app() -> App {
    let mut prom = prometheus_client::registry::Registry::default();
    let metrics = Metrics::register(&mut prom);
    let registry = Registry::start(
        Arc::new(gangway_store::MemoryStore::default()),
        Config::for_tests(),
        metrics,
    )
    .expect("registry starts");
    let router =
        super::router(registry.clone(), prom).layer(MockConnectInfo(SocketAddr::from(PEER)));
    App { router, registry }
}

struct Reply {
    status: StatusCode,
    content_type: String,
    text: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text))
    }
}

impl App {
    async fn send(&self, request: Request<Body>) -> Reply {
        let response = self
            .router
            .clone()
            .oneshot(request)
            .await
            .expect("infallible");
        let status = response.status();
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        let bytes = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        Reply {
            status,
            content_type,
            text: String::from_utf8(bytes.to_vec()).expect("utf-8"),
        }
    }

    /// A request with an optional JSON body (sent as `application/json`).
    async fn call(&self, method: Method, uri: &str, body: Option<&str>) -> Reply {
        let mut request = Request::builder().method(method).uri(uri);
        let body = match body {
            Some(b) => {
                request = request.header(header::CONTENT_TYPE, "application/json");
                Body::from(b.to_owned())
            }
            None => Body::empty(),
        };
        self.send(request.body(body).unwrap()).await
    }

    /// A request that must answer `status`; returns the JSON body.
    async fn expect(
        &self,
        method: Method,
        uri: &str,
        body: Option<Value>,
        status: StatusCode,
    ) -> Value {
        let text = body.map(|b| b.to_string());
        let reply = self.call(method.clone(), uri, text.as_deref()).await;
        assert_eq!(reply.status, status, "{method} {uri}: {}", reply.text);
        assert!(
            reply.content_type.starts_with("application/json"),
            "{method} {uri}: {}",
            reply.content_type
        );
        reply.json()
    }

    async fn ok(&self, method: Method, uri: &str, body: Option<Value>) -> Value {
        self.expect(method, uri, body, StatusCode::OK).await
    }

    /// Everything a client can see: the service listing and the `all=true` listing of each.
    async fn everything(&self) -> Value {
        let services = self.ok(Method::GET, "/v1/services", None).await;
        let mut all = vec![services.clone()];
        for s in services["services"].as_array().unwrap() {
            let uri = format!(
                "/v1/services/{}/instances?all=true&namespace={}&group={}",
                s["service"].as_str().unwrap(),
                s["namespace"].as_str().unwrap(),
                s["group"].as_str().unwrap()
            );
            all.push(self.ok(Method::GET, &uri, None).await);
        }
        Value::Array(all)
    }

    /// Registers a lease-kept instance of `service`; returns the answer.
    async fn lease(&self, service: &str, ip: &str) -> Value {
        let uri = format!("/v1/services/{service}/instances");
        self.ok(Method::POST, &uri, Some(json!({ "ip": ip, "port": 8080 })))
            .await
    }
}

fn revision(v: &Value) -> u64 {
    v["revision"]
        .as_u64()
        .unwrap_or_else(|| panic!("no revision in {v}"))
}

fn addrs(view: &Value) -> Vec<String> {
    view["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| format!("{}:{}", i["ip"].as_str().unwrap(), i["port"]))
        .collect()
}

/// At most 160 characters of `text` (a case or an answer in a failure message).
fn short(text: &str) -> String {
    match text.char_indices().nth(160) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_owned(),
    }
}

/// What is wrong with `reply` as the one error shape with `status`, `code` and `field`
/// (`""`: null); `None` when it is exactly that. Tables collect these, so a failure lists
/// every case that is wrong, not only the first.
fn error_mismatch(reply: &Reply, status: StatusCode, code: &str, field: &str) -> Option<String> {
    let body: Value = serde_json::from_str(&reply.text).unwrap_or(Value::Null);
    let error = &body["error"];
    let field = if field.is_empty() {
        Value::Null
    } else {
        json!(field)
    };
    let right = reply.status == status
        && reply.content_type.starts_with("application/json")
        && body.as_object().is_some_and(|o| o.len() == 1)
        && error.as_object().is_some_and(|e| e.len() == 3)
        && error["code"] == code
        && error["message"].as_str().is_some_and(|m| !m.is_empty())
        && error["field"] == field;
    (!right).then(|| {
        format!(
            "HTTP {} ({}) {}",
            reply.status.as_u16(),
            reply.content_type,
            short(&reply.text)
        )
    })
}

fn assert_error(reply: &Reply, status: StatusCode, code: &str) -> Value {
    assert_eq!(reply.status, status, "{}", reply.text);
    assert!(
        reply.content_type.starts_with("application/json"),
        "{}",
        reply.content_type
    );
    let body = reply.json();
    let error = body["error"].clone();
    assert_eq!(error["code"], code, "{body}");
    assert!(!error["message"].as_str().unwrap().is_empty(), "{body}");
    assert_eq!(
        body.as_object().unwrap().len(),
        1,
        "only `error` at the top: {body}"
    );
    assert_eq!(
        error.as_object().unwrap().len(),
        3,
        "code, message, field: {body}"
    );
    error
}

#[tokio::test]
async fn health_reports_up_with_boot_id() {
    let app = app();
    let body = app.ok(Method::GET, "/v1/health", None).await;
    assert_eq!(body["status"], "UP");
    assert_eq!(body["boot_id"], app.registry.boot_id());
    assert_eq!(body["warming_up"], false);
}

#[tokio::test]
async fn a_node_alone_says_so_on_the_cluster_endpoint() {
    let app = app();
    let body = app.ok(Method::GET, "/v1/cluster", None).await;
    assert_eq!(body, json!({"mode": "single", "nodes": []}));
}

#[tokio::test]
async fn register_a_lease_kept_instance_and_list_it() {
    let app = app();
    let body = json!({
        "ip": "10.0.0.1", "port": 8080, "weight": 2.5, "metadata": {"zone": "a"},
        "ttl_ms": 6000, "delete_timeout_ms": 12000
    });
    let first = app
        .ok(Method::POST, "/v1/services/orders/instances", Some(body))
        .await;
    let i = &first["instance"];
    assert_eq!(i["ip"], "10.0.0.1");
    assert_eq!(i["port"], 8080);
    assert_eq!(i["cluster"], "DEFAULT");
    assert_eq!(i["weight"], 2.5);
    assert_eq!(i["metadata"], json!({"zone": "a"}));
    assert_eq!(
        (
            i["enabled"].clone(),
            i["healthy"].clone(),
            i["ephemeral"].clone()
        ),
        (json!(true), json!(true), json!(true))
    );

    let second = app.lease("orders", "10.0.0.2").await;
    assert!(revision(&second) > revision(&first), "revisions grow");

    let view = app
        .ok(Method::GET, "/v1/services/orders/instances", None)
        .await;
    assert_eq!(view["namespace"], "public");
    assert_eq!(view["group"], "DEFAULT_GROUP");
    assert_eq!(view["service"], "orders");
    assert_eq!(revision(&view), revision(&second));
    assert_eq!(view["protection_triggered"], false);
    assert_eq!(view["warming_up"], false);
    assert_eq!(addrs(&view), ["10.0.0.1:8080", "10.0.0.2:8080"]);
    assert_eq!(view["instances"][0]["liveness"], "lease");
    assert_eq!(view["instances"][0]["weight"], 2.5);

    // The lease TTL is the one asked for.
    let beat = app
        .ok(
            Method::PUT,
            "/v1/services/orders/instances/10.0.0.1:8080/heartbeat",
            None,
        )
        .await;
    assert_eq!(beat, json!({"ttl_ms": 6000, "healthy": true}));
    let beat = app
        .ok(
            Method::PUT,
            "/v1/services/orders/instances/10.0.0.2:8080/heartbeat",
            None,
        )
        .await;
    assert_eq!(
        beat,
        json!({"ttl_ms": 15000, "healthy": true}),
        "server default TTL"
    );

    let services = app.ok(Method::GET, "/v1/services", None).await;
    assert_eq!(
        services,
        json!({"services": [{
            "namespace": "public", "group": "DEFAULT_GROUP", "service": "orders", "kind": "ephemeral",
            "revision": revision(&second), "instances": 2, "serving": 2, "subscribers": 0,
            "states": {"serving": 2, "unhealthy": 0, "offline": 0, "zero_weight": 0},
            "protect_threshold": 0.0, "metadata": {}
        }]})
    );
}

#[tokio::test]
async fn register_a_persistent_probed_instance() {
    let app = app();
    let body = json!({
        "ip": "127.0.0.1", "port": 9, "ephemeral": false, "cluster": "east",
        "probe": {"kind": "http", "path": "/ready", "interval_ms": 3_600_000, "fall": 3, "rise": 1}
    });
    let reg = app
        .ok(
            Method::POST,
            "/v1/services/stock/instances?namespace=prod&group=g1",
            Some(body),
        )
        .await;
    assert_eq!(reg["instance"]["ephemeral"], false);
    assert_eq!(reg["instance"]["cluster"], "east");

    let all = app
        .ok(
            Method::GET,
            "/v1/services/stock/instances?namespace=prod&group=g1&all=true",
            None,
        )
        .await;
    assert_eq!(all["namespace"], "prod");
    assert_eq!(all["group"], "g1");
    assert_eq!(all["instances"][0]["liveness"], "probe");
    assert_eq!(revision(&all), revision(&reg));

    // A probe alone implies ephemeral=false.
    let implied = json!({"ip": "127.0.0.2", "port": 9, "cluster": "east", "probe": {"interval_ms": 3_600_000}});
    let reg2 = app
        .ok(
            Method::POST,
            "/v1/services/stock/instances?namespace=prod&group=g1",
            Some(implied),
        )
        .await;
    assert_eq!(reg2["instance"]["ephemeral"], false);

    let service = app
        .ok(
            Method::GET,
            "/v1/services/stock?namespace=prod&group=g1",
            None,
        )
        .await;
    assert_eq!(service["kind"], "persistent");
    assert_eq!(service["instances"], 2);

    // Filters of the service listing.
    let none = app
        .ok(Method::GET, "/v1/services?namespace=public", None)
        .await;
    assert_eq!(none, json!({"services": []}));
    let some = app
        .ok(Method::GET, "/v1/services?namespace=prod&group=g1", None)
        .await;
    assert_eq!(some["services"].as_array().unwrap().len(), 1);

    // Persistent instances have no lease.
    let reply = app.call(Method::PUT, "/v1/services/stock/instances/127.0.0.1:9/heartbeat?namespace=prod&group=g1&cluster=east", None).await;
    let error = assert_error(&reply, StatusCode::CONFLICT, "conflict");
    assert_eq!(error["field"], Value::Null);
    assert!(
        error["message"].as_str().unwrap().contains("probe"),
        "{error}"
    );
}

#[tokio::test]
async fn consumer_view_and_all_differ_on_offline_unhealthy_and_zero_weight() {
    let app = app();
    app.lease("orders", "10.0.0.1").await;
    app.lease("orders", "10.0.0.2").await;
    app.ok(
        Method::POST,
        "/v1/services/orders/instances",
        Some(json!({"ip": "10.0.0.3", "port": 8080, "weight": 0})),
    )
    .await;
    app.ok(
        Method::POST,
        "/v1/services/orders/instances",
        Some(json!({"ip": "10.0.0.4", "port": 8080, "enabled": false})),
    )
    .await;

    let view = app
        .ok(Method::GET, "/v1/services/orders/instances", None)
        .await;
    assert_eq!(addrs(&view), ["10.0.0.1:8080", "10.0.0.2:8080"]);
    let all = app
        .ok(Method::GET, "/v1/services/orders/instances?all=true", None)
        .await;
    assert_eq!(
        addrs(&all),
        [
            "10.0.0.1:8080",
            "10.0.0.2:8080",
            "10.0.0.3:8080",
            "10.0.0.4:8080"
        ]
    );
    assert_eq!(all["instances"][3]["enabled"], false);
    assert_eq!(revision(&all), revision(&view));

    // Unknown service: empty, revision 0.
    let empty = app
        .ok(Method::GET, "/v1/services/nobody/instances", None)
        .await;
    assert_eq!(revision(&empty), 0);
    assert_eq!(empty["instances"], json!([]));
}

#[tokio::test]
async fn get_and_put_service_with_protect_threshold() {
    let app = app();
    let reply = app.call(Method::GET, "/v1/services/orders", None).await;
    let error = assert_error(&reply, StatusCode::NOT_FOUND, "not_found");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("public/DEFAULT_GROUP/orders"),
        "{error}"
    );

    let reg = app.lease("orders", "10.0.0.1").await;
    app.lease("orders", "10.0.0.2").await;
    let put = app
        .ok(
            Method::PUT,
            "/v1/services/orders",
            Some(json!({"protect_threshold": 0.6, "metadata": {"team": "core"}})),
        )
        .await;
    assert_eq!(put["protect_threshold"], 0.6);
    assert_eq!(put["metadata"], json!({"team": "core"}));
    assert_eq!(put["instances"], 2);
    assert!(revision(&put) > revision(&reg));

    // Only metadata: the threshold stays.
    let put2 = app
        .ok(
            Method::PUT,
            "/v1/services/orders",
            Some(json!({"metadata": {"team": "edge"}})),
        )
        .await;
    assert_eq!(put2["protect_threshold"], 0.6);
    assert_eq!(put2["metadata"], json!({"team": "edge"}));
    assert_eq!(app.ok(Method::GET, "/v1/services/orders", None).await, put2);

    // One of two instances unhealthy: 1/2 <= 0.6, so protection fires and lists both,
    // with the real health flag.
    let one = gangway_core::model::ServiceKey::named("orders");
    let key = gangway_core::model::InstanceKey::new("10.0.0.2", 8080, "");
    app.registry.set_health(&one, &key, false);
    let view = app
        .ok(Method::GET, "/v1/services/orders/instances", None)
        .await;
    assert_eq!(view["protection_triggered"], true);
    assert_eq!(addrs(&view), ["10.0.0.1:8080", "10.0.0.2:8080"]);
    assert_eq!(view["instances"][1]["healthy"], false);

    // Below the threshold the unhealthy one is dropped.
    app.ok(
        Method::PUT,
        "/v1/services/orders",
        Some(json!({"protect_threshold": 0.4})),
    )
    .await;
    let view = app
        .ok(Method::GET, "/v1/services/orders/instances", None)
        .await;
    assert_eq!(view["protection_triggered"], false);
    assert_eq!(addrs(&view), ["10.0.0.1:8080"]);

    // A heartbeat makes a lease-kept instance healthy again.
    let beat = app
        .ok(
            Method::PUT,
            "/v1/services/orders/instances/10.0.0.2:8080/heartbeat",
            None,
        )
        .await;
    assert_eq!(beat["healthy"], true);
    let view = app
        .ok(Method::GET, "/v1/services/orders/instances", None)
        .await;
    assert_eq!(addrs(&view), ["10.0.0.1:8080", "10.0.0.2:8080"]);
}

#[tokio::test]
async fn put_settings_create_an_empty_service() {
    let app = app();
    let put = app
        .ok(
            Method::PUT,
            "/v1/services/later",
            Some(json!({"protect_threshold": 0.5})),
        )
        .await;
    assert_eq!(put["kind"], Value::Null);
    assert_eq!(put["instances"], 0);
    assert!(revision(&put) > 0);
}

#[tokio::test]
async fn patch_changes_weight_metadata_and_enabled() {
    let app = app();
    let reg = app.lease("orders", "10.0.0.1").await;
    app.lease("orders", "10.0.0.2").await;
    let patched = app
        .ok(
            Method::PATCH,
            "/v1/services/orders/instances/10.0.0.1:8080",
            Some(json!({"weight": 7, "metadata": {"v": "2"}})),
        )
        .await;
    assert_eq!(patched["instance"]["weight"], 7.0);
    assert_eq!(patched["instance"]["metadata"], json!({"v": "2"}));
    assert!(revision(&patched) > revision(&reg));

    let off = app
        .ok(
            Method::PATCH,
            "/v1/services/orders/instances/10.0.0.1:8080",
            Some(json!({"enabled": false})),
        )
        .await;
    assert_eq!(off["instance"]["enabled"], false);
    assert_eq!(off["instance"]["weight"], 7.0, "untouched fields stay");
    assert!(revision(&off) > revision(&patched));
    let view = app
        .ok(Method::GET, "/v1/services/orders/instances", None)
        .await;
    assert_eq!(addrs(&view), ["10.0.0.2:8080"]);

    let reply = app
        .call(
            Method::PATCH,
            "/v1/services/orders/instances/10.0.0.9:8080",
            Some(r#"{"weight":1}"#),
        )
        .await;
    assert_error(&reply, StatusCode::NOT_FOUND, "not_found");
}

#[tokio::test]
async fn deregister_removes_and_bumps_the_revision() {
    let app = app();
    let reg = app.lease("orders", "10.0.0.1").await;
    let gone = app
        .ok(
            Method::DELETE,
            "/v1/services/orders/instances/10.0.0.1:8080",
            None,
        )
        .await;
    assert!(revision(&gone) > revision(&reg));
    assert_eq!(
        gone.as_object().unwrap().len(),
        1,
        "only the revision: {gone}"
    );
    let view = app
        .ok(Method::GET, "/v1/services/orders/instances", None)
        .await;
    assert_eq!(view["instances"], json!([]));
    assert_eq!(revision(&view), revision(&gone));

    let reply = app
        .call(
            Method::DELETE,
            "/v1/services/orders/instances/10.0.0.1:8080",
            None,
        )
        .await;
    let error = assert_error(&reply, StatusCode::NOT_FOUND, "not_found");
    assert!(
        error["message"].as_str().unwrap().contains("10.0.0.1:8080"),
        "{error}"
    );

    // IPv6 and cluster in the address.
    let v6 = json!({"ip": "::1", "port": 80, "cluster": "east"});
    app.ok(Method::POST, "/v1/services/orders/instances", Some(v6))
        .await;
    app.ok(
        Method::DELETE,
        "/v1/services/orders/instances/%5B::1%5D:80?cluster=east",
        None,
    )
    .await;
}

#[tokio::test]
async fn heartbeat_renews_404s_unknown_and_409s_persistent() {
    let app = app();
    app.lease("orders", "10.0.0.1").await;
    let beat = app
        .ok(
            Method::PUT,
            "/v1/services/orders/instances/10.0.0.1:8080/heartbeat",
            None,
        )
        .await;
    assert_eq!(beat, json!({"ttl_ms": 15000, "healthy": true}));

    let reply = app
        .call(
            Method::PUT,
            "/v1/services/orders/instances/10.0.0.9:8080/heartbeat",
            None,
        )
        .await;
    let error = assert_error(&reply, StatusCode::NOT_FOUND, "not_found");
    assert_eq!(error["field"], Value::Null);

    let persistent = json!({"ip": "127.0.0.1", "port": 9, "probe": {"interval_ms": 3_600_000}});
    app.ok(
        Method::POST,
        "/v1/services/stock/instances",
        Some(persistent),
    )
    .await;
    let reply = app
        .call(
            Method::PUT,
            "/v1/services/stock/instances/127.0.0.1:9/heartbeat",
            None,
        )
        .await;
    let error = assert_error(&reply, StatusCode::CONFLICT, "conflict");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("not by heartbeats"),
        "{error}"
    );
}

#[tokio::test]
async fn offline_and_online() {
    let app = app();
    app.lease("orders", "10.0.0.1").await;
    app.lease("orders", "10.0.0.2").await;
    let off = app
        .ok(
            Method::POST,
            "/v1/services/orders/instances/10.0.0.1:8080/offline",
            None,
        )
        .await;
    assert_eq!(off["instance"]["enabled"], false);
    assert_eq!(
        addrs(
            &app.ok(Method::GET, "/v1/services/orders/instances", None)
                .await
        ),
        ["10.0.0.2:8080"]
    );
    let services = app.ok(Method::GET, "/v1/services", None).await;
    assert_eq!(services["services"][0]["serving"], 1);
    assert_eq!(services["services"][0]["instances"], 2);

    let on = app
        .ok(
            Method::POST,
            "/v1/services/orders/instances/10.0.0.1:8080/online",
            None,
        )
        .await;
    assert_eq!(on["instance"]["enabled"], true);
    assert!(revision(&on) > revision(&off));
    assert_eq!(
        addrs(
            &app.ok(Method::GET, "/v1/services/orders/instances", None)
                .await
        ),
        ["10.0.0.1:8080", "10.0.0.2:8080"]
    );

    let reply = app
        .call(
            Method::POST,
            "/v1/services/orders/instances/10.0.0.9:8080/offline",
            None,
        )
        .await;
    assert_error(&reply, StatusCode::NOT_FOUND, "not_found");
}

#[tokio::test]
async fn offline_refuses_the_last_serving_instance_unless_forced_and_online_can_wait() {
    let app = app();
    app.lease("orders", "10.0.0.1").await;
    let before = app.everything().await;
    let off = "/v1/services/orders/instances/10.0.0.1:8080/offline";
    let reply = app.call(Method::POST, off, None).await;
    assert_error(&reply, StatusCode::CONFLICT, "conflict");
    assert!(
        reply.text.contains("last serving instance"),
        "{}",
        reply.text
    );
    let reply = app
        .call(
            Method::PATCH,
            "/v1/services/orders/instances/10.0.0.1:8080",
            Some(r#"{"weight":0}"#),
        )
        .await;
    assert_error(&reply, StatusCode::CONFLICT, "conflict");
    assert_eq!(app.everything().await, before, "refusals changed nothing");
    let forced = app
        .ok(Method::POST, off, Some(json!({"force": true})))
        .await;
    assert_eq!(forced["instance"]["enabled"], false);
    // Online with wait: no subscriber, so ready at once, with the drain report's shape.
    let on = "/v1/services/orders/instances/10.0.0.1:8080/online";
    let ready = app
        .ok(
            Method::POST,
            on,
            Some(json!({"wait": true, "timeout_ms": 1000})),
        )
        .await;
    assert_eq!(ready["complete"], true, "{ready}");
    assert_eq!(ready["waited_ms"], 0);
    assert!(
        ready["notes"][0]
            .as_str()
            .unwrap()
            .contains("no live subscriber")
    );
    let reply = app
        .call(Method::POST, on, Some(r#"{"wait": true, "timeout": 1}"#))
        .await;
    assert_error(&reply, StatusCode::BAD_REQUEST, "invalid_argument");
}

#[tokio::test]
async fn a_session_instance_cannot_be_taken_over_or_deleted_over_rest() {
    let app = app();
    let session = app
        .registry
        .open_session("127.0.0.1:7".into(), "demo".into(), "c".into());
    app.registry
        .register(
            gangway_core::model::ServiceKey::named("orders"),
            gangway_core::model::Instance::new(gangway_core::model::InstanceKey::new(
                "10.0.0.1", 8080, "",
            )),
            crate::engine::LivenessRequest::Session(session),
        )
        .await
        .unwrap();
    let before = app.everything().await;
    let reply = app
        .call(
            Method::POST,
            "/v1/services/orders/instances",
            Some(r#"{"ip":"10.0.0.1","port":8080,"ttl_ms":3000}"#),
        )
        .await;
    assert_error(&reply, StatusCode::CONFLICT, "conflict");
    assert!(
        reply.text.contains("kept alive by session"),
        "{}",
        reply.text
    );
    let delete = "/v1/services/orders/instances/10.0.0.1:8080";
    let reply = app.call(Method::DELETE, delete, None).await;
    assert_error(&reply, StatusCode::CONFLICT, "conflict");
    assert_eq!(app.everything().await, before, "refusals changed nothing");
    app.ok(Method::DELETE, &format!("{delete}?force=true"), None)
        .await;
    let left = app
        .ok(Method::GET, "/v1/services/orders/instances", None)
        .await;
    assert!(left["instances"].as_array().unwrap().is_empty());
}

#[tokio::test]
async fn drain_refuses_the_last_serving_instance_unless_forced() {
    let app = app();
    app.lease("orders", "10.0.0.1").await;
    let before = app.everything().await;
    let reply = app
        .call(
            Method::POST,
            "/v1/services/orders/instances/10.0.0.1:8080/drain",
            None,
        )
        .await;
    let error = assert_error(&reply, StatusCode::CONFLICT, "conflict");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("last serving instance"),
        "{error}"
    );
    assert_eq!(
        app.everything().await,
        before,
        "a refused drain changes nothing"
    );

    let uri = "/v1/services/orders/instances/10.0.0.1:8080/drain";
    let report = app
        .ok(
            Method::POST,
            uri,
            Some(json!({"force": true, "timeout_ms": 1000})),
        )
        .await;
    assert_eq!(report["complete"], true);
    assert_eq!(report["acked"], json!([]));
    assert_eq!(report["laggards"], json!([]));
    assert!(
        report["notes"][0]
            .as_str()
            .unwrap()
            .contains("no live subscriber"),
        "{report}"
    );
    assert!(report["waited_ms"].as_u64().unwrap() < 1000);
    let all = app
        .ok(Method::GET, "/v1/services/orders/instances?all=true", None)
        .await;
    assert_eq!(revision(&report), revision(&all));
    assert_eq!(all["instances"][0]["enabled"], false);

    let reply = app
        .call(
            Method::POST,
            "/v1/services/orders/instances/10.0.0.9:8080/drain",
            None,
        )
        .await;
    assert_error(&reply, StatusCode::NOT_FOUND, "not_found");
}

#[tokio::test]
async fn drain_with_an_empty_body_and_no_subscribers_completes() {
    let app = app();
    app.lease("orders", "10.0.0.1").await;
    app.lease("orders", "10.0.0.2").await;
    // No Content-Type and no body at all.
    let request = Request::post("/v1/services/orders/instances/10.0.0.1:8080/drain")
        .body(Body::empty())
        .unwrap();
    let reply = app.send(request).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    let report = reply.json();
    assert_eq!(report["complete"], true);
    assert_eq!(
        addrs(
            &app.ok(Method::GET, "/v1/services/orders/instances", None)
                .await
        ),
        ["10.0.0.2:8080"]
    );

    // Whitespace counts as empty, too.
    app.lease("orders", "10.0.0.3").await;
    let report = app
        .ok(
            Method::POST,
            "/v1/services/orders/instances/10.0.0.2:8080/drain",
            None,
        )
        .await;
    assert_eq!(report["complete"], true);
    let reply = app
        .call(
            Method::POST,
            "/v1/services/orders/instances/10.0.0.3:8080/drain",
            Some(" \n"),
        )
        .await;
    assert_error(&reply, StatusCode::CONFLICT, "conflict");
}

#[tokio::test]
async fn a_poll_of_another_service_under_the_same_name_acks_nothing_here() {
    // One consumer process, one poller name, two services: polling "billing" is no ack of a
    // drain in "orders" (the poller is one per name and service).
    let app = app();
    for ip in ["10.0.0.1", "10.0.0.2"] {
        app.lease("orders", ip).await;
        app.lease("billing", ip).await;
    }
    app.ok(
        Method::GET,
        "/v1/services/orders/instances?subscriber=web",
        None,
    )
    .await;
    let drain = spawn_drain(&app, "10.0.0.1:8080", 300);
    let billing = "/v1/services/billing/instances?subscriber=web";
    for _ in 0..3 {
        app.ok(Method::GET, billing, None).await;
    }
    let report = drain.await.unwrap();
    assert_eq!(report["complete"], false, "{report}");
    assert_eq!(
        report["laggards"][0]["id"],
        "p-web@public/DEFAULT_GROUP/orders"
    );
    let subs = app
        .ok(Method::GET, "/v1/services/billing/subscribers", None)
        .await;
    assert_eq!(
        subs["subscribers"][0]["id"], "p-web@public/DEFAULT_GROUP/billing",
        "{subs}"
    );
}

#[tokio::test]
async fn drain_waits_for_a_poller_to_fetch_and_reports_laggards_on_timeout() {
    let app = app();
    app.lease("orders", "10.0.0.1").await;
    app.lease("orders", "10.0.0.2").await;
    app.lease("orders", "10.0.0.3").await;
    // The poller fetches once, then stops polling: the drain times out with it as a laggard.
    app.ok(
        Method::GET,
        "/v1/services/orders/instances?subscriber=web",
        None,
    )
    .await;
    let uri = "/v1/services/orders/instances/10.0.0.1:8080/drain";
    let report = app
        .ok(Method::POST, uri, Some(json!({"timeout_ms": 50})))
        .await;
    assert_eq!(report["complete"], false);
    assert_eq!(report["acked"], json!([]));
    assert_eq!(
        report["laggards"][0]["id"],
        "p-web@public/DEFAULT_GROUP/orders"
    );
    assert!(report["laggards"][0]["acked_revision"].as_u64().unwrap() < revision(&report));
    assert!(report["waited_ms"].as_u64().unwrap() >= 50);
    assert!(
        report["notes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().contains("timed out")),
        "{report}"
    );

    // This time the poller keeps polling: its next fetch acks the drain's revision.
    let drain = spawn_drain(&app, "10.0.0.2:8080", 10_000);
    // The poller acks by polling again, until the drain is done.
    let done = gangway_testkit::poll(Duration::from_secs(5), || async {
        app.ok(
            Method::GET,
            "/v1/services/orders/instances?subscriber=web",
            None,
        )
        .await;
        drain.is_finished().then_some(())
    })
    .await;
    assert!(done.is_some(), "drain did not complete");
    let report = drain.await.unwrap();
    assert_eq!(report["complete"], true, "{report}");
    assert_eq!(report["laggards"], json!([]));
    assert_eq!(
        report["acked"][0]["id"],
        "p-web@public/DEFAULT_GROUP/orders"
    );
    assert_eq!(report["acked"][0]["address"], "127.0.0.1:40000");
    assert!(report["acked"][0]["acked_revision"].as_u64().unwrap() >= revision(&report));
}

#[tokio::test]
async fn a_poller_is_listed_as_subscriber_having_acked_what_it_fetched() {
    let app = app();
    let reg = app.lease("orders", "10.0.0.1").await;
    let empty = app
        .ok(Method::GET, "/v1/services/orders/subscribers", None)
        .await;
    assert_eq!(
        empty,
        json!({"revision": revision(&reg), "subscribers": []})
    );

    let view = app
        .ok(
            Method::GET,
            "/v1/services/orders/instances?subscriber=web-1",
            None,
        )
        .await;
    assert_eq!(addrs(&view), ["10.0.0.1:8080"]);
    let subs = app
        .ok(Method::GET, "/v1/services/orders/subscribers", None)
        .await;
    assert_eq!(revision(&subs), revision(&view));
    let row = &subs["subscribers"][0];
    assert_eq!(row["id"], "p-web-1@public/DEFAULT_GROUP/orders");
    assert_eq!(row["kind"], "poller");
    assert_eq!(row["client_name"], "web-1");
    assert_eq!(row["address"], "127.0.0.1:40000");
    assert_eq!(row["acked_revision"], revision(&view));
    assert_eq!(row["pushed_revision"], revision(&view));
    assert!(row["acked_at_ms"].as_u64().unwrap() > 0);
    assert_eq!(
        app.ok(Method::GET, "/v1/services/orders", None).await["subscribers"],
        1
    );

    // A change, then the next poll acks the new revision.
    let reg2 = app.lease("orders", "10.0.0.2").await;
    let subs = app
        .ok(Method::GET, "/v1/services/orders/subscribers", None)
        .await;
    assert_eq!(
        subs["subscribers"][0]["acked_revision"],
        revision(&view),
        "not fetched yet"
    );
    app.ok(
        Method::GET,
        "/v1/services/orders/instances?subscriber=web-1",
        None,
    )
    .await;
    let subs = app
        .ok(Method::GET, "/v1/services/orders/subscribers", None)
        .await;
    assert_eq!(subs["subscribers"][0]["acked_revision"], revision(&reg2));
    assert_eq!(
        subs["subscribers"].as_array().unwrap().len(),
        1,
        "one row per poller name"
    );
}

#[tokio::test]
async fn watch_streams_snapshots_and_counts_as_a_subscriber() {
    let app = app();
    let reg = app.lease("orders", "10.0.0.1").await;
    let request = Request::get("/v1/services/orders/watch?subscriber=ui")
        .body(Body::empty())
        .unwrap();
    let response = app.router.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        "text/event-stream"
    );
    let mut body = response.into_body();
    let mut text = String::new();
    let deadline = Duration::from_secs(5);
    while !text.contains("\n\n") {
        let frame = tokio::time::timeout(deadline, body.frame())
            .await
            .expect("a snapshot in time");
        let frame = frame.expect("stream open").expect("frame");
        if let Some(data) = frame.data_ref() {
            text.push_str(std::str::from_utf8(data).unwrap());
        }
    }
    assert!(text.starts_with("event: snapshot\ndata: "), "{text}");
    let data = text.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
    let snapshot: Value = serde_json::from_str(data).unwrap();
    assert_eq!(revision(&snapshot), revision(&reg));
    assert_eq!(addrs(&snapshot), ["10.0.0.1:8080"]);
    assert_eq!(snapshot["instances"][0]["liveness"], "lease");

    let subs = app
        .ok(Method::GET, "/v1/services/orders/subscribers", None)
        .await;
    let row = &subs["subscribers"][0];
    assert_eq!(row["kind"], "watch");
    assert_eq!(row["client_name"], "ui");
    assert_eq!(
        row["acked_revision"],
        revision(&reg),
        "a watcher acks what it was sent"
    );

    drop(body);
    let subs = app
        .ok(Method::GET, "/v1/services/orders/subscribers", None)
        .await;
    assert_eq!(
        subs["subscribers"],
        json!([]),
        "closing the stream unsubscribes"
    );
}

#[tokio::test]
async fn mixing_kinds_is_refused_naming_the_service_and_its_kind() {
    let app = app();
    app.lease("orders", "10.0.0.1").await;
    let before = app.everything().await;
    let persistent = r#"{"ip":"10.0.0.2","port":8080,"ephemeral":false}"#;
    let reply = app
        .call(
            Method::POST,
            "/v1/services/orders/instances",
            Some(persistent),
        )
        .await;
    let error = assert_error(&reply, StatusCode::CONFLICT, "conflict");
    assert_eq!(error["field"], Value::Null);
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("public/DEFAULT_GROUP/orders") && message.contains("is ephemeral"),
        "{message}"
    );
    assert_eq!(app.everything().await, before);

    let persistent = r#"{"ip":"127.0.0.1","port":9,"probe":{"interval_ms":3600000}}"#;
    app.call(
        Method::POST,
        "/v1/services/stock/instances",
        Some(persistent),
    )
    .await;
    let before = app.everything().await;
    let reply = app
        .call(
            Method::POST,
            "/v1/services/stock/instances",
            Some(r#"{"ip":"10.0.0.2","port":80}"#),
        )
        .await;
    let error = assert_error(&reply, StatusCode::CONFLICT, "conflict");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("public/DEFAULT_GROUP/stock") && message.contains("is persistent"),
        "{message}"
    );
    assert_eq!(app.everything().await, before);
}

/// (method, uri, body, field named by the 400) for every validation rule.
#[rustfmt::skip]
fn validation_cases() -> Vec<(Method, String, Option<String>, &'static str)> {
    let keys65: serde_json::Map<String, Value> = (0..65).map(|i| (format!("k{i}"), json!("v"))).collect();
    let big = json!({"blob": "x".repeat(16 * 1024)});
    let reg = "/v1/services/orders/instances";
    let one = "/v1/services/orders/instances/10.0.0.1:8080";
    let stock = "/v1/services/stock/instances";
    let settings = "/v1/services/orders";
    let s = |t: &str| Some(t.to_owned());
    vec![
        // names
        (Method::POST, "/v1/services/bad!name/instances".into(), s(r#"{"ip":"10.0.0.3","port":1}"#), "service"),
        (Method::POST, "/v1/services/bad%20name/instances".into(), s(r#"{"ip":"10.0.0.3","port":1}"#), "service"),
        (Method::POST, format!("{reg}?group=a@@b"), s(r#"{"ip":"10.0.0.3","port":1}"#), "group"),
        (Method::POST, format!("{reg}?namespace=a%20b"), s(r#"{"ip":"10.0.0.3","port":1}"#), "namespace"),
        (Method::POST, reg.into(), s(r#"{"ip":"10.0.0.3","port":1,"cluster":"a@@b"}"#), "cluster"),
        (Method::PATCH, format!("{one}?cluster=a@@b"), s(r#"{"weight":1}"#), "cluster"),
        (Method::PUT, "/v1/services/bad!name".into(), s(r#"{"protect_threshold":0.1}"#), "service"),
        (Method::GET, "/v1/services/bad!name".into(), None, "service"),
        (Method::GET, "/v1/services/orders/instances?group=a@@b".into(), None, "group"),
        (Method::GET, "/v1/services/bad!name/subscribers".into(), None, "service"),
        (Method::GET, "/v1/services/bad!name/watch".into(), None, "service"),
        (Method::GET, "/v1/services/orders/instances?subscriber=a%20b".into(), None, "subscriber"),
        // dot segments: a URL cannot carry them (issue #9)
        (Method::POST, "/v1/services/./instances".into(), s(r#"{"ip":"10.0.0.3","port":1}"#), "service"),
        (Method::POST, "/v1/services/../instances".into(), s(r#"{"ip":"10.0.0.3","port":1}"#), "service"),
        (Method::POST, "/v1/services/%2E%2E/instances".into(), s(r#"{"ip":"10.0.0.3","port":1}"#), "service"),
        (Method::PUT, "/v1/services/.".into(), s(r#"{"protect_threshold":0.1}"#), "service"),
        (Method::POST, format!("{reg}?namespace=.."), s(r#"{"ip":"10.0.0.3","port":1}"#), "namespace"),
        (Method::POST, format!("{reg}?group=."), s(r#"{"ip":"10.0.0.3","port":1}"#), "group"),
        (Method::POST, reg.into(), s(r#"{"ip":"10.0.0.3","port":1,"cluster":".."}"#), "cluster"),
        // ports
        (Method::POST, reg.into(), s(r#"{"ip":"10.0.0.3","port":0}"#), "port"),
        (Method::POST, reg.into(), s(r#"{"ip":"10.0.0.3","port":70000}"#), "port"),
        (Method::POST, reg.into(), s(r#"{"ip":"10.0.0.3","port":-1}"#), "body"),
        // ips
        (Method::POST, reg.into(), s(r#"{"ip":"10.0.0.300","port":1}"#), "ip"),
        (Method::POST, reg.into(), s(r#"{"ip":"bad_host","port":1}"#), "ip"),
        (Method::POST, reg.into(), s(r#"{"ip":"","port":1}"#), "ip"),
        // weights
        (Method::POST, reg.into(), s(r#"{"ip":"10.0.0.3","port":1,"weight":-1}"#), "weight"),
        (Method::POST, reg.into(), s(r#"{"ip":"10.0.0.3","port":1,"weight":10001}"#), "weight"),
        (Method::PATCH, one.into(), s(r#"{"weight":-1}"#), "weight"),
        (Method::PATCH, one.into(), s(r#"{"weight":10001}"#), "weight"),
        // -0.0 and subnormal weights (issue #9): 0 exactly, or 0.001-10000
        (Method::POST, reg.into(), s(r#"{"ip":"10.0.0.3","port":1,"weight":-0.0}"#), "weight"),
        (Method::POST, reg.into(), s(r#"{"ip":"10.0.0.3","port":1,"weight":5e-324}"#), "weight"),
        (Method::POST, reg.into(), s(r#"{"ip":"10.0.0.3","port":1,"weight":0.0009}"#), "weight"),
        (Method::PATCH, one.into(), s(r#"{"weight":-0.0}"#), "weight"),
        (Method::PATCH, one.into(), s(r#"{"weight":1e-310}"#), "weight"),
        // metadata
        (Method::POST, reg.into(), s(&json!({"ip":"10.0.0.3","port":1,"metadata":keys65}).to_string()), "metadata"),
        (Method::POST, reg.into(), s(&json!({"ip":"10.0.0.3","port":1,"metadata":big}).to_string()), "metadata"),
        (Method::POST, reg.into(), s(r#"{"ip":"10.0.0.3","port":1,"metadata":{"":"v"}}"#), "metadata"),
        (Method::PATCH, one.into(), s(&json!({"metadata": keys65}).to_string()), "metadata"),
        (Method::PATCH, one.into(), s(&json!({"metadata": big}).to_string()), "metadata"),
        (Method::PUT, settings.into(), s(&json!({"metadata": keys65}).to_string()), "metadata"),
        (Method::PUT, settings.into(), s(&json!({"metadata": big}).to_string()), "metadata"),
        // service settings
        (Method::PUT, settings.into(), s(r#"{"protect_threshold":1.5}"#), "protect_threshold"),
        (Method::PUT, settings.into(), s(r#"{"protect_threshold":-0.1}"#), "protect_threshold"),
        // liveness
        (Method::POST, reg.into(), s(r#"{"ip":"10.0.0.3","port":1,"ttl_ms":50}"#), "ttl_ms"),
        (Method::POST, reg.into(), s(r#"{"ip":"10.0.0.3","port":1,"ttl_ms":5000,"delete_timeout_ms":1000}"#), "delete_timeout_ms"),
        (Method::POST, reg.into(), s(r#"{"ip":"10.0.0.3","port":1,"ephemeral":true,"probe":{}}"#), "probe"),
        (Method::POST, stock.into(), s(r#"{"ip":"10.0.0.3","port":1,"ephemeral":false,"ttl_ms":5000}"#), "ttl_ms"),
        (Method::POST, stock.into(), s(r#"{"ip":"10.0.0.3","port":1,"probe":{"interval_ms":10}}"#), "probe.interval_ms"),
        (Method::POST, stock.into(), s(r#"{"ip":"10.0.0.3","port":1,"probe":{"interval_ms":3600001}}"#), "probe.interval_ms"),
        (Method::POST, stock.into(), s(r#"{"ip":"10.0.0.3","port":1,"probe":{"fall":0}}"#), "probe.fall"),
        (Method::POST, stock.into(), s(r#"{"ip":"10.0.0.3","port":1,"probe":{"rise":101}}"#), "probe.rise"),
        (Method::POST, stock.into(), s(r#"{"ip":"10.0.0.3","port":1,"probe":{"path":"ready"}}"#), "probe.path"),
        // unbounded leases and probe paths (issue #9)
        (Method::POST, reg.into(), s(r#"{"ip":"10.0.0.3","port":1,"ttl_ms":18446744073709551615}"#), "ttl_ms"),
        (Method::POST, reg.into(), s(r#"{"ip":"10.0.0.3","port":1,"ttl_ms":86400001,"delete_timeout_ms":86400001}"#), "ttl_ms"),
        (Method::POST, reg.into(), s(r#"{"ip":"10.0.0.3","port":1,"delete_timeout_ms":18446744073709551615}"#), "delete_timeout_ms"),
        (Method::POST, reg.into(), s(r#"{"ip":"10.0.0.3","port":1,"ttl_ms":1000,"delete_timeout_ms":86400001}"#), "delete_timeout_ms"),
        (Method::POST, stock.into(), s(&json!({"ip":"10.0.0.3","port":1,"probe":{"kind":"http","path":format!("/{}", "a".repeat(100 * 1024))}}).to_string()), "probe.path"),
        (Method::POST, stock.into(), s(&json!({"ip":"10.0.0.3","port":1,"probe":{"kind":"http","path":format!("/{}", "a".repeat(1024))}}).to_string()), "probe.path"),
        (Method::POST, stock.into(), s(r#"{"ip":"10.0.0.3","port":1,"probe":{"kind":"udp"}}"#), "body"),
        // malformed bodies, wrong types, unknown fields
        (Method::POST, reg.into(), s(r#"{"ip":"10.0.0.3","port":"#), "body"),
        (Method::POST, reg.into(), s("[]"), "body"),
        (Method::POST, reg.into(), s(r#"{"ip":10,"port":"80"}"#), "body"),
        (Method::POST, reg.into(), s(r#"{"ip":"10.0.0.3","port":1,"weight":"heavy"}"#), "body"),
        (Method::POST, reg.into(), s(r#"{"ip":"10.0.0.3"}"#), "body"),
        (Method::POST, reg.into(), s(r#"{"ip":"10.0.0.3","port":1,"colour":"red"}"#), "body"),
        (Method::PATCH, one.into(), s(r#"{"weight":2,"healthy":false}"#), "body"),
        (Method::PATCH, one.into(), s(r#"{"enabled":"no"}"#), "body"),
        (Method::PUT, settings.into(), s(r#"{"protect_threshold":"half"}"#), "body"),
        (Method::PUT, settings.into(), s(r#"{"revision":1}"#), "body"),
        (Method::POST, format!("{one}/drain"), s(r#"{"timeout_ms":"#), "body"),
        (Method::POST, format!("{one}/drain"), s(r#"{"timeout_ms":-5}"#), "body"),
        (Method::POST, format!("{one}/drain"), s(r#"{"force":true,"now":true}"#), "body"),
        // query strings
        (Method::GET, "/v1/services/orders/instances?all=maybe".into(), None, "query"),
        (Method::DELETE, format!("{one}?clustr=east"), None, "query"),
        (Method::POST, format!("{reg}?namespace="), s(r#"{"ip":"10.0.0.3","port":1}"#), "namespace"),
        (Method::DELETE, format!("{one}?cluster="), None, "cluster"),
        (Method::POST, reg.into(), s(r#"{"ip":"10.0.0.3","port":1,"cluster":""}"#), "cluster"),
        (Method::POST, reg.into(), s(r#"{"ip":"0.0.0.0","port":1}"#), "ip"),
        (Method::POST, reg.into(), s(r#"{"ip":"224.0.0.1","port":1}"#), "ip"),
        (Method::POST, reg.into(), s(r#"{"ip":"10.0.0.3","port":1,"metadata":{"a\nb":"v"}}"#), "metadata"),
        (Method::POST, stock.into(), s(r#"{"ip":"10.0.0.9","port":1,"ephemeral":false,"probe":{"kind":"http","path":"/a b"}}"#), "probe.path"),
        (Method::GET, "/v1/services?namespace=bad%20ns".into(), None, "namespace"),
        (Method::GET, "/v1/services/orders/instances?all=true&subscriber=web".into(), None, "subscriber"),
        (Method::POST, stock.into(), s(r#"{"ip":"10.0.0.9","port":1,"ephemeral":false,"probe":{"intervall_ms":5}}"#), "body"),
        // addresses in the path
        (Method::PATCH, "/v1/services/orders/instances/10.0.0.1".into(), s(r#"{"weight":1}"#), "addr"),
        (Method::DELETE, "/v1/services/orders/instances/10.0.0.1:0".into(), None, "port"),
        (Method::DELETE, "/v1/services/orders/instances/10.0.0.1:99999".into(), None, "port"),
        (Method::DELETE, "/v1/services/orders/instances/10.0.0.1:http".into(), None, "port"),
        (Method::DELETE, "/v1/services/orders/instances/bad_host:8080".into(), None, "ip"),
        (Method::DELETE, "/v1/services/orders/instances/::1:80".into(), None, "addr"),
        (Method::PUT, "/v1/services/orders/instances/10.0.0.1/heartbeat".into(), None, "addr"),
        (Method::POST, "/v1/services/orders/instances/10.0.0.1:0/offline".into(), None, "port"),
        (Method::POST, "/v1/services/orders/instances/[::1/online".into(), None, "addr"),
        (Method::POST, "/v1/services/orders/instances/10.0.0.1/drain".into(), None, "addr"),
    ]
}

#[tokio::test]
async fn every_validation_rule_answers_400_naming_the_field_and_changes_nothing() {
    let app = app();
    app.lease("orders", "10.0.0.1").await;
    app.lease("orders", "10.0.0.2").await;
    app.ok(
        Method::PUT,
        "/v1/services/orders",
        Some(json!({"protect_threshold": 0.25, "metadata": {"t": "x"}})),
    )
    .await;
    let persistent = json!({"ip": "127.0.0.1", "port": 9, "probe": {"interval_ms": 3_600_000}});
    app.ok(
        Method::POST,
        "/v1/services/stock/instances",
        Some(persistent),
    )
    .await;
    app.ok(
        Method::GET,
        "/v1/services/orders/instances?subscriber=web",
        None,
    )
    .await;

    let cases = validation_cases();
    let total = cases.len();
    let mut before = app.everything().await;
    let mut wrong = Vec::new();
    for (method, uri, body, field) in cases {
        let case = short(&format!("{method} {uri} {}", body.as_deref().unwrap_or("")));
        let reply = app.call(method, &uri, body.as_deref()).await;
        let mut problems = Vec::new();
        if let Some(m) = error_mismatch(&reply, StatusCode::BAD_REQUEST, "invalid_argument", field)
        {
            problems.push(format!("answered {m}"));
        }
        let after = app.everything().await;
        if after != before {
            problems.push("changed the registry".to_owned());
            before = after;
        }
        if !problems.is_empty() {
            wrong.push(format!("{case}\n    {}", problems.join("\n    ")));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {total} cases wrong:\n{}",
        wrong.len(),
        wrong.join("\n")
    );

    // A JSON body without its Content-Type is refused the same way.
    let request = Request::post("/v1/services/orders/instances")
        .body(Body::from(r#"{"ip":"10.0.0.3","port":1}"#))
        .unwrap();
    let error = assert_error(
        &app.send(request).await,
        StatusCode::BAD_REQUEST,
        "invalid_argument",
    );
    assert_eq!(error["field"], "body");
    assert_eq!(app.everything().await, before);
}

#[tokio::test]
async fn unknown_paths_answer_404_json() {
    let app = app();
    for uri in [
        "/nope",
        "/v1",
        "/v1/services/orders/instances/10.0.0.1:80/reboot",
        "/v2/services",
    ] {
        let reply = app.call(Method::GET, uri, None).await;
        let error = assert_error(&reply, StatusCode::NOT_FOUND, "not_found");
        assert_eq!(error["field"], Value::Null);
        assert!(
            error["message"].as_str().unwrap().contains("openapi"),
            "{error}"
        );
    }
}

#[tokio::test]
async fn metrics_expose_instances_and_counters() {
    let app = app();
    app.lease("orders", "10.0.0.1").await;
    app.lease("orders", "10.0.0.2").await;
    app.ok(
        Method::POST,
        "/v1/services/orders/instances/10.0.0.2:8080/offline",
        None,
    )
    .await;
    app.ok(
        Method::GET,
        "/v1/services/orders/instances?subscriber=web",
        None,
    )
    .await;
    app.ok(
        Method::POST,
        "/v1/services/orders/instances/10.0.0.1:8080/drain",
        Some(json!({"force": true, "timeout_ms": 20})),
    )
    .await;
    let reply = app.call(Method::GET, "/metrics", None).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(
        reply
            .content_type
            .starts_with("application/openmetrics-text"),
        "{}",
        reply.content_type
    );
    let text = reply.text;
    for line in [
        r#"gangway_instances{service="public/DEFAULT_GROUP/orders",state="offline"} 2"#,
        "gangway_leases 2",
        "gangway_subscribers 1",
        "gangway_sessions 0",
        "gangway_sessions_opened_total 0",
        "gangway_pushes_acked_total 1",
        "gangway_pushes_sent_total 0",
        "gangway_pushes_resent_total 0",
        "gangway_drains_started_total 1",
        "gangway_drains_complete_total 0",
        "gangway_drains_timed_out_total 1",
        "gangway_drain_wait_seconds_count 1",
        "gangway_push_to_ack_seconds_count 0",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
    assert!(text.trim_end().ends_with("# EOF"));
}

/// Every (method, path) the router serves.
const ROUTES: &[(&str, &str)] = &[
    ("get", "/v1/health"),
    ("get", "/v1/openapi.json"),
    ("get", "/metrics"),
    ("get", "/v1/services"),
    ("get", "/v1/services/{service}"),
    ("put", "/v1/services/{service}"),
    ("get", "/v1/services/{service}/instances"),
    ("post", "/v1/services/{service}/instances"),
    ("patch", "/v1/services/{service}/instances/{addr}"),
    ("delete", "/v1/services/{service}/instances/{addr}"),
    ("put", "/v1/services/{service}/instances/{addr}/heartbeat"),
    ("post", "/v1/services/{service}/instances/{addr}/offline"),
    ("post", "/v1/services/{service}/instances/{addr}/online"),
    ("post", "/v1/services/{service}/instances/{addr}/drain"),
    ("get", "/v1/services/{service}/subscribers"),
    ("get", "/v1/services/{service}/watch"),
    ("get", "/v1/services/{service}/liveness"),
    ("get", "/v1/drains"),
    ("get", "/v1/cluster"),
];

#[tokio::test]
async fn openapi_describes_exactly_the_routes_the_router_serves() {
    let app = app();
    let reply = app.call(Method::GET, "/v1/openapi.json", None).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.content_type, "application/json");
    let spec = reply.json();
    assert_eq!(spec["openapi"], "3.0.3");
    assert!(spec["info"]["title"].is_string() && spec["info"]["version"].is_string());
    let paths = spec["paths"].as_object().expect("paths");

    let mut documented: Vec<(String, String)> = paths
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .unwrap()
                .keys()
                .filter(|k| ["get", "put", "post", "patch", "delete"].contains(&k.as_str()))
                .map(move |m| (m.clone(), path.clone()))
        })
        .collect();
    documented.sort();
    let mut served: Vec<(String, String)> = ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    served.sort();
    assert_eq!(documented, served);

    // Each route in the list is really served (no fallback 404, no 405), and every
    // operation is documented with an id, responses and the error body where it can fail.
    app.lease("orders", "10.0.0.1").await;
    for (method, path) in ROUTES {
        if path.ends_with("/watch") {
            continue; // an endless stream; covered by its own test
        }
        let uri = path
            .replace("{service}", "orders")
            .replace("{addr}", "10.0.0.9:1");
        let method = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
        let reply = app.call(method.clone(), &uri, Some("{}")).await;
        assert_ne!(
            reply.status,
            StatusCode::METHOD_NOT_ALLOWED,
            "{method} {uri}"
        );
        assert!(
            !reply.text.contains("no such endpoint"),
            "{method} {uri}: {}",
            reply.text
        );

        let op = &spec["paths"][*path][method.as_str().to_lowercase()];
        assert!(
            op["operationId"].is_string(),
            "{method} {path}: operationId"
        );
        assert!(op["responses"]["200"].is_object(), "{method} {path}: 200");
        if path.contains("{service}") {
            assert!(op["responses"]["400"].is_object(), "{method} {path}: 400");
        }
    }

    // Every $ref resolves.
    fn refs(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("$ref", Value::String(r)) => out.push(r.clone()),
                        _ => refs(v, out),
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }
    let mut all = Vec::new();
    refs(&spec, &mut all);
    assert!(!all.is_empty());
    for r in all {
        let pointer = r
            .strip_prefix('#')
            .unwrap_or_else(|| panic!("external $ref {r}"));
        assert!(spec.pointer(pointer).is_some(), "dangling $ref {r}");
    }

    // The error codes are the shared enum's, all of them.
    let codes = &spec["components"]["schemas"]["Error"]["properties"]["error"]["properties"]["code"]
        ["enum"];
    let known: Vec<Value> = gangway_wire::ErrorCode::KNOWN
        .iter()
        .map(|c| json!(c.as_str()))
        .collect();
    assert_eq!(codes, &Value::Array(known));
}

#[tokio::test]
async fn put_default_settings_on_an_unknown_service_answers_the_service() {
    let app = app();
    let put = app
        .ok(Method::PUT, "/v1/services/fresh", Some(json!({})))
        .await;
    assert_eq!(put["service"], "fresh");
}

#[tokio::test]
async fn wrong_method_answers_the_json_error_shape() {
    let app = app();
    let reply = app.call(Method::DELETE, "/v1/services", None).await;
    assert_eq!(reply.status, StatusCode::METHOD_NOT_ALLOWED);
    assert!(reply.json()["error"]["code"].is_string());
}

#[tokio::test]
async fn the_bounds_themselves_are_accepted() {
    let app = app();
    let path = format!("/{}", "a".repeat(1023));
    for (uri, body) in [
        (
            "/v1/services/orders/instances",
            json!({"ip": "10.0.0.1", "port": 1, "weight": 0.001,
                   "ttl_ms": 86_400_000, "delete_timeout_ms": 86_400_000}),
        ),
        (
            "/v1/services/orders/instances",
            json!({"ip": "10.0.0.2", "port": 1, "weight": 0.0, "ttl_ms": 100, "delete_timeout_ms": 100}),
        ),
        (
            "/v1/services/stock/instances",
            json!({"ip": "127.0.0.1", "port": 9, "weight": 10_000.0,
                   "probe": {"kind": "http", "path": path, "interval_ms": 100, "fall": 100, "rise": 1}}),
        ),
    ] {
        let answer = app.ok(Method::POST, uri, Some(body.clone())).await;
        assert_eq!(answer["instance"]["weight"], body["weight"], "{body}");
    }
    let view = app
        .ok(Method::GET, "/v1/services/orders/instances?all=true", None)
        .await;
    let zero = &view["instances"][1];
    assert_eq!(zero["weight"].to_string(), "0.0", "positive zero: {zero}");
}

/// A body of 3 MiB: larger than the 2 MiB limit of every /v1 body.
fn oversized_body() -> String {
    format!(
        r#"{{"ip":"10.0.0.3","port":1,"metadata":{{"k":"{}"}}}}"#,
        "x".repeat(3 * 1024 * 1024)
    )
}

#[tokio::test]
async fn an_oversized_body_is_a_413_in_the_json_shape_and_changes_nothing() {
    let app = app();
    app.lease("orders", "10.0.0.1").await;
    app.lease("orders", "10.0.0.2").await;
    let before = app.everything().await;
    let one = "/v1/services/orders/instances/10.0.0.1:8080";
    let body = oversized_body();
    let cases = [
        (
            Method::POST,
            "/v1/services/orders/instances".to_owned(),
            true,
        ),
        (Method::PATCH, one.to_owned(), true),
        (Method::PUT, "/v1/services/orders".to_owned(), true),
        (Method::POST, format!("{one}/drain"), true),
        (Method::POST, format!("{one}/drain"), false),
        (Method::POST, format!("{one}/offline"), false),
        (Method::POST, format!("{one}/online"), true),
    ];
    let total = cases.len();
    let mut wrong = Vec::new();
    for (method, uri, content_type) in cases {
        let mut request = Request::builder().method(method.clone()).uri(&uri);
        if content_type {
            request = request.header(header::CONTENT_TYPE, "application/json");
        }
        let reply = app
            .send(request.body(Body::from(body.clone())).unwrap())
            .await;
        let case = format!("{method} {uri} (3 MiB, Content-Type: {content_type})");
        let m = error_mismatch(
            &reply,
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            "",
        );
        let names_limit = reply.text.contains("at most 2097152 bytes");
        let mut problems = Vec::new();
        if let Some(m) = m.or_else(|| (!names_limit).then(|| short(&reply.text))) {
            problems.push(format!("answered {m}"));
        }
        if app.everything().await != before {
            problems.push("changed the registry".to_owned());
        }
        if !problems.is_empty() {
            wrong.push(format!("{case}\n    {}", problems.join("\n    ")));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {total} cases wrong:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// Sends a drain through the router on a task (it waits for acks); the task answers the report.
fn spawn_drain(app: &App, addr: &str, timeout_ms: u64) -> tokio::task::JoinHandle<Value> {
    let router = app.router.clone();
    let uri = format!("/v1/services/orders/instances/{addr}/drain");
    tokio::spawn(async move {
        let request = Request::post(uri)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(json!({ "timeout_ms": timeout_ms }).to_string()))
            .unwrap();
        let response = router.oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice::<Value>(&bytes).unwrap()
    })
}

impl App {
    /// Fetches `orders` as the poller `name` (which acks what it fetched).
    async fn poll_orders(&self, name: &str) -> Value {
        let uri = format!("/v1/services/orders/instances?subscriber={name}");
        self.ok(Method::GET, &uri, None).await
    }

    /// The drains listing's entry for `addr`, once one `matches`.
    async fn drain_listed(&self, addr: &str, matches: impl Fn(&Value) -> bool) -> Value {
        let (ip, port) = addr.split_once(':').unwrap();
        let port: u64 = port.parse().unwrap();
        let found = gangway_testkit::poll(Duration::from_secs(5), || async {
            let list = self.ok(Method::GET, "/v1/drains", None).await;
            list["drains"]
                .as_array()
                .unwrap()
                .iter()
                .find(|d| d["instance"]["ip"] == ip && d["instance"]["port"] == port && matches(d))
                .cloned()
        })
        .await;
        found.unwrap_or_else(|| panic!("no such drain of {addr} listed"))
    }
}

#[tokio::test]
async fn drains_are_listed_with_their_progress_while_they_wait_and_their_outcome_after() {
    let app = app();
    for ip in ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"] {
        app.lease("orders", ip).await;
    }
    let poll = || app.poll_orders("web");
    poll().await;
    assert_eq!(
        app.ok(Method::GET, "/v1/drains", None).await,
        json!({"drains": []})
    );

    // Waiting: the poller has not fetched the revision without the instance.
    let drain = spawn_drain(&app, "10.0.0.1:8080", 10_000);
    let waiting = app
        .drain_listed("10.0.0.1:8080", |d| d["state"] == "waiting")
        .await;
    assert_eq!(
        (
            waiting["namespace"].clone(),
            waiting["group"].clone(),
            waiting["service"].clone()
        ),
        (json!("public"), json!("DEFAULT_GROUP"), json!("orders"))
    );
    assert_eq!(
        (waiting["acked"].clone(), waiting["total"].clone()),
        (json!(0), json!(1))
    );
    assert_eq!(
        waiting["laggards"][0]["id"],
        "p-web@public/DEFAULT_GROUP/orders"
    );
    assert_eq!(waiting["timeout_ms"], 10_000);
    assert!(waiting["started_at_ms"].as_u64().unwrap() > 0);
    // Its next fetch acks it: complete, listed as such with its count.
    poll().await;
    let report = drain.await.unwrap();
    assert_eq!(report["complete"], true, "{report}");
    let done = app
        .drain_listed("10.0.0.1:8080", |d| d["state"] != "waiting")
        .await;
    assert_eq!(done["state"], "complete");
    assert_eq!(
        (done["acked"].clone(), done["total"].clone()),
        (json!(1), json!(1))
    );
    assert_eq!(done["laggards"], json!([]));
    assert_eq!(done["revision"], report["revision"]);
    assert_eq!(done["id"], waiting["id"]);

    // A timeout ends one with its laggard; a caller that goes away cancels one.
    let report = spawn_drain(&app, "10.0.0.2:8080", 50).await.unwrap();
    assert_eq!(report["complete"], false);
    let timed_out = app
        .drain_listed("10.0.0.2:8080", |d| d["state"] != "waiting")
        .await;
    assert_eq!(timed_out["state"], "timed_out");
    assert_eq!(
        timed_out["laggards"][0]["id"],
        "p-web@public/DEFAULT_GROUP/orders"
    );
    let gone = spawn_drain(&app, "10.0.0.3:8080", 10_000);
    app.drain_listed("10.0.0.3:8080", |d| d["state"] == "waiting")
        .await;
    gone.abort();
    let cancelled = app
        .drain_listed("10.0.0.3:8080", |d| d["state"] != "waiting")
        .await;
    assert_eq!(cancelled["state"], "cancelled");

    // Newest first after the running ones; filters are exact.
    let list = app.ok(Method::GET, "/v1/drains", None).await;
    let ips: Vec<&str> = list["drains"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["instance"]["ip"].as_str().unwrap())
        .collect();
    assert_eq!(ips, ["10.0.0.3", "10.0.0.2", "10.0.0.1"]);
    let other = app
        .ok(Method::GET, "/v1/drains?service=billing", None)
        .await;
    assert_eq!(other, json!({"drains": []}));
    let reply = app.call(Method::GET, "/v1/drains?service=", None).await;
    assert_error(&reply, StatusCode::BAD_REQUEST, "invalid_argument");
}

#[tokio::test]
async fn liveness_lists_who_keeps_each_instance_alive_and_since_when() {
    let app = app();
    let before = crate::engine::now_ms();
    app.lease("orders", "10.0.0.1").await;
    let session =
        app.registry
            .open_session("127.0.0.1:7001".into(), "orders-app".into(), "c1".into());
    app.registry
        .register(
            ServiceKey::named("orders"),
            Instance::new(InstanceKey::new("10.0.0.2", 8080, "")),
            LivenessRequest::Session(session.clone()),
        )
        .await
        .unwrap();
    app.ok(
        Method::POST,
        "/v1/services/orders/instances/10.0.0.1:8080/offline",
        Some(json!({})),
    )
    .await;
    let after = crate::engine::now_ms();
    let list = app
        .ok(Method::GET, "/v1/services/orders/liveness", None)
        .await;
    assert_eq!(list["service"], "orders");
    assert_eq!(
        list["revision"],
        app.registry.revision(&ServiceKey::named("orders"))
    );
    let lease = &list["instances"][0];
    assert_eq!(
        (lease["ip"].clone(), lease["liveness"].clone()),
        (json!("10.0.0.1"), json!("lease"))
    );
    assert_eq!(lease["state"], "offline");
    assert_eq!(lease["lease"]["ttl_ms"], 15_000);
    assert_eq!(lease["lease"]["delete_timeout_ms"], 30_000);
    assert!(lease["lease"]["last_heartbeat_ms_ago"].as_u64().unwrap() < 15_000);
    assert!(lease.get("session").is_none() && lease.get("probe").is_none());
    let since = lease["since_ms"].as_u64().unwrap();
    assert!(
        (before..=after).contains(&since),
        "{since} in {before}..={after}"
    );
    let kept = &list["instances"][1];
    assert_eq!(
        (kept["liveness"].clone(), kept["state"].clone()),
        (json!("session"), json!("serving"))
    );
    assert_eq!(
        kept["session"],
        json!({"id": session, "client_name": "orders-app", "address": "127.0.0.1:7001"})
    );
    assert_eq!(kept["owner"], Value::Null);

    // A re-registration by the same keeper keeps its time; a heartbeat too.
    app.lease("orders", "10.0.0.1").await;
    app.ok(
        Method::PUT,
        "/v1/services/orders/instances/10.0.0.1:8080/heartbeat",
        None,
    )
    .await;
    let again = app
        .ok(Method::GET, "/v1/services/orders/liveness", None)
        .await;
    assert_eq!(again["instances"][0]["since_ms"], since);
    // A persistent one is kept by its probe.
    let probed = app
        .ok(
            Method::POST,
            "/v1/services/stock/instances",
            Some(json!({"ip": "127.0.0.1", "port": 9, "ephemeral": false,
                        "probe": {"kind": "http", "path": "/health", "interval_ms": 60000}})),
        )
        .await;
    assert_eq!(probed["instance"]["ephemeral"], false);
    let stock = app
        .ok(Method::GET, "/v1/services/stock/liveness", None)
        .await;
    assert_eq!(stock["instances"][0]["liveness"], "probe");
    assert_eq!(stock["instances"][0]["probe"]["kind"], "http");
    assert_eq!(stock["instances"][0]["probe"]["path"], "/health");
    let unknown = app
        .ok(Method::GET, "/v1/services/nothing/liveness", None)
        .await;
    assert_eq!(
        (unknown["revision"].clone(), unknown["instances"].clone()),
        (json!(0), json!([]))
    );
}

#[tokio::test]
async fn subscribers_say_how_far_behind_they_are() {
    let app = app();
    app.lease("orders", "10.0.0.1").await;
    let poll = || app.poll_orders("web");
    poll().await;
    let row = |subs: &Value| subs["subscribers"][0].clone();
    let subs = app
        .ok(Method::GET, "/v1/services/orders/subscribers", None)
        .await;
    assert_eq!(
        (row(&subs)["behind"].clone(), row(&subs)["lag_ms"].clone()),
        (json!(0), Value::Null)
    );
    app.lease("orders", "10.0.0.2").await;
    app.lease("orders", "10.0.0.3").await;
    let subs = app
        .ok(Method::GET, "/v1/services/orders/subscribers", None)
        .await;
    assert_eq!(row(&subs)["behind"], 2, "{subs}");
    assert!(row(&subs)["lag_ms"].as_u64().is_some(), "{subs}");
    poll().await;
    let subs = app
        .ok(Method::GET, "/v1/services/orders/subscribers", None)
        .await;
    assert_eq!(
        (row(&subs)["behind"].clone(), row(&subs)["lag_ms"].clone()),
        (json!(0), Value::Null)
    );
}

#[tokio::test]
async fn services_count_their_instances_by_state() {
    let app = app();
    for ip in ["10.0.0.1", "10.0.0.2", "10.0.0.3"] {
        app.lease("orders", ip).await;
    }
    app.ok(
        Method::POST,
        "/v1/services/orders/instances/10.0.0.1:8080/offline",
        Some(json!({})),
    )
    .await;
    app.ok(
        Method::PATCH,
        "/v1/services/orders/instances/10.0.0.2:8080",
        Some(json!({"weight": 0})),
    )
    .await;
    let svc = app.ok(Method::GET, "/v1/services/orders", None).await;
    assert_eq!(
        svc["states"],
        json!({"serving": 1, "unhealthy": 0, "offline": 1, "zero_weight": 1})
    );
}

#[tokio::test]
async fn a_refused_online_wait_changes_nothing() {
    // Found by the fuzz long run (rest input 308975): an offline instance of weight 0 cannot
    // enter the view, so `online` with `wait` is a 409, and it stays offline.
    let app = app();
    app.lease("pay", "10.0.0.1").await;
    app.lease("pay", "10.0.0.2").await;
    let uri = "/v1/services/pay/instances/10.0.0.1:8080";
    app.ok(
        Method::PATCH,
        uri,
        Some(json!({"weight": 0.0, "enabled": false})),
    )
    .await;
    let before = app.ok(Method::GET, "/v1/services/pay", None).await;
    let reply = app
        .call(
            Method::POST,
            &format!("{uri}/online"),
            Some(r#"{"wait": true, "timeout_ms": 20}"#),
        )
        .await;
    assert_error(&reply, StatusCode::CONFLICT, "conflict");
    let after = app.ok(Method::GET, "/v1/services/pay", None).await;
    assert_eq!(revision(&after), revision(&before), "{after}");
    let listed = app
        .ok(Method::GET, "/v1/services/pay/instances?all=true", None)
        .await;
    let enabled: Vec<bool> = listed["instances"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["ip"] == "10.0.0.1")
        .map(|i| i["enabled"].as_bool().unwrap())
        .collect();
    assert_eq!(enabled, [false]);
}

#[tokio::test]
async fn a_cluster_parameter_where_it_addresses_nothing_is_refused_and_changes_nothing() {
    // A tester's `POST .../instances?cluster=east` registered into DEFAULT, and `?cluster=a b`
    // was not even checked: the parameter belongs to instance paths only.
    let app = app();
    app.lease("cq", "10.0.0.1").await;
    let before = app.ok(Method::GET, "/v1/services/cq", None).await;
    for (method, uri, body) in [
        (
            Method::POST,
            "/v1/services/cq/instances?cluster=east",
            Some(r#"{"ip": "10.0.0.8", "port": 80}"#),
        ),
        (
            Method::POST,
            "/v1/services/cq/instances?cluster=a%20b",
            Some(r#"{"ip": "10.0.0.9", "port": 80}"#),
        ),
        (Method::GET, "/v1/services/cq/instances?cluster=zzz", None),
        (Method::PUT, "/v1/services/cq?cluster=x", Some("{}")),
        (Method::GET, "/v1/services?cluster=a", None),
        (Method::GET, "/v1/services/cq/subscribers?cluster=a", None),
    ] {
        let reply = app.call(method.clone(), uri, body).await;
        let error = assert_error(&reply, StatusCode::BAD_REQUEST, "invalid_argument");
        assert_eq!(error["field"], "cluster", "{method} {uri}: {error}");
    }
    let after = app.ok(Method::GET, "/v1/services/cq", None).await;
    assert_eq!(revision(&after), revision(&before), "{after}");
    // On an instance path it addresses the cluster.
    let reply = app
        .call(
            Method::PATCH,
            "/v1/services/cq/instances/10.0.0.1:8080?cluster=east",
            Some(r#"{"weight": 2}"#),
        )
        .await;
    assert_error(&reply, StatusCode::NOT_FOUND, "not_found");
}

#[tokio::test]
async fn settings_put_as_they_are_keep_the_revision() {
    let app = app();
    app.lease("same", "10.0.0.1").await;
    let put = |body: &'static str| {
        app.ok(
            Method::PUT,
            "/v1/services/same",
            Some(json!(serde_json::from_str::<Value>(body).unwrap())),
        )
    };
    let first = put(r#"{"protect_threshold": 0.5}"#).await;
    for body in [
        "{}",
        r#"{"protect_threshold": null}"#,
        r#"{"protect_threshold": 0.5}"#,
    ] {
        let again = put(body).await;
        assert_eq!(revision(&again), revision(&first), "{body}: {again}");
    }
    let changed = put(r#"{"protect_threshold": 0.25}"#).await;
    assert!(revision(&changed) > revision(&first), "{changed}");
}
