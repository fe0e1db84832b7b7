//! `gangway lab liveness`: how the registry sees an instance go, measured on real processes and
//! sockets, next to the figures of a Nacos 3.2 single node measured elsewhere.
//!
//! Every measurement has its own registry and runs concurrently with the others; the persistent
//! instance's `--observe` wait (default 60 s) sets the suite's length.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use comfy_table::Table as TextTable;
use gangway_wire::client::{InstanceRef, RestClient, ServiceRef};
use gangway_wire::rest::{Instance, ProbeRequest, RegisterRequest, SettingsRequest, View};
use indicatif::{ProgressBar, ProgressStyle};
use nix::sys::signal::Signal;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::process::{Proc, STARTUP, field};

/// How often the registry's list is read while waiting for a change.
const POLL: Duration = Duration::from_millis(25);
/// Longest wait for one answer of the registry's REST API.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// Settings of the liveness suite.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The `gangway` executable.
    pub exe: PathBuf,
    /// How long to watch a persistent instance whose port stopped listening (default 60 s).
    pub observe: Duration,
    /// Session keepalive ping interval (default 1 s).
    pub keepalive_interval: Duration,
    /// Session keepalive timeout (default 3 s).
    pub keepalive_timeout: Duration,
    /// Show a progress bar.
    pub progress: bool,
}

/// One measured row.
#[derive(Debug, Clone)]
pub struct Row {
    /// What happened.
    pub case: String,
    /// What gangway did, measured here.
    pub measured: String,
    /// What the list showed meanwhile.
    pub meanwhile: String,
    /// Nacos 3.2 single node, measured elsewhere (issue 4).
    pub nacos: String,
    /// Error, if the measurement could not run.
    pub error: Option<String>,
}

fn row(case: &str, nacos: &str, r: anyhow::Result<(String, String)>) -> Row {
    match r {
        Ok((measured, meanwhile)) => Row {
            case: case.to_owned(),
            measured,
            meanwhile,
            nacos: nacos.to_owned(),
            error: None,
        },
        Err(e) => Row {
            case: case.to_owned(),
            measured: "error".to_owned(),
            meanwhile: format!("{e:#}"),
            nacos: nacos.to_owned(),
            error: Some(format!("{e:#}")),
        },
    }
}

