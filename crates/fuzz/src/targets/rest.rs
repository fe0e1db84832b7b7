//! The HTTP port in process: the REST router merged with the Nacos HTTP routes, as `start`
//! serves them, driven with `tower::ServiceExt::oneshot` (no sockets).
//!
//! REST inputs: every route (the mutating ones most), a path with mutated segments, a query
//! string from valid `Scope` pairs mutated, and a JSON body from a valid one mutated (or random
//! bytes, or another content type). Nacos inputs: every v1/v3 route with its parameters in the
//! query, a form body, or both. A refusal must be the protocol's error shape (REST
//! `{"error": {"code", "message"}}`; Nacos v1 `caused: ...;` or v3 `{code, message, data}`)
//! and must leave the registry's digest as it was.

use std::net::SocketAddr;
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use futures::FutureExt;
use gangway_server::Registry;
use http::{Method, Request, header};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::{
    ANSWER_TIMEOUT, Case, Gen, Options, Outcome, Report, Runner, Target, digest, panics, registry,
    retire,
};

const SERVICES: &[&str] = &["orders", "pay"];
const ADDRS: &[&str] = &["127.0.0.1:8080", "127.0.0.2:8080", "[::1]:9000"];
const SCOPE: &[&str] = &[
    "namespace",
    "group",
    "cluster",
    "all",
    "subscriber",
    "force",
];
const NACOS_PARAMS: &[&str] = &[
    "serviceName",
    "groupName",
    "namespaceId",
    "ip",
    "port",
    "clusterName",
    "weight",
    "enabled",
    "healthy",
    "ephemeral",
    "metadata",
    "beat",
    "udpPort",
    "clientIP",
    "clusters",
    "healthyOnly",
    "pageNo",
    "pageSize",
    "protectThreshold",
    "selector",
    "accessToken",
    "username",
    "password",
    "app",
];

struct Http {
    router: Router,
    registry: Registry,
    born: Instant,
}

fn http() -> Http {
    let (registry, prom) = registry();
    let nacos = gangway_server::nacos::Nacos::new(registry.clone());
    let router = gangway_server::http::router(registry.clone(), prom)
        .merge(gangway_server::nacos::http::router(nacos))
        .layer(MockConnectInfo(SocketAddr::from(([127, 0, 0, 1], 40_000))));
    Http {
        router,
        registry,
        born: Instant::now(),
    }
}

/// One HTTP request as generated.
struct Input {
    method: Method,
    path: String,
    query: String,
    content_type: Option<&'static str>,
    body: Vec<u8>,
}

impl Input {
    fn case(&self) -> Case {
        Case {
            description: format!(
                "{} {}?{}\ncontent-type: {:?}\nbody: {:?}",
                self.method,
                self.path,
                self.query,
                self.content_type,
                String::from_utf8_lossy(&self.body)
            ),
            raw: self.body.clone(),
        }
    }
}

/// Runs the REST target (`nacos` false) or the Nacos HTTP target.
///
/// Errors: none so far (the signature leaves room for setup that can fail).
pub async fn run(options: &Options, nacos: bool) -> anyhow::Result<Report> {
    let target = if nacos {
        Target::NacosHttp
    } else {
        Target::Rest
    };
    let mut g = Gen::new(options.seed);
    let mut runner = Runner::new(target, options);
    let mut app = http();
    while runner.more() {
        if runner.reset_due(app.born) {
            retire(&app.registry).await;
            app = http();
        }
        let input = if nacos {
            nacos_input(&mut g)
        } else {
            rest_input(&mut g)
        };
        let before = panics();
        let outcome = one(&app, &input, nacos).await;
        if matches!(outcome, Outcome::TimedOut) {
            retire(&app.registry).await;
            app = http();
        }
        runner.record(&input.case(), outcome, before);
    }
    Ok(runner.finish())
}

