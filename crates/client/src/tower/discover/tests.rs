use std::collections::BTreeMap;
use std::task::Waker;

use gangway_core::model::ServiceKey;
use tokio::sync::mpsc;
use tower::balance::p2c::Balance;
use tower::load::{CompleteOnResponse, PendingRequestsDiscover};
use tower::{Service, ServiceExt};

use super::*;
use crate::outlier::{Outcome, OutlierConfig};

fn instance(last: u8) -> Instance {
    Instance::new(InstanceKey::new(&format!("10.0.0.{last}"), 8080, ""))
}

fn key(last: u8) -> InstanceKey {
    instance(last).key
}

fn view(revision: u64, instances: Vec<Instance>) -> Arc<View> {
    Arc::new(View {
        revision,
        instances,
        protection_triggered: false,
    })
}

/// The instance's address, as the toy service of every test.
fn addr_of(instance: &Instance) -> String {
    instance.key.addr()
}

/// Everything the stream yields right now, without waiting.
fn drain<S>(discover: &mut ViewDiscover<S>) -> Vec<Change<InstanceKey, S>> {
    let mut cx = Context::from_waker(Waker::noop());
    let mut out = Vec::new();
    while let Poll::Ready(Some(Ok(change))) = Pin::new(&mut *discover).poll_next(&mut cx) {
        out.push(change);
    }
    out
}

/// Changes as comparable text: `+addr=service` / `-addr`.
fn show(changes: Vec<Change<InstanceKey, String>>) -> Vec<String> {
    changes
        .into_iter()
        .map(|change| match change {
            Change::Insert(key, service) => format!("+{key}={service}"),
            Change::Remove(key) => format!("-{key}"),
        })
        .collect()
}

#[test]
fn the_first_view_inserts_its_pickable_instances_in_key_order() {
    let mut disabled = instance(4);
    disabled.enabled = false;
    let mut zero = instance(5);
    zero.weight = 0.0;
    let mut sick = instance(6);
    sick.healthy = false;
    let (_tx, rx) = watch::channel(view(
        1,
        vec![instance(2), instance(1), disabled, zero, sick],
    ));
    let mut discover = ViewDiscover::from_receiver(rx, addr_of);
    assert_eq!(
        show(drain(&mut discover)),
        [
            "+10.0.0.1:8080=10.0.0.1:8080",
            "+10.0.0.2:8080=10.0.0.2:8080"
        ]
    );
    assert!(
        drain(&mut discover).is_empty(),
        "nothing until the view changes"
    );
}

#[test]
fn an_empty_view_inserts_nothing() {
    let (_tx, rx) = watch::channel(view(0, vec![]));
    let mut discover = ViewDiscover::from_receiver(rx, addr_of);
    assert!(drain(&mut discover).is_empty());
}

#[test]
fn a_view_change_removes_the_departed_then_inserts_the_new() {
    let (tx, rx) = watch::channel(view(1, vec![instance(1), instance(2)]));
    let mut discover = ViewDiscover::from_receiver(rx, addr_of);
    drain(&mut discover);
    tx.send(view(2, vec![instance(2), instance(3)])).unwrap();
    assert_eq!(
        show(drain(&mut discover)),
        ["-10.0.0.1:8080", "+10.0.0.3:8080=10.0.0.3:8080"]
    );
    // It comes back: inserted again, with a new service.
    tx.send(view(3, vec![instance(1), instance(2), instance(3)]))
        .unwrap();
    assert_eq!(show(drain(&mut discover)), ["+10.0.0.1:8080=10.0.0.1:8080"]);
}

#[test]
fn an_instance_that_stops_being_pickable_is_removed() {
    let (tx, rx) = watch::channel(view(1, vec![instance(1), instance(2)]));
    let mut discover = ViewDiscover::from_receiver(rx, addr_of);
    drain(&mut discover);
    let mut zero = instance(1);
    zero.weight = 0.0;
    tx.send(view(2, vec![zero, instance(2)])).unwrap();
    assert_eq!(show(drain(&mut discover)), ["-10.0.0.1:8080"]);
}

