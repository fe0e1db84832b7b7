//! [`RestError`]: why a call of the [`RestClient`](super::RestClient) failed, classified from
//! the answer's status and body and the transport error's `source()` chain.

use std::time::Duration;

use crate::error::{ErrorBody, ErrorCode};

/// Added to errors that suggest the address names the registry's gRPC (HTTP/2-only) port.
pub const GRPC_PORT_HINT: &str = "is this the gRPC port? the REST port is usually 8848 (a registry that serves TLS needs https://)";

/// What an `https://` address or a TLS file gets from a client built without TLS.
pub const NO_TLS: &str = "this gangway was built without TLS (cargo feature tls)";

/// Why a REST call failed. Classify by the variant, [`RestError::code`] or
/// [`RestError::is_retryable`], never by the message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RestError {
    /// The registry (or a proxy in front of it) answered with an error status.
    #[error("{}", status_line(message, field.as_deref(), *status))]
    Status {
        /// HTTP status code.
        status: u16,
        /// The registry's code; `None` when the body was not gangway's error body (a 5xx of a
        /// proxy, for example).
        code: Option<ErrorCode>,
        /// Readable reason: the body's message, else the body itself when it is one short
        /// line, else the status text.
        message: String,
        /// The request field at fault, if the registry named one.
        field: Option<String>,
    },
    /// No connection could be made.
    #[error("cannot reach the registry at {server}: {reason}")]
    Unreachable {
        /// The address as configured.
        server: String,
        /// The innermost cause, e.g. `Connection refused (os error 111)`.
        reason: String,
    },
    /// The call took longer than its timeout.
    #[error(
        "the registry at {server} did not answer within {}",
        gangway_core::duration::format(*after)
    )]
    Timeout {
        /// The address as configured.
        server: String,
        /// The timeout that ran out.
        after: Duration,
    },
    /// The connection broke or the answer could not be read.
    #[error("lost the connection to the registry at {server}: {reason}")]
    Transport {
        /// The address as configured.
        server: String,
        /// The innermost cause.
        reason: String,
    },
    /// The answer did not come from a gangway registry: a 4xx or 501 without gangway's error
    /// body, a body that is not JSON where JSON was expected, or not HTTP/1 at all.
    #[error(
        "{server} does not look like a gangway registry ({detail}){}",
        hint.map(|h| format!("; {h}")).unwrap_or_default()
    )]
    NotRegistry {
        /// The address as configured.
        server: String,
        /// What gave it away, e.g. `HTTP 404 Not Found`.
        detail: String,
        /// What the user may have got wrong ([`GRPC_PORT_HINT`]), if it can tell.
        hint: Option<&'static str>,
    },
    /// TLS with the registry failed: the handshake of an `https://` address (an untrusted
    /// certificate, a client certificate required or refused, no TLS on the port), PEM files
    /// that hold no certificate or key, or TLS asked of a client built without it ([`NO_TLS`]).
    #[error(
        "TLS with the registry at {server} failed: {reason}{}",
        hint.map(|h| format!("; {h}")).unwrap_or_default()
    )]
    Tls {
        /// The address as configured.
        server: String,
        /// The TLS library's reason, e.g. `invalid peer certificate: UnknownIssuer`, or the
        /// file at fault by its CLI flag (`--ca: no PEM certificate in the file`).
        reason: String,
        /// What to change (`--ca`, `--client-cert`, the scheme), when it can tell.
        hint: Option<&'static str>,
    },
    /// The answer was JSON, but not of the expected shape.
    #[error("unexpected answer from the registry ({what}): {reason}")]
    Decode {
        /// What was being read, e.g. `View`.
        what: &'static str,
        /// The parser's complaint.
        reason: String,
    },
}

impl RestError {
    /// The error of a non-2xx answer from `server` (`reason`: the status's canonical text):
    /// [`RestError::Status`] when `body` is gangway's error body, or for a 5xx (e.g. from a
    /// proxy in front of the registry); [`RestError::NotRegistry`] for a 4xx or 501 without
    /// it, which any registry would explain in its own words.
    pub fn from_answer(server: &str, status: u16, reason: Option<&str>, body: &str) -> Self {
        match serde_json::from_str::<ErrorBody>(body) {
            Ok(ErrorBody { error }) => RestError::Status {
                status,
                code: Some(error.code),
                message: error.message,
                field: error.field,
            },
            Err(_) if (400..500).contains(&status) || status == 501 => RestError::NotRegistry {
                server: server.to_owned(),
                detail: match reason {
                    Some(reason) => format!("HTTP {status} {reason}"),
                    None => format!("HTTP {status}"),
                },
                hint: None,
            },
            Err(_) => {
                let text = body.trim();
                let message = if text.is_empty() || text.len() > 200 || text.contains('\n') {
                    reason.unwrap_or("request failed").to_owned()
                } else {
                    text.to_owned()
                };
                RestError::Status {
                    status,
                    code: None,
                    message,
                    field: None,
                }
            }
        }
    }

