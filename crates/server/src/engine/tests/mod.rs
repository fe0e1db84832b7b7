use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use gangway_core::model::{Instance, InstanceKey, ProbeSpec, ServiceKey, ServiceSettings};
use gangway_store::{MemoryStore, Store};

use super::*;
use crate::config::Config;

fn registry_with(store: Arc<dyn Store>, config: Config) -> Registry {
    let mut prom = prometheus_client::registry::Registry::default();
    Registry::start(store, config, Metrics::register(&mut prom)).expect("start")
}

fn registry() -> Registry {
    registry_with(Arc::new(MemoryStore::default()), Config::for_tests())
}

fn svc() -> ServiceKey {
    ServiceKey::named("orders")
}

fn inst(n: u8) -> Instance {
    Instance::new(InstanceKey::new(&format!("10.0.0.{n}"), 8080, ""))
}

fn lease() -> LivenessRequest {
    LivenessRequest::Lease {
        ttl: None,
        delete_timeout: None,
    }
}

fn listing(r: &Registry) -> Vec<(ServiceKey, Vec<Instance>)> {
    r.services(None, None)
        .into_iter()
        .map(|s| {
            let (_, entries) = r.entries(&s.key);
            (s.key, entries.into_iter().map(|e| e.instance).collect())
        })
        .collect()
}

#[tokio::test]
async fn register_lists_and_bumps_the_revision() {
    let r = registry();
    let (rev1, _) = r.register(svc(), inst(1), lease()).await.unwrap();
    let (rev2, stored) = r.register(svc(), inst(2), lease()).await.unwrap();
    assert!(rev2 > rev1);
    assert!(stored.ephemeral && stored.healthy && stored.enabled);
    let view = r.view(&svc());
    assert_eq!(view.revision, rev2);
    assert_eq!(view.instances.len(), 2);
}

#[tokio::test]
async fn rejected_requests_change_nothing() {
    let r = registry();
    r.register(svc(), inst(1), lease()).await.unwrap();
    let before = listing(&r);
    let mut bad_weight = inst(2);
    bad_weight.weight = 10_001.0;
    let mut bad_meta = inst(3);
    bad_meta.metadata = (0..65).map(|i| (format!("k{i}"), "v".into())).collect();
    let bad_ip = Instance::new(InstanceKey::new("not a host", 80, ""));
    let cases = [
        (ServiceKey::named("bad name"), inst(4), "service"),
        (svc(), bad_weight, "weight"),
        (svc(), bad_meta, "metadata"),
        (svc(), bad_ip, "ip"),
        (ServiceKey::new("", "g@@x", "s"), inst(5), "group"),
    ];
    for (service, instance, field) in cases {
        let err = r.register(service, instance, lease()).await.unwrap_err();
        assert_eq!(err.field(), Some(field), "{err}");
        assert!(matches!(err, RegistryError::Invalid(_)));
    }
    let err = r
        .register(
            svc(),
            inst(6),
            LivenessRequest::Lease {
                ttl: Some(Duration::from_secs(10)),
                delete_timeout: Some(Duration::from_secs(5)),
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.field(), Some("delete_timeout_ms"));
    assert_eq!(listing(&r), before);
}

#[tokio::test]
async fn mixing_kinds_is_refused_with_409() {
    let r = registry();
    r.register(svc(), inst(1), lease()).await.unwrap();
    let err = r
        .register(svc(), inst(2), LivenessRequest::Probe(ProbeSpec::default()))
        .await
        .unwrap_err();
    assert!(err.is_conflict());
    assert_eq!(
        err.to_string(),
        "service public/DEFAULT_GROUP/orders is ephemeral; cannot register an instance of the other kind (persistent) in it"
    );
    assert_eq!(r.entries(&svc()).1.len(), 1);
}

#[tokio::test]
async fn offline_mark_survives_reregistration_and_restart() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
    let r = registry_with(store.clone(), Config::for_tests());
    let session = r.open_session("127.0.0.1:1".into(), "t".into(), String::new());
    r.register(svc(), inst(1), LivenessRequest::Session(session.clone()))
        .await
        .unwrap();
    r.register(svc(), inst(2), LivenessRequest::Session(session.clone()))
        .await
        .unwrap();
    r.set_enabled(&svc(), &inst(1).key, false, false)
        .await
        .unwrap();
    assert!(!r.view(&svc()).contains(&inst(1).key));
    // The session reconnects: its instances go, then come back re-registered.
    r.close_session(&session);
    assert!(r.entries(&svc()).1.is_empty());
    let again = r.open_session("127.0.0.1:2".into(), "t".into(), String::new());
    let (_, back) = r
        .register(svc(), inst(1), LivenessRequest::Session(again))
        .await
        .unwrap();
    assert!(!back.enabled, "offline mark must survive a reconnect");
    // A restart on the same store keeps the mark too.
    let restarted = registry_with(store, Config::for_tests());
    let s = restarted.open_session("127.0.0.1:3".into(), "t".into(), String::new());
    let (_, back) = restarted
        .register(svc(), inst(1), LivenessRequest::Session(s))
        .await
        .unwrap();
    assert!(!back.enabled, "offline mark must survive a restart");
    restarted
        .set_enabled(&svc(), &inst(1).key, true, false)
        .await
        .unwrap();
    assert!(restarted.view(&svc()).contains(&inst(1).key));
}

