//! `register`, `deregister`, `heartbeat`: an instance's registration and its lease.

use std::collections::BTreeMap;
use std::time::Duration;

use clap::{Args, ValueEnum};
use gangway_wire::client::RestError;
use gangway_wire::rest::{ProbeRequest, RegisterRequest};
use tokio::time::MissedTickBehavior;

use super::{Context, Outcome, ok};
use crate::args::{
    InstanceArgs, format_duration, parse_duration, parse_meta, parse_period, parse_weight,
};
use crate::error::CliError;
use crate::output;

/// Heartbeat period when neither `--every` nor the registry's TTL says otherwise.
pub const DEFAULT_HEARTBEAT_EVERY: Duration = Duration::from_secs(5);

/// Arguments of `gangway register`.
#[derive(Debug, Args)]
#[command(after_help = "\
An ephemeral registration over HTTP is kept alive by a lease: send heartbeats \
(`gangway heartbeat SERVICE IP:PORT`, or `--keep-alive` here) at least every TTL/3, or the \
instance turns unhealthy after the TTL and disappears after the delete timeout. A persistent \
instance (--persistent) is stored durably and probed by the registry instead.

With --keep-alive the command stays and heartbeats until Ctrl-C. When the registry no longer \
knows the instance (HTTP 404, e.g. after a registry restart) it registers it again with the \
same settings and goes on; while the registry is unreachable it warns and retries.

Examples:
  gangway register orders 10.0.0.5:8080 --meta zone=a --meta version=1.4 --keep-alive
  gangway register billing db-1.internal:5432 --persistent --probe tcp")]
pub struct RegisterArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub instance: InstanceArgs,
    /// Persistent instance: stored durably, health checked by the registry's probe,
    /// deleted only by `deregister`.
    #[arg(long)]
    pub persistent: bool,
    /// Share of traffic: 0 (never picked) or 0.001-10000 [registry default: 1].
    #[arg(long, short = 'w', value_name = "W", value_parser = parse_weight, allow_negative_numbers = true)]
    pub weight: Option<f64>,
    /// Metadata entry; repeat for more.
    #[arg(long = "meta", short = 'm', value_name = "K=V", value_parser = parse_meta)]
    pub meta: Vec<(String, String)>,
    /// Lease TTL of an ephemeral instance: seconds or 500ms/15s/1m [registry default].
    #[arg(long, value_name = "S", value_parser = parse_duration, conflicts_with = "persistent", allow_negative_numbers = true)]
    pub ttl: Option<Duration>,
    /// Time without heartbeats after which an ephemeral instance is deleted [registry default].
    #[arg(long, value_name = "S", value_parser = parse_duration, conflicts_with = "persistent", allow_negative_numbers = true)]
    pub delete_timeout: Option<Duration>,
    /// Probe of a persistent instance [registry default: tcp].
    #[arg(long, value_enum, requires = "persistent")]
    pub probe: Option<ProbeKind>,
    /// Path of an HTTP probe (implies --probe http) [registry default: /].
    #[arg(long, value_name = "P", requires = "persistent")]
    pub probe_path: Option<String>,
    /// After registering, send heartbeats until Ctrl-C (ephemeral only).
    #[arg(long, conflicts_with = "persistent")]
    pub keep_alive: bool,
    /// Heartbeat period with --keep-alive [default: a third of the lease TTL].
    #[arg(long, value_name = "S", value_parser = parse_period, requires = "keep_alive", allow_negative_numbers = true)]
    pub every: Option<Duration>,
}

/// How the registry probes a persistent instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProbeKind {
    /// A TCP connect is a pass.
    Tcp,
    /// An HTTP GET answered 200-399 is a pass.
    Http,
}

/// Arguments of `gangway deregister`.
#[derive(Debug, Args)]
pub struct DeregisterArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub instance: InstanceArgs,
    /// Remove it even when a session keeps it alive (it belongs to that session; the registry
    /// refuses otherwise, and `offline`/`drain` take it out of traffic instead).
    #[arg(long)]
    pub force: bool,
}

/// Arguments of `gangway heartbeat`.
#[derive(Debug, Args)]
#[command(after_help = "\
Stops on Ctrl-C (exit 0), or with exit 1 when the registry answers 404 (the instance is gone: \
register it again, or use `gangway register --keep-alive`, which does so by itself) or 409 (the \
instance is not lease-kept). Unreachable-registry errors are reported and retried.")]
pub struct HeartbeatArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub instance: InstanceArgs,
    /// Heartbeat period: seconds or 500ms/5s [default: a third of the lease TTL].
    #[arg(long, value_name = "S", value_parser = parse_period, allow_negative_numbers = true)]
    pub every: Option<Duration>,
    /// Send one heartbeat and exit.
    #[arg(long, conflicts_with = "every")]
    pub once: bool,
}

