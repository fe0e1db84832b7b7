//! Nacos-style failures: v1 `caused: ...;` text, v3 `{code, message, data}`.

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use gangway_core::validate::ValidationError;
use serde_json::{Value, json};

use crate::engine::RegistryError;
use crate::error::ApiError;

/// A Nacos-style failure: status and a message, rendered by v1 as `caused: <message>;` in
/// plain text and by v3 as `{code, message, data: null}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NacosError {
    /// HTTP status.
    pub status: StatusCode,
    /// Nacos v2/v3 error code (10000 missing parameter, 20004 not found, ...).
    pub code: u32,
    /// Message without the `caused:` framing.
    pub message: String,
}

impl NacosError {
    pub(super) fn bad(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            code: 10001,
            message: message.into(),
        }
    }

    /// A 400 for a broken input rule, rendered `field: rule`.
    pub(super) fn invalid(e: ValidationError) -> Self {
        Self::bad(e.to_string())
    }

    pub(super) fn missing(name: &str) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            code: 10000,
            message: format!("Param '{name}' is required."),
        }
    }

    pub(super) fn not_found(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            code: 20004,
            message: message.into(),
        }
    }
}

impl From<RegistryError> for NacosError {
    /// The one place the Nacos HTTP layer maps an engine refusal (through its REST class).
    fn from(e: RegistryError) -> Self {
        ApiError::from(e).into()
    }
}

impl From<ApiError> for NacosError {
    fn from(e: ApiError) -> Self {
        let message = e.to_string();
        match e {
            ApiError::Invalid(_) | ApiError::Conflict { .. } | ApiError::MethodNotAllowed => {
                Self::bad(message)
            }
            ApiError::NotFound { .. } => Self::not_found(message),
            ApiError::PayloadTooLarge { .. } => Self {
                status: StatusCode::PAYLOAD_TOO_LARGE,
                code: 10001,
                message,
            },
            ApiError::WarmingUp => Self {
                status: StatusCode::SERVICE_UNAVAILABLE,
                code: 30000,
                message,
            },
            ApiError::Store(_) => Self {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                code: 30000,
                message,
            },
            // Nacos answers 403 to both; gangway keeps 401 for missing or bad credentials.
            ApiError::Unauthenticated { .. }
            | ApiError::Forbidden { .. }
            | ApiError::UnsupportedMediaType { .. } => Self {
                status: e.status(),
                code: 403,
                message,
            },
            ApiError::LimitExceeded { .. } => Self {
                status: e.status(),
                code: 429,
                message,
            },
            // Only the serving layer raises these, before any route runs.
            ApiError::UriTooLong { .. }
            | ApiError::HeadersTooLarge { .. }
            | ApiError::RequestTimeout { .. }
            | ApiError::Overloaded { .. } => Self {
                status: e.status(),
                code: 30000,
                message,
            },
        }
    }
}

impl IntoResponse for NacosError {
    fn into_response(self) -> Response {
        (
            self.status,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!("caused: {};", self.message),
        )
            .into_response()
    }
}

/// A v3 answer: `{code, message, data}`.
pub(super) struct V3(pub(super) Result<Value, NacosError>);

impl IntoResponse for V3 {
    fn into_response(self) -> Response {
        match self.0 {
            Ok(data) => {
                axum::Json(json!({"code": 0, "message": "success", "data": data})).into_response()
            }
            Err(e) => (
                e.status,
                axum::Json(json!({"code": e.code, "message": e.message, "data": null})),
            )
                .into_response(),
        }
    }
}
