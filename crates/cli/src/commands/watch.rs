//! `watch`: follow a service's consumer view as the registry pushes it.

use std::time::{Duration, SystemTime};

use clap::Args;

use super::{Context, Outcome, ok};
use crate::args::{ServiceArgs, format_duration, parse_count};
use crate::output;

/// Wait before the first reconnect after the stream broke.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// Longest wait between reconnects (the wait doubles from [`FIRST_BACKOFF`] up to this).
pub const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Arguments of `gangway watch`.
#[derive(Debug, Args)]
#[command(after_help = "\
Prints one line per snapshot: local receive time (UTC), revision, instance count, addresses \
(with --json: each snapshot's JSON on one line). The watcher counts as a subscriber that acks \
every snapshot it receives. Runs until Ctrl-C (exit 0) or --count snapshots (exit 0). When the \
stream breaks (e.g. the registry restarts) it reconnects, waiting 100ms, then twice as long \
after each failed attempt up to 2s, with one line on stderr per attempt; the first snapshot of \
a new stream is the current view. Exit 1 when the first connection fails or the registry \
refuses the watch.")]
pub struct WatchArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub service: ServiceArgs,
    /// Stop after this many snapshots (exit 0).
    #[arg(long, value_name = "N", value_parser = parse_count, allow_negative_numbers = true)]
    pub count: Option<u64>,
}

/// `gangway watch`.
pub async fn watch(ctx: &Context, args: WatchArgs) -> Outcome {
    if args.count == Some(0) {
        return ok();
    }
    let service = args.service.to_ref();
    let mut stream = ctx.registry.watch(&service).await?;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut seen = 0u64;
    let mut backoff = FIRST_BACKOFF;
    loop {
        let mut reason = loop {
            let next = tokio::select! {
                _ = &mut ctrl_c => return ok(),
                next = stream.next_snapshot() => next,
            };
            match next {
                Ok(Some(reply)) => {
                    if ctx.json {
                        output::emit_json(&reply.body)?;
                    } else {
                        output::emit(&output::snapshot_line(SystemTime::now(), &reply.parse()?))?;
                    }
                    seen += 1;
                    backoff = FIRST_BACKOFF;
                    if args.count.is_some_and(|n| seen >= n) {
                        return ok();
                    }
                }
                Ok(None) => break "the registry closed the watch stream".to_owned(),
                Err(e) if e.is_retryable() => break e.to_string(),
                Err(e) => return Err(e.into()),
            }
        };
        stream = loop {
            eprintln!("{reason}; reconnecting in {}", format_duration(backoff));
            tokio::select! {
                _ = &mut ctrl_c => return ok(),
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
            // No answer, a broken stream or a 5xx (a registry restarting) are worth another
            // attempt; a 4xx or an answer from something else are not.
            match ctx.registry.watch(&service).await {
                Ok(s) => break s,
                Err(e) if e.is_retryable() => reason = e.to_string(),
                Err(e) => return Err(e.into()),
            }
        };
    }
}
