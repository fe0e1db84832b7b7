//! TLS on the REST port of a started server on 127.0.0.1 (docs/security.md, "TLS"; cargo
//! feature `tls`, which `cargo test --workspace` enables through the `gangway` binary): a
//! private CA made by each test, health over HTTPS, client certificates, a reload seen by new
//! connections, plain text and stalled handshakes on a TLS port.

#![cfg(feature = "tls")]

use std::path::Path;
use std::time::{Duration, Instant};

use gangway_server::tls::{Tls, TlsFileKind, TlsFiles};
use gangway_server::{Config, RunningServer};
use gangway_testkit::tls::{Leaf, LeafFiles, Pki};
use reqwest::StatusCode;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A server with TLS from `files`, and `config` otherwise.
async fn serve(files: TlsFiles, mut config: Config) -> (RunningServer, Tls) {
    let tls = Tls::load(files).expect("TLS files");
    config.security.tls = Some(tls.clone());
    let server = gangway_server::start_in_memory(config).await.unwrap();
    (server, tls)
}

fn files(leaf: &LeafFiles, client_ca: Option<&Path>) -> TlsFiles {
    TlsFiles {
        cert: leaf.cert.clone(),
        key: leaf.key.clone(),
        client_ca: client_ca.map(Path::to_owned),
    }
}

/// A client that trusts `pki`'s CA, optionally presenting `identity`, on a connection of its
/// own (no pooling), that records the peer's certificate.
fn client(pki: &Pki, identity: Option<&Leaf>) -> reqwest::Client {
    let ca = reqwest::Certificate::from_pem(pki.ca_pem().as_bytes()).unwrap();
    let mut builder = reqwest::Client::builder()
        .add_root_certificate(ca)
        .pool_max_idle_per_host(0)
        .tls_info(true)
        .timeout(Duration::from_secs(5));
    if let Some(leaf) = identity {
        let pem = format!("{}{}", leaf.cert_pem, leaf.key_pem);
        builder = builder.identity(reqwest::Identity::from_pem(pem.as_bytes()).unwrap());
    }
    builder.build().unwrap()
}

fn health_url(server: &RunningServer) -> String {
    format!("https://127.0.0.1:{}/v1/health", server.http_addr.port())
}

/// `GET /v1/health`: its status, body and the DER of the certificate the server presented.
async fn health(
    client: &reqwest::Client,
    server: &RunningServer,
) -> reqwest::Result<(StatusCode, Value, Vec<u8>)> {
    let response = client.get(health_url(server)).send().await?;
    let peer = response
        .extensions()
        .get::<reqwest::tls::TlsInfo>()
        .and_then(|info| info.peer_certificate())
        .expect("TLS info")
        .to_vec();
    let status = response.status();
    Ok((status, response.json().await?, peer))
}

#[tokio::test]
async fn rest_over_tls_answers_health_and_says_tls_on() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new("test CA");
    let leaf = pki.server("gangway", 1);
    let (server, _tls) = serve(
        files(&leaf.write(dir.path(), "server"), None),
        Config::for_tests(),
    )
    .await;
    let (status, body, peer) = health(&client(&pki, None), &server).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["status"], "UP");
    assert_eq!(body["tls"], "on");
    assert_eq!(peer, leaf.der, "the configured certificate");

    // A client that does not trust the CA gets no answer.
    let e = reqwest::Client::new()
        .get(health_url(&server))
        .send()
        .await
        .expect_err("an untrusted certificate");
    assert!(e.is_connect(), "{e:?}");
    server.shutdown().await;
}

#[tokio::test]
async fn with_a_client_ca_only_clients_with_a_certificate_it_signed_get_in() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new("test CA");
    let clients = Pki::new("client CA");
    let ca = clients.write_ca(dir.path(), "clients.pem");
    let leaf = pki.server("gangway", 1).write(dir.path(), "server");
    let (server, _tls) = serve(files(&leaf, Some(&ca)), Config::for_tests()).await;

    let refused = health(&client(&pki, None), &server).await;
    assert!(refused.is_err(), "no client certificate: {refused:?}");
    let stranger = Pki::new("another CA").client("stranger", 7);
    let refused = health(&client(&pki, Some(&stranger)), &server).await;
    assert!(refused.is_err(), "a certificate of another CA: {refused:?}");

    let (status, body, _) = health(&client(&pki, Some(&clients.client("app", 8))), &server)
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["tls"], "mutual");
    server.shutdown().await;
}

