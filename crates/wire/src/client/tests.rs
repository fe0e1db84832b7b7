//! The client against a fake registry on 127.0.0.1:0 that records what it gets and answers
//! with a canned status, content type and body.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::{Body, to_bytes};
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::Response;
use serde_json::{Value, json};

use super::*;
use crate::error::ErrorCode;
use crate::rest::{ProbeRequest, SettingsRequest};

/// One request as the fake got it: method, path and query, body.
type Seen = (String, String, String);

#[derive(Clone)]
struct Fake {
    status: u16,
    content_type: &'static str,
    body: String,
    delay: Duration,
    seen: Arc<Mutex<Vec<Seen>>>,
}

async fn answer(State(fake): State<Fake>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = to_bytes(body, usize::MAX).await.unwrap_or_default();
    fake.seen.lock().unwrap().push((
        parts.method.to_string(),
        parts.uri.to_string(),
        String::from_utf8_lossy(&body).into_owned(),
    ));
    tokio::time::sleep(fake.delay).await;
    Response::builder()
        .status(StatusCode::from_u16(fake.status).unwrap())
        .header(header::CONTENT_TYPE, fake.content_type)
        .body(Body::from(fake.body.clone()))
        .unwrap()
}

/// A fake answering every request with `status` and `body`; its client and its log.
async fn fake(
    status: u16,
    content_type: &'static str,
    body: &str,
    delay: Duration,
) -> (RestClient, Arc<Mutex<Vec<Seen>>>) {
    let (addr, seen) = fake_at(status, content_type, body, delay).await;
    (client_of(&addr.to_string()), seen)
}

/// A client of `server` with a call timeout of 500 ms.
fn client_of(server: &str) -> RestClient {
    RestClient::builder(server)
        .call_timeout(Duration::from_millis(500))
        .build()
        .unwrap()
}

/// A fake as [`fake`] does, without a client: its address and its log.
async fn fake_at(
    status: u16,
    content_type: &'static str,
    body: &str,
    delay: Duration,
) -> (SocketAddr, Arc<Mutex<Vec<Seen>>>) {
    let seen = Arc::default();
    let state = Fake {
        status,
        content_type,
        body: body.to_owned(),
        delay,
        seen: Arc::clone(&seen),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().fallback(answer).with_state(state);
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, seen)
}

async fn json_fake(body: Value) -> (RestClient, Arc<Mutex<Vec<Seen>>>) {
    fake(200, "application/json", &body.to_string(), Duration::ZERO).await
}

fn orders_in(namespace: &str) -> ServiceRef {
    ServiceRef {
        namespace: Some(namespace.into()),
        ..ServiceRef::named("orders")
    }
}

#[tokio::test]
async fn calls_name_the_service_and_instance_in_path_and_query() {
    let (client, seen) = json_fake(json!({"revision": 3})).await;
    let mut inst = InstanceRef::new(orders_in("prod"), "fd00::5", 80);
    inst.cluster = Some("blue".into());
    client.deregister(&inst, true).await.unwrap();
    client.heartbeat(&inst).await.unwrap();
    client.online(&inst).await.unwrap();
    client.offline(&inst, false).await.unwrap();
    client
        .online_wait(&inst, Duration::from_millis(1500))
        .await
        .unwrap();
    client
        .drain(&inst, Duration::from_secs(5), true)
        .await
        .unwrap();
    let patch = PatchRequest {
        weight: Some(0.5),
        ..Default::default()
    };
    client.update(&inst, &patch).await.unwrap();
    let path = "/v1/services/orders/instances/%5Bfd00::5%5D:80";
    let query = "namespace=prod&cluster=blue";
    let expected = [
        ("DELETE", format!("{path}?{query}&force=true"), ""),
        ("PUT", format!("{path}/heartbeat?{query}"), ""),
        // A POST is JSON (docs/security.md): online without a body sends `{}`.
        ("POST", format!("{path}/online?{query}"), "{}"),
        (
            "POST",
            format!("{path}/offline?{query}"),
            r#"{"force":false}"#,
        ),
        (
            "POST",
            format!("{path}/online?{query}"),
            r#"{"wait":true,"timeout_ms":1500}"#,
        ),
        (
            "POST",
            format!("{path}/drain?{query}"),
            r#"{"timeout_ms":5000,"force":true}"#,
        ),
        (
            "PATCH",
            format!("{path}?{query}"),
            r#"{"weight":0.5,"force":false}"#,
        ),
    ];
    let seen = seen.lock().unwrap().clone();
    let got: Vec<_> = seen
        .iter()
        .map(|(m, u, b)| (m.as_str(), u.clone(), b.as_str()))
        .collect();
    assert_eq!(got, expected);
}

