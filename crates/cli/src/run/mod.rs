//! `gangway run [options] -- CMD ARGS...`: the whole lifecycle (DESIGN §4) for any program,
//! whatever its language.
//!
//! 1. Starts CMD as a child (its own process group) and probes it (`--ready`) until it is
//!    ready, at most `--ready-timeout`.
//! 2. Only then registers it on a **session** (the client crate's [`Client`]): a crash of the
//!    wrapper or of the child removes the instance at once. With `--warmup` the registration
//!    carries the warm-up metadata, so native consumers ramp its weight up.
//! 3. Waits until every live subscriber acked a revision holding it (ack-based readiness,
//!    [`Registration::ready`]); `/ready` of `--readiness-port` answers 200 from then on, as
//!    long as the instance stays in the consumer view: the wrapper subscribes to its own
//!    service, so an offline by someone else (`gangway offline`, `drain`) turns `/ready` to 503
//!    at once, and an online back to 200 once every subscriber acked it again.
//! 4. Keeps probing every `--probe-interval`: after `--fall` failures in a row it deregisters
//!    the instance (consumers drop it at once), after `--rise` successes it registers it again
//!    (with a new warm-up) and waits for the acks again.
//! 5. On SIGTERM or SIGINT: `/ready` says 503, offline + ack-based drain (`--drain-timeout`,
//!    forced: the process leaves even as the last instance; the step ends after at most
//!    `--drain-timeout` + [`DRAIN_ANSWER_SLACK`] whatever the registry does), then the
//!    `--on-drain` hook (run by `sh -c` in its own process group, which is killed after
//!    `--on-drain-timeout`), then `--linger` (for programs that cut off in-flight requests on
//!    SIGTERM), then SIGTERM to the child's process group and SIGKILL after `--grace`; exits
//!    with the child's code. Further signals change nothing. The whole stop takes at most
//!    `--drain-timeout` + 1 s + `--on-drain-timeout` + `--linger` + `--grace`.
//! 6. The child exiting by itself: deregister at once, exit with its code (128 + signal when a
//!    signal ended it).
//!
//! Every step is logged on stderr with its time since the start and since the signal
//! ([`events`]); `--json` writes JSON lines. A SIGKILL of the wrapper ends its session, so the
//! registry drops the instance at once, and the kernel kills the child (PR_SET_PDEATHSIG on
//! Linux, [`child`]), as a container's end would.
//!
//! Exit status: the child's; 1 when the wrapper gave up (not ready in time, registry
//! unreachable, registration refused), after stopping the child; 2 for bad arguments.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use clap::Args;
use gangway_client::balance::warm_up::warm_up_metadata;
use gangway_client::{Client, ClientTls, ReadyReport, Registration, Subscription};
use gangway_core::model::{DEFAULT_GROUP, DEFAULT_NAMESPACE, InstanceKey, ServiceKey};
use serde_json::Value;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::args::parse_port;
use crate::args::{parse_duration, parse_meta, parse_name, parse_period, parse_weight};
use crate::error::{CliError, EXIT_FAILURE};

mod child;
pub mod events;
mod probe;
mod readiness;

use child::{Child, exit_code};
use events::Events;
use probe::{ReadyCheck, spawn_prober};
use readiness::{Readiness, ReadyState};

/// How often the child is probed while the wrapper waits for it to become ready.
pub const STARTUP_POLL: Duration = Duration::from_millis(100);
/// Pause between two readiness waits that did not complete (refused, or laggards).
pub const ACK_RETRY: Duration = Duration::from_millis(500);
/// Longest wait for the session to close at the end of a stop.
pub const SESSION_CLOSE_WAIT: Duration = Duration::from_millis(500);
/// Added to `--drain-timeout` for the registry's answer to arrive: the drain step of a stop
/// ends after at most their sum whatever the registry does (paused, unreachable, partitioned),
/// and the stop goes on with the hook and the child (docs/kubernetes.md counts it).
pub const DRAIN_ANSWER_SLACK: Duration = Duration::from_secs(1);

/// Flags of `gangway run`.
#[derive(Debug, Args)]
#[command(after_help = "\
Example (any program; in Kubernetes the env comes from the pod spec, docs/kubernetes.md):
  gangway run --service orders --port 8080 --ready http://127.0.0.1:8080/health \\
      --readiness-port 9000 --warmup 30s -- java -jar orders.jar

