//! `gangway demo-client`: GET /ping through a subscription at a fixed **open-loop** rate: the
//! send time of request i is `start + i / rate`, fixed in advance and never delayed by slow
//! answers. Prints each failure with its time, the cache's view changes, and a summary.

use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use gangway_client::http::HttpClient;
use gangway_client::{Client, ClientTls, Subscription};
use gangway_core::model::ServiceKey;

use super::pipeline::PipelineArgs;
use crate::args::parse_duration;

/// Flags of `gangway demo-client`.
#[derive(Debug, Args, Clone)]
pub struct ClientArgs {
    /// Registry gRPC address, or several nodes of one registry: HOST:PORT,HOST:PORT (the
    /// session fails over between them).
    #[arg(
        long,
        default_value = "127.0.0.1:9848",
        env = "GANGWAY_GRPC",
        value_name = "HOST:PORT",
        value_parser = crate::args::parse_server
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

pub use gangway_lab::load::{LoadReport, RequestRecord};

/// Sends `rate x duration` GET /ping requests to `service` through `http` on the open-loop
/// schedule; `subscription` (of the same service) is only watched to record view changes.
/// `on_failure` sees each failure as it happens. The generator is the lab's
/// ([`gangway_lab::load`]).
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
    gangway_lab::load::run_load(
        http,
        &subscription.service().service,
        subscription.receiver(),
        gangway_lab::load::Schedule { rate, duration },
        on_failure,
    )
    .await
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

/// Runs the demo client and prints failures, view changes and the summary; `token` is sent
/// on its session (`--token`), `tls` is its TLS toward an `https://` registry (`--ca`,
/// `--client-cert`, `--client-key`).
pub async fn run(
    args: ClientArgs,
    token: Option<String>,
    tls: ClientTls,
) -> anyhow::Result<LoadReport> {
    let client = Client::connect(
        crate::args::session_config(crate::args::server_list(&args.registry))
            .with_client_name("demo-client")
            .with_optional_token(token)
            .with_tls(tls),
    )
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
