//! The systems under test and their server processes: each is started on free loopback ports with
//! a temporary data directory, waited on until it answers, measured through `/proc`, and stopped
//! (SIGTERM, then SIGKILL) afterwards. Dropping a [`Server`] kills its process too.
//!
//! `gangway-cluster` is several processes behind one [`Server`]: [`CLUSTER_NODES`] etcd members
//! and as many `gangway server --store etcd` nodes on them, each one a [`Server`] of its own
//! (the same start, stop and kill), held by the first node ([`Server::node`]).

use std::fmt;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::Stdio;
use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::Serialize;
use tokio::process::{Child, Command};

use crate::stats;

/// A registry the bench can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum System {
    /// This project's `gangway server`.
    Gangway,
    /// rnacos, a Nacos server in Rust (`cargo install rnacos`).
    Rnacos,
    /// etcd 3.4 (Debian's `etcd-server`), used the usual way: lease per instance, prefix watch.
    Etcd,
    /// [`CLUSTER_NODES`] `gangway server --store etcd` nodes on as many etcd members (issue 11):
    /// the rows of gangway's drivers that spread their clients over the nodes. Only run when
    /// `--peers` names it (not in the default lineup).
    #[serde(rename = "gangway-cluster")]
    GangwayCluster,
}

/// Nodes of the `gangway-cluster` system: 3 gangway nodes on 3 etcd members.
pub const CLUSTER_NODES: usize = 3;

/// How long a new cluster may take until every gangway node lists all nodes in
/// `GET /v1/cluster`: 30 s.
const CLUSTER_JOIN_DEADLINE: Duration = Duration::from_secs(30);

impl System {
    /// Every system, gangway first.
    pub const ALL: [System; 4] = [
        System::Gangway,
        System::Rnacos,
        System::Etcd,
        System::GangwayCluster,
    ];

    /// The lowercase name used in `--peers` and in tables.
    pub fn name(self) -> &'static str {
        match self {
            System::Gangway => "gangway",
            System::Rnacos => "rnacos",
            System::Etcd => "etcd",
            System::GangwayCluster => "gangway-cluster",
        }
    }

    /// Whether this is gangway, alone or as a cluster (rows the peers' ratios never use as
    /// their base, and that get no `gangway ×` of their own).
    pub fn is_gangway(self) -> bool {
        matches!(self, System::Gangway | System::GangwayCluster)
    }
}

impl fmt::Display for System {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for System {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "gangway" => Ok(System::Gangway),
            "rnacos" => Ok(System::Rnacos),
            "etcd" => Ok(System::Etcd),
            "gangway-cluster" => Ok(System::GangwayCluster),
            other => Err(format!(
                "unknown system {other:?}: gangway, rnacos, etcd or gangway-cluster"
            )),
        }
    }
}

/// Where the server binaries are.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// The `gangway` binary (by default the running one).
    pub gangway: PathBuf,
    /// `rnacos` (PATH, then `~/.cargo/bin`).
    pub rnacos: PathBuf,
    /// `etcd`.
    pub etcd: PathBuf,
}

impl Binaries {
    /// The binary for `system`, or `None` when it cannot be found (`gangway-cluster`: the
    /// gangway binary, when etcd's is found too).
    pub fn find(&self, system: System) -> Option<PathBuf> {
        let p = match system {
            System::Gangway => &self.gangway,
            System::Rnacos => &self.rnacos,
            System::Etcd => &self.etcd,
            System::GangwayCluster => {
                resolve(&self.etcd)?;
                &self.gangway
            }
        };
        resolve(p)
    }

