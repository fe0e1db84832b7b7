//! The HTTP side of authentication: one axum middleware in front of every route.
//!
//! It takes the credentials from `Authorization: Bearer <token>` or `Basic <user:password>`,
//! or, under `/nacos/`, from the `accessToken` query or form parameter (or header) as the Nacos
//! SDKs send it, or elsewhere from the web console's session cookie (with its CSRF header on
//! mutations, [`crate::console`]); turns them into a [`Caller`] (401 when they are not valid) and puts it in the
//! request's extensions for the route's one decision ([`Caller::allow`]). It also refuses what
//! a web page on another site could send without a CORS preflight (docs/security.md, "Browser
//! requests").
//!
//! Nothing else in the request (User-Agent, X-Forwarded-For, `serverIdentity`, ...) is looked
//! at.

use axum::body::Body;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::{HeaderMap, Method, header, request::Parts};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;

use super::{AuthError, Authority, Caller, Credentials};
use crate::error::ApiError;
use crate::http::MAX_BODY_BYTES;

/// What the middleware needs.
#[derive(Clone, Debug)]
pub struct AuthLayerState {
    /// Users and tokens.
    pub authority: Authority,
    /// Auth is off on a non-loopback address (`--insecure-no-auth`): credential-less Nacos
    /// forms are refused too, since any web page may reach the port.
    pub exposed: bool,
    /// The web console's sessions: its cookie is a third way to carry a user's credentials
    /// (outside `/nacos/`), with a CSRF header on every mutation.
    pub console: crate::console::Sessions,
}

/// The middleware (`axum::middleware::from_fn_with_state`).
pub async fn authenticate(
    State(state): State<AuthLayerState>,
    request: Request,
    next: Next,
) -> Response {
    match prepare(&state, request).await {
        Ok(request) => next.run(request).await,
        Err(e) => e.into_response(),
    }
}

async fn prepare(state: &AuthLayerState, request: Request) -> Result<Request, ApiError> {
    if !state.authority.is_on() && !state.exposed {
        check_host(&request)?;
    }
    check_not_cross_site(&request)?;
    let nacos = request.uri().path().starts_with("/nacos/");
    let header_credentials = from_authorization(request.headers())?;
    let (mut request, nacos_token) = if nacos && header_credentials.is_none() {
        nacos_access_token(request).await?
    } else {
        (request, None)
    };
    check_browser_safe(
        state,
        &request,
        header_credentials.is_some(),
        nacos_token.is_some(),
        nacos,
    )?;
    // Without an Authorization header, a console session cookie; its mutations need the CSRF
    // header too (crate::console::Sessions::caller).
    let from_cookie = match (&header_credentials, nacos) {
        (None, false) => state.console.caller(&state.authority, &request)?,
        _ => None,
    };
    let credentials = header_credentials.or(nacos_token.map(Credentials::Token));
    let caller = match from_cookie {
        Some(caller) => caller,
        None => state.authority.authenticate(credentials).await?,
    };
    request.extensions_mut().insert(caller);
    Ok(request)
}

/// `Authorization: Bearer` or `Basic`. Errors: 401 for any other scheme, a malformed value,
/// or more than one `Authorization` header ([`one_authorization`]).
fn from_authorization(headers: &HeaderMap) -> Result<Option<Credentials>, ApiError> {
    one_authorization(headers.get_all(header::AUTHORIZATION).iter().count())?;
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Ok(None);
    };
    let value = value
        .to_str()
        .map_err(|_| AuthError::Unauthenticated("Authorization header: not ASCII".into()))?;
    Ok(Some(parse_authorization(value)?))
}

