//! A workload's lineup: the (system, driver) pairs it runs, each checked by the compiler, and
//! the loop that runs them in the order of `--peers`, a fresh server per pair.

use futures::future::BoxFuture;

use super::Ctx;
use super::measure::truncate;
use crate::drivers::{
    Driver, EtcdPut, EtcdWatch, NacosGrpc, NacosV1Persistent, NativeGrpc, OnEtcd, OnGangway,
    OnRnacos, Persist, RestPersistent, Serves, Subscribe,
};
use crate::report::{Row, Table};
use crate::system::{Server, System};

/// Measures one (system, driver) pair on a server started for it (which it may kill and start
/// again): the pair's rows.
pub(crate) type Measure =
    for<'a> fn(&'a Ctx, &'a mut Server) -> BoxFuture<'a, anyhow::Result<Vec<Row>>>;

/// One (system, driver) pair of a lineup and what measures it.
pub(crate) struct Entry {
    system: System,
    driver: &'static str,
    measure: Measure,
}

/// A workload ready to run: its table, still without rows, and its lineup.
pub(crate) struct Plan {
    table: Table,
    lineup: Vec<Entry>,
}

/// A workload that measures every [`Persist`] driver the same way: [`persistent`] is its
/// lineup.
pub(crate) trait OfPersistent {
    /// Driver `D` on system `S`, measured by this workload.
    fn entry<S: Serves<D>, D: Persist>() -> Entry;
}

/// A workload that measures every [`Subscribe`] driver the same way: [`subscribers`] is its
/// lineup.
pub(crate) trait OfSubscribers {
    /// Driver `D` on system `S`, measured by this workload.
    fn entry<S: Serves<D>, D: Subscribe>() -> Entry;
}

/// Each system's driver of durable instances (written once for `durable` and `restart`).
pub(crate) fn persistent<W: OfPersistent>() -> Vec<Entry> {
    vec![
        W::entry::<OnGangway, RestPersistent>(),
        W::entry::<OnRnacos, NacosV1Persistent>(),
        W::entry::<OnEtcd, EtcdPut>(),
    ]
}

/// Each system's subscribers (written once for `fanout` and `churn`).
pub(crate) fn subscribers<W: OfSubscribers>() -> Vec<Entry> {
    vec![
        W::entry::<OnGangway, NativeGrpc>(),
        W::entry::<OnGangway, NacosGrpc>(),
        W::entry::<OnRnacos, NacosGrpc>(),
        W::entry::<OnEtcd, EtcdWatch>(),
    ]
}

impl Entry {
    /// Driver `D` on system `S`, measured by `measure`; compiles only where `S` serves `D`.
    pub(crate) fn new<S: Serves<D>, D: Driver>(measure: Measure) -> Entry {
        Entry {
            system: S::SYSTEM,
            driver: D::NAME,
            measure,
        }
    }
}

impl Plan {
    /// `table` filled by the pairs of `lineup`.
    pub(crate) fn new(table: Table, lineup: Vec<Entry>) -> Plan {
        Plan { table, lineup }
    }

    /// Runs every pair whose system `ctx` asks for, systems in `ctx`'s order; a server that
    /// does not start or a measurement that fails gives a row saying why.
    pub(crate) async fn run(self, ctx: &Ctx) -> Table {
        let Plan { mut table, lineup } = self;
        let width = table.columns.len();
        for &system in &ctx.systems {
            // A fresh server per driver: what one driver leaves behind (expiring leases,
            // thousands of closing sessions) must not load the next one's measurement.
            for entry in lineup.iter().filter(|e| e.system == system) {
                eprintln!("-- {}: {system} {}", table.workload, entry.driver);
                let mut server = match Server::start(system, &ctx.bins).await {
                    Ok(s) => s,
                    Err(e) => {
                        let why = format!("{e:#}");
                        let first = why.lines().next().unwrap_or("");
                        table
                            .rows
                            .push(Row::failed(system, entry.driver, "", width, first));
                        continue;
                    }
                };
                match (entry.measure)(ctx, &mut server).await {
                    Ok(rows) => table.rows.extend(rows),
                    Err(e) => table.rows.push(Row::failed(
                        system,
                        entry.driver,
                        "",
                        width,
                        truncate(&format!("failed: {e:#}"), 200),
                    )),
                }
                server.stop().await;
            }
        }
        table.fill_cluster_ratios();
        table
    }
}
