//! The subscriber table: who follows which service, what they were pushed and what they acked
//! (DESIGN §4), and the push stream that feeds a subscriber.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use futures::Stream;
use gangway_core::drain::SubscriberAck;
use gangway_core::model::ServiceKey;
use serde::Serialize;
use tokio::sync::watch;
use tokio::time::Instant;

use super::{Registry, Snapshot};
use crate::error::ApiError;

/// How a subscriber follows a service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SubscriberKind {
    /// A subscription on a gRPC session: pushed, acks explicitly.
    Session,
    /// A Server-Sent Events watcher: counts as having acked what it was sent.
    Watch,
    /// An HTTP poller (`subscriber=` on the list call): counts as having acked what it fetched.
    Poller,
}

/// Who subscribes (given by the transport).
#[derive(Debug, Clone)]
pub struct SubscriberInfo {
    /// Kind.
    pub kind: SubscriberKind,
    /// Remote `ip:port`.
    pub address: String,
    /// Client's own name, if it gave one.
    pub client_name: String,
    /// Owning session: the subscriber leaves when the session ends.
    pub session: Option<String>,
}

pub(crate) struct Subscriber {
    pub(crate) service: ServiceKey,
    pub(crate) info: SubscriberInfo,
    pub(crate) session: Option<String>,
    pub(crate) acked_revision: u64,
    pub(crate) acked_at_ms: Option<u64>,
    pub(crate) pushed_revision: u64,
    pub(crate) pushed_at: Option<Instant>,
    pub(crate) last_seen: Instant,
    /// Pollers only: forgotten after this long without a poll (`None`: the server's
    /// `poller_expiry`).
    pub(crate) expiry: Option<std::time::Duration>,
}

