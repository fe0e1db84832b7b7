//! `fanout`: S subscribers of one service; one instance is added at a time; the time from the
//! change to the last subscriber holding it.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::lineup::{self, Entry, OfSubscribers, Plan};
use super::measure::truncate;
use super::{Ctx, Params};
use crate::drivers::{
    NativeGrpc, OnGangwayCluster, OnUpdate, Register, Serves, Subscribe, Update, etcd,
};
use crate::load::{self, Percentiles};
use crate::report::{Row, Table};
use crate::system::{CpuMeter, Server};

/// Columns of a row: the subscriber count first.
const COLUMNS: [&str; 6] = [
    "subscribers",
    "p50 ms (last)",
    "p99 ms (last)",
    "max ms (last)",
    "p50 ms (each)",
    "incomplete",
];

/// How long a change may take to reach every subscriber before it counts as incomplete.
const ROUND_TIMEOUT: Duration = Duration::from_secs(3);

/// The table and the lineup.
pub(super) fn plan(p: &Params) -> Plan {
    let table = Table::new(
        "fanout",
        format!(
            "S subscribers of one service, {} changes each: time from the change to the last subscriber holding it",
            p.fanout_changes
        ),
        COLUMNS.iter().map(|c| (*c).to_owned()).collect(),
        2,
        false,
        vec![
            "gangway native: the snapshot received (and acked at once); Nacos: the NotifySubscriberRequest received (and answered); etcd: the watch event received.".into(),
            "rnacos coalesces changes for about 500 ms before it pushes (its DelayNotifyActor).".into(),
            "gangway-cluster: the changes registered on node-1, subscriber i on node i mod 3: the time until the last subscriber of any node holds the change.".into(),
        ],
    );
    let mut entries = lineup::subscribers::<Measured>();
    entries.push(Measured::entry::<OnGangwayCluster, NativeGrpc>());
    Plan::new(table, entries)
}

/// This workload's measurement, as a type (its lineup's entries).
struct Measured;

impl OfSubscribers for Measured {
    fn entry<S: Serves<D>, D: Subscribe>() -> Entry {
        Entry::new::<S, D>(|ctx, server| Box::pin(measure::<D>(ctx, server)))
    }
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

    /// Waits until every subscriber saw the round (its time) or `timeout` passed (`None`).
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

/// Whether `ports` holds `p`.
fn contains(ports: &mut dyn Iterator<Item = u64>, p: u64) -> bool {
    for x in ports {
        if x == p {
            return true;
        }
    }
    false
}

/// A row per subscriber count; a size that fails gets a row saying why.
async fn measure<D: Subscribe>(ctx: &Ctx, server: &Server) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for &n in &ctx.params.fanout_sizes {
        let svc = format!("bench-fan-{n}-{}", D::NAME.replace('+', ""));
        let group = format!("S={n}");
        let mut row = match size::<D>(ctx, server, &svc, n).await {
            Ok(row) => row,
            Err(e) => {
                let mut row = Row::failed(
                    server.system,
                    D::NAME,
                    "",
                    COLUMNS.len(),
                    truncate(&format!("failed: {e:#}"), 200),
                );
                row.values[0] = Some(n as f64);
                row
            }
        };
        row.group = group;
        rows.push(row);
    }
    Ok(rows)
}

/// One subscriber count `n`: the changes, one at a time.
async fn size<D: Subscribe>(
    ctx: &Ctx,
    server: &Server,
    svc: &str,
    n: usize,
) -> anyhow::Result<Row> {
    // A standing instance (port 1) so no list is ever empty; changes add ports 1000 + k.
    let keeper = D::Producer::connect(server, 1).await?;
    D::Producer::register(&keeper, 0, svc, "127.0.0.1", 1).await?;
    let changer = D::Producer::connect(server, 1).await?;
    let rounds = Rounds::new(n);
    let on_update: OnUpdate = {
        let rounds = rounds.clone();
        let svc = svc.to_owned();
        Arc::new(move |i, u| match u {
            Update::Ports(ports) => rounds.saw(i, |p| contains(ports, p)),
            Update::Event { key, deleted } => rounds.saw(i, |p| {
                !deleted && key == etcd::b64(etcd::key(&svc, "127.0.0.1", p as u16).as_bytes())
            }),
        })
    };
    let held = D::subscribe(server, svc, n, on_update).await?;
    // Let the initial pushes settle (rnacos delays pushes by about 500 ms).
    tokio::time::sleep(Duration::from_millis(700)).await;
    let mut last = load::histogram();
    let mut incomplete = 0u64;
    let changes = ctx.params.fanout_changes as u64;
    let pb = load::bar(changes, format!("{} {} S={n}", server.system, D::NAME));
    let meter = CpuMeter::start(server);
    for k in 1..=changes {
        let port = 1000 + k;
        rounds.arm(k, port);
        D::Producer::register(&changer, 0, svc, "127.0.0.1", port as u16).await?;
        match rounds.wait(ROUND_TIMEOUT).await {
            Some(d) => load::record(&mut last, d),
            None => incomplete += 1,
        }
        pb.inc(1);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cpu = meter.stop();
    pb.finish_and_clear();
    let reconnects = D::reconnects(&held);
    drop(held);
    let l = Percentiles::of(&last);
    let each = Percentiles::of(&rounds.each.lock().unwrap());
    let have = |v: f64| (l.count > 0).then_some(v);
    Ok(Row::measured(
        server.system,
        D::NAME,
        vec![
            Some(n as f64),
            have(l.p50_ms),
            have(l.p99_ms),
            have(l.max_ms),
            Some(each.p50_ms),
            Some(incomplete as f64),
        ],
        cpu,
        [
            (incomplete > 0)
                .then(|| format!("{incomplete} changes did not reach every subscriber within 3 s")),
            (reconnects > 0).then(|| {
                format!("{reconnects} subscriber connections ended by the server and reopened")
            }),
        ]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join("; "),
    ))
}
