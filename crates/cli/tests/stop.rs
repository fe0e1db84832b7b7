//! `gangway server` stops within its bound on SIGTERM and SIGINT, whatever its clients do, and
//! a replacement on the same data directory takes over without anyone noticing (issue 9,
//! part 4). Real processes on 127.0.0.1; the sessions, watchers and the Nacos client live in
//! this test process.

mod cluster;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cluster::{DemoService, Server, demo_client, poll};
use futures::{StreamExt, TryStreamExt};
use gangway_bench::drivers::nacos_grpc::{NacosConn, host_ports};
use gangway_client::{Client, ClientConfig};
use gangway_core::model::{InstanceKey, ServiceKey};
use nix::sys::signal::Signal;
use serde_json::Value;
use tokio::time::Instant;

/// The bound the issue sets on a stop with open clients.
const EXIT_WITHIN: Duration = Duration::from_secs(2);
/// Longer than any stop can take (the default shutdown timeout is 5 s): a server still running
/// then never stops by itself.
const NEVER: Duration = Duration::from_secs(10);

/// The `(revision, instance count)` of every view a consumer was given, in order.
type Views = Arc<Mutex<Vec<(u64, usize)>>>;

/// Reads an SSE stream: the `(revision, instances)` of each `snapshot` event, until the stream
/// ends.
async fn read_watch(response: reqwest::Response, seen: &Mutex<Vec<(u64, usize)>>) {
    let mut body = response.bytes_stream();
    let mut buf = String::new();
    while let Some(Ok(chunk)) = body.next().await {
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            let Some(data) = event.lines().find_map(|l| l.strip_prefix("data:")) else {
                continue; // keep-alive comment
            };
            if let Ok(v) = serde_json::from_str::<Value>(data.trim()) {
                let count = v["instances"].as_array().map_or(0, Vec::len);
                let revision = v["revision"].as_u64().unwrap_or(0);
                seen.lock().unwrap().push((revision, count));
            }
        }
    }
}

