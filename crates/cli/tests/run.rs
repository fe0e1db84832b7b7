//! `gangway run` with real processes on loopback (issue 12): Python `http.server` children
//! behind the wrapper, a registry process, `gangway demo-client` consumers, and `gangway online
//! --wait` against a frozen subscriber.

mod cluster;

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cluster::{GANGWAY, Proc, STARTUP, Server, addresses, poll};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// The consumer measures the registry and the wrapper alone: no retry, no ejection.
const NO_RETRY: &[&str] = &["--no-retry", "--no-ejection"];

/// python's http.server dies at SIGTERM with its requests in flight; those sent just before the
/// last ack need a moment (it answers in milliseconds; 500 ms covers a loaded machine).
const LINGER: &[&str] = &["--linger", "500ms"];

/// A `gangway run` process wrapping `python3 -m http.server`, its JSON events read from stdout.
struct Wrapper {
    child: Child,
    events: mpsc::UnboundedReceiver<Value>,
    /// Every line of its stderr (its logs and python's) so far.
    stderr: Arc<Mutex<Vec<String>>>,
    port: u16,
    /// The Python child's pid (its own process group).
    python: i32,
    /// The `/ready` endpoint's address, from the `readiness` event.
    readiness: Option<String>,
    /// Serves the `ping` and `health` files.
    dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    let s = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    s.local_addr().unwrap().port()
}

impl Wrapper {
    /// `gangway run --json --service demo --port P --registry G FLAGS -- python3 -m http.server
    /// P`, serving a directory with a `ping` file; returns once the child started.
    async fn start(grpc: &str, flags: &[&str]) -> Wrapper {
        Self::start_cmd(grpc, flags, None).await
    }

    async fn start_cmd(grpc: &str, flags: &[&str], delay_start: Option<&str>) -> Wrapper {
        Self::start_on(grpc, flags, delay_start, free_port()).await
    }

    async fn start_on(grpc: &str, flags: &[&str], delay_start: Option<&str>, port: u16) -> Wrapper {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ping"), "pong").unwrap();
        std::fs::write(dir.path().join("health"), "ok").unwrap();
        let port_s = port.to_string();
        let dir_s = dir.path().to_str().unwrap().to_owned();
        let mut args: Vec<String> = ["run", "--json", "--service", "demo", "--port", &port_s]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend(["--registry".into(), grpc.into()]);
        args.extend(flags.iter().map(|s| s.to_string()));
        args.push("--".into());
        // HTTP/1.1: keep-alive, so the consumer does not open a connection per request (with
        // HTTP/1.0 and its listen backlog of 5, a loaded machine drops SYNs, and a dropped SYN
        // costs a 1 s retransmission: a timeout that has nothing to do with the lifecycle).
        let python = format!(
            "python3 -m http.server {port} --bind 127.0.0.1 --directory {dir_s} --protocol HTTP/1.1"
        );
        match delay_start {
            // A child that opens its port late (part of the program under test, not a wait).
            Some(delay) => args.extend([
                "sh".into(),
                "-c".into(),
                format!("sleep {delay}; exec {python}"),
            ]),
            None => args.extend(python.split(' ').map(str::to_owned)),
        }
        let mut child = Command::new(GANGWAY)
            .args(&args)
            .env_remove("GANGWAY_SERVICE")
            .env_remove("GANGWAY_PORT")
            .env_remove("GANGWAY_IP")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn gangway run");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let (tx, events) = mpsc::unbounded_channel();
        // The child shares stdout: keep reading, keep the events.
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                match serde_json::from_str::<Value>(&line) {
                    Ok(v) if v.get("event").is_some() => {
                        let _ = tx.send(v);
                    }
                    _ => {}
                }
            }
        });
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let mut errors = BufReader::new(child.stderr.take().unwrap()).lines();
        let kept = stderr.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = errors.next_line().await {
                kept.lock().unwrap().push(line);
            }
        });
        let mut w = Wrapper {
            child,
            events,
            stderr,
            port,
            python: 0,
            readiness: None,
            dir,
        };
        if flags.contains(&"--readiness-port") {
            let e = w.event("readiness").await;
            w.readiness = e["listen"].as_str().map(str::to_owned);
        }
        let started = w.event("started").await;
        w.python = started["pid"].as_i64().unwrap() as i32;
        w
    }

    /// A wrapper whose check is `GET /health` every 100 ms, fall 2, rise 2.
    async fn start_with_health_check(grpc: &str) -> Wrapper {
        let port = free_port();
        let url = format!("http://127.0.0.1:{port}/health");
        let flags = [
            "--ready",
            url.as_str(),
            "--probe-interval",
            "100ms",
            "--fall",
            "2",
            "--rise",
            "2",
        ];
        Self::start_on(grpc, &flags, None, port).await
    }

    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The next event named `name` (earlier ones are skipped), within [`STARTUP`].
    async fn event(&mut self, name: &str) -> Value {
        let found = tokio::time::timeout(STARTUP, async {
            while let Some(e) = self.events.recv().await {
                if e["event"] == name {
                    return Some(e);
                }
            }
            None
        })
        .await;
        match found {
            Ok(Some(e)) => e,
            other => panic!("no {name:?} event (got {other:?})"),
        }
    }

    fn signal(&self, sig: Signal) {
        kill(Pid::from_raw(self.child.id().unwrap() as i32), sig).unwrap();
    }

    /// Its stderr lines so far that contain `text`.
    fn logged(&self, text: &str) -> Vec<String> {
        let lines = self.stderr.lock().unwrap();
        lines.iter().filter(|l| l.contains(text)).cloned().collect()
    }

    async fn wait(&mut self, timeout: Duration) -> Option<i32> {
        tokio::time::timeout(timeout, self.child.wait())
            .await
            .expect("the wrapper exited in time")
            .unwrap()
            .code()
    }
}