#[test]
fn a_burst_of_views_collapses_into_one_diff() {
    let (tx, rx) = watch::channel(view(1, vec![instance(1)]));
    let mut discover = ViewDiscover::from_receiver(rx, addr_of);
    drain(&mut discover);
    tx.send(view(2, vec![instance(1), instance(2)])).unwrap();
    tx.send(view(3, vec![instance(1)])).unwrap();
    assert!(drain(&mut discover).is_empty(), "2 came and went unseen");
}

#[test]
fn metadata_changes_rebuild_by_default_weight_changes_do_not() {
    let (tx, rx) = watch::channel(view(1, vec![instance(1)]));
    let mut discover =
        ViewDiscover::from_receiver(rx, |i: &Instance| format!("{}{:?}", i.weight, i.metadata));
    drain(&mut discover);
    let mut heavier = instance(1);
    heavier.weight = 5.0;
    tx.send(view(2, vec![heavier.clone()])).unwrap();
    assert!(drain(&mut discover).is_empty());
    let mut tagged = heavier;
    tagged.metadata = BTreeMap::from([("zone".to_owned(), "b".to_owned())]);
    tx.send(view(3, vec![tagged])).unwrap();
    assert_eq!(
        show(drain(&mut discover)),
        [r#"+10.0.0.1:8080=5{"zone": "b"}"#]
    );
}

#[test]
fn rebuild_on_any_change_and_never() {
    let mut heavier = instance(1);
    heavier.weight = 5.0;
    let mut tagged = instance(1);
    tagged.metadata = BTreeMap::from([("zone".to_owned(), "b".to_owned())]);

    let (tx, rx) = watch::channel(view(1, vec![instance(1)]));
    let mut any = ViewDiscover::from_receiver(rx, addr_of).with_rebuild(Rebuild::OnAnyChange);
    drain(&mut any);
    tx.send(view(2, vec![heavier.clone()])).unwrap();
    assert_eq!(show(drain(&mut any)), ["+10.0.0.1:8080=10.0.0.1:8080"]);

    let (tx, rx) = watch::channel(view(1, vec![instance(1)]));
    let mut never = ViewDiscover::from_receiver(rx, addr_of).with_rebuild(Rebuild::Never);
    drain(&mut never);
    tx.send(view(2, vec![tagged])).unwrap();
    tx.send(view(3, vec![heavier])).unwrap();
    assert!(drain(&mut never).is_empty());
}

#[test]
fn the_stream_ends_with_the_channel_and_removes_nothing() {
    let (tx, rx) = watch::channel(view(1, vec![instance(1)]));
    let mut discover = ViewDiscover::from_receiver(rx, addr_of);
    drain(&mut discover);
    drop(tx);
    let mut cx = Context::from_waker(Waker::noop());
    assert!(matches!(
        Pin::new(&mut discover).poll_next(&mut cx),
        Poll::Ready(None)
    ));
    assert!(matches!(
        Pin::new(&mut discover).poll_next(&mut cx),
        Poll::Ready(None)
    ));
}

#[tokio::test(start_paused = true)]
async fn with_detector_forgets_instances_that_left() {
    let detector = Arc::new(
        OutlierDetector::new(ServiceKey::named("orders"), OutlierConfig::default()).unwrap(),
    );
    let all: Vec<Instance> = (1..=5).map(instance).collect();
    let (tx, rx) = watch::channel(view(1, all.clone()));
    let mut discover = ViewDiscover::from_receiver(rx, addr_of).with_detector(detector.clone());
    drain(&mut discover);
    for _ in 0..5 {
        detector.record(&key(1), Outcome::ConnectFailure, 5);
    }
    assert!(detector.is_ejected(&key(1)));
    tx.send(view(2, all[1..].to_vec())).unwrap();
    drain(&mut discover);
    assert!(!detector.is_ejected(&key(1)), "forgotten once it left");
}

#[tokio::test]
async fn new_keeps_the_subscription_alive() {
    let (tx, rx) = watch::channel(view(1, vec![instance(1)]));
    let (commands, mut unsubscribed) = mpsc::unbounded_channel();
    let subscription = Subscription::new(ServiceKey::named("orders"), rx, commands);
    let mut discover = ViewDiscover::new(&subscription, addr_of);
    drop(subscription);
    assert!(
        unsubscribed.try_recv().is_err(),
        "the discover holds a clone"
    );
    assert_eq!(show(drain(&mut discover)), ["+10.0.0.1:8080=10.0.0.1:8080"]);
    drop(discover);
    assert!(
        unsubscribed.try_recv().is_ok(),
        "unsubscribed with the last clone"
    );
    drop(tx);
}

/// A p2c balancer over the discover only ever calls instances of the current view.
#[tokio::test]
async fn p2c_balance_follows_the_view() {
    let (tx, rx) = watch::channel(view(1, (1..=3).map(instance).collect()));
    let discover = ViewDiscover::from_receiver(rx, |i: &Instance| {
        let addr = i.key.addr();
        tower::service_fn(move |()| {
            let addr = addr.clone();
            async move { Ok::<_, std::io::Error>(addr) }
        })
    });
    let mut balance = Balance::new(PendingRequestsDiscover::new(
        discover,
        CompleteOnResponse::default(),
    ));
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..60 {
        seen.insert(balance.ready().await.unwrap().call(()).await.unwrap());
    }
    assert_eq!(seen.len(), 3, "all three picked: {seen:?}");

    tx.send(view(2, vec![instance(2)])).unwrap();
    for _ in 0..20 {
        let addr = balance.ready().await.unwrap().call(()).await.unwrap();
        assert_eq!(addr, "10.0.0.2:8080");
    }
}

#[tokio::test]
async fn tonic_endpoints_yield_http_uris_and_removals() {
    let (tx, rx) = watch::channel(view(1, vec![instance(1)]));
    let (commands, _unsubscribed) = mpsc::unbounded_channel();
    let subscription = Subscription::new(ServiceKey::named("orders"), rx, commands);
    let mut endpoints = tonic_endpoints(&subscription, |_, endpoint| {
        endpoint.connect_timeout(std::time::Duration::from_secs(1))
    });
    use tokio_stream::StreamExt as _;
    use tonic::transport::channel::Change as TonicChange;
    match endpoints.next().await {
        Some(TonicChange::Insert(key, endpoint)) => {
            assert_eq!(key, self::key(1));
            assert_eq!(endpoint.uri().to_string(), "http://10.0.0.1:8080/");
        }
        other => panic!("expected an insert, got {other:?}"),
    }
    tx.send(view(2, vec![])).unwrap();
    assert!(matches!(
        endpoints.next().await,
        Some(TonicChange::Remove(k)) if k == key(1)
    ));
}

#[tokio::test]
async fn balance_channel_builds_a_lazy_channel_and_its_task_ends_with_it() {
    let (tx, rx) = watch::channel(view(1, vec![instance(1)]));
    let (commands, mut unsubscribed) = mpsc::unbounded_channel();
    let subscription = Subscription::new(ServiceKey::named("orders"), rx, commands);
    let channel = balance_channel(&subscription, 16, |_, endpoint| endpoint);
    drop(subscription);
    tokio::task::yield_now().await;
    assert!(
        unsubscribed.try_recv().is_err(),
        "the task holds the subscription"
    );
    drop(channel);
    // The forwarding task notices the closed sender and drops its subscription clone.
    tokio::time::timeout(std::time::Duration::from_secs(5), unsubscribed.recv())
        .await
        .expect("unsubscribed once the channel is gone")
        .expect("a command");
    drop(tx);
}

#[tokio::test]
async fn tonic_endpoints_skip_an_address_that_is_no_uri() {
    let bad = Instance::new(InstanceKey::new("not a host", 8080, ""));
    let (_tx, rx) = watch::channel(view(1, vec![bad, instance(1)]));
    let (commands, _unsubscribed) = mpsc::unbounded_channel();
    let subscription = Subscription::new(ServiceKey::named("orders"), rx, commands);
    let mut endpoints = tonic_endpoints(&subscription, |_, endpoint| endpoint);
    use tokio_stream::StreamExt as _;
    match endpoints.next().await {
        Some(tonic::transport::channel::Change::Insert(key, _)) => assert_eq!(key, self::key(1)),
        other => panic!("expected the valid instance only, got {other:?}"),
    }
}