    /// The version string a binary reports, best effort (`gangway-cluster`: gangway's and
    /// etcd's).
    pub fn version(&self, system: System) -> String {
        if system == System::GangwayCluster {
            return format!(
                "{} on {}",
                self.version(System::Gangway),
                self.version(System::Etcd)
            );
        }
        let Some(bin) = self.find(system) else {
            return "not installed".into();
        };
        let arg = if system == System::Etcd {
            "--version"
        } else {
            "-V"
        };
        let out = std::process::Command::new(bin)
            .arg(arg)
            .stdin(Stdio::null())
            .output();
        match out {
            Ok(o) => String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_owned(),
            Err(_) => String::new(),
        }
    }
}

fn resolve(p: &std::path::Path) -> Option<PathBuf> {
    if p.components().count() > 1 {
        return p.is_file().then(|| p.to_owned());
    }
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|v| std::env::split_paths(&v).collect())
        .unwrap_or_default();
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(PathBuf::from(home).join(".cargo/bin"));
    }
    dirs.into_iter().map(|d| d.join(p)).find(|c| c.is_file())
}

/// A running server of one system.
#[derive(Debug)]
pub struct Server {
    /// Which system.
    pub system: System,
    /// HTTP address (gangway REST + Nacos v1, rnacos Nacos v1, etcd client URL + JSON gateway).
    pub http: SocketAddr,
    /// gRPC address (gangway sessions + Nacos v2, rnacos Nacos v2); etcd: same as `http`.
    pub grpc: SocketAddr,
    /// rnacos's console port, etcd's peer port; unused for gangway.
    aux_port: u16,
    bin: PathBuf,
    child: Option<Child>,
    dir: tempfile::TempDir,
    log: PathBuf,
    /// What this process is in a cluster.
    role: Role,
    /// Every node's addresses, this server's first: one entry unless it is a cluster.
    nodes: Vec<Node>,
    /// A cluster's other processes: its other gangway nodes, then its etcd members.
    members: Vec<Server>,
}

/// The addresses of one node of a system (the server itself, unless it is a cluster).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Node {
    /// HTTP address, as [`Server::http`].
    pub http: SocketAddr,
    /// gRPC address, as [`Server::grpc`].
    pub grpc: SocketAddr,
}

/// What one process is in a `gangway-cluster`.
#[derive(Debug, Clone)]
enum Role {
    /// A server of its own.
    Alone,
    /// etcd member `name` of the cluster `initial_cluster` (`name=peer URL`, comma-separated).
    EtcdMember {
        name: String,
        initial_cluster: String,
    },
    /// gangway node `name` on the etcd client URLs `endpoints` (comma-separated).
    GangwayNode { name: String, endpoints: String },
}

/// A free loopback port (bound, then released; the server binds it right after).
pub fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

impl Server {
    /// Starts `system` on fresh loopback ports with an empty data directory and waits until its
    /// HTTP port answers (at most 30 s).
    ///
    /// `gangway-cluster`: [`CLUSTER_NODES`] etcd members forming one new cluster (etcd's
    /// default Raft timings), then as many `gangway server --store etcd` nodes on every
    /// member's client URL (names `node-1`, ...; the default prefix and lease TTL), ready once
    /// each node answers health and lists every node in `GET /v1/cluster` (at most 30 s). The
    /// returned server is `node-1`; it holds the other processes, stopped and killed with it.
    ///
    /// # Errors
    /// Not installed (for a cluster: gangway or etcd), a process that does not start or answer
    /// in time (with its log's tail), a cluster that does not form; what was started is killed.
    pub async fn start(system: System, bins: &Binaries) -> anyhow::Result<Server> {
        if system == System::GangwayCluster {
            return Server::start_cluster(bins).await;
        }
        let mut server = Server::prepare(system, bins)?;
        server.spawn()?;
        server.wait_ready().await?;
        Ok(server)
    }

