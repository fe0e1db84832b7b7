//! `POST /ui/login`, `POST /ui/logout` and `GET /ui/session`.

use axum::Json;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use super::Console;
use super::sessions::{SESSION_TTL, clear_cookie, session_cookie, set_cookie};
use crate::auth::layer::parse_authorization;
use crate::auth::{Caller, Credentials, Grant};
use crate::error::ApiError;
use crate::http::ApiJson;

/// Password checks (argon2, on the blocking pool) the console runs at once; a login beyond
/// it is refused with 503 `overloaded` (retry shortly), so that a flood of logins cannot take
/// the blocking pool.
pub const MAX_CONCURRENT_LOGINS: usize = 4;

/// The body of `POST /ui/login`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LoginBody {
    username: String,
    password: String,
}

/// What `GET /ui/session` and `POST /ui/login` answer.
#[derive(Serialize)]
pub(super) struct SessionJson {
    /// `on` or `off`.
    auth: &'static str,
    /// Auth is off on a non-loopback address (`--insecure-no-auth`).
    exposed: bool,
    /// The user signed in (`null`: nobody, or auth is off).
    user: Option<String>,
    /// Its grants.
    grants: Vec<Grant>,
    /// The token to send in `X-CSRF-Token` on every mutation.
    csrf: Option<String>,
    /// Time left of the session, ms (at login: its whole lifetime). For a request signed in
    /// by `Authorization` instead of the cookie: the time left of a Nacos login token
    /// (`gws_...`); `null` for an API token and Basic credentials, which do not expire, and
    /// when nobody is signed in.
    expires_in_ms: Option<u64>,
}

impl Console {
    fn anonymous(&self) -> SessionJson {
        SessionJson {
            auth: if self.authority.is_on() { "on" } else { "off" },
            exposed: self.exposed,
            user: None,
            grants: Vec::new(),
            csrf: None,
            expires_in_ms: None,
        }
    }
}

/// Who the request's cookie signs in (or, without a live cookie session, its
/// `Authorization` credentials, which the auth middleware has checked). Open: it tells a page
/// without a session that it must sign in (or, with auth off, that it need not).
pub(super) async fn session(
    State(c): State<Console>,
    caller: Caller,
    headers: HeaderMap,
) -> Json<SessionJson> {
    let mut out = c.anonymous();
    let signed_in = session_cookie(&headers).and_then(|id| c.sessions.get(id));
    let by_cookie = signed_in.and_then(|session| {
        let p = c.authority.user(&session.user, &session.stamp)?;
        Some((p, session))
    });
    if let Some((p, session)) = by_cookie {
        out.user = Some(p.name);
        out.grants = p.grants;
        out.csrf = Some(session.csrf.clone());
        out.expires_in_ms = Some(millis(session.expires_in()));
    } else if let (Caller::Principal(p), Some(value)) = (caller, headers.get(header::AUTHORIZATION))
    {
        out.user = Some(p.name.clone());
        out.grants = p.grants.clone();
        let token = match value.to_str().map(parse_authorization) {
            Ok(Ok(Credentials::Token(token))) => Some(token),
            _ => None,
        };
        out.expires_in_ms = token
            .and_then(|t| c.authority.login_expires_in(&t))
            .map(millis);
    }
    Json(out)
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Checks the password against the `--auth` file's users, opens a session and sets its
/// cookie.
///
/// Errors: 400 for a body that is not `{username, password}` (field `body`); 401 for an
/// unknown user or a wrong password (one answer for both); 409 when auth is off (there is
/// nothing to sign in to); 503 when [`MAX_CONCURRENT_LOGINS`] checks are running; 429
/// `limit_exceeded` (limit `console-sessions`) when [`super::MAX_SESSIONS`] sessions are held.
pub(super) async fn login(
    State(c): State<Console>,
    ApiJson(body): ApiJson<LoginBody>,
) -> Result<Response, ApiError> {
    if !c.authority.is_on() {
        return Err(ApiError::conflict(
            "authentication is off (a loopback-only server): the console needs no sign-in",
        ));
    }
    let Ok(_permit) = c.logins.try_acquire() else {
        return Err(ApiError::Overloaded {
            message: format!(
                "limit console-logins reached: {MAX_CONCURRENT_LOGINS} sign-ins are being \
                 checked; retry shortly"
            ),
        });
    };
    let (principal, stamp) = c
        .authority
        .check_password(&body.username, &body.password)
        .await?;
    let new = c.sessions.create(&principal.name, stamp)?;
    tracing::info!(user = %principal.name, "console: signed in");
    let out = SessionJson {
        user: Some(principal.name),
        grants: principal.grants,
        csrf: Some(new.csrf),
        expires_in_ms: Some(millis(SESSION_TTL)),
        ..c.anonymous()
    };
    Ok(([(header::SET_COOKIE, set_cookie(&new.id))], Json(out)).into_response())
}

/// Ends the cookie's session (the auth middleware has checked its CSRF token) and clears the
/// cookie. Answers `{"signed_out": true}` also without a session.
pub(super) async fn logout(State(c): State<Console>, caller: Caller, request: Request) -> Response {
    if let Some(id) = session_cookie(request.headers()) {
        c.sessions.remove(id);
    }
    if let Some(user) = caller.owner() {
        tracing::info!(user, "console: signed out");
    }
    (
        [(header::SET_COOKIE, clear_cookie())],
        Json(serde_json::json!({ "signed_out": true })),
    )
        .into_response()
}