async fn one(app: &Http, input: &Input, nacos: bool) -> Outcome {
    let uri = if input.query.is_empty() {
        input.path.clone()
    } else {
        format!("{}?{}", input.path, input.query)
    };
    let mut request = Request::builder().method(input.method.clone()).uri(&uri);
    if let Some(ct) = input.content_type {
        request = request.header(header::CONTENT_TYPE, ct);
    }
    let Ok(request) = request.body(Body::from(input.body.clone())) else {
        // Not a valid URI: hyper would refuse it before any handler; nothing to test.
        return Outcome::Rejected;
    };
    let before = digest(&app.registry);
    let call = async {
        let response = app
            .router
            .clone()
            .oneshot(request)
            .await
            .expect("infallible");
        let status = response.status();
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let body = response.into_body().collect().await.map(|b| b.to_bytes());
        (status, content_type, body)
    };
    let answer = tokio::time::timeout(
        ANSWER_TIMEOUT,
        std::panic::AssertUnwindSafe(call).catch_unwind(),
    )
    .await;
    let (status, content_type, body) = match answer {
        Err(_) => return Outcome::TimedOut,
        Ok(Err(_)) => return Outcome::Broken("the handler panicked".into()),
        Ok(Ok(a)) => a,
    };
    let Ok(body) = body else {
        return Outcome::Broken(format!("{status}: the body could not be read"));
    };
    if status.is_success() {
        return Outcome::Accepted;
    }
    if !status.is_client_error() && !status.is_server_error() {
        return Outcome::Broken(format!("status {status} is neither a success nor an error"));
    }
    let text = String::from_utf8_lossy(&body);
    let shape = if nacos {
        nacos_error_shape(&content_type, &text)
    } else {
        rest_error_shape(&text)
    };
    if let Err(why) = shape {
        return Outcome::Broken(format!("{status}: {why}: {text}"));
    }
    let after = digest(&app.registry);
    if before != after {
        return Outcome::Broken(format!(
            "{status} ({text}) but the registry changed:\nbefore:\n{before}after:\n{after}"
        ));
    }
    Outcome::Rejected
}

/// `{"error": {"code": "...", "message": "..."}}`, with `field` a string when present.
fn rest_error_shape(text: &str) -> Result<(), String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON ({e})"))?;
    let e = v.get("error").ok_or("no \"error\" object")?;
    let code = e
        .get("code")
        .and_then(Value::as_str)
        .ok_or("no error.code")?;
    if code.is_empty() {
        return Err("empty error.code".into());
    }
    e.get("message")
        .and_then(Value::as_str)
        .ok_or("no error.message")?;
    if e.get("field")
        .is_some_and(|f| !f.is_string() && !f.is_null())
    {
        return Err("error.field is not a string".into());
    }
    Ok(())
}

/// Nacos v1 `caused: <message>;` as text, or the v3 envelope `{code, message, data: null}`.
fn nacos_error_shape(content_type: &str, text: &str) -> Result<(), String> {
    if content_type.starts_with("application/json") {
        let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON ({e})"))?;
        v.get("code")
            .and_then(Value::as_u64)
            .ok_or("no numeric code")?;
        v.get("message")
            .and_then(Value::as_str)
            .ok_or("no message")?;
        if !v.get("data").is_some_and(Value::is_null) {
            return Err("data is not null".into());
        }
        return Ok(());
    }
    if text.starts_with("caused: ") && text.ends_with(';') {
        Ok(())
    } else {
        Err("neither `caused: ...;` nor the v3 envelope".into())
    }
}

/// A mutated path segment: mostly valid, sometimes odd (percent-encoded).
fn segment(g: &mut Gen, valid: &[&str]) -> String {
    if g.chance(0.85) {
        let v = *g.pick(valid);
        g.segment(v)
    } else {
        let s = g.string();
        g.segment(&s)
    }
}

