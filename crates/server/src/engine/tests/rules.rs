//! The rules that must hold under races (issue 9 parts 1, 2 and 7): the last serving instance,
//! instances born offline, drains that wake on their own service only, session ownership and
//! ack-based readiness.

use std::sync::Arc;
use std::time::Duration;

use gangway_core::model::ProbeSpec;
use gangway_store::{MemoryStore, Store};
use tokio::sync::Barrier;

use super::*;

/// How each instance of a race is kept alive.
#[derive(Debug, Clone, Copy)]
enum Keeper {
    Lease,
    Session,
    Probe,
}

async fn populated(keeper: Keeper, n: u8) -> Registry {
    let r = registry();
    let session = r.open_session("127.0.0.1:1".into(), "p".into(), "client-p".into());
    for i in 1..=n {
        let liveness = match keeper {
            Keeper::Lease => lease(),
            Keeper::Session => LivenessRequest::Session(session.clone()),
            Keeper::Probe => LivenessRequest::Probe(ProbeSpec::default()),
        };
        r.register(svc(), inst(i), liveness).await.unwrap();
    }
    r
}

/// Fires `n` drains of the `n` instances at once (2 worker threads, a barrier), 50 rounds per
/// keeper; the view must keep one instance, exactly one drain is refused with a 409 naming the
/// service and the reason, and the refused one's instance is left as it was.
async fn race(n: u8, offline_only: bool) {
    let mut refused_total = 0;
    for keeper in [Keeper::Lease, Keeper::Session, Keeper::Probe] {
        for round in 0..50 {
            let r = populated(keeper, n).await;
            let barrier = Arc::new(Barrier::new(usize::from(n)));
            let tasks: Vec<_> = (1..=n)
                .map(|i| {
                    let (r, barrier) = (r.clone(), barrier.clone());
                    tokio::spawn(async move {
                        barrier.wait().await;
                        let key = inst(i).key;
                        let result = if offline_only {
                            r.set_enabled(&svc(), &key, false, false).await.map(|_| ())
                        } else {
                            r.drain(&svc(), &key, Duration::from_secs(1), false)
                                .await
                                .map(|_| ())
                        };
                        (i, result)
                    })
                })
                .collect();
            let mut refused = Vec::new();
            for t in tasks {
                let (i, result) = t.await.unwrap();
                if let Err(e) = result {
                    assert!(e.is_conflict(), "{keeper:?} round {round}: {e}");
                    let text = e.to_string();
                    assert!(
                        text.contains("last serving instance") && text.contains("orders"),
                        "names the service and the reason: {text}"
                    );
                    refused.push(i);
                }
            }
            let view = r.view(&svc());
            assert_eq!(
                view.instances.len(),
                1,
                "{keeper:?} round {round}: {n} racing drains left {:?}",
                view.instances
            );
            assert_eq!(
                refused.len(),
                1,
                "{keeper:?} round {round}: refused {refused:?}"
            );
            let loser = r.instance(&svc(), &inst(refused[0]).key).unwrap();
            assert!(loser.enabled, "the refused instance is left as it was");
            assert!(view.contains(&loser.key));
            refused_total += refused.len();
        }
    }
    println!(
        "{n} racing {} x 50 rounds x 3 keepers: {refused_total} refused, view never empty",
        if offline_only { "offlines" } else { "drains" }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_racing_drains_never_empty_the_view() {
    race(2, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_racing_drains_never_empty_the_view() {
    race(3, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_offlines_never_empty_the_view() {
    race(2, true).await;
}

#[tokio::test]
async fn every_way_out_of_the_view_keeps_the_last_instance_unless_forced() {
    let r = registry();
    r.register(svc(), inst(1), lease()).await.unwrap();
    let key = inst(1).key;
    let out = [
        Patch {
            enabled: Some(false),
            ..Patch::default()
        },
        Patch {
            weight: Some(0.0),
            ..Patch::default()
        },
    ];
    for patch in out.clone() {
        let err = r.update(&svc(), &key, patch).await.unwrap_err();
        assert!(err.is_conflict(), "{err}");
    }
    // Re-registering it offline (Nacos enabled=false) takes it out too.
    let mut offline = inst(1);
    offline.enabled = false;
    let err = r.register(svc(), offline, lease()).await.unwrap_err();
    assert!(err.is_conflict(), "{err}");
    let still = r.instance(&svc(), &key).unwrap();
    assert!(
        still.enabled && still.weight == 1.0,
        "refusals changed nothing: {still:?}"
    );
    assert!(r.view(&svc()).contains(&key));
    for patch in out {
        let forced = Patch {
            force: true,
            ..patch
        };
        r.update(&svc(), &key, forced.clone()).await.unwrap();
        assert!(!r.view(&svc()).contains(&key));
        r.update(
            &svc(),
            &key,
            Patch {
                enabled: Some(true),
                weight: Some(1.0),
                ..Patch::default()
            },
        )
        .await
        .unwrap();
    }
}

/// The protect threshold keeps an unhealthy instance in the view; it is not serving, so the
/// last healthy instance still cannot be taken out, and the summary counts one serving.
#[tokio::test]
async fn an_unhealthy_instance_kept_by_protection_does_not_count_as_serving() {
    let r = registry();
    r.put_settings(
        &svc(),
        ServiceSettings {
            protect_threshold: 0.6,
            ..ServiceSettings::default()
        },
    )
    .await
    .unwrap();
    r.register(svc(), inst(1), lease()).await.unwrap();
    let sick = inst(2);
    r.register(svc(), sick.clone(), lease()).await.unwrap();
    r.set_health(&svc(), &sick.key, false);
    assert_eq!(r.view(&svc()).instances.len(), 2, "protection keeps both");
    assert_eq!(r.service(&svc()).unwrap().serving, 1);
    let offline = Patch {
        enabled: Some(false),
        ..Patch::default()
    };
    let err = r
        .update(&svc(), &inst(1).key, offline.clone())
        .await
        .unwrap_err();
    assert!(err.is_conflict(), "{err}");
    assert!(r.instance(&svc(), &inst(1).key).unwrap().enabled);
    // Weight 0 would keep it in the view (protection) but not serving: refused too.
    let zero = Patch {
        weight: Some(0.0),
        ..Patch::default()
    };
    let err = r.update(&svc(), &inst(1).key, zero).await.unwrap_err();
    assert!(err.is_conflict(), "{err}");
    assert_eq!(r.instance(&svc(), &inst(1).key).unwrap().weight, 1.0);
    assert_eq!(r.service(&svc()).unwrap().serving, 1);
    // The unhealthy one may go: the serving one stays.
    r.update(&svc(), &sick.key, offline).await.unwrap();
    assert_eq!(r.view(&svc()).instances.len(), 1);
}

#[tokio::test]
async fn an_instance_registered_offline_is_never_published_enabled() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
    let r = registry_with(store.clone(), Config::for_tests());
    r.register(svc(), inst(2), lease()).await.unwrap();
    let (_, mut rx) = r
        .subscribe(
            &svc(),
            SubscriberInfo {
                kind: SubscriberKind::Session,
                address: "127.0.0.1:9".into(),
                client_name: "watcher".into(),
                session: None,
                deltas: false,
                ignores_empty_lists: false,
            },
        )
        .unwrap();
    rx.borrow_and_update();
    let mut offline = inst(1);
    offline.enabled = false;
    let (revision, stored) = r.register(svc(), offline, lease()).await.unwrap();
    assert!(!stored.enabled);
    // Exactly one revision was published for it, and it does not hold the instance.
    assert!(rx.has_changed().unwrap());
    assert_eq!(*rx.borrow_and_update(), revision);
    let snap = r.snapshot(&svc());
    assert_eq!(snap.view.revision, revision);
    assert!(!snap.view.contains(&inst(1).key), "{:?}", snap.view);
    assert!(!rx.has_changed().unwrap(), "no second revision");
    // The offline mark is durable: a restart keeps it offline.
    assert!(
        store
            .load()
            .unwrap()
            .offline_marks
            .contains_key(&(svc(), inst(1).key))
    );
}

/// A drain's offline lasts until the instance leaves: while it is there a re-registration (an
/// SDK's redo) keeps it offline, and nothing is stored; once it left, the same address
/// registered again (a restarted process) serves. An operator's offline stays across both.
#[tokio::test]
async fn a_drained_instance_serves_again_when_it_comes_back_an_offline_one_does_not() {
    let store = Arc::new(MemoryStore::default());
    let r = registry_with(store.clone(), Config::for_tests());
    r.register(svc(), inst(1), lease()).await.unwrap();
    r.register(svc(), inst(2), lease()).await.unwrap();
    let enabled = |r: &Registry| r.instance(&svc(), &inst(1).key).unwrap().enabled;
    let stored_mark = || {
        store
            .load()
            .unwrap()
            .offline_marks
            .contains_key(&(svc(), inst(1).key))
    };
    r.drain(&svc(), &inst(1).key, Duration::from_millis(50), false)
        .await
        .unwrap();
    r.register(svc(), inst(1), lease()).await.unwrap();
    assert!(!enabled(&r), "re-registered while drained: still offline");
    assert!(!stored_mark(), "a drain stores no mark");
    r.deregister(&svc(), &inst(1).key, false).await.unwrap();
    r.register(svc(), inst(1), lease()).await.unwrap();
    assert!(enabled(&r), "back after it left: serving");
    assert!(r.view(&svc()).contains(&inst(1).key));

    let offline = Patch {
        enabled: Some(false),
        ..Patch::default()
    };
    r.update(&svc(), &inst(1).key, offline).await.unwrap();
    assert!(stored_mark());
    r.deregister(&svc(), &inst(1).key, false).await.unwrap();
    r.register(svc(), inst(1), lease()).await.unwrap();
    assert!(
        !enabled(&r),
        "an operator's offline survives re-registration"
    );
    // A drain over it does not weaken it.
    r.drain(&svc(), &inst(1).key, Duration::from_millis(50), false)
        .await
        .unwrap();
    r.deregister(&svc(), &inst(1).key, false).await.unwrap();
    r.register(svc(), inst(1), lease()).await.unwrap();
    assert!(!enabled(&r));
}

#[tokio::test(start_paused = true)]
async fn a_drain_wakes_only_on_acks_of_its_own_service() {
    let r = registry();
    let other = ServiceKey::named("payments");
    r.register(svc(), inst(1), lease()).await.unwrap();
    r.register(svc(), inst(2), lease()).await.unwrap();
    let info = |name: &str| SubscriberInfo {
        kind: SubscriberKind::Session,
        address: "127.0.0.1:9".into(),
        client_name: name.into(),
        session: None,
        deltas: false,
        ignores_empty_lists: false,
    };
    let (_laggard, _rx) = r.subscribe(&svc(), info("frozen")).unwrap();
    let (busy, _rx2) = r.subscribe(&other, info("busy")).unwrap();
    let drain = tokio::spawn({
        let r = r.clone();
        async move {
            r.drain(&svc(), &inst(1).key, Duration::from_secs(10), false)
                .await
        }
    });
    let scans = || r.inner.metrics.ack_wait_scans.get();
    // Until the drain made its first scan (it offlines the instance first).
    for _ in 0..1000 {
        if scans() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let before = scans();
    assert_eq!(before, 1, "the drain scanned once and waits");
    for revision in 1..=200 {
        r.ack(&busy, revision);
        tokio::task::yield_now().await;
    }
    let after = scans();
    let report = drain.await.unwrap().unwrap();
    assert!(!report.complete);
    println!(
        "200 acks on another service: {} scans by the drain",
        after - before
    );
    assert_eq!(after, before, "acks of another service woke the drain");
}

fn session_info() -> SubscriberInfo {
    SubscriberInfo {
        kind: SubscriberKind::Session,
        address: "127.0.0.1:9".into(),
        client_name: "consumer".into(),
        session: None,
        deltas: false,
        ignores_empty_lists: false,
    }
}

#[tokio::test]
async fn an_instance_kept_by_a_session_belongs_to_it() {
    let r = registry();
    let owner = r.open_session("127.0.0.1:1".into(), "owner".into(), "c1".into());
    let stranger = r.open_session("127.0.0.1:2".into(), "stranger".into(), "c2".into());
    r.register(svc(), inst(1), LivenessRequest::Session(owner.clone()))
        .await
        .unwrap();
    r.register(svc(), inst(2), lease()).await.unwrap();
    let before = r.entries(&svc()).1;

    let by_lease = r.register(svc(), inst(1), lease()).await.unwrap_err();
    let by_stranger = r
        .register(svc(), inst(1), LivenessRequest::Session(stranger.clone()))
        .await
        .unwrap_err();
    let by_delete = r.deregister(&svc(), &inst(1).key, false).await.unwrap_err();
    let by_other_session = r
        .deregister_on_session(&stranger, &svc(), &inst(1).key)
        .unwrap_err();
    for err in [&by_lease, &by_stranger, &by_delete, &by_other_session] {
        assert!(err.is_conflict(), "{err}");
    }
    for err in [&by_lease, &by_stranger, &by_delete] {
        let text = err.to_string();
        assert!(
            text.contains("kept alive by session") && text.contains("owner"),
            "names the owner kind: {text}"
        );
    }
    let after = r.entries(&svc()).1;
    assert_eq!(
        format!("{before:?}"),
        format!("{after:?}"),
        "refusals changed nothing"
    );
    // Offline is how another client takes it out of traffic.
    r.set_enabled(&svc(), &inst(1).key, false, false)
        .await
        .unwrap();
    r.set_enabled(&svc(), &inst(1).key, true, false)
        .await
        .unwrap();
    // Force removes it.
    r.deregister(&svc(), &inst(1).key, true).await.unwrap();
    assert!(r.instance(&svc(), &inst(1).key).is_err());
}

#[tokio::test]
async fn a_reconnect_of_the_same_client_takes_its_instances_over() {
    let r = registry();
    let old = r.open_session("127.0.0.1:1".into(), "app".into(), "same".into());
    r.register(svc(), inst(1), LivenessRequest::Session(old.clone()))
        .await
        .unwrap();
    let new = r.open_session("127.0.0.1:5".into(), "app".into(), "same".into());
    r.register(svc(), inst(1), LivenessRequest::Session(new.clone()))
        .await
        .unwrap();
    // The old connection is seen closing only now: the instance is the new session's.
    r.close_session(&old);
    assert!(r.view(&svc()).contains(&inst(1).key));
    let (_, entries) = r.entries(&svc());
    assert_eq!(entries[0].liveness, Liveness::Session(new.clone()));
    // A client without an id never takes over.
    let anonymous = r.open_session("127.0.0.1:6".into(), "x".into(), String::new());
    let other = r.open_session("127.0.0.1:7".into(), "x".into(), String::new());
    r.register(svc(), inst(2), LivenessRequest::Session(anonymous))
        .await
        .unwrap();
    let err = r
        .register(svc(), inst(2), LivenessRequest::Session(other))
        .await
        .unwrap_err();
    assert!(err.is_conflict());
}

#[tokio::test(start_paused = true)]
async fn wait_ready_completes_on_acks_of_a_revision_holding_the_instance() {
    let r = registry();
    r.register(svc(), inst(1), lease()).await.unwrap();
    let (a, mut rx) = r.subscribe(&svc(), session_info()).unwrap();
    let (frozen, _rx) = r.subscribe(&svc(), session_info()).unwrap();
    r.ack(&frozen, 1);
    let (revision, _) = r.register(svc(), inst(2), lease()).await.unwrap();
    // Offline: no revision can make it ready.
    let mut third = inst(3);
    third.enabled = false;
    r.register(svc(), third, lease()).await.unwrap();
    let err = r
        .wait_ready(&svc(), &inst(3).key, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(err.is_conflict(), "{err}");
    let err = r
        .wait_ready(&svc(), &inst(9).key, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(err.is_not_found());

    // One subscriber acks, the frozen one does not: the wait ends at its timeout naming it.
    let held = *rx.borrow_and_update();
    r.ack(&a, held);
    let report = r
        .wait_ready(&svc(), &inst(2).key, Duration::from_secs(2))
        .await
        .unwrap();
    assert!(report.revision >= revision);
    assert!(!report.complete);
    assert_eq!(report.waited_ms, 2000);
    assert_eq!(report.laggards.len(), 1);
    assert_eq!(report.laggards[0].id, frozen);
    // Once the frozen one leaves, the wait completes at once.
    r.unsubscribe(&frozen);
    let report = r
        .wait_ready(&svc(), &inst(2).key, Duration::from_secs(2))
        .await
        .unwrap();
    assert!(report.complete, "{report:?}");
    assert_eq!(report.waited_ms, 0);
    assert_eq!(report.acked.len(), 1);
}

/// A readiness wait overtaken by an offline of its instance ends in a conflict (the CLI exits
/// 1, not 3: waiting longer would not help), not in a timeout-like incomplete report.
#[tokio::test(start_paused = true)]
async fn a_readiness_wait_overtaken_by_an_offline_is_a_conflict() {
    let r = registry();
    r.register(svc(), inst(1), lease()).await.unwrap();
    r.register(svc(), inst(2), lease()).await.unwrap();
    // A subscriber that never acks: the wait must still end when the instance leaves.
    let (_lazy, _rx) = r.subscribe(&svc(), session_info()).unwrap();
    let started = tokio::time::Instant::now();
    let wait = tokio::spawn({
        let r = r.clone();
        async move {
            r.wait_ready(&svc(), &inst(2).key, Duration::from_secs(30))
                .await
        }
    });
    tokio::task::yield_now().await;
    r.update(
        &svc(),
        &inst(2).key,
        Patch {
            enabled: Some(false),
            ..Patch::default()
        },
    )
    .await
    .unwrap();
    let err = wait.await.unwrap().unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "ended at the offline, not at the 30 s timeout: {:?}",
        started.elapsed()
    );
    assert!(matches!(err, RegistryError::LeftView { .. }), "{err}");
    assert!(err.is_conflict());
    assert!(err.to_string().contains("left the consumer view"), "{err}");
}

/// An instance that is not a session's own cannot be registered by a different kind either.
#[tokio::test]
async fn kinds_stay_apart_under_a_race() {
    for _ in 0..50 {
        let r = registry();
        let persistent = {
            let r = r.clone();
            tokio::spawn(async move {
                r.register(svc(), inst(1), LivenessRequest::Probe(ProbeSpec::default()))
                    .await
            })
        };
        let ephemeral = {
            let r = r.clone();
            tokio::spawn(async move { r.register(svc(), inst(2), lease()).await })
        };
        let (p, e) = (persistent.await.unwrap(), ephemeral.await.unwrap());
        let kinds: Vec<bool> = r
            .entries(&svc())
            .1
            .iter()
            .map(|e| e.instance.ephemeral)
            .collect();
        assert_eq!(kinds.len(), 1, "both kinds in one service: {p:?} {e:?}");
        assert!(p.is_ok() != e.is_ok());
    }
}

/// Two `write` principals register the same new instance at once: the owner rule is decided in
/// the critical section that applies the registration, so exactly one wins and owns it, the
/// other is refused (a takeover needs `admin`), for every instance of the race.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_registrations_of_one_instance_by_two_principals_have_one_owner() {
    use crate::auth::file::grant;
    use crate::auth::{AuthError, Caller, Principal, Role};

    let r = registry();
    let principal = |name: &str| {
        Caller::Principal(Arc::new(Principal::given(
            name,
            vec![grant("public", Role::Write)],
        )))
    };
    let (alice, bob) = (principal("alice"), principal("bob"));
    for n in 1..=50u8 {
        let barrier = Arc::new(Barrier::new(2));
        let race = |caller: Caller| {
            let (r, barrier) = (r.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                r.register_as(svc(), inst(n), lease(), caller).await
            })
        };
        let (a, b) = (race(alice.clone()), race(bob.clone()));
        let (a, b) = (a.await.unwrap(), b.await.unwrap());
        let winner = match (&a, &b) {
            (Ok(_), Err(_)) => "alice",
            (Err(_), Ok(_)) => "bob",
            other => panic!("instance {n}: exactly one registration wins: {other:?}"),
        };
        let refused = a.err().or(b.err()).unwrap();
        assert!(
            matches!(
                refused,
                RegistryError::Refused(AuthError::Forbidden {
                    rule: "register",
                    ..
                })
            ),
            "{refused:?}"
        );
        assert_eq!(r.owner(&svc(), &inst(n).key).as_deref(), Some(winner));
    }
}
