//! The registry's own stall (issue 9 part 3; engine::hold), on tokio's paused clock: the clock
//! jumps with no task running, as after SIGSTOP/SIGCONT of the server.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use gangway_store::MemoryStore;

use super::*;

use crate::engine::hold::ClockReading;

fn stalling_registry() -> Registry {
    let config = Config {
        stall_recovery: Duration::from_secs(5),
        stall_grace: Duration::from_secs(20),
        ..Config::for_tests()
    };
    registry_with(Arc::new(MemoryStore::default()), config)
}

fn short_lease() -> LivenessRequest {
    LivenessRequest::Lease {
        ttl: Some(Duration::from_secs(1)),
        delete_timeout: Some(Duration::from_secs(2)),
    }
}

fn watcher() -> SubscriberInfo {
    SubscriberInfo {
        kind: SubscriberKind::Watch,
        address: "127.0.0.1:9".into(),
        client_name: "watch".into(),
        session: None,
        deltas: false,
        ignores_empty_lists: false,
    }
}

#[tokio::test(start_paused = true)]
async fn a_stall_extends_leases_holds_pushes_and_keeps_sessions_that_come_back() {
    let r = stalling_registry();
    let app = r.open_session("127.0.0.1:1".into(), "app".into(), "app-1".into());
    let gone = r.open_session("127.0.0.1:2".into(), "gone".into(), "gone-1".into());
    r.register(svc(), inst(1), LivenessRequest::Session(app.clone()))
        .await
        .unwrap();
    r.register(svc(), inst(2), short_lease()).await.unwrap();
    r.register(svc(), inst(3), LivenessRequest::Session(gone.clone()))
        .await
        .unwrap();
    let (id, rx) = r.subscribe(&svc(), watcher()).unwrap();
    let pushes = r.full_pushes(id.clone(), rx);
    futures::pin_mut!(pushes);
    let first = pushes.next().await.unwrap();
    assert_eq!(first.view.instances.len(), 3);
    r.ack(&id, first.view.revision);
    r.heartbeat(&svc(), &inst(2).key).unwrap();

    // The registry freezes for 10 s; the lease had 1 s of TTL. On resume the kernel has the
    // sessions' connections closed (their clients gave up on the frozen server).
    tokio::time::advance(Duration::from_secs(10)).await;
    r.close_session(&app);
    r.close_session(&gone);
    assert_eq!(r.inner.metrics.stalls.get(), 1, "the stall was noticed");
    assert!(r.warming_up(), "snapshots held back during the recovery");
    let view = r.view(&svc());
    assert_eq!(
        view.instances.len(),
        3,
        "nothing evicted: {:?}",
        view.instances
    );
    assert!(view.instances.iter().all(|i| i.healthy));
    let (_, entries) = r.entries(&svc());
    assert_eq!(
        entries
            .iter()
            .filter(|e| matches!(e.liveness, Liveness::Grace { .. }))
            .count(),
        2
    );

    // Nothing is pushed while the sessions come back...
    let quiet = tokio::time::timeout(Duration::from_secs(2), pushes.next()).await;
    assert!(quiet.is_err(), "pushed during the recovery: {quiet:?}");
    // ...and the app's client reconnects and re-registers (a new session, any client may
    // take over a grace instance); the lease's client heartbeats at TTL/3 again.
    let again = r.open_session("127.0.0.1:3".into(), "app".into(), "app-1".into());
    r.register(svc(), inst(1), LivenessRequest::Session(again.clone()))
        .await
        .unwrap();
    let beats = tokio::spawn({
        let r = r.clone();
        async move {
            for _ in 0..100 {
                r.heartbeat(&svc(), &inst(2).key).unwrap();
                tokio::time::sleep(Duration::from_millis(333)).await;
            }
        }
    });

    // When the recovery ends pushes resume; the instance whose client has not come back yet
    // stays in grace (a Nacos SDK's redo comes 14-28 s after the resume)...
    let next = tokio::time::timeout(Duration::from_secs(10), pushes.next())
        .await
        .expect("pushes resume after the recovery")
        .unwrap();
    let keys: Vec<_> = next.view.instances.iter().map(|i| i.key.clone()).collect();
    assert_eq!(keys, vec![inst(1).key, inst(2).key, inst(3).key]);
    assert!(!r.warming_up());
    let (_, entries) = r.entries(&svc());
    assert_eq!(entries[0].liveness, Liveness::Session(again));
    // ...and goes, in one revision, when its grace (20 s from its session's end) is over.
    r.ack(&id, next.view.revision);
    let resumed = tokio::time::Instant::now();
    let gone = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let push = pushes.next().await.unwrap();
            r.ack(&id, push.view.revision);
            if push.view.revision > next.view.revision {
                return push;
            }
        }
    })
    .await
    .expect("a new revision when the grace ends");
    assert!(
        resumed.elapsed() >= Duration::from_secs(10),
        "not before the grace ends"
    );
    assert_eq!(gone.view.revision, next.view.revision + 1);
    let keys: Vec<_> = gone.view.instances.iter().map(|i| i.key.clone()).collect();
    assert_eq!(keys, vec![inst(1).key, inst(2).key]);
    beats.abort();
}

