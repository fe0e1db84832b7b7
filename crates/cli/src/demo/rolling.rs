//! `gangway demo`: the main job in one command. A registry (store in a temporary directory),
//! three `demo-service` processes and an open-loop client at 60 req/s; a rolling restart of all
//! three instances with ack-based drain; a closing table of requests and drain waits.

use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use gangway_client::{Client, ClientConfig};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};
use tokio::time::Instant;

use gangway_client::http::{HttpClient, HttpConfig};

use super::client::{run_load, subscribe_ready};
use crate::args::parse_duration;

/// Flags of `gangway demo`.
#[derive(Debug, Args, Clone)]
pub struct DemoArgs {
    /// Number of demo-service instances.
    #[arg(long, default_value_t = 3)]
    pub instances: usize,
    /// Client requests per second (open loop).
    #[arg(long, default_value_t = 60.0)]
    pub rate: f64,
    /// In-flight time of GET /ping.
    #[arg(long, default_value = "200ms", value_parser = parse_duration, value_name = "DURATION")]
    pub delay: Duration,
    /// Time between two instance restarts.
    #[arg(long, default_value = "2500ms", value_parser = parse_duration, value_name = "DURATION")]
    pub step: Duration,
}

/// A demo-service child process.
pub struct ServiceProcess {
    /// Instance name.
    pub name: String,
    /// `ip:port` it serves on.
    pub addr: String,
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl ServiceProcess {
    /// Starts `gangway demo-service` (this executable) and waits for its `ready` line (10 s).
    pub async fn spawn(
        registry: &str,
        service: &str,
        name: &str,
        delay: Duration,
    ) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("cannot find the gangway executable")?;
        let mut child = Command::new(exe)
            .args([
                "demo-service",
                "--registry",
                registry,
                "--service",
                service,
                "--name",
                name,
            ])
            .arg("--delay")
            .arg(format!("{}ms", delay.as_millis()))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .context("cannot start demo-service")?;
        let stdout = child.stdout.take().context("demo-service stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let ready = tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(line) = lines.next_line().await? {
                if let Some(rest) = line.strip_prefix("ready ") {
                    return Ok::<_, std::io::Error>(Some(field(rest, "addr").unwrap_or_default()));
                }
            }
            Ok(None)
        })
        .await;
        let addr = match ready {
            Ok(Ok(Some(addr))) => addr,
            _ => anyhow::bail!("demo-service {name} did not get ready within 10 s"),
        };
        Ok(Self {
            name: name.to_owned(),
            addr,
            child,
            lines,
        })
    }

    /// Process id.
    pub fn pid(&self) -> i32 {
        self.child.id().map(|p| p as i32).unwrap_or(0)
    }

    /// Sends SIGTERM and waits (at most `timeout`) for exit; returns its `drained` line fields.
    pub async fn terminate(mut self, timeout: Duration) -> anyhow::Result<Drained> {
        signal(self.pid(), nix::sys::signal::Signal::SIGTERM)?;
        let mut drained = Drained::default();
        let read = async {
            while let Ok(Some(line)) = self.lines.next_line().await {
                if let Some(rest) = line.strip_prefix("drained ") {
                    drained.waited_ms = field(rest, "waited_ms")
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                    drained.complete = field(rest, "complete").as_deref() == Some("true");
                    drained.acked = field(rest, "acked")
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                }
            }
            self.child.wait().await
        };
        match tokio::time::timeout(timeout, read).await {
            Ok(status) => {
                drained.exited_cleanly = status.map(|s| s.success()).unwrap_or(false);
                Ok(drained)
            }
            Err(_) => {
                let _ = self.child.start_kill();
                anyhow::bail!("demo-service {} did not exit within {timeout:?}", self.name)
            }
        }
    }
}

/// What a drained demo-service reported.
#[derive(Debug, Default, Clone)]
pub struct Drained {
    /// Drain wait, ms.
    pub waited_ms: u64,
    /// Every subscriber acked.
    pub complete: bool,
    /// Subscribers that acked.
    pub acked: usize,
    /// Exit status 0.
    pub exited_cleanly: bool,
}

/// Sends `sig` to process `pid`.
pub fn signal(pid: i32, sig: nix::sys::signal::Signal) -> anyhow::Result<()> {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig)
        .with_context(|| format!("kill -{sig} {pid}"))
}

