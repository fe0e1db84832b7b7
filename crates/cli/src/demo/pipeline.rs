//! Flags for the consumer pipeline (balancer, retry, outlier ejection, pool), shared by the
//! demo client and the lab. docs/client.md explains each knob and its default.

use std::time::Duration;

use clap::{Args, ValueEnum};
use gangway_client::http::{BalancerKind, HttpConfig};
use gangway_client::outlier::{ErrorKinds, OutlierConfig, RecoveryCheck};
use gangway_client::retry::RetryConfig;
use serde::Serialize;

use crate::args::parse_duration;

/// Balancer choice.
#[derive(Debug, Clone, Copy, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BalancerArg {
    /// Round robin over the view.
    RoundRobin,
    /// Smooth weighted round robin (nginx).
    Weighted,
    /// Uniformly at random.
    Random,
    /// Power of two choices on requests in flight.
    P2c,
}

/// What counts as an error for ejection.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ErrorsArg {
    /// Connection and network errors only.
    Network,
    /// Network errors and HTTP 5xx.
    NetworkAnd5xx,
}

/// How an ejected instance is checked.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum CheckArg {
    /// Let one real request through.
    Request,
    /// A TCP connect.
    Tcp,
}

/// Pipeline flags.
#[derive(Debug, Args, Clone)]
pub struct PipelineArgs {
    /// Balancer.
    #[arg(long, value_enum, default_value = "round-robin")]
    pub balancer: BalancerArg,
    /// Turn retry off (one attempt per request).
    #[arg(long)]
    pub no_retry: bool,
    /// Attempts per request, the first included (each on another instance while one is left).
    #[arg(long, default_value_t = 2)]
    pub max_attempts: u32,
    /// Timeout of each attempt (default: the request timeout).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub per_try_timeout: Option<Duration>,
    /// Retry budget: extra attempts per request over the budget window (0..1000).
    #[arg(long, default_value_t = 0.2)]
    pub retry_ratio: f32,
    /// Retry budget floor, retries per second.
    #[arg(long, default_value_t = 10)]
    pub retry_min_per_second: u32,
    /// Turn outlier ejection off.
    #[arg(long)]
    pub no_ejection: bool,
    /// What counts as an error for ejection.
    #[arg(long, value_enum, default_value = "network")]
    pub eject_errors: ErrorsArg,
    /// Error-rate window.
    #[arg(long, default_value = "10s", value_parser = parse_duration, value_name = "DURATION")]
    pub eject_window: Duration,
    /// Minimum request rate (req/s) in the window before the error rate counts.
    #[arg(long, default_value_t = 1.0)]
    pub eject_min_rate: f64,
    /// Error rate (0..1) above which an instance is ejected.
    #[arg(long, default_value_t = 0.5)]
    pub eject_threshold: f64,
    /// Consecutive connection failures that eject at once (0: off).
    #[arg(long, default_value_t = 5)]
    pub eject_consecutive: u32,
    /// At most floor(n x ratio) instances ejected at once.
    #[arg(long, default_value_t = 0.2)]
    pub eject_max_ratio: f64,
    /// Recovery unit: the k-th check comes unit x k after the previous one.
    #[arg(long, default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    pub recovery_unit: Duration,
    /// Recovery interval cap, in units.
    #[arg(long, default_value_t = 20)]
    pub recovery_max_checks: u32,
    /// How an ejected instance is checked.
    #[arg(long, value_enum, default_value = "request")]
    pub recovery_check: CheckArg,
    /// Idle keep-alive connections close after this.
    #[arg(long, default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    pub pool_idle_timeout: Duration,
}

impl PipelineArgs {
    /// The HTTP client settings these flags describe, with `timeout` per attempt.
    pub fn http_config(&self, timeout: Duration) -> HttpConfig {
        let balancer = match self.balancer {
            BalancerArg::RoundRobin => BalancerKind::RoundRobin,
            BalancerArg::Weighted => BalancerKind::Weighted,
            BalancerArg::Random => BalancerKind::Random,
            BalancerArg::P2c => BalancerKind::PowerOfTwoChoices,
        };
        let mut retry = if self.no_retry {
            RetryConfig::disabled()
        } else {
            RetryConfig::default()
                .with_max_attempts(self.max_attempts)
                .with_budget(
                    RetryConfig::default().budget_window,
                    self.retry_min_per_second,
                    self.retry_ratio,
                )
        };
        if let Some(t) = self.per_try_timeout {
            retry = retry.with_per_try_timeout(t);
        }
        let outlier = (!self.no_ejection).then(|| {
            let mut o = OutlierConfig::new()
                .with_errors(match self.eject_errors {
                    ErrorsArg::Network => ErrorKinds::NetworkOnly,
                    ErrorsArg::NetworkAnd5xx => ErrorKinds::NetworkAndServerErrors,
                })
                .with_check(match self.recovery_check {
                    CheckArg::Request => RecoveryCheck::Request,
                    CheckArg::Tcp => RecoveryCheck::TcpConnect,
                })
                .with_max_ejection_ratio(self.eject_max_ratio);
            o.window = self.eject_window;
            o.min_request_rate = self.eject_min_rate;
            o.error_rate_threshold = self.eject_threshold;
            o.consecutive_failures = self.eject_consecutive;
            o.recovery_unit = self.recovery_unit;
            o.max_checks = self.recovery_max_checks;
            o
        });
        HttpConfig::default()
            .with_balancer(balancer)
            .with_retry(retry)
            .with_outlier(outlier)
            .with_attempt_timeout(timeout)
            .with_pool_idle_timeout(self.pool_idle_timeout)
    }
}
