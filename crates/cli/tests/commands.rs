//! The real `gangway` binary against a fake registry: tables, `--json`, error lines, exit codes.

mod fake_registry;

use std::process::Output;

use fake_registry::{Fake, error, gangway, json, sse};
use serde_json::{Value, json};

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn instance(ip: &str, port: u16, healthy: bool) -> Value {
    json!({"ip": ip, "port": port, "cluster": "DEFAULT", "weight": 1.0, "enabled": true,
           "healthy": healthy, "ephemeral": true, "metadata": {"zone": "a"}, "liveness": "lease"})
}

fn view(revision: u64, instances: Vec<Value>) -> Value {
    json!({"namespace": "public", "group": "DEFAULT_GROUP", "service": "orders",
           "revision": revision, "protection_triggered": false, "warming_up": false,
           "instances": instances})
}

#[tokio::test]
async fn list_prints_a_table_with_a_revision_header() {
    let fake = Fake::start(vec![json(
        "GET",
        "/v1/services/orders/instances",
        200,
        view(
            42,
            vec![
                instance("10.0.0.5", 8080, true),
                instance("10.0.0.6", 8080, true),
            ],
        ),
    )])
    .await;
    let out = fake.run(&["list", "orders", "-n", "prod", "--all"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        "public/DEFAULT_GROUP/orders  revision 42  2 instances (all)  protection not triggered"
    );
    assert!(lines[1].starts_with("ADDRESS"), "{text}");
    assert!(
        lines[2].starts_with("10.0.0.5:8080  DEFAULT") && lines[2].ends_with("lease     zone=a"),
        "{text}"
    );
    assert_eq!(lines.len(), 4, "{text}");
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].method, "GET");
    assert_eq!(
        reqs[0].uri,
        "/v1/services/orders/instances?namespace=prod&all=true"
    );
}

#[tokio::test]
async fn json_prints_the_raw_answer() {
    let answer = view(3, vec![instance("10.0.0.5", 80, true)]);
    let fake = Fake::start(vec![json(
        "GET",
        "/v1/services/orders/instances",
        200,
        answer.clone(),
    )])
    .await;
    let out = fake.run(&["list", "orders", "--json"]).await;
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(stdout(&out), format!("{answer}\n"));
    let parsed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(parsed, answer);
}

#[tokio::test]
async fn register_sends_the_body_and_hints_at_heartbeats() {
    let mut inst = instance("10.0.0.5", 8080, true);
    inst["metadata"] = json!({"zone": "a", "v": "2"});
    inst["weight"] = json!(3.0);
    let fake = Fake::start(vec![json(
        "POST",
        "/v1/services/orders/instances",
        200,
        json!({"revision": 5, "instance": inst}),
    )])
    .await;
    let out = fake
        .run(&[
            "register",
            "orders",
            "10.0.0.5:8080",
            "--meta",
            "zone=a",
            "-m",
            "v=2",
            "-w",
            "3",
            "--ttl",
            "9",
        ])
        .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with("registered 10.0.0.5:8080 in orders (revision 5)\n"),
        "{}",
        stdout(&out)
    );
    assert!(
        stderr(&out).contains("gangway heartbeat orders 10.0.0.5:8080"),
        "{}",
        stderr(&out)
    );
    let reqs = fake.requests();
    assert_eq!(reqs[0].uri, "/v1/services/orders/instances");
    let body: Value = serde_json::from_str(&reqs[0].body).unwrap();
    assert_eq!(
        body,
        json!({"ip": "10.0.0.5", "port": 8080, "weight": 3.0, "metadata": {"zone": "a", "v": "2"},
               "ephemeral": true, "ttl_ms": 9000})
    );
}

#[tokio::test]
async fn a_400_is_one_error_line_and_exit_1() {
    let fake = Fake::start(vec![error(
        "POST",
        "/v1/services/orders/instances",
        400,
        "invalid_argument",
        "must be 0-10000, got 20000",
        Some("weight"),
    )])
    .await;
    let out = fake
        .run(&["register", "orders", "10.0.0.5:80", "--weight", "20000"])
        .await;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out),
        "error: weight: must be 0-10000, got 20000 (HTTP 400)\n"
    );
    assert_eq!(stdout(&out), "");
}