/// Whether a request carries an `Authorization` header (HTTP) or `authorization` metadata
/// (gRPC), given how many it carries. Errors: 401 for more than one, naming the header: which
/// one counts would otherwise be up to each proxy and parser on the way (the first, the last,
/// a comma-joined value), so a request is refused rather than read one way here and another
/// way there.
pub fn one_authorization(count: usize) -> Result<bool, AuthError> {
    if count > 1 {
        return Err(AuthError::Unauthenticated(format!(
            "Authorization header: sent {count} times; send exactly one"
        )));
    }
    Ok(count == 1)
}

/// An `Authorization` value (HTTP header, gRPC metadata): `Bearer <token>` or
/// `Basic <base64 user:password>`. Errors: 401 for another scheme or a malformed value.
pub fn parse_authorization(value: &str) -> Result<Credentials, AuthError> {
    let bad = |why: &str| AuthError::Unauthenticated(format!("Authorization header: {why}"));
    let (scheme, rest) = value
        .split_once(' ')
        .ok_or_else(|| bad("expected Bearer or Basic"))?;
    match scheme.to_ascii_lowercase().as_str() {
        "bearer" => Ok(Credentials::Token(rest.trim().to_owned())),
        "basic" => {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(rest.trim())
                .map_err(|_| bad("Basic credentials are not base64"))?;
            let text =
                String::from_utf8(decoded).map_err(|_| bad("Basic credentials are not UTF-8"))?;
            let (user, password) = text
                .split_once(':')
                .ok_or_else(|| bad("Basic credentials need user:password"))?;
            Ok(Credentials::Password {
                user: user.to_owned(),
                password: password.to_owned(),
            })
        }
        _ => Err(bad("expected Bearer or Basic")),
    }
}

fn is_form(headers: &HeaderMap) -> bool {
    content_type(headers).is_some_and(|c| c == "application/x-www-form-urlencoded")
}

fn content_type(headers: &HeaderMap) -> Option<String> {
    let v = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
    Some(
        v.split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase(),
    )
}

fn access_token_in(query: &str) -> Option<String> {
    form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "accessToken")
        .map(|(_, v)| v.into_owned())
        .filter(|v| !v.is_empty())
}

/// A Nacos request's `accessToken`: header, query, or form body (read, then put back).
async fn nacos_access_token(request: Request) -> Result<(Request, Option<String>), ApiError> {
    if let Some(v) = request
        .headers()
        .get("accesstoken")
        .and_then(|v| v.to_str().ok())
    {
        let v = v.to_owned();
        return Ok((request, Some(v)));
    }
    if let Some(t) = request.uri().query().and_then(access_token_in) {
        return Ok((request, Some(t)));
    }
    if !is_form(request.headers()) {
        return Ok((request, None));
    }
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_BODY_BYTES)
        .await
        .map_err(|_| ApiError::PayloadTooLarge {
            limit_bytes: MAX_BODY_BYTES,
        })?;
    let token = std::str::from_utf8(&bytes).ok().and_then(access_token_in);
    Ok((Request::from_parts(parts, Body::from(bytes)), token))
}

/// Without auth, a loopback server answers only requests whose `Host` (HTTP/2: `:authority`)
/// is an IP address or `localhost` (also `*.localhost`), with any port; others get 403 rule
/// `host`. A web page whose DNS name an attacker points at 127.0.0.1 (DNS rebinding) is
/// same-origin to the browser and could otherwise send any request to the registry, JSON
/// included; its requests carry the attacker's name. A request without a host passes (no
/// browser sends one). With auth on the credentials decide, and `--insecure-no-auth` has
/// opened the port to every page anyway.
fn check_host(request: &Request) -> Result<(), ApiError> {
    let authority = match request.headers().get(header::HOST) {
        Some(value) => value.to_str().ok(),
        None => match request.uri().authority() {
            Some(authority) => Some(authority.as_str()),
            None => return Ok(()),
        },
    };
    let authority = authority.and_then(|a| a.parse::<axum::http::uri::Authority>().ok());
    if authority.is_some_and(|a| host_is_local(a.host())) {
        return Ok(());
    }
    Err(ApiError::Forbidden {
        rule: "host",
        message: "without auth the registry answers only requests to an IP address or \
                  localhost (Host header), so that no web page can reach it by DNS rebinding; \
                  use the address, or turn auth on (--auth)"
            .into(),
    })
}

