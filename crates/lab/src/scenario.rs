//! One scenario = one run: a registry, N demo-service child processes, one consumer sending an
//! open-loop rate round robin through its cached view, and one instance leaving at a fixed time.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use gangway_client::http::{HttpClient, HttpConfig};
use gangway_client::retry::RetryConfig;
use gangway_client::{Client, ClientConfig};
use gangway_core::View;
use gangway_core::model::ServiceKey;
use nix::sys::signal::Signal;
use serde::Serialize;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::load::{LoadReport, Schedule, ms, run_load_at};
use crate::process::{Proc, STARTUP, field};

/// The service name the demo instances register under.
pub const SERVICE: &str = "lab";

/// How the registry keeps instances alive and how the consumer learns of changes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Mode {
    /// Lease with a TTL and heartbeats every TTL/3, expiry checked every 200 ms (lazy expiry);
    /// the consumer pulls the list every `refresh`, no push.
    Classic {
        /// Lease TTL: unhealthy (out of the list) after this long without a heartbeat.
        #[serde(serialize_with = "ser_ms")]
        ttl: Duration,
        /// Consumer refresh interval R.
        #[serde(serialize_with = "ser_ms")]
        refresh: Duration,
    },
    /// Sessions (a closed connection ends them at once, a silent one after the keepalive
    /// timeout), push with acks.
    Gangway,
}

/// How the instance leaves.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Action {
    /// SIGKILL, no deregistration.
    Crash,
    /// SIGSTOP (frozen: connections stay open, nothing answers).
    Freeze,
    /// Deregister over REST, wait, SIGKILL.
    DeregisterKill {
        /// Wait W between deregistration and SIGKILL.
        #[serde(serialize_with = "ser_ms")]
        wait: Duration,
    },
    /// Deregister over REST, wait, SIGTERM: graceful exit (stop accepting, finish in-flight).
    DeregisterGraceful {
        /// Wait W between deregistration and SIGTERM.
        #[serde(serialize_with = "ser_ms")]
        wait: Duration,
    },
    /// gangway's drain (offline, wait until every subscriber acked), then graceful exit: SIGTERM
    /// to a demo-service, which does both.
    Drain,
}

/// One configuration.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Scenario {
    /// Registry behaviour.
    pub mode: Mode,
    /// How the instance leaves.
    pub action: Action,
    /// The consumer retries once on another instance (connection failures always, others for
    /// idempotent requests, which GET is).
    pub retry: bool,
}

/// Settings shared by every scenario of a run. Defaults: [`Params::default`].
#[derive(Debug, Clone, Serialize)]
pub struct Params {
    /// The `gangway` executable (started as `demo-service` children).
    #[serde(skip)]
    pub exe: PathBuf,
    /// Instances N (default 3).
    pub instances: usize,
    /// Requests per second (default 60).
    pub rate: f64,
    /// Sending time (default 8 s).
    #[serde(serialize_with = "ser_ms")]
    pub duration: Duration,
    /// When the instance leaves, after the first send (default 2.8 s).
    #[serde(serialize_with = "ser_ms")]
    pub action_at: Duration,
    /// In-flight time of GET /ping (default 200 ms).
    #[serde(serialize_with = "ser_ms")]
    pub delay: Duration,
    /// Timeout of each attempt (default 1 s).
    #[serde(serialize_with = "ser_ms")]
    pub timeout: Duration,
    /// Session keepalive ping interval (gangway mode, default 1 s).
    #[serde(serialize_with = "ser_ms")]
    pub keepalive_interval: Duration,
    /// Session keepalive timeout (gangway mode, default 3 s).
    #[serde(serialize_with = "ser_ms")]
    pub keepalive_timeout: Duration,
    /// Longest drain wait (default 10 s).
    #[serde(serialize_with = "ser_ms")]
    pub drain_timeout: Duration,
    /// Classic consumer: its first poll after the registry dropped the instance comes this
    /// fraction of R after that moment (0..1, default 0.5: the mean over a random phase).
    pub poll_phase: f64,
    /// Classic instance: its last heartbeat before the leave action comes this fraction of
    /// TTL/3 before it (0..1, default 0.5: the mean over a random phase).
    pub heartbeat_phase: f64,
}