Exit status: the child's (128 + N when signal N ended it); 1 when the wrapper gave up (not \
ready within --ready-timeout, registry unreachable, registration refused) after stopping the \
child; 2 bad arguments.")]
pub struct RunArgs {
    /// Service to register the child under.
    #[arg(long, env = "GANGWAY_SERVICE", value_name = "SERVICE")]
    pub service: String,
    /// The child's port (the instance's port, and what `--ready tcp` connects to).
    #[arg(long, env = "GANGWAY_PORT", value_parser = parse_port, value_name = "PORT")]
    pub port: u16,
    /// The instance's IP as registered [default: the local address of the route toward the
    /// registry, the address `gangway offline` also defaults to].
    #[arg(long, env = "GANGWAY_IP", value_name = "IP")]
    pub ip: Option<String>,
    /// Registry gRPC address, or several nodes of one registry: HOST:PORT,HOST:PORT (or the
    /// flag repeated); the session fails over between them (docs/cluster.md, "Client
    /// failover").
    #[arg(
        long = "registry",
        env = "GANGWAY_GRPC",
        default_value = "127.0.0.1:9848",
        value_name = "HOST:PORT",
        value_parser = crate::args::parse_server
    )]
    pub registries: Vec<String>,
    /// Namespace [default: public].
    #[arg(long, short = 'n', env = "GANGWAY_NAMESPACE", value_parser = parse_name)]
    pub namespace: Option<String>,
    /// Group [default: DEFAULT_GROUP].
    #[arg(long, short = 'g', env = "GANGWAY_GROUP", value_parser = parse_name)]
    pub group: Option<String>,
    /// Cluster [default: DEFAULT].
    #[arg(long, short = 'c', env = "GANGWAY_CLUSTER", value_parser = parse_name)]
    pub cluster: Option<String>,
    /// Weight 0-10000.
    #[arg(long, default_value = "1", value_parser = parse_weight)]
    pub weight: f64,
    /// Metadata KEY=VALUE (repeatable).
    #[arg(long = "meta", value_name = "KEY=VALUE", value_parser = parse_meta)]
    pub meta: Vec<(String, String)>,
    /// When the child is ready: `tcp` (connect to 127.0.0.1:--port), `tcp://HOST:PORT`, or
    /// `http://HOST:PORT/PATH` answering 2xx.
    #[arg(long, default_value = "tcp", value_name = "CHECK")]
    pub ready: String,
    /// Longest wait for the child to become ready before giving up.
    #[arg(long, default_value = "60s", value_parser = parse_period, value_name = "DURATION")]
    pub ready_timeout: Duration,
    /// Interval of the checks once registered.
    #[arg(long, default_value = "1s", value_parser = parse_period, value_name = "DURATION")]
    pub probe_interval: Duration,
    /// Timeout of one check.
    #[arg(long, default_value = "1s", value_parser = parse_period, value_name = "DURATION")]
    pub probe_timeout: Duration,
    /// Failed checks in a row that take the instance out of the registry.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub fall: u32,
    /// Passed checks in a row that bring it back.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub rise: u32,
    /// Longest wait, each time, for every subscriber's ack of the registration (repeated until
    /// complete).
    #[arg(long, default_value = "30s", value_parser = parse_period, value_name = "DURATION")]
    pub ack_timeout: Duration,
    /// Serve GET /ready (200 once every subscriber acked; 503 before, when unhealthy, and from
    /// the stop signal on) and GET /live on this port (0: a free one, logged as `readiness`).
    #[arg(long, value_name = "PORT")]
    pub readiness_port: Option<u16>,
    /// Address the readiness endpoint listens on.
    #[arg(
        long,
        default_value = "0.0.0.0",
        value_name = "IP",
        requires = "readiness_port"
    )]
    pub readiness_host: IpAddr,
    /// Warm-up window: native consumers ramp the instance's weight up over it (Envoy's slow
    /// start curve, from the registration time).
    #[arg(long, value_parser = parse_period, value_name = "DURATION")]
    pub warmup: Option<Duration>,
    /// Longest wait for the subscribers' acks when draining on SIGTERM/SIGINT; the step ends
    /// after at most this + 1 s, whatever the registry does.
    #[arg(long, default_value = "30s", value_parser = parse_period, value_name = "DURATION")]
    pub drain_timeout: Duration,
    /// After the drain, run this (with `sh -c`) and wait for it before stopping the child:
    /// for what the registry cannot see (stop consuming a queue, stop a scheduler).
    #[arg(long, value_name = "CMD")]
    pub on_drain: Option<String>,
    /// Longest wait for --on-drain; it and what it started (its process group) are killed
    /// after this.
    #[arg(long, default_value = "30s", value_parser = parse_period, value_name = "DURATION")]
    pub on_drain_timeout: Duration,
    /// After the drain and the hook, wait this long before signalling the program: requests
    /// sent before the last consumer's ack may still be in flight, and a program that does not
    /// finish them on SIGTERM (python's http.server) would cut them off. Set it to your longest
    /// request time for such programs; graceful ones need none.
    #[arg(long, default_value = "0s", value_parser = parse_duration, value_name = "DURATION")]
    pub linger: Duration,
    /// Time between SIGTERM and SIGKILL to the child.
    #[arg(long, default_value = "10s", value_parser = parse_period, value_name = "DURATION")]
    pub grace: Duration,
    /// The program and its arguments.
    #[arg(last = true, required = true, num_args = 1.., value_name = "CMD")]
    pub command: Vec<String>,
}