#[tokio::test]
async fn service_calls_send_only_the_scope_that_is_set() {
    let (client, seen) = json_fake(json!({"services": []})).await;
    client.services(None, Some("g")).await.unwrap();
    client
        .instances(&ServiceRef::named("orders"), true)
        .await
        .unwrap();
    client.subscribers(&ServiceRef::named("a b")).await.unwrap();
    client.service(&orders_in("prod")).await.unwrap();
    let settings = SettingsRequest {
        protect_threshold: Some(0.5),
        ..Default::default()
    };
    client
        .put_settings(&ServiceRef::named("orders"), &settings)
        .await
        .unwrap();
    let body = RegisterRequest {
        ip: "10.0.0.5".into(),
        port: 80,
        ephemeral: Some(false),
        probe: Some(ProbeRequest::default()),
        ..Default::default()
    };
    client.register(&orders_in("prod"), &body).await.unwrap();
    client.health().await.unwrap();
    let seen = seen.lock().unwrap().clone();
    let uris: Vec<_> = seen.iter().map(|(_, u, _)| u.as_str()).collect();
    assert_eq!(
        uris,
        [
            "/v1/services?group=g",
            "/v1/services/orders/instances?all=true",
            "/v1/services/a%20b/subscribers",
            "/v1/services/orders?namespace=prod",
            "/v1/services/orders",
            "/v1/services/orders/instances?namespace=prod",
            "/v1/health",
        ]
    );
    assert_eq!(seen[4].2, r#"{"protect_threshold":0.5}"#);
    assert_eq!(
        serde_json::from_str::<Value>(&seen[5].2).unwrap(),
        json!({"ip": "10.0.0.5", "port": 80, "ephemeral": false, "probe": {}})
    );
}

#[tokio::test]
async fn a_reply_keeps_the_body_and_parses_on_demand() {
    let (client, _) = json_fake(json!({"revision": 3})).await;
    let inst = InstanceRef::new(ServiceRef::named("orders"), "10.0.0.5", 80);
    let reply = client.deregister(&inst, false).await.unwrap();
    assert_eq!(reply.body, r#"{"revision":3}"#);
    assert_eq!(reply.parse().unwrap().revision, 3);
    // The same body is no heartbeat answer.
    let reply = client.heartbeat(&inst).await.unwrap();
    let e = reply.parse().unwrap_err();
    assert!(
        e.to_string()
            .starts_with("unexpected answer from the registry (HeartbeatAnswer)"),
        "{e}"
    );
}

#[tokio::test]
async fn a_refusal_carries_the_registry_code() {
    let body =
        json!({"error": {"code": "conflict", "message": "last serving instance", "field": null}});
    let (client, _) = fake(409, "application/json", &body.to_string(), Duration::ZERO).await;
    let inst = InstanceRef::new(ServiceRef::named("orders"), "10.0.0.5", 80);
    let e = client
        .drain(&inst, Duration::from_secs(1), false)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(&ErrorCode::Conflict));
    assert_eq!(e.to_string(), "last serving instance (HTTP 409)");
}

#[tokio::test]
async fn an_answer_that_is_not_json_is_not_a_registry() {
    let (client, _) = fake(200, "text/html", "<html></html>", Duration::ZERO).await;
    let e = client.services(None, None).await.unwrap_err();
    assert!(
        matches!(&e, RestError::NotRegistry { detail, .. } if detail == "HTTP 200 OK, the answer is not JSON"),
        "{e:?}"
    );
    let e = client
        .watch(&ServiceRef::named("orders"))
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .ends_with("(HTTP 200 OK answered with text/html instead of an event stream)"),
        "{e}"
    );
}

#[tokio::test]
async fn a_slow_answer_times_out() {
    let (client, _) = fake(200, "application/json", "{}", Duration::from_secs(5)).await;
    let e = client.health().await.unwrap_err();
    assert_eq!(
        e,
        RestError::Timeout {
            server: client.server().to_owned(),
            after: Duration::from_millis(500)
        }
    );
    assert!(e.is_retryable());
}

#[tokio::test]
async fn a_closed_port_is_unreachable() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    drop(listener);
    let client = RestClient::new(&format!("http://{addr}/")).unwrap();
    let e = client.health().await.unwrap_err();
    assert!(
        matches!(&e, RestError::Unreachable { server, .. } if *server == format!("http://{addr}/")),
        "{e:?}"
    );
    assert!(e.is_retryable());
}

#[tokio::test]
async fn a_watch_yields_its_snapshots_then_ends() {
    let stream = ": hello\n\nevent: snapshot\ndata: {\"revision\":4,\"instances\":[]}\n\n\
                  event: other\ndata: x\n\nevent: snapshot\ndata: {\"revision\":5}\n\n";
    let (client, seen) = fake(200, "text/event-stream", stream, Duration::ZERO).await;
    let mut watch = client.watch(&orders_in("prod")).await.unwrap();
    let mut revisions = Vec::new();
    for _ in 0..2 {
        let snapshot = watch.next_snapshot().await.unwrap().unwrap();
        revisions.push(snapshot.parse().unwrap().revision);
    }
    assert_eq!(revisions, [4, 5]);
    assert!(watch.next_snapshot().await.unwrap().is_none());
    assert_eq!(
        seen.lock().unwrap()[0].1,
        "/v1/services/orders/watch?namespace=prod"
    );
}

