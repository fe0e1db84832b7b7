//! The session logic against an in-process fake registry on 127.0.0.1:0.
//!
//! The fake hands every accepted `Session` stream to the test, which then plays the registry
//! message by message: nothing is answered unless the test says so, and dropping a
//! [`FakeConn`] ends that stream like a registry restart would.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use gangway_client::balance::SmoothWeighted;
use gangway_client::{Client, ClientConfig, Error, ErrorCode};
use gangway_core::model::{InstanceKey, ServiceKey};
use gangway_proto::v1 as pb;
use gangway_proto::v1::client_message::Kind as Out;
use gangway_proto::v1::registry_server::{Registry, RegistryServer};
use gangway_proto::v1::server_message::Kind as In;
use gangway_testkit::eventually;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::time::{Instant, timeout};
use tokio_stream::wrappers::{TcpListenerStream, UnboundedReceiverStream};
use tonic::{Request, Response, Status, Streaming};

/// Upper bound of every wait in these tests; the happy path takes milliseconds.
const WAIT: Duration = Duration::from_secs(5);

struct Fake {
    conns: mpsc::UnboundedSender<FakeConn>,
}

/// One session stream as seen by the fake registry.
struct FakeConn {
    inbound: Streaming<pb::ClientMessage>,
    out: mpsc::UnboundedSender<Result<pb::ServerMessage, Status>>,
}

#[tonic::async_trait]
impl Registry for Fake {
    type SessionStream = UnboundedReceiverStream<Result<pb::ServerMessage, Status>>;

    async fn session(
        &self,
        request: Request<Streaming<pb::ClientMessage>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        let (out, rx) = mpsc::unbounded_channel();
        self.conns
            .send(FakeConn {
                inbound: request.into_inner(),
                out,
            })
            .map_err(|_| Status::unavailable("test finished"))?;
        Ok(Response::new(UnboundedReceiverStream::new(rx)))
    }
}

impl FakeConn {
    async fn recv(&mut self) -> pb::ClientMessage {
        timeout(WAIT, self.inbound.message())
            .await
            .expect("no client message in time")
            .expect("client stream error")
            .expect("client stream ended")
    }

    /// Reads until a message that is not a `Pull` (pulls are answered `not_modified`).
    async fn recv_no_pull(&mut self) -> pb::ClientMessage {
        loop {
            let m = self.recv().await;
            if matches!(m.kind, Some(Out::Pull(_))) {
                self.reply(pb::Reply {
                    request_id: m.request_id,
                    not_modified: true,
                    ..Default::default()
                });
            } else {
                return m;
            }
        }
    }

    fn send(&self, kind: In) {
        self.out
            .send(Ok(pb::ServerMessage { kind: Some(kind) }))
            .expect("client gone");
    }

    fn welcome(&self, session_id: &str, boot_id: &str) {
        self.send(In::Welcome(pb::Welcome {
            session_id: session_id.into(),
            boot_id: boot_id.into(),
            peer: "127.0.0.1:1".into(),
        }));
    }

    fn reply(&self, reply: pb::Reply) {
        self.send(In::Reply(reply));
    }

    fn ok(&self, request_id: u64, revision: u64) {
        self.reply(pb::Reply {
            request_id,
            revision,
            ..Default::default()
        });
    }

    fn snapshot(&self, service: &ServiceKey, revision: u64, ips: &[&str], request_id: u64) {
        self.send(In::Snapshot(pb::Snapshot {
            service: Some(pb_service(service)),
            revision,
            instances: ips.iter().map(|ip| pb_instance(ip)).collect(),
            protection_triggered: false,
            request_id,
            ..Default::default()
        }));
    }
}

fn pb_service(s: &ServiceKey) -> pb::ServiceKey {
    pb::ServiceKey {
        namespace: s.namespace.clone(),
        group: s.group.clone(),
        service: s.service.clone(),
    }
}

fn pb_instance(ip: &str) -> pb::Instance {
    pb::Instance {
        key: Some(pb::InstanceKey {
            ip: ip.into(),
            port: 8080,
            cluster: "DEFAULT".into(),
        }),
        weight: 1.0,
        enabled: true,
        healthy: true,
        ephemeral: true,
        metadata: HashMap::new(),
    }
}

