//! `GET /ui/events`: the console's live updates, as Server-Sent Events. The stream looks at
//! [`Registry::activity`](crate::engine::Registry::activity) every [`EVENT_INTERVAL`] and sends
//! one `change` event (data: that reading) when it differs from the last one sent; the page
//! then fetches what it shows again. So a burst of changes costs one event per interval, and
//! the console is no subscriber of any service (a drain never waits for it).
//!
//! Bounds: at most [`MAX_EVENT_STREAMS`] streams at once (then 503 `overloaded`); a stream
//! ends after [`STREAM_LIFETIME`] (the browser's `EventSource` reconnects after the `retry`
//! the first event sets), when its session ends (logout, expiry, user removed), at the reload
//! that removes or changes its credential (user, password, grants, API token:
//! [`Authority::revoked`](crate::auth::Authority::revoked)) and when the server stops.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::{Stream, StreamExt};

use super::Console;
use super::sessions::session_cookie;
use crate::auth::{Caller, Rule};
use crate::error::ApiError;

/// How often a stream looks for changes: at most one event per interval.
pub const EVENT_INTERVAL: Duration = Duration::from_millis(500);

/// Most event streams open at once (all users together).
pub const MAX_EVENT_STREAMS: usize = 64;

/// Longest life of one stream; the browser reconnects.
pub const STREAM_LIFETIME: Duration = Duration::from_secs(600);

/// The `retry` the first event tells the browser to wait before it reconnects.
const RECONNECT: Duration = Duration::from_secs(1);

/// Rule: any valid credentials (the events name no service; what the page fetches then is
/// filtered by the API's own rules). Errors: 401 without credentials; 503 with
/// [`MAX_EVENT_STREAMS`] open.
pub(super) async fn events(
    State(c): State<Console>,
    caller: Caller,
    request: Request,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    // Rule `metrics` is "any valid credentials" (and nothing with auth off).
    caller.allow(Rule::Metrics, "", None)?;
    let Ok(permit) = c.streams.clone().try_acquire_owned() else {
        return Err(ApiError::Overloaded {
            message: format!(
                "limit console-event-streams reached: {MAX_EVENT_STREAMS} are open; retry \
                 shortly"
            ),
        });
    };
    // A stream opened with the session cookie ends with its session.
    let session = match (&caller, request.headers().contains_key("authorization")) {
        (Caller::Principal(_), false) => session_cookie(request.headers()).map(str::to_owned),
        _ => None,
    };
    let registry = c.registry.clone();
    let sessions = c.sessions.clone();
    let stream = async_stream::stream! {
        let _permit = permit;
        let mut last = None;
        let mut tick = tokio::time::interval(EVENT_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if session.as_deref().is_some_and(|id| sessions.get(id).is_none()) {
                break;
            }
            let now = registry.activity();
            if last == Some(now) {
                continue;
            }
            let event = Event::default().event("change").json_data(now).unwrap_or_default();
            yield Ok(if last.is_none() { event.retry(RECONNECT) } else { event });
            last = Some(now);
        }
    };
    let ends = tokio::time::sleep(STREAM_LIFETIME);
    let stream = stream
        .take_until(c.registry.stopping())
        .take_until(c.authority.revoked(&caller))
        .take_until(ends);
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}