/// A Nacos client that comes back after the recovery, within its grace, keeps its instance
/// in the view throughout; a second stall during the grace moves its deadline on.
#[tokio::test(start_paused = true)]
async fn a_late_client_within_its_grace_keeps_its_instance_through_a_second_stall() {
    let r = stalling_registry();
    let late = r.open_session("127.0.0.1:1".into(), "late".into(), "late-1".into());
    r.register(svc(), inst(1), LivenessRequest::Session(late.clone()))
        .await
        .unwrap();
    r.register(svc(), inst(2), short_lease()).await.unwrap();
    tokio::time::advance(Duration::from_secs(10)).await;
    r.close_session(&late);
    // 15 s on (recovery over at 5 s), the registry stalls again for 10 s: the grace, due at
    // 20 s, moves to 30 s.
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert!(
        r.view(&svc()).contains(&inst(1).key),
        "in grace after the recovery"
    );
    tokio::time::advance(Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(r.inner.metrics.stalls.get(), 2);
    assert!(
        r.view(&svc()).contains(&inst(1).key),
        "a second stall does not end the grace"
    );
    let again = r.open_session("127.0.0.1:3".into(), "late".into(), "late-1".into());
    r.register(svc(), inst(1), LivenessRequest::Session(again.clone()))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    let (_, entries) = r.entries(&svc());
    let kept = entries
        .iter()
        .find(|e| e.instance.key == inst(1).key)
        .unwrap();
    assert_eq!(kept.liveness, Liveness::Session(again));
}

#[tokio::test(start_paused = true)]
async fn lease_expiry_resumes_after_the_recovery() {
    let r = stalling_registry();
    r.register(svc(), inst(1), short_lease()).await.unwrap();
    tokio::time::advance(Duration::from_secs(30)).await;
    // Let the background timer notice and run through the recovery.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(r.inner.metrics.stalls.get(), 1);
    assert!(r.instance(&svc(), &inst(1).key).unwrap().healthy);
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        r.instance(&svc(), &inst(1).key).unwrap().healthy,
        "no expiry during the recovery"
    );
    // No heartbeat came after the resume: once the recovery is over, the lease is expired.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        r.instance(&svc(), &inst(1).key).is_err(),
        "really gone: removed"
    );
}

#[tokio::test(start_paused = true)]
async fn a_short_scheduling_delay_is_not_a_stall() {
    let r = stalling_registry();
    let s = r.open_session("127.0.0.1:1".into(), "a".into(), "a".into());
    r.register(svc(), inst(1), LivenessRequest::Session(s.clone()))
        .await
        .unwrap();
    tokio::time::advance(Duration::from_millis(900)).await;
    r.close_session(&s);
    assert_eq!(r.inner.metrics.stalls.get(), 0);
    assert!(
        r.view(&svc()).instances.is_empty(),
        "a session that ends normally takes its instances at once"
    );
}