/// Runs every measurement (concurrently) and returns the rows in table order.
///
/// # Errors
/// None of its own: a measurement that fails becomes a row with its error.
pub async fn run(s: &Settings) -> anyhow::Result<Vec<Row>> {
    let bar = if s.progress {
        ProgressBar::new(6)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    bar.set_message(format!(
        "liveness (the persistent probe is watched for {} s)",
        s.observe.as_secs()
    ));
    let step = |bar: &ProgressBar| bar.inc(1);
    let (graceful, kill, stop, lease, persistent, (protect, restart)) = tokio::join!(
        async {
            let r = session_leaves(s, Leave::Graceful).await;
            step(&bar);
            r
        },
        async {
            let r = session_leaves(s, Leave::Kill).await;
            step(&bar);
            r
        },
        async {
            let r = session_leaves(s, Leave::Stop).await;
            step(&bar);
            r
        },
        async {
            let r = session_leaves(s, Leave::LeaseKill).await;
            step(&bar);
            r
        },
        async {
            let r = persistent_port_closes(s).await;
            step(&bar);
            r
        },
        async {
            // These two are short; run them one after the other to keep the CPU quieter.
            let p = protect_threshold().await;
            let r = registry_restart(s).await;
            step(&bar);
            (p, r)
        },
    );
    bar.finish_and_clear();
    let mut rows = vec![
        row(
            "session instance, graceful exit (deregisters)",
            "0.68 s",
            graceful,
        ),
        row("session instance, SIGKILL of its process", "0.58 s", kill),
        row("session instance, SIGSTOP of its process", "26 s", stop),
        row(
            "lease instance (REST, TTL 15 s, delete 30 s), SIGKILL of its process",
            "not measured; v1 HTTP defaults: unhealthy after 15 s, deleted after 30 s",
            lease,
        ),
    ];
    match persistent {
        Ok(rows_p) => rows.extend(rows_p),
        Err(e) => rows.push(row(
            "persistent instance, port stops listening",
            "unhealthy after 0.6-3.4 s, healthy 13 s after the port is back",
            Err(e),
        )),
    }
    match protect {
        Ok(rows_p) => rows.extend(rows_p),
        Err(e) => rows.push(row("protect threshold, 4 of 5 down", "-", Err(e))),
    }
    match restart {
        Ok(rows_r) => rows.extend(rows_r),
        Err(e) => rows.push(row(
            "registry restart (kill -9, start)",
            "ephemeral re-registered after 14 s",
            Err(e),
        )),
    }
    Ok(rows)
}

/// Renders the table.
pub fn render(rows: &[Row]) -> String {
    let mut t = TextTable::new();
    t.load_preset(comfy_table::presets::ASCII_MARKDOWN);
    t.set_header([
        "case",
        "gangway (measured here)",
        "the list meanwhile",
        "Nacos 3.2 (measured elsewhere)",
    ]);
    for r in rows {
        t.add_row([&r.case, &r.measured, &r.meanwhile, &r.nacos]);
    }
    format!("liveness: how the registry sees an instance go\n{t}")
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Leave {
    Graceful,
    Kill,
    Stop,
    /// SIGKILL of a classic instance: REST lease, TTL 15 s, delete timeout 30 s (Nacos v1's).
    LeaseKill,
}

async fn start_registry(s: &Settings) -> anyhow::Result<gangway_server::RunningServer> {
    let mut config = gangway_server::Config::for_tests();
    config.liveness.keepalive_interval = s.keepalive_interval;
    config.liveness.keepalive_timeout = s.keepalive_timeout;
    gangway_server::start_in_memory(config)
        .await
        .context("start the registry")
}

/// A REST client of the registry at `http` (its HTTP port), [`CALL_TIMEOUT`] a call.
fn rest(http: SocketAddr) -> anyhow::Result<RestClient> {
    Ok(RestClient::builder(&http.to_string())
        .call_timeout(CALL_TIMEOUT)
        .build()?)
}

/// Every instance of `service` (`?all=true`), or an empty list on any error.
async fn list_all(registry: &RestClient, service: &str) -> Vec<Instance> {
    list(registry, service, true)
        .await
        .map(|v| v.instances)
        .unwrap_or_default()
}

/// The consumer view of `service`, or with `all` every instance.
async fn list(registry: &RestClient, service: &str, all: bool) -> anyhow::Result<View> {
    Ok(registry
        .instances(&ServiceRef::named(service), all)
        .await?
        .parse()?)
}

/// The instance at `addr` (`ip:port`) among `instances`.
fn find<'a>(instances: &'a [Instance], addr: &str) -> Option<&'a Instance> {
    instances.iter().find(|i| i.addr() == addr)
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// A demo-service on a session leaves; how long until the registry's list no longer holds it,
/// and its health flag meanwhile.
async fn session_leaves(s: &Settings, how: Leave) -> anyhow::Result<(String, String)> {
    let server = start_registry(s).await?;
    let service = "liveness";
    let mut args: Vec<String> = vec![
        "demo-service".into(),
        "--service".into(),
        service.into(),
        "--no-drain".into(),
    ];
    if how == Leave::LeaseKill {
        args.extend([
            "--lease-ttl".into(),
            "15s".into(),
            "--lease-delete-timeout".into(),
            "30s".into(),
            "--registry-http".into(),
            server.http_addr.to_string(),
        ]);
    } else {
        args.extend(["--registry".into(), server.grpc_addr.to_string()]);
    }
    let mut p = Proc::spawn(&s.exe, &args)?;
    let result = async {
        let ready = p.line("ready ", STARTUP).await?;
        let addr = field(&ready, "addr").context("ready line without addr=")?;
        let http = rest(server.http_addr)?;
        let listed = wait_until(Duration::from_secs(10), || async {
            find(&list_all(&http, service).await, &addr).is_some()
        })
        .await;
        anyhow::ensure!(listed.is_some(), "the instance was never listed");
        let sig = match how {
            Leave::Graceful => Signal::SIGTERM,
            Leave::Kill | Leave::LeaseKill => Signal::SIGKILL,
            Leave::Stop => Signal::SIGSTOP,
        };
        let start = Instant::now();
        p.signal(sig)?;
        let mut flags = Vec::new();
        let mut unhealthy = None;
        let limit = Duration::from_secs(60);
        loop {
            let all = list_all(&http, service).await;
            match find(&all, &addr) {
                None => break,
                Some(i) => {
                    if unhealthy.is_none() && !i.healthy {
                        unhealthy = Some(start.elapsed());
                    }
                    let flag = format!("healthy={} enabled={}", i.healthy, i.enabled);
                    if flags.last() != Some(&flag) {
                        flags.push(flag);
                    }
                }
            }
            anyhow::ensure!(start.elapsed() < limit, "still listed after {limit:?}");
            tokio::time::sleep(POLL).await;
        }
        let gone = start.elapsed();
        Ok((
            match unhealthy {
                Some(u) => format!("unhealthy after {}, gone after {}", secs(u), secs(gone)),
                None => format!("gone after {}", secs(gone)),
            },
            if flags.is_empty() {
                "gone at the first look".to_owned()
            } else {
                format!("{} until gone", flags.join(", then "))
            },
        ))
    }
    .await;
    p.kill().await;
    server.shutdown().await;
    result
}

/// Polls `check` every [`POLL`] until it holds; the time it took, or `None` after `limit`.
async fn wait_until<F, Fut>(limit: Duration, mut check: F) -> Option<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if check().await {
            return Some(start.elapsed());
        }
        if start.elapsed() >= limit {
            return None;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// A listener that accepts and drops connections until aborted.
fn listen(listener: TcpListener) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            if let Ok((stream, _)) = listener.accept().await {
                drop(stream);
            }
        }
    })
}