impl RegisterArgs {
    /// The request body; fails on a metadata key given twice.
    pub fn request(&self) -> Result<RegisterRequest, CliError> {
        let mut metadata = BTreeMap::new();
        for (k, v) in &self.meta {
            if metadata.insert(k.clone(), v.clone()).is_some() {
                return Err(CliError::usage("--meta", format!("key {k:?} given twice")));
            }
        }
        let probe = match (self.probe, &self.probe_path) {
            (None, None) => None,
            (Some(ProbeKind::Tcp), Some(_)) => {
                return Err(CliError::usage(
                    "--probe-path",
                    "only HTTP probes have a path (use --probe http)",
                ));
            }
            (Some(ProbeKind::Tcp), None) => Some(ProbeRequest {
                kind: Some(gangway_core::model::ProbeKind::Tcp),
                ..ProbeRequest::default()
            }),
            (_, path) => Some(ProbeRequest {
                kind: Some(gangway_core::model::ProbeKind::Http),
                path: path.clone(),
                ..ProbeRequest::default()
            }),
        };
        Ok(RegisterRequest {
            ip: self.instance.addr.host.clone(),
            port: u32::from(self.instance.addr.port),
            cluster: self.instance.cluster.clone(),
            weight: self.weight,
            metadata,
            ephemeral: Some(!self.persistent),
            ttl_ms: self.ttl.map(millis),
            delete_timeout_ms: self.delete_timeout.map(millis),
            probe,
            ..RegisterRequest::default()
        })
    }
}

/// `gangway register`.
pub async fn register(ctx: &Context, args: RegisterArgs) -> Outcome {
    let body = args.request()?;
    let reply = ctx
        .registry
        .register(&args.instance.service.to_ref(), &body)
        .await?;
    if ctx.json {
        output::emit_json(&reply.body)?;
    } else {
        let change = reply.parse()?;
        output::emit(&output::instance_change(
            "registered",
            &args.instance.service.service,
            &change,
        ))?;
    }
    if !args.persistent {
        let inst = &args.instance;
        if args.keep_alive {
            return heartbeat_loop(ctx, inst, args.every, Some(&body)).await;
        }
        eprintln!(
            "hint: this ephemeral instance is lease-kept: send heartbeats \
             (`{}`, or register with --keep-alive), or it turns unhealthy \
             after the TTL and disappears after the delete timeout",
            heartbeat_command(inst)
        );
    }
    ok()
}

/// The `gangway heartbeat` command line that renews `inst`'s lease: the service and address,
/// and the namespace, group and cluster when they were given (by flag or environment), since
/// the heartbeat must name the same instance.
fn heartbeat_command(inst: &InstanceArgs) -> String {
    let mut cmd = format!("gangway heartbeat {} {}", inst.service.service, inst.addr);
    for (flag, value) in [
        ("--namespace", &inst.service.namespace),
        ("--group", &inst.service.group),
        ("--cluster", &inst.cluster),
    ] {
        if let Some(v) = value {
            cmd.push_str(&format!(" {flag} {v}"));
        }
    }
    cmd
}

/// `gangway deregister`.
pub async fn deregister(ctx: &Context, args: DeregisterArgs) -> Outcome {
    let reply = ctx
        .registry
        .deregister(&args.instance.to_ref(), args.force)
        .await?;
    if ctx.json {
        output::emit_json(&reply.body)?;
    } else {
        let r = reply.parse()?;
        output::emit(&format!(
            "deregistered {} from {} (revision {})",
            args.instance.addr, args.instance.service.service, r.revision
        ))?;
    }
    ok()
}

/// `gangway heartbeat`.
pub async fn heartbeat(ctx: &Context, args: HeartbeatArgs) -> Outcome {
    if args.once {
        let reply = ctx
            .registry
            .heartbeat(&args.instance.to_ref())
            .await
            .map_err(lease_hint)?;
        if ctx.json {
            output::emit_json(&reply.body)?;
        } else {
            let a = reply.parse()?;
            output::emit(&format!(
                "heartbeat sent for {}: {}, lease TTL {}",
                args.instance.addr,
                if a.healthy { "healthy" } else { "UNHEALTHY" },
                format_duration(Duration::from_millis(a.ttl_ms))
            ))?;
        }
        return ok();
    }
    heartbeat_loop(ctx, &args.instance, args.every, None).await
}