    /// A server of `system` on fresh ports and a fresh temporary directory, not started.
    fn prepare(system: System, bins: &Binaries) -> anyhow::Result<Server> {
        let bin = bins
            .find(system)
            .with_context(|| format!("{system} is not installed (see docs/benchmarks.md)"))?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("gangway-bench-{system}-"))
            .tempdir()?;
        let http = loopback(free_port()?);
        // etcd serves its gateway on the client URL.
        let grpc = match system {
            System::Etcd => http,
            System::Gangway | System::Rnacos | System::GangwayCluster => loopback(free_port()?),
        };
        Ok(Server {
            system,
            http,
            grpc,
            aux_port: free_port()?,
            bin,
            log: dir.path().join("server.log"),
            dir,
            child: None,
            role: Role::Alone,
            nodes: vec![Node { http, grpc }],
            members: Vec::new(),
        })
    }

    /// Starts `gangway-cluster` as [`Server::start`] says, the join bounded by
    /// [`CLUSTER_JOIN_DEADLINE`].
    async fn start_cluster(bins: &Binaries) -> anyhow::Result<Server> {
        bins.find(System::GangwayCluster)
            .context("gangway-cluster needs gangway and etcd; etcd is not installed")?;
        let mut etcd = (0..CLUSTER_NODES)
            .map(|_| Server::prepare(System::Etcd, bins))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let initial_cluster = etcd
            .iter()
            .enumerate()
            .map(|(i, m)| format!("m{i}=http://127.0.0.1:{}", m.aux_port))
            .collect::<Vec<_>>()
            .join(",");
        for (i, m) in etcd.iter_mut().enumerate() {
            m.role = Role::EtcdMember {
                name: format!("m{i}"),
                initial_cluster: initial_cluster.clone(),
            };
        }
        // A member of a new cluster answers health only once a quorum is up: spawn all first.
        start_all(&mut etcd).await?;
        let endpoints = etcd
            .iter()
            .map(|m| format!("http://{}", m.http))
            .collect::<Vec<_>>()
            .join(",");
        let mut nodes = (0..CLUSTER_NODES)
            .map(|i| {
                let mut n = Server::prepare(System::Gangway, bins)?;
                n.role = Role::GangwayNode {
                    name: format!("node-{}", i + 1),
                    endpoints: endpoints.clone(),
                };
                Ok(n)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        start_all(&mut nodes).await?;
        let mut first = nodes.remove(0);
        first.system = System::GangwayCluster;
        first.nodes.extend(nodes.iter().map(|n| n.nodes[0]));
        first.members = nodes;
        first.members.extend(etcd);
        first.wait_joined().await?;
        Ok(first)
    }

    /// Waits until every node of a cluster lists all of them in `GET /v1/cluster`.
    async fn wait_joined(&self) -> anyhow::Result<()> {
        let client = reqwest::Client::new();
        let deadline = Instant::now() + CLUSTER_JOIN_DEADLINE;
        for node in &self.nodes {
            let url = format!("http://{}/v1/cluster", node.http);
            loop {
                let listed = match client
                    .get(&url)
                    .timeout(Duration::from_secs(1))
                    .send()
                    .await
                {
                    Ok(r) => r
                        .json::<serde_json::Value>()
                        .await
                        .ok()
                        .and_then(|v| v["nodes"].as_array().map(Vec::len))
                        .unwrap_or(0),
                    Err(_) => 0,
                };
                if listed >= self.nodes.len() {
                    break;
                }
                if Instant::now() > deadline {
                    bail!(
                        "{url} listed {listed} of {} nodes within {CLUSTER_JOIN_DEADLINE:?}",
                        self.nodes.len()
                    );
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(())
    }

    /// Node `i` of this system, round robin (`i` modulo [`Server::node_count`]): the server
    /// itself unless it is a cluster, whose `node(0)` is `node-1`.
    pub fn node(&self, i: usize) -> Node {
        self.nodes[i % self.nodes.len()]
    }

    /// How many gangway nodes serve this system: 1, or [`CLUSTER_NODES`] for a cluster.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The server's command: the same ports and data directory every time.
    fn command(&self) -> Command {
        let data = self.dir.path().join("data");
        let mut cmd = Command::new(&self.bin);
        match self.system {
            System::Gangway | System::GangwayCluster => {
                // No warm-up: nothing re-registers after a fresh start, and pushes should flow
                // at once.
                cmd.arg("server")
                    .arg("--http")
                    .arg(self.http.to_string())
                    .arg("--grpc")
                    .arg(self.grpc.to_string())
                    .arg("--data-dir")
                    .arg(&data)
                    .args(["--warmup", "0s", "--log", "warn"])
                    // Every load generator connection comes from 127.0.0.1: the per-address
                    // bound (4,096) is for many clients, not for one machine opening 10,000.
                    .args(["--max-connections-per-address", "1000000"])
                    // And the port's own maximum: `auto` is three eighths of the open-file limit
                    // (7,500 of the bench's 20,000), under the 10,000 subscribers of fan-out.
                    .args(["--grpc-max-connections", "15000"]);
                if let Role::GangwayNode { name, endpoints } = &self.role {
                    cmd.args(["--store", "etcd", "--etcd-endpoints", endpoints])
                        .args(["--node-name", name]);
                }
            }
            System::Rnacos => {
                // rnacos puts gRPC at HTTP + 1000 unless told; pick both explicitly.
                cmd.env("RNACOS_HTTP_PORT", self.http.port().to_string())
                    .env("RNACOS_GRPC_PORT", self.grpc.port().to_string())
                    .env("RNACOS_HTTP_CONSOLE_PORT", self.aux_port.to_string())
                    .env("RNACOS_SDK_HOST", "127.0.0.1")
                    .env("RNACOS_CONSOLE_HOST", "127.0.0.1")
                    .env("RNACOS_DATA_DIR", &data)
                    .env("RNACOS_ENABLE_NO_AUTH_CONSOLE", "false")
                    // rnacos logs every request at info.
                    .env("RUST_LOG", "warn")
                    // Its .env lookup walks up from the working directory: start in the temp dir.
                    .current_dir(self.dir.path());
            }
            System::Etcd => {
                let peer = format!("http://127.0.0.1:{}", self.aux_port);
                let client = format!("http://{}", self.http);
                let (name, initial_cluster) = match &self.role {
                    Role::EtcdMember {
                        name,
                        initial_cluster,
                    } => (name.clone(), initial_cluster.clone()),
                    _ => ("bench".to_owned(), format!("bench={peer}")),
                };
                cmd.args(["--name", &name, "--data-dir"])
                    .arg(&data)
                    .args(["--listen-client-urls", &client])
                    .args(["--advertise-client-urls", &client])
                    .args(["--listen-peer-urls", &peer])
                    .args(["--initial-advertise-peer-urls", &peer])
                    .args(["--initial-cluster", &initial_cluster])
                    // One token per cluster: its first member's peer URL.
                    .args([
                        "--initial-cluster-token",
                        initial_cluster_token(&initial_cluster),
                    ])
                    .args(["--initial-cluster-state", "new"])
                    .args(["--log-level", "warn", "--logger", "zap"])
                    // 8 GiB backend quota: the scale workload writes 100k keys.
                    .args(["--quota-backend-bytes", "8589934592"]);
            }
        }
        cmd
    }

    /// Spawns the server process, its output appended to the log.
    fn spawn(&mut self) -> anyhow::Result<()> {
        let logfile = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let child = self
            .command()
            .stdin(Stdio::null())
            .stdout(logfile.try_clone()?)
            .stderr(logfile)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", self.bin.display()))?;
        self.child = Some(child);
        Ok(())
    }

    /// Kills the server with SIGKILL (no chance to flush or close anything) and reaps it.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }

    /// Starts the server again on the same ports and data directory, without waiting for it
    /// (after [`Server::kill`]).
    ///
    /// # Errors
    /// The process could not be spawned.
    pub fn respawn(&mut self) -> anyhow::Result<()> {
        self.spawn()
    }

    /// How the server process ended, if it has (`None` while it runs, or when none was
    /// started).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut()?.try_wait().ok().flatten()
    }

    /// The URL of the health endpoint: 2xx once the server answers.
    pub fn health_url(&self) -> String {
        let path = match self.system {
            System::Gangway | System::GangwayCluster => "/v1/health",
            System::Rnacos => "/nacos/v1/console/health/readiness",
            System::Etcd => "/health",
        };
        format!("http://{}{path}", self.http)
    }

    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let url = self.health_url();
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.exited() {
                bail!(
                    "{} exited at start ({status}); its log:\n{}",
                    self.system,
                    self.log_tail()
                );
            }
            let answered = client
                .get(&url)
                .timeout(Duration::from_secs(1))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            // rnacos answers HTTP before its gRPC port is up; wait for that too.
            if answered && tokio::net::TcpStream::connect(self.grpc).await.is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "{} did not answer {url} within 30 s; its log:\n{}",
                    self.system,
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The last lines of the server's log (for error messages).
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().and_then(Child::id).unwrap_or(0)
    }

    /// The process ids of every process of the system: the server's, then a cluster's other
    /// nodes and its etcd members.
    pub fn pids(&self) -> Vec<u32> {
        std::iter::once(self.pid())
            .chain(self.members.iter().map(Server::pid))
            .collect()
    }

    /// CPU time the system's processes ([`Server::pids`]) have used so far (a process whose
    /// time is unreadable counts zero).
    pub fn cpu(&self) -> Duration {
        cpu_of(&self.pids())
    }

    /// The server's resident set size in bytes (0 when unreadable); a cluster: its first node
    /// only.
    pub fn rss(&self) -> u64 {
        stats::rss_bytes(self.pid()).unwrap_or(0)
    }

    /// Stops the server: SIGTERM, then SIGKILL after 5 s. A cluster: its gangway nodes at once,
    /// then its etcd members at once.
    ///
    /// With `GANGWAY_BENCH_LOGS=DIR` in the environment, each process's log is kept as
    /// `DIR/<system>-<pid>.log` (the servers log at `warn`; `RUST_LOG` raises it for gangway).
    pub async fn stop(mut self) {
        let mut members = std::mem::take(&mut self.members);
        let (mut etcd, mut nodes): (Vec<&mut Server>, Vec<&mut Server>) =
            members.iter_mut().partition(|m| m.system == System::Etcd);
        nodes.push(&mut self);
        futures::future::join_all(nodes.into_iter().map(Server::stop_process)).await;
        futures::future::join_all(etcd.iter_mut().map(|m| m.stop_process())).await;
    }

    /// Stops this process alone (SIGTERM, SIGKILL after 5 s) and keeps its log if asked.
    async fn stop_process(&mut self) {
        let pid = self.child.as_ref().and_then(Child::id);
        if let Some(mut child) = self.child.take() {
            if let Some(pid) = pid {
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
            }
            if tokio::time::timeout(Duration::from_secs(5), child.wait())
                .await
                .is_err()
            {
                let _ = child.kill().await;
            }
        }
        if let Some(dir) = std::env::var_os("GANGWAY_BENCH_LOGS") {
            let to = PathBuf::from(dir).join(format!("{}-{}.log", self.system, pid.unwrap_or(0)));
            if let Err(e) = std::fs::copy(&self.log, &to) {
                eprintln!("could not keep the server log as {}: {e}", to.display());
            }
        }
    }
}

/// Spawns every server of `servers`, then waits until each answers (all spawned first: etcd
/// members of a new cluster answer only once a quorum runs).
async fn start_all(servers: &mut [Server]) -> anyhow::Result<()> {
    for s in servers.iter_mut() {
        s.spawn()?;
    }
    for s in servers.iter_mut() {
        s.wait_ready().await?;
    }
    Ok(())
}

/// The cluster token of an etcd `--initial-cluster` list: its first member's peer URL, unique
/// per cluster on this machine (free ports).
fn initial_cluster_token(initial_cluster: &str) -> &str {
    let first = initial_cluster.split(',').next().unwrap_or(initial_cluster);
    first.split_once('=').map_or(first, |(_, url)| url)
}

/// The summed CPU time of `pids` (unreadable ones count zero).
fn cpu_of(pids: &[u32]) -> Duration {
    pids.iter()
        .map(|&p| stats::cpu_time(p).unwrap_or_default())
        .sum()
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.start_kill();
        }
    }
}

