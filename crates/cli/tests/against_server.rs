//! The real `gangway` binary against a real in-process registry (`gangway_server::start` on
//! 127.0.0.1:0): the wire shapes the CLI expects are the ones the server sends.

mod cluster;
#[path = "fake_registry/running.rs"]
mod running;

use std::process::Output;

use cluster::gangway;
use running::Running;
use serde_json::Value;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn ok(o: &Output) -> String {
    assert_eq!(o.status.code(), Some(0), "stderr: {}", text(&o.stderr));
    text(&o.stdout)
}

#[tokio::test]
async fn register_list_offline_drain_deregister_round_trip() {
    let server = gangway_server::start_in_memory(gangway_server::Config::for_tests())
        .await
        .unwrap();
    let addr = server.http_addr.to_string();
    let run = |args: &'static [&'static str]| gangway(&addr, args);

    let out = ok(&run(&[
        "register",
        "orders",
        "10.0.0.5:8080",
        "-m",
        "zone=a",
        "--ttl",
        "30",
    ])
    .await);
    assert!(
        out.starts_with("registered 10.0.0.5:8080 in orders (revision "),
        "{out}"
    );
    // The register answer does not say how the instance is kept alive: no LIVENESS column.
    assert!(!out.contains("LIVENESS"), "{out}");
    ok(&run(&["register", "orders", "[fd00::7]:8080"]).await);
    let out = ok(&run(&["heartbeat", "orders", "[fd00::7]:8080", "--once"]).await);
    assert!(
        out.starts_with("heartbeat sent for [fd00::7]:8080: healthy"),
        "{out}"
    );

    let out = ok(&run(&["list", "orders"]).await);
    assert!(out.contains("2 instances"), "{out}");
    assert!(out.contains("LIVENESS"), "{out}");
    assert!(out.contains("\n10.0.0.5:8080 "), "{out}");
    assert!(out.contains("[fd00::7]:8080"), "{out}");

    let out = ok(&run(&["services", "--json"]).await);
    let services: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(services["services"][0]["service"], "orders");
    assert_eq!(services["services"][0]["instances"], 2);

    // No subscribers: the drain completes at once.
    let out = ok(&run(&[
        "offline",
        "orders",
        "10.0.0.5:8080",
        "--wait",
        "--timeout",
        "2",
    ])
    .await);
    assert!(out.contains(" complete: "), "{out}");
    let out = ok(&run(&["list", "orders", "--all", "--json"]).await);
    let view: Value = serde_json::from_str(&out).unwrap();
    let off = view["instances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["ip"] == "10.0.0.5")
        .unwrap();
    assert_eq!(off["enabled"], false);
    ok(&run(&["online", "orders", "10.0.0.5:8080"]).await);

    let out = ok(&run(&["deregister", "orders", "[fd00::7]:8080"]).await);
    assert!(
        out.starts_with("deregistered [fd00::7]:8080 from orders"),
        "{out}"
    );
    let out = ok(&run(&["subscribers", "orders"]).await);
    assert!(out.starts_with("orders  revision "), "{out}");

    // The registry's own validation error comes back as one line, exit 2 (a bad argument).
    // (A bad service name is caught by the CLI; a zero TTL only by the registry.)
    let out = run(&["register", "orders", "10.0.0.6:80", "--ttl", "0"]).await;
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.starts_with("error: ttl_ms: ") && err.ends_with("(HTTP 400)\n"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");

    let out = run(&["heartbeat", "orders", "10.9.9.9:80", "--once"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("(HTTP 404)"),
        "{}",
        text(&out.stderr)
    );

    server.shutdown().await;
}

#[tokio::test]
async fn watch_sees_the_current_snapshot() {
    let server = gangway_server::start_in_memory(gangway_server::Config::for_tests())
        .await
        .unwrap();
    let addr = server.http_addr.to_string();
    ok(&gangway(&addr, &["register", "orders", "10.0.0.5:8080"]).await);
    let out = ok(&gangway(&addr, &["watch", "orders", "--count", "1"]).await);
    assert!(out.contains("  1 instance  10.0.0.5:8080"), "{out}");
    server.shutdown().await;
}

#[tokio::test]
async fn drain_waits_for_a_watching_subscriber() {
    use tokio::io::AsyncBufReadExt;

    let server = gangway_server::start_in_memory(gangway_server::Config::for_tests())
        .await
        .unwrap();
    let addr = server.http_addr.to_string();
    ok(&gangway(&addr, &["register", "orders", "10.0.0.5:8080"]).await);
    ok(&gangway(&addr, &["register", "orders", "10.0.0.6:8080"]).await);

    let mut watcher = tokio::process::Command::new(env!("CARGO_BIN_EXE_gangway"))
        .args(["--server", &addr, "watch", "orders", "--count", "2"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(watcher.stdout.take().unwrap()).lines();
    // Its first snapshot means it is subscribed.
    let first = lines.next_line().await.unwrap().unwrap();
    assert!(first.contains("  2 instances  "), "{first}");

    let out = ok(&gangway(
        &addr,
        &["drain", "orders", "10.0.0.5:8080", "--timeout", "10"],
    )
    .await);
    assert!(
        out.contains(" complete: ") && out.contains("1 acked, 0 lagging"),
        "{out}"
    );
    assert!(out.lines().any(|l| l.ends_with("acked")), "{out}");

    let second = lines.next_line().await.unwrap().unwrap();
    assert!(second.ends_with("  1 instance  10.0.0.6:8080"), "{second}");
    assert!(watcher.wait().await.unwrap().success());
    server.shutdown().await;
}

#[tokio::test]
async fn the_grpc_port_by_mistake_gets_a_hint() {
    let server = gangway_server::start_in_memory(gangway_server::Config::for_tests())
        .await
        .unwrap();
    let grpc = server.grpc_addr.to_string();
    let out = gangway(&grpc, &["services"]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.starts_with(&format!(
            "error: {grpc} does not look like a gangway registry ("
        )) && err.ends_with(
            "); is this the gRPC port? the REST port is usually 8848 (a registry that serves \
             TLS needs https://)\n"
        ),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    server.shutdown().await;
}

/// `gangway server` on `http` with a fresh data dir and no warm-up, once it listens.
async fn registry_process(http: &str, data: &std::path::Path) -> Running {
    let mut registry = Running::start(
        "",
        &[
            "server",
            "--http",
            http,
            "--grpc",
            "127.0.0.1:0",
            "--data-dir",
            data.to_str().unwrap(),
            "--warmup",
            "0s",
        ],
    );
    registry
        .wait_for(|out, _| out.contains(" listening: "))
        .await;
    registry
}

#[tokio::test]
async fn keep_alive_and_watch_survive_a_registry_restart() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let data = tempfile::tempdir().unwrap();
    let registry = registry_process(&addr, data.path()).await;

    let mut keeper = Running::start(
        &addr,
        &[
            "register",
            "orders",
            "10.0.0.5:8080",
            "-m",
            "zone=a",
            "--keep-alive",
            "--every",
            "100ms",
        ],
    );
    keeper
        .wait_for(|out, _| out.contains("heartbeating "))
        .await;
    let mut watch = Running::start(&addr, &["watch", "orders"]);
    watch
        .wait_for(|out, _| out.contains("  1 instance  10.0.0.5:8080"))
        .await;

    // The registry dies; heartbeats warn and the watch retries, neither exits.
    registry.stop(nix::sys::signal::Signal::SIGKILL).await;
    keeper
        .wait_for(|_, err| err.contains("warning: heartbeat failed: cannot reach the registry"))
        .await;
    watch
        .wait_for(|_, err| err.matches("; reconnecting in ").count() >= 3)
        .await;

    // A new, empty registry on the same address: the instance is registered again (ephemeral
    // instances do not outlive the registry), and the watch sees it in a new stream.
    let registry = registry_process(&addr, data.path()).await;
    keeper
        .wait_for(|_, err| {
            err.contains(
                "10.0.0.5:8080 was gone from the registry (restarted?): registered it again",
            )
        })
        .await;
    watch
        .wait_for(|out, _| out.matches("  1 instance  10.0.0.5:8080").count() >= 2)
        .await;
    let out = ok(&gangway(&addr, &["list", "orders", "--json"]).await);
    let view: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(view["instances"][0]["ip"], "10.0.0.5");
    assert_eq!(view["instances"][0]["metadata"]["zone"], "a");

    let (status, _, err) = keeper.interrupt().await;
    assert_eq!(status.code(), Some(0), "{err}");
    let (status, _, err) = watch.interrupt().await;
    assert_eq!(status.code(), Some(0), "{err}");
    // Backoff: 100ms doubling, at most 2s.
    let waits: Vec<&str> = err.lines().map(|l| l.rsplit(' ').next().unwrap()).collect();
    assert_eq!(waits.first(), Some(&"100ms"), "{err}");
    assert!(
        waits
            .iter()
            .all(|w| ["100ms", "200ms", "400ms", "800ms", "1.6s", "2s"].contains(w)),
        "{err}"
    );
    registry.interrupt().await;
}
