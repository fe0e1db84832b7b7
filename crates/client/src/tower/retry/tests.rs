use std::io;
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use tower::{BoxError, Layer, ServiceExt};
use tower_test::mock;

use super::*;
use crate::retry::{Failure, RetryConfig};

type Mock = mock::Mock<Request<String>, Response<String>>;
type Handle = mock::Handle<Request<String>, Response<String>>;

fn stack(config: &RetryConfig) -> (Retry<Mock, crate::tower::DefaultClassify>, Handle) {
    let (service, handle) = mock::pair();
    (RetryLayer::new(config).layer(service), handle)
}

fn request(method: Method) -> Request<String> {
    Request::builder()
        .method(method)
        .uri("http://orders/v1")
        .body("payload".to_owned())
        .unwrap()
}

fn status(code: u16) -> Response<String> {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap())
        .body(String::new())
        .unwrap()
}

fn refused() -> io::Error {
    io::Error::from(io::ErrorKind::ConnectionRefused)
}

fn reset() -> io::Error {
    io::Error::from(io::ErrorKind::ConnectionReset)
}

/// What the next attempt receives, answered by `answer`.
async fn answer(
    handle: &mut Handle,
    answer: Result<Response<String>, io::Error>,
) -> Request<String> {
    let (request, send) = handle.next_request().await.expect("an attempt");
    match answer {
        Ok(response) => send.send_response(response),
        Err(error) => send.send_error(error),
    }
    request
}

fn send(
    service: &mut Retry<Mock, crate::tower::DefaultClassify>,
    request: Request<String>,
) -> tokio::task::JoinHandle<Result<Response<String>, BoxError>> {
    tokio::spawn(service.clone().oneshot(request))
}

fn attempts(response: &Response<String>) -> Option<u32> {
    response.extensions().get::<Attempts>().map(|a| a.0)
}

/// The call is over (its future resolved) and no other attempt was sent.
fn no_more_attempts(handle: &mut Handle) {
    assert!(
        handle.poll_request().is_pending(),
        "an unexpected extra attempt"
    );
}

#[tokio::test(start_paused = true)]
async fn a_first_try_success_says_one_attempt() {
    let (mut service, mut handle) = stack(&RetryConfig::default());
    let call = send(&mut service, request(Method::GET));
    answer(&mut handle, Ok(status(200))).await;
    let response = call.await.unwrap().unwrap();
    assert_eq!(attempts(&response), Some(1));
}

#[tokio::test(start_paused = true)]
async fn a_connect_failure_is_retried_even_for_post() {
    let (mut service, mut handle) = stack(&RetryConfig::default());
    let call = send(&mut service, request(Method::POST));
    answer(&mut handle, Err(refused())).await;
    let replayed = answer(&mut handle, Ok(status(201))).await;
    assert_eq!(replayed.method(), Method::POST);
    assert_eq!(
        replayed.body(),
        "payload",
        "the same request, body included"
    );
    let response = call.await.unwrap().unwrap();
    assert_eq!(response.status(), 201);
    assert_eq!(attempts(&response), Some(2));
}

#[tokio::test(start_paused = true)]
async fn a_post_is_not_retried_after_sending() {
    let (mut service, mut handle) = stack(&RetryConfig::default());
    let call = send(&mut service, request(Method::POST));
    answer(&mut handle, Err(reset())).await;
    let error = call.await.unwrap().unwrap_err();
    assert_eq!(
        error.downcast_ref::<io::Error>().map(io::Error::kind),
        Some(io::ErrorKind::ConnectionReset),
        "the inner error, unchanged"
    );
    no_more_attempts(&mut handle);
}

#[tokio::test(start_paused = true)]
async fn a_get_is_retried_after_sending() {
    let (mut service, mut handle) = stack(&RetryConfig::default());
    let call = send(&mut service, request(Method::GET));
    answer(&mut handle, Err(reset())).await;
    answer(&mut handle, Ok(status(200))).await;
    assert_eq!(attempts(&call.await.unwrap().unwrap()), Some(2));
}

#[tokio::test(start_paused = true)]
async fn a_503_is_retried_for_get_and_returned_for_post() {
    let (mut service, mut handle) = stack(&RetryConfig::default());
    let call = send(&mut service, request(Method::GET));
    answer(&mut handle, Ok(status(503))).await;
    answer(&mut handle, Ok(status(200))).await;
    assert_eq!(attempts(&call.await.unwrap().unwrap()), Some(2));

    let call = send(&mut service, request(Method::POST));
    answer(&mut handle, Ok(status(503))).await;
    let response = call.await.unwrap().unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(attempts(&response), Some(1));
    no_more_attempts(&mut handle);
}

#[tokio::test(start_paused = true)]
async fn the_idempotent_extension_overrides_the_method() {
    let (mut service, mut handle) = stack(&RetryConfig::default());
    let mut post = request(Method::POST);
    post.extensions_mut().insert(Idempotent(true));
    let call = send(&mut service, post);
    answer(&mut handle, Ok(status(502))).await;
    let replayed = answer(&mut handle, Ok(status(200))).await;
    assert_eq!(
        replayed.extensions().get::<Idempotent>(),
        Some(&Idempotent(true))
    );
    assert_eq!(attempts(&call.await.unwrap().unwrap()), Some(2));

    let mut get = request(Method::GET);
    get.extensions_mut().insert(Idempotent(false));
    let call = send(&mut service, get);
    answer(&mut handle, Ok(status(504))).await;
    assert_eq!(attempts(&call.await.unwrap().unwrap()), Some(1));
}

