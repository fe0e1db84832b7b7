//! The SDK's one public error type.

use std::time::Duration;

use gangway_wire::{ErrorCode, ErrorDetail};

/// Everything a [`Client`](crate::Client) call can fail with.
///
/// Classify with [`Error::is_retryable`] or by matching the variant, never by the message text.
/// No tonic or hyper type appears here: transport failures are reported as text in
/// [`Error::Connect`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The [`ClientConfig`](crate::ClientConfig) is unusable; every problem is listed.
    #[error("invalid client config: {}", problems.join("; "))]
    InvalidConfig {
        /// One line per problem, each naming its field.
        problems: Vec<String>,
    },
    /// No session could be established with the registry before the deadline, at any of its
    /// addresses.
    #[error("cannot connect to the registry at {address}: {reason}")]
    Connect {
        /// The configured addresses, `a:1, b:2` ([`ClientConfig::address_list`]).
        ///
        /// [`ClientConfig::address_list`]: crate::ClientConfig::address_list
        address: String,
        /// The last transport or handshake failure, as text; with several addresses, the last
        /// failure of each tried: `a:1: reason; b:2: reason`.
        reason: String,
    },
    /// The registry answered the request with an error.
    #[error("rejected by the registry: {code}: {message}{}", field.as_deref().map(|f| format!(" (field {f})")).unwrap_or_default())]
    Rejected {
        /// Why, e.g. [`ErrorCode::InvalidArgument`], [`ErrorCode::Conflict`].
        code: ErrorCode,
        /// Human-readable detail.
        message: String,
        /// The request field the error is about, if the registry named one.
        field: Option<String>,
    },
    /// The registry refused the session's credentials (gRPC UNAUTHENTICATED: no, unknown or
    /// removed token) or their role (PERMISSION_DENIED). The same config cannot succeed, so the
    /// client stops: [`Client::connect`](crate::Client::connect) returns this at once instead of
    /// retrying, and a client whose reconnect is refused fails its requests with it.
    #[error("refused by the registry at {address}: {code}: {message}")]
    Unauthorized {
        /// The configured address that refused them.
        address: String,
        /// [`ErrorCode::Unauthenticated`] or [`ErrorCode::Forbidden`], as REST's.
        code: ErrorCode,
        /// The registry's reason.
        message: String,
    },
    /// No answer within the deadline. The request may still take effect on the registry.
    #[error("{operation} timed out after {after:?}")]
    Timeout {
        /// What was being waited for (`"register"`, `"subscribe"`, `"wait_for"`, ...).
        operation: &'static str,
        /// The deadline that passed.
        after: Duration,
    },
    /// The client was closed (see [`Client::close`](crate::Client::close)); no further requests
    /// are possible.
    #[error("the client is closed")]
    Closed,
}

impl Error {
    /// Whether repeating the same call later can succeed: true for [`Error::Connect`],
    /// [`Error::Timeout`] and the transient rejections ([`ErrorCode::is_retryable`]:
    /// `warming_up`, `overloaded`); false otherwise.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Connect { .. } | Error::Timeout { .. } => true,
            Error::Rejected { code, .. } => code.is_retryable(),
            Error::InvalidConfig { .. } | Error::Unauthorized { .. } | Error::Closed => false,
        }
    }

    /// The registry's error code when this is [`Error::Rejected`] or [`Error::Unauthorized`].
    pub fn code(&self) -> Option<&ErrorCode> {
        match self {
            Error::Rejected { code, .. } | Error::Unauthorized { code, .. } => Some(code),
            _ => None,
        }
    }
}

impl From<ErrorDetail> for Error {
    /// The registry's refusal of a request: [`Error::Rejected`].
    fn from(e: ErrorDetail) -> Self {
        Error::Rejected {
            code: e.code,
            message: e.message,
            field: e.field,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryable_classification() {
        let rejected = |code: ErrorCode| Error::Rejected {
            code,
            message: String::new(),
            field: None,
        };
        assert!(rejected(ErrorCode::WarmingUp).is_retryable());
        assert!(rejected(ErrorCode::Overloaded).is_retryable());
        assert!(!rejected(ErrorCode::InvalidArgument).is_retryable());
        assert!(!rejected(ErrorCode::Other("unavailable".into())).is_retryable());
        assert!(
            Error::Timeout {
                operation: "register",
                after: Duration::from_secs(1)
            }
            .is_retryable()
        );
        assert!(
            Error::Connect {
                address: "a".into(),
                reason: "b".into()
            }
            .is_retryable()
        );
        assert!(!Error::Closed.is_retryable());
        assert!(!Error::InvalidConfig { problems: vec![] }.is_retryable());
        assert_eq!(
            rejected(ErrorCode::Conflict).code(),
            Some(&ErrorCode::Conflict)
        );
    }

    #[test]
    fn rejected_display_names_the_field() {
        let e = Error::from(ErrorDetail::new(
            ErrorCode::InvalidArgument,
            "bad port",
            Some("instance.port"),
        ));
        assert_eq!(
            e.to_string(),
            "rejected by the registry: invalid_argument: bad port (field instance.port)"
        );
    }
}
