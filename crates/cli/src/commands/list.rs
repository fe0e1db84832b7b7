//! Read-only commands: `list`, `services`, `subscribers`.

use clap::Args;

use super::{Context, Outcome, ok};
use crate::args::{ServiceArgs, parse_name};
use crate::output;

/// Arguments of `gangway list`.
#[derive(Debug, Args)]
#[command(after_help = "\
Without --all this is the consumer view: enabled, healthy instances with weight > 0, or every \
enabled instance when the protect threshold triggered. Listing counts as a poll: it acks the \
listed revision for this client.")]
pub struct ListArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub service: ServiceArgs,
    /// Every instance whatever its state (disabled, unhealthy, weight 0).
    #[arg(long, short = 'a')]
    pub all: bool,
}

/// Arguments of `gangway services`.
#[derive(Debug, Args)]
pub struct ServicesArgs {
    /// Only this namespace [default: all].
    #[arg(long, short = 'n', value_parser = parse_name)]
    pub namespace: Option<String>,
    /// Only this group [default: all].
    #[arg(long, short = 'g', value_parser = parse_name)]
    pub group: Option<String>,
}

/// Arguments of `gangway subscribers`.
#[derive(Debug, Args)]
pub struct SubscribersArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub service: ServiceArgs,
}

/// `gangway list`.
pub async fn list(ctx: &Context, args: ListArgs) -> Outcome {
    let reply = ctx
        .registry
        .instances(&args.service.to_ref(), args.all)
        .await?;
    if ctx.json {
        output::emit_json(&reply.body)?;
    } else {
        let mut view = reply.parse()?;
        if view.service.is_empty() {
            view.service = args.service.service.clone();
        }
        output::emit(&output::view(&view, args.all))?;
    }
    ok()
}

/// `gangway services`.
pub async fn services(ctx: &Context, args: ServicesArgs) -> Outcome {
    let reply = ctx
        .registry
        .services(args.namespace.as_deref(), args.group.as_deref())
        .await?;
    if ctx.json {
        output::emit_json(&reply.body)?;
    } else {
        output::emit(&output::services(&reply.parse()?))?;
        // Cluster mode: the nodes too (`GET /v1/cluster`; a registry without it is skipped).
        if let Ok(cluster) = ctx.registry.cluster().await
            && let Ok(view) = cluster.parse()
            && view.mode == "cluster"
        {
            output::emit(&output::nodes(&view))?;
        }
    }
    ok()
}

/// `gangway subscribers`.
pub async fn subscribers(ctx: &Context, args: SubscribersArgs) -> Outcome {
    let reply = ctx.registry.subscribers(&args.service.to_ref()).await?;
    if ctx.json {
        output::emit_json(&reply.body)?;
    } else {
        output::emit(&output::subscribers(&args.service.service, &reply.parse()?))?;
    }
    ok()
}
