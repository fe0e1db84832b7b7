//! Against real etcd members (Debian's `etcd-server`) on loopback: gangway-testkit's
//! [`EtcdCluster`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use etcd_client::Client;
use gangway_core::model::ServiceKey;
use gangway_store::conformance::sample;
use gangway_store::{Contents, Store, StoreError, Write};
use gangway_testkit::etcd::EtcdCluster;

use super::*;

fn config(endpoints: Vec<String>, prefix: &str) -> EtcdConfig {
    EtcdConfig {
        endpoints,
        prefix: prefix.into(),
        ..EtcdConfig::default()
    }
}

/// A runtime for the test's own etcd calls.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// A plain etcd client for looking behind the store, with the runtime it runs on.
fn raw(endpoint: &str) -> (tokio::runtime::Runtime, Client) {
    let rt = runtime();
    let client = rt
        .block_on(Client::connect([endpoint], None))
        .expect("connect");
    (rt, client)
}

#[test]
fn etcd_store_conforms() {
    let cluster = EtcdCluster::start(1).expect("etcd");
    let n = AtomicUsize::new(0);
    // A fresh prefix per store: each starts empty.
    gangway_store::conformance::run(|| {
        let prefix = format!("/conformance{}", n.fetch_add(1, Ordering::SeqCst));
        EtcdStore::connect(config(cluster.endpoints(), &prefix)).expect("connect")
    });
    assert_eq!(n.load(Ordering::SeqCst), 6);
}

#[test]
fn writes_land_on_the_documented_keys_and_load_reads_pages_at_one_revision() {
    let cluster = EtcdCluster::start(1).expect("etcd");
    let store = EtcdStore::connect(EtcdConfig {
        page_size: 7,
        ..config(cluster.endpoints(), "/gangway")
    })
    .expect("connect");
    let svc = ServiceKey::named("orders");
    let mut batch: Vec<Write> = (0..30)
        .map(|n| Write::PutInstance(svc.clone(), sample(n)))
        .collect();
    batch.push(Write::PutService(svc.clone(), Default::default()));
    store.apply(&batch).expect("apply");

    let (rt, mut client) = raw(&cluster.endpoint(0));
    let got = rt
        .block_on(client.get(
            "/gangway/v1/instances/public/DEFAULT_GROUP/orders/10.0.0.1:8080#DEFAULT",
            None,
        ))
        .expect("get");
    let value: StoredInstance = serde_json::from_slice(got.kvs()[0].value()).expect("json");
    assert_eq!(value, sample(1));
    let all = rt
        .block_on(client.get("/gangway/v1/", Some(GetOptions::new().with_prefix())))
        .expect("get");
    assert_eq!(all.count(), 31);

    // 30 instances in pages of 7: 5 pages, all at the first page's revision.
    let (contents, revision) = store.load_at().expect("load");
    let mut expected = Contents::default();
    expected.apply(&batch);
    assert_eq!(contents, expected);
    assert_eq!(contents.instances[&svc].len(), 30);
    assert_eq!(revision, all.header().expect("header").revision());
}

#[test]
fn undecodable_values_and_foreign_keys_are_reported_with_their_key() {
    let cluster = EtcdCluster::start(1).expect("etcd");
    let store = EtcdStore::connect(config(cluster.endpoints(), "/g")).expect("connect");
    let (rt, mut client) = raw(&cluster.endpoint(0));
    let key = "/g/v1/services/public/DEFAULT_GROUP/orders";
    rt.block_on(client.put(key, "{not json", None))
        .expect("put");
    let e = store.load().expect_err("corrupt");
    assert!(
        matches!(&e, StoreError::Corrupt { table: "etcd services", message } if message.contains(key)),
        "{e}"
    );

    rt.block_on(client.delete(key, None)).expect("delete");
    let foreign = "/g/v1/instances/public/DEFAULT_GROUP/orders/no-port";
    rt.block_on(client.put(foreign, "{}", None)).expect("put");
    let e = store.load().expect_err("foreign key").to_string();
    assert!(
        e.contains("a key outside the layout") && e.contains(foreign),
        "{e}"
    );

    // A value whose instance is not the one its key names.
    rt.block_on(client.delete(foreign, None)).expect("delete");
    let svc = ServiceKey::named("orders");
    let wrong = store
        .layout()
        .instance(Space::Instances, &svc, &sample(2).instance.key);
    let json = serde_json::to_string(&sample(1)).expect("json");
    rt.block_on(client.put(wrong.as_str(), json, None))
        .expect("put");
    let e = store.load().expect_err("mismatch").to_string();
    assert!(
        e.contains(&wrong) && e.contains("holds instance 10.0.0.1:8080"),
        "{e}"
    );
}

