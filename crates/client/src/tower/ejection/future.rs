//! The ejection response future: records the outcome when the inner future completes.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use gangway_core::model::InstanceKey;
use gangway_core::view::View;
use tokio::sync::watch;

use crate::balance::pickable;
use crate::outlier::OutlierDetector;
use crate::tower::{Classify, outcome_of};

/// The future of [`Ejection`](super::Ejection): the inner future, whose result is recorded
/// into the detector when it completes. Dropped before completion (cancelled), nothing is
/// recorded.
#[derive(Debug)]
pub struct ResponseFuture<F, C> {
    inner: Pin<Box<F>>,
    record: Option<Record<C>>,
}

#[derive(Debug)]
struct Record<C> {
    detector: Arc<OutlierDetector>,
    views: watch::Receiver<Arc<View>>,
    key: InstanceKey,
    classify: C,
}

// Only `inner` is pinned, behind its own box.
impl<F, C> Unpin for ResponseFuture<F, C> {}

impl<F, C> ResponseFuture<F, C> {
    pub(super) fn new(
        inner: F,
        detector: Arc<OutlierDetector>,
        views: watch::Receiver<Arc<View>>,
        key: InstanceKey,
        classify: C,
    ) -> Self {
        Self {
            inner: Box::pin(inner),
            record: Some(Record {
                detector,
                views,
                key,
                classify,
            }),
        }
    }
}

impl<F, C, Res, E> Future for ResponseFuture<F, C>
where
    F: Future<Output = Result<Res, E>>,
    C: Classify<Res, E>,
{
    type Output = Result<Res, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let result = ready!(self.inner.as_mut().poll(cx));
        if let Some(r) = self.record.take() {
            let outcome = outcome_of(r.classify.classify(result.as_ref()));
            let available = pickable(&r.views.borrow()).len();
            r.detector.record(&r.key, outcome, available);
        }
        Poll::Ready(result)
    }
}
