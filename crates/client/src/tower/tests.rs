//! The stack of docs/tower.md against real sockets on 127.0.0.1: hyper-util clients per
//! instance, axum backends, one instance refusing connections.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::any;
use gangway_core::model::{Instance, InstanceKey, ServiceKey};
use gangway_core::view::View;
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Method, Request, Uri};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;
use tokio::sync::watch;
use tower::balance::p2c::Balance;
use tower::buffer::Buffer;
use tower::load::{CompleteOnResponse, PendingRequestsDiscover};
use tower::{Service, ServiceBuilder, ServiceExt};

use super::{Attempts, EjectionLayer, RetryLayer, StackConfig, ViewDiscover, balanced};
use crate::Subscription;
use crate::outlier::{OutlierConfig, OutlierDetector};
use crate::retry::RetryConfig;

async fn backend(name: &'static str) -> InstanceKey {
    slow_backend(name, Duration::ZERO).await
}

/// A backend answering `name` after `delay`.
async fn slow_backend(name: &'static str, delay: Duration) -> InstanceKey {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let app = Router::new().route(
        "/x",
        any(move || async move {
            tokio::time::sleep(delay).await;
            name
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    InstanceKey::new("127.0.0.1", port, "")
}

/// A port with nothing listening (bound, then released).
async fn dead_port() -> InstanceKey {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    InstanceKey::new("127.0.0.1", port, "")
}

fn to_instance<B>(mut request: Request<B>, authority: &Authority) -> Request<B> {
    let mut parts = request.uri().clone().into_parts();
    parts.scheme = Some(Scheme::HTTP);
    parts.authority = Some(authority.clone());
    parts
        .path_and_query
        .get_or_insert(PathAndQuery::from_static("/"));
    if let Ok(uri) = Uri::from_parts(parts) {
        *request.uri_mut() = uri;
    }
    request
}

#[tokio::test]
async fn hyper_stack_survives_a_refusing_instance_and_ejects_it() {
    let dead = dead_port().await;
    let keys = vec![backend("a").await, backend("b").await, dead.clone()];
    let instances: Vec<Instance> = keys.iter().cloned().map(Instance::new).collect();
    let (_views_tx, views) = watch::channel(Arc::new(View {
        revision: 1,
        instances,
        protection_triggered: false,
    }));
    // 3 x 0.5: one instance may be ejected.
    let detector = Arc::new(
        OutlierDetector::new(
            ServiceKey::named("orders"),
            OutlierConfig::default().with_max_ejection_ratio(0.5),
        )
        .unwrap(),
    );
    let discover = ViewDiscover::from_receiver(views.clone(), {
        let detector = detector.clone();
        move |instance: &Instance| {
            let client = HyperClient::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(30))
                .build_http::<String>();
            let authority: Authority = instance.key.addr().parse().unwrap();
            ServiceBuilder::new()
                .layer(EjectionLayer::new(
                    detector.clone(),
                    views.clone(),
                    instance,
                ))
                .map_request(move |request| to_instance(request, &authority))
                .service(client)
        }
    })
    .with_detector(detector.clone());
    let balance = Balance::new(PendingRequestsDiscover::new(
        discover,
        CompleteOnResponse::default(),
    ));
    // p2c may pick the refusing instance again before it is ejected: room for retries.
    let mut http = ServiceBuilder::new()
        .layer(RetryLayer::new(
            &RetryConfig::default().with_max_attempts(10),
        ))
        .service(Buffer::new(balance, 64));

    let mut answered = BTreeMap::new();
    for n in 0..60 {
        // POSTs too: a refused connection never reached the application.
        let method = if n % 2 == 0 {
            Method::GET
        } else {
            Method::POST
        };
        let request = Request::builder()
            .method(method)
            .uri("http://orders/x")
            .body(String::new())
            .unwrap();
        let response = http
            .ready()
            .await
            .unwrap()
            .call(request)
            .await
            .unwrap_or_else(|e| panic!("request {n} failed: {e}"));
        assert_eq!(response.status(), 200);
        assert!(response.extensions().get::<Attempts>().is_some());
        let body = text(response).await;
        *answered.entry(body).or_insert(0) += 1;
    }
    assert!(
        detector.is_ejected(&dead),
        "the refusing instance is ejected"
    );
    assert_eq!(
        answered.keys().collect::<Vec<_>>(),
        ["a", "b"],
        "{answered:?}"
    );
}

async fn text<B>(response: http::Response<B>) -> String
where
    B: axum::body::HttpBody<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<tower::BoxError>,
{
    let body = axum::body::to_bytes(axum::body::Body::new(response.into_body()), 1024)
        .await
        .unwrap();
    String::from_utf8(body.to_vec()).unwrap()
}

/// `balanced` over real sockets: a hanging instance costs a per-try timeout, then the GET is
/// answered elsewhere; the subscription lives as long as the stack.
#[tokio::test]
async fn balanced_retries_a_timed_out_get_elsewhere() {
    let keys = vec![
        backend("a").await,
        slow_backend("hang", Duration::from_secs(30)).await,
    ];
    let instances: Vec<Instance> = keys.iter().cloned().map(Instance::new).collect();
    let (views_tx, views) = watch::channel(Arc::new(View {
        revision: 1,
        instances,
        protection_triggered: false,
    }));
    let (commands, mut unsubscribed) = tokio::sync::mpsc::unbounded_channel();
    let subscription = Subscription::new(ServiceKey::named("orders"), views, commands);
    let config = StackConfig::default().with_retry(
        RetryConfig::default()
            .with_max_attempts(10)
            .with_per_try_timeout(Duration::from_millis(100)),
    );
    let mut http = balanced(&subscription, &config, |instance: &Instance| {
        let client = HyperClient::builder(TokioExecutor::new()).build_http::<String>();
        let authority: Authority = instance.key.addr().parse().unwrap();
        ServiceBuilder::new()
            .map_request(move |request| to_instance(request, &authority))
            .service(client)
    })
    .unwrap();
    drop(subscription);

    let mut retried = 0;
    for n in 0..20 {
        let request = Request::get("http://orders/x").body(String::new()).unwrap();
        let response = http
            .ready()
            .await
            .unwrap()
            .call(request)
            .await
            .unwrap_or_else(|e| panic!("request {n} failed: {e}"));
        let attempts = response.extensions().get::<Attempts>().unwrap().0;
        retried += usize::from(attempts > 1);
        assert_eq!(text(response).await, "a");
    }
    // The hanging instance is picked about half the time (p2c over two, ties).
    assert!(retried > 0, "some GETs needed a second attempt");

    assert!(
        unsubscribed.try_recv().is_err(),
        "the stack holds the subscription"
    );
    drop(http);
    drop(views_tx);
}

#[tokio::test]
async fn balanced_reports_every_config_problem_together() {
    let (_views_tx, views) = watch::channel(Arc::new(View {
        revision: 0,
        instances: Vec::new(),
        protection_triggered: false,
    }));
    let (commands, _unsubscribed) = tokio::sync::mpsc::unbounded_channel();
    let subscription = Subscription::new(ServiceKey::named("orders"), views, commands);
    let mut outlier = OutlierConfig::default();
    outlier.max_checks = 0;
    let config = StackConfig::default()
        .with_retry(RetryConfig::default().with_max_attempts(0))
        .with_outlier(outlier);
    let make = |_: &Instance| {
        tower::service_fn(|_: Request<String>| async {
            Ok::<_, std::io::Error>(http::Response::new(String::new()))
        })
    };
    match balanced(&subscription, &config, make) {
        Err(crate::Error::InvalidConfig { problems }) => {
            assert_eq!(problems.len(), 2, "{problems:?}");
            assert!(problems[0].contains("max_attempts"), "{problems:?}");
            assert!(problems[1].contains("max_checks"), "{problems:?}");
        }
        Err(other) => panic!("unexpected error: {other}"),
        Ok(_) => panic!("accepted an invalid config"),
    }
}