impl Drop for Wrapper {
    fn drop(&mut self) {
        // The wrapper dies with kill_on_drop; its child is in a process group of its own.
        if self.python > 0 {
            let _ = killpg(Pid::from_raw(self.python), Signal::SIGKILL);
        }
    }
}

/// A demo-client subscribed to `demo`, at `rate` for `duration`, with `flags`; returns once it
/// sends.
async fn consumer(grpc: &str, rate: &str, duration: &str, min: &str, flags: &[&str]) -> Proc {
    let mut args = vec![
        "demo-client",
        "--registry",
        grpc,
        "--service",
        "demo",
        "--rate",
        rate,
        "--duration",
        duration,
        "--min-instances",
        min,
        "--json",
    ];
    args.extend_from_slice(flags);
    let mut client = Proc::spawn(&args);
    client.stderr_line_starting("sending ").await;
    client.forward_stderr("demo-client");
    client
}

async fn report_of(client: &mut Proc) -> Value {
    let out = client.rest_of_stdout(Duration::from_secs(30)).await;
    client.wait(Duration::from_secs(5)).await;
    serde_json::from_str(out.trim()).expect("demo-client JSON summary")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_restart_of_three_python_children_loses_nothing() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start(data.path(), "127.0.0.1:0", "127.0.0.1:0", &[]).await;
    let mut wrappers = Vec::new();
    for _ in 0..3 {
        let mut w = Wrapper::start(&server.grpc, LINGER).await;
        w.event("ready").await;
        wrappers.push(w);
    }
    let mut client = consumer(&server.grpc, "60", "6s", "3", NO_RETRY).await;
    let started = Instant::now();
    tokio::time::sleep_until(started + Duration::from_secs(1)).await;
    let mut steps = Vec::new();
    for _ in 0..3 {
        // Surge first: the new one counts once every subscriber acked it, then the old drains.
        let mut fresh = Wrapper::start(&server.grpc, LINGER).await;
        let ready = fresh.event("ready").await;
        let mut old = wrappers.remove(0);
        old.signal(Signal::SIGTERM);
        let drained = old.event("drained").await;
        assert_eq!(drained["complete"], true, "{drained}");
        // Python dies of the SIGTERM: the wrapper passes 128 + 15 on.
        assert_eq!(old.wait(Duration::from_secs(15)).await, Some(143));
        steps.push((ready["acked"].clone(), drained["waited_ms"].clone()));
        wrappers.push(fresh);
    }
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "the rollout must fit in the load"
    );
    let report = report_of(&mut client).await;
    assert_eq!(report["sent"], 360, "{report}");
    assert_eq!(
        report["failed"], 0,
        "ack drain + ack readiness lose nothing: {report}"
    );
    let listed = addresses(&server.get("/v1/services/demo/instances").await);
    let mut expected: Vec<String> = wrappers.iter().map(Wrapper::addr).collect();
    let mut listed_sorted = listed.clone();
    listed_sorted.sort();
    expected.sort();
    assert_eq!(listed_sorted, expected);
    println!(
        "rolling restart of 3 python children: 0 of 360 failed; (acked by, drain ms) per step: {steps:?}"
    );
}