async fn start_fake() -> (String, mpsc::UnboundedReceiver<FakeConn>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (conns, rx) = mpsc::unbounded_channel();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RegistryServer::new(Fake { conns }))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    (addr.to_string(), rx)
}

async fn next_conn(conns: &mut mpsc::UnboundedReceiver<FakeConn>) -> FakeConn {
    timeout(WAIT, conns.recv())
        .await
        .expect("no connection in time")
        .expect("fake server gone")
}

fn config(addr: &str) -> ClientConfig {
    ClientConfig::new(addr)
        .with_client_name("test-client")
        // Long enough that no pull interleaves with the scripted messages.
        .with_refresh(Duration::from_secs(3600))
        .with_backoff(Duration::from_millis(10), Duration::from_millis(50))
        .with_request_timeout(WAIT)
}

/// Connects a client to the fake and plays Hello/Welcome.
async fn connected(
    conns: &mut mpsc::UnboundedReceiver<FakeConn>,
    cfg: ClientConfig,
) -> (Client, FakeConn) {
    let connecting = tokio::spawn(Client::connect(cfg));
    let mut conn = next_conn(conns).await;
    let hello = conn.recv().await;
    assert_eq!(hello.request_id, 0);
    let Some(Out::Hello(h)) = hello.kind else {
        panic!("expected Hello, got {:?}", hello.kind)
    };
    assert_eq!(h.client_name, "test-client");
    assert_eq!(h.client_id.len(), 16, "a random 64-bit id in hex: {h:?}");
    conn.welcome("s-1", "boot-1");
    let client = timeout(WAIT, connecting)
        .await
        .unwrap()
        .unwrap()
        .expect("connect");
    (client, conn)
}

fn orders() -> ServiceKey {
    ServiceKey::named("orders")
}

fn me() -> InstanceKey {
    InstanceKey::new("10.0.0.7", 8080, "")
}

