//! A fake registry for the CLI's process tests: an axum server on 127.0.0.1:0 that answers
//! canned JSON (shaped as docs/api-draft.md says) and records every request it gets.

use std::net::SocketAddr;
use std::process::Output;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::{Body, to_bytes};
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::Response;

pub mod running;

/// One canned answer: for `method` on `path` (without the query), `status` and `body`.
///
/// The first route that matches and is not used up answers; [`Canned::times`] limits how often
/// a route answers, so a list can script a sequence (200, then 404, then 200 ...).
#[derive(Clone)]
pub struct Canned {
    pub method: &'static str,
    pub path: &'static str,
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
    /// How many requests this route answers; `None`: all of them.
    pub times: Option<usize>,
}

impl Canned {
    /// Answer only the next `n` matching requests, then let later routes answer.
    pub fn times(mut self, n: usize) -> Self {
        self.times = Some(n);
        self
    }
}

/// A request as the fake received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    /// Path and query, as sent (still percent-encoded).
    pub uri: String,
    pub body: String,
}

#[derive(Clone)]
struct Shared {
    routes: Arc<Vec<Canned>>,
    /// How many requests each route answered.
    used: Arc<Mutex<Vec<usize>>>,
    log: Arc<Mutex<Vec<Recorded>>>,
}

/// A running fake registry; stops when dropped with the test's runtime.
pub struct Fake {
    pub addr: SocketAddr,
    log: Arc<Mutex<Vec<Recorded>>>,
}

/// A JSON answer.
pub fn json(
    method: &'static str,
    path: &'static str,
    status: u16,
    body: serde_json::Value,
) -> Canned {
    Canned {
        method,
        path,
        status,
        content_type: "application/json",
        body: body.to_string(),
        times: None,
    }
}

/// A plain-text answer (what a server other than gangway might send).
pub fn text(method: &'static str, path: &'static str, status: u16, body: &str) -> Canned {
    Canned {
        method,
        path,
        status,
        content_type: "text/plain; charset=utf-8",
        body: body.to_owned(),
        times: None,
    }
}

/// An error answer with the spec's body.
pub fn error(
    method: &'static str,
    path: &'static str,
    status: u16,
    code: &str,
    message: &str,
    field: Option<&str>,
) -> Canned {
    json(
        method,
        path,
        status,
        serde_json::json!({"error": {"code": code, "message": message, "field": field}}),
    )
}

/// A Server-Sent Events answer carrying `snapshots` as `snapshot` events, then closing.
pub fn sse(path: &'static str, snapshots: &[serde_json::Value]) -> Canned {
    let mut body = String::from(": hello\n\n");
    for s in snapshots {
        body.push_str(&format!("event: snapshot\ndata: {s}\n\n"));
    }
    Canned {
        method: "GET",
        path,
        status: 200,
        content_type: "text/event-stream",
        body,
        times: None,
    }
}

impl Fake {
    /// Starts serving `routes`; unknown routes get 404 with a spec-shaped body.
    pub async fn start(routes: Vec<Canned>) -> Fake {
        let log = Arc::new(Mutex::new(Vec::new()));
        let shared = Shared {
            used: Arc::new(Mutex::new(vec![0; routes.len()])),
            routes: Arc::new(routes),
            log: log.clone(),
        };
        let app = Router::new().fallback(handle).with_state(shared);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Fake { addr, log }
    }

    /// Requests received so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.log.lock().unwrap().clone()
    }

    /// Runs `gangway --server <fake> ARGS...` to completion.
    pub async fn run(&self, args: &[&str]) -> Output {
        gangway(&self.addr.to_string(), args).await
    }

    /// [`Fake::run`] with these environment variables set.
    pub async fn run_with_env(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        gangway_with_env(&self.addr.to_string(), args, env).await
    }
}

/// Runs the real binary against `server` with a clean environment for its own variables.
pub async fn gangway(server: &str, args: &[&str]) -> Output {
    gangway_with_env(server, args, &[]).await
}

/// [`gangway`] with `env` set on top of the cleaned environment.
pub async fn gangway_with_env(server: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_gangway"));
    command.arg("--server").arg(server).args(args);
    for var in [
        "GANGWAY_SERVER",
        "GANGWAY_NAMESPACE",
        "GANGWAY_GROUP",
        "GANGWAY_SERVICE",
        "GANGWAY_IP",
        "GANGWAY_PORT",
        "GANGWAY_CLUSTER",
        "RUST_LOG",
    ] {
        command.env_remove(var);
    }
    command
        .envs(env.iter().copied())
        .kill_on_drop(true)
        .output()
        .await
        .expect("run gangway")
}

async fn handle(State(shared): State<Shared>, req: Request) -> Response {
    let method = req.method().to_string();
    let uri = req
        .uri()
        .path_and_query()
        .map(|p| p.to_string())
        .unwrap_or_default();
    let path = req.uri().path().to_owned();
    let body = to_bytes(req.into_body(), usize::MAX)
        .await
        .unwrap_or_default();
    shared.log.lock().unwrap().push(Recorded {
        method: method.clone(),
        uri,
        body: String::from_utf8_lossy(&body).into_owned(),
    });
    let canned = {
        let mut used = shared.used.lock().unwrap();
        let found = shared.routes.iter().enumerate().find(|(i, c)| {
            c.method == method && c.path == path && c.times.is_none_or(|n| used[*i] < n)
        });
        found.map(|(i, c)| {
            used[i] += 1;
            c
        })
    };
    let (status, content_type, body) = match canned {
        Some(c) => (c.status, c.content_type, c.body.clone()),
        None => (
            404,
            "application/json",
            serde_json::json!({"error": {"code": "not_found", "message": format!("no route {method} {path}"), "field": null}})
                .to_string(),
        ),
    };
    Response::builder()
        .status(StatusCode::from_u16(status).unwrap())
        .header(header::CONTENT_TYPE, content_type)
        .body(Body::from(body))
        .unwrap()
}