#[tokio::test(start_paused = true)]
async fn offline_mark_expires_after_the_instance_is_gone_long_enough() {
    let config = Config {
        offline_mark_expiry: Duration::from_secs(60),
        ..Config::for_tests()
    };
    let r = registry_with(Arc::new(MemoryStore::default()), config);
    r.register(svc(), inst(1), lease()).await.unwrap();
    // The only instance: offline needs force.
    r.set_enabled(&svc(), &inst(1).key, false, true)
        .await
        .unwrap();
    r.deregister(&svc(), &inst(1).key, false).await.unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    let (_, back) = r.register(svc(), inst(1), lease()).await.unwrap();
    assert!(!back.enabled, "gone 30 s < 60 s: mark kept");
    r.deregister(&svc(), &inst(1).key, false).await.unwrap();
    tokio::time::sleep(Duration::from_secs(70)).await;
    let (_, back) = r.register(svc(), inst(1), lease()).await.unwrap();
    assert!(back.enabled, "gone 70 s > 60 s: mark expired");
}

#[tokio::test(start_paused = true)]
async fn leases_go_unhealthy_after_ttl_and_away_after_delete_timeout() {
    let r = registry();
    let ttl = LivenessRequest::Lease {
        ttl: Some(Duration::from_secs(2)),
        delete_timeout: Some(Duration::from_secs(4)),
    };
    r.register(svc(), inst(1), ttl).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    r.heartbeat(&svc(), &inst(1).key).unwrap();
    tokio::time::sleep(Duration::from_millis(1900)).await;
    assert!(
        r.instance(&svc(), &inst(1).key).unwrap().healthy,
        "heartbeat renewed the lease"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !r.instance(&svc(), &inst(1).key).unwrap().healthy,
        "TTL passed"
    );
    r.heartbeat(&svc(), &inst(1).key).unwrap();
    assert!(
        r.instance(&svc(), &inst(1).key).unwrap().healthy,
        "heartbeat heals"
    );
    tokio::time::sleep(Duration::from_millis(4500)).await;
    assert!(r.instance(&svc(), &inst(1).key).unwrap_err().is_not_found());
    assert!(
        r.heartbeat(&svc(), &inst(1).key)
            .unwrap_err()
            .is_not_found()
    );
}

#[tokio::test]
async fn closing_a_session_removes_its_instances_at_once() {
    let r = registry();
    let a = r.open_session("127.0.0.1:1".into(), "a".into(), String::new());
    let b = r.open_session("127.0.0.1:2".into(), "b".into(), String::new());
    r.register(svc(), inst(1), LivenessRequest::Session(a.clone()))
        .await
        .unwrap();
    r.register(svc(), inst(2), LivenessRequest::Session(b))
        .await
        .unwrap();
    r.close_session(&a);
    let left: Vec<_> = r
        .view(&svc())
        .instances
        .into_iter()
        .map(|i| i.key)
        .collect();
    assert_eq!(left, vec![inst(2).key]);
    let err = r
        .register(svc(), inst(3), LivenessRequest::Session(a))
        .await
        .unwrap_err();
    assert!(err.is_not_found());
}

#[tokio::test]
async fn persistent_instances_are_stored_and_reloaded() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
    let r = registry_with(store.clone(), Config::for_tests());
    let mut i = inst(1);
    i.weight = 3.0;
    r.register(svc(), i, LivenessRequest::Probe(ProbeSpec::default()))
        .await
        .unwrap();
    let stored = store.load().unwrap();
    assert_eq!(stored.instances[&svc()].len(), 1);
    let restarted = registry_with(store.clone(), Config::for_tests());
    let back = restarted.instance(&svc(), &inst(1).key).unwrap();
    assert_eq!((back.weight, back.ephemeral), (3.0, false));
    restarted
        .deregister(&svc(), &inst(1).key, false)
        .await
        .unwrap();
    assert!(store.load().unwrap().instances.is_empty());
}

/// A store with a bound on its batches (as etcd's transactions have), recording each
/// batch's size; each apply takes 5 ms, as an fsync would, so that writers queue meanwhile.
#[derive(Default)]
struct BoundedStore {
    inner: MemoryStore,
    sizes: std::sync::Mutex<Vec<usize>>,
}

