//! `gangway lab rollout`: a rolling restart of N instances (default 10) under an open-loop load,
//! one strategy per row: what each costs in failed requests and in **total rollout time**.
//!
//! Every strategy replaces the instances one at a time, surge first (Kubernetes with
//! `maxSurge: 1, maxUnavailable: 0`): start the new instance, wait for its readiness signal,
//! then remove the oldest one as the strategy says:
//!
//! | strategy | readiness signal of the new one | removal of the old one |
//! |---|---|---|
//! | kill | its process is up and registered | SIGKILL |
//! | deregister + sleep W | the same | deregister over REST, sleep W, SIGTERM (graceful exit) |
//! | gangway run | every subscriber acked its registration | SIGTERM to the wrapper: ack drain, then the program's stop |

use std::path::PathBuf;
use std::time::Duration;

use comfy_table::Table as TextTable;
use indicatif::{ProgressBar, ProgressStyle};
use nix::sys::signal::Signal;
use serde::Serialize;
use tokio::time::Instant;

use crate::fleet::{Consumer, Instance, Kind, LabRegistry};
use crate::load::{LoadReport, ms, run_load_until};
use crate::scenario::{Mode, Params, SERVICE, secs};

/// How the old instances leave and the new ones join.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Strategy {
    /// SIGKILL the old instance once the new one is up.
    Kill,
    /// Deregister the old one, sleep, then SIGTERM it (a preStop `sleep W`).
    DeregisterSleep {
        /// The fixed wait W.
        #[serde(serialize_with = "ser_ms")]
        wait: Duration,
    },
    /// Both wrapped in `gangway run`: the new one counts once every subscriber acked it, the
    /// old one drains until every subscriber acked its removal.
    GangwayRun,
}

/// One row: a strategy on a registry.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Rollout {
    /// Registry and consumer behaviour.
    pub mode: Mode,
    /// The strategy.
    pub strategy: Strategy,
}

/// Settings of a rollout run.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Load and timing (its `instances` is N).
    pub params: Params,
    /// The rows.
    pub rows: Vec<(Rollout, String)>,
    /// Rows at the same time.
    pub concurrency: usize,
    /// Progress bar on stderr.
    pub progress: bool,
}

/// What one row measured.
#[derive(Debug, Clone, Serialize)]
pub struct RolloutResult {
    /// The row.
    pub rollout: Rollout,
    /// Its label.
    pub label: String,
    /// Instances replaced.
    pub instances: usize,
    /// Requests sent during the rollout, until the consumer caught up, and 1 s more.
    pub total: usize,
    /// Requests that failed.
    pub failed: usize,
    /// From the first step until the last old instance was gone, ms.
    pub rollout_ms: f64,
    /// From the first step until the consumer's view held only the new instances, ms (`None`:
    /// not within [`CATCH_UP`] after the last step).
    pub caught_up_ms: Option<f64>,
    /// Per replaced instance: until its replacement counted as ready, ms.
    pub join_ms: Vec<f64>,
    /// Per replaced instance: its removal (kill, sleep + exit, drain + exit), ms.
    pub leave_ms: Vec<f64>,
    /// Raw records.
    pub load: LoadReport,
}

/// The longest a rollout may send for.
pub const MAX_LOAD: Duration = Duration::from_secs(600);
/// Load after the consumer caught up, to catch failures that come late.
pub const TAIL: Duration = Duration::from_secs(1);
/// The longest wait, after the last step, for the consumer's view to hold only the new
/// instances (a classic consumer needs up to TTL + R).
pub const CATCH_UP: Duration = Duration::from_secs(30);

impl Rollout {
    /// `kill (SIGKILL), classic TTL 2s R 1s`, ...
    pub fn label(&self) -> String {
        let mode = match self.mode {
            Mode::Classic { ttl, refresh } => {
                format!("classic TTL {} R {}", secs(ttl), secs(refresh))
            }
            Mode::Gangway => "gangway sessions".to_owned(),
        };
        match self.strategy {
            Strategy::Kill => format!("kill (SIGKILL), {mode}"),
            Strategy::DeregisterSleep { wait } => {
                format!("deregister + sleep {}, {mode}", secs(wait))
            }
            Strategy::GangwayRun => "gangway run: ack drain + ack readiness".to_owned(),
        }
    }

    fn kind(&self) -> Kind {
        match (self.strategy, self.mode) {
            (Strategy::GangwayRun, _) => Kind::Wrapped {
                ready_path: None,
                warmup: None,
            },
            (_, Mode::Classic { ttl, .. }) => Kind::Classic { ttl },
            (_, Mode::Gangway) => Kind::Session,
        }
    }
}

