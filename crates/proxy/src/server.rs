//! Serving: the proxy listener (HTTP/1.1 and h2c on one port), the admin listener, and the
//! process around them (SIGHUP reloads the config, SIGTERM/SIGINT drain the listener).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use gangway_client::http::AttemptMetrics;
use gangway_client::outlier::OutlierMetrics;
use gangway_client::{Client, ClientConfig};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;

use crate::admin::{self, AdminState, Reloads};
use crate::config::{Config, Overrides};
use crate::metrics::ProxyMetrics;
use crate::proxy::{Proxy, Source};

/// A request's head must arrive within this on HTTP/1.1 connections (slow clients), and a new
/// connection's first byte on any (an idle one that sends nothing is closed then): 30 s.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Most concurrent streams of one HTTP/2 connection: 256.
pub const MAX_CONCURRENT_STREAMS: u32 = 256;
/// Pause after a failed `accept` (out of file descriptors, say) before the next: 50 ms.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Serves `proxy` on `listener` until `shutdown` turns true, then stops accepting (the
/// listener is closed), lets each connection finish what it has in flight (HTTP/1.1: the
/// current request, then close; HTTP/2: GOAWAY, then the open streams) and returns once all
/// are closed or `timeout` passed, with the number of connections still open then (0 after a
/// clean drain). At most `max_connections` are open at once; further clients wait in the
/// listen backlog.
pub async fn serve(
    listener: TcpListener,
    proxy: Proxy,
    max_connections: usize,
    mut shutdown: watch::Receiver<bool>,
    timeout: Duration,
) -> usize {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS);
    let graceful = GracefulShutdown::new();
    let permits = Arc::new(Semaphore::new(max_connections.max(1)));
    let connections = proxy.metrics().connections.clone();
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            _ = stopped(&mut shutdown) => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            _ = stopped(&mut shutdown) => break,
        };
        // Small requests and answers: no Nagle delay.
        let _ = stream.set_nodelay(true);
        let service = {
            let proxy = proxy.clone();
            hyper::service::service_fn(move |request| {
                let proxy = proxy.clone();
                async move { Ok::<_, Infallible>(proxy.handle(request).await) }
            })
        };
        let (builder, watcher) = (builder.clone(), graceful.watcher());
        let connections = connections.clone();
        connections.inc();
        tokio::spawn(async move {
            // The auto builder reads the first bytes to tell HTTP/1.1 from h2c before any of
            // its own timeouts runs: a connection that sends nothing at all would hold its
            // permit for ever. It gets HEADER_READ_TIMEOUT for its first byte, like a head.
            let mut first = [0u8; 1];
            let spoke = tokio::time::timeout(HEADER_READ_TIMEOUT, stream.peek(&mut first)).await;
            if matches!(spoke, Ok(Ok(n)) if n > 0) {
                let connection = builder
                    .serve_connection(TokioIo::new(stream), service)
                    .into_owned();
                if let Err(e) = watcher.watch(connection).await {
                    tracing::debug!(error = %e, "downstream connection ended with an error");
                }
            }
            connections.dec();
            drop(permit);
        });
    }
    drop(listener);
    let open = graceful.count();
    tracing::info!(
        connections = open,
        "listener closed; finishing requests in flight"
    );
    match tokio::time::timeout(timeout, graceful.shutdown()).await {
        Ok(()) => 0,
        Err(_) => usize::try_from(connections.get()).unwrap_or(0),
    }
}

/// Resolves once `shutdown` is true (or its sender is gone).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    // The guard `wait_for` returns is not `Send`: drop it here, not across the caller's await.
    let _ = shutdown.wait_for(|s| *s).await;
}

/// The command line's choices for [`run`].
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct RunOptions {
    /// The TOML file (`--config`), re-read on SIGHUP.
    pub config: Option<PathBuf>,
    /// Flags that win over the file.
    pub overrides: Overrides,
    /// TLS toward an `https://` registry (the CLI's global `--ca`, `--client-cert`,
    /// `--client-key`). Default: the system's roots, no client certificate.
    pub tls: gangway_client::ClientTls,
    /// The registry's API token when it runs with `--auth` (`--token`, `GANGWAY_TOKEN`): sent
    /// as the session's `Authorization: Bearer`. `None`: no credentials.
    pub token: Option<String>,
}

