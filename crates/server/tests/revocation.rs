//! A reload (SIGHUP) that removes or changes a credential ends its open streams: REST watches
//! (Bearer API token, Basic, a Nacos login token), the console's `/ui/events` (cookie) and
//! native gRPC sessions, whose instances then go (docs/security.md, "Reloading"). Streams of
//! credentials still in the file keep going. Against a started server on 127.0.0.1.

use std::time::Duration;

use futures::StreamExt;
use gangway_core::model::ServiceKey;
use gangway_proto::v1 as pb;
use gangway_server::auth::file::grant;
use gangway_server::auth::{AuthFile, Authority, Role};
use gangway_server::{Config, RunningServer};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// How long a stream gets to show what it should.
const DEADLINE: Duration = Duration::from_secs(10);

/// A streamed HTTP body, read as text.
struct Body {
    body: futures::stream::BoxStream<'static, reqwest::Result<axum::body::Bytes>>,
    text: String,
}

impl Body {
    fn new(resp: reqwest::Response) -> Self {
        assert_eq!(resp.status(), StatusCode::OK, "{}", resp.url());
        Self {
            body: resp.bytes_stream().boxed(),
            text: String::new(),
        }
    }

    /// Reads until `needle` has come (within [`DEADLINE`]); what was read is consumed.
    async fn until(&mut self, needle: &str) {
        let read = async {
            while !self.text.contains(needle) {
                let chunk = self.body.next().await.expect("stream open").unwrap();
                self.text.push_str(std::str::from_utf8(&chunk).unwrap());
            }
        };
        tokio::time::timeout(DEADLINE, read)
            .await
            .unwrap_or_else(|_| panic!("{needle:?} within {DEADLINE:?}"));
        self.text.clear();
    }

    /// Reads to the end of the stream (within [`DEADLINE`]): what came meanwhile.
    async fn ended(mut self) -> String {
        let read = async {
            while let Some(Ok(chunk)) = self.body.next().await {
                self.text.push_str(&String::from_utf8_lossy(&chunk));
            }
            self.text
        };
        tokio::time::timeout(DEADLINE, read)
            .await
            .expect("the stream ended within the deadline")
    }
}

fn orders() -> pb::ServiceKey {
    pb::ServiceKey {
        namespace: "public".into(),
        group: "DEFAULT_GROUP".into(),
        service: "orders".into(),
    }
}

/// The next reply to `request_id` on a native session (within [`DEADLINE`]); `None` when the
/// stream ended first.
async fn reply(inbound: &mut tonic::Streaming<pb::ServerMessage>, id: u64) -> Option<pb::Reply> {
    let read = async {
        loop {
            match inbound.message().await {
                Ok(Some(pb::ServerMessage {
                    kind: Some(pb::server_message::Kind::Reply(r)),
                })) if r.request_id == id => return Some(r),
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => return None,
            }
        }
    };
    tokio::time::timeout(DEADLINE, read)
        .await
        .expect("a reply or the end within the deadline")
}

/// A native gRPC session with `token` that registered `ip`:80 in orders.
async fn session(
    server: &RunningServer,
    token: &str,
    ip: &str,
) -> (
    mpsc::Sender<pb::ClientMessage>,
    tonic::Streaming<pb::ServerMessage>,
) {
    let mut client =
        pb::registry_client::RegistryClient::connect(format!("http://{}", server.grpc_addr))
            .await
            .unwrap();
    let (tx, rx) = mpsc::channel(8);
    tx.send(pb::ClientMessage {
        request_id: 0,
        kind: Some(pb::client_message::Kind::Hello(pb::Hello {
            client_name: "test".into(),
            client_id: ip.into(),
        })),
    })
    .await
    .unwrap();
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    let mut inbound = client.session(request).await.unwrap().into_inner();
    tx.send(pb::ClientMessage {
        request_id: 1,
        kind: Some(pb::client_message::Kind::Register(pb::Register {
            service: Some(orders()),
            instance: Some(pb::InstanceKey {
                ip: ip.into(),
                port: 80,
                cluster: "DEFAULT".into(),
            }),
            weight: None,
            metadata: Default::default(),
        })),
    })
    .await
    .unwrap();
    let r = reply(&mut inbound, 1).await.expect("a reply to Register");
    assert_eq!(r.error_code, "", "{r:?}");
    (tx, inbound)
}

fn ips(server: &RunningServer) -> Vec<String> {
    let mut ips: Vec<_> = server
        .registry
        .view(&ServiceKey::named("orders"))
        .instances
        .iter()
        .map(|i| i.key.ip.clone())
        .collect();
    ips.sort();
    ips
}

