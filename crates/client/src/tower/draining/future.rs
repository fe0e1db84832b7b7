//! The draining response future: marks the response when it is ready, if draining by then.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::header::{CONNECTION, HeaderValue};
use http::{Response, Version};

use super::DrainSignal;
use crate::http::DRAINING_HEADER;

/// The future of [`Draining`](super::Draining): the inner future, whose response is marked
/// if the drain started before it completed (so a request that arrived before the drain and
/// is answered after it carries the mark too).
#[derive(Debug)]
pub struct ResponseFuture<F> {
    inner: Pin<Box<F>>,
    signal: DrainSignal,
    version: Version,
}

// Only `inner` is pinned, behind its own box.
impl<F> Unpin for ResponseFuture<F> {}

impl<F> ResponseFuture<F> {
    pub(super) fn new(inner: F, signal: DrainSignal, version: Version) -> Self {
        Self {
            inner: Box::pin(inner),
            signal,
            version,
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<B>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut result = ready!(self.inner.as_mut().poll(cx));
        match &mut result {
            Ok(response) if self.signal.is_draining() => mark(response, self.version),
            _ => {}
        }
        Poll::Ready(result)
    }
}

/// The draining header; `Connection: close` unless HTTP/2 or later (where it is forbidden and
/// GOAWAY does the job).
fn mark<B>(response: &mut Response<B>, version: Version) {
    let headers = response.headers_mut();
    headers.insert(DRAINING_HEADER, HeaderValue::from_static("1"));
    if matches!(
        version,
        Version::HTTP_09 | Version::HTTP_10 | Version::HTTP_11
    ) {
        headers.insert(CONNECTION, HeaderValue::from_static("close"));
    }
}
