//! The gangway registry server: the engine ([`engine::Registry`]) behind REST (`/v1/`), the
//! native gRPC session protocol, the Nacos naming protocols ([`nacos`]: v1/v3 HTTP under
//! `/nacos/` on the HTTP port, the Nacos SDK gRPC services on the gRPC port), and Prometheus
//! metrics.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! let server = gangway_server::start(gangway_server::Config::for_tests()).await?;
//! println!("REST on {}, gRPC on {}", server.http_addr, server.grpc_addr);
//! server.shutdown().await;
//! # Ok(()) }
//! ```

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;

pub mod config;
pub mod engine;
pub mod error;
pub mod grpc;
pub mod http;
pub mod metrics;
pub mod nacos;

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
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<anyhow::Result<()>>>,
}

/// Opens the store, loads durable state, binds both listeners and starts serving.
///
/// Errors: the data directory or store cannot be opened (e.g. another server holds it), or an
/// address cannot be bound.
pub async fn start(config: Config) -> anyhow::Result<RunningServer> {
    // Bind first: a taken port must not leave a new data directory behind.
    let http_listener = TcpListener::bind(config.http)
        .await
        .with_context(|| format!("bind HTTP {}", config.http))?;
    let grpc_listener = TcpListener::bind(config.grpc)
        .await
        .with_context(|| format!("bind gRPC {}", config.grpc))?;
    let store: Arc<dyn gangway_store::Store> = match &config.data_dir {
        Some(dir) => Arc::new(
            gangway_store_redb::RedbStore::open(dir)
                .with_context(|| format!("data dir {}", dir.display()))?,
        ),
        None => Arc::new(gangway_store::MemoryStore::default()),
    };
    let mut prometheus = prometheus_client::registry::Registry::default();
    let metrics = metrics::Metrics::register(&mut prometheus);
    let registry =
        Registry::start(store, config.clone(), metrics).map_err(|e| anyhow::anyhow!("{e}"))?;
    let (stop, stopped) = watch::channel(false);
    let http_addr = http_listener.local_addr()?;
    let grpc_addr = grpc_listener.local_addr()?;

    let nacos = nacos::Nacos::new(registry.clone());
    let router =
        http::router(registry.clone(), prometheus).merge(nacos::http::router(nacos.clone()));
    let (nacos_request, nacos_bi_stream) = nacos::grpc::services(nacos.clone());
    let mut http_stop = stopped.clone();
    let http_task = tokio::spawn(async move {
        axum::serve(
            http_listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(async move {
            let _ = http_stop.wait_for(|s| *s).await;
        })
        .await
        .context("HTTP server")
    });

    let live = config.liveness;
    let service = grpc::SessionService::new(registry.clone()).into_server();
    let mut grpc_stop = stopped;
    let grpc_task = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(live.keepalive_interval))
            .http2_keepalive_timeout(Some(live.keepalive_timeout))
            .tcp_nodelay(true)
            .add_service(service)
            .add_service(nacos_request)
            .add_service(nacos_bi_stream)
            .serve_with_incoming_shutdown(TcpListenerStream::new(grpc_listener), async move {
                let _ = grpc_stop.wait_for(|s| *s).await;
                // Nacos streams last as long as their clients: end them, or shutdown waits.
                nacos.reset_all().await;
            })
            .await
            .context("gRPC server")
    });
    Ok(RunningServer {
        http_addr,
        grpc_addr,
        registry,
        stop,
        tasks: vec![http_task, grpc_task],
    })
}

impl RunningServer {
    /// Serves until one of the listeners fails.
    pub async fn wait(mut self) -> anyhow::Result<()> {
        let (result, _, rest) = futures::future::select_all(std::mem::take(&mut self.tasks)).await;
        for task in rest {
            task.abort();
        }
        result?
    }

    /// Stops accepting, ends open streams and waits for both servers to finish.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        for task in std::mem::take(&mut self.tasks) {
            let _ = task.await;
        }
    }
}
