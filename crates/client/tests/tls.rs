//! The real [`Client`] over TLS to the gRPC port of an in-process registry on 127.0.0.1
//! (cargo feature `tls`, which `cargo test --workspace` enables through the `gangway` binary):
//! a private CA made by the test, register and subscribe, client certificates.

#![cfg(feature = "tls")]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use gangway_client::{Client, ClientConfig, Error};
use gangway_core::model::{InstanceKey, ServiceKey};
use gangway_server::RunningServer;
use gangway_server::tls::{Tls, TlsFiles};
use gangway_testkit::tls::Pki;

const WAIT: Duration = Duration::from_secs(5);

/// A registry whose ports speak TLS with a certificate of `pki`, requiring client
/// certificates of `client_ca` when given.
async fn serve(pki: &Pki, dir: &Path, client_ca: Option<&Pki>) -> RunningServer {
    let leaf = pki.server("gangway", 1).write(dir, "server");
    let tls = Tls::load(TlsFiles {
        cert: leaf.cert,
        key: leaf.key,
        client_ca: client_ca.map(|ca| ca.write_ca(dir, "clients.pem")),
    })
    .unwrap();
    let mut config = gangway_server::Config::for_tests();
    config.security.tls = Some(tls);
    gangway_server::start_in_memory(config).await.unwrap()
}

fn config(server: &RunningServer, pki: &Pki) -> ClientConfig {
    ClientConfig::new(format!("https://localhost:{}", server.grpc_addr.port()))
        .with_ca_pem(pki.ca_pem())
        .with_request_timeout(Duration::from_secs(2))
}

#[tokio::test]
async fn a_client_registers_and_subscribes_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new("test CA");
    let server = serve(&pki, dir.path(), None).await;
    let orders = ServiceKey::named("orders");
    let provider = Client::connect(config(&server, &pki).with_client_name("provider"))
        .await
        .expect("connects over TLS");
    let instance = InstanceKey::new("10.0.0.1", 8080, "");
    let registration = provider
        .register(orders.clone(), instance.clone(), 1.0, BTreeMap::new())
        .await
        .unwrap();
    // An IP address as the name to check works as well as a DNS name.
    let ip = ClientConfig::new(format!("https://127.0.0.1:{}", server.grpc_addr.port()))
        .with_ca_pem(pki.ca_pem())
        .with_client_name("consumer");
    let consumer = Client::connect(ip).await.expect("connects by IP address");
    let mut sub = consumer.subscribe(orders.clone()).await.unwrap();
    sub.wait_for(|v| v.contains(&instance), WAIT)
        .await
        .expect("the consumer is pushed the instance");
    let report = registration.drain(WAIT, true).await.unwrap();
    assert!(report.complete, "{report:?}");
    assert_eq!(server.registry.subscribers(&orders).len(), 1);
    provider.close();
    consumer.close();
    server.shutdown().await;
}

#[tokio::test]
async fn without_the_ca_or_over_plain_text_the_client_does_not_connect() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new("test CA");
    let server = serve(&pki, dir.path(), None).await;
    let stranger = Pki::new("another CA");
    let e = Client::connect(config(&server, &stranger))
        .await
        .expect_err("a server certificate of another CA");
    assert!(matches!(e, Error::Connect { .. }), "{e:?}");
    assert!(e.to_string().contains("UnknownIssuer"), "{e}");
    println!("another CA: {e}");
    let plain = ClientConfig::new(format!("http://127.0.0.1:{}", server.grpc_addr.port()))
        .with_request_timeout(Duration::from_secs(2));
    let e = Client::connect(plain).await.expect_err("plain text to TLS");
    assert!(matches!(e, Error::Connect { .. }), "{e:?}");
    server.shutdown().await;
}

#[tokio::test]
async fn with_client_certificates_required_only_a_client_with_one_connects() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new("test CA");
    let clients = Pki::new("client CA");
    let server = serve(&pki, dir.path(), Some(&clients)).await;
    let e = Client::connect(config(&server, &pki))
        .await
        .expect_err("no client certificate");
    assert!(matches!(e, Error::Connect { .. }), "{e:?}");
    println!("no client certificate: {e}");
    let leaf = clients.client("app", 9);
    let client = Client::connect(config(&server, &pki).with_identity(leaf.cert_pem, leaf.key_pem))
        .await
        .expect("a client certificate of the client CA");
    client
        .register(
            ServiceKey::named("orders"),
            InstanceKey::new("10.0.0.2", 8080, ""),
            1.0,
            BTreeMap::new(),
        )
        .await
        .unwrap();
    client.close();
    server.shutdown().await;
}

#[test]
fn tls_settings_need_https_and_pem_text() {
    let problems = |c: ClientConfig| match c.validate() {
        Err(Error::InvalidConfig { problems }) => problems,
        other => panic!("accepted: {other:?}"),
    };
    let p = problems(ClientConfig::new("127.0.0.1:9848").with_ca_pem("x"));
    assert_eq!(
        p,
        ["tls: a CA or a client identity needs an https:// address"]
    );
    let p = problems(
        ClientConfig::new("https://127.0.0.1:9848")
            .with_ca_pem("not PEM")
            .with_identity("no cert", "no key"),
    );
    assert_eq!(
        p,
        [
            "tls.ca_pem: no PEM certificate",
            "tls.identity.cert_pem: no PEM certificate",
            "tls.identity.key_pem: no PEM private key"
        ]
    );
    let leaf = Pki::new("ca").client("app", 1);
    let c = ClientConfig::new("https://127.0.0.1:9848").with_identity(leaf.cert_pem, leaf.key_pem);
    assert!(c.validate().is_ok());
    assert!(
        !format!("{c:?}").contains("PRIVATE KEY"),
        "the key stays out of Debug"
    );
}
