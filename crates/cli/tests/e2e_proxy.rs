//! End to end through `gangway proxy` (issue 14): a registry, demo-service instances, one
//! proxy process and a Python consumer (`tests/proxy/consumer.py`, standard library only) that
//! sends GET http://SERVICE/ping at 60 req/s with the proxy as its `http_proxy`. Each scenario
//! uses its own service of 3 instances:
//! (a) SIGKILL of one instance: 0 failed (retry);
//! (b) one instance answers 500: ejected by the error-rate rule of docs/client.md;
//! (c) rolling restart with drains (`gangway drain`, then demo-service SIGTERM): 0 failed, and
//!     the drain lists the proxy among the subscribers that acked.
//! Then a full `SERVICE.GROUP.NAMESPACE` host, SIGHUP with a bad and a good config file, and
//! SIGTERM of the proxy with a request in flight. Prints the failure table.

mod cluster;

use std::io::Write as _;
use std::process::Stdio;
use std::time::Duration;

use cluster::{GANGWAY, Proc, STARTUP, Server, poll};
use nix::sys::signal::Signal;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::time::Instant;

const CONSUMER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/proxy/consumer.py");

/// The proxy's config: `sick` counts 5xx as errors and may eject 1 of its 3 instances.
const CONFIG: &str = r#"
[services.sick.outlier]
errors = "network-and-5xx"
max_ejection_ratio = 0.5
"#;

/// The same with `roll` on another balancer.
const CONFIG_CHANGED: &str = r#"
[services.sick.outlier]
errors = "network-and-5xx"
max_ejection_ratio = 0.5
[services.roll]
balancer = "random"
"#;

/// Not loadable: two bad values.
const CONFIG_BAD: &str = r#"
[services.roll]
balancer = "fastest"
[services.roll.retry]
max_attempts = 0
"#;

struct Outcome {
    scenario: &'static str,
    sent: u64,
    failed: u64,
    attempts: f64,
    detail: String,
}

/// The registry and the proxy, shared by the scenarios.
struct Stack {
    server: Server,
    proxy: Proc,
    listen: String,
    admin: String,
    config: tempfile::NamedTempFile,
    _data: tempfile::TempDir,
}

impl Stack {
    async fn start() -> Stack {
        let data = tempfile::tempdir().unwrap();
        let server = Server::start(
            data.path(),
            "127.0.0.1:0",
            "127.0.0.1:0",
            &["--warmup", "0s"],
        )
        .await;
        let mut config = tempfile::NamedTempFile::new().unwrap();
        config.write_all(CONFIG.as_bytes()).unwrap();
        let path = config.path().to_str().unwrap().to_owned();
        let mut proxy = Proc::spawn(&[
            "proxy",
            "--registry",
            &server.grpc,
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--config",
            &path,
        ]);
        let line = proxy.line_starting("gangway proxy").await;
        Stack {
            listen: field(&line, "listen"),
            admin: field(&line, "admin"),
            server,
            proxy,
            config,
            _data: data,
        }
    }

    async fn admin(&self, path: &str) -> Value {
        reqwest::get(format!("http://{}{path}", self.admin))
            .await
            .expect("admin GET")
            .json()
            .await
            .expect("admin JSON")
    }

    /// Three instances of `service` (names `a`, `b`, `c`); `first` flags go to `a`.
    async fn instances(&self, service: &str, first: &[&str]) -> Vec<Instance> {
        let mut out = Vec::new();
        for name in ["a", "b", "c"] {
            let flags = if name == "a" { first } else { &[] };
            out.push(Instance::start(&self.server.grpc, service, name, flags).await);
        }
        out
    }

    fn write_config(&mut self, text: &str) {
        let f = self.config.as_file_mut();
        f.set_len(0).unwrap();
        use std::io::Seek as _;
        f.seek(std::io::SeekFrom::Start(0)).unwrap();
        f.write_all(text.as_bytes()).unwrap();
        f.sync_all().unwrap();
    }
}

/// One demo-service process.
struct Instance {
    proc: Proc,
    addr: String,
}