#[tokio::test]
async fn connection_refused_names_the_registry() {
    // A port that was just free: bind, note it, close.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    drop(listener);
    let out = gangway(&addr, &["list", "orders"]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.starts_with(&format!("error: cannot reach the registry at {addr}: ")),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[tokio::test]
async fn a_bad_address_exits_2_and_sends_nothing() {
    let fake = Fake::start(vec![]).await;
    let out = fake.run(&["deregister", "orders", "10.0.0.5:0"]).await;
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        "error: invalid value '10.0.0.5:0' for '<IP:PORT>': port: must be 1-65535, got 0\n"
    );
    let out = fake.run(&["offline", "orders", "::1:80"]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("IPv6 addresses need brackets: [::1]:80"));
    let out = fake
        .run(&[
            "register",
            "orders",
            "10.0.0.5:80",
            "-m",
            "a=1",
            "-m",
            "a=2",
        ])
        .await;
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(stderr(&out), "error: --meta: key \"a\" given twice\n");
    assert!(fake.requests().is_empty());
}

#[tokio::test]
async fn deregister_percent_encodes_ipv6_and_passes_the_cluster() {
    let fake = Fake::start(vec![json(
        "DELETE",
        "/v1/services/orders/instances/%5B::1%5D:80",
        200,
        json!({"revision": 8}),
    )])
    .await;
    let out = fake
        .run(&["deregister", "orders", "[::1]:80", "--cluster", "east"])
        .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "deregistered [::1]:80 from orders (revision 8)\n"
    );
    assert_eq!(
        fake.requests()[0].uri,
        "/v1/services/orders/instances/%5B::1%5D:80?cluster=east"
    );
}

fn drain_report(complete: bool) -> Value {
    json!({"revision": 12, "waited_ms": 5003, "complete": complete,
           "acked": [{"id": "s-1", "address": "10.0.1.1:50000", "acked_revision": 12}],
           "laggards": if complete { json!([]) } else {
               json!([{"id": "s-2", "address": "10.0.1.2:50000", "acked_revision": 11}]) },
           "notes": []})
}

#[tokio::test]
async fn a_timed_out_drain_exits_3_with_its_laggards() {
    const DRAIN: &str = "/v1/services/orders/instances/10.0.0.5:80/drain";
    let fake = Fake::start(vec![json("POST", DRAIN, 200, drain_report(false))]).await;
    let out = fake
        .run(&[
            "drain",
            "orders",
            "10.0.0.5:80",
            "--timeout",
            "5",
            "--force",
        ])
        .await;
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.starts_with("drain of 10.0.0.5:80 in orders TIMED OUT: waited 5003 ms for revision 12; 1 acked, 1 lagging\n"),
        "{text}"
    );
    assert!(
        text.contains("\ns-2         10.0.1.2:50000  11              LAGGING\n"),
        "{text}"
    );
    let body: Value = serde_json::from_str(&fake.requests()[0].body).unwrap();
    assert_eq!(body, json!({"timeout_ms": 5000, "force": true}));

    // --json: the raw report, same exit status.
    let out = fake
        .run(&["offline", "orders", "10.0.0.5:80", "--wait", "--json"])
        .await;
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(
        serde_json::from_slice::<Value>(&out.stdout).unwrap(),
        drain_report(false)
    );
    let body: Value = serde_json::from_str(&fake.requests()[1].body).unwrap();
    assert_eq!(body, json!({"timeout_ms": 30000, "force": false}));
}

#[tokio::test]
async fn offline_wait_exits_0_when_complete_and_plain_offline_does_not_drain() {
    let mut off = instance("10.0.0.5", 80, true);
    off["enabled"] = json!(false);
    let fake = Fake::start(vec![
        json(
            "POST",
            "/v1/services/orders/instances/10.0.0.5:80/drain",
            200,
            drain_report(true),
        ),
        json(
            "POST",
            "/v1/services/orders/instances/10.0.0.5:80/offline",
            200,
            json!({"revision": 13, "instance": off}),
        ),
        json(
            "POST",
            "/v1/services/orders/instances/10.0.0.5:80/online",
            200,
            json!({"revision": 14, "instance": instance("10.0.0.5", 80, true)}),
        ),
    ])
    .await;
    let out = fake
        .run(&["offline", "orders", "10.0.0.5:80", "--wait"])
        .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains(" complete: waited 5003 ms"));
    let out = fake.run(&["offline", "orders", "10.0.0.5:80"]).await;
    assert_eq!(out.status.code(), Some(0));
    assert!(
        stdout(&out).starts_with("offline: 10.0.0.5:80 in orders (revision 13)\n"),
        "{}",
        stdout(&out)
    );
    let out = fake.run(&["online", "orders", "10.0.0.5:80"]).await;
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout(&out).starts_with("online: 10.0.0.5:80 in orders (revision 14)\n"));
    let uris: Vec<String> = fake.requests().into_iter().map(|r| r.uri).collect();
    assert_eq!(
        uris,
        [
            "/v1/services/orders/instances/10.0.0.5:80/drain",
            "/v1/services/orders/instances/10.0.0.5:80/offline",
            "/v1/services/orders/instances/10.0.0.5:80/online",
        ]
    );
}

