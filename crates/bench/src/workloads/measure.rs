//! What the workloads share: closed- then open-loop phases of one request, and the rows and
//! columns they make.

use std::sync::Arc;

use futures::future::BoxFuture;

use super::Ctx;
use crate::load::{self, Outcome, Percentiles};
use crate::report::Row;
use crate::system::{CpuMeter, CpuUse, Server};

/// One request of a load phase: `op(worker, seq)`.
pub(crate) type Op =
    Arc<dyn Fn(usize, u64) -> BoxFuture<'static, anyhow::Result<()>> + Send + Sync>;

/// Bytes in a MiB, for RSS columns.
pub(crate) const MB: f64 = 1024.0 * 1024.0;

/// The columns of a closed-then-open-loop table of requests named `what`.
pub(crate) fn load_columns(what: &str) -> Vec<String> {
    vec![
        format!("{what}/s (closed)"),
        "p99 ms (closed)".into(),
        "p50 ms (open)".into(),
        "p99 ms (open)".into(),
        "errors".into(),
    ]
}

/// Closed loop with `op`, then open loop at the fixed rate (workers of the open loop use ids
/// from 4096 on, so their instances differ from the closed loop's): the row of [`load_columns`]
/// for `driver` on `server`, with the CPU of the closed loop.
pub(crate) async fn load_rows(ctx: &Ctx, server: &Server, driver: &str, op: Op) -> Vec<Row> {
    let p = &ctx.params;
    let label = format!("{} {driver}", server.system);
    let meter = CpuMeter::start(server);
    let closed = {
        let op = op.clone();
        load::closed_loop(
            p.concurrency,
            p.duration,
            &format!("{label} closed"),
            move |w, n| op(w, n),
        )
        .await
    };
    let cpu = meter.stop();
    let c = p.concurrency as u64;
    let open = load::open_loop(
        p.open_rate,
        p.open_duration,
        10_000,
        &format!("{label} open"),
        move |i| op(4096 + (i % c) as usize, i / c),
    )
    .await;
    vec![load_row(server, driver, &closed, &open, cpu)]
}

fn load_row(server: &Server, driver: &str, closed: &Outcome, open: &Outcome, cpu: CpuUse) -> Row {
    let c = Percentiles::of(&closed.latency);
    let o = Percentiles::of(&open.latency);
    let note = match closed.first_error.as_ref().or(open.first_error.as_ref()) {
        Some(e) => format!("first error: {}", truncate(e, 120)),
        None => String::new(),
    };
    Row::measured(
        server.system,
        driver,
        vec![
            Some(closed.rate()),
            Some(c.p99_ms),
            Some(o.p50_ms),
            Some(o.p99_ms),
            Some((closed.errors + open.errors) as f64),
        ],
        cpu,
        note,
    )
}

/// `s` cut to at most `n` bytes (on a character boundary), with an ellipsis when cut.
pub(crate) fn truncate(s: &str, n: usize) -> String {
    if s.len() <= n {
        s.to_owned()
    } else {
        let mut end = n;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &s[..end])
    }
}

/// The load generator's own RSS in MiB (the scale notes).
pub(crate) fn own_rss_mb() -> f64 {
    crate::stats::rss_bytes(std::process::id()).unwrap_or(0) as f64 / MB
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncate_cuts_on_a_character_boundary() {
        assert_eq!(truncate("short", 10), "short");
        assert_eq!(truncate("abcdef", 3), "abc…");
        // 'é' is two bytes: a cut inside it moves back before it.
        assert_eq!(truncate("aé", 2), "a…");
    }
}
