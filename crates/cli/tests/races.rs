//! Issue 9 part 1: racing drains and offlines through REST and through the CLI never leave a
//! service without a serving instance (without force), whatever keeps the instances alive
//! (lease, session, probe). Real sockets on 127.0.0.1 against an in-process registry, with one
//! acking subscriber (the Rust client).

use std::collections::BTreeMap;
use std::process::Output;
use std::sync::Arc;
use std::time::Duration;

use gangway_client::{Client, ClientConfig, Registration};
use gangway_core::model::{InstanceKey, ServiceKey};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::Barrier;

const ROUNDS: usize = 50;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Keeper {
    Lease,
    Session,
    Probe,
}

/// One round's service: `n` instances of one keeper on ports that accept (so probes pass).
struct Round {
    service: String,
    addrs: Vec<String>,
    _listeners: Vec<TcpListener>,
    _registrations: Vec<Registration>,
}

async fn round(
    http: &reqwest::Client,
    base: &str,
    client: &Client,
    keeper: Keeper,
    name: String,
    n: usize,
) -> Round {
    let mut listeners = Vec::new();
    let mut addrs = Vec::new();
    let mut registrations = Vec::new();
    for _ in 0..n {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        addrs.push(format!("127.0.0.1:{port}"));
        match keeper {
            Keeper::Session => {
                let reg = client
                    .register(
                        ServiceKey::named(&name),
                        InstanceKey::new("127.0.0.1", port, ""),
                        1.0,
                        BTreeMap::new(),
                    )
                    .await
                    .unwrap();
                registrations.push(reg);
            }
            Keeper::Lease | Keeper::Probe => {
                let body = if keeper == Keeper::Lease {
                    json!({"ip": "127.0.0.1", "port": port, "ttl_ms": 30000})
                } else {
                    json!({"ip": "127.0.0.1", "port": port, "ephemeral": false})
                };
                let r = http
                    .post(format!("{base}/v1/services/{name}/instances"))
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
            }
        }
        listeners.push(l);
    }
    Round {
        service: name,
        addrs,
        _listeners: listeners,
        _registrations: registrations,
    }
}

