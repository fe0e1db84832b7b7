//! The errors the proxy answers itself, mapped to the wire in one place.
//!
//! Every one is a JSON body `{"error": CODE, "message": TEXT, "service": KEY?}` with the
//! status below and an `x-gangway-error: CODE` header, so a caller can tell the proxy's own
//! answer from an instance's.
//!
//! | code | status | when |
//! |---|---|---|
//! | `bad_host` | 400 | the host names no service (see [`naming`](crate::naming)) |
//! | `bad_host` | 400 | two `Host` headers |
//! | `unsupported_scheme` | 400 | an absolute-form target that is not `http://` (`https://...`: the proxy neither tunnels nor originates TLS) |
//! | `method_not_supported` | 501 | `CONNECT` (the proxy does not tunnel) |
//! | `body_too_large` | 413 | the request body exceeds `max_request_body` |
//! | `bad_request_body` | 400 | the request body broke off |
//! | `request_timeout` | 408 | the request body did not arrive within [`BODY_READ_TIMEOUT`](crate::proxy::BODY_READ_TIMEOUT) (10 s) |
//! | `unknown_service` | 503 | the registry has never had an instance of the service |
//! | `no_instance` | 503 | the service has no instance that may take requests |
//! | `too_many_services` | 503 | routing one more service would exceed `max_services` |
//! | `registry_unavailable` | 503 | the first request to a service could not subscribe |
//! | `upstream_failed` | 502 | the last attempt got no answer (refused, reset, timed out) |

use bytes::Bytes;
use gangway_core::model::ServiceKey;
use http::{HeaderValue, Response, StatusCode};
use http_body_util::BodyExt;

use crate::proxy::ProxyBody;

/// Header naming the code of an answer the proxy made itself.
pub const ERROR_HEADER: &str = "x-gangway-error";

/// An answer the proxy makes itself instead of an instance's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyError {
    /// The request's host names no service.
    #[error("{reason}")]
    BadHost {
        /// Why.
        reason: String,
    },
    /// An absolute-form target whose scheme is not `http`.
    #[error(
        "{scheme}:// targets are not supported: the proxy speaks plain HTTP to instances and does \
         not tunnel TLS; send http://SERVICE/path"
    )]
    UnsupportedScheme {
        /// The scheme, e.g. `https`.
        scheme: String,
    },
    /// `CONNECT` and other methods the proxy cannot forward.
    #[error(
        "method {method} is not supported: the proxy forwards HTTP requests, it does not tunnel"
    )]
    MethodNotSupported {
        /// The method.
        method: String,
    },
    /// The request body is larger than the limit.
    #[error("the request body exceeds max_request_body ({limit} bytes)")]
    BodyTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// The request body did not arrive in time (a client trickling it).
    #[error("the request body did not arrive within {after_ms} ms")]
    BodyTimeout {
        /// The bound, ms.
        after_ms: u64,
    },
    /// The request body broke off while it was read.
    #[error("the request body broke off: {reason}")]
    BadRequestBody {
        /// The transport's message.
        reason: String,
    },
    /// The registry has never had an instance of the service.
    #[error("unknown service {service}: the registry has no instance of it")]
    UnknownService {
        /// The service.
        service: ServiceKey,
    },
    /// The service has no instance that may take requests.
    #[error("service {service} has no serving instance")]
    NoInstance {
        /// The service.
        service: ServiceKey,
    },
    /// `max_services` services are routed already.
    #[error("cannot route {service}: max_services ({limit}) services are routed already")]
    TooManyServices {
        /// The service.
        service: ServiceKey,
        /// The limit.
        limit: usize,
    },
    /// The first request to a service could not subscribe to it.
    #[error("cannot resolve {service}: {reason}")]
    RegistryUnavailable {
        /// The service.
        service: ServiceKey,
        /// Why.
        reason: String,
    },
    /// The last attempt got no answer.
    #[error("{service}: {reason}")]
    UpstreamFailed {
        /// The service.
        service: ServiceKey,
        /// The client's error, naming the instance and the attempts made.
        reason: String,
    },
}

