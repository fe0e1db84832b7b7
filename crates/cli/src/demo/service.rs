//! `gangway demo-service`: GET /ping answers after a delay, saying which instance answered.
//! Registers itself on a session; on SIGTERM runs the lossless sequence (DESIGN §4): drain
//! (offline + wait for every subscriber's ack), stop accepting, finish in-flight requests, exit.
//!
//! With `--no-register` it registers nothing and only serves (and finishes in-flight requests
//! on SIGTERM): the program for `gangway run` to wrap. `--cold-start D` makes it a cold app:
//! the port is open at once, but for its first D it answers `/ping` with 503
//! (`--cold-start-mode unavailable`, and `/health` says 503 too) or slowly (`slow`: an extra
//! `--cold-start-latency` that shrinks linearly to 0 over D, while `/health` already says ok:
//! the case a readiness check cannot see, where only warm-up helps).
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
use std::time::Duration;

use anyhow::Context as _;
use axum::extract::{ConnectInfo, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use clap::{Args, ValueEnum};
use gangway_client::tower::{DrainSignal, DrainingLayer};
use gangway_client::{Client, ClientTls};
use gangway_core::model::{InstanceKey, ServiceKey};
use gangway_wire::ErrorCode;
use gangway_wire::client::{InstanceRef, RestClient, ServiceRef};
use gangway_wire::rest::RegisterRequest;
use tokio::time::Instant;

use crate::args::parse_duration;

/// How a cold demo-service misbehaves during `--cold-start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ColdStartMode {
    /// `/ping` and `/health` answer 503 (still initialising).
    Unavailable,
    /// `/ping` answers slowly (caches cold, JIT), `/health` already says ok.
    Slow,
}

/// Flags of `gangway demo-service`.
#[derive(Debug, Args, Clone)]
pub struct ServiceArgs {
    /// Registry gRPC address, or several nodes of one registry: HOST:PORT,HOST:PORT (the
    /// session fails over between them).
    #[arg(
        long,
        default_value = "127.0.0.1:9848",
        env = "GANGWAY_GRPC",
        value_name = "HOST:PORT",
        value_parser = crate::args::parse_server
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
    /// Register nothing; only serve (the program to wrap in `gangway run`).
    #[arg(long, conflicts_with_all = ["lease_ttl", "no_drain"])]
    pub no_register: bool,
    /// Be a cold app for this long after the start: the port is open, /ping misbehaves as
    /// --cold-start-mode says.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub cold_start: Option<Duration>,
    /// What a cold start looks like.
    #[arg(
        long,
        value_enum,
        default_value = "unavailable",
        requires = "cold_start"
    )]
    pub cold_start_mode: ColdStartMode,
    /// `slow` cold start: extra latency of the first /ping, shrinking linearly to 0 at the end
    /// of --cold-start.
    #[arg(long, default_value = "1s", value_parser = parse_duration, value_name = "DURATION", requires = "cold_start")]
    pub cold_start_latency: Duration,
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
    failing: Arc<AtomicBool>,
    cold: Option<Cold>,
}

/// The cold-start settings and the process's start.
#[derive(Clone, Copy)]
struct Cold {
    started: Instant,
    window: Duration,
    mode: ColdStartMode,
    latency: Duration,
}

impl Cold {
    /// Time left of the cold start, `None` once it is over.
    fn left(&self) -> Option<Duration> {
        let elapsed = self.started.elapsed();
        (elapsed < self.window).then(|| self.window - elapsed)
    }
}

