//! The one error type that reaches the wire: REST (status + JSON body) and gRPC (status code).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use gangway_core::ValidationError;
use gangway_store::StoreError;
use gangway_wire::{ErrorBody, ErrorCode, ErrorDetail};

use crate::auth::AuthError;
use crate::engine::RegistryError;

/// A request the registry refuses or could not carry out. Nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// Bad input (HTTP 400, gRPC INVALID_ARGUMENT), naming the field.
    #[error("{0}")]
    Invalid(ValidationError),
    /// Unknown service or instance (HTTP 404, gRPC NOT_FOUND).
    #[error("{message}")]
    NotFound {
        /// Readable message naming what is missing.
        message: String,
    },
    /// The request contradicts the registry's state (HTTP 409, gRPC FAILED_PRECONDITION).
    #[error("{message}")]
    Conflict {
        /// Readable message.
        message: String,
    },
    /// The path exists but not with this method (HTTP 405).
    #[error("method not allowed on this path; see /v1/openapi.json")]
    MethodNotAllowed,
    /// The request body is larger than the server accepts (HTTP 413).
    #[error("the request body must be at most {limit_bytes} bytes")]
    PayloadTooLarge {
        /// The limit, in bytes.
        limit_bytes: usize,
    },
    /// The request body did not arrive in time (HTTP 408; the connection is closed): it
    /// stalled for the header timeout, or was not complete within the body timeout.
    #[error("{message}")]
    RequestTimeout {
        /// Which bound was passed.
        message: String,
    },
    /// The registry is starting and holds back snapshots (HTTP 503, gRPC UNAVAILABLE).
    #[error("the registry is warming up; retry shortly")]
    WarmingUp,
    /// The durable store failed (HTTP 500, gRPC INTERNAL).
    #[error("{0}")]
    Store(String),
    /// The request line (method, path and query) is longer than the server reads (HTTP 414).
    #[error("the request line is longer than {limit} bytes; send long inputs in a body")]
    UriTooLong {
        /// The limit, bytes.
        limit: usize,
    },
    /// The request's header section is too large (HTTP 431).
    #[error("{message}")]
    HeadersTooLarge {
        /// Which limit was passed.
        message: String,
    },
    /// No credentials, or credentials that are not valid (HTTP 401 with `WWW-Authenticate`,
    /// gRPC UNAUTHENTICATED).
    #[error("{message}")]
    Unauthenticated {
        /// Why.
        message: String,
    },
    /// Valid credentials without the role the route's rule needs (HTTP 403, gRPC
    /// PERMISSION_DENIED); the body names the rule.
    #[error("{message}")]
    Forbidden {
        /// The rule (docs/security.md).
        rule: &'static str,
        /// What it needed.
        message: String,
    },
    /// A mutation that a web page could send across sites (an HTML form, `text/plain`) without
    /// credentials (HTTP 415).
    #[error("{message}")]
    UnsupportedMediaType {
        /// What is accepted.
        message: String,
    },
    /// A session holds the most it may of something (HTTP 429, gRPC RESOURCE_EXHAUSTED); the
    /// message names the limit.
    #[error("{message}")]
    LimitExceeded {
        /// The limit (`subscriptions-per-session`, `instances-per-session`).
        limit: &'static str,
        /// What was refused and why.
        message: String,
    },
    /// The server holds its maximum number of connections (HTTP 503, gRPC UNAVAILABLE); retry
    /// later or on another server.
    #[error("{message}")]
    Overloaded {
        /// Which limit was reached.
        message: String,
    },
}

