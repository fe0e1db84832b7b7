//! `gangway lab cold-start`: an instance joins N warm ones under an open-loop load, and it starts
//! cold: its port is open at once, but for its first `cold` it answers `/ping` with 503
//! (`unavailable`) or slowly (`slow`: up to `latency` more, shrinking to 0). One row per
//! (cold behaviour, way of joining):
//!
//! | join | how |
//! |---|---|
//! | registered at once | the classic client: `demo-service` registers itself as it starts |
//! | ready-gated | `gangway run --ready http://127.0.0.1:PORT/health`: registered once `/health` says 200, counted once every subscriber acked |
//! | ready-gated + warm-up | the same with `--warmup`: the consumer ramps its share up (Envoy's slow-start curve) |
//!
//! A `slow` app says 200 on `/health` from the start: a readiness check cannot see it, only
//! warm-up helps. The consumer does not retry, so each failed request counts.

use std::time::Duration;

use comfy_table::Table as TextTable;
use serde::Serialize;
use tokio::time::Instant;

use crate::fleet::{Consumer, Instance, Kind, LabRegistry};
use crate::load::{LoadReport, ms, run_load_at};
use crate::scenario::{Mode, Params, SERVICE, secs};

/// What the cold instance does in its first seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Cold {
    /// 503 on `/ping` and `/health`.
    Unavailable,
    /// Slow `/ping`, `/health` 200.
    Slow,
}

/// How the cold instance joins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Join {
    /// Registered as the process starts.
    AtOnce,
    /// `gangway run` with an HTTP readiness check.
    ReadyGated,
    /// The same, with warm-up.
    ReadyGatedWarmUp,
}

/// One row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ColdStart {
    /// The cold behaviour.
    pub cold: Cold,
    /// The way of joining.
    pub join: Join,
}

/// Settings of a cold-start run.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Load and timing: N warm instances, the join at `action_at`.
    pub params: Params,
    /// How long the new instance is cold.
    pub cold: Duration,
    /// `slow`: the extra latency at its start.
    pub latency: Duration,
    /// The warm-up window of the warm-up rows.
    pub warmup: Duration,
    /// The rows.
    pub rows: Vec<ColdStart>,
    /// Rows at the same time.
    pub concurrency: usize,
}

/// What one row measured.
#[derive(Debug, Clone, Serialize)]
pub struct ColdStartResult {
    /// The row.
    pub row: ColdStart,
    /// Its label.
    pub label: String,
    /// Requests sent.
    pub total: usize,
    /// Requests failed.
    pub failed: usize,
    /// When the joining process was started, ms after the first send.
    pub join_ms: f64,
    /// When the consumer's view first held it, ms after the first send.
    pub in_view_ms: Option<f64>,
    /// Requests sent from the join on.
    pub after_join: usize,
    /// Their latencies' 50th and 99th percentiles and maximum, ms (failures included).
    pub p50_ms: f64,
    /// See `p50_ms`.
    pub p99_ms: f64,
    /// See `p50_ms`.
    pub max_ms: f64,
    /// Requests the new instance answered (or failed) while it was cold.
    pub to_new_while_cold: usize,
    /// Raw records.
    pub load: LoadReport,
}

impl ColdStart {
    /// `unavailable (503): registered at once`, ...
    pub fn label(&self) -> String {
        let cold = match self.cold {
            Cold::Unavailable => "503 while cold",
            Cold::Slow => "slow while cold",
        };
        let join = match self.join {
            Join::AtOnce => "registered at once",
            Join::ReadyGated => "ready-gated (gangway run)",
            Join::ReadyGatedWarmUp => "ready-gated + warm-up",
        };
        format!("{cold}: {join}")
    }
}

/// The six rows: both cold behaviours, each joining the three ways.
pub fn default_rows() -> Vec<ColdStart> {
    let mut rows = Vec::new();
    for cold in [Cold::Unavailable, Cold::Slow] {
        for join in [Join::AtOnce, Join::ReadyGated, Join::ReadyGatedWarmUp] {
            rows.push(ColdStart { cold, join });
        }
    }
    rows
}

/// Runs every row, `concurrency` at a time, each on its own registry; results in row order.
pub async fn run(s: &Settings) -> Vec<(ColdStart, Result<ColdStartResult, String>)> {
    let semaphore = std::sync::Arc::new(tokio::sync::Semaphore::new(s.concurrency.max(1)));
    let mut tasks = Vec::new();
    for row in &s.rows {
        let (row, settings, semaphore) = (*row, s.clone(), semaphore.clone());
        tasks.push(tokio::spawn(async move {
            let _permit = semaphore.acquire_owned().await.expect("semaphore open");
            one(row, &settings).await.map_err(|e| format!("{e:#}"))
        }));
    }
    let mut out = Vec::new();
    for (row, task) in s.rows.iter().zip(tasks) {
        out.push((
            *row,
            task.await
                .unwrap_or_else(|e| Err(format!("cold-start task: {e}"))),
        ));
    }
    out
}

