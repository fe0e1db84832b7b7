//! The registry engine (DESIGN §2-§4): one in-memory state behind a mutex, durable parts
//! written through the [`Store`] before they are acknowledged.
//!
//! Every change to a service bumps its revision (one global counter, started from the boot
//! time in µs so revisions keep growing across restarts) and publishes a new [`Snapshot`] on the
//! service's `watch` channel; push streams ([`Registry::pushes`]) turn that into coalesced,
//! re-sent pushes, and acks flow back through [`Registry::ack`]. [`Registry::drain`] waits on
//! those acks.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gangway_core::model::{
    Instance, InstanceKey, Kind, OfflineMark, ProbeSpec, ServiceKey, ServiceSettings,
    StoredInstance,
};
use gangway_core::{View, validate};
use gangway_store::{Store, Write};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::config::Config;
use crate::error::ApiError;
use crate::metrics::Metrics;

mod background;
mod drain;
mod hold;
mod probe;
mod shutdown;
mod subscribers;
#[cfg(test)]
mod tests;

pub use drain::DrainReport;
pub use shutdown::CloseReport;
pub use subscribers::{SubscriberInfo, SubscriberKind, SubscriberRow};

/// A service's consumer view at one revision, as pushed.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// Which service.
    pub service: ServiceKey,
    /// The view (revision, instances, protection flag).
    pub view: View,
}

/// Who keeps an instance alive (DESIGN §3).
#[derive(Debug, Clone, PartialEq)]
pub enum Liveness {
    /// Ephemeral, bound to a session (gRPC stream) with this id.
    Session(String),
    /// Ephemeral, kept by heartbeats.
    Lease(Lease),
    /// Persistent, probed by the registry.
    Probe(ProbeSpec),
    /// Ephemeral, its session ended while the registry recovered from its own stall: kept,
    /// owned by nobody, until a session registers it again or the recovery ends (then removed).
    Grace,
}

impl Liveness {
    /// `"session"`, `"lease"`, `"probe"` or `"grace"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Liveness::Session(_) => "session",
            Liveness::Lease(_) => "lease",
            Liveness::Probe(_) => "probe",
            Liveness::Grace => "grace",
        }
    }
}

/// Lease state of a heartbeat-kept instance.
#[derive(Debug, Clone, PartialEq)]
pub struct Lease {
    /// Last heartbeat (or registration).
    pub last_heartbeat: Instant,
    /// Unhealthy after this long without a heartbeat.
    pub ttl: Duration,
    /// Deleted after this long without a heartbeat.
    pub delete_timeout: Duration,
}

/// What a registration asks for before liveness is bound.
#[derive(Debug, Clone)]
pub enum LivenessRequest {
    /// Bind to this session.
    Session(String),
    /// A lease; `None` takes the server defaults.
    Lease {
        /// TTL.
        ttl: Option<Duration>,
        /// Delete timeout.
        delete_timeout: Option<Duration>,
    },
    /// Persistent with this probe.
    Probe(ProbeSpec),
}

/// An instance with its liveness, as listed with `all=true`.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The instance.
    pub instance: Instance,
    /// Who keeps it alive.
    pub liveness: Liveness,
}

/// A change to an existing instance; `None` fields stay as they are.
#[derive(Debug, Clone, Default)]
pub struct Patch {
    /// New weight.
    pub weight: Option<f64>,
    /// New metadata (replaces the map).
    pub metadata: Option<BTreeMap<String, String>>,
    /// Offline (`false`) or online (`true`), with the durable offline mark.
    pub enabled: Option<bool>,
    /// Apply even when the change takes the last instance out of the consumer view (default
    /// false: such a change is refused with 409).
    pub force: bool,
}

/// Summary of one service, for listings.
#[derive(Debug, Clone)]
pub struct ServiceSummary {
    /// Identity.
    pub key: ServiceKey,
    /// Kind, fixed by the instances it holds; `None` when empty.
    pub kind: Option<Kind>,
    /// Current revision (0: never changed since start).
    pub revision: u64,
    /// All instances.
    pub instances: usize,
    /// Instances in the consumer view.
    pub serving: usize,
    /// Live subscribers.
    pub subscribers: usize,
    /// Settings.
    pub settings: ServiceSettings,
}

pub(crate) struct ServiceEntry {
    pub(crate) settings: ServiceSettings,
    pub(crate) instances: BTreeMap<InstanceKey, Entry>,
    pub(crate) revision: u64,
    pub(crate) tx: watch::Sender<Arc<Snapshot>>,
    /// Bumped on every ack by a subscriber of this service and every such subscriber that
    /// leaves: drains and readiness waits of this service wait on it, and only on it.
    pub(crate) acks: watch::Sender<u64>,
}

