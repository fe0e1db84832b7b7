//! The draining service.

use std::task::{Context, Poll};

use http::{Request, Response};
use tower::Service;

use super::{DrainSignal, ResponseFuture};

/// Marks responses while its [`DrainSignal`] is on (see the [module docs](super)): the
/// draining header always, `Connection: close` on HTTP/1.x. Readiness, errors and bodies pass
/// through untouched.
#[derive(Debug, Clone)]
pub struct Draining<S> {
    inner: S,
    signal: DrainSignal,
}

impl<S> Draining<S> {
    /// `inner`, switched by `signal`.
    pub fn new(inner: S, signal: DrainSignal) -> Self {
        Self { inner, signal }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Draining<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let version = request.version();
        ResponseFuture::new(self.inner.call(request), self.signal.clone(), version)
    }
}
