//! `gangway server`: run the registry until SIGINT or SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use gangway_core::validate::{MAX_LEASE, MIN_LEASE};
use gangway_server::config::{self, Config, Liveness};

use crate::args::{format_duration, parse_duration};
use crate::error::CliError;

/// Flags of `gangway server`. Durations take `500ms`, `3s`, `2m` (a bare number is seconds).
#[derive(Debug, Args)]
pub struct ServerArgs {
    /// REST address (the Nacos HTTP port by default).
    #[arg(long, default_value = config::DEFAULT_HTTP, value_name = "ADDR")]
    pub http: SocketAddr,
    /// gRPC address for sessions (HTTP port + 1000, as Nacos).
    #[arg(long, default_value = config::DEFAULT_GRPC, value_name = "ADDR")]
    pub grpc: SocketAddr,
    /// Directory of the embedded store (persistent instances, settings, offline marks).
    #[arg(long, default_value = "./gangway-data", value_name = "DIR")]
    pub data_dir: PathBuf,
    /// HTTP/2 keepalive ping interval on sessions.
    #[arg(long, default_value = "2s", value_parser = parse_duration, value_name = "DURATION")]
    pub keepalive_interval: Duration,
    /// A session whose peer does not answer a ping within this ends (frozen client).
    #[arg(long, default_value = "3s", value_parser = parse_duration, value_name = "DURATION")]
    pub keepalive_timeout: Duration,
    /// Lease TTL: a heartbeat-kept instance is unhealthy after this long without a heartbeat.
    #[arg(long, default_value = "15s", value_parser = parse_duration, value_name = "DURATION")]
    pub lease_ttl: Duration,
    /// Lease delete timeout: removed after this long without a heartbeat.
    #[arg(long, default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    pub lease_delete_timeout: Duration,
    /// After start, hold back snapshots this long while sessions re-register.
    #[arg(long, default_value = "5s", value_parser = parse_duration, value_name = "DURATION")]
    pub warmup: Duration,
    /// Forget an offline mark once its instance has been gone this long.
    #[arg(long, default_value = "10m", value_parser = parse_duration, value_name = "DURATION")]
    pub offline_mark_expiry: Duration,
    /// Re-send an unacked push after this long.
    #[arg(long, default_value = "2s", value_parser = parse_duration, value_name = "DURATION")]
    pub resend_interval: Duration,
    /// A jump of the registry's own clock by more than this between two ticks (200 ms apart)
    /// is its own stall (SIGSTOP, VM pause): leases are extended and expiry waits.
    #[arg(long, default_value = "2s", value_parser = parse_duration, value_name = "DURATION")]
    pub stall_threshold: Duration,
    /// After such a stall, hold back snapshots and expiry this long while sessions reconnect.
    #[arg(long, default_value = "5s", value_parser = parse_duration, value_name = "DURATION")]
    pub stall_recovery: Duration,
    /// Log filter (tracing EnvFilter syntax), e.g. `info` or `gangway_server=debug`.
    #[arg(long, default_value = "info", value_name = "FILTER", value_parser = parse_log_filter)]
    pub log: String,
}

/// Checks a `--log` filter (tracing `EnvFilter` syntax): a typo fails here rather than silently
/// logging nothing.
fn parse_log_filter(s: &str) -> Result<String, String> {
    tracing_subscriber::EnvFilter::builder()
        .parse(s)
        .map_err(|e| format!("not a log filter ({e}); e.g. info, warn, gangway_server=debug"))?;
    Ok(s.to_owned())
}

impl ServerArgs {
    /// The server configuration these flags describe.
    ///
    /// Errors (a [`CliError::Usage`], exit status 2 like every bad argument): a flag out of its
    /// range (leases: the per-instance bounds of `gangway_core::validate`, 100 ms-24 h); a lease
    /// delete timeout below the TTL. Every problem is named, in one message.
    pub fn config(&self) -> Result<Config, CliError> {
        let mut problems = Vec::new();
        let ms = Duration::from_millis;
        let hour = Duration::from_secs(3600);
        for (flag, value, min, max) in [
            (
                "--keepalive-interval",
                self.keepalive_interval,
                ms(100),
                hour,
            ),
            ("--keepalive-timeout", self.keepalive_timeout, ms(100), hour),
            ("--lease-ttl", self.lease_ttl, MIN_LEASE, MAX_LEASE),
            (
                "--lease-delete-timeout",
                self.lease_delete_timeout,
                MIN_LEASE,
                MAX_LEASE,
            ),
            ("--warmup", self.warmup, Duration::ZERO, hour),
            (
                "--offline-mark-expiry",
                self.offline_mark_expiry,
                Duration::from_secs(1),
                30 * 24 * hour,
            ),
            (
                "--resend-interval",
                self.resend_interval,
                ms(10),
                Duration::from_secs(60),
            ),
            ("--stall-threshold", self.stall_threshold, ms(400), hour),
            (
                "--stall-recovery",
                self.stall_recovery,
                Duration::ZERO,
                hour,
            ),
        ] {
            if value < min || value > max {
                problems.push((
                    flag,
                    format!(
                        "{flag} must be {}-{}, got {}",
                        format_duration(min),
                        format_duration(max),
                        format_duration(value)
                    ),
                ));
            }
        }
        if self.lease_delete_timeout < self.lease_ttl {
            problems.push((
                "--lease-delete-timeout",
                format!(
                    "--lease-delete-timeout ({}) must be at least --lease-ttl ({})",
                    format_duration(self.lease_delete_timeout),
                    format_duration(self.lease_ttl)
                ),
            ));
        }
        if let Some((flag, _)) = problems.first() {
            let message: Vec<&str> = problems.iter().map(|(_, m)| m.as_str()).collect();
            return Err(CliError::usage(flag, message.join("; ")));
        }
        Ok(Config {
            http: self.http,
            grpc: self.grpc,
            data_dir: Some(self.data_dir.clone()),
            liveness: Liveness {
                keepalive_interval: self.keepalive_interval,
                keepalive_timeout: self.keepalive_timeout,
                lease_ttl: self.lease_ttl,
                lease_delete_timeout: self.lease_delete_timeout,
            },
            warmup: self.warmup,
            offline_mark_expiry: self.offline_mark_expiry,
            resend_interval: self.resend_interval,
            poller_expiry: config::DEFAULT_POLLER_EXPIRY,
            stall_threshold: self.stall_threshold,
            stall_recovery: self.stall_recovery,
            full_push_interval: config::DEFAULT_FULL_PUSH_INTERVAL,
            delta_push_interval: config::DEFAULT_DELTA_PUSH_INTERVAL,
        })
    }
}

/// Runs the registry until SIGINT/SIGTERM, then stops cleanly.
pub async fn run(args: ServerArgs) -> anyhow::Result<()> {
    let config = args.config()?;
    // Handlers first, so that a signal sent right after the start-up line is never lost.
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot listen for SIGINT")?;
    let server = gangway_server::start(config.clone()).await?;
    println!(
        "gangway server {} listening: http={} grpc={} data-dir={} warm-up={}",
        env!("CARGO_PKG_VERSION"),
        server.http_addr,
        server.grpc_addr,
        args.data_dir.display(),
        format_duration(config.warmup),
    );
    tokio::select! {
        _ = int.recv() => tracing::info!("SIGINT: stopping"),
        _ = term.recv() => tracing::info!("SIGTERM: stopping"),
    }
    server.shutdown().await;
    println!("gangway server stopped");
    Ok(())
}