impl Params {
    /// The defaults of issue 4 with `exe` as the `gangway` executable.
    pub fn new(exe: PathBuf) -> Self {
        Self {
            exe,
            instances: 3,
            rate: 60.0,
            duration: Duration::from_secs(8),
            action_at: Duration::from_millis(2800),
            delay: Duration::from_millis(200),
            timeout: Duration::from_secs(1),
            keepalive_interval: Duration::from_secs(1),
            keepalive_timeout: Duration::from_secs(3),
            drain_timeout: Duration::from_secs(10),
            poll_phase: 0.5,
            heartbeat_phase: 0.5,
        }
    }

    /// The open-loop schedule.
    pub fn schedule(&self) -> Schedule {
        Schedule {
            rate: self.rate,
            duration: self.duration,
        }
    }
}

/// What one scenario measured.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioResult {
    /// The configuration.
    pub scenario: Scenario,
    /// A short label, e.g. `classic ttl=2s R=1s crash, no retry`.
    pub label: String,
    /// The instance that left (`ip:port`).
    pub leaving: String,
    /// When the action started, ms after the first send.
    pub action_ms: f64,
    /// When the process was signalled (kill, stop, term), ms after the first send.
    pub signal_ms: Option<f64>,
    /// When the consumer's cache first held a view without the leaving instance, ms after the
    /// first send (`None`: never during the run).
    pub cache_drop_ms: Option<f64>,
    /// Drain wait reported by the instance, ms (drain only).
    pub drain_wait_ms: Option<u64>,
    /// Requests sent.
    pub total: usize,
    /// Requests failed.
    pub failed: usize,
    /// Send time of the first and last failed request, ms after the first send.
    pub failures_ms: Option<(f64, f64)>,
    /// Requests that needed more than one attempt.
    pub retried: usize,
    /// Attempts per request.
    pub attempts_per_request: f64,
    /// Requests that were in flight on the leaving instance when it was signalled.
    pub in_flight_at_signal: usize,
    /// Raw records: one per request, and the consumer's view changes.
    pub load: LoadReport,
}

impl Scenario {
    /// A short label, e.g. `classic TTL 2s R 1s: crash, no retry`.
    pub fn label(&self) -> String {
        let mode = match self.mode {
            Mode::Classic { ttl, refresh } => {
                format!("classic TTL {} R {}", secs(ttl), secs(refresh))
            }
            Mode::Gangway => "gangway".to_owned(),
        };
        format!(
            "{mode}: {}, {}",
            self.action.label(),
            if self.retry { "retry once" } else { "no retry" }
        )
    }
}

impl Action {
    /// `crash (SIGKILL)`, `deregister, W 1.2s, SIGKILL`, ...
    pub fn label(&self) -> String {
        match self {
            Action::Crash => "crash (SIGKILL)".to_owned(),
            Action::Freeze => "freeze (SIGSTOP)".to_owned(),
            Action::DeregisterKill { wait } => format!("deregister, W {}, SIGKILL", secs(*wait)),
            Action::DeregisterGraceful { wait } => {
                format!("deregister, W {}, graceful exit", secs(*wait))
            }
            Action::Drain => "drain, graceful exit".to_owned(),
        }
    }
}

/// `2s`, `0.5s`, `1.2s`.
pub fn secs(d: Duration) -> String {
    format!("{}s", (d.as_secs_f64() * 1000.0).round() / 1000.0)
}

fn ser_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(ms(*d))
}

/// Runs one scenario: own registry (in this process, free ports), own children, own consumer.
///
/// # Errors
/// A child that does not start, a registry that does not come up, a consumer that never sees
/// every instance.
pub async fn run(scenario: Scenario, params: &Params) -> anyhow::Result<ScenarioResult> {
    anyhow::ensure!(params.instances >= 2, "at least 2 instances are needed");
    anyhow::ensure!(
        params.action_at < params.duration,
        "the action time must fall inside the sending time"
    );
    let mut config = gangway_server::Config::for_tests();
    config.liveness.keepalive_interval = params.keepalive_interval;
    config.liveness.keepalive_timeout = params.keepalive_timeout;
    if let Mode::Classic { ttl, .. } = scenario.mode {
        config.liveness.lease_ttl = ttl;
        config.liveness.lease_delete_timeout = ttl * 2;
    }
    let server = gangway_server::start_in_memory(config)
        .await
        .context("start the registry")?;
    let result = run_on(scenario, params, server.http_addr, server.grpc_addr).await;
    server.shutdown().await;
    result
}

