//! `scale`: sessions, then 10 ephemeral instances each: the server's RSS per session and per
//! instance; then gangway alone with idle sessions multiplexed 100 per connection, as many as
//! it takes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::lineup::{Entry, Plan};
use super::measure::{MB, own_rss_mb, truncate};
use super::{Ctx, Params};
use crate::drivers::native::Session;
use crate::drivers::{
    Driver as _, EtcdLeasePut, Hold, MaxSessions, NacosGrpc, NativeGrpc, OnEtcd, OnGangway,
    OnRnacos, Serves, channel, instance_addr,
};
use crate::load;
use crate::report::{Row, Table};
use crate::system::{CpuMeter, Server};

/// Instances each session registers.
const PER_SESSION: usize = 10;
/// Sessions per connection in the max-sessions probe.
const PER_CONNECTION: usize = 100;

/// The table and the lineup.
pub(super) fn plan(p: &Params) -> Plan {
    let table = Table::new(
        "scale",
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
    );
    Plan::new(
        table,
        vec![
            on::<OnGangway, NativeGrpc>(),
            Entry::new::<OnGangway, MaxSessions>(|ctx, server| Box::pin(max_sessions(ctx, server))),
            on::<OnRnacos, NacosGrpc>(),
            on::<OnEtcd, EtcdLeasePut>(),
        ],
    )
}

fn on<S: Serves<D>, D: Hold>() -> Entry {
    Entry::new::<S, D>(|ctx, server| Box::pin(measure::<D>(ctx, server)))
}

async fn measure<D: Hold>(ctx: &Ctx, server: &Server) -> anyhow::Result<Vec<Row>> {
    let s = ctx.params.sessions;
    tokio::time::sleep(ctx.params.settle).await;
    let rss0 = server.rss();
    let meter = CpuMeter::start(server);
    // 1,000 services of 100 instances (sessions i, i+100, ... share a service), each session's
    // 10 instances in 10 different services (a Nacos connection keeps one per service).
    let svc = |i: usize, j: usize| format!("bench-scale-{}-{j}", i % 100);
    let sessions = D::open(server, s).await?;
    tokio::time::sleep(ctx.params.settle).await;
    let rss1 = server.rss();
    let sessions = &sessions;
    load::for_each(s, 128, "instances (10 per session)", |i| async move {
        for j in 0..PER_SESSION {
            let (ip, port) = instance_addr(i, j as u64);
            D::register(sessions, i, &svc(i, j), &ip, port).await?;
        }
        Ok(())
    })
    .await?;
    tokio::time::sleep(ctx.params.settle).await;
    let rss2 = server.rss();
    let cpu = meter.stop();
    let instances = (s * PER_SESSION) as f64;
    Ok(vec![Row::measured(
        server.system,
        D::NAME,
        vec![
            Some(s as f64),
            Some(instances),
            Some(rss0 as f64 / MB),
            Some(rss1 as f64 / MB),
            Some(rss2 as f64 / MB),
            Some(rss1.saturating_sub(rss0) as f64 / s as f64),
            Some(rss2.saturating_sub(rss1) as f64 / instances),
        ],
        cpu,
        format!("load generator RSS {:.0} MB", own_rss_mb()),
    )])
}

/// Opens idle sessions, 100 per connection, until `max_sessions` or the first failures.
async fn max_sessions(ctx: &Ctx, server: &Server) -> anyhow::Result<Vec<Row>> {
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
        own_rss_mb()
    );
    if let Some(e) = first_error.lock().unwrap().as_ref() {
        note.push_str(&format!(
            "; {} failed, first: {}",
            failures.load(Ordering::Relaxed),
            truncate(e, 100)
        ));
    }
    drop(held);
    let mut row = Row::measured(
        server.system,
        MaxSessions::NAME,
        vec![
            Some(opened as f64),
            Some(0.0),
            Some(rss0 as f64 / MB),
            Some(rss1 as f64 / MB),
            Some(rss1 as f64 / MB),
            Some(rss1.saturating_sub(rss0) as f64 / opened.max(1) as f64),
            None,
        ],
        cpu,
        note,
    );
    row.group = "max".into();
    Ok(vec![row])
}