/// The failed requests of a report and whether all were sent to `addr` around `at_ms`.
fn failures(report: &Value) -> Vec<Value> {
    report["requests"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["ok"] == false)
        .cloned()
        .collect()
}

async fn child_sigkill(flags: &[&str]) -> (Value, f64, String) {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start(data.path(), "127.0.0.1:0", "127.0.0.1:0", &[]).await;
    let mut wrappers = Vec::new();
    for _ in 0..3 {
        let mut w = Wrapper::start(&server.grpc, &[]).await;
        w.event("ready").await;
        wrappers.push(w);
    }
    let mut client = consumer(&server.grpc, "60", "4s", "3", flags).await;
    let started = Instant::now();
    tokio::time::sleep_until(started + Duration::from_millis(1500)).await;
    let victim = &mut wrappers[0];
    killpg(Pid::from_raw(victim.python), Signal::SIGKILL).unwrap();
    let killed_ms = started.elapsed().as_secs_f64() * 1000.0;
    let exited = victim.event("child-exited").await;
    assert_eq!(exited["code"], 137, "SIGKILL: 128 + 9 passed on");
    assert_eq!(victim.wait(Duration::from_secs(5)).await, Some(137));
    let addr = victim.addr();
    let gone = poll(Duration::from_secs(2), || async {
        let listing = server.get("/v1/services/demo/instances?all=true").await;
        (!addresses(&listing).contains(&addr)).then_some(())
    })
    .await;
    assert!(gone.is_some(), "the wrapper deregistered its dead child");
    (report_of(&mut client).await, killed_ms, addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_sigkill_fails_at_most_its_in_flight_requests_and_none_with_a_retry() {
    let (report, killed_ms, victim) = child_sigkill(NO_RETRY).await;
    let failed = failures(&report);
    // The wrapper sees its child die at once and deregisters; the push reaches the consumer
    // within milliseconds (and at most a second on a loaded machine). Only requests to the
    // victim that were in flight at the kill (sent at most one attempt timeout, 1 s, before) or
    // sent before the consumer's view dropped it can fail.
    let dropped_ms = report["view_changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| {
            c["at_ms"].as_f64().unwrap() >= killed_ms
                && !c["instances"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|i| i == victim.as_str())
        })
        .and_then(|c| c["at_ms"].as_f64())
        .expect("the consumer's view dropped the killed instance");
    assert!(
        dropped_ms - killed_ms < 1000.0,
        "view dropped it {} ms after the kill",
        dropped_ms - killed_ms
    );
    let exposed = report["requests"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["instance"] == victim.as_str())
        .filter(|r| {
            let sent = r["sent_ms"].as_f64().unwrap();
            killed_ms - 1000.0 <= sent && sent <= dropped_ms
        })
        .count();
    for f in &failed {
        assert_eq!(f["instance"], victim.as_str(), "{f}");
        let sent = f["sent_ms"].as_f64().unwrap();
        assert!(
            killed_ms - 1000.0 <= sent && sent <= dropped_ms,
            "failure at {sent} ms, kill at {killed_ms} ms, dropped at {dropped_ms} ms: {f}"
        );
    }
    assert!(
        failed.len() <= exposed,
        "{} failed, {exposed} exposed",
        failed.len()
    );
    let (report, _, _) = child_sigkill(&[]).await;
    assert_eq!(report["failed"], 0, "one retry covers the kill: {report}");
    println!(
        "child SIGKILL: {} failed without retry (of {exposed} in flight or sent before the drop, \
         {:.0} ms after the kill), 0 with one",
        failed.len(),
        dropped_ms - killed_ms
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrapper_sigkill_removes_the_instance_within_a_second() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start(data.path(), "127.0.0.1:0", "127.0.0.1:0", &[]).await;
    let mut w = Wrapper::start(&server.grpc, &[]).await;
    w.event("ready").await;
    let addr = w.addr();
    let listed = addresses(&server.get("/v1/services/demo/instances?all=true").await);
    assert_eq!(listed, std::slice::from_ref(&addr));
    w.signal(Signal::SIGKILL);
    let killed = Instant::now();
    let gone = poll(Duration::from_secs(5), || async {
        let listing = server.get("/v1/services/demo/instances?all=true").await;
        (!addresses(&listing).contains(&addr)).then(|| killed.elapsed())
    })
    .await
    .expect("the instance left the registry");
    // The connection closes with the process: gone in well under a keepalive timeout (3 s).
    assert!(gone < Duration::from_secs(2), "gone after {gone:?}");
    println!(
        "wrapper SIGKILL: instance gone after {} ms",
        gone.as_millis()
    );
}

/// `--registry A,B`: when the registry A the wrapper is on is killed, the wrapper's session
/// moves to B and registers the instance there (docs/cluster.md, "Client failover").
#[tokio::test]
async fn the_wrapper_registers_on_the_next_registry_after_a_sigkill_of_its_own() {
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let a = Server::start(dirs[0].path(), "127.0.0.1:0", "127.0.0.1:0", &[]).await;
    // B is not up yet: whichever address the wrapper tries first, it ends up on A.
    let b_http = gangway_testkit::refused_address().to_string();
    let b_grpc = gangway_testkit::refused_address().to_string();
    let mut w = Wrapper::start(&format!("{},{b_grpc}", a.grpc), &[]).await;
    w.event("ready").await;
    let addr = w.addr();
    assert_eq!(
        addresses(&a.get("/v1/services/demo/instances").await),
        std::slice::from_ref(&addr)
    );
    let b = Server::start(dirs[1].path(), &b_http, &b_grpc, &[]).await;
    a.proc.signal(Signal::SIGKILL);
    let killed = Instant::now();
    let back = poll(Duration::from_secs(10), || async {
        let listing = b.get("/v1/services/demo/instances").await;
        addresses(&listing)
            .contains(&addr)
            .then(|| killed.elapsed())
    })
    .await
    .expect("the wrapper registered the instance on B");
    println!(
        "registry SIGKILL: the wrapper's instance is on the next registry after {} ms",
        back.as_millis()
    );
    assert!(
        w.child.try_wait().unwrap().is_none(),
        "the wrapper keeps running"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_is_503_before_200_after_the_acks_and_503_from_sigterm() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start(data.path(), "127.0.0.1:0", "127.0.0.1:0", &[]).await;
    // A live subscriber (the demo-client), whose ack the readiness waits for.
    let mut other = Wrapper::start(&server.grpc, &[]).await;
    other.event("ready").await;
    let client = consumer(&server.grpc, "5", "20s", "1", &[]).await;
    let mut w = Wrapper::start_cmd(
        &server.grpc,
        &[
            "--readiness-port",
            "0",
            "--readiness-host",
            "127.0.0.1",
            "--on-drain",
            "sleep 1",
        ],
        Some("1"),
    )
    .await;
    let url = format!(
        "http://{}/ready",
        w.readiness.clone().expect("readiness event")
    );
    let http = reqwest::Client::new();
    let status = |http: reqwest::Client, url: String| async move {
        http.get(&url)
            .send()
            .await
            .map(|r| r.status().as_u16())
            .ok()
    };
    // The child opens its port a second after its start: not ready yet.
    assert_eq!(status(http.clone(), url.clone()).await, Some(503));
    let ready = w.event("ready").await;
    // The demo-client, the other wrapper and this one (each follows its own service).
    assert_eq!(ready["acked"], 3, "every subscriber acked: {ready}");
    assert_eq!(status(http.clone(), url.clone()).await, Some(200));
    w.signal(Signal::SIGTERM);
    let draining = poll(Duration::from_secs(1), || {
        let (http, url) = (http.clone(), url.clone());
        async move { (status(http, url).await == Some(503)).then_some(()) }
    })
    .await;
    assert!(draining.is_some(), "/ready says 503 once SIGTERM arrived");
    let drained = w.event("drained").await;
    assert_eq!(drained["complete"], true, "{drained}");
    w.event("on-drain-done").await;
    assert_eq!(w.wait(Duration::from_secs(15)).await, Some(143));
    client.signal(Signal::SIGKILL);
    assert_eq!(
        w.logged("session lost"),
        Vec::<String>::new(),
        "a normal stop"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn online_wait_returns_once_a_frozen_subscriber_is_gone_or_times_out_naming_it() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start(
        data.path(),
        "127.0.0.1:0",
        "127.0.0.1:0",
        &["--keepalive-interval", "200ms", "--keepalive-timeout", "1s"],
    )
    .await;
    let http = reqwest::Client::new();
    for port in [1, 2] {
        let r = http
            .post(server.url("/v1/services/demo/instances"))
            .json(&json!({"ip": "127.0.0.1", "port": port, "ttl_ms": 600000, "delete_timeout_ms": 600000}))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{r:?}");
    }
    let client = consumer(&server.grpc, "1", "60s", "2", NO_RETRY).await;
    let cli = |args: &[&str]| {
        let mut all = vec!["--server", &server.http, "--json"];
        all.extend_from_slice(args);
        let all: Vec<String> = all.iter().map(|s| s.to_string()).collect();
        async move {
            let out = Command::new(GANGWAY).args(&all).output().await.unwrap();
            let body = serde_json::from_slice::<Value>(&out.stdout).unwrap_or(Value::Null);
            (out.status.code(), body)
        }
    };
    let (code, _) = cli(&["offline", "demo", "127.0.0.1:1"]).await;
    assert_eq!(code, Some(0));
    client.signal(Signal::SIGSTOP);
    // The frozen subscriber cannot ack: the wait times out, exit 3, and names it.
    let (code, report) = cli(&[
        "online",
        "demo",
        "127.0.0.1:1",
        "--wait",
        "--timeout",
        "300ms",
    ])
    .await;
    assert_eq!(code, Some(3), "{report}");
    assert_eq!(report["complete"], false);
    let laggards = report["laggards"].as_array().unwrap();
    assert_eq!(laggards.len(), 1, "{report}");
    let frozen = laggards[0]["id"].as_str().unwrap().to_owned();
    // Again, with time: it returns complete once the registry dropped the frozen session
    // (keepalive 200 ms + 1 s), not before.
    let (code, _) = cli(&["offline", "demo", "127.0.0.1:1"]).await;
    assert_eq!(code, Some(0));
    let asked = Instant::now();
    let (code, report) = cli(&[
        "online",
        "demo",
        "127.0.0.1:1",
        "--wait",
        "--timeout",
        "10s",
    ])
    .await;
    let took = asked.elapsed();
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["complete"], true);
    assert!(
        report["acked"]
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a["id"] != frozen.as_str()),
        "the frozen subscriber never acked: {report}"
    );
    let subscribers = server.get("/v1/services/demo/subscribers").await;
    assert!(
        subscribers["subscribers"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["id"] != frozen.as_str()),
        "it returned after the frozen subscriber was dropped: {subscribers}"
    );
    assert!(
        took < Duration::from_secs(5),
        "well inside its timeout: {took:?}"
    );
    client.signal(Signal::SIGCONT);
    client.signal(Signal::SIGKILL);
    println!(
        "online --wait: timed out naming {frozen}, then complete after {} ms once it was dropped",
        took.as_millis()
    );
}

/// The share of `addr` among the requests sent in `[from_ms, to_ms)`.
fn share(report: &Value, addr: &str, from_ms: f64, to_ms: f64) -> (f64, usize) {
    let sent: Vec<&Value> = report["requests"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| (from_ms..to_ms).contains(&r["sent_ms"].as_f64().unwrap()))
        .collect();
    let hits = sent.iter().filter(|r| r["instance"] == addr).count();
    (hits as f64 / sent.len().max(1) as f64, sent.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_up_ramps_a_new_instances_share_then_gives_it_all() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start(data.path(), "127.0.0.1:0", "127.0.0.1:0", &[]).await;
    let mut warm = Vec::new();
    for _ in 0..2 {
        let mut w = Wrapper::start(&server.grpc, &[]).await;
        w.event("ready").await;
        warm.push(w);
    }
    let mut client = consumer(&server.grpc, "60", "6s", "2", NO_RETRY).await;
    let mut fresh = Wrapper::start(&server.grpc, &["--warmup", "3s"]).await;
    fresh.event("ready").await;
    let report = report_of(&mut client).await;
    assert_eq!(report["failed"], 0, "{report}");
    let addr = fresh.addr();
    let joined = report["view_changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| {
            c["instances"]
                .as_array()
                .unwrap()
                .iter()
                .any(|i| i == addr.as_str())
        })
        .and_then(|c| c["at_ms"].as_f64())
        .expect("the new instance joined the consumer's view");
    // Linear ramp over 3 s with a 0.1 floor: over the first 1.2 s the factor averages about
    // 0.2 (share 0.2 / 2.2 = 0.09); after the window it has a third.
    let (early, n_early) = share(&report, &addr, joined, joined + 1200.0);
    let (late, n_late) = share(&report, &addr, joined + 3200.0, 6000.0);
    assert!(
        n_early >= 50 && n_late >= 30,
        "{n_early} and {n_late} requests"
    );
    assert!(early < 0.17, "share in the first 1.2 s: {early:.3}");
    assert!(
        (late - 1.0 / 3.0).abs() < 0.09,
        "share after the window: {late:.3}"
    );
    println!("warm-up 3 s: share {early:.3} in its first 1.2 s, {late:.3} after the window");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_failing_its_checks_leaves_the_registry_and_comes_back_after_rise() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start(data.path(), "127.0.0.1:0", "127.0.0.1:0", &[]).await;
    let mut w = Wrapper::start_with_health_check(&server.grpc).await;
    w.event("ready").await;
    let addr = w.addr();
    let listed = || async {
        addresses(&server.get("/v1/services/demo/instances?all=true").await).contains(&addr)
    };
    assert!(listed().await);
    // /health answers 404 from now on: after --fall 2 failed checks the instance leaves.
    std::fs::remove_file(w.dir.path().join("health")).unwrap();
    let unhealthy = w.event("unhealthy").await;
    assert_eq!(unhealthy["deregistered"], true, "{unhealthy}");
    assert!(!listed().await, "deregistered while unhealthy");
    // Healthy again: after --rise 2 passed checks it is registered again and acked.
    std::fs::write(w.dir.path().join("health"), "ok").unwrap();
    w.event("registered").await;
    w.event("ready").await;
    assert!(listed().await, "back after rise");
}

/// Whether process `pid` has ended (no longer exists, or a zombie nobody reaped yet).
fn ended(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name in parentheses, which may itself hold spaces.
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X')),
        Err(_) => true,
    }
}

/// Polls until `pid` ended, at most `deadline`.
async fn ends_within(pid: i32, deadline: Duration) -> bool {
    poll(deadline, || async move { ended(pid).then_some(()) })
        .await
        .is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drain_step_ends_within_its_timeout_when_the_registry_is_paused_or_gone() {
    // --drain-timeout 1s + the 1 s slack for the answer, then python stops at its SIGTERM.
    let bound = Duration::from_millis(2000 + 1500);
    let mut took = Vec::new();
    for how in [Signal::SIGSTOP, Signal::SIGKILL] {
        let data = tempfile::tempdir().unwrap();
        let server = Server::start(data.path(), "127.0.0.1:0", "127.0.0.1:0", &[]).await;
        let mut w = Wrapper::start(&server.grpc, &["--drain-timeout", "1s"]).await;
        w.event("ready").await;
        server.proc.signal(how);
        let signalled = Instant::now();
        w.signal(Signal::SIGTERM);
        let failed = w.event("drain-failed").await;
        assert_eq!(w.wait(Duration::from_secs(20)).await, Some(143), "{failed}");
        let elapsed = signalled.elapsed();
        if how == Signal::SIGSTOP {
            server.proc.signal(Signal::SIGCONT);
        }
        assert!(
            elapsed < bound,
            "registry {how}: the stop took {elapsed:?} ({failed})"
        );
        assert!(ended(w.python), "the child was stopped");
        took.push((how, elapsed.as_millis()));
    }
    println!("drain with a paused / killed registry, --drain-timeout 1s: stop took {took:?} ms");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_child_dies_with_a_killed_wrapper() {
    // No registry: the child never opens its port, the wrapper waits for it (step 1).
    let w = Wrapper::start_cmd("127.0.0.1:1", &[], Some("600")).await;
    assert!(!ended(w.python), "the child runs");
    w.signal(Signal::SIGKILL);
    let killed = Instant::now();
    assert!(
        ends_within(w.python, Duration::from_secs(5)).await,
        "the child outlived the wrapper's SIGKILL"
    );
    println!(
        "wrapper SIGKILL: child gone after {} ms",
        killed.elapsed().as_millis()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_on_drain_hook_that_overruns_is_killed_with_what_it_started() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start(data.path(), "127.0.0.1:0", "127.0.0.1:0", &[]).await;
    let pid_file = data.path().join("hook-child.pid");
    let hook = format!("sleep 600 & echo $! > {}; wait", pid_file.display());
    let mut w = Wrapper::start(
        &server.grpc,
        &["--on-drain", &hook, "--on-drain-timeout", "300ms"],
    )
    .await;
    w.event("ready").await;
    w.signal(Signal::SIGTERM);
    w.event("on-drain-killed").await;
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .expect("the hook started its child")
        .trim()
        .parse()
        .unwrap();
    let gone = ends_within(pid, Duration::from_secs(2)).await;
    // Whatever the outcome, leave nothing behind.
    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    assert!(
        gone,
        "the hook's own child {pid} outlived the hook's timeout"
    );
    assert_eq!(w.wait(Duration::from_secs(15)).await, Some(143));
}

/// The status `GET url` answers, `None` when it cannot be reached.
async fn status_of(http: &reqwest::Client, url: &str) -> Option<u16> {
    http.get(url).send().await.map(|r| r.status().as_u16()).ok()
}

/// Polls `url` until it answers `status`, at most 2 s; how long after `since` it did.
async fn answers(
    http: &reqwest::Client,
    url: &str,
    status: u16,
    since: Instant,
) -> Option<Duration> {
    poll(Duration::from_secs(2), || async move {
        (status_of(http, url).await == Some(status)).then(|| since.elapsed())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_follows_an_offline_and_an_online_by_someone_else() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start(data.path(), "127.0.0.1:0", "127.0.0.1:0", &[]).await;
    let mut w = Wrapper::start(
        &server.grpc,
        &["--readiness-port", "0", "--readiness-host", "127.0.0.1"],
    )
    .await;
    let url = format!("http://{}/ready", w.readiness.clone().unwrap());
    let http = reqwest::Client::new();
    w.event("ready").await;
    assert_eq!(status_of(&http, &url).await, Some(200));
    let cli = |verb: &'static str, addr: String| {
        let server = server.http.clone();
        async move {
            let args = ["--server", &server, verb, "demo", &addr, "--force"];
            let args = if verb == "online" {
                &args[..5]
            } else {
                &args[..]
            };
            Command::new(GANGWAY).args(args).output().await.unwrap()
        }
    };
    let turned = Instant::now();
    let out = cli("offline", w.addr()).await;
    assert!(out.status.success(), "{out:?}");
    w.event("out-of-view").await;
    let offline = answers(&http, &url, 503, turned)
        .await
        .expect("/ready says 503 once someone else took the instance offline");
    let body: Value = http.get(&url).send().await.unwrap().json().await.unwrap();
    assert_eq!(body["state"], "offline", "{body}");
    let turned = Instant::now();
    let out = cli("online", w.addr()).await;
    assert!(out.status.success(), "{out:?}");
    w.event("ready").await;
    let online = answers(&http, &url, 200, turned)
        .await
        .expect("/ready says 200 again once the instance is back and acked");
    println!(
        "/ready after someone else's offline: 503 {} ms after the command started; after the online: 200 after {} ms",
        offline.as_millis(),
        online.as_millis()
    );
}

/// `gangway [--json] run ARGS` to its end, bounded: exit code, stdout lines, stderr lines.
async fn run_to_end(args: &[&str]) -> (Option<i32>, Vec<String>, Vec<String>) {
    let out = tokio::time::timeout(
        Duration::from_secs(20),
        Command::new(GANGWAY)
            .args(args)
            .env_remove("GANGWAY_SERVICE")
            .env_remove("GANGWAY_PORT")
            .env_remove("GANGWAY_IP")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("gangway run ended in time")
    .unwrap();
    let lines = |b: &[u8]| {
        String::from_utf8_lossy(b)
            .lines()
            .map(str::to_owned)
            .collect()
    };
    (out.status.code(), lines(&out.stdout), lines(&out.stderr))
}

#[tokio::test]
async fn a_child_that_never_gets_ready_ends_in_the_one_json_error_shape() {
    let port = free_port().to_string();
    let run = [
        "run",
        "--service",
        "s",
        "--port",
        &port,
        "--ready-timeout",
        "300ms",
        "--registry",
        "127.0.0.1:1",
        "--",
        "sleep",
        "60",
    ];
    let json: Vec<&str> = std::iter::once("--json").chain(run).collect();
    let (code, out, err) = run_to_end(&json).await;
    assert_eq!(code, Some(1), "{out:?} {err:?}");
    let events: Vec<Value> = out
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let names: Vec<&str> = events.iter().filter_map(|e| e["event"].as_str()).collect();
    assert_eq!(
        names,
        ["started", "not-ready", "stopping-child", "child-exited"],
        "every step on stdout: {out:?}"
    );
    let last = events.last().unwrap();
    assert_eq!(last["error"]["code"], "not_ready", "{out:?}");
    assert_eq!(last["error"]["field"], "--ready", "{out:?}");
    assert!(last["error"]["message"].as_str().unwrap().contains("300ms"));
    assert!(err.is_empty(), "nothing but logs on stderr: {err:?}");
    let (code, out, err) = run_to_end(&run).await;
    assert_eq!(code, Some(1));
    assert!(out.is_empty(), "{out:?}");
    assert!(
        err.last()
            .unwrap()
            .starts_with("error: the child did not pass --ready"),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_readiness_port_equal_to_the_port_is_one_line_and_exit_2() {
    let run = [
        "run",
        "--service",
        "s",
        "--port",
        "8080",
        "--readiness-port",
        "8080",
        "--",
        "true",
    ];
    let (code, out, err) = run_to_end(&run).await;
    assert_eq!(code, Some(2));
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(err.len(), 1, "one line: {err:?}");
    assert!(
        err[0].contains("--readiness-port 8080") && err[0].contains("--port"),
        "{err:?}"
    );
    let json: Vec<&str> = std::iter::once("--json").chain(run).collect();
    let (code, out, _) = run_to_end(&json).await;
    assert_eq!(code, Some(2));
    let e: Value = serde_json::from_str(&out[0]).unwrap();
    assert_eq!(e["error"]["code"], "invalid_argument");
    assert_eq!(e["error"]["field"], "--readiness-port");
}
