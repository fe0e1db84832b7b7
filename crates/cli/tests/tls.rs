//! `gangway server --tls-cert --tls-key [--tls-client-ca]` as a real process on 127.0.0.1, and
//! the CLI's commands against it with `https://` addresses (docs/security.md, "TLS"): a private
//! CA made by each test, `--ca`, client certificates, SIGHUP and file-change reloads seen by
//! new connections, bad files at start and on reload.

#![cfg(feature = "tls")]

mod cluster;

use std::path::Path;
use std::process::Output;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cluster::{DemoService, GANGWAY, Server};
use gangway_testkit::tls::{Leaf, Pki};
use nix::sys::signal::Signal;

/// How long a reload (SIGHUP, or the 2 s file poll) may take to show.
const RELOAD: Duration = Duration::from_secs(10);

/// Runs `gangway ARGS` with none of the CLI's variables from the test's environment.
async fn gangway(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = tokio::process::Command::new(GANGWAY);
    command.args(args).kill_on_drop(true);
    for var in [
        "GANGWAY_SERVER",
        "GANGWAY_CA",
        "GANGWAY_CLIENT_CERT",
        "GANGWAY_CLIENT_KEY",
        "GANGWAY_TOKEN",
        "RUST_LOG",
    ] {
        command.env_remove(var);
    }
    command.envs(env.iter().copied());
    command.output().await.expect("run gangway")
}

fn stdout(o: &Output) -> String {
    assert_eq!(
        o.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The one line a failed command printed on stderr, checking its exit status.
fn error_line(o: &Output, code: i32) -> String {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(code), "stderr: {err}");
    assert_eq!(err.lines().count(), 1, "one line: {err:?}");
    err.trim_end().to_owned()
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The certificate the registry presents to a new connection on its REST port, DER.
async fn served_certificate(pki: &Pki, server: &Server) -> Vec<u8> {
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(pki.ca_pem().as_bytes()).unwrap())
        .tls_info(true)
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let response = client
        .get(format!("https://{}/v1/health", server.http))
        .send()
        .await
        .expect("GET /v1/health over TLS");
    response
        .extensions()
        .get::<reqwest::tls::TlsInfo>()
        .and_then(|i| i.peer_certificate())
        .expect("the peer certificate")
        .to_vec()
}

/// Waits until the registry presents `leaf` to new connections.
async fn serves(pki: &Pki, server: &Server, leaf: &Leaf, what: &str) {
    let seen = gangway_testkit::poll(RELOAD, || async {
        (served_certificate(pki, server).await == leaf.der).then_some(())
    })
    .await;
    assert!(seen.is_some(), "{what}: the new certificate is not served");
}

fn lines_with(log: &Mutex<Vec<String>>, needle: &str) -> Vec<String> {
    let lines = log.lock().unwrap();
    lines
        .iter()
        .filter(|l| l.contains(needle))
        .cloned()
        .collect()
}

async fn logged(log: &Arc<Mutex<Vec<String>>>, needle: &str) -> Vec<String> {
    let found = gangway_testkit::poll(RELOAD, || async {
        let lines = lines_with(log, needle);
        (!lines.is_empty()).then_some(lines)
    })
    .await;
    found.unwrap_or_else(|| panic!("no log line with {needle:?}: {:?}", log.lock().unwrap()))
}

#[tokio::test]
async fn commands_reach_a_tls_registry_with_ca_and_fail_in_one_line_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new("test CA");
    let leaf = pki.server("gangway", 1).write(dir.path(), "server");
    let ca = pki.write_ca(dir.path(), "ca.pem");
    let (server, log) = Server::start_logged(
        dir.path(),
        &["--tls-cert", path(&leaf.cert), "--tls-key", path(&leaf.key)],
    )
    .await;
    let https = format!("https://{}", server.http);

    // The native gRPC client of the CLI (demo-service) registers over TLS...
    let grpc = format!("https://{}", server.grpc);
    let _provider = DemoService::start_with(&grpc, "a", &["--ca", path(&ca)]).await;
    // ...and the REST commands see it, with --ca or GANGWAY_CA.
    let listed = stdout(&gangway(&["services", "--server", &https, "--ca", path(&ca)], &[]).await);
    assert!(listed.contains("demo"), "{listed}");
    let listed = stdout(
        &gangway(
            &["list", "demo", "--server", &https],
            &[("GANGWAY_CA", path(&ca))],
        )
        .await,
    );
    assert!(listed.contains("127.0.0.1"), "{listed}");

    // Without the CA: one line that says what to pass.
    let line = error_line(&gangway(&["services", "--server", &https], &[]).await, 1);
    assert_eq!(
        line,
        format!(
            "error: TLS with the registry at {https} failed: invalid peer certificate: \
             UnknownIssuer; the registry's certificate is not trusted: pass --ca FILE (or \
             GANGWAY_CA) with the CA that signed it"
        )
    );
    println!("without --ca: {line}");
    // Plain HTTP to the TLS port: one line too, and the registry serves TLS after it.
    let plain = format!("http://{}", server.http);
    let line = error_line(&gangway(&["services", "--server", &plain], &[]).await, 1);
    println!("http:// to the TLS port: {line}");
    assert!(
        line.ends_with("(a registry that serves TLS needs https://)"),
        "{line}"
    );
    stdout(&gangway(&["services", "--server", &https, "--ca", path(&ca)], &[]).await);
    // A --ca file that holds no certificate: one line naming the flag.
    let line = error_line(
        &gangway(
            &["services", "--server", &https, "--ca", path(&leaf.key)],
            &[],
        )
        .await,
        1,
    );
    assert!(line.contains("--ca: no PEM certificate"), "{line}");
    let services: serde_json::Value = serde_json::from_str(&stdout(
        &gangway(
            &["services", "--server", &https, "--ca", path(&ca), "--json"],
            &[],
        )
        .await,
    ))
    .unwrap();
    assert!(services["services"].is_array(), "{services}");
    assert!(lines_with(&log, "panicked").is_empty());
}