impl ServiceEntry {
    fn new(key: &ServiceKey) -> Self {
        let view = View::build(0, [], 0.0);
        let (tx, _) = watch::channel(Arc::new(Snapshot {
            service: key.clone(),
            view,
        }));
        Self {
            settings: ServiceSettings::default(),
            instances: BTreeMap::new(),
            revision: 0,
            tx,
            acks: watch::channel(0).0,
        }
    }

    pub(crate) fn kind(&self) -> Option<Kind> {
        self.instances.values().next().map(|e| {
            if e.instance.ephemeral {
                Kind::Ephemeral
            } else {
                Kind::Persistent
            }
        })
    }

    pub(crate) fn view(&self) -> View {
        View::build(
            self.revision,
            self.instances.values().map(|e| &e.instance),
            self.settings.protect_threshold,
        )
    }
}

pub(crate) struct MarkEntry {
    /// The durable mark (kept for listings and expiry decisions).
    #[allow(dead_code)]
    pub(crate) mark: OfflineMark,
    /// When the marked instance was last seen leaving (None: present).
    pub(crate) gone_since: Option<Instant>,
}

pub(crate) struct SessionEntry {
    pub(crate) peer: String,
    pub(crate) client_name: String,
    /// The client process's own id, the same on each of its sessions (empty: none given).
    pub(crate) client_id: String,
}

#[derive(Default)]
pub(crate) struct State {
    pub(crate) services: HashMap<ServiceKey, ServiceEntry>,
    pub(crate) sessions: HashMap<String, SessionEntry>,
    pub(crate) subscribers: HashMap<String, subscribers::Subscriber>,
    pub(crate) marks: HashMap<(ServiceKey, InstanceKey), MarkEntry>,
    pub(crate) revision: u64,
    /// Instances an update is taking out of the consumer view (reserved under the lock before
    /// its store write, released when it is applied or failed): the last-serving rule counts
    /// them as gone.
    pub(crate) leaving: HashSet<(ServiceKey, InstanceKey)>,
    /// Kinds reserved by registrations that are writing to the store, with their count.
    pub(crate) pending_kinds: HashMap<ServiceKey, (Kind, usize)>,
}

/// What a [`Reservation`] holds.
enum Reserved {
    /// An instance an update is taking out of the consumer view ([`State::leaving`]).
    Leaving(ServiceKey, InstanceKey),
    /// A service's kind ([`State::pending_kinds`]).
    Kind(ServiceKey),
}

/// Releases a reservation made under the state lock when the change holding it ends, however
/// it ends (applied, failed, or its task dropped).
pub(crate) struct Reservation {
    registry: Registry,
    what: Reserved,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut state = self.registry.lock();
        match &self.what {
            Reserved::Leaving(service, key) => {
                state.leaving.remove(&(service.clone(), key.clone()));
            }
            Reserved::Kind(service) => {
                if let Some(slot) = state.pending_kinds.get_mut(service) {
                    slot.1 -= 1;
                    if slot.1 == 0 {
                        state.pending_kinds.remove(service);
                    }
                }
            }
        }
    }
}

/// The kind of service an instance with this liveness belongs in.
fn kind_of(liveness: &Liveness) -> Kind {
    if matches!(liveness, Liveness::Probe(_)) {
        Kind::Persistent
    } else {
        Kind::Ephemeral
    }
}

impl State {
    fn service(&mut self, key: &ServiceKey) -> &mut ServiceEntry {
        self.services
            .entry(key.clone())
            .or_insert_with(|| ServiceEntry::new(key))
    }

    /// Bumps the service's revision and publishes its new snapshot. Returns the revision.
    pub(crate) fn publish(&mut self, key: &ServiceKey) -> u64 {
        self.revision += 1;
        let revision = self.revision;
        let entry = self.service(key);
        entry.revision = revision;
        let snapshot = Arc::new(Snapshot {
            service: key.clone(),
            view: entry.view(),
        });
        entry.tx.send_replace(snapshot);
        revision
    }

    fn check_kind(&self, key: &ServiceKey, kind: Kind) -> Result<(), ApiError> {
        let existing = self
            .services
            .get(key)
            .and_then(ServiceEntry::kind)
            .or_else(|| self.pending_kinds.get(key).map(|(k, _)| *k));
        match existing {
            Some(existing) if existing != kind => Err(ApiError::conflict(format!(
                "service {key} is {existing}; cannot register an instance of the other kind ({kind}) in it"
            ))),
            _ => Ok(()),
        }
    }