/// Registers `body` in `service`.
async fn register(
    registry: &RestClient,
    service: &str,
    body: &RegisterRequest,
) -> anyhow::Result<()> {
    registry
        .register(&ServiceRef::named(service), body)
        .await
        .context("register")?;
    Ok(())
}

/// A persistent instance at `127.0.0.1:port`, TCP-probed with the registry's defaults.
fn persistent(port: u16) -> RegisterRequest {
    RegisterRequest {
        ip: "127.0.0.1".to_owned(),
        port: u32::from(port),
        ephemeral: Some(false),
        probe: Some(ProbeRequest {
            kind: Some(gangway_core::model::ProbeKind::Tcp),
            ..ProbeRequest::default()
        }),
        ..RegisterRequest::default()
    }
}

/// A persistent, TCP-probed instance (default probe: every 2 s, fall 2, rise 2) whose port
/// stops listening: time until unhealthy, still listed after `observe`, time until healthy
/// again once the port listens again.
async fn persistent_port_closes(s: &Settings) -> anyhow::Result<Vec<Row>> {
    let server = start_registry(s).await?;
    let result = async {
        let http = rest(server.http_addr)?;
        let service = "stock";
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port_addr = listener.local_addr()?;
        let addr = port_addr.to_string();
        let accept = listen(listener);
        register(&http, service, &persistent(port_addr.port())).await?;
        let health = |http: RestClient| {
            let addr = addr.clone();
            async move { find(&list_all(&http, service).await, &addr).map(|i| i.healthy) }
        };
        wait_until(Duration::from_secs(15), || {
            let h = health(http.clone());
            async move { h.await == Some(true) }
        })
        .await
        .context("the persistent instance never became healthy")?;
        accept.abort();
        let _ = accept.await;
        let closed = Instant::now();
        let unhealthy = wait_until(Duration::from_secs(30), || {
            let h = health(http.clone());
            async move { h.await == Some(false) }
        })
        .await
        .context("the probe never marked it unhealthy within 30 s")?;
        tokio::time::sleep_until(closed + s.observe).await;
        let listed = health(http.clone()).await;
        let listener = TcpListener::bind(port_addr)
            .await
            .with_context(|| format!("listen on {port_addr} again"))?;
        let accept = listen(listener);
        let back = wait_until(Duration::from_secs(60), || {
            let h = health(http.clone());
            async move { h.await == Some(true) }
        })
        .await;
        accept.abort();
        let nacos = "unhealthy after 0.6-3.4 s, healthy 13 s after the port is back";
        Ok(vec![
            row(
                "persistent instance (TCP probe 2 s, fall 2, rise 2), port stops listening",
                nacos,
                Ok((
                    format!("unhealthy after {}", secs(unhealthy)),
                    format!(
                        "after {} s: {}",
                        s.observe.as_secs(),
                        match listed {
                            Some(h) => format!("still listed, healthy={h}"),
                            None => "not listed".to_owned(),
                        }
                    ),
                )),
            ),
            row(
                "persistent instance, port listens again",
                "13 s",
                Ok((
                    back.map_or("not healthy within 60 s".to_owned(), |b| {
                        format!("healthy again after {}", secs(b))
                    }),
                    "listed throughout, healthy=false until then".to_owned(),
                )),
            ),
        ])
    }
    .await;
    server.shutdown().await;
    result
}

