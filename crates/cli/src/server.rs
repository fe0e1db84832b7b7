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
    #[arg(long, default_value = "1s", value_parser = parse_duration, value_name = "DURATION")]
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
    #[arg(long, default_value = "1s", value_parser = parse_duration, value_name = "DURATION")]
    pub resend_interval: Duration,
    /// A jump of the registry's own clock by more than this between two ticks (200 ms apart)
    /// is its own stall (SIGSTOP, VM pause): leases are extended and expiry waits.
    #[arg(long, default_value = "2s", value_parser = parse_duration, value_name = "DURATION")]
    pub stall_threshold: Duration,
    /// After such a stall, hold back snapshots and expiry this long while sessions reconnect.
    #[arg(long, default_value = "5s", value_parser = parse_duration, value_name = "DURATION")]
    pub stall_recovery: Duration,
    /// On SIGTERM/SIGINT, stop within this: sessions are told to go away, watches and Nacos
    /// streams end, connections close; what still runs then is dropped.
    #[arg(long, default_value = "5s", value_parser = parse_duration, value_name = "DURATION")]
    pub shutdown_timeout: Duration,
    /// HTTP: a request head must arrive within this (from its first byte; from the accept for a
    /// connection's first request), or the connection is closed (slowloris); a request body
    /// may not stall for longer either.
    #[arg(long, default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    pub http_header_timeout: Duration,
    /// HTTP: a keep-alive connection with nothing in flight is closed after this.
    #[arg(long, default_value = "75s", value_parser = parse_duration, value_name = "DURATION")]
    pub http_idle_timeout: Duration,
    /// HTTP: most open connections; more get 503 `overloaded`. `auto`: from the open-file
    /// limit (three quarters of it shared by both ports, at most 10000 each).
    #[arg(long, default_value = "auto", value_parser = parse_max_connections, value_name = "N|auto")]
    pub http_max_connections: MaxConnections,
    /// gRPC: a connection must send the HTTP/2 preface within this of its accept.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    pub grpc_handshake_timeout: Duration,
    /// gRPC: most open connections; more get status UNAVAILABLE. `auto` as for HTTP.
    #[arg(long, default_value = "auto", value_parser = parse_max_connections, value_name = "N|auto")]
    pub grpc_max_connections: MaxConnections,
    /// Log filter (tracing EnvFilter syntax), e.g. `info` or `gangway_server=debug`.
    #[arg(long, default_value = "info", value_name = "FILTER", value_parser = parse_log_filter)]
    pub log: String,
}

/// A maximum connection count: a number, or derived from the open-file limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxConnections {
    /// Derived from `RLIMIT_NOFILE` by the server.
    Auto,
    /// This many.
    Count(usize),
}

impl MaxConnections {
    fn get(self) -> Option<usize> {
        match self {
            MaxConnections::Auto => None,
            MaxConnections::Count(n) => Some(n),
        }
    }
}

/// `auto` or a count of 1-1000000.
fn parse_max_connections(s: &str) -> Result<MaxConnections, String> {
    if s == "auto" {
        return Ok(MaxConnections::Auto);
    }
    match s.parse::<usize>() {
        Ok(n) if (1..=1_000_000).contains(&n) => Ok(MaxConnections::Count(n)),
        _ => Err(format!("must be auto or 1-1000000, got {s:?}")),
    }
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
            (
                "--shutdown-timeout",
                self.shutdown_timeout,
                ms(100),
                Duration::from_secs(600),
            ),
            (
                "--http-header-timeout",
                self.http_header_timeout,
                ms(100),
                hour,
            ),
            ("--http-idle-timeout", self.http_idle_timeout, ms(100), hour),
            (
                "--grpc-handshake-timeout",
                self.grpc_handshake_timeout,
                ms(100),
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
            shutdown_timeout: self.shutdown_timeout,
            connections: config::Connections {
                http_header_timeout: self.http_header_timeout,
                http_idle_timeout: self.http_idle_timeout,
                http_max: self.http_max_connections.get(),
                grpc_handshake_timeout: self.grpc_handshake_timeout,
                grpc_max: self.grpc_max_connections.get(),
            },
        })
    }
}