    /// Whether `liveness` may (re-)register `instance` in `service` now: the kind fits, the
    /// session exists, and no other client's session owns the instance.
    fn check_register(
        &self,
        service: &ServiceKey,
        instance: &Instance,
        liveness: &Liveness,
    ) -> Result<(), ApiError> {
        self.check_kind(service, kind_of(liveness))?;
        if let Liveness::Session(id) = liveness {
            if !self.sessions.contains_key(id) {
                return Err(ApiError::not_found(format!("no session {id}")));
            }
        }
        let existing = self
            .services
            .get(service)
            .and_then(|s| s.instances.get(&instance.key));
        if let Some(Entry {
            liveness: Liveness::Session(owner),
            ..
        }) = existing
        {
            let same_client = match liveness {
                Liveness::Session(id) => id == owner || self.same_client(id, owner),
                _ => false,
            };
            if !same_client {
                return Err(self.owned_error(service, &instance.key, owner));
            }
        }
        Ok(())
    }

    /// Two sessions of one client process (a reconnect): both gave the same client id.
    fn same_client(&self, a: &str, b: &str) -> bool {
        match (self.sessions.get(a), self.sessions.get(b)) {
            (Some(a), Some(b)) => !a.client_id.is_empty() && a.client_id == b.client_id,
            _ => false,
        }
    }

    /// The 409 for touching an instance that `owner`'s session keeps alive.
    fn owned_error(&self, service: &ServiceKey, key: &InstanceKey, owner: &str) -> ApiError {
        let who = match self.sessions.get(owner) {
            Some(s) if !s.client_name.is_empty() => {
                format!("session {owner} (client {} at {})", s.client_name, s.peer)
            }
            Some(s) => format!("session {owner} (at {})", s.peer),
            None => format!("session {owner}"),
        };
        ApiError::conflict(format!(
            "instance {key} of {service} is kept alive by {who} and belongs to it; offline or \
             drain take it out of traffic, and only its session (or force) removes it"
        ))
    }

    /// Reserves `kind` for `service` while a registration writes to the store, so that a
    /// racing registration of the other kind is refused.
    fn reserve_kind(
        &mut self,
        registry: &Registry,
        service: &ServiceKey,
        kind: Kind,
    ) -> Reservation {
        let slot = self
            .pending_kinds
            .entry(service.clone())
            .or_insert((kind, 0));
        slot.1 += 1;
        Reservation {
            registry: registry.clone(),
            what: Reserved::Kind(service.clone()),
        }
    }

    fn entry(&self, key: &ServiceKey, instance: &InstanceKey) -> Result<&Entry, ApiError> {
        self.services
            .get(key)
            .and_then(|s| s.instances.get(instance))
            .ok_or_else(|| ApiError::not_found(format!("no instance {instance} in service {key}")))
    }

    fn entry_mut(
        &mut self,
        key: &ServiceKey,
        instance: &InstanceKey,
    ) -> Result<&mut Entry, ApiError> {
        self.services
            .get_mut(key)
            .and_then(|s| s.instances.get_mut(instance))
            .ok_or_else(|| ApiError::not_found(format!("no instance {instance} in service {key}")))
    }

    /// The last-serving rule, checked and reserved in one step: when `updated` (the new state
    /// of an instance of `service`) takes it out of the consumer view, and no other instance
    /// would be left there (instances already reserved as leaving count as gone), refuses
    /// unless `force`. Otherwise reserves it as leaving until the returned guard drops.
    fn reserve_leaving(
        &mut self,
        registry: &Registry,
        service: &ServiceKey,
        updated: &Instance,
        force: bool,
    ) -> Result<Option<Reservation>, ApiError> {
        let Some(entry) = self.services.get(service) else {
            return Ok(None);
        };
        if !entry.view().contains(&updated.key) {
            return Ok(None);
        }
        let after: Vec<Instance> = entry
            .instances
            .values()
            .map(|e| {
                let mut i = if e.instance.key == updated.key {
                    updated.clone()
                } else {
                    e.instance.clone()
                };
                if self.leaving.contains(&(service.clone(), i.key.clone())) {
                    i.enabled = false;
                }
                i
            })
            .collect();
        let view = View::build(0, &after, entry.settings.protect_threshold);
        if view.contains(&updated.key) {
            return Ok(None);
        }
        if view.instances.is_empty() && !force {
            return Err(ApiError::conflict(format!(
                "{} is the last serving instance of {service}; taking it out of the consumer \
                 view would cut all traffic (use force to do it anyway)",
                updated.key
            )));
        }
        self.leaving.insert((service.clone(), updated.key.clone()));
        Ok(Some(Reservation {
            registry: registry.clone(),
            what: Reserved::Leaving(service.clone(), updated.key.clone()),
        }))
    }