async fn run_on(
    scenario: Scenario,
    params: &Params,
    http_addr: std::net::SocketAddr,
    grpc_addr: std::net::SocketAddr,
) -> anyhow::Result<ScenarioResult> {
    // Children.
    let mut args = vec![
        "demo-service".to_owned(),
        "--service".to_owned(),
        SERVICE.to_owned(),
        "--delay".to_owned(),
        format!("{}ms", params.delay.as_millis()),
    ];
    match scenario.mode {
        Mode::Classic { ttl, .. } => args.extend([
            "--lease-ttl".to_owned(),
            format!("{}ms", ttl.as_millis()),
            "--registry-http".to_owned(),
            http_addr.to_string(),
        ]),
        Mode::Gangway => {
            args.extend([
                "--registry".to_owned(),
                grpc_addr.to_string(),
                "--drain-timeout".to_owned(),
                format!("{}ms", params.drain_timeout.as_millis()),
            ]);
            if scenario.action != Action::Drain {
                args.push("--no-drain".to_owned());
            }
        }
    }
    let mut procs = Vec::new();
    let mut addrs = Vec::new();
    for i in 0..params.instances {
        let mut a = args.clone();
        a.extend(["--name".to_owned(), format!("i{i}")]);
        procs.push(Proc::spawn(&params.exe, &a)?);
    }
    for p in &mut procs {
        let ready = p.line("ready ", STARTUP).await?;
        addrs.push(field(&ready, "addr").context("ready line without addr=")?);
    }
    let outcome = measure(scenario, params, http_addr, grpc_addr, &mut procs, &addrs).await;
    for p in &mut procs {
        p.kill().await;
    }
    outcome
}

async fn measure(
    scenario: Scenario,
    params: &Params,
    http_addr: std::net::SocketAddr,
    grpc_addr: std::net::SocketAddr,
    procs: &mut [Proc],
    addrs: &[String],
) -> anyhow::Result<ScenarioResult> {
    // The consumer.
    let retry = if scenario.retry {
        RetryConfig::default().with_max_attempts(2)
    } else {
        RetryConfig::disabled()
    };
    let config = HttpConfig::default()
        .with_retry(retry)
        .with_outlier(None)
        .with_attempt_timeout(params.timeout);
    let key = ServiceKey::named(SERVICE);
    let mut client = None;
    let mut poller = None;
    let (anchor_tx, anchor_rx) = watch::channel(None);
    let (http, mut views) = match scenario.mode {
        Mode::Classic { refresh, .. } => {
            let (task, rx) = crate::classic::poller(http_addr, SERVICE, refresh, anchor_rx);
            poller = Some(task);
            let http = HttpClient::from_views(vec![(key.clone(), rx.clone())], config)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            (http, rx)
        }
        Mode::Gangway => {
            let c = Client::connect(
                ClientConfig::new(grpc_addr.to_string()).with_client_name("lab-consumer"),
            )
            .await
            .context("consumer: connect to the registry")?;
            let subscription = c.subscribe(key.clone()).await.context("subscribe")?;
            let rx = subscription.receiver();
            let http = HttpClient::new(c.clone(), config).map_err(|e| anyhow::anyhow!("{e}"))?;
            client = Some((c, subscription));
            (http, rx)
        }
    };
    let n = params.instances;
    tokio::time::timeout(
        STARTUP,
        views.wait_for(|v: &Arc<View>| v.instances.len() >= n),
    )
    .await
    .map_err(|_| anyhow::anyhow!("the consumer did not see {n} instances within {STARTUP:?}"))?
    .context("view channel closed")?;
    // Warm the pipeline (connections to every instance) outside the measured run.
    let url = format!("http://{SERVICE}/ping");
    let warm: Vec<_> = (0..n).map(|_| http.get(&url)).collect();
    futures::future::join_all(warm).await;

    let leaving = addrs[0].clone();
    let target = procs.first_mut().context("no instance")?;
    let start = Instant::now();
    let action_at = start + params.action_at;
    // Classic: the phases of the heartbeats and of the consumer's polls are set, not left to
    // start-up timing (docs/lab.md, "phases"): one heartbeat (SIGUSR1) comes `heartbeat_phase`
    // x TTL/3 before the action, and the consumer's first poll after the registry dropped the
    // instance comes `poll_phase` x R after that.
    let mut phases = None;
    if let Mode::Classic { ttl, refresh } = scenario.mode {
        let pid = nix::unistd::Pid::from_raw(target.pid());
        let beat_at = action_at - (ttl / 3).mul_f64(params.heartbeat_phase);
        let (leaving, poll_phase) = (leaving.clone(), params.poll_phase);
        let limit = params.duration + ttl * 2;
        // Until then, keep the polls half a period away from the action: a poll racing the
        // deregistration would make the row a coin toss.
        let _ = anchor_tx.send(Some(action_at + refresh / 2));
        phases = Some(tokio::spawn(async move {
            tokio::time::sleep_until(beat_at).await;
            let _ = nix::sys::signal::kill(pid, Signal::SIGUSR1);
            tokio::time::sleep_until(action_at).await;
            if let Some(dropped) =
                crate::classic::wait_dropped(http_addr, SERVICE, &leaving, limit).await
            {
                let _ = anchor_tx.send(Some(dropped + refresh.mul_f64(poll_phase)));
            }
        }));
    }
    let schedule = params.schedule();
    let load = run_load_at(
        &http,
        SERVICE,
        "/ping",
        views.clone(),
        schedule,
        start,
        |_| {},
    );
    let action = act(
        scenario.action,
        target,
        &leaving,
        http_addr,
        action_at,
        params,
        start,
    );
    let (load, acted) = tokio::join!(load, action);
    let load = load?;
    let acted = acted?;
    if let Some((c, _subscription)) = client {
        c.close();
    }
    if let Some(task) = poller {
        task.abort();
    }
    if let Some(task) = phases {
        task.abort();
    }
    Ok(summarize(scenario, params, leaving, acted, load))
}

