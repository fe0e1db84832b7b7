//! The classic consumer and registry calls over REST: a poller that lists the service every R
//! and publishes what it got (no push), and deregistration.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use gangway_core::View;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Polls `GET /v1/services/{service}/instances` every `refresh` (the first poll at once) and
/// publishes each view that differs from the last on the returned channel. A failed poll keeps
/// the last view (as Nacos and Eureka clients keep their cache). Abort the task to stop.
pub fn poller(
    http: SocketAddr,
    service: &str,
    refresh: Duration,
) -> (JoinHandle<()>, watch::Receiver<Arc<View>>) {
    let empty = Arc::new(View {
        revision: 0,
        instances: Vec::new(),
        protection_triggered: false,
    });
    let (tx, rx) = watch::channel(empty);
    let url = format!("http://{http}/v1/services/{service}/instances");
    let task = tokio::spawn(async move {
        let client = reqwest::Client::new();
        let mut tick = tokio::time::interval(refresh);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Ok(response) = client.get(&url).send().await else {
                continue;
            };
            let Ok(view) = response.json::<View>().await else {
                continue;
            };
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
    });
    (task, rx)
}

/// `DELETE /v1/services/{service}/instances/{addr}`.
///
/// # Errors
/// The registry is unreachable or answers other than 2xx.
pub async fn deregister(http: SocketAddr, service: &str, addr: &str) -> anyhow::Result<()> {
    let url = format!("http://{http}/v1/services/{service}/instances/{addr}");
    let response = reqwest::Client::new()
        .delete(&url)
        .send()
        .await
        .with_context(|| format!("DELETE {url}"))?;
    anyhow::ensure!(
        response.status().is_success(),
        "deregister {addr}: HTTP {}",
        response.status()
    );
    Ok(())
}
