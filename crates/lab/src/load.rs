//! The open-loop load generator: request `i` is sent at `start + i / rate`, a time fixed in
//! advance and never delayed by slow answers (a closed loop would send less while the system
//! struggles, and hide exactly the failures the lab measures). Every request is recorded: its
//! send time, the instance of its last attempt, its outcome and the attempts made; every change
//! of the consumer's view is recorded beside.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use gangway_client::http::{HttpClient, HttpResponse, RequestError};
use gangway_core::View;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;

/// One request's outcome.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RequestRecord {
    /// Index in the schedule.
    pub index: usize,
    /// Scheduled send time, ms after start.
    pub scheduled_ms: f64,
    /// Actual send time, ms after start.
    pub sent_ms: f64,
    /// Instance of the last attempt (`ip:port`), if any was made.
    pub instance: Option<String>,
    /// The client's end of the TCP connection that carried the answer (from the demo
    /// service's reply), to tell keep-alive connections apart.
    pub connection: Option<String>,
    /// Answered 2xx.
    pub ok: bool,
    /// Failure reason: `no instance`, `connect`, `timeout`, `HTTP 500`, ...
    pub error: Option<String>,
    /// Time to the answer or failure, ms.
    pub latency_ms: f64,
    /// Attempts made (0 when no instance could be picked).
    pub attempts: u32,
}

/// A change of the consumer's cache, as seen by the load generator.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ViewChange {
    /// ms after start.
    pub at_ms: f64,
    /// Revision applied.
    pub revision: u64,
    /// Addresses in the view.
    pub instances: Vec<String>,
}

/// A run's summary and raw records.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LoadReport {
    /// Requests sent.
    pub sent: usize,
    /// Requests answered 2xx.
    pub ok: usize,
    /// Requests failed.
    pub failed: usize,
    /// Attempts per request.
    pub attempts_per_request: f64,
    /// Every request, in schedule order.
    pub requests: Vec<RequestRecord>,
    /// Every view change during the run.
    pub view_changes: Vec<ViewChange>,
}

/// The open-loop schedule: rate (requests per second) and duration.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    /// Requests per second, > 0.
    pub rate: f64,
    /// How long to send.
    pub duration: Duration,
}

impl Schedule {
    /// Number of requests: `round(rate x duration)`.
    pub fn total(&self) -> usize {
        (self.rate * self.duration.as_secs_f64()).round() as usize
    }

    /// Send time of request `index`, after the start.
    pub fn at(&self, index: usize) -> Duration {
        Duration::from_secs_f64(index as f64 / self.rate)
    }
}

pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Sends `schedule.total()` GET `path` requests to `service` through `http` on the open-loop
/// schedule, starting at `start`; `views` (the view channel of the same service the client
/// routes with) is only watched to record view changes. `on_failure` sees each failure as it
/// happens. Returns once every request has an outcome (each bounded by the client's timeouts).
///
/// # Errors
/// A rate that is not a positive finite number; a request task that panicked.
pub async fn run_load_at(
    http: &HttpClient,
    service: &str,
    path: &str,
    views: watch::Receiver<Arc<View>>,
    schedule: Schedule,
    start: Instant,
    on_failure: impl Fn(&RequestRecord) + Send + Sync + 'static,
) -> anyhow::Result<LoadReport> {
    let never = std::future::pending::<()>();
    run_load_until(
        http, service, path, views, schedule, start, never, on_failure,
    )
    .await
}

