//! Settings of the HTTP client.

use std::time::Duration;

use gangway_core::model::{DEFAULT_GROUP, DEFAULT_NAMESPACE};

use crate::balance::{
    Balancer, PowerOfTwoChoices, Random, RoundRobin, SmoothWeighted, WarmUp, WarmUpConfig,
};
use crate::outlier::OutlierConfig;
use crate::retry::RetryConfig;

/// Which balancer picks instances.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum BalancerKind {
    /// Round robin (default).
    #[default]
    RoundRobin,
    /// nginx smooth weighted round robin.
    Weighted,
    /// Uniform random.
    Random,
    /// Power of two choices on requests in flight.
    PowerOfTwoChoices,
}

impl BalancerKind {
    /// A fresh balancer of this kind.
    pub fn build(self) -> Box<dyn Balancer> {
        match self {
            BalancerKind::RoundRobin => Box::new(RoundRobin::new()),
            BalancerKind::Weighted => Box::new(SmoothWeighted::new()),
            BalancerKind::Random => Box::new(Random::new()),
            BalancerKind::PowerOfTwoChoices => Box::new(PowerOfTwoChoices::new()),
        }
    }

    /// A fresh balancer of this kind, wrapped in [`WarmUp`] when `warm_up` is set.
    ///
    /// # Errors
    /// [`crate::Error::InvalidConfig`] for a bad `warm_up`.
    pub fn build_with(
        self,
        warm_up: Option<WarmUpConfig>,
    ) -> Result<Box<dyn Balancer>, crate::Error> {
        Ok(match warm_up {
            Some(config) => Box::new(WarmUp::new(self.build(), config)?),
            None => self.build(),
        })
    }
}

/// Default timeout of one attempt when the retry config sets none: 10 s.
pub const DEFAULT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default TCP connect timeout: 1 s.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Default idle timeout of pooled keep-alive connections: 30 s.
pub const DEFAULT_POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Default wait for a service's first instances on first use: 5 s.
pub const DEFAULT_FIRST_VIEW_WAIT: Duration = Duration::from_secs(5);
/// How long an instance that answered with the draining header is skipped (unless the
/// registry's view drops it first): 30 s.
pub const DRAINING_HOLD: Duration = Duration::from_secs(30);

/// Settings of [`HttpClient`](super::HttpClient).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct HttpConfig {
    /// Namespace of the services named in URLs. Default `public`.
    pub namespace: String,
    /// Group of the services named in URLs. Default `DEFAULT_GROUP`.
    pub group: String,
    /// Balancer. Default round robin.
    pub balancer: BalancerKind,
    /// Warm-up of instances that registered with a window ([`crate::balance::warm_up`]);
    /// `None` turns it off. Default on, with [`WarmUpConfig::default`] (linear, floor 0.1).
    pub warm_up: Option<WarmUpConfig>,
    /// Retry policy. Default: 2 attempts, budget 20 % + 10/s over 10 s.
    pub retry: RetryConfig,
    /// Outlier ejection; `None` turns it off. Default on, with [`OutlierConfig::default`].
    pub outlier: Option<OutlierConfig>,
    /// Timeout of one attempt when `retry.per_try_timeout` is unset. Default 10 s.
    pub attempt_timeout: Duration,
    /// TCP connect timeout. Default 1 s.
    pub connect_timeout: Duration,
    /// Idle keep-alive connections close after this. Default 30 s.
    pub pool_idle_timeout: Duration,
    /// On a service's first use, wait at most this long for a non-empty view. Default 5 s.
    pub first_view_wait: Duration,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            namespace: DEFAULT_NAMESPACE.to_owned(),
            group: DEFAULT_GROUP.to_owned(),
            balancer: BalancerKind::default(),
            warm_up: Some(WarmUpConfig::default()),
            retry: RetryConfig::default(),
            outlier: Some(OutlierConfig::default()),
            attempt_timeout: DEFAULT_ATTEMPT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            pool_idle_timeout: DEFAULT_POOL_IDLE_TIMEOUT,
            first_view_wait: DEFAULT_FIRST_VIEW_WAIT,
        }
    }
}

impl HttpConfig {
    /// With this balancer.
    pub fn with_balancer(mut self, balancer: BalancerKind) -> Self {
        self.balancer = balancer;
        self
    }

    /// With warm-up (`None`: off).
    pub fn with_warm_up(mut self, warm_up: Option<WarmUpConfig>) -> Self {
        self.warm_up = warm_up;
        self
    }

    /// With this retry policy.
    pub fn with_retry(mut self, retry: RetryConfig) -> Self {
        self.retry = retry;
        self
    }

    /// With outlier ejection (`None`: off).
    pub fn with_outlier(mut self, outlier: Option<OutlierConfig>) -> Self {
        self.outlier = outlier;
        self
    }

    /// With this attempt timeout.
    pub fn with_attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = timeout;
        self
    }

    /// With this pool idle timeout.
    pub fn with_pool_idle_timeout(mut self, timeout: Duration) -> Self {
        self.pool_idle_timeout = timeout;
        self
    }

    /// Timeout of one attempt.
    pub fn per_try_timeout(&self) -> Duration {
        self.retry.per_try_timeout.unwrap_or(self.attempt_timeout)
    }
}
