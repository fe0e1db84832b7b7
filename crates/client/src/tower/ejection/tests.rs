use std::future::poll_fn;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Poll, Wake, Waker};
use std::time::Duration;

use gangway_core::model::{Instance, InstanceKey, ServiceKey};
use gangway_core::view::View;
use http::{Method, Request, Response};
use tokio::sync::watch;
use tower::balance::p2c::Balance;
use tower::buffer::Buffer;
use tower::load::{CompleteOnResponse, PendingRequestsDiscover};
use tower::{BoxError, Layer, Service, ServiceBuilder, ServiceExt};
use tower_test::mock;

use super::*;
use crate::outlier::{ErrorKinds, OutlierConfig, OutlierDetector, RecoveryCheck};
use crate::retry::RetryConfig;
use crate::tower::{Attempts, DefaultClassify, RetryLayer, ViewDiscover};

type Mock = mock::Mock<Request<String>, Response<String>>;
type Handle = mock::Handle<Request<String>, Response<String>>;

fn instance(last: u8) -> Instance {
    Instance::new(InstanceKey::new(&format!("10.0.0.{last}"), 8080, ""))
}

fn view(instances: Vec<Instance>) -> Arc<View> {
    Arc::new(View {
        revision: 1,
        instances,
        protection_triggered: false,
    })
}

fn detector(config: OutlierConfig) -> Arc<OutlierDetector> {
    Arc::new(OutlierDetector::new(ServiceKey::named("orders"), config).unwrap())
}

struct Fixture {
    service: Ejection<Mock, DefaultClassify>,
    handle: Handle,
    detector: Arc<OutlierDetector>,
    views: watch::Sender<Arc<View>>,
}

/// The `Ejection` of instance 1 of five.
fn fixture(config: OutlierConfig) -> Fixture {
    let detector = detector(config);
    let (views, rx) = watch::channel(view((1..=5).map(instance).collect()));
    let (inner, handle) = mock::pair();
    let service = EjectionLayer::new(detector.clone(), rx, &instance(1)).layer(inner);
    Fixture {
        service,
        handle,
        detector,
        views,
    }
}

fn get() -> Request<String> {
    Request::builder()
        .method(Method::GET)
        .uri("/")
        .body(String::new())
        .unwrap()
}

fn status(code: u16) -> Response<String> {
    Response::builder()
        .status(code)
        .body(String::new())
        .unwrap()
}

#[derive(Default)]
struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

impl Fixture {
    fn key(&self) -> InstanceKey {
        instance(1).key
    }

    /// One `poll_ready` with a waker whose wake-up is recorded in the returned flag.
    fn poll_ready(&mut self) -> (bool, Arc<Flag>) {
        let flag = Arc::new(Flag::default());
        let waker = Waker::from(flag.clone());
        let mut cx = std::task::Context::from_waker(&waker);
        let ready = match self.service.poll_ready(&mut cx) {
            Poll::Ready(Ok(())) => true,
            Poll::Ready(Err(e)) => panic!("poll_ready failed: {e}"),
            Poll::Pending => false,
        };
        (ready, flag)
    }

    /// One call answered with `answer`; returns once the outcome is recorded.
    async fn call(&mut self, answer: Result<Response<String>, io::Error>) {
        poll_fn(|cx| self.service.poll_ready(cx)).await.unwrap();
        let future = self.service.call(get());
        let (_, send) = self.handle.next_request().await.unwrap();
        match answer {
            Ok(response) => send.send_response(response),
            Err(error) => send.send_error(error),
        }
        let _ = future.await;
    }

    async fn eject(&mut self) {
        for _ in 0..5 {
            self.call(Err(io::Error::from(io::ErrorKind::ConnectionRefused)))
                .await;
        }
        assert!(self.detector.is_ejected(&self.key()));
    }
}