    /// The error of a failed send or read with `server`; `timeout` is the call's, when it had
    /// one (a watch has none).
    pub(crate) fn from_transport(
        server: &str,
        e: &reqwest::Error,
        timeout: Option<Duration>,
    ) -> Self {
        let server = server.to_owned();
        #[cfg(feature = "tls")]
        if let Some(tls) = tls_error(e) {
            return RestError::Tls {
                server,
                reason: tls.to_string(),
                hint: tls_hint(tls),
            };
        }
        let reason = innermost(e);
        if speaks_http2_only(&reason) {
            return RestError::NotRegistry {
                server,
                detail: reason,
                hint: Some(GRPC_PORT_HINT),
            };
        }
        match timeout {
            Some(after) if e.is_timeout() => RestError::Timeout { server, after },
            _ if e.is_connect() => RestError::Unreachable { server, reason },
            _ => RestError::Transport { server, reason },
        }
    }

    /// The registry's code, for a [`RestError::Status`] with gangway's error body.
    pub fn code(&self) -> Option<&ErrorCode> {
        match self {
            RestError::Status { code, .. } => code.as_ref(),
            _ => None,
        }
    }

    /// The HTTP status, for a [`RestError::Status`].
    pub fn status(&self) -> Option<u16> {
        match self {
            RestError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// Whether the same call may succeed later: no answer ([`RestError::Unreachable`],
    /// [`RestError::Timeout`]), a broken connection ([`RestError::Transport`]) or a 5xx (a
    /// registry restarting or warming up) may pass; a 4xx refusal or an answer from something
    /// other than a registry will not.
    pub fn is_retryable(&self) -> bool {
        match self {
            RestError::Unreachable { .. }
            | RestError::Timeout { .. }
            | RestError::Transport { .. } => true,
            RestError::Status { status, .. } => *status >= 500,
            // An untrusted certificate does not become trusted by waiting.
            RestError::NotRegistry { .. } | RestError::Decode { .. } | RestError::Tls { .. } => {
                false
            }
        }
    }
}

/// `field: message (HTTP status)`, the field left out when the message already starts with it.
fn status_line(message: &str, field: Option<&str>, status: u16) -> String {
    match field {
        Some(field) if !field.is_empty() && !message.starts_with(&format!("{field}:")) => {
            format!("{field}: {message} (HTTP {status})")
        }
        _ => format!("{message} (HTTP {status})"),
    }
}

/// Whether a transport failure reads like an HTTP/2-only server (gRPC) answering HTTP/1.1:
/// hyper either parses the server's SETTINGS frame as a response ("invalid HTTP version
/// parsed") or sees it arrive before the request went out ("received unexpected message from
/// connection"). hyper gives no typed error for either, so its text is all there is.
fn speaks_http2_only(reason: &str) -> bool {
    let r = reason.to_ascii_lowercase();
    [
        "invalid http version",
        "unexpected message from connection",
        "http/2",
        "http2",
    ]
    .iter()
    .any(|s| r.contains(s))
}

/// The TLS error among `e`'s sources, if any. An I/O error may carry it, inside another I/O
/// error: `io::Error::source` skips the error it wraps, so that one is looked at directly.
#[cfg(feature = "tls")]
fn tls_error<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut next = Some(e);
    while let Some(cur) = next {
        if let Some(tls) = cur.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        next = match cur
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => cur.source(),
        };
    }
    None
}

/// What to change after a TLS failure, when it says: an untrusted certificate (`--ca`), a
/// client certificate required or refused by the registry (`--client-cert`, `--client-key`),
/// a peer that does not speak TLS (`http://`).
#[cfg(feature = "tls")]
fn tls_hint(e: &rustls::Error) -> Option<&'static str> {
    use rustls::AlertDescription as Alert;
    match e {
        rustls::Error::InvalidCertificate(_) => Some(
            "the registry's certificate is not trusted: pass --ca FILE (or GANGWAY_CA) with the \
             CA that signed it",
        ),
        rustls::Error::AlertReceived(
            Alert::CertificateRequired | Alert::BadCertificate | Alert::UnknownCA,
        ) => Some(
            "the registry requires a client certificate it trusts: pass --client-cert FILE \
             --client-key FILE",
        ),
        rustls::Error::InvalidMessage(_) => {
            Some("the registry does not seem to speak TLS on this port: try http://")
        }
        _ => None,
    }
}

