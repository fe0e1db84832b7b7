//! `gangway server --auth FILE` as a real process on 127.0.0.1 (docs/security.md): SIGHUP
//! reloads the file (a removed token stops working; a file that does not parse keeps the old
//! one and is one log line), and no password or token reaches the log, even at debug level.

mod cluster;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cluster::{Proc, Server, gangway_auth as auth};
use gangway_client::{Client, ClientConfig};
use gangway_core::model::{InstanceKey, ServiceKey};
use nix::sys::signal::Signal;
use reqwest::StatusCode;
use serde_json::{Value, json};

/// How long a SIGHUP may take to show.
const RELOAD: Duration = Duration::from_secs(10);

fn token_id(token: &str) -> &str {
    token.split('_').nth(1).expect("gwt_<id>_<secret>")
}

async fn status_with(server: &Server, token: &str) -> StatusCode {
    reqwest::Client::new()
        .get(server.url("/v1/services"))
        .bearer_auth(token)
        .send()
        .await
        .expect("GET /v1/services")
        .status()
}

fn lines_with(log: &Mutex<Vec<String>>, needle: &str) -> Vec<String> {
    log.lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains(needle))
        .cloned()
        .collect()
}

async fn logged(log: &Arc<Mutex<Vec<String>>>, needle: &str, count: usize) {
    let found = gangway_testkit::poll(RELOAD, || async {
        (lines_with(log, needle).len() >= count).then_some(())
    })
    .await;
    assert!(
        found.is_some(),
        "no {count} log lines with {needle:?}: {:?}",
        log.lock().unwrap()
    );
}

#[tokio::test]
async fn sighup_reloads_the_file_and_a_bad_file_keeps_the_old_one_in_one_log_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("auth.toml");
    let kept = auth(&file, &["token", "create", "--role", "read"], "");
    let removed = auth(&file, &["token", "create", "--role", "read"], "");
    let (server, log) = Server::start_logged(
        dir.path(),
        &["--auth", file.to_str().unwrap(), "--log", "info"],
    )
    .await;
    assert_eq!(status_with(&server, &kept).await, StatusCode::OK);
    assert_eq!(status_with(&server, &removed).await, StatusCode::OK);

    auth(&file, &["token", "remove", token_id(&removed)], "");
    server.proc.signal(Signal::SIGHUP);
    let refused = gangway_testkit::poll(RELOAD, || async {
        (status_with(&server, &removed).await == StatusCode::UNAUTHORIZED).then_some(())
    })
    .await;
    assert!(
        refused.is_some(),
        "the removed token still works after SIGHUP"
    );
    assert_eq!(status_with(&server, &kept).await, StatusCode::OK);
    logged(&log, "SIGHUP: auth file reloaded", 1).await;

    // A file that does not parse: the old contents stay, and the log says so in one line.
    std::fs::write(&file, "[[tokens]]\nid = broken-value\n").unwrap();
    let before = log.lock().unwrap().len();
    server.proc.signal(Signal::SIGHUP);
    logged(&log, "auth file not reloaded", 1).await;
    assert_eq!(status_with(&server, &kept).await, StatusCode::OK);
    assert_eq!(
        status_with(&server, &removed).await,
        StatusCode::UNAUTHORIZED
    );
    let after: Vec<String> = log.lock().unwrap()[before..].to_vec();
    assert_eq!(
        after.len(),
        1,
        "one log line for the failed reload: {after:#?}"
    );
    assert!(after[0].contains("line 2"), "{}", after[0]);
    assert!(
        !after[0].contains("broken"),
        "the file's text is not echoed: {}",
        after[0]
    );
}

