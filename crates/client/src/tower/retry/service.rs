//! The retry service.

use std::task::{Context, Poll};

use tower::Service;

use super::{Policy, RecordAttempts, Replay, ResponseFuture, RetryLayer};
use crate::retry::RetryBudget;
use crate::tower::Classify;

/// A service that retries failed attempts by the gangway rules; built by [`RetryLayer`].
///
/// Every call deposits one request into the budget; every retry withdraws one. Readiness is
/// the inner service's; errors are the inner service's, unchanged.
#[derive(Debug, Clone)]
pub struct Retry<S, C> {
    inner: tower::retry::Retry<Policy<C>, S>,
    budget: RetryBudget,
}

impl<S, C> Retry<S, C> {
    /// `inner` retried by `layer`'s rules.
    pub fn new(inner: S, layer: RetryLayer<C>) -> Self {
        let policy = Policy::new(layer.max_attempts, layer.budget.clone(), layer.classify);
        Self {
            inner: tower::retry::Retry::new(policy, inner),
            budget: layer.budget,
        }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        self.inner.get_ref()
    }
}

impl<S, C, Req> Service<Req> for Retry<S, C>
where
    S: Service<Req> + Clone,
    S::Response: RecordAttempts,
    Req: Replay,
    C: Classify<S::Response, S::Error> + Clone,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ResponseFuture<S, C, Req>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        self.budget.deposit();
        self.inner.call(request)
    }
}
