//! Readiness checks of the child: `--ready tcp` (connect), `--ready tcp://HOST:PORT`, or
//! `--ready http://HOST:PORT/path` (a 2xx answer), and the prober that repeats one.

use std::time::Duration;

use tokio::sync::mpsc;

/// One way to tell whether the child serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadyCheck {
    /// A TCP connect to `host:port` succeeds.
    Tcp(String),
    /// GET on the URL answers 2xx.
    Http(String),
}

impl ReadyCheck {
    /// Parses `--ready`: `tcp` (connect to 127.0.0.1:`port`), `tcp://HOST:PORT`, or
    /// `http://HOST:PORT/path`.
    ///
    /// # Errors
    /// Any other shape, named in the message.
    pub fn parse(spec: &str, port: u16) -> Result<Self, String> {
        const SHAPES: &str = "expected tcp, tcp://HOST:PORT or http://HOST:PORT/PATH";
        if spec == "tcp" {
            return Ok(Self::Tcp(format!("127.0.0.1:{port}")));
        }
        if let Some(addr) = spec.strip_prefix("tcp://") {
            gangway_core::validate::addr(addr).map_err(|e| format!("{spec:?}: {}", e.message))?;
            return Ok(Self::Tcp(addr.to_owned()));
        }
        if spec.starts_with("http://") {
            let url = reqwest::Url::parse(spec).map_err(|e| format!("{spec:?}: {e}"))?;
            if url.host_str().is_none_or(str::is_empty) {
                return Err(format!("{spec:?}: no host ({SHAPES})"));
            }
            return Ok(Self::Http(spec.to_owned()));
        }
        Err(format!("{SHAPES}, got {spec:?}"))
    }

    /// Runs the check once, bounded by `timeout`; `true` when the child is ready.
    pub async fn check(&self, http: &reqwest::Client, timeout: Duration) -> bool {
        match self {
            Self::Tcp(addr) => matches!(
                tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await,
                Ok(Ok(_))
            ),
            Self::Http(url) => match http.get(url).timeout(timeout).send().await {
                Ok(r) => r.status().is_success(),
                Err(_) => false,
            },
        }
    }
}

impl std::fmt::Display for ReadyCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tcp(addr) => write!(f, "tcp://{addr}"),
            Self::Http(url) => f.write_str(url),
        }
    }
}

/// Runs `check` every `interval` (each bounded by `timeout`) and sends each result; stops when
/// the receiver is dropped. The channel holds one result: a slow reader sees the latest ones,
/// the prober waits meanwhile.
pub fn spawn_prober(
    check: ReadyCheck,
    interval: Duration,
    timeout: Duration,
) -> mpsc::Receiver<bool> {
    let (tx, rx) = mpsc::channel(1);
    tokio::spawn(async move {
        let http = reqwest::Client::new();
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let ok = check.check(&http, timeout).await;
            if tx.send(ok).await.is_err() {
                break;
            }
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_or_say_what_is_expected() {
        assert_eq!(
            ReadyCheck::parse("tcp", 8080),
            Ok(ReadyCheck::Tcp("127.0.0.1:8080".into()))
        );
        assert_eq!(
            ReadyCheck::parse("tcp://127.0.0.1:9", 1),
            Ok(ReadyCheck::Tcp("127.0.0.1:9".into()))
        );
        assert_eq!(
            ReadyCheck::parse("http://127.0.0.1:8080/health", 1)
                .unwrap()
                .to_string(),
            "http://127.0.0.1:8080/health"
        );
        assert!(
            ReadyCheck::parse("https://x/", 1)
                .unwrap_err()
                .contains("expected tcp")
        );
        assert!(ReadyCheck::parse("tcp://nope", 1).is_err());
        assert!(
            ReadyCheck::parse("exec", 1)
                .unwrap_err()
                .contains("got \"exec\"")
        );
    }

    #[tokio::test]
    async fn tcp_and_http_checks_tell_a_listener_from_nothing() {
        let http = reqwest::Client::new();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let t = Duration::from_secs(2);
        assert!(
            ReadyCheck::parse("tcp", port)
                .unwrap()
                .check(&http, t)
                .await
        );
        let app = axum::Router::new()
            .route("/ok", axum::routing::get(|| async { "ok" }))
            .route(
                "/cold",
                axum::routing::get(|| async { axum::http::StatusCode::SERVICE_UNAVAILABLE }),
            );
        tokio::spawn(async move { axum::serve(listener, app).await });
        let url = |p: &str| ReadyCheck::Http(format!("http://127.0.0.1:{port}{p}"));
        assert!(url("/ok").check(&http, t).await);
        assert!(!url("/cold").check(&http, t).await, "503 is not ready");
        drop(http);
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let closed_port = closed.local_addr().unwrap().port();
        drop(closed);
        let http = reqwest::Client::new();
        assert!(
            !ReadyCheck::parse("tcp", closed_port)
                .unwrap()
                .check(&http, t)
                .await
        );
    }
}
