//! The web console's cookie and CSRF rules against a started server on 127.0.0.1
//! (docs/console.md, "Security"): the session cookie authenticates the REST API with the
//! user's roles, a change needs the CSRF header too, a form or text POST gets nowhere, a
//! logged-out cookie is dead; the page's headers; the console with auth off; the event stream.

use std::time::Duration;

use futures::StreamExt;
use gangway_core::model::ServiceKey;
use gangway_server::auth::file::grant;
use gangway_server::auth::{AuthFile, Authority, Role};
use gangway_server::console::{CSRF_HEADER, SESSION_COOKIE};
use gangway_server::{Config, RunningServer};
use reqwest::{Method, StatusCode, header};
use serde_json::{Value, json};

struct Fixture {
    server: RunningServer,
    http: reqwest::Client,
    /// An admin token, to set things up without the console.
    admin_token: String,
}

/// A signed-in browser: its cookie and CSRF token.
struct Browser {
    cookie: String,
    csrf: String,
}

async fn started() -> Fixture {
    let mut f = AuthFile::default();
    let admin_token = f.create_token("setup", vec![grant("*", Role::Admin)]);
    f.add_user("ada", "ada-password", vec![grant("public", Role::Admin)])
        .unwrap();
    f.add_user("rita", "rita-password", vec![grant("public", Role::Read)])
        .unwrap();
    let mut config = Config::for_tests();
    config.security.authority = Authority::from_file(f);
    Fixture {
        server: gangway_server::start_in_memory(config).await.unwrap(),
        http: reqwest::Client::new(),
        admin_token,
    }
}

/// A started server whose public/orders holds 10.0.0.1:1 and 10.0.0.1:2.
async fn serving_two() -> Fixture {
    let f = started().await;
    f.register(1).await;
    f.register(2).await;
    f
}