#[tokio::test(start_paused = true)]
async fn connect_failures_eject_and_close_the_gate() {
    let mut f = fixture(OutlierConfig::default());
    for _ in 0..4 {
        f.call(Err(io::Error::from(io::ErrorKind::ConnectionRefused)))
            .await;
    }
    assert!(
        !f.detector.is_ejected(&f.key()),
        "4 in a row are not enough"
    );
    assert!(f.poll_ready().0);
    f.call(Err(io::Error::from(io::ErrorKind::ConnectionRefused)))
        .await;
    assert!(f.detector.is_ejected(&f.key()));
    let (ready, woken) = f.poll_ready();
    assert!(
        !ready,
        "an ejected instance is not ready (Pending, not an error)"
    );
    assert!(!woken.0.load(Ordering::SeqCst));
    tokio::time::advance(RECHECK_INTERVAL).await;
    assert!(
        woken.0.load(Ordering::SeqCst),
        "re-evaluated within RECHECK_INTERVAL"
    );
    assert!(!f.poll_ready().0);
}

#[tokio::test(start_paused = true)]
async fn the_due_check_opens_the_gate_for_one_probe_that_recovers() {
    let mut f = fixture(OutlierConfig::default());
    f.eject().await;
    tokio::time::advance(Duration::from_secs(29)).await;
    assert!(!f.poll_ready().0);
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(f.poll_ready().0, "check due after recovery_unit (30 s)");

    let probe = f.service.call(get());
    let info = f.detector.ejected()[0].1;
    assert!(info.check_in_flight, "the call is the probe");
    assert!(!f.poll_ready().0, "one probe at a time");
    let (_, send) = f.handle.next_request().await.unwrap();
    send.send_response(status(200));
    probe.await.unwrap();
    assert!(!f.detector.is_ejected(&f.key()), "recovered by the probe");
    assert!(f.poll_ready().0);
}

#[tokio::test(start_paused = true)]
async fn a_failed_probe_closes_the_gate_until_the_next_check() {
    let mut f = fixture(OutlierConfig::default());
    f.eject().await;
    tokio::time::advance(Duration::from_secs(30)).await;
    f.call(Err(io::Error::from(io::ErrorKind::ConnectionRefused)))
        .await;
    assert!(f.detector.is_ejected(&f.key()));
    assert!(!f.poll_ready().0);
    tokio::time::advance(Duration::from_secs(59)).await;
    assert!(!f.poll_ready().0, "the second check comes 60 s later");
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(f.poll_ready().0);
}

#[tokio::test(start_paused = true)]
async fn the_gate_fails_open_when_every_pickable_instance_is_ejected() {
    let mut f = fixture(OutlierConfig::default());
    f.eject().await;
    assert!(!f.poll_ready().0);
    // The healthy ones left the view; the detector was not told (no retain).
    f.views.send(view(vec![instance(1)])).unwrap();
    assert!(
        f.poll_ready().0,
        "never leave the service without instances"
    );
}

#[tokio::test(start_paused = true)]
async fn tcp_checks_reopen_the_gate_once_reported() {
    let mut f = fixture(OutlierConfig::default().with_check(RecoveryCheck::TcpConnect));
    f.eject().await;
    tokio::time::advance(Duration::from_secs(31)).await;
    let (ready, woken) = f.poll_ready();
    assert!(!ready, "no probe request with TCP checks");
    assert_eq!(f.detector.due_tcp_checks(), vec![f.key()]);
    f.detector.check_result(&f.key(), true);
    tokio::time::advance(RECHECK_INTERVAL).await;
    assert!(woken.0.load(Ordering::SeqCst));
    assert!(f.poll_ready().0);
}