#[tokio::test]
async fn hello_first_then_restore_after_the_stream_drops() {
    let (addr, mut conns) = start_fake().await;
    let (client, mut c1) = connected(&mut conns, config(&addr)).await;
    assert_eq!(client.session_id().as_deref(), Some("s-1"));
    assert_eq!(client.boot_id().as_deref(), Some("boot-1"));
    assert!(client.is_connected());

    // Register.
    let registering = tokio::spawn({
        let client = client.clone();
        let metadata = BTreeMap::from([("zone".to_owned(), "a".to_owned())]);
        async move { client.register(orders(), me(), 2.0, metadata).await }
    });
    let m = c1.recv().await;
    let Some(Out::Register(r)) = &m.kind else {
        panic!("expected Register, got {m:?}")
    };
    assert_ne!(m.request_id, 0);
    assert_eq!(r.service, Some(pb_service(&orders())));
    assert_eq!(r.instance.as_ref().unwrap().port, 8080);
    assert_eq!(r.weight, Some(2.0));
    assert_eq!(r.metadata.get("zone").map(String::as_str), Some("a"));
    let register_body = m.kind.clone();
    c1.ok(m.request_id, 3);
    let registration = timeout(WAIT, registering).await.unwrap().unwrap().unwrap();
    assert_eq!(registration.revision(), 3);

    // Subscribe, receive a push, ack it.
    let payments = ServiceKey::named("payments");
    let subscribing = tokio::spawn({
        let client = client.clone();
        let payments = payments.clone();
        async move { client.subscribe(payments).await }
    });
    let m = c1.recv().await;
    assert_eq!(
        m.kind,
        Some(Out::Subscribe(pb::Subscribe {
            service: Some(pb_service(&payments))
        }))
    );
    c1.ok(m.request_id, 0);
    let mut sub = timeout(WAIT, subscribing).await.unwrap().unwrap().unwrap();
    assert_eq!(sub.view().revision, 0, "empty until the first snapshot");
    assert_eq!(sub.pick(), None);
    c1.snapshot(&payments, 5, &["10.0.1.1", "10.0.1.2"], 0);
    let ack = c1.recv().await;
    assert_eq!(ack.request_id, 0);
    assert_eq!(
        ack.kind,
        Some(Out::Ack(pb::Ack {
            service: Some(pb_service(&payments)),
            revision: 5
        }))
    );
    let view = sub.wait_for(|v| v.revision == 5, WAIT).await.unwrap();
    assert_eq!(view.instances.len(), 2);

    // The registry goes away: the cache stays, the client reconnects.
    drop(c1);
    eventually("client notices the lost stream", || !client.is_connected()).await;
    // A request made while disconnected waits for the next session.
    let late = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .register(
                    orders(),
                    InstanceKey::new("10.0.0.8", 8080, ""),
                    1.0,
                    BTreeMap::new(),
                )
                .await
        }
    });
    let mut c2 = next_conn(&mut conns).await;
    let hello = c2.recv().await;
    assert!(
        matches!(hello.kind, Some(Out::Hello(_))),
        "Hello first on every stream: {hello:?}"
    );
    assert_eq!(sub.view().revision, 5, "cache kept while disconnected");
    assert!(
        sub.pick().is_some(),
        "picks keep working while disconnected"
    );
    c2.welcome("s-2", "boot-2");

    // Restored: the live registration, the subscription, then the request still waiting.
    let m = c2.recv().await;
    assert_eq!(m.kind, register_body, "registration re-sent");
    c2.ok(m.request_id, 1);
    let m = c2.recv().await;
    assert_eq!(
        m.kind,
        Some(Out::Subscribe(pb::Subscribe {
            service: Some(pb_service(&payments))
        }))
    );
    c2.ok(m.request_id, 0);
    let m = c2.recv().await;
    let Some(Out::Register(r)) = &m.kind else {
        panic!("expected the late Register, got {m:?}")
    };
    assert_eq!(r.instance.as_ref().unwrap().ip, "10.0.0.8");
    c2.ok(m.request_id, 2);
    timeout(WAIT, late)
        .await
        .unwrap()
        .unwrap()
        .expect("late register");
    eventually("new session published", || {
        client.session_id().as_deref() == Some("s-2")
    })
    .await;
    assert_eq!(client.boot_id().as_deref(), Some("boot-2"));

    // The restarted registry starts below the old revision: the first snapshot still applies.
    c2.snapshot(&payments, 1, &["10.0.1.3"], 0);
    let ack = c2.recv().await;
    assert_eq!(
        ack.kind,
        Some(Out::Ack(pb::Ack {
            service: Some(pb_service(&payments)),
            revision: 1
        }))
    );
    let view = sub.wait_for(|v| v.revision == 1, WAIT).await.unwrap();
    assert_eq!(view.instances[0].key.ip, "10.0.1.3");
}