#[tokio::test]
async fn refusing_to_drain_the_last_instance_exits_1() {
    let fake = Fake::start(vec![error(
        "POST",
        "/v1/services/orders/instances/10.0.0.5:80/drain",
        409,
        "conflict",
        "10.0.0.5:80 is the last serving instance of orders; use force",
        None,
    )])
    .await;
    let out = fake.run(&["drain", "orders", "10.0.0.5:80"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out),
        "error: 10.0.0.5:80 is the last serving instance of orders; use force (HTTP 409)\n"
    );
}

#[tokio::test]
async fn watch_prints_one_line_per_snapshot_and_stops_after_count() {
    let snaps = [
        view(1, vec![instance("10.0.0.5", 80, true)]),
        view(
            2,
            vec![
                instance("10.0.0.5", 80, true),
                instance("10.0.0.6", 80, true),
            ],
        ),
        view(3, vec![]),
    ];
    let fake = Fake::start(vec![sse("/v1/services/orders/watch", &snaps)]).await;
    let out = fake.run(&["watch", "orders", "--count", "2"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[0].ends_with("Z  revision 1  1 instance  10.0.0.5:80"),
        "{text}"
    );
    assert!(
        lines[1].ends_with("Z  revision 2  2 instances  10.0.0.5:80 10.0.0.6:80"),
        "{text}"
    );

    let out = fake
        .run(&["watch", "orders", "--json", "--count", "3"])
        .await;
    assert_eq!(out.status.code(), Some(0));
    let got: Vec<Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(got, snaps);

    // The stream ends before the count: an error, after printing what came.
    let out = fake.run(&["watch", "orders", "--count", "5"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stdout(&out).lines().count(), 3);
    assert!(
        stderr(&out).contains("closed the watch stream after 3 snapshot(s)"),
        "{}",
        stderr(&out)
    );
    assert_eq!(fake.requests()[0].uri, "/v1/services/orders/watch");
}

#[tokio::test]
async fn heartbeat_once_reports_health_and_explains_a_404() {
    let fake = Fake::start(vec![
        json(
            "PUT",
            "/v1/services/orders/instances/10.0.0.5:80/heartbeat",
            200,
            json!({"ttl_ms": 15000, "healthy": true}),
        ),
        error(
            "PUT",
            "/v1/services/orders/instances/10.0.0.9:80/heartbeat",
            404,
            "not_found",
            "no instance 10.0.0.9:80 in orders",
            None,
        ),
    ])
    .await;
    let out = fake
        .run(&["heartbeat", "orders", "10.0.0.5:80", "--once"])
        .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "heartbeat sent for 10.0.0.5:80: healthy, lease TTL 15s\n"
    );
    let out = fake.run(&["heartbeat", "orders", "10.0.0.9:80"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out),
        "error: no instance 10.0.0.9:80 in orders; the instance is gone: register it again (HTTP 404)\n"
    );
}

#[tokio::test]
async fn services_and_subscribers_render_tables() {
    let fake = Fake::start(vec![
        json("GET", "/v1/services", 200, json!({"services": [
            {"namespace": "public", "group": "DEFAULT_GROUP", "service": "orders", "kind": "ephemeral",
             "revision": 4, "instances": 2, "serving": 2, "subscribers": 1, "protect_threshold": 0.0}]})),
        json("GET", "/v1/services/orders/subscribers", 200, json!({"revision": 4, "subscribers": [
            {"id": 17, "address": "10.0.1.1:50000", "kind": "watch", "client_name": null,
             "acked_revision": 3, "acked_at_ms": null, "pushed_revision": 4}]})),
    ])
    .await;
    let out = fake.run(&["services", "--group", "DEFAULT_GROUP"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.lines()
            .nth(1)
            .unwrap()
            .starts_with("public     DEFAULT_GROUP  orders   ephemeral  4"),
        "{text}"
    );
    let out = fake.run(&["subscribers", "orders"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.starts_with("orders  revision 4  1 subscriber\n"),
        "{text}"
    );
    assert!(
        text.lines()
            .nth(2)
            .unwrap()
            .starts_with("17  10.0.1.1:50000  watch"),
        "{text}"
    );
    assert!(text.lines().nth(2).unwrap().ends_with("behind"), "{text}");
    let uris: Vec<String> = fake.requests().into_iter().map(|r| r.uri).collect();
    assert_eq!(
        uris,
        [
            "/v1/services?group=DEFAULT_GROUP",
            "/v1/services/orders/subscribers"
        ]
    );
}

#[tokio::test]
async fn an_unexpected_answer_is_reported_not_panicked_on() {
    let fake = Fake::start(vec![json("GET", "/v1/services", 200, json!({"nope": 1}))]).await;
    let out = fake.run(&["services"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).starts_with("error: unexpected answer from the registry (ServiceList): "),
        "{}",
        stderr(&out)
    );
}