#[test]
fn an_etcd_that_does_not_answer_fails_connect_within_its_timeout() {
    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let started = Instant::now();
    let e = EtcdStore::connect(EtcdConfig {
        connect_timeout: Duration::from_millis(500),
        ..config(vec![format!("http://127.0.0.1:{port}")], "/g")
    })
    .expect_err("nothing listens")
    .to_string();
    let took = started.elapsed();
    println!("connect to a closed port failed after {took:?}: {e}");
    assert!(e.contains(&format!("127.0.0.1:{port}")), "{e}");
    // The client connects lazily, so the proof read meets the timeout: 500 ms, not more
    // than twice that.
    assert!(took < Duration::from_secs(2), "{took:?}");

    let e = EtcdStore::connect(config(vec![], "/g"))
        .expect_err("no endpoints")
        .to_string();
    assert!(e.contains("endpoints: must list 1-32 URLs"), "{e}");
}

/// The member that leads the Raft group, found by asking each for its status.
fn leader(cluster: &EtcdCluster) -> usize {
    let rt = runtime();
    rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            for i in 0..cluster.len() {
                let Ok(mut c) = Client::connect([cluster.endpoint(i)], None).await else {
                    continue;
                };
                if let Ok(status) = c.status().await {
                    let me = status.header().map(|h| h.member_id());
                    if me == Some(status.leader()) {
                        return i;
                    }
                }
            }
            assert!(Instant::now() < deadline, "no etcd leader within 10 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
}

#[test]
fn killing_the_etcd_leader_loses_no_acknowledged_write_and_writes_continue() {
    let mut cluster = EtcdCluster::start(3).expect("etcd");
    let store = EtcdStore::connect(config(cluster.endpoints(), "/gangway")).expect("connect");
    let svc = ServiceKey::named("orders");
    // Each write is its own batch (one instance put and a settings put), as the engine's
    // group commit sends them; every acknowledged one must survive.
    let write = |n: u16| {
        let mut settings = gangway_core::model::ServiceSettings::default();
        settings.metadata.insert("last".into(), n.to_string());
        store.apply(&[
            Write::PutInstance(svc.clone(), sample(n)),
            Write::PutService(svc.clone(), settings),
        ])
    };
    let mut acked = Vec::new();
    for n in 0..100 {
        write(n).expect("before the kill every write succeeds");
        acked.push(n);
    }
    let old_leader = leader(&cluster);
    let killed_at = Instant::now();
    cluster.kill9(old_leader);
    let mut failed = 0;
    let mut first_after = None;
    let deadline = killed_at + Duration::from_secs(20);
    let mut n = 100;
    while acked.len() < 200 {
        assert!(
            Instant::now() < deadline,
            "writes did not continue within 20 s"
        );
        match write(n) {
            Ok(()) => {
                acked.push(n);
                first_after.get_or_insert_with(|| killed_at.elapsed());
            }
            Err(e) => {
                failed += 1;
                println!("write {n} failed: {e}");
            }
        }
        n += 1;
    }
    let new_leader = leader(&cluster);
    let (contents, _) = store.load_at().expect("load");
    let instances = &contents.instances[&svc];
    let lost: Vec<u16> = acked
        .iter()
        .copied()
        .filter(|n| !instances.contains_key(&sample(*n).instance.key))
        .collect();
    println!(
        "leader m{old_leader} killed: first acknowledged write {:?} later, {failed} failed \
         writes, new leader m{new_leader}, {} acknowledged, {} lost",
        first_after.expect("a write after the kill"),
        acked.len(),
        lost.len()
    );
    assert_eq!(lost, Vec::<u16>::new(), "acknowledged writes lost");
    assert_ne!(new_leader, old_leader);
    assert_eq!(
        contents.services[&svc].metadata["last"],
        (n - 1).to_string()
    );

    // The killed member comes back, catches up, and serves the same contents on its own.
    cluster.restart(old_leader).expect("restart");
    let alone = EtcdStore::connect(config(vec![cluster.endpoint(old_leader)], "/gangway"))
        .expect("connect to the restarted member");
    let caught_up = (0..500).find_map(|_| {
        let c = alone.load().expect("load");
        if c == contents {
            Some(c)
        } else {
            std::thread::sleep(Duration::from_millis(20));
            None
        }
    });
    assert!(
        caught_up.is_some(),
        "the restarted member did not catch up in 10 s"
    );
}

#[test]
fn a_frozen_member_costs_one_attempt_then_calls_stay_on_another() {
    let cluster = EtcdCluster::start(3).expect("etcd");
    // Freeze a member that is not the leader (its sockets stay open, it answers nothing), and
    // list it first: the store starts with it, the worst case.
    let frozen = (leader(&cluster) + 1) % 3;
    let mut endpoints = cluster.endpoints();
    endpoints.swap(0, frozen);
    let store = EtcdStore::connect(config(endpoints, "/gangway")).expect("connect");
    let svc = ServiceKey::named("orders");
    cluster.freeze(frozen);
    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    for n in 0..20 {
        let one = Instant::now();
        store
            .apply(&[Write::PutInstance(svc.clone(), sample(n))])
            .expect("write with a member frozen");
        slowest = slowest.max(one.elapsed());
    }
    let took = started.elapsed();
    cluster.thaw(frozen);
    println!("20 writes with member m{frozen} frozen took {took:?}, the slowest {slowest:?}");
    // One attempt (1.25 s) is lost to the frozen member, then calls stay on another.
    let attempt = DEFAULT_REQUEST_TIMEOUT / ATTEMPTS_PER_CALL;
    assert!(
        slowest >= attempt,
        "the first write met the frozen member: {slowest:?}"
    );
    assert!(slowest < attempt + Duration::from_secs(1), "{slowest:?}");
    assert!(took < attempt + Duration::from_secs(2), "{took:?}");
    assert_eq!(store.load().expect("load").instances[&svc].len(), 20);
}

use config::DEFAULT_REQUEST_TIMEOUT;

/// The next event of `watch`, within 20 s.
fn next_event(rt: &tokio::runtime::Runtime, watch: &mut PrefixWatch) -> WatchEvent {
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(20), watch.next())
            .await
            .expect("an event within 20 s")
            .expect("the watch runs")
            .expect("a decodable event")
    })
}

