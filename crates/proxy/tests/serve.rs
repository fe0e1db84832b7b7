//! The proxy listener on a real socket (127.0.0.1, ephemeral ports) over fixed views: HTTP/1.1
//! in both request forms, h2c on the same port, and the drain when `shutdown` turns true.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use bytes::Bytes;
use gangway_core::model::{Instance, InstanceKey, ServiceKey};
use gangway_core::view::View;
use gangway_proxy::config::{Config, Overrides};
use gangway_proxy::metrics::ProxyMetrics;
use gangway_proxy::{Proxy, Source};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};

/// An instance whose GET /slow says it `arrived`, then answers once `release` fires; GET
/// /ping answers at once.
async fn backend(release: oneshot::Receiver<()>, arrived: oneshot::Sender<()>) -> InstanceKey {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let release = Arc::new(tokio::sync::Mutex::new(Some((release, arrived))));
    let app = Router::new()
        .route("/ping", get(|| async { "pong" }))
        .route(
            "/slow",
            get(move || {
                let release = release.clone();
                async move {
                    if let Some((release, arrived)) = release.lock().await.take() {
                        let _ = arrived.send(());
                        let _ = release.await;
                    }
                    "slow pong"
                }
            }),
        );
    tokio::spawn(async move { axum::serve(listener, app).await });
    InstanceKey::new("127.0.0.1", port, "")
}

struct Running {
    addr: String,
    stop: watch::Sender<bool>,
    served: tokio::task::JoinHandle<usize>,
    release: Option<oneshot::Sender<()>>,
    arrived: Option<oneshot::Receiver<()>>,
}

/// The [`backend`]'s `release` and `arrived` ends and a view of `orders` holding it, which
/// never changes.
async fn slow_orders() -> (
    oneshot::Sender<()>,
    oneshot::Receiver<()>,
    watch::Receiver<Arc<View>>,
) {
    let (release, release_rx) = oneshot::channel();
    let (arrived_tx, arrived) = oneshot::channel();
    let key = backend(release_rx, arrived_tx).await;
    let view = View {
        revision: 1,
        instances: vec![Instance::new(key)],
        protection_triggered: false,
    };
    let (tx, rx) = watch::channel(Arc::new(view));
    std::mem::forget(tx); // the view never changes
    (release, arrived, rx)
}

async fn start() -> Running {
    let (release, arrived, rx) = slow_orders().await;
    let config = Config::from_overrides(&Overrides::default()).unwrap();
    let proxy = Proxy::new(
        Source::Views(vec![(ServiceKey::named("orders"), rx)]),
        config.routing.clone(),
        ProxyMetrics::default(),
        Default::default(),
        Default::default(),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (stop, stop_rx) = watch::channel(false);
    let served = tokio::spawn(gangway_proxy::server::serve(
        listener,
        proxy,
        16,
        stop_rx,
        Duration::from_secs(10),
    ));
    Running {
        addr,
        stop,
        served,
        release: Some(release),
        arrived: Some(arrived),
    }
}

#[tokio::test]
async fn http1_in_both_forms_and_h2c_on_one_port() {
    let running = start().await;
    let via_proxy = reqwest::Client::builder()
        .proxy(reqwest::Proxy::http(format!("http://{}", running.addr)).unwrap())
        .build()
        .unwrap();
    let r = via_proxy.get("http://orders/ping").send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-gangway-attempts"], "1");
    assert_eq!(r.text().await.unwrap(), "pong");

    let host_form = reqwest::Client::new()
        .get(format!("http://{}/ping", running.addr))
        .header("host", "orders")
        .send()
        .await
        .unwrap();
    assert_eq!(host_form.text().await.unwrap(), "pong");

    // h2c with prior knowledge: :authority names the service, the TCP connection the proxy.
    let tcp = tokio::net::TcpStream::connect(&running.addr).await.unwrap();
    let (mut h2c, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(connection);
    let request = http::Request::get("http://orders/ping")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let answer = h2c.send_request(request).await.unwrap();
    assert_eq!(answer.version(), http::Version::HTTP_2);
    assert_eq!(answer.status(), 200);
    assert_eq!(answer.headers()["x-gangway-attempts"], "1");
    let body = answer.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"pong");

    let unknown = via_proxy.get("http://nowhere/ping").send().await.unwrap();
    assert_eq!(unknown.status(), 503);
    assert_eq!(unknown.headers()["x-gangway-error"], "unknown_service");
}

#[tokio::test]
async fn shutdown_closes_the_listener_and_finishes_the_request_in_flight() {
    let mut running = start().await;
    let url = format!("http://{}/slow", running.addr);
    let in_flight = tokio::spawn(async move {
        reqwest::Client::new()
            .get(url)
            .header("host", "orders")
            .send()
            .await?
            .text()
            .await
    });
    tokio::time::timeout(Duration::from_secs(10), running.arrived.take().unwrap())
        .await
        .expect("the request reached the instance")
        .unwrap();
    running.stop.send(true).unwrap();
    // The listener closes at once; the request in flight still gets its answer.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while tokio::net::TcpStream::connect(&running.addr).await.is_ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the listener kept accepting"
        );
        tokio::task::yield_now().await;
    }
    assert!(
        !in_flight.is_finished(),
        "the slow request is still in flight"
    );
    running.release.take().unwrap().send(()).unwrap();
    assert_eq!(in_flight.await.unwrap().unwrap(), "slow pong");
    let cut = tokio::time::timeout(Duration::from_secs(10), running.served)
        .await
        .expect("serve returned after the drain")
        .unwrap();
    assert_eq!(cut, 0, "no connection was cut");
}

