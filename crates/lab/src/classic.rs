//! The classic consumer and registry calls over REST: a poller that lists the service every R
//! and publishes what it got (no push), and deregistration.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use gangway_core::View;
use gangway_wire::client::{InstanceRef, RestClient, ServiceRef};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Polls `GET /v1/services/{service}/instances` every `refresh` (the first poll at once) and
/// publishes each view that differs from the last on the returned channel. A failed poll keeps
/// the last view (as Nacos and Eureka clients keep their cache). Whenever `anchor` is set to a
/// time, the polls are realigned at once to fall at `anchor + k x refresh` (k any integer), so
/// that the phase of the polls is a setting, not an accident of start-up timing. Abort the
/// task to stop.
pub fn poller(
    http: SocketAddr,
    service: &str,
    refresh: Duration,
    mut anchor: watch::Receiver<Option<Instant>>,
) -> (JoinHandle<()>, watch::Receiver<Arc<View>>) {
    let empty = Arc::new(View {
        revision: 0,
        instances: Vec::new(),
        protection_triggered: false,
    });
    let (tx, rx) = watch::channel(empty);
    let service = ServiceRef::named(service);
    let client = RestClient::new(&http.to_string());
    let task = tokio::spawn(async move {
        // Without an HTTP client the poller never sees a view: as if every poll failed.
        let Ok(client) = client else { return };
        let mut next = Instant::now();
        let mut anchor_open = true;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(next) => {}
                changed = anchor.changed(), if anchor_open => {
                    anchor_open = changed.is_ok();
                    if let Some(a) = *anchor.borrow_and_update() {
                        next = next_tick(a, refresh, Instant::now());
                    }
                    continue;
                }
            }
            let polled = Instant::now();
            if let Some(view) = fetch(&client, &service).await {
                tx.send_if_modified(|current| {
                    if current.instances == view.instances
                        && current.protection_triggered == view.protection_triggered
                    {
                        false
                    } else {
                        *current = Arc::new(view);
                        true
                    }
                });
            }
            let anchored = *anchor.borrow();
            next = match anchored {
                Some(a) => next_tick(a, refresh, Instant::now()),
                None => polled + refresh,
            };
        }
    });
    (task, rx)
}

/// Polls the registry's consumer view every 10 ms until `addr` is no longer in it;
/// returns that moment (`None`: still listed after `limit`).
pub async fn wait_dropped(
    http: SocketAddr,
    service: &str,
    addr: &str,
    limit: Duration,
) -> Option<Instant> {
    let Ok(client) = RestClient::new(&http.to_string()) else {
        return None;
    };
    let service = ServiceRef::named(service);
    let end = Instant::now() + limit;
    while Instant::now() < end {
        let view = fetch(&client, &service).await;
        if view.is_some_and(|v| !v.instances.iter().any(|i| i.key.addr() == addr)) {
            return Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

/// One GET of a consumer view, in domain form; `None` on any error.
async fn fetch(client: &RestClient, service: &ServiceRef) -> Option<View> {
    let view = client.instances(service, false).await.ok()?.parse().ok()?;
    Some(View::from(view))
}

/// The first `anchor + k x period` (k any integer) after `now`.
pub fn next_tick(anchor: Instant, period: Duration, now: Instant) -> Instant {
    let p = period.as_secs_f64().max(0.001);
    if now >= anchor {
        let k = ((now - anchor).as_secs_f64() / p).floor() + 1.0;
        anchor + Duration::from_secs_f64(k * p)
    } else {
        // k <= 0: step back from the anchor while still after now.
        let k = ((anchor - now).as_secs_f64() / p).ceil() - 1.0;
        let t = anchor - Duration::from_secs_f64(k.max(0.0) * p);
        if t > now { t } else { anchor }
    }
}

/// `DELETE /v1/services/{service}/instances/{addr}`, `addr` an `ip:port` socket address.
///
/// # Errors
/// `addr` is not `ip:port`, the registry is unreachable or refuses (a [`gangway_wire::client::RestError`]
/// with its code in the chain).
pub async fn deregister(http: SocketAddr, service: &str, addr: &str) -> anyhow::Result<()> {
    let at: SocketAddr = addr
        .parse()
        .with_context(|| format!("deregister {addr}: not ip:port"))?;
    let instance = InstanceRef::new(ServiceRef::named(service), &at.ip().to_string(), at.port());
    RestClient::new(&http.to_string())?
        .deregister(&instance, false)
        .await
        .with_context(|| format!("deregister {addr}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_tick_falls_on_the_anchor_grid_after_now() {
        let a = Instant::now() + Duration::from_secs(10);
        let r = Duration::from_secs(1);
        let t = next_tick(a, r, a - Duration::from_millis(2500));
        assert_eq!(t, a - Duration::from_secs(2));
        assert_eq!(next_tick(a, r, a), a + r);
        assert_eq!(next_tick(a, r, a + Duration::from_millis(1500)), a + 2 * r);
        assert_eq!(next_tick(a, r, a - Duration::from_millis(1)), a);
    }
}
