//! The load generator is open loop: a backend that answers in 2 s does not delay the sends.

use std::sync::Arc;
use std::time::Duration;

use gangway_client::http::{HttpClient, HttpConfig};
use gangway_client::retry::RetryConfig;
use gangway_core::View;
use gangway_core::model::{Instance, InstanceKey, ServiceKey};
use gangway_lab::load::{Schedule, run_load};

async fn slow_backend(answer_after: Duration) -> std::net::SocketAddr {
    let app = axum::Router::new().route(
        "/ping",
        axum::routing::get(move || async move {
            tokio::time::sleep(answer_after).await;
            "pong"
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_follow_the_schedule_when_answers_take_two_seconds() {
    let addr = slow_backend(Duration::from_secs(2)).await;
    let view = View {
        revision: 1,
        instances: vec![Instance::new(InstanceKey::new(
            "127.0.0.1",
            addr.port(),
            "",
        ))],
        protection_triggered: false,
    };
    let (_tx, rx) = tokio::sync::watch::channel(Arc::new(view));
    let config = HttpConfig::default()
        .with_retry(RetryConfig::disabled())
        .with_outlier(None)
        .with_attempt_timeout(Duration::from_secs(5));
    let http = HttpClient::from_views(vec![(ServiceKey::named("slow"), rx.clone())], config)
        .expect("valid config");
    let schedule = Schedule {
        rate: 40.0,
        duration: Duration::from_millis(1500),
    };
    let started = std::time::Instant::now();
    let report = run_load(&http, "slow", rx, schedule, |_| {})
        .await
        .expect("load ran");
    assert_eq!(report.sent, 60);
    assert_eq!(
        report.failed,
        0,
        "{:?}",
        report.requests.iter().find(|r| !r.ok)
    );
    // A closed loop would fall behind by whole answers (2 s each); allow scheduler jitter on a
    // busy 2-core machine, far below that.
    for r in &report.requests {
        assert!(
            (r.sent_ms - r.scheduled_ms).abs() < 500.0,
            "request {} sent at {:.1} ms, scheduled at {:.1} ms",
            r.index,
            r.sent_ms,
            r.scheduled_ms
        );
        assert!((r.scheduled_ms - r.index as f64 * 25.0).abs() < 0.01);
        assert!(r.latency_ms >= 1990.0, "answered in {} ms", r.latency_ms);
    }
    // A closed loop (one request at a time) would have needed 60 x 2 s; this took ~3.5 s.
    let last = report.requests.last().unwrap();
    assert!(
        last.sent_ms < 1600.0,
        "the last send came at {} ms",
        last.sent_ms
    );
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test]
async fn a_rate_of_zero_is_refused() {
    let (_tx, rx) = tokio::sync::watch::channel(Arc::new(View {
        revision: 0,
        instances: vec![],
        protection_triggered: false,
    }));
    let http = HttpClient::from_views(
        vec![(ServiceKey::named("x"), rx.clone())],
        HttpConfig::default(),
    )
    .unwrap();
    let schedule = Schedule {
        rate: 0.0,
        duration: Duration::from_secs(1),
    };
    let err = run_load(&http, "x", rx, schedule, |_| {})
        .await
        .unwrap_err();
    assert!(err.to_string().contains("rate"), "{err}");
}

#[test]
fn schedule_counts_and_times() {
    let s = Schedule {
        rate: 60.0,
        duration: Duration::from_secs(8),
    };
    assert_eq!(s.total(), 480);
    assert_eq!(s.at(0), Duration::ZERO);
    assert_eq!(s.at(60), Duration::from_secs(1));
}
