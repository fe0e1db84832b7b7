//! The gangway registry server: the engine ([`engine::Registry`]) behind REST (`/v1/`), the
//! native gRPC session protocol, the Nacos naming protocols ([`nacos`]: v1/v3 HTTP under
//! `/nacos/` on the HTTP port, the Nacos SDK gRPC services on the gRPC port), Prometheus
//! metrics and the web console ([`console`], under `/ui`).
//!
//! The caller binds the listeners and opens the store ([`start`]); [`start_in_memory`] does both
//! on loopback for tests and embedding:
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use std::sync::Arc;
//! use tokio::net::TcpListener;
//!
//! let http = TcpListener::bind("127.0.0.1:0").await?;
//! let grpc = TcpListener::bind("127.0.0.1:0").await?;
//! let store = Arc::new(gangway_store::MemoryStore::default());
//! let server = gangway_server::start(gangway_server::Config::default(), store, http, grpc).await?;
//! println!("REST on {}, gRPC on {}", server.http_addr, server.grpc_addr);
//! server.shutdown().await;
//! # Ok(()) }
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use gangway_store::{MemoryStore, Store};
use tokio::net::TcpListener;
use tokio::time::Instant;

pub mod auth;
pub mod config;
pub mod console;
pub mod engine;
pub mod error;
pub mod grpc;
pub mod http;
pub mod metrics;
pub mod nacos;
pub mod serve;
#[cfg(feature = "tls")]
pub mod tls;

pub use config::Config;
pub use engine::Registry;
pub use error::ApiError;

/// A started server.
pub struct RunningServer {
    /// Bound REST address.
    pub http_addr: SocketAddr,
    /// Bound gRPC address.
    pub grpc_addr: SocketAddr,
    /// The engine, for embedding and tests.
    pub registry: Registry,
    /// Most open connections of the REST and the gRPC port (configured, or derived from the
    /// open-file limit).
    pub max_connections: (usize, usize),
    /// Most open connections of both ports together (three quarters of the open-file limit,
    /// or the sum of the maximums when that is less).
    pub connection_budget: usize,
    nacos: nacos::Nacos,
    http: serve::Serving,
    grpc: serve::Serving,
}

/// What a stop did ([`RunningServer::shutdown`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShutdownReport {
    /// From the call until everything was closed.
    pub elapsed: Duration,
    /// REST connections: closed by themselves, dropped at the timeout.
    pub http: serve::PortStop,
    /// gRPC connections: closed by themselves, dropped at the timeout.
    pub grpc: serve::PortStop,
    /// The engine's close (probes, store).
    pub engine: engine::CloseReport,
}

/// Loads durable state from `store` and starts serving REST (and the Nacos HTTP API) on
/// `http` and the native and Nacos gRPC protocols on `grpc`. The caller binds the listeners
/// (so that a taken port fails before any store is opened) and chooses the store (the binary:
/// redb under `--data-dir`).
///
/// Errors: `config` is out of bounds ([`Config::validate`]), the store cannot be read, or a
/// listener has no local address.
pub async fn start(
    config: Config,
    store: Arc<dyn Store>,
    http_listener: TcpListener,
    grpc_listener: TcpListener,
) -> anyhow::Result<RunningServer> {
    config.validate()?;
    let mut prometheus = prometheus_client::registry::Registry::default();
    let metrics = metrics::Metrics::register(&mut prometheus);
    let connection_metrics = serve::ConnectionMetrics::register(&mut prometheus);
    // The ports answer their health checks while the store loads.
    let registry = Registry::start_loading(store, config.clone(), metrics);
    // A reload that removes a token or user also ends, at once, the stall grace of the
    // instances it owned: no client can register them again (docs/security.md).
    if let Some(mut generations) = config.security.authority.generations() {
        let (registry, authority) = (registry.clone(), config.security.authority.clone());
        tokio::spawn(async move {
            while generations.changed().await.is_ok() {
                registry.end_grace_of_unknown_owners(|owner| authority.knows(owner));
            }
        });
    }
    let http_addr = http_listener.local_addr()?;
    let grpc_addr = grpc_listener.local_addr()?;
    registry.set_addresses(http_addr, grpc_addr);

    let nacos = nacos::Nacos::with_detection(
        registry.clone(),
        config.nacos.detect_after,
        config.nacos.detect_timeout,
    );
    let console = console::Console::new(registry.clone(), &config.security);
    let router = http::router(registry.clone(), prometheus)
        .merge(nacos::http::router(nacos.clone()))
        .merge(console.router())
        .layer(axum::middleware::from_fn_with_state(
            auth::layer::AuthLayerState {
                authority: config.security.authority.clone(),
                exposed: config.security.insecure_no_auth,
                console: console.sessions().clone(),
            },
            auth::layer::authenticate,
        ))
        .layer(axum::middleware::from_fn_with_state(
            registry.clone(),
            http::loading::gate,
        ));
    let (nacos_request, nacos_bi_stream) = nacos::grpc::services(nacos.clone());
    let grpc_router =
        tonic::service::Routes::new(grpc::SessionService::new(registry.clone()).into_server())
            .add_service(nacos_request)
            .add_service(nacos_bi_stream)
            .prepare()
            .into_axum_router();
    let caps = serve::caps(&config.connections);
    let budget = serve::Budget::new(caps.budget);
    let http = serve::Serving::http(
        http_listener,
        router,
        &config.connections,
        &caps,
        budget.clone(),
        connection_metrics.clone(),
        &config.security,
    );
    let grpc = serve::Serving::grpc(
        grpc_listener,
        grpc_router,
        &config.liveness,
        &config.connections,
        &caps,
        budget,
        connection_metrics,
        &config.security,
    );
    Ok(RunningServer {
        http_addr,
        grpc_addr,
        registry,
        max_connections: (caps.http, caps.grpc),
        connection_budget: caps.budget,
        nacos,
        http,
        grpc,
    })
}