/// A drain applied during the recovery, then the drained process's session ends (it gave up
/// on the frozen registry) and its instance waits in grace: a new process on the same address
/// (another client id) takes it over online, as after any leave; the old process reconnecting
/// (same client id) finds it still drained.
#[tokio::test(start_paused = true)]
async fn a_new_process_taking_over_a_drained_grace_instance_serves() {
    let r = stalling_registry();
    let keep = r.open_session("127.0.0.1:9".into(), "keep".into(), "keep-1".into());
    r.register(svc(), inst(9), LivenessRequest::Session(keep.clone()))
        .await
        .unwrap();
    for (old_id, new_id, serves) in [("old-1", "new-1", true), ("old-2", "old-2", false)] {
        let old = r.open_session("127.0.0.1:1".into(), "app".into(), old_id.into());
        r.register(svc(), inst(1), LivenessRequest::Session(old.clone()))
            .await
            .unwrap();
        tokio::time::advance(Duration::from_secs(10)).await;
        r.drain(&svc(), &inst(1).key, Duration::from_millis(10), false)
            .await
            .unwrap();
        r.close_session(&old);
        let (_, entries) = r.entries(&svc());
        let one = entries
            .iter()
            .find(|e| e.instance.key == inst(1).key)
            .unwrap();
        assert!(
            matches!(one.liveness, Liveness::Grace { .. }),
            "{:?}",
            one.liveness
        );
        let new = r.open_session("127.0.0.1:2".into(), "app".into(), new_id.into());
        r.register(svc(), inst(1), LivenessRequest::Session(new.clone()))
            .await
            .unwrap();
        let enabled = r.instance(&svc(), &inst(1).key).unwrap().enabled;
        assert_eq!(enabled, serves, "client {new_id} after {old_id}");
        r.close_session(&new);
        // Let the recovery end so that the next round's stall is a new one.
        tokio::time::sleep(Duration::from_secs(6)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_gap_the_process_spent_working_is_not_a_stall() {
    // 3 s between two looks at the clock with 3 s of CPU used meanwhile: the registry was busy
    // (a burst of pushes on a small machine), not stopped; 3 s with 0.1 s used: stopped.
    let r = stalling_registry();
    let (t, cpu) = (Instant::now(), super::super::hold::process_cpu_time());
    assert_eq!(r.observe_clock_at(t, cpu), ClockReading::Normal);
    let busy = r.observe_clock_at(t + Duration::from_secs(3), cpu + Duration::from_secs(3));
    assert_eq!(busy, ClockReading::Normal);
    // Starved by other processes, it still ran a quarter of the time: slow, not stopped (a
    // tester saw 2-5 s gaps on a 2-core machine at load 9 with no SIGSTOP).
    let starved = r.observe_clock_at(t + Duration::from_secs(7), cpu + Duration::from_secs(4));
    assert_eq!(starved, ClockReading::Normal);
    assert_eq!(r.inner.metrics.stalls.get(), 0);
    let stopped = r.observe_clock_at(
        t + Duration::from_secs(10),
        cpu + Duration::from_millis(4_100),
    );
    assert_eq!(stopped, ClockReading::Recovering);
    assert_eq!(r.inner.metrics.stalls.get(), 1);
}

/// A session that ends during a stall leaves its instance in grace; when a reload then
/// removes its owner's token, nobody can register it again: it goes at once, and an instance
/// in grace whose owner is still known waits for its client (a tester saw a revoked token's
/// instance serve on for 60 s after SIGSTOP, SIGHUP, SIGCONT).
#[tokio::test(start_paused = true)]
async fn a_reload_ends_the_grace_of_instances_whose_owner_is_gone() {
    let r = stalling_registry();
    let mut sessions = Vec::new();
    for (i, owner) in [(1, "token:gone"), (2, "alice")] {
        let s = r.open_session(format!("127.0.0.1:{i}"), "c".into(), format!("c-{i}"));
        sessions.push(s.clone());
        r.register_owned(
            svc(),
            inst(i),
            LivenessRequest::Session(s.clone()),
            Some(owner.into()),
        )
        .await
        .unwrap();
        // The stall below ends the connections while the registry is frozen.
        tokio::time::advance(Duration::from_secs(if i == 2 { 10 } else { 0 })).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(r.inner.metrics.stalls.get(), 1);
    for s in &sessions {
        r.close_session(s);
    }
    let (_, entries) = r.entries(&svc());
    let in_grace = entries
        .iter()
        .filter(|e| matches!(e.liveness, Liveness::Grace { .. }))
        .count();
    assert_eq!(in_grace, 2, "{entries:?}");
    let before = r.view(&svc()).revision;
    assert_eq!(r.end_grace_of_unknown_owners(|owner| owner == "alice"), 1);
    let (_, entries) = r.entries(&svc());
    let keys: Vec<_> = entries.iter().map(|e| e.instance.key.clone()).collect();
    assert_eq!(keys, [inst(2).key]);
    assert!(r.view(&svc()).revision > before);
    assert_eq!(r.end_grace_of_unknown_owners(|owner| owner == "alice"), 0);
}
