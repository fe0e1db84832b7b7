use std::convert::Infallible;
use std::time::Duration;

use http::{Request, Response, Version};
use tokio::sync::oneshot;
use tower::{Layer, Service, ServiceExt};

use super::*;

fn app() -> impl Service<Request<()>, Response = Response<&'static str>, Error = Infallible> + Clone
{
    tower::service_fn(|_: Request<()>| async { Ok::<_, Infallible>(Response::new("pong")) })
}

fn request(version: Version) -> Request<()> {
    let mut r = Request::new(());
    *r.version_mut() = version;
    r
}

#[tokio::test]
async fn unmarked_until_the_drain_starts_then_marked_for_good() {
    let signal = DrainSignal::new();
    let svc = DrainingLayer::new(signal.clone()).layer(app());
    let before = svc
        .clone()
        .oneshot(request(Version::HTTP_11))
        .await
        .unwrap();
    assert!(before.headers().is_empty(), "{:?}", before.headers());
    assert!(!signal.is_draining());
    signal.start();
    signal.start(); // idempotent
    assert!(signal.is_draining());
    let after = svc.oneshot(request(Version::HTTP_11)).await.unwrap();
    assert_eq!(after.headers()["x-gangway-draining"], "1");
    assert_eq!(after.headers()["connection"], "close");
    assert_eq!(*after.body(), "pong");
}

#[tokio::test]
async fn http2_responses_get_the_header_but_no_connection_close() {
    let signal = DrainSignal::new();
    signal.start();
    let svc = DrainingLayer::new(signal).layer(app());
    let r = svc.oneshot(request(Version::HTTP_2)).await.unwrap();
    assert_eq!(r.headers()["x-gangway-draining"], "1");
    assert!(r.headers().get("connection").is_none());
}

#[tokio::test]
async fn a_request_answered_after_the_drain_started_is_marked() {
    let signal = DrainSignal::new();
    let (release_tx, release_rx) = oneshot::channel::<()>();
    let release_rx = std::sync::Arc::new(tokio::sync::Mutex::new(Some(release_rx)));
    let slow = tower::service_fn(move |_: Request<()>| {
        let release_rx = release_rx.clone();
        async move {
            if let Some(rx) = release_rx.lock().await.take() {
                let _ = rx.await;
            }
            Ok::<_, Infallible>(Response::new("late"))
        }
    });
    let svc = DrainingLayer::new(signal.clone()).layer(slow);
    let in_flight = tokio::spawn(svc.oneshot(request(Version::HTTP_11)));
    signal.start();
    release_tx.send(()).unwrap();
    let r = tokio::time::timeout(Duration::from_secs(5), in_flight)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(r.headers()["x-gangway-draining"], "1");
}

#[tokio::test]
async fn errors_pass_through_and_started_resolves() {
    let signal = DrainSignal::new();
    signal.start();
    let failing = tower::service_fn(|_: Request<()>| async {
        Err::<Response<()>, _>(std::io::Error::other("boom"))
    });
    let err = DrainingLayer::new(signal.clone())
        .layer(failing)
        .oneshot(request(Version::HTTP_11))
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), "boom");
    tokio::time::timeout(Duration::from_secs(1), signal.started())
        .await
        .expect("started() resolves once the drain started");
    let fresh = DrainSignal::new();
    assert!(
        tokio::time::timeout(Duration::from_millis(20), fresh.started())
            .await
            .is_err(),
        "started() waits while the drain has not started"
    );
}