/// [`start`] on `127.0.0.1:0` for both ports with durable state in memory: for tests, the lab
/// and embedding. Errors: as [`start`], or a loopback port cannot be bound.
/// Returns once the (empty) store is loaded, so the server answers everything at once.
pub async fn start_in_memory(config: Config) -> anyhow::Result<RunningServer> {
    let http = TcpListener::bind("127.0.0.1:0")
        .await
        .context("bind HTTP 127.0.0.1:0")?;
    let grpc = TcpListener::bind("127.0.0.1:0")
        .await
        .context("bind gRPC 127.0.0.1:0")?;
    let server = start(config, Arc::new(MemoryStore::default()), http, grpc).await?;
    server.loaded().await?;
    Ok(server)
}

impl RunningServer {
    /// Serves until the server stops by itself, which only an internal failure makes it do: a
    /// store that could not be loaded, or a panicked accept loop.
    pub async fn wait(mut self) -> anyhow::Result<()> {
        let load_failed = async {
            match self.registry.loaded().await {
                Err(e) => e,
                Ok(()) => std::future::pending().await,
            }
        };
        tokio::select! {
            e = load_failed => anyhow::bail!("the store could not be loaded: {e}"),
            _ = self.http.ended() => {}
            _ = self.grpc.ended() => {}
        }
        anyhow::bail!("a listener stopped serving")
    }

    /// Resolves when the store is loaded; errors when it could not be.
    pub async fn loaded(&self) -> anyhow::Result<()> {
        self.registry
            .loaded()
            .await
            .map_err(|e| anyhow::anyhow!("the store could not be loaded: {e}"))
    }

    /// Stops within [`Config::shutdown_timeout`]: stops accepting on both ports; holds back
    /// every push (so that ending sessions shows no consumer a removal); tells every native
    /// session to go away (`GoAway`, the client reconnects at once and keeps its views) and
    /// ends its stream; ends SSE watches and Nacos streams (`ConnectResetRequest`); shuts every
    /// connection down gracefully; drops whatever still runs at the timeout; then closes the
    /// engine, which waits for the store write in flight and releases the store (and its file
    /// lock on the data directory).
    pub async fn shutdown(self) -> ShutdownReport {
        let started = Instant::now();
        let deadline = started + self.registry.config().shutdown_timeout;
        self.http.stop_accepting();
        self.grpc.stop_accepting();
        // Before any stream ends: what consumers hold stays what they were last sent.
        self.registry.hold_pushes();
        self.nacos.reset_all().await;
        tracing::debug!(
            ms = started.elapsed().as_millis() as u64,
            "stop: streams told to end"
        );
        let (http, grpc) = tokio::join!(self.http.finish(deadline), self.grpc.finish(deadline));
        tracing::debug!(
            ms = started.elapsed().as_millis() as u64,
            ?http,
            ?grpc,
            "stop: connections done"
        );
        let engine = self.registry.close(deadline).await;
        ShutdownReport {
            elapsed: started.elapsed(),
            http,
            grpc,
            engine,
        }
    }
}
