//! `offline`, `online`, `drain`: taking an instance out of (and back into) rotation.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use super::{Context, Outcome, ok};
use crate::args::{InstanceArgs, parse_duration};
use crate::error::EXIT_DRAIN_TIMEOUT;
use crate::instance_env::EnvInstanceArgs;
use crate::output;

const EXIT_CODES: &str = "\
Exit status:
  0  done (with --wait / drain: every live subscriber acked the offline revision)
  1  the registry refused (e.g. HTTP 409: the last serving instance, use --force) or was unreachable
  2  bad arguments, whether the CLI caught them (nothing was sent) or the registry (HTTP 400)
  3  drain timed out: some subscribers had not acked (listed); the instance is offline all the same";

/// Arguments of `gangway offline`.
#[derive(Debug, Args)]
#[command(after_help = format!("\
Without --wait the instance is set offline (enabled=false) and the command returns at once. \
With --wait it drains: offline, then wait until every live subscriber has acked the new \
revision, bounded by --timeout. Use it as a Kubernetes preStop hook instead of `sleep N`, \
with the instance in the container's environment (Kubernetes does not expand $(POD_IP) in a \
hook's command): GANGWAY_SERVICE, GANGWAY_IP (fieldRef status.podIP; default: the local \
address of the route toward the registry, as `gangway run` registers it), GANGWAY_PORT, and \
GANGWAY_SERVER for the registry:
  lifecycle: {{preStop: {{exec: {{command: [gangway, offline, --wait]}}}}}}

{EXIT_CODES}"))]
pub struct OfflineArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub instance: EnvInstanceArgs,
    /// Wait until every subscriber acked (a drain); see the exit status below.
    #[arg(long)]
    pub wait: bool,
    /// With --wait: longest wait for acks, seconds or 500ms/30s/1m.
    #[arg(long, value_name = "S", value_parser = parse_duration, default_value = "30", allow_negative_numbers = true, requires = "wait")]
    pub timeout: Duration,
    /// Take it out even when it is the last serving instance of the service (without
    /// --force the registry refuses that, with or without --wait).
    #[arg(long)]
    pub force: bool,
}

/// Arguments of `gangway drain`.
#[derive(Debug, Args)]
#[command(after_help = format!("\
Same as `gangway offline --wait`: set the instance offline, then wait until every live \
subscriber has acked the new revision, bounded by --timeout; prints the waited time, the acked \
subscribers and the laggards.

{EXIT_CODES}"))]
pub struct DrainArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub instance: EnvInstanceArgs,
    /// Longest wait for acks, seconds or 500ms/30s/1m.
    #[arg(long, value_name = "S", value_parser = parse_duration, default_value = "30", allow_negative_numbers = true)]
    pub timeout: Duration,
    /// Drain even the last serving instance of the service.
    #[arg(long)]
    pub force: bool,
}

/// Arguments of `gangway online`.
#[derive(Debug, Args)]
#[command(after_help = "\
Without --wait the instance is set online (enabled=true) and the command returns at once. With \
--wait it also waits until every live subscriber has acked a revision that holds the instance, \
bounded by --timeout: only then does traffic reach it (ack-based readiness, the mirror of \
`offline --wait`). The instance may come from the environment as for `offline`.

Exit status:
  0  done (with --wait: every live subscriber acked a revision holding the instance)
  1  the registry refused (e.g. HTTP 409: the instance is not in the consumer view, being \
unhealthy or of weight 0) or was unreachable
  2  bad arguments, whether the CLI caught them (nothing was sent) or the registry (HTTP 400)
  3  timed out: some subscribers had not acked (listed); the instance is online all the same")]
pub struct OnlineArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub instance: EnvInstanceArgs,
    /// Wait until every subscriber acked a revision holding the instance; see the exit status.
    #[arg(long)]
    pub wait: bool,
    /// With --wait: longest wait for acks, seconds or 500ms/30s/1m.
    #[arg(long, value_name = "S", value_parser = parse_duration, default_value = "30", allow_negative_numbers = true, requires = "wait")]
    pub timeout: Duration,
}

/// `gangway offline`.
pub async fn offline(ctx: &Context, args: OfflineArgs) -> Outcome {
    let instance = args.instance.resolve_toward(&ctx.server).await?;
    if args.wait {
        return run_drain(ctx, &instance, args.timeout, args.force).await;
    }
    let reply = ctx.registry.offline(&instance.to_ref(), args.force).await?;
    if ctx.json {
        output::emit_json(&reply.body)?;
    } else {
        output::emit(&output::instance_change(
            "offline:",
            &instance.service.service,
            &reply.parse()?,
        ))?;
    }
    ok()
}

/// `gangway online`.
pub async fn online(ctx: &Context, args: OnlineArgs) -> Outcome {
    let instance = args.instance.resolve_toward(&ctx.server).await?;
    if args.wait {
        let reply = ctx
            .registry
            .online_wait(&instance.to_ref(), args.timeout)
            .await?;
        let report = reply.parse()?;
        if ctx.json {
            output::emit_json(&reply.body)?;
        } else {
            output::emit(&output::ready(
                &instance.addr.to_string(),
                &instance.service.service,
                &report,
            ))?;
        }
        return complete_or_timeout(report.complete);
    }
    let reply = ctx.registry.online(&instance.to_ref()).await?;
    if ctx.json {
        output::emit_json(&reply.body)?;
    } else {
        output::emit(&output::instance_change(
            "online:",
            &instance.service.service,
            &reply.parse()?,
        ))?;
    }
    ok()
}

/// `gangway drain`.
pub async fn drain(ctx: &Context, args: DrainArgs) -> Outcome {
    let instance = args.instance.resolve_toward(&ctx.server).await?;
    run_drain(ctx, &instance, args.timeout, args.force).await
}

async fn run_drain(ctx: &Context, inst: &InstanceArgs, timeout: Duration, force: bool) -> Outcome {
    let reply = ctx.registry.drain(&inst.to_ref(), timeout, force).await?;
    let report = reply.parse()?;
    if ctx.json {
        output::emit_json(&reply.body)?;
    } else {
        output::emit(&output::drain(
            &inst.addr.to_string(),
            &inst.service.service,
            &report,
        ))?;
    }
    complete_or_timeout(report.complete)
}

/// Exit 0 when every subscriber acked, 3 when the wait timed out.
fn complete_or_timeout(complete: bool) -> Outcome {
    if complete {
        ok()
    } else {
        Ok(ExitCode::from(EXIT_DRAIN_TIMEOUT))
    }
}
