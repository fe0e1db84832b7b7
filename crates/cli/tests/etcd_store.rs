//! `gangway server --store etcd` against real etcd: 3 members of Debian's `etcd-server` on
//! loopback (gangway-testkit's `EtcdCluster`). Built with the CLI's `etcd` feature only.
#![cfg(feature = "etcd")]

mod cluster;

use std::time::{Duration, Instant};

use cluster::{Proc, Server};
use futures::StreamExt;
use gangway_testkit::etcd::EtcdCluster;
use nix::sys::signal::Signal;
use serde_json::{Value, json};

fn sorted_instances(listing: &Value) -> Vec<Value> {
    let mut v: Vec<Value> = listing["instances"].as_array().cloned().unwrap_or_default();
    v.sort_by_key(|i| {
        (
            i["ip"].as_str().unwrap_or("").to_owned(),
            i["port"].as_u64(),
        )
    });
    v
}

async fn start_on(etcd: &EtcdCluster, prefix: &str) -> (Server, tempfile::TempDir) {
    // --data-dir stays unused with --store etcd; a fresh one proves nothing is kept there.
    let dir = tempfile::tempdir().unwrap();
    let endpoints = etcd.endpoints().join(",");
    let server = Server::start(
        dir.path(),
        "127.0.0.1:0",
        "127.0.0.1:0",
        &[
            "--warmup",
            "0s",
            "--store",
            "etcd",
            "--etcd-endpoints",
            &endpoints,
            "--etcd-prefix",
            prefix,
        ],
    )
    .await;
    (server, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn persistent_instances_written_through_one_node_are_loaded_by_the_next_after_kill_9() {
    let etcd = tokio::task::spawn_blocking(|| EtcdCluster::start(3).expect("etcd"))
        .await
        .unwrap();
    let (mut first, first_dir) = start_on(&etcd, "/gangway").await;
    let http = reqwest::Client::new();
    let url = first.url("/v1/services/stock/instances");
    let started = Instant::now();
    let statuses: Vec<u16> = futures::stream::iter(0..300u32)
        .map(|n| {
            let body = json!({
                "ip": format!("10.2.{}.{}", n / 250, n % 250 + 1),
                "port": 9000,
                "ephemeral": false,
                "weight": f64::from(n % 10) + 0.5,
                "metadata": { "n": n.to_string() },
                "probe": { "kind": "tcp", "interval_ms": 3_600_000 },
            });
            let (http, url) = (http.clone(), url.clone());
            async move { cluster::post_status(&http, &url, &body).await }
        })
        // More writers than one etcd transaction takes (128): the group commit splits.
        .buffer_unordered(200)
        .collect()
        .await;
    let took = started.elapsed();
    println!("300 persistent registrations on etcd (3 members) in {took:?}");
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    let before = sorted_instances(&first.get("/v1/services/stock/instances?all=true").await);
    assert_eq!(before.len(), 300);
    let health = first.get("/v1/health").await;
    println!("health of the etcd-backed node: {health}");
    let lease = &health["node_lease"];
    assert_eq!(lease["state"], "alive", "{health}");
    assert_eq!(lease["ttl_s"], 5, "{health}");
    assert_eq!(lease["id"].as_str().map(str::len), Some(16), "{health}");

    first.proc.signal(Signal::SIGKILL);
    first.proc.wait(Duration::from_secs(5)).await;
    drop(first_dir);
    let (second, _dir) = start_on(&etcd, "/gangway").await;
    let after = sorted_instances(&second.get("/v1/services/stock/instances?all=true").await);
    assert_eq!(
        after, before,
        "the same instances, from etcd, on another node"
    );

    // Another prefix is another registry.
    let (other, _dir) = start_on(&etcd, "/elsewhere").await;
    let listing = other.get("/v1/services/stock/instances?all=true").await;
    assert_eq!(sorted_instances(&listing), Vec::<Value>::new(), "{listing}");
}

/// Runs `gangway server ARGS` to its exit (bounded); returns the status and stderr.
async fn refused(args: &[&str]) -> (i32, String, Duration) {
    let mut full = vec!["server", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"];
    full.extend_from_slice(args);
    let mut proc = Proc::spawn(&full);
    let started = Instant::now();
    let status = proc.wait(Duration::from_secs(20)).await;
    let mut stderr = String::new();
    let lines = proc.stderr.as_mut().unwrap();
    while let Ok(Some(line)) = lines.next_line().await {
        stderr.push_str(&line);
        stderr.push('\n');
    }
    (status.code().unwrap_or(-1), stderr, started.elapsed())
}

#[tokio::test]
async fn bad_etcd_flags_and_an_unreachable_etcd_are_refused_in_one_line() {
    let (code, stderr, _) = refused(&["--store", "etcd"]).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("--store etcd needs --etcd-endpoints"),
        "{stderr}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");

    let (code, stderr, _) =
        refused(&["--store", "etcd", "--etcd-endpoints", "localhost:2379"]).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("--etcd-endpoints \"localhost:2379\" must look like"),
        "{stderr}"
    );

    let (code, stderr, _) = refused(&["--etcd-prefix", "/x"]).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("--etcd-prefix needs --store etcd"),
        "{stderr}"
    );

    // Nothing listens there: the start fails within the 5 s connect timeout, naming it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let (code, stderr, took) = refused(&["--store", "etcd", "--etcd-endpoints", &endpoint]).await;
    println!("unreachable etcd refused after {took:?}: {stderr}");
    assert_ne!(code, 0, "{stderr}");
    assert!(
        stderr.contains(&endpoint) && stderr.contains("--store etcd"),
        "{stderr}"
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
}
