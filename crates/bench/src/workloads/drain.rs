//! `drain`: S subscribers of one service spread over the nodes (native sessions that ack every
//! push); instances registered on the first node are drained, one at a time, through the last
//! node's REST API: the drain's call time and the wait for acks the server reports. On a
//! single node, every part is on that node; on `gangway-cluster` the drain waits for the
//! subscribers of every node (issue 11).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use gangway_wire::client::{InstanceRef, RestClient};

use super::lineup::{Entry, Plan};
use super::{Ctx, Params};
use crate::drivers::{
    Driver, NativeGrpc, OnGangway, OnGangwayCluster, OnUpdate, Register, Serves, Subscribe, Update,
    rest_driver,
};
use crate::load::{self, Percentiles};
use crate::report::{Row, Table};
use crate::system::{CpuMeter, Server};

/// Columns of a row.
const COLUMNS: [&str; 8] = [
    "subscribers",
    "drains",
    "p50 ms (call)",
    "p99 ms (call)",
    "p50 waited_ms",
    "p99 waited_ms",
    "acked (fewest)",
    "incomplete",
];

/// The column the ratios compare: the median call.
const KEY: usize = 2;

/// How long one drain may wait for acks (its `timeout_ms`): 10 s.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// How long every subscriber may take to hold a new instance before it is drained: 10 s.
const HOLD_TIMEOUT: Duration = Duration::from_secs(10);

/// The service drained.
const SERVICE: &str = "bench-drain";

/// Port of the instance that stays (a drain of the last serving instance is refused); the
/// drained ones take ports from 2001 on.
const KEEPER_PORT: u16 = 1;

/// The table and the lineup.
pub(super) fn plan(p: &Params) -> Plan {
    let table = Table::new(
        "drain",
        format!(
            "{} subscribers of one service (native sessions, spread over the nodes), {} drains of an instance registered on the first node, each through the last node's REST API",
            p.drain_subscribers, p.drains
        ),
        COLUMNS.iter().map(|c| (*c).to_owned()).collect(),
        KEY,
        false,
        vec![
            "call: POST .../drain from send to answer (the offline, then the wait until every subscriber acked); waited_ms: the wait the server reports (ms resolution).".into(),
            "acked (fewest): the fewest subscribers a drain reported as acked (all of them: every node's subscribers were waited for).".into(),
            "Each instance is held by every subscriber before its drain starts; one more instance stays.".into(),
        ],
    );
    Plan::new(table, vec![on::<OnGangway>(), on::<OnGangwayCluster>()])
}

fn on<S: Serves<NativeGrpc>>() -> Entry {
    Entry::new::<S, NativeGrpc>(|ctx, server| Box::pin(measure(ctx, server)))
}

/// The highest instance port each subscriber holds.
struct Held(Vec<AtomicU64>);

impl Held {
    /// How many subscribers hold port `port` or a later one.
    fn holding(&self, port: u64) -> usize {
        self.0
            .iter()
            .filter(|h| h.load(Ordering::Acquire) >= port)
            .count()
    }

    /// Waits until every subscriber holds `port` (polled every 2 ms), at most `timeout`.
    async fn wait_all(&self, port: u64, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let holding = self.holding(port);
            if holding == self.0.len() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "only {holding} of {} subscribers held instance port {port} within {timeout:?}",
                    self.0.len()
                );
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

/// One row: the drains, one after another.
async fn measure(ctx: &Ctx, server: &Server) -> anyhow::Result<Vec<Row>> {
    let (n, drains) = (ctx.params.drain_subscribers, ctx.params.drains);
    // Session 0 of the producer is on the first node.
    let producer = NativeGrpc::connect(server, 1).await?;
    NativeGrpc::register(&producer, 0, SERVICE, "127.0.0.1", KEEPER_PORT).await?;
    let held = Arc::new(Held((0..n).map(|_| AtomicU64::new(0)).collect()));
    let on_update: OnUpdate = {
        let held = held.clone();
        Arc::new(move |i, u| {
            if let Update::Ports(ports) = u
                && let Some(max) = ports.max()
            {
                held.0[i].fetch_max(max, Ordering::AcqRel);
            }
        })
    };
    let subscribers = NativeGrpc::subscribe(server, SERVICE, n, on_update).await?;
    let last = server.node(server.node_count() - 1);
    let rest = rest_driver::client_of(&last.http.to_string(), 1)?;
    let mut calls = load::histogram();
    let mut waited = load::histogram();
    let mut incomplete = 0u64;
    let mut fewest = n;
    let pb = load::bar(drains as u64, format!("{} drain S={n}", server.system));
    let meter = CpuMeter::start(server);
    for k in 1..=drains {
        let port = 2000 + k as u16;
        NativeGrpc::register(&producer, 0, SERVICE, "127.0.0.1", port).await?;
        held.wait_all(u64::from(port), HOLD_TIMEOUT).await?;
        let report = drain(&rest, port, &mut calls).await?;
        load::record(&mut waited, report.waited());
        incomplete += u64::from(!report.complete);
        fewest = fewest.min(report.acked.len());
        pb.inc(1);
    }
    let cpu = meter.stop();
    pb.finish_and_clear();
    drop(subscribers);
    let c = Percentiles::of(&calls);
    let w = Percentiles::of(&waited);
    let note = [
        (server.node_count() > 1).then(|| {
            format!(
                "instances on node-1, drains through node-{}, subscribers round robin",
                server.node_count()
            )
        }),
        (incomplete > 0).then(|| format!("{incomplete} drains timed out after {DRAIN_TIMEOUT:?}")),
    ]
    .into_iter()
    .flatten()
    .collect::<Vec<_>>()
    .join("; ");
    Ok(vec![Row::measured(
        server.system,
        NativeGrpc::NAME,
        vec![
            Some(n as f64),
            Some(drains as f64),
            Some(c.p50_ms),
            Some(c.p99_ms),
            Some(w.p50_ms),
            Some(w.p99_ms),
            Some(fewest as f64),
            Some(incomplete as f64),
        ],
        cpu,
        note,
    )])
}

/// Drains instance `127.0.0.1:port` of the service through `rest`, the call's time recorded
/// in `calls`: the server's report.
async fn drain(
    rest: &RestClient,
    port: u16,
    calls: &mut hdrhistogram::Histogram<u64>,
) -> anyhow::Result<gangway_core::drain::DrainReport> {
    let inst = InstanceRef {
        service: rest_driver::service(SERVICE),
        ip: "127.0.0.1".into(),
        port,
        cluster: None,
    };
    let t0 = Instant::now();
    let reply = rest
        .drain(&inst, DRAIN_TIMEOUT, false)
        .await
        .with_context(|| format!("draining 127.0.0.1:{port}"))?;
    load::record(calls, t0.elapsed());
    Ok(reply.parse()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn held_counts_subscribers_at_or_past_a_port() {
        let held = Held(vec![
            AtomicU64::new(2001),
            AtomicU64::new(2003),
            AtomicU64::new(0),
        ]);
        assert_eq!(held.holding(2001), 2);
        assert_eq!(held.holding(2002), 1);
        let e = held
            .wait_all(2001, Duration::from_millis(5))
            .await
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "only 2 of 3 subscribers held instance port 2001 within 5ms"
        );
        held.0[2].store(2001, Ordering::Release);
        held.wait_all(2001, Duration::from_millis(5)).await.unwrap();
    }
}
