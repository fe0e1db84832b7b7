//! `durable`: persistent registrations, each acknowledged after sync to disk, closed loop then
//! open loop.

use std::sync::Arc;

use super::lineup::{self, Entry, OfPersistent, Plan};
use super::measure::{Op, load_columns, load_rows};
use super::{Ctx, Params};
use crate::drivers::{Persist, Serves, instance_addr};
use crate::report::{Row, Table};
use crate::system::Server;

/// The table and the lineup.
pub(super) fn plan(p: &Params) -> Plan {
    let table = Table::new(
        "durable",
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
    );
    Plan::new(table, lineup::persistent::<Measured>())
}

/// This workload's measurement, as a type (its lineup's entries).
struct Measured;

impl OfPersistent for Measured {
    fn entry<S: Serves<D>, D: Persist>() -> Entry {
        Entry::new::<S, D>(|ctx, server| Box::pin(measure::<D>(ctx, server)))
    }
}

async fn measure<D: Persist>(ctx: &Ctx, server: &Server) -> anyhow::Result<Vec<Row>> {
    let client = Arc::new(D::connect(server, ctx.params.concurrency).await?);
    let op: Op = Arc::new(move |w, n| {
        let client = client.clone();
        Box::pin(async move {
            let (ip, port) = instance_addr(w, n);
            let svc = format!("bench-durable-{w}-{}", n / 100);
            D::register(&client, &svc, &ip, port).await
        })
    });
    Ok(load_rows(ctx, server, D::NAME, op).await)
}
