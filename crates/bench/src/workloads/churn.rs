//! `churn`: N instances of one service deregister at once (64 in flight) with N subscribers:
//! the time until every subscriber holds the final list.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gangway_wire::client::RestClient;
use tokio::sync::Notify;

use super::lineup::{self, Entry, OfSubscribers, Plan};
use super::{Ctx, Params};
use crate::drivers::rest_driver;
use crate::drivers::{Deregister, OnUpdate, Register, Serves, Subscribe, Update};
use crate::load;
use crate::report::{Row, Table};
use crate::system::{CpuMeter, Server, System};

/// Requests in flight while instances are registered and deregistered.
const IN_FLIGHT: usize = 64;
/// How long the subscribers may take to see the full list before the run fails.
const FULL_TIMEOUT: Duration = Duration::from_secs(30);
/// How long they may take to see the final list after the deregistrations began.
const FINAL_TIMEOUT: Duration = Duration::from_secs(60);

/// The table and the lineup.
pub(super) fn plan(p: &Params) -> Plan {
    let table = Table::new(
        "churn",
        format!(
            "{n} instances of one service deregister at once (64 in flight) with {n} subscribers: time until every subscriber holds the final list",
            n = p.churn
        ),
        vec![
            "instances".into(),
            "deregistered ms".into(),
            "p50 ms (each final)".into(),
            "last ms (all final)".into(),
        ],
        3,
        false,
        vec!["One more instance stays, so the final list is not empty (Nacos SDKs ignore empty lists).".into()],
    );
    Plan::new(table, lineup::subscribers::<Measured>())
}

/// This workload's measurement, as a type (its lineup's entries).
struct Measured;

impl OfSubscribers for Measured {
    fn entry<S: Serves<D>, D: Subscribe>() -> Entry {
        Entry::new::<S, D>(|ctx, server| Box::pin(measure::<D>(ctx, server)))
    }
}

/// Shared state of the churn: who holds the full list, who holds the final one and since when.
struct Churn {
    full: Vec<AtomicBool>,
    full_count: AtomicUsize,
    finished: Vec<AtomicBool>,
    t0: Mutex<Option<Instant>>,
    finals: Mutex<Vec<Duration>>,
    changed: Notify,
}

impl Churn {
    fn new(n: usize) -> Arc<Churn> {
        Arc::new(Churn {
            full: (0..n).map(|_| AtomicBool::default()).collect(),
            full_count: AtomicUsize::new(0),
            finished: (0..n).map(|_| AtomicBool::default()).collect(),
            t0: Mutex::new(None),
            finals: Mutex::new(Vec::new()),
            changed: Notify::new(),
        })
    }

    /// Subscriber `i` holds `len` instances of `full_len`.
    // Nested `if let` rather than a let chain: the workspace keeps the 1.85 MSRV.
    #[allow(clippy::collapsible_if)]
    fn observe(&self, i: usize, len: usize, full_len: usize) {
        if len == full_len && !self.full[i].swap(true, Ordering::AcqRel) {
            self.full_count.fetch_add(1, Ordering::AcqRel);
            self.changed.notify_one();
        }
        if len == 1 {
            let t0 = *self.t0.lock().unwrap();
            if let Some(t0) = t0 {
                if !self.finished[i].swap(true, Ordering::AcqRel) {
                    self.finals.lock().unwrap().push(t0.elapsed());
                    self.changed.notify_one();
                }
            }
        }
    }

    /// Waits until `pred` holds (true) or `timeout` passed (false).
    async fn until(&self, timeout: Duration, mut pred: impl FnMut() -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        while !pred() {
            if tokio::time::timeout_at(deadline, self.changed.notified())
                .await
                .is_err()
            {
                return pred();
            }
        }
        true
    }
}

/// Instance `i` of the churned service.
fn addr(i: usize) -> (String, u16) {
    ("127.0.0.2".to_owned(), 1000 + i as u16)
}

/// Registers (or with `remove`, deregisters) the `n` churned instances, 64 in flight.
async fn change_all<P: Deregister>(
    producer: &<P as Register>::Client,
    svc: &str,
    n: usize,
    remove: bool,
) -> anyhow::Result<()> {
    let label = if remove { "deregister" } else { "instances" };
    load::for_each(n, IN_FLIGHT, label, |i| async move {
        let (ip, port) = addr(i);
        if remove {
            P::deregister(producer, 0, svc, &ip, port).await
        } else {
            P::register(producer, 0, svc, &ip, port).await
        }
    })
    .await
    .map(drop)
}

