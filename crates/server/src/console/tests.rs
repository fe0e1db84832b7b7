use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Method, Request, header};

use super::sessions::{LOGIN_PATH, session_cookie, set_cookie};
use super::*;
use crate::auth::file::grant;
use crate::auth::{AuthFile, Caller, Role};

fn authority() -> Authority {
    let mut f = AuthFile::default();
    // The console never checks a password here: sessions are made directly.
    f.users.push(crate::auth::file::UserRecord {
        name: "ada".into(),
        password_hash: String::new(),
        grants: vec![grant("public", Role::Admin)],
    });
    Authority::from_file(f)
}

/// The stamp of ada's password in [`authority`].
fn stamp() -> crate::auth::CredentialStamp {
    authority().current_stamp("ada").unwrap()
}

fn request(method: Method, path: &str, cookie: Option<&str>, csrf: Option<&str>) -> Request<Body> {
    let mut b = Request::builder().method(method).uri(path);
    if let Some(c) = cookie {
        b = b.header(header::COOKIE, format!("theme=dark; {SESSION_COOKIE}={c}"));
    }
    if let Some(t) = csrf {
        b = b.header(CSRF_HEADER, t);
    }
    b.body(Body::empty()).unwrap()
}

#[test]
fn the_cookie_is_found_among_others_and_set_with_its_attributes() {
    let mut headers = HeaderMap::new();
    headers.append(
        header::COOKIE,
        HeaderValue::from_static("a=1; gangway_session=abc"),
    );
    assert_eq!(session_cookie(&headers), Some("abc"));
    let mut empty = HeaderMap::new();
    empty.append(
        header::COOKIE,
        HeaderValue::from_static("gangway_session=; b=2"),
    );
    assert_eq!(session_cookie(&empty), None);
    assert_eq!(
        set_cookie("abc"),
        "gangway_session=abc; HttpOnly; SameSite=Strict; Path=/; Max-Age=28800"
    );
}

#[tokio::test]
async fn reads_pass_with_the_cookie_and_changes_need_the_csrf_token() {
    let authority = authority();
    let sessions = Sessions::default();
    let new = sessions.create("ada", stamp()).unwrap();
    let caller = |m: Method, csrf: Option<&str>| {
        sessions.caller(&authority, &request(m, "/v1/services", Some(&new.id), csrf))
    };
    assert!(matches!(caller(Method::GET, None), Ok(Some(Caller::Principal(p))) if p.name == "ada"));
    for m in [Method::POST, Method::PUT, Method::PATCH, Method::DELETE] {
        let err = caller(m.clone(), None).unwrap_err();
        assert_eq!(
            (err.status().as_u16(), err.rule()),
            (403, Some("csrf")),
            "{m}"
        );
        assert!(caller(m.clone(), Some("wrong")).is_err(), "{m}");
        assert!(matches!(caller(m, Some(&new.csrf)), Ok(Some(_))));
    }
    // Unknown ids and the login path go on without the cookie (anonymous: the rule says 401).
    let unknown = request(Method::POST, "/v1/services", Some("no-such-id"), None);
    assert!(matches!(sessions.caller(&authority, &unknown), Ok(None)));
    let login = request(Method::POST, LOGIN_PATH, Some(&new.id), None);
    assert!(matches!(sessions.caller(&authority, &login), Ok(None)));
    // With auth off the cookie means nothing.
    let open = request(Method::POST, "/v1/services", Some(&new.id), None);
    assert!(matches!(
        sessions.caller(&Authority::off(), &open),
        Ok(None)
    ));
    // A user no longer in the file: signed out.
    let gone = sessions.create("ghost", stamp()).unwrap();
    let req = request(Method::GET, "/v1/services", Some(&gone.id), None);
    assert!(matches!(sessions.caller(&authority, &req), Ok(None)));
    assert!(sessions.get(&gone.id).is_none(), "the session was dropped");
}

#[tokio::test(start_paused = true)]
async fn sessions_expire_and_are_bounded() {
    let sessions = Sessions::default();
    let first = sessions.create("ada", stamp()).unwrap();
    tokio::time::advance(SESSION_TTL - std::time::Duration::from_secs(1)).await;
    assert!(sessions.get(&first.id).is_some());
    tokio::time::advance(std::time::Duration::from_secs(1)).await;
    assert!(
        sessions.get(&first.id).is_none(),
        "expired after {SESSION_TTL:?}"
    );
    let one = sessions.create("ada", stamp()).unwrap();
    sessions.remove(&one.id);
    assert!(sessions.get(&one.id).is_none());
    assert_eq!(format!("{sessions:?}"), "Sessions(0)");
}

/// F4: a user's sign-ins beyond [`MAX_SESSIONS_PER_USER`] end its own oldest only, so a
/// flood by one (read-only) user leaves the others signed in; a full table refuses a sign-in
/// with 429 `limit_exceeded` and ends nobody's session.
#[tokio::test(start_paused = true)]
async fn a_users_sessions_beyond_its_cap_end_its_own_and_a_full_table_refuses() {
    let global = MAX_SESSIONS_PER_USER + 4;
    let sessions = Sessions::with_max(global);
    let create = |user: &str| sessions.create(user, stamp());
    let admin = create("admin").unwrap();
    let mut flood = Vec::new();
    for n in 0..10 * MAX_SESSIONS_PER_USER {
        // Distinct expiries, so "oldest" is one session.
        tokio::time::advance(std::time::Duration::from_millis(1)).await;
        flood.push((n, create("reader").unwrap()));
    }
    assert!(
        sessions.get(&admin.id).is_some(),
        "the admin's session survives"
    );
    let live: Vec<usize> = flood
        .iter()
        .filter(|(_, s)| sessions.get(&s.id).is_some())
        .map(|(n, _)| *n)
        .collect();
    let last: Vec<usize> = (9 * MAX_SESSIONS_PER_USER..10 * MAX_SESSIONS_PER_USER).collect();
    assert_eq!(
        live, last,
        "the reader's newest {MAX_SESSIONS_PER_USER} only"
    );
    assert_eq!(sessions.len(), 1 + MAX_SESSIONS_PER_USER);

    // Three more users fill the table; the next sign-in of a new user is refused.
    for user in ["b", "c", "d"] {
        create(user).unwrap();
    }
    assert_eq!(sessions.len(), global);
    let Err(refused) = create("e") else {
        panic!("a sign-in into a full table")
    };
    assert_eq!(
        (refused.status().as_u16(), refused.code()),
        (429, gangway_wire::ErrorCode::LimitExceeded),
    );
    assert!(
        refused
            .to_string()
            .starts_with(&format!("limit console-sessions reached: {global}")),
        "{refused}"
    );
    assert_eq!(sessions.len(), global, "nobody was signed out");
    assert!(sessions.get(&admin.id).is_some());
    // The reader, at its own cap, still gets in by giving up its own oldest.
    tokio::time::advance(std::time::Duration::from_millis(1)).await;
    let again = create("reader").unwrap();
    assert!(sessions.get(&again.id).is_some());
    assert!(
        sessions
            .get(&flood[9 * MAX_SESSIONS_PER_USER].1.id)
            .is_none()
    );
    assert!(sessions.get(&admin.id).is_some());
}