/// The settings, checked as a whole.
struct Plan {
    args: RunArgs,
    service: ServiceKey,
    check: ReadyCheck,
    /// The registry's gRPC addresses, in the order given (every `--registry` list, flattened).
    registries: Vec<String>,
    /// TLS toward an `https://` registry (the global `--ca`, `--client-cert`, `--client-key`).
    tls: ClientTls,
    /// The registry's API token (`--token`), sent on the session.
    token: Option<String>,
}

/// A bad argument: the flag at fault and the line that says what is wrong.
type Problem = (&'static str, String);

/// Why the serving phase ended.
enum End {
    /// A stop signal.
    Signal(&'static str),
    /// The child exited by itself.
    ChildExited(std::process::ExitStatus),
}

impl Plan {
    /// Every problem at once, each naming its flag (the flag, and the line that says it).
    fn new(args: RunArgs) -> Result<Self, Vec<Problem>> {
        let mut problems = Vec::new();
        if let Err(e) = gangway_core::validate::name("service", &args.service) {
            problems.push((
                "--service",
                format!("--service (GANGWAY_SERVICE): {}", e.message),
            ));
        }
        if let Some((ip, Err(e))) = args
            .ip
            .as_deref()
            .map(|ip| (ip, gangway_core::validate::ip(ip)))
        {
            problems.push(("--ip", format!("--ip (GANGWAY_IP) {ip:?}: {}", e.message)));
        }
        let meta: BTreeMap<String, String> = args.meta.iter().cloned().collect();
        if let Err(e) = gangway_core::validate::metadata(&meta) {
            problems.push(("--meta", format!("--meta: {}", e.message)));
        }
        let check = ReadyCheck::parse(&args.ready, args.port)
            .map_err(|e| problems.push(("--ready", format!("--ready: {e}"))))
            .ok();
        // Each `--registry` was checked as a list; repeated ones add to it.
        let registries: Vec<String> = args
            .registries
            .iter()
            .flat_map(|list| crate::args::server_list(list))
            .collect();
        let twice = registries
            .iter()
            .enumerate()
            .find(|(i, r)| registries[..*i].contains(r));
        let registry = match twice {
            Some((_, r)) => {
                problems.push((
                    "--registry",
                    format!("--registry (GANGWAY_GRPC): {r:?} is given twice"),
                ));
                None
            }
            None if registries.len() > crate::args::MAX_SERVERS => {
                problems.push((
                    "--registry",
                    format!(
                        "--registry (GANGWAY_GRPC): {} addresses, at most {}",
                        registries.len(),
                        crate::args::MAX_SERVERS
                    ),
                ));
                None
            }
            None => Some(registries),
        };
        if args.readiness_port == Some(args.port) {
            // The child would fail to bind it, or the probe would ask the child for /ready.
            problems.push((
                "--readiness-port",
                format!(
                    "--readiness-port {0} is --port (GANGWAY_PORT) {0}, the child's port: give \
                     the readiness endpoint a port of its own",
                    args.port
                ),
            ));
        }
        match (check, registry) {
            (Some(check), Some(registries)) if problems.is_empty() => Ok(Self {
                service: ServiceKey::new(
                    args.namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE),
                    args.group.as_deref().unwrap_or(DEFAULT_GROUP),
                    &args.service,
                ),
                check,
                registries,
                token: None,
                args,
                tls: ClientTls::default(),
            }),
            _ => Err(problems),
        }
    }

    fn metadata(&self) -> BTreeMap<String, String> {
        let mut meta: BTreeMap<String, String> = self.args.meta.iter().cloned().collect();
        if let Some(window) = self.args.warmup {
            meta.extend(warm_up_metadata(window, SystemTime::now()));
        }
        meta
    }
}

/// Runs `gangway run`; `json` (the global `--json`) writes the steps as JSON lines.
///
/// # Errors
/// [`CliError::Usage`] naming every bad argument at once; what prevents the wrapper from
/// starting at all (no signal handler, the readiness port taken, the program not found).
/// Everything later is a logged step and an exit status.
///
/// `token`: the registry's API token (`--token`, `GANGWAY_TOKEN`), sent on the session; `tls`:
/// TLS toward an `https://` registry (`--ca`, `--client-cert`, `--client-key`).
pub async fn run(
    args: RunArgs,
    json: bool,
    token: Option<String>,
    tls: ClientTls,
) -> anyhow::Result<ExitCode> {
    // Bad arguments go out as every other command's: one line, exit 2.
    let mut plan = Plan::new(args).map_err(|problems| CliError::Usage {
        field: problems.first().map(|(field, _)| (*field).to_owned()),
        message: problems
            .iter()
            .map(|(_, line)| line.as_str())
            .collect::<Vec<_>>()
            .join("; "),
    })?;
    plan.tls = tls;
    plan.token = token;
    let events = Arc::new(Events::new(json));
    // Handlers first: a signal during start-up must reach the drain logic, not kill us.
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let readiness = match plan.args.readiness_port {
        Some(port) => {
            let (r, bound) =
                Readiness::serve(SocketAddr::new(plan.args.readiness_host, port)).await?;
            events.emit("readiness", &[("listen", bound.to_string().into())]);
            r
        }
        None => Readiness::unserved(),
    };
    let mut child = Child::spawn(&plan.args.command)?;
    events.emit(
        "started",
        &[
            ("pid", child.pid().into()),
            ("command", plan.args.command.join(" ").into()),
        ],
    );
    let code = lifecycle(&plan, &events, &readiness, &mut child, &mut term, &mut int).await;
    Ok(ExitCode::from(code))
}

async fn next_signal(term: &mut Signal, int: &mut Signal) -> &'static str {
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}

