//! The workloads of issue 6. Each starts every system in turn, runs the same work against it,
//! stops it, and returns one [`Table`].

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use serde_json::Value;
use tokio::sync::Notify;

use crate::drivers::etcd::{self, Etcd};
use crate::drivers::nacos_grpc::{self, NacosConn};
use crate::drivers::nacos_http::NacosHttp;
use crate::drivers::native::Session;
use crate::drivers::rest::Rest;
use crate::drivers::{channel, http_client, instance_addr};
use crate::load::{self, Outcome, Percentiles};
use crate::report::{self, Row, Table};
use crate::system::{Binaries, CpuMeter, Server, System};

/// Sizes and durations of one run.
#[derive(Debug, Clone)]
pub struct Params {
    /// Closed-loop phase length.
    pub duration: Duration,
    /// Closed-loop workers (each its own connection or session).
    pub concurrency: usize,
    /// Open-loop rate for latency (requests/s), the same for every system.
    pub open_rate: f64,
    /// Open-loop phase length.
    pub open_duration: Duration,
    /// Subscriber counts of the fan-out workload.
    pub fanout_sizes: Vec<usize>,
    /// Changes per fan-out size.
    pub fanout_changes: usize,
    /// Instances (and subscribers) of the churn workload.
    pub churn: usize,
    /// Sessions of the scale workload (each holds 10 instances).
    pub sessions: usize,
    /// Target of the largest-session-count probe (gangway only).
    pub max_sessions: usize,
    /// Pause before each RSS reading, so the server's allocator settles.
    pub settle: Duration,
    /// Service sizes at which the big-service workload measures.
    pub big_service_sizes: Vec<usize>,
}

impl Params {
    /// The `--quick` sizes: `gangway bench all --quick` stays under a minute.
    pub fn quick() -> Self {
        Params {
            duration: Duration::from_secs(1),
            concurrency: 32,
            open_rate: 1000.0,
            open_duration: Duration::from_millis(500),
            fanout_sizes: vec![100],
            fanout_changes: 10,
            churn: 50,
            sessions: 200,
            max_sessions: 1000,
            settle: Duration::from_millis(300),
            big_service_sizes: vec![500, 2000],
        }
    }

    /// The full run's sizes (issue 6).
    pub fn full() -> Self {
        Params {
            duration: Duration::from_secs(10),
            concurrency: 64,
            open_rate: 5000.0,
            open_duration: Duration::from_secs(5),
            fanout_sizes: vec![100, 1000, 10_000],
            fanout_changes: 50,
            churn: 1000,
            sessions: 10_000,
            max_sessions: 100_000,
            settle: Duration::from_millis(1500),
            big_service_sizes: vec![1000, 2000, 5000, 10_000, 20_000],
        }
    }
}

/// What every workload needs.
pub struct Ctx {
    /// Sizes.
    pub params: Params,
    /// Server binaries.
    pub bins: Binaries,
    /// Systems to run, in order.
    pub systems: Vec<System>,
}

type Op = Arc<dyn Fn(usize, u64) -> BoxFuture<'static, anyhow::Result<()>> + Send + Sync>;

/// Closed loop with `op`, then open loop at the fixed rate; workers of the open loop use ids
/// from 4096 on so their instances differ from the closed loop's.
async fn throughput_and_latency(
    ctx: &Ctx,
    server: &Server,
    label: &str,
    op: Op,
) -> (Outcome, Outcome, crate::system::CpuUse) {
    let p = &ctx.params;
    let meter = CpuMeter::start(server);
    let closed = {
        let op = op.clone();
        load::closed_loop(
            p.concurrency,
            p.duration,
            &format!("{label} closed"),
            move |w, n| op(w, n),
        )
        .await
    };
    let cpu = meter.stop();
    let c = p.concurrency as u64;
    let open = load::open_loop(
        p.open_rate,
        p.open_duration,
        10_000,
        &format!("{label} open"),
        move |i| op(4096 + (i % c) as usize, i / c),
    )
    .await;
    (closed, open, cpu)
}

fn load_row(
    system: System,
    driver: &str,
    closed: &Outcome,
    open: &Outcome,
    cpu: crate::system::CpuUse,
) -> Row {
    let c = Percentiles::of(&closed.latency);
    let o = Percentiles::of(&open.latency);
    let mut note = String::new();
    if let Some(e) = closed.first_error.as_ref().or(open.first_error.as_ref()) {
        note = format!("first error: {}", truncate(e, 120));
    }
    Row {
        system,
        driver: driver.into(),
        group: String::new(),
        values: vec![
            Some(closed.rate()),
            Some(c.p99_ms),
            Some(o.p50_ms),
            Some(o.p99_ms),
            Some((closed.errors + open.errors) as f64),
        ],
        cpu: Some(cpu),
        note,
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.len() <= n {
        s.to_owned()
    } else {
        let mut end = n;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &s[..end])
    }
}

fn load_columns(what: &str) -> Vec<String> {
    vec![
        format!("{what}/s (closed)"),
        "p99 ms (closed)".into(),
        "p50 ms (open)".into(),
        "p99 ms (open)".into(),
        "errors".into(),
    ]
}

/// The workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    /// C clients register distinct ephemeral instances as fast as they can.
    Register,
    /// List a 10-instance service.
    Query,
    /// S subscribers of one service; one instance changes; time to the last subscriber.
    Fanout,
    /// 1,000 instances deregister at once with 1,000 subscribers.
    Churn,
    /// 100,000 instances held by 10,000 sessions: RSS per instance and per session.
    Scale,
    /// Persistent registrations with sync to disk before the acknowledgement.
    Durable,
    /// One service growing to 20,000 instances over one connection: cost per registration by
    /// size.
    BigService,
    /// `gangway proxy` beside HAProxy on 3 instances: added latency, throughput (not in `all`;
    /// see [`crate::proxy`]).
    Proxy,
    /// Every workload in turn.
    All,
}

impl Workload {
    /// Every workload `all` runs, in order.
    pub const EACH: [Workload; 7] = [
        Workload::Register,
        Workload::Query,
        Workload::Fanout,
        Workload::Churn,
        Workload::Scale,
        Workload::Durable,
        Workload::BigService,
    ];

