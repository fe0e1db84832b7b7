//! The real `gangway` binary against a fake registry: tables, `--json`, error lines, exit codes.

mod fake_registry;

use std::process::Output;

use fake_registry::running::Running;
use fake_registry::{Fake, error, gangway, json, sse, text};
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
async fn a_400_is_one_error_line_and_exit_2() {
    let fake = Fake::start(vec![error(
        "POST",
        "/v1/services/orders/instances",
        400,
        "invalid_argument",
        "must be at least 1s, got 1ms",
        Some("ttl_ms"),
    )])
    .await;
    let out = fake
        .run(&["register", "orders", "10.0.0.5:80", "--ttl", "1ms"])
        .await;
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        "error: ttl_ms: must be at least 1s, got 1ms (HTTP 400)\n"
    );
    assert_eq!(stdout(&out), "");
}

#[tokio::test]
async fn weights_the_registry_would_refuse_are_refused_before_sending() {
    let fake = Fake::start(vec![]).await;
    for w in ["NaN", "inf", "-1", "20000"] {
        let out = fake
            .run(&["register", "orders", "10.0.0.5:80", "--weight", w])
            .await;
        assert_eq!(out.status.code(), Some(2), "{w}");
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.starts_with(&format!("error: invalid value '{w}' for '--weight <W>': ")),
            "{err}"
        );
    }
    assert!(fake.requests().is_empty());
}

#[tokio::test]
async fn argument_errors_are_one_line_and_exit_2() {
    let fake = Fake::start(vec![]).await;
    for args in [
        &["register", "orders", "10.0.0.5:80", "--ttl", "-5"][..],
        &["drain", "orders", "10.0.0.5:80", "--timeout", "-1"][..],
        &["register", "orders", "-host:8080"][..],
        &[
            "register",
            "orders",
            "10.0.0.5:80",
            "--keep-alive",
            "--every",
            "0",
        ][..],
        &["heartbeat", "orders", "10.0.0.5:80", "--every", "0"][..],
        &["list", "orders", "--namespace", ""][..],
        &["list", "orders", "--group", ""][..],
        &["offline", "orders", "10.0.0.5:80", "--cluster", ""][..],
        &["server", "--log", "gangway=loud"][..],
        // URL dot segments: `list ..` would GET /v1/instances.
        &["list", ".."][..],
        &["register", ".", "10.0.0.5:80"][..],
        &["drain", "a b", "10.0.0.5:80"][..],
    ] {
        let out = fake.run(args).await;
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("error: invalid value '"), "{args:?}: {err}");
        assert_eq!(stdout(&out), "", "{args:?}");
    }
    assert!(fake.requests().is_empty());
    for (server, reason) in [
        (
            "127.0.0.1",
            "missing :PORT in \"127.0.0.1\" (expected HOST:PORT, e.g. 127.0.0.1:8848)",
        ),
        ("127.0.0.1:99999", "port: must be 1-65535, got 99999"),
        (
            "",
            "empty address (expected HOST:PORT, e.g. 127.0.0.1:8848)",
        ),
    ] {
        let out = gangway(server, &["list", "orders"]).await;
        assert_eq!(out.status.code(), Some(2), "{server:?}");
        assert_eq!(
            stderr(&out),
            format!("error: invalid value '{server}' for '--server <HOST:PORT>': {reason}\n")
        );
    }
}

