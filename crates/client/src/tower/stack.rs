//! The whole stack in one call: discovery, p2c, retry and ejection over per-instance services.

use std::sync::Arc;

use gangway_core::model::Instance;
use tower::balance::p2c::Balance;
use tower::buffer::Buffer;
use tower::load::{CompleteOnResponse, PendingRequestsDiscover};
use tower::timeout::TimeoutLayer;
use tower::util::BoxCloneService;
use tower::{BoxError, Layer, Service, ServiceBuilder};

use super::retry::{RecordAttempts, Replay};
use super::{AsStdError, EjectionLayer, HasStatus, RetryLayer, ViewDiscover};
use crate::outlier::{OutlierConfig, OutlierDetector, OutlierMetrics};
use crate::retry::RetryConfig;
use crate::{Error, Subscription};

/// Default capacity of the buffer in front of the balancer (requests waiting for a ready
/// instance): 1024.
pub const DEFAULT_BUFFER: usize = 1024;

/// Settings of [`balanced`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StackConfig {
    /// Attempts, budget and per-try timeout (applied as a `tower::timeout` below the retry).
    /// Default [`RetryConfig::default`]: 2 attempts, 20 % over 10 s, at least 10 retries/s.
    pub retry: RetryConfig,
    /// Ejection rules. Default [`OutlierConfig::default`].
    pub outlier: OutlierConfig,
    /// Requests that may wait for a ready instance before callers wait in `poll_ready`.
    /// Default [`DEFAULT_BUFFER`]; 0 counts as 1.
    pub buffer: usize,
    /// Where ejections and recoveries are counted; `None` (default) counts nowhere.
    pub metrics: Option<OutlierMetrics>,
}

impl Default for StackConfig {
    fn default() -> Self {
        Self {
            retry: RetryConfig::default(),
            outlier: OutlierConfig::default(),
            buffer: DEFAULT_BUFFER,
            metrics: None,
        }
    }
}

impl StackConfig {
    /// With these retry settings.
    pub fn with_retry(mut self, retry: RetryConfig) -> Self {
        self.retry = retry;
        self
    }

    /// With these ejection settings.
    pub fn with_outlier(mut self, outlier: OutlierConfig) -> Self {
        self.outlier = outlier;
        self
    }

    /// Counting ejections and recoveries in `metrics`.
    pub fn with_metrics(mut self, metrics: OutlierMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }
}

/// The service [`balanced`] returns: cheap to clone, `Send`; errors are the per-instance
/// service's (boxed), a `tower::timeout::error::Elapsed` after a per-try timeout, or
/// `tower::buffer::error::Closed` when the balancer's task is gone (the runtime shut down).
pub type Balanced<Req, Res> = BoxCloneService<Req, Res, BoxError>;

/// The stack of the [module docs](super) in one call, for `subscription`'s service:
/// `Retry` (→ per-try `Timeout`) → `Buffer` → p2c `Balance` → [`ViewDiscover`] of
/// `PendingRequests<Ejection<make(instance)>>`, with one [`OutlierDetector`] and one
/// [`RetryBudget`](crate::retry::RetryBudget) for the service.
///
/// `make` builds the service of one instance (a connection pool to `instance.key.addr()`);
/// results are classified by [`DefaultClassify`](super::DefaultClassify). The subscription is
/// kept alive as long as the returned service (any clone) lives.
///
/// Must be called inside a tokio runtime (the buffer spawns the balancer's task). While the
/// view has no instance, callers wait in `poll_ready` (or in the buffer): add a timeout on top
/// if they must not.
///
/// # Errors
/// [`Error::InvalidConfig`] listing every problem of `config.retry` ([`RetryConfig::problems`])
/// and `config.outlier` ([`OutlierConfig::validate`]) together.
pub fn balanced<S, Req, F>(
    subscription: &Subscription,
    config: &StackConfig,
    mut make: F,
) -> Result<Balanced<Req, S::Response>, Error>
where
    F: FnMut(&Instance) -> S + Send + 'static,
    S: Service<Req> + Send + 'static,
    S::Future: Send + 'static,
    S::Response: HasStatus + RecordAttempts + Send + 'static,
    S::Error: AsStdError + Into<BoxError> + Send + 'static,
    Req: Replay + Send + 'static,
{
    let mut problems = config.retry.problems();
    if let Err(Error::InvalidConfig { problems: outlier }) = config.outlier.validate() {
        problems.extend(outlier);
    }
    if !problems.is_empty() {
        return Err(Error::InvalidConfig { problems });
    }
    let mut detector =
        OutlierDetector::new(subscription.service().clone(), config.outlier.clone())?;
    if let Some(metrics) = &config.metrics {
        detector = detector.with_metrics(metrics.clone());
    }
    let detector = Arc::new(detector);
    let views = subscription.receiver();
    let discover = ViewDiscover::new(subscription, {
        let detector = detector.clone();
        move |instance: &Instance| {
            EjectionLayer::new(detector.clone(), views.clone(), instance).layer(make(instance))
        }
    })
    .with_detector(detector);
    let balance = Balance::new(PendingRequestsDiscover::new(
        discover,
        CompleteOnResponse::default(),
    ));
    let stack = ServiceBuilder::new()
        .layer(RetryLayer::new(&config.retry))
        .option_layer(config.retry.per_try_timeout.map(TimeoutLayer::new))
        .service(Buffer::new(balance, config.buffer.max(1)));
    Ok(BoxCloneService::new(stack))
}
