//! `big-service`: one service grows to 20,000 instances, registered one after another over one
//! connection: the cost of a registration at each size (issue 10: flat in the service's size).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;

use super::lineup::{Entry, Plan};
use super::{Ctx, Params};
use crate::drivers::native::{Session, SnapshotHandler};
use crate::drivers::rest_driver;
use crate::drivers::{
    EtcdPut, NacosV1, OnEtcd, OnGangway, OnRnacos, Register, RestApi, Serves, channel,
    instance_addr,
};
use crate::load;
use crate::report::{self, Row, Table};
use crate::system::{CpuMeter, Server, System};

/// Registrations timed at each size.
const WINDOW: usize = 200;
/// The service.
const SERVICE: &str = "bench-big";
/// How long a push to the bytes-per-change subscriber may take to arrive.
const PUSH_WAIT: Duration = Duration::from_secs(30);

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
            .chain([
                "largest ÷ smallest".into(),
                "full push B".into(),
                "delta push B".into(),
            ])
            .collect(),
        sizes.len(),
        false,
        vec![
            format!("each size: the mean of the next {WINDOW} registrations once the service holds that many; gangway rest: leases; etcd: puts under one lease."),
            "largest ÷ smallest: the cost of a registration in the biggest service over that in the smallest (1 is flat).".into(),
            "full / delta push B (gangway only): a native subscriber joining the biggest service gets the whole view; the next registration reaches it as a delta against the revision it acked. Sizes of the protobuf Snapshot.".into(),
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
    let (full, delta) = if server.system == System::Gangway {
        let (full, delta) = push_bytes(server, n, || register(n)).await?;
        (Some(full as f64), Some(delta as f64))
    } else {
        (None, None)
    };
    values.extend([full, delta]);
    Ok(vec![Row::measured(
        server.system,
        D::NAME,
        values,
        meter.stop(),
        "",
    )])
}

/// Waits until the registry holds the ack of the push-bytes subscriber for the service's
/// current revision: a delta is computed against the revision a subscriber acked.
async fn acked(server: &Server) -> anyhow::Result<()> {
    let rest = rest_driver::client(server, 1)?;
    let service = rest_driver::service(SERVICE);
    let deadline = Instant::now() + PUSH_WAIT;
    loop {
        let listing = rest.subscribers(&service).await?.parse()?;
        let done = listing.subscribers.iter().any(|s| {
            s.client_name.as_deref() == Some("bench-push-bytes")
                && s.acked_revision == listing.revision
        });
        if done {
            return Ok(());
        }
        if Instant::now() > deadline {
            anyhow::bail!("the push-bytes subscriber did not ack within {PUSH_WAIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A native subscriber joins the service of `held` instances, then `change` registers one
/// more: the bytes of the push that brought the whole view, and of the one that brought the
/// change (a delta against the revision the subscriber acked).
async fn push_bytes<F: std::future::Future<Output = anyhow::Result<()>>>(
    server: &Server,
    held: usize,
    change: impl FnOnce() -> F,
) -> anyhow::Result<(usize, usize)> {
    let seen: Arc<Mutex<Vec<(usize, usize)>>> = Arc::default();
    let handler: SnapshotHandler = {
        let seen = seen.clone();
        Arc::new(move |view| {
            seen.lock()
                .unwrap()
                .push((view.instances.len(), view.last_push_bytes))
        })
    };
    let session = Session::open(
        channel(server.grpc).await?,
        "bench-push-bytes",
        Some(handler),
    )
    .await?;
    session.subscribe(SERVICE).await?;
    let pushed = |count: usize| {
        let seen = seen.clone();
        async move {
            let deadline = Instant::now() + PUSH_WAIT;
            loop {
                if let Some((_, bytes)) = seen.lock().unwrap().iter().find(|(n, _)| *n == count) {
                    return Ok(*bytes);
                }
                if Instant::now() > deadline {
                    anyhow::bail!("no push holding {count} instances within {PUSH_WAIT:?}");
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    let full = pushed(held).await.context("the subscriber's first push")?;
    acked(server).await?;
    change().await?;
    let delta = pushed(held + 1).await.context("the push of one change")?;
    Ok((full, delta))
}
