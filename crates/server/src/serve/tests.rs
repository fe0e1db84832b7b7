//! The serving layer: head limits (pure), then real sockets on 127.0.0.1 against a started
//! server: timeouts, counts, refusals and the stop.

use std::sync::Arc;
use std::time::Duration;

use gangway_proto::v1 as pb;
use gangway_testkit::poll;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use super::head::{MAX_HEAD, MAX_HEADERS, MAX_LINE, Scan, Verdict};
use crate::config::{Config, Connections};
use crate::error::ApiError;

// ---- head limits ----

fn feed_all(scan: &mut Scan, bytes: &[u8]) -> Verdict {
    scan.feed(bytes, false)
}

fn code(v: &Verdict) -> String {
    match v {
        Verdict::Reject(e) => e.code().to_string(),
        Verdict::Pass => "pass".to_owned(),
        Verdict::Http2 => "http2".to_owned(),
    }
}

#[test]
fn ordinary_heads_pass_one_byte_at_a_time_or_at_once() {
    let head =
        b"\r\nGET /v1/services?namespace=public HTTP/1.1\r\nhost: 127.0.0.1\r\naccept: */*\r\n\r\n";
    let mut scan = Scan::default();
    for b in head {
        assert_eq!(scan.feed(std::slice::from_ref(b), false), Verdict::Pass);
    }
    let mut scan = Scan::default();
    assert_eq!(feed_all(&mut scan, head), Verdict::Pass);
}

#[test]
fn a_long_request_line_is_414_and_a_long_header_line_431() {
    let mut scan = Scan::default();
    let path = "a".repeat(MAX_LINE);
    let v = feed_all(&mut scan, format!("GET /{path} HTTP/1.1\r\n").as_bytes());
    assert_eq!(v, Verdict::Reject(ApiError::UriTooLong { limit: MAX_LINE }));

    let mut scan = Scan::default();
    let fine = "a".repeat(MAX_LINE - 20);
    assert_eq!(
        feed_all(&mut scan, format!("GET /{fine} HTTP/1.1\r\n").as_bytes()),
        Verdict::Pass,
        "a request line just under the limit passes"
    );
    let value = "v".repeat(MAX_LINE);
    let v = feed_all(&mut scan, format!("x-big: {value}\r\n").as_bytes());
    assert_eq!(code(&v), "headers_too_large");
}

#[test]
fn a_large_head_and_too_many_headers_are_431() {
    let mut scan = Scan::default();
    assert_eq!(feed_all(&mut scan, b"GET / HTTP/1.1\r\n"), Verdict::Pass);
    let line = format!("x-h: {}\r\n", "v".repeat(1000));
    let mut verdict = Verdict::Pass;
    for _ in 0..(MAX_HEAD / line.len() + 1) {
        verdict = feed_all(&mut scan, line.as_bytes());
        if verdict != Verdict::Pass {
            break;
        }
    }
    match verdict {
        Verdict::Reject(ApiError::HeadersTooLarge { message }) => {
            assert!(message.contains(&MAX_HEAD.to_string()), "{message}")
        }
        other => panic!("expected 431, got {other:?}"),
    }

    let many = |n: usize| {
        let mut head = String::from("GET / HTTP/1.1\r\n");
        for i in 0..n {
            head.push_str(&format!("x-{i}: 1\r\n"));
        }
        head.push_str("\r\n");
        head
    };
    let mut scan = Scan::default();
    assert_eq!(
        feed_all(&mut scan, many(MAX_HEADERS).as_bytes()),
        Verdict::Pass
    );
    let mut scan = Scan::default();
    match feed_all(&mut scan, many(MAX_HEADERS + 1).as_bytes()) {
        Verdict::Reject(ApiError::HeadersTooLarge { message }) => {
            assert!(message.contains("100 header fields"), "{message}")
        }
        other => panic!("expected 431, got {other:?}"),
    }
}

