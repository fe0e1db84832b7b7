//! `watch`: follow a service's consumer view as the registry pushes it.

use std::time::SystemTime;

use clap::Args;

use super::{Context, Outcome, ok};
use crate::api::ApiError;
use crate::args::ServiceArgs;
use crate::output;

/// Arguments of `gangway watch`.
#[derive(Debug, Args)]
#[command(after_help = "\
Prints one line per snapshot: local receive time (UTC), revision, instance count, addresses \
(with --json: each snapshot's JSON on one line). The watcher counts as a subscriber that acks \
every snapshot it receives. Runs until Ctrl-C, --count snapshots, or the registry closes the \
stream (exit 1).")]
pub struct WatchArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub service: ServiceArgs,
    /// Stop after this many snapshots (exit 0).
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
}

/// `gangway watch`.
pub async fn watch(ctx: &Context, args: WatchArgs) -> Outcome {
    if args.count == Some(0) {
        return ok();
    }
    let mut stream = ctx.registry.watch(&args.service).await?;
    let mut seen = 0u64;
    while let Some(reply) = stream.next_snapshot().await? {
        if ctx.json {
            output::emit_json(&reply.body)?;
        } else {
            output::emit(&output::snapshot_line(SystemTime::now(), &reply.parse()?))?;
        }
        seen += 1;
        if args.count.is_some_and(|n| seen >= n) {
            return ok();
        }
    }
    Err(ApiError::Transport {
        server: ctx.registry.server().to_owned(),
        reason: format!("the registry closed the watch stream after {seen} snapshot(s)"),
    }
    .into())
}