#[tokio::test]
async fn an_answer_from_another_server_says_so() {
    let fake = Fake::start(vec![
        text("GET", "/v1/services", 404, "404 page not found"),
        text("GET", "/v1/services/orders/subscribers", 501, ""),
        text(
            "GET",
            "/v1/services/orders/instances",
            200,
            "<html><body>hello</body></html>",
        ),
        json("GET", "/v1/services/orders/watch", 200, json!({"ok": true})),
    ])
    .await;
    let addr = fake.addr;
    for (args, detail) in [
        (&["services"][..], "HTTP 404 Not Found"),
        (&["subscribers", "orders"][..], "HTTP 501 Not Implemented"),
        (
            &["list", "orders"][..],
            "HTTP 200 OK, the answer is not JSON",
        ),
        (
            &["watch", "orders"][..],
            "HTTP 200 OK answered with application/json instead of an event stream",
        ),
    ] {
        let out = fake.run(args).await;
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert_eq!(
            stderr(&out),
            format!("error: {addr} does not look like a gangway registry ({detail})\n"),
            "{args:?}"
        );
        assert_eq!(stdout(&out), "", "{args:?}");
    }
    // With --json the same error is the error object, on stdout.
    let out = fake.run(&["list", "orders", "--json"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stderr(&out), "");
    let message = format!(
        "{addr} does not look like a gangway registry (HTTP 200 OK, the answer is not JSON)"
    );
    assert_eq!(
        serde_json::from_slice::<Value>(&out.stdout).unwrap(),
        json!({"error": {"code": "not_registry", "message": message, "field": null}})
    );
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
async fn the_instance_may_come_from_the_environment_as_a_prestop_hook_has_it() {
    let fake = Fake::start(vec![json(
        "POST",
        "/v1/services/orders/instances/10.0.0.5:80/drain",
        200,
        drain_report(true),
    )])
    .await;
    let env = [
        ("GANGWAY_SERVICE", "orders"),
        ("GANGWAY_IP", "10.0.0.5"),
        ("GANGWAY_PORT", "80"),
        ("GANGWAY_CLUSTER", "c1"),
    ];
    // The plain argv of a preStop hook: no address, no shell.
    let out = fake.run_with_env(&["offline", "--wait"], &env).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let sent = &fake.requests()[0];
    assert_eq!(
        sent.uri,
        "/v1/services/orders/instances/10.0.0.5:80/drain?cluster=c1"
    );
    // What Kubernetes leaves in a hook's argv: refused, naming the argument, nothing sent.
    let out = fake
        .run_with_env(&["offline", "orders", "$(POD_IP):8080", "--wait"], &[])
        .await;
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("'[IP:PORT]'"), "{}", stderr(&out));
    // Nothing at all: every missing part named on one line.
    let out = fake.run_with_env(&["offline", "--wait"], &[]).await;
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out),
        "error: SERVICE: missing (give it, or set GANGWAY_SERVICE); IP:PORT: missing (give it \
         after SERVICE, or set --ip (GANGWAY_IP) and --port (GANGWAY_PORT))\n"
    );
    // A Kubernetes service link in GANGWAY_PORT is explained.
    let out = fake
        .run_with_env(
            &["offline", "--wait"],
            &[
                ("GANGWAY_SERVICE", "orders"),
                ("GANGWAY_IP", "10.0.0.5"),
                ("GANGWAY_PORT", "tcp://10.96.0.12:8848"),
            ],
        )
        .await;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("enableServiceLinks: false"),
        "{}",
        stderr(&out)
    );
    assert_eq!(fake.requests().len(), 1, "the refused calls sent nothing");
}

#[tokio::test]
async fn online_wait_mirrors_offline_wait_report_and_exit_codes() {
    const ONLINE: &str = "/v1/services/orders/instances/10.0.0.5:80/online";
    let fake = Fake::start(vec![
        json("POST", ONLINE, 200, drain_report(false)).times(2),
        json("POST", ONLINE, 200, drain_report(true)).times(1),
        error(
            "POST",
            ONLINE,
            409,
            "conflict",
            "10.0.0.5:80 of orders is not in the consumer view (unhealthy)",
            None,
        ),
    ])
    .await;
    let out = fake
        .run(&[
            "online",
            "orders",
            "10.0.0.5:80",
            "--wait",
            "--timeout",
            "5",
        ])
        .await;
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.starts_with("readiness of 10.0.0.5:80 in orders TIMED OUT: waited 5003 ms for revision 12; 1 acked, 1 lagging\n"),
        "{text}"
    );
    assert!(text.contains("LAGGING"), "{text}");
    let body: Value = serde_json::from_str(&fake.requests()[0].body).unwrap();
    assert_eq!(body, json!({"wait": true, "timeout_ms": 5000}));
    // --json: the raw report, same exit status.
    let out = fake
        .run(&["online", "orders", "10.0.0.5:80", "--wait", "--json"])
        .await;
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(
        serde_json::from_slice::<Value>(&out.stdout).unwrap(),
        drain_report(false)
    );
    let out = fake
        .run(&["online", "orders", "10.0.0.5:80", "--wait"])
        .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains(" complete: waited 5003 ms"));
    let out = fake
        .run(&["online", "orders", "10.0.0.5:80", "--wait"])
        .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("not in the consumer view"),
        "{}",
        stderr(&out)
    );
    let out = fake
        .run(&["online", "orders", "10.0.0.5:80", "--timeout", "5"])
        .await;
    assert_eq!(out.status.code(), Some(2), "--timeout needs --wait");
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

    assert_eq!(fake.requests()[0].uri, "/v1/services/orders/watch");
}