#[test]
fn bodies_are_skipped_by_their_length_and_the_next_head_is_scanned() {
    let mut scan = Scan::default();
    let body = "x".repeat(MAX_HEAD * 2); // longer than any head limit, no line end
    let post = format!(
        "POST /v1/x HTTP/1.1\r\ncontent-length: {}\r\n\r\n{}",
        body.len(),
        &body[..100]
    );
    assert_eq!(feed_all(&mut scan, post.as_bytes()), Verdict::Pass);
    scan.request_started();
    assert_eq!(scan.feed(&body.as_bytes()[100..200], true), Verdict::Pass);
    // The answer went out before the body was read; the rest of it follows the end.
    scan.request_ended();
    assert_eq!(scan.feed(&body.as_bytes()[200..], false), Verdict::Pass);
    let long = "a".repeat(MAX_LINE + 1);
    let v = feed_all(&mut scan, format!("GET /{long}").as_bytes());
    assert_eq!(code(&v), "uri_too_long", "the next head is scanned");
}

#[test]
fn unknown_body_lengths_and_pipelining_stop_the_scan() {
    let long = format!("GET /{} HTTP/1.1\r\n", "a".repeat(MAX_LINE + 1));

    let mut scan = Scan::default();
    let chunked = "POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n";
    assert_eq!(feed_all(&mut scan, chunked.as_bytes()), Verdict::Pass);
    scan.request_started();
    scan.request_ended();
    assert_eq!(feed_all(&mut scan, long.as_bytes()), Verdict::Pass);

    let mut scan = Scan::default();
    let two = "GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\n";
    assert_eq!(feed_all(&mut scan, two.as_bytes()), Verdict::Pass);
    scan.request_started();
    scan.request_ended();
    assert_eq!(feed_all(&mut scan, long.as_bytes()), Verdict::Pass);
}