impl Instance {
    async fn start(registry: &str, service: &str, name: &str, flags: &[&str]) -> Instance {
        let mut args = vec![
            "demo-service",
            "--registry",
            registry,
            "--service",
            service,
            "--name",
            name,
        ];
        args.extend_from_slice(flags);
        let mut proc = Proc::spawn(&args);
        let line = proc.line_starting("ready ").await;
        proc.forward_stderr("demo-service");
        Instance {
            addr: field(&line, "addr"),
            proc,
        }
    }
}

fn field(line: &str, key: &str) -> String {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
        .to_owned()
}

/// The Python consumer, started and sending.
struct Consumer {
    child: tokio::process::Child,
    started: Instant,
}

impl Consumer {
    async fn start(proxy: &str, service: &str, seconds: f64) -> Consumer {
        let mut child = tokio::process::Command::new("python3")
            .arg(CONSUMER)
            .args(["--proxy", proxy, "--service", service, "--rate", "60"])
            .args(["--duration", &seconds.to_string()])
            // The proxy reaches instances directly even when http_proxy is set around it.
            .env_remove("http_proxy")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("python3 runs the consumer");
        let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
        let line = tokio::time::timeout(STARTUP, stderr.next_line())
            .await
            .expect("the consumer started in time")
            .expect("read stderr");
        assert!(
            line.as_deref().is_some_and(|l| l.starts_with("sending ")),
            "{line:?}"
        );
        tokio::spawn(async move {
            while let Ok(Some(line)) = stderr.next_line().await {
                eprintln!("[consumer] {line}");
            }
        });
        Consumer {
            child,
            started: Instant::now(),
        }
    }

    async fn finish(mut self) -> Value {
        let mut out = String::new();
        let mut stdout = self.child.stdout.take().unwrap();
        tokio::time::timeout(Duration::from_secs(30), stdout.read_to_string(&mut out))
            .await
            .expect("consumer output in time")
            .expect("read stdout");
        let status = tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .expect("consumer exited")
            .expect("wait");
        let report: Value = serde_json::from_str(out.trim()).expect("consumer JSON summary");
        let expected = if report["failed"] == 0 { 0 } else { 1 };
        assert_eq!(status.code(), Some(expected), "consumer exit status");
        report
    }
}

fn requests(report: &Value) -> &Vec<Value> {
    report["requests"].as_array().expect("requests")
}

fn summary(scenario: &'static str, report: &Value, detail: String) -> Outcome {
    let rows = requests(report);
    let answered: Vec<f64> = rows
        .iter()
        .filter_map(|r| r["attempts"].as_f64())
        .filter(|a| *a > 0.0)
        .collect();
    Outcome {
        scenario,
        sent: report["sent"].as_u64().unwrap(),
        failed: report["failed"].as_u64().unwrap(),
        attempts: answered.iter().sum::<f64>() / answered.len().max(1) as f64,
        detail,
    }
}

async fn sigkill(stack: &Stack) -> Outcome {
    let mut instances = stack.instances("kill", &[]).await;
    let consumer = Consumer::start(&stack.listen, "kill", 4.0).await;
    tokio::time::sleep_until(consumer.started + Duration::from_millis(1500)).await;
    let victim = instances.remove(0);
    victim.proc.signal(Signal::SIGKILL);
    let report = consumer.finish().await;
    let retried = requests(&report)
        .iter()
        .filter(|r| r["attempts"].as_u64() == Some(2))
        .count();
    let out = summary(
        "(a) SIGKILL of one instance",
        &report,
        format!("{retried} request(s) retried on another instance"),
    );
    assert_eq!(out.sent, 240);
    assert_eq!(out.failed, 0, "retry must cover a crash: {report}");
    assert!(retried >= 1, "the killed instance had requests in flight");
    out
}

