//! Typed outlier-ejection configuration and its defaults (issue 3 §3).

use std::time::Duration;

use crate::Error;

/// Default sliding window of the error-rate trigger: 10 s.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(10);
/// Default minimum request rate before the error rate is evaluated: 1 request/s.
pub const DEFAULT_MIN_REQUEST_RATE: f64 = 1.0;
/// Default error-rate threshold: 0.5 (an instance is ejected above 50 % errors).
pub const DEFAULT_ERROR_RATE_THRESHOLD: f64 = 0.5;
/// Default consecutive connection failures that eject at once: 5.
pub const DEFAULT_CONSECUTIVE_FAILURES: u32 = 5;
/// Default maximum share of a service's instances ejected at once: 0.2.
pub const DEFAULT_MAX_EJECTION_RATIO: f64 = 0.2;
/// Default recovery unit: 30 s (the k-th check comes `k` units after the previous one).
pub const DEFAULT_RECOVERY_UNIT: Duration = Duration::from_secs(30);
/// Default cap of the recovery interval in units: 20 (so at most 10 min between checks).
pub const DEFAULT_MAX_CHECKS: u32 = 20;
/// Default time after which an unreported recovery check counts as lost: 30 s.
pub const DEFAULT_CHECK_TIMEOUT: Duration = Duration::from_secs(30);

/// Number of buckets the sliding window is cut into (1 s each with the default window).
pub(crate) const WINDOW_BUCKETS: u32 = 10;

/// Which [`Outcome`](super::Outcome)s count as errors for the error-rate trigger and for a
/// recovery check made with a real request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ErrorKinds {
    /// Only network errors: [`ConnectFailure`](super::Outcome::ConnectFailure) and
    /// [`NetworkError`](super::Outcome::NetworkError). The default: such an error says
    /// something about the instance (or the path to it) and nothing about the request,
    /// whereas a 5xx may come from the request itself (an input that hits a bug on every
    /// instance) or from a dependency shared by all instances, where ejecting only moves load
    /// onto the others. Choose [`NetworkAndServerErrors`](Self::NetworkAndServerErrors) when
    /// the service answers 5xx only when the instance itself is broken.
    #[default]
    NetworkOnly,
    /// Network errors and HTTP 5xx answers ([`ServerError`](super::Outcome::ServerError)).
    NetworkAndServerErrors,
}

/// How an ejected instance is checked for recovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum RecoveryCheck {
    /// One real request is let through when the check is due
    /// ([`OutlierDetector::admit`](super::OutlierDetector::admit)); its outcome, recorded with
    /// [`OutlierDetector::record`](super::OutlierDetector::record), decides. The default: it
    /// proves the application answers, not only that the port is open, and costs no extra
    /// connection logic in the caller.
    #[default]
    Request,
    /// The caller opens a TCP connection to each instance listed by
    /// [`OutlierDetector::due_tcp_checks`](super::OutlierDetector::due_tcp_checks) and reports
    /// with [`OutlierDetector::check_result`](super::OutlierDetector::check_result); no
    /// request is risked on a suspect instance.
    TcpConnect,
}

/// Outlier-ejection policy of one consumer (DESIGN §5, issue 3 §3).
///
/// Build with [`OutlierConfig::default`] (or [`new`](Self::new)) and adjust the public fields;
/// [`OutlierDetector::new`](super::OutlierDetector::new) validates it and reports every
/// problem at once. Nothing is read from the environment.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct OutlierConfig {
    /// Sliding window of the error-rate trigger. It is cut into 10 buckets of `window / 10`
    /// (1 s by default), so an outcome stops counting between `window - window / 10` and
    /// `window` after it was recorded. Default [`DEFAULT_WINDOW`] (10 s): long enough to
    /// hold a meaningful number of requests, short enough to eject within seconds. Must be
    /// > 0.
    pub window: Duration,
    /// Minimum request rate, in requests per second, of an instance over the window before
    /// its error rate is evaluated: the window must hold at least
    /// `ceil(min_request_rate x window)` outcomes (at least 1). Default
    /// [`DEFAULT_MIN_REQUEST_RATE`] (1 req/s, so 10 outcomes in the default window): two
    /// failures out of three requests are noise, not evidence. The window counts as full
    /// from the start, so a fresh instance is judged only after that many requests. Must be
    /// finite and >= 0.
    pub min_request_rate: f64,
    /// Error ratio (0..=1) above which an instance is ejected; a ratio equal to the threshold
    /// does not eject. Default [`DEFAULT_ERROR_RATE_THRESHOLD`] (0.5): an instance failing
    /// more often than it succeeds does more harm than good. 1.0 disables the trigger. Must
    /// be within 0..=1.
    pub error_rate_threshold: f64,
    /// What counts as an error for the error-rate trigger and for a request check. Default
    /// [`ErrorKinds::NetworkOnly`] (see there for why).
    pub errors: ErrorKinds,
    /// Connection-level failures ([`ConnectFailure`](super::Outcome::ConnectFailure)) in a
    /// row that eject an instance at once, whatever the window says; any other outcome
    /// (the instance accepted a connection) resets the streak. Default
    /// [`DEFAULT_CONSECUTIVE_FAILURES`] (5): a crashed instance is ejected within a few
    /// requests instead of a window. 0 disables the trigger.
    pub consecutive_failures: u32,
    /// Largest share of a service's `n` instances ejected at once: at most
    /// `floor(n x max_ejection_ratio)`, but at least one when the ratio is above 0 (as Envoy),
    /// and never the last instance that is not ejected. Checked at ejection time; an instance over the limit
    /// stays in until another one recovers. Default [`DEFAULT_MAX_EJECTION_RATIO`] (0.2):
    /// when many instances look bad at once the cause is usually shared (the network, a
    /// dependency, the consumer itself), and ejecting them would overload the rest. Must be
    /// within 0..=1.
    pub max_ejection_ratio: f64,
    /// Recovery unit: the k-th check of an ejected instance comes `recovery_unit x k` after
    /// the previous one (the first one `recovery_unit` after the ejection). Default
    /// [`DEFAULT_RECOVERY_UNIT`] (30 s): a restarting process is usually back within that.
    /// Must be > 0.
    pub recovery_unit: Duration,
    /// Cap of the check interval in units: after `max_checks` failed checks the interval
    /// stays at `recovery_unit x max_checks`. Default [`DEFAULT_MAX_CHECKS`] (20, so 10 min):
    /// a long-dead instance costs one check every 10 min. Must be >= 1.
    pub max_checks: u32,
    /// How a due check is made. Default [`RecoveryCheck::Request`] (see there for why).
    pub check: RecoveryCheck,
    /// How long a check may stay unreported (a probe request whose outcome is never
    /// recorded because it was cancelled, a TCP check whose result never comes) before it
    /// counts as lost: the check becomes due again, neither recovering the instance nor
    /// counting as a failure. Default [`DEFAULT_CHECK_TIMEOUT`] (30 s); keep it above the
    /// request (or connect) timeout, or a slow probe may be duplicated. Must be > 0.
    pub check_timeout: Duration,
}

