//! The `tower::retry::Policy` with the gangway rules, and the request/response hooks it needs.

use std::future::{Ready, ready};

use crate::retry::{RetryBudget, is_idempotent, may_retry};
use crate::tower::Classify;

/// Response extension: how many attempts the response took, the first included (1 = no
/// retry). Inserted by [`Retry`](super::Retry) into every response it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Attempts(pub u32);

/// Request extension: marks an `http::Request` idempotent (`Idempotent(true)`, e.g. a POST
/// with an idempotency key) or not (`Idempotent(false)`), overriding the method rule (GET,
/// HEAD, PUT, DELETE, OPTIONS, TRACE are idempotent).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Idempotent(pub bool);

/// A request [`Retry`](super::Retry) can send again.
pub trait Replay: Sized {
    /// A copy to send on the next attempt; `None` when the request cannot be replayed (it is
    /// then sent once, never retried).
    fn replay(&self) -> Option<Self>;

    /// Whether the request is idempotent, i.e. may be retried after it was (maybe) sent.
    fn idempotent(&self) -> bool;
}

impl<B: Clone> Replay for http::Request<B> {
    fn replay(&self) -> Option<Self> {
        Some(self.clone())
    }

    /// The [`Idempotent`] extension when present, else the method's RFC 9110 rule.
    fn idempotent(&self) -> bool {
        match self.extensions().get::<Idempotent>() {
            Some(Idempotent(marked)) => *marked,
            None => is_idempotent(self.method()),
        }
    }
}

impl Replay for reqwest::Request {
    /// `reqwest::Request::try_clone`: `None` for a streaming body.
    fn replay(&self) -> Option<Self> {
        self.try_clone()
    }

    /// The method's RFC 9110 rule (a `reqwest::Request` carries no extensions).
    fn idempotent(&self) -> bool {
        is_idempotent(self.method())
    }
}

/// A response that can carry the [`Attempts`] extension.
pub trait RecordAttempts {
    /// Records that the response took `attempts` attempts.
    fn record_attempts(&mut self, attempts: u32);
}

impl<B> RecordAttempts for http::Response<B> {
    fn record_attempts(&mut self, attempts: u32) {
        self.extensions_mut().insert(Attempts(attempts));
    }
}

impl RecordAttempts for reqwest::Response {
    fn record_attempts(&mut self, attempts: u32) {
        self.extensions_mut().insert(Attempts(attempts));
    }
}

/// The `tower::retry::Policy` of [`Retry`](super::Retry): one per request (tower clones it
/// into each response future), counting that request's attempts.
#[derive(Debug, Clone)]
pub struct Policy<C> {
    max_attempts: u32,
    budget: RetryBudget,
    classify: C,
    /// Attempts made so far for this request (the one in flight included).
    attempts: u32,
}

impl<C> Policy<C> {
    /// A policy allowing `max_attempts` attempts per request (0 counts as 1), retries
    /// withdrawn from `budget`, failures found by `classify`. Does not deposit: the service
    /// deposits once per request.
    pub fn new(max_attempts: u32, budget: RetryBudget, classify: C) -> Self {
        Self {
            max_attempts: max_attempts.max(1),
            budget,
            classify,
            attempts: 1,
        }
    }
}

impl<C, Req, Res, E> tower::retry::Policy<Req, Res, E> for Policy<C>
where
    C: Classify<Res, E>,
    Req: Replay,
    Res: RecordAttempts,
{
    type Future = Ready<()>;

    fn retry(&mut self, request: &mut Req, result: &mut Result<Res, E>) -> Option<Self::Future> {
        let failure = self.classify.classify(result.as_ref());
        // The order matters: the budget is only withdrawn from for a retry that happens.
        let retry = failure.is_some_and(|failure| {
            self.attempts < self.max_attempts
                && may_retry(failure, request.idempotent())
                && self.budget.withdraw()
        });
        if retry {
            tracing::debug!(attempt = self.attempts, ?failure, "retrying");
            self.attempts += 1;
            return Some(ready(()));
        }
        if let Ok(response) = result {
            response.record_attempts(self.attempts);
        }
        None
    }

    fn clone_request(&mut self, request: &Req) -> Option<Req> {
        // Cloned even for the last attempt: the policy must see its result to record
        // `Attempts` (tower only consults the policy when it holds a copy).
        request.replay()
    }
}
