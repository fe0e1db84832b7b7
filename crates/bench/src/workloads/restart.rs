//! `restart` (issue 10): fill the server with persistent instances, kill it with SIGKILL, start
//! it again on the same data directory, and measure the time until its health endpoint answers
//! and until a list of each service holds all its instances, with the server's CPU for the
//! load, and how its health endpoint answers while it loads.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::lineup::{Entry, Plan};
use super::{Ctx, Params, ServiceBatch};
use crate::drivers::{
    EtcdPut, List, NacosV1Persistent, OnEtcd, OnGangway, OnRnacos, Persist, RestPersistent, Serves,
    instance_addr,
};
use crate::load;
use crate::report::{Row, Table};
use crate::system::{CpuMeter, Server};

/// Services listed at once while waiting for the restarted server.
const LIST_CONCURRENCY: usize = 8;
/// Pause between two lists of a service that is not whole yet.
const LIST_RETRY: Duration = Duration::from_millis(20);
/// Pause between two health requests once the server answers (before: 10 ms).
const HEALTH_INTERVAL: Duration = Duration::from_millis(50);
/// Longest wait for one health answer before it counts as failed and is sent again.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(10);

/// The table and the lineup.
pub(super) fn plan(p: &Params) -> Plan {
    let batches: Vec<String> = p
        .restart_services
        .iter()
        .map(|b| format!("{} of {}", b.services, b.instances))
        .collect();
    let table = Table::new(
        "restart",
        format!(
            "{} persistent instances ({} services: {}) stored, the server killed (SIGKILL) and started again on the same data: time until health answers and until a list of each service holds all its instances",
            total(&p.restart_services),
            p.restart_services.iter().map(|b| b.services).sum::<usize>(),
            batches.join(", "),
        ),
        vec![
            "instances".into(),
            "health ms".into(),
            "serving ms".into(),
            "health max ms (loading)".into(),
        ],
        2,
        false,
        vec![
            "gangway: REST ephemeral=false (TCP probe hourly), listed over REST; rnacos: v1 HTTP ephemeral=false, listed over v1 HTTP; etcd: puts without lease, listed by range.".into(),
            "health ms, serving ms: from the start of the new process; health max ms: the slowest health answer from the first one until serving (small: the port answers while loading).".into(),
            "CPU: from the start of the new process until serving.".into(),
        ],
    );
    Plan::new(
        table,
        vec![
            on::<OnGangway, RestPersistent>(),
            on::<OnRnacos, NacosV1Persistent>(),
            on::<OnEtcd, EtcdPut>(),
        ],
    )
}

fn on<S: Serves<D>, D: Persist>() -> Entry {
    Entry::new::<S, D>(|ctx, server| Box::pin(measure::<D>(ctx, server)))
}

/// Instances in `batches`.
fn total(batches: &[ServiceBatch]) -> usize {
    batches.iter().map(|b| b.services * b.instances).sum()
}

/// The services of `batches`: name and size.
fn services(batches: &[ServiceBatch]) -> Vec<(String, usize)> {
    batches
        .iter()
        .enumerate()
        .flat_map(|(b, batch)| {
            (0..batch.services).map(move |k| (format!("bench-restart-{b}-{k}"), batch.instances))
        })
        .collect()
}

/// What the health endpoint answered while the server came back.
#[derive(Debug, Default)]
struct Health {
    /// When it first answered 2xx, from the start of the process.
    first: Option<Duration>,
    /// The slowest answer after the first one.
    slowest: Duration,
    /// Requests after the first answer that failed or timed out.
    failed: usize,
}

/// Polls `url` from `started` until `done`: every 10 ms until it answers, then every 50 ms.
async fn watch_health(url: String, started: Instant, done: Arc<AtomicBool>) -> Health {
    let client = reqwest::Client::builder()
        .timeout(HEALTH_TIMEOUT)
        .build()
        .expect("static client configuration");
    let mut health = Health::default();
    while !done.load(Ordering::Acquire) {
        let sent = Instant::now();
        let ok = client
            .get(&url)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        match (ok, health.first) {
            (true, None) => health.first = Some(started.elapsed()),
            (true, Some(_)) => health.slowest = health.slowest.max(sent.elapsed()),
            (false, Some(_)) => health.failed += 1,
            (false, None) => {}
        }
        let pause = if health.first.is_some() {
            HEALTH_INTERVAL
        } else {
            Duration::from_millis(10)
        };
        tokio::time::sleep(pause).await;
    }
    health
}