/// Five lease-kept instances, four stop heartbeating (TTL 500 ms): what the consumer view holds
/// with protect thresholds 0.0, 0.1, 0.2 and 0.5 (healthy ratio 1/5 = 0.2).
async fn protect_threshold() -> anyhow::Result<Vec<Row>> {
    let mut config = gangway_server::Config::for_tests();
    config.liveness.lease_ttl = Duration::from_millis(500);
    config.liveness.lease_delete_timeout = Duration::from_secs(600);
    let server = gangway_server::start_in_memory(config)
        .await
        .context("start the registry")?;
    let result = async {
        let http = rest(server.http_addr)?;
        let mut rows = Vec::new();
        for threshold in [0.0, 0.1, 0.2, 0.5] {
            let service = format!("protect{}", (threshold * 10.0) as u32);
            for port in 1..=5u16 {
                let lease = RegisterRequest {
                    ip: "127.0.0.1".to_owned(),
                    port: u32::from(20000 + port),
                    ttl_ms: Some(500),
                    delete_timeout_ms: Some(600_000),
                    ..RegisterRequest::default()
                };
                register(&http, &service, &lease).await?;
            }
            let settings = SettingsRequest {
                protect_threshold: Some(threshold),
                ..SettingsRequest::default()
            };
            http.put_settings(&ServiceRef::named(&service), &settings)
                .await
                .context("PUT protect_threshold")?;
            // Keep instance 1 alive; the other four expire after 500 ms (checked every 200 ms).
            let beat = InstanceRef::new(ServiceRef::named(&service), "127.0.0.1", 20001);
            let unhealthy = wait_until(Duration::from_secs(10), || {
                let (http, beat, service) = (http.clone(), beat.clone(), service.clone());
                async move {
                    let _ = http.heartbeat(&beat).await;
                    list_all(&http, &service)
                        .await
                        .iter()
                        .filter(|i| !i.healthy)
                        .count()
                        == 4
                }
            })
            .await;
            anyhow::ensure!(unhealthy.is_some(), "4 of 5 never went unhealthy");
            let view = list(&http, &service, false).await?;
            let instances = view.instances;
            let healthy = instances.iter().filter(|i| i.healthy).count();
            let triggered = view.protection_triggered;
            rows.push(row(
                &format!("protect threshold {threshold}, 4 of 5 down (healthy ratio 0.2)"),
                if threshold >= 0.2 {
                    "not measured; by its rule all 5, each rewritten healthy"
                } else {
                    "not measured; by its rule the 1 healthy"
                },
                Ok((
                    format!("view holds {} ({} healthy)", instances.len(), healthy),
                    if triggered {
                        "protection triggered: all 5 with their real health flags".to_owned()
                    } else {
                        "not triggered: healthy only".to_owned()
                    },
                )),
            ));
        }
        Ok(rows)
    }
    .await;
    server.shutdown().await;
    result
}