fn field(line: &str, key: &str) -> Option<String> {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=').map(str::to_owned))
}

/// Runs the demo and prints its closing table.
pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.instances >= 2,
        "--instances must be at least 2 for a lossless rolling restart"
    );
    let data = tempfile::tempdir().context("temporary data directory")?;
    let config = gangway_server::Config {
        warmup: Duration::ZERO,
        ..gangway_server::Config::default()
    };
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let store = gangway_store_redb::RedbStore::open(data.path())?;
    let server = gangway_server::start(config, std::sync::Arc::new(store), http, grpc).await?;
    let registry = server.grpc_addr.to_string();
    println!(
        "registry: http={} grpc={} (store in {})",
        server.http_addr,
        registry,
        data.path().display()
    );

    let names: Vec<String> = (0..args.instances)
        .map(|i| format!("demo-{}", (b'a' + i as u8) as char))
        .collect();
    let mut running = Vec::new();
    for name in &names {
        let p = ServiceProcess::spawn(&registry, "demo", name, args.delay).await?;
        println!("started {} on {}", p.name, p.addr);
        running.push(p);
    }
    let client =
        Client::connect(ClientConfig::new(registry.clone()).with_client_name("demo-client"))
            .await?;
    let subscription = subscribe_ready(&client, "demo", args.instances).await?;
    // No retry and no ejection: the zero below is the drain's alone.
    let config = HttpConfig::default()
        .with_retry(gangway_client::retry::RetryConfig::disabled())
        .with_outlier(None)
        .with_attempt_timeout(Duration::from_secs(1));
    let http = HttpClient::new(client.clone(), config).map_err(|e| anyhow::anyhow!("{e}"))?;

    let duration = args.step * (args.instances as u32 + 1);
    println!(
        "client: {} req/s for {:.1} s; rolling restart every {:.1} s with ack-based drain",
        args.rate,
        duration.as_secs_f64(),
        args.step.as_secs_f64()
    );
    let load = {
        let subscription = subscription.clone();
        let rate = args.rate;
        tokio::spawn(async move {
            run_load(&http, &subscription, rate, duration, |r| {
                println!(
                    "  request #{} failed on {}: {}",
                    r.index,
                    r.instance.as_deref().unwrap_or("-"),
                    r.error.as_deref().unwrap_or("")
                )
            })
            .await
        })
    };

    let start = Instant::now();
    let mut rows = Vec::new();
    for (i, name) in names.iter().enumerate() {
        tokio::time::sleep_until(start + args.step * (i as u32 + 1) - args.step / 2).await;
        let old = running.remove(0);
        let old_addr = old.addr.clone();
        let drained = old.terminate(Duration::from_secs(40)).await?;
        let new = ServiceProcess::spawn(&registry, "demo", name, args.delay).await?;
        println!(
            "+{:.1}s {name}: drained {} in {} ms ({} subscriber(s) acked), restarted on {}",
            start.elapsed().as_secs_f64(),
            old_addr,
            drained.waited_ms,
            drained.acked,
            new.addr
        );
        rows.push((name.clone(), old_addr, new.addr.clone(), drained));
        running.push(new);
    }
    let report = load.await.context("load task")??;
    client.close();
    for p in running {
        let _ = p.terminate(Duration::from_secs(40)).await;
    }
    server.shutdown().await;

    let mut drains = comfy_table::Table::new();
    drains.set_header([
        "instance",
        "old address",
        "new address",
        "drain wait (ms)",
        "acked",
        "complete",
    ]);
    for (name, old, new, d) in &rows {
        drains.add_row([
            name.clone(),
            old.clone(),
            new.clone(),
            d.waited_ms.to_string(),
            d.acked.to_string(),
            d.complete.to_string(),
        ]);
    }
    println!("{drains}");
    let mut totals = comfy_table::Table::new();
    totals.set_header(["requests sent", "ok", "failed", "attempts/request"]);
    totals.add_row([
        report.sent.to_string(),
        report.ok.to_string(),
        report.failed.to_string(),
        format!("{:.2}", report.attempts_per_request),
    ]);
    println!("{totals}");
    if report.failed > 0 {
        anyhow::bail!(
            "{} of {} requests failed during the rolling restart",
            report.failed,
            report.sent
        );
    }
    Ok(())
}
