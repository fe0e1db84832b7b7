//! The per-service outlier detector: records outcomes, ejects, admits, recovers.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Mutex, MutexGuard, PoisonError};

use gangway_core::model::{Instance, InstanceKey, ServiceKey};
use tokio::time::Instant;

use super::schedule::Ejection;
use super::window::RequestWindow;
use super::{
    EjectionInfo, EjectionReason, Outcome, OutlierConfig, OutlierMetrics, RecoveryCheck,
    RecoverySchedule,
};
use crate::Error;

/// Outlier ejection for the instances of one service, local to this consumer.
///
/// One detector per service, shared between tasks (`Send + Sync`; a mutex inside, held for
/// microseconds, never across an `.await`). Nothing runs in the background: every decision
/// is taken inside a call, against `tokio::time::Instant::now()`, so tests drive it on a
/// paused clock. See the [module docs](super) for the request loop it expects.
#[derive(Debug)]
pub struct OutlierDetector {
    service: ServiceKey,
    /// `service` as text, for logs and metric labels.
    service_name: String,
    config: OutlierConfig,
    schedule: RecoverySchedule,
    min_requests: u64,
    bucket_nanos: u128,
    /// Bucket 0 of every window starts here.
    epoch: Instant,
    metrics: OutlierMetrics,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Outcomes of instances that are not ejected.
    stats: HashMap<InstanceKey, Stats>,
    /// Ejected instances (a recovery check may be in flight).
    ejected: BTreeMap<InstanceKey, Ejection>,
}

#[derive(Debug, Default)]
struct Stats {
    window: RequestWindow,
    /// Connection failures in a row.
    streak: u32,
}

impl OutlierDetector {
    /// A detector for `service` with unregistered metrics (see [`with_metrics`](Self::with_metrics)).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] listing every problem of `config` (see
    /// [`OutlierConfig::validate`]).
    pub fn new(service: ServiceKey, config: OutlierConfig) -> Result<Self, Error> {
        config.validate()?;
        Ok(Self {
            service_name: service.to_string(),
            service,
            schedule: RecoverySchedule {
                unit: config.recovery_unit,
                max_checks: config.max_checks,
            },
            min_requests: config.min_requests(),
            bucket_nanos: config.bucket_width().as_nanos(),
            epoch: Instant::now(),
            config,
            metrics: OutlierMetrics::default(),
            state: Mutex::default(),
        })
    }

