//! Client failover between the nodes of a registry (docs/cluster.md, "Client failover"): two
//! real in-process registries on 127.0.0.1:0 that share nothing, one client given both
//! addresses. When the node it is on dies (its connections cut and its port refusing, as after
//! `kill -9`) or stops (`GoAway`), the client moves to the other one, opens a session there,
//! re-registers its instance and re-subscribes, and its consumer view never goes empty.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gangway_client::{Client, ClientConfig, Error, Subscription};
use gangway_core::model::{InstanceKey, ServiceKey};
use gangway_server::RunningServer;
use gangway_testkit::poll;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio::time::Instant;

/// Upper bound of every wait here; a failover takes milliseconds.
const WAIT: Duration = Duration::from_secs(5);

fn orders() -> ServiceKey {
    ServiceKey::named("orders")
}

fn instance(n: u8) -> InstanceKey {
    InstanceKey::new(&format!("10.0.0.{n}"), 8080, "")
}

async fn registry() -> RunningServer {
    gangway_server::start_in_memory(gangway_server::Config::for_tests())
        .await
        .expect("the registry starts")
}

/// A loopback TCP relay in front of a registry: killing it cuts every relayed connection and
/// closes its port, which is what the clients of a node see when its process is killed.
struct Relay {
    addr: SocketAddr,
    tasks: JoinSet<()>,
}