/// An IP address, `localhost` or a name under `.localhost` (RFC 6761: always loopback).
fn host_is_local(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    host.parse::<std::net::IpAddr>().is_ok() || host == "localhost" || host.ends_with(".localhost")
}

/// Refuses, whatever the method and with or without auth, a request that a browser says a
/// page of another site made (`Sec-Fetch-Site: cross-site` or `same-site`, Fetch Metadata):
/// 403 rule `browser`. Such a page could otherwise, with an `<img>` or a no-cors `fetch`, make
/// the browser poll as a `subscriber=NAME` (acking a drain for that consumer) or send
/// credentials the browser holds (Basic). gangway grants no CORS, so no cross-site page can
/// use its API legitimately; the console is served from the same origin (`same-origin`), and
/// clients that are not browsers send no such header. Browsers without Fetch Metadata send
/// none either: what they can do is what [`check_browser_safe`] and the credentials allow.
fn check_not_cross_site(request: &Request) -> Result<(), ApiError> {
    // Any header value that names another site, whatever its case or list position.
    let other_site = request
        .headers()
        .get_all("sec-fetch-site")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|v| {
            let v = v.trim();
            v.eq_ignore_ascii_case("cross-site") || v.eq_ignore_ascii_case("same-site")
        });
    if other_site {
        return Err(ApiError::Forbidden {
            rule: "browser",
            message: "a request a browser made for a page of another site (Sec-Fetch-Site) \
                      is refused"
                .into(),
        });
    }
    Ok(())
}

/// Refuses what a page on another site could make a browser send without a CORS preflight: a
/// POST whose content type is not JSON (an HTML form, `text/plain`, none at all) and that
/// carries no `Authorization` header (a page cannot add one without a preflight, which gangway
/// never grants). Nacos v1/v3 forms are what the Nacos SDKs send: they pass with an
/// `accessToken`, or when auth is off on loopback and no browser `Origin` says it came from a
/// page.
fn check_browser_safe(
    state: &AuthLayerState,
    request: &Request,
    has_authorization: bool,
    has_access_token: bool,
    nacos: bool,
) -> Result<(), ApiError> {
    if request.method() != Method::POST || has_authorization {
        return Ok(());
    }
    let headers = request.headers();
    let json =
        content_type(headers).is_some_and(|c| c == "application/json" || c.ends_with("+json"));
    if !nacos {
        if json {
            return Ok(());
        }
        return Err(ApiError::UnsupportedMediaType {
            message: "a POST needs Content-Type: application/json or an Authorization header \
                      (so that no web page can send it from another site)"
                .into(),
        });
    }
    if has_access_token {
        return Ok(());
    }
    let from_a_page = headers.contains_key(header::ORIGIN)
        || headers
            .get("sec-fetch-site")
            .is_some_and(|v| v.as_bytes() != b"same-origin" && v.as_bytes() != b"none");
    if state.authority.is_on() || json {
        // With auth on, the route's rule answers 401 to a request without credentials.
        return Ok(());
    }
    if state.exposed || from_a_page {
        return Err(ApiError::Forbidden {
            rule: "browser",
            message: "a Nacos form POST without an accessToken is accepted only from a \
                      non-browser client of a loopback server without auth"
                .into(),
        });
    }
    Ok(())
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = std::convert::Infallible;

    /// The caller the middleware found; a request that did not pass it (a router used without
    /// the middleware, as in tests) is [`Caller::Open`] only when no middleware was installed
    /// at all, which `start` never does.
    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(parts
            .extensions
            .get::<Caller>()
            .cloned()
            .unwrap_or(Caller::Open))
    }
}