#[derive(Default)]
struct Acted {
    action_ms: f64,
    signal_ms: Option<f64>,
    drain_wait_ms: Option<u64>,
}

async fn act(
    action: Action,
    target: &mut Proc,
    leaving: &str,
    http_addr: std::net::SocketAddr,
    at: Instant,
    params: &Params,
    start: Instant,
) -> anyhow::Result<Acted> {
    tokio::time::sleep_until(at).await;
    let mut acted = Acted {
        action_ms: ms(start.elapsed()),
        ..Acted::default()
    };
    let signal = |p: &Proc, sig: Signal, acted: &mut Acted| -> anyhow::Result<()> {
        acted.signal_ms = Some(ms(start.elapsed()));
        p.signal(sig)
    };
    match action {
        Action::Crash => signal(target, Signal::SIGKILL, &mut acted)?,
        Action::Freeze => signal(target, Signal::SIGSTOP, &mut acted)?,
        Action::DeregisterKill { wait } | Action::DeregisterGraceful { wait } => {
            crate::classic::deregister(http_addr, SERVICE, leaving).await?;
            tokio::time::sleep(wait).await;
            let sig = if matches!(action, Action::DeregisterKill { .. }) {
                Signal::SIGKILL
            } else {
                Signal::SIGTERM
            };
            signal(target, sig, &mut acted)?;
        }
        Action::Drain => {
            signal(target, Signal::SIGTERM, &mut acted)?;
            let line = target
                .line("drained ", params.drain_timeout + Duration::from_secs(5))
                .await?;
            acted.drain_wait_ms = field(&line, "waited_ms").and_then(|v| v.parse().ok());
        }
    }
    Ok(acted)
}