async fn lifecycle(
    plan: &Plan,
    events: &Arc<Events>,
    readiness: &Readiness,
    child: &mut Child,
    term: &mut Signal,
    int: &mut Signal,
) -> u8 {
    let args = &plan.args;
    // 1. Ready-gated: probe until the child serves.
    let http = reqwest::Client::new();
    let deadline = Instant::now() + args.ready_timeout;
    loop {
        tokio::select! {
            name = next_signal(term, int) => {
                events.signalled(name);
                return stop_child(child, args, events, None).await;
            }
            status = child.wait() => return exited(status, events),
            ok = plan.check.check(&http, args.probe_timeout) => {
                if ok {
                    events.emit("child-ready", &[("check", plan.check.to_string().into())]);
                    break;
                }
                if Instant::now() >= deadline {
                    events.emit("not-ready", &[("check", plan.check.to_string().into()),
                        ("after_ms", (args.ready_timeout.as_millis() as u64).into())]);
                    stop_child(child, args, events, None).await;
                    events.give_up("not_ready", &format!(
                        "the child did not pass --ready {} within --ready-timeout {:?}",
                        plan.check, args.ready_timeout), Some("--ready"));
                    return EXIT_FAILURE;
                }
                tokio::time::sleep(STARTUP_POLL).await;
            }
        }
    }
    // 2. Register on a session.
    let connect = Client::connect(
        crate::args::session_config(plan.registries.clone())
            .with_client_name(format!("gangway run {}", plan.service))
            .with_optional_token(plan.token.clone())
            .with_tls(plan.tls.clone()),
    );
    let client = tokio::select! {
        name = next_signal(term, int) => {
            events.signalled(name);
            return stop_child(child, args, events, None).await;
        }
        status = child.wait() => return exited(status, events),
        c = connect => match c {
            Ok(c) => c,
            Err(e) => {
                events.emit("registry-unreachable", &[("error", e.to_string().into())]);
                stop_child(child, args, events, None).await;
                events.give_up("unreachable", &e.to_string(), Some("--registry"));
                return EXIT_FAILURE;
            }
        },
    };
    // The same default as `gangway offline` (and `online`, `drain`) uses to find it again.
    let ip = match &args.ip {
        Some(ip) => ip.clone(),
        None => match crate::route::local_ip_toward(&plan.registries[0]).await {
            Ok(ip) => ip.to_string(),
            // The route was there a moment ago (the session is up): what the registry saw.
            Err(_) => client
                .session()
                .and_then(|s| peer_ip(&s.peer))
                .unwrap_or_else(|| "127.0.0.1".to_owned()),
        },
    };
    let instance = InstanceKey::new(&ip, args.port, args.cluster.as_deref().unwrap_or(""));
    // Subscribed before registering, so that this subscription is among those whose acks the
    // readiness waits for: when they are complete, its view holds the instance.
    let mut view = InView::follow(&client, &plan.service, &instance, events).await;
    let mut registration = match register(plan, &client, &instance, events).await {
        Ok(r) => Some(r),
        Err(e) => {
            stop_child(child, args, events, Some(&client)).await;
            events.give_up(
                e.code().map_or("register_failed", |c| c.as_str()),
                &e.to_string(),
                None,
            );
            return EXIT_FAILURE;
        }
    };
    // 3. and 4. Serve: wait for the acks, keep probing.
    let mut acks = registration
        .as_ref()
        .map(|r| spawn_ack_wait(r.clone(), args.ack_timeout, events.clone()));
    let mut checks = spawn_prober(plan.check.clone(), args.probe_interval, args.probe_timeout);
    let (mut passed, mut failed) = (0u32, 0u32);
    // The last complete readiness wait of the current registration, while still in the view.
    let mut acked: Option<ReadyReport> = None;
    let end = loop {
        tokio::select! {
            name = next_signal(term, int) => break End::Signal(name),
            status = child.wait() => match status {
                Ok(status) => break End::ChildExited(status),
                Err(e) => {
                    events.emit("wait-failed", &[("error", e.to_string().into())]);
                    break End::Signal("wait failure");
                }
            },
            report = async { acks.as_mut().expect("guarded").await }, if acks.is_some() => {
                acks = None;
                if let Ok(report) = report {
                    if view.now {
                        ready(readiness, events, &report);
                    }
                    acked = Some(report);
                }
            }
            now = view.flipped() => if registration.is_some() {
                if now {
                    events.emit("in-view", &[("instance", instance.addr().into())]);
                    match &acked {
                        Some(report) => ready(readiness, events, report),
                        None => {
                            readiness.set(ReadyState::Starting);
                            if acks.is_none() {
                                let r = registration.clone().expect("guarded");
                                acks = Some(spawn_ack_wait(r, args.ack_timeout, events.clone()));
                            }
                        }
                    }
                } else {
                    // Taken offline by someone else (`gangway offline`, a drain, weight 0):
                    // not ready until it is back in the view and acked there again.
                    if let Some(task) = acks.take() { task.abort(); }
                    acked = None;
                    readiness.set(ReadyState::Offline);
                    events.emit("out-of-view", &[("instance", instance.addr().into())]);
                }
            },
            Some(ok) = checks.recv() => {
                if ok { passed += 1; failed = 0 } else { failed += 1; passed = 0 }
                if failed >= args.fall {
                    if let Some(r) = registration.take() {
                        if let Some(task) = acks.take() { task.abort(); }
                        acked = None;
                        readiness.set(ReadyState::Unhealthy);
                        let result = r.deregister().await;
                        events.emit("unhealthy", &[
                            ("failed_checks", failed.into()),
                            ("deregistered", result.is_ok().into()),
                        ]);
                    }
                } else if passed >= args.rise && registration.is_none() {
                    // A refusal is logged by `register`; the next passed check tries again.
                    registration = register(plan, &client, &instance, events).await.ok();
                    if let Some(r) = &registration {
                        readiness.set(ReadyState::Starting);
                        acks = Some(spawn_ack_wait(r.clone(), args.ack_timeout, events.clone()));
                    }
                }
            }
        }
    };
    if let Some(task) = acks.take() {
        task.abort();
    }
    drop((checks, view));
    match end {
        End::ChildExited(status) => {
            if let Some(r) = registration.take() {
                let result = r.deregister().await;
                events.emit("deregistered", &[("ok", result.is_ok().into())]);
            }
            close_session(&client).await;
            exited(Ok(status), events)
        }
        End::Signal(name) => {
            events.signalled(name);
            readiness.set(ReadyState::Draining);
            shut_down(registration, args, events, child, &client).await
        }
    }
}