#[tokio::test(start_paused = true)]
async fn server_errors_count_only_when_configured() {
    let mut f = fixture(OutlierConfig::default());
    for _ in 0..12 {
        f.call(Ok(status(500))).await;
    }
    assert!(
        !f.detector.is_ejected(&f.key()),
        "network errors only, by default"
    );

    let mut f = fixture(OutlierConfig::default().with_errors(ErrorKinds::NetworkAndServerErrors));
    for _ in 0..12 {
        f.call(Ok(status(500))).await;
    }
    assert!(
        f.detector.is_ejected(&f.key()),
        "all 5xx over the minimum rate"
    );
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_call_records_nothing() {
    let mut f = fixture(OutlierConfig::default());
    for _ in 0..5 {
        poll_fn(|cx| f.service.poll_ready(cx)).await.unwrap();
        drop(f.service.call(get()));
        let (_, send) = f.handle.next_request().await.unwrap();
        send.send_error(io::Error::from(io::ErrorKind::ConnectionRefused));
    }
    assert!(!f.detector.is_ejected(&f.key()));
}

/// The whole stack as docs/tower.md shows it, over fake instances: retry over a buffered p2c
/// balancer over `ViewDiscover` of `Ejection`s. One instance refuses connections: every
/// request still succeeds, and once it is ejected (5 refusals) it gets no more requests.
#[tokio::test]
async fn discover_balance_retry_and_ejection_compose() {
    let dead = instance(2).key;
    let calls: Arc<Mutex<Vec<InstanceKey>>> = Arc::default();
    let refused = Arc::new(AtomicUsize::new(0));
    let (views_tx, views) = watch::channel(view((1..=3).map(instance).collect()));
    // 3 x 0.5: one instance may be ejected.
    let detector = detector(OutlierConfig::default().with_max_ejection_ratio(0.5));

    let discover = ViewDiscover::from_receiver(views.clone(), {
        let (calls, refused, detector, dead) = (
            calls.clone(),
            refused.clone(),
            detector.clone(),
            dead.clone(),
        );
        move |i: &Instance| {
            let key = i.key.clone();
            let is_dead = key == dead;
            let (calls, refused) = (calls.clone(), refused.clone());
            let client = tower::service_fn(move |_: Request<String>| {
                calls.lock().unwrap().push(key.clone());
                if is_dead {
                    refused.fetch_add(1, Ordering::SeqCst);
                }
                let answer = if is_dead {
                    Err(io::Error::from(io::ErrorKind::ConnectionRefused))
                } else {
                    Ok(Response::new(key.to_string()))
                };
                async move { answer }
            });
            EjectionLayer::new(detector.clone(), views.clone(), i).layer(client)
        }
    })
    .with_detector(detector.clone());
    let balance = Balance::new(PendingRequestsDiscover::new(
        discover,
        CompleteOnResponse::default(),
    ));
    // Up to 10 attempts: p2c may pick the dead instance again before it is ejected.
    let mut stack = ServiceBuilder::new()
        .layer(RetryLayer::new(
            &RetryConfig::default().with_max_attempts(10),
        ))
        .service(Buffer::new(balance, 64));

    for n in 0..60 {
        let ejected_before = detector.is_ejected(&dead);
        let response: Response<String> = stack
            .ready()
            .await
            .unwrap()
            .call(Request::new(String::new()))
            .await
            .unwrap_or_else(|e: BoxError| panic!("request {n} failed: {e}"));
        assert_ne!(response.body(), &dead.to_string());
        let attempts = response.extensions().get::<Attempts>().unwrap().0;
        if ejected_before {
            assert_eq!(attempts, 1, "request {n}: only live instances are ready");
        }
    }
    assert!(
        detector.is_ejected(&dead),
        "the refusing instance is ejected"
    );
    assert_eq!(
        refused.load(Ordering::SeqCst),
        5,
        "no request reaches it once ejected"
    );
    let calls = calls.lock().unwrap();
    assert_eq!(calls.iter().filter(|k| **k == dead).count(), 5);
    assert!(
        calls.len() >= 65,
        "60 answers and 5 refusals: {}",
        calls.len()
    );
    drop(views_tx);
}

#[tokio::test(start_paused = true)]
async fn a_lost_probe_reopens_the_gate_after_the_check_timeout() {
    let mut f = fixture(OutlierConfig::default());
    f.eject().await;
    tokio::time::advance(Duration::from_secs(30)).await;
    assert!(f.poll_ready().0);
    drop(f.service.call(get())); // the probe is cancelled: no outcome ever comes
    let (ready, woken) = f.poll_ready();
    assert!(!ready);
    tokio::time::advance(crate::outlier::DEFAULT_CHECK_TIMEOUT).await;
    assert!(woken.0.load(Ordering::SeqCst));
    assert!(f.poll_ready().0, "the check is due again");
}