fn put(n: u16) -> Write {
    Write::PutInstance(ServiceKey::named("orders"), sample(n))
}

#[test]
fn the_watch_delivers_typed_changes_per_revision_from_the_load_revision() {
    let cluster = EtcdCluster::start(1).expect("etcd");
    let store = EtcdStore::connect(config(cluster.endpoints(), "/gangway")).expect("connect");
    store.apply(&[put(1)]).expect("before the load");
    let (loaded, revision) = store.load_at().expect("load");
    let mut watch = store.watch(revision + 1);
    let svc = ServiceKey::named("orders");
    let mark = gangway_core::model::OfflineMark { since_ms: 7 };
    let batches = vec![
        vec![put(2), Write::PutService(svc.clone(), Default::default())],
        vec![Write::PutOfflineMark(
            svc.clone(),
            sample(2).instance.key,
            mark,
        )],
        vec![Write::DeleteInstance(svc.clone(), sample(1).instance.key)],
    ];
    for batch in &batches {
        store.apply(batch).expect("apply");
    }
    // A key of a space gangway does not know (a later version's) is skipped, and one outside
    // the prefix is not seen.
    let (rt, mut client) = raw(&cluster.endpoint(0));
    rt.block_on(client.put("/gangway/v1/later/n1", "{}", None))
        .expect("put");
    rt.block_on(client.put("/other/v1/services/a/b/c", "{}", None))
        .expect("put");
    store.apply(&[put(3)]).expect("apply");

    let mut state = loaded;
    let mut revisions = Vec::new();
    let mut seen = Vec::new();
    while seen.len() < 4 {
        let WatchEvent::Changes { revision, changes } = next_event(&rt, &mut watch) else {
            panic!("no re-list without a compaction")
        };
        revisions.push(revision);
        state.apply(&changes);
        seen.push(changes);
    }
    assert_eq!(seen[..3], batches[..], "each batch is one revision, typed");
    // The revision of the unknown key changed no durable state: left out.
    assert_eq!(seen[3], vec![put(3)]);
    assert!(revisions.windows(2).all(|w| w[0] < w[1]), "{revisions:?}");
    assert_eq!(revisions[0], revision + 1);
    assert_eq!(state, store.load().expect("load"), "load + changes = load");
    assert_eq!((watch.resumes(), watch.relists()), (0, 0));
}

