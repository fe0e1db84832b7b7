//! `register`: C clients register distinct ephemeral instances as fast as they can (closed
//! loop), then at a fixed rate (open loop, latency).

use std::sync::Arc;

use super::Params;
use super::lineup::{Entry, Plan};
use super::measure::{Op, load_columns, load_rows};
use crate::drivers::{
    EtcdLeasePut, NacosGrpc, NacosV1, NativeGrpc, OnEtcd, OnGangway, OnGangwayCluster, OnRnacos,
    Register, Serves, instance_addr,
};
use crate::report::{Row, Table};
use crate::system::Server;

/// The table and the lineup.
pub(super) fn plan(p: &Params) -> Plan {
    let table = Table::new(
        "register",
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
            "gangway-cluster: worker w's session on node w mod 3 (round robin); each instance is an etcd key bound to its node's lease.".into(),
        ],
    );
    Plan::new(
        table,
        vec![
            on::<OnGangway, NativeGrpc>(),
            on::<OnGangway, NacosGrpc>(),
            on::<OnGangway, NacosV1>(),
            on::<OnRnacos, NacosGrpc>(),
            on::<OnRnacos, NacosV1>(),
            on::<OnEtcd, EtcdLeasePut>(),
            on::<OnGangwayCluster, NativeGrpc>(),
        ],
    )
}

fn on<S: Serves<D>, D: Register>() -> Entry {
    Entry::new::<S, D>(|ctx, server| Box::pin(measure::<D>(ctx, server)))
}

/// Worker `w`'s service for its request `n`: each service takes 100 instances, so services stay
/// the size real ones have (a registry's per-change cost may grow with the service).
fn service(w: usize, n: u64) -> String {
    format!("bench-reg-{w}-{}", n / 100)
}

async fn measure<D: Register>(ctx: &super::Ctx, server: &Server) -> anyhow::Result<Vec<Row>> {
    let client = Arc::new(D::connect(server, ctx.params.concurrency).await?);
    let op: Op = Arc::new(move |w, n| {
        let client = client.clone();
        Box::pin(async move {
            let (ip, port) = instance_addr(w, n);
            D::register(&client, w, &service(w, n), &ip, port).await
        })
    });
    Ok(load_rows(ctx, server, D::NAME, op).await)
}
