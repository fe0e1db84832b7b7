//! What gangway's tests share. Tests synchronise by polling a condition with a deadline,
//! never by sleeping a guessed time (STYLE: "no `sleep` as synchronisation"). Both helpers use
//! tokio's clock, so they also work under `#[tokio::test(start_paused = true)]`. With the
//! feature `tls`, [`tls`] makes a private CA and certificates for TLS tests; with the feature
//! `etcd`, [`etcd`] runs real etcd members on loopback for cluster tests.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(feature = "tls")]
pub mod tls;

/// How long [`eventually`] waits before it fails: 5 s.
pub const WAIT: Duration = Duration::from_secs(5);

/// Pause between two looks of [`eventually`] and [`poll`]: 10 ms.
pub const EVERY: Duration = Duration::from_millis(10);

/// Waits until `condition` holds, looking every [`EVERY`]; panics naming `what` after
/// [`WAIT`].
pub async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !condition() {
        assert!(
            Instant::now() < deadline,
            "timed out after {WAIT:?} waiting for: {what}"
        );
        tokio::time::sleep(EVERY).await;
    }
}

/// Runs `probe` every [`EVERY`] until it returns `Some`, for at most `deadline`; `None` when
/// it never did. For conditions that need `.await` (an HTTP request, a process state).
pub async fn poll<T, F, Fut>(deadline: Duration, mut probe: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let end = Instant::now() + deadline;
    loop {
        if let Some(v) = probe().await {
            return Some(v);
        }
        if Instant::now() >= end {
            return None;
        }
        tokio::time::sleep(EVERY).await;
    }
}

/// A loopback address whose port refuses connections (bound to `127.0.0.1:0`, then closed),
/// for "this node is down" in failover tests. The kernel may hand the port out again later, so
/// use it at once.
///
/// # Panics
/// When no loopback port can be bound.
pub fn refused_address() -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("a bound address")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test(start_paused = true)]
    async fn poll_returns_the_first_value_and_gives_up_at_the_deadline() {
        let looks = AtomicU32::new(0);
        let got = poll(Duration::from_secs(1), || async {
            let n = looks.fetch_add(1, Ordering::SeqCst) + 1;
            (n == 3).then_some(n)
        })
        .await;
        assert_eq!(got, Some(3));
        let started = Instant::now();
        let never: Option<()> = poll(Duration::from_millis(100), || async { None }).await;
        assert_eq!(never, None);
        assert!(started.elapsed() >= Duration::from_millis(100));
        assert!(started.elapsed() < Duration::from_millis(100) + 2 * EVERY);
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "waiting for: never")]
    async fn eventually_fails_naming_the_condition() {
        eventually("never", || false).await;
    }
}
