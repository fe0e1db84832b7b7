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

/// A plain etcd client for looking behind the store, with the runtime it runs on.
fn raw(endpoint: &str) -> (tokio::runtime::Runtime, Client) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
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
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
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