#[tokio::test]
async fn duplicate_snapshots_are_acked_but_not_reapplied_and_pull_falls_back() {
    let (addr, mut conns) = start_fake().await;
    let cfg = config(&addr).with_refresh(Duration::from_millis(50));
    let (client, mut c1) = connected(&mut conns, cfg).await;
    let svc = ServiceKey::named("payments");
    let subscribing = tokio::spawn({
        let client = client.clone();
        let svc = svc.clone();
        async move { client.subscribe(svc).await }
    });
    let m = c1.recv().await;
    assert!(matches!(m.kind, Some(Out::Subscribe(_))), "{m:?}");
    c1.ok(m.request_id, 0);
    let sub = timeout(WAIT, subscribing).await.unwrap().unwrap().unwrap();
    let mut rx = sub.receiver();

    // Warming up: the pull is refused, and pulled again later.
    let pull = c1.recv().await;
    let Some(Out::Pull(p)) = &pull.kind else {
        panic!("expected Pull, got {pull:?}")
    };
    assert_eq!(p.known_revision, 0);
    c1.reply(pb::Reply {
        request_id: pull.request_id,
        error_code: "warming_up".into(),
        ..Default::default()
    });
    let pull = c1.recv().await;
    assert!(matches!(pull.kind, Some(Out::Pull(_))), "{pull:?}");
    // Answered by a snapshot carrying the pull's request id: applied and acked.
    c1.snapshot(&svc, 9, &["10.0.1.1"], pull.request_id);
    let ack = c1.recv_no_pull().await;
    assert_eq!(
        ack.kind,
        Some(Out::Ack(pb::Ack {
            service: Some(pb_service(&svc)),
            revision: 9
        }))
    );
    assert_eq!(rx.borrow_and_update().revision, 9);

    // The next pull is conditional on what we hold.
    let pull = c1.recv().await;
    let Some(Out::Pull(p)) = &pull.kind else {
        panic!("expected Pull, got {pull:?}")
    };
    assert_eq!(p.known_revision, 9);
    c1.reply(pb::Reply {
        request_id: pull.request_id,
        not_modified: true,
        ..Default::default()
    });

    // A re-sent push (not acked in time) is acked again but does not wake watchers.
    c1.snapshot(&svc, 9, &["10.0.1.1"], 0);
    let ack = c1.recv_no_pull().await;
    assert_eq!(
        ack.kind,
        Some(Out::Ack(pb::Ack {
            service: Some(pb_service(&svc)),
            revision: 9
        }))
    );
    assert!(
        !rx.has_changed().unwrap(),
        "same revision must not be re-applied"
    );
    let mut waiting = sub.clone();
    let err = waiting
        .wait_for(|v| v.revision == 42, Duration::from_millis(50))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Timeout {
                operation: "wait_for",
                ..
            }
        ),
        "{err:?}"
    );
    drop(waiting);

    // Dropping the last subscription unsubscribes.
    drop(sub);
    let m = c1.recv_no_pull().await;
    assert_eq!(
        m.kind,
        Some(Out::Unsubscribe(pb::Unsubscribe {
            service: Some(pb_service(&svc))
        }))
    );
    c1.ok(m.request_id, 0);
}

/// Issue 9 part 2: a pull reply (revision N) overtaken by a push (N+1) on the one stream must
/// not take the cache back to N after N+1 was acked, or a drain could count this client as
/// holding N+1 while it routes by N.
#[tokio::test]
async fn an_older_snapshot_after_a_newer_one_is_not_applied() {
    let (addr, mut conns) = start_fake().await;
    let cfg = config(&addr).with_refresh(Duration::from_millis(50));
    let (client, mut c1) = connected(&mut conns, cfg).await;
    let svc = ServiceKey::named("orders");
    let subscribing = tokio::spawn({
        let client = client.clone();
        let svc = svc.clone();
        async move { client.subscribe(svc).await }
    });
    let m = c1.recv().await;
    assert!(matches!(m.kind, Some(Out::Subscribe(_))), "{m:?}");
    c1.ok(m.request_id, 0);
    let sub = timeout(WAIT, subscribing).await.unwrap().unwrap().unwrap();
    let rx = sub.receiver();
    let ack_of = |m: pb::ClientMessage| match m.kind {
        Some(Out::Ack(a)) => a.revision,
        other => panic!("expected Ack, got {other:?}"),
    };

    // The pull goes out while the registry is at N = 10 (two instances)...
    let pull = c1.recv().await;
    assert!(matches!(pull.kind, Some(Out::Pull(_))), "{pull:?}");
    // ...but the push of N+1 (one instance drained away) arrives first,
    c1.snapshot(&svc, 11, &["10.0.0.1"], 0);
    assert_eq!(ack_of(c1.recv_no_pull().await), 11);
    // and the pull's reply at N arrives after it.
    c1.snapshot(&svc, 10, &["10.0.0.1", "10.0.0.2"], pull.request_id);
    assert_eq!(
        ack_of(c1.recv_no_pull().await),
        11,
        "the ack says what the cache holds"
    );
    let view = rx.borrow().clone();
    assert_eq!(view.revision, 11, "older snapshot applied: {view:?}");
    assert_eq!(view.instances.len(), 1);
    assert_eq!(sub.pick().unwrap().key.ip, "10.0.0.1");
    drop(client);
}