fn rest_input(g: &mut Gen) -> Input {
    let service = segment(g, SERVICES);
    let addr = segment(g, ADDRS);
    let base = format!("/v1/services/{service}");
    let inst = format!("{base}/instances/{addr}");
    let (ip, port) = g
        .pick(&[("127.0.0.1", 8080), ("127.0.0.2", 8080), ("::1", 9000)])
        .to_owned();
    // (method, path, valid body)
    let routes: Vec<(Method, String, Option<Value>)> = vec![
        (
            Method::POST,
            format!("{base}/instances"),
            Some(json!({
                "ip": ip, "port": port, "cluster": "DEFAULT", "weight": 1.0,
                "metadata": {"zone": "a", "preserved.heart.beat.timeout": "15000"},
                "ephemeral": true, "enabled": true, "ttl_ms": 15000, "delete_timeout_ms": 30000,
            })),
        ),
        (
            Method::POST,
            format!("{base}/instances"),
            Some(json!({
                "ip": ip, "port": port, "ephemeral": false,
                "probe": {"kind": "tcp", "interval_ms": 1000, "fall": 2, "rise": 2},
            })),
        ),
        (
            Method::PUT,
            base.clone(),
            Some(json!({"protect_threshold": 0.5, "metadata": {"owner": "team"}})),
        ),
        (
            Method::PATCH,
            inst.clone(),
            Some(
                json!({"weight": 2.0, "metadata": {"zone": "b"}, "enabled": false, "force": false}),
            ),
        ),
        (Method::DELETE, inst.clone(), None),
        (Method::PUT, format!("{inst}/heartbeat"), None),
        (
            Method::POST,
            format!("{inst}/offline"),
            Some(json!({"force": false})),
        ),
        (
            Method::POST,
            format!("{inst}/online"),
            Some(json!({"wait": true, "timeout_ms": 20})),
        ),
        (
            Method::POST,
            format!("{inst}/drain"),
            Some(json!({"timeout_ms": 20, "force": true})),
        ),
        (Method::GET, "/v1/services".into(), None),
        (Method::GET, base.clone(), None),
        (Method::GET, format!("{base}/instances"), None),
        (Method::GET, format!("{base}/subscribers"), None),
        (Method::GET, "/v1/health".into(), None),
    ];
    let (mut method, path, valid) = routes[g.below(routes.len())].clone();
    if g.chance(0.03) {
        method = g
            .pick(&[
                Method::GET,
                Method::POST,
                Method::PUT,
                Method::PATCH,
                Method::DELETE,
                Method::OPTIONS,
            ])
            .clone();
    }
    let mut pairs: Vec<(String, String)> = Vec::new();
    if g.chance(0.5) {
        let n = g.below(3);
        for _ in 0..n {
            let k = (*g.pick(SCOPE)).to_owned();
            let v = match k.as_str() {
                "namespace" => "public",
                "group" => "DEFAULT_GROUP",
                "cluster" => "DEFAULT",
                "all" | "force" => "true",
                _ => "poller-1",
            };
            pairs.push((k, v.to_owned()));
        }
    }
    if g.chance(0.4) {
        g.mutate_pairs(&mut pairs, SCOPE);
    }
    let query = g.encode_pairs(&pairs);
    let (content_type, body) = body(g, valid);
    Input {
        method,
        path,
        query,
        content_type,
        body,
    }
}

/// A body from `valid`: as is, structurally mutated, byte-mutated, or random bytes; mostly as
/// JSON, sometimes with another or no content type.
fn body(g: &mut Gen, valid: Option<Value>) -> (Option<&'static str>, Vec<u8>) {
    let content_type = if g.chance(0.92) {
        Some("application/json")
    } else {
        *g.pick(&[
            None,
            Some("text/plain"),
            Some("application/json; charset=utf-8"),
            Some("application/x-www-form-urlencoded"),
        ])
    };
    let mut value = valid.unwrap_or_else(|| json!({}));
    let body = match g.below(10) {
        0 => Vec::new(),
        1 => g.bytes(256),
        2 | 3 => {
            let mut b = serde_json::to_vec(&value).unwrap_or_default();
            g.mutate_bytes(&mut b);
            b
        }
        4 => serde_json::to_vec(&value).unwrap_or_default(),
        _ => {
            g.mutate_json(&mut value);
            serde_json::to_vec(&value).unwrap_or_default()
        }
    };
    (content_type, body)
}

