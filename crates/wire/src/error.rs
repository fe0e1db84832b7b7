//! The registry's one error vocabulary: a stable [`ErrorCode`], and the three parts of a refusal
//! ([`ErrorDetail`]: code, message, field). REST answers carry them as the body
//! `{"error": {"code", "message", "field"}}` ([`ErrorBody`]); the native protocol carries the
//! same three in its `Reply` ([`crate::proto::rejection`]).

use std::convert::Infallible;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Why the registry refused a request. Stable and snake_case, the same on REST (the body's
/// `code`) and in the native protocol (`Reply.error_code`); classify refusals by it, never by
/// their message.
///
/// On the wire it is its [`as_str`](Self::as_str) text; a text this version does not know (a
/// newer registry's) reads as [`ErrorCode::Other`] and is written back unchanged.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// `invalid_argument`: bad input; the refusal names the field (HTTP 400).
    InvalidArgument,
    /// `not_found`: unknown service, instance or endpoint (HTTP 404).
    NotFound,
    /// `method_not_allowed`: the path exists, not with this method (HTTP 405).
    MethodNotAllowed,
    /// `conflict`: the request contradicts the registry's state, e.g. draining the last
    /// serving instance without force (HTTP 409; gRPC's FAILED_PRECONDITION).
    Conflict,
    /// `payload_too_large`: the request body is over the server's limit (HTTP 413).
    PayloadTooLarge,
    /// `uri_too_long`: the request line is over the server's limit (HTTP 414).
    UriTooLong,
    /// `headers_too_large`: the header section is over the server's limit (HTTP 431).
    HeadersTooLarge,
    /// `warming_up`: the registry is starting (or recovering from a stall) and holds back
    /// snapshots; retry shortly (HTTP 503).
    WarmingUp,
    /// `overloaded`: the server holds its maximum of connections; retry later or elsewhere
    /// (HTTP 503).
    Overloaded,
    /// `limit_exceeded`: one more would pass a documented limit of the session (instances,
    /// subscriptions per session; docs/security.md); the refusal names the limit (HTTP 429;
    /// gRPC RESOURCE_EXHAUSTED).
    LimitExceeded,
    /// `internal`: the store or the registry itself failed (HTTP 500).
    Internal,
    /// `request_timeout`: the request body did not arrive in time (HTTP 408; the connection
    /// is closed).
    RequestTimeout,
    /// `unauthenticated`: no credentials, or not valid ones (HTTP 401; gRPC UNAUTHENTICATED).
    Unauthenticated,
    /// `forbidden`: valid credentials without the role the route's rule needs; the refusal
    /// names the rule ([`ErrorDetail::rule`]) (HTTP 403; gRPC PERMISSION_DENIED).
    Forbidden,
    /// `unsupported_media_type`: a mutation a web page could send across sites (an HTML form,
    /// `text/plain`) (HTTP 415).
    UnsupportedMediaType,
    /// A code this version does not know, as it was sent. [`ErrorCode::parse`] never makes
    /// one of a known text.
    Other(String),
}

/// The three parts of a refusal, as REST's error body and the native `Reply` carry them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// What kind of refusal.
    pub code: ErrorCode,
    /// Readable reason, without the field name.
    pub message: String,
    /// The request field at fault (`port`, `body`, `query`, `probe.interval_ms`, ...), for
    /// [`ErrorCode::InvalidArgument`]; `None` (JSON `null`) otherwise.
    #[serde(default)]
    pub field: Option<String>,
    /// The access rule that refused the request (docs/security.md), for
    /// [`ErrorCode::Forbidden`] only; not sent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
}

/// The body of every REST error answer: `{"error": {"code", "message", "field"}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The refusal.
    pub error: ErrorDetail,
}

impl ErrorCode {
    /// Every code this version knows, in the order of the docs.
    pub const KNOWN: [ErrorCode; 15] = [
        ErrorCode::InvalidArgument,
        ErrorCode::NotFound,
        ErrorCode::MethodNotAllowed,
        ErrorCode::Conflict,
        ErrorCode::PayloadTooLarge,
        ErrorCode::UriTooLong,
        ErrorCode::HeadersTooLarge,
        ErrorCode::WarmingUp,
        ErrorCode::Overloaded,
        ErrorCode::LimitExceeded,
        ErrorCode::Internal,
        ErrorCode::RequestTimeout,
        ErrorCode::Unauthenticated,
        ErrorCode::Forbidden,
        ErrorCode::UnsupportedMediaType,
    ];

    /// The code's text on the wire, e.g. `invalid_argument`.
    pub fn as_str(&self) -> &str {
        match self {
            ErrorCode::InvalidArgument => "invalid_argument",
            ErrorCode::NotFound => "not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::Conflict => "conflict",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::UriTooLong => "uri_too_long",
            ErrorCode::HeadersTooLarge => "headers_too_large",
            ErrorCode::WarmingUp => "warming_up",
            ErrorCode::Overloaded => "overloaded",
            ErrorCode::LimitExceeded => "limit_exceeded",
            ErrorCode::Internal => "internal",
            ErrorCode::RequestTimeout => "request_timeout",
            ErrorCode::Unauthenticated => "unauthenticated",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::UnsupportedMediaType => "unsupported_media_type",
            ErrorCode::Other(text) => text,
        }
    }