/// A `gangway server` child process with a persistent instance and a session instance; kill -9
/// and start again on the same ports and data directory: time until the persistent instance is
/// listed and until the session has re-registered its instance.
async fn registry_restart(s: &Settings) -> anyhow::Result<Vec<Row>> {
    let data = tempfile::tempdir().context("temporary data directory")?;
    let (http_addr, grpc_addr) = (free_port().await?, free_port().await?);
    let server_args: Vec<String> = vec![
        "server".into(),
        "--http".into(),
        http_addr.to_string(),
        "--grpc".into(),
        grpc_addr.to_string(),
        "--data-dir".into(),
        data.path().display().to_string(),
        "--keepalive-interval".into(),
        format!("{}ms", s.keepalive_interval.as_millis()),
        "--keepalive-timeout".into(),
        format!("{}ms", s.keepalive_timeout.as_millis()),
        "--log".into(),
        "error".into(),
    ];
    let http = rest(http_addr)?;
    let up = |http: RestClient| async move {
        wait_until(Duration::from_secs(15), || {
            let http = http.clone();
            async move { list(&http, "x", false).await.is_ok() }
        })
        .await
    };
    let mut server = Proc::spawn(&s.exe, &server_args)?;
    let mut instance = None;
    let probed = TcpListener::bind("127.0.0.1:0").await?;
    let probed_port = probed.local_addr()?.port();
    let probed_addr = probed.local_addr()?.to_string();
    let accept = listen(probed);
    let result = async {
        up(http.clone()).await.context("gangway server did not start")?;
        register(&http, "stock", &persistent(probed_port)).await?;
        let mut p = Proc::spawn(
            &s.exe,
            &[
                "demo-service".into(),
                "--registry".into(),
                grpc_addr.to_string(),
                "--service".into(),
                "orders".into(),
            ],
        )?;
        let ready = p.line("ready ", STARTUP).await?;
        let session_addr = field(&ready, "addr").context("ready line without addr=")?;
        instance = Some(p);
        let listed = |service: &'static str, addr: String, all: bool| {
            let http = http.clone();
            async move {
                wait_until(Duration::from_secs(60), || {
                    let (http, addr) = (http.clone(), addr.clone());
                    async move {
                        list(&http, service, all)
                            .await
                            .is_ok_and(|v| find(&v.instances, &addr).is_some())
                    }
                })
                .await
            }
        };
        listed("orders", session_addr.clone(), true)
            .await
            .context("the session instance was never listed")?;
        server.kill().await;
        let restart = Instant::now();
        server = Proc::spawn(&s.exe, &server_args)?;
        let (persistent, session, session_view) = tokio::join!(
            listed("stock", probed_addr.clone(), true),
            listed("orders", session_addr.clone(), true),
            listed("orders", session_addr.clone(), false),
        );
        let _ = restart;
        let show = |d: Option<Duration>| d.map_or("not within 60 s".to_owned(), secs);
        Ok(vec![
            row(
                "registry restart (kill -9, start on the same ports and data dir): persistent instance",
                "-",
                Ok((
                    format!("listed after {}", show(persistent)),
                    "read from the store at start".to_owned(),
                )),
            ),
            row(
                "registry restart: session instance re-registered",
                "14 s",
                Ok((
                    format!("listed after {}", show(session)),
                    format!(
                        "in the consumer view (GET) after {}",
                        show(session_view)
                    ),
                )),
            ),
        ])
    }
    .await;
    accept.abort();
    if let Some(mut p) = instance {
        p.kill().await;
    }
    server.kill().await;
    result
}

async fn free_port() -> anyhow::Result<SocketAddr> {
    let l = TcpListener::bind("127.0.0.1:0").await?;
    Ok(l.local_addr()?)
}
