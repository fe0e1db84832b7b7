//! The ejection service: outcome recording and the readiness gate.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use gangway_core::model::Instance;
use gangway_core::view::View;
use tokio::sync::watch;
use tokio::time::{Instant, Sleep};
use tower::Service;

use super::{EjectionLayer, ResponseFuture};
use crate::balance::pickable;
use crate::outlier::{OutlierDetector, RecoveryCheck};
use crate::tower::Classify;

/// How often an ejected instance's readiness is re-evaluated at most apart (1 s): catches a
/// recovery by TCP check, and every other instance of the view being ejected (fail open).
pub const RECHECK_INTERVAL: Duration = Duration::from_secs(1);

/// One instance's service, recording outcomes into the service's detector and not ready
/// while the instance is ejected; built by [`EjectionLayer`]. See the
/// [module docs](super) for the readiness rule.
///
/// `poll_ready` never fails on its own account: errors are the inner service's. Not `Clone`
/// (it owns a timer); tower's balancer does not need it to be.
pub struct Ejection<S, C> {
    inner: S,
    detector: Arc<OutlierDetector>,
    views: watch::Receiver<Arc<View>>,
    instance: Instance,
    classify: C,
    /// Armed while the gate is closed: when to look again.
    recheck: Option<Pin<Box<Sleep>>>,
}

/// Whether requests may go to the instance now.
enum Gate {
    Open,
    /// Closed; look again at this instant.
    ClosedUntil(Instant),
}

impl<S, C> Ejection<S, C> {
    /// `inner` (the service of `layer`'s instance) behind the ejection rules.
    pub fn new(inner: S, layer: EjectionLayer<C>) -> Self {
        Self {
            inner,
            detector: layer.detector,
            views: layer.views,
            instance: layer.instance,
            classify: layer.classify,
            recheck: None,
        }
    }

    /// The instance this service sends to.
    pub fn instance(&self) -> &Instance {
        &self.instance
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    fn gate(&self) -> Gate {
        if !self.detector.is_ejected(&self.instance.key) {
            return Gate::Open;
        }
        let ejected = self.detector.ejected();
        let Some(info) = ejected
            .iter()
            .find(|(key, _)| *key == self.instance.key)
            .map(|(_, info)| *info)
        else {
            // Recovered between the two calls.
            return Gate::Open;
        };
        let all_ejected = pickable(&self.views.borrow()).iter().all(|candidate| {
            ejected
                .binary_search_by(|(key, _)| key.cmp(&candidate.key))
                .is_ok()
        });
        if all_ejected {
            return Gate::Open;
        }
        let now = Instant::now();
        let probe = self.detector.config().check == RecoveryCheck::Request;
        if probe && !info.check_in_flight && info.next_check_at <= now {
            return Gate::Open;
        }
        let recheck = now + RECHECK_INTERVAL;
        if probe && !info.check_in_flight && info.next_check_at < recheck {
            Gate::ClosedUntil(info.next_check_at)
        } else {
            Gate::ClosedUntil(recheck)
        }
    }
}

impl<S, C, Req> Service<Req> for Ejection<S, C>
where
    S: Service<Req>,
    C: Classify<S::Response, S::Error> + Clone,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, C>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        loop {
            match self.gate() {
                Gate::Open => {
                    self.recheck = None;
                    return self.inner.poll_ready(cx);
                }
                Gate::ClosedUntil(at) => {
                    let sleep = self
                        .recheck
                        .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
                    if sleep.deadline() != at {
                        sleep.as_mut().reset(at);
                    }
                    if sleep.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    // The deadline passed: look again.
                }
            }
        }
    }

    fn call(&mut self, request: Req) -> Self::Future {
        if self.detector.is_ejected(&self.instance.key) {
            // Hands out the recovery probe when it is due, so the detector takes this
            // request's outcome as the check; a no-op otherwise (fail open).
            let _ = self.detector.admit(vec![&self.instance]);
        }
        ResponseFuture::new(
            self.inner.call(request),
            self.detector.clone(),
            self.views.clone(),
            self.instance.key.clone(),
            self.classify.clone(),
        )
    }
}

impl<S: fmt::Debug, C> fmt::Debug for Ejection<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ejection")
            .field("inner", &self.inner)
            .field("instance", &self.instance.key)
            .field("gated", &self.recheck.is_some())
            .finish_non_exhaustive()
    }
}
