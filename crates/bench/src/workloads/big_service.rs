//! `big-service`: one service grows to 20,000 instances, registered one after another over one
//! connection: the cost of a registration at each size (issue 10: flat in the service's size).

use std::time::Instant;

use super::lineup::{Entry, Plan};
use super::{Ctx, Params};
use crate::drivers::{
    EtcdPut, NacosV1, OnEtcd, OnGangway, OnRnacos, Register, RestApi, Serves, instance_addr,
};
use crate::load;
use crate::report::{self, Row, Table};
use crate::system::{CpuMeter, Server};

/// Registrations timed at each size.
const WINDOW: usize = 200;
/// The service.
const SERVICE: &str = "bench-big";

/// The table and the lineup.
pub(super) fn plan(p: &Params) -> Plan {
    let sizes = &p.big_service_sizes;
    let table = Table::new(
        "big-service",
        format!(
            "one service grows to {} instances, registered one after another over one connection: µs per registration at each size",
            sizes.last().copied().unwrap_or(0)
        ),
        sizes
            .iter()
            .map(|n| format!("µs/reg at {}", report::format_number(*n as f64)))
            .chain(["largest ÷ smallest".into()])
            .collect(),
        sizes.len(),
        false,
        vec![
            format!("each size: the mean of the next {WINDOW} registrations once the service holds that many; gangway rest: leases; etcd: puts under one lease."),
            "largest ÷ smallest: the cost of a registration in the biggest service over that in the smallest (1 is flat).".into(),
        ],
    );
    Plan::new(
        table,
        vec![
            on::<OnGangway, RestApi>(),
            on::<OnGangway, NacosV1>(),
            on::<OnRnacos, NacosV1>(),
            on::<OnEtcd, EtcdPut>(),
        ],
    )
}

fn on<S: Serves<D>, D: Register>() -> Entry {
    Entry::new::<S, D>(|ctx, server| Box::pin(measure::<D>(ctx, server)))
}

/// The service filled one registration at a time; at each size, the mean time of the next
/// [`WINDOW`] registrations.
async fn measure<D: Register>(ctx: &Ctx, server: &Server) -> anyhow::Result<Vec<Row>> {
    let client = D::connect(server, 1).await?;
    let register = |n: usize| {
        let (ip, port) = instance_addr(0, n as u64);
        let client = &client;
        async move { D::register(client, 0, SERVICE, &ip, port).await }
    };
    let sizes = &ctx.params.big_service_sizes;
    let last = sizes.last().copied().unwrap_or(0) + WINDOW;
    let bar = load::bar(
        last as u64,
        format!("{} {} big-service", server.system, D::NAME),
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
        for _ in 0..WINDOW {
            register(n).await?;
            n += 1;
            bar.inc(1);
        }
        let us = started.elapsed().as_secs_f64() * 1e6 / WINDOW as f64;
        values.push(Some(us));
    }
    bar.finish_and_clear();
    let ratio = match (values.first(), values.last()) {
        (Some(Some(a)), Some(Some(b))) if *a > 0.0 => Some(b / a),
        _ => None,
    };
    values.push(ratio);
    Ok(vec![Row::measured(
        server.system,
        D::NAME,
        values,
        meter.stop(),
        "",
    )])
}