/// Step 5, after a stop signal: drain (forced: the process leaves even as the last instance),
/// the `--on-drain` hook, `--linger`, then the program's stop; its exit code.
async fn shut_down(
    registration: Option<Arc<Registration>>,
    args: &RunArgs,
    events: &Events,
    child: &mut Child,
    client: &Client,
) -> u8 {
    if let Some(r) = registration {
        // The client alone would wait for the answer up to its request timeout more, and while
        // disconnected for the next session: bound the step here.
        let bound = args.drain_timeout + DRAIN_ANSWER_SLACK;
        match tokio::time::timeout(bound, r.drain(args.drain_timeout, true)).await {
            Err(_) => events.emit(
                "drain-failed",
                &[
                    (
                        "error",
                        format!(
                            "no answer from the registry within --drain-timeout + {}s",
                            DRAIN_ANSWER_SLACK.as_secs()
                        )
                        .into(),
                    ),
                    ("after_ms", (bound.as_millis() as u64).into()),
                ],
            ),
            Ok(Ok(report)) => events.emit(
                "drained",
                &[
                    ("revision", report.revision.into()),
                    ("waited_ms", report.waited_ms.into()),
                    ("complete", report.complete.into()),
                    ("acked", report.acked.len().into()),
                    ("laggards", laggards(&report)),
                ],
            ),
            Ok(Err(e)) => events.emit("drain-failed", &[("error", e.to_string().into())]),
        }
    }
    if let Some(hook) = &args.on_drain {
        on_drain(hook, args.on_drain_timeout, events).await;
    }
    if !args.linger.is_zero() {
        events.emit("linger", &[("ms", (args.linger.as_millis() as u64).into())]);
        tokio::time::sleep(args.linger).await;
    }
    stop_child(child, args, events, Some(client)).await
}