/// The deepest `source()` of an error: the OS's reason rather than reqwest's wrapper text.
pub(crate) fn innermost(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_body_with_field_reads_as_one_line() {
        let body = r#"{"error":{"code":"invalid_argument","message":"must be 1-65535, got 0","field":"port"}}"#;
        let e = RestError::from_answer("h:1", 400, Some("Bad Request"), body);
        assert_eq!(e.to_string(), "port: must be 1-65535, got 0 (HTTP 400)");
        assert_eq!(e.code(), Some(&ErrorCode::InvalidArgument));
        assert_eq!(e.status(), Some(400));
        assert!(!e.is_retryable());
    }

    #[test]
    fn error_message_already_naming_its_field_is_not_prefixed_twice() {
        let body = r#"{"error":{"code":"invalid_argument","message":"port: must be 1-65535, got 0","field":"port"}}"#;
        let e = RestError::from_answer("h:1", 400, None, body);
        assert_eq!(e.to_string(), "port: must be 1-65535, got 0 (HTTP 400)");
    }

    #[test]
    fn foreign_5xx_bodies_fall_back_to_text_or_reason() {
        let e = RestError::from_answer("h:1", 502, Some("Bad Gateway"), "");
        assert_eq!(e.to_string(), "Bad Gateway (HTTP 502)");
        assert_eq!(e.code(), None);
        assert!(e.is_retryable());
        assert_eq!(
            RestError::from_answer("h:1", 503, Some("Service Unavailable"), "no upstream")
                .to_string(),
            "no upstream (HTTP 503)"
        );
        let html = "<html>\n<body>oops</body>\n</html>";
        assert_eq!(
            RestError::from_answer("h:1", 500, None, html).to_string(),
            "request failed (HTTP 500)"
        );
    }

    #[test]
    fn a_foreign_4xx_or_501_is_not_a_registry() {
        let e = RestError::from_answer(
            "127.0.0.1:28850",
            404,
            Some("Not Found"),
            "404 page not found",
        );
        assert_eq!(
            e.to_string(),
            "127.0.0.1:28850 does not look like a gangway registry (HTTP 404 Not Found)"
        );
        assert!(!e.is_retryable());
        assert_eq!(
            RestError::from_answer("h:1", 501, Some("Not Implemented"), "").to_string(),
            "h:1 does not look like a gangway registry (HTTP 501 Not Implemented)"
        );
        // Gangway's own 404 stays a 404 with its message.
        let ours = r#"{"error":{"code":"not_found","message":"no instance","field":null}}"#;
        let e = RestError::from_answer("h:1", 404, Some("Not Found"), ours);
        assert_eq!(e.to_string(), "no instance (HTTP 404)");
        assert_eq!(e.code(), Some(&ErrorCode::NotFound));
    }

    #[test]
    fn an_http2_only_answer_hints_at_the_grpc_port() {
        assert!(speaks_http2_only("invalid HTTP version parsed"));
        assert!(speaks_http2_only(
            "received unexpected message from connection"
        ));
        assert!(!speaks_http2_only("Connection refused (os error 111)"));
        let e = RestError::NotRegistry {
            server: "127.0.0.1:9848".into(),
            detail: "invalid HTTP version parsed".into(),
            hint: Some(GRPC_PORT_HINT),
        };
        assert_eq!(
            e.to_string(),
            "127.0.0.1:9848 does not look like a gangway registry (invalid HTTP version \
             parsed); is this the gRPC port? the REST port is usually 8848 (a registry that \
             serves TLS needs https://)"
        );
    }

    #[test]
    fn no_answer_is_worth_another_try() {
        let timeout = RestError::Timeout {
            server: "h:1".into(),
            after: Duration::from_secs(30),
        };
        assert_eq!(
            timeout.to_string(),
            "the registry at h:1 did not answer within 30s"
        );
        assert!(timeout.is_retryable());
        assert_eq!(timeout.code(), None);
        let decode = RestError::Decode {
            what: "View",
            reason: "missing field".into(),
        };
        assert!(!decode.is_retryable());
        let tls = RestError::Tls {
            server: "https://h:1".into(),
            reason: "invalid peer certificate: UnknownIssuer".into(),
            hint: Some("pass --ca FILE"),
        };
        assert_eq!(
            tls.to_string(),
            "TLS with the registry at https://h:1 failed: invalid peer certificate: \
             UnknownIssuer; pass --ca FILE"
        );
        assert!(!tls.is_retryable());
    }
}