#[test]
fn http2_prior_knowledge_is_not_scanned() {
    let mut scan = Scan::default();
    assert_eq!(
        feed_all(&mut scan, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
        Verdict::Http2
    );
    assert_eq!(feed_all(&mut scan, &[b'a'; MAX_HEAD * 2]), Verdict::Pass);
}

// ---- accept backoff ----

#[tokio::test(start_paused = true)]
async fn failing_accepts_back_off_doubling_and_an_episode_ends_after_a_quiet_second() {
    use super::accept::{BACKOFF_MAX, BACKOFF_MIN, Backoff};
    let emfile = std::io::Error::from_raw_os_error(24);
    let mut b = Backoff::new();
    let waits: Vec<Duration> = (0..10).map(|_| b.failed("http", &emfile)).collect();
    assert_eq!(waits[0], BACKOFF_MIN);
    assert_eq!(waits[1], BACKOFF_MIN * 2);
    assert!(waits.windows(2).all(|w| w[1] >= w[0]), "{waits:?}");
    assert_eq!(*waits.last().unwrap(), BACKOFF_MAX, "capped");
    // An accept right after a failure is the same episode: the backoff stays.
    b.succeeded("http");
    assert_eq!(b.failed("http", &emfile), BACKOFF_MAX);
    // A second without failures ends it: the next failure starts at the minimum again.
    tokio::time::advance(BACKOFF_MAX).await;
    b.succeeded("http");
    assert_eq!(b.failed("http", &emfile), BACKOFF_MIN);
}

// ---- real sockets ----

/// A slack for scheduling on a loaded machine: a close must come after its timeout and
/// within this of it.
const SLACK: Duration = Duration::from_secs(2);

async fn server(connections: Connections) -> crate::RunningServer {
    crate::start_in_memory(Config {
        connections,
        ..Config::for_tests()
    })
    .await
    .expect("server starts")
}

fn limits(header: Duration, idle: Duration) -> Connections {
    Connections {
        http_header_timeout: header,
        http_idle_timeout: idle,
        grpc_handshake_timeout: header,
        ..Connections::default()
    }
}

/// Reads until the peer closes; returns what was read and how long the close took from
/// `since`. Panics after `bound`.
async fn until_closed(
    stream: &mut TcpStream,
    since: Instant,
    bound: Duration,
) -> (Vec<u8>, Duration) {
    let mut out = Vec::new();
    let read = tokio::time::timeout(bound, async {
        let mut buf = [0u8; 8192];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(
        read.is_ok(),
        "the server did not close the connection within {bound:?}"
    );
    (out, since.elapsed())
}

/// The status and JSON body of a raw HTTP/1.1 answer.
fn parse_answer(raw: &[u8]) -> (u16, Value) {
    let text = String::from_utf8_lossy(raw);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("");
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_silent_connection_is_closed_after_the_header_timeout() {
    let header = Duration::from_millis(400);
    let s = server(limits(header, Duration::from_secs(30))).await;
    let since = Instant::now();
    let mut stream = TcpStream::connect(s.http_addr).await.unwrap();
    let (_, took) = until_closed(&mut stream, since, header + SLACK).await;
    println!("silent HTTP connection closed after {took:?} (header timeout {header:?})");
    assert!(took >= header, "closed too early: {took:?}");
}

#[tokio::test]
async fn a_head_trickling_in_is_closed_within_the_header_timeout() {
    let header = Duration::from_millis(600);
    let s = server(limits(header, Duration::from_secs(30))).await;
    let mut stream = TcpStream::connect(s.http_addr).await.unwrap();
    let since = Instant::now();
    let head =
        b"GET /v1/health HTTP/1.1\r\nhost: 127.0.0.1\r\nx-slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    let (mut reader, mut writer) = stream.split();
    let trickle = async {
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        for b in head {
            tick.tick().await;
            if writer.write_all(std::slice::from_ref(b)).await.is_err() {
                break;
            }
        }
    };
    let closed = async {
        let mut buf = [0u8; 64];
        loop {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => return since.elapsed(),
                Ok(_) => {}
            }
        }
    };
    let took = tokio::time::timeout(header + SLACK, async {
        tokio::select! {
            took = closed => took,
            () = trickle => panic!("the whole trickle was accepted"),
        }
    })
    .await
    .expect("closed in time");
    println!("slow head closed after {took:?} (header timeout {header:?}, 1 byte / 50 ms)");
    assert!(took >= header, "closed too early: {took:?}");
}

#[tokio::test]
async fn a_body_that_stops_arriving_is_answered_408_after_the_header_timeout() {
    let header = Duration::from_millis(400);
    let s = server(limits(header, Duration::from_secs(30))).await;
    let mut stream = TcpStream::connect(s.http_addr).await.unwrap();
    let head = "POST /v1/services/stalled/instances HTTP/1.1\r\nhost: 127.0.0.1\r\n\
                content-type: application/json\r\ncontent-length: 100\r\n\r\n{\"ip\":";
    stream.write_all(head.as_bytes()).await.unwrap();
    let since = Instant::now();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(header + SLACK, stream.read(&mut buf))
        .await
        .expect("answered in time")
        .unwrap();
    let took = since.elapsed();
    let (status, body) = parse_answer(&buf[..n]);
    println!("body stalled after 6 of 100 bytes: {status} after {took:?} {body}");
    assert_eq!(status, 408);
    assert_eq!(body["error"]["code"], "request_timeout", "{body}");
    assert!(took >= header, "{took:?}");
    assert!(
        s.registry
            .entries(&gangway_core::model::ServiceKey::named("stalled"))
            .1
            .is_empty()
    );
}

#[tokio::test]
async fn a_body_trickling_in_is_answered_408_at_the_body_timeout() {
    // A byte every 100 ms never stalls for the header timeout (30 s), so only the bound on
    // the whole body ends it.
    let total = Duration::from_millis(800);
    let s = server(Connections {
        http_body_timeout: total,
        ..limits(Duration::from_secs(30), Duration::from_secs(30))
    })
    .await;
    let mut stream = TcpStream::connect(s.http_addr).await.unwrap();
    let head = "POST /v1/services/trickled/instances HTTP/1.1\r\nhost: 127.0.0.1\r\n\
                content-type: application/json\r\ncontent-length: 200\r\n\r\n";
    stream.write_all(head.as_bytes()).await.unwrap();
    let since = Instant::now();
    let (mut reader, mut writer) = stream.split();
    let trickle = async {
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        for _ in 0..200 {
            tick.tick().await;
            if writer.write_all(b" ").await.is_err() {
                break;
            }
        }
        std::future::pending::<()>().await;
    };
    let answer = async {
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => return out,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    };
    let raw = tokio::time::timeout(total + SLACK, async {
        tokio::select! {
            raw = answer => raw,
            () = trickle => unreachable!(),
        }
    })
    .await
    .expect("answered and closed within the body timeout");
    let took = since.elapsed();
    let (status, body) = parse_answer(&raw);
    println!("body trickling at 10 B/s: {status} after {took:?} {body}");
    assert_eq!(status, 408);
    assert_eq!(body["error"]["code"], "request_timeout", "{body}");
    assert!(
        String::from_utf8_lossy(&raw).contains("connection: close"),
        "{raw:?}"
    );
    assert!(took >= total, "{took:?}");
}

#[tokio::test]
async fn an_idle_keep_alive_connection_lasts_the_idle_timeout_not_the_header_timeout() {
    let (header, idle) = (Duration::from_millis(300), Duration::from_millis(1500));
    let s = server(limits(header, idle)).await;
    let mut stream = TcpStream::connect(s.http_addr).await.unwrap();
    // From before the request: the server's idle clock starts later (after its answer), so
    // `took` can only overstate the idle time, never understate it.
    let since = Instant::now();
    stream
        .write_all(b"GET /v1/health HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = stream.read(&mut buf).await.unwrap();
    assert!(
        buf[..n].starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&buf[..n])
    );
    let (_, took) = until_closed(&mut stream, since, idle + SLACK).await;
    println!(
        "idle keep-alive connection closed after {took:?} (idle timeout {idle:?}, header {header:?})"
    );
    assert!(took >= idle, "closed before the idle timeout: {took:?}");
}

#[tokio::test]
async fn a_watch_in_flight_outlives_both_timeouts() {
    let (header, idle) = (Duration::from_millis(200), Duration::from_millis(300));
    let s = server(limits(header, idle)).await;
    let response = reqwest::get(format!("http://{}/v1/services/w/watch", s.http_addr))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.bytes_stream();
    use futures::StreamExt;
    let started = Instant::now();
    let mut chunks = 0;
    // SSE keep-alives arrive every second: three of them span both timeouts many times over.
    while started.elapsed() < Duration::from_millis(2500) {
        let next = tokio::time::timeout(Duration::from_secs(2), body.next())
            .await
            .expect("the watch still sends");
        assert!(matches!(next, Some(Ok(_))), "the watch ended: {next:?}");
        chunks += 1;
    }
    assert!(chunks >= 2);
}

/// One HTTP/2 (prior knowledge) GET on a fresh connection: status and JSON body.
async fn h2c_get(
    addr: std::net::SocketAddr,
    path: &str,
    headers: &[(String, String)],
) -> (u16, Value) {
    use http_body_util::BodyExt as _;
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (mut h2, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(connection);
    let mut request = http::Request::get(format!("http://127.0.0.1{path}"));
    for (name, value) in headers {
        request = request.header(name, value);
    }
    let request = request
        .body(http_body_util::Empty::<axum::body::Bytes>::new())
        .unwrap();
    let response = h2.send_request(request).await.expect("an answer");
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

#[tokio::test]
async fn h2c_heads_have_the_http1_limits_and_the_json_answers() {
    let s = server(Connections::default()).await;
    let big = |n: usize, len: usize| -> Vec<(String, String)> {
        (0..n)
            .map(|i| (format!("x-big-{i}"), "v".repeat(len)))
            .collect()
    };
    // Over MAX_LINE: 414 with the JSON body, as on HTTP/1.
    let path = format!("/v1/services/{}", "a".repeat(MAX_LINE));
    let (status, body) = h2c_get(s.http_addr, &path, &[]).await;
    println!("h2c, {} B path: {status} {body}", path.len());
    assert_eq!(status, 414);
    assert_eq!(body["error"]["code"], "uri_too_long", "{body}");
    // 21 KB of headers: within the HTTP/1 head limit (hyper's HTTP/2 default, 16 KiB, would
    // refuse it with an empty 431).
    let (status, body) = h2c_get(s.http_addr, "/v1/health", &big(3, 7000)).await;
    println!("h2c, 21 KB of headers: {status} {body}");
    assert_eq!(status, 200, "{body}");
    // 35 KB of headers: over MAX_HEAD.
    let (status, body) = h2c_get(s.http_addr, "/v1/health", &big(5, 7000)).await;
    println!("h2c, 35 KB of headers: {status} {body}");
    assert_eq!(status, 431);
    assert_eq!(body["error"]["code"], "headers_too_large", "{body}");
    // One header line over MAX_LINE.
    let (status, body) = h2c_get(s.http_addr, "/v1/health", &big(1, MAX_LINE)).await;
    assert_eq!(status, 431);
    assert_eq!(body["error"]["code"], "headers_too_large", "{body}");
    // More than MAX_HEADERS small fields.
    let (status, body) = h2c_get(s.http_addr, "/v1/health", &big(MAX_HEADERS + 1, 1)).await;
    println!("h2c, {} header fields: {status} {body}", MAX_HEADERS + 1);
    assert_eq!(status, 431);
    assert_eq!(
        body["error"]["message"],
        format!("more than {MAX_HEADERS} header fields")
    );
}

#[test]
fn the_parsed_head_check_never_refuses_what_the_scan_passes() {
    // A head exactly at the scan's limits passes both.
    let target = format!("/{}", "a".repeat(MAX_LINE - "GET / HTTP/1.1\r".len()));
    let raw = format!("GET {target} HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n");
    let mut scan = Scan::default();
    assert_eq!(feed_all(&mut scan, raw.as_bytes()), Verdict::Pass);
    let request = http::Request::get(target.as_str())
        .header("host", "x")
        .body(())
        .unwrap();
    assert!(super::head::check(&request).is_none());
    let longer = http::Request::get(format!("{target}aa").as_str())
        .body(())
        .unwrap();
    assert_eq!(
        super::head::check(&longer).map(|e| e.code()),
        Some(gangway_wire::ErrorCode::UriTooLong)
    );
}

#[tokio::test]
async fn oversized_heads_get_the_json_error_shape() {
    let s = server(Connections::default()).await;
    let client = reqwest::Client::new();
    // 100 KB path (raw: the http crate refuses URIs over 64 KiB itself): hyper alone would
    // answer 414 with an empty body.
    let path = "a".repeat(100 * 1024);
    let mut stream = TcpStream::connect(s.http_addr).await.unwrap();
    let request = format!("GET /v1/services/{path} HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .expect("the whole request is read");
    let (raw, _) = until_closed(&mut stream, Instant::now(), SLACK).await;
    let (status, body) = parse_answer(&raw);
    println!("100 KB path: {status} {body}");
    assert_eq!(status, 414);
    assert_eq!(body["error"]["code"], "uri_too_long", "{body}");

    // 600 KB of headers: hyper would answer 431 with an empty body.
    let mut request = client.get(format!("http://{}/v1/health", s.http_addr));
    for i in 0..60 {
        request = request.header(format!("x-big-{i}"), "v".repeat(8000));
    }
    let response = request.send().await.expect("an answer");
    assert_eq!(response.status(), 431);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "headers_too_large", "{body}");
    println!("480 KB of headers: 431 {body}");

    // 150 small headers: hyper would refuse more than 100 with an empty 431.
    let mut head = String::from("GET /v1/health HTTP/1.1\r\nhost: 127.0.0.1\r\n");
    for i in 0..150 {
        head.push_str(&format!("x-{i}: 1\r\n"));
    }
    head.push_str("\r\n");
    let mut stream = TcpStream::connect(s.http_addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    let (raw, _) = until_closed(&mut stream, Instant::now(), SLACK).await;
    let (status, body) = parse_answer(&raw);
    assert_eq!(status, 431);
    assert_eq!(body["error"]["code"], "headers_too_large", "{body}");

    // The connection that was refused is closed; others are served as usual.
    let ok = client
        .get(format!("http://{}/v1/health", s.http_addr))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
}

#[tokio::test]
async fn keep_alive_requests_with_bodies_are_not_mistaken_for_heads() {
    let s = server(Connections::default()).await;
    let client = reqwest::Client::new();
    // One connection (reqwest keeps it alive): a large JSON body between two requests.
    let metadata: serde_json::Map<String, Value> = (0..50)
        .map(|i| (format!("k{i}"), Value::String("v".repeat(300))))
        .collect();
    for round in 0..3 {
        let response = client
            .post(format!(
                "http://{}/v1/services/bodies/instances",
                s.http_addr
            ))
            .json(
                &serde_json::json!({"ip": "10.0.0.1", "port": 8000 + round, "metadata": metadata}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
        let listed = client
            .get(format!(
                "http://{}/v1/services/bodies/instances",
                s.http_addr
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(listed.status(), 200);
    }
}

#[tokio::test]
async fn connections_beyond_the_maximum_get_a_clear_refusal_and_the_others_stay() {
    let s = server(Connections {
        http_max: Some(2),
        grpc_max: Some(1),
        ..Connections::default()
    })
    .await;
    assert_eq!(s.max_connections, (2, 1));
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(served_connection(s.http_addr).await);
    }
    refused_get(
        s.http_addr,
        "3rd HTTP connection with a maximum of 2",
        "maximum of 2",
    )
    .await;
    // The held connections still work.
    for c in &mut held {
        health_on(c).await;
    }
    // A freed slot is used again.
    drop(held.pop());
    let ok = health_within(s.http_addr, SLACK).await;
    assert!(ok.is_some(), "a freed slot is served again");

    // gRPC: one session holds the only slot; a second connection gets UNAVAILABLE.
    let (_session, mut pushes) = open_session(s.grpc_addr).await;
    refused_session(
        s.grpc_addr,
        "2nd gRPC connection with a maximum of 1",
        "maximum of 1 gRPC",
    )
    .await;
    // The first session is untouched.
    assert!(s.registry.session_count() == 1);
    assert!(
        tokio::time::timeout(Duration::from_millis(200), pushes.message())
            .await
            .is_err(),
        "the session stays open and quiet"
    );
}

#[tokio::test]
async fn both_ports_together_stay_within_three_quarters_of_the_fd_limit() {
    // A lowered limit of 32 descriptors: a budget of 24 connections for both ports, although
    // each port alone may hold 20.
    let s = server(Connections {
        http_max: Some(20),
        grpc_max: Some(20),
        fd_limit: Some(32),
        ..Connections::default()
    })
    .await;
    assert_eq!(s.max_connections, (20, 20));
    assert_eq!(s.connection_budget, 24);
    let mut held = Vec::new();
    for _ in 0..16 {
        held.push(served_connection(s.http_addr).await);
    }
    let mut sessions = Vec::new();
    for _ in 0..8 {
        sessions.push(open_session(s.grpc_addr).await);
    }
    assert_eq!(s.registry.session_count(), 8);
    // The 25th connection: the gRPC port is below its own maximum, the budget is not.
    refused_session(
        s.grpc_addr,
        "25th connection on gRPC",
        "maximum of 24 connections across its HTTP and gRPC ports",
    )
    .await;
    // And on HTTP: the 503 JSON refusal, naming the shared budget.
    refused_get(s.http_addr, "25th connection on HTTP", "open-file limit 32").await;
    // A connection that closes frees its share for either port.
    drop(held.pop());
    let ok = health_within(s.http_addr, SLACK).await;
    assert!(ok.is_some(), "a freed share is served again");
    assert_eq!(s.registry.session_count(), 8, "the sessions stay");
}

#[test]
fn explicit_maximums_above_the_fd_limit_are_bounded_together() {
    let caps = super::caps(&Connections {
        http_max: Some(5000),
        grpc_max: Some(5000),
        fd_limit: Some(1024),
        ..Connections::default()
    });
    assert_eq!((caps.http, caps.grpc, caps.budget), (5000, 5000, 768));
    assert_eq!(caps.refusals, 64);
    let derived = super::caps(&Connections {
        fd_limit: Some(256),
        ..Connections::default()
    });
    assert_eq!((derived.http, derived.grpc, derived.budget), (96, 96, 192));
    assert_eq!(
        derived.refusals, 16,
        "refusals fit in the reserve of 64 descriptors"
    );
}

/// An HTTP connection that was served one request (so it holds a slot), kept open.
async fn served_connection(addr: std::net::SocketAddr) -> TcpStream {
    let mut c = TcpStream::connect(addr).await.unwrap();
    health_on(&mut c).await;
    c
}

/// A `/v1/health` request on `c`, which must answer 200.
async fn health_on(c: &mut TcpStream) {
    c.write_all(b"GET /v1/health HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = c.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
}

/// Whether `/v1/health` answers 200 within `deadline` (polled).
async fn health_within(addr: std::net::SocketAddr, deadline: Duration) -> Option<()> {
    poll(deadline, || async {
        let r = reqwest::get(format!("http://{addr}/v1/health"))
            .await
            .ok()?;
        (r.status() == 200).then_some(())
    })
    .await
}

/// A GET on a new HTTP connection the port refuses (`what` names it in the output), read
/// until the server closes it: it must be a 503 `overloaded` whose message contains
/// `expected`.
async fn refused_get(addr: std::net::SocketAddr, what: &str, expected: &str) {
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(b"GET /v1/health HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let (raw, took) = until_closed(&mut c, Instant::now(), SLACK).await;
    let (status, body) = parse_answer(&raw);
    println!("{what}: {status} {body} (closed after {took:?})");
    assert_eq!(status, 503);
    assert_eq!(body["error"]["code"], "overloaded");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(expected), "{body}");
}

/// Opens a session on a connection the gRPC port refuses (`what` names it in the output):
/// it must fail with UNAVAILABLE and a message containing `expected`.
async fn refused_session(addr: std::net::SocketAddr, what: &str, expected: &str) {
    let mut client = pb::registry_client::RegistryClient::connect(format!("http://{addr}"))
        .await
        .expect("TCP and HTTP/2 are accepted before the refusal");
    let (_tx, rx) = tokio::sync::mpsc::channel(1);
    let refused = client
        .session(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect_err("refused");
    println!("{what}: {:?} {}", refused.code(), refused.message());
    assert_eq!(refused.code(), tonic::Code::Unavailable);
    assert!(
        refused.message().contains(expected),
        "{}",
        refused.message()
    );
}

static NEXT_CLIENT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Opens a native session: returns its sender and its inbound stream after `Welcome`.
async fn open_session(
    addr: std::net::SocketAddr,
) -> (
    tokio::sync::mpsc::Sender<pb::ClientMessage>,
    tonic::Streaming<pb::ServerMessage>,
) {
    let mut client = pb::registry_client::RegistryClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tx.send(pb::ClientMessage {
        request_id: 0,
        kind: Some(pb::client_message::Kind::Hello(pb::Hello {
            client_name: "test".into(),
            client_id: format!(
                "c{}",
                NEXT_CLIENT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            ),
        })),
    })
    .await
    .unwrap();
    let mut inbound = client
        .session(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let welcome = inbound.message().await.unwrap().unwrap();
    assert!(matches!(
        welcome.kind,
        Some(pb::server_message::Kind::Welcome(_))
    ));
    (tx, inbound)
}

#[tokio::test]
async fn a_grpc_connection_without_the_preface_is_closed_after_the_handshake_timeout() {
    let handshake = Duration::from_millis(400);
    let s = server(limits(handshake, Duration::from_secs(30))).await;
    // An established session outlives the handshake timeout.
    let (_session, mut pushes) = open_session(s.grpc_addr).await;
    let since = Instant::now();
    let mut silent = TcpStream::connect(s.grpc_addr).await.unwrap();
    let (_, took) = until_closed(&mut silent, since, handshake + SLACK).await;
    println!(
        "gRPC connection without a preface closed after {took:?} (handshake timeout {handshake:?})"
    );
    assert!(took >= handshake, "closed too early: {took:?}");
    let mut partial = TcpStream::connect(s.grpc_addr).await.unwrap();
    let since = Instant::now();
    partial.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    let (_, took) = until_closed(&mut partial, since, handshake + SLACK).await;
    assert!(
        took >= handshake - Duration::from_millis(50),
        "closed too early: {took:?}"
    );
    assert_eq!(s.registry.session_count(), 1, "the session survives");
    assert!(
        tokio::time::timeout(Duration::from_millis(100), pushes.message())
            .await
            .is_err(),
        "the session stays open"
    );
}

// ---- the stop ----

/// A server on loopback over `store`.
async fn start_on(config: Config, store: Arc<dyn gangway_store::Store>) -> crate::RunningServer {
    let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = crate::start(config, store, http, grpc).await.unwrap();
    server.loaded().await.unwrap();
    server
}

#[tokio::test]
async fn a_stop_with_an_open_session_and_watch_is_bounded_and_frees_the_data_dir() {
    let data = tempfile::tempdir().unwrap();
    let config = Config::for_tests();
    let redb = |dir: &std::path::Path| -> Arc<dyn gangway_store::Store> {
        Arc::new(gangway_store_redb::RedbStore::open(dir).expect("the data dir opens"))
    };
    let s = start_on(config.clone(), redb(data.path())).await;
    let (_session, mut inbound) = open_session(s.grpc_addr).await;
    let watch = reqwest::get(format!("http://{}/v1/services/w/watch", s.http_addr))
        .await
        .unwrap();
    let mut watch = watch.bytes_stream();
    use futures::StreamExt;
    let first = watch.next().await;
    assert!(
        matches!(first, Some(Ok(_))),
        "the watch sends its first snapshot"
    );

    let report = tokio::time::timeout(Duration::from_secs(4), s.shutdown())
        .await
        .expect("the stop is bounded");
    println!("stop with a session and a watch open: {report:?}");
    assert!(report.elapsed < Duration::from_secs(2), "{report:?}");
    assert_eq!(report.http.dropped + report.grpc.dropped, 0, "{report:?}");
    assert!(report.engine.store_released);

    // The session was told, then its stream ended.
    let go_away = tokio::time::timeout(SLACK, inbound.message())
        .await
        .unwrap();
    match go_away {
        Ok(Some(pb::ServerMessage {
            kind: Some(pb::server_message::Kind::GoAway(g)),
        })) => assert_eq!(g.reason, crate::grpc::GO_AWAY_REASON),
        other => panic!("expected GoAway, got {other:?}"),
    }
    let end = tokio::time::timeout(SLACK, inbound.message())
        .await
        .unwrap();
    assert!(matches!(end, Ok(None) | Err(_)), "{end:?}");
    // The watch ended.
    let rest = tokio::time::timeout(SLACK, async {
        while let Some(Ok(_)) = watch.next().await {}
    })
    .await;
    assert!(rest.is_ok(), "the watch ended");

    // A second server opens the same data directory at once.
    let again = start_on(config, redb(data.path())).await;
    again.shutdown().await;
}

#[tokio::test]
async fn a_stop_drops_what_outlives_its_timeout() {
    let config = Config {
        shutdown_timeout: Duration::from_millis(500),
        ..Config::for_tests()
    };
    let s = crate::start_in_memory(config).await.unwrap();
    let client = reqwest::Client::new();
    let base = format!("http://{}/v1/services/d/instances", s.http_addr);
    for port in [1, 2] {
        let r = client
            .post(&base)
            .json(&serde_json::json!({"ip": "10.0.0.1", "port": port}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    // A poller that never acks the drain's revision keeps the drain waiting for 30 s.
    let listed = client
        .get(format!("{base}?subscriber=never"))
        .send()
        .await
        .unwrap();
    assert_eq!(listed.status(), 200);
    let drain = tokio::spawn(
        client
            .post(format!("{base}/10.0.0.1:1/drain"))
            .header("content-type", "application/json")
            .body(r#"{"timeout_ms":30000}"#)
            .send(),
    );
    let waiting = poll(SLACK, || async {
        let view = s
            .registry
            .view(&gangway_core::model::ServiceKey::named("d"));
        let key = gangway_core::model::InstanceKey::new("10.0.0.1", 1, "");
        (!view.contains(&key)).then_some(())
    })
    .await;
    assert!(
        waiting.is_some(),
        "the drain took the instance out and waits"
    );
    let report = s.shutdown().await;
    println!("stop with a drain waiting for 30 s: {report:?}");
    assert_eq!(report.http.dropped, 1, "{report:?}");
    assert!(report.elapsed >= Duration::from_millis(500), "{report:?}");
    assert!(
        report.elapsed < Duration::from_millis(500) + SLACK,
        "{report:?}"
    );
    assert!(
        drain.await.unwrap().is_err(),
        "the dropped request got no answer"
    );
}

/// An HTTP/1.1 connection from `from` (any 127.0.0.0/8 address) that got one answer.
async fn health_from(from: [u8; 4], to: std::net::SocketAddr) -> (TcpStream, Vec<u8>) {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket
        .bind((std::net::Ipv4Addr::from(from), 0).into())
        .unwrap();
    let mut c = socket.connect(to).await.unwrap();
    c.write_all(b"GET /v1/health HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = c.read(&mut buf).await.unwrap();
    buf.truncate(n);
    (c, buf)
}

#[tokio::test]
async fn connections_beyond_the_per_address_maximum_are_refused_naming_the_limit() {
    let s = server(Connections {
        per_address_max: 2,
        ..Connections::default()
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let (c, answer) = health_from([127, 0, 0, 1], s.http_addr).await;
        assert!(answer.starts_with(b"HTTP/1.1 200"));
        held.push(c);
    }
    refused_get(
        s.http_addr,
        "3rd HTTP connection from one address with a maximum of 2",
        "connections-per-address",
    )
    .await;
    // Another address has its own count; the held connections still work.
    let (_other, answer) = health_from([127, 0, 0, 2], s.http_addr).await;
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "another address is served"
    );
    for c in &mut held {
        health_on(c).await;
    }
    // A closed connection frees its address's slot.
    drop(held.pop());
    let ok = health_within(s.http_addr, SLACK).await;
    assert!(ok.is_some(), "a freed slot is served again");
}