#[test]
fn segment_keeps_ipv4_and_encodes_brackets() {
    assert_eq!(segment("10.0.0.5:8080"), "10.0.0.5:8080");
    assert_eq!(segment("[::1]:80"), "%5B::1%5D:80");
    assert_eq!(segment("a b/c"), "a%20b%2Fc");
}

#[test]
fn a_service_key_names_its_namespace_and_group() {
    let r = ServiceRef::from(&ServiceKey::named("orders"));
    assert_eq!(r.namespace.as_deref(), Some("public"));
    assert_eq!(r.group.as_deref(), Some("DEFAULT_GROUP"));
    assert_eq!(InstanceRef::new(r, "::1", 80).addr(), "[::1]:80");
}

#[test]
fn a_token_that_is_not_printable_ascii_is_refused_at_build() {
    let err = RestClient::builder("127.0.0.1:1")
        .token(Some("line\nbreak"))
        .build()
        .unwrap_err();
    assert!(matches!(err, RestError::Transport { .. }), "{err:?}");
    assert!(err.to_string().contains("--token"), "{err}");
    RestClient::builder("127.0.0.1:1")
        .token(Some("abc.DEF-123"))
        .build()
        .unwrap();
}

/// An address whose port refuses connections.
fn dead_address() -> String {
    gangway_testkit::refused_address().to_string()
}

#[tokio::test]
async fn a_node_that_does_not_answer_is_skipped_and_the_next_call_starts_where_one_answered() {
    let warming = r#"{"error":{"code":"warming_up","message":"warming up","field":null}}"#;
    let (first, first_seen) = fake_at(503, "application/json", warming, Duration::ZERO).await;
    let (second, second_seen) = fake_at(200, "application/json", "{}", Duration::ZERO).await;
    let dead = dead_address();
    let client = client_of(&format!("{dead},{first},http://{second}/"));
    assert_eq!(
        client.servers().collect::<Vec<_>>(),
        [
            dead.as_str(),
            &first.to_string(),
            &format!("http://{second}/")
        ]
    );
    let body = RegisterRequest {
        ip: "10.0.0.5".into(),
        port: 8080,
        ..RegisterRequest::default()
    };
    client.register(&orders_in("prod"), &body).await.unwrap();
    // Refused by the dead one, 503 from the first fake, answered by the second, whole.
    assert_eq!(first_seen.lock().unwrap().len(), 1);
    let seen = second_seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].0, "POST");
    assert_eq!(seen[0].1, "/v1/services/orders/instances?namespace=prod");
    assert!(seen[0].2.contains("10.0.0.5"), "{seen:?}");
    // The next call starts at the node that answered.
    client.health().await.unwrap();
    assert_eq!(first_seen.lock().unwrap().len(), 1);
    assert_eq!(second_seen.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn when_no_node_answers_one_line_names_each_with_its_failure() {
    let (a, b) = (dead_address(), dead_address());
    let e = client_of(&format!("{a},{b}")).health().await.unwrap_err();
    let RestError::Unreachable { server, reason } = &e else {
        panic!("expected Unreachable, got {e:?}");
    };
    assert_eq!(server, &format!("{a}, {b}"));
    assert!(reason.starts_with(&format!("{a}: ")), "{reason}");
    assert!(reason.contains(&format!("; {b}: ")), "{reason}");
    assert!(!e.to_string().contains('\n'), "{e}");
    assert!(e.is_retryable());
    println!("{e}");
    // One node: the error as it was.
    let e = client_of(&a).health().await.unwrap_err();
    assert!(
        matches!(&e, RestError::Unreachable { server, .. } if *server == a),
        "{e:?}"
    );
}

#[tokio::test]
async fn a_write_that_timed_out_stays_on_its_node_and_a_read_moves_on() {
    let (slow, slow_seen) = fake_at(200, "application/json", "{}", Duration::from_secs(5)).await;
    let (live, live_seen) = fake_at(200, "application/json", "{}", Duration::ZERO).await;
    let client = client_of(&format!("{slow},{live}"));
    let inst = InstanceRef::new(ServiceRef::named("orders"), "10.0.0.5", 8080);
    let e = client.offline(&inst, false).await.unwrap_err();
    assert!(matches!(e, RestError::Timeout { .. }), "{e:?}");
    assert_eq!(slow_seen.lock().unwrap().len(), 1);
    assert!(
        live_seen.lock().unwrap().is_empty(),
        "the write may have taken effect"
    );
    client.health().await.unwrap();
    assert_eq!(live_seen.lock().unwrap().len(), 1, "a read goes on");
}