/// Whether the instance is in the consumer view, as the wrapper's own subscription to its
/// service sees it: what makes `/ready` follow an offline (or online) by someone else.
struct InView {
    /// `None` when the subscription failed or ended: then the view is not followed.
    subscription: Option<Subscription>,
    instance: InstanceKey,
    /// In the view now (true when not followed).
    now: bool,
}

impl InView {
    /// Subscribes to `service`; a refusal is logged, and the view is then not followed.
    async fn follow(
        client: &Client,
        service: &ServiceKey,
        instance: &InstanceKey,
        events: &Events,
    ) -> Self {
        let subscription = match client.subscribe(service.clone()).await {
            Ok(s) => Some(s),
            Err(e) => {
                events.emit("subscribe-failed", &[("error", e.to_string().into())]);
                None
            }
        };
        Self {
            now: subscription.is_none(),
            subscription,
            instance: instance.clone(),
        }
    }

    /// Resolves when the instance enters (`true`) or leaves (`false`) the view; never when the
    /// view is not followed. Cancellation safe.
    async fn flipped(&mut self) -> bool {
        loop {
            let Some(subscription) = self.subscription.as_mut() else {
                return std::future::pending().await;
            };
            let now = match subscription.changed().await {
                Ok(view) => view.contains(&self.instance),
                Err(_) => {
                    // The client closed: nothing to follow any more.
                    self.subscription = None;
                    true
                }
            };
            if now != self.now {
                self.now = now;
                return now;
            }
        }
    }
}