impl ApiError {
    /// A 404.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::NotFound {
            message: message.into(),
        }
    }

    /// A 409.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::Conflict {
            message: message.into(),
        }
    }

    /// A 400 about `field`.
    pub fn invalid(field: &str, message: impl Into<String>) -> Self {
        Self::Invalid(ValidationError::new(field, message))
    }

    /// The stable code REST and the native protocol carry (docs/api.md).
    pub fn code(&self) -> ErrorCode {
        match self {
            ApiError::Invalid(_) => ErrorCode::InvalidArgument,
            ApiError::NotFound { .. } => ErrorCode::NotFound,
            ApiError::Conflict { .. } => ErrorCode::Conflict,
            ApiError::MethodNotAllowed => ErrorCode::MethodNotAllowed,
            ApiError::PayloadTooLarge { .. } => ErrorCode::PayloadTooLarge,
            ApiError::RequestTimeout { .. } => ErrorCode::RequestTimeout,
            ApiError::WarmingUp => ErrorCode::WarmingUp,
            ApiError::Store(_) => ErrorCode::Internal,
            ApiError::UriTooLong { .. } => ErrorCode::UriTooLong,
            ApiError::HeadersTooLarge { .. } => ErrorCode::HeadersTooLarge,
            ApiError::Overloaded { .. } => ErrorCode::Overloaded,
            ApiError::LimitExceeded { .. } => ErrorCode::LimitExceeded,
            ApiError::Unauthenticated { .. } => ErrorCode::Unauthenticated,
            ApiError::Forbidden { .. } => ErrorCode::Forbidden,
            ApiError::UnsupportedMediaType { .. } => ErrorCode::UnsupportedMediaType,
        }
    }

    /// The field the error is about, if any.
    pub fn field(&self) -> Option<&str> {
        match self {
            ApiError::Invalid(v) => Some(&v.field),
            _ => None,
        }
    }

    /// The message without the field prefix.
    pub fn message(&self) -> String {
        match self {
            ApiError::Invalid(v) => v.message.clone(),
            other => other.to_string(),
        }
    }

    /// HTTP status: its code's ([`ErrorCode::http_status`]).
    pub fn status(&self) -> StatusCode {
        StatusCode::from_u16(self.code().http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    /// Code, message, field and (403 only) rule: what the REST body and a native `Reply` carry.
    pub fn detail(&self) -> ErrorDetail {
        ErrorDetail {
            code: self.code(),
            message: self.message(),
            field: self.field().map(str::to_owned),
            rule: self.rule().map(str::to_owned),
        }
    }

    /// The rule that refused a request (403 only).
    pub fn rule(&self) -> Option<&'static str> {
        match self {
            ApiError::Forbidden { rule, .. } => Some(rule),
            _ => None,
        }
    }

    /// The JSON body: `{"error": {"code", "message", "field"}}` (and `"rule"` on a 403).
    pub fn json_body(&self) -> String {
        serde_json::to_string(&self.body()).unwrap_or_default()
    }

    fn body(&self) -> ErrorBody {
        ErrorBody {
            error: self.detail(),
        }
    }

    /// The gRPC status of this error.
    pub fn grpc_code(&self) -> tonic::Code {
        match self {
            ApiError::Invalid(_) => tonic::Code::InvalidArgument,
            ApiError::NotFound { .. } => tonic::Code::NotFound,
            ApiError::Conflict { .. } => tonic::Code::FailedPrecondition,
            ApiError::Unauthenticated { .. } => tonic::Code::Unauthenticated,
            ApiError::Forbidden { .. } => tonic::Code::PermissionDenied,
            ApiError::WarmingUp | ApiError::Overloaded { .. } => tonic::Code::Unavailable,
            ApiError::Store(_) => tonic::Code::Internal,
            ApiError::LimitExceeded { .. } => tonic::Code::ResourceExhausted,
            _ => tonic::Code::InvalidArgument,
        }
    }
}

impl From<RegistryError> for ApiError {
    /// The REST status of each refusal: 400 invalid input, 404 unknown, 409 contradicting the
    /// registry's state, 503 warming up, 500 store or internal failure.
    fn from(e: RegistryError) -> Self {
        let message = e.to_string();
        match e {
            RegistryError::Invalid(v) => ApiError::Invalid(v),
            RegistryError::WarmingUp => ApiError::WarmingUp,
            RegistryError::Refused(a) => ApiError::from(a),
            RegistryError::LimitExceeded { limit, .. } => {
                ApiError::LimitExceeded { limit, message }
            }
            RegistryError::Store(_) | RegistryError::Internal(_) => ApiError::Store(message),
            e if e.is_not_found() => ApiError::NotFound { message },
            _ => ApiError::Conflict { message },
        }
    }
}

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> Self {
        match e {
            AuthError::Unauthenticated(message) => ApiError::Unauthenticated { message },
            AuthError::Forbidden { rule, message } => ApiError::Forbidden { rule, message },
            AuthError::LimitExceeded { limit, message } => {
                ApiError::LimitExceeded { limit, message }
            }
        }
    }
}

impl From<ApiError> for tonic::Status {
    fn from(e: ApiError) -> Self {
        tonic::Status::new(e.grpc_code(), e.message())
    }
}

impl From<ValidationError> for ApiError {
    fn from(e: ValidationError) -> Self {
        ApiError::Invalid(e)
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        ApiError::Store(e.to_string())
    }
}

impl IntoResponse for ApiError {
    /// `{"error": {"code", "message", "field"}}` with the variant's status; a 408 also closes
    /// the connection (the rest of the body is not read).
    fn into_response(self) -> Response {
        let close = matches!(self, ApiError::RequestTimeout { .. });
        let unauthenticated = matches!(self, ApiError::Unauthenticated { .. });
        let mut response = (
            self.status(),
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            self.json_body(),
        )
            .into_response();
        if unauthenticated {
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer realm=\"gangway\""),
            );
        }
        if close {
            response.headers_mut().insert(
                axum::http::header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
        }
        response
    }
}