#[tokio::test]
async fn no_password_or_token_reaches_the_debug_log() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("auth.toml");
    let password = "Pw-of-alice-7c1e9b";
    let wrong = "Wrong-pw-of-alice-52d0";
    auth(
        &file,
        &["user", "add", "alice", "--role", "write"],
        &format!("{password}\n"),
    );
    let token = auth(&file, &["token", "create", "--role", "admin"], "");
    let (server, log) = Server::start_logged(
        dir.path(),
        &["--auth", file.to_str().unwrap(), "--log", "debug"],
    )
    .await;
    let http = reqwest::Client::new();
    let instance = json!({"ip": "10.0.0.1", "port": 80});
    // REST: Basic (right and wrong password), Bearer (right and changed).
    let r = http
        .post(server.url("/v1/services/orders/instances"))
        .basic_auth("alice", Some(password))
        .json(&instance)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let r = http
        .get(server.url("/v1/services"))
        .basic_auth("alice", Some(wrong))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(status_with(&server, &token).await, StatusCode::OK);
    let changed = format!("{}x", &token[..token.len() - 1]);
    assert_eq!(
        status_with(&server, &changed).await,
        StatusCode::UNAUTHORIZED
    );
    // Nacos: the login (form and query), its accessToken in a query, a form and a header.
    let r = http
        .post(server.url("/nacos/v1/auth/login"))
        .form(&[("username", "alice"), ("password", wrong)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let login: Value = http
        .post(server.url(&format!(
            "/nacos/v1/auth/users/login?username=alice&password={password}"
        )))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let session = login["accessToken"]
        .as_str()
        .expect("accessToken")
        .to_owned();
    let r = http
        .get(server.url(&format!(
            "/nacos/v1/ns/instance/list?serviceName=orders&accessToken={session}"
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let r = http
        .post(server.url("/nacos/v1/ns/instance"))
        .form(&[
            ("serviceName", "orders"),
            ("ip", "10.0.0.2"),
            ("port", "80"),
            ("accessToken", session.as_str()),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let r = http
        .get(server.url("/nacos/v1/ns/service/list?pageNo=1&pageSize=10"))
        .header("accessToken", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    // Native gRPC: the token in the session's metadata, and a refused one.
    let client = Client::connect(
        ClientConfig::new(format!("http://{}", server.grpc)).with_token(token.clone()),
    )
    .await
    .expect("client with a token");
    client
        .register(
            ServiceKey::named("orders"),
            InstanceKey::new("10.0.0.3", 80, ""),
            1.0,
            BTreeMap::new(),
        )
        .await
        .expect("register over gRPC");
    drop(client);
    let mut refused =
        ClientConfig::new(format!("http://{}", server.grpc)).with_token(changed.clone());
    refused.request_timeout = Duration::from_secs(1);
    assert!(Client::connect(refused).await.is_err());

    // Something was logged at debug level, and no secret in it.
    let lines = log.lock().unwrap().clone();
    assert!(
        lines.iter().any(|l| l.contains("DEBUG")),
        "no debug line logged: {lines:#?}"
    );
    let secret_of = |t: &str| t.rsplit('_').next().unwrap().to_owned();
    for (what, secret) in [
        ("password", password.to_owned()),
        ("wrong password", wrong.to_owned()),
        ("API token", token.clone()),
        ("API token's secret", secret_of(&token)),
        ("changed token's secret", secret_of(&changed)),
        ("login token", session.clone()),
        (
            "login token's secret",
            session.trim_start_matches("gws_").to_owned(),
        ),
    ] {
        let hits: Vec<&String> = lines.iter().filter(|l| l.contains(&secret)).collect();
        assert!(hits.is_empty(), "the {what} is in the log: {hits:#?}");
    }
    eprintln!(
        "{} log lines at debug level, none with any of the 7 secrets",
        lines.len()
    );
}

#[tokio::test]
async fn session_commands_send_the_token_and_are_refused_without_one() {
    // `gangway demo-service` (and `run`, `proxy`, `demo-client`) registers over the native
    // session: with `--token` its instance is listed, without one the process stops with the
    // registry's refusal instead of retrying.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("auth.toml");
    let write = auth(&file, &["token", "create", "--role", "write"], "");
    let server = Server::start(
        dir.path(),
        "127.0.0.1:0",
        "127.0.0.1:0",
        &["--auth", file.to_str().unwrap()],
    )
    .await;
    let service = cluster::DemoService::start_with(&server.grpc, "a", &["--token", &write]).await;
    let listed = gangway_testkit::poll(RELOAD, || async {
        let body: Value = reqwest::Client::new()
            .get(server.url("/v1/services/demo/instances"))
            .bearer_auth(&write)
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        let addresses = cluster::addresses(&body);
        (addresses.len() == 1).then_some(addresses)
    })
    .await;
    assert_eq!(
        listed.as_deref().map(|a| a[0].as_str()),
        Some(service.addr.as_str()),
        "the instance of demo-service --token is listed"
    );

    let mut refused = Proc::spawn(&[
        "demo-service",
        "--registry",
        &server.grpc,
        "--service",
        "demo",
        "--name",
        "b",
    ]);
    let status = refused.wait(RELOAD).await;
    let line = refused.stderr_line_containing("refused").await;
    println!("demo-service without a token: {status}, {line}");
    assert!(!status.success());
    assert!(line.contains("unauthenticated"), "{line}");
}

/// A Nacos login's `accessToken`.
async fn nacos_token(server: &Server, user: &str, password: &str) -> String {
    let body: Value = reqwest::Client::new()
        .post(server.url("/nacos/v1/auth/login"))
        .form(&[("username", user), ("password", password)])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    body["accessToken"].as_str().expect("a token").to_owned()
}

#[tokio::test]
async fn a_new_password_ends_the_old_login_tokens_at_sighup_and_a_restart_ends_them_all() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("auth.toml");
    let grant = ["--role", "read"];
    auth(
        &file,
        &[&["user", "add", "alice"][..], &grant].concat(),
        "old-pw\n",
    );
    auth(
        &file,
        &[&["user", "add", "bob"][..], &grant].concat(),
        "bob-pw\n",
    );
    let args = ["--auth", file.to_str().unwrap(), "--log", "info"];
    let (server, log) = Server::start_logged(dir.path(), &args).await;
    let alice_old = nacos_token(&server, "alice", "old-pw").await;
    let bob = nacos_token(&server, "bob", "bob-pw").await;
    assert_eq!(status_with(&server, &alice_old).await, StatusCode::OK);

    // A new password: `user remove` then `user add`; SIGHUP loads it.
    auth(&file, &["user", "remove", "alice"], "");
    auth(
        &file,
        &[&["user", "add", "alice"][..], &grant].concat(),
        "new-pw\n",
    );
    server.proc.signal(Signal::SIGHUP);
    logged(&log, "SIGHUP: auth file reloaded", 1).await;
    assert_eq!(
        status_with(&server, &alice_old).await,
        StatusCode::UNAUTHORIZED,
        "a login token made with the old password"
    );
    assert_eq!(status_with(&server, &bob).await, StatusCode::OK);
    let alice_new = nacos_token(&server, "alice", "new-pw").await;
    assert_eq!(status_with(&server, &alice_new).await, StatusCode::OK);

    // Login tokens live in the process: after a restart none works, the passwords do.
    let mut server = server;
    server.proc.signal(Signal::SIGTERM);
    assert!(server.proc.wait(Duration::from_secs(10)).await.success());
    let (server, _log) = Server::start_logged(dir.path(), &args).await;
    for token in [&alice_new, &bob] {
        assert_eq!(status_with(&server, token).await, StatusCode::UNAUTHORIZED);
    }
    let again = nacos_token(&server, "alice", "new-pw").await;
    assert_eq!(status_with(&server, &again).await, StatusCode::OK);
}
