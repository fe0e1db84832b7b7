//! Background work: warm-up timer, lease expiry, offline-mark expiry, poller expiry.

use std::time::Duration;

use gangway_core::model::{InstanceKey, ServiceKey};
use gangway_store::Write;
use tokio::time::Instant;

use super::hold::ClockReading;
use super::service::Changed;
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
    /// Costs the leases that fell due (from the deadline queue), not all of them.
    pub(crate) fn expire_leases(&self, now: Instant) {
        let mut state = self.lock();
        let mut touched: Vec<(ServiceKey, Vec<InstanceKey>)> = Vec::new();
        while let Some((svc, key)) = state.leases.pop_due(now) {
            let Ok(entry) = state.entry(&svc, &key) else {
                continue;
            };
            let Liveness::Lease(lease) = &entry.liveness else {
                continue;
            };
            let silent = now.saturating_duration_since(lease.last_heartbeat);
            let (last, ttl, delete) = (lease.last_heartbeat, lease.ttl, lease.delete_timeout);
            if silent >= delete {
                state.remove(&svc, &key);
                tracing::info!(service = %svc, instance = %key, "lease: delete timeout passed, removed");
            } else if silent >= ttl {
                if !matches!(state.modify(&svc, &key, |i| i.healthy = false), Ok(true)) {
                    continue;
                }
                tracing::info!(service = %svc, instance = %key, "lease: TTL passed, unhealthy");
                state.leases.push(last + delete, &svc, &key);
            } else {
                continue; // heartbeat since: its own deadline is queued
            }
            match touched.iter_mut().find(|(s, _)| s == &svc) {
                Some((_, keys)) => keys.push(key),
                None => touched.push((svc, vec![key])),
            }
        }
        for (svc, keys) in touched {
            state.publish(&svc, Changed::Keys(keys));
        }
    }

    fn expire_pollers(&self) {
        let expiry = self.inner.config.poller_expiry;
        let mut state = self.lock();
        let gone: Vec<String> = state
            .subscribers
            .iter()
            .filter(|(_, s)| {
                s.info.kind == super::SubscriberKind::Poller
                    && s.last_seen.elapsed() >= s.expiry.unwrap_or(expiry)
            })
            .map(|(id, _)| id.clone())
            .collect();
        let left: Vec<ServiceKey> = gone
            .iter()
            .filter_map(|id| state.remove_subscriber(id))
            .map(|s| s.service)
            .collect();
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
        // One commit for all of them, or, when the store bounds a batch (etcd), one per
        // that many marks: each is independent of the others.
        let chunk = self.inner.committer.max_writes.unwrap_or(usize::MAX).max(1);
        for stale in stale.chunks(chunk) {
            let stale = stale.to_vec();
            let batch = stale
                .iter()
                .map(|(s, k)| Write::DeleteOfflineMark(s.clone(), k.clone()))
                .collect();
            let dropped = self
                .commit(batch, move |state| {
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
                    Ok(())
                })
                .await;
            if let Err(e) = dropped {
                tracing::warn!(error = %e, "could not drop expired offline marks");
            }
        }
    }
}