#[tokio::test]
async fn with_a_client_ca_the_cli_needs_a_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new("test CA");
    let clients = Pki::new("client CA");
    let leaf = pki.server("gangway", 1).write(dir.path(), "server");
    let ca = pki.write_ca(dir.path(), "ca.pem");
    let client_ca = clients.write_ca(dir.path(), "clients.pem");
    let me = clients.client("operator", 5).write(dir.path(), "operator");
    let (server, _log) = Server::start_logged(
        dir.path(),
        &[
            "--tls-cert",
            path(&leaf.cert),
            "--tls-key",
            path(&leaf.key),
            "--tls-client-ca",
            path(&client_ca),
        ],
    )
    .await;
    let https = format!("https://{}", server.http);
    let line = error_line(
        &gangway(&["services", "--server", &https, "--ca", path(&ca)], &[]).await,
        1,
    );
    assert!(
        line.contains("pass --client-cert FILE --client-key FILE"),
        "{line}"
    );
    println!("without a client certificate: {line}");
    let with = gangway(
        &[
            "services",
            "--server",
            &https,
            "--ca",
            path(&ca),
            "--client-cert",
            path(&me.cert),
            "--client-key",
            path(&me.key),
        ],
        &[],
    )
    .await;
    stdout(&with);
    // A certificate without its key is a usage error, caught before anything is sent.
    let line = error_line(
        &gangway(
            &[
                "services",
                "--server",
                &https,
                "--client-cert",
                path(&me.cert),
            ],
            &[],
        )
        .await,
        2,
    );
    assert!(line.contains("--client-key"), "{line}");
}

#[tokio::test]
async fn sighup_and_file_changes_reload_the_certificates_and_a_bad_file_keeps_the_old_ones() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new("test CA");
    let first = pki.server("first", 1);
    let files = first.write(dir.path(), "server");
    let (server, log) = Server::start_logged(
        dir.path(),
        &[
            "--tls-cert",
            path(&files.cert),
            "--tls-key",
            path(&files.key),
            "--log",
            "info",
        ],
    )
    .await;
    assert_eq!(served_certificate(&pki, &server).await, first.der);

    // SIGHUP: the new pair is served to new connections.
    let second = pki.server("second", 2);
    second.write(dir.path(), "server");
    server.proc.signal(Signal::SIGHUP);
    logged(&log, "SIGHUP: TLS files reloaded").await;
    serves(&pki, &server, &second, "after SIGHUP").await;

    // A key that belongs to another certificate: the old pair stays, one line names the file.
    let stranger = pki.server("stranger", 3);
    std::fs::write(&files.key, &stranger.key_pem).unwrap();
    server.proc.signal(Signal::SIGHUP);
    let refused = logged(&log, "TLS files not reloaded, the old ones stay").await;
    let expected = format!(
        "--tls-key {}: does not match the first certificate of {}",
        files.key.display(),
        files.cert.display()
    );
    assert!(refused.iter().all(|l| l.contains(&expected)), "{refused:?}");
    assert_eq!(served_certificate(&pki, &server).await, second.der);
    println!("bad key on reload: {}", refused[0]);

    // A file change without a signal: the poll picks it up.
    let third = pki.server("third", 4);
    third.write(dir.path(), "server");
    serves(&pki, &server, &third, "after the files changed").await;
    logged(&log, "TLS files changed: TLS files reloaded").await;
    assert!(lines_with(&log, "panicked").is_empty());
}

#[tokio::test]
async fn bad_tls_files_at_start_stop_the_server_with_one_line_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new("test CA");
    let good = pki.server("good", 1).write(dir.path(), "good");
    let other = pki.server("other", 2).write(dir.path(), "other");
    let missing = dir.path().join("missing.pem");
    let data = dir.path().join("data");
    for (flags, needle) in [
        (
            vec!["--tls-cert", path(&missing), "--tls-key", path(&good.key)],
            format!("--tls-cert {}: cannot open it", missing.display()),
        ),
        (
            vec![
                "--tls-cert",
                path(&good.cert),
                "--tls-key",
                path(&other.key),
            ],
            format!(
                "--tls-key {}: does not match the first certificate",
                other.key.display()
            ),
        ),
        (
            vec![
                "--tls-cert",
                path(&good.cert),
                "--tls-key",
                path(&good.key),
                "--tls-client-ca",
                path(&good.key),
            ],
            format!("--tls-client-ca {}: no PEM certificate", good.key.display()),
        ),
        (vec!["--tls-cert", path(&good.cert)], "--tls-key".to_owned()),
    ] {
        let mut args = vec![
            "server",
            "--http",
            "127.0.0.1:0",
            "--grpc",
            "127.0.0.1:0",
            "--data-dir",
            path(&data),
        ];
        args.extend(flags);
        let out = tokio::time::timeout(RELOAD, gangway(&args, &[]))
            .await
            .expect("the server stops at once");
        let line = error_line(&out, 2);
        assert!(line.contains(&needle), "{needle}: {line}");
    }
    assert!(
        !data.exists(),
        "nothing was created before the files were checked"
    );
}
