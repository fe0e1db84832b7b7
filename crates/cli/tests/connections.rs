//! Connections are bounded (issue 9, part 5): slowloris heads are cut at the header timeout,
//! and with few file descriptors a flood of idle connections neither blocks the API for longer
//! than its idle ones live nor touches the sessions. Real processes on 127.0.0.1.

mod cluster;

use std::collections::BTreeMap;
use std::time::Duration;

use cluster::Server;
use gangway_client::{Client, ClientConfig};
use gangway_core::model::{InstanceKey, ServiceKey};
use nix::sys::signal::Signal;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Scheduling slack on a loaded machine: a close must come after its timeout and within this.
const SLACK: Duration = Duration::from_secs(2);

/// Reads until the peer closes the connection or `until`; returns when it closed.
async fn closed_at(stream: &mut TcpStream, until: Instant) -> Option<Instant> {
    let mut buf = [0u8; 4096];
    tokio::time::timeout_at(until, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return Instant::now(),
                Ok(_) => {}
            }
        }
    })
    .await
    .ok()
}

/// One `GET` on a fresh connection: status, JSON body, time to the answer.
async fn get(addr: &str, path: &str) -> (u16, Value, Duration) {
    let started = Instant::now();
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(SLACK, stream.read_to_end(&mut raw)).await;
    let took = started.elapsed();
    let text = String::from_utf8_lossy(&raw);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split("\r\n\r\n")
        .nth(1)
        .and_then(|b| serde_json::from_str(b).ok())
        .unwrap_or(Value::Null);
    (status, body, took)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_heads_are_closed_within_the_header_timeout() {
    let header = Duration::from_secs(2);
    let data = tempfile::tempdir().unwrap();
    let server = Server::start(
        data.path(),
        "127.0.0.1:0",
        "127.0.0.1:0",
        &["--http-header-timeout", "2s", "--warmup", "0s"],
    )
    .await;
    let started = Instant::now();
    let slow: Vec<_> = (0..50)
        .map(|i| {
            let addr = server.http.clone();
            tokio::spawn(async move {
                let mut stream = TcpStream::connect(&addr).await.expect("connect");
                let opened = Instant::now();
                let head = format!("GET /v1/services HTTP/1.1\r\nhost: 127.0.0.1\r\nx-slow-{i}: ");
                let mut tick = tokio::time::interval(Duration::from_secs(1));
                let mut sent = 0;
                let deadline = opened + header + SLACK;
                // One byte a second until the server closes the connection (or the deadline).
                for b in head.bytes().chain(std::iter::repeat(b'a')).take(60) {
                    tokio::select! {
                        _ = tick.tick() => {}
                        at = closed_at(&mut stream, deadline) => return (at.map(|at| at - opened), sent),
                    }
                    if stream.write_all(&[b]).await.is_err() {
                        break;
                    }
                    sent += 1;
                }
                (closed_at(&mut stream, deadline).await.map(|at| at - opened), sent)
            })
        })
        .collect();
    let mut closes = Vec::new();
    for task in slow {
        let (closed, sent) = task.await.unwrap();
        let closed = closed
            .unwrap_or_else(|| panic!("a slowloris connection outlived {:?}", header + SLACK));
        closes.push((closed, sent));
    }
    let earliest = closes.iter().map(|c| c.0).min().unwrap();
    let latest = closes.iter().map(|c| c.0).max().unwrap();
    let bytes = closes.iter().map(|c| c.1).max().unwrap();
    println!(
        "50 slowloris connections (1 byte/s, header timeout {header:?}): closed after {earliest:?} to {latest:?}, at most {bytes} bytes sent; all done {:?} after the first connect",
        started.elapsed()
    );
    assert!(
        earliest >= header - Duration::from_millis(50),
        "{earliest:?}"
    );
    assert!(latest <= header + SLACK, "{latest:?}");
    let (status, _, took) = get(&server.http, "/v1/services").await;
    assert_eq!(status, 200, "the API answers ({took:?})");
    server.proc.signal(Signal::SIGKILL);
}

/// The flood of the fd-limit tests: `count` connections to `addr` that send nothing. Returns
/// them (closed ones included) and how many connects failed.
async fn flood(addr: &str, count: usize) -> (Vec<TcpStream>, usize) {
    let mut open = Vec::with_capacity(count);
    let mut failed = 0;
    for _ in 0..count {
        match tokio::time::timeout(Duration::from_millis(500), TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => open.push(stream),
            _ => failed += 1,
        }
    }
    (open, failed)
}

/// Waits for the server to close every flooded connection; returns when the last one closed.
async fn all_closed(streams: &mut [TcpStream], until: Instant) -> Instant {
    let mut last = Instant::now();
    for s in streams.iter_mut() {
        let at = closed_at(s, until)
            .await
            .expect("the server closed every idle connection");
        last = last.max(at);
    }
    last
}

/// Reads `gangway_<name>{port="http"}` from `/metrics`.
fn metric(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with(&format!("gangway_{name}{{port=\"http\"}}")))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

async fn sessions(server: &Server) -> Vec<Client> {
    let mut clients = Vec::new();
    for i in 0..2 {
        let client = Client::connect(ClientConfig::new(server.grpc.clone()))
            .await
            .unwrap();
        client
            .register(
                ServiceKey::named("kept"),
                InstanceKey::new("10.0.0.1", 9000 + i, ""),
                1.0,
                BTreeMap::new(),
            )
            .await
            .unwrap();
        clients.push(client);
    }
    clients
}

/// Sessions still on the sessions they had, and the registry still lists their instances.
async fn assert_sessions_survived(server: &Server, clients: &[Client], ids: &[Option<String>]) {
    for (client, id) in clients.iter().zip(ids) {
        assert!(client.is_connected(), "a session was lost");
        assert_eq!(&client.session_id(), id, "a session was replaced");
    }
    let (status, body, _) = get(&server.http, "/v1/services/kept/instances").await;
    assert_eq!(status, 200);
    assert_eq!(
        body["instances"].as_array().map_or(0, Vec::len),
        2,
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_1024_descriptors_a_flood_is_refused_clearly_and_the_api_recovers_at_once() {
    let idle = Duration::from_secs(3);
    let data = tempfile::tempdir().unwrap();
    let mut server = Server::start_with_fd_limit(
        data.path(),
        1024,
        &[
            "--http-header-timeout",
            "3s",
            "--http-idle-timeout",
            "3s",
            "--warmup",
            "0s",
        ],
    )
    .await;
    server.proc.forward_stderr("server");
    let clients = sessions(&server).await;
    let ids: Vec<_> = clients.iter().map(Client::session_id).collect();

    let flooded = Instant::now();
    let (mut streams, failed) = flood(&server.http, 1500).await;
    let flood_took = flooded.elapsed();
    // While the flood holds the port's maximum, an API call is refused, clearly.
    let (status, body, took) = get(&server.http, "/v1/services").await;
    println!("during the flood: {status} {body} in {took:?}");
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "overloaded", "{body}");
    // A new session still connects: the gRPC port has its own maximum.
    let newcomer = Client::connect(ClientConfig::new(server.grpc.clone())).await;
    assert!(
        newcomer.is_ok(),
        "a new session during the HTTP flood: {:?}",
        newcomer.err()
    );

    let last = all_closed(&mut streams, flooded + flood_took + idle + SLACK * 2).await;
    let (status, _, took) = get(&server.http, "/v1/services").await;
    let after = last.elapsed();
    let (_, metrics_text) = {
        let (s, _, _) = get(&server.http, "/v1/health").await;
        (
            s,
            reqwest::get(server.url("/metrics"))
                .await
                .unwrap()
                .text()
                .await
                .unwrap(),
        )
    };
    println!(
        "ulimit -n 1024, 1500 idle connections ({failed} connects failed, flood took {flood_took:?}): \
         refused {}, timed out {}, accept errors {}; list answered {status} in {took:?}, {after:?} after the last idle one closed",
        metric(&metrics_text, "connections_refused_total"),
        metric(&metrics_text, "connections_timed_out_total"),
        metric(&metrics_text, "accept_errors_total"),
    );
    assert_eq!(status, 200);
    // Answered, not queued behind the idle connections' timeouts (2 s and more); the
    // figure is printed, the bound leaves room for a loaded machine.
    assert!(took < Duration::from_secs(1), "list took {took:?}");
    assert!(metric(&metrics_text, "connections_refused_total") > 0.0);
    assert_eq!(
        metric(&metrics_text, "accept_errors_total"),
        0.0,
        "the derived maximum keeps descriptors free"
    );
    assert_sessions_survived(&server, &clients, &ids).await;
    server.proc.signal(Signal::SIGKILL);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maximums_above_the_fd_limit_share_one_budget_when_both_ports_are_flooded() {
    let idle = Duration::from_secs(3);
    let data = tempfile::tempdir().unwrap();
    // Maximums far above what 1024 descriptors allow: both ports together still hold at most
    // three quarters of them (768), so accepts never run out of descriptors.
    let mut server = Server::start_with_fd_limit(
        data.path(),
        1024,
        &[
            "--http-header-timeout",
            "3s",
            "--http-idle-timeout",
            "3s",
            "--grpc-handshake-timeout",
            "3s",
            "--warmup",
            "0s",
            "--http-max-connections",
            "5000",
            "--grpc-max-connections",
            "5000",
            "--log",
            "info",
        ],
    )
    .await;
    let log = server.proc.keep_stderr("server");
    let clients = sessions(&server).await;
    let ids: Vec<_> = clients.iter().map(Client::session_id).collect();

    let flooded = Instant::now();
    let (mut http, failed_http) = flood(&server.http, 700).await;
    let (mut grpc, failed_grpc) = flood(&server.grpc, 700).await;
    let flood_took = flooded.elapsed();
    let (status, body, took) = get(&server.http, "/v1/services").await;
    println!("during the flood of both ports: {status} {body} in {took:?}");
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "overloaded", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("across its HTTP and gRPC ports"),
        "{body}"
    );
    let last = all_closed(&mut http, flooded + flood_took + idle + SLACK * 2)
        .await
        .max(all_closed(&mut grpc, flooded + flood_took + idle + SLACK * 2).await);
    let (status, _, took) = get(&server.http, "/v1/services").await;
    let after = last.elapsed();
    let metrics_text = reqwest::get(server.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let errors = metric(&metrics_text, "accept_errors_total");
    let exhausted = log
        .lock()
        .unwrap()
        .iter()
        .any(|l| l.contains("accept failing"));
    println!(
        "ulimit -n 1024, max 5000/5000, 700 + 700 idle connections ({failed_http} + {failed_grpc} connects failed): \
         refused {} on HTTP, accept errors {errors}; list answered {status} in {took:?}, {after:?} after the last idle one closed",
        metric(&metrics_text, "connections_refused_total"),
    );
    assert_eq!(status, 200);
    // Answered, not queued behind the idle connections' timeouts (2 s and more); the
    // figure is printed, the bound leaves room for a loaded machine.
    assert!(took < Duration::from_secs(1), "list took {took:?}");
    assert_eq!(errors, 0.0, "the budget keeps descriptors free");
    assert!(!exhausted, "no accept ran out of descriptors");
    assert!(metric(&metrics_text, "connections_refused_total") > 0.0);
    assert_sessions_survived(&server, &clients, &ids).await;
    server.proc.signal(Signal::SIGKILL);
}