/// Runs `gangway proxy` until SIGTERM or SIGINT.
///
/// Start-up: reads the config (an error stops it: nothing is served), installs the signal
/// handlers, binds both listeners, starts the registry session in the background, then prints
/// one line on stdout: `gangway proxy listen=ADDR admin=ADDR|off registry=ADDR`. A registry
/// that is not reachable yet does not stop it: it logs a warning once the client's request
/// timeout (10 s) passed without a session, keeps trying with backoff, and meanwhile answers
/// every proxied request `503 registry_unavailable` and `/ready` 503; once the session is up it
/// logs `connected to the registry` and subscribes to the configured services.
///
/// SIGHUP re-reads the file: a good one replaces the routing (services whose settings
/// changed get a new pipeline); a bad one keeps the old config and logs one line
/// (`config reload failed, keeping the previous config: ...`). `registry`, `listen`, `admin`,
/// `max_connections` and `shutdown_timeout` are read at start only.
///
/// SIGTERM/SIGINT: `/ready` turns 503, the listener closes, requests in flight finish
/// (at most `shutdown_timeout`), the registry session closes, the admin listener closes last
/// (so `/ready` answers 503 throughout the drain), and it prints `stopped in_flight=N` (the
/// connections cut at the timeout, 0 after a clean drain).
///
/// # Errors
/// A bad config, a listener that cannot be bound.
pub async fn run(options: RunOptions) -> anyhow::Result<()> {
    let file = options.config.clone();
    let config = Config::load(file.as_deref(), &options.overrides)?;
    // Handlers first: a signal sent right after the start-up line must not kill the process.
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let mut hup = signal(SignalKind::hangup()).context("SIGHUP handler")?;
    let client = Client::start(
        ClientConfig::from_addresses(config.registry.split(',').map(str::trim))
            .with_client_name(format!("gangway-proxy/{}", std::process::id()))
            .with_optional_token(options.token.clone())
            .with_tls(options.tls.clone()),
    )
    .with_context(|| format!("registry address {}", config.registry))?;

    let mut registry = Registry::default();
    let metrics = ProxyMetrics::register(&mut registry);
    let proxy = Proxy::new(
        Source::Registry(client.clone()),
        config.routing.clone(),
        metrics.clone(),
        OutlierMetrics::register(&mut registry),
        AttemptMetrics::register(&mut registry),
    );
    let reloads = Arc::new(Reloads::new(file.as_deref()));
    let running = Running::start(&config, proxy.clone(), registry, reloads.clone()).await?;
    tokio::spawn(first_session(client.clone(), proxy.clone()));
    println!(
        "gangway proxy listen={} admin={} registry={}",
        running.listen,
        running
            .admin
            .map_or_else(|| "off".to_owned(), |a| a.to_string()),
        config.registry
    );

    loop {
        tokio::select! {
            _ = hup.recv() => reload(&config, &options, &proxy, &metrics, &reloads).await,
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
    }
    let cut = running.stop(|| client.close()).await;
    println!("stopped in_flight={cut}");
    Ok(())
}

/// Waits for the registry's first session, saying so in the log when it takes longer than the
/// client's request timeout, then subscribes to the configured services.
async fn first_session(client: Client, proxy: Proxy) {
    let patience = client.config().request_timeout;
    if let Err(e) = client.first_session(patience).await {
        tracing::warn!(
            registry = %client.config().address_list(),
            error = %e,
            "the registry is not reachable yet; answering 503 registry_unavailable until it is (retrying with backoff)"
        );
        if client.first_session(Duration::MAX).await.is_err() {
            return;
        }
    }
    tracing::info!(registry = %client.config().address_list(), "connected to the registry");
    proxy.subscribe_configured().await;
}

/// The proxy's listeners, serving: the data plane and the admin endpoints.
pub struct Running {
    /// The proxy listener's address.
    pub listen: SocketAddr,
    /// The admin listener's address (`None`: off).
    pub admin: Option<SocketAddr>,
    shutting_down: Arc<AtomicBool>,
    stop_data: watch::Sender<bool>,
    stop_admin: watch::Sender<bool>,
    data: JoinHandle<usize>,
    admin_task: Option<JoinHandle<std::io::Result<()>>>,
}

impl Running {
    /// Binds `config.listen` and `config.admin` and serves `proxy` on the first, the admin
    /// endpoints (over `registry`'s metrics and `reloads`) on the second.
    ///
    /// # Errors
    /// A listener that cannot be bound.
    pub async fn start(
        config: &Config,
        proxy: Proxy,
        registry: Registry,
        reloads: Arc<Reloads>,
    ) -> anyhow::Result<Running> {
        let listener = TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("bind the proxy listener {}", config.listen))?;
        let admin_listener = match config.admin {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("bind the admin listener {addr}"))?,
            ),
            None => None,
        };
        let listen = listener.local_addr()?;
        let admin = admin_listener
            .as_ref()
            .map(TcpListener::local_addr)
            .transpose()?;
        let shutting_down = Arc::new(AtomicBool::new(false));
        let (stop_data, data_rx) = watch::channel(false);
        let (stop_admin, mut admin_rx) = watch::channel(false);
        let admin_task = admin_listener.map(|l| {
            let app = admin::router(AdminState {
                proxy: proxy.clone(),
                registry: Arc::new(registry),
                reloads,
                shutting_down: shutting_down.clone(),
            });
            tokio::spawn(async move {
                axum::serve(l, app)
                    .with_graceful_shutdown(async move {
                        let _ = admin_rx.wait_for(|s| *s).await;
                    })
                    .await
            })
        });
        let data = tokio::spawn(serve(
            listener,
            proxy,
            config.max_connections,
            data_rx,
            config.shutdown_timeout,
        ));
        Ok(Running {
            listen,
            admin,
            shutting_down,
            stop_data,
            stop_admin,
            data,
            admin_task,
        })
    }

    /// The drain: `/ready` turns 503, the proxy listener closes and its requests in flight
    /// finish (at most `shutdown_timeout`), then `before_admin` runs (closing the registry
    /// session, say) and the admin listener closes last. Returns the connections cut at the
    /// timeout (0 after a clean drain).
    pub async fn stop(self, before_admin: impl FnOnce()) -> usize {
        self.shutting_down.store(true, Ordering::Relaxed);
        let _ = self.stop_data.send(true);
        let cut = self.data.await.unwrap_or_default();
        before_admin();
        let _ = self.stop_admin.send(true);
        if let Some(task) = self.admin_task {
            let _ = task.await;
        }
        cut
    }
}