/// The rows of the issue: kill (classic and gangway), deregister + sleep `wait` (classic),
/// gangway run. References: what the same rollout costs at production scale.
pub fn default_rows(ttl: Duration, refresh: Duration, wait: Duration) -> Vec<(Rollout, String)> {
    let classic = Mode::Classic { ttl, refresh };
    vec![
        (
            Rollout {
                mode: classic,
                strategy: Strategy::Kill,
            },
            "every request until the cache holds the new ones (<= TTL + R)".to_owned(),
        ),
        (
            Rollout {
                mode: Mode::Gangway,
                strategy: Strategy::Kill,
            },
            "the requests in flight (rate x in-flight time)".to_owned(),
        ),
        (
            Rollout {
                mode: classic,
                strategy: Strategy::DeregisterSleep { wait },
            },
            "0, but N x W: 10 x sleep 40 = 400 s with R = 30 s".to_owned(),
        ),
        (
            Rollout {
                mode: Mode::Gangway,
                strategy: Strategy::GangwayRun,
            },
            "0, W = the slowest ack (ms)".to_owned(),
        ),
    ]
}

/// Runs every row, `concurrency` at a time, each on its own registry; results in row order.
pub async fn run(s: &Settings) -> Vec<(Rollout, Result<RolloutResult, String>)> {
    let bar = if s.progress {
        ProgressBar::new(s.rows.len() as u64)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let semaphore = std::sync::Arc::new(tokio::sync::Semaphore::new(s.concurrency.max(1)));
    let mut tasks = Vec::new();
    for (rollout, _) in &s.rows {
        let (rollout, params, semaphore, bar) =
            (*rollout, s.params.clone(), semaphore.clone(), bar.clone());
        tasks.push(tokio::spawn(async move {
            let _permit = semaphore.acquire_owned().await.expect("semaphore open");
            bar.set_message(rollout.label());
            let result = one(rollout, &params).await.map_err(|e| format!("{e:#}"));
            bar.inc(1);
            result
        }));
    }
    let mut out = Vec::new();
    for ((rollout, _), task) in s.rows.iter().zip(tasks) {
        let result = task
            .await
            .unwrap_or_else(|e| Err(format!("rollout task: {e}")));
        out.push((*rollout, result));
    }
    bar.finish_and_clear();
    out
}

/// One rolling restart on its own registry.
///
/// # Errors
/// An instance that does not start, a consumer that never sees them all.
pub async fn one(rollout: Rollout, params: &Params) -> anyhow::Result<RolloutResult> {
    let registry = LabRegistry::start(rollout.mode, params).await?;
    let result = on(rollout, params, &registry).await;
    registry.shutdown().await;
    result
}

async fn on(
    rollout: Rollout,
    params: &Params,
    registry: &LabRegistry,
) -> anyhow::Result<RolloutResult> {
    let exe: PathBuf = params.exe.clone();
    let kind = rollout.kind();
    let n = params.instances;
    let mut instances = Vec::with_capacity(n);
    let mut started = 0usize;
    let mut outcome = async {
        for _ in 0..n {
            let name = format!("v1-{started}");
            started += 1;
            instances.push(Instance::start(&exe, &kind, registry, params, &name, &[]).await?);
        }
        let mut consumer = Consumer::start(rollout.mode, registry, params, false).await?;
        consumer.wait_for(n).await?;
        let start = Instant::now();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        let stop = async move {
            let _ = done_rx.await;
            tokio::time::sleep(TAIL).await;
        };
        let schedule = crate::load::Schedule {
            rate: params.rate,
            duration: MAX_LOAD,
        };
        let load = run_load_until(
            &consumer.http,
            SERVICE,
            "/ping",
            consumer.views.clone(),
            schedule,
            start,
            stop,
            |_| {},
        );
        let mut views = consumer.views.clone();
        let steps = async {
            // Let the load settle before the first step.
            tokio::time::sleep(TAIL).await;
            let begun = Instant::now();
            let mut join_ms = Vec::with_capacity(n);
            let mut leave_ms = Vec::with_capacity(n);
            for i in 0..n {
                let t = Instant::now();
                let fresh =
                    Instance::start(&exe, &kind, registry, params, &format!("v2-{i}"), &[]).await?;
                join_ms.push(ms(t.elapsed()));
                instances.push(fresh);
                let mut old = instances.remove(0);
                let t = Instant::now();
                leave(rollout.strategy, &mut old, registry, params).await?;
                leave_ms.push(ms(t.elapsed()));
            }
            let rollout_ms = ms(begun.elapsed());
            // The load goes on until the consumer holds only the new instances: requests that
            // fail because its cache still names a killed instance count too.
            let new: Vec<String> = instances.iter().map(|i| i.addr.clone()).collect();
            let caught_up = tokio::time::timeout(
                CATCH_UP,
                views.wait_for(|v| {
                    v.instances.len() == new.len()
                        && v.instances.iter().all(|i| new.contains(&i.key.addr()))
                }),
            )
            .await;
            let caught_up_ms = matches!(caught_up, Ok(Ok(_))).then(|| ms(begun.elapsed()));
            let _ = done_tx.send(());
            anyhow::Ok((rollout_ms, caught_up_ms, join_ms, leave_ms))
        };
        let (load, steps) = tokio::join!(load, steps);
        consumer.stop();
        let (rollout_ms, caught_up_ms, join_ms, leave_ms) = steps?;
        let load = load?;
        anyhow::Ok(RolloutResult {
            rollout,
            label: rollout.label(),
            instances: n,
            total: load.sent,
            failed: load.failed,
            rollout_ms,
            caught_up_ms,
            join_ms,
            leave_ms,
            load,
        })
    }
    .await;
    for i in &mut instances {
        i.kill().await;
    }
    if let Ok(r) = &mut outcome {
        r.instances = n;
    }
    outcome
}

/// Removes `old` as `strategy` says; returns once it is gone.
async fn leave(
    strategy: Strategy,
    old: &mut Instance,
    registry: &LabRegistry,
    params: &Params,
) -> anyhow::Result<()> {
    let limit = params.drain_timeout + Duration::from_secs(10);
    match strategy {
        Strategy::Kill => old.kill().await,
        Strategy::DeregisterSleep { wait } => {
            crate::classic::deregister(registry.http, SERVICE, &old.addr).await?;
            tokio::time::sleep(wait).await;
            old.signal(Signal::SIGTERM)?;
            if !old.wait(limit).await {
                anyhow::bail!("{} did not exit within {limit:?} of SIGTERM", old.addr);
            }
        }
        Strategy::GangwayRun => {
            old.signal(Signal::SIGTERM)?;
            if !old.wait(limit).await {
                anyhow::bail!("{} did not exit within {limit:?} of SIGTERM", old.addr);
            }
        }
    }
    old.kill().await;
    Ok(())
}

/// The rollout table.
pub fn render(
    rows: &[(Rollout, String)],
    results: &[(Rollout, Result<RolloutResult, String>)],
) -> String {
    let mut t = TextTable::new();
    t.load_preset(comfy_table::presets::ASCII_MARKDOWN);
    t.set_header([
        "strategy",
        "failed / total",
        "total rollout time (s)",
        "consumer caught up (s)",
        "per instance: join + leave (s)",
        "reference",
    ]);
    for ((rollout, reference), (_, result)) in rows.iter().zip(results) {
        match result {
            Ok(r) => {
                let n = r.join_ms.len().max(1) as f64;
                let join = r.join_ms.iter().sum::<f64>() / n / 1000.0;
                let leave = r.leave_ms.iter().sum::<f64>() / n / 1000.0;
                t.add_row(vec![
                    r.label.clone(),
                    format!("{} / {}", r.failed, r.total),
                    format!("{:.1}", r.rollout_ms / 1000.0),
                    r.caught_up_ms
                        .map_or("never".to_owned(), |c| format!("{:.1}", c / 1000.0)),
                    format!("{join:.2} + {leave:.2}"),
                    reference.clone(),
                ]);
            }
            Err(e) => {
                t.add_row(vec![
                    rollout.label(),
                    format!("error: {e}"),
                    String::new(),
                    String::new(),
                    String::new(),
                    reference.clone(),
                ]);
            }
        }
    }
    t.to_string()
}

fn ser_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(ms(*d))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_kinds_follow_the_strategy() {
        let rows = default_rows(
            Duration::from_secs(2),
            Duration::from_secs(1),
            Duration::from_secs(2),
        );
        let labels: Vec<String> = rows.iter().map(|(r, _)| r.label()).collect();
        assert_eq!(
            labels,
            [
                "kill (SIGKILL), classic TTL 2s R 1s",
                "kill (SIGKILL), gangway sessions",
                "deregister + sleep 2s, classic TTL 2s R 1s",
                "gangway run: ack drain + ack readiness",
            ]
        );
        assert_eq!(
            rows[0].0.kind(),
            Kind::Classic {
                ttl: Duration::from_secs(2)
            }
        );
        assert_eq!(rows[1].0.kind(), Kind::Session);
        assert!(matches!(rows[3].0.kind(), Kind::Wrapped { .. }));
    }

    #[test]
    fn an_error_row_keeps_its_label() {
        let rows = default_rows(
            Duration::from_secs(2),
            Duration::from_secs(1),
            Duration::from_secs(2),
        );
        let results: Vec<_> = rows
            .iter()
            .map(|(r, _)| (*r, Err("no port".to_owned())))
            .collect();
        let text = render(&rows, &results);
        assert!(
            text.contains("| gangway run: ack drain + ack readiness     | error: no port"),
            "{text}"
        );
    }
}
