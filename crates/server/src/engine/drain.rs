//! Ack-based drain and readiness (DESIGN §4): wait until every live subscriber of a service has
//! acked a revision, at most a timeout.

use std::time::Duration;

use gangway_core::drain::AckProgress;
use gangway_core::model::{InstanceKey, ServiceKey};
use tokio::time::Instant;

use super::RegistryError;
use super::state::State;
use super::{Patch, Registry};

/// The outcome of a drain or readiness wait: the shared report, written once.
pub use gangway_core::drain::DrainReport;

impl Registry {
    /// Sets the instance offline, then waits until every live subscriber of its service has
    /// acked a revision that excludes it, at most `timeout`. Subscribers that leave meanwhile
    /// leave the wait. Cancel-safe: dropping the future stops the wait (the instance stays
    /// offline).
    ///
    /// Errors: 404 unknown instance; 409 when it is the last instance in the consumer view and
    /// `force` is false (draining it would cut all traffic): the rule is checked and the
    /// offline applied in one step, so of two racing drains of the last two instances one
    /// is refused (see [`Registry::update`]).
    pub async fn drain(
        &self,
        service: &ServiceKey,
        key: &InstanceKey,
        timeout: Duration,
        force: bool,
    ) -> Result<DrainReport, RegistryError> {
        let started = Instant::now();
        let patch = Patch {
            enabled: Some(false),
            until_gone: true,
            force,
            ..Patch::default()
        };
        let (revision, _) = self.update(service, key, patch).await?;
        self.inner.metrics.drains_started.inc();
        let tracker = self.track_drain(service, key, revision, started, timeout);
        let deadline = started + timeout;
        // Cluster mode: the other nodes wait for their own subscribers and answer.
        let across = match self
            .written_revision(service, key, revision, deadline)
            .await
        {
            Some(written) => self.announce_drain(
                service,
                key,
                written,
                deadline.saturating_duration_since(Instant::now()),
            ),
            None => None,
        };
        let progress = self.wait_acks(service, revision, deadline, None).await;
        let mut progress = self.name_progress(progress);
        let mut unanswered = false;
        let mut cluster_notes = Vec::new();
        if let Some((id, asked)) = across {
            let answers = self
                .gather_answers(&id, &asked, deadline + super::cluster::ANSWER_GRACE)
                .await;
            progress.acked.extend(answers.acked);
            progress.laggards.extend(answers.laggards);
            unanswered = answers.unanswered;
            cluster_notes = answers.notes;
        }
        tracker.end(&progress);
        let waited = started.elapsed();
        let complete = progress.is_complete() && !unanswered;
        self.inner.metrics.drain_wait.observe(waited.as_secs_f64());
        if complete {
            self.inner.metrics.drains_complete.inc();
        } else {
            self.inner.metrics.drains_timed_out.inc();
        }
        let mut notes = common_notes(service, revision, waited, &progress);
        notes.extend(cluster_notes);
        if let Some(note) = self.empty_list_note(service, key) {
            notes.push(note);
        }
        tracing::info!(%service, instance = %key, revision, waited_ms = waited.as_millis() as u64, complete, "drain");
        let mut report = report(revision, waited, progress, notes);
        report.complete = complete;
        Ok(report)
    }

    /// Whether `key` would enter the consumer view once enabled: healthy with a weight above
    /// 0. For an `online` that waits for readiness, checked before it enables anything.
    ///
    /// Errors: unknown instance; [`RegistryError::NotInView`] when it could not.
    pub fn could_serve(
        &self,
        service: &ServiceKey,
        key: &InstanceKey,
    ) -> Result<(), RegistryError> {
        let state = self.lock();
        let instance = &state.entry(service, key)?.instance;
        if instance.healthy && instance.weight > 0.0 {
            Ok(())
        } else {
            Err(RegistryError::NotInView {
                service: service.clone(),
                instance: key.clone(),
            })
        }
    }

