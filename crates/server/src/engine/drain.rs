//! Ack-based drain (DESIGN §4).

use std::time::Duration;

use gangway_core::drain::{AckProgress, SubscriberAck};
use gangway_core::model::{InstanceKey, ServiceKey};
use serde::Serialize;
use tokio::time::Instant;

use super::Registry;
use crate::error::ApiError;

/// The outcome of a drain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DrainReport {
    /// Revision that excludes the instance; subscribers had to ack this or later.
    pub revision: u64,
    /// Time waited for acks, ms.
    pub waited_ms: u64,
    /// Every live subscriber acked (false: the timeout ended the wait).
    pub complete: bool,
    /// Subscribers that acked `revision` or later.
    pub acked: Vec<SubscriberAck>,
    /// Subscribers that had not when the wait ended.
    pub laggards: Vec<SubscriberAck>,
    /// Readable remarks (for example: no subscriber at all).
    pub notes: Vec<String>,
}

impl Registry {
    /// Sets the instance offline, then waits until every live subscriber of its service has
    /// acked a revision that excludes it, at most `timeout`. Subscribers that leave meanwhile
    /// leave the wait. Cancel-safe: dropping the future stops the wait (the instance stays
    /// offline).
    ///
    /// Errors: 404 unknown instance; 409 when it is the last instance in the consumer view and
    /// `force` is false (draining it would cut all traffic).
    pub async fn drain(
        &self,
        service: &ServiceKey,
        key: &InstanceKey,
        timeout: Duration,
        force: bool,
    ) -> Result<DrainReport, ApiError> {
        {
            let state = self.lock();
            state.entry(service, key)?;
            let view = state.services.get(service).map(|s| s.view());
            let last = view.is_some_and(|v| v.contains(key) && v.instances.len() == 1);
            if last && !force {
                return Err(ApiError::conflict(format!(
                    "{key} is the last serving instance of {service}; draining it would cut all \
                     traffic (use force to drain anyway)"
                )));
            }
        }
        let started = Instant::now();
        let (revision, _) = self.set_enabled(service, key, false).await?;
        self.inner.metrics.drains_started.inc();
        let deadline = started + timeout;
        let mut acks = self.inner.acks.subscribe();
        let progress = loop {
            acks.borrow_and_update();
            let progress = AckProgress::of(revision, &self.subscriber_acks(service));
            if progress.is_complete() || Instant::now() >= deadline {
                break progress;
            }
            tokio::select! {
                _ = acks.changed() => {}
                _ = tokio::time::sleep_until(deadline) => {}
            }
        };
        let waited = started.elapsed();
        let complete = progress.is_complete();
        self.inner.metrics.drain_wait.observe(waited.as_secs_f64());
        if complete {
            self.inner.metrics.drains_complete.inc();
        } else {
            self.inner.metrics.drains_timed_out.inc();
        }
        let mut notes = Vec::new();
        if progress.acked.is_empty() && progress.laggards.is_empty() {
            notes.push(format!(
                "{service} has no live subscriber: nothing to wait for"
            ));
        }
        if let Some(note) = self.empty_list_note(service, key) {
            notes.push(note);
        }
        if !complete {
            notes.push(format!(
                "timed out after {} ms with {} subscriber(s) behind revision {revision}",
                waited.as_millis(),
                progress.laggards.len()
            ));
        }
        tracing::info!(%service, instance = %key, revision, waited_ms = waited.as_millis() as u64, complete, "drain");
        Ok(DrainReport {
            revision,
            waited_ms: waited.as_millis() as u64,
            complete,
            acked: progress.acked,
            laggards: progress.laggards,
            notes,
        })
    }
}

impl Registry {
    /// Nacos SDKs (Python and Go by default, Node always, Rust with its default empty-push
    /// protection) ignore an instance list with no usable instance and keep their last one, so
    /// when the drain left none, a Nacos subscriber's ack does not prove it dropped `key`.
    fn empty_list_note(&self, service: &ServiceKey, key: &InstanceKey) -> Option<String> {
        let nacos: Vec<String> = self
            .subscribers(service)
            .into_iter()
            .filter(|s| s.client_name.starts_with(crate::nacos::CLIENT_NAME_PREFIX))
            .map(|s| s.id)
            .collect();
        let usable = self
            .view(service)
            .instances
            .iter()
            .any(|i| i.healthy && i.weight > 0.0);
        if nacos.is_empty() || usable {
            return None;
        }
        Some(format!(
            "{service} has no serving instance left, and Nacos SDKs ignore an empty instance list: \
             the {} Nacos subscriber(s) ({}) acked, but keep {key} cached, so this drain cannot \
             prove they dropped it (see docs/compat.md)",
            nacos.len(),
            nacos.join(", ")
        ))
    }
}