async fn failing_instance(stack: &Stack) -> Outcome {
    let instances = stack.instances("sick", &["--fail"]).await;
    let sick = instances[0].addr.clone();
    let consumer = Consumer::start(&stack.listen, "sick", 4.0).await;
    let report = consumer.finish().await;
    let failures: Vec<&Value> = requests(&report)
        .iter()
        .filter(|r| r["ok"] != true)
        .collect();
    assert!(
        failures
            .iter()
            .all(|r| r["status"] == 500 && r["instance"] == "a"),
        "only the sick instance's own 500s fail: {failures:?}"
    );
    let last = failures
        .iter()
        .filter_map(|r| r["sent_ms"].as_f64())
        .fold(0.0, f64::max);
    let detail = stack.admin("/services/sick").await;
    let ejected = detail["ejected"].as_array().unwrap();
    assert_eq!(ejected.len(), 1, "{detail}");
    assert_eq!(ejected[0]["instance"], sick.as_str());
    assert_eq!(ejected[0]["reason"], "error_rate");
    let counted = detail["instances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["instance"] == sick.as_str())
        .map(|i| i["outcomes"]["server_error"].as_u64().unwrap())
        .unwrap();
    let out = summary(
        "(b) one instance answers 500",
        &report,
        format!(
            "ejected (error_rate) after {counted} 500s; last failure sent at {last:.0} ms; \
             admin lists it ejected"
        ),
    );
    // 10 outcomes (1 req/s over the 10 s window) at 100 % errors eject it, plus the ones
    // already in flight; none after that (the first recovery check is 30 s away).
    assert!(
        (10..=20).contains(&out.failed),
        "failed {}: {report}",
        out.failed
    );
    assert!(last < 2000.0, "requests to the ejected instance went on");
    assert_eq!(counted, out.failed, "admin counts every 500");
    out
}

async fn rolling_restart(stack: &Stack) -> Outcome {
    let old = stack.instances("roll", &[]).await;
    let consumer = Consumer::start(&stack.listen, "roll", 6.0).await;
    tokio::time::sleep_until(consumer.started + Duration::from_millis(1000)).await;
    let subscribers: Value = serde_json::from_str(
        &command(&[
            "subscribers",
            "roll",
            "--server",
            &stack.server.http,
            "--json",
        ])
        .await,
    )
    .unwrap();
    let proxy_id = subscribers["subscribers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| {
            s["client_name"]
                .as_str()
                .is_some_and(|n| n.starts_with("gangway-proxy/"))
        })
        .map(|s| s["id"].as_str().unwrap().to_owned())
        .unwrap_or_else(|| panic!("the proxy subscribes to roll: {subscribers}"));
    let mut waits = Vec::new();
    let mut proxy_acked = false;
    let mut new = Vec::new();
    for (i, mut instance) in old.into_iter().enumerate() {
        let name = ["d", "e", "f"][i];
        new.push(Instance::start(&stack.server.grpc, "roll", name, &[]).await);
        if i == 0 {
            // `gangway drain` first: the report names who acked the revision without it.
            let report: Value = serde_json::from_str(
                &command(&[
                    "drain",
                    "roll",
                    &instance.addr,
                    "--server",
                    &stack.server.http,
                    "--json",
                ])
                .await,
            )
            .unwrap();
            assert_eq!(report["complete"], true, "{report}");
            proxy_acked = report["acked"]
                .as_array()
                .unwrap()
                .iter()
                .any(|a| a["id"] == proxy_id.as_str());
            waits.push(format!("{} ms", report["waited_ms"]));
        }
        // demo-service drains itself on SIGTERM, then stops accepting and finishes.
        instance.proc.signal(Signal::SIGTERM);
        let drained = instance.proc.line_starting("drained ").await;
        assert!(drained.contains("complete=true"), "{drained}");
        if i > 0 {
            waits.push(format!("{} ms", field(&drained, "waited_ms")));
        }
        assert!(instance.proc.wait(Duration::from_secs(10)).await.success());
    }
    let report = consumer.finish().await;
    assert!(
        proxy_acked,
        "the drain must list the proxy ({proxy_id}) as acked"
    );
    let out = summary(
        "(c) rolling restart with drains",
        &report,
        format!(
            "3 instances replaced; drains waited {}; proxy {proxy_id} acked",
            waits.join(", ")
        ),
    );
    assert_eq!(
        out.failed, 0,
        "a drained instance must cost nothing: {report}"
    );
    full_name(stack).await;
    drop(new);
    out
}

