//! `gangway demo-service`: GET /ping answers after a delay, saying which instance answered.
//! Registers itself on a session; on SIGTERM runs the lossless sequence (DESIGN §4): drain
//! (offline + wait for every subscriber's ack), stop accepting, finish in-flight requests, exit.
//!
//! With `--lease-ttl` it is a "classic" instance instead (the lab's baseline): registered over
//! REST with a lease (`--registry-http`), a heartbeat every TTL/3, and on SIGTERM a graceful exit
//! only (stop accepting, finish in-flight): no drain, no deregistration.
//!
//! Machine-readable lines on stdout: `ready name=.. addr=..`, `drained waited_ms=.. complete=..
//! acked=.. laggards=..`, `stopped in_flight=0`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::extract::ConnectInfo;
use std::time::Duration;

use anyhow::Context as _;
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use clap::Args;
use gangway_client::{Client, ClientConfig};
use gangway_core::model::{InstanceKey, ServiceKey};

use crate::args::parse_duration;

/// Response header set while the instance drains (DESIGN §4, in-band signal).
pub const DRAINING_HEADER: &str = "x-gangway-draining";

/// Flags of `gangway demo-service`.
#[derive(Debug, Args, Clone)]
pub struct ServiceArgs {
    /// Registry gRPC address.
    #[arg(
        long,
        default_value = "127.0.0.1:9848",
        env = "GANGWAY_GRPC",
        value_name = "HOST:PORT"
    )]
    pub registry: String,
    /// Service name to register under.
    #[arg(long, default_value = "demo")]
    pub service: String,
    /// Address to listen on (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:0", value_name = "ADDR")]
    pub listen: SocketAddr,
    /// Instance name shown in answers (default: the port).
    #[arg(long)]
    pub name: Option<String>,
    /// Time GET /ping takes (in-flight time).
    #[arg(long, default_value = "200ms", value_parser = parse_duration, value_name = "DURATION")]
    pub delay: Duration,
    /// Longest wait for subscribers' acks on SIGTERM.
    #[arg(long, default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    pub drain_timeout: Duration,
    /// On SIGTERM skip the drain (deregister by exiting): for comparisons.
    #[arg(long)]
    pub no_drain: bool,
    /// Start failing: GET /ping answers HTTP 500 until `POST /control/heal`.
    #[arg(long)]
    pub fail: bool,
    /// Classic mode: register over REST with a lease of this TTL and heartbeat every TTL/3
    /// instead of opening a session; SIGTERM then only exits gracefully (no drain).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION", requires = "registry_http")]
    pub lease_ttl: Option<Duration>,
    /// Classic mode: lease delete timeout (default: 2 x the TTL).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION", requires = "lease_ttl")]
    pub lease_delete_timeout: Option<Duration>,
    /// Classic mode: the registry's REST address.
    #[arg(long, value_name = "HOST:PORT")]
    pub registry_http: Option<String>,
}

#[derive(Clone)]
struct Demo {
    name: String,
    delay: Duration,
    draining: Arc<AtomicBool>,
    failing: Arc<AtomicBool>,
}

/// GET /ping: after the delay, `{"instance": name, "peer": "ip:port"}` where `peer` is the
/// caller's end of the TCP connection (so callers can tell connections apart), or HTTP 500
/// while failing.
async fn ping(State(d): State<Demo>, ConnectInfo(peer): ConnectInfo<SocketAddr>) -> Response {
    // A zero delay must not wait for the timer's next millisecond tick (benchmarks use it).
    if !d.delay.is_zero() {
        tokio::time::sleep(d.delay).await;
    }
    let body = Json(serde_json::json!({ "instance": d.name, "peer": peer.to_string() }));
    let mut response = if d.failing.load(Ordering::Relaxed) {
        (axum::http::StatusCode::INTERNAL_SERVER_ERROR, body).into_response()
    } else {
        body.into_response()
    };
    if d.draining.load(Ordering::Relaxed) {
        // In-band: a consumer whose ack is late still stops reusing this connection.
        let headers = response.headers_mut();
        headers.insert(DRAINING_HEADER, HeaderValue::from_static("1"));
        headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// POST /control/fail: GET /ping answers HTTP 500 from now on.
async fn control_fail(State(d): State<Demo>) -> &'static str {
    d.failing.store(true, Ordering::Relaxed);
    "failing"
}

/// POST /control/heal: GET /ping answers normally again.
async fn control_heal(State(d): State<Demo>) -> &'static str {
    d.failing.store(false, Ordering::Relaxed);
    "healed"
}