    /// The name used on the command line and in tables.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Register => "register",
            Workload::Query => "query",
            Workload::Fanout => "fanout",
            Workload::Churn => "churn",
            Workload::Scale => "scale",
            Workload::Durable => "durable",
            Workload::BigService => "big-service",
            Workload::Proxy => "proxy",
            Workload::All => "all",
        }
    }

    /// The drivers run against `system`.
    fn drivers(self, system: System) -> Vec<&'static str> {
        use System::*;
        match (self, system) {
            (Workload::Register, Gangway) => vec!["native-grpc", "nacos-grpc", "nacos-http"],
            (Workload::Register, Rnacos) => vec!["nacos-grpc", "nacos-http"],
            (Workload::Register, Etcd) => vec!["lease+put"],
            (Workload::Query, Gangway) => vec!["rest", "nacos-http"],
            (Workload::Query, Rnacos) => vec!["nacos-http"],
            (Workload::Query, Etcd) => vec!["range"],
            (Workload::Fanout | Workload::Churn, Gangway) => vec!["native-grpc", "nacos-grpc"],
            (Workload::Fanout | Workload::Churn, Rnacos) => vec!["nacos-grpc"],
            (Workload::Fanout | Workload::Churn, Etcd) => vec!["watch"],
            (Workload::Scale, Gangway) => vec!["native-grpc", "max-sessions"],
            (Workload::Scale, Rnacos) => vec!["nacos-grpc"],
            (Workload::Scale, Etcd) => vec!["lease+put"],
            (Workload::Durable, Gangway) => vec!["rest-persistent"],
            (Workload::Durable, Rnacos) => vec!["nacos-http-persistent"],
            (Workload::Durable, Etcd) => vec!["put"],
            (Workload::BigService, Gangway) => vec!["rest", "nacos-http"],
            (Workload::BigService, Rnacos) => vec!["nacos-http"],
            (Workload::BigService, Etcd) => vec!["put"],
            (Workload::All | Workload::Proxy, _) => vec![],
        }
    }

    fn table(self, p: &Params) -> Table {
        let (title, columns, key, higher_is_better, notes): (String, Vec<String>, usize, bool, Vec<String>) = match self {
            Workload::Register => (
                format!(
                    "{} clients register distinct ephemeral instances (100 per service) for {:?} (closed loop); latency open loop at {}/s",
                    p.concurrency, p.duration, p.open_rate
                ),
                load_columns("regs"),
                0,
                true,
                vec![
                    "etcd: a lease grant then a put (two requests) per registration, as registries use etcd.".into(),
                    "nacos-grpc on rnacos: a second instance of a service on one connection replaces the first (Nacos semantics).".into(),
                ],
            ),
            Workload::Query => (
                format!(
                    "list a 10-instance service, {} clients for {:?} (closed loop); latency open loop at {}/s",
                    p.concurrency, p.duration, p.open_rate
                ),
                load_columns("queries"),
                0,
                true,
                vec![],
            ),
            Workload::Fanout => (
                format!(
                    "S subscribers of one service, {} changes each: time from the change to the last subscriber holding it",
                    p.fanout_changes
                ),
                vec![
                    "subscribers".into(),
                    "p50 ms (last)".into(),
                    "p99 ms (last)".into(),
                    "max ms (last)".into(),
                    "p50 ms (each)".into(),
                    "incomplete".into(),
                ],
                2,
                false,
                vec![
                    "gangway native: the snapshot received (and acked at once); Nacos: the NotifySubscriberRequest received (and answered); etcd: the watch event received.".into(),
                    "rnacos coalesces changes for about 500 ms before it pushes (its DelayNotifyActor).".into(),
                ],
            ),
            Workload::Churn => (
                format!(
                    "{n} instances of one service deregister at once (64 in flight) with {n} subscribers: time until every subscriber holds the final list",
                    n = p.churn
                ),
                vec![
                    "instances".into(),
                    "deregistered ms".into(),
                    "p50 ms (each final)".into(),
                    "last ms (all final)".into(),
                ],
                3,
                false,
                vec!["One more instance stays, so the final list is not empty (Nacos SDKs ignore empty lists).".into()],
            ),
            Workload::Scale => (
                format!(
                    "{} sessions (each its own connection), then 10 ephemeral instances each (services of 100); RSS deltas. max-sessions: sessions multiplexed 100 per connection, up to {}",
                    p.sessions, p.max_sessions
                ),
                vec![
                    "sessions".into(),
                    "instances".into(),
                    "RSS idle MB".into(),
                    "RSS sessions MB".into(),
                    "RSS all MB".into(),
                    "B/session".into(),
                    "B/instance".into(),
                ],
                6,
                false,
                vec![
                    "etcd: a session is a lease (TTL 1 h, no keep-alive stream), an instance a key under it.".into(),
                    "nacos-grpc: each connection registers one instance in each of 10 services (Nacos keeps one per service and connection).".into(),
                ],
            ),
            Workload::Durable => (
                format!(
                    "{} clients write persistent instances for {:?} (closed loop), each acknowledged after sync to disk; latency open loop at {}/s",
                    p.concurrency, p.duration, p.open_rate
                ),
                load_columns("writes"),
                0,
                true,
                vec![
                    "gangway: REST, ephemeral=false (redb, fsync before the answer); rnacos: v1 HTTP ephemeral=false (Raft log); etcd: put without lease (WAL fsync).".into(),
                ],
            ),
            Workload::BigService => (
                format!(
                    "one service grows to {} instances, registered one after another over one connection: µs per registration at each size",
                    p.big_service_sizes.last().copied().unwrap_or(0)
                ),
                p.big_service_sizes
                    .iter()
                    .map(|n| format!("µs/reg at {}", report::format_number(*n as f64)))
                    .chain(["largest ÷ smallest".into()])
                    .collect(),
                p.big_service_sizes.len(),
                false,
                vec![
                    format!("each size: the mean of the next {BIG_SERVICE_WINDOW} registrations once the service holds that many; gangway rest: leases; etcd: puts under one lease.").into(),
                    "largest ÷ smallest: the cost of a registration in the biggest service over that in the smallest (1 is flat).".into(),
                ],
            ),
            Workload::All | Workload::Proxy => {
                unreachable!("all is run workload by workload; proxy builds its own table")
            }
        };
        Table {
            workload: self.name().into(),
            title,
            columns,
            key,
            higher_is_better,
            rows: Vec::new(),
            notes,
        }
    }

    /// Runs this workload against every system of `ctx` and returns its table.
    pub async fn run(self, ctx: &Ctx) -> Table {
        if self == Workload::Proxy {
            return crate::proxy::run(ctx).await;
        }
        let mut table = self.table(&ctx.params);
        for &system in &ctx.systems {
            // A fresh server per driver: what one driver leaves behind (expiring leases,
            // thousands of closing sessions) must not load the next one's measurement.
            for d in self.drivers(system) {
                eprintln!("-- {}: {system} {d}", self.name());
                let server = match Server::start(system, &ctx.bins).await {
                    Ok(s) => s,
                    Err(e) => {
                        let why = format!("{e:#}");
                        table.rows.push(Row::failed(
                            system,
                            d,
                            "",
                            table.columns.len(),
                            why.lines().next().unwrap_or(""),
                        ));
                        continue;
                    }
                };
                let result = match self {
                    Workload::Register => register(ctx, &server, d).await,
                    Workload::Query => query(ctx, &server, d).await,
                    Workload::Fanout => fanout(ctx, &server, d).await,
                    Workload::Churn => churn(ctx, &server, d).await,
                    Workload::Scale => scale(ctx, &server, d).await,
                    Workload::Durable => durable(ctx, &server, d).await,
                    Workload::BigService => big_service(ctx, &server, d).await,
                    Workload::All | Workload::Proxy => Ok(vec![]),
                };
                match result {
                    Ok(rows) => table.rows.extend(rows),
                    Err(e) => table.rows.push(Row::failed(
                        system,
                        d,
                        "",
                        table.columns.len(),
                        truncate(&format!("failed: {e:#}"), 200),
                    )),
                }
                server.stop().await;
            }
        }
        table
    }
}

