//! What one request to an instance ended with, as the detector sees it.

use super::ErrorKinds;

/// The outcome of one request (or attempt) to one instance, reported with
/// [`OutlierDetector::record`](super::OutlierDetector::record).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// An answer that is not a 5xx (a 4xx is the caller's problem, not the instance's).
    Success,
    /// The connection could not be made, or broke before any request byte was written:
    /// connection refused, connect timeout, reset before sending. Always an error; the only
    /// outcome that extends a consecutive-failure streak.
    ConnectFailure,
    /// The request was sent but no answer came: reset or timeout after sending. Always an
    /// error.
    NetworkError,
    /// An HTTP 5xx answer. An error only with [`ErrorKinds::NetworkAndServerErrors`].
    ServerError,
}

impl Outcome {
    /// `"success"`, `"connect_failure"`, `"network_error"` or `"server_error"`: the
    /// `outcome` label of [`AttemptMetrics`](crate::http::AttemptMetrics).
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::ConnectFailure => "connect_failure",
            Outcome::NetworkError => "network_error",
            Outcome::ServerError => "server_error",
        }
    }

    /// Whether this outcome counts as an error under `kinds`.
    pub fn is_error(self, kinds: ErrorKinds) -> bool {
        match self {
            Outcome::Success => false,
            Outcome::ConnectFailure | Outcome::NetworkError => true,
            Outcome::ServerError => kinds == ErrorKinds::NetworkAndServerErrors,
        }
    }
}