fn summarize(
    scenario: Scenario,
    params: &Params,
    leaving: String,
    acted: Acted,
    load: LoadReport,
) -> ScenarioResult {
    let failed: Vec<f64> = load
        .requests
        .iter()
        .filter(|r| !r.ok)
        .map(|r| r.sent_ms)
        .collect();
    let failures_ms = failed
        .first()
        .map(|first| (*first, *failed.last().unwrap_or(first)));
    let cache_drop_ms = load
        .view_changes
        .iter()
        .find(|c| c.at_ms >= acted.action_ms && !c.instances.contains(&leaving))
        .map(|c| c.at_ms);
    let in_flight_at_signal = acted.signal_ms.map_or(0, |at| {
        let delay = ms(params.delay);
        load.requests
            .iter()
            .filter(|r| r.instance.as_deref() == Some(leaving.as_str()))
            .filter(|r| r.sent_ms <= at && r.sent_ms + delay > at)
            .count()
    });
    ScenarioResult {
        label: scenario.label(),
        scenario,
        leaving,
        action_ms: acted.action_ms,
        signal_ms: acted.signal_ms,
        cache_drop_ms,
        drain_wait_ms: acted.drain_wait_ms,
        total: load.sent,
        failed: load.failed,
        failures_ms,
        retried: load.requests.iter().filter(|r| r.attempts > 1).count(),
        attempts_per_request: load.attempts_per_request,
        in_flight_at_signal,
        load,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::{RequestRecord, ViewChange};

    fn request(
        index: usize,
        sent_ms: f64,
        instance: &str,
        ok: bool,
        attempts: u32,
    ) -> RequestRecord {
        RequestRecord {
            index,
            scheduled_ms: sent_ms,
            sent_ms,
            instance: Some(instance.to_owned()),
            connection: None,
            ok,
            error: (!ok).then(|| "connect".to_owned()),
            latency_ms: 200.0,
            attempts,
        }
    }

    #[test]
    fn summary_counts_failures_cache_drop_and_in_flight() {
        let params = Params::new("gangway".into());
        let requests = vec![
            request(0, 2650.0, "a:1", false, 1), // in flight at the signal (2700)
            request(1, 2690.0, "b:1", true, 1),
            request(2, 2900.0, "a:1", false, 1),
            request(3, 3000.0, "b:1", true, 2),
        ];
        let load = LoadReport {
            sent: 4,
            ok: 2,
            failed: 2,
            attempts_per_request: 1.25,
            requests,
            view_changes: vec![
                // Before the action: not the drop even though a:1 is absent.
                ViewChange {
                    at_ms: 100.0,
                    revision: 1,
                    instances: vec!["b:1".into()],
                },
                ViewChange {
                    at_ms: 2800.0,
                    revision: 2,
                    instances: vec!["a:1".into(), "b:1".into()],
                },
                ViewChange {
                    at_ms: 3100.0,
                    revision: 3,
                    instances: vec!["b:1".into()],
                },
            ],
        };
        let acted = Acted {
            action_ms: 2700.0,
            signal_ms: Some(2700.0),
            drain_wait_ms: None,
        };
        let s = Scenario {
            mode: Mode::Gangway,
            action: Action::Crash,
            retry: false,
        };
        let r = summarize(s, &params, "a:1".into(), acted, load);
        assert_eq!((r.failed, r.total, r.retried), (2, 4, 1));
        assert_eq!(r.failures_ms, Some((2650.0, 2900.0)));
        assert_eq!(r.cache_drop_ms, Some(3100.0));
        assert_eq!(r.in_flight_at_signal, 1);
        assert_eq!(r.label, "gangway: crash (SIGKILL), no retry");
    }

    #[test]
    fn no_failure_and_no_drop_are_none() {
        let params = Params::new("gangway".into());
        let load = LoadReport {
            sent: 1,
            ok: 1,
            failed: 0,
            attempts_per_request: 1.0,
            requests: vec![request(0, 0.0, "a:1", true, 1)],
            view_changes: vec![],
        };
        let s = Scenario {
            mode: Mode::Classic {
                ttl: Duration::from_secs(2),
                refresh: Duration::from_millis(500),
            },
            action: Action::DeregisterKill {
                wait: Duration::from_millis(1200),
            },
            retry: true,
        };
        let r = summarize(s, &params, "a:1".into(), Acted::default(), load);
        assert_eq!(
            (r.failures_ms, r.cache_drop_ms, r.in_flight_at_signal),
            (None, None, 0)
        );
        assert_eq!(
            r.label,
            "classic TTL 2s R 0.5s: deregister, W 1.2s, SIGKILL, retry once"
        );
    }
}