/// A config listening on ephemeral loopback ports, the admin port included.
fn ephemeral() -> Config {
    let mut overrides = Overrides::default();
    overrides.listen = Some("127.0.0.1:0".parse().unwrap());
    overrides.admin = Some(Some("127.0.0.1:0".parse().unwrap()));
    Config::from_overrides(&overrides).unwrap()
}

/// The proxy over `source`, listening as [`ephemeral`] says, admin port included.
async fn listening(source: Source) -> gangway_proxy::server::Running {
    let config = ephemeral();
    let proxy = Proxy::new(
        source,
        config.routing.clone(),
        ProxyMetrics::default(),
        Default::default(),
        Default::default(),
    );
    gangway_proxy::server::Running::start(&config, proxy, Default::default(), Default::default())
        .await
        .expect("the listeners bind")
}

/// A port nothing listens on.
async fn dead_port() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap().to_string()
}

#[tokio::test]
async fn a_proxy_started_before_its_registry_serves_503_and_is_not_ready() {
    let registry = dead_port().await;
    let client = gangway_client::Client::start(gangway_client::ClientConfig::new(registry))
        .expect("a valid config");
    let running = listening(Source::Registry(client.clone())).await;
    let via_proxy = reqwest::Client::builder()
        .proxy(reqwest::Proxy::http(format!("http://{}", running.listen)).unwrap())
        .build()
        .unwrap();
    let started = tokio::time::Instant::now();
    let answer = via_proxy.get("http://orders/ping").send().await.unwrap();
    let took = started.elapsed();
    assert_eq!(answer.status(), 503);
    assert_eq!(answer.headers()["x-gangway-error"], "registry_unavailable");
    let body: serde_json::Value = answer.json().await.unwrap();
    println!("no registry yet: 503 in {took:?} {body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("no session with the registry"),
        "{body}"
    );
    assert!(took < Duration::from_secs(1), "answered at once: {took:?}");
    let admin = running.admin.unwrap();
    let ready = reqwest::get(format!("http://{admin}/ready")).await.unwrap();
    assert_eq!(ready.status(), 503);
    assert_eq!(running.stop(|| client.close()).await, 0);
}

#[tokio::test]
async fn the_admin_port_answers_ready_503_until_the_drain_ends() {
    let (release, arrived, rx) = slow_orders().await;
    let running = listening(Source::Views(vec![(ServiceKey::named("orders"), rx)])).await;
    let (listen, admin) = (running.listen, running.admin.unwrap());
    let ready = || async move {
        reqwest::get(format!("http://{admin}/ready"))
            .await
            .map(|r| r.status().as_u16())
    };
    assert_eq!(ready().await.unwrap(), 200);
    let in_flight = tokio::spawn(async move {
        reqwest::Client::new()
            .get(format!("http://{listen}/slow"))
            .header("host", "orders")
            .send()
            .await?
            .text()
            .await
    });
    tokio::time::timeout(Duration::from_secs(10), arrived)
        .await
        .expect("the request reached the instance")
        .unwrap();
    let (admin_closed_tx, admin_closed) = oneshot::channel();
    let stopping = tokio::spawn(running.stop(move || {
        let _ = admin_closed_tx.send(());
    }));
    // While the request drains, the admin port stays up and says not ready.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        match ready().await {
            Ok(503) => break,
            Ok(200) => {}
            other => panic!("the admin port must answer during the drain: {other:?}"),
        }
        assert!(tokio::time::Instant::now() < deadline, "/ready stayed 200");
        tokio::task::yield_now().await;
    }
    assert!(!in_flight.is_finished());
    assert_eq!(ready().await.unwrap(), 503, "still up, still not ready");
    release.send(()).unwrap();
    assert_eq!(in_flight.await.unwrap().unwrap(), "slow pong");
    let cut = tokio::time::timeout(Duration::from_secs(10), stopping)
        .await
        .expect("the drain ended")
        .unwrap();
    assert_eq!(cut, 0);
    admin_closed
        .await
        .expect("the admin port closed after the drain");
    assert!(ready().await.is_err(), "the admin port is closed at exit");
}
