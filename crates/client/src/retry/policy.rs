//! Which failures may be retried.

use std::time::Duration;

/// Retry settings.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RetryConfig {
    /// Attempts per request, first included; 1 disables retry. Default 2.
    pub max_attempts: u32,
    /// Timeout of each attempt; `None` uses the client's request timeout. Default `None`.
    pub per_try_timeout: Option<Duration>,
    /// Window over which the budget counts requests. Default 10 s.
    pub budget_window: Duration,
    /// Retries always allowed per second, whatever the ratio. Default 10.
    pub min_retries_per_second: u32,
    /// Extra attempts allowed per request over the window (ratio 0..=1000). Default 0.2.
    pub retry_ratio: f32,
}

/// Default attempts per request.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 2;
/// Default budget window.
pub const DEFAULT_BUDGET_WINDOW: Duration = Duration::from_secs(10);
/// Default retry floor per second.
pub const DEFAULT_MIN_RETRIES_PER_SECOND: u32 = 10;
/// Default retry ratio.
pub const DEFAULT_RETRY_RATIO: f32 = 0.2;

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            per_try_timeout: None,
            budget_window: DEFAULT_BUDGET_WINDOW,
            min_retries_per_second: DEFAULT_MIN_RETRIES_PER_SECOND,
            retry_ratio: DEFAULT_RETRY_RATIO,
        }
    }
}

impl RetryConfig {
    /// No retry at all (`max_attempts` 1).
    pub fn disabled() -> Self {
        Self {
            max_attempts: 1,
            ..Self::default()
        }
    }

    /// With `max_attempts` (1 = no retry).
    pub fn with_max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = max_attempts;
        self
    }

    /// With a per-try timeout.
    pub fn with_per_try_timeout(mut self, timeout: Duration) -> Self {
        self.per_try_timeout = Some(timeout);
        self
    }

    /// With a budget: `ratio` extra attempts per request over `window`, at least
    /// `min_per_second` retries/s.
    pub fn with_budget(mut self, window: Duration, min_per_second: u32, ratio: f32) -> Self {
        self.budget_window = window;
        self.min_retries_per_second = min_per_second;
        self.retry_ratio = ratio;
        self
    }

    /// Problems with the settings, all of them: `max_attempts` 1-10, window 1 s-60 s, ratio
    /// 0-1000, per-try timeout above 0.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !(1..=10).contains(&self.max_attempts) {
            out.push(format!(
                "retry.max_attempts must be 1-10, got {}",
                self.max_attempts
            ));
        }
        if !(Duration::from_secs(1)..=Duration::from_secs(60)).contains(&self.budget_window) {
            out.push(format!(
                "retry.budget_window must be 1 s-60 s, got {:?}",
                self.budget_window
            ));
        }
        if !(0.0..=1000.0).contains(&self.retry_ratio) {
            out.push(format!(
                "retry.retry_ratio must be 0-1000, got {}",
                self.retry_ratio
            ));
        }
        if self.per_try_timeout.is_some_and(|t| t.is_zero()) {
            out.push("retry.per_try_timeout must be above 0".to_owned());
        }
        out
    }
}

/// How an attempt failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Connection refused, reset before any request byte was written, connect timeout: the
    /// request never reached the application.
    Connect,
    /// Timeout or reset after the request was (partly) sent: the application may have acted.
    AfterSend,
    /// The instance answered with this HTTP status (only 5xx are failures).
    Status(u16),
}

impl Failure {
    /// A connection-level failure (counts for consecutive-failure ejection).
    pub fn is_connect(self) -> bool {
        matches!(self, Failure::Connect)
    }
}

/// RFC 9110 §9.2.2 idempotent methods: GET, HEAD, PUT, DELETE, OPTIONS, TRACE.
pub fn is_idempotent(method: &http::Method) -> bool {
    matches!(
        *method,
        http::Method::GET
            | http::Method::HEAD
            | http::Method::PUT
            | http::Method::DELETE
            | http::Method::OPTIONS
            | http::Method::TRACE
    )
}

/// Whether a failed attempt may be retried (the budget and attempt count aside).
pub fn may_retry(failure: Failure, idempotent: bool) -> bool {
    match failure {
        Failure::Connect => true,
        Failure::AfterSend => idempotent,
        Failure::Status(502..=504) => idempotent,
        Failure::Status(_) => false,
    }
}