fn nacos_input(g: &mut Gen) -> Input {
    let routes: &[(Method, &str)] = &[
        (Method::POST, "/nacos/v1/ns/instance"),
        (Method::PUT, "/nacos/v1/ns/instance"),
        (Method::DELETE, "/nacos/v1/ns/instance"),
        (Method::GET, "/nacos/v1/ns/instance"),
        (Method::PUT, "/nacos/v1/ns/instance/beat"),
        (Method::GET, "/nacos/v1/ns/instance/list"),
        (Method::POST, "/nacos/v1/ns/service"),
        (Method::PUT, "/nacos/v1/ns/service"),
        (Method::DELETE, "/nacos/v1/ns/service"),
        (Method::GET, "/nacos/v1/ns/service"),
        (Method::GET, "/nacos/v1/ns/service/list"),
        (Method::POST, "/nacos/v3/client/ns/instance"),
        (Method::DELETE, "/nacos/v3/client/ns/instance"),
        (Method::GET, "/nacos/v3/client/ns/instance/list"),
        (Method::POST, "/nacos/v3/admin/ns/instance"),
        (Method::PUT, "/nacos/v3/admin/ns/instance"),
        (Method::DELETE, "/nacos/v3/admin/ns/instance"),
        (Method::GET, "/nacos/v3/admin/ns/instance"),
        (Method::GET, "/nacos/v3/admin/ns/instance/list"),
        (Method::POST, "/nacos/v1/auth/login"),
        (Method::GET, "/nacos/v1/cs/configs"),
    ];
    let (method, path) = routes[g.below(routes.len())].clone();
    let ip = *g.pick(&["127.0.0.1", "127.0.0.2", "::1"]);
    let service = *g.pick(&["orders", "DEFAULT_GROUP@@orders", "pay"]);
    let beat = json!({"serviceName": service, "ip": ip, "port": 8080, "cluster": "DEFAULT",
        "weight": 1.0, "metadata": {"zone": "a"}, "scheduled": true});
    let mut pairs: Vec<(String, String)> = vec![
        ("serviceName".into(), service.into()),
        ("ip".into(), ip.into()),
        ("port".into(), "8080".into()),
    ];
    let optional: [(&str, String); 14] = [
        ("groupName", "DEFAULT_GROUP".into()),
        ("namespaceId", "public".into()),
        ("clusterName", "DEFAULT".into()),
        ("weight", "1.5".into()),
        ("enabled", "true".into()),
        ("healthy", "true".into()),
        ("ephemeral", (*g.pick(&["true", "false"])).into()),
        (
            "metadata",
            json!({"zone": "a", "preserved.heart.beat.timeout": "15000"}).to_string(),
        ),
        ("beat", beat.to_string()),
        ("udpPort", "5000".into()),
        ("clusters", "DEFAULT,b".into()),
        ("healthyOnly", "false".into()),
        ("protectThreshold", "0.5".into()),
        ("pageNo", "1".into()),
    ];
    for (k, v) in optional {
        if g.chance(0.3) {
            pairs.push((k.into(), v));
        }
    }
    // A JSON-valued parameter mutated as JSON.
    if g.chance(0.3) {
        let i = g.below(pairs.len());
        if let Ok(mut v) = serde_json::from_str::<Value>(&pairs[i].1) {
            g.mutate_json(&mut v);
            pairs[i].1 = v.to_string();
        }
    }
    if g.chance(0.6) {
        g.mutate_pairs(&mut pairs, NACOS_PARAMS);
    }
    // Split between query and form body.
    let (mut query_pairs, mut form_pairs) = (Vec::new(), Vec::new());
    let mode = g.below(3);
    for p in pairs {
        if mode == 0 || (mode == 2 && g.chance(0.5)) {
            query_pairs.push(p);
        } else {
            form_pairs.push(p);
        }
    }
    let query = g.encode_pairs(&query_pairs);
    let mut body = g.encode_pairs(&form_pairs).into_bytes();
    if g.chance(0.1) {
        g.mutate_bytes(&mut body);
    }
    if g.chance(0.03) {
        body = g.bytes(256);
    }
    let content_type = if g.chance(0.9) {
        Some("application/x-www-form-urlencoded")
    } else {
        *g.pick(&[None, Some("application/json"), Some("text/plain")])
    };
    Input {
        method,
        path: path.to_owned(),
        query,
        content_type,
        body,
    }
}