#[tokio::test]
async fn rejections_drain_and_deregister() {
    let (addr, mut conns) = start_fake().await;
    let (client, mut c1) = connected(&mut conns, config(&addr)).await;

    // A rejected register surfaces code, message and field.
    let registering = tokio::spawn({
        let client = client.clone();
        async move { client.register(orders(), me(), 1.0, BTreeMap::new()).await }
    });
    let m = c1.recv().await;
    c1.reply(pb::Reply {
        request_id: m.request_id,
        error_code: "conflict".into(),
        error_message: "service is persistent".into(),
        error_field: "service".into(),
        ..Default::default()
    });
    let err = timeout(WAIT, registering)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert_eq!(
        err,
        Error::Rejected {
            code: ErrorCode::Conflict,
            message: "service is persistent".into(),
            field: Some("service".into()),
        }
    );
    assert!(!err.is_retryable());

    // Register, then drain: the report mirrors the registry's DrainResult.
    let registering = tokio::spawn({
        let client = client.clone();
        async move { client.register(orders(), me(), 1.0, BTreeMap::new()).await }
    });
    let m = c1.recv().await;
    c1.ok(m.request_id, 4);
    let registration = timeout(WAIT, registering).await.unwrap().unwrap().unwrap();
    let draining = tokio::spawn(async move {
        let report = registration.drain(Duration::from_millis(1500), true).await;
        (registration, report)
    });
    let m = c1.recv().await;
    let Some(Out::Drain(d)) = &m.kind else {
        panic!("expected Drain, got {m:?}")
    };
    assert_eq!((d.timeout_ms, d.force), (1500, true));
    let subscriber = |id: &str, rev| pb::SubscriberAck {
        id: id.into(),
        address: "10.0.9.9:5000".into(),
        acked_revision: rev,
        node: String::new(),
    };
    c1.reply(pb::Reply {
        request_id: m.request_id,
        revision: 5,
        drain: Some(pb::DrainResult {
            revision: 5,
            waited_ms: 120,
            complete: false,
            acked: vec![subscriber("s-7", 5)],
            laggards: vec![subscriber("s-8", 3)],
            notes: vec!["s-8 did not ack".into()],
        }),
        ..Default::default()
    });
    let (registration, report) = timeout(WAIT, draining).await.unwrap().unwrap();
    let report = report.unwrap();
    assert_eq!(report.revision, 5);
    assert_eq!(report.waited(), Duration::from_millis(120));
    assert!(!report.complete);
    assert_eq!(report.acked[0].id, "s-7");
    assert_eq!(
        (
            report.laggards[0].id.as_str(),
            report.laggards[0].acked_revision
        ),
        ("s-8", 3)
    );
    assert_eq!(report.notes, ["s-8 did not ack"]);

    // Deregistering something the registry no longer knows counts as done.
    let deregistering = tokio::spawn(async move { registration.deregister().await });
    let m = c1.recv().await;
    assert!(matches!(m.kind, Some(Out::Deregister(_))), "{m:?}");
    c1.reply(pb::Reply {
        request_id: m.request_id,
        error_code: "not_found".into(),
        ..Default::default()
    });
    timeout(WAIT, deregistering)
        .await
        .unwrap()
        .unwrap()
        .expect("not_found is success");

    // A drained (and deregistered) instance is not restored after a reconnect.
    drop(c1);
    let mut c2 = next_conn(&mut conns).await;
    assert!(matches!(c2.recv().await.kind, Some(Out::Hello(_))));
    c2.welcome("s-2", "boot-1");
    let subscribing = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .subscribe(ServiceKey::named("x"))
                .await
                .map(|s| s.with_balancer(SmoothWeighted::new()))
        }
    });
    let m = c2.recv().await;
    assert!(
        matches!(m.kind, Some(Out::Subscribe(_))),
        "nothing restored before it: {m:?}"
    );
    c2.ok(m.request_id, 0);
    let mut sub = timeout(WAIT, subscribing).await.unwrap().unwrap().unwrap();

    // Close ends the stream; later calls fail with Closed.
    client.close();
    let end = timeout(WAIT, c2.inbound.message())
        .await
        .expect("stream should end");
    assert!(
        !matches!(end, Ok(Some(_))),
        "no further message after close: {end:?}"
    );
    let err = client
        .register(orders(), me(), 1.0, BTreeMap::new())
        .await
        .unwrap_err();
    assert_eq!(err, Error::Closed);
    assert_eq!(
        timeout(WAIT, sub.changed()).await.unwrap().unwrap_err(),
        Error::Closed
    );
    assert_eq!(sub.view().revision, 0, "the last view stays readable");
}