impl ProxyError {
    /// The stable code of the JSON body and the `x-gangway-error` header.
    pub fn code(&self) -> &'static str {
        match self {
            ProxyError::BadHost { .. } => "bad_host",
            ProxyError::UnsupportedScheme { .. } => "unsupported_scheme",
            ProxyError::MethodNotSupported { .. } => "method_not_supported",
            ProxyError::BodyTooLarge { .. } => "body_too_large",
            ProxyError::BadRequestBody { .. } => "bad_request_body",
            ProxyError::BodyTimeout { .. } => "request_timeout",
            ProxyError::UnknownService { .. } => "unknown_service",
            ProxyError::NoInstance { .. } => "no_instance",
            ProxyError::TooManyServices { .. } => "too_many_services",
            ProxyError::RegistryUnavailable { .. } => "registry_unavailable",
            ProxyError::UpstreamFailed { .. } => "upstream_failed",
        }
    }

    /// The HTTP status of the answer.
    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::BadHost { .. }
            | ProxyError::UnsupportedScheme { .. }
            | ProxyError::BadRequestBody { .. } => StatusCode::BAD_REQUEST,
            ProxyError::MethodNotSupported { .. } => StatusCode::NOT_IMPLEMENTED,
            ProxyError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ProxyError::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            ProxyError::UnknownService { .. }
            | ProxyError::NoInstance { .. }
            | ProxyError::TooManyServices { .. }
            | ProxyError::RegistryUnavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ProxyError::UpstreamFailed { .. } => StatusCode::BAD_GATEWAY,
        }
    }

    /// The service the error is about, if the request named one.
    pub fn service(&self) -> Option<&ServiceKey> {
        match self {
            ProxyError::UnknownService { service }
            | ProxyError::NoInstance { service }
            | ProxyError::TooManyServices { service, .. }
            | ProxyError::RegistryUnavailable { service, .. }
            | ProxyError::UpstreamFailed { service, .. } => Some(service),
            _ => None,
        }
    }

    /// The answer: status, JSON body, `x-gangway-error` header.
    pub fn into_response(self) -> Response<ProxyBody> {
        let mut body = serde_json::json!({
            "error": self.code(),
            "message": self.to_string(),
        });
        if let Some(s) = self.service() {
            body["service"] = serde_json::json!({
                "namespace": s.namespace,
                "group": s.group,
                "name": s.service,
            });
        }
        let bytes = Bytes::from(body.to_string());
        let mut response = Response::new(
            http_body_util::Full::new(bytes)
                .map_err(|never| match never {})
                .boxed_unsync(),
        );
        *response.status_mut() = self.status();
        let headers = response.headers_mut();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(ERROR_HEADER, HeaderValue::from_static(self.code()));
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_body_names_the_code_and_the_service() {
        let e = ProxyError::UnknownService {
            service: ServiceKey::named("orders"),
        };
        let r = e.into_response();
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()[ERROR_HEADER], "unknown_service");
        let body = r.into_body().collect().await.unwrap().to_bytes();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["error"], "unknown_service");
        assert_eq!(json["service"]["name"], "orders");
        assert_eq!(json["service"]["group"], "DEFAULT_GROUP");
        assert!(json["message"].as_str().unwrap().contains("orders"));
    }

    #[test]
    fn every_code_has_its_status() {
        let s = ServiceKey::named("x");
        let cases = [
            (ProxyError::BadHost { reason: "r".into() }, 400),
            (
                ProxyError::UnsupportedScheme {
                    scheme: "https".into(),
                },
                400,
            ),
            (
                ProxyError::MethodNotSupported {
                    method: "CONNECT".into(),
                },
                501,
            ),
            (ProxyError::BodyTooLarge { limit: 1 }, 413),
            (ProxyError::BodyTimeout { after_ms: 1 }, 408),
            (ProxyError::NoInstance { service: s.clone() }, 503),
            (
                ProxyError::TooManyServices {
                    service: s.clone(),
                    limit: 1,
                },
                503,
            ),
            (
                ProxyError::UpstreamFailed {
                    service: s,
                    reason: "r".into(),
                },
                502,
            ),
        ];
        for (e, status) in cases {
            assert_eq!(e.status().as_u16(), status, "{}", e.code());
        }
    }
}