async fn measure<D: Subscribe>(ctx: &Ctx, server: &Server) -> anyhow::Result<Vec<Row>> {
    let n = ctx.params.churn;
    let svc = format!("bench-churn-{}", D::NAME.replace('+', ""));
    let full_len = n + 1;
    // One producer with 64 requests in flight: the native session for gangway's native run,
    // v1 HTTP leases for the Nacos runs (one Nacos connection holds one instance per service),
    // keys under one lease for etcd.
    let producer = D::Producer::connect(server, 1).await?;
    let keeper = D::Producer::connect(server, 1).await?;
    D::Producer::register(&keeper, 0, &svc, "127.0.0.1", 1).await?;
    // Nacos v1 leases last 15 s: beat them, as the SDKs do, while the run outlasts them (the
    // churned ones until they are deregistered, the kept one to the end).
    let _keeper_beats = Aborted(D::Producer::keep_alive(
        &keeper,
        &svc,
        vec![("127.0.0.1".to_owned(), 1)],
    ));
    let churned_beats = Aborted(D::Producer::keep_alive(
        &producer,
        &svc,
        (0..n).map(addr).collect(),
    ));
    if !D::SENDS_LISTS {
        // Instances first, then the watches, which start from the full list.
        change_all::<D::Producer>(&producer, &svc, n, false).await?;
    }
    let state = Churn::new(n);
    let counts: Arc<Vec<AtomicI64>> =
        Arc::new((0..n).map(|_| AtomicI64::new(full_len as i64)).collect());
    let on_update: OnUpdate = {
        let state = state.clone();
        let counts = counts.clone();
        Arc::new(move |i, u| match u {
            Update::Ports(ports) => state.observe(i, ports.count(), full_len),
            Update::Event { deleted, .. } => {
                let left = if deleted {
                    counts[i].fetch_sub(1, Ordering::AcqRel) - 1
                } else {
                    counts[i].load(Ordering::Acquire)
                };
                state.observe(i, left.max(0) as usize, full_len);
            }
        })
    };
    let held = D::subscribe(server, &svc, n, on_update).await?;
    if D::SENDS_LISTS {
        change_all::<D::Producer>(&producer, &svc, n, false).await?;
    } else {
        for i in 0..n {
            state.observe(i, full_len, full_len);
        }
    }
    let all_full = state
        .until(FULL_TIMEOUT, || {
            state.full_count.load(Ordering::Acquire) == n
        })
        .await;
    if !all_full {
        let behind = laggards(server, &svc).await;
        anyhow::bail!(
            "only {} of {n} subscribers saw all {full_len} instances within 30 s{behind}",
            state.full_count.load(Ordering::Acquire)
        );
    }
    let meter = CpuMeter::start(server);
    drop(churned_beats);
    let t0 = Instant::now();
    *state.t0.lock().unwrap() = Some(t0);
    change_all::<D::Producer>(&producer, &svc, n, true).await?;
    let deregistered = t0.elapsed();
    let all_final = state
        .until(FINAL_TIMEOUT, || state.finals.lock().unwrap().len() == n)
        .await;
    let cpu = meter.stop();
    let behind = if all_final {
        String::new()
    } else {
        laggards(server, &svc).await
    };
    let reconnects = D::reconnects(&held);
    drop(held);
    let mut finals = state.finals.lock().unwrap().clone();
    finals.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let p50 = finals.get(finals.len() / 2).map(|d| ms(*d));
    let mut note = match (all_final, D::PRODUCED_VIA) {
        (true, "") => String::new(),
        (true, via) => format!("instances via {via}"),
        (false, _) => format!(
            "only {} of {n} subscribers reached the final list within 60 s{behind}",
            finals.len()
        ),
    };
    if reconnects > 0 {
        let sep = if note.is_empty() { "" } else { "; " };
        note.push_str(&format!(
            "{sep}{reconnects} subscriber connections ended by the server and reopened"
        ));
    }
    Ok(vec![Row::measured(
        server.system,
        D::NAME,
        vec![
            Some(n as f64),
            Some(ms(deregistered)),
            p50,
            all_final.then(|| finals.last().map(|d| ms(*d))).flatten(),
        ],
        cpu,
        note,
    )])
}

/// What gangway's subscriber table says of `svc`'s subscribers behind its revision: how many
/// were pushed the latest revision and how many acked it (", server: ..."), for a run that did
/// not converge; "" for the other systems.
async fn laggards(server: &Server, svc: &str) -> String {
    if server.system != System::Gangway {
        return String::new();
    }
    let Ok(registry) = RestClient::new(&server.http.to_string()) else {
        return String::new();
    };
    let Ok(table) = registry
        .subscribers(&rest_driver::service(svc))
        .await
        .and_then(|reply| reply.parse())
    else {
        return String::new();
    };
    let revision = table.revision;
    let subs = table.subscribers;
    let pushed = subs
        .iter()
        .filter(|s| s.pushed_revision == Some(revision))
        .count();
    let acked = subs.iter().filter(|s| s.acked_revision == revision).count();
    format!(
        "; server: {} subscribers, {pushed} pushed and {acked} acked the latest revision",
        subs.len()
    )
}

/// Aborts a [`Register::keep_alive`] task when dropped.
struct Aborted(Option<tokio::task::AbortHandle>);

impl Drop for Aborted {
    fn drop(&mut self) {
        if let Some(task) = &self.0 {
            task.abort();
        }
    }
}