impl Relay {
    async fn to(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut tasks = JoinSet::new();
        let (conns_tx, mut conns) = tokio::sync::mpsc::unbounded_channel();
        tasks.spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let _ = conns_tx.send(inbound);
            }
        });
        let mut relay = Self { addr, tasks };
        // Each connection is a task of the set, so that `kill` ends it too.
        let mut pipes = JoinSet::new();
        relay.tasks.spawn(async move {
            while let Some(mut inbound) = conns.recv().await {
                pipes.spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        relay
    }

    /// Cuts every connection and closes the port.
    fn kill(&mut self) {
        self.tasks.abort_all();
    }
}

/// Every view a subscription was woken for, by its instance count, from the first view that
/// held an instance on.
fn record_views(subscription: &Subscription) -> Arc<Mutex<Vec<usize>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut rx = subscription.receiver();
    let log = seen.clone();
    tokio::spawn(async move {
        loop {
            let n = rx.borrow_and_update().instances.len();
            {
                let mut log = log.lock().unwrap();
                if n > 0 || !log.is_empty() {
                    log.push(n);
                }
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    });
    seen
}

/// Registers and subscribes through the first of `[first, b]`, makes it leave by calling
/// `lose`, then checks that the client's session, instance and subscription are on `b` within
/// [`WAIT`] and that its view never went empty. Returns the time from the loss until the
/// instance was back in `b`'s view.
async fn fails_over(first: String, lose: impl FnOnce(), b: &RunningServer) -> Duration {
    let b_addr = format!("http://{}", b.grpc_addr);
    let config = ClientConfig::from_addresses([first.clone(), b_addr.clone()])
        .with_random_start(false)
        .with_client_name("failover");
    let client = Client::connect(config)
        .await
        .expect("connects to the first");
    assert_eq!(client.session().unwrap().address, first);
    let me = client
        .register(orders(), instance(1), 1.0, BTreeMap::new())
        .await
        .unwrap();
    let mut sub = client.subscribe(orders()).await.unwrap();
    sub.wait_for(|v| v.contains(me.instance()), WAIT)
        .await
        .expect("the first node pushes the instance");
    let views = record_views(&sub);
    let boot_before = client.boot_id();

    let lost_at = Instant::now();
    lose();
    let back_in = poll(WAIT, || async {
        b.registry
            .view(&orders())
            .contains(me.instance())
            .then(|| lost_at.elapsed())
    })
    .await
    .expect("the instance is registered again on the other node");
    let session = client.session().unwrap();
    assert_eq!(
        session.address, b_addr,
        "the session moved to the other node"
    );
    assert_ne!(
        Some(session.boot_id),
        boot_before,
        "a session of the other registry"
    );
    assert!(client.is_connected());

    // The subscription is on the new node: a change made there reaches the consumer.
    let other = Client::connect(ClientConfig::new(b_addr.clone()))
        .await
        .unwrap();
    other
        .register(orders(), instance(2), 1.0, BTreeMap::new())
        .await
        .unwrap();
    sub.wait_for(
        |v| v.contains(&instance(1)) && v.contains(&instance(2)),
        WAIT,
    )
    .await
    .expect("a registration on the new node reaches the consumer");
    let rows = b.registry.subscribers(&orders());
    assert!(
        rows.iter().any(|r| r.client_name == "failover"),
        "subscribed on the new node: {rows:?}"
    );
    let seen = views.lock().unwrap().clone();
    assert!(
        !seen.is_empty() && seen.iter().all(|n| *n > 0),
        "the view never went empty: {seen:?}"
    );
    println!("views seen across the failover (instances): {seen:?}; back after {back_in:?}");
    client.close();
    other.close();
    back_in
}

#[tokio::test]
async fn a_killed_node_is_replaced_by_the_next_with_everything_restored() {
    let a = registry().await;
    let b = registry().await;
    let mut relay = Relay::to(a.grpc_addr).await;
    let first = format!("http://{}", relay.addr);
    let took = fails_over(first, || relay.kill(), &b).await;
    println!("killed node: instance back on the other node after {took:?}");
    // One failed session ends in a reconnect after the first backoff (at most 100 ms by
    // default), not after a keepalive timeout.
    assert!(took < Duration::from_secs(2), "{took:?}");
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn a_stopping_node_sends_the_client_to_the_next_at_once() {
    let a = registry().await;
    let b = registry().await;
    let first = format!("http://{}", a.grpc_addr);
    let (stopped_tx, stopped) = tokio::sync::oneshot::channel();
    let stop = || {
        // The stop runs meanwhile: it waits for the sessions to end, which the failover does.
        tokio::spawn(async move {
            let _ = stopped_tx.send(a.shutdown().await);
        });
    };
    let took = fails_over(first, stop, &b).await;
    println!("stopped node: instance back on the other node after {took:?}");
    let report = tokio::time::timeout(WAIT, stopped).await.unwrap().unwrap();
    println!("the stopped node's shutdown took {:?}", report.elapsed);
    b.shutdown().await;
}

/// A port that refuses connections.
fn dead_address() -> String {
    format!("http://{}", gangway_testkit::refused_address())
}

#[tokio::test]
async fn connect_skips_a_dead_address_and_names_every_address_when_all_fail() {
    let live = registry().await;
    let live_addr = format!("http://{}", live.grpc_addr);
    let dead = dead_address();
    let started = Instant::now();
    let client = Client::connect(
        ClientConfig::from_addresses([dead.clone(), live_addr.clone()]).with_random_start(false),
    )
    .await
    .expect("the second address answers");
    println!("connected past a dead address in {:?}", started.elapsed());
    assert_eq!(client.session().unwrap().address, live_addr);
    client.close();

    let other_dead = dead_address();
    let config = ClientConfig::from_addresses([dead.clone(), other_dead.clone()])
        .with_request_timeout(Duration::from_secs(1));
    let err = Client::connect(config).await.expect_err("nothing answers");
    println!("{err}");
    let Error::Connect { address, reason } = &err else {
        panic!("expected Error::Connect, got {err:?}");
    };
    assert_eq!(address, &format!("{dead}, {other_dead}"));
    // The last failure of each address, each named once, on one line.
    for a in [&dead, &other_dead] {
        assert_eq!(reason.matches(a.as_str()).count(), 1, "{reason}");
    }
    assert!(!err.to_string().contains('\n'), "{err}");
    assert!(err.is_retryable());
    live.shutdown().await;
}

#[tokio::test]
async fn a_node_that_accepts_but_never_answers_is_left_after_connect_plus_keepalive_timeout() {
    let live = registry().await;
    let live_addr = format!("http://{}", live.grpc_addr);
    // Bound but never accepting: the kernel completes the TCP handshake, nobody answers (a
    // frozen node).
    let frozen = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let frozen_addr = format!("http://{}", frozen.local_addr().unwrap());
    let mut config = ClientConfig::from_addresses([frozen_addr, live_addr.clone()])
        .with_random_start(false)
        .with_request_timeout(Duration::from_secs(30));
    config.connect_timeout = Duration::from_millis(200);
    config.keepalive_timeout = Duration::from_millis(300);
    let started = Instant::now();
    let client = Client::connect(config)
        .await
        .expect("the live node answers");
    let took = started.elapsed();
    println!("connected past a frozen node in {took:?}");
    assert_eq!(client.session().unwrap().address, live_addr);
    // One attempt of at most 500 ms, one backoff of at most 100 ms, then the live node.
    assert!(took < Duration::from_secs(3), "{took:?}");
    client.close();
    live.shutdown().await;
}