/// A watcher of `url` that reconnects (every 50 ms) whenever its stream ends, until aborted.
fn watcher(url: String, seen: Views) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let client = reqwest::Client::new();
        // Bounded: the test aborts the task long before.
        for _ in 0..10_000 {
            match client.get(&url).send().await {
                Ok(r) if r.status() == 200 => read_watch(r, &seen).await,
                _ => {}
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
}

/// Sends `signal` and measures how long the server takes to exit; returns that time and its
/// last stdout line.
async fn stop(server: &mut Server, signal: Signal) -> (Duration, String) {
    let sent = Instant::now();
    server.proc.signal(signal);
    let status = tokio::time::timeout(NEVER, server.proc.child.wait())
        .await
        .unwrap_or_else(|_| panic!("the server still runs {NEVER:?} after {signal}"))
        .expect("wait");
    let took = sent.elapsed();
    assert!(status.success(), "{signal}: exit status {status}");
    let line = server.proc.line_starting("gangway server stopped").await;
    (took, line)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_and_sigint_stop_the_server_with_a_session_and_a_watch_open() {
    let data = tempfile::tempdir().unwrap();
    let mut server = Server::start(data.path(), "127.0.0.1:0", "127.0.0.1:0", &[]).await;
    let (http, grpc) = (server.http.clone(), server.grpc.clone());
    for signal in [Signal::SIGTERM, Signal::SIGINT] {
        let mut service = DemoService::start(&grpc, "a").await;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let watch = watcher(server.url("/v1/services/demo/watch"), seen.clone());
        let opened = poll(Duration::from_secs(10), || async {
            let subscribers = server.get("/v1/services/demo/subscribers").await;
            (subscribers["subscribers"].as_array()?.len() == 1).then_some(())
        })
        .await;
        assert!(opened.is_some(), "the watch is open");
        let (took, line) = stop(&mut server, signal).await;
        println!("{signal} with a session and a watch open: exited after {took:?} ({line})");
        assert!(took < EXIT_WITHIN, "{signal}: {took:?}");

        let restarted = Instant::now();
        server = Server::start(data.path(), &http, &grpc, &[]).await;
        println!(
            "a second server on the same data dir listened {:?} after the first exited",
            restarted.elapsed()
        );
        watch.abort();
        service.proc.signal(Signal::SIGKILL);
        service.proc.wait(Duration::from_secs(5)).await;
    }
    server.proc.signal(Signal::SIGKILL);
}

/// Instances of the fleet: one per native session, plus the Nacos client's.
const SESSIONS: usize = 1000;
const WATCHERS: usize = 100;
const FLEET: usize = SESSIONS + 1;

fn fleet() -> ServiceKey {
    ServiceKey::named("fleet")
}

fn member(i: usize) -> InstanceKey {
    InstanceKey::new(&format!("10.9.{}.{}", i / 200, i % 200 + 1), 8080, "")
}

/// A Nacos SDK's connection as the SDK keeps it: registered and subscribed; on a lost stream it
/// connects again, registers again and subscribes again (the SDK's redo) until it succeeds.
async fn nacos(addr: SocketAddr, pushes: Arc<Mutex<Vec<usize>>>) -> NacosConn {
    let handler = {
        let pushes = pushes.clone();
        Arc::new(move |info: &Value| pushes.lock().unwrap().push(host_ports(info).count()))
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let attempt = async {
            let conn = NacosConn::connect(addr, Some(handler.clone())).await?;
            conn.register("fleet", "10.8.0.1", 8080).await?;
            // Subscribe answers count as views too, but for an empty one: the answer during
            // the warm-up has no hosts, which the Python, Go and Rust SDKs ignore (their cache
            // stays; the push after the warm-up brings the view).
            let sub_deadline = Instant::now() + Duration::from_secs(15);
            loop {
                match conn.subscribe("fleet").await {
                    Ok(info) => {
                        let hosts = host_ports(&info).count();
                        if hosts > 0 {
                            pushes.lock().unwrap().push(hosts);
                        }
                        return anyhow::Ok(conn);
                    }
                    Err(e) if Instant::now() > sub_deadline => return Err(e),
                    // The SDK's redo retries a refused subscribe.
                    Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
        };
        match attempt.await {
            Ok(conn) => return conn,
            Err(e) if Instant::now() > deadline => panic!("Nacos client cannot reconnect: {e:#}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

fn min_seen(views: &[usize]) -> Option<usize> {
    views.iter().copied().min()
}

/// This process hosts 1,100 clients on a machine shared with other builds, where freezes of
/// the whole machine for up to 4 s were seen: the default 3 s keepalive rightly ends the
/// sessions of such a frozen peer, before any restart. The restart is what is under test here,
/// so its sessions tolerate freezes of up to this on both sides.
const FREEZE_TOLERANT_KEEPALIVE: Duration = Duration::from_secs(10);
const SERVER_FLAGS: &[&str] = &["--keepalive-timeout", "10s"];

fn client_config(grpc: &str) -> ClientConfig {
    let mut config = ClientConfig::new(grpc);
    config.keepalive_timeout = FREEZE_TOLERANT_KEEPALIVE;
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_under_a_thousand_sessions_is_bounded_and_loses_nothing() {
    let data = tempfile::tempdir().unwrap();
    let mut server = Server::start(data.path(), "127.0.0.1:0", "127.0.0.1:0", SERVER_FLAGS).await;
    let (http, grpc) = (server.http.clone(), server.grpc.clone());
    let grpc_addr: SocketAddr = grpc.parse().unwrap();

    // Providers: 1,000 native sessions with one instance each, three demo-services, and a
    // Nacos client, all registered during the warm-up (so watchers get one full snapshot).
    let setup = Instant::now();
    let sessions: Vec<Client> = futures::stream::iter(0..SESSIONS)
        .map(|i| {
            let grpc = grpc.clone();
            async move {
                let client =
                    Client::connect(client_config(&grpc).with_client_name(format!("fleet-{i}")))
                        .await?;
                client
                    .register(fleet(), member(i), 1.0, BTreeMap::new())
                    .await?;
                Ok::<_, gangway_client::Error>(client)
            }
        })
        .buffer_unordered(50)
        .try_collect()
        .await
        .expect("1,000 sessions register");
    let nacos_views = Arc::new(Mutex::new(Vec::new()));
    let mut nacos_conn = nacos(grpc_addr, nacos_views.clone()).await;
    let mut services = Vec::new();
    for name in ["a", "b", "c"] {
        services.push(DemoService::start(&grpc, name).await);
    }
    println!(
        "{SESSIONS} sessions, 3 demo-services and a Nacos client registered in {:?}",
        setup.elapsed()
    );

    // Consumers: a native subscription, 100 SSE watchers, the Nacos client's subscription.
    let consumer = Client::connect(client_config(&grpc)).await.unwrap();
    let subscription = consumer.subscribe(fleet()).await.unwrap();
    let native_views = Views::default();
    let native_task = {
        let mut rx = subscription.receiver();
        let views = native_views.clone();
        tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                let view = rx.borrow_and_update().clone();
                views
                    .lock()
                    .unwrap()
                    .push((view.revision, view.instances.len()));
            }
        })
    };
    let watch_url = server.url("/v1/services/fleet/watch");
    let watched: Vec<Views> = (0..WATCHERS).map(|_| Arc::default()).collect();
    let watchers: Vec<_> = watched
        .iter()
        .map(|seen| watcher(watch_url.clone(), seen.clone()))
        .collect();
    let full =
        |seen: &Mutex<Vec<(u64, usize)>>| seen.lock().unwrap().iter().any(|(_, n)| *n == FLEET);
    let ready = poll(Duration::from_secs(30), || async {
        let native = native_views
            .lock()
            .unwrap()
            .iter()
            .any(|(_, n)| *n == FLEET);
        let nacos = nacos_views.lock().unwrap().contains(&FLEET);
        (native && nacos && watched.iter().all(|s| full(s))).then_some(())
    })
    .await;
    assert!(ready.is_some(), "every consumer sees the {FLEET} instances");
    let first_revision = native_views.lock().unwrap().last().unwrap().0;

    // A demo-client at 60 req/s through the restart.
    let mut client = demo_client(&grpc, 60, Duration::from_secs(12), 3, &[]).await;
    let sending = Instant::now();
    tokio::time::sleep_until(sending + Duration::from_secs(2)).await;

    let (took, line) = stop(&mut server, Signal::SIGTERM).await;
    println!(
        "SIGTERM with {SESSIONS} sessions, {WATCHERS} watchers and a Nacos client: exited after {took:?} ({line})"
    );
    assert!(took < EXIT_WITHIN, "{took:?}");
    let exited = Instant::now();
    server = Server::start(data.path(), &http, &grpc, SERVER_FLAGS).await;
    let restart = exited.elapsed();
    println!("second server on the same data dir listening {restart:?} after the first exited");

    // The Nacos client was told (ConnectResetRequest) and its stream ended: reconnect.
    let ended = poll(Duration::from_secs(5), || async {
        nacos_conn.stream_ended().then_some(())
    })
    .await;
    assert!(ended.is_some(), "the Nacos stream ended");
    assert!(
        nacos_conn.resets() >= 1,
        "the Nacos client got a ConnectResetRequest"
    );
    let nacos_before = nacos_views.lock().unwrap().len();
    let reconnecting = tokio::spawn(nacos(grpc_addr, nacos_views.clone()));

    // Everyone is back on the second server.
    let back = poll(Duration::from_secs(20), || async {
        let listed = server.get("/v1/services/fleet/instances?all=true").await;
        let demo = server.get("/v1/services/demo/instances?all=true").await;
        let count = |v: &Value| v["instances"].as_array().map_or(0, Vec::len);
        (count(&listed) == FLEET && count(&demo) == 3).then(|| exited.elapsed())
    })
    .await
    .expect("every provider registered again on the second server");
    nacos_conn = reconnecting.await.unwrap();
    let caught_up = poll(Duration::from_secs(20), || async {
        let native = native_views
            .lock()
            .unwrap()
            .last()
            .is_some_and(|(r, _)| *r > first_revision);
        let nacos = nacos_views.lock().unwrap().len() > nacos_before;
        let watchers = watched.iter().all(|s| {
            s.lock()
                .unwrap()
                .last()
                .is_some_and(|(r, _)| *r > first_revision)
        });
        (native && nacos && watchers).then(|| exited.elapsed())
    })
    .await
    .expect("every consumer followed the second server");
    println!(
        "second server: every provider back after {back:?}, every consumer on it after {caught_up:?}"
    );

    let out = client.rest_of_stdout(Duration::from_secs(30)).await;
    let report: Value = serde_json::from_str(out.trim()).expect("demo-client summary");
    println!(
        "demo-client through the restart: sent {} failed {}",
        report["sent"], report["failed"]
    );
    assert_eq!(report["failed"], 0, "{report}");

    // No consumer ever saw an instance go.
    let native: Vec<usize> = native_views
        .lock()
        .unwrap()
        .iter()
        .map(|(_, n)| *n)
        .collect();
    let nacos: Vec<usize> = nacos_views.lock().unwrap().clone();
    let watcher_counts: Vec<usize> = watched
        .iter()
        .flat_map(|s| {
            s.lock()
                .unwrap()
                .iter()
                .map(|(_, n)| *n)
                .collect::<Vec<_>>()
        })
        .collect();
    println!(
        "views seen: native {} (min {:?}), SSE {} over {WATCHERS} watchers (min {:?}), Nacos {} (min {:?})",
        native.len(),
        min_seen(&native),
        watcher_counts.len(),
        min_seen(&watcher_counts),
        nacos.len(),
        min_seen(&nacos),
    );
    assert!(
        native.iter().all(|n| *n == FLEET),
        "native consumer saw {native:?}"
    );
    let short: Vec<(usize, u64, usize)> = watched
        .iter()
        .enumerate()
        .flat_map(|(w, s)| {
            s.lock()
                .unwrap()
                .iter()
                .filter(|(_, n)| *n != FLEET)
                .map(|(r, n)| (w, *r, *n))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        short.is_empty(),
        "watchers saw other than {FLEET} (watcher, revision, count; the first server's last \
         revision was {first_revision}): {short:?}"
    );
    assert!(
        nacos.iter().all(|n| *n == FLEET),
        "the Nacos client saw {nacos:?}"
    );

    // The second server stops as fast with everyone on it.
    let (took, line) = stop(&mut server, Signal::SIGTERM).await;
    println!("second server, SIGTERM with everyone reconnected: exited after {took:?} ({line})");
    assert!(took < EXIT_WITHIN, "{took:?}");

    native_task.abort();
    for w in watchers {
        w.abort();
    }
    drop(sessions);
    drop(nacos_conn);
    for s in &mut services {
        s.proc.signal(Signal::SIGKILL);
        s.proc.wait(Duration::from_secs(5)).await;
    }
}
