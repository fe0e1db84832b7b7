//! Probes of persistent instances (DESIGN §3): TCP connect by default, HTTP GET on request,
//! with fall/rise counts. Probes only flip the health flag; they never delete.

use std::time::Duration;

use gangway_core::model::{InstanceKey, ProbeKind, ProbeSpec, ServiceKey};

use super::Registry;
use super::hold::ClockReading;

/// Longest a single probe may take, ms (capped by the interval).
const MAX_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

impl Registry {
    /// Starts (or restarts) the probe task of a persistent instance.
    pub(crate) fn start_probe(&self, service: ServiceKey, key: InstanceKey, spec: ProbeSpec) {
        let registry = self.clone();
        let id = (service.clone(), key.clone());
        let task = tokio::spawn(async move {
            let interval = Duration::from_millis(spec.interval_ms);
            let timeout = interval.min(MAX_PROBE_TIMEOUT);
            let (mut passes, mut fails) = (0u32, 0u32);
            let mut ticker = tokio::time::interval(interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticker.tick().await;
            loop {
                ticker.tick().await;
                let epoch = registry.stall_epoch();
                let ok = probe(&key, &spec, timeout).await;
                // A probe that spans the registry's own stall, or fails while it recovers from
                // one, says nothing about the instance (its timeout may have fired late).
                let now = tokio::time::Instant::now();
                let recovering = registry.observe_clock(now) == ClockReading::Recovering;
                if registry.stall_epoch() != epoch || (!ok && recovering) {
                    continue;
                }
                if ok {
                    passes += 1;
                    fails = 0;
                } else {
                    fails += 1;
                    passes = 0;
                }
                let Ok(current) = registry.instance(&service, &key) else {
                    break;
                };
                if current.healthy && fails >= spec.fall {
                    tracing::info!(%service, instance = %key, "probe: unhealthy");
                    registry.set_health(&service, &key, false);
                } else if !current.healthy && passes >= spec.rise {
                    tracing::info!(%service, instance = %key, "probe: healthy again");
                    registry.set_health(&service, &key, true);
                }
            }
        });
        let mut probes = self.inner.probes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(old) = probes.insert(id, task.abort_handle()) {
            old.abort();
        }
    }

    pub(crate) fn stop_probe(&self, service: &ServiceKey, key: &InstanceKey) {
        let mut probes = self.inner.probes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(task) = probes.remove(&(service.clone(), key.clone())) {
            task.abort();
        }
    }
}

async fn probe(key: &InstanceKey, spec: &ProbeSpec, timeout: Duration) -> bool {
    let addr = key.addr();
    match spec.kind {
        ProbeKind::Tcp => {
            matches!(
                tokio::time::timeout(timeout, tokio::net::TcpStream::connect(&addr)).await,
                Ok(Ok(_))
            )
        }
        ProbeKind::Http => {
            let Ok(client) = reqwest::Client::builder().timeout(timeout).build() else {
                return false;
            };
            match client
                .get(format!("http://{addr}{}", spec.path))
                .send()
                .await
            {
                Ok(r) => r.status().is_success() || r.status().is_redirection(),
                Err(_) => false,
            }
        }
    }
}