#[tokio::test]
async fn a_reload_serves_new_certificates_to_new_connections_and_a_bad_set_keeps_the_old() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new("test CA");
    let first = pki.server("first", 1);
    let written = first.write(dir.path(), "server");
    let (server, tls) = serve(files(&written, None), Config::for_tests()).await;
    let http = client(&pki, None);
    assert_eq!(health(&http, &server).await.unwrap().2, first.der);

    let second = pki.server("second", 2);
    second.write(dir.path(), "server");
    tls.reload().unwrap();
    assert_eq!(health(&http, &server).await.unwrap().2, second.der);

    std::fs::write(&written.cert, "-----BEGIN CERTIFICATE-----\nnot base64\n").unwrap();
    let e = tls.reload().expect_err("a broken certificate file");
    assert_eq!(e.kind, TlsFileKind::Cert);
    assert!(e.to_string().contains("server.crt"), "{e}");
    let (status, _, peer) = health(&http, &server).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(peer, second.der, "the old set stays");
    server.shutdown().await;
}

/// Reads from `stream` until it closes or `limit` passes; what was read.
async fn read_until_closed(stream: &mut TcpStream, limit: Duration) -> Vec<u8> {
    let mut got = Vec::new();
    let _ = tokio::time::timeout(limit, stream.read_to_end(&mut got)).await;
    got
}

#[tokio::test]
async fn plain_http_to_a_tls_port_is_closed_and_tls_clients_are_served_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new("test CA");
    let leaf = pki.server("gangway", 1).write(dir.path(), "server");
    let (server, _tls) = serve(files(&leaf, None), Config::for_tests()).await;

    let mut plain = TcpStream::connect(server.http_addr).await.unwrap();
    plain
        .write_all(b"GET /v1/health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    let answer = read_until_closed(&mut plain, Duration::from_secs(5)).await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "closed at once, not at a timeout: {:?}",
        started.elapsed()
    );
    assert!(!answer.starts_with(b"HTTP/"), "no plain-text answer");

    let http = client(&pki, None);
    let (status, _, _) = health(&http, &server).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    let metrics = http
        .get(format!(
            "https://127.0.0.1:{}/metrics",
            server.http_addr.port()
        ))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("gangway_tls_handshake_failures_total{port=\"http\"} 1"),
        "{metrics}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn a_stalled_handshake_holds_its_slot_until_the_header_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new("test CA");
    let leaf = pki.server("gangway", 1).write(dir.path(), "server");
    let mut config = Config::for_tests();
    config.connections.http_header_timeout = Duration::from_millis(500);
    config.connections.http_max = Some(1);
    let (server, _tls) = serve(files(&leaf, None), config).await;

    // A connection that never starts its handshake takes the port's only slot...
    let mut stalled = TcpStream::connect(server.http_addr).await.unwrap();
    let accepted = Instant::now();
    let http = client(&pki, None);
    let (status, body, _) = health(&http, &server).await.unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], "overloaded");

    // ...until the header timeout closes it; then the slot serves again.
    let answer = read_until_closed(&mut stalled, Duration::from_secs(5)).await;
    let held = accepted.elapsed();
    assert!(answer.is_empty());
    assert!(
        held >= Duration::from_millis(450) && held < Duration::from_secs(3),
        "closed after {held:?}"
    );
    let ok = gangway_testkit::poll(Duration::from_secs(5), || async {
        let (status, _, _) = health(&http, &server).await.ok()?;
        (status == StatusCode::OK).then_some(())
    })
    .await;
    assert!(ok.is_some(), "served once the stalled connection closed");
    println!("stalled TLS handshake closed after {} ms", held.as_millis());
    server.shutdown().await;
}
