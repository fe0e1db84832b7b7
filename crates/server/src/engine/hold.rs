//! When snapshots are held back, and the registry's own stall (DESIGN §4; STYLE: "a clock jump
//! of the process itself is a stall to survive, not a reason to expire").
//!
//! Pushes stop while any hold is on: the warm-up after start (sessions re-register before
//! anything is published), a stall recovery, and a shutdown (which never ends). Subscribers
//! keep the last view they were sent meanwhile.
//!
//! A stall is a jump of the process's monotonic clock between two ticks of its own timer by
//! more than [`Config::stall_threshold`](crate::Config::stall_threshold) during which the
//! process itself hardly ran (less than a fifth of the gap in CPU time, [`STALL_CPU_SHARE`]):
//! SIGSTOP, a VM pause, swapping. A gap the process spent working (its threads busy, as under a
//! burst of pushes on a small machine), or that it ran slowly because other processes took the
//! machine's cores, is no stall: it went on reading heartbeats in order. Every peer's timers ran on during it, the registry's did not; so the registry
//! treats it like a restart, as etcd's lessor does after a leader change: every lease and
//! poller is extended by the stall, snapshots are held back for
//! [`Config::stall_recovery`](crate::Config::stall_recovery), sessions that end meanwhile
//! leave their instances in [`Liveness::Grace`] for
//! [`Config::stall_grace`](crate::Config::stall_grace) (their clients reconnect and
//! re-register them: Nacos SDKs do it 14-28 s after the resume, after their own health check
//! and redo timers), lease expiry, poller expiry and probe failures wait, and only when the
//! recovery ends is what is really gone (expired leases, pollers) removed and published; a
//! grace instance no session took back goes when its grace ends.

use std::sync::Mutex;
use std::time::Duration;

use gangway_core::model::{InstanceKey, ServiceKey};
use tokio::time::Instant;

use super::service::Changed;
use super::state::State;
use super::{Liveness, Registry};

/// Why snapshots are held back; pushes flow when none is set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Holds {
    pub(crate) loading: bool,
    pub(crate) warmup: bool,
    pub(crate) recovery: bool,
    pub(crate) shutdown: bool,
}

impl Holds {
    pub(crate) fn any(self) -> bool {
        self.loading || self.warmup || self.recovery || self.shutdown
    }
}

/// A clock gap counts as a stall only when the process used less CPU time than this share of
/// it (0.2: a fifth of one core): a stopped process uses none (SIGSTOP: about 0.01 over the
/// gap), while one starved by other processes still gets a share (a tester saw 2-5 s gaps on a
/// 2-core machine at load 9 with the earlier 0.5, each holding pushes back for 5 s).
pub(crate) const STALL_CPU_SHARE: f64 = 0.2;

/// The CPU time the process has used (`CLOCK_PROCESS_CPUTIME_ID`, every thread); zero where
/// it cannot be read, which makes every gap over the threshold a stall, as before.
pub(crate) fn process_cpu_time() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_PROCESS_CPUTIME_ID)
        .map(Duration::from)
        .unwrap_or_default()
}

/// The stall detector's clock.
pub(crate) struct StallClock {
    inner: Mutex<ClockState>,
}

struct ClockState {
    /// The last time the registry looked at its clock (timer tick or a removal path).
    last_seen: Instant,
    /// The process's CPU time then.
    last_cpu: Duration,
    /// Set while recovering from a stall: the recovery ends then.
    recovering_until: Option<Instant>,
    /// Bumped on every stall; a probe that spans a change discards its result.
    epoch: u64,
}

impl StallClock {
    pub(crate) fn new(now: Instant) -> Self {
        Self {
            inner: Mutex::new(ClockState {
                last_seen: now,
                last_cpu: process_cpu_time(),
                recovering_until: None,
                epoch: 0,
            }),
        }
    }