/// SIGHUP: re-reads the file; keeps the running config when it is bad.
async fn reload(
    running: &Config,
    options: &RunOptions,
    proxy: &Proxy,
    metrics: &ProxyMetrics,
    reloads: &Reloads,
) {
    let Some(file) = &options.config else {
        tracing::info!("SIGHUP: no --config file to reload");
        return;
    };
    match Config::load(Some(file), &options.overrides) {
        Ok(new) => {
            for (name, changed) in [
                ("registry", new.registry != running.registry),
                ("listen", new.listen != running.listen),
                ("admin", new.admin != running.admin),
                (
                    "max_connections",
                    new.max_connections != running.max_connections,
                ),
                (
                    "shutdown_timeout",
                    new.shutdown_timeout != running.shutdown_timeout,
                ),
            ] {
                if changed {
                    tracing::warn!("config reload: {name} changed; it takes effect on restart");
                }
            }
            let services = new.routing.services.len();
            proxy.set_routing(new.routing);
            proxy.subscribe_configured().await;
            metrics.reload(true);
            reloads.record(None);
            tracing::info!(
                "config reloaded from {}: {services} service table(s)",
                file.display()
            );
        }
        Err(e) => {
            metrics.reload(false);
            reloads.record(Some(e.to_string()));
            tracing::error!("config reload failed, keeping the previous config: {e}");
        }
    }
}