#[tokio::test(start_paused = true)]
async fn a_500_is_never_retried() {
    let (mut service, mut handle) = stack(&RetryConfig::default());
    let call = send(&mut service, request(Method::GET));
    answer(&mut handle, Ok(status(500))).await;
    let response = call.await.unwrap().unwrap();
    assert_eq!(
        (response.status().as_u16(), attempts(&response)),
        (500, Some(1))
    );
    no_more_attempts(&mut handle);
}

#[tokio::test(start_paused = true)]
async fn max_attempts_bounds_the_attempts() {
    let (mut service, mut handle) = stack(&RetryConfig::default());
    let call = send(&mut service, request(Method::GET));
    answer(&mut handle, Err(refused())).await;
    answer(&mut handle, Err(refused())).await;
    assert!(call.await.unwrap().is_err(), "default 2 attempts");
    no_more_attempts(&mut handle);

    let (mut service, mut handle) = stack(&RetryConfig::default().with_max_attempts(3));
    let call = send(&mut service, request(Method::GET));
    answer(&mut handle, Ok(status(503))).await;
    answer(&mut handle, Err(refused())).await;
    answer(&mut handle, Ok(status(200))).await;
    assert_eq!(attempts(&call.await.unwrap().unwrap()), Some(3));

    let (mut service, mut handle) = stack(&RetryConfig::disabled());
    let call = send(&mut service, request(Method::GET));
    answer(&mut handle, Ok(status(503))).await;
    assert_eq!(attempts(&call.await.unwrap().unwrap()), Some(1));
}

#[tokio::test(start_paused = true)]
async fn an_empty_budget_stops_retries() {
    // Ratio 0 and a floor of 1 retry/s over 1 s: exactly one retry in the window.
    let config =
        RetryConfig::default()
            .with_max_attempts(5)
            .with_budget(Duration::from_secs(1), 1, 0.0);
    let (mut service, mut handle) = stack(&config);
    let call = send(&mut service, request(Method::GET));
    answer(&mut handle, Err(refused())).await;
    answer(&mut handle, Err(refused())).await;
    assert!(
        call.await.unwrap().is_err(),
        "one retry, then the budget is empty"
    );
    no_more_attempts(&mut handle);

    let call = send(&mut service, request(Method::GET));
    answer(&mut handle, Ok(status(503))).await;
    let response = call.await.unwrap().unwrap();
    assert_eq!(
        (response.status().as_u16(), attempts(&response)),
        (503, Some(1))
    );
    no_more_attempts(&mut handle);
}

#[tokio::test(start_paused = true)]
async fn clones_of_a_layer_share_the_budget() {
    let layer =
        RetryLayer::new(&RetryConfig::default().with_budget(Duration::from_secs(1), 1, 0.0));
    let (a, mut handle_a) = mock::pair::<Request<String>, Response<String>>();
    let (b, mut handle_b) = mock::pair::<Request<String>, Response<String>>();
    let a = layer.clone().layer(a);
    let b = layer.layer(b);
    let call = tokio::spawn(a.oneshot(request(Method::GET)));
    answer(&mut handle_a, Err(refused())).await;
    answer(&mut handle_a, Ok(status(200))).await;
    assert_eq!(attempts(&call.await.unwrap().unwrap()), Some(2));
    let call = tokio::spawn(b.oneshot(request(Method::GET)));
    answer(&mut handle_b, Err(refused())).await;
    assert!(call.await.unwrap().is_err(), "a spent the only retry");
}

#[tokio::test(start_paused = true)]
async fn a_custom_classifier_decides() {
    // Treats every error as a connection failure and 429 as retryable-when-idempotent.
    let classify = |result: Result<&Response<String>, &BoxError>| match result {
        Ok(r) if r.status() == 429 => Some(Failure::Status(503)),
        Ok(_) => None,
        Err(_) => Some(Failure::Connect),
    };
    let (service, mut handle) = mock::pair::<Request<String>, Response<String>>();
    let service = RetryLayer::new(&RetryConfig::default().with_max_attempts(3))
        .with_classify(classify)
        .layer(service);
    let call = tokio::spawn(service.oneshot(request(Method::POST)));
    answer(&mut handle, Err(reset())).await;
    answer(&mut handle, Ok(status(200))).await;
    assert_eq!(attempts(&call.await.unwrap().unwrap()), Some(2));
}

#[tokio::test(start_paused = true)]
async fn a_reqwest_request_is_replayed() {
    let (service, mut handle) = mock::pair::<reqwest::Request, Response<String>>();
    let service = RetryLayer::new(&RetryConfig::default()).layer(service);
    let client = reqwest::Client::new();
    let post = client
        .post("http://10.0.0.1:8080/v1")
        .body("x")
        .build()
        .unwrap();
    let call = tokio::spawn(service.oneshot(post));
    let (_, send) = handle.next_request().await.unwrap();
    send.send_error(refused());
    let (replayed, send) = handle.next_request().await.unwrap();
    assert_eq!(replayed.method(), Method::POST);
    send.send_response(status(200));
    assert_eq!(attempts(&call.await.unwrap().unwrap()), Some(2));
}

#[test]
fn replay_rules() {
    let get = request(Method::GET);
    assert!(get.idempotent());
    assert!(!request(Method::POST).idempotent());
    assert!(get.replay().is_some());
}

#[tokio::test(start_paused = true)]
async fn zero_max_attempts_means_one_attempt() {
    let (mut service, mut handle) = stack(&RetryConfig::default().with_max_attempts(0));
    let call = send(&mut service, request(Method::GET));
    answer(&mut handle, Err(refused())).await;
    assert!(call.await.unwrap().is_err());
    no_more_attempts(&mut handle);
}
