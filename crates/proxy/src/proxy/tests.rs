//! The data plane through [`Proxy::handle`], over fixed views and real backends on
//! 127.0.0.1 (no registry).

use std::sync::Arc;

use axum::Router;
use axum::routing::any;
use bytes::Bytes;
use gangway_core::model::{Instance, InstanceKey, ServiceKey};
use gangway_core::view::View;
use http_body_util::{BodyExt, Full};
use tokio::sync::watch;

use super::*;
use crate::config::{Config, Overrides};

/// A backend that echoes what it got as JSON and sets a hop-by-hop header on its answer.
async fn backend() -> InstanceKey {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let app = Router::new().route(
        "/{*path}",
        any(move |headers: http::HeaderMap, body: Bytes| async move {
            let get = |name: &str| {
                headers
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_owned()
            };
            let json = serde_json::json!({
                "port": port,
                "host": get("host"),
                "x-hop": get("x-hop"),
                "proxy-authorization": get("proxy-authorization"),
                "body": String::from_utf8_lossy(&body),
            });
            (
                [("x-hop", "1"), ("connection", "x-hop"), ("x-kept", "yes")],
                json.to_string(),
            )
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    InstanceKey::new("127.0.0.1", port, "")
}

async fn dead_port() -> InstanceKey {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    InstanceKey::new("127.0.0.1", port, "")
}

fn view(revision: u64, keys: &[&InstanceKey]) -> Arc<View> {
    Arc::new(View {
        revision,
        instances: keys.iter().map(|k| Instance::new((*k).clone())).collect(),
        protection_triggered: false,
    })
}

fn proxy_over(
    views: Vec<(ServiceKey, watch::Receiver<Arc<View>>)>,
    tweak: impl FnOnce(&mut Routing),
) -> Proxy {
    let config = Config::from_overrides(&Overrides::default()).unwrap();
    let mut routing = (*config.routing).clone();
    tweak(&mut routing);
    Proxy::new(
        Source::Views(views),
        Arc::new(routing),
        ProxyMetrics::default(),
        OutlierMetrics::default(),
        AttemptMetrics::default(),
    )
}

fn request(method: Method, uri: &str, body: &'static str) -> Request<Full<Bytes>> {
    Request::builder()
        .method(method)
        .uri(uri)
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap()
}

async fn json(response: Response<ProxyBody>) -> serde_json::Value {
    let body = response.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&body).unwrap_or_else(|_| panic!("JSON: {body:?}"))
}

fn code(response: &Response<ProxyBody>) -> &str {
    response.headers()[crate::error::ERROR_HEADER]
        .to_str()
        .unwrap()
}

#[tokio::test]
async fn both_request_forms_reach_an_instance_without_hop_by_hop_headers() {
    let a = backend().await;
    let (_tx, rx) = watch::channel(view(1, &[&a]));
    let proxy = proxy_over(vec![(ServiceKey::named("orders"), rx)], |_| {});

    let mut absolute = request(Method::POST, "http://orders/x?q=1", "hello");
    let headers = absolute.headers_mut();
    headers.insert("host", HeaderValue::from_static("orders"));
    headers.insert("connection", HeaderValue::from_static("x-hop"));
    headers.insert("x-hop", HeaderValue::from_static("secret"));
    headers.insert("proxy-authorization", HeaderValue::from_static("Basic x"));
    let answer = proxy.handle(absolute).await;
    assert_eq!(answer.status(), 200);
    assert_eq!(answer.headers()[ATTEMPTS_HEADER], "1");
    assert_eq!(answer.headers()["x-kept"], "yes");
    assert!(
        answer.headers().get("x-hop").is_none(),
        "named by Connection"
    );
    assert!(answer.headers().get("connection").is_none());
    let body = json(answer).await;
    assert_eq!(body["port"], a.port);
    assert_eq!(body["host"], "orders", "Host is kept");
    assert_eq!(body["x-hop"], "", "hop-by-hop not forwarded");
    assert_eq!(body["proxy-authorization"], "");
    assert_eq!(body["body"], "hello");

    let mut origin = request(Method::GET, "/x", "");
    origin
        .headers_mut()
        .insert("host", HeaderValue::from_static("orders:15001"));
    let answer = proxy.handle(origin).await;
    assert_eq!(answer.status(), 200);
    assert_eq!(json(answer).await["host"], "orders:15001");
}

#[tokio::test]
async fn unknown_services_empty_views_and_bad_hosts_are_json_errors() {
    let (_never, rx0) = watch::channel(view(0, &[]));
    let (_empty, rx1) = watch::channel(view(4, &[]));
    let proxy = proxy_over(
        vec![
            (ServiceKey::named("fresh"), rx0),
            (ServiceKey::named("empty"), rx1),
        ],
        |_| {},
    );
    for (uri, status, expected) in [
        ("http://nowhere/x", 503, "unknown_service"),
        ("http://fresh/x", 503, "unknown_service"),
        ("http://empty/x", 503, "no_instance"),
        ("http://127.0.0.1/x", 400, "bad_host"),
        ("/x", 400, "bad_host"),
    ] {
        let answer = proxy.handle(request(Method::GET, uri, "")).await;
        assert_eq!(answer.status(), status, "{uri}");
        assert_eq!(code(&answer), expected, "{uri}");
        let body = json(answer).await;
        assert_eq!(body["error"], expected);
        if status == 503 {
            let name = uri.trim_start_matches("http://").trim_end_matches("/x");
            assert_eq!(body["service"]["name"], name, "{body}");
        }
    }
    let connect = proxy
        .handle(request(Method::CONNECT, "http://empty:443", ""))
        .await;
    assert_eq!(connect.status(), 501);
}

#[tokio::test]
async fn an_absolute_target_is_the_host_two_hosts_and_https_are_refused() {
    let a = backend().await;
    let (_tx, rx) = watch::channel(view(1, &[&a]));
    let proxy = proxy_over(vec![(ServiceKey::named("orders"), rx)], |_| {});

    // Absolute-form: the authority routes and is the Host the instance sees (RFC 9112
    // §3.2.2), whatever Host header the client sent.
    let mut absolute = request(Method::GET, "http://orders:8080/x", "");
    absolute
        .headers_mut()
        .insert("host", HeaderValue::from_static("payments"));
    let answer = proxy.handle(absolute).await;
    assert_eq!(answer.status(), 200);
    assert_eq!(json(answer).await["host"], "orders:8080");

    let mut twice = request(Method::GET, "/x", "");
    twice
        .headers_mut()
        .append("host", HeaderValue::from_static("orders"));
    twice
        .headers_mut()
        .append("host", HeaderValue::from_static("orders"));
    let answer = proxy.handle(twice).await;
    assert_eq!(answer.status(), 400);
    assert_eq!(code(&answer), "bad_host");
    let body = json(answer).await;
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("more than one Host"),
        "{body}"
    );

    let answer = proxy
        .handle(request(Method::GET, "https://orders/x", ""))
        .await;
    assert_eq!(answer.status(), 400);
    assert_eq!(code(&answer), "unsupported_scheme");
    let body = json(answer).await;
    assert!(
        body["message"].as_str().unwrap().starts_with("https://"),
        "{body}"
    );
}

#[tokio::test]
async fn request_bodies_above_the_limit_get_413_and_reach_no_instance() {
    let a = backend().await;
    let (_tx, rx) = watch::channel(view(1, &[&a]));
    let proxy = proxy_over(vec![(ServiceKey::named("orders"), rx)], |r| {
        r.max_request_body = 4
    });
    let answer = proxy
        .handle(request(Method::POST, "http://orders/x", "12345"))
        .await;
    assert_eq!(answer.status(), 413);
    assert_eq!(code(&answer), "body_too_large");
    let answer = proxy
        .handle(request(Method::POST, "http://orders/x", "1234"))
        .await;
    assert_eq!(answer.status(), 200);
}

#[tokio::test]
async fn a_refused_connection_is_retried_on_another_instance_even_for_post() {
    let live = backend().await;
    let dead = dead_port().await;
    let (_tx, rx) = watch::channel(view(1, &[&dead, &live]));
    let proxy = proxy_over(vec![(ServiceKey::named("orders"), rx)], |_| {});
    for _ in 0..4 {
        let answer = proxy
            .handle(request(Method::POST, "http://orders/x", "b"))
            .await;
        assert_eq!(answer.status(), 200);
        assert_eq!(json(answer).await["port"], live.port);
    }
    let route = proxy.route_of(&ServiceKey::named("orders")).unwrap();
    let state = route.state().unwrap();
    assert_eq!(state.budget.requests, 4);
    // Round robin's counter also moves on the retry, so each request starts on the dead
    // port (until 5 refusals in a row eject it).
    assert_eq!(state.budget.retries, 4);
    assert_eq!(state.ejected.len(), 0, "4 refusals: not ejected yet");
}

#[tokio::test]
async fn at_most_max_services_are_routed() {
    let proxy = proxy_over(vec![], |r| r.max_services = 1);
    let first = proxy.handle(request(Method::GET, "http://a/x", "")).await;
    assert_eq!(code(&first), "unknown_service");
    let second = proxy.handle(request(Method::GET, "http://b/x", "")).await;
    assert_eq!(second.status(), 503);
    assert_eq!(code(&second), "too_many_services");
    let again = proxy.handle(request(Method::GET, "http://a/x", "")).await;
    assert_eq!(code(&again), "unknown_service");
}

#[tokio::test]
async fn a_reload_keeps_pipelines_whose_settings_did_not_change() {
    let a = backend().await;
    let (_tx, rx) = watch::channel(view(1, &[&a]));
    let proxy = proxy_over(vec![(ServiceKey::named("orders"), rx)], |_| {});
    let get = || request(Method::GET, "http://orders/x", "");
    assert_eq!(proxy.handle(get()).await.status(), 200);
    let before = proxy.route_of(&ServiceKey::named("orders")).unwrap();
    // Same values in new allocations: the same pipeline.
    let same = Config::from_overrides(&Overrides::default()).unwrap();
    proxy.set_routing(same.routing);
    assert_eq!(proxy.handle(get()).await.status(), 200);
    let after = proxy.route_of(&ServiceKey::named("orders")).unwrap();
    assert!(Arc::ptr_eq(&before, &after));
    // Changed settings: a new pipeline.
    let mut changed = (*proxy.routing()).clone();
    let mut defaults = (*changed.defaults).clone();
    defaults.retry.max_attempts = 3;
    changed.defaults = Arc::new(defaults);
    proxy.set_routing(Arc::new(changed));
    assert_eq!(proxy.handle(get()).await.status(), 200);
    let rebuilt = proxy.route_of(&ServiceKey::named("orders")).unwrap();
    assert!(!Arc::ptr_eq(&before, &rebuilt));
    assert_eq!(rebuilt.settings.retry.max_attempts, 3);
}

/// A body trickled in (one byte, then nothing) is answered 408 at the body read timeout and
/// reaches no instance.
#[tokio::test(start_paused = true)]
async fn a_trickled_body_gets_408_at_the_body_read_timeout() {
    let dead = dead_port().await;
    let (_tx, rx) = watch::channel(view(1, &[&dead]));
    let proxy = proxy_over(vec![(ServiceKey::named("orders"), rx)], |_| {});
    let first = one_chunk_then_nothing(Bytes::from_static(b"x"));
    let body = http_body_util::StreamBody::new(first);
    let trickled = Request::builder()
        .method(Method::POST)
        .uri("http://orders/x")
        .header("content-length", "100000")
        .body(body)
        .unwrap();
    let started = Instant::now();
    let answer = proxy.handle(trickled).await;
    assert_eq!(answer.status(), 408);
    assert_eq!(code(&answer), "request_timeout");
    assert_eq!(started.elapsed(), BODY_READ_TIMEOUT);
}

/// One frame, then a body that never ends.
fn one_chunk_then_nothing(
    chunk: Bytes,
) -> impl futures::Stream<Item = Result<http_body::Frame<Bytes>, std::convert::Infallible>> {
    use futures::StreamExt;
    futures::stream::once(async move { Ok(http_body::Frame::data(chunk)) })
        .chain(futures::stream::pending())
}
