//! The console's sessions: a random id in a `HttpOnly; SameSite=Strict` cookie, held
//! server-side (by its SHA-256) with the user's name, a CSRF token and an expiry; at most
//! [`MAX_SESSIONS`] (of one user at most [`MAX_SESSIONS_PER_USER`]), each for at most
//! [`SESSION_TTL`].
//!
//! The cookie authenticates the REST API (`/v1/...`) and the console's own routes as the user,
//! with the user's grants as the `--auth` file says now (a user removed at a reload is signed
//! out). A request that changes anything (any method but GET, HEAD and OPTIONS) must carry the
//! session's CSRF token in [`CSRF_HEADER`] as well, else 403 rule `csrf`; and a POST must be
//! JSON anyway (`auth::layer`), so neither an HTML form nor a `text/plain` body from another
//! site gets through, with or without the cookie.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::Request;
use axum::http::{HeaderMap, Method, header};
use subtle::ConstantTimeEq;
use tokio::time::Instant;

use crate::auth::authority::make_room;
use crate::auth::file::{base64_url, random_bytes, sha256};
use crate::auth::{Authority, Caller, CredentialStamp};
use crate::error::ApiError;

/// Name of the session cookie.
pub const SESSION_COOKIE: &str = "gangway_session";

/// Header that carries the session's CSRF token on every mutation.
pub const CSRF_HEADER: &str = "x-csrf-token";

/// Lifetime of a console session from its login: 8 hours (a working day); then sign in again.
pub const SESSION_TTL: Duration = Duration::from_secs(8 * 3600);

/// Most console sessions held at once, all users together. When that many are live a sign-in
/// is refused (HTTP 429 `limit_exceeded`, limit `console-sessions`) rather than ending anyone's
/// session: sessions held go only by expiry ([`SESSION_TTL`]), logout, a reload that ends
/// their user, and their own user's [`MAX_SESSIONS_PER_USER`].
pub const MAX_SESSIONS: usize = 1_000;

/// Most console sessions of one user: its sign-in beyond that ends its own oldest session
/// (the one closest to expiry), never another user's.
pub const MAX_SESSIONS_PER_USER: usize = 16;

/// The path whose requests never look at the cookie: a login replaces whatever session the
/// browser held.
pub(super) const LOGIN_PATH: &str = "/ui/login";

/// The console's session table. Cheap to clone; clones share it.
#[derive(Clone)]
pub struct Sessions {
    table: Arc<Mutex<HashMap<[u8; 32], Session>>>,
    /// Most sessions held at once ([`MAX_SESSIONS`] but in tests).
    max: usize,
}

impl Default for Sessions {
    /// At most [`MAX_SESSIONS`].
    fn default() -> Self {
        Self::with_max(MAX_SESSIONS)
    }
}

impl std::fmt::Debug for Sessions {
    // Ids and CSRF tokens never reach a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sessions({})", self.len())
    }
}

/// One session, as the table holds it.
#[derive(Clone)]
pub(super) struct Session {
    /// The user signed in.
    pub(super) user: String,
    /// The token every mutation must carry in [`CSRF_HEADER`].
    pub(super) csrf: String,
    /// The password the user signed in with: a user added again since is signed out.
    pub(super) stamp: CredentialStamp,
    expires: Instant,
}

impl Session {
    /// Time left of the session (zero once it has expired).
    pub(super) fn expires_in(&self) -> Duration {
        self.expires.saturating_duration_since(Instant::now())
    }
}

/// A new session's secrets: the cookie's value and the CSRF token.
pub(super) struct NewSession {
    /// The cookie's value (256 random bits).
    pub(super) id: String,
    /// The CSRF token (256 random bits, unrelated to the id).
    pub(super) csrf: String,
}

fn random_token() -> String {
    base64_url(&random_bytes::<32>())
}

