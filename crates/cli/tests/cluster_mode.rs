//! Cluster mode (issue 11, docs/cluster.md): three `gangway server --store etcd` nodes on three
//! real etcd members (gangway-testkit's `EtcdCluster`), all on loopback with ephemeral ports,
//! every process killed by PID. Each test starts its own etcd cluster and nodes, so nextest may
//! run them side by side. The figures are printed (`--nocapture` shows them) so they can be
//! quoted; the bounds asserted are generous, the figures are the real ones.
#![cfg(feature = "etcd")]

mod cluster;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cluster::{DemoService, Proc, Server, addresses, poll};
use futures::StreamExt;
use gangway_testkit::etcd::EtcdCluster;
use nix::sys::signal::Signal;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::time::Instant;

/// The node lease TTL of most tests: the shortest gangway takes, so that expiries are quick.
const TTL: &str = "2s";
/// Timeout of every REST call of the tests: a frozen node must not hang a test.
const CALL: Duration = Duration::from_secs(2);
/// Node names, in node order.
const NAMES: [&str; 3] = ["n1", "n2", "n3"];

/// One gangway node of a test cluster.
struct Node {
    name: &'static str,
    server: Server,
    /// Its stderr (the log), line by line.
    log: Arc<Mutex<Vec<String>>>,
    /// Unused with --store etcd (nothing is written there).
    _dir: tempfile::TempDir,
}

impl Node {
    /// Starts node `name` on `http`/`grpc` (`127.0.0.1:0` for fresh ports) over `etcd`.
    async fn start(
        etcd: &EtcdCluster,
        name: &'static str,
        http: &str,
        grpc: &str,
        ttl: &str,
    ) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let endpoints = etcd.endpoints().join(",");
        let (server, log) = Server::start_tagged(
            dir.path(),
            http,
            grpc,
            &[
                "--warmup",
                "0s",
                "--store",
                "etcd",
                "--etcd-endpoints",
                &endpoints,
                "--etcd-lease-ttl",
                ttl,
                "--node-name",
                name,
            ],
            name,
        )
        .await;
        Node {
            name,
            server,
            log,
            _dir: dir,
        }
    }

    fn http(&self) -> &str {
        &self.server.http
    }

    fn grpc(&self) -> &str {
        &self.server.grpc
    }

    /// Log lines (stderr) containing `needle`.
    fn log_lines(&self, needle: &str) -> Vec<String> {
        let log = self.log.lock().unwrap();
        log.iter().filter(|l| l.contains(needle)).cloned().collect()
    }
}

/// The REST client of the tests, every call bounded by [`CALL`].
fn rest() -> reqwest::Client {
    reqwest::Client::builder().timeout(CALL).build().unwrap()
}

/// `GET http://{http}{path}` as JSON; `None` on any failure (a frozen or dead node).
async fn get(c: &reqwest::Client, http: &str, path: &str) -> Option<Value> {
    let r = c.get(format!("http://{http}{path}")).send().await.ok()?;
    if !r.status().is_success() {
        return None;
    }
    r.json().await.ok()
}