#[test]
fn the_watch_resumes_after_a_member_restart_with_nothing_lost_or_repeated() {
    let mut cluster = EtcdCluster::start(1).expect("etcd");
    let store = EtcdStore::connect(config(cluster.endpoints(), "/gangway")).expect("connect");
    let (_, revision) = store.load_at().expect("load");
    let mut watch = store.watch(revision + 1);
    let rt = runtime();
    let mut got = Vec::new();
    for n in 0..5 {
        store.apply(&[put(n)]).expect("before the restart");
    }
    while got.len() < 5 {
        if let WatchEvent::Changes { changes, .. } = next_event(&rt, &mut watch) {
            got.extend(changes);
        }
    }
    let restarted = Instant::now();
    cluster.kill9(0);
    cluster.restart(0).expect("restart");
    println!("etcd member restarted in {:?}", restarted.elapsed());
    for n in 5..10 {
        store.apply(&[put(n)]).expect("after the restart");
    }
    while got.len() < 10 {
        if let WatchEvent::Changes { changes, .. } = next_event(&rt, &mut watch) {
            got.extend(changes);
        }
    }
    let expected: Vec<Write> = (0..10).map(put).collect();
    assert_eq!(got, expected, "every change once, in order");
    println!(
        "watch across a member restart: {} resumes, {} re-lists",
        watch.resumes(),
        watch.relists()
    );
    assert!(watch.resumes() >= 1);
    assert_eq!(watch.relists(), 0);
    // Nothing more is pending: no change was delivered twice.
    let extra =
        rt.block_on(async { tokio::time::timeout(Duration::from_millis(300), watch.next()).await });
    assert!(extra.is_err(), "{extra:?}");
}

