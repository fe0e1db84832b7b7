use std::io;

use super::*;

#[derive(Debug)]
struct Wrapper(io::Error);

impl std::fmt::Display for Wrapper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("wrapped")
    }
}

impl StdError for Wrapper {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&self.0)
    }
}

fn boxed(e: impl StdError + Send + Sync + 'static) -> BoxError {
    Box::new(e)
}

#[test]
fn connection_level_errors_anywhere_in_the_chain_are_connect_failures() {
    let refused = || io::Error::from(io::ErrorKind::ConnectionRefused);
    assert_eq!(classify_error(&refused()), Failure::Connect);
    assert_eq!(
        classify_error(&*boxed(Wrapper(refused()))),
        Failure::Connect
    );
    let shed = boxed(tower::load_shed::error::Overloaded::new());
    assert_eq!(classify_error(&*shed), Failure::Connect);
    let unreachable = io::Error::from(io::ErrorKind::AddrNotAvailable);
    assert_eq!(classify_error(&unreachable), Failure::Connect);
}

#[test]
fn other_errors_are_after_send() {
    let reset = io::Error::from(io::ErrorKind::ConnectionReset);
    assert_eq!(classify_error(&*boxed(Wrapper(reset))), Failure::AfterSend);
    let timeout = boxed(tower::timeout::error::Elapsed::new());
    assert_eq!(classify_error(&*timeout), Failure::AfterSend);
    // The message says "refused", the type does not: text is never read.
    let text = io::Error::other("connection refused");
    assert_eq!(classify_error(&text), Failure::AfterSend);
}

#[tokio::test]
async fn reqwest_connect_errors_are_connect_failures() {
    let port = closed_port();
    let error = reqwest::get(format!("http://127.0.0.1:{port}/"))
        .await
        .unwrap_err();
    assert_eq!(
        DefaultClassify.classify(Err::<&reqwest::Response, _>(&error)),
        Some(Failure::Connect)
    );
    let boxed: BoxError = Box::new(error);
    assert_eq!(classify_error(&*boxed), Failure::Connect);
}

#[test]
fn default_classify_fails_5xx_only() {
    let response = |code: u16| http::Response::builder().status(code).body(()).unwrap();
    let classify = |code| DefaultClassify.classify(Ok::<_, &BoxError>(&response(code)));
    assert_eq!(classify(200), None);
    assert_eq!(classify(404), None);
    assert_eq!(classify(429), None);
    assert_eq!(classify(500), Some(Failure::Status(500)));
    assert_eq!(classify(503), Some(Failure::Status(503)));
}

#[test]
fn outcomes_of_failures() {
    assert_eq!(outcome_of(None), Outcome::Success);
    assert_eq!(outcome_of(Some(Failure::Connect)), Outcome::ConnectFailure);
    assert_eq!(outcome_of(Some(Failure::AfterSend)), Outcome::NetworkError);
    assert_eq!(outcome_of(Some(Failure::Status(502))), Outcome::ServerError);
    assert_eq!(outcome_of(Some(Failure::Status(429))), Outcome::Success);
}

#[tokio::test]
async fn hyper_util_connect_errors_are_connect_failures() {
    let port = closed_port();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<String>();
    let uri: http::Uri = format!("http://127.0.0.1:{port}/").parse().unwrap();
    let error = client.get(uri).await.unwrap_err();
    assert!(error.is_connect());
    assert_eq!(classify_error(error.as_std_error()), Failure::Connect);
}

/// A port that was just free: nothing listens there.
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap()
}