#[tokio::test]
async fn watch_reconnects_when_the_stream_ends() {
    let snaps = [
        view(1, vec![instance("10.0.0.5", 80, true)]),
        view(2, vec![]),
    ];
    let fake = Fake::start(vec![sse("/v1/services/orders/watch", &snaps)]).await;
    // Each stream carries 2 snapshots, then closes: the 5th comes from the third stream.
    let out = fake.run(&["watch", "orders", "--count", "5"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    let revisions: Vec<&str> = text
        .lines()
        .map(|l| l.split("  ").nth(1).unwrap())
        .collect();
    assert_eq!(
        revisions,
        [
            "revision 1",
            "revision 2",
            "revision 1",
            "revision 2",
            "revision 1"
        ],
        "{text}"
    );
    assert_eq!(
        stderr(&out),
        "the registry closed the watch stream; reconnecting in 100ms\n".repeat(2)
    );
    assert_eq!(fake.requests().len(), 3);

    // Without --count it goes on until Ctrl-C, which ends it with exit 0.
    let mut watch = Running::start(&fake.addr.to_string(), &["watch", "orders"]);
    watch
        .wait_for(|out, err| out.lines().count() >= 4 && err.lines().count() >= 2)
        .await;
    let (status, out, err) = watch.interrupt().await;
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(out.lines().count() >= 4, "{out}");
    assert!(
        err.lines()
            .all(|l| l == "the registry closed the watch stream; reconnecting in 100ms"),
        "{err}"
    );
}

#[tokio::test]
async fn watch_backs_off_while_the_registry_is_away() {
    let fake = Fake::start(vec![
        sse("/v1/services/orders/watch", &[view(1, vec![])]).times(1),
        error(
            "GET",
            "/v1/services/orders/watch",
            503,
            "unavailable",
            "starting",
            None,
        )
        .times(4),
        sse("/v1/services/orders/watch", &[view(2, vec![])]),
    ])
    .await;
    let out = fake.run(&["watch", "orders", "--count", "2"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out).lines().count(), 2);
    let err = stderr(&out);
    let waits: Vec<&str> = err.lines().map(|l| l.rsplit(' ').next().unwrap()).collect();
    assert_eq!(waits, ["100ms", "200ms", "400ms", "800ms", "1.6s"]);
    assert!(
        err.contains("\nstarting (HTTP 503); reconnecting in 200ms\n"),
        "{err}"
    );
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
            // The nodes of a cluster (a registry alone, or without it, adds no table).
            "/v1/cluster",
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

const HEARTBEAT: &str = "/v1/services/orders/instances/10.0.0.5:80/heartbeat";

#[tokio::test]
async fn keep_alive_registers_again_when_the_registry_forgot_the_instance() {
    let mut inst = instance("10.0.0.5", 80, true);
    inst.as_object_mut().unwrap().remove("liveness");
    let beat = json!({"ttl_ms": 15000, "healthy": true});
    let fake = Fake::start(vec![
        json(
            "POST",
            "/v1/services/orders/instances",
            200,
            json!({"revision": 5, "instance": inst}),
        ),
        json("PUT", HEARTBEAT, 200, beat.clone()).times(1),
        // The registry restarts: first unreachable-ish (503), then it answers 404.
        error("PUT", HEARTBEAT, 503, "unavailable", "starting", None).times(1),
        error("PUT", HEARTBEAT, 404, "not_found", "no instance", None).times(1),
        json("PUT", HEARTBEAT, 200, beat),
    ])
    .await;
    let mut run = Running::start(
        &fake.addr.to_string(),
        &[
            "register",
            "orders",
            "10.0.0.5:80",
            "-m",
            "zone=a",
            "--keep-alive",
            "--every",
            "50ms",
        ],
    );
    let fake_ref = &fake;
    run.wait_for(|_, _| {
        let methods: Vec<String> = fake_ref.requests().into_iter().map(|r| r.method).collect();
        methods.len() >= 6
    })
    .await;
    let (status, out, err) = run.interrupt().await;
    assert_eq!(status.code(), Some(0), "{err}");
    let reqs = fake.requests();
    let methods: Vec<&str> = reqs.iter().map(|r| r.method.as_str()).collect();
    assert_eq!(methods[..6], ["POST", "PUT", "PUT", "PUT", "POST", "PUT"]);
    assert_eq!(
        reqs[4].body, reqs[0].body,
        "registered again with the same body"
    );
    assert_eq!(reqs[4].uri, reqs[0].uri);
    let err_lines: Vec<&str> = err.lines().collect();
    assert_eq!(
        err_lines[..2],
        [
            "warning: heartbeat failed: starting (HTTP 503)",
            "10.0.0.5:80 was gone from the registry (restarted?): registered it again \
             (revision 5); heartbeats go on",
        ],
        "{err}"
    );
    assert_eq!(
        err_lines.last(),
        Some(&"stopped heartbeats; the lease now runs out")
    );
    // register/offline answers carry no liveness: no LIVENESS column.
    assert!(
        out.starts_with("registered 10.0.0.5:80 in orders (revision 5)\nADDRESS "),
        "{out}"
    );
    assert!(!out.contains("LIVENESS"), "{out}");
}

#[tokio::test]
async fn heartbeat_periods_beyond_the_ttl_are_warned_about() {
    let fake = Fake::start(vec![json(
        "PUT",
        HEARTBEAT,
        200,
        json!({"ttl_ms": 300, "healthy": true}),
    )])
    .await;
    let mut run = Running::start(
        &fake.addr.to_string(),
        &["heartbeat", "orders", "10.0.0.5:80", "--every", "400ms"],
    );
    let fake_ref = &fake;
    run.wait_for(|_, _| fake_ref.requests().len() >= 2).await;
    let (status, out, err) = run.interrupt().await;
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(
        out.starts_with("heartbeating 10.0.0.5:80 in orders every 400ms (lease TTL 300ms)"),
        "{out}"
    );
    assert_eq!(
        err.lines().next(),
        Some(
            "warning: heartbeats every 400ms but the lease TTL is 300ms: the lease will expire \
             between heartbeats (send them at least every 100ms)"
        ),
        "{err}"
    );
}

#[tokio::test]
async fn logs_have_no_colour_codes_when_stderr_is_not_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Running::start(
        "",
        &[
            "server",
            "--http",
            "127.0.0.1:0",
            "--grpc",
            "127.0.0.1:0",
            "--data-dir",
            dir.path().to_str().unwrap(),
        ],
    );
    // The signal handlers are installed before the start-up line is printed.
    server.wait_for(|out, _| out.contains(" listening: ")).await;
    let (status, _, err) = server.interrupt().await;
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(err.contains("INFO"), "{err}");
    assert!(!err.contains('\x1b'), "{err:?}");
}

/// Parses stdout as one JSON value.
fn stdout_json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {:?}", stdout(o)))
}

#[tokio::test]
async fn with_json_errors_are_json_on_stdout_with_the_same_exit_codes() {
    let refusal = json!({"error": {"code": "conflict",
        "message": "10.0.0.5:80 is the last serving instance of orders; use force", "field": null}});
    let fake = Fake::start(vec![
        error(
            "POST",
            "/v1/services/orders/instances",
            400,
            "invalid_argument",
            "must be 100-86400000 (24 h), got 0",
            Some("ttl_ms"),
        ),
        json(
            "POST",
            "/v1/services/orders/instances/10.0.0.5:80/drain",
            409,
            refusal.clone(),
        ),
        text("GET", "/v1/services", 404, "404 page not found"),
    ])
    .await;
    // From the registry: its own error object, exit 2 for a 400, 1 for a 409.
    let out = fake
        .run(&["register", "orders", "10.0.0.5:80", "--ttl", "0", "--json"])
        .await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(
        stdout_json(&out),
        json!({"error": {"code": "invalid_argument", "message": "must be 100-86400000 (24 h), got 0", "field": "ttl_ms"}})
    );
    assert_eq!(stderr(&out), "");
    let out = fake
        .run(&["--json", "drain", "orders", "10.0.0.5:80"])
        .await;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stdout_json(&out), refusal);
    assert_eq!(stderr(&out), "");

    // Caught by the CLI: the same shape, a code of its own, the argument as the field.
    let addr = fake.addr;
    let cases: [(&[&str], u8, &str, Value, &str); 4] = [
        (
            &[
                "register",
                "orders",
                "10.0.0.5:80",
                "-m",
                "a=1",
                "-m",
                "a=2",
                "--json",
            ],
            2,
            "invalid_argument",
            json!("--meta"),
            "key \"a\" given twice",
        ),
        (
            &[
                "register",
                "orders",
                "10.0.0.5:80",
                "--weight",
                "-1",
                "--json",
            ],
            2,
            "invalid_argument",
            json!("--weight"),
            "invalid value '-1' for '--weight <W>'",
        ),
        (
            &["--json", "list", "orders", "--nope"],
            2,
            "invalid_argument",
            json!("--nope"),
            "unexpected argument '--nope'",
        ),
        (
            &["services", "--json"],
            1,
            "not_registry",
            Value::Null,
            &format!("{addr} does not look like a gangway registry (HTTP 404 Not Found)"),
        ),
    ];
    for (args, code, error_code, field, message) in cases {
        let out = fake.run(args).await;
        assert_eq!(
            out.status.code(),
            Some(i32::from(code)),
            "{args:?}: {}",
            stderr(&out)
        );
        let v = stdout_json(&out);
        assert_eq!(v["error"]["code"], error_code, "{args:?}: {v}");
        assert_eq!(v["error"]["field"], field, "{args:?}: {v}");
        let text = v["error"]["message"].as_str().unwrap();
        assert!(text.contains(message), "{args:?}: {v}");
        assert_eq!(v.as_object().unwrap().len(), 1, "{v}");
        assert_eq!(v["error"].as_object().unwrap().len(), 3, "{v}");
        assert_eq!(stderr(&out), "", "{args:?}");
    }
    assert_eq!(
        fake.requests().len(),
        3,
        "the CLI's own refusals sent nothing"
    );

    // Unreachable: exit 1.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let free = listener.local_addr().unwrap().to_string();
    drop(listener);
    let out = gangway(&free, &["list", "orders", "--json"]).await;
    assert_eq!(out.status.code(), Some(1));
    let v = stdout_json(&out);
    assert_eq!(v["error"]["code"], "unreachable", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with(&format!("cannot reach the registry at {free}: ")),
        "{v}"
    );
}