async fn serving(http: &reqwest::Client, base: &str, service: &str) -> Vec<String> {
    let v: Value = http
        .get(format!("{base}/v1/services/{service}/instances"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| format!("{}:{}", i["ip"].as_str().unwrap(), i["port"]))
        .collect()
}

/// What one racer did: the address and, if refused, the error message.
type Outcome = (String, Option<String>);

async fn rest_racer(http: reqwest::Client, url: String, addr: String, body: Value) -> Outcome {
    let r = http.post(url).json(&body).send().await.unwrap();
    let status = r.status().as_u16();
    let v: Value = r.json().await.unwrap();
    match status {
        200 => (addr, None),
        409 => {
            assert_eq!(v["error"]["code"], "conflict", "{v}");
            (
                addr,
                Some(v["error"]["message"].as_str().unwrap().to_owned()),
            )
        }
        other => panic!("{other}: {v}"),
    }
}

fn cli(base: &str, args: Vec<String>) -> impl std::future::Future<Output = Output> + use<> {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_gangway"));
    cmd.arg("--server")
        .arg(base.trim_start_matches("http://"))
        .args(args)
        .env_remove("GANGWAY_SERVER")
        .env_remove("GANGWAY_NAMESPACE")
        .env_remove("GANGWAY_GROUP")
        .kill_on_drop(true);
    async move { cmd.output().await.expect("run gangway") }
}

#[derive(Debug, Clone, Copy)]
enum Path {
    RestDrain,
    RestOffline,
    CliDrain,
    CliOffline,
}

/// `ROUNDS` rounds per keeper of `n` racing take-outs of the `n` instances of a fresh service.
async fn race(n: usize, path: Path) {
    let server = gangway_server::start_in_memory(gangway_server::Config::for_tests())
        .await
        .unwrap();
    let base = format!("http://{}", server.http_addr);
    let http = reqwest::Client::new();
    let client =
        Client::connect(ClientConfig::new(server.grpc_addr.to_string()).with_client_name("races"))
            .await
            .unwrap();
    let mut refused_total = 0;
    let mut min_serving = usize::MAX;
    for keeper in [Keeper::Lease, Keeper::Session, Keeper::Probe] {
        for i in 0..ROUNDS {
            let name = format!("svc-{keeper:?}-{i}").to_lowercase();
            let r = round(&http, &base, &client, keeper, name, n).await;
            // One subscriber that acks, as `gangway watch` in the report.
            let mut sub = client
                .subscribe(ServiceKey::named(&r.service))
                .await
                .unwrap();
            sub.wait_for(|v| v.instances.len() == n, Duration::from_secs(5))
                .await
                .unwrap();
            let barrier = Arc::new(Barrier::new(n));
            let racers: Vec<_> = r
                .addrs
                .iter()
                .map(|addr| {
                    let barrier = barrier.clone();
                    let addr = addr.clone();
                    let url = format!("{base}/v1/services/{}/instances/{addr}", r.service);
                    let (http, base, service) = (http.clone(), base.clone(), r.service.clone());
                    tokio::spawn(async move {
                        barrier.wait().await;
                        match path {
                            Path::RestDrain => {
                                rest_racer(
                                    http,
                                    format!("{url}/drain"),
                                    addr,
                                    json!({"timeout_ms": 5000}),
                                )
                                .await
                            }
                            Path::RestOffline => {
                                rest_racer(http, format!("{url}/offline"), addr, json!({})).await
                            }
                            Path::CliDrain | Path::CliOffline => {
                                let mut args = vec![];
                                if matches!(path, Path::CliDrain) {
                                    args.push("drain".to_owned());
                                } else {
                                    args.push("offline".to_owned());
                                }
                                args.extend([service, addr.clone(), "--json".to_owned()]);
                                let out = cli(&base, args).await;
                                match out.status.code() {
                                    Some(0) => (addr, None),
                                    Some(1) => {
                                        // --json: the registry's error object on stdout.
                                        let v: Value = serde_json::from_slice(&out.stdout)
                                            .expect("a JSON error on stdout");
                                        assert_eq!(v["error"]["code"], "conflict", "{v}");
                                        let message = v["error"]["message"].as_str().unwrap();
                                        (addr, Some(message.to_owned()))
                                    }
                                    other => panic!(
                                        "exit {other:?}: {}",
                                        String::from_utf8_lossy(&out.stderr)
                                    ),
                                }
                            }
                        }
                    })
                })
                .collect();
            let mut refused = Vec::new();
            for t in racers {
                let (addr, err) = t.await.unwrap();
                if let Some(message) = err {
                    assert!(
                        message.contains("last serving instance") && message.contains(&r.service),
                        "the refusal names the service and the reason: {message}"
                    );
                    refused.push(addr);
                }
            }
            let left = serving(&http, &base, &r.service).await;
            min_serving = min_serving.min(left.len());
            assert_eq!(
                left.len(),
                1,
                "{path:?} {keeper:?} round {i}: {n} racers left {left:?} serving"
            );
            assert_eq!(
                refused, left,
                "the refused instance is left as it was, serving"
            );
            refused_total += refused.len();
        }
    }
    println!(
        "{path:?}: {n} racers x {ROUNDS} rounds x 3 keepers (lease, session, probe): \
         fewest serving {min_serving}, {refused_total} refused with 409"
    );
    client.close();
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_racing_rest_drains_leave_one_serving() {
    race(2, Path::RestDrain).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_racing_rest_drains_leave_one_serving() {
    race(3, Path::RestDrain).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_racing_rest_offlines_leave_one_serving() {
    race(2, Path::RestOffline).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_racing_cli_drains_leave_one_serving() {
    race(2, Path::CliDrain).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_racing_cli_offlines_leave_one_serving() {
    race(3, Path::CliOffline).await;
}
