//! Load generators: closed loop (N workers, each sends its next request when the previous one
//! answered: throughput) and open loop (requests start on a fixed schedule whatever the answers:
//! latency without coordinated omission, measured from the intended start). Latencies go into
//! HdrHistograms in microseconds.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

/// Highest latency recorded (60 s, in µs); slower answers are clamped to it.
const MAX_US: u64 = 60_000_000;

/// A latency histogram in microseconds.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_US, 3).expect("static bounds are valid")
}

/// Records `d` (clamped to the histogram's range).
pub fn record(h: &mut Histogram<u64>, d: Duration) {
    let us = u64::try_from(d.as_micros())
        .unwrap_or(MAX_US)
        .clamp(1, MAX_US);
    h.record(us).expect("clamped into range");
}

/// What one load phase measured.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Requests answered successfully.
    pub ok: u64,
    /// Requests that failed.
    pub errors: u64,
    /// The first error seen, for the report.
    pub first_error: Option<String>,
    /// Wall time of the phase.
    pub elapsed: Duration,
    /// Latencies of successful requests (µs).
    pub latency: Histogram<u64>,
}

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Percentiles {
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Largest.
    pub max_ms: f64,
    /// Number of samples.
    pub count: u64,
}

impl Percentiles {
    /// The percentiles of `h` (all zero when it is empty).
    pub fn of(h: &Histogram<u64>) -> Self {
        let ms = |us: u64| us as f64 / 1000.0;
        Percentiles {
            p50_ms: ms(h.value_at_quantile(0.50)),
            p99_ms: ms(h.value_at_quantile(0.99)),
            max_ms: ms(h.max()),
            count: h.len(),
        }
    }
}