    /// Starts the clock again at `now` (after loading the store, which is no stall).
    pub(crate) fn reset(&self, now: Instant) {
        let mut clock = self.lock();
        clock.last_seen = now;
        clock.last_cpu = process_cpu_time();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ClockState> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What [`Registry::observe_clock`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClockReading {
    /// Time moves normally and no recovery runs.
    Normal,
    /// A recovery runs (it may have started just now).
    Recovering,
}

impl Registry {
    /// Looks at the clock: when it jumped by more than the stall threshold since the last look,
    /// starts a stall recovery. Called by the background timer every tick and by every path that
    /// removes or expires something, before it does, so that whichever task runs first after a
    /// stall notices it.
    pub(crate) fn observe_clock(&self, now: Instant) -> ClockReading {
        self.observe_clock_at(now, process_cpu_time())
    }

    /// [`observe_clock`](Self::observe_clock) with the process's CPU time `cpu` read by the
    /// caller: a gap over the threshold is a stall when the CPU time grew by less than
    /// [`STALL_CPU_SHARE`] of it.
    pub(crate) fn observe_clock_at(&self, now: Instant, cpu: Duration) -> ClockReading {
        let threshold = self.inner.config.stall_threshold;
        let stall = {
            let mut clock = self.inner.clock.lock();
            let gap = now.saturating_duration_since(clock.last_seen);
            let worked = cpu.saturating_sub(clock.last_cpu);
            clock.last_seen = clock.last_seen.max(now);
            clock.last_cpu = clock.last_cpu.max(cpu);
            if gap > threshold && worked.as_secs_f64() < gap.as_secs_f64() * STALL_CPU_SHARE {
                clock.epoch += 1;
                clock.recovering_until = Some(now + self.inner.config.stall_recovery);
                Some(gap)
            } else {
                None
            }
        };
        if let Some(gap) = stall {
            self.begin_recovery(gap);
            return ClockReading::Recovering;
        }
        if self.recovering(now) {
            ClockReading::Recovering
        } else {
            ClockReading::Normal
        }
    }

    /// True while a stall recovery runs.
    pub(crate) fn recovering(&self, now: Instant) -> bool {
        self.inner
            .clock
            .lock()
            .recovering_until
            .is_some_and(|until| now < until)
    }

    /// Bumped on every stall.
    pub(crate) fn stall_epoch(&self) -> u64 {
        self.inner.clock.lock().epoch
    }

    /// Changes the holds and publishes whether pushes may flow.
    pub(crate) fn set_hold(&self, change: impl FnOnce(&mut Holds)) {
        self.inner.holds.send_modify(change);
    }

    fn begin_recovery(&self, gap: Duration) {
        tracing::warn!(
            stall_ms = gap.as_millis() as u64,
            recovery_ms = self.inner.config.stall_recovery.as_millis() as u64,
            "the registry itself stalled: leases extended, snapshots held back while sessions reconnect"
        );
        self.inner.metrics.stalls.inc();
        self.set_hold(|h| h.recovery = true);
        {
            let mut state = self.lock();
            let mut deadlines = Vec::new();
            for (svc, service) in state.services.iter_mut() {
                for entry in service.instances.values_mut() {
                    if let Liveness::Grace { until, .. } = &mut entry.liveness {
                        *until += gap;
                    }
                    if let Liveness::Lease(lease) = &mut entry.liveness {
                        lease.last_heartbeat += gap;
                        let next = if entry.instance.healthy {
                            lease.ttl
                        } else {
                            lease.delete_timeout
                        };
                        deadlines.push((
                            lease.last_heartbeat + next,
                            svc.clone(),
                            entry.instance.key.clone(),
                        ));
                    }
                }
            }
            state.leases.rebuild(deadlines);
            for sub in state.subscribers.values_mut() {
                sub.last_seen += gap;
            }
        }
        let (epoch, until) = {
            let clock = self.inner.clock.lock();
            (clock.epoch, clock.recovering_until)
        };
        let Some(until) = until else { return };
        let registry = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(until).await;
            registry.end_recovery(epoch);
        });
    }

    /// Ends the recovery started at `epoch` unless a later stall extended it: lets pushes flow
    /// (unless another hold is on). Instances in grace stay until their own deadline.
    fn end_recovery(&self, epoch: u64) {
        {
            let mut clock = self.inner.clock.lock();
            if clock.epoch != epoch {
                return; // a later stall extended the recovery; its own timer ends it
            }
            clock.recovering_until = None;
        }
        self.set_hold(|h| h.recovery = false);
        tracing::info!("stall recovery over: pushing snapshots");
    }

    /// Removes, at `until`, the instances in grace whose deadline has passed by then and that
    /// no session registered again, in one revision per service. A stall meanwhile moves the
    /// deadlines on (see `begin_recovery`): the task then waits for the earliest one left. One
    /// task for the registry (`State::grace_timer`); it ends, clearing the flag under the
    /// state lock, when no instance is left in grace.
    pub(crate) fn expire_grace_at(&self, until: Instant) {
        let registry = self.clone();
        tokio::spawn(async move {
            let mut next = until;
            loop {
                tokio::time::sleep_until(next).await;
                let now = Instant::now();
                // A stall while asleep is noticed (and the deadlines moved) before any removal.
                registry.observe_clock(now);
                match registry.remove_expired_grace(now) {
                    Some(later) => next = later,
                    None => return,
                }
            }
        });
    }

    /// Removes the instances whose grace ended by `now`; returns the earliest deadline still
    /// ahead, if any. O(instances) of the registry: runs once per grace deadline, which only
    /// a stall of the registry itself creates.
    fn remove_expired_grace(&self, now: Instant) -> Option<Instant> {
        let mut state = self.lock();
        let mut gone: Vec<(ServiceKey, InstanceKey)> = Vec::new();
        let mut later: Option<Instant> = None;
        for (svc, s) in &state.services {
            for e in s.instances.values() {
                if let Liveness::Grace { until, .. } = e.liveness {
                    if until <= now {
                        gone.push((svc.clone(), e.instance.key.clone()));
                    } else {
                        later = Some(later.map_or(until, |l| l.min(until)));
                    }
                }
            }
        }
        remove_in_one_revision(
            &mut state,
            gone,
            "stall grace over: no session registered it again, removed",
        );
        state.grace_timer = later.is_some();
        later
    }

    /// Removes at once the instances in stall grace whose owner `still_known` says has no
    /// credential any more (its API token or user removed at a reload of the auth file): no
    /// client can register them again, so waiting out the grace would only keep a revoked
    /// principal's instances in every consumer's view. One revision per service; returns how
    /// many went. Called at every reload (crate `start`).
    pub fn end_grace_of_unknown_owners(&self, still_known: impl Fn(&str) -> bool) -> usize {
        let mut state = self.lock();
        let gone: Vec<(ServiceKey, InstanceKey)> = state
            .services
            .iter()
            .flat_map(|(svc, s)| {
                s.instances
                    .values()
                    .filter(|e| matches!(e.liveness, Liveness::Grace { .. }))
                    .filter(|e| e.owner.as_deref().is_some_and(|o| !still_known(o)))
                    .map(|e| (svc.clone(), e.instance.key.clone()))
            })
            .collect();
        let count = gone.len();
        remove_in_one_revision(
            &mut state,
            gone,
            "stall grace ended: its owner's credential was removed at a reload",
        );
        count
    }
}

/// Removes `gone` (logging `why` for each) and publishes one revision per service touched.
fn remove_in_one_revision(state: &mut State, gone: Vec<(ServiceKey, InstanceKey)>, why: &str) {
    let mut touched: Vec<(ServiceKey, Vec<InstanceKey>)> = Vec::new();
    for (svc, key) in gone {
        tracing::info!(service = %svc, instance = %key, "{why}");
        state.remove(&svc, &key);
        match touched.iter_mut().find(|(s, _)| s == &svc) {
            Some((_, keys)) => keys.push(key),
            None => touched.push((svc, vec![key])),
        }
    }
    for (svc, keys) in &touched {
        state.publish(svc, Changed::Keys(keys.clone()));
    }
}
