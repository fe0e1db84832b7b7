//! The real [`Client`] against a real in-process registry (`gangway_server::start_in_memory`
//! on 127.0.0.1:0, no fake): register, subscribe, drain; the acks a drain reports are those
//! of the consumer's own subscription, and the rules the server enforces reach the client as
//! its errors.

use std::collections::BTreeMap;
use std::time::Duration;

use gangway_client::{Client, ClientConfig, Error};
use gangway_core::model::{InstanceKey, ServiceKey};

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
