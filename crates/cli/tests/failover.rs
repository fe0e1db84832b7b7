//! Failover between the nodes of a registry (docs/cluster.md, "Client failover") with the real
//! binary: REST commands given `--server A,B` go on to B when A does not answer and name both
//! when neither does; `demo-service` and `demo-client` given `--registry A,B` keep working when
//! the `gangway server` process they are on is killed with SIGKILL. Real processes (or an
//! in-process registry) on 127.0.0.1 with ephemeral ports.

mod cluster;

use std::time::Duration;

use cluster::{DemoService, Server, addresses, demo_client, gangway, poll};
use nix::sys::signal::Signal;
use serde_json::Value;
use tokio::time::Instant;

/// Upper bound of a failover here: a killed node's clients are on the next within the first
/// reconnect backoff (at most 100 ms) plus a connect; 10 s leaves room for a loaded machine.
const FAILOVER_WITHIN: Duration = Duration::from_secs(10);

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// An address whose port refuses connections.
fn dead_address() -> String {
    gangway_testkit::refused_address().to_string()
}

#[tokio::test]
async fn a_command_goes_on_to_the_next_server_and_names_every_one_when_none_answers() {
    let live = gangway_server::start_in_memory(gangway_server::Config::for_tests())
        .await
        .unwrap();
    let list = format!("127.0.0.1:1,{}", live.http_addr);
    let out = gangway(&list, &["register", "orders", "10.0.0.5:8080"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = gangway(&list, &["list", "orders", "--json"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let view: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(addresses(&view), ["10.0.0.5:8080"]);

    let dead = dead_address();
    let none = format!("127.0.0.1:1,{dead}");
    let out = gangway(&none, &["services"]).await;
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    println!("{}", stderr.trim_end());
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with(&format!(
            "error: cannot reach the registry at 127.0.0.1:1, {dead}: 127.0.0.1:1: "
        )) && stderr.contains(&format!("; {dead}: ")),
        "{stderr}"
    );
    let out = gangway(&none, &["services", "--json"]).await;
    assert_eq!(out.status.code(), Some(1));
    let error: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(error["error"]["code"], "unreachable", "{error}");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.contains("127.0.0.1:1: ") && message.contains(&format!("{dead}: ")));

    // Bad lists are refused before anything is sent: exit 2, one line naming --server.
    for bad in ["127.0.0.1:1,", &format!("{},127.0.0.1:0", live.http_addr)] {
        let out = gangway(bad, &["services"]).await;
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let stderr = text(&out.stderr);
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.starts_with(&format!(
                "error: invalid value '{bad}' for '--server <HOST:PORT>': address 2 of 2: "
            )),
            "{stderr}"
        );
    }
    live.shutdown().await;
}

/// `(sent, failed)` of a demo-client summary.
fn counts(report: &Value) -> (u64, u64) {
    (
        report["sent"].as_u64().unwrap(),
        report["failed"].as_u64().unwrap(),
    )
}

/// A free loopback address for a server started later: bound, then closed (until then it
/// refuses connections).
fn reserved_address() -> String {
    dead_address()
}

/// Whether the answer of `GET url` holds `needle` (`None` also when there is no answer).
async fn answer_holds(url: String, needle: String) -> Option<()> {
    let body = reqwest::get(url).await.ok()?.text().await.ok()?;
    body.contains(&needle).then_some(())
}

#[tokio::test]
async fn sessions_and_subscriptions_move_to_the_next_server_after_a_sigkill() {
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let mut a = Server::start(dirs[0].path(), "127.0.0.1:0", "127.0.0.1:0", &[]).await;
    // B is not up yet: whichever address the clients try first, they end up on A.
    let (b_http, b_grpc) = (reserved_address(), reserved_address());
    let grpc = format!("{},{b_grpc}", a.grpc);
    let service = DemoService::start(&grpc, "one").await;
    let mut client = demo_client(&grpc, 50, Duration::from_secs(3), 1, &[]).await;
    let b = Server::start(dirs[1].path(), &b_http, &b_grpc, &[]).await;

    let killed_at = Instant::now();
    a.proc.signal(Signal::SIGKILL);
    let instances = b.url("/v1/services/demo/instances");
    poll(FAILOVER_WITHIN, || {
        answer_holds(
            instances.clone(),
            format!("\"port\":{}", port_of(&service.addr)),
        )
    })
    .await
    .expect("the demo-service registers again on B");
    let registered = killed_at.elapsed();
    let subscribers = b.url("/v1/services/demo/subscribers");
    poll(FAILOVER_WITHIN, || {
        answer_holds(subscribers.clone(), "demo-client".to_owned())
    })
    .await
    .expect("the demo-client subscribes again on B");
    let subscribed = killed_at.elapsed();
    println!(
        "after the SIGKILL of A: demo-service registered on B after {registered:?}, \
         demo-client subscribed on B after {subscribed:?}"
    );
    assert!(
        a.proc.wait(Duration::from_secs(5)).await.code().is_none(),
        "killed"
    );

    // REST commands given both nodes reach the one still up.
    let http = format!("{},{}", a.http, b.http);
    let out = gangway(&http, &["list", "demo", "--json"]).await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "{http}: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let view: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(addresses(&view), [service.addr.as_str()]);

    // The consumer follows B and its view holds the instance at the end (no change at all when
    // the demo-service was back on B before the demo-client's first snapshot from B). It may
    // have been empty for a moment: A and B share no store here, so B knows the instance only
    // once the demo-service is back, which races with the demo-client's own failover; on one
    // etcd the instance is in B's view all along. The client crate's failover tests check
    // that a failover itself never empties a view.
    let out = client.rest_of_stdout(Duration::from_secs(30)).await;
    let status = client.wait(Duration::from_secs(5)).await;
    let report: Value = serde_json::from_str(out.trim()).expect("demo-client JSON summary");
    let (sent, failed) = counts(&report);
    println!("demo-client across the failover: {sent} sent, {failed} failed, exit {status}");
    assert_eq!(sent, 150, "{report}");
    if let Some(last) = report["view_changes"].as_array().unwrap().last() {
        assert_eq!(
            last["instances"],
            serde_json::json!([service.addr]),
            "{report}"
        );
    }
}

/// The port of `ip:port`.
fn port_of(addr: &str) -> &str {
    addr.rsplit_once(':').unwrap().1
}
