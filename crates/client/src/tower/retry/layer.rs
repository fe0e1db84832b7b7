//! The retry layer: configuration only.

use tower::Layer;

use super::Retry;
use crate::retry::{RetryBudget, RetryConfig};
use crate::tower::DefaultClassify;

/// Applies the gangway retry rules to a service (see the [module docs](super)).
///
/// Cloning is cheap and clones share the budget: build one layer per target service (one
/// budget per service, as [`HttpClient`](crate::http::HttpClient) does) and apply it to
/// every stack that calls it.
#[derive(Debug, Clone)]
pub struct RetryLayer<C = DefaultClassify> {
    pub(super) max_attempts: u32,
    pub(super) budget: RetryBudget,
    pub(super) classify: C,
}

impl RetryLayer {
    /// A layer with `config`'s attempts and budget (see [`RetryConfig`]; `max_attempts` 0
    /// counts as 1, i.e. no retry) and the [`DefaultClassify`] classifier.
    /// `per_try_timeout` is ignored (see the module docs).
    pub fn new(config: &RetryConfig) -> Self {
        Self {
            max_attempts: config.max_attempts.max(1),
            budget: RetryBudget::new(config),
            classify: DefaultClassify,
        }
    }
}

impl<C> RetryLayer<C> {
    /// With another classifier (a [`Classify`](crate::tower::Classify) implementation or a
    /// closure `Fn(Result<&Res, &E>) -> Option<Failure> + Clone`).
    pub fn with_classify<C2>(self, classify: C2) -> RetryLayer<C2> {
        RetryLayer {
            max_attempts: self.max_attempts,
            budget: self.budget,
            classify,
        }
    }

    /// With this budget instead of a fresh one, e.g. to share one budget between layers.
    pub fn with_budget(mut self, budget: RetryBudget) -> Self {
        self.budget = budget;
        self
    }

    /// The budget, shared by every service this layer wraps.
    pub fn budget(&self) -> &RetryBudget {
        &self.budget
    }
}

impl<S, C: Clone> Layer<S> for RetryLayer<C> {
    type Service = Retry<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        Retry::new(inner, self.clone())
    }
}
