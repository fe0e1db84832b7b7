//! The default suite: four tables of scenarios, run a few at a time, each on its own registry
//! and ports, with a progress bar.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

use crate::scenario::{self, Action, Mode, Params, Scenario, ScenarioResult};

/// A table of the default suite: a title and its rows, each a scenario with the reference value
/// measured elsewhere (or the requirement gangway must meet).
#[derive(Debug, Clone)]
pub struct Table {
    /// Title printed above the table.
    pub title: String,
    /// Rows.
    pub rows: Vec<Row>,
}

/// A row of a suite table.
#[derive(Debug, Clone)]
pub struct Row {
    /// The configuration.
    pub scenario: Scenario,
    /// Reference or requirement, as printed.
    pub reference: String,
}

fn classic(ttl_ms: u64, refresh_ms: u64) -> Mode {
    Mode::Classic {
        ttl: Duration::from_millis(ttl_ms),
        refresh: Duration::from_millis(refresh_ms),
    }
}

fn row(mode: Mode, action: Action, retry: bool, reference: &str) -> Row {
    Row {
        scenario: Scenario {
            mode,
            action,
            retry,
        },
        reference: reference.to_owned(),
    }
}

/// The four tables of issue 4 with the reference values measured elsewhere (3 instances,
/// 60 req/s, 480 requests).
pub fn default_suite() -> Vec<Table> {
    let ms = Duration::from_millis;
    let mut crash = Vec::new();
    for (ttl, refresh, reference) in [
        (1000, 500, "23"),
        (1000, 1000, "42"),
        (2000, 500, "42"),
        (2000, 1000, "42"),
        (4000, 500, "82"),
        (4000, 1000, "82"),
    ] {
        crash.push(row(classic(ttl, refresh), Action::Crash, false, reference));
    }
    let mut deregister = Vec::new();
    for (w, kill_ref, graceful_ref) in [(0, "22", "18"), (1200, "0", "0"), (2500, "0", "-")] {
        deregister.push(row(
            classic(2000, 1000),
            Action::DeregisterKill { wait: ms(w) },
            false,
            kill_ref,
        ));
        deregister.push(row(
            classic(2000, 1000),
            Action::DeregisterGraceful { wait: ms(w) },
            false,
            graceful_ref,
        ));
    }
    let retry = vec![
        row(classic(2000, 1000), Action::Crash, false, "42"),
        row(
            classic(2000, 1000),
            Action::Crash,
            true,
            "1 at 1.13 att/req",
        ),
        row(
            classic(2000, 1000),
            Action::DeregisterKill { wait: ms(0) },
            false,
            "22",
        ),
        row(
            classic(2000, 1000),
            Action::DeregisterKill { wait: ms(0) },
            true,
            "1 at 1.06 att/req",
        ),
        row(
            classic(2000, 1000),
            Action::DeregisterGraceful { wait: ms(2500) },
            false,
            "-",
        ),
    ];
    let gangway = vec![
        row(
            Mode::Gangway,
            Action::Crash,
            false,
            "<= in flight on it + 2",
        ),
        row(Mode::Gangway, Action::Crash, true, "0 at <= 1.05 att/req"),
        row(Mode::Gangway, Action::Freeze, false, "-"),
        row(Mode::Gangway, Action::Freeze, true, "-"),
        row(Mode::Gangway, Action::Drain, false, "0, drain wait < 1 s"),
    ];
    vec![
        Table {
            title: "1. crash (SIGKILL), classic: lease TTL x consumer refresh R".to_owned(),
            rows: crash,
        },
        Table {
            title:
                "2. deregister first, classic (TTL 2s, R 1s): then SIGKILL or graceful exit after W"
                    .to_owned(),
            rows: deregister,
        },
        Table {
            title: "3. retry, classic (TTL 2s, R 1s): one retry on another instance".to_owned(),
            rows: retry,
        },
        Table {
            title: "4. gangway: sessions, push with acks, drain".to_owned(),
            rows: gangway,
        },
    ]
}

/// A short suite for CI: one row of each table, shorter run.
pub fn quick_suite() -> Vec<Table> {
    let tables = default_suite();
    let pick = |t: &Table, i: &[usize]| Table {
        title: format!("{} (--quick: references are for 480 requests)", t.title),
        rows: i.iter().map(|&i| t.rows[i].clone()).collect(),
    };
    vec![
        pick(&tables[0], &[3]),
        pick(&tables[1], &[0]),
        pick(&tables[2], &[1]),
        pick(&tables[3], &[1, 4]),
    ]
}

/// Runs every distinct scenario of `tables` once, `concurrency` at a time, and returns the
/// results in first-appearance order. A scenario that fails to run is reported as an error
/// entry and the others go on.
pub async fn run(
    tables: &[Table],
    params: &Params,
    concurrency: usize,
    progress: bool,
) -> Vec<(Scenario, Result<ScenarioResult, String>)> {
    let mut distinct: Vec<Scenario> = Vec::new();
    for t in tables {
        for r in &t.rows {
            if !distinct.contains(&r.scenario) {
                distinct.push(r.scenario);
            }
        }
    }
    let bar = if progress {
        ProgressBar::new(distinct.len() as u64)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    let semaphore = std::sync::Arc::new(tokio::sync::Semaphore::new(concurrency.max(1)));
    let mut tasks = Vec::new();
    for s in distinct.iter().copied() {
        let (params, semaphore, bar) = (params.clone(), semaphore.clone(), bar.clone());
        tasks.push(tokio::spawn(async move {
            let _permit = semaphore.acquire_owned().await.expect("semaphore open");
            bar.set_message(s.label());
            let result = scenario::run(s, &params)
                .await
                .map_err(|e| format!("{e:#}"));
            bar.inc(1);
            if let Ok(r) = &result {
                bar.println(format!(
                    "  {} -> {} of {} failed",
                    r.label, r.failed, r.total
                ));
            }
            result
        }));
    }
    let mut out = Vec::new();
    for (s, task) in distinct.into_iter().zip(tasks) {
        let result = task
            .await
            .unwrap_or_else(|e| Err(format!("scenario task: {e}")));
        out.push((s, result));
    }
    bar.finish_and_clear();
    out
}
