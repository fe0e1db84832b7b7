//! `gangway bench proxy` (issue 14): what `gangway proxy` adds to a request, beside HAProxy,
//! on the same three `gangway demo-service` instances (GET /ping answered at once).
//!
//! Three paths from the load generator to the instances, measured in the same run:
//! - `direct`: the generator itself spreads requests over the three instances (round robin,
//!   keep-alive pool): the baseline;
//! - `gangway proxy`: the generator uses the proxy as its HTTP proxy (`GET http://bench/ping`
//!   in absolute form), the proxy resolves `bench` through the registry; once with the default
//!   runtime (a worker thread per core) and once with `--threads 1`;
//! - `haproxy`: Debian's `haproxy` with a static three-server round-robin backend, keep-alive
//!   and connection reuse on both sides.
//!
//! Per round: each path at a fixed 1,000 req/s open loop (latency from the intended send time,
//! so no coordinated omission), then each proxy at its maximum throughput (closed loop: `wrk`
//! when installed, else the bench's own closed loop). Added latency is a path's percentile
//! minus the direct path's in the same round; each figure printed is the median over the
//! rounds (3 in the full run, 1 with `--quick`).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::Ctx;
use crate::load::{self, Percentiles};
use crate::report::{Row, Table};
use crate::stats;
use crate::system::{Server, System, free_port};

/// Open-loop rate of the latency phase: 1,000 req/s (issue 14).
pub const LATENCY_RATE: f64 = 1000.0;
/// The service the instances register under.
const SERVICE: &str = "bench";
/// Longest wait for a child process's start-up line: 20 s.
const STARTUP: Duration = Duration::from_secs(20);

const COLUMNS: [&str; 6] = [
    "p50 ms @1k/s",
    "p99 ms @1k/s",
    "added p50 µs",
    "added p99 µs",
    "max req/s",
    "proxy CPU ms/1k req",
];

/// A child process killed (by its handle, so by its PID) when dropped.
struct Proc {
    child: Child,
}

impl Proc {
    fn pid(&self) -> u32 {
        self.child.id().unwrap_or(0)
    }