async fn text_or_json(resp: reqwest::Response) -> (StatusCode, Value) {
    let status = resp.status();
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn rule(body: &Value) -> &str {
    body["error"]["rule"].as_str().unwrap_or("")
}

impl Fixture {
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.server.http_addr)
    }

    /// Registers 10.0.0.1:{port} in public/orders with the admin token.
    async fn register(&self, port: u16) {
        let resp = self
            .http
            .post(self.url("/v1/services/orders/instances"))
            .bearer_auth(&self.admin_token)
            .json(&json!({"ip": "10.0.0.1", "port": port}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
    }

    /// `POST /ui/login`; the answer and the `Set-Cookie` header.
    async fn login_raw(&self, user: &str, password: &str) -> (StatusCode, Value, Option<String>) {
        let resp = self
            .http
            .post(self.url("/ui/login"))
            .json(&json!({"username": user, "password": password}))
            .send()
            .await
            .unwrap();
        let set_cookie = resp
            .headers()
            .get(header::SET_COOKIE)
            .map(|v| v.to_str().unwrap().to_owned());
        let (status, body) = text_or_json(resp).await;
        (status, body, set_cookie)
    }

    async fn login(&self, user: &str, password: &str) -> Browser {
        let (status, body, set_cookie) = self.login_raw(user, password).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let set_cookie = set_cookie.expect("Set-Cookie");
        let pair = set_cookie.split(';').next().unwrap();
        assert!(
            pair.starts_with(&format!("{SESSION_COOKIE}=")),
            "{set_cookie}"
        );
        Browser {
            cookie: pair.to_owned(),
            csrf: body["csrf"].as_str().expect("csrf").to_owned(),
        }
    }

    /// `POST /ui/logout` with the CSRF token, as the page signs out.
    async fn logout(&self, browser: &Browser) -> reqwest::Response {
        self.request(Method::POST, "/ui/logout", browser, true)
            .json(&json!({}))
            .send()
            .await
            .unwrap()
    }

    /// A request as the console's page makes it: the cookie, and optionally the CSRF header.
    fn request(
        &self,
        method: Method,
        path: &str,
        browser: &Browser,
        csrf: bool,
    ) -> reqwest::RequestBuilder {
        let mut req = self
            .http
            .request(method, self.url(path))
            .header(header::COOKIE, &browser.cookie);
        if csrf {
            req = req.header(CSRF_HEADER, &browser.csrf);
        }
        req
    }

    async fn json_call(
        &self,
        method: Method,
        path: &str,
        browser: &Browser,
        csrf: bool,
    ) -> (StatusCode, Value) {
        let mut req = self.request(method.clone(), path, browser, csrf);
        if method != Method::GET {
            req = req.json(&json!({}));
        }
        text_or_json(req.send().await.unwrap()).await
    }
}

#[tokio::test]
async fn the_cookie_reads_and_a_change_needs_the_csrf_header_too() {
    let f = serving_two().await;
    let ada = f.login("ada", "ada-password").await;
    let (status, body) = f.json_call(Method::GET, "/v1/services", &ada, false).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "a read needs no CSRF header: {body}"
    );
    assert_eq!(body["services"][0]["service"], "orders");

    let offline = "/v1/services/orders/instances/10.0.0.1:1/offline";
    let (status, body) = f.json_call(Method::POST, offline, &ada, false).await;
    assert_eq!(
        (status, rule(&body)),
        (StatusCode::FORBIDDEN, "csrf"),
        "{body}"
    );
    // A wrong token is no token.
    let (status, body) = text_or_json(
        f.request(Method::POST, offline, &ada, false)
            .header(CSRF_HEADER, "not-the-token")
            .json(&json!({}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((status, rule(&body)), (StatusCode::FORBIDDEN, "csrf"));
    // PATCH and DELETE are changes too.
    let one = "/v1/services/orders/instances/10.0.0.1:1";
    let (status, body) = f.json_call(Method::PATCH, one, &ada, false).await;
    assert_eq!((status, rule(&body)), (StatusCode::FORBIDDEN, "csrf"));
    let (status, body) = text_or_json(
        f.request(Method::DELETE, one, &ada, false)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((status, rule(&body)), (StatusCode::FORBIDDEN, "csrf"));
    let view = f.server.registry.view(&ServiceKey::named("orders"));
    assert_eq!(view.instances.len(), 2, "the refusals changed nothing");

    // With the header: the user's own roles decide (admin on public).
    let (status, body) = f.json_call(Method::POST, offline, &ada, true).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["instance"]["enabled"], false);
}

#[tokio::test]
async fn a_form_or_text_post_with_the_cookie_is_refused() {
    let f = serving_two().await;
    let ada = f.login("ada", "ada-password").await;
    let offline = "/v1/services/orders/instances/10.0.0.1:1/offline";
    for csrf in [false, true] {
        let form = f
            .request(Method::POST, offline, &ada, csrf)
            .form(&[("force", "true")])
            .send()
            .await
            .unwrap();
        let text = f
            .request(Method::POST, offline, &ada, csrf)
            .header(header::CONTENT_TYPE, "text/plain")
            .body("{}")
            .send()
            .await
            .unwrap();
        let bare = f
            .request(Method::POST, offline, &ada, csrf)
            .send()
            .await
            .unwrap();
        for (what, resp) in [("form", form), ("text/plain", text), ("no body", bare)] {
            // The browser rule comes first: not JSON, whatever the cookie and header.
            let (status, body) = text_or_json(resp).await;
            assert_eq!(
                (status, body["error"]["code"].as_str()),
                (
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    Some("unsupported_media_type")
                ),
                "{what} (csrf header: {csrf}): {body}"
            );
        }
    }
    let view = f.server.registry.view(&ServiceKey::named("orders"));
    assert_eq!(view.instances.len(), 2, "nothing went offline");
    // A login from a form is refused too (no login CSRF).
    let resp = f
        .http
        .post(f.url("/ui/login"))
        .form(&[("username", "ada"), ("password", "ada-password")])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert!(resp.headers().get(header::SET_COOKIE).is_none());
}

#[tokio::test]
async fn a_cookie_from_logout_no_longer_works() {
    let f = started().await;
    let ada = f.login("ada", "ada-password").await;
    let (status, body) = f.json_call(Method::GET, "/ui/session", &ada, false).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (body["auth"].as_str(), body["user"].as_str()),
        (Some("on"), Some("ada"))
    );
    assert_eq!(body["csrf"].as_str(), Some(ada.csrf.as_str()));

    // Logout is a change: without the CSRF header it is refused and the session lives on.
    let (status, body) = f.json_call(Method::POST, "/ui/logout", &ada, false).await;
    assert_eq!((status, rule(&body)), (StatusCode::FORBIDDEN, "csrf"));
    assert_eq!(
        f.json_call(Method::GET, "/v1/services", &ada, false)
            .await
            .0,
        StatusCode::OK
    );
    let resp = f.logout(&ada).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let cleared = resp.headers()[header::SET_COOKIE]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(cleared.contains("Max-Age=0"), "{cleared}");

    let (status, body) = f.json_call(Method::GET, "/v1/services", &ada, false).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    let (status, _) = f
        .json_call(
            Method::POST,
            "/v1/services/orders/instances/10.0.0.1:1/offline",
            &ada,
            true,
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (_, body) = f.json_call(Method::GET, "/ui/session", &ada, false).await;
    assert_eq!(
        (body["user"].clone(), body["csrf"].clone()),
        (Value::Null, Value::Null)
    );
    assert_eq!(
        f.json_call(Method::GET, "/ui/events", &ada, false).await.0,
        StatusCode::UNAUTHORIZED
    );
}

#[tokio::test]
async fn a_read_users_drain_is_refused_with_403() {
    let f = serving_two().await;
    let rita = f.login("rita", "rita-password").await;
    let (status, body) = f.json_call(Method::GET, "/v1/services", &rita, false).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = f
        .json_call(
            Method::POST,
            "/v1/services/orders/instances/10.0.0.1:1/drain",
            &rita,
            true,
        )
        .await;
    assert_eq!(
        (status, rule(&body)),
        (StatusCode::FORBIDDEN, "instance"),
        "{body}"
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("rita holds read"),
        "{body}"
    );
    let view = f.server.registry.view(&ServiceKey::named("orders"));
    assert_eq!(view.instances.len(), 2, "nothing was drained");
}

#[tokio::test]
async fn login_sets_a_strict_http_only_cookie_and_wrong_passwords_get_none() {
    let f = started().await;
    let (status, body, set_cookie) = f.login_raw("ada", "ada-password").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let set_cookie = set_cookie.unwrap();
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=28800"] {
        assert!(
            set_cookie.split("; ").any(|a| a == attribute),
            "{attribute} missing: {set_cookie}"
        );
    }
    let id = set_cookie
        .split(';')
        .next()
        .unwrap()
        .split_once('=')
        .unwrap()
        .1;
    assert!(id.len() >= 43, "256 random bits: {id}");
    assert_eq!(body["user"], "ada");
    assert_eq!(
        body["grants"],
        json!([{"namespace": "public", "role": "admin"}])
    );
    assert_ne!(
        body["csrf"].as_str().unwrap(),
        id,
        "the CSRF token is not the cookie"
    );

    let wrong = f.login_raw("ada", "not-her-password").await;
    let unknown = f.login_raw("nobody", "whatever").await;
    for (status, body, cookie) in [&wrong, &unknown] {
        assert_eq!(*status, StatusCode::UNAUTHORIZED, "{body}");
        assert!(cookie.is_none());
    }
    assert_eq!(
        wrong.1["error"]["message"], unknown.1["error"]["message"],
        "one answer for both"
    );
    let resp = f
        .http
        .post(f.url("/ui/login"))
        .json(&json!({"username": "ada"}))
        .send()
        .await
        .unwrap();
    let (status, body) = text_or_json(resp).await;
    assert_eq!(
        (status, body["error"]["field"].as_str()),
        (StatusCode::BAD_REQUEST, Some("body"))
    );
}

#[tokio::test]
async fn the_page_is_served_compiled_in_with_its_content_types_a_csp_and_no_cors() {
    let f = started().await;
    for (path, content_type, needle) in [
        (
            "/ui",
            "text/html; charset=utf-8",
            "<title>gangway console</title>",
        ),
        ("/ui/", "text/html; charset=utf-8", "/ui/app.js"),
        (
            "/ui/app.js",
            "text/javascript; charset=utf-8",
            "X-CSRF-Token",
        ),
        ("/ui/app.css", "text/css; charset=utf-8", ".drain"),
    ] {
        let resp = f
            .http
            .get(f.url(path))
            .header(header::ORIGIN, "https://evil.example")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{path}");
        let h = resp.headers().clone();
        assert_eq!(h[header::CONTENT_TYPE], content_type, "{path}");
        let csp = h[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
        for directive in [
            "default-src 'none'",
            "script-src 'self'",
            "frame-ancestors 'none'",
        ] {
            assert!(csp.contains(directive), "{path}: {csp}");
        }
        assert_eq!(h[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        assert!(
            !h.contains_key(header::ACCESS_CONTROL_ALLOW_ORIGIN),
            "{path}"
        );
        assert!(resp.text().await.unwrap().contains(needle), "{path}");
    }
    // A preflight from another site is never granted.
    let resp = f
        .http
        .request(
            Method::OPTIONS,
            f.url("/v1/services/orders/instances/10.0.0.1:1/drain"),
        )
        .header(header::ORIGIN, "https://evil.example")
        .header(header::ACCESS_CONTROL_REQUEST_METHOD, "POST")
        .header(
            header::ACCESS_CONTROL_REQUEST_HEADERS,
            "x-csrf-token, content-type",
        )
        .send()
        .await
        .unwrap();
    assert!(!resp.status().is_success(), "{}", resp.status());
    assert!(
        !resp
            .headers()
            .contains_key(header::ACCESS_CONTROL_ALLOW_ORIGIN)
    );
    assert!(
        !resp
            .headers()
            .contains_key(header::ACCESS_CONTROL_ALLOW_HEADERS)
    );
}

#[tokio::test]
async fn with_auth_off_the_console_needs_no_login() {
    let server = gangway_server::start_in_memory(Config::for_tests())
        .await
        .unwrap();
    let http = reqwest::Client::new();
    let url = |p: &str| format!("http://{}{p}", server.http_addr);
    let (_, session) = text_or_json(http.get(url("/ui/session")).send().await.unwrap()).await;
    assert_eq!(session["auth"], "off");
    assert_eq!(session["user"], Value::Null);
    let resp = http
        .post(url("/ui/login"))
        .json(&json!({"username": "a", "password": "b"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::CONFLICT);
    // The API's own browser rules still hold: JSON changes pass, forms do not.
    for port in [1, 2] {
        let resp = http
            .post(url("/v1/services/orders/instances"))
            .json(&json!({"ip": "10.0.0.1", "port": port}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
    }
    let drain = url("/v1/services/orders/instances/10.0.0.1:1/drain");
    let form = http
        .post(&drain)
        .form(&[("force", "true")])
        .send()
        .await
        .unwrap();
    assert_eq!(form.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let (_, report) = text_or_json(http.post(&drain).json(&json!({})).send().await.unwrap()).await;
    assert_eq!(report["complete"], true, "{report}");
    let resp = http.get(url("/ui/events")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()[header::CONTENT_TYPE], "text/event-stream");
}

/// An SSE body read event by event.
struct Events {
    body: futures::stream::BoxStream<'static, reqwest::Result<axum::body::Bytes>>,
    text: String,
}

impl Events {
    fn new(resp: reqwest::Response) -> Self {
        Self {
            body: resp.bytes_stream().boxed(),
            text: String::new(),
        }
    }

    /// The data of the next event named `change` (within 10 s).
    async fn next_change(&mut self) -> Value {
        let read = async {
            loop {
                while let Some(end) = self.text.find("\n\n") {
                    let block: String = self.text.drain(..end + 2).collect();
                    if block.lines().any(|l| l == "event: change") {
                        let data = block
                            .lines()
                            .find_map(|l| l.strip_prefix("data: "))
                            .unwrap();
                        return serde_json::from_str(data).unwrap();
                    }
                }
                let chunk = self.body.next().await.expect("stream open").unwrap();
                self.text.push_str(std::str::from_utf8(&chunk).unwrap());
            }
        };
        tokio::time::timeout(Duration::from_secs(10), read)
            .await
            .expect("a change event arrived")
    }
}

#[tokio::test]
async fn the_event_stream_says_when_something_changed_and_needs_credentials() {
    let f = started().await;
    let resp = f.http.get(f.url("/ui/events")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    let ada = f.login("ada", "ada-password").await;
    let resp = f
        .request(Method::GET, "/ui/events", &ada, false)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()[header::CONTENT_TYPE], "text/event-stream");
    let mut events = Events::new(resp);
    // The first event is the reading at the start; each registration is a newer revision.
    let mut last = events.next_change().await["revision"].as_u64().unwrap();
    for port in 1..=3 {
        f.register(port).await;
        let now = events.next_change().await["revision"].as_u64().unwrap();
        assert!(now > last, "a newer revision: {now} after {last}");
        last = now;
    }
    // Logging out ends the stream.
    let resp = f.logout(&ada).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(chunk) = events.body.next().await {
            chunk.unwrap();
        }
    })
    .await;
    assert!(ended.is_ok(), "the stream ended with its session");
}