/// Every subscriber acked a view holding the instance, and it is in the view: `/ready` says 200.
fn ready(readiness: &Readiness, events: &Events, report: &ReadyReport) {
    readiness.set(ReadyState::Ready);
    events.emit(
        "ready",
        &[
            ("revision", report.revision.into()),
            ("waited_ms", report.waited_ms.into()),
            ("acked", report.acked.len().into()),
        ],
    );
}

/// The laggards of a drain or readiness report, as `id@address`.
fn laggards(report: &ReadyReport) -> Value {
    Value::from(
        report
            .laggards
            .iter()
            .map(|l| format!("{}@{}", l.id, l.address))
            .collect::<Vec<_>>(),
    )
}

/// Registers the instance (with warm-up metadata when asked); logs the outcome.
async fn register(
    plan: &Plan,
    client: &Client,
    instance: &InstanceKey,
    events: &Events,
) -> Result<Arc<Registration>, gangway_client::Error> {
    match client
        .register(
            plan.service.clone(),
            instance.clone(),
            plan.args.weight,
            plan.metadata(),
        )
        .await
    {
        Ok(r) => {
            events.emit(
                "registered",
                &[
                    ("service", plan.service.to_string().into()),
                    ("instance", instance.addr().into()),
                    ("revision", r.revision().into()),
                    (
                        "warmup_ms",
                        plan.args.warmup.map_or(0, |w| w.as_millis() as u64).into(),
                    ),
                ],
            );
            Ok(Arc::new(r))
        }
        Err(e) => {
            events.emit("register-failed", &[("error", e.to_string().into())]);
            Err(e)
        }
    }
}

/// Waits until every live subscriber acked the registration: one bounded wait after another
/// (the laggards of each are logged) until one completes. Ends when aborted.
fn spawn_ack_wait(
    registration: Arc<Registration>,
    timeout: Duration,
    events: Arc<Events>,
) -> JoinHandle<ReadyReport> {
    tokio::spawn(async move {
        loop {
            match registration.ready(timeout).await {
                Ok(report) if report.complete => return report,
                Ok(report) => events.emit("acks-pending", &[("laggards", laggards(&report))]),
                Err(e) => events.emit("acks-refused", &[("error", e.to_string().into())]),
            }
            tokio::time::sleep(ACK_RETRY).await;
        }
    })
}

/// Runs the `--on-drain` hook with `sh -c` in a process group of its own (as the child,
/// [`Child::spawn`]); after `timeout` the whole group is killed, so what the hook started goes
/// too.
async fn on_drain(hook: &str, timeout: Duration, events: &Events) {
    let argv = ["sh".to_owned(), "-c".to_owned(), hook.to_owned()];
    let mut proc = match Child::spawn(&argv) {
        Ok(p) => p,
        Err(e) => {
            events.emit("on-drain-failed", &[("error", format!("{e:#}").into())]);
            return;
        }
    };
    match tokio::time::timeout(timeout, proc.wait()).await {
        Ok(Ok(status)) => events.emit("on-drain-done", &[("exit", exit_code(&status).into())]),
        Ok(Err(e)) => events.emit("on-drain-failed", &[("error", e.to_string().into())]),
        Err(_) => {
            let _ = proc.kill().await;
            events.emit(
                "on-drain-killed",
                &[("after_ms", (timeout.as_millis() as u64).into())],
            );
        }
    }
}

/// SIGTERM to the child, SIGKILL after `--grace`; closes the session; the child's exit code.
async fn stop_child(
    child: &mut Child,
    args: &RunArgs,
    events: &Events,
    client: Option<&Client>,
) -> u8 {
    events.emit("stopping-child", &[("pid", child.pid().into())]);
    let code = match child.stop(args.grace).await {
        Ok(stopped) => {
            let code = exit_code(&stopped.status);
            events.emit(
                "child-exited",
                &[("code", code.into()), ("killed", stopped.killed.into())],
            );
            code
        }
        Err(e) => {
            events.emit("wait-failed", &[("error", e.to_string().into())]);
            EXIT_FAILURE
        }
    };
    if let Some(c) = client {
        close_session(c).await;
    }
    code
}

