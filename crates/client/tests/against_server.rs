//! The real [`Client`] against a real in-process registry (`gangway_server::start_in_memory`
//! on 127.0.0.1:0, no fake): register, subscribe, drain; the acks a drain reports are those
//! of the consumer's own subscription, and the rules the server enforces reach the client as
//! its errors.

use std::collections::BTreeMap;
use std::time::Duration;

use gangway_client::{Client, ClientConfig, Error};
use gangway_core::model::{InstanceKey, ServiceKey};
use gangway_wire::ErrorCode;

const WAIT: Duration = Duration::from_secs(5);

fn orders() -> ServiceKey {
    ServiceKey::named("orders")
}

fn instance(n: u8) -> InstanceKey {
    InstanceKey::new(&format!("10.0.0.{n}"), 8080, "")
}

async fn client(server: &gangway_server::RunningServer, name: &str) -> Client {
    let mut config = ClientConfig::new(format!("http://{}", server.grpc_addr));
    config.client_name = name.into();
    Client::connect(config).await.expect("the client connects")
}

#[tokio::test]
async fn a_drain_completes_on_the_real_consumers_ack_and_the_last_one_is_refused() {
    let server = gangway_server::start_in_memory(gangway_server::Config::for_tests())
        .await
        .expect("the registry starts");
    let provider = client(&server, "provider").await;
    let a = provider
        .register(orders(), instance(1), 1.0, BTreeMap::new())
        .await
        .unwrap();
    let b = provider
        .register(orders(), instance(2), 1.0, BTreeMap::new())
        .await
        .unwrap();
    let consumer = client(&server, "consumer").await;
    let mut sub = consumer.subscribe(orders()).await.unwrap();
    sub.wait_for(|v| v.instances.len() == 2, WAIT)
        .await
        .expect("the consumer sees both instances");

    let report = a.drain(WAIT, false).await.unwrap();
    assert!(report.complete, "{report:?}");
    assert!(report.laggards.is_empty(), "{report:?}");
    // The one subscriber that acked is the consumer's subscription, as the registry lists it.
    let rows = server.registry.subscribers(&orders());
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].client_name, "consumer");
    let acked: Vec<&str> = report.acked.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(acked, vec![rows[0].id.as_str()]);
    assert!(report.acked[0].acked_revision >= report.revision);
    // The consumer's cache no longer holds the drained instance when the drain returns.
    assert!(!sub.view().contains(&instance(1)), "{:?}", sub.view());

    // The other one is now the last serving instance: refused, and left serving.
    let err = b.drain(WAIT, false).await.unwrap_err();
    match &err {
        Error::Rejected { code, message, .. } => {
            assert_eq!(code.as_str(), "conflict");
            assert!(message.contains("last serving instance"), "{message}");
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert!(sub.view().contains(&instance(2)));
    provider.close();
    consumer.close();
    server.shutdown().await;
}

/// With auth on, a refused token is not retried: `connect` fails at once with
/// `Error::Unauthorized` (had it retried, it would be `Error::Connect` after the 30 s request
/// timeout), and a valid `read` token's registration is a non-retryable `forbidden`.
#[tokio::test]
async fn a_refused_token_fails_connect_at_once_and_is_not_retryable() {
    use gangway_server::auth::file::grant;
    use gangway_server::auth::{AuthFile, Authority, Role};

    let mut file = AuthFile::default();
    let reader = file.create_token("reader", vec![grant("public", Role::Read)]);
    let mut config = gangway_server::Config::for_tests();
    config.security.authority = Authority::from_file(file);
    let server = gangway_server::start_in_memory(config)
        .await
        .expect("the registry starts");
    let address = format!("http://{}", server.grpc_addr);
    let mut changed = reader.clone();
    let last = changed.pop().unwrap();
    changed.push(if last == 'A' { 'B' } else { 'A' });
    for token in [None, Some(changed.as_str()), Some("gwt_00000000_unknown")] {
        let mut config = ClientConfig::new(address.clone());
        config.request_timeout = Duration::from_secs(30);
        if let Some(t) = token {
            config = config.with_token(t);
        }
        let err = Client::connect(config).await.expect_err("refused");
        assert!(
            matches!(&err, Error::Unauthorized { code, .. } if *code == ErrorCode::Unauthenticated),
            "{token:?}: {err:?}"
        );
        assert!(!err.is_retryable(), "{err}");
        assert_eq!(err.code(), Some(&ErrorCode::Unauthenticated));
        println!("{token:?}: {err}");
    }
    let client = Client::connect(ClientConfig::new(address).with_token(reader))
        .await
        .expect("a valid token connects");
    let err = client
        .register(orders(), instance(1), 1.0, BTreeMap::new())
        .await
        .expect_err("a read token cannot register");
    assert_eq!(err.code(), Some(&ErrorCode::Forbidden), "{err}");
    assert!(!err.is_retryable(), "{err}");
}
