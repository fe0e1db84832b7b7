//! `restart` (issue 10): fill the server with persistent instances, kill it with SIGKILL, start
//! it again on the same data directory, and measure the time until its health endpoint answers
//! at all (gangway: 503 `LOADING` as soon as its ports are bound), until it answers 2xx, and
//! until a list of each service holds all its instances, with the server's CPU for the load and
//! the slowest health answer while it loads.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::lineup::{self, Entry, OfPersistent, Plan};
use super::{Ctx, Params, ServiceBatch};
use crate::drivers::{List, Persist, Serves, instance_addr};
use crate::load;
use crate::report::{Row, Table};
use crate::system::{CpuMeter, Server};

/// Services listed at once while waiting for the restarted server.
const LIST_CONCURRENCY: usize = 8;
/// Pause between two lists of a service that is not whole yet.
const LIST_RETRY: Duration = Duration::from_millis(20);
/// Pause between two health requests before the server answers.
const HEALTH_FIRST_INTERVAL: Duration = Duration::from_millis(10);
/// Pause between two health requests once the server answers.
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
            "instances loaded".into(),
            "health answers ms".into(),
            "health 2xx ms".into(),
            "serving ms".into(),
            "health max ms (loading)".into(),
        ],
        3,
        false,
        vec![
            "gangway: REST ephemeral=false (TCP probe hourly), listed over REST; rnacos: v1 HTTP ephemeral=false, listed over v1 HTTP; etcd: puts without lease, listed by range.".into(),
            "instances loaded: listed after the restart (of those stored). health answers ms: the first HTTP answer of any status (gangway: 503 LOADING while it reads its store); health 2xx ms, serving ms: from the start of the new process; health max ms: the slowest health answer from the first one until serving (small: the port answers while loading).".into(),
            "Target (issue 10): gangway serving within 2 s with 100,000 instances (5 services of 20,000 and 1,000 of 100, the full run).".into(),
            "CPU: from the start of the new process until serving.".into(),
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
    /// When it first answered at all (any HTTP status), from the start of the process.
    answered: Option<Duration>,
    /// When it first answered 2xx, from the start of the process.
    up: Option<Duration>,
    /// The slowest answer after the first one.
    slowest: Duration,
    /// Requests after the first answer that failed or timed out (a 503 is an answer).
    failed: usize,
}

impl Health {
    /// Records one request sent at `sent`: `status` its answer (`None`: no HTTP answer).
    fn record(&mut self, started: Instant, sent: Instant, status: Option<reqwest::StatusCode>) {
        match (status, self.answered) {
            (Some(_), None) => self.answered = Some(started.elapsed()),
            (Some(_), Some(_)) => self.slowest = self.slowest.max(sent.elapsed()),
            (None, Some(_)) => self.failed += 1,
            (None, None) => {}
        }
        if self.up.is_none() && status.is_some_and(|s| s.is_success()) {
            self.up = Some(started.elapsed());
        }
    }
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
        let status = client.get(&url).send().await.ok().map(|r| r.status());
        health.record(started, sent, status);
        let pause = if health.answered.is_some() {
            HEALTH_INTERVAL
        } else {
            HEALTH_FIRST_INTERVAL
        };
        tokio::time::sleep(pause).await;
    }
    health
}

/// How far the lists of [`until_listed`] got.
#[derive(Debug, Default)]
struct Listed {
    /// Services whose list held all their instances.
    whole: usize,
    /// Instances in the last list of each service.
    instances: usize,
    /// When the last service was whole (from `started`), if all were.
    last: Option<Duration>,
}

/// Lists every service until it holds all its instances or `deadline`.
async fn until_listed<L: List>(
    lister: &<L as List>::Client,
    services: &[(String, usize)],
    started: Instant,
    deadline: Instant,
) -> Listed {
    let done = load::for_each(services.len(), LIST_CONCURRENCY, "lists", |i| async move {
        let (svc, want) = &services[i];
        let mut seen = 0;
        loop {
            // Errors (refused while the server starts, 503 while it loads) are retried.
            if let Ok(n) = L::count(lister, svc).await {
                seen = n;
                if n >= *want {
                    return Ok((seen, Some(started.elapsed())));
                }
            }
            if Instant::now() >= deadline {
                return Ok((seen, None));
            }
            tokio::time::sleep(LIST_RETRY).await;
        }
    })
    .await
    .unwrap_or_default();
    let times: Vec<Duration> = done.iter().filter_map(|(_, t)| *t).collect();
    Listed {
        whole: times.len(),
        instances: done.iter().map(|(n, _)| n).sum(),
        last: (times.len() == services.len())
            .then(|| times.iter().max().copied())
            .flatten(),
    }
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
    let before = until_listed::<D::Lister>(&lister, &services, now, now + p.restart_deadline).await;
    anyhow::ensure!(
        before.whole == services.len(),
        "before the restart only {} of {} services listed all their instances",
        before.whole,
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
    let after =
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
    if after.last.is_none() {
        note.push_str(&format!(
            "; only {} of {} services listed whole within {:?}",
            after.whole,
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
    let slowest = (health.answered.is_some() && after.last.is_some()).then(|| ms(health.slowest));
    Ok(vec![Row::measured(
        server.system,
        D::NAME,
        vec![
            Some(after.instances as f64),
            health.answered.map(ms),
            health.up.map(ms),
            after.last.map(ms),
            slowest,
        ],
        cpu,
        note,
    )])
}

#[cfg(test)]
mod tests {
    use reqwest::StatusCode;

    use super::*;

    #[test]
    fn health_counts_a_503_as_an_answer_but_not_as_up() {
        let started = Instant::now();
        let mut h = Health::default();
        // Refused before the port is bound: neither an answer nor a failure.
        h.record(started, Instant::now(), None);
        assert_eq!((h.answered, h.up, h.failed), (None, None, 0));
        h.record(
            started,
            Instant::now(),
            Some(StatusCode::SERVICE_UNAVAILABLE),
        );
        assert!(h.answered.is_some());
        assert_eq!(h.up, None);
        // Once it answers, a request without an answer is a failure.
        h.record(started, Instant::now(), None);
        assert_eq!(h.failed, 1);
        h.record(started, Instant::now(), Some(StatusCode::OK));
        assert!(h.up.is_some_and(|up| Some(up) >= h.answered));
    }

    #[test]
    fn services_spell_out_every_batch() {
        let batches = [
            ServiceBatch {
                services: 2,
                instances: 3,
            },
            ServiceBatch {
                services: 1,
                instances: 5,
            },
        ];
        assert_eq!(total(&batches), 11);
        let s = services(&batches);
        assert_eq!(
            s,
            [
                ("bench-restart-0-0".to_string(), 3),
                ("bench-restart-0-1".to_string(), 3),
                ("bench-restart-1-0".to_string(), 5),
            ]
        );
        assert!(services(&[]).is_empty());
    }
}