#[tokio::test]
async fn connect_fails_with_the_reason_when_nobody_listens() {
    let free = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let cfg = ClientConfig::new(free.to_string()).with_request_timeout(Duration::from_millis(300));
    let err = Client::connect(cfg).await.unwrap_err();
    let Error::Connect { address, reason } = &err else {
        panic!("expected Connect, got {err:?}")
    };
    assert_eq!(address, &free.to_string());
    assert!(!reason.is_empty());
    assert!(err.is_retryable());

    let mut bad = ClientConfig::new("");
    bad.request_timeout = Duration::ZERO;
    let Err(Error::InvalidConfig { problems }) = Client::connect(bad).await else {
        panic!("invalid config accepted")
    };
    assert_eq!(problems.len(), 2, "{problems:?}");
}

#[tokio::test]
async fn abandoned_register_is_undone() {
    let (addr, mut conns) = start_fake().await;
    let cfg = config(&addr).with_request_timeout(Duration::from_millis(200));
    let connecting = tokio::spawn(Client::connect(cfg));
    let mut c1 = next_conn(&mut conns).await;
    c1.recv().await;
    c1.welcome("s-1", "boot-1");
    let client = timeout(WAIT, connecting).await.unwrap().unwrap().unwrap();

    let err = client
        .register(orders(), me(), 1.0, BTreeMap::new())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Timeout {
                operation: "register",
                ..
            }
        ),
        "{err:?}"
    );
    // The registry answers late: the client takes the orphan registration back.
    let m = c1.recv().await;
    assert!(matches!(m.kind, Some(Out::Register(_))));
    c1.ok(m.request_id, 1);
    let m = c1.recv().await;
    let Some(Out::Deregister(d)) = &m.kind else {
        panic!("expected Deregister, got {m:?}")
    };
    assert_eq!(d.instance.as_ref().unwrap().ip, "10.0.0.7");
}

#[tokio::test]
async fn go_away_reconnects_at_once_with_the_same_client_id_and_keeps_the_views() {
    let (addr, mut conns) = start_fake().await;
    // A plain lost stream waits this long before the next attempt; a GoAway must not.
    let backoff = Duration::from_secs(3);
    let cfg = config(&addr).with_backoff(backoff, backoff * 2);
    let connecting = tokio::spawn(Client::connect(cfg));
    let mut c1 = next_conn(&mut conns).await;
    let Some(Out::Hello(first)) = c1.recv().await.kind else {
        panic!("expected Hello")
    };
    c1.welcome("s-1", "boot-1");
    let client = timeout(WAIT, connecting).await.unwrap().unwrap().unwrap();

    let subscribing = tokio::spawn({
        let client = client.clone();
        async move { client.subscribe(orders()).await }
    });
    let m = c1.recv().await;
    assert!(matches!(m.kind, Some(Out::Subscribe(_))), "{m:?}");
    c1.ok(m.request_id, 0);
    let sub = timeout(WAIT, subscribing).await.unwrap().unwrap().unwrap();
    c1.snapshot(&orders(), 7, &["10.0.1.1", "10.0.1.2"], 0);
    assert!(matches!(c1.recv().await.kind, Some(Out::Ack(_))));

    // The registry is stopping: it says so and keeps its end of the stream open.
    let said = Instant::now();
    c1.send(In::GoAway(pb::GoAway {
        reason: "the registry is stopping".into(),
    }));
    let ended = timeout(WAIT, c1.inbound.message())
        .await
        .expect("client ends its stream");
    assert!(matches!(ended, Ok(None) | Err(_)), "{ended:?}");
    let mut c2 = next_conn(&mut conns).await;
    let reconnected = said.elapsed();
    println!("GoAway to the next session attempt: {reconnected:?} (backoff {backoff:?})");
    assert!(
        reconnected < backoff / 2,
        "reconnected after {reconnected:?}, as if backing off"
    );
    let Some(Out::Hello(second)) = c2.recv().await.kind else {
        panic!("expected Hello")
    };
    assert_eq!(
        second.client_id, first.client_id,
        "one client id across sessions, so the registry lets the new one take over"
    );
    assert_eq!(sub.view().revision, 7, "the view is kept across the GoAway");
    assert_eq!(sub.view().instances.len(), 2);
    c2.welcome("s-2", "boot-2");
    let m = c2.recv().await;
    assert!(
        matches!(m.kind, Some(Out::Subscribe(_))),
        "re-subscribed: {m:?}"
    );
    assert_eq!(sub.view().revision, 7, "still kept until the next snapshot");
}