    /// Spawns `bin args` and waits for a stdout line starting with `prefix`; returns it.
    async fn start(bin: &Path, args: &[&str], prefix: &str) -> anyhow::Result<(Proc, String)> {
        let mut child = Command::new(bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut lines = BufReader::new(child.stdout.take().context("stdout")?).lines();
        let line = tokio::time::timeout(STARTUP, async {
            while let Some(line) = lines.next_line().await? {
                if line.starts_with(prefix) {
                    return Ok::<_, std::io::Error>(Some(line));
                }
            }
            Ok(None)
        })
        .await
        .with_context(|| format!("{} gave no {prefix:?} line in time", bin.display()))??
        .with_context(|| format!("{} exited before {prefix:?}", bin.display()))?;
        // Keep reading so the child never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok((Proc { child }, line))
    }
}

fn field(line: &str, key: &str) -> anyhow::Result<String> {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .map(str::to_owned)
        .with_context(|| format!("no {key}= in {line:?}"))
}

/// Everything one run needs: registry, instances, both proxies.
struct Setup {
    _registry: Server,
    _instances: Vec<Proc>,
    backends: Vec<String>,
    /// `gangway proxy` with one worker thread per core, then with `--threads 1`.
    gangway: Vec<(Proc, String)>,
    haproxy: Option<(Proc, String)>,
    haproxy_note: String,
    _dir: tempfile::TempDir,
}

async fn setup(ctx: &Ctx) -> anyhow::Result<Setup> {
    let gangway_bin = &ctx.bins.gangway;
    let registry = Server::start(System::Gangway, &ctx.bins).await?;
    let grpc = registry.grpc.to_string();
    let mut instances = Vec::new();
    let mut backends = Vec::new();
    for name in ["a", "b", "c"] {
        let (p, line) = Proc::start(
            gangway_bin,
            &[
                "demo-service",
                "--registry",
                &grpc,
                "--service",
                SERVICE,
                "--name",
                name,
                "--delay",
                "0ms",
            ],
            "ready ",
        )
        .await?;
        backends.push(field(&line, "addr")?);
        instances.push(p);
    }
    let mut gangway = Vec::new();
    for threads in [None, Some("1")] {
        let listen = format!("127.0.0.1:{}", free_port()?);
        let mut args = vec![
            "proxy",
            "--registry",
            &grpc,
            "--listen",
            &listen,
            "--admin",
            "off",
            "--log",
            "warn",
        ];
        if let Some(n) = threads {
            args.extend(["--threads", n]);
        }
        let (proc, line) = Proc::start(gangway_bin, &args, "gangway proxy").await?;
        gangway.push((proc, field(&line, "listen")?));
    }
    let dir = tempfile::Builder::new()
        .prefix("gangway-bench-proxy-")
        .tempdir()?;
    let (haproxy, haproxy_note) = match start_haproxy(dir.path(), &backends).await {
        Ok(h) => (Some(h), String::new()),
        Err(e) => (None, format!("{e:#}")),
    };
    Ok(Setup {
        _registry: registry,
        _instances: instances,
        backends,
        gangway,
        haproxy,
        haproxy_note,
        _dir: dir,
    })
}

/// HAProxy in the foreground with a static round-robin backend of the three instances;
/// returns once its port accepts connections.
async fn start_haproxy(dir: &Path, backends: &[String]) -> anyhow::Result<(Proc, String)> {
    let bin = which("haproxy").context("haproxy is not installed (apt-get install haproxy)")?;
    let addr = format!("127.0.0.1:{}", free_port()?);
    let servers: String = backends
        .iter()
        .enumerate()
        .map(|(i, b)| format!("  server s{i} {b}\n"))
        .collect();
    // Keep-alive on both sides and connections reused across clients: its fastest setup.
    let config = format!(
        "global\n  maxconn 4096\ndefaults\n  mode http\n  timeout connect 1s\n  timeout client 30s\n  \
         timeout server 30s\n  option http-keep-alive\n  http-reuse always\nfrontend fe\n  \
         bind {addr}\n  default_backend be\nbackend be\n  balance roundrobin\n{servers}"
    );
    let path = dir.join("haproxy.cfg");
    std::fs::write(&path, config)?;
    let child = Command::new(&bin)
        .arg("-db")
        .arg("-f")
        .arg(&path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("starting haproxy")?;
    let deadline = tokio::time::Instant::now() + STARTUP;
    while tokio::net::TcpStream::connect(&addr).await.is_err() {
        if tokio::time::Instant::now() > deadline {
            bail!("haproxy did not listen on {addr} within {STARTUP:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok((Proc { child }, addr))
}

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

#[derive(Clone, Copy, PartialEq)]
enum Path3 {
    Direct,
    /// The n-th of [`Setup::gangway`].
    Gangway(usize),
    Haproxy,
}

/// One keep-alive client and URL rotation for a path.
#[derive(Clone)]
struct Target {
    client: reqwest::Client,
    urls: Arc<Vec<String>>,
    next: Arc<AtomicUsize>,
}

impl Target {
    fn new(path: Path3, s: &Setup) -> anyhow::Result<Target> {
        let builder = reqwest::Client::builder()
            .pool_max_idle_per_host(1024)
            .timeout(Duration::from_secs(10));
        let (client, urls) = match path {
            Path3::Direct => (
                builder.no_proxy().build()?,
                s.backends
                    .iter()
                    .map(|b| format!("http://{b}/ping"))
                    .collect(),
            ),
            Path3::Gangway(n) => (
                builder
                    .proxy(reqwest::Proxy::http(format!("http://{}", s.gangway[n].1))?)
                    .build()?,
                vec![format!("http://{SERVICE}/ping")],
            ),
            Path3::Haproxy => {
                let (_, addr) = s.haproxy.as_ref().context("no haproxy")?;
                (
                    builder.no_proxy().build()?,
                    vec![format!("http://{addr}/ping")],
                )
            }
        };
        Ok(Target {
            client,
            urls: Arc::new(urls),
            next: Arc::default(),
        })
    }

    async fn send(&self) -> anyhow::Result<()> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        let url = &self.urls[i % self.urls.len()];
        let r = self.client.get(url).send().await?;
        if !r.status().is_success() {
            bail!("HTTP {}", r.status());
        }
        r.bytes().await?;
        Ok(())
    }
}

/// Latency of `target` at [`LATENCY_RATE`] for `duration` (after a short warm-up).
async fn latency(target: &Target, duration: Duration, label: &str) -> anyhow::Result<Percentiles> {
    for _ in 0..200 {
        target.send().await?;
    }
    let t = target.clone();
    let out = load::open_loop(LATENCY_RATE, duration, 2000, label, move |_| {
        let t = t.clone();
        async move { t.send().await }
    })
    .await;
    if out.errors > 0 {
        bail!(
            "{} of {} failed: {}",
            out.errors,
            out.errors + out.ok,
            out.first_error.unwrap_or_default()
        );
    }
    Ok(Percentiles::of(&out.latency))
}

/// Maximum throughput through `addr` (`host` header for the proxy's Host form), and the CPU
/// the proxy process `pid` used per 1,000 requests.
async fn throughput(
    addr: &str,
    host: Option<&str>,
    pid: u32,
    connections: usize,
    duration: Duration,
    target: &Target,
) -> anyhow::Result<(f64, f64, &'static str)> {
    let cpu_before = stats::cpu_time(pid).unwrap_or_default();
    let (rate, tool) = match which("wrk") {
        Some(wrk) => {
            let mut cmd = Command::new(wrk);
            cmd.args(["-t", "2", "-c", &connections.to_string(), "-d"])
                .arg(format!("{}s", duration.as_secs_f64().max(1.0).round()))
                .arg(format!("http://{addr}/ping"));
            if let Some(h) = host {
                cmd.args(["-H", &format!("Host: {h}")]);
            }
            let out = cmd.stdin(Stdio::null()).kill_on_drop(true).output().await?;
            let text = String::from_utf8_lossy(&out.stdout);
            if text.contains("Non-2xx") || text.contains("Socket errors") {
                bail!("wrk saw errors: {}", text.replace('\n', " "));
            }
            let rate = text
                .lines()
                .find_map(|l| l.strip_prefix("Requests/sec:"))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .with_context(|| format!("no Requests/sec in wrk's output: {text}"))?;
            (rate, "wrk")
        }
        None => {
            let t = target.clone();
            let out = load::closed_loop(connections, duration, "throughput", move |_, _| {
                let t = t.clone();
                async move { t.send().await }
            })
            .await;
            (out.rate(), "the bench's closed loop")
        }
    };
    let cpu = stats::cpu_time(pid)
        .unwrap_or_default()
        .saturating_sub(cpu_before);
    let requests = rate * duration.as_secs_f64().max(1.0).round();
    Ok((rate, cpu.as_secs_f64() * 1000.0 / (requests / 1000.0), tool))
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

/// Runs the workload; rows `direct`, `gangway proxy`, `haproxy`.
pub async fn run(ctx: &Ctx) -> Table {
    let p = &ctx.params;
    let rounds = if p.duration < Duration::from_secs(5) {
        1
    } else {
        3
    };
    let latency_for = p.open_duration.max(Duration::from_millis(500));
    let mut table = Table {
        workload: "proxy".into(),
        title: format!(
            "GET /ping on 3 demo-service instances: {LATENCY_RATE} req/s open loop for {latency_for:?}, then max throughput \
             ({} connections for {:?}); median of {rounds} round(s)",
            p.concurrency, p.duration
        ),
        columns: COLUMNS.iter().map(|c| (*c).to_owned()).collect(),
        key: 4,
        higher_is_better: true,
        rows: Vec::new(),
        notes: vec![
            "system: the registry (gangway in every row); driver: the path from the load generator to the instances.".into(),
            "added µs: the row's percentile minus direct's in the same round; direct has no proxy, so no throughput row.".into(),
        ],
    };
    let setup = match setup(ctx).await {
        Ok(s) => s,
        Err(e) => {
            for d in [
                "direct",
                "gangway proxy",
                "gangway proxy --threads 1",
                "haproxy",
            ] {
                table.rows.push(Row::failed(
                    System::Gangway,
                    d,
                    "",
                    COLUMNS.len(),
                    format!("{e:#}"),
                ));
            }
            return table;
        }
    };
    let paths: Vec<(Path3, &str)> = [
        (Path3::Direct, "direct"),
        (Path3::Gangway(0), "gangway proxy"),
        (Path3::Gangway(1), "gangway proxy --threads 1"),
        (Path3::Haproxy, "haproxy"),
    ]
    .into_iter()
    .filter(|(path, _)| *path != Path3::Haproxy || setup.haproxy.is_some())
    .collect();
    // Per path: [p50, p99, added p50, added p99, max req/s, CPU] over the rounds.
    let mut samples: Vec<Vec<Vec<f64>>> = vec![vec![Vec::new(); COLUMNS.len()]; paths.len()];
    let mut errors: Vec<String> = vec![String::new(); paths.len()];
    let mut tool = "";
    for round in 0..rounds {
        eprintln!("-- proxy: round {} of {rounds}", round + 1);
        let mut base: Option<Percentiles> = None;
        for (i, (path, name)) in paths.iter().enumerate() {
            let measured = match Target::new(*path, &setup) {
                Ok(t) => latency(&t, latency_for, name).await,
                Err(e) => Err(e),
            };
            match measured {
                Ok(pc) => {
                    samples[i][0].push(pc.p50_ms);
                    samples[i][1].push(pc.p99_ms);
                    if *path == Path3::Direct {
                        base = Some(pc);
                    } else if let Some(b) = base {
                        samples[i][2].push((pc.p50_ms - b.p50_ms) * 1000.0);
                        samples[i][3].push((pc.p99_ms - b.p99_ms) * 1000.0);
                    }
                }
                Err(e) => errors[i] = format!("latency: {e:#}"),
            }
        }
        for (i, (path, _)) in paths.iter().enumerate() {
            let (addr, host, pid) = match path {
                Path3::Direct => continue,
                Path3::Gangway(n) => (
                    setup.gangway[*n].1.clone(),
                    Some(SERVICE),
                    setup.gangway[*n].0.pid(),
                ),
                Path3::Haproxy => match &setup.haproxy {
                    Some((proc, addr)) => (addr.clone(), None, proc.pid()),
                    None => continue,
                },
            };
            let measured = match Target::new(*path, &setup) {
                Ok(t) => throughput(&addr, host, pid, p.concurrency, p.duration, &t).await,
                Err(e) => Err(e),
            };
            match measured {
                Ok((rate, cpu, used)) => {
                    samples[i][4].push(rate);
                    samples[i][5].push(cpu);
                    tool = used;
                }
                Err(e) => errors[i] = format!("throughput: {e:#}"),
            }
        }
    }
    for (i, (_, name)) in paths.iter().enumerate() {
        table.rows.push(Row {
            system: System::Gangway,
            driver: (*name).to_owned(),
            group: String::new(),
            values: samples[i].iter().map(|s| median(s.clone())).collect(),
            cpu: None,
            note: errors[i].clone(),
            cluster_vs_single: None,
        });
    }
    if setup.haproxy.is_none() {
        table.rows.push(Row::failed(
            System::Gangway,
            "haproxy",
            "",
            COLUMNS.len(),
            &setup.haproxy_note,
        ));
    }
    if !tool.is_empty() {
        table
            .notes
            .push(format!("max req/s: {tool}, {} connections, 2 threads; the generator, the proxy and the instances share the machine.", p.concurrency));
    }
    table
}
