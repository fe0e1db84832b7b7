//! The web console (docs/console.md): one page served under `/ui` by the server itself, its
//! HTML, JS and CSS compiled into the binary (no build step, nothing from another site), over
//! the REST API it calls like any client.
//!
//! Files: `assets` (the page, its script and style sheet, and the headers they are served
//! with: a strict Content-Security-Policy), `sessions` (the session cookie, its CSRF token, the
//! rule the auth middleware applies), `login` (`POST /ui/login`, `POST /ui/logout`, `GET
//! /ui/session`), `events` (`GET /ui/events`, the live-update stream).
//!
//! | route | what | rule |
//! |---|---|---|
//! | `GET /ui`, `/ui/`, `/ui/app.js`, `/ui/app.css` | the page | open (they hold no data) |
//! | `GET /ui/session` | who the cookie signs in, the CSRF token, whether auth is on | open |
//! | `POST /ui/login` | `{username, password}`: sets the session cookie | open (a password) |
//! | `POST /ui/logout` | ends the session, clears the cookie | the session's CSRF token |
//! | `GET /ui/events` | Server-Sent Events: `change` when something shown changed | any valid credentials |
//!
//! With auth off (a loopback-only server) there is nothing to sign in to: the page says so and
//! works at once, under the API's own browser rules (JSON POSTs only, no CORS).

use std::sync::Arc;

use axum::Router;
use axum::routing::{get, post};
use tokio::sync::Semaphore;

use crate::auth::Authority;
use crate::config::Security;
use crate::engine::Registry;

mod assets;
mod events;
mod login;
mod sessions;

pub use events::{EVENT_INTERVAL, MAX_EVENT_STREAMS, STREAM_LIFETIME};
pub use login::MAX_CONCURRENT_LOGINS;
pub use sessions::{
    CSRF_HEADER, MAX_SESSIONS, MAX_SESSIONS_PER_USER, SESSION_COOKIE, SESSION_TTL, Sessions,
};

/// What the console's routes share. Cheap to clone.
#[derive(Clone)]
pub struct Console {
    registry: Registry,
    authority: Authority,
    sessions: Sessions,
    /// Auth is off on a non-loopback address (`--insecure-no-auth`): the page warns.
    exposed: bool,
    /// Password checks running at once ([`MAX_CONCURRENT_LOGINS`]).
    logins: Arc<Semaphore>,
    /// Open event streams ([`MAX_EVENT_STREAMS`]).
    streams: Arc<Semaphore>,
}

impl Console {
    /// The console of `registry`, signing users in against `security`'s authority.
    pub fn new(registry: Registry, security: &Security) -> Self {
        Self {
            registry,
            authority: security.authority.clone(),
            sessions: Sessions::default(),
            exposed: security.insecure_no_auth,
            logins: Arc::new(Semaphore::new(MAX_CONCURRENT_LOGINS)),
            streams: Arc::new(Semaphore::new(MAX_EVENT_STREAMS)),
        }
    }

    /// Its session table, for the auth middleware.
    pub fn sessions(&self) -> &Sessions {
        &self.sessions
    }

    /// The routes under `/ui`, each answer with the console's security headers
    /// (Content-Security-Policy and the rest, see `assets`).
    pub fn router(&self) -> Router {
        Router::new()
            .route("/ui", get(assets::index))
            .route("/ui/", get(assets::index))
            .route("/ui/app.js", get(assets::script))
            .route("/ui/app.css", get(assets::style))
            .route("/ui/session", get(login::session))
            .route("/ui/login", post(login::login))
            .route("/ui/logout", post(login::logout))
            .route("/ui/events", get(events::events))
            .layer(axum::middleware::map_response(assets::security_headers))
            .with_state(self.clone())
    }
}

#[cfg(test)]
mod tests;