/// One row of `GET /v1/services/{service}/subscribers`.
#[derive(Debug, Clone, Serialize)]
pub struct SubscriberRow {
    /// Subscriber id.
    pub id: String,
    /// Remote `ip:port`.
    pub address: String,
    /// Kind.
    pub kind: SubscriberKind,
    /// Client's own name.
    pub client_name: String,
    /// Newest revision acked (0: none).
    pub acked_revision: u64,
    /// Unix ms of the newest ack.
    pub acked_at_ms: Option<u64>,
    /// Newest revision pushed.
    pub pushed_revision: u64,
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Registry {
    /// Adds a subscriber of `service`. Returns its id and the service's snapshot channel.
    /// Errors: 400 on an invalid service key.
    pub fn subscribe(
        &self,
        service: &ServiceKey,
        info: SubscriberInfo,
    ) -> Result<(String, watch::Receiver<Arc<Snapshot>>), ApiError> {
        gangway_core::validate::service_key(service)?;
        let prefix = match info.kind {
            SubscriberKind::Session => "sub",
            SubscriberKind::Watch => "w",
            SubscriberKind::Poller => "p",
        };
        let id = self.next_id(prefix);
        let mut state = self.lock();
        let rx = state.service(service).tx.subscribe();
        state.subscribers.insert(
            id.clone(),
            Subscriber {
                service: service.clone(),
                session: info.session.clone(),
                info,
                acked_revision: 0,
                acked_at_ms: None,
                pushed_revision: 0,
                pushed_at: None,
                last_seen: Instant::now(),
                expiry: None,
            },
        );
        Ok((id, rx))
    }

    /// Removes a subscriber; it leaves every drain's wait.
    pub fn unsubscribe(&self, id: &str) {
        let mut state = self.lock();
        if let Some(sub) = state.subscribers.remove(id) {
            state.notify_acks([sub.service]);
        }
    }

    /// Records that `id` applied `revision` (older acks are ignored).
    pub fn ack(&self, id: &str, revision: u64) {
        let mut state = self.lock();
        let Some(sub) = state.subscribers.get_mut(id) else {
            return;
        };
        sub.last_seen = Instant::now();
        if revision <= sub.acked_revision {
            return;
        }
        sub.acked_revision = revision;
        sub.acked_at_ms = Some(unix_ms());
        if revision == sub.pushed_revision {
            if let Some(at) = sub.pushed_at {
                self.inner
                    .metrics
                    .push_to_ack
                    .observe(at.elapsed().as_secs_f64());
            }
        }
        let service = sub.service.clone();
        state.notify_acks([service]);
        drop(state);
        self.inner.metrics.pushes_acked.inc();
    }

    /// Records that `revision` was sent to `id`.
    pub fn pushed(&self, id: &str, revision: u64) {
        let mut state = self.lock();
        if let Some(sub) = state.subscribers.get_mut(id) {
            sub.pushed_revision = revision;
            sub.pushed_at = Some(Instant::now());
            self.inner.metrics.pushes_sent.inc();
        }
    }

    fn acked_below(&self, id: &str, revision: u64) -> Option<bool> {
        self.lock()
            .subscribers
            .get(id)
            .map(|s| s.acked_revision < revision)
    }

    /// An HTTP poll by a named poller: registers or refreshes it and counts the returned
    /// revision as acked (DESIGN §4: pollers ack what they fetched).
    pub fn poll(
        &self,
        service: &ServiceKey,
        poller: &str,
        address: String,
    ) -> Result<gangway_core::View, ApiError> {
        self.poll_expiring(service, poller, address, None)
    }

    /// [`Registry::poll`] for a poller with its own expiry (forgotten after `expiry` without a
    /// poll; `None`: the server's `poller_expiry`). Nacos v1 clients poll every `cacheMillis`
    /// and expire after three missed polls.
    pub fn poll_expiring(
        &self,
        service: &ServiceKey,
        poller: &str,
        address: String,
        expiry: Option<std::time::Duration>,
    ) -> Result<gangway_core::View, ApiError> {
        gangway_core::validate::name("subscriber", poller)?;
        let id = format!("p-{poller}");
        let view = self.view(service);
        {
            let mut state = self.lock();
            let now = Instant::now();
            let sub = state
                .subscribers
                .entry(id.clone())
                .or_insert_with(|| Subscriber {
                    service: service.clone(),
                    info: SubscriberInfo {
                        kind: SubscriberKind::Poller,
                        address: address.clone(),
                        client_name: poller.to_owned(),
                        session: None,
                    },
                    session: None,
                    acked_revision: 0,
                    acked_at_ms: None,
                    pushed_revision: 0,
                    pushed_at: None,
                    last_seen: now,
                    expiry,
                });
            sub.last_seen = now;
            sub.expiry = expiry;
            sub.info.address = address;
            sub.pushed_revision = view.revision;
        }
        self.ack(&id, view.revision);
        Ok(view)
    }

    /// Subscribers of a service, sorted by id.
    pub fn subscribers(&self, service: &ServiceKey) -> Vec<SubscriberRow> {
        let state = self.lock();
        let mut rows: Vec<SubscriberRow> = state
            .subscribers
            .iter()
            .filter(|(_, s)| &s.service == service)
            .map(|(id, s)| SubscriberRow {
                id: id.clone(),
                address: s.info.address.clone(),
                kind: s.info.kind,
                client_name: s.info.client_name.clone(),
                acked_revision: s.acked_revision,
                acked_at_ms: s.acked_at_ms,
                pushed_revision: s.pushed_revision,
            })
            .collect();
        rows.sort_by(|a, b| a.id.cmp(&b.id));
        rows
    }

    pub(crate) fn subscriber_acks(&self, service: &ServiceKey) -> Vec<SubscriberAck> {
        self.subscribers(service)
            .into_iter()
            .map(|r| SubscriberAck {
                id: r.id,
                address: r.address,
                acked_revision: r.acked_revision,
            })
            .collect()
    }

    /// The pushes for subscriber `id`: nothing while snapshots are held back (warm-up, stall
    /// recovery, shutdown), then the current snapshot, then every change (coalesced: the latest
    /// wins), and the latest again every resend interval while the subscriber has not acked it.
    /// A hold that begins mid-stream stops the pushes until it ends; the latest snapshot goes
    /// out then. Ends when the subscriber leaves.
    pub fn pushes(
        &self,
        id: String,
        mut rx: watch::Receiver<Arc<Snapshot>>,
    ) -> impl Stream<Item = Arc<Snapshot>> + Send + 'static + use<> {
        let registry = self.clone();
        let resend = self.inner.config.resend_interval;
        async_stream::stream! {
            rx.mark_changed();
            loop {
                registry.warmed_up().await;
                tokio::select! {
                    changed = rx.changed() => {
                        if changed.is_err() {
                            break;
                        }
                        if registry.warming_up() {
                            // Held back: send the latest once the hold ends.
                            rx.mark_changed();
                            continue;
                        }
                        let snapshot = rx.borrow_and_update().clone();
                        registry.pushed(&id, snapshot.view.revision);
                        yield snapshot;
                    }
                    _ = tokio::time::sleep(resend) => {
                        if registry.warming_up() {
                            continue;
                        }
                        let latest = rx.borrow().clone();
                        match registry.acked_below(&id, latest.view.revision) {
                            None => break,
                            Some(true) => {
                                registry.inner.metrics.pushes_resent.inc();
                                registry.pushed(&id, latest.view.revision);
                                yield latest;
                            }
                            Some(false) => {}
                        }
                    }
                }
            }
        }
    }
}
