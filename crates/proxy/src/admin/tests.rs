//! The admin router without sockets (tower `oneshot`), over a proxy on fixed views.

use std::sync::Arc;

use axum::body::Body;
use bytes::Bytes;
use gangway_client::http::AttemptMetrics;
use gangway_client::outlier::OutlierMetrics;
use gangway_core::model::{Instance, InstanceKey, ServiceKey};
use gangway_core::view::View;
use http_body_util::{BodyExt, Full};
use tower::ServiceExt;

use super::*;
use crate::config::{Config, Overrides};
use crate::metrics::ProxyMetrics;
use crate::proxy::Source;

async fn backend() -> InstanceKey {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let app = Router::new().route("/x", get(|| async { "ok" }));
    tokio::spawn(async move { axum::serve(listener, app).await });
    InstanceKey::new("127.0.0.1", port, "")
}

async fn dead_port() -> InstanceKey {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    InstanceKey::new("127.0.0.1", port, "")
}

struct Fixture {
    app: Router,
    proxy: Proxy,
    shutting_down: Arc<AtomicBool>,
    reloads: Arc<Reloads>,
    _views: tokio::sync::watch::Sender<Arc<View>>,
}

/// A proxy whose `orders` has a live and a dead instance; 2 refusals in a row eject, and
/// 2 instances x 0.5 allow one ejection.
async fn fixture() -> (Fixture, InstanceKey, InstanceKey) {
    let (live, dead) = (backend().await, dead_port().await);
    let view = View {
        revision: 7,
        instances: vec![Instance::new(dead.clone()), Instance::new(live.clone())],
        protection_triggered: false,
    };
    let (tx, rx) = tokio::sync::watch::channel(Arc::new(view));
    let config = Config::from_overrides(&Overrides::default()).unwrap();
    let mut routing = (*config.routing).clone();
    let mut defaults = (*routing.defaults).clone();
    let outlier = defaults.outlier.as_mut().unwrap();
    outlier.consecutive_failures = 2;
    outlier.max_ejection_ratio = 0.5;
    routing.defaults = Arc::new(defaults);
    let mut registry = Registry::default();
    let proxy = Proxy::new(
        Source::Views(vec![(ServiceKey::named("orders"), rx)]),
        Arc::new(routing),
        ProxyMetrics::register(&mut registry),
        OutlierMetrics::register(&mut registry),
        AttemptMetrics::register(&mut registry),
    );
    let shutting_down = Arc::new(AtomicBool::new(false));
    let reloads = Arc::new(Reloads::new(Some(std::path::Path::new("/etc/proxy.toml"))));
    let app = router(AdminState {
        proxy: proxy.clone(),
        registry: Arc::new(registry),
        reloads: reloads.clone(),
        shutting_down: shutting_down.clone(),
    });
    let f = Fixture {
        app,
        proxy,
        shutting_down,
        reloads,
        _views: tx,
    };
    (f, live, dead)
}

async fn get_json(app: &Router, path: &str) -> (StatusCode, Value) {
    let (status, body) = get_text(app, path).await;
    let json = serde_json::from_str(&body).unwrap_or_else(|_| panic!("{path}: {body}"));
    (status, json)
}

async fn get_text(app: &Router, path: &str) -> (StatusCode, String) {
    let request = http::Request::get(path).body(Body::empty()).unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

async fn send(proxy: &Proxy, n: usize) {
    for _ in 0..n {
        let request = http::Request::get("http://orders/x")
            .body(Full::new(Bytes::new()))
            .unwrap();
        assert_eq!(proxy.handle(request).await.status(), 200);
    }
}

#[tokio::test]
async fn a_service_shows_its_view_ejections_budget_and_counts() {
    let (f, live, dead) = fixture().await;
    let (status, _) = get_json(&f.app, "/services/orders").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "not routed yet");
    send(&f.proxy, 6).await;

    let (status, list) = get_json(&f.app, "/services").await;
    assert_eq!(status, StatusCode::OK);
    let row = &list["services"][0];
    assert_eq!(row["service"]["name"], "orders");
    assert_eq!(
        (&row["revision"], &row["instances"], &row["ejected"]),
        (&json!(7), &json!(2), &json!(1))
    );

    let (_, detail) = get_json(&f.app, "/services/orders").await;
    assert_eq!(detail["revision"], 7);
    let ejected = detail["ejected"].as_array().unwrap();
    assert_eq!(ejected.len(), 1);
    assert_eq!(ejected[0]["instance"], dead.addr().as_str());
    assert_eq!(ejected[0]["reason"], "consecutive");
    assert!(ejected[0]["next_check_in_ms"].as_u64().unwrap() <= 30_000);
    let instance = |key: &InstanceKey| {
        detail["instances"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["instance"] == key.addr().as_str())
            .cloned()
            .unwrap()
    };
    let d = instance(&dead);
    assert_eq!((&d["requests"], &d["errors"]), (&json!(2), &json!(2)));
    assert_eq!(d["outcomes"]["connect_failure"], 2);
    assert_eq!(d["ejected"], true);
    let l = instance(&live);
    assert_eq!((&l["requests"], &l["errors"]), (&json!(6), &json!(0)));
    assert_eq!(l["pooled"], true);
    assert_eq!(detail["retry_budget"]["requests"], 6);
    assert_eq!(detail["retry_budget"]["retries"], 2);
    assert_eq!(detail["settings"]["balancer"], "round-robin");
    assert_eq!(detail["settings"]["retry"]["retry_ratio"], 0.2);

    // The same service named in full; a host that names none.
    let (status, _) = get_json(&f.app, "/services/orders.DEFAULT_GROUP.public").await;
    assert_eq!(status, StatusCode::OK);
    let (status, bad) = get_json(&f.app, "/services/a.b.c.d").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(bad["error"], "bad_host");
}

#[tokio::test]
async fn metrics_config_and_readiness() {
    let (f, _, _) = fixture().await;
    send(&f.proxy, 3).await;
    let (status, text) = get_text(&f.app, "/metrics").await;
    assert_eq!(status, StatusCode::OK);
    for series in [
        "gangway_proxy_requests_total{service=\"public/DEFAULT_GROUP/orders\",status=\"200\"} 3",
        "gangway_http_attempts_total{",
        "gangway_outlier_ejections_total{service=\"public/DEFAULT_GROUP/orders\",reason=\"consecutive\"} 1",
        "gangway_proxy_request_duration_seconds_count{service=\"public/DEFAULT_GROUP/orders\"} 3",
    ] {
        assert!(text.contains(series), "{series} missing:\n{text}");
    }

    f.reloads
        .record(Some("proxy.toml: services.x.balancer: bad".into()));
    f.reloads.record(None);
    let (_, config) = get_json(&f.app, "/config").await;
    assert_eq!(config["file"], "/etc/proxy.toml");
    assert_eq!(
        (&config["reloads"], &config["reload_failures"]),
        (&json!(1), &json!(1))
    );
    assert_eq!(
        config["last_reload_error"],
        "proxy.toml: services.x.balancer: bad"
    );
    assert_eq!(config["defaults"]["outlier"]["consecutive_failures"], 2);
    assert_eq!(config["max_request_body"], 1 << 20);

    assert_eq!(get_text(&f.app, "/ready").await.0, StatusCode::OK);
    f.shutting_down.store(true, Ordering::Relaxed);
    assert_eq!(
        get_text(&f.app, "/ready").await,
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down".to_owned())
    );
}