    /// Counts ejections and recoveries in `metrics` (usually shared by every detector of the
    /// process, from [`OutlierMetrics::register`]).
    pub fn with_metrics(mut self, metrics: OutlierMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The service this detector watches.
    pub fn service(&self) -> &ServiceKey {
        &self.service
    }

    /// The (validated) configuration.
    pub fn config(&self) -> &OutlierConfig {
        &self.config
    }

    /// Records the outcome of one request (or retry attempt) to `instance`; may eject it.
    ///
    /// `available` is `n`, the number of instances of the service the caller may currently
    /// send to, ejected ones included (usually the candidates passed to
    /// [`admit`](Self::admit)); it bounds ejection to [`OutlierConfig::max_ejected`] and
    /// keeps the last instance in.
    ///
    /// For an ejected instance whose probe request was admitted
    /// ([`RecoveryCheck::Request`]), this outcome is the check: not an error (under
    /// [`OutlierConfig::errors`]) recovers it, an error schedules the next check. Outcomes of
    /// other ejected instances (requests sent before the ejection) are ignored.
    pub fn record(&self, instance: &InstanceKey, outcome: Outcome, available: usize) {
        let now = Instant::now();
        let mut state = self.lock();
        let state = &mut *state;

        if let Some(ejection) = state.ejected.get_mut(instance) {
            if self.config.check == RecoveryCheck::Request && ejection.awaiting(now) {
                let ok = !outcome.is_error(self.config.errors);
                self.finish_check(state, instance, ok, now);
            }
            return;
        }

        let bucket = self.bucket(now);
        // No key clone (two strings) per request once the instance is known.
        if !state.stats.contains_key(instance) {
            state.stats.insert(instance.clone(), Stats::default());
        }
        let Some(stats) = state.stats.get_mut(instance) else {
            return;
        };
        stats
            .window
            .record(bucket, outcome.is_error(self.config.errors));
        stats.streak = if outcome == Outcome::ConnectFailure {
            stats.streak.saturating_add(1)
        } else {
            0
        };
        let counts = stats.window.counts(bucket);
        let reason = if self.config.consecutive_failures > 0
            && stats.streak >= self.config.consecutive_failures
        {
            EjectionReason::Consecutive
        } else if counts.requests >= self.min_requests
            && counts.errors as f64 / counts.requests as f64 > self.config.error_rate_threshold
        {
            EjectionReason::ErrorRate
        } else {
            return;
        };

        let allowed = self.config.max_ejected(available);
        if state.ejected.len() >= allowed {
            tracing::debug!(
                service = %self.service_name,
                instance = %instance,
                reason = reason.as_str(),
                ejected = state.ejected.len(),
                available,
                allowed,
                "outlier not ejected: ejection limit reached"
            );
            return;
        }
        let streak = stats.streak;
        state.stats.remove(instance);
        state
            .ejected
            .insert(instance.clone(), Ejection::new(reason, now, &self.schedule));
        self.metrics.ejection(&self.service_name, reason);
        tracing::warn!(
            service = %self.service_name,
            instance = %instance,
            reason = reason.as_str(),
            requests = counts.requests,
            errors = counts.errors,
            consecutive_failures = streak,
            ejected = state.ejected.len(),
            available,
            "outlier ejected"
        );
    }

    /// Whether `instance` is ejected right now (a recovery check may be in flight).
    pub fn is_ejected(&self, instance: &InstanceKey) -> bool {
        self.lock().ejected.contains_key(instance)
    }

    /// The candidates the next request may go to, in their input order.
    ///
    /// - Ejected instances are dropped.
    /// - With [`RecoveryCheck::Request`], when an ejected candidate's check is due, the
    ///   result is **that instance alone**: the request this admission is for is the probe
    ///   (a balancer handed the whole list might never pick it). The probe is handed out once;
    ///   the outcome recorded next for that instance decides (see [`record`](Self::record)).
    ///   If none is recorded within [`OutlierConfig::check_timeout`] the probe is lost and
    ///   becomes due again. Due candidates are probed one per call, in input order.
    /// - When every candidate is ejected they are all returned (fail open): ejection must
    ///   never leave a service without instances, e.g. after the non-ejected ones left the
    ///   view.
    ///
    /// The result only holds instances of `candidates`; it is empty only when they are.
    pub fn admit<'a>(&self, candidates: Vec<&'a Instance>) -> Vec<&'a Instance> {
        let now = Instant::now();
        let mut state = self.lock();
        if state.ejected.is_empty() {
            return candidates;
        }
        if self.config.check == RecoveryCheck::Request {
            let due = candidates.iter().copied().find(|candidate| {
                state
                    .ejected
                    .get(&candidate.key)
                    .is_some_and(|ejection| ejection.is_due(now))
            });
            if let Some(probe) = due {
                if let Some(ejection) = state.ejected.get_mut(&probe.key) {
                    ejection.start_check(now, self.config.check_timeout);
                    tracing::debug!(
                        service = %self.service_name,
                        instance = %probe.key,
                        check = ejection.checks() + 1,
                        "outlier recovery probe admitted"
                    );
                }
                return vec![probe];
            }
        }
        let admitted: Vec<&'a Instance> = candidates
            .iter()
            .copied()
            .filter(|candidate| !state.ejected.contains_key(&candidate.key))
            .collect();
        if admitted.is_empty() {
            candidates
        } else {
            admitted
        }
    }

    /// With [`RecoveryCheck::TcpConnect`]: the ejected instances whose check is due, sorted
    /// by key. Each is handed out once; connect to it and report with
    /// [`check_result`](Self::check_result). Unreported checks become due again after
    /// [`OutlierConfig::check_timeout`]. Always empty with [`RecoveryCheck::Request`].
    ///
    /// Call it periodically (every second is plenty; a check is never due more often than
    /// [`OutlierConfig::recovery_unit`]).
    pub fn due_tcp_checks(&self) -> Vec<InstanceKey> {
        if self.config.check != RecoveryCheck::TcpConnect {
            return Vec::new();
        }
        let now = Instant::now();
        let mut state = self.lock();
        state
            .ejected
            .iter_mut()
            .filter(|(_, ejection)| ejection.is_due(now))
            .map(|(key, ejection)| {
                ejection.start_check(now, self.config.check_timeout);
                key.clone()
            })
            .collect()
    }

    /// Reports the result of a recovery check of `instance` (usually one listed by
    /// [`due_tcp_checks`](Self::due_tcp_checks)): `ok` recovers it and resets its schedule;
    /// a failure schedules the next check `recovery_unit x (checks + 1)` later, capped at
    /// `recovery_unit x max_checks`. Ignored when `instance` is not ejected (it recovered, or
    /// left the view).
    pub fn check_result(&self, instance: &InstanceKey, ok: bool) {
        let now = Instant::now();
        let mut state = self.lock();
        if state.ejected.contains_key(instance) {
            self.finish_check(&mut state, instance, ok, now);
        }
    }

    /// Forgets every instance not in `live` (it left the view): its outcomes, and its
    /// ejection if any. Call on every view change.
    pub fn retain(&self, live: &[InstanceKey]) {
        let live: HashSet<&InstanceKey> = live.iter().collect();
        let mut state = self.lock();
        state.stats.retain(|key, _| live.contains(key));
        let before = state.ejected.len();
        state.ejected.retain(|key, _| {
            let keep = live.contains(key);
            if !keep {
                tracing::info!(
                    service = %self.service_name,
                    instance = %key,
                    "ejected outlier left the view; forgotten"
                );
            }
            keep
        });
        self.metrics
            .forgotten(&self.service_name, before - state.ejected.len());
    }

    /// Every ejected instance with its state, sorted by key; for logs and tests.
    pub fn ejected(&self) -> Vec<(InstanceKey, EjectionInfo)> {
        let now = Instant::now();
        self.lock()
            .ejected
            .iter()
            .map(|(key, ejection)| (key.clone(), ejection.info(now)))
            .collect()
    }

    /// Applies a check result to an ejected instance.
    fn finish_check(&self, state: &mut State, instance: &InstanceKey, ok: bool, now: Instant) {
        if ok {
            if let Some(ejection) = state.ejected.remove(instance) {
                self.metrics.recovery(&self.service_name);
                tracing::info!(
                    service = %self.service_name,
                    instance = %instance,
                    reason = ejection.reason().as_str(),
                    failed_checks = ejection.checks(),
                    ejected_for = ?now.saturating_duration_since(ejection.since()),
                    "outlier recovered"
                );
            }
        } else if let Some(ejection) = state.ejected.get_mut(instance) {
            ejection.check_failed(now, &self.schedule);
            tracing::debug!(
                service = %self.service_name,
                instance = %instance,
                failed_checks = ejection.checks(),
                next_in = ?self.schedule.interval(ejection.checks().saturating_add(1)),
                "outlier recovery check failed"
            );
        }
    }

    /// The window bucket `now` falls in.
    fn bucket(&self, now: Instant) -> u64 {
        let elapsed = now.saturating_duration_since(self.epoch).as_nanos();
        u64::try_from(elapsed / self.bucket_nanos).unwrap_or(u64::MAX)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves counts, never broken invariants.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for OutlierDetector {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        self.metrics
            .forgotten(&self.service_name, state.ejected.len());
    }
}