/// Ends the session and waits, at most [`SESSION_CLOSE_WAIT`], until the client's task has
/// closed it: exiting with the stream still open would tear it down under the task, which
/// would then log a lost session on a normal stop.
async fn close_session(client: &Client) {
    client.close();
    let deadline = Instant::now() + SESSION_CLOSE_WAIT;
    while client.is_connected() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The child exited by itself: log it and pass its code on.
fn exited(status: std::io::Result<std::process::ExitStatus>, events: &Events) -> u8 {
    match status {
        Ok(status) => {
            let code = exit_code(&status);
            events.emit(
                "child-exited",
                &[("code", code.into()), ("killed", false.into())],
            );
            code
        }
        Err(e) => {
            events.emit("wait-failed", &[("error", e.to_string().into())]);
            EXIT_FAILURE
        }
    }
}

/// The IP of a `ip:port` or `[ipv6]:port` peer address.
fn peer_ip(peer: &str) -> Option<String> {
    let (host, _) = peer.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (!host.is_empty()).then(|| host.to_owned())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    fn parse(argv: &[&str]) -> Result<RunArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("run").chain(argv.iter().copied())).map(|c| c.run)
    }

    #[test]
    fn defaults_and_the_command_after_the_double_dash() {
        let a = parse(&[
            "--service",
            "orders",
            "--port",
            "8080",
            "--",
            "python3",
            "-m",
            "http.server",
        ])
        .unwrap();
        assert_eq!(a.command, ["python3", "-m", "http.server"]);
        assert_eq!((a.fall, a.rise), (3, 2));
        assert_eq!(a.grace, Duration::from_secs(10));
        let plan = Plan::new(a).unwrap();
        assert_eq!(plan.check, ReadyCheck::Tcp("127.0.0.1:8080".into()));
        assert_eq!(plan.registries, ["127.0.0.1:9848"]);
        assert!(plan.metadata().is_empty(), "no warm-up asked");
    }

    #[test]
    fn registry_lists_and_repeated_flags_make_one_failover_order() {
        let a = parse(&[
            "--service",
            "s",
            "--port",
            "80",
            "--registry",
            "a:1,b:2",
            "--registry",
            "c:3",
            "--",
            "x",
        ])
        .unwrap();
        assert_eq!(Plan::new(a).unwrap().registries, ["a:1", "b:2", "c:3"]);
        let err = parse(&[
            "--service",
            "s",
            "--port",
            "80",
            "--registry",
            "a:1,",
            "--",
            "x",
        ])
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("'--registry <HOST:PORT>'") && err.contains("address 2 of 2: empty"),
            "{err}"
        );
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let a = parse(&[
            "--service",
            "bad name",
            "--port",
            "80",
            "--ip",
            "not an ip",
            "--ready",
            "udp",
            "--registry",
            "a:1,b:2",
            "--registry",
            "a:1",
            "--",
            "x",
        ])
        .unwrap();
        let problems = Plan::new(a).err().unwrap();
        let fields: Vec<&str> = problems.iter().map(|(f, _)| *f).collect();
        assert_eq!(fields, ["--service", "--ip", "--ready", "--registry"]);
        for (field, line) in &problems {
            assert!(line.starts_with(field), "{problems:?}");
        }
        assert!(
            parse(&["--service", "s", "--port", "80"]).is_err(),
            "no command"
        );
        assert!(parse(&["--service", "s", "--port", "0", "--", "x"]).is_err());
        assert!(parse(&["--service", "s", "--port", "1", "--fall", "0", "--", "x"]).is_err());
    }

    #[test]
    fn warm_up_goes_into_the_metadata() {
        let a = parse(&[
            "--service",
            "s",
            "--port",
            "1",
            "--warmup",
            "10s",
            "--meta",
            "zone=a",
            "--",
            "x",
        ])
        .unwrap();
        let meta = Plan::new(a).unwrap().metadata();
        assert_eq!(meta["zone"], "a");
        assert_eq!(meta[gangway_client::balance::warm_up::WARM_UP_KEY], "10000");
        assert!(meta.contains_key(gangway_client::balance::warm_up::REGISTERED_AT_KEY));
    }

    #[test]
    fn peer_ips_lose_their_port_and_brackets() {
        assert_eq!(peer_ip("10.0.0.5:4000").as_deref(), Some("10.0.0.5"));
        assert_eq!(peer_ip("[fd00::5]:4000").as_deref(), Some("fd00::5"));
        assert_eq!(peer_ip("nonsense"), None);
    }
}