#[tokio::test]
async fn server_flag_errors_exit_2_like_every_other_bad_argument() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let base = [
        "server",
        "--http",
        "127.0.0.1:0",
        "--grpc",
        "127.0.0.1:0",
        "--data-dir",
        data.to_str().unwrap(),
    ];
    for (extra, reason) in [
        (
            &["--keepalive-timeout", "0"][..],
            "--keepalive-timeout must be 100ms-60m, got 0ms",
        ),
        (
            &["--lease-ttl", "25h", "--lease-delete-timeout", "25h"][..],
            "--lease-ttl must be 100ms-1440m, got 1500m; --lease-delete-timeout must be 100ms-1440m, got 1500m",
        ),
        (
            &["--lease-ttl", "20s", "--lease-delete-timeout", "10s"][..],
            "--lease-delete-timeout must be at least --lease-ttl (20s), got 10s",
        ),
    ] {
        let args: Vec<&str> = base.iter().chain(extra).copied().collect();
        // `--server` is every command's global flag; the server ignores it.
        let out = gangway("127.0.0.1:1", &args).await;
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {}", stderr(&out));
        assert_eq!(stderr(&out), format!("error: {reason}\n"), "{extra:?}");
        assert_eq!(stdout(&out), "");
    }
    assert!(!data.exists(), "a refused start creates no data directory");
}

#[tokio::test]
async fn the_heartbeat_hint_keeps_namespace_group_and_cluster() {
    let fake = Fake::start(vec![json(
        "POST",
        "/v1/services/orders/instances",
        200,
        json!({"revision": 5, "instance": instance("10.0.0.5", 8080, true)}),
    )])
    .await;
    let out = fake
        .run(&[
            "register",
            "orders",
            "10.0.0.5:8080",
            "-n",
            "prod",
            "--group",
            "blue",
            "-c",
            "east",
        ])
        .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(
            "`gangway heartbeat orders 10.0.0.5:8080 --namespace prod --group blue --cluster east`"
        ),
        "{}",
        stderr(&out)
    );
    let out = fake.run(&["register", "orders", "10.0.0.5:8080"]).await;
    assert!(
        stderr(&out).contains("`gangway heartbeat orders 10.0.0.5:8080`"),
        "{}",
        stderr(&out)
    );
}