/// CPU used by the client (this process) and the server (every process of its system) over
/// one measured phase.
#[derive(Debug, Clone)]
pub struct CpuMeter {
    client: Duration,
    server: Duration,
    pids: Vec<u32>,
    start: Instant,
}

/// The CPU seconds of one phase, and the wall time it took.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct CpuUse {
    /// Load generator (this process) CPU seconds.
    pub client_s: f64,
    /// Server CPU seconds (a cluster: its gangway nodes and etcd members together).
    pub server_s: f64,
    /// Wall seconds of the phase.
    pub wall_s: f64,
}

impl CpuMeter {
    /// Starts measuring this process and `server`.
    pub fn start(server: &Server) -> Self {
        CpuMeter {
            client: stats::own_cpu_time().unwrap_or_default(),
            server: server.cpu(),
            pids: server.pids(),
            start: Instant::now(),
        }
    }

    /// CPU used since [`CpuMeter::start`].
    pub fn stop(&self) -> CpuUse {
        let client = stats::own_cpu_time().unwrap_or_default();
        let server = cpu_of(&self.pids);
        CpuUse {
            client_s: client.saturating_sub(self.client).as_secs_f64(),
            server_s: server.saturating_sub(self.server).as_secs_f64(),
            wall_s: self.start.elapsed().as_secs_f64(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_is_named_and_parsed() {
        assert_eq!(
            "gangway-cluster".parse::<System>(),
            Ok(System::GangwayCluster)
        );
        assert_eq!(System::GangwayCluster.to_string(), "gangway-cluster");
        for s in System::ALL {
            assert_eq!(serde_json::to_value(s).unwrap(), s.name(), "{s:?}");
        }
        assert!(System::GangwayCluster.is_gangway() && System::Gangway.is_gangway());
        assert!(!System::Etcd.is_gangway());
        let e = "cluster".parse::<System>().unwrap_err();
        assert!(e.contains("gangway-cluster"), "{e}");
    }

    #[test]
    fn cluster_tokens_are_the_first_peer_url() {
        assert_eq!(
            initial_cluster_token("m0=http://127.0.0.1:4001,m1=http://127.0.0.1:4002"),
            "http://127.0.0.1:4001"
        );
        assert_eq!(
            initial_cluster_token("bench=http://127.0.0.1:4003"),
            "http://127.0.0.1:4003"
        );
    }

    #[test]
    fn nodes_are_taken_round_robin() {
        let bins = Binaries {
            gangway: PathBuf::from("/bin/sh"),
            rnacos: PathBuf::from("/nonexistent/rnacos"),
            etcd: PathBuf::from("/nonexistent/etcd"),
        };
        let mut s = Server::prepare(System::Gangway, &bins).unwrap();
        let first = s.node(0);
        assert_eq!((first.http, first.grpc), (s.http, s.grpc));
        assert_eq!(s.node(7), first);
        assert_eq!(s.node_count(), 1);
        let other = Node {
            http: loopback(1),
            grpc: loopback(2),
        };
        s.nodes.push(other);
        assert_eq!(
            (0..4).map(|i| s.node(i)).collect::<Vec<_>>(),
            vec![first, other, first, other]
        );
        // Without etcd there is no cluster.
        assert!(bins.find(System::GangwayCluster).is_none());
        assert!(Server::prepare(System::Rnacos, &bins).is_err());
    }
}
