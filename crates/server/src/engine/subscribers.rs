//! The subscriber table: who follows which service, what they were pushed and what they acked
//! (DESIGN §4), and the push stream that feeds a subscriber.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use std::sync::Arc;

use futures::{Stream, StreamExt};
use gangway_core::drain::SubscriberAck;
use gangway_core::model::ServiceKey;
use serde::Serialize;
use tokio::sync::watch;
use tokio::time::Instant;

use super::Registry;
use super::RegistryError;
use super::service::{Push, Snapshot};

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

/// Who subscribes, and what its protocol can do (set by the transport).
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
    /// Its protocol takes deltas ([`Push::Delta`]); otherwise every push is the full view.
    pub deltas: bool,
    /// It ignores a pushed view with no usable instance and keeps its last one (Nacos SDKs), so
    /// its ack of such a view proves nothing; drains say so.
    pub ignores_empty_lists: bool,
}

impl SubscriberInfo {
    /// A subscriber of `kind` at `address`, full pushes, no quirks.
    pub fn new(kind: SubscriberKind, address: impl Into<String>) -> Self {
        Self {
            kind,
            address: address.into(),
            client_name: String::new(),
            session: None,
            deltas: false,
            ignores_empty_lists: false,
        }
    }
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
    /// When it subscribed: it cannot lag behind what was published before.
    pub(crate) since: Instant,
    /// Pollers only: forgotten after this long without a poll (`None`: the server's
    /// `poller_expiry`).
    pub(crate) expiry: Option<Duration>,
}