    /// The code of a wire text: a known one, else [`ErrorCode::Other`] holding it.
    pub fn parse(text: &str) -> ErrorCode {
        Self::KNOWN
            .into_iter()
            .find(|c| c.as_str() == text)
            .unwrap_or_else(|| ErrorCode::Other(text.to_owned()))
    }

    /// The HTTP status REST answers this refusal with (500 for [`ErrorCode::Other`]).
    pub fn http_status(&self) -> u16 {
        match self {
            ErrorCode::InvalidArgument => 400,
            ErrorCode::NotFound => 404,
            ErrorCode::MethodNotAllowed => 405,
            ErrorCode::Unauthenticated => 401,
            ErrorCode::Forbidden => 403,
            ErrorCode::RequestTimeout => 408,
            ErrorCode::Conflict => 409,
            ErrorCode::PayloadTooLarge => 413,
            ErrorCode::UnsupportedMediaType => 415,
            ErrorCode::LimitExceeded => 429,
            ErrorCode::UriTooLong => 414,
            ErrorCode::HeadersTooLarge => 431,
            ErrorCode::WarmingUp | ErrorCode::Overloaded => 503,
            ErrorCode::Internal | ErrorCode::Other(_) => 500,
        }
    }

    /// Whether the same request can succeed later unchanged: [`ErrorCode::WarmingUp`] and
    /// [`ErrorCode::Overloaded`]; every other refusal stays one.
    pub fn is_retryable(&self) -> bool {
        matches!(self, ErrorCode::WarmingUp | ErrorCode::Overloaded)
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ErrorCode {
    type Err = Infallible;

    /// [`ErrorCode::parse`]: never fails.
    fn from_str(s: &str) -> Result<Self, Infallible> {
        Ok(ErrorCode::parse(s))
    }
}

impl Serialize for ErrorCode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ErrorCode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = std::borrow::Cow::<'de, str>::deserialize(d)?;
        Ok(ErrorCode::parse(&text))
    }
}

impl ErrorDetail {
    /// A refusal with `code` and `message`, about `field` if given.
    pub fn new(code: ErrorCode, message: impl Into<String>, field: Option<&str>) -> Self {
        Self {
            code,
            message: message.into(),
            field: field.map(str::to_owned),
            rule: None,
        }
    }
}

impl fmt::Display for ErrorDetail {
    /// `code: message`, and ` (field F)` when it names one.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)?;
        if let Some(field) = &self.field {
            write!(f, " (field {field})")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_code_reads_back_as_itself() {
        for code in ErrorCode::KNOWN {
            assert_eq!(ErrorCode::parse(code.as_str()), code);
            let json = serde_json::to_string(&code).unwrap();
            assert_eq!(json, format!("\"{}\"", code.as_str()));
            assert_eq!(serde_json::from_str::<ErrorCode>(&json).unwrap(), code);
        }
    }

    #[test]
    fn an_unknown_code_is_kept_as_sent() {
        let code: ErrorCode = serde_json::from_str("\"too_early\"").unwrap();
        assert_eq!(code, ErrorCode::Other("too_early".into()));
        assert_eq!(serde_json::to_string(&code).unwrap(), "\"too_early\"");
        assert_eq!(code.http_status(), 500);
        assert!(!code.is_retryable());
        assert!(serde_json::from_str::<ErrorCode>("7").is_err());
    }

    #[test]
    fn only_transient_refusals_are_retryable() {
        let retryable: Vec<_> = ErrorCode::KNOWN
            .into_iter()
            .filter(ErrorCode::is_retryable)
            .collect();
        assert_eq!(retryable, [ErrorCode::WarmingUp, ErrorCode::Overloaded]);
    }

    #[test]
    fn the_body_has_the_documented_shape() {
        let body = ErrorBody {
            error: ErrorDetail::new(ErrorCode::NotFound, "no instance", None),
        };
        assert_eq!(
            serde_json::to_value(&body).unwrap(),
            serde_json::json!({"error": {"code": "not_found", "message": "no instance", "field": null}})
        );
        let read: ErrorBody = serde_json::from_str(
            r#"{"error":{"code":"invalid_argument","message":"must be 1-65535","field":"port"}}"#,
        )
        .unwrap();
        assert_eq!(read.error.field.as_deref(), Some("port"));
        assert_eq!(
            read.error.to_string(),
            "invalid_argument: must be 1-65535 (field port)"
        );
        assert!(serde_json::from_str::<ErrorBody>(r#"{"error":{"message":"x"}}"#).is_err());
    }
}