#[tokio::test]
async fn ready_waits_for_the_registrys_wait_ready_and_is_resent_after_a_reconnect() {
    let (addr, mut conns) = start_fake().await;
    let (client, mut c1) = connected(&mut conns, config(&addr)).await;
    let registering = tokio::spawn({
        let client = client.clone();
        async move { client.register(orders(), me(), 1.0, BTreeMap::new()).await }
    });
    let m = c1.recv().await;
    c1.ok(m.request_id, 4);
    let registration = timeout(WAIT, registering).await.unwrap().unwrap().unwrap();
    let registration = std::sync::Arc::new(registration);

    // Refused: the instance is not in the consumer view.
    let waiting = tokio::spawn({
        let r = registration.clone();
        async move { r.ready(Duration::from_secs(2)).await }
    });
    let m = c1.recv().await;
    let Some(Out::WaitReady(w)) = &m.kind else {
        panic!("expected WaitReady, got {m:?}")
    };
    assert_eq!(w.timeout_ms, 2000);
    assert_eq!(w.instance.as_ref().map(|i| i.port), Some(8080));
    c1.reply(pb::Reply {
        request_id: m.request_id,
        error_code: "conflict".into(),
        error_message: "not in the consumer view".into(),
        ..Default::default()
    });
    let err = timeout(WAIT, waiting).await.unwrap().unwrap().unwrap_err();
    assert_eq!(err.code(), Some(&ErrorCode::Conflict));

    // Accepted, but the stream drops before the answer: re-sent after the re-registration.
    let waiting = tokio::spawn({
        let r = registration.clone();
        async move { r.ready(Duration::from_millis(1500)).await }
    });
    let m = c1.recv().await;
    assert!(matches!(m.kind, Some(Out::WaitReady(_))), "{m:?}");
    drop(c1);
    let mut c2 = next_conn(&mut conns).await;
    assert!(matches!(c2.recv().await.kind, Some(Out::Hello(_))));
    c2.welcome("s-2", "boot-1");
    let restore = c2.recv().await;
    assert!(
        matches!(restore.kind, Some(Out::Register(_))),
        "{restore:?}"
    );
    c2.ok(restore.request_id, 6);
    let resent = c2.recv().await;
    let Some(Out::WaitReady(w)) = &resent.kind else {
        panic!("expected the WaitReady again, got {resent:?}")
    };
    assert_eq!(w.timeout_ms, 1500);
    c2.reply(pb::Reply {
        request_id: resent.request_id,
        drain: Some(pb::DrainResult {
            revision: 6,
            waited_ms: 40,
            complete: true,
            acked: vec![pb::SubscriberAck {
                id: "s-9".into(),
                address: "127.0.0.1:7000".into(),
                acked_revision: 6,
                node: String::new(),
            }],
            laggards: vec![],
            notes: vec![],
        }),
        ..Default::default()
    });
    let report = timeout(WAIT, waiting).await.unwrap().unwrap().unwrap();
    assert!(report.complete);
    assert_eq!(
        (report.revision, report.waited()),
        (6, Duration::from_millis(40))
    );
    assert_eq!(report.acked[0].acked_revision, 6);
}