/// POSTs `body`; returns the status and the JSON answer.
async fn post(c: &reqwest::Client, http: &str, path: &str, body: &Value) -> (u16, Value) {
    let r = c
        .post(format!("http://{http}{path}"))
        .json(body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST {http}{path}: {e}"));
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// POSTs `body` with a longer timeout (a drain waits).
async fn post_waiting(http: &str, path: &str, body: &Value, timeout: Duration) -> (u16, Value) {
    let c = reqwest::Client::builder().timeout(timeout).build().unwrap();
    post(&c, http, path, body).await
}

/// Registers an ephemeral REST instance kept by a lease of 60 s (no heartbeat needed in a test).
async fn register_lease(c: &reqwest::Client, http: &str, svc: &str, ip: &str, port: u16) {
    let body = json!({"ip": ip, "port": port, "ttl_ms": 60_000, "delete_timeout_ms": 120_000});
    let (status, answer) = post(c, http, &format!("/v1/services/{svc}/instances"), &body).await;
    assert_eq!(status, 200, "register {ip}:{port} on {http}: {answer}");
}

/// Registers a persistent instance (TCP probe once an hour: it stays as registered).
async fn register_persistent(c: &reqwest::Client, http: &str, svc: &str, ip: &str) -> u16 {
    let body = json!({
        "ip": ip, "port": 9000, "ephemeral": false,
        "probe": {"kind": "tcp", "interval_ms": 3_600_000},
    });
    let r = c
        .post(format!("http://{http}/v1/services/{svc}/instances"))
        .timeout(Duration::from_secs(10))
        .json(&body)
        .send()
        .await;
    r.map_or(0, |r| r.status().as_u16())
}

/// `ip:port` of a listed instance.
fn addr_of(i: &Value) -> String {
    format!("{}:{}", i["ip"].as_str().unwrap_or(""), i["port"])
}

/// Every instance of `svc` on node `http` with who keeps it: `addr -> (liveness, node)`.
async fn keepers(
    c: &reqwest::Client,
    http: &str,
    svc: &str,
) -> Option<Vec<(String, String, Option<String>)>> {
    let v = get(c, http, &format!("/v1/services/{svc}/liveness")).await?;
    Some(
        v["instances"]
            .as_array()?
            .iter()
            .map(|i| {
                (
                    addr_of(i),
                    i["liveness"].as_str().unwrap_or("").to_owned(),
                    i["node"].as_str().map(str::to_owned),
                )
            })
            .collect(),
    )
}

/// Who keeps `addr` of `svc` on node `http`: `(liveness, node)`, `None` when not there.
async fn keeper(
    c: &reqwest::Client,
    http: &str,
    svc: &str,
    addr: &str,
) -> Option<(String, Option<String>)> {
    keepers(c, http, svc)
        .await?
        .into_iter()
        .find(|(a, _, _)| a == addr)
        .map(|(_, l, n)| (l, n))
}

/// The addresses of `svc` listed by node `http` (every instance, `?all=true`).
async fn listed(c: &reqwest::Client, http: &str, svc: &str) -> Option<Vec<String>> {
    let v = get(c, http, &format!("/v1/services/{svc}/instances?all=true")).await?;
    Some(addresses(&v))
}

/// Starts 3 etcd members.
async fn etcd3() -> EtcdCluster {
    tokio::task::spawn_blocking(|| EtcdCluster::start(3).expect("etcd"))
        .await
        .unwrap()
}

/// Starts nodes n1, n2, n3 on fresh ports and waits until each lists all three on /v1/cluster.
async fn nodes3(etcd: &EtcdCluster, ttl: &str) -> Vec<Node> {
    let mut nodes = Vec::new();
    for name in NAMES {
        nodes.push(Node::start(etcd, name, "127.0.0.1:0", "127.0.0.1:0", ttl).await);
    }
    wait_members(&nodes.iter().collect::<Vec<_>>(), 3).await;
    nodes
}

/// Waits (at most 10 s) until every one of `nodes` lists `n` nodes on /v1/cluster.
async fn wait_members(nodes: &[&Node], n: usize) {
    let c = rest();
    let started = Instant::now();
    for node in nodes {
        let seen = poll(Duration::from_secs(10), || async {
            let v = get(&c, node.http(), "/v1/cluster").await?;
            (v["nodes"].as_array()?.len() == n).then_some(v)
        })
        .await;
        assert!(seen.is_some(), "{} does not list {n} nodes", node.name);
    }
    println!(
        "{} node(s) list {n} nodes on /v1/cluster after {:?}",
        nodes.len(),
        started.elapsed()
    );
}

/// An SSE watcher of one service on one node, keeping every snapshot with its arrival time.
struct Sse {
    seen: Arc<Mutex<Vec<(Instant, Vec<String>)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Sse {
    /// Opens `GET /v1/services/{svc}/watch?subscriber=NAME` on `http` and waits for its first
    /// snapshot.
    async fn open(http: &str, svc: &str, name: &str) -> Sse {
        let url = format!("http://{http}/v1/services/{svc}/watch?subscriber={name}");
        let resp = reqwest::get(&url).await.expect("watch");
        assert!(resp.status().is_success(), "watch {url}: {}", resp.status());
        let seen: Arc<Mutex<Vec<(Instant, Vec<String>)>>> = Arc::default();
        let sink = seen.clone();
        let task = tokio::spawn(async move {
            let mut body = resp.bytes_stream();
            let mut buf = String::new();
            while let Some(Ok(chunk)) = body.next().await {
                buf.push_str(&String::from_utf8_lossy(&chunk));
                while let Some(end) = buf.find("\n\n") {
                    let event: String = buf.drain(..end + 2).collect();
                    if let Some(data) = event.lines().find_map(|l| l.strip_prefix("data:")) {
                        let v: Value = serde_json::from_str(data.trim()).expect("snapshot JSON");
                        let mut addrs = addresses(&v);
                        addrs.sort();
                        sink.lock().unwrap().push((Instant::now(), addrs));
                    }
                }
            }
        });
        let sse = Sse { seen, task };
        sse.wait_for("a first snapshot", Duration::from_secs(10), |_| true)
            .await;
        sse
    }

    /// Arrival time of the first snapshot whose addresses satisfy `pred`, waiting at most
    /// `within`; panics naming `what`.
    async fn wait_for(
        &self,
        what: &str,
        within: Duration,
        pred: impl Fn(&[String]) -> bool,
    ) -> Instant {
        let seen = &self.seen;
        let found = poll(within, || async {
            let s = seen.lock().unwrap();
            s.iter().find(|(_, a)| pred(a)).map(|(t, _)| *t)
        })
        .await;
        found.unwrap_or_else(|| {
            panic!(
                "watcher: no snapshot with {what} within {within:?}; seen {:?}",
                self.snapshots()
            )
        })
    }

    /// Every snapshot's addresses, in order.
    fn snapshots(&self) -> Vec<Vec<String>> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|(_, a)| a.clone())
            .collect()
    }
}

impl Drop for Sse {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Milliseconds from `from` to `to` (negative when `to` came first).
fn ms(from: Instant, to: Instant) -> f64 {
    if to >= from {
        (to - from).as_secs_f64() * 1000.0
    } else {
        -((from - to).as_secs_f64() * 1000.0)
    }
}

/// When node `http` first lists `addr` of `svc`, polling every 10 ms for at most `within`.
async fn first_listed(
    c: reqwest::Client,
    http: String,
    svc: String,
    addr: String,
    within: Duration,
) -> Option<Instant> {
    poll(within, || async {
        let l = listed(&c, &http, &svc).await?;
        l.contains(&addr).then(Instant::now)
    })
    .await
}

// ---------------------------------------------------------------------------------------------
// 1. Replication of ephemeral instances
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_on_one_node_is_seen_through_the_others_and_by_their_subscribers() {
    let etcd = etcd3().await;
    let nodes = nodes3(&etcd, TTL).await;
    let (n1, n2, n3) = (&nodes[0], &nodes[1], &nodes[2]);
    let c = rest();
    let bound = Duration::from_secs(2);

    // A REST lease instance registered on n1, watched (SSE) on n2, listed on n2 and n3.
    let sse = Sse::open(n2.http(), "t1", "watch-n2").await;
    let addr = "10.1.0.1:8080".to_owned();
    let p2 = tokio::spawn(first_listed(
        c.clone(),
        n2.http().into(),
        "t1".into(),
        addr.clone(),
        bound * 2,
    ));
    let p3 = tokio::spawn(first_listed(
        c.clone(),
        n3.http().into(),
        "t1".into(),
        addr.clone(),
        bound * 2,
    ));
    let t0 = Instant::now();
    register_lease(&c, n1.http(), "t1", "10.1.0.1", 8080).await;
    let acked = Instant::now();
    let on_sse = sse
        .wait_for("the REST instance", bound * 2, |a| a.contains(&addr))
        .await;
    let on_n2 = p2.await.unwrap().expect("listed on n2");
    let on_n3 = p3.await.unwrap().expect("listed on n3");
    println!(
        "REST ephemeral registered on n1 (acked in {:.1} ms): n2's SSE watcher had it {:.1} ms \
         after the POST was sent, n2's list {:.1} ms, n3's list {:.1} ms (lists polled every 10 ms)",
        ms(t0, acked),
        ms(t0, on_sse),
        ms(t0, on_n2),
        ms(t0, on_n3)
    );
    for (what, t) in [("n2 SSE", on_sse), ("n2 list", on_n2), ("n3 list", on_n3)] {
        assert!(t - t0 < bound, "{what}: {:.1} ms", ms(t0, t));
    }

    // A native session (demo-service) on n1.
    let sse_demo = Sse::open(n2.http(), "demo", "watch-demo-n2").await;
    let spawned = Instant::now();
    let demo = DemoService::start(n1.grpc(), "a").await;
    let ready = Instant::now();
    let p2 = tokio::spawn(first_listed(
        c.clone(),
        n2.http().into(),
        "demo".into(),
        demo.addr.clone(),
        bound * 2,
    ));
    let p3 = tokio::spawn(first_listed(
        c.clone(),
        n3.http().into(),
        "demo".into(),
        demo.addr.clone(),
        bound * 2,
    ));
    let on_sse = sse_demo
        .wait_for("the demo-service", bound * 2, |a| a.contains(&demo.addr))
        .await;
    let on_n2 = p2.await.unwrap().expect("demo listed on n2");
    let on_n3 = p3.await.unwrap().expect("demo listed on n3");
    println!(
        "demo-service on n1 (session): spawned -> ready line {:.1} ms; from its ready line: n2's SSE \
         {:.1} ms, n2's list {:.1} ms, n3's list {:.1} ms (negative: before the ready line was read)",
        ms(spawned, ready),
        ms(ready, on_sse),
        ms(ready, on_n2),
        ms(ready, on_n3)
    );
    for (what, t) in [("n2 SSE", on_sse), ("n2 list", on_n2), ("n3 list", on_n3)] {
        assert!(t < ready + bound, "{what}: {:.1} ms", ms(ready, t));
    }

    // Who keeps them: n1 itself, and "remote" on n1 for the others.
    assert_eq!(
        keeper(&c, n1.http(), "demo", &demo.addr).await,
        Some(("session".into(), None))
    );
    assert_eq!(
        keeper(&c, n1.http(), "t1", &addr).await,
        Some(("lease".into(), None))
    );
    for other in [n2, n3] {
        assert_eq!(
            keeper(&c, other.http(), "demo", &demo.addr).await,
            Some(("remote".into(), Some("n1".into()))),
            "demo-service on {}",
            other.name
        );
        assert_eq!(
            keeper(&c, other.http(), "t1", &addr).await,
            Some(("remote".into(), Some("n1".into()))),
            "REST instance on {}",
            other.name
        );
    }
    println!(
        "n3 liveness of demo: {}",
        get(&c, n3.http(), "/v1/services/demo/liveness")
            .await
            .unwrap()
    );

    // /v1/cluster as n2 sees it: three nodes, n1 with its session (records refresh every 2 s).
    let view = poll(Duration::from_secs(8), || async {
        let v = get(&c, n2.http(), "/v1/cluster").await?;
        let n1_entry = v["nodes"]
            .as_array()?
            .iter()
            .find(|n| n["name"] == "n1")?
            .clone();
        (n1_entry["sessions"].as_u64()? >= 1).then_some(v)
    })
    .await
    .expect("n2 sees n1's session count on /v1/cluster");
    println!("/v1/cluster on n2: {view}");
    assert_eq!(view["node"], "n2");
    let mut names: Vec<&str> = view["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap())
        .collect();
    assert_eq!(names[0], "n2", "the answering node comes first: {view}");
    names.sort();
    assert_eq!(names, NAMES);
    let n1_entry = view["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "n1")
        .unwrap();
    assert_eq!(n1_entry["http"], n1.http(), "{view}");
    assert_eq!(n1_entry["grpc"], n1.grpc(), "{view}");
    assert_eq!(n1_entry["lease"].as_str().map(str::len), Some(16), "{view}");
}

// ---------------------------------------------------------------------------------------------
// 2. Drains across nodes
// ---------------------------------------------------------------------------------------------

/// A `gangway demo-client` subscribed through `grpc` (a session subscriber that acks what it
/// applies), sending 2 req/s for 120 s; returns once it sends.
async fn consumer(grpc: &str, tag: &'static str) -> Proc {
    let mut p = Proc::spawn(&[
        "demo-client",
        "--registry",
        grpc,
        "--service",
        "demo",
        "--rate",
        "2",
        "--duration",
        "120s",
        "--min-instances",
        "3",
        "--json",
    ]);
    p.stderr_line_starting("sending ").await;
    p.forward_stderr(tag);
    p
}

/// The `node` fields of a drain report's `acked` or `laggards`.
fn nodes_of(report: &Value, field: &str) -> Vec<String> {
    let mut v: Vec<String> = report[field]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|s| s["node"].as_str().unwrap_or("").to_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_through_node_3_waits_for_subscribers_of_nodes_1_and_2_and_names_a_frozen_one() {
    let etcd = etcd3().await;
    let nodes = nodes3(&etcd, TTL).await;
    let (n1, n2, n3) = (&nodes[0], &nodes[1], &nodes[2]);
    let c = rest();
    let mut services = Vec::new();
    for name in ["a", "b", "c"] {
        services.push(DemoService::start(n3.grpc(), name).await);
    }
    let mut c1 = consumer(n1.grpc(), "consumer-n1").await;
    let mut c2 = consumer(n2.grpc(), "consumer-n2").await;
    // Each node has its subscriber.
    for (node, n) in [(n1, "n1"), (n2, "n2")] {
        let subs = poll(Duration::from_secs(5), || async {
            let v = get(&c, node.http(), "/v1/services/demo/subscribers").await?;
            (!v["subscribers"].as_array()?.is_empty()).then_some(v)
        })
        .await
        .unwrap_or_else(|| panic!("no subscriber on {n}"));
        println!("subscribers on {n}: {subs}");
    }

    // Drain of a through n3: complete once n1's and n2's consumers acked.
    let a = services[0].addr.clone();
    let t0 = Instant::now();
    let (status, report) = post_waiting(
        n3.http(),
        &format!("/v1/services/demo/instances/{a}/drain"),
        &json!({"timeout_ms": 5000}),
        Duration::from_secs(15),
    )
    .await;
    let took = t0.elapsed();
    println!("drain of {a} through n3: {status} in {took:?}: {report}");
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["complete"], true, "{report}");
    let acked = nodes_of(&report, "acked");
    assert!(
        acked.contains(&"n1".to_owned()) && acked.contains(&"n2".to_owned()),
        "acked by the subscribers of n1 and n2: {report}"
    );
    assert_eq!(
        nodes_of(&report, "laggards"),
        Vec::<String>::new(),
        "{report}"
    );
    for ack in report["acked"].as_array().unwrap() {
        assert!(
            ack["acked_revision"].as_u64() >= report["revision"].as_u64(),
            "{report}"
        );
    }
    assert!(took < Duration::from_secs(5), "{took:?}");
    // The consumers' views lost a: n1's and n2's lists show it disabled.
    for node in [n1, n2] {
        let v = get(&c, node.http(), "/v1/services/demo/instances")
            .await
            .unwrap();
        assert!(
            !addresses(&v).contains(&a),
            "{} still serves {a}: {v}",
            node.name
        );
    }

    // n2's consumer frozen: the drain of b times out naming it, with node n2.
    c2.signal(Signal::SIGSTOP);
    let b = services[1].addr.clone();
    let t0 = Instant::now();
    let (status, report) = post_waiting(
        n3.http(),
        &format!("/v1/services/demo/instances/{b}/drain"),
        &json!({"timeout_ms": 1500}),
        Duration::from_secs(15),
    )
    .await;
    let took = t0.elapsed();
    c2.signal(Signal::SIGCONT);
    println!("drain of {b} through n3 with n2's consumer frozen: {status} in {took:?}: {report}");
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["complete"], false, "{report}");
    assert_eq!(
        nodes_of(&report, "laggards"),
        vec!["n2".to_owned()],
        "{report}"
    );
    assert!(
        nodes_of(&report, "acked").contains(&"n1".to_owned()),
        "{report}"
    );
    assert!(report["waited_ms"].as_u64() >= Some(1500), "{report}");
    assert!(
        took < Duration::from_millis(1500) + drain_grace() + Duration::from_secs(2),
        "{took:?}"
    );

    c1.signal(Signal::SIGKILL);
    c2.signal(Signal::SIGKILL);
    c1.wait(Duration::from_secs(5)).await;
    c2.wait(Duration::from_secs(5)).await;
}

/// How long past its timeout a drain waits for the other nodes' answers (the engine's
/// `ANSWER_GRACE`, docs/cluster.md): 1 s.
fn drain_grace() -> Duration {
    Duration::from_secs(1)
}

// ---------------------------------------------------------------------------------------------
// 3. etcd members lost
// ---------------------------------------------------------------------------------------------

/// Member index of the etcd leader among `alive`, from etcd's `/v3/maintenance/status`.
async fn etcd_leader(etcd: &EtcdCluster, alive: &[usize]) -> Option<usize> {
    let c = rest();
    let mut ids = Vec::new();
    let mut leader = None;
    for &i in alive {
        let r = c
            .post(format!("{}/v3/maintenance/status", etcd.endpoint(i)))
            .body("{}")
            .send()
            .await
            .ok()?;
        let v: Value = r.json().await.ok()?;
        ids.push((i, v["header"]["member_id"].clone()));
        leader = Some(v["leader"].clone());
    }
    let leader = leader?;
    ids.into_iter()
        .find(|(_, id)| *id == leader)
        .map(|(i, _)| i)
}

/// Writes `count` persistent instances `10.3.{phase}.N` of service `stock` through `http`, one
/// after the other; returns the acknowledged addresses and the slowest call.
async fn write_phase(
    c: &reqwest::Client,
    http: &str,
    phase: u8,
    count: u8,
) -> (Vec<String>, Duration) {
    let mut acked = Vec::new();
    let mut slowest = Duration::ZERO;
    for n in 1..=count {
        let ip = format!("10.3.{phase}.{n}");
        let t0 = Instant::now();
        let status = register_persistent(c, http, "stock", &ip).await;
        slowest = slowest.max(t0.elapsed());
        if status == 200 {
            acked.push(format!("{ip}:9000"));
        } else {
            println!("write {ip} through {http}: status {status}");
        }
    }
    (acked, slowest)
}

/// Waits until every node lists every address of `want` for `svc`; returns how long it took.
async fn wait_all_listed(
    nodes: &[&Node],
    svc: &str,
    want: &[String],
    within: Duration,
) -> Duration {
    let c = rest();
    let t0 = Instant::now();
    for node in nodes {
        let got = poll(within, || async {
            let l = listed(&c, node.http(), svc).await?;
            want.iter().all(|a| l.contains(a)).then_some(())
        })
        .await;
        if got.is_none() {
            let l = listed(&c, node.http(), svc).await.unwrap_or_default();
            let missing: Vec<&String> = want.iter().filter(|a| !l.contains(a)).collect();
            panic!("{} misses {missing:?} of {svc} after {within:?}", node.name);
        }
    }
    t0.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_losing_a_member_or_its_leader_loses_no_acknowledged_write_and_all_members_back_restore_everything()
 {
    let mut etcd = etcd3().await;
    let nodes = nodes3(&etcd, TTL).await;
    let all: Vec<&Node> = nodes.iter().collect();
    let (n1, n2, n3) = (&nodes[0], &nodes[1], &nodes[2]);
    let c = rest();
    let demo = DemoService::start(n1.grpc(), "a").await;
    register_lease(&c, n2.http(), "eph", "10.3.9.1", 80).await;
    let eph = vec!["10.3.9.1:80".to_owned()];

    let (mut acked, _) = write_phase(&c, n1.http(), 0, 10).await;
    assert_eq!(acked.len(), 10);
    // Consumers on n3 of the two ephemeral instances (kept by n1 and n2).
    let watch_demo = Sse::open(n3.http(), "demo", "watch-demo").await;
    let watch_eph = Sse::open(n3.http(), "eph", "watch-eph").await;
    watch_demo
        .wait_for("the demo-service", Duration::from_secs(5), |a| {
            a.contains(&demo.addr)
        })
        .await;
    watch_eph
        .wait_for("the REST instance", Duration::from_secs(5), |a| {
            a.contains(&eph[0])
        })
        .await;
    // Whether a consumer saw either ephemeral instance go, from snapshot `from` on.
    let flaps = |from: (usize, usize)| -> Vec<String> {
        let mut out = Vec::new();
        for (watch, addr, from) in [
            (&watch_demo, &demo.addr, from.0),
            (&watch_eph, &eph[0], from.1),
        ] {
            for (i, s) in watch.snapshots().iter().enumerate().skip(from) {
                if !s.contains(addr) {
                    out.push(format!(
                        "snapshot {i} of n3's watcher without {addr}: {s:?}"
                    ));
                }
            }
        }
        out
    };
    let counts = || (watch_demo.snapshots().len(), watch_eph.snapshots().len());
    let start_counts = counts();

    // A follower killed, then the leader: writes through another node go on.
    for (phase, what) in [(1u8, "follower"), (2, "leader")] {
        let leader = etcd_leader(&etcd, &[0, 1, 2]).await.expect("a leader");
        let victim = if what == "leader" {
            leader
        } else {
            (leader + 1) % 3
        };
        tokio::task::block_in_place(|| etcd.kill9(victim));
        let t0 = Instant::now();
        println!("{} etcd {what} m{victim} killed", utc_now());
        let through = &nodes[phase as usize];
        let (written, slowest) = write_phase(&c, through.http(), phase, 10).await;
        println!(
            "etcd {what} m{victim} killed: 10 persistent writes through {} took {:?}, slowest {slowest:?}, {} acknowledged",
            through.name,
            t0.elapsed(),
            written.len()
        );
        assert_eq!(
            written.len(),
            10,
            "every write after the {what}'s kill is acknowledged"
        );
        acked.extend(written);
        let seen = wait_all_listed(&all, "stock", &acked, Duration::from_secs(15)).await;
        println!(
            "  ... and every node lists all {} writes {seen:?} after the last one",
            acked.len()
        );
        // The ephemeral instances' records outlive the nodes' old leases: wait one TTL.
        let past_ttl = Instant::now() + Duration::from_secs(3);
        tokio::time::sleep_until(past_ttl).await;
        tokio::task::block_in_place(|| etcd.restart(victim)).expect("member restarts");
        println!("{} etcd m{victim} restarted", utc_now());
    }
    let one_member_flaps = flaps(start_counts);
    println!(
        "n3's watchers during the member and leader kills: demo {:?}, eph {:?}",
        watch_demo.snapshots(),
        watch_eph.snapshots()
    );
    let before_all_down = counts();

    // Every member down: the nodes count their leases lost.
    let t0 = Instant::now();
    println!("{} every etcd member killed", utc_now());
    tokio::task::block_in_place(|| {
        for i in 0..3 {
            etcd.kill9(i)
        }
    });
    for node in &all {
        let lost = poll(Duration::from_secs(10), || async {
            let h = get(&c, node.http(), "/v1/health").await?;
            (h["node_lease"]["state"] == "lost").then_some(h)
        })
        .await
        .unwrap_or_else(|| panic!("{} does not say its lease is lost", node.name));
        println!(
            "{} {:?} after every etcd member died: {}",
            node.name,
            t0.elapsed(),
            lost["node_lease"]
        );
    }
    // The nodes still answer from memory meanwhile.
    assert_eq!(
        keeper(&c, n3.http(), "demo", &demo.addr).await,
        Some(("remote".into(), Some("n1".into())))
    );

    let t0 = Instant::now();
    tokio::task::block_in_place(|| etcd.restart_all()).expect("etcd back");
    println!(
        "every etcd member restarted and healthy in {:?}",
        t0.elapsed()
    );
    for node in &all {
        let alive = poll(Duration::from_secs(15), || async {
            let h = get(&c, node.http(), "/v1/health").await?;
            (h["node_lease"]["state"] == "alive").then_some(h)
        })
        .await
        .unwrap_or_else(|| panic!("{} has no live lease after etcd came back", node.name));
        println!(
            "{} {:?} after etcd was back: {}",
            node.name,
            t0.elapsed(),
            alive["node_lease"]
        );
    }
    let persistent = wait_all_listed(&all, "stock", &acked, Duration::from_secs(15)).await;
    println!(
        "all {} acknowledged persistent writes listed on every node {persistent:?} after",
        acked.len()
    );

    // Ephemeral instances written again under the new leases: after the old leases' TTL their
    // records are still there, kept by their nodes.
    let old_leases_gone = Instant::now() + Duration::from_secs(3);
    for (svc, addr, holder) in [
        ("demo", demo.addr.as_str(), "n1"),
        ("eph", eph[0].as_str(), "n2"),
    ] {
        let back = poll(Duration::from_secs(15), || async {
            if Instant::now() < old_leases_gone {
                return None;
            }
            for node in &all {
                let want = if node.name == holder {
                    keeper(&c, node.http(), svc, addr).await?.0 != "remote"
                } else {
                    keeper(&c, node.http(), svc, addr).await?
                        == ("remote".into(), Some(holder.into()))
                };
                if !want {
                    return None;
                }
            }
            Some(())
        })
        .await;
        if back.is_none() {
            for node in &all {
                println!(
                    "{} liveness of {svc}: {:?}",
                    node.name,
                    get(&c, node.http(), &format!("/v1/services/{svc}/liveness")).await
                );
            }
            panic!("{svc} {addr} (kept by {holder}) not on every node after etcd came back");
        }
    }
    println!(
        "ephemeral instances on every node, kept by their nodes, when looked at {:?} after etcd was back (past the old leases' TTL)",
        t0.elapsed()
    );
    let all_down_flaps = flaps(before_all_down);
    println!("n3's watchers across all members down and up: went {all_down_flaps:?}");
    for node in &all {
        for line in node.log_lines("lease") {
            println!("{} log: {line}", node.name);
        }
    }
    // Membership is back too: every node lists the three (their records, under new leases).
    let mut clusters = Vec::new();
    for node in &all {
        clusters.push(format!(
            "{}: {:?}",
            node.name,
            get(&c, node.http(), "/v1/cluster").await
        ));
    }
    println!("/v1/cluster after etcd came back:\n{}", clusters.join("\n"));
    assert!(
        one_member_flaps.is_empty(),
        "one etcd member (a follower, then the leader) killed: consumers saw ephemeral instances go:\n{}",
        one_member_flaps.join("\n")
    );
    wait_members(&all, 3).await;
}

/// Now, UTC, as the nodes' logs print it (to put the test's steps beside their lines).
fn utc_now() -> String {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let secs = d.as_secs();
    format!(
        "{:02}:{:02}:{:02}.{:06}Z",
        secs / 3600 % 24,
        secs / 60 % 60,
        secs % 60,
        d.subsec_micros()
    )
}

// ---------------------------------------------------------------------------------------------
// 4. A frozen gangway node
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_frozen_past_its_lease_ttl_loses_its_instances_and_brings_no_stale_one_back() {
    let etcd = etcd3().await;
    let nodes = nodes3(&etcd, TTL).await;
    let (n1, n2, n3) = (&nodes[0], &nodes[1], &nodes[2]);
    let c = rest();
    // On n2: a demo-service that will die while n2 is frozen (`a`), one that lives on (`b`),
    // and a REST instance whose client moves to n1 meanwhile (`moved`).
    let mut a = DemoService::start(n2.grpc(), "a").await;
    let b = DemoService::start(n2.grpc(), "b").await;
    register_lease(&c, n2.http(), "demo", "10.4.0.2", 80).await;
    let moved = "10.4.0.2:80".to_owned();
    // On n1: one that stays.
    register_lease(&c, n1.http(), "demo", "10.4.0.9", 80).await;
    let stays = "10.4.0.9:80".to_owned();
    for node in [n1, n3] {
        for addr in [&a.addr, &b.addr, &moved] {
            let ok = poll(Duration::from_secs(5), || async {
                (keeper(&c, node.http(), "demo", addr).await?
                    == ("remote".into(), Some("n2".into())))
                    .then_some(())
            })
            .await;
            assert!(
                ok.is_some(),
                "{addr} not remote on n2 as {} sees it",
                node.name
            );
        }
    }
    let lease_before = get(&c, n2.http(), "/v1/health").await.unwrap()["node_lease"]["id"].clone();
    let sse = Sse::open(n3.http(), "demo", "watch-n3").await;

    let frozen = Instant::now();
    n2.server.proc.signal(Signal::SIGSTOP);
    // The client of `moved` re-registers on n1 (within the TTL: a takeover, no removal).
    register_lease(&c, n1.http(), "demo", "10.4.0.2", 80).await;
    // n2's session instances go from n1's and n3's views once its lease expired.
    for node in [n1, n3] {
        let gone = poll(Duration::from_secs(10), || async {
            let l = keepers(&c, node.http(), "demo").await?;
            let has = |x: &str| l.iter().any(|(addr, _, _)| addr == x);
            (!has(&a.addr) && !has(&b.addr)).then(Instant::now)
        })
        .await
        .unwrap_or_else(|| panic!("n2's instances still on {} 10 s after n2 froze", node.name));
        println!(
            "n2 frozen (lease TTL {TTL}): its session instances gone from {}'s view after {:.0} ms",
            node.name,
            ms(frozen, gone)
        );
        assert!(
            gone - frozen < Duration::from_secs(5),
            "{:.0} ms",
            ms(frozen, gone)
        );
        assert_eq!(
            keeper(&c, node.http(), "demo", &moved).await,
            Some(if node.name == "n1" {
                ("lease".into(), None)
            } else {
                ("remote".into(), Some("n1".into()))
            }),
            "{moved} moved to n1 ({} view)",
            node.name
        );
        assert!(
            listed(&c, node.http(), "demo")
                .await
                .unwrap()
                .contains(&stays)
        );
    }
    // `a`'s process dies while n2 is frozen: what n2 holds of it is stale.
    a.proc.signal(Signal::SIGKILL);
    a.proc.wait(Duration::from_secs(5)).await;
    // Frozen for longer than the lease TTL in any case (etcd may expire the lease up to a
    // third of the TTL before the freeze's TTL is over: the last renewal came before it).
    tokio::time::sleep_until(frozen + Duration::from_millis(3500)).await;
    let thawed = Instant::now();
    n2.server.proc.signal(Signal::SIGCONT);
    println!("n2 frozen for {:.0} ms", ms(frozen, thawed));

    // For 3 s: `a` never back on n1 or n3, `moved` stays n1's, `stays` stays.
    let mut b_back = None;
    let mut violations = Vec::new();
    let watch_until = thawed + Duration::from_secs(3);
    while Instant::now() < watch_until {
        for node in [n1, n3] {
            let Some(l) = keepers(&c, node.http(), "demo").await else {
                continue;
            };
            let find = |x: &str| {
                l.iter()
                    .find(|(addr, _, _)| addr == x)
                    .map(|(_, k, n)| (k.clone(), n.clone()))
            };
            if let Some(k) = find(&a.addr) {
                violations.push(format!(
                    "+{:.0} ms {}: dead {} back as {k:?}",
                    ms(thawed, Instant::now()),
                    node.name,
                    a.addr
                ));
            }
            let want_moved = if node.name == "n1" {
                ("lease".to_owned(), None)
            } else {
                ("remote".to_owned(), Some("n1".to_owned()))
            };
            if find(&moved) != Some(want_moved) {
                violations.push(format!(
                    "+{:.0} ms {}: {moved} is {:?}",
                    ms(thawed, Instant::now()),
                    node.name,
                    find(&moved)
                ));
            }
            if find(&stays).is_none() {
                violations.push(format!(
                    "+{:.0} ms {}: {stays} missing",
                    ms(thawed, Instant::now()),
                    node.name
                ));
            }
            if b_back.is_none() && find(&b.addr).is_some() && node.name == "n1" {
                b_back = Some(Instant::now());
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The SSE watcher of n3 never lost `moved` or `stays` and never saw `a` again after it went.
    let snaps = sse.snapshots();
    let a_went = snaps.iter().position(|s| !s.contains(&a.addr));
    for (i, s) in snaps.iter().enumerate() {
        if !s.contains(&moved) || !s.contains(&stays) {
            violations.push(format!(
                "n3 watcher snapshot {i} without {moved} or {stays}: {s:?}"
            ));
        }
        if a_went.is_some_and(|w| i > w) && s.contains(&a.addr) {
            violations.push(format!(
                "n3 watcher snapshot {i} has the dead {} again: {s:?}",
                a.addr
            ));
        }
    }
    println!("n3's watcher saw {} snapshots: {snaps:?}", snaps.len());
    // n2 itself converges: `a` gone, `moved` n1's; `b` (alive) back, with a new lease.
    let n2_view = poll(Duration::from_secs(5), || async {
        let l = keepers(&c, n2.http(), "demo").await?;
        let find = |x: &str| {
            l.iter()
                .find(|(addr, _, _)| addr == x)
                .map(|(_, k, n)| (k.clone(), n.clone()))
        };
        (find(&a.addr).is_none()
            && find(&moved) == Some(("remote".into(), Some("n1".into())))
            && find(&b.addr).is_some_and(|(k, _)| k == "session"))
        .then_some(l)
    })
    .await;
    let health = get(&c, n2.http(), "/v1/health").await;
    for node in [n1, n2, n3] {
        println!(
            "{} liveness of demo {:.0} ms after SIGCONT: {:?}",
            node.name,
            ms(thawed, Instant::now()),
            get(&c, node.http(), "/v1/services/demo/liveness").await
        );
    }
    // How long the dead `a` stays in n1's view, if it came back.
    let a_gone = poll(Duration::from_secs(5), || async {
        let l = keepers(&c, n1.http(), "demo").await?;
        (!l.iter().any(|(x, _, _)| *x == a.addr)).then(Instant::now)
    })
    .await;
    println!(
        "the dead {} is out of n1's view {:?} ms after SIGCONT",
        a.addr,
        a_gone.map(|t| ms(thawed, t).round())
    );
    println!(
        "n2 after SIGCONT: view {n2_view:?}; lease before {lease_before}, now {:?}",
        health.as_ref().map(|h| h["node_lease"].clone())
    );
    if let Some(t) = b_back {
        println!(
            "the live demo-service b of n2 back on n1's view {:.0} ms after SIGCONT",
            ms(thawed, t)
        );
    }
    for line in n2.log_lines("lease") {
        println!("n2 log: {line}");
    }
    // One line per kind of violation: its first and last time and how often it was seen.
    let mut kinds: Vec<(String, String, String, usize)> = Vec::new();
    for v in &violations {
        let (at, what) = v
            .split_once(" ms ")
            .map_or(("", v.as_str()), |(t, w)| (t, w));
        match kinds.iter_mut().find(|k| k.0 == what) {
            Some(k) => {
                k.2 = at.to_owned();
                k.3 += 1;
            }
            None => kinds.push((what.to_owned(), at.to_owned(), at.to_owned(), 1)),
        }
    }
    let summary: Vec<String> = kinds
        .iter()
        .map(|(what, first, last, n)| {
            format!("{what} (seen {n} times, from {first} ms to {last} ms)")
        })
        .collect();
    assert!(
        violations.is_empty(),
        "after n2's SIGCONT:\n{}",
        summary.join("\n")
    );
    assert!(n2_view.is_some(), "n2's own view did not converge");
    let b_back = poll(Duration::from_secs(10), || async {
        keeper(&c, n1.http(), "demo", &b.addr)
            .await
            .filter(|k| *k == ("remote".into(), Some("n2".into())))
    })
    .await;
    assert!(
        b_back.is_some(),
        "the live demo-service b on n2 is not back in n1's view"
    );
    assert_ne!(
        health.map(|h| h["node_lease"]["id"].clone()),
        Some(lease_before),
        "n2 was granted a new lease"
    );
}

// ---------------------------------------------------------------------------------------------
// 5. Clients on a node that dies or restarts (needs client failover)
// ---------------------------------------------------------------------------------------------

/// A loopback address with a free port (bound, then released).
fn free_addr() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// Three nodes on fixed loopback ports (so that a restarted node comes back at its address).
async fn nodes3_fixed(etcd: &EtcdCluster, ttl: &str) -> (Vec<Node>, Vec<(String, String)>) {
    let addrs: Vec<(String, String)> = (0..3).map(|_| (free_addr(), free_addr())).collect();
    let mut nodes = Vec::new();
    for (i, name) in NAMES.into_iter().enumerate() {
        nodes.push(Node::start(etcd, name, &addrs[i].0, &addrs[i].1, ttl).await);
    }
    wait_members(&nodes.iter().collect::<Vec<_>>(), 3).await;
    (nodes, addrs)
}

/// Three demo-services and a demo-client at 60 req/s for `duration`, all given the gRPC
/// addresses of the three nodes, n1's first (their sessions start there); an SSE watcher on n2.
struct FailoverRun {
    services: Vec<DemoService>,
    client: Proc,
    started: Instant,
    sse: Sse,
}

impl FailoverRun {
    async fn start(nodes: &[Node], duration: &str) -> FailoverRun {
        // The demo processes start on the first address of their list (n1), not a random one.
        cluster::CHILD_ENV
            .lock()
            .unwrap()
            .push(("GANGWAY_RANDOM_START", "0"));
        let list = nodes.iter().map(|n| n.grpc()).collect::<Vec<_>>().join(",");
        let mut services = Vec::new();
        for name in ["a", "b", "c"] {
            services.push(DemoService::start(&list, name).await);
        }
        let c = rest();
        for s in &services {
            assert_eq!(
                keeper(&c, nodes[0].http(), "demo", &s.addr)
                    .await
                    .map(|k| k.0),
                Some("session".into()),
                "{} has its session on n1",
                s.addr
            );
        }
        let sse = Sse::open(nodes[1].http(), "demo", "watch-n2").await;
        let mut client = Proc::spawn(&[
            "demo-client",
            "--registry",
            &list,
            "--service",
            "demo",
            "--rate",
            "60",
            "--duration",
            duration,
            "--min-instances",
            "3",
            "--json",
        ]);
        client.stderr_line_starting("sending ").await;
        let started = Instant::now();
        client.forward_stderr("demo-client");
        FailoverRun {
            services,
            client,
            started,
            sse,
        }
    }

    /// Waits for the client's summary; asserts 0 failed and that neither the client nor n2's
    /// watcher ever saw fewer than the three instances.
    async fn finish(mut self, what: &str) {
        let out = self.client.rest_of_stdout(Duration::from_secs(60)).await;
        let report: Value = serde_json::from_str(out.trim()).expect("demo-client JSON summary");
        let changes: Vec<usize> = report["view_changes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["instances"].as_array().map_or(0, Vec::len))
            .collect();
        let watched: Vec<usize> = self.sse.snapshots().iter().map(Vec::len).collect();
        println!(
            "{what}: sent {} ok {} failed {} attempts/request {}; client view sizes {changes:?}; n2 watcher sizes {watched:?}",
            report["sent"], report["ok"], report["failed"], report["attempts_per_request"]
        );
        assert_eq!(report["failed"], 0, "{what}: {}", report["requests"]);
        assert!(
            changes.iter().all(|n| *n == 3),
            "{what}: the client's view lost instances: {changes:?}"
        );
        assert!(
            watched.iter().skip_while(|n| **n < 3).all(|n| *n == 3),
            "{what}: n2's watcher saw instances removed: {watched:?}"
        );
        self.client.wait(Duration::from_secs(5)).await;
        drop(self.services);
    }
}

/// The revision each of `nodes` names `svc`'s view by (printed, not asserted: docs/cluster.md,
/// "Service revisions", says when nodes can differ).
async fn revisions_of(nodes: &[&Node], svc: &str) -> Vec<(&'static str, Option<u64>)> {
    let c = rest();
    let mut out = Vec::new();
    for n in nodes {
        let v = get(
            &c,
            n.http(),
            &format!("/v1/services/{svc}/instances?all=true"),
        )
        .await;
        out.push((n.name, v.and_then(|v| v["revision"].as_u64())));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_node_holding_the_sessions_fails_no_request() {
    let etcd = etcd3().await;
    let (mut nodes, _) = nodes3_fixed(&etcd, "5s").await;
    let run = FailoverRun::start(&nodes, "8s").await;
    tokio::time::sleep_until(run.started + Duration::from_secs(2)).await;
    let killed = Instant::now();
    nodes[0].server.proc.signal(Signal::SIGKILL);
    nodes[0].server.proc.wait(Duration::from_secs(5)).await;
    let c = rest();
    let moved = poll(Duration::from_secs(10), || async {
        for s in &run.services {
            let (k, _) = keeper(&c, nodes[1].http(), "demo", &s.addr).await?;
            let on_n3 = keeper(&c, nodes[2].http(), "demo", &s.addr).await?.0;
            if k != "session" && on_n3 != "session" {
                return None;
            }
        }
        Some(Instant::now())
    })
    .await
    .expect("the three sessions moved to n2 or n3");
    println!(
        "n1 killed: the three demo-services' sessions on n2/n3 {:.0} ms later",
        ms(killed, moved)
    );
    run.finish("kill -9 of n1").await;
    nodes.remove(0);
    let revisions = revisions_of(&nodes.iter().collect::<Vec<_>>(), "demo").await;
    println!(
        "after the takeover and the services' end, demo's revision on each node: {revisions:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_of_the_three_nodes_fails_no_request() {
    let etcd = etcd3().await;
    let (mut nodes, addrs) = nodes3_fixed(&etcd, "5s").await;
    let run = FailoverRun::start(&nodes, "25s").await;
    for i in 0..3 {
        let t0 = Instant::now();
        nodes[i].server.proc.signal(Signal::SIGTERM);
        let status = nodes[i].server.proc.wait(Duration::from_secs(15)).await;
        assert!(status.success(), "{} stopped with {status}", NAMES[i]);
        let stopped = t0.elapsed();
        nodes[i] = Node::start(&etcd, NAMES[i], &addrs[i].0, &addrs[i].1, "5s").await;
        wait_members(&nodes.iter().collect::<Vec<_>>(), 3).await;
        println!(
            "{} stopped in {stopped:?} (SIGTERM), back and in the cluster {:?} after",
            NAMES[i],
            t0.elapsed()
        );
    }
    run.finish("rolling restart of n1, n2, n3").await;
    let revisions = revisions_of(&nodes.iter().collect::<Vec<_>>(), "demo").await;
    println!(
        "after the rolling restart and the services' end, demo's revision on each node: {revisions:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// 6. The Nacos Python SDK with three server addresses
// ---------------------------------------------------------------------------------------------

/// The workspace root.
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The Python of the Nacos venv (scripts/test.sh makes it): `NACOS_PYTHON`, else
/// tests/nacos/python/.venv/bin/python; `None` when neither exists.
fn nacos_python() -> Option<PathBuf> {
    let p = std::env::var_os("NACOS_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("tests/nacos/python/.venv/bin/python"));
    p.exists().then_some(p)
}

/// An HTTP port P with P + 1000 free too (Nacos SDKs take the gRPC port as HTTP + 1000).
fn free_nacos_pair() -> u16 {
    for _ in 0..100 {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let p = l.local_addr().unwrap().port();
        if p < 64000 && TcpListener::bind(("127.0.0.1", p + 1000)).is_ok() {
            return p;
        }
    }
    panic!("no free port pair P, P+1000");
}

/// `python scenarios.py ARGS` (tests/nacos/python), stdout read line by line.
fn scenario(python: &Path, scratch: &Path, args: &[&str]) -> Proc {
    let mut command = tokio::process::Command::new(python);
    command
        .arg("scenarios.py")
        .args(args)
        .current_dir(workspace().join("tests/nacos/python"))
        .env("NACOS_SCRATCH", scratch)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().expect("spawn python");
    let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let stderr = Some(BufReader::new(child.stderr.take().unwrap()).lines());
    Proc {
        child,
        stdout,
        stderr,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nacos_python_sdk_with_three_nodes_keeps_its_registration_and_subscription_when_its_node_is_killed()
 {
    let Some(python) = nacos_python() else {
        assert_ne!(
            std::env::var("GANGWAY_NACOS_E2E").as_deref(),
            Ok("require"),
            "GANGWAY_NACOS_E2E=require but no Nacos venv (tests/nacos/python/.venv or NACOS_PYTHON)"
        );
        println!(
            "SKIPPED: no nacos-sdk-python venv at tests/nacos/python/.venv (scripts/test.sh makes it) \
             and no NACOS_PYTHON"
        );
        return;
    };
    let etcd = etcd3().await;
    let mut nodes = Vec::new();
    for name in NAMES {
        let p = free_nacos_pair();
        let (http, grpc) = (format!("127.0.0.1:{p}"), format!("127.0.0.1:{}", p + 1000));
        nodes.push(Node::start(&etcd, name, &http, &grpc, TTL).await);
    }
    wait_members(&nodes.iter().collect::<Vec<_>>(), 3).await;
    let c = rest();
    let servers = nodes.iter().map(|n| n.http()).collect::<Vec<_>>().join(",");
    // The SDK's logs go under the scratch folder: kept when NACOS_SCRATCH names one.
    let scratch = match std::env::var_os("NACOS_SCRATCH") {
        Some(dir) => tempfile::Builder::new()
            .prefix("cluster-")
            .disable_cleanup(true)
            .tempdir_in(dir)
            .unwrap(),
        None => tempfile::tempdir().unwrap(),
    };
    println!("SDK scratch (logs): {}", scratch.path().display());
    let svc = "py-cluster";
    let a = "10.7.0.1:9001".to_owned();
    let mut holder = scenario(
        &python,
        scratch.path(),
        &["holder", &servers, svc, "10.7.0.1", "9001"],
    );
    holder.line_starting("READY").await;
    holder.forward_stderr("py-holder");
    let mut consumer = scenario(&python, scratch.path(), &["consumer", &servers, svc]);
    consumer.forward_stderr("py-consumer");
    // The consumer's pushes, read by a task that owns the process (killed by PID at the end).
    let consumer_pid = consumer.pid();
    let pushed: Arc<Mutex<Vec<(Instant, Vec<String>)>>> = Arc::default();
    let sink = pushed.clone();
    let reader = tokio::spawn(async move {
        while let Ok(Some(line)) = consumer.stdout.next_line().await {
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                let hosts: Vec<String> =
                    serde_json::from_value(v["hosts"].clone()).unwrap_or_default();
                sink.lock().unwrap().push((Instant::now(), hosts));
            }
        }
        consumer
    });
    // (Its first push may come before its READY line: the SDK calls back during subscribe.)
    // Up to 35 s: when the consumer's own node is the one killed, the SDK (nacos-sdk-python
    // 3.2) subscribes again only at its redo, every 30 s, and meanwhile sees changes at its
    // poll of the service every cacheMillis (10 s).
    let got = |want: Vec<String>| {
        let pushed = pushed.clone();
        async move {
            poll(Duration::from_secs(35), || async {
                pushed
                    .lock()
                    .unwrap()
                    .iter()
                    .find(|(_, h)| *h == want)
                    .map(|(t, _)| *t)
            })
            .await
        }
    };
    if got(vec![a.clone()]).await.is_none() {
        for n in &nodes {
            println!(
                "{}: liveness {:?}; subscribers {:?}",
                n.name,
                get(&c, n.http(), &format!("/v1/services/{svc}/liveness")).await,
                get(&c, n.http(), &format!("/v1/services/{svc}/subscribers")).await
            );
        }
        panic!(
            "the SDK consumer was not pushed the holder's instance; it printed {:?}",
            pushed.lock().unwrap()
        );
    }

    // Which node holds the holder's session, and the consumer's subscription.
    let mut holder_node = None;
    for (i, n) in nodes.iter().enumerate() {
        if keeper(&c, n.http(), svc, &a)
            .await
            .is_some_and(|k| k.0 == "session")
        {
            holder_node = Some(i);
        }
    }
    let k = holder_node.expect("a node holds the holder's session");
    let mut consumer_node = None;
    for (i, n) in nodes.iter().enumerate() {
        let subs = get(&c, n.http(), &format!("/v1/services/{svc}/subscribers"))
            .await
            .unwrap();
        if subs["subscribers"].as_array().unwrap().iter().any(|s| {
            s["client_name"]
                .as_str()
                .is_some_and(|n| n.starts_with("nacos-grpc"))
                && s["node"]
                    .as_str()
                    .is_none_or(|x| x.is_empty() || x == NAMES[i])
        }) {
            consumer_node = Some(NAMES[i]);
        }
    }
    println!(
        "the SDK holder's session is on {}, the consumer's subscription on {consumer_node:?}",
        NAMES[k]
    );

    let killed = Instant::now();
    nodes[k].server.proc.signal(Signal::SIGKILL);
    nodes[k].server.proc.wait(Duration::from_secs(5)).await;
    let survivors: Vec<&Node> = nodes
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != k)
        .map(|(_, n)| n)
        .collect();
    // The registration, watched on the survivors until past the dead node's lease TTL.
    let mut missing_since: Option<Instant> = None;
    let mut gaps = Vec::new();
    let mut taken_over = None;
    let watch_until = killed + Duration::from_secs(6);
    while Instant::now() < watch_until || taken_over.is_none() {
        if Instant::now() > killed + Duration::from_secs(20) {
            break;
        }
        let mut present = true;
        for n in &survivors {
            match keeper(&c, n.http(), svc, &a).await {
                None => present = false,
                Some((l, _)) if l == "session" && taken_over.is_none() => {
                    taken_over = Some((Instant::now(), n.name));
                }
                _ => {}
            }
        }
        match (present, missing_since) {
            (false, None) => missing_since = Some(Instant::now()),
            (true, Some(s)) => {
                gaps.push(format!(
                    "{:.0}-{:.0} ms",
                    ms(killed, s),
                    ms(killed, Instant::now())
                ));
                missing_since = None;
            }
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    if let Some(s) = missing_since {
        gaps.push(format!("from {:.0} ms on", ms(killed, s)));
    }
    println!(
        "{} killed: the SDK's registration taken over by {:?} after {:?} ms; missing from a survivor's view: {gaps:?}",
        NAMES[k],
        taken_over.map(|t| t.1),
        taken_over.map(|t| ms(killed, t.0).round())
    );
    if taken_over.is_none() {
        for n in &survivors {
            println!(
                "{} after the kill: cluster {:?}; liveness {:?}",
                n.name,
                get(&c, n.http(), "/v1/cluster").await,
                get(&c, n.http(), &format!("/v1/services/{svc}/liveness")).await
            );
        }
    }
    let (_, by) = taken_over.expect("the SDK re-registered on a surviving node");
    for n in &survivors {
        let kept = keeper(&c, n.http(), svc, &a).await;
        let want = if n.name == by {
            ("session".into(), None)
        } else {
            ("remote".into(), Some(by.into()))
        };
        assert_eq!(kept, Some(want), "{a} on {} after the kill", n.name);
    }
    // The subscription still works: a new instance on a survivor reaches the SDK's consumer.
    let t0 = Instant::now();
    register_lease(&c, survivors[0].http(), svc, "10.7.0.2", 9002).await;
    let mut both = vec![a.clone(), "10.7.0.2:9002".to_owned()];
    both.sort();
    let at = got(both).await.unwrap_or_else(|| {
        panic!(
            "the SDK consumer was not pushed both instances: {:?}",
            pushed.lock().unwrap()
        )
    });
    println!(
        "after the kill, a new instance on {} reached the SDK's consumer in {:.0} ms",
        survivors[0].name,
        ms(t0, at)
    );
    assert!(
        gaps.is_empty(),
        "the SDK's registration left the survivors' view: {gaps:?}"
    );
    holder.signal(Signal::SIGKILL);
    holder.wait(Duration::from_secs(5)).await;
    nix::sys::signal::kill(consumer_pid, Signal::SIGKILL).expect("kill the consumer");
    let mut consumer = tokio::time::timeout(Duration::from_secs(5), reader)
        .await
        .expect("the consumer's stdout ends")
        .unwrap();
    consumer.wait(Duration::from_secs(5)).await;
}

/// `enabled` of `addr` of `svc` on node `http` (every instance listed).
async fn enabled_on(c: &reqwest::Client, http: &str, svc: &str, addr: &str) -> Option<bool> {
    let v = get(c, http, &format!("/v1/services/{svc}/instances?all=true")).await?;
    v["instances"]
        .as_array()?
        .iter()
        .find(|i| addr_of(i) == addr)
        .and_then(|i| i["enabled"].as_bool())
}

/// Polls until every node shows `addr` with `enabled`; the time it took.
async fn everywhere(
    c: &reqwest::Client,
    nodes: &[Node],
    svc: &str,
    addr: &str,
    enabled: bool,
) -> Option<Instant> {
    poll(Duration::from_secs(5), || async {
        for n in nodes {
            if enabled_on(c, n.http(), svc, addr).await? != enabled {
                return None;
            }
        }
        Some(Instant::now())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_after_the_registration_drains_it_everywhere_and_online_through_its_holder_sticks()
 {
    let etcd = etcd3().await;
    let (mut nodes, addrs) = nodes3_fixed(&etcd, TTL).await;
    let c = rest();
    register_lease(&c, nodes[0].http(), "fq", "10.3.0.1", 80).await;
    register_lease(&c, nodes[0].http(), "fq", "10.3.0.2", 80).await;
    let a = "10.3.0.1:80";
    everywhere(&c, &nodes, "fq", a, true)
        .await
        .expect("registered everywhere");
    // n2 restarts: it loads the instances from etcd (not from its own watch).
    nodes[1].server.proc.signal(Signal::SIGTERM);
    nodes[1].server.proc.wait(Duration::from_secs(15)).await;
    nodes[1] = Node::start(&etcd, NAMES[1], &addrs[1].0, &addrs[1].1, TTL).await;
    wait_members(&nodes.iter().collect::<Vec<_>>(), 3).await;
    // A second node of the same name is refused while n2 lives.
    let dir = tempfile::tempdir().unwrap();
    let endpoints = etcd.endpoints().join(",");
    let mut twin = Proc::spawn(&[
        "server",
        "--http",
        "127.0.0.1:0",
        "--grpc",
        "127.0.0.1:0",
        "--data-dir",
        dir.path().to_str().unwrap(),
        "--store",
        "etcd",
        "--etcd-endpoints",
        &endpoints,
        "--etcd-lease-ttl",
        TTL,
        "--node-name",
        NAMES[1],
    ]);
    let status = twin.wait(Duration::from_secs(15)).await;
    assert!(!status.success(), "a second {} started", NAMES[1]);
    let said = twin.stderr_line_containing("in use by a live node").await;
    println!("a second {}: {said}", NAMES[1]);
    assert_eq!(
        get(&c, nodes[0].http(), "/v1/cluster").await.unwrap()["nodes"]
            .as_array()
            .unwrap()
            .len(),
        3,
        "n2 is still a member"
    );

    // A drain through the restarted n2 takes the instance out on every node.
    let t0 = Instant::now();
    let (status, report) = post(
        &c,
        nodes[1].http(),
        &format!("/v1/services/fq/instances/{a}/drain"),
        &json!({"timeout_ms": 3000}),
    )
    .await;
    assert_eq!(status, 200, "{report}");
    let out = everywhere(&c, &nodes, "fq", a, false)
        .await
        .unwrap_or_else(|| panic!("not offline everywhere after a drain through n2: {report}"));
    println!(
        "drain through the restarted n2: {} ms, offline on every node after {:.0} ms",
        report["waited_ms"],
        ms(t0, out)
    );
    // online through its holder n1 sticks on every node (no node puts its drain back).
    let (status, answer) = post(
        &c,
        nodes[0].http(),
        &format!("/v1/services/fq/instances/{a}/online"),
        &json!({}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    everywhere(&c, &nodes, "fq", a, true)
        .await
        .expect("online everywhere");
    // Still online everywhere a while later.
    let until = Instant::now() + Duration::from_secs(1);
    while Instant::now() < until {
        for n in &nodes {
            assert_eq!(
                enabled_on(&c, n.http(), "fq", a).await,
                Some(true),
                "{} put it offline again",
                n.name
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_drains_of_the_last_two_instances_through_two_nodes_leave_one_serving() {
    let etcd = etcd3().await;
    let nodes = nodes3(&etcd, TTL).await;
    let c = rest();
    let (a, b) = ("10.6.0.1:80", "10.6.0.2:80");
    register_lease(&c, nodes[0].http(), "last", "10.6.0.1", 80).await;
    register_lease(&c, nodes[0].http(), "last", "10.6.0.2", 80).await;
    for round in 0..5 {
        everywhere(&c, &nodes, "last", a, true)
            .await
            .expect("a online");
        everywhere(&c, &nodes, "last", b, true)
            .await
            .expect("b online");
        let drain = |node: &Node, addr: &str| {
            let (c, http, path) = (
                c.clone(),
                node.http().to_owned(),
                format!("/v1/services/last/instances/{addr}/drain"),
            );
            async move { post(&c, &http, &path, &json!({"timeout_ms": 500})).await }
        };
        let t0 = Instant::now();
        let ((sa, ra), (sb, rb)) = tokio::join!(drain(&nodes[1], a), drain(&nodes[2], b));
        let mut statuses = [sa, sb];
        statuses.sort();
        println!(
            "round {round}: drains through n2 and n3 answered {statuses:?} in {:.0} ms",
            ms(t0, Instant::now())
        );
        assert_eq!(statuses, [200, 409], "round {round}: {ra} / {rb}");
        // Exactly one of the two is offline, and every node agrees.
        let offline = if sa == 200 { a } else { b };
        everywhere(&c, &nodes, "last", offline, false)
            .await
            .expect("the drained one offline everywhere");
        let serving = if sa == 200 { b } else { a };
        everywhere(&c, &nodes, "last", serving, true)
            .await
            .expect("the refused one serving everywhere");
        let (status, answer) = post(
            &c,
            nodes[0].http(),
            &format!("/v1/services/last/instances/{offline}/online"),
            &json!({}),
        )
        .await;
        assert_eq!(status, 200, "{answer}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_registrations_of_the_two_kinds_through_two_nodes_fix_one_kind() {
    let etcd = etcd3().await;
    let nodes = nodes3(&etcd, TTL).await;
    let c = rest();
    for round in 0..5 {
        let svc = format!("kind-{round}");
        let path = format!("/v1/services/{svc}/instances");
        let ephemeral =
            json!({"ip": "10.8.0.1", "port": 80, "ttl_ms": 60_000, "delete_timeout_ms": 120_000});
        let persistent = json!({
            "ip": "10.8.0.2", "port": 80, "ephemeral": false,
            "probe": {"kind": "tcp", "interval_ms": 3_600_000},
        });
        let t0 = Instant::now();
        let ((se, re), (sp, rp)) = tokio::join!(
            post(&c, nodes[0].http(), &path, &ephemeral),
            post(&c, nodes[1].http(), &path, &persistent)
        );
        let mut statuses = [se, sp];
        statuses.sort();
        println!(
            "round {round}: ephemeral through n1 {se}, persistent through n2 {sp}, in {:.0} ms",
            ms(t0, Instant::now())
        );
        assert_eq!(statuses, [200, 409], "round {round}: {re} / {rp}");
        let kind = if se == 200 { "ephemeral" } else { "persistent" };
        let agreed = poll(Duration::from_secs(5), || async {
            for n in &nodes {
                let s = get(&c, n.http(), &format!("/v1/services/{svc}")).await?;
                if s["kind"] != kind || s["instances"] != 1 {
                    return None;
                }
            }
            Some(())
        })
        .await;
        assert!(
            agreed.is_some(),
            "round {round}: not every node holds one {kind} instance"
        );
    }
}