impl Default for OutlierConfig {
    fn default() -> Self {
        Self {
            window: DEFAULT_WINDOW,
            min_request_rate: DEFAULT_MIN_REQUEST_RATE,
            error_rate_threshold: DEFAULT_ERROR_RATE_THRESHOLD,
            errors: ErrorKinds::default(),
            consecutive_failures: DEFAULT_CONSECUTIVE_FAILURES,
            max_ejection_ratio: DEFAULT_MAX_EJECTION_RATIO,
            recovery_unit: DEFAULT_RECOVERY_UNIT,
            max_checks: DEFAULT_MAX_CHECKS,
            check: RecoveryCheck::default(),
            check_timeout: DEFAULT_CHECK_TIMEOUT,
        }
    }
}

impl OutlierConfig {
    /// Every field at its default; same as [`OutlierConfig::default`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets [`errors`](Self::errors).
    pub fn with_errors(mut self, errors: ErrorKinds) -> Self {
        self.errors = errors;
        self
    }

    /// Sets [`check`](Self::check).
    pub fn with_check(mut self, check: RecoveryCheck) -> Self {
        self.check = check;
        self
    }

    /// Sets [`max_ejection_ratio`](Self::max_ejection_ratio).
    pub fn with_max_ejection_ratio(mut self, ratio: f64) -> Self {
        self.max_ejection_ratio = ratio;
        self
    }

    /// Checks every field; all problems are reported together.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] with one line per problem, each starting with
    /// `outlier.<field>`.
    pub fn validate(&self) -> Result<(), Error> {
        let mut problems = Vec::new();
        for (name, value) in [
            ("window", self.window),
            ("recovery_unit", self.recovery_unit),
            ("check_timeout", self.check_timeout),
        ] {
            if value.is_zero() {
                problems.push(format!("outlier.{name}: must be > 0"));
            }
        }
        if !(self.min_request_rate.is_finite() && self.min_request_rate >= 0.0) {
            problems.push(format!(
                "outlier.min_request_rate: {} is not a finite rate >= 0",
                self.min_request_rate
            ));
        }
        for (name, value) in [
            ("error_rate_threshold", self.error_rate_threshold),
            ("max_ejection_ratio", self.max_ejection_ratio),
        ] {
            if !(0.0..=1.0).contains(&value) {
                problems.push(format!("outlier.{name}: {value} is not within 0..=1"));
            }
        }
        if self.max_checks == 0 {
            problems.push("outlier.max_checks: must be >= 1".to_owned());
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error::InvalidConfig { problems })
        }
    }

    /// Outcomes the window must hold before its error rate is evaluated:
    /// `ceil(min_request_rate x window)`, at least 1.
    pub fn min_requests(&self) -> u64 {
        // The epsilon keeps 0.1 x 30 s (3.0000000000000004 in f64) at 3 requests.
        let needed = (self.min_request_rate * self.window.as_secs_f64() - 1e-9).ceil();
        if needed >= u64::MAX as f64 {
            u64::MAX
        } else {
            (needed as u64).max(1)
        }
    }

    /// How many of `n` instances may be ejected at once: `floor(n x max_ejection_ratio)` but
    /// at least one when the ratio is above 0 (Envoy's `max_ejection_percent`: "will eject at
    /// least one host regardless of the value"), so a crashed instance of a small service is
    /// ejected; at most `n - 1` so one instance always stays (0 when `n` is 0 or 1). A ratio
    /// of 0 ejects nothing.
    pub fn max_ejected(&self, n: usize) -> usize {
        // The epsilon keeps 100 x 0.29 (28.999999999999996 in f64) at 29.
        let allowed = (n as f64 * self.max_ejection_ratio + 1e-9).floor() as usize;
        let allowed = if self.max_ejection_ratio > 0.0 {
            allowed.max(1)
        } else {
            0
        };
        allowed.min(n.saturating_sub(1))
    }

    /// Bucket width of the sliding window: `window / 10`, at least 1 ns.
    pub(crate) fn bucket_width(&self) -> Duration {
        (self.window / WINDOW_BUCKETS).max(Duration::from_nanos(1))
    }
}