/// Lists every service until it holds all its instances or `deadline`; returns how many did,
/// and when the last of them did (from `started`) if all did.
async fn until_listed<L: List>(
    lister: &<L as List>::Client,
    services: &[(String, usize)],
    started: Instant,
    deadline: Instant,
) -> (usize, Option<Duration>) {
    let done = load::for_each(services.len(), LIST_CONCURRENCY, "lists", |i| async move {
        let (svc, want) = &services[i];
        loop {
            // Errors (refused while the server starts, timeouts while it loads) are retried.
            if L::count(lister, svc).await.is_ok_and(|n| n >= *want) {
                return Ok(Some(started.elapsed()));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            tokio::time::sleep(LIST_RETRY).await;
        }
    })
    .await
    .unwrap_or_default();
    let whole: Vec<Duration> = done.into_iter().flatten().collect();
    let last = (whole.len() == services.len())
        .then(|| whole.iter().max().copied())
        .flatten();
    (whole.len(), last)
}

async fn measure<D: Persist>(ctx: &Ctx, server: &mut Server) -> anyhow::Result<Vec<Row>> {
    let p = &ctx.params;
    let services = services(&p.restart_services);
    let total = total(&p.restart_services);
    // Instance k of the fill: (service, index in it).
    let slots: Vec<(usize, usize)> = services
        .iter()
        .enumerate()
        .flat_map(|(s, (_, n))| (0..*n).map(move |j| (s, j)))
        .collect();
    let filled = {
        let client = &D::connect(server, p.concurrency).await?;
        let (services, slots) = (&services, &slots);
        let filling = Instant::now();
        load::for_each(
            total,
            p.concurrency,
            "persistent instances",
            |k| async move {
                let (s, j) = slots[k];
                let (ip, port) = instance_addr(s, j as u64);
                D::register(client, &services[s].0, &ip, port).await
            },
        )
        .await?;
        filling.elapsed()
    };
    // Every list whole before the kill, so a short list afterwards is the restart's doing.
    let lister = <D::Lister as List>::connect(server, LIST_CONCURRENCY).await?;
    let now = Instant::now();
    let (whole, _) =
        until_listed::<D::Lister>(&lister, &services, now, now + p.restart_deadline).await;
    anyhow::ensure!(
        whole == services.len(),
        "before the restart only {whole} of {} services listed all their instances",
        services.len()
    );
    // The client closes its connections first, so the server's ports are free to bind again.
    drop(lister);
    server.kill().await;
    let started = Instant::now();
    server.respawn()?;
    let meter = CpuMeter::start(server);
    let lister = <D::Lister as List>::connect(server, LIST_CONCURRENCY).await?;
    let done = Arc::new(AtomicBool::new(false));
    let health = tokio::spawn(watch_health(server.health_url(), started, done.clone()));
    let (whole, serving) =
        until_listed::<D::Lister>(&lister, &services, started, started + p.restart_deadline).await;
    let cpu = meter.stop();
    done.store(true, Ordering::Release);
    let health = health.await.unwrap_or_default();
    if let Some(status) = server.exited() {
        anyhow::bail!(
            "the restarted server exited ({status}); its log:\n{}",
            server.log_tail()
        );
    }
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let mut note = format!(
        "filled in {:.1} s ({:.0}/s)",
        filled.as_secs_f64(),
        total as f64 / filled.as_secs_f64().max(1e-9)
    );
    if serving.is_none() {
        note.push_str(&format!(
            "; only {whole} of {} services listed whole within {:?}",
            services.len(),
            p.restart_deadline
        ));
    }
    if health.failed > 0 {
        note.push_str(&format!(
            "; {} health requests failed after the first answer",
            health.failed
        ));
    }
    let slowest = (health.first.is_some() && serving.is_some()).then(|| ms(health.slowest));
    Ok(vec![Row::measured(
        server.system,
        D::NAME,
        vec![
            Some(total as f64),
            health.first.map(ms),
            serving.map(ms),
            slowest,
        ],
        cpu,
        note,
    )])
}