/// Worker `w`'s service for its request `n`: each service takes 100 instances, so services stay
/// the size real ones have (a registry's per-change cost may grow with the service).
fn reg_service(w: usize, n: u64) -> String {
    format!("bench-reg-{w}-{}", n / 100)
}

/// Opens `n` native sessions, each on its own connection.
async fn native_sessions(
    server: &Server,
    n: usize,
    label: &str,
) -> anyhow::Result<Vec<Arc<Session>>> {
    let addr = server.grpc;
    load::for_each(n, 128, label, |i| async move {
        let ch = channel(addr).await?;
        Ok(Arc::new(
            Session::open(ch, &format!("bench-{i}"), None).await?,
        ))
    })
    .await
}

/// Opens `n` Nacos SDK connections.
async fn nacos_conns(
    server: &Server,
    n: usize,
    label: &str,
) -> anyhow::Result<Vec<Arc<NacosConn>>> {
    let addr = server.grpc;
    load::for_each(n, 128, label, |_| async move {
        Ok(Arc::new(NacosConn::connect(addr, None).await?))
    })
    .await
}

async fn register(ctx: &Ctx, server: &Server, driver: &str) -> anyhow::Result<Vec<Row>> {
    let c = ctx.params.concurrency;
    let op: Op = match driver {
        "native-grpc" => {
            let sessions = native_sessions(server, c, "native sessions").await?;
            Arc::new(move |w, n| {
                let s = sessions[w % sessions.len()].clone();
                Box::pin(async move {
                    let (ip, port) = instance_addr(w, n);
                    s.register(&reg_service(w, n), &ip, port).await.map(drop)
                })
            })
        }
        "nacos-grpc" => {
            let conns = nacos_conns(server, c, "nacos connections").await?;
            Arc::new(move |w, n| {
                let s = conns[w % conns.len()].clone();
                Box::pin(async move {
                    let (ip, port) = instance_addr(w, n);
                    s.register(&reg_service(w, n), &ip, port).await
                })
            })
        }
        "nacos-http" => {
            let h = NacosHttp::new(http_client(2 * c), server.http);
            Arc::new(move |w, n| {
                let h = h.clone();
                Box::pin(async move {
                    let (ip, port) = instance_addr(w, n);
                    h.register(&reg_service(w, n), &ip, port, true).await
                })
            })
        }
        "lease+put" => {
            let e = Etcd::new(http_client(2 * c), server.http);
            Arc::new(move |w, n| {
                let e = e.clone();
                Box::pin(async move {
                    let (ip, port) = instance_addr(w, n);
                    e.register(&reg_service(w, n), &ip, port, 600)
                        .await
                        .map(drop)
                })
            })
        }
        other => anyhow::bail!("no register driver {other}"),
    };
    let (closed, open, cpu) =
        throughput_and_latency(ctx, server, &format!("{} {driver}", server.system), op).await;
    Ok(vec![load_row(server.system, driver, &closed, &open, cpu)])
}

const QUERY_SERVICE: &str = "bench-query";