    /// Ack-based readiness: waits until every live subscriber of the service has acked a
    /// revision that contains the instance in its consumer view (the service's revision when
    /// the wait starts), at most `timeout`. The instance is not changed; bring it online first.
    /// Subscribers that leave meanwhile leave the wait. Cancel-safe.
    ///
    /// Errors: 404 unknown instance; 409 when the instance is not in the consumer view
    /// (offline, unhealthy or weight 0): no revision could make it ready; 409
    /// [`RegistryError::LeftView`] when it left the view during the wait (a drain or an offline
    /// overtook it).
    pub async fn wait_ready(
        &self,
        service: &ServiceKey,
        key: &InstanceKey,
        timeout: Duration,
    ) -> Result<DrainReport, RegistryError> {
        let started = Instant::now();
        let revision = {
            let state = self.lock();
            state.entry(service, key)?;
            let entry = &state.services[service];
            if !entry.in_view(key) {
                return Err(RegistryError::NotInView {
                    service: service.clone(),
                    instance: key.clone(),
                });
            }
            entry.revision
        };
        let in_view = |state: &State| state.services.get(service).is_some_and(|s| s.in_view(key));
        let progress = self
            .wait_acks(
                service,
                revision,
                started + timeout,
                Some(&|state| !in_view(state)),
            )
            .await;
        let waited = started.elapsed();
        if !in_view(&self.lock()) {
            return Err(RegistryError::LeftView {
                service: service.clone(),
                instance: key.clone(),
            });
        }
        let notes = common_notes(service, revision, waited, &progress);
        let report = report(revision, waited, progress, notes);
        tracing::info!(%service, instance = %key, revision, waited_ms = report.waited_ms, complete = report.complete, "ready wait");
        Ok(report)
    }

    /// Waits until every live subscriber of `service` acked `revision` or later, or until
    /// `deadline`; wakes only on acks and departures of this service's subscribers.
    ///
    /// With `abandon`, the wait also wakes on every new revision of the service and ends at
    /// once with the progress so far when `abandon` holds (looked at under the state lock): a
    /// readiness wait whose instance left the view. A drain gives none and wakes on acks only.
    pub(crate) async fn wait_acks(
        &self,
        service: &ServiceKey,
        revision: u64,
        deadline: Instant,
        abandon: Option<&(dyn Fn(&State) -> bool + Sync)>,
    ) -> AckProgress {
        let (mut acks, mut revisions) = {
            let mut state = self.lock();
            let entry = state.service(service);
            (
                entry.acks.subscribe(),
                abandon.map(|_| entry.tx.subscribe()),
            )
        };
        loop {
            acks.borrow_and_update();
            self.inner.metrics.ack_wait_scans.inc();
            let progress = AckProgress::of(revision, &self.subscriber_acks(service));
            let abandoned = abandon.is_some_and(|stop| stop(&self.lock()));
            if progress.is_complete() || Instant::now() >= deadline || abandoned {
                return progress;
            }
            let revision_changed = async {
                match revisions.as_mut() {
                    Some(rx) => rx.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                changed = acks.changed() => if changed.is_err() { return progress },
                alive = revision_changed => if !alive { return progress },
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }
}

fn common_notes(
    service: &ServiceKey,
    revision: u64,
    waited: Duration,
    progress: &AckProgress,
) -> Vec<String> {
    let mut notes = Vec::new();
    if progress.acked.is_empty() && progress.laggards.is_empty() {
        notes.push(format!(
            "{service} has no live subscriber: nothing to wait for"
        ));
    }
    if !progress.is_complete() {
        notes.push(format!(
            "timed out after {} ms with {} subscriber(s) behind revision {revision}",
            waited.as_millis(),
            progress.laggards.len()
        ));
    }
    notes
}

fn report(
    revision: u64,
    waited: Duration,
    progress: AckProgress,
    notes: Vec<String>,
) -> DrainReport {
    DrainReport {
        revision,
        waited_ms: waited.as_millis() as u64,
        complete: progress.is_complete(),
        acked: progress.acked,
        laggards: progress.laggards,
        notes,
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
            .filter(|s| s.ignores_empty_lists)
            .map(|s| s.id)
            .collect();
        let usable = self
            .lock()
            .services
            .get(service)
            .is_some_and(|s| s.tally().serving > 0);
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