#[test]
fn a_watch_behind_a_compaction_relists_then_follows() {
    let cluster = EtcdCluster::start(3).expect("etcd");
    // The watch's member is the first endpoint; the writer talks to the two others.
    let store = EtcdStore::connect(config(cluster.endpoints(), "/gangway")).expect("connect");
    let writer =
        EtcdStore::connect(config(cluster.endpoints()[1..].to_vec(), "/gangway")).expect("writer");
    let (_, revision) = store.load_at().expect("load");
    let mut watch = store.watch(revision + 1);
    let rt = runtime();
    writer.apply(&[put(1)]).expect("apply");
    assert!(matches!(
        next_event(&rt, &mut watch),
        WatchEvent::Changes { .. }
    ));

    // The watch's member freezes; meanwhile changes land and etcd compacts them away.
    cluster.freeze(0);
    let frozen = Instant::now();
    for n in 2..12 {
        writer.apply(&[put(n)]).expect("apply");
    }
    writer
        .apply(&[Write::DeleteInstance(
            ServiceKey::named("orders"),
            sample(2).instance.key,
        )])
        .expect("apply");
    let mut client = rt
        .block_on(Client::connect([cluster.endpoint(1)], None))
        .expect("connect");
    let (current, _) = writer.load_at().expect("load");
    let now = rt
        .block_on(client.get("/gangway/v1/", Some(GetOptions::new().with_count_only())))
        .expect("revision")
        .header()
        .expect("header")
        .revision();
    rt.block_on(client.compact(now, None)).expect("compact");

    // The broken stream is noticed (gRPC keepalive), the resume point is compacted: re-list.
    let event = next_event(&rt, &mut watch);
    let took = frozen.elapsed();
    cluster.thaw(0);
    let WatchEvent::Relisted { revision, contents } = event else {
        panic!("expected a re-list, got {event:?}")
    };
    println!("re-listed at revision {revision} {took:?} after the member froze");
    assert!(revision >= now, "{revision} < {now}");
    assert_eq!(contents, current);
    assert_eq!(watch.relists(), 1);
    // And changes follow from the listing's revision.
    writer.apply(&[put(50)]).expect("apply");
    match next_event(&rt, &mut watch) {
        WatchEvent::Changes {
            revision: r,
            changes,
        } => {
            assert_eq!(changes, vec![put(50)]);
            assert!(r > revision);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_node_lease_is_kept_alive_past_its_ttl_and_lost_when_etcd_is_gone() {
    let mut cluster = EtcdCluster::start(1).expect("etcd");
    let store = EtcdStore::connect(config(cluster.endpoints(), "/gangway")).expect("connect");
    let ttl = Duration::from_secs(2);
    let lease = store.grant_node_lease(ttl).expect("grant");
    assert!(lease.id() > 0);
    // A key bound to the lease outlives three TTLs while the lease is kept alive.
    let (rt, mut client) = raw(&cluster.endpoint(0));
    let key = "/gangway/v1/nodes/n1";
    let options = etcd_client::PutOptions::new().with_lease(lease.id());
    rt.block_on(client.put(key, "{}", Some(options)))
        .expect("put");
    let started = Instant::now();
    let mut renewals = 0;
    while started.elapsed() < 3 * ttl {
        match lease.state() {
            LeaseState::Alive { renewals: r, .. } => renewals = r,
            lost => panic!("{lost:?}"),
        }
        let found = rt.block_on(client.get(key, None)).expect("get").count();
        assert_eq!(found, 1, "the key outlives its lease's ttl");
        std::thread::sleep(Duration::from_millis(100));
    }
    println!(
        "node lease {:x}: {renewals} renewals in {:?}",
        lease.id(),
        3 * ttl
    );
    assert!(renewals >= 5, "renewed every ttl/3: {renewals}");

    // etcd gone: lost within the TTL after the last renewal, and it stays lost.
    let mut changes = lease.subscribe();
    cluster.kill9(0);
    let killed = Instant::now();
    rt.block_on(async {
        tokio::time::timeout(
            2 * ttl,
            changes.wait_for(|s| matches!(s, LeaseState::Lost { .. })),
        )
        .await
        .expect("lost within the ttl")
        .expect("state")
        .clone()
    });
    let took = killed.elapsed();
    println!(
        "lease lost {took:?} after etcd was killed: {:?}",
        lease.state()
    );
    assert!(took <= ttl + Duration::from_millis(500), "{took:?}");
    cluster.restart(0).expect("restart");
    assert!(matches!(lease.state(), LeaseState::Lost { .. }));

    // A new lease, revoked: its key goes at once.
    let lease = store.grant_node_lease(ttl).expect("grant");
    let (rt, mut client) = raw(&cluster.endpoint(0));
    let options = etcd_client::PutOptions::new().with_lease(lease.id());
    rt.block_on(client.put(key, "{}", Some(options)))
        .expect("put");
    lease.revoke().expect("revoke");
    assert_eq!(rt.block_on(client.get(key, None)).expect("get").count(), 0);

    for bad in [
        Duration::from_secs(1),
        Duration::from_millis(2500),
        Duration::from_secs(61),
    ] {
        let e = store
            .grant_node_lease(bad)
            .expect_err("refused")
            .to_string();
        assert!(
            e.contains("node lease ttl must be whole seconds, 2s-60s"),
            "{e}"
        );
    }
}

#[test]
fn two_nodes_writing_one_key_lose_no_update_the_stale_one_is_refused_until_it_caught_up() {
    use gangway_store::Cluster;
    let cluster = EtcdCluster::start(1).expect("etcd");
    let a = EtcdStore::connect(config(cluster.endpoints(), "/gangway")).expect("connect a");
    let b = EtcdStore::connect(config(cluster.endpoints(), "/gangway")).expect("connect b");
    let node_a = a.join("a", Duration::from_secs(5)).expect("join a");
    let node_b = b.join("b", Duration::from_secs(5)).expect("join b");
    // Both load the empty registry, then a writes instance 1.
    node_a.load().expect("load a");
    node_b.load().expect("load b");
    a.apply(&[put(1)]).expect("a writes");
    // b decided on a view without a's write: refused, nothing applied.
    let mut changed = put(1);
    if let Write::PutInstance(_, i) = &mut changed {
        i.instance.weight = 9.0;
    }
    let err = b.apply(&[changed.clone()]).expect_err("b is behind");
    assert!(matches!(err, StoreError::Conflict(_)), "{err}");
    assert_eq!(
        a.load().expect("load").instances[&ServiceKey::named("orders")][&sample(1).instance.key]
            .instance
            .weight,
        sample(1).instance.weight,
        "a's write stands"
    );
    // Once b saw a's write (a load, or its watch), its change applies.
    let seen = node_b.load().expect("load b");
    assert_eq!(seen.durable.instances.len(), 1);
    b.apply(&[changed]).expect("b caught up");
    // a's own later write is checked against b's: a is behind now.
    assert!(matches!(a.apply(&[put(1)]), Err(StoreError::Conflict(_))));
    // The revision marks move with every batch: the service is named by its last write.
    let contents = node_a.load().expect("load a");
    assert_eq!(
        contents.revisions[&ServiceKey::named("orders")],
        contents.revision,
        "the service's revision is its last write's"
    );
}
