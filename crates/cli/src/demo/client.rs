//! `gangway demo-client`: GET /ping through a subscription at a fixed **open-loop** rate: the
//! send time of request i is `start + i / rate`, fixed in advance and never delayed by slow
//! answers. Prints each failure with its time, the cache's view changes, and a summary.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use gangway_client::balance::{RoundRobin, SmoothWeighted};
use gangway_client::{Client, ClientConfig, Subscription};
use gangway_core::model::ServiceKey;
use serde::Serialize;
use tokio::time::Instant;

use crate::args::parse_duration;

/// Balancer choice.
#[derive(Debug, Clone, Copy, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BalancerArg {
    /// Round robin over the view.
    RoundRobin,
    /// Smooth weighted round robin (nginx).
    Weighted,
}

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
    /// Per-request timeout.
    #[arg(long, default_value = "1s", value_parser = parse_duration, value_name = "DURATION")]
    pub timeout: Duration,
    /// Wait until the view holds at least this many instances before sending.
    #[arg(long, default_value_t = 1)]
    pub min_instances: usize,
    /// Balancer.
    #[arg(long, value_enum, default_value = "round-robin")]
    pub balancer: BalancerArg,
    /// Print the summary (with every request) as JSON instead of text.
    #[arg(long)]
    pub json: bool,
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
    /// Instance tried (`ip:port`), if the view had one.
    pub instance: Option<String>,
    /// Answered 2xx.
    pub ok: bool,
    /// Failure reason: `no instance`, `connect`, `timeout`, `HTTP 503`, ...
    pub error: Option<String>,
    /// Time to the answer or failure, ms.
    pub latency_ms: f64,
    /// Attempts made (1 without retry).
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

/// Sends `rate × duration` requests on the open-loop schedule through `subscription`.
/// `on_failure` sees each failure as it happens.
pub async fn run_load(
    subscription: &Subscription,
    rate: f64,
    duration: Duration,
    timeout: Duration,
    on_failure: impl Fn(&RequestRecord) + Send + Sync + 'static,
) -> anyhow::Result<LoadReport> {
    anyhow::ensure!(
        rate > 0.0 && rate.is_finite(),
        "--rate must be above 0, got {rate}"
    );
    let http = reqwest::Client::builder()
        .timeout(timeout)
        .build()
        .context("HTTP client")?;
    let total = (rate * duration.as_secs_f64()).round() as usize;
    let start = Instant::now();
    let (stop_changes, stopped) = tokio::sync::oneshot::channel();
    let changes = tokio::spawn(record_changes(subscription.receiver(), start, stopped));
    let on_failure = Arc::new(on_failure);
    let mut tasks = Vec::with_capacity(total);
    for index in 0..total {
        let scheduled = Duration::from_secs_f64(index as f64 / rate);
        tokio::time::sleep_until(start + scheduled).await;
        let picked = subscription.pick();
        let http = http.clone();
        let on_failure = on_failure.clone();
        tasks.push(tokio::spawn(async move {
            let sent = start.elapsed();
            let instance = picked.map(|i| i.key.addr());
            let error = match &instance {
                None => Some("no instance".to_owned()),
                Some(addr) => match http.get(format!("http://{addr}/ping")).send().await {
                    Ok(r) if r.status().is_success() => match r.bytes().await {
                        Ok(_) => None,
                        Err(e) => Some(classify(&e)),
                    },
                    Ok(r) => Some(format!("HTTP {}", r.status().as_u16())),
                    Err(e) => Some(classify(&e)),
                },
            };
            let record = RequestRecord {
                index,
                scheduled_ms: ms(scheduled),
                sent_ms: ms(sent),
                instance,
                ok: error.is_none(),
                error,
                latency_ms: ms(start.elapsed() - sent),
                attempts: 1,
            };
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

fn classify(e: &reqwest::Error) -> String {
    if e.is_connect() {
        "connect".to_owned()
    } else if e.is_timeout() {
        "timeout".to_owned()
    } else {
        let mut source: Option<&dyn std::error::Error> = Some(e);
        let mut last = e.to_string();
        while let Some(s) = source {
            last = s.to_string();
            source = s.source();
        }
        format!("error: {last}")
    }
}

/// Subscribes to `service` and waits until the view holds `min` instances (at most 10 s).
pub async fn subscribe_ready(
    client: &Client,
    service: &str,
    min: usize,
    balancer: BalancerArg,
) -> anyhow::Result<Subscription> {
    let mut subscription = client
        .subscribe(ServiceKey::named(service))
        .await
        .context("subscribe")?;
    subscription = match balancer {
        BalancerArg::RoundRobin => subscription.with_balancer(RoundRobin::new()),
        BalancerArg::Weighted => subscription.with_balancer(SmoothWeighted::new()),
    };
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
    let subscription =
        subscribe_ready(&client, &args.service, args.min_instances, args.balancer).await?;
    let quiet = args.json;
    // On stderr so that `--json` keeps stdout to the summary; tests key their actions off it.
    eprintln!(
        "sending {} requests at {}/s to {} instance(s)",
        (args.rate * args.duration.as_secs_f64()).round(),
        args.rate,
        subscription.view().instances.len()
    );
    let report = run_load(
        &subscription,
        args.rate,
        args.duration,
        args.timeout,
        move |r| {
            if !quiet {
                println!(
                    "+{:.3}s FAIL #{} {}: {}",
                    r.sent_ms / 1000.0,
                    r.index,
                    r.instance.as_deref().unwrap_or("-"),
                    r.error.as_deref().unwrap_or("")
                );
            }
        },
    )
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
            format!("{:.2}", report.attempts_per_request),
        ]);
        println!("{table}");
    }
    Ok(report)
}
