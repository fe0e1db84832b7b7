//! `query`: list a 10-instance service, closed loop then open loop.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::lineup::{Entry, Plan};
use super::measure::{Op, load_columns, load_rows};
use super::{Ctx, Params};
use crate::drivers::{
    EtcdLeasePut, EtcdRange, List, NacosV1, NativeGrpc, OnEtcd, OnGangway, OnRnacos, Register,
    RestApi, Serves,
};
use crate::report::{Row, Table};
use crate::system::Server;

const SERVICE: &str = "bench-query";
/// Instances of the listed service.
const INSTANCES: u16 = 10;

/// The table and the lineup: each lister with the provider that keeps the ten instances alive
/// on its system.
pub(super) fn plan(p: &Params) -> Plan {
    let table = Table::new(
        "query",
        format!(
            "list a 10-instance service, {} clients for {:?} (closed loop); latency open loop at {}/s",
            p.concurrency, p.duration, p.open_rate
        ),
        load_columns("queries"),
        0,
        true,
        vec![],
    );
    Plan::new(
        table,
        vec![
            on::<OnGangway, RestApi, NativeGrpc>(),
            on::<OnGangway, NacosV1, NativeGrpc>(),
            on::<OnRnacos, NacosV1, NacosV1>(),
            on::<OnEtcd, EtcdRange, EtcdLeasePut>(),
        ],
    )
}

/// Lister `D`, the instances kept by provider `P` (a session, v1 HTTP leases, etcd leases).
fn on<S: Serves<D> + Serves<P>, D: List, P: Register>() -> Entry {
    Entry::new::<S, D>(|ctx, server| Box::pin(measure::<D, P>(ctx, server)))
}

async fn measure<D: List, P: Register>(ctx: &Ctx, server: &Server) -> anyhow::Result<Vec<Row>> {
    // Ten instances, kept alive for the whole phase (v1 HTTP leases stay healthy for 15 s + 3 s
    // without beats: longer than the phase).
    let provider = P::connect(server, 1).await?;
    for i in 0..INSTANCES {
        P::register(&provider, 0, SERVICE, "127.0.0.1", 8000 + i).await?;
    }
    let client = Arc::new(D::connect(server, ctx.params.concurrency).await?);
    // rnacos indexes asynchronously: give the list a moment to fill.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let n = D::count(&client, SERVICE).await?;
        if n == usize::from(INSTANCES) {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "expected {INSTANCES} instances, the list has {n}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let op: Op = Arc::new(move |_, _| {
        let client = client.clone();
        Box::pin(async move { D::list(&client, SERVICE).await })
    });
    let rows = load_rows(ctx, server, D::NAME, op).await;
    drop(provider);
    Ok(rows)
}