/// GET /ping: after the delay, `{"instance": name, "peer": "ip:port"}` where `peer` is the
/// caller's end of the TCP connection (so callers can tell connections apart), or HTTP 500
/// while failing; during a cold start HTTP 503 or a slower answer. While draining, the
/// [`DrainingLayer`] marks the answer.
async fn ping(State(d): State<Demo>, ConnectInfo(peer): ConnectInfo<SocketAddr>) -> Response {
    let mut delay = d.delay;
    if let Some((cold, left)) = d.cold.and_then(|c| c.left().map(|left| (c, left))) {
        match cold.mode {
            ColdStartMode::Unavailable => {
                return (StatusCode::SERVICE_UNAVAILABLE, "cold start").into_response();
            }
            ColdStartMode::Slow => {
                delay += cold
                    .latency
                    .mul_f64(left.as_secs_f64() / cold.window.as_secs_f64());
            }
        }
    }
    // A zero delay must not wait for the timer's next millisecond tick (benchmarks use it).
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let body = Json(serde_json::json!({ "instance": d.name, "peer": peer.to_string() }));
    if d.failing.load(Ordering::Relaxed) {
        (StatusCode::INTERNAL_SERVER_ERROR, body).into_response()
    } else {
        body.into_response()
    }
}

/// GET /health: 503 during an `unavailable` cold start, else 200.
async fn health(State(d): State<Demo>) -> Response {
    match d.cold {
        Some(c) if c.mode == ColdStartMode::Unavailable && c.left().is_some() => {
            (StatusCode::SERVICE_UNAVAILABLE, "cold start").into_response()
        }
        _ => "ok".into_response(),
    }
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

/// Runs the demo service until SIGTERM/SIGINT; `token` is sent on its session (`--token`),
/// `tls` is its TLS toward an `https://` registry (`--ca`, `--client-cert`, `--client-key`).
pub async fn run(args: ServiceArgs, token: Option<String>, tls: ClientTls) -> anyhow::Result<()> {
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
        failing: Arc::new(AtomicBool::new(args.fail)),
        cold: args.cold_start.map(|window| Cold {
            started: Instant::now(),
            window,
            mode: args.cold_start_mode,
            latency: args.cold_start_latency,
        }),
    };
    let draining = DrainSignal::new();
    let app = Router::new()
        .route("/ping", get(ping))
        .route("/health", get(health))
        .route("/control/fail", post(control_fail))
        .route("/control/heal", post(control_heal))
        .with_state(demo.clone())
        // In-band: a consumer whose ack is late still stops reusing this instance.
        .layer(DrainingLayer::new(draining.clone()));

    if let (Some(ttl), Some(http)) = (args.lease_ttl, args.registry_http.clone()) {
        return run_classic(args, ttl, &http, listener, app, name).await;
    }
    if args.no_register {
        println!("ready name={name} addr={addr}");
        return serve_until_signal(listener, app, &draining).await;
    }
    let client = Client::connect(
        crate::args::session_config(crate::args::server_list(&args.registry))
            .with_client_name(format!("demo-service {name}"))
            .with_optional_token(token)
            .with_tls(tls),
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
    draining.start();
    if !args.no_drain {
        // Forced: the process is leaving anyway; being the last instance does not change that.
        match registration.drain(args.drain_timeout, true).await {
            Ok(report) => println!(
                "drained waited_ms={} complete={} acked={} laggards={}",
                report.waited_ms,
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

/// `--no-register`: serve until SIGTERM/SIGINT, then mark answers draining, stop accepting,
/// finish in-flight requests and exit.
async fn serve_until_signal(
    listener: tokio::net::TcpListener,
    app: Router,
    draining: &DrainSignal,
) -> anyhow::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let shutdown = {
        let draining = draining.clone();
        async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            draining.start();
        }
    };
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
    .context("serve")?;
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
    let registry = RestClient::new(registry_http)?;
    let delete_timeout = args.lease_delete_timeout.unwrap_or(ttl * 2).max(ttl);
    let instance = InstanceRef::new(
        ServiceRef::named(&args.service),
        &addr.ip().to_string(),
        addr.port(),
    );
    let body = RegisterRequest {
        ip: instance.ip.clone(),
        port: u32::from(addr.port()),
        ttl_ms: Some(ttl.as_millis() as u64),
        delete_timeout_ms: Some(delete_timeout.as_millis() as u64),
        metadata: [("name".to_owned(), name.clone())].into(),
        ..RegisterRequest::default()
    };
    registry
        .register(&instance.service, &body)
        .await
        .context("register")?;
    println!("ready name={name} addr={addr}");
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
            match registry.heartbeat(&instance).await {
                Err(e) if e.code() == Some(&ErrorCode::NotFound) => break,
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