async fn query(ctx: &Ctx, server: &Server, driver: &str) -> anyhow::Result<Vec<Row>> {
    let c = ctx.params.concurrency;
    // Ten instances, kept alive for the whole phase by a session, connections or leases.
    let mut _keep_session = None;
    match server.system {
        System::Gangway => {
            let s =
                Session::open(channel(server.grpc).await?, "bench-query-provider", None).await?;
            for i in 0..10 {
                s.register(QUERY_SERVICE, "127.0.0.1", 8000 + i).await?;
            }
            _keep_session = Some(s);
        }
        System::Rnacos => {
            // v1 HTTP leases (healthy for 15 s + 3 s without beats: longer than the phase).
            let h = NacosHttp::new(http_client(1), server.http);
            for i in 0..10 {
                h.register(QUERY_SERVICE, "127.0.0.1", 8000 + i, true)
                    .await?;
            }
        }
        System::Etcd => {
            let e = Etcd::new(http_client(1), server.http);
            for i in 0..10 {
                e.register(QUERY_SERVICE, "127.0.0.1", 8000 + i, 3600)
                    .await?;
            }
        }
    }
    let client = http_client(2 * c);
    let op: Op = match driver {
        "rest" => {
            let r = Rest::new(client, server.http);
            let body: Value = serde_json::from_slice(&r.list(QUERY_SERVICE).await?)?;
            let n = body["instances"].as_array().map_or(0, Vec::len);
            anyhow::ensure!(n == 10, "expected 10 instances, the list has {n}");
            Arc::new(move |_, _| {
                let r = r.clone();
                Box::pin(async move { r.list(QUERY_SERVICE).await.map(drop) })
            })
        }
        "nacos-http" => {
            let h = NacosHttp::new(client, server.http);
            // rnacos indexes asynchronously: give the list a moment to fill.
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                let body: Value = serde_json::from_slice(&h.list(QUERY_SERVICE).await?)?;
                let n = body["hosts"].as_array().map_or(0, Vec::len);
                if n == 10 {
                    break;
                }
                anyhow::ensure!(
                    Instant::now() < deadline,
                    "expected 10 instances, the list has {n}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Arc::new(move |_, _| {
                let h = h.clone();
                Box::pin(async move { h.list(QUERY_SERVICE).await.map(drop) })
            })
        }
        "range" => {
            let e = Etcd::new(client, server.http);
            let n = e.list(QUERY_SERVICE).await?;
            anyhow::ensure!(n == 10, "expected 10 keys, the range has {n}");
            Arc::new(move |_, _| {
                let e = e.clone();
                Box::pin(async move { e.list(QUERY_SERVICE).await.map(drop) })
            })
        }
        other => anyhow::bail!("no query driver {other}"),
    };
    let (closed, open, cpu) =
        throughput_and_latency(ctx, server, &format!("{} {driver}", server.system), op).await;
    Ok(vec![load_row(server.system, driver, &closed, &open, cpu)])
}

async fn durable(ctx: &Ctx, server: &Server, driver: &str) -> anyhow::Result<Vec<Row>> {
    let c = ctx.params.concurrency;
    let client = http_client(2 * c);
    let svc = |w: usize, n: u64| format!("bench-durable-{w}-{}", n / 100);
    let op: Op = match driver {
        "rest-persistent" => {
            let r = Rest::new(client, server.http);
            Arc::new(move |w, n| {
                let r = r.clone();
                let s = svc(w, n);
                Box::pin(async move {
                    let (ip, port) = instance_addr(w, n);
                    r.register_persistent(&s, &ip, port).await
                })
            })
        }
        "nacos-http-persistent" => {
            let h = NacosHttp::new(client, server.http);
            Arc::new(move |w, n| {
                let h = h.clone();
                let s = svc(w, n);
                Box::pin(async move {
                    let (ip, port) = instance_addr(w, n);
                    h.register(&s, &ip, port, false).await
                })
            })
        }
        "put" => {
            let e = Etcd::new(client, server.http);
            Arc::new(move |w, n| {
                let e = e.clone();
                let s = svc(w, n);
                Box::pin(async move {
                    let (ip, port) = instance_addr(w, n);
                    e.put(&etcd::key(&s, &ip, port), r#"{"weight":1.0}"#, None)
                        .await
                })
            })
        }
        other => anyhow::bail!("no durable driver {other}"),
    };
    let (closed, open, cpu) =
        throughput_and_latency(ctx, server, &format!("{} {driver}", server.system), op).await;
    Ok(vec![load_row(server.system, driver, &closed, &open, cpu)])
}

/// Shared state of the fan-out rounds: which change is awaited, who has seen it, when.
struct Rounds {
    round: AtomicU64,
    target: AtomicU64,
    seen: AtomicUsize,
    per_sub: Vec<AtomicU64>,
    t0: Mutex<Instant>,
    each: Mutex<hdrhistogram::Histogram<u64>>,
    last: Mutex<Option<Duration>>,
    done: Notify,
}

impl Rounds {
    fn new(subs: usize) -> Arc<Self> {
        Arc::new(Rounds {
            round: AtomicU64::new(0),
            target: AtomicU64::new(0),
            seen: AtomicUsize::new(0),
            per_sub: (0..subs).map(|_| AtomicU64::new(0)).collect(),
            t0: Mutex::new(Instant::now()),
            each: Mutex::new(load::histogram()),
            last: Mutex::new(None),
            done: Notify::new(),
        })
    }

    /// Subscriber `sub` received an update; `has` tells whether it holds instance port `p`.
    fn saw(&self, sub: usize, has: impl FnOnce(u64) -> bool) {
        let r = self.round.load(Ordering::Acquire);
        if r == 0 || self.per_sub[sub].load(Ordering::Relaxed) >= r {
            return;
        }
        if !has(self.target.load(Ordering::Acquire)) {
            return;
        }
        if self.per_sub[sub].fetch_max(r, Ordering::AcqRel) >= r {
            return;
        }
        let elapsed = self.t0.lock().unwrap().elapsed();
        load::record(&mut self.each.lock().unwrap(), elapsed);
        if self.seen.fetch_add(1, Ordering::AcqRel) + 1 == self.per_sub.len() {
            *self.last.lock().unwrap() = Some(elapsed);
            self.done.notify_one();
        }
    }

    /// Arms round `k` awaiting port `port`; the change must be sent right after.
    fn arm(&self, k: u64, port: u64) {
        self.seen.store(0, Ordering::Release);
        *self.last.lock().unwrap() = None;
        self.target.store(port, Ordering::Release);
        *self.t0.lock().unwrap() = Instant::now();
        self.round.store(k, Ordering::Release);
    }

    /// Waits until every subscriber saw the round (true) or `timeout` passed (false).
    async fn wait(&self, timeout: Duration) -> Option<Duration> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(d) = *self.last.lock().unwrap() {
                return Some(d);
            }
            if tokio::time::timeout_at(deadline, self.done.notified())
                .await
                .is_err()
            {
                return None;
            }
        }
    }
}