impl Store for BoundedStore {
    fn load(&self) -> Result<gangway_store::Contents, gangway_store::StoreError> {
        self.inner.load()
    }
    fn apply(&self, batch: &[gangway_store::Write]) -> Result<(), gangway_store::StoreError> {
        std::thread::sleep(Duration::from_millis(5));
        self.sizes.lock().unwrap().push(batch.len());
        self.inner.apply(batch)
    }
    fn max_batch(&self) -> Option<usize> {
        Some(2)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_commits_stay_within_the_stores_bound_at_job_boundaries() {
    let store = Arc::new(BoundedStore::default());
    let r = registry_with(store.clone(), Config::for_tests());
    let writers: Vec<_> = (1..=30)
        .map(|n| {
            let r = r.clone();
            tokio::spawn(async move {
                r.register(svc(), inst(n), LivenessRequest::Probe(ProbeSpec::default()))
                    .await
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap().unwrap();
    }
    let sizes = store.sizes.lock().unwrap().clone();
    assert!(sizes.iter().all(|&n| (1..=2).contains(&n)), "{sizes:?}");
    assert!(
        sizes.contains(&2),
        "writers queued meanwhile are committed together: {sizes:?}"
    );
    assert_eq!(store.load().unwrap().instances[&svc()].len(), 30);
}

#[tokio::test]
async fn drain_waits_for_every_subscriber_ack() {
    let r = registry();
    r.register(svc(), inst(1), lease()).await.unwrap();
    r.register(svc(), inst(2), lease()).await.unwrap();
    let info = |n: &str| SubscriberInfo {
        kind: SubscriberKind::Session,
        address: format!("127.0.0.1:{n}"),
        client_name: n.into(),
        session: None,
        deltas: false,
        ignores_empty_lists: false,
    };
    let (a, mut rx_a) = r.subscribe(&svc(), info("1")).unwrap();
    let (b, _rx_b) = r.subscribe(&svc(), info("2")).unwrap();
    let drain = tokio::spawn({
        let r = r.clone();
        async move {
            r.drain(&svc(), &inst(1).key, Duration::from_secs(10), false)
                .await
        }
    });
    // a applies the snapshot without the instance and acks it; b leaves.
    let rev = loop {
        rx_a.changed().await.unwrap();
        rx_a.borrow_and_update();
        let snap = r.snapshot(&svc());
        if !snap.view.contains(&inst(1).key) {
            break snap.view.revision;
        }
    };
    r.ack(&a, rev);
    r.unsubscribe(&b);
    let report = drain.await.unwrap().unwrap();
    assert!(report.complete);
    assert_eq!(report.revision, rev);
    assert_eq!(
        report
            .acked
            .iter()
            .map(|s| s.id.as_str())
            .collect::<Vec<_>>(),
        [a.as_str()]
    );
    assert!(report.laggards.is_empty());
    assert!(!r.instance(&svc(), &inst(1).key).unwrap().enabled);
}

#[tokio::test(start_paused = true)]
async fn drain_times_out_with_laggards() {
    let r = registry();
    r.register(svc(), inst(1), lease()).await.unwrap();
    r.register(svc(), inst(2), lease()).await.unwrap();
    let info = SubscriberInfo {
        kind: SubscriberKind::Session,
        address: "127.0.0.1:9".into(),
        client_name: "slow".into(),
        session: None,
        deltas: false,
        ignores_empty_lists: false,
    };
    let (id, _rx) = r.subscribe(&svc(), info).unwrap();
    r.ack(&id, 5);
    let report = r
        .drain(&svc(), &inst(1).key, Duration::from_secs(3), false)
        .await
        .unwrap();
    assert!(!report.complete);
    assert_eq!(report.waited_ms, 3000);
    assert_eq!(report.laggards.len(), 1);
    assert_eq!(
        (
            report.laggards[0].id.as_str(),
            report.laggards[0].acked_revision
        ),
        (id.as_str(), 5)
    );
}

#[tokio::test]
async fn draining_the_last_serving_instance_needs_force() {
    let r = registry();
    r.register(svc(), inst(1), lease()).await.unwrap();
    let err = r
        .drain(&svc(), &inst(1).key, Duration::from_secs(1), false)
        .await
        .unwrap_err();
    assert!(err.is_conflict());
    assert!(err.to_string().contains("last serving instance"), "{err}");
    assert!(
        r.instance(&svc(), &inst(1).key).unwrap().enabled,
        "refused drain changed nothing"
    );
    let report = r
        .drain(&svc(), &inst(1).key, Duration::from_secs(1), true)
        .await
        .unwrap();
    assert!(report.complete);
    assert_eq!(
        report.notes,
        ["public/DEFAULT_GROUP/orders has no live subscriber: nothing to wait for"]
    );
}

#[tokio::test]
async fn protect_threshold_applies_to_the_view() {
    let r = registry();
    for n in 1..=5 {
        r.register(svc(), inst(n), lease()).await.unwrap();
    }
    for n in 2..=5 {
        r.set_health(&svc(), &inst(n).key, false);
    }
    for (threshold, size, triggered) in [
        (0.0, 1, false),
        (0.1, 1, false),
        (0.2, 5, true),
        (0.5, 5, true),
    ] {
        r.put_settings(
            &svc(),
            ServiceSettings {
                protect_threshold: threshold,
                ..Default::default()
            },
        )
        .await
        .unwrap();
        let view = r.view(&svc());
        assert_eq!(
            (view.instances.len(), view.protection_triggered),
            (size, triggered),
            "{threshold}"
        );
    }
    let err = r
        .put_settings(
            &svc(),
            ServiceSettings {
                protect_threshold: 1.5,
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.field(), Some("protect_threshold"));
}

#[tokio::test(start_paused = true)]
async fn pushes_wait_for_warmup_then_coalesce_and_resend_until_acked() {
    let config = Config {
        warmup: Duration::from_secs(5),
        ..Config::for_tests()
    };
    let r = registry_with(Arc::new(MemoryStore::default()), config);
    let info = SubscriberInfo {
        kind: SubscriberKind::Session,
        address: "127.0.0.1:9".into(),
        client_name: "c".into(),
        session: None,
        deltas: false,
        ignores_empty_lists: false,
    };
    let (id, rx) = r.subscribe(&svc(), info).unwrap();
    let pushes = r.full_pushes(id.clone(), rx);
    futures::pin_mut!(pushes);
    r.register(svc(), inst(1), lease()).await.unwrap();
    r.register(svc(), inst(2), lease()).await.unwrap();
    assert!(r.warming_up());
    let started = tokio::time::Instant::now();
    let first = pushes.next().await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(4900),
        "held back during warm-up"
    );
    assert_eq!(
        first.view.instances.len(),
        2,
        "coalesced: only the latest snapshot"
    );
    // Not acked: re-sent after the resend interval.
    let again = pushes.next().await.unwrap();
    assert_eq!(again.view.revision, first.view.revision);
    r.ack(&id, first.view.revision);
    r.register(svc(), inst(3), lease()).await.unwrap();
    let next = pushes.next().await.unwrap();
    assert_eq!(next.view.instances.len(), 3);
    let rows = r.subscribers(&svc());
    assert_eq!(
        (rows[0].acked_revision, rows[0].pushed_revision),
        (first.view.revision, next.view.revision)
    );
}

#[tokio::test]
async fn revisions_keep_growing_across_restarts() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
    let r = registry_with(store.clone(), Config::for_tests());
    let (before, _) = r.register(svc(), inst(1), lease()).await.unwrap();
    let restarted = registry_with(store, Config::for_tests());
    let (after, _) = restarted.register(svc(), inst(1), lease()).await.unwrap();
    assert!(after > before, "{after} > {before}");
}

#[tokio::test]
async fn an_update_that_changes_nothing_publishes_nothing() {
    let r = registry();
    r.register(svc(), inst(1), lease()).await.unwrap();
    let (rev, _) = r
        .set_enabled(&svc(), &inst(1).key, true, false)
        .await
        .unwrap();
    let before = r.view(&svc()).revision;
    assert_eq!(rev, before);
    let (again, _) = r
        .update(&svc(), &inst(1).key, Patch::default())
        .await
        .unwrap();
    assert_eq!(again, before);
    let (changed, i) = r
        .update(
            &svc(),
            &inst(1).key,
            Patch {
                weight: Some(3.0),
                ..Patch::default()
            },
        )
        .await
        .unwrap();
    assert!(changed > before);
    assert_eq!(i.weight, 3.0);
}

mod limits;
mod rules;
mod stall;

#[tokio::test]
async fn deleting_a_service_removes_its_stored_settings_and_refuses_a_non_empty_one() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
    let r = registry_with(store.clone(), Config::for_tests());
    let settings = ServiceSettings {
        protect_threshold: 0.5,
        ..ServiceSettings::default()
    };
    r.put_settings(&svc(), settings).await.unwrap();
    r.register(svc(), inst(1), lease()).await.unwrap();
    let err = r.delete_service(&svc()).await.unwrap_err();
    assert!(matches!(err, RegistryError::ServiceNotEmpty(_)), "{err}");
    assert!(store.load().unwrap().services.contains_key(&svc()));
    r.deregister(&svc(), &inst(1).key, false).await.unwrap();
    r.delete_service(&svc()).await.unwrap();
    assert!(
        store.load().unwrap().services.is_empty(),
        "gone from the store"
    );
    assert!(r.service(&svc()).unwrap_err().is_not_found());
    let err = r.delete_service(&svc()).await.unwrap_err();
    assert!(err.is_not_found(), "{err}");
}
