//! Acknowledged persistent writes survive kill -9 of the server (issue #2).

mod cluster;

use std::time::Duration;

use cluster::Server;
use futures::StreamExt;
use nix::sys::signal::Signal;
use serde_json::{Value, json};

fn sorted_instances(listing: &Value) -> Vec<Value> {
    let mut v: Vec<Value> = listing["instances"].as_array().expect("instances").clone();
    v.sort_by_key(|i| (i["ip"].as_str().unwrap().to_owned(), i["port"].as_u64()));
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_persistent_instances_survive_kill_9() {
    let data = tempfile::tempdir().unwrap();
    let mut server = Server::start(
        data.path(),
        "127.0.0.1:0",
        "127.0.0.1:0",
        &["--warmup", "0s"],
    )
    .await;
    let http = reqwest::Client::new();
    let url = server.url("/v1/services/stock/instances");
    let statuses: Vec<u16> = futures::stream::iter(0..1000u32)
        .map(|n| {
            let body = json!({
                "ip": format!("10.1.{}.{}", n / 250, n % 250 + 1),
                "port": 8000 + n % 7,
                "ephemeral": false,
                "weight": f64::from(n % 10) + 0.5,
                "metadata": { "n": n.to_string(), "zone": format!("z{}", n % 3) },
                // Probes would mark them unhealthy (nothing listens); keep them slow.
                "probe": { "kind": "tcp", "interval_ms": 3_600_000 },
            });
            let (http, url) = (http.clone(), url.clone());
            async move { cluster::post_status(&http, &url, &body).await }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    assert!(
        statuses.iter().all(|s| *s == 200),
        "every registration acknowledged"
    );
    let before = sorted_instances(&server.get("/v1/services/stock/instances?all=true").await);
    assert_eq!(before.len(), 1000);

    let (h, g) = (server.http.clone(), server.grpc.clone());
    server.proc.signal(Signal::SIGKILL);
    server.proc.wait(Duration::from_secs(5)).await;
    let server = Server::start(data.path(), &h, &g, &["--warmup", "0s"]).await;
    let after = sorted_instances(&server.get("/v1/services/stock/instances?all=true").await);
    assert_eq!(after.len(), 1000);
    assert_eq!(after, before, "same fields after kill -9 and restart");
    assert_eq!(after[0]["ephemeral"], false);
}
