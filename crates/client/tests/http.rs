//! The HTTP client's pipeline against real sockets on 127.0.0.1: backends are tiny axum
//! servers, views come from a watch channel (`HttpClient::from_views`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::routing::{get, post};
use gangway_client::http::{HttpClient, HttpConfig, HttpRequest, RequestError};
use gangway_client::outlier::OutlierConfig;
use gangway_client::retry::RetryConfig;
use gangway_core::model::{Instance, InstanceKey, ServiceKey};
use gangway_core::view::View;
use tokio::sync::watch;

async fn backend(status: u16, hits: Arc<AtomicUsize>) -> InstanceKey {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let handler = move || {
        let hits = hits.clone();
        async move {
            hits.fetch_add(1, Ordering::Relaxed);
            (axum::http::StatusCode::from_u16(status).unwrap(), "hi")
        }
    };
    let app = Router::new()
        .route("/x", get(handler.clone()))
        .route("/x", post(handler));
    tokio::spawn(async move { axum::serve(listener, app).await });
    InstanceKey::new("127.0.0.1", port, "")
}

/// A port with nothing listening (bound, then released).
async fn dead_port() -> InstanceKey {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    InstanceKey::new("127.0.0.1", port, "")
}

fn view(keys: &[&InstanceKey]) -> View {
    View {
        revision: 1,
        instances: keys.iter().map(|k| Instance::new((*k).clone())).collect(),
        protection_triggered: false,
    }
}

fn client(keys: &[&InstanceKey], config: HttpConfig) -> (HttpClient, watch::Sender<Arc<View>>) {
    let (tx, rx) = watch::channel(Arc::new(view(keys)));
    (
        HttpClient::from_views(vec![(ServiceKey::named("svc"), rx)], config).unwrap(),
        tx,
    )
}

#[tokio::test]
async fn a_dead_instance_is_retried_elsewhere_then_ejected() {
    let hits = Arc::new(AtomicUsize::new(0));
    let live = backend(200, hits.clone()).await;
    let dead = dead_port().await;
    // Ratio 0.5 of 2 instances: one may be ejected; 3 consecutive connect failures eject.
    let mut outlier = OutlierConfig::default().with_max_ejection_ratio(0.5);
    outlier.consecutive_failures = 3;
    let (http, _tx) = client(
        &[&dead, &live],
        HttpConfig::default().with_outlier(Some(outlier)),
    );
    let mut attempts = Vec::new();
    for _ in 0..20 {
        let r = http.get("http://svc/x").await.expect("answered");
        assert_eq!(r.status, 200);
        assert_eq!(r.instance, live);
        attempts.push(r.attempts);
    }
    // Round robin sends every other request to the dead one until it is ejected.
    assert_eq!(
        attempts.iter().filter(|a| **a == 2).count(),
        3,
        "{attempts:?}"
    );
    assert_eq!(http.ejected("svc").await, vec![dead]);
    assert_eq!(hits.load(Ordering::Relaxed), 20);
}

#[tokio::test]
async fn post_is_not_retried_after_a_503_but_get_is() {
    let (bad_hits, good_hits) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let bad = backend(503, bad_hits.clone()).await;
    let good = backend(200, good_hits.clone()).await;
    let (http, _tx) = client(&[&bad, &good], HttpConfig::default().with_outlier(None));
    let get = http.get("http://svc/x").await.unwrap();
    assert_eq!(
        (get.status.as_u16(), get.attempts),
        (200, 2),
        "GET retried on the other instance"
    );
    // Round robin now points at `good` then `bad`; send one GET to move it back to `bad`.
    let _ = http.get("http://svc/x").await.unwrap();
    let post = http
        .send(HttpRequest::new(http::Method::POST, "http://svc/x"))
        .await
        .unwrap();
    assert_eq!(
        (post.status.as_u16(), post.attempts),
        (503, 1),
        "POST answered 503 is returned as is"
    );
    let marked = http
        .send(HttpRequest::new(http::Method::POST, "http://svc/x").idempotent(true))
        .await
        .unwrap();
    assert_eq!(marked.status.as_u16(), 200);
}

#[tokio::test]
async fn no_retry_means_one_attempt_and_the_connect_failure() {
    let dead = dead_port().await;
    let (http, _tx) = client(
        &[&dead],
        HttpConfig::default()
            .with_retry(RetryConfig::disabled())
            .with_outlier(None),
    );
    match http.get("http://svc/x").await {
        Err(RequestError::Failed {
            failure,
            attempts,
            instance,
            ..
        }) => {
            assert!(failure.is_connect());
            assert_eq!((attempts, instance), (1, dead));
        }
        other => panic!("expected a connect failure, got {other:?}"),
    }
}

