//! The page, its script and its style sheet, compiled in (`include_str!`), and the headers
//! every console answer carries.

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

/// The page.
pub const INDEX_HTML: &str = include_str!("assets/index.html");
/// Its script: plain JS, no build step, no library.
pub const APP_JS: &str = include_str!("assets/app.js");
/// Its style sheet.
pub const APP_CSS: &str = include_str!("assets/app.css");

/// The Content-Security-Policy of every console answer: scripts, styles and connections from
/// this server only (no inline script or style, no `eval`, nothing from another site), no
/// plugins, no framing by another page, no form posts anywhere (the login is sent by the
/// script as JSON).
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

pub(super) async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX_HTML)
}

pub(super) async fn script() -> Response {
    asset("text/javascript; charset=utf-8", APP_JS)
}

pub(super) async fn style() -> Response {
    asset("text/css; charset=utf-8", APP_CSS)
}

/// Adds the console's headers to an answer: the CSP, `nosniff` (a JSON answer is never run as
/// a script), no framing, no referrer, no caching (answers carry a CSRF token and live
/// data), and same-origin isolation. No CORS header is ever sent.
pub(super) async fn security_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-store"),
        (
            header::HeaderName::from_static("cross-origin-opener-policy"),
            "same-origin",
        ),
        (
            header::HeaderName::from_static("cross-origin-resource-policy"),
            "same-origin",
        ),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}
