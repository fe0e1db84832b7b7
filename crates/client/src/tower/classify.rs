//! What an attempt's result means for retry and ejection: success or a [`Failure`].

use std::error::Error as StdError;

use tower::BoxError;

use crate::outlier::Outcome;
use crate::retry::Failure;

/// Maps the result of one attempt to `None` (success) or the [`Failure`] it is.
///
/// [`RetryLayer`](super::RetryLayer) and [`EjectionLayer`](super::EjectionLayer) take one.
/// [`DefaultClassify`] covers `http` and `reqwest` responses and the common error types; any
/// `Fn(Result<&Res, &E>) -> Option<Failure> + Clone` closure is a classifier too, for other
/// response or error types:
///
/// ```
/// use gangway_client::retry::Failure;
/// use gangway_client::tower::Classify;
///
/// #[derive(Debug)]
/// enum MyError { Refused, Broken }
///
/// let classify = |result: Result<&u16, &MyError>| match result {
///     Ok(status) if *status >= 500 => Some(Failure::Status(*status)),
///     Ok(_) => None,
///     Err(MyError::Refused) => Some(Failure::Connect),
///     Err(MyError::Broken) => Some(Failure::AfterSend),
/// };
/// assert_eq!(classify.classify(Err(&MyError::Refused)), Some(Failure::Connect));
/// ```
pub trait Classify<Res, E> {
    /// `None` when the attempt succeeded (any answer that is not a 5xx, for HTTP), else how
    /// it failed. [`Failure::Connect`] must only be returned when no request byte reached the
    /// instance: it is retried even for non-idempotent requests.
    fn classify(&self, result: Result<&Res, &E>) -> Option<Failure>;
}

impl<F, Res, E> Classify<Res, E> for F
where
    F: Fn(Result<&Res, &E>) -> Option<Failure>,
{
    fn classify(&self, result: Result<&Res, &E>) -> Option<Failure> {
        self(result)
    }
}

/// The default classifier: a response with a 5xx status is [`Failure::Status`], any other
/// response a success; an error is classified by [`classify_error`] (connection-level or
/// after send).
///
/// Responses: anything implementing [`HasStatus`] (`http::Response<B>`,
/// `reqwest::Response`). Errors: anything implementing [`AsStdError`] (`BoxError`,
/// `reqwest::Error`, `hyper_util::client::legacy::Error`, `std::io::Error`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DefaultClassify;

impl<Res: HasStatus, E: AsStdError> Classify<Res, E> for DefaultClassify {
    fn classify(&self, result: Result<&Res, &E>) -> Option<Failure> {
        match result {
            Ok(response) => {
                let status = response.status_code();
                (500..=599)
                    .contains(&status)
                    .then_some(Failure::Status(status))
            }
            Err(error) => Some(classify_error(error.as_std_error())),
        }
    }
}

/// A response with an HTTP status, for [`DefaultClassify`].
pub trait HasStatus {
    /// The status code (100-999).
    fn status_code(&self) -> u16;
}

impl<B> HasStatus for http::Response<B> {
    fn status_code(&self) -> u16 {
        self.status().as_u16()
    }
}

impl HasStatus for reqwest::Response {
    fn status_code(&self) -> u16 {
        self.status().as_u16()
    }
}

/// An error [`DefaultClassify`] can inspect as a `std::error::Error` (to walk its `source()`
/// chain). Implement it for your own error type to use the default classifier with it.
pub trait AsStdError {
    /// The error as a trait object.
    fn as_std_error(&self) -> &(dyn StdError + 'static);
}

impl AsStdError for BoxError {
    fn as_std_error(&self) -> &(dyn StdError + 'static) {
        &**self
    }
}

impl AsStdError for reqwest::Error {
    fn as_std_error(&self) -> &(dyn StdError + 'static) {
        self
    }
}

impl AsStdError for hyper_util::client::legacy::Error {
    fn as_std_error(&self) -> &(dyn StdError + 'static) {
        self
    }
}

impl AsStdError for std::io::Error {
    fn as_std_error(&self) -> &(dyn StdError + 'static) {
        self
    }
}

/// Classifies an error by walking it and its `source()` chain, never by message text.
///
/// [`Failure::Connect`] (the request never reached the application) when any error of the
/// chain is
/// - a `reqwest::Error` or `hyper_util::client::legacy::Error` whose `is_connect()` holds
///   (connection refused, connect timeout, DNS or TLS handshake failure);
/// - a `std::io::Error` of kind `ConnectionRefused` or `AddrNotAvailable`;
/// - tower's `load_shed::error::Overloaded` (the request was shed before being sent);
///
/// else [`Failure::AfterSend`] (timeouts after connecting and resets included: the
/// application may have acted, so only idempotent requests are retried).
pub fn classify_error(error: &(dyn StdError + 'static)) -> Failure {
    let mut next = Some(error);
    while let Some(e) = next {
        if is_connect(e) {
            return Failure::Connect;
        }
        next = e.source();
    }
    Failure::AfterSend
}

fn is_connect(e: &(dyn StdError + 'static)) -> bool {
    if let Some(e) = e.downcast_ref::<reqwest::Error>() {
        e.is_connect()
    } else if let Some(e) = e.downcast_ref::<hyper_util::client::legacy::Error>() {
        e.is_connect()
    } else if let Some(e) = e.downcast_ref::<std::io::Error>() {
        matches!(
            e.kind(),
            std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::AddrNotAvailable
        )
    } else {
        e.is::<tower::load_shed::error::Overloaded>()
    }
}

/// What the outlier detector records for a classified attempt: `None` is
/// [`Outcome::Success`], [`Failure::Connect`] a connect failure, [`Failure::AfterSend`] a
/// network error, a 5xx [`Failure::Status`] a server error (any other status a success).
pub fn outcome_of(failure: Option<Failure>) -> Outcome {
    match failure {
        None => Outcome::Success,
        Some(Failure::Connect) => Outcome::ConnectFailure,
        Some(Failure::AfterSend) => Outcome::NetworkError,
        Some(Failure::Status(500..=599)) => Outcome::ServerError,
        Some(Failure::Status(_)) => Outcome::Success,
    }
}

#[cfg(test)]
mod tests;