#[tokio::test]
async fn an_instance_that_leaves_the_view_loses_its_pool() {
    let hits = Arc::new(AtomicUsize::new(0));
    let a = backend(200, hits.clone()).await;
    let b = backend(200, hits.clone()).await;
    let (http, tx) = client(&[&a, &b], HttpConfig::default());
    for _ in 0..4 {
        http.get("http://svc/x").await.unwrap();
    }
    let mut pooled = http.pooled("svc").await;
    pooled.sort();
    let mut both = vec![a.clone(), b.clone()];
    both.sort();
    assert_eq!(pooled, both);
    tx.send_replace(Arc::new(view(&[&b])));
    // The pool follows the view (a background task): poll with a deadline.
    let only_b = gangway_testkit::poll(std::time::Duration::from_secs(5), || async {
        (http.pooled("svc").await == vec![b.clone()]).then_some(())
    })
    .await;
    assert!(only_b.is_some(), "pool of the removed instance kept");
    for _ in 0..4 {
        assert_eq!(http.get("http://svc/x").await.unwrap().instance, b);
    }
}

#[tokio::test]
async fn bad_urls_unknown_services_and_empty_views_are_clear_errors() {
    let (http, _tx) = client(&[], HttpConfig::default());
    assert!(matches!(
        http.get("https://svc/x").await,
        Err(RequestError::InvalidUrl { .. })
    ));
    assert!(matches!(
        http.get("http://other/x").await,
        Err(RequestError::Resolve { .. })
    ));
    assert!(matches!(
        http.get("http://svc/x").await,
        Err(RequestError::NoInstance { .. })
    ));
    let bad = HttpConfig::default().with_retry(RetryConfig::default().with_max_attempts(0));
    assert!(HttpClient::from_views(vec![], bad).is_err());
}

#[tokio::test]
async fn attempts_are_counted_per_instance_and_the_state_shows_ejections_and_budget() {
    use gangway_client::http::AttemptMetrics;
    use gangway_client::outlier::{EjectionReason, Outcome};

    let hits = Arc::new(AtomicUsize::new(0));
    let live = backend(200, hits.clone()).await;
    let dead = dead_port().await;
    let mut outlier = OutlierConfig::default().with_max_ejection_ratio(0.5);
    outlier.consecutive_failures = 2;
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = AttemptMetrics::register(&mut registry);
    let ejections = gangway_client::outlier::OutlierMetrics::register(&mut registry);
    let (http, _tx) = client(
        &[&dead, &live],
        HttpConfig::default().with_outlier(Some(outlier)),
    );
    // Set after from_views: the pipeline is built on first use, so both count.
    let http = http
        .with_attempt_metrics(metrics.clone())
        .with_outlier_metrics(ejections);
    assert!(http.state("svc").is_none(), "built on first use");
    for _ in 0..6 {
        assert_eq!(http.get("http://svc/x").await.unwrap().status, 200);
    }
    let service = ServiceKey::named("svc").to_string();
    assert_eq!(metrics.count(&service, &live, Outcome::Success), 6);
    assert_eq!(
        metrics.count(&service, &dead, Outcome::ConnectFailure),
        2,
        "two connect failures, then ejected"
    );
    assert!(http.state("other").is_none());
    let state = http.state("svc").unwrap();
    assert_eq!(state.view.revision, 1);
    assert_eq!(state.ejected.len(), 1);
    assert_eq!(state.ejected[0].0, dead);
    assert_eq!(state.ejected[0].1.reason, EjectionReason::Consecutive);
    assert_eq!((state.budget.requests, state.budget.retries), (6, 2));
    assert_eq!(state.budget.refused, 0);
    assert_eq!(
        state.pooled,
        vec![live.clone()],
        "the ejected instance lost its pool"
    );
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains("gangway_http_attempts_total{service=\"public/DEFAULT_GROUP/svc\""),
        "{text}"
    );
    assert!(
        text.contains(
            "gangway_outlier_ejections_total{service=\"public/DEFAULT_GROUP/svc\",reason=\"consecutive\"} 1"
        ),
        "{text}"
    );
    assert_eq!(http.states().len(), 1);
}

#[tokio::test]
async fn a_streamed_answer_returns_its_head_before_the_body_ends() {
    use http_body_util::BodyExt;
    use tokio::sync::mpsc;

    // The backend's body is fed by the test: the second chunk only once the head was seen.
    let (chunks_tx, chunks_rx) = mpsc::channel::<Result<bytes::Bytes, std::io::Error>>(4);
    let chunks = Arc::new(std::sync::Mutex::new(Some(chunks_rx)));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let app =
        Router::new().route(
            "/x",
            get(move || {
                let rx = chunks.lock().unwrap().take().expect("one request");
                async move {
                    axum::body::Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
                }
            }),
        );
    tokio::spawn(async move { axum::serve(listener, app).await });
    let key = InstanceKey::new("127.0.0.1", port, "");
    let (http, _tx) = client(&[&key], HttpConfig::default());
    chunks_tx
        .send(Ok(bytes::Bytes::from_static(b"first ")))
        .await
        .unwrap();
    let answer = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        http.send_streaming(HttpRequest::new(http::Method::GET, "http://svc/x")),
    )
    .await
    .expect("the head came before the body's end")
    .unwrap();
    assert_eq!((answer.status.as_u16(), answer.attempts), (200, 1));
    chunks_tx
        .send(Ok(bytes::Bytes::from_static(b"second")))
        .await
        .unwrap();
    drop(chunks_tx);
    let body = answer.body.collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"first second");
}
