//! Issue 9 part 3 (alibaba/nacos#8090): the registry's own pause must not evict live instances.
//! Real processes on loopback: a registry with 3 demo-service sessions, 3 lease instances kept
//! by `gangway register --keep-alive` (TTL 3 s), 3 persistent instances whose ports stay open,
//! SSE watchers on the three services and a demo-client at 60 req/s; the registry is SIGSTOPped
//! for 10 s, then SIGCONTed. Nothing may be evicted, no watcher may see a live instance
//! missing, no persistent instance may turn unhealthy, and the client loses nothing.

mod cluster;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cluster::{DemoService, Proc, Server, poll};
use futures::StreamExt;
use nix::sys::signal::Signal;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::time::Instant;

/// How long the registry is frozen: longer than the lease TTL and the session keepalive timeout.
const STALL: Duration = Duration::from_secs(10);

/// Every view an SSE watcher received: (instances listed, how many of them unhealthy).
type Seen = Arc<Mutex<Vec<(usize, usize)>>>;

fn watch(server: &Server, service: &str) -> Seen {
    let seen: Seen = Arc::default();
    let url = server.url(&format!("/v1/services/{service}/watch"));
    let sink = seen.clone();
    tokio::spawn(async move {
        // One connection for the whole test: a reconnect would start from a fresh snapshot.
        let Ok(resp) = reqwest::get(url).await else {
            return;
        };
        let mut body = resp.bytes_stream();
        let mut buf = String::new();
        while let Some(Ok(chunk)) = body.next().await {
            buf.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = buf.find("\n\n") {
                let event: String = buf.drain(..end + 2).collect();
                if let Some(data) = event.lines().find_map(|l| l.strip_prefix("data:")) {
                    let v: Value = serde_json::from_str(data.trim()).unwrap();
                    let list = v["instances"].as_array().unwrap();
                    let unhealthy = list.iter().filter(|i| i["healthy"] == false).count();
                    sink.lock().unwrap().push((list.len(), unhealthy));
                }
            }
        }
    });
    seen
}

#[tokio::test]
async fn a_frozen_registry_evicts_nothing_when_it_resumes() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start(data.path(), "127.0.0.1:0", "127.0.0.1:0", &[]).await;
    let mut services = Vec::new();
    for name in ["a", "b", "c"] {
        services.push(DemoService::start(&server.grpc, name).await);
    }
    let http = reqwest::Client::new();
    // Three lease instances kept by heartbeats, and three persistent ones probed every 500 ms.
    let mut listeners = Vec::new();
    let mut keepers = Vec::new();
    for _ in 0..3 {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let mut keeper = Proc::spawn(&[
            "--server",
            &server.http,
            "register",
            "leases",
            &addr,
            "--keep-alive",
            "--ttl",
            "3",
            "--delete-timeout",
            "6",
        ]);
        keeper.line_starting("registered").await;
        keeper.forward_stderr("keep-alive");
        keepers.push(keeper);
        listeners.push(l);
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let r = http
            .post(server.url("/v1/services/stock/instances"))
            .json(&json!({"ip": "127.0.0.1", "port": port, "ephemeral": false,
                          "probe": {"kind": "tcp", "interval_ms": 500, "fall": 2, "rise": 2}}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
        listeners.push(l);
    }
    // Accept the probes' connections so the ports stay answering.
    for l in listeners {
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                drop(s);
            }
        });
    }
    for service in ["demo", "leases", "stock"] {
        let listed = poll(Duration::from_secs(10), || async {
            let v = server
                .get(&format!("/v1/services/{service}/instances"))
                .await;
            (v["instances"].as_array().map_or(0, Vec::len) == 3).then_some(())
        })
        .await;
        assert!(listed.is_some(), "{service}: 3 instances before the stall");
    }
    let watchers: Vec<(&str, Seen)> = ["demo", "leases", "stock"]
        .into_iter()
        .map(|s| (s, watch(&server, s)))
        .collect();
    let mut client = Proc::spawn(&[
        "demo-client",
        "--registry",
        &server.grpc,
        "--service",
        "demo",
        "--rate",
        "60",
        "--duration",
        "20s",
        "--min-instances",
        "3",
        "--no-retry",
        "--no-ejection",
        "--json",
    ]);
    client.stderr_line_starting("sending 1200 requests").await;
    client.forward_stderr("demo-client");
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;

    server.proc.signal(Signal::SIGSTOP);
    // The pause is the scenario: nothing to poll for while the registry is frozen.
    tokio::time::sleep(STALL).await;
    server.proc.signal(Signal::SIGCONT);
    let resumed = Instant::now();

    // Past the stall recovery (5 s) and one more lease TTL: anything evicted is gone by now.
    tokio::time::sleep_until(resumed + Duration::from_secs(8)).await;
    let metrics = reqwest::get(server.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let mut rows = Vec::new();
    let mut failures: Vec<String> = Vec::new();
    for (service, seen) in &watchers {
        let all = server
            .get(&format!("/v1/services/{service}/instances?all=true"))
            .await;
        let list = all["instances"].as_array().unwrap();
        let healthy = list.iter().filter(|i| i["healthy"] == true).count();
        let seen = seen.lock().unwrap().clone();
        let fewest = seen.iter().map(|(n, _)| *n).min().unwrap_or(0);
        let unhealthy_seen = seen.iter().map(|(_, u)| *u).max().unwrap_or(0);
        rows.push(format!(
            "{service:<7} after: {} listed, {healthy} healthy; {} views pushed, fewest instances {fewest}, most unhealthy {unhealthy_seen}",
            list.len(),
            seen.len()
        ));
        if list.len() != 3 || healthy != 3 {
            failures.push(format!(
                "{service}: evicted or unhealthy after the stall: {all}"
            ));
        }
        if seen.is_empty() || fewest != 3 || unhealthy_seen != 0 {
            failures.push(format!(
                "{service}: a watcher saw a live instance missing or unhealthy: {seen:?}"
            ));
        }
    }
    let out = client.rest_of_stdout(Duration::from_secs(30)).await;
    let report: Value = serde_json::from_str(out.trim()).expect("demo-client JSON");
    println!(
        "registry SIGSTOP {} s at t = 2 s:\n  {}\n  demo-client: {} sent, {} failed ({:.1} s)",
        STALL.as_secs(),
        rows.join("\n  "),
        report["sent"],
        report["failed"],
        started.elapsed().as_secs_f64()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        metrics.contains("gangway_stalls_total 1"),
        "the registry noticed its stall"
    );
    assert_eq!(report["failed"], 0, "{report}");
    drop(keepers);
    drop(services);
}