impl Subscriber {
    fn new(service: &ServiceKey, info: SubscriberInfo) -> Self {
        Self {
            service: service.clone(),
            session: info.session.clone(),
            info,
            acked_revision: 0,
            acked_at_ms: None,
            pushed_revision: 0,
            pushed_at: None,
            last_seen: Instant::now(),
            since: Instant::now(),
            expiry: None,
        }
    }
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
    /// Revisions of the service published since its ack (0: it acked the current one), at
    /// most [`CHANGE_LOG_LEN`](super::CHANGE_LOG_LEN).
    pub behind: usize,
    /// How long it has been behind, ms: since the oldest revision it has not acked was
    /// published, or since it subscribed if that is later. `None` when it acked the current
    /// revision.
    pub lag_ms: Option<u64>,
    /// See [`SubscriberInfo::ignores_empty_lists`].
    #[serde(skip)]
    pub ignores_empty_lists: bool,
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Registry {
    /// Adds a subscriber of `service`. Returns its id and a receiver of the service's revision
    /// (it changes on every change; [`pushes`](Self::pushes) turns it into pushes).
    /// Errors: 400 on an invalid service key; `LimitExceeded` when the subscriber's session
    /// holds [`SessionLimits::subscriptions`](crate::config::SessionLimits) already.
    pub fn subscribe(
        &self,
        service: &ServiceKey,
        info: SubscriberInfo,
    ) -> Result<(String, watch::Receiver<u64>), RegistryError> {
        gangway_core::validate::service_key(service)?;
        let prefix = match info.kind {
            SubscriberKind::Session => "sub",
            SubscriberKind::Watch => "w",
            SubscriberKind::Poller => "p",
        };
        let id = self.next_id(prefix);
        let mut state = self.lock();
        state.check_subscribe(info.session.as_deref())?;
        let rx = state.service(service).tx.subscribe();
        state.add_subscriber(id.clone(), Subscriber::new(service, info));
        Ok((id, rx))
    }

    /// Removes a subscriber; it leaves every drain's wait.
    pub fn unsubscribe(&self, id: &str) {
        let mut state = self.lock();
        if let Some(sub) = state.remove_subscriber(id) {
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

    /// What to push to subscriber `id` now, recorded as pushed; `None` when it is gone. A
    /// subscriber whose protocol takes deltas gets one against the revision it acked when
    /// that is cheaper than the view.
    fn next_push(&self, id: &str) -> Option<Push> {
        let mut state = self.lock();
        let state = &mut *state;
        let sub = state.subscribers.get_mut(id)?;
        let service = state.services.get_mut(&sub.service)?;
        let push = if sub.info.deltas {
            service.push_since(sub.acked_revision)
        } else {
            Push::Full(service.snapshot())
        };
        sub.pushed_revision = push.revision();
        sub.pushed_at = Some(Instant::now());
        self.inner.metrics.pushes_sent.inc();
        if let Push::Delta(_) = &push {
            self.inner.metrics.pushes_delta.inc();
        }
        Some(push)
    }

    fn acked_below(&self, id: &str, revision: u64) -> Option<bool> {
        self.lock()
            .subscribers
            .get(id)
            .map(|s| s.acked_revision < revision)
    }

    /// An HTTP poll by a named poller: registers or refreshes it and counts the returned
    /// revision as acked (DESIGN §4: pollers ack what they fetched). Its subscriber id is
    /// `p-NAME@namespace/group/service`: one per name and service.
    pub fn poll(
        &self,
        service: &ServiceKey,
        poller: &str,
        address: String,
    ) -> Result<gangway_core::View, RegistryError> {
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
        expiry: Option<Duration>,
    ) -> Result<gangway_core::View, RegistryError> {
        self.poll_as(
            service,
            poller,
            SubscriberInfo::new(SubscriberKind::Poller, address),
            expiry,
        )
    }

    /// [`Registry::poll_expiring`] with the poller's protocol properties.
    pub fn poll_as(
        &self,
        service: &ServiceKey,
        poller: &str,
        mut info: SubscriberInfo,
        expiry: Option<Duration>,
    ) -> Result<gangway_core::View, RegistryError> {
        gangway_core::validate::name("subscriber", poller)?;
        gangway_core::validate::service_key(service)?;
        // One poller per name *and service*: a consumer polling two services under one name
        // acks each on its own (a poll of one service is no ack of the other's drain).
        let id = format!("p-{poller}@{service}");
        let view = self.view(service);
        {
            let mut state = self.lock();
            if !state.subscribers.contains_key(&id) {
                info.client_name = poller.to_owned();
                state.add_subscriber(id.clone(), Subscriber::new(service, info.clone()));
            }
            let sub = state.subscribers.get_mut(&id).expect("just added");
            sub.last_seen = Instant::now();
            sub.expiry = expiry;
            sub.info.address = info.address;
            sub.pushed_revision = view.revision;
        }
        self.ack(&id, view.revision);
        Ok(view)
    }

    /// Subscribers of a service, sorted by id.
    pub fn subscribers(&self, service: &ServiceKey) -> Vec<SubscriberRow> {
        let state = self.lock();
        let Some(entry) = state.services.get(service) else {
            return Vec::new();
        };
        let now = Instant::now();
        entry
            .subscribers
            .iter()
            .filter_map(|id| state.subscribers.get(id).map(|s| (id, s)))
            .map(|(id, s)| {
                let behind = entry.behind(s.acked_revision);
                SubscriberRow {
                    behind: behind.map_or(0, |(n, _)| n),
                    lag_ms: behind.map(|(_, at)| {
                        now.saturating_duration_since(at.max(s.since)).as_millis() as u64
                    }),
                    id: id.clone(),
                    address: s.info.address.clone(),
                    kind: s.info.kind,
                    client_name: s.info.client_name.clone(),
                    acked_revision: s.acked_revision,
                    acked_at_ms: s.acked_at_ms,
                    pushed_revision: s.pushed_revision,
                    ignores_empty_lists: s.info.ignores_empty_lists,
                }
            })
            .collect()
    }

    pub(crate) fn subscriber_acks(&self, service: &ServiceKey) -> Vec<SubscriberAck> {
        self.lock().subscriber_acks(service)
    }

    /// [`pushes`](Self::pushes) as whole views, for protocols without deltas (their
    /// subscribers are created with `deltas: false`, so this only unwraps).
    pub fn full_pushes(
        &self,
        id: String,
        rx: watch::Receiver<u64>,
    ) -> impl Stream<Item = Arc<Snapshot>> + Send + 'static + use<> {
        let registry = self.clone();
        self.pushes(id, rx).map(move |push| match push {
            Push::Full(snapshot) => snapshot,
            Push::Delta(d) => registry.snapshot(&d.service),
        })
    }

    /// The pushes for subscriber `id`: nothing while snapshots are held back (warm-up, stall
    /// recovery, shutdown), then the current view, then every change (coalesced: what is
    /// current when the subscriber is ready wins), and again every resend interval while the
    /// subscriber has not acked the latest. Two pushes are at least the push interval apart
    /// (`Config::full_push_interval`, or `delta_push_interval` for a subscriber that takes
    /// deltas): under churn the subscriber gets the latest state at that pace, not every
    /// revision. A hold that begins mid-stream stops the pushes until it ends; the latest goes
    /// out then. Ends when the subscriber leaves.
    pub fn pushes(
        &self,
        id: String,
        mut rx: watch::Receiver<u64>,
    ) -> impl Stream<Item = Push> + Send + 'static + use<> {
        let registry = self.clone();
        let resend = self.inner.config.resend_interval;
        let deltas = self
            .lock()
            .subscribers
            .get(&id)
            .is_some_and(|s| s.info.deltas);
        let interval = if deltas {
            self.inner.config.delta_push_interval
        } else {
            self.inner.config.full_push_interval
        };
        async_stream::stream! {
            rx.mark_changed();
            let mut last_push: Option<Instant> = None;
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
                        if let Some(at) = last_push {
                            // Changes meanwhile are coalesced: the push below reads the latest.
                            tokio::time::sleep_until(at + interval).await;
                        }
                        rx.borrow_and_update();
                        let Some(push) = registry.next_push(&id) else { break };
                        last_push = Some(Instant::now());
                        yield push;
                    }
                    _ = tokio::time::sleep(resend) => {
                        if registry.warming_up() {
                            continue;
                        }
                        let latest = *rx.borrow();
                        match registry.acked_below(&id, latest) {
                            None => break,
                            Some(true) => {
                                registry.inner.metrics.pushes_resent.inc();
                                let Some(push) = registry.next_push(&id) else { break };
                                last_push = Some(Instant::now());
                                yield push;
                            }
                            Some(false) => {}
                        }
                    }
                }
            }
        }
    }
}