impl Outcome {
    /// Successful requests per second.
    pub fn rate(&self) -> f64 {
        self.ok as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// A progress bar on stderr (hidden when stderr is not a terminal) for a phase of `len` steps.
pub fn bar(len: u64, msg: impl Into<String>) -> ProgressBar {
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template("{spinner} {msg:40} [{bar:30}] {pos}/{len} {per_sec}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    pb.set_message(msg.into());
    pb
}

/// A progress bar over a timed phase (in ms), advanced by a ticker.
fn timed_bar(d: Duration, msg: &str) -> ProgressBar {
    let pb = ProgressBar::new(d.as_millis() as u64);
    pb.set_style(
        ProgressStyle::with_template("{spinner} {msg:40} [{bar:30}] {elapsed} {prefix}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    pb.set_message(msg.to_owned());
    pb
}

/// Runs `workers` closed-loop workers for `duration`. `op(worker, seq)` is one request; `seq`
/// counts that worker's requests from 0.
pub async fn closed_loop<F, Fut>(workers: usize, duration: Duration, label: &str, op: F) -> Outcome
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let op = Arc::new(op);
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + duration;
    let pb = timed_bar(duration, label);
    let mut tasks = Vec::with_capacity(workers);
    for w in 0..workers {
        let op = op.clone();
        let done = done.clone();
        tasks.push(tokio::spawn(async move {
            let mut h = histogram();
            let (mut ok, mut errors, mut first_error) = (0u64, 0u64, None);
            let mut seq = 0u64;
            while Instant::now() < deadline {
                let t = Instant::now();
                match op(w, seq).await {
                    Ok(()) => {
                        record(&mut h, t.elapsed());
                        ok += 1;
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        errors += 1;
                        first_error.get_or_insert_with(|| format!("{e:#}"));
                        // A failing system should not spin the CPU.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
                seq += 1;
            }
            (h, ok, errors, first_error)
        }));
    }
    let ticker = {
        let pb = pb.clone();
        let done = done.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let el = start.elapsed();
                pb.set_position(el.as_millis() as u64);
                let n = done.load(Ordering::Relaxed);
                pb.set_prefix(format!("{:.0}/s", n as f64 / el.as_secs_f64()));
            }
        })
    };
    let mut out = Outcome {
        ok: 0,
        errors: 0,
        first_error: None,
        elapsed: Duration::ZERO,
        latency: histogram(),
    };
    for t in tasks {
        if let Ok((h, ok, errors, first)) = t.await {
            out.latency.add(&h).expect("same bounds");
            out.ok += ok;
            out.errors += errors;
            if out.first_error.is_none() {
                out.first_error = first;
            }
        }
    }
    out.elapsed = start.elapsed();
    ticker.abort();
    pb.finish_and_clear();
    out
}

/// Runs an open loop at `rate` requests/s for `duration`: request `i` is due at
/// `start + i / rate` and its latency counts from then, so a stalled server shows as latency
/// rather than as fewer requests. At most `max_in_flight` requests are outstanding; beyond that a
/// request counts as an error (the system is overloaded at this rate).
pub async fn open_loop<F, Fut>(
    rate: f64,
    duration: Duration,
    max_in_flight: u64,
    label: &str,
    op: F,
) -> Outcome
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let op = Arc::new(op);
    let total = (rate * duration.as_secs_f64()).round() as u64;
    let in_flight = Arc::new(AtomicU64::new(0));
    let pb = bar(total, label);
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(total as usize);
    let mut shed = 0u64;
    for i in 0..total {
        let due = start + Duration::from_secs_f64(i as f64 / rate);
        tokio::time::sleep_until(due.into()).await;
        if in_flight.load(Ordering::Relaxed) >= max_in_flight {
            shed += 1;
            continue;
        }
        in_flight.fetch_add(1, Ordering::Relaxed);
        let op = op.clone();
        let in_flight = in_flight.clone();
        tasks.push(tokio::spawn(async move {
            let r = op(i).await;
            in_flight.fetch_sub(1, Ordering::Relaxed);
            r.map(|()| due.elapsed())
        }));
        if i % 256 == 0 {
            pb.set_position(i);
        }
    }
    let mut out = Outcome {
        ok: 0,
        errors: shed,
        first_error: (shed > 0)
            .then(|| format!("{shed} requests shed: over {max_in_flight} in flight")),
        elapsed: Duration::ZERO,
        latency: histogram(),
    };
    for t in tasks {
        match t.await {
            Ok(Ok(d)) => {
                record(&mut out.latency, d);
                out.ok += 1;
            }
            Ok(Err(e)) => {
                out.errors += 1;
                out.first_error.get_or_insert_with(|| format!("{e:#}"));
            }
            Err(e) => {
                out.errors += 1;
                out.first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }
    out.elapsed = start.elapsed();
    pb.finish_and_clear();
    out
}

/// Runs `op(i)` for `i` in `0..n` with at most `concurrency` at once, behind a progress bar;
/// fails on the first error. For setting a workload up, not for measuring.
pub async fn for_each<F, Fut, T>(
    n: usize,
    concurrency: usize,
    label: &str,
    op: F,
) -> anyhow::Result<Vec<T>>
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = anyhow::Result<T>>,
{
    use futures::StreamExt as _;
    let pb = bar(n as u64, label);
    let results: Vec<(usize, anyhow::Result<T>)> = futures::stream::iter(0..n)
        .map(|i| {
            let f = op(i);
            let pb = pb.clone();
            async move {
                let r = f.await;
                pb.inc(1);
                (i, r)
            }
        })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    pb.finish_and_clear();
    let mut ordered: Vec<Option<T>> = (0..n).map(|_| None).collect();
    for (i, r) in results {
        ordered[i] = Some(r?);
    }
    Ok(ordered
        .into_iter()
        .map(|o| o.expect("every index ran"))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn closed_loop_counts_and_errors() {
        let out = closed_loop(4, Duration::from_millis(100), "t", |_, seq| async move {
            tokio::time::sleep(Duration::from_millis(1)).await;
            if seq == 3 {
                anyhow::bail!("boom")
            } else {
                Ok(())
            }
        })
        .await;
        assert!(out.ok > 10, "{}", out.ok);
        assert_eq!(out.errors, 4);
        assert_eq!(out.first_error.as_deref(), Some("boom"));
        assert!(Percentiles::of(&out.latency).p50_ms >= 1.0);
    }

    #[tokio::test]
    async fn open_loop_sends_on_schedule_and_sheds() {
        let out = open_loop(1000.0, Duration::from_millis(100), 1000, "t", |_| async {
            Ok(())
        })
        .await;
        assert_eq!(out.ok, 100);
        let slow = open_loop(1000.0, Duration::from_millis(50), 5, "t", |_| async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Ok(())
        })
        .await;
        assert_eq!(slow.ok, 5);
        assert_eq!(slow.errors, 45);
    }

    #[tokio::test]
    async fn for_each_keeps_order_and_fails() {
        let v = for_each(10, 3, "t", |i| async move { Ok(i * 2) })
            .await
            .unwrap();
        assert_eq!(v, (0..10).map(|i| i * 2).collect::<Vec<_>>());
        let e = for_each(5, 2, "t", |i| async move {
            if i == 2 { anyhow::bail!("no") } else { Ok(i) }
        })
        .await;
        assert!(e.is_err());
    }

    #[test]
    fn percentiles_of_empty_and_full() {
        let mut h = histogram();
        assert_eq!(Percentiles::of(&h).count, 0);
        for ms in 1..=100 {
            record(&mut h, Duration::from_millis(ms));
        }
        let p = Percentiles::of(&h);
        assert!((p.p50_ms - 50.0).abs() < 0.1, "{p:?}");
        assert!((p.p99_ms - 99.0).abs() < 0.1, "{p:?}");
    }
}