/// Heartbeats until Ctrl-C; the period is `every`, else a third of the TTL the registry reports.
///
/// With `again` (`register --keep-alive`), an instance the registry no longer knows (404, e.g.
/// after a registry restart) is registered again with that body; without it a 404 ends the loop.
/// Unreachable registries and 5xx answers are reported and retried.
async fn heartbeat_loop(
    ctx: &Context,
    inst: &InstanceArgs,
    every: Option<Duration>,
    again: Option<&RegisterRequest>,
) -> Outcome {
    let target = inst.to_ref();
    let first = ctx.registry.heartbeat(&target).await.map_err(lease_hint)?;
    let answer = first.parse()?;
    let ttl = Duration::from_millis(answer.ttl_ms);
    if let Some(every) = every.filter(|e| answer.ttl_ms > 0 && *e >= ttl) {
        eprintln!(
            "warning: heartbeats every {} but the lease TTL is {}: the lease will expire \
             between heartbeats (send them at least every {})",
            format_duration(every),
            format_duration(ttl),
            format_duration(ttl / 3)
        );
    }
    let period = every
        .or_else(|| (answer.ttl_ms > 0).then(|| Duration::from_millis(answer.ttl_ms / 3)))
        .filter(|d| !d.is_zero())
        .unwrap_or(DEFAULT_HEARTBEAT_EVERY);
    if ctx.json {
        output::emit_json(&first.body)?;
    } else {
        output::emit(&format!(
            "heartbeating {} in {} every {} (lease TTL {}); Ctrl-C to stop",
            inst.addr,
            inst.service.service,
            format_duration(period),
            format_duration(Duration::from_millis(answer.ttl_ms))
        ))?;
    }
    let mut healthy = answer.healthy;
    let mut failing = false;
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    tick.tick().await;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        tokio::select! {
            _ = &mut ctrl_c => {
                if !ctx.json {
                    eprintln!("stopped heartbeats; the lease now runs out");
                }
                return ok();
            }
            _ = tick.tick() => {}
        }
        match (ctx.registry.heartbeat(&target).await, again) {
            (Ok(reply), _) => {
                if ctx.json {
                    output::emit_json(&reply.body)?;
                    continue;
                }
                let a = reply.parse()?;
                if failing {
                    eprintln!("heartbeats reach the registry again");
                    failing = false;
                }
                if a.healthy != healthy {
                    output::emit(&format!(
                        "{} is now {}",
                        inst.addr,
                        if a.healthy { "healthy" } else { "UNHEALTHY" }
                    ))?;
                    healthy = a.healthy;
                }
            }
            (Err(RestError::Status { status: 404, .. }), Some(body)) => {
                match ctx.registry.register(&target.service, body).await {
                    Ok(reply) => {
                        let change = reply.parse()?;
                        eprintln!(
                            "{} was gone from the registry (restarted?): registered it again \
                             (revision {}); heartbeats go on",
                            inst.addr, change.revision
                        );
                        healthy = change.instance.healthy;
                        failing = false;
                    }
                    Err(e) if is_refusal(&e) => return Err(e.into()),
                    Err(e) => {
                        eprintln!("warning: registering again failed: {e}");
                        failing = true;
                    }
                }
            }
            (Err(e), _) if is_refusal(&e) => return Err(lease_hint(e).into()),
            (Err(e), _) => {
                // A restarting or briefly unreachable registry (or a 5xx): keep trying.
                eprintln!("warning: heartbeat failed: {e}");
                failing = true;
            }
        }
    }
}

/// A 4xx answer: the registry refused, trying again will not help (a 5xx or no answer may pass).
fn is_refusal(e: &RestError) -> bool {
    matches!(e, RestError::Status { status, .. } if *status < 500)
}

/// Adds what to do to a 404 (instance gone) or 409 (not lease-kept) answer to a heartbeat.
fn lease_hint(e: RestError) -> RestError {
    match e {
        RestError::Status {
            status: 404,
            code,
            message,
            field,
        } => RestError::Status {
            status: 404,
            code,
            message: format!("{message}; the instance is gone: register it again"),
            field,
        },
        RestError::Status {
            status: 409,
            code,
            message,
            field,
        } => RestError::Status {
            status: 409,
            code,
            message: format!("{message}; only ephemeral HTTP registrations take heartbeats"),
            field,
        },
        other => other,
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