/// Runs the registry until SIGINT/SIGTERM, then stops within `--shutdown-timeout`.
pub async fn run(args: ServerArgs) -> anyhow::Result<()> {
    let config = args.config()?;
    // Handlers first, so that a signal sent right after the start-up line is never lost.
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot listen for SIGINT")?;
    // Every connection holds a descriptor: take what the hard limit allows.
    let fd_limit = gangway_server::serve::raise_fd_limit()
        .map(|n| n.to_string())
        .unwrap_or_else(|e| format!("unknown ({e})"));
    let server = gangway_server::start(config.clone()).await?;
    let (http_max, grpc_max) = server.max_connections;
    println!(
        "gangway server {} listening: http={} grpc={} data-dir={} warm-up={} \
         max-connections={http_max}/{grpc_max} fd-limit={fd_limit}",
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
    let report = server.shutdown().await;
    let dropped = report.http.dropped + report.grpc.dropped;
    println!(
        "gangway server stopped in {} ms: {} connections closed, {dropped} dropped at the \
         {} timeout; store {}",
        report.elapsed.as_millis(),
        report.http.closed + report.grpc.closed,
        format_duration(config.shutdown_timeout),
        if report.engine.store_released {
            "released"
        } else {
            "released when its last write ends"
        },
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::Parser;
    use gangway_server::config;

    use super::ServerArgs;

    #[derive(Parser)]
    struct Args {
        #[command(flatten)]
        server: ServerArgs,
    }

    fn parse(args: &[&str]) -> Result<ServerArgs, clap::Error> {
        Args::try_parse_from(std::iter::once("server").chain(args.iter().copied()))
            .map(|a| a.server)
    }

    #[test]
    fn stop_and_connection_flags_default_to_the_documented_constants() {
        let c = parse(&[]).unwrap().config().unwrap();
        assert_eq!(c.shutdown_timeout, config::DEFAULT_SHUTDOWN_TIMEOUT);
        assert_eq!(c.connections, config::Connections::default());
        assert_eq!(c.connections.http_header_timeout, Duration::from_secs(30));
        assert_eq!(c.connections.http_idle_timeout, Duration::from_secs(75));
        assert_eq!(
            c.connections.grpc_handshake_timeout,
            Duration::from_secs(10)
        );
        assert_eq!(c.connections.http_max, None, "auto");
    }

    #[test]
    fn connection_flags_are_read_and_checked() {
        let c = parse(&[
            "--shutdown-timeout",
            "2s",
            "--http-header-timeout",
            "5s",
            "--http-idle-timeout",
            "1m",
            "--http-max-connections",
            "100",
            "--grpc-max-connections",
            "auto",
            "--grpc-handshake-timeout",
            "500ms",
        ])
        .unwrap()
        .config()
        .unwrap();
        assert_eq!(c.shutdown_timeout, Duration::from_secs(2));
        assert_eq!(c.connections.http_header_timeout, Duration::from_secs(5));
        assert_eq!(c.connections.http_idle_timeout, Duration::from_secs(60));
        assert_eq!(c.connections.http_max, Some(100));
        assert_eq!(c.connections.grpc_max, None);
        assert_eq!(
            c.connections.grpc_handshake_timeout,
            Duration::from_millis(500)
        );

        for bad in ["0", "lots", "1000001", "1.5"] {
            let e = parse(&["--http-max-connections", bad])
                .expect_err(bad)
                .to_string();
            assert!(
                e.contains("--http-max-connections") && e.contains("must be auto or 1-1000000"),
                "{bad}: {e}"
            );
        }
        let e = parse(&["--shutdown-timeout", "0s", "--http-idle-timeout", "2h"])
            .unwrap()
            .config()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--shutdown-timeout must be 100ms-10m, got 0ms"),
            "{e}"
        );
        assert!(
            e.contains("--http-idle-timeout must be 100ms-60m, got 120m"),
            "{e}"
        );
    }
}
