//! Background work: warm-up timer, lease expiry, offline-mark expiry, poller expiry.

use std::time::Duration;

use gangway_core::model::{InstanceKey, ServiceKey};
use gangway_store::Write;
use tokio::time::Instant;

use super::hold::ClockReading;
use super::{Liveness, Registry};

/// How often leases are checked.
const LEASE_CHECK: Duration = Duration::from_millis(200);
/// How often offline marks and pollers are checked.
const HOUSEKEEPING: Duration = Duration::from_secs(5);

impl Registry {
    pub(super) fn spawn_background(&self) {
        let warmup = self.inner.config.warmup;
        if !warmup.is_zero() {
            let registry = self.clone();
            tokio::spawn(async move {
                tokio::time::sleep(warmup).await;
                registry.set_hold(|h| h.warmup = false);
                tracing::info!(
                    warmup_ms = warmup.as_millis() as u64,
                    "warm-up over: pushing snapshots"
                );
            });
        }
        let weak = std::sync::Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(LEASE_CHECK);
            // After a stall, one late tick (not a burst of the missed ones).
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut last_housekeeping = Instant::now();
            loop {
                ticker.tick().await;
                let Some(inner) = weak.upgrade() else { break };
                let registry = Registry { inner };
                if registry.is_closed() {
                    break;
                }
                let now = Instant::now();
                if registry.observe_clock(now) == ClockReading::Recovering {
                    continue; // expiry waits until the stall recovery is over
                }
                registry.expire_leases(now);
                if last_housekeeping.elapsed() >= HOUSEKEEPING {
                    last_housekeeping = Instant::now();
                    registry.expire_pollers();
                    registry.expire_marks().await;
                }
            }
        });
    }

    /// Marks leases past their TTL unhealthy and deletes those past their delete timeout.
    pub(crate) fn expire_leases(&self, now: Instant) {
        let mut state = self.lock();
        let mut unhealthy: Vec<(ServiceKey, InstanceKey)> = Vec::new();
        let mut expired: Vec<(ServiceKey, InstanceKey)> = Vec::new();
        for (svc, s) in &state.services {
            for e in s.instances.values() {
                if let Liveness::Lease(lease) = &e.liveness {
                    let silent = now.saturating_duration_since(lease.last_heartbeat);
                    if silent > lease.delete_timeout {
                        expired.push((svc.clone(), e.instance.key.clone()));
                    } else if silent > lease.ttl && e.instance.healthy {
                        unhealthy.push((svc.clone(), e.instance.key.clone()));
                    }
                }
            }
        }
        let mut touched: Vec<ServiceKey> = Vec::new();
        for (svc, key) in unhealthy {
            if let Ok(e) = state.entry_mut(&svc, &key) {
                e.instance.healthy = false;
                tracing::info!(service = %svc, instance = %key, "lease: TTL passed, unhealthy");
            }
            touched.push(svc);
        }
        for (svc, key) in expired {
            state.remove(&svc, &key);
            tracing::info!(service = %svc, instance = %key, "lease: delete timeout passed, removed");
            touched.push(svc);
        }
        touched.sort();
        touched.dedup();
        for svc in touched {
            state.publish(&svc);
        }
    }

    fn expire_pollers(&self) {
        let expiry = self.inner.config.poller_expiry;
        let mut state = self.lock();
        let mut left = Vec::new();
        state.subscribers.retain(|_, s| {
            let keep = s.info.kind != super::SubscriberKind::Poller
                || s.last_seen.elapsed() < s.expiry.unwrap_or(expiry);
            if !keep {
                left.push(s.service.clone());
            }
            keep
        });
        state.notify_acks(left);
    }

    async fn expire_marks(&self) {
        let expiry = self.inner.config.offline_mark_expiry;
        let stale: Vec<(ServiceKey, InstanceKey)> = self
            .lock()
            .marks
            .iter()
            .filter(|(_, m)| m.gone_since.is_some_and(|t| t.elapsed() >= expiry))
            .map(|(k, _)| k.clone())
            .collect();
        if stale.is_empty() {
            return;
        }
        let _durable = self.inner.durable.lock().await;
        let batch = stale
            .iter()
            .map(|(s, k)| Write::DeleteOfflineMark(s.clone(), k.clone()))
            .collect();
        if let Err(e) = self.write(batch).await {
            tracing::warn!(error = %e, "could not drop expired offline marks");
            return;
        }
        let mut state = self.lock();
        for key in stale {
            // Only if still gone: a re-registration meanwhile keeps the mark.
            if state
                .marks
                .get(&key)
                .is_some_and(|m| m.gone_since.is_some())
            {
                state.marks.remove(&key);
            }
        }
    }
}