    /// Wakes the drains and readiness waits of these services (an ack arrived or a subscriber
    /// left).
    pub(crate) fn notify_acks(&self, services: impl IntoIterator<Item = ServiceKey>) {
        for key in services {
            if let Some(s) = self.services.get(&key) {
                s.acks.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
    }

    /// Removes an instance, noting when a marked instance left. Does not publish.
    pub(crate) fn remove(&mut self, key: &ServiceKey, instance: &InstanceKey) -> Option<Entry> {
        let removed = self.services.get_mut(key)?.instances.remove(instance)?;
        if let Some(mark) = self.marks.get_mut(&(key.clone(), instance.clone())) {
            mark.gone_since = Some(Instant::now());
        }
        Some(removed)
    }

    fn insert(&mut self, key: &ServiceKey, mut instance: Instance, liveness: Liveness) -> u64 {
        if let Some(mark) = self.marks.get_mut(&(key.clone(), instance.key.clone())) {
            instance.enabled = false;
            mark.gone_since = None;
        }
        let entry = Entry { instance, liveness };
        self.service(key)
            .instances
            .insert(entry.instance.key.clone(), entry);
        self.publish(key)
    }
}

pub(crate) struct Inner {
    pub(crate) state: Mutex<State>,
    /// The durable store, until [`Registry::close`] releases it.
    store: shutdown::StoreSlot,
    /// Serialises durable writes with the in-memory change that follows them.
    durable: tokio::sync::Mutex<()>,
    pub(crate) config: Config,
    boot_id: String,
    /// Why snapshots are held back (warm-up after start, stall recovery, shutdown).
    holds: watch::Sender<hold::Holds>,
    clock: hold::StallClock,
    pub(crate) metrics: Metrics,
    probes: Mutex<HashMap<(ServiceKey, InstanceKey), tokio::task::AbortHandle>>,
    next_id: AtomicU64,
}

/// The registry. Cheap to clone; all clones share one state.
#[derive(Clone)]
pub struct Registry {
    pub(crate) inner: Arc<Inner>,
}

fn summary(state: &State, key: &ServiceKey, s: &ServiceEntry) -> ServiceSummary {
    ServiceSummary {
        key: key.clone(),
        kind: s.kind(),
        revision: s.revision,
        instances: s.instances.len(),
        serving: s.view().instances.len(),
        subscribers: state
            .subscribers
            .values()
            .filter(|sub| &sub.service == key)
            .count(),
        settings: s.settings.clone(),
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Registry {
    /// Loads durable state from `store`, starts probes for persistent instances, the lease,
    /// mark and poller checker, and the warm-up timer. Must run inside a tokio runtime.
    pub fn start(
        store: Arc<dyn Store>,
        config: Config,
        metrics: Metrics,
    ) -> Result<Self, ApiError> {
        let contents = store.load()?;
        let boot_micros = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(1);
        let mut state = State {
            revision: boot_micros,
            ..State::default()
        };
        for (key, settings) in &contents.services {
            state.service(key).settings = settings.clone();
        }
        let now = Instant::now();
        for ((svc, key), mark) in &contents.offline_marks {
            // Absent until a registration says otherwise; the expiry clock starts now.
            state.marks.insert(
                (svc.clone(), key.clone()),
                MarkEntry {
                    mark: mark.clone(),
                    gone_since: Some(now),
                },
            );
        }
        let mut persistent = Vec::new();
        for (svc, instances) in &contents.instances {
            for stored in instances.values() {
                let mut instance = stored.instance.clone();
                instance.healthy = true;
                state.insert(svc, instance, Liveness::Probe(stored.probe.clone()));
                persistent.push((
                    svc.clone(),
                    stored.instance.key.clone(),
                    stored.probe.clone(),
                ));
            }
        }
        let holds = hold::Holds {
            warmup: !config.warmup.is_zero(),
            ..hold::Holds::default()
        };
        let registry = Registry {
            inner: Arc::new(Inner {
                state: Mutex::new(state),
                store: shutdown::StoreSlot::new(store),
                durable: tokio::sync::Mutex::new(()),
                boot_id: format!("{boot_micros:x}"),
                holds: watch::channel(holds).0,
                clock: hold::StallClock::new(Instant::now()),
                metrics,
                probes: Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(1),
                config,
            }),
        };
        for (svc, key, spec) in persistent {
            registry.start_probe(svc, key, spec);
        }
        registry.spawn_background();
        Ok(registry)
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn next_id(&self, prefix: &str) -> String {
        format!(
            "{prefix}{}",
            self.inner.next_id.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// Changes on every start (hex of the boot time in µs).
    pub fn boot_id(&self) -> &str {
        &self.inner.boot_id
    }

    /// The configuration the registry runs with.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// True while snapshots are held back: the warm-up after start, a recovery from the
    /// registry's own stall, or a shutdown. Pulls are refused meanwhile (503 / `warming_up`).
    pub fn warming_up(&self) -> bool {
        self.inner.holds.borrow().any()
    }

    /// Resolves once snapshots flow (at once when they do).
    pub async fn warmed_up(&self) {
        let mut rx = self.inner.holds.subscribe();
        let _ = rx.wait_for(|h| !h.any()).await;
    }

    /// Holds back every push from now on (server shutdown): subscribers keep the last view
    /// they were sent, so ending their sessions afterwards shows no consumer a removal.
    /// There is no way back; a stopping server calls it before it ends sessions.
    pub fn hold_pushes(&self) {
        self.set_hold(|h| h.shutdown = true);
    }

    async fn write(&self, batch: Vec<Write>) -> Result<(), ApiError> {
        let store = self.inner.store.get()?;
        tokio::task::spawn_blocking(move || store.apply(&batch))
            .await
            .map_err(|e| ApiError::Store(format!("store task failed: {e}")))??;
        Ok(())
    }

    /// Registers (or re-registers, replacing fields) an instance.
    ///
    /// `instance.enabled = false` registers it offline from its first revision, with its
    /// durable offline mark (Nacos `enabled=false`); an existing offline mark keeps any
    /// registration offline. An instance kept alive by a session belongs to that session: a
    /// registration on a lease, a probe or another client's session is refused (a new session
    /// of the same client, a reconnect, takes it over). Cancel-safe: once validated, the
    /// registration runs to completion even if the future is dropped.
    ///
    /// Errors: 400 on any invalid field (nothing changes), 404 for an unknown session,
    /// 409 when the service holds instances of the other kind, when a session owns the
    /// instance, or when re-registering it offline would take the last serving instance out.
    pub async fn register(
        &self,
        service: ServiceKey,
        instance: Instance,
        liveness: LivenessRequest,
    ) -> Result<(u64, Instance), ApiError> {
        validate::service_key(&service)?;
        validate::instance_key(&instance.key)?;
        validate::weight(instance.weight)?;
        validate::metadata(&instance.metadata)?;
        let liveness = self.bind_liveness(liveness)?;
        let mut instance = instance;
        instance.ephemeral = !matches!(liveness, Liveness::Probe(_));
        instance.healthy = true;
        let registry = self.clone();
        tokio::spawn(async move { registry.apply_register(service, instance, liveness).await })
            .await
            .map_err(|e| ApiError::Store(format!("register task failed: {e}")))?
    }

    async fn apply_register(
        &self,
        service: ServiceKey,
        mut instance: Instance,
        liveness: Liveness,
    ) -> Result<(u64, Instance), ApiError> {
        let key = instance.key.clone();
        let mark_key = (service.clone(), key.clone());
        let offline = !instance.enabled;
        let probe = match &liveness {
            Liveness::Probe(p) => Some(p.clone()),
            _ => None,
        };
        // Only a persistent instance or a new offline mark needs the store.
        let mut marked = self.lock().marks.contains_key(&mark_key);
        let durable = if probe.is_some() || (offline && !marked) {
            Some(self.inner.durable.lock().await)
        } else {
            None
        };
        let (batch, reservation) = {
            let mut state = self.lock();
            state.check_register(&service, &instance, &liveness)?;
            marked = state.marks.contains_key(&mark_key);
            if marked {
                instance.enabled = false;
            }
            let mut batch = Vec::new();
            if offline && !marked {
                batch.push(Write::PutOfflineMark(
                    service.clone(),
                    key.clone(),
                    OfflineMark { since_ms: now_ms() },
                ));
            }
            if let Some(probe) = &probe {
                batch.push(Write::PutInstance(
                    service.clone(),
                    StoredInstance {
                        instance: instance.clone(),
                        probe: probe.clone(),
                    },
                ));
            }
            // Fallible first: a reservation must not drop while the state lock is held.
            let leaving = state.reserve_leaving(self, &service, &instance, false)?;
            let kind =
                (!batch.is_empty()).then(|| state.reserve_kind(self, &service, kind_of(&liveness)));
            (batch, (kind, leaving))
        };
        if !batch.is_empty() {
            self.write(batch).await?;
        }
        let applied = {
            let mut state = self.lock();
            state
                .check_register(&service, &instance, &liveness)
                .map(|()| {
                    if !instance.enabled {
                        state.marks.entry(mark_key).or_insert(MarkEntry {
                            mark: OfflineMark { since_ms: now_ms() },
                            gone_since: None,
                        });
                    }
                    state.insert(&service, instance, liveness)
                })
        };
        let revision = match applied {
            Ok(revision) => revision,
            Err(e) => {
                // Only a session that ended (or took the instance) during the store write gets
                // here, the kind being reserved: undo the mark this registration wrote.
                if offline && !marked {
                    let undo = vec![Write::DeleteOfflineMark(service.clone(), key.clone())];
                    if let Err(undo_err) = self.write(undo).await {
                        tracing::warn!(error = %undo_err, "could not undo an offline mark");
                    }
                }
                return Err(e);
            }
        };
        drop(reservation);
        drop(durable);
        if let Some(probe) = probe {
            self.start_probe(service.clone(), key.clone(), probe);
        }
        Ok((revision, self.instance(&service, &key)?))
    }

    fn bind_liveness(&self, request: LivenessRequest) -> Result<Liveness, ApiError> {
        Ok(match request {
            LivenessRequest::Session(id) => Liveness::Session(id),
            LivenessRequest::Lease {
                ttl,
                delete_timeout,
            } => {
                let ttl = ttl.unwrap_or(self.inner.config.liveness.lease_ttl);
                let delete_timeout =
                    delete_timeout.unwrap_or(self.inner.config.liveness.lease_delete_timeout);
                validate::lease(ttl, delete_timeout)?;
                Liveness::Lease(Lease {
                    last_heartbeat: Instant::now(),
                    ttl,
                    delete_timeout,
                })
            }
            LivenessRequest::Probe(spec) => {
                validate::probe(&spec)?;
                Liveness::Probe(spec)
            }
        })
    }

    /// One instance as stored. Errors: 404.
    pub fn instance(&self, service: &ServiceKey, key: &InstanceKey) -> Result<Instance, ApiError> {
        Ok(self.lock().entry(service, key)?.instance.clone())
    }

    /// Deletes an instance (and its durable record if persistent). An instance kept alive by
    /// a session belongs to it: deleting it from elsewhere is refused unless `force` (its
    /// session may still re-register it later).
    ///
    /// Errors: 404 unknown instance; 409 owned by a session and `force` is false.
    pub async fn deregister(
        &self,
        service: &ServiceKey,
        key: &InstanceKey,
        force: bool,
    ) -> Result<u64, ApiError> {
        let check = |state: &State| -> Result<bool, ApiError> {
            let entry = state.entry(service, key)?;
            if let (Liveness::Session(owner), false) = (&entry.liveness, force) {
                return Err(state.owned_error(service, key, owner));
            }
            Ok(!entry.instance.ephemeral)
        };
        let persistent = check(&self.lock())?;
        if persistent {
            let _durable = self.inner.durable.lock().await;
            check(&self.lock())?;
            self.write(vec![Write::DeleteInstance(service.clone(), key.clone())])
                .await?;
            self.stop_probe(service, key);
        }
        let mut state = self.lock();
        check(&state)?;
        state.remove(service, key);
        Ok(state.publish(service))
    }

    /// Removes an instance if `session` still owns it (a session's own deregister).
    pub fn deregister_on_session(
        &self,
        session: &str,
        service: &ServiceKey,
        key: &InstanceKey,
    ) -> Result<u64, ApiError> {
        let mut state = self.lock();
        match &state.entry(service, key)?.liveness {
            Liveness::Session(owner) if owner == session => {}
            _ => {
                return Err(ApiError::conflict(format!(
                    "instance {key} of {service} is not registered on this session"
                )));
            }
        }
        state.remove(service, key);
        Ok(state.publish(service))
    }

    /// Changes weight, metadata and/or enabled (the latter with its durable offline mark).
    /// Validates everything first. Returns the new revision and instance.
    ///
    /// An update that takes the instance out of the consumer view (offline, weight 0) while it
    /// is the last instance there is refused unless `patch.force`: the check and the change
    /// are one step (the instance is reserved as leaving under the state lock before the store
    /// write, so a racing update of another instance counts it as gone already).
    /// Cancel-safe: once past validation, the change runs to completion even if the future is
    /// dropped.
    ///
    /// Errors: 400 on an invalid field, 404 unknown instance, 409 last serving instance.
    pub async fn update(
        &self,
        service: &ServiceKey,
        key: &InstanceKey,
        patch: Patch,
    ) -> Result<(u64, Instance), ApiError> {
        if let Some(w) = patch.weight {
            validate::weight(w)?;
        }
        if let Some(m) = &patch.metadata {
            validate::metadata(m)?;
        }
        let registry = self.clone();
        let (service, key) = (service.clone(), key.clone());
        tokio::spawn(async move { registry.apply_update(&service, &key, patch).await })
            .await
            .map_err(|e| ApiError::Store(format!("update task failed: {e}")))?
    }

    async fn apply_update(
        &self,
        service: &ServiceKey,
        key: &InstanceKey,
        patch: Patch,
    ) -> Result<(u64, Instance), ApiError> {
        let _durable = self.inner.durable.lock().await;
        let mut batch = Vec::new();
        let (updated, _leaving) = {
            let mut state = self.lock();
            let entry = state.entry(service, key)?;
            let mut instance = entry.instance.clone();
            if let Some(w) = patch.weight {
                instance.weight = w;
            }
            if let Some(m) = patch.metadata.clone() {
                instance.metadata = m;
            }
            if let Some(enabled) = patch.enabled {
                instance.enabled = enabled;
                let has_mark = state.marks.contains_key(&(service.clone(), key.clone()));
                match (enabled, has_mark) {
                    (false, false) => batch.push(Write::PutOfflineMark(
                        service.clone(),
                        key.clone(),
                        OfflineMark { since_ms: now_ms() },
                    )),
                    (true, true) => {
                        batch.push(Write::DeleteOfflineMark(service.clone(), key.clone()))
                    }
                    _ => {}
                }
            }
            if let Liveness::Probe(probe) = &entry.liveness {
                let mut stored = instance.clone();
                stored.healthy = true;
                batch.push(Write::PutInstance(
                    service.clone(),
                    StoredInstance {
                        instance: stored,
                        probe: probe.clone(),
                    },
                ));
            }
            let leaving = state.reserve_leaving(self, service, &instance, patch.force)?;
            (instance, leaving)
        };
        if !batch.is_empty() {
            self.write(batch).await?;
        }
        let mut state = self.lock();
        match patch.enabled {
            Some(false) => {
                state
                    .marks
                    .entry((service.clone(), key.clone()))
                    .or_insert(MarkEntry {
                        mark: OfflineMark { since_ms: now_ms() },
                        gone_since: None,
                    });
            }
            Some(true) => {
                state.marks.remove(&(service.clone(), key.clone()));
            }
            None => {}
        }
        // The instance may have left while the store wrote; then there is nothing to change.
        let entry = state.entry_mut(service, key)?;
        let healthy = entry.instance.healthy;
        let updated = Instance { healthy, ..updated };
        if entry.instance == updated {
            // Nothing changed: no new revision, no push.
            let instance = updated;
            let revision = state.services.get(service).map_or(0, |s| s.revision);
            return Ok((revision, instance));
        }
        entry.instance = updated;
        let instance = entry.instance.clone();
        Ok((state.publish(service), instance))
    }

    /// Sets an instance offline (`enabled=false`) or online, durably. `force`: see
    /// [`Patch::force`]. Errors: 404; 409 when offline would take the last instance out of the
    /// consumer view and `force` is false.
    pub async fn set_enabled(
        &self,
        service: &ServiceKey,
        key: &InstanceKey,
        enabled: bool,
        force: bool,
    ) -> Result<(u64, Instance), ApiError> {
        self.update(
            service,
            key,
            Patch {
                enabled: Some(enabled),
                force,
                ..Patch::default()
            },
        )
        .await
    }

    /// Renews a lease. Errors: 404 unknown instance (the client should re-register),
    /// 409 when the instance is not lease-kept. Returns (ttl, healthy after renewal).
    pub fn heartbeat(&self, service: &ServiceKey, key: &InstanceKey) -> Result<Duration, ApiError> {
        let mut state = self.lock();
        let entry = state.entry_mut(service, key)?;
        let Liveness::Lease(lease) = &mut entry.liveness else {
            return Err(ApiError::conflict(format!(
                "instance {key} of {service} is kept alive by its {}, not by heartbeats",
                entry.liveness.as_str()
            )));
        };
        lease.last_heartbeat = Instant::now();
        let ttl = lease.ttl;
        if !entry.instance.healthy {
            entry.instance.healthy = true;
            state.publish(service);
        }
        Ok(ttl)
    }

    /// Sets an instance's health flag (probes); publishes only on a change.
    pub(crate) fn set_health(&self, service: &ServiceKey, key: &InstanceKey, healthy: bool) {
        let mut state = self.lock();
        if let Ok(entry) = state.entry_mut(service, key) {
            if entry.instance.healthy != healthy {
                entry.instance.healthy = healthy;
                state.publish(service);
            }
        }
    }

    /// Settings of a service. Errors: 404 if the registry knows nothing of it.
    pub fn settings(&self, service: &ServiceKey) -> Result<ServiceSettings, ApiError> {
        self.lock()
            .services
            .get(service)
            .map(|s| s.settings.clone())
            .ok_or_else(|| ApiError::not_found(format!("no service {service}")))
    }

    /// Replaces a service's settings, durably. Errors: 400.
    pub async fn put_settings(
        &self,
        service: &ServiceKey,
        settings: ServiceSettings,
    ) -> Result<u64, ApiError> {
        validate::service_key(service)?;
        validate::protect_threshold(settings.protect_threshold)?;
        validate::metadata(&settings.metadata)?;
        let _durable = self.inner.durable.lock().await;
        self.write(vec![Write::PutService(service.clone(), settings.clone())])
            .await?;
        let mut state = self.lock();
        state.service(service).settings = settings;
        Ok(state.publish(service))
    }

    /// The consumer view of a service (revision 0 and empty if unknown).
    pub fn view(&self, service: &ServiceKey) -> View {
        self.lock()
            .services
            .get(service)
            .map(ServiceEntry::view)
            .unwrap_or_else(|| View::build(0, [], 0.0))
    }

    /// Every instance of a service with its liveness, and the revision.
    pub fn entries(&self, service: &ServiceKey) -> (u64, Vec<Entry>) {
        let state = self.lock();
        match state.services.get(service) {
            Some(s) => (s.revision, s.instances.values().cloned().collect()),
            None => (0, Vec::new()),
        }
    }

    /// Services with instances, settings or subscribers, filtered by namespace/group if given.
    pub fn services(&self, namespace: Option<&str>, group: Option<&str>) -> Vec<ServiceSummary> {
        let state = self.lock();
        let mut out: Vec<ServiceSummary> = state
            .services
            .iter()
            .filter(|(k, _)| {
                namespace.is_none_or(|n| k.namespace == n) && group.is_none_or(|g| k.group == g)
            })
            .map(|(k, s)| summary(&state, k, s))
            .filter(|s| {
                s.instances > 0 || s.settings != ServiceSettings::default() || s.subscribers > 0
            })
            .collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out
    }

    /// One service's summary, whatever it holds. Errors: 404 if the registry knows nothing of it.
    pub fn service(&self, service: &ServiceKey) -> Result<ServiceSummary, ApiError> {
        let state = self.lock();
        state
            .services
            .get(service)
            .map(|s| summary(&state, service, s))
            .ok_or_else(|| ApiError::not_found(format!("no service {service}")))
    }

    /// Opens a session for a connected peer. Returns its id (`s<N>`). `client_id` identifies
    /// the client process across its sessions (the native `Hello.client_id`; Nacos: its peer
    /// IP): a session with the same non-empty `client_id` as the one owning an instance may
    /// register it, taking it over (a reconnect whose old connection is not closed yet).
    pub fn open_session(&self, peer: String, client_name: String, client_id: String) -> String {
        let id = self.next_id("s");
        self.lock().sessions.insert(
            id.clone(),
            SessionEntry {
                peer,
                client_name,
                client_id,
            },
        );
        self.inner.metrics.sessions_opened.inc();
        id
    }

    /// Ends a session: its instances go at once, its subscriptions leave every drain's wait.
    /// While the registry recovers from its own stall the instances stay instead, in
    /// [`Liveness::Grace`], until their client registers them again on a new session or the
    /// recovery ends (see `engine::hold`). While the registry stops they stay too: nothing is
    /// published any more, and removing them one session at a time would only slow the stop.
    pub fn close_session(&self, id: &str) {
        let recovering = self.observe_clock(Instant::now()) == hold::ClockReading::Recovering;
        let stopping = self.is_stopping();
        let mut state = self.lock();
        state.sessions.remove(id);
        let owned: Vec<(ServiceKey, InstanceKey)> = state
            .services
            .iter()
            .filter(|_| !stopping)
            .flat_map(|(svc, s)| {
                s.instances
                    .values()
                    .filter(|e| matches!(&e.liveness, Liveness::Session(owner) if owner == id))
                    .map(move |e| (svc.clone(), e.instance.key.clone()))
            })
            .collect();
        let mut touched: Vec<ServiceKey> = Vec::new();
        for (svc, key) in owned {
            if recovering {
                if let Ok(entry) = state.entry_mut(&svc, &key) {
                    entry.liveness = Liveness::Grace;
                }
                continue;
            }
            state.remove(&svc, &key);
            if !touched.contains(&svc) {
                touched.push(svc);
            }
        }
        for svc in &touched {
            state.publish(svc);
        }
        let mut left: Vec<ServiceKey> = Vec::new();
        state.subscribers.retain(|_, s| {
            let gone = s.session.as_deref() == Some(id);
            if gone {
                left.push(s.service.clone());
            }
            !gone
        });
        state.notify_acks(left);
        drop(state);
        tracing::debug!(
            session = id,
            services = touched.len(),
            recovering,
            "session closed"
        );
    }

    /// Number of live sessions.
    pub fn session_count(&self) -> usize {
        self.lock().sessions.len()
    }
}
