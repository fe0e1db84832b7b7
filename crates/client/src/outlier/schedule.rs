//! Ejection state and the linear recovery schedule.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

/// Why an instance was ejected; the `reason` label of the ejection counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EjectionReason {
    /// Its error rate over the window exceeded the threshold.
    ErrorRate,
    /// It failed to connect too many times in a row.
    Consecutive,
}

impl EjectionReason {
    /// `"error_rate"` or `"consecutive"`, as in logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            EjectionReason::ErrorRate => "error_rate",
            EjectionReason::Consecutive => "consecutive",
        }
    }
}

impl fmt::Display for EjectionReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A snapshot of one ejection, from [`OutlierDetector::ejected`](super::OutlierDetector::ejected).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EjectionInfo {
    /// What triggered the ejection.
    pub reason: EjectionReason,
    /// When it was ejected (tokio clock).
    pub since: Instant,
    /// Recovery checks that failed so far; the next check is number `checks + 1`.
    pub checks: u32,
    /// When the next check is due: `recovery_unit x (checks + 1)` (capped at
    /// `recovery_unit x max_checks`) after the ejection or the last failed check. While a
    /// check is awaited this is the time it became due.
    pub next_check_at: Instant,
    /// Whether a check was handed out (a probe request admitted, a TCP check listed) and its
    /// result is awaited.
    pub check_in_flight: bool,
}

/// The interval rule: the k-th check comes `unit x min(k, max_checks)` after the previous one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecoverySchedule {
    /// Interval step (config `recovery_unit`).
    pub unit: Duration,
    /// Interval cap in units (config `max_checks`).
    pub max_checks: u32,
}

/// The state of one ejected instance.
#[derive(Debug, Clone)]
pub(crate) struct Ejection {
    reason: EjectionReason,
    since: Instant,
    checks: u32,
    next_check_at: Instant,
    /// Deadline of the check handed out, if one is awaited.
    in_flight_until: Option<Instant>,
}

impl RecoverySchedule {
    /// Time from the previous check (or the ejection, for `k = 1`) to the k-th check:
    /// `unit x min(k, max_checks)`; `k = 0` is treated as 1. Saturates instead of overflowing.
    pub fn interval(&self, k: u32) -> Duration {
        self.unit.saturating_mul(k.clamp(1, self.max_checks.max(1)))
    }
}

impl Ejection {
    /// An instance ejected at `now`; its first check is due one unit later.
    pub(crate) fn new(reason: EjectionReason, now: Instant, schedule: &RecoverySchedule) -> Self {
        Self {
            reason,
            since: now,
            checks: 0,
            next_check_at: later(now, schedule.interval(1)),
            in_flight_until: None,
        }
    }

    /// The public snapshot at `now`.
    pub(crate) fn info(&self, now: Instant) -> EjectionInfo {
        EjectionInfo {
            reason: self.reason,
            since: self.since,
            checks: self.checks,
            next_check_at: self.next_check_at,
            check_in_flight: self.awaiting(now),
        }
    }

    /// Whether a handed-out check is still awaited at `now` (not yet past its deadline).
    pub(crate) fn awaiting(&self, now: Instant) -> bool {
        self.in_flight_until.is_some_and(|deadline| now < deadline)
    }

    /// Whether a check should be handed out at `now`: due, and none awaited (a lost one,
    /// past its deadline, no longer counts).
    pub(crate) fn is_due(&self, now: Instant) -> bool {
        now >= self.next_check_at && !self.awaiting(now)
    }

    /// Records that a check was handed out at `now`; it is lost after `timeout`.
    pub(crate) fn start_check(&mut self, now: Instant, timeout: Duration) {
        self.in_flight_until = Some(later(now, timeout));
    }

    /// Records a failed check at `now`: the next one comes `interval(checks + 1)` later.
    pub(crate) fn check_failed(&mut self, now: Instant, schedule: &RecoverySchedule) {
        self.checks = self.checks.saturating_add(1);
        self.next_check_at = later(now, schedule.interval(self.checks.saturating_add(1)));
        self.in_flight_until = None;
    }

    /// The reason of the ejection.
    pub(crate) fn reason(&self) -> EjectionReason {
        self.reason
    }

    /// Failed checks so far.
    pub(crate) fn checks(&self) -> u32 {
        self.checks
    }

    /// When the instance was ejected.
    pub(crate) fn since(&self) -> Instant {
        self.since
    }
}

/// `now + d`, or about 30 years from now when that would overflow.
fn later(now: Instant, d: Duration) -> Instant {
    now.checked_add(d)
        .or_else(|| now.checked_add(Duration::from_secs(30 * 365 * 86_400)))
        .unwrap_or(now)
}