#[tokio::test]
async fn a_reload_ends_the_open_streams_of_removed_credentials_and_keeps_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("auth.toml");
    let mut f = AuthFile::default();
    let gone = f.create_token("gone", vec![grant("public", Role::Write)]);
    let kept = f.create_token("kept", vec![grant("public", Role::Write)]);
    f.add_user("alice", "alice-password", vec![grant("public", Role::Read)])
        .unwrap();
    f.add_user("bob", "bob-password", vec![grant("public", Role::Read)])
        .unwrap();
    f.save(&path).unwrap();
    let authority = Authority::load(&path).unwrap();
    let mut config = Config::for_tests();
    config.security.authority = authority.clone();
    let server = gangway_server::start_in_memory(config).await.unwrap();
    let http = reqwest::Client::new();
    let url = |p: &str| format!("http://{}{p}", server.http_addr);
    let register = |ip: &str| {
        let req = http
            .post(url("/v1/services/orders/instances"))
            .bearer_auth(&kept)
            .json(&json!({"ip": ip, "port": 80}));
        async move { assert_eq!(req.send().await.unwrap().status(), StatusCode::OK) }
    };
    register("10.0.0.1").await;

    let login: Value = http
        .post(url("/nacos/v1/auth/login"))
        .form(&[("username", "alice"), ("password", "alice-password")])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let login = login["accessToken"].as_str().unwrap().to_owned();
    let cookie = |user: &'static str, password: &'static str| {
        let req = http
            .post(url("/ui/login"))
            .json(&json!({"username": user, "password": password}));
        async move {
            let resp = req.send().await.unwrap();
            assert_eq!(resp.status(), StatusCode::OK);
            let set = resp.headers()[reqwest::header::SET_COOKIE]
                .to_str()
                .unwrap();
            set.split(';').next().unwrap().to_owned()
        }
    };
    let (alice_cookie, bob_cookie) = (
        cookie("alice", "alice-password").await,
        cookie("bob", "bob-password").await,
    );

    let watch = url("/v1/services/orders/watch");
    let open = |req: reqwest::RequestBuilder| async move {
        let mut body = Body::new(req.send().await.unwrap());
        body.until("event: ").await;
        body
    };
    let watch_gone = open(http.get(&watch).bearer_auth(&gone)).await;
    let watch_kept = open(http.get(&watch).bearer_auth(&kept)).await;
    let watch_basic = open(http.get(&watch).basic_auth("alice", Some("alice-password"))).await;
    let watch_login = open(http.get(&watch).bearer_auth(&login)).await;
    let events = url("/ui/events");
    let events_alice = open(http.get(&events).header("cookie", &alice_cookie)).await;
    let events_bob = open(http.get(&events).header("cookie", &bob_cookie)).await;
    let (_gone_tx, mut gone_session) = session(&server, &gone, "10.0.0.11").await;
    let (kept_tx, mut kept_session) = session(&server, &kept, "10.0.0.12").await;
    assert_eq!(ips(&server), ["10.0.0.1", "10.0.0.11", "10.0.0.12"]);

    // `gangway auth token remove` and `auth user remove`, then SIGHUP.
    f.remove_token(gone.split('_').nth(1).unwrap()).unwrap();
    f.remove_user("alice").unwrap();
    f.save(&path).unwrap();
    assert_eq!(authority.reload().unwrap(), (1, 1));
    register("10.0.0.2").await;

    for (what, body) in [
        ("the removed token's watch", watch_gone),
        ("the removed user's Basic watch", watch_basic),
        ("the removed user's login-token watch", watch_login),
    ] {
        let after = body.ended().await;
        assert!(
            !after.contains("10.0.0.2"),
            "{what} got a later change: {after}"
        );
    }
    events_alice.ended().await;
    assert_eq!(
        reply(&mut gone_session, 2).await,
        None,
        "the removed token's session ended"
    );

    // The others go on: the watch is pushed the change, the console stream says so, the
    // session answers; the ended session's instance went with it.
    let mut watch_kept = watch_kept;
    watch_kept.until("10.0.0.2").await;
    let mut events_bob = events_bob;
    events_bob.until("event: change").await;
    kept_tx
        .send(pb::ClientMessage {
            request_id: 3,
            kind: Some(pb::client_message::Kind::Subscribe(pb::Subscribe {
                service: Some(orders()),
            })),
        })
        .await
        .unwrap();
    let subscribed = reply(&mut kept_session, 3)
        .await
        .expect("the kept session answers");
    assert_eq!(subscribed.error_code, "", "{subscribed:?}");
    let server2 = &server;
    let gone_instance = gangway_testkit::poll(DEADLINE, || async move {
        let now = ips(server2);
        (now == ["10.0.0.1", "10.0.0.12", "10.0.0.2"]).then_some(now)
    })
    .await;
    assert!(gone_instance.is_some(), "instances now: {:?}", ips(&server));
}

#[tokio::test]
async fn new_grants_or_a_new_password_end_the_streams_made_before() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("auth.toml");
    let mut f = AuthFile::default();
    f.add_user("carol", "old-password", vec![grant("public", Role::Read)])
        .unwrap();
    f.add_user("dave", "dave-password", vec![grant("public", Role::Write)])
        .unwrap();
    f.save(&path).unwrap();
    let authority = Authority::load(&path).unwrap();
    let mut config = Config::for_tests();
    config.security.authority = authority.clone();
    let server = gangway_server::start_in_memory(config).await.unwrap();
    let http = reqwest::Client::new();
    let base = format!("http://{}/v1/services/orders", server.http_addr);
    let created = http
        .post(format!("{base}/instances"))
        .basic_auth("dave", Some("dave-password"))
        .json(&json!({"ip": "10.0.0.1", "port": 80}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), StatusCode::OK);
    let open = |user: &'static str, password: &'static str| {
        let req = http
            .get(format!("{base}/watch"))
            .basic_auth(user, Some(password));
        async move {
            let mut body = Body::new(req.send().await.unwrap());
            body.until("10.0.0.1").await;
            body
        }
    };
    let carol = open("carol", "old-password").await;
    let dave = open("dave", "dave-password").await;

    // carol: a new password (remove, add); dave: the same password, read instead of write.
    f.remove_user("carol").unwrap();
    f.add_user("carol", "new-password", vec![grant("public", Role::Read)])
        .unwrap();
    let record = f.users.iter_mut().find(|u| u.name == "dave").unwrap();
    record.grants = vec![grant("public", Role::Read)];
    f.save(&path).unwrap();
    assert_eq!(authority.reload().unwrap(), (2, 0));
    carol.ended().await;
    dave.ended().await;
    // Streams opened with the credentials as they are now go on.
    open("carol", "new-password").await;
    open("dave", "dave-password").await;
}