/// Runs the demo service until SIGTERM/SIGINT.
pub async fn run(args: ServiceArgs) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("bind {}", args.listen))?;
    let addr = listener.local_addr()?;
    let name = args
        .name
        .clone()
        .unwrap_or_else(|| format!("i{}", addr.port()));
    let demo = Demo {
        name: name.clone(),
        delay: args.delay,
        draining: Arc::new(AtomicBool::new(false)),
        failing: Arc::new(AtomicBool::new(args.fail)),
    };
    let app = Router::new()
        .route("/ping", get(ping))
        .route("/health", get(|| async { "ok" }))
        .route("/control/fail", post(control_fail))
        .route("/control/heal", post(control_heal))
        .with_state(demo.clone());

    if let (Some(ttl), Some(http)) = (args.lease_ttl, args.registry_http.clone()) {
        return run_classic(args, ttl, &http, listener, app, name).await;
    }
    let client = Client::connect(
        ClientConfig::new(args.registry.clone()).with_client_name(format!("demo-service {name}")),
    )
    .await
    .with_context(|| format!("cannot reach the registry at {}", args.registry))?;
    let service = ServiceKey::named(&args.service);
    let instance = InstanceKey::new(&addr.ip().to_string(), addr.port(), "");
    let registration = client
        .register(
            service,
            instance,
            1.0,
            [("name".to_string(), name.clone())].into(),
        )
        .await
        .context("register")?;
    println!("ready name={name} addr={addr}");

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(async move {
            let _ = stop_rx.await;
        })
        .await
    });

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    demo.draining.store(true, Ordering::Relaxed);
    if !args.no_drain {
        // Forced: the process is leaving anyway; being the last instance does not change that.
        match registration.drain(args.drain_timeout, true).await {
            Ok(report) => println!(
                "drained waited_ms={} complete={} acked={} laggards={}",
                report.waited.as_millis(),
                report.complete,
                report.acked.len(),
                report.laggards.len()
            ),
            Err(e) => println!("drain-failed error={e}"),
        }
    }
    // Stop accepting, finish in-flight requests (axum's graceful shutdown), then end the session.
    let _ = stop_tx.send(());
    server.await.context("server task")?.context("serve")?;
    client.close();
    println!("stopped in_flight=0");
    Ok(())
}

/// Classic mode: REST registration with a lease, heartbeats every TTL/3, graceful exit on
/// SIGTERM (the registry learns of the exit only when the lease expires, unless someone
/// deregisters the instance first).
async fn run_classic(
    args: ServiceArgs,
    ttl: Duration,
    registry_http: &str,
    listener: tokio::net::TcpListener,
    app: Router,
    name: String,
) -> anyhow::Result<()> {
    let addr = listener.local_addr()?;
    let base = if registry_http.starts_with("http") {
        registry_http.trim_end_matches('/').to_owned()
    } else {
        format!("http://{registry_http}")
    };
    let http = reqwest::Client::new();
    let delete_timeout = args.lease_delete_timeout.unwrap_or(ttl * 2).max(ttl);
    let instances = format!("{base}/v1/services/{}/instances", args.service);
    let response = http
        .post(&instances)
        .json(&serde_json::json!({
            "ip": addr.ip().to_string(),
            "port": addr.port(),
            "ttl_ms": ttl.as_millis() as u64,
            "delete_timeout_ms": delete_timeout.as_millis() as u64,
            "metadata": { "name": name },
        }))
        .send()
        .await
        .with_context(|| format!("cannot reach the registry at {registry_http}"))?;
    anyhow::ensure!(
        response.status().is_success(),
        "register refused: HTTP {} {}",
        response.status(),
        response.text().await.unwrap_or_default()
    );
    println!("ready name={name} addr={addr}");
    let heartbeat_url = format!("{instances}/{addr}/heartbeat");
    // Heartbeats every TTL/3, as a Nacos v1 or Eureka client does. A 404 (deregistered by
    // someone else) stops them: the instance does not come back by itself. SIGUSR1 sends one
    // at once and restarts the interval from there: `gangway lab` uses it to set the phase of
    // the heartbeats against the moment it kills the process.
    let mut usr1 = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1())?;
    let heartbeats = tokio::spawn(async move {
        let period = ttl / 3;
        let mut next = tokio::time::Instant::now() + period;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(next) => {}
                _ = usr1.recv() => {}
            }
            next = tokio::time::Instant::now() + period;
            match http.put(&heartbeat_url).send().await {
                Ok(r) if r.status() == reqwest::StatusCode::NOT_FOUND => break,
                _ => {}
            }
        }
    });
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(async move {
            let _ = stop_rx.await;
        })
        .await
    });
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    heartbeats.abort();
    let _ = stop_tx.send(());
    server.await.context("server task")?.context("serve")?;
    println!("stopped in_flight=0");
    Ok(())
}