/// A `gangway` command's stdout (it must exit 0).
async fn command(args: &[&str]) -> String {
    let out = tokio::process::Command::new(GANGWAY)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run gangway");
    assert!(
        out.status.success(),
        "gangway {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `roll.DEFAULT_GROUP.public` reaches the same service as `roll` (the same route), while
/// `roll`'s new instances run. reqwest sends the host lower-cased (`default_group`), as many
/// clients do; the proxy reads it as the default group.
async fn full_name(stack: &Stack) {
    let client = reqwest::Client::builder()
        .proxy(reqwest::Proxy::http(format!("http://{}", stack.listen)).unwrap())
        .build()
        .unwrap();
    let answer = client
        .get("http://roll.DEFAULT_GROUP.public/ping")
        .send()
        .await
        .unwrap();
    let status = answer.status();
    let text = answer.text().await.unwrap();
    assert_eq!(status, 200, "{text}");
    let routed = stack.admin("/services").await;
    let rolls = routed["services"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["service"]["name"] == "roll")
        .count();
    assert_eq!(rolls, 1, "{routed}");
}

async fn reloads(stack: &mut Stack) {
    stack.write_config(CONFIG_BAD);
    stack.proxy.signal(Signal::SIGHUP);
    let failed = poll(Duration::from_secs(5), || async {
        let c = stack.admin("/config").await;
        (c["reload_failures"] == 1).then_some(c)
    })
    .await
    .expect("the bad file was read");
    let error = failed["last_reload_error"].as_str().unwrap();
    assert!(
        error.contains("services.roll.balancer")
            && error.contains("services.roll.retry.max_attempts"),
        "{error}"
    );
    assert_eq!(failed["reloads"], 0);
    assert_eq!(
        failed["services"]["sick"]["settings"]["outlier"]["errors"], "network-and-5xx",
        "the running config is kept"
    );
    let logged = stack
        .proxy
        .stderr_line_containing("config reload failed, keeping the previous config")
        .await;
    assert!(logged.contains("services.roll.balancer"), "{logged}");

    stack.write_config(CONFIG_CHANGED);
    stack.proxy.signal(Signal::SIGHUP);
    let ok = poll(Duration::from_secs(5), || async {
        let c = stack.admin("/config").await;
        (c["reloads"] == 1).then_some(c)
    })
    .await
    .expect("the good file was read");
    assert_eq!(ok["services"]["roll"]["settings"]["balancer"], "random");
}

async fn proxy_sigterm(stack: &mut Stack) {
    let slow = Instance::start(&stack.server.grpc, "slow", "s", &["--delay", "1s"]).await;
    let client = reqwest::Client::builder()
        .proxy(reqwest::Proxy::http(format!("http://{}", stack.listen)).unwrap())
        .build()
        .unwrap();
    let in_flight = tokio::spawn(async move { client.get("http://slow/ping").send().await });
    // The request is routed (and so in flight to the 1 s instance) once admin knows `slow`.
    poll(Duration::from_secs(10), || async {
        reqwest::get(format!("http://{}/services/slow", stack.admin))
            .await
            .ok()
            .filter(|r| r.status().is_success())
    })
    .await
    .expect("the request was routed");
    stack.proxy.signal(Signal::SIGTERM);
    let closed = poll(Duration::from_secs(2), || async {
        tokio::net::TcpStream::connect(&stack.listen)
            .await
            .is_err()
            .then_some(())
    })
    .await;
    assert!(closed.is_some(), "the listener stops accepting");
    assert!(
        !in_flight.is_finished(),
        "closed while the request was in flight"
    );
    let answer = in_flight
        .await
        .unwrap()
        .expect("the request in flight finished");
    assert_eq!(answer.status(), 200);
    let stopped = stack.proxy.line_starting("stopped ").await;
    assert_eq!(stopped, "stopped in_flight=0");
    assert!(stack.proxy.wait(Duration::from_secs(10)).await.success());
    drop(slow);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_consumer_through_the_proxy() {
    let mut stack = Stack::start().await;
    let outcomes = vec![
        sigkill(&stack).await,
        failing_instance(&stack).await,
        rolling_restart(&stack).await,
    ];
    reloads(&mut stack).await;
    stack.proxy.forward_stderr("proxy");
    proxy_sigterm(&mut stack).await;
    let mut table = comfy_table::Table::new();
    table.set_header(["scenario", "sent", "failed", "attempts/request", "detail"]);
    for o in &outcomes {
        table.add_row([
            o.scenario.to_owned(),
            o.sent.to_string(),
            o.failed.to_string(),
            format!("{:.3}", o.attempts),
            o.detail.clone(),
        ]);
    }
    println!("Python urllib consumer through gangway proxy, 60 req/s, 3 instances each:\n{table}");
}