/// Something that holds subscribers open until dropped.
enum Held {
    Native(#[allow(dead_code)] Vec<Session>),
    Nacos(#[allow(dead_code)] Vec<NacosConn>),
    Watches(Vec<tokio::task::JoinHandle<()>>),
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Held::Watches(w) = self {
            for h in w {
                h.abort();
            }
        }
    }
}

/// Opens `n` subscribers of `svc`; `on_update(i, ports)` gets subscriber i's current instance
/// ports on every push (etcd: on every event, with the key's port and whether it was a delete).
async fn subscribers(
    server: &Server,
    driver: &str,
    svc: &str,
    n: usize,
    on_update: Arc<dyn Fn(usize, Update<'_>) + Send + Sync>,
) -> anyhow::Result<Held> {
    let label = format!("{n} subscribers ({driver})");
    Ok(match driver {
        "native-grpc" => {
            let addr = server.grpc;
            Held::Native(
                load::for_each(n, 128, &label, |i| {
                    let on_update = on_update.clone();
                    async move {
                        let h: crate::drivers::native::SnapshotHandler =
                            Arc::new(move |view| on_update(i, Update::Ports(&mut view.ports())));
                        let s =
                            Session::open(channel(addr).await?, &format!("bench-sub-{i}"), Some(h))
                                .await?;
                        s.subscribe(svc).await?;
                        Ok(s)
                    }
                })
                .await?,
            )
        }
        "nacos-grpc" => {
            let addr = server.grpc;
            Held::Nacos(
                load::for_each(n, 128, &label, |i| {
                    let on_update = on_update.clone();
                    async move {
                        let h: nacos_grpc::PushHandler = Arc::new(move |info: &Value| {
                            on_update(i, Update::Ports(&mut nacos_grpc::host_ports(info)))
                        });
                        let c = NacosConn::connect(addr, Some(h)).await?;
                        c.subscribe(svc).await?;
                        Ok(c)
                    }
                })
                .await?,
            )
        }
        "watch" => {
            let e = Etcd::new(http_client(n), server.http);
            Held::Watches(
                load::for_each(n, 128, &label, |i| {
                    let on_update = on_update.clone();
                    let e = e.clone();
                    async move {
                        let h: etcd::EventHandler = Box::new(move |ev: &Value| {
                            let deleted = ev["type"] == "DELETE";
                            let key = ev["kv"]["key"].as_str().unwrap_or("");
                            on_update(i, Update::Event { key, deleted });
                        });
                        e.watch(svc, h).await
                    }
                })
                .await?,
            )
        }
        other => anyhow::bail!("no subscriber driver {other}"),
    })
}

/// What a subscriber received.
enum Update<'a> {
    /// The full list of instance ports (gangway snapshot, Nacos push).
    Ports(&'a mut dyn Iterator<Item = u64>),
    /// One etcd watch event, the key base64-encoded.
    Event { key: &'a str, deleted: bool },
}

fn contains(ports: &mut dyn Iterator<Item = u64>, p: u64) -> bool {
    for x in ports {
        if x == p {
            return true;
        }
    }
    false
}

fn count(ports: &mut dyn Iterator<Item = u64>) -> usize {
    let mut n = 0;
    for _ in ports {
        n += 1;
    }
    n
}

/// Makes changes to a service (the fan-out's and churn's producer side).
enum Changer {
    Native(Session),
    Nacos(NacosConn),
    NacosHttp(NacosHttp),
    Etcd(Etcd, String),
}

impl Changer {
    async fn new(server: &Server, driver: &str) -> anyhow::Result<Changer> {
        Ok(match driver {
            "native-grpc" => Changer::Native(
                Session::open(channel(server.grpc).await?, "bench-changer", None).await?,
            ),
            "nacos-grpc" => Changer::Nacos(NacosConn::connect(server.grpc, None).await?),
            "nacos-http" => Changer::NacosHttp(NacosHttp::new(http_client(64), server.http)),
            "watch" => {
                let e = Etcd::new(http_client(64), server.http);
                let lease = e.grant(3600).await?;
                Changer::Etcd(e, lease)
            }
            other => anyhow::bail!("no changer for {other}"),
        })
    }

    async fn add(&self, svc: &str, ip: &str, port: u16) -> anyhow::Result<()> {
        match self {
            Changer::Native(s) => s.register(svc, ip, port).await.map(drop),
            Changer::Nacos(c) => c.register(svc, ip, port).await,
            Changer::NacosHttp(h) => h.register(svc, ip, port, true).await,
            Changer::Etcd(e, lease) => {
                e.put(&etcd::key(svc, ip, port), r#"{"weight":1.0}"#, Some(lease))
                    .await
            }
        }
    }

    async fn remove(&self, svc: &str, ip: &str, port: u16) -> anyhow::Result<()> {
        match self {
            Changer::Native(s) => s.deregister(svc, ip, port).await.map(drop),
            Changer::Nacos(c) => c.deregister(svc, ip, port).await,
            Changer::NacosHttp(h) => h.deregister(svc, ip, port, true).await,
            Changer::Etcd(e, _) => e.delete(&etcd::key(svc, ip, port)).await,
        }
    }
}

async fn fanout(ctx: &Ctx, server: &Server, driver: &str) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for &n in &ctx.params.fanout_sizes {
        let svc = format!("bench-fan-{n}-{}", driver.replace('+', ""));
        let group = format!("S={n}");
        match fanout_size(ctx, server, driver, &svc, n).await {
            Ok(mut row) => {
                row.group = group;
                rows.push(row);
            }
            Err(e) => {
                let mut row = Row::failed(
                    server.system,
                    driver,
                    &group,
                    6,
                    truncate(&format!("failed: {e:#}"), 200),
                );
                row.values[0] = Some(n as f64);
                rows.push(row);
            }
        }
    }
    Ok(rows)
}

async fn fanout_size(
    ctx: &Ctx,
    server: &Server,
    driver: &str,
    svc: &str,
    n: usize,
) -> anyhow::Result<Row> {
    // A standing instance (port 1) so no list is ever empty; changes add ports 1000 + k. Nacos
    // changes go through v1 HTTP: instances registered over rnacos's gRPC did not show in its
    // lists in our runs (see docs/benchmarks.md).
    let producer = if driver == "nacos-grpc" {
        "nacos-http"
    } else {
        driver
    };
    let keeper = Changer::new(server, producer).await?;
    keeper.add(svc, "127.0.0.1", 1).await?;
    let changer = Changer::new(server, producer).await?;
    let rounds = Rounds::new(n);
    let on_update: Arc<dyn Fn(usize, Update<'_>) + Send + Sync> = {
        let rounds = rounds.clone();
        let svc = svc.to_owned();
        Arc::new(move |i, u| match u {
            Update::Ports(ports) => rounds.saw(i, |p| contains(ports, p)),
            Update::Event { key, deleted } => rounds.saw(i, |p| {
                !deleted && key == etcd::b64(etcd::key(&svc, "127.0.0.1", p as u16).as_bytes())
            }),
        })
    };
    let held = subscribers(server, driver, svc, n, on_update).await?;
    // Let the initial pushes settle (rnacos delays pushes by about 500 ms).
    tokio::time::sleep(Duration::from_millis(700)).await;
    let mut last = load::histogram();
    let mut incomplete = 0u64;
    let changes = ctx.params.fanout_changes as u64;
    let pb = load::bar(changes, format!("{} {driver} S={n}", server.system));
    let meter = CpuMeter::start(server);
    for k in 1..=changes {
        let port = 1000 + k;
        rounds.arm(k, port);
        changer.add(svc, "127.0.0.1", port as u16).await?;
        match rounds.wait(Duration::from_secs(3)).await {
            Some(d) => load::record(&mut last, d),
            None => incomplete += 1,
        }
        pb.inc(1);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cpu = meter.stop();
    pb.finish_and_clear();
    drop(held);
    let l = Percentiles::of(&last);
    let each = Percentiles::of(&rounds.each.lock().unwrap());
    let have = |v: f64| (l.count > 0).then_some(v);
    Ok(Row {
        system: server.system,
        driver: driver.into(),
        group: String::new(),
        values: vec![
            Some(n as f64),
            have(l.p50_ms),
            have(l.p99_ms),
            have(l.max_ms),
            Some(each.p50_ms),
            Some(incomplete as f64),
        ],
        cpu: Some(cpu),
        note: if incomplete > 0 {
            format!("{incomplete} changes did not reach every subscriber within 3 s")
        } else {
            String::new()
        },
    })
}

/// Shared state of the churn: who holds the full list, who holds the final one and since when.
struct Churn {
    full: Vec<std::sync::atomic::AtomicBool>,
    full_count: AtomicUsize,
    finished: Vec<std::sync::atomic::AtomicBool>,
    t0: Mutex<Option<Instant>>,
    finals: Mutex<Vec<Duration>>,
    changed: Notify,
}

impl Churn {
    // Nested `if let` rather than a let chain: the workspace keeps the 1.85 MSRV.
    #[allow(clippy::collapsible_if)]
    fn observe(&self, i: usize, len: usize, full_len: usize) {
        if len == full_len && !self.full[i].swap(true, Ordering::AcqRel) {
            self.full_count.fetch_add(1, Ordering::AcqRel);
            self.changed.notify_one();
        }
        if len == 1 {
            let t0 = *self.t0.lock().unwrap();
            if let Some(t0) = t0 {
                if !self.finished[i].swap(true, Ordering::AcqRel) {
                    self.finals.lock().unwrap().push(t0.elapsed());
                    self.changed.notify_one();
                }
            }
        }
    }

    async fn until(&self, timeout: Duration, mut pred: impl FnMut() -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        while !pred() {
            if tokio::time::timeout_at(deadline, self.changed.notified())
                .await
                .is_err()
            {
                return pred();
            }
        }
        true
    }
}

async fn churn(ctx: &Ctx, server: &Server, driver: &str) -> anyhow::Result<Vec<Row>> {
    let n = ctx.params.churn;
    let svc = format!("bench-churn-{}", driver.replace('+', ""));
    let full_len = n + 1;
    // Producers: the native session for gangway's native run, v1 HTTP leases for the Nacos
    // runs (one Nacos connection holds one instance per service), a lease per key for etcd.
    let producer = match driver {
        "nacos-grpc" => Changer::new(server, "nacos-http").await?,
        d => Changer::new(server, d).await?,
    };
    let keeper = match driver {
        "nacos-grpc" => Changer::new(server, "nacos-http").await?,
        d => Changer::new(server, d).await?,
    };
    keeper.add(&svc, "127.0.0.1", 1).await?;
    let addr = |i: usize| ("127.0.0.2".to_owned(), 1000 + i as u16);
    let producer = Arc::new(producer);
    if driver == "watch" {
        // Instances first, then the watches, which start from the full list.
        load::for_each(n, 64, "instances", |i| {
            let p = producer.clone();
            let svc = svc.clone();
            async move {
                let (ip, port) = addr(i);
                p.add(&svc, &ip, port).await
            }
        })
        .await?;
    }
    let state = Arc::new(Churn {
        full: (0..n).map(|_| Default::default()).collect(),
        full_count: AtomicUsize::new(0),
        finished: (0..n).map(|_| Default::default()).collect(),
        t0: Mutex::new(None),
        finals: Mutex::new(Vec::new()),
        changed: Notify::new(),
    });
    let counts: Arc<Vec<std::sync::atomic::AtomicI64>> = Arc::new(
        (0..n)
            .map(|_| std::sync::atomic::AtomicI64::new(full_len as i64))
            .collect(),
    );
    let on_update: Arc<dyn Fn(usize, Update<'_>) + Send + Sync> = {
        let state = state.clone();
        let counts = counts.clone();
        Arc::new(move |i, u| match u {
            Update::Ports(ports) => state.observe(i, count(ports), full_len),
            Update::Event { deleted, .. } => {
                let left = if deleted {
                    counts[i].fetch_sub(1, Ordering::AcqRel) - 1
                } else {
                    counts[i].load(Ordering::Acquire)
                };
                state.observe(i, left.max(0) as usize, full_len);
            }
        })
    };
    let held = subscribers(server, driver, &svc, n, on_update).await?;
    if driver == "watch" {
        for i in 0..n {
            state.observe(i, full_len, full_len);
        }
    } else {
        load::for_each(n, 64, "instances", |i| {
            let p = producer.clone();
            let svc = svc.clone();
            async move {
                let (ip, port) = addr(i);
                p.add(&svc, &ip, port).await
            }
        })
        .await?;
    }
    let all_full = state
        .until(Duration::from_secs(30), || {
            state.full_count.load(Ordering::Acquire) == n
        })
        .await;
    if !all_full {
        let behind = if server.system == System::Gangway {
            laggards(server, &svc).await
        } else {
            String::new()
        };
        anyhow::bail!(
            "only {} of {n} subscribers saw all {full_len} instances within 30 s{behind}",
            state.full_count.load(Ordering::Acquire)
        );
    }
    let meter = CpuMeter::start(server);
    let t0 = Instant::now();
    *state.t0.lock().unwrap() = Some(t0);
    load::for_each(n, 64, "deregister", |i| {
        let p = producer.clone();
        let svc = svc.clone();
        async move {
            let (ip, port) = addr(i);
            p.remove(&svc, &ip, port).await
        }
    })
    .await?;
    let deregistered = t0.elapsed();
    let all_final = state
        .until(Duration::from_secs(60), || {
            state.finals.lock().unwrap().len() == n
        })
        .await;
    let cpu = meter.stop();
    let behind = if all_final || server.system != System::Gangway {
        String::new()
    } else {
        laggards(server, &svc).await
    };
    drop(held);
    let mut finals = state.finals.lock().unwrap().clone();
    finals.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let p50 = finals.get(finals.len() / 2).map(|d| ms(*d));
    Ok(vec![Row {
        system: server.system,
        driver: driver.into(),
        group: String::new(),
        values: vec![
            Some(n as f64),
            Some(ms(deregistered)),
            p50,
            all_final.then(|| finals.last().map(|d| ms(*d))).flatten(),
        ],
        cpu: Some(cpu),
        note: if all_final {
            if driver == "nacos-grpc" {
                "instances via v1 HTTP leases".into()
            } else {
                String::new()
            }
        } else {
            format!(
                "only {} of {n} subscribers reached the final list within 60 s{behind}",
                finals.len()
            )
        },
    }])
}

/// What gangway's subscriber table says of `svc`'s subscribers behind its revision: how many
/// were pushed the latest revision and how many acked it (", server: ..."), for a run that did
/// not converge.
async fn laggards(server: &Server, svc: &str) -> String {
    let url = format!(
        "http://{}/v1/services/{svc}/subscribers?namespace={}&group={}",
        server.http,
        crate::drivers::NAMESPACE,
        crate::drivers::GROUP
    );
    let Ok(resp) = reqwest::get(url).await else {
        return String::new();
    };
    let Ok(v) = resp.json::<Value>().await else {
        return String::new();
    };
    let revision = v["revision"].as_u64().unwrap_or(0);
    let subs = v["subscribers"].as_array().cloned().unwrap_or_default();
    let pushed = subs
        .iter()
        .filter(|s| s["pushed_revision"].as_u64() == Some(revision))
        .count();
    let acked = subs
        .iter()
        .filter(|s| s["acked_revision"].as_u64() == Some(revision))
        .count();
    format!(
        "; server: {} subscribers, {pushed} pushed and {acked} acked the latest revision",
        subs.len()
    )
}

const MB: f64 = 1024.0 * 1024.0;

async fn scale(ctx: &Ctx, server: &Server, driver: &str) -> anyhow::Result<Vec<Row>> {
    if driver == "max-sessions" {
        return max_sessions(ctx, server).await;
    }
    let s = ctx.params.sessions;
    let per = 10usize;
    tokio::time::sleep(ctx.params.settle).await;
    let rss0 = server.rss();
    let meter = CpuMeter::start(server);
    // 1,000 services of 100 instances (sessions i, i+100, ... share a service), each session's
    // 10 instances in 10 different services (a Nacos connection keeps one per service).
    let svc = |i: usize, j: usize| format!("bench-scale-{}-{j}", i % 100);
    let addr = |i: usize, j: usize| instance_addr(i, j as u64);
    let (rss1, rss2, _held): (u64, u64, Box<dyn std::any::Any + Send>) = match driver {
        "native-grpc" => {
            let sessions = native_sessions(server, s, "sessions").await?;
            tokio::time::sleep(ctx.params.settle).await;
            let rss1 = server.rss();
            load::for_each(s, 128, "instances (10 per session)", |i| {
                let sess = sessions[i].clone();
                async move {
                    for j in 0..per {
                        let (ip, port) = addr(i, j);
                        sess.register(&svc(i, j), &ip, port).await?;
                    }
                    Ok(())
                }
            })
            .await?;
            tokio::time::sleep(ctx.params.settle).await;
            (rss1, server.rss(), Box::new(sessions))
        }
        "nacos-grpc" => {
            let conns = nacos_conns(server, s, "connections").await?;
            tokio::time::sleep(ctx.params.settle).await;
            let rss1 = server.rss();
            load::for_each(s, 128, "instances (10 per connection)", |i| {
                let c = conns[i].clone();
                async move {
                    for j in 0..per {
                        let (ip, port) = addr(i, j);
                        c.register(&svc(i, j), &ip, port).await?;
                    }
                    Ok(())
                }
            })
            .await?;
            tokio::time::sleep(ctx.params.settle).await;
            (rss1, server.rss(), Box::new(conns))
        }
        "lease+put" => {
            let e = Etcd::new(http_client(128), server.http);
            let leases = load::for_each(s, 128, "leases", |_| {
                let e = e.clone();
                async move { e.grant(3600).await }
            })
            .await?;
            tokio::time::sleep(ctx.params.settle).await;
            let rss1 = server.rss();
            let leases = Arc::new(leases);
            load::for_each(s, 128, "keys (10 per lease)", |i| {
                let e = e.clone();
                let leases = leases.clone();
                async move {
                    for j in 0..per {
                        let (ip, port) = addr(i, j);
                        e.put(
                            &etcd::key(&svc(i, j), &ip, port),
                            r#"{"weight":1.0}"#,
                            Some(&leases[i]),
                        )
                        .await?;
                    }
                    Ok(())
                }
            })
            .await?;
            tokio::time::sleep(ctx.params.settle).await;
            (rss1, server.rss(), Box::new(()))
        }
        other => anyhow::bail!("no scale driver {other}"),
    };
    let cpu = meter.stop();
    let instances = (s * per) as f64;
    Ok(vec![Row {
        system: server.system,
        driver: driver.into(),
        group: String::new(),
        values: vec![
            Some(s as f64),
            Some(instances),
            Some(rss0 as f64 / MB),
            Some(rss1 as f64 / MB),
            Some(rss2 as f64 / MB),
            Some(rss1.saturating_sub(rss0) as f64 / s as f64),
            Some(rss2.saturating_sub(rss1) as f64 / instances),
        ],
        cpu: Some(cpu),
        note: format!(
            "load generator RSS {:.0} MB",
            crate::stats::rss_bytes(std::process::id()).unwrap_or(0) as f64 / MB
        ),
    }])
}

/// Opens idle sessions, 100 per connection, until `max_sessions` or the first failures.
async fn max_sessions(ctx: &Ctx, server: &Server) -> anyhow::Result<Vec<Row>> {
    const PER_CONNECTION: usize = 100;
    let target = ctx.params.max_sessions;
    tokio::time::sleep(ctx.params.settle).await;
    let rss0 = server.rss();
    let meter = CpuMeter::start(server);
    let failures = Arc::new(AtomicUsize::new(0));
    let first_error: Arc<Mutex<Option<String>>> = Arc::default();
    let chunks = target.div_ceil(PER_CONNECTION);
    let addr = server.grpc;
    let start = Instant::now();
    let held = load::for_each(
        chunks,
        16,
        &format!("sessions ({PER_CONNECTION} per connection)"),
        |c| {
            let failures = failures.clone();
            let first_error = first_error.clone();
            async move {
                let n = PER_CONNECTION.min(target - c * PER_CONNECTION);
                if failures.load(Ordering::Relaxed) > 0 {
                    return Ok(Vec::new());
                }
                let ch = match channel(addr).await {
                    Ok(ch) => ch,
                    Err(e) => {
                        failures.fetch_add(n, Ordering::Relaxed);
                        first_error.lock().unwrap().get_or_insert(format!("{e:#}"));
                        return Ok(Vec::new());
                    }
                };
                let opened = futures::future::join_all((0..n).map(|i| {
                    let ch = ch.clone();
                    async move { Session::open(ch, &format!("idle-{c}-{i}"), None).await }
                }))
                .await;
                let mut ok = Vec::with_capacity(n);
                for r in opened {
                    match r {
                        Ok(s) => ok.push(s),
                        Err(e) => {
                            failures.fetch_add(1, Ordering::Relaxed);
                            first_error.lock().unwrap().get_or_insert(format!("{e:#}"));
                        }
                    }
                }
                Ok(ok)
            }
        },
    )
    .await?;
    let opened: usize = held.iter().map(Vec::len).sum();
    let took = start.elapsed();
    tokio::time::sleep(ctx.params.settle).await;
    let rss1 = server.rss();
    let cpu = meter.stop();
    let mut note = format!(
        "opened in {:.1} s; load generator RSS {:.0} MB",
        took.as_secs_f64(),
        crate::stats::rss_bytes(std::process::id()).unwrap_or(0) as f64 / MB
    );
    if let Some(e) = first_error.lock().unwrap().as_ref() {
        note.push_str(&format!(
            "; {} failed, first: {}",
            failures.load(Ordering::Relaxed),
            truncate(e, 100)
        ));
    }
    drop(held);
    Ok(vec![Row {
        system: server.system,
        driver: "max-sessions".into(),
        group: "max".into(),
        values: vec![
            Some(opened as f64),
            Some(0.0),
            Some(rss0 as f64 / MB),
            Some(rss1 as f64 / MB),
            Some(rss1 as f64 / MB),
            Some(rss1.saturating_sub(rss0) as f64 / opened.max(1) as f64),
            None,
        ],
        cpu: Some(cpu),
        note,
    }])
}

/// Registrations timed at each big-service size.
const BIG_SERVICE_WINDOW: usize = 200;

/// One service filled one registration at a time over one connection; at each size, the mean
/// time of the next [`BIG_SERVICE_WINDOW`] registrations.
async fn big_service(ctx: &Ctx, server: &Server, driver: &str) -> anyhow::Result<Vec<Row>> {
    const SVC: &str = "bench-big";
    let http = http_client(1);
    let ttl_s = 3600;
    let lease = if driver == "put" {
        Some(Etcd::new(http.clone(), server.http).grant(ttl_s).await?)
    } else {
        None
    };
    let rest = Rest::new(http.clone(), server.http);
    let nacos = NacosHttp::new(http.clone(), server.http);
    let etcd = Etcd::new(http, server.http);
    let register = |n: usize| {
        let (ip, port) = instance_addr(0, n as u64);
        let (rest, nacos, etcd, lease) = (&rest, &nacos, &etcd, &lease);
        async move {
            match driver {
                "rest" => rest.register_lease(SVC, &ip, port, ttl_s * 1000).await,
                "nacos-http" => nacos.register(SVC, &ip, port, true).await,
                "put" => {
                    let key = etcd::key(SVC, &ip, port);
                    etcd.put(&key, &format!("{ip}:{port}"), lease.as_deref())
                        .await
                }
                other => anyhow::bail!("no big-service driver {other}"),
            }
        }
    };
    let sizes = &ctx.params.big_service_sizes;
    let last = sizes.last().copied().unwrap_or(0) + BIG_SERVICE_WINDOW;
    let bar = load::bar(
        last as u64,
        format!("{} {driver} big-service", server.system),
    );
    let meter = CpuMeter::start(server);
    let mut values = Vec::new();
    let mut n = 0;
    for &size in sizes {
        while n < size {
            register(n).await?;
            n += 1;
            bar.inc(1);
        }
        let started = Instant::now();
        for _ in 0..BIG_SERVICE_WINDOW {
            register(n).await?;
            n += 1;
            bar.inc(1);
        }
        let us = started.elapsed().as_secs_f64() * 1e6 / BIG_SERVICE_WINDOW as f64;
        values.push(Some(us));
    }
    bar.finish_and_clear();
    let ratio = match (values.first(), values.last()) {
        (Some(Some(a)), Some(Some(b))) if *a > 0.0 => Some(b / a),
        _ => None,
    };
    values.push(ratio);
    Ok(vec![Row {
        system: server.system,
        driver: driver.into(),
        group: String::new(),
        values,
        cpu: Some(meter.stop()),
        note: String::new(),
    }])
}