/// [`run_load_at`] that also stops sending once `stop` resolves (for runs whose length is not
/// known in advance, e.g. a rollout): `schedule.duration` is then the longest it sends. Requests
/// already sent still get their outcome.
///
/// # Errors
/// As [`run_load_at`].
#[allow(clippy::too_many_arguments)]
pub async fn run_load_until(
    http: &HttpClient,
    service: &str,
    path: &str,
    views: watch::Receiver<Arc<View>>,
    schedule: Schedule,
    start: Instant,
    stop: impl std::future::Future<Output = ()>,
    on_failure: impl Fn(&RequestRecord) + Send + Sync + 'static,
) -> anyhow::Result<LoadReport> {
    anyhow::ensure!(
        schedule.rate > 0.0 && schedule.rate.is_finite(),
        "the rate must be above 0, got {}",
        schedule.rate
    );
    let url = format!("http://{service}{path}");
    let total = schedule.total();
    let (stop_changes, stopped) = tokio::sync::oneshot::channel();
    let changes = tokio::spawn(record_changes(views, start, stopped));
    let on_failure = Arc::new(on_failure);
    let mut tasks = Vec::with_capacity(total);
    tokio::pin!(stop);
    for index in 0..total {
        let scheduled = schedule.at(index);
        tokio::select! {
            () = tokio::time::sleep_until(start + scheduled) => {}
            () = &mut stop => break,
        }
        let (http, url, on_failure) = (http.clone(), url.clone(), on_failure.clone());
        // Each request is its own task: a slow answer never holds back the next send.
        tasks.push(tokio::spawn(async move {
            let sent = start.elapsed();
            let result = http.get(&url).await;
            let record = record(index, scheduled, sent, start.elapsed() - sent, result);
            if !record.ok {
                on_failure(&record);
            }
            record
        }));
    }
    let mut requests = Vec::with_capacity(total);
    for task in tasks {
        requests.push(task.await.context("request task")?);
    }
    let _ = stop_changes.send(());
    let view_changes = changes.await.context("view change recorder")?;
    let ok = requests.iter().filter(|r| r.ok).count();
    let attempts: u32 = requests.iter().map(|r| r.attempts).sum();
    Ok(LoadReport {
        sent: requests.len(),
        ok,
        failed: requests.len() - ok,
        attempts_per_request: if requests.is_empty() {
            0.0
        } else {
            f64::from(attempts) / requests.len() as f64
        },
        requests,
        view_changes,
    })
}

/// [`run_load_at`] starting now, GET `/ping`.
///
/// # Errors
/// As [`run_load_at`].
pub async fn run_load(
    http: &HttpClient,
    service: &str,
    views: watch::Receiver<Arc<View>>,
    schedule: Schedule,
    on_failure: impl Fn(&RequestRecord) + Send + Sync + 'static,
) -> anyhow::Result<LoadReport> {
    run_load_at(
        http,
        service,
        "/ping",
        views,
        schedule,
        Instant::now(),
        on_failure,
    )
    .await
}

fn record(
    index: usize,
    scheduled: Duration,
    sent: Duration,
    latency: Duration,
    result: Result<HttpResponse, RequestError>,
) -> RequestRecord {
    let mut r = RequestRecord {
        index,
        scheduled_ms: ms(scheduled),
        sent_ms: ms(sent),
        instance: None,
        connection: None,
        ok: false,
        error: None,
        latency_ms: ms(latency),
        attempts: 0,
    };
    match result {
        Ok(response) => {
            r.instance = Some(response.instance.addr());
            r.attempts = response.attempts;
            r.connection = serde_json::from_slice::<serde_json::Value>(&response.body)
                .ok()
                .and_then(|v| v["peer"].as_str().map(str::to_owned));
            r.ok = response.status.is_success();
            if !r.ok {
                r.error = Some(format!("HTTP {}", response.status.as_u16()));
            }
        }
        Err(e) => {
            r.attempts = e.attempts();
            r.error = Some(match &e {
                RequestError::NoInstance { .. } => "no instance".to_owned(),
                RequestError::Failed {
                    failure,
                    instance,
                    message,
                    ..
                } => {
                    r.instance = Some(instance.addr());
                    if failure.is_connect() {
                        "connect".to_owned()
                    } else if message.contains("timed out") {
                        "timeout".to_owned()
                    } else {
                        format!("error: {message}")
                    }
                }
                other => other.to_string(),
            });
        }
    }
    r
}

async fn record_changes(
    mut rx: watch::Receiver<Arc<View>>,
    start: Instant,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) -> Vec<ViewChange> {
    let mut out = Vec::new();
    loop {
        tokio::select! {
            changed = rx.changed() => {
                if changed.is_err() {
                    break;
                }
                let view = rx.borrow_and_update().clone();
                out.push(ViewChange {
                    at_ms: ms(start.elapsed()),
                    revision: view.revision,
                    instances: view.instances.iter().map(|i| i.key.addr()).collect(),
                });
            }
            _ = &mut stop => break,
        }
    }
    out
}
