use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use super::*;

const SHORT: Duration = Duration::from_millis(300);

/// A served readiness on 127.0.0.1 with a header timeout of [`SHORT`].
async fn served() -> (Readiness, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let readiness = Readiness::unserved();
    tokio::spawn(serve_on(listener, readiness.router(), SHORT, 4));
    (readiness, addr)
}

/// Reads until the server closes the connection, at most 5 s; what it sent and when it closed.
async fn until_closed(stream: &mut TcpStream) -> (String, Instant) {
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        let mut buf = [0u8; 1024];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(read.is_ok(), "the connection stayed open: {got:?}");
    (String::from_utf8_lossy(&got).into_owned(), Instant::now())
}

async fn get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let head = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    s.write_all(head.as_bytes()).await.unwrap();
    until_closed(&mut s).await.0
}

#[tokio::test]
async fn ready_is_200_only_in_the_ready_state() {
    let (readiness, addr) = served().await;
    for (state, status, name) in [
        (ReadyState::Starting, "503", "starting"),
        (ReadyState::Ready, "200", "ready"),
        (ReadyState::Offline, "503", "offline"),
        (ReadyState::Unhealthy, "503", "unhealthy"),
        (ReadyState::Draining, "503", "draining"),
    ] {
        readiness.set(state);
        let answer = get(addr, "/ready").await;
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status}")),
            "{answer}"
        );
        assert!(
            answer.ends_with(&format!(r#"{{"state":"{name}"}}"#)),
            "{answer}"
        );
    }
    assert!(get(addr, "/live").await.starts_with("HTTP/1.1 200"));
}

#[tokio::test]
async fn a_silent_or_slow_head_is_cut_off_at_the_header_timeout() {
    let (_readiness, addr) = served().await;
    // Nothing sent at all.
    let opened = Instant::now();
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let (_, closed) = until_closed(&mut silent).await;
    let waited = closed - opened;
    assert!(waited >= SHORT - Duration::from_millis(50), "{waited:?}");
    // Half a head, then nothing.
    let opened = Instant::now();
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET /ready HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let (_, closed) = until_closed(&mut slow).await;
    let waited = closed - opened;
    assert!(waited >= SHORT - Duration::from_millis(50), "{waited:?}");
    println!("readiness port: silent and half heads closed after about {SHORT:?}");
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_after_the_timeout() {
    let (readiness, addr) = served().await;
    readiness.set(ReadyState::Ready);
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /ready HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let answered = Instant::now();
    let (answer, closed) = until_closed(&mut s).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let idle = closed - answered;
    assert!(
        idle >= SHORT - Duration::from_millis(50),
        "closed too early: {idle:?}"
    );
}