impl Sessions {
    /// A table of at most `max` sessions instead of [`MAX_SESSIONS`] (tests of that cap; 0
    /// refuses every sign-in).
    pub fn with_max(max: usize) -> Self {
        Self {
            table: Arc::default(),
            max,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Session>> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sessions held now (expired ones included until the next login sweeps them).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no session is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Opens a session for `user`, valid for [`SESSION_TTL`]; drops expired sessions, and
    /// `user`'s own oldest when it holds [`MAX_SESSIONS_PER_USER`]. O(sessions held).
    ///
    /// Errors: 429 `limit_exceeded` (limit `console-sessions`) when [`MAX_SESSIONS`] (or the
    /// table's [`Sessions::with_max`]) are held even so; no session is ended for it.
    pub(super) fn create(
        &self,
        user: &str,
        stamp: CredentialStamp,
    ) -> Result<NewSession, ApiError> {
        let now = Instant::now();
        let mut table = self.lock();
        let room = make_room(
            &mut table,
            user,
            (MAX_SESSIONS_PER_USER, self.max),
            now,
            |s| (s.user.as_str(), s.expires),
        );
        if !room {
            return Err(ApiError::LimitExceeded {
                limit: "console-sessions",
                message: format!(
                    "limit console-sessions reached: {} console sessions are held; retry once \
                     some have ended (after at most {} s)",
                    self.max,
                    SESSION_TTL.as_secs()
                ),
            });
        }
        let new = NewSession {
            id: random_token(),
            csrf: random_token(),
        };
        table.insert(
            sha256(new.id.as_bytes()),
            Session {
                user: user.to_owned(),
                csrf: new.csrf.clone(),
                stamp,
                expires: now + SESSION_TTL,
            },
        );
        Ok(new)
    }

    /// The live session with this cookie value.
    pub(super) fn get(&self, id: &str) -> Option<Session> {
        let key = sha256(id.as_bytes());
        let mut table = self.lock();
        match table.get(&key) {
            Some(s) if s.expires > Instant::now() => Some(s.clone()),
            Some(_) => {
                table.remove(&key);
                None
            }
            None => None,
        }
    }

    /// Ends the session with this cookie value (a logout); nothing if there is none.
    pub(super) fn remove(&self, id: &str) {
        self.lock().remove(&sha256(id.as_bytes()));
    }

    /// The caller a request's session cookie makes, for the auth middleware, which asks only
    /// when the request has no `Authorization` header and is not under `/nacos/`.
    ///
    /// `Ok(None)` (the request goes on as if without the cookie: anonymous, so the route's
    /// rule answers 401) when auth is off, on the login path, without a cookie, and for an
    /// unknown or expired session, a user no longer in the file, or one added again since the
    /// session's sign-in (a changed password).
    ///
    /// Errors: 403 rule `csrf` for a mutation (any method but GET, HEAD, OPTIONS) of a live
    /// session without its CSRF token in [`CSRF_HEADER`].
    pub fn caller(
        &self,
        authority: &Authority,
        request: &Request,
    ) -> Result<Option<Caller>, ApiError> {
        if !authority.is_on() || request.uri().path() == LOGIN_PATH {
            return Ok(None);
        }
        let Some(id) = session_cookie(request.headers()) else {
            return Ok(None);
        };
        let Some(session) = self.get(id) else {
            return Ok(None);
        };
        let Some(principal) = authority.user(&session.user, &session.stamp) else {
            self.remove(id);
            return Ok(None);
        };
        let safe = matches!(
            *request.method(),
            Method::GET | Method::HEAD | Method::OPTIONS
        );
        if !safe && !csrf_matches(request.headers(), &session.csrf) {
            return Err(ApiError::Forbidden {
                rule: "csrf",
                message: format!(
                    "a change made with the console's session cookie needs the session's CSRF \
                     token in the {CSRF_HEADER} header"
                ),
            });
        }
        Ok(Some(Caller::Principal(Arc::new(principal))))
    }
}

/// Whether the request's [`CSRF_HEADER`] is the session's token (compared in constant time).
fn csrf_matches(headers: &HeaderMap, csrf: &str) -> bool {
    headers
        .get(CSRF_HEADER)
        .is_some_and(|v| bool::from(v.as_bytes().ct_eq(csrf.as_bytes())))
}

/// The value of the [`SESSION_COOKIE`] in the request's `Cookie` headers, if any.
pub(super) fn session_cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| {
            let (name, value) = pair.trim().split_once('=')?;
            (name == SESSION_COOKIE && !value.is_empty()).then_some(value)
        })
}

/// The `Set-Cookie` value that stores `id` for [`SESSION_TTL`]: `HttpOnly` (no script reads
/// it), `SameSite=Strict` (no other site's page sends it), `Path=/` (it authenticates
/// `/v1/` too).
pub(super) fn set_cookie(id: &str) -> String {
    format!(
        "{SESSION_COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}",
        SESSION_TTL.as_secs()
    )
}

/// The `Set-Cookie` value that deletes the cookie (a logout).
pub(super) fn clear_cookie() -> String {
    format!("{SESSION_COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0")
}