/// One row on its own registry.
///
/// # Errors
/// An instance that does not start, a consumer that never sees them all.
pub async fn one(row: ColdStart, s: &Settings) -> anyhow::Result<ColdStartResult> {
    let params = &s.params;
    let registry = LabRegistry::start(Mode::Gangway, params).await?;
    let mut instances = Vec::new();
    let outcome = async {
        for i in 0..params.instances {
            let name = format!("warm-{i}");
            instances.push(
                Instance::start(&params.exe, &Kind::Session, &registry, params, &name, &[]).await?,
            );
        }
        let mut consumer = Consumer::start(Mode::Gangway, &registry, params, false).await?;
        consumer.wait_for(params.instances).await?;
        let start = Instant::now();
        let load = run_load_at(
            &consumer.http,
            SERVICE,
            "/ping",
            consumer.views.clone(),
            params.schedule(),
            start,
            |_| {},
        );
        let joining = async {
            tokio::time::sleep_until(start + params.action_at).await;
            let join_ms = ms(start.elapsed());
            let mode = match row.cold {
                Cold::Unavailable => "unavailable",
                Cold::Slow => "slow",
            };
            let extra = vec![
                "--cold-start".to_owned(),
                format!("{}ms", s.cold.as_millis()),
                "--cold-start-mode".to_owned(),
                mode.to_owned(),
                "--cold-start-latency".to_owned(),
                format!("{}ms", s.latency.as_millis()),
            ];
            let kind = match row.join {
                Join::AtOnce => Kind::Session,
                Join::ReadyGated => Kind::Wrapped {
                    ready_path: Some("/health"),
                    warmup: None,
                },
                Join::ReadyGatedWarmUp => Kind::Wrapped {
                    ready_path: Some("/health"),
                    warmup: Some(s.warmup),
                },
            };
            let fresh =
                Instance::start(&params.exe, &kind, &registry, params, "cold", &extra).await?;
            anyhow::Ok((join_ms, fresh))
        };
        let (load, joined) = tokio::join!(load, joining);
        consumer.stop();
        let (join_ms, fresh) = joined?;
        let addr = fresh.addr.clone();
        instances.push(fresh);
        Ok(summarize(row, s, join_ms, &addr, load?))
    }
    .await;
    for i in &mut instances {
        i.kill().await;
    }
    registry.shutdown().await;
    outcome
}

fn summarize(
    row: ColdStart,
    s: &Settings,
    join_ms: f64,
    addr: &str,
    load: LoadReport,
) -> ColdStartResult {
    let in_view_ms = load
        .view_changes
        .iter()
        .find(|c| c.instances.iter().any(|i| i == addr))
        .map(|c| c.at_ms);
    let mut latencies: Vec<f64> = load
        .requests
        .iter()
        .filter(|r| r.sent_ms >= join_ms)
        .map(|r| r.latency_ms)
        .collect();
    latencies.sort_by(f64::total_cmp);
    let cold_until = join_ms + ms(s.cold);
    let to_new_while_cold = load
        .requests
        .iter()
        .filter(|r| r.instance.as_deref() == Some(addr) && r.sent_ms < cold_until)
        .count();
    ColdStartResult {
        row,
        label: row.label(),
        total: load.sent,
        failed: load.failed,
        join_ms,
        in_view_ms,
        after_join: latencies.len(),
        p50_ms: percentile(&latencies, 0.50),
        p99_ms: percentile(&latencies, 0.99),
        max_ms: latencies.last().copied().unwrap_or(0.0),
        to_new_while_cold,
        load,
    }
}

/// The `q` quantile of sorted values (nearest rank); 0 for none.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The cold-start table.
pub fn render(s: &Settings, results: &[(ColdStart, Result<ColdStartResult, String>)]) -> String {
    let mut t = TextTable::new();
    t.load_preset(comfy_table::presets::ASCII_MARKDOWN);
    t.set_header([
        "cold instance: join",
        "failed / total",
        "p50 / p99 / max after the join (ms)",
        "in the view (s after start)",
        "requests to it while cold",
    ]);
    for (row, result) in results {
        match result {
            Ok(r) => {
                t.add_row(vec![
                    r.label.clone(),
                    format!("{} / {}", r.failed, r.total),
                    format!("{:.0} / {:.0} / {:.0}", r.p50_ms, r.p99_ms, r.max_ms),
                    r.in_view_ms.map_or("never".to_owned(), |v| {
                        format!("{:.2}", (v - r.join_ms) / 1000.0)
                    }),
                    r.to_new_while_cold.to_string(),
                ]);
            }
            Err(e) => {
                t.add_row(vec![
                    row.label(),
                    format!("error: {e}"),
                    String::new(),
                    String::new(),
                    String::new(),
                ]);
            }
        }
    }
    format!(
        "cold start: {} warm instances, one joins at {} cold for {} (slow: +{} at first), \
         warm-up {}, no retry\n{t}",
        s.params.instances,
        secs(s.params.action_at),
        secs(s.cold),
        secs(s.latency),
        secs(s.warmup)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&[7.0], 0.99), 7.0);
        assert_eq!(percentile(&[], 0.99), 0.0);
    }

    #[test]
    fn six_rows_with_distinct_labels() {
        let rows = default_rows();
        let mut labels: Vec<String> = rows.iter().map(ColdStart::label).collect();
        assert_eq!(labels[0], "503 while cold: registered at once");
        assert_eq!(labels[5], "slow while cold: ready-gated + warm-up");
        labels.dedup();
        assert_eq!(labels.len(), 6);
    }
}
