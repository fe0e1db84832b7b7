//! The retry response future.

use super::Policy;

/// The future of [`Retry`](super::Retry): tower's retry future driven by the gangway
/// [`Policy`]. Resolves to the last attempt's result; responses carry an
/// [`Attempts`](super::Attempts) extension. Dropping it cancels the attempt in flight.
pub type ResponseFuture<S, C, Req> = tower::retry::future::ResponseFuture<Policy<C>, S, Req>;
