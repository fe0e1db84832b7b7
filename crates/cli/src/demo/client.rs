//! `gangway demo-client`: GET /ping through a subscription at a fixed **open-loop** rate: the
//! send time of request i is `start + i / rate`, fixed in advance and never delayed by slow
//! answers. Prints each failure with its time, the cache's view changes, and a summary.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use gangway_client::http::{HttpClient, HttpResponse, RequestError};
use gangway_client::{Client, ClientConfig, Subscription};
use gangway_core::model::ServiceKey;
use serde::Serialize;
use tokio::time::Instant;

use super::pipeline::PipelineArgs;
use crate::args::parse_duration;

/// Flags of `gangway demo-client`.
#[derive(Debug, Args, Clone)]
pub struct ClientArgs {
    /// Registry gRPC address.
    #[arg(
        long,
        default_value = "127.0.0.1:9848",
        env = "GANGWAY_GRPC",
        value_name = "HOST:PORT"
    )]
    pub registry: String,
    /// Service to call.
    #[arg(long, default_value = "demo")]
    pub service: String,
    /// Requests per second (open loop).
    #[arg(long, default_value_t = 60.0)]
    pub rate: f64,
    /// How long to send.
    #[arg(long, default_value = "8s", value_parser = parse_duration, value_name = "DURATION")]
    pub duration: Duration,
    /// Per-request timeout (each attempt).
    #[arg(long, default_value = "1s", value_parser = parse_duration, value_name = "DURATION")]
    pub timeout: Duration,
    /// Wait until the view holds at least this many instances before sending.
    #[arg(long, default_value_t = 1)]
    pub min_instances: usize,
    /// Print the summary (with every request) as JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Balancer, retry, ejection and pool settings.
    #[command(flatten)]
    pub pipeline: PipelineArgs,
}

/// One request's outcome.
#[derive(Debug, Clone, Serialize)]
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
    /// Attempts made.
    pub attempts: u32,
}

/// A change of the consumer cache, as seen by the client.
#[derive(Debug, Clone, Serialize)]
pub struct ViewChange {
    /// ms after start.
    pub at_ms: f64,
    /// Revision applied.
    pub revision: u64,
    /// Addresses in the view.
    pub instances: Vec<String>,
}

/// The run's summary.
#[derive(Debug, Clone, Serialize)]
pub struct LoadReport {
    /// Requests sent.
    pub sent: usize,
    /// Requests answered 2xx.
    pub ok: usize,
    /// Requests failed.
    pub failed: usize,
    /// Attempts per request.
    pub attempts_per_request: f64,
    /// Every request.
    pub requests: Vec<RequestRecord>,
    /// Every view change during the run.
    pub view_changes: Vec<ViewChange>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Sends `rate x duration` GET /ping requests to `service` through `http` on the open-loop
/// schedule; `subscription` (of the same service) is only watched to record view changes.
/// `on_failure` sees each failure as it happens.
pub async fn run_load(
    http: &HttpClient,
    subscription: &Subscription,
    rate: f64,
    duration: Duration,
    on_failure: impl Fn(&RequestRecord) + Send + Sync + 'static,
) -> anyhow::Result<LoadReport> {
    anyhow::ensure!(
        rate > 0.0 && rate.is_finite(),
        "--rate must be above 0, got {rate}"
    );
    let url = format!("http://{}/ping", subscription.service().service);
    let total = (rate * duration.as_secs_f64()).round() as usize;
    let start = Instant::now();
    let (stop_changes, stopped) = tokio::sync::oneshot::channel();
    let changes = tokio::spawn(record_changes(subscription.receiver(), start, stopped));
    let on_failure = Arc::new(on_failure);
    let mut tasks = Vec::with_capacity(total);
    for index in 0..total {
        let scheduled = Duration::from_secs_f64(index as f64 / rate);
        tokio::time::sleep_until(start + scheduled).await;
        let (http, url, on_failure) = (http.clone(), url.clone(), on_failure.clone());
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
    mut rx: tokio::sync::watch::Receiver<Arc<gangway_core::View>>,
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

/// Subscribes to `service` and waits until the view holds `min` instances (at most 10 s).
pub async fn subscribe_ready(
    client: &Client,
    service: &str,
    min: usize,
) -> anyhow::Result<Subscription> {
    let mut subscription = client
        .subscribe(ServiceKey::named(service))
        .await
        .context("subscribe")?;
    subscription
        .wait_for(|v| v.instances.len() >= min, Duration::from_secs(10))
        .await
        .with_context(|| {
            format!("service {service} did not reach {min} instance(s) within 10 s")
        })?;
    Ok(subscription)
}

/// Runs the demo client and prints failures, view changes and the summary.
pub async fn run(args: ClientArgs) -> anyhow::Result<LoadReport> {
    let client =
        Client::connect(ClientConfig::new(args.registry.clone()).with_client_name("demo-client"))
            .await
            .with_context(|| format!("cannot reach the registry at {}", args.registry))?;
    let subscription = subscribe_ready(&client, &args.service, args.min_instances).await?;
    let http = HttpClient::new(client.clone(), args.pipeline.http_config(args.timeout))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let quiet = args.json;
    // On stderr so that `--json` keeps stdout to the summary; tests key their actions off it.
    eprintln!(
        "sending {} requests at {}/s to {} instance(s)",
        (args.rate * args.duration.as_secs_f64()).round(),
        args.rate,
        subscription.view().instances.len()
    );
    let report = run_load(&http, &subscription, args.rate, args.duration, move |r| {
        if !quiet {
            println!(
                "+{:.3}s FAIL #{} {}: {} ({} attempt(s))",
                r.sent_ms / 1000.0,
                r.index,
                r.instance.as_deref().unwrap_or("-"),
                r.error.as_deref().unwrap_or(""),
                r.attempts
            );
        }
    })
    .await?;
    client.close();
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        for c in &report.view_changes {
            println!(
                "+{:.3}s view revision={} instances={}",
                c.at_ms / 1000.0,
                c.revision,
                c.instances.join(",")
            );
        }
        let mut table = comfy_table::Table::new();
        table.set_header(["sent", "ok", "failed", "attempts/request"]);
        table.add_row([
            report.sent.to_string(),
            report.ok.to_string(),
            report.failed.to_string(),
            format!("{:.3}", report.attempts_per_request),
        ]);
        println!("{table}");
    }
    Ok(report)
}
