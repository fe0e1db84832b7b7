//! The registry engine (DESIGN §2-§4, §7): one in-memory state behind a mutex, durable parts
//! written through the [`Store`] with group commit before they are acknowledged.
//!
//! Every change to a service bumps its revision (one global counter, started from the boot
//! time in µs so revisions keep growing across restarts) and wakes the service's subscribers;
//! nothing is rebuilt per change: the consumer view is derived from counts kept up to date, a
//! [`Snapshot`] is built once per revision when first asked for and shared, and native
//! subscribers get a [`Delta`] against the revision they acked. Push streams
//! ([`Registry::pushes`]) coalesce and re-send; acks flow back through [`Registry::ack`];
//! [`Registry::drain`] and [`Registry::wait_ready`] wait on those acks.
//!
//! Files: `state` (the state and its race-proof rules), `service` (one service: tally,
//! snapshot, change log), `instances` (changes), `sessions`, `subscribers` (table and push
//! streams), `drain` (ack waits), `live_drains` (drains in progress, for listings), `durable` (group commit), `hold` (warm-up, stalls,
//! shutdown), `background` (expiry), `probe`.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gangway_core::View;
use gangway_core::model::{Instance, InstanceKey, Kind, ProbeSpec, ServiceKey, ServiceSettings};
use gangway_store::Store;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::config::Config;
use crate::metrics::Metrics;

mod background;
mod cluster;
mod drain;
mod durable;
mod error;
mod hold;
mod instances;
mod leases;
mod live_drains;
mod probe;
mod service;
mod sessions;
mod shutdown;
mod state;
mod subscribers;
#[cfg(test)]
mod tests;

pub use cluster::Remote;
pub use drain::DrainReport;
pub use error::RegistryError;
pub use live_drains::{Activity, DrainProgress, DrainState, LAGGARDS_LISTED, RECENT_DRAINS};
pub use service::{CHANGE_LOG_LEN, Delta, Push, Snapshot};
pub use sessions::{Kept, SessionInfo};
pub use shutdown::CloseReport;
pub use subscribers::{SubscriberInfo, SubscriberKind, SubscriberRow};

use service::Changed;
use state::{MarkEntry, State};

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
    /// owned by nobody, until a session registers it again or `until` passes (then removed):
    /// the session's end plus [`Config::stall_grace`](crate::Config::stall_grace), moved on by
    /// a later stall as leases are.
    Grace {
        /// When the instance goes if no session registered it again.
        until: Instant,
        /// The client id of the session that ended (empty: none given): a registration by
        /// another client is a new process, which a drain's offline does not follow.
        client_id: String,
    },
    /// Ephemeral, kept by a session or lease on another node of the cluster (docs/cluster.md):
    /// it goes when that node's store record goes.
    Remote(cluster::Remote),
}

impl Liveness {
    /// `"session"`, `"lease"`, `"probe"`, `"grace"` or `"remote"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Liveness::Session(_) => "session",
            Liveness::Lease(_) => "lease",
            Liveness::Probe(_) => "probe",
            Liveness::Grace { .. } => "grace",
            Liveness::Remote(_) => "remote",
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
    /// The principal that registered it (docs/security.md): it may always take it out; others
    /// need `admin`. `None` without auth; a persistent instance keeps it in the store
    /// ([`StoredInstance::owner`](gangway_core::model::StoredInstance::owner)), so it survives a
    /// restart.
    pub owner: Option<String>,
    /// Unix ms since which its current keeper keeps it: its registration, kept by a
    /// re-registration through the same session, lease or probe (a heartbeat, an SDK's redo),
    /// new when another session takes it over. For persistent instances loaded from the store:
    /// the load.
    pub since_ms: u64,
}

/// A change to an existing instance; `None` fields stay as they are.
#[derive(Debug, Clone, Default)]
pub struct Patch {
    /// New weight.
    pub weight: Option<f64>,
    /// New metadata (replaces the map).
    pub metadata: Option<BTreeMap<String, String>>,
    /// Offline (`false`) or online (`true`), with the durable offline mark: an operator's
    /// offline survives re-registration of the same address and registry restarts, until
    /// online (Nacos `enabled=false` semantics).
    pub enabled: Option<bool>,
    /// With `enabled: Some(false)`: the offline lasts only until the instance leaves
    /// (deregistered, lease expired, session closed), held in memory, not in the store, so a
    /// restarted process on the same address serves again. What a drain sets (default false:
    /// the durable mark). Never weakens a durable mark already there.
    pub until_gone: bool,
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
    /// Serving instances: enabled, healthy, weight > 0 (as `/metrics` counts them; while the
    /// protect threshold fires the consumer view also holds the unhealthy enabled ones).
    pub serving: usize,
    /// Live subscribers.
    pub subscribers: usize,
    /// Instance counts: enabled, enabled and healthy, serving (so offline = `instances -
    /// enabled`, unhealthy = `enabled - healthy`, weight 0 = `healthy - serving`, as
    /// `/metrics` counts the states).
    pub tally: gangway_core::Tally,
    /// Settings.
    pub settings: ServiceSettings,
}

pub(crate) struct Inner {
    pub(crate) state: Mutex<State>,
    committer: durable::Committer,
    pub(crate) config: Config,
    boot_id: String,
    /// Why snapshots are held back (loading, warm-up after start, stall recovery, shutdown).
    holds: watch::Sender<hold::Holds>,
    /// Whether the store's contents are in.
    load: watch::Sender<LoadState>,
    clock: hold::StallClock,
    pub(crate) metrics: Metrics,
    probes: Mutex<HashMap<(ServiceKey, InstanceKey), tokio::task::AbortHandle>>,
    next_id: AtomicU64,
    /// The cluster this node is part of (docs/cluster.md), `None`: alone.
    pub(crate) cluster: Option<Arc<dyn gangway_store::Cluster>>,
    /// The REST and gRPC addresses served, and the start (unix ms), once `start` bound them.
    pub(crate) addresses: std::sync::OnceLock<(std::net::SocketAddr, std::net::SocketAddr, u64)>,
}

/// Where loading the store stands.
#[derive(Debug, Clone)]
enum LoadState {
    Loading,
    Loaded,
    Failed(RegistryError),
}

/// The registry. Cheap to clone; all clones share one state.
#[derive(Clone)]
pub struct Registry {
    pub(crate) inner: Arc<Inner>,
}

fn summary(s: &service::ServiceEntry) -> ServiceSummary {
    ServiceSummary {
        key: s.key.clone(),
        kind: s.kind(),
        revision: s.revision,
        instances: s.instances.len(),
        serving: s.tally().serving,
        subscribers: s.subscribers.len(),
        tally: s.tally(),
        settings: s.settings.clone(),
    }
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Registry {
    /// Loads durable state from `store`, then starts the group commit, probes for persistent
    /// instances, the lease, mark and poller checker, and the warm-up timer. Loading publishes
    /// one revision per service, not one per instance. Must run inside a tokio runtime.
    ///
    /// Errors: the store cannot be read.
    pub fn start(
        store: Arc<dyn Store>,
        config: Config,
        metrics: Metrics,
    ) -> Result<Self, RegistryError> {
        let contents = store.load()?;
        let registry = Self::empty(store, config, metrics);
        registry.load(contents, None);
        Ok(registry)
    }

    /// [`Registry::start`] without waiting for the store: the registry is returned at once,
    /// *loading* ([`Registry::is_loading`], pushes held) while a blocking task reads the store,
    /// so that a server answers its health check during a long load. Transports refuse other
    /// requests meanwhile (503 / UNAVAILABLE). [`Registry::loaded`] resolves when the data is
    /// in, with the store's error if it could not be read.
    pub fn start_loading(store: Arc<dyn Store>, config: Config, metrics: Metrics) -> Self {
        let registry = Self::empty(store.clone(), config, metrics);
        let loader = registry.clone();
        if let Some(cluster) = registry.inner.cluster.clone() {
            tokio::spawn(async move {
                let started = Instant::now();
                let read = {
                    let cluster = cluster.clone();
                    tokio::task::spawn_blocking(move || cluster.load()).await
                };
                match read {
                    Ok(Ok(all)) => {
                        let revision = all.revision;
                        loader.load_cluster(all);
                        loader.spawn_follower(cluster.clone(), revision);
                        loader.spawn_replicator(cluster);
                        tracing::info!(
                            revision,
                            ms = started.elapsed().as_millis() as u64,
                            "cluster store loaded"
                        );
                    }
                    Ok(Err(e)) => loader.load_failed(e.into()),
                    Err(e) => {
                        loader.load_failed(RegistryError::Internal(format!("load task: {e}")))
                    }
                }
            });
            return registry;
        }
        tokio::spawn(async move {
            let started = Instant::now();
            let read = tokio::task::spawn_blocking(move || store.load()).await;
            match read {
                Ok(Ok(contents)) => {
                    let instances: usize = contents.instances.values().map(|m| m.len()).sum();
                    loader.load(contents, None);
                    tracing::info!(
                        instances,
                        ms = started.elapsed().as_millis() as u64,
                        "store loaded"
                    );
                }
                Ok(Err(e)) => loader.load_failed(e.into()),
                Err(e) => loader.load_failed(RegistryError::Internal(format!("load task: {e}"))),
            }
        });
        registry
    }

    /// A registry holding nothing yet, loading.
    fn empty(store: Arc<dyn Store>, config: Config, metrics: Metrics) -> Self {
        let boot_micros = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(1);
        let cluster = store.cluster();
        let state = State {
            // In cluster mode revisions are the store's (docs/cluster.md).
            revision: if cluster.is_some() { 0 } else { boot_micros },
            session_limits: config.session_limits,
            cluster: cluster
                .as_ref()
                .map(|c| cluster::ClusterState::new(c.node().to_owned())),
            ..State::default()
        };
        let holds = hold::Holds {
            loading: true,
            warmup: !config.warmup.is_zero(),
            ..hold::Holds::default()
        };
        let (committer, queue) = durable::Committer::new(store.max_batch());
        let registry = Registry {
            inner: Arc::new(Inner {
                state: Mutex::new(state),
                committer,
                boot_id: format!("{boot_micros:x}"),
                holds: watch::channel(holds).0,
                load: watch::channel(LoadState::Loading).0,
                clock: hold::StallClock::new(Instant::now()),
                metrics,
                probes: Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(1),
                config,
                cluster,
                addresses: std::sync::OnceLock::new(),
            }),
        };
        queue.start(store, Arc::downgrade(&registry.inner));
        registry
    }

    /// Fills the state from the store's contents (one revision per service: the store's for
    /// each service in cluster mode, `revisions`), then starts probes and background work and
    /// ends the loading.
    fn load(
        &self,
        contents: gangway_store::Contents,
        revisions: Option<&BTreeMap<ServiceKey, i64>>,
    ) {
        let mut persistent = Vec::new();
        {
            let mut state = self.lock();
            for (key, settings) in contents.services {
                state.service(&key).settings = settings;
            }
            let now = Instant::now();
            for ((svc, key), mark) in contents.offline_marks {
                // Absent until a registration says otherwise; the expiry clock starts now.
                state.marks.insert(
                    (svc, key),
                    MarkEntry {
                        mark,
                        gone_since: Some(now),
                        until_gone: false,
                    },
                );
            }
            for (svc, instances) in contents.instances {
                for stored in instances.into_values() {
                    let mut instance = stored.instance;
                    instance.healthy = true;
                    persistent.push((svc.clone(), instance.key.clone(), stored.probe.clone()));
                    state.insert(&svc, instance, Liveness::Probe(stored.probe), stored.owner);
                }
                if revisions.is_none() {
                    state.publish(&svc, Changed::All);
                }
            }
            if let Some(revisions) = revisions {
                // A service emptied before this node started still has its revision mark.
                for svc in revisions.keys() {
                    state.service(svc);
                }
                let services: Vec<ServiceKey> = state.services.keys().cloned().collect();
                for svc in services {
                    let revision = revisions.get(&svc).copied().unwrap_or(0).max(1) as u64;
                    state.publish_at(&svc, Changed::All, revision);
                }
            }
        }
        for (svc, key, spec) in persistent {
            self.start_probe(svc, key, spec);
        }
        // The time the load took is no stall of the registry.
        self.inner.clock.reset(Instant::now());
        self.spawn_background();
        self.inner.load.send_replace(LoadState::Loaded);
        self.set_hold(|h| h.loading = false);
    }

    fn load_failed(&self, e: RegistryError) {
        tracing::error!(error = %e, "the store could not be loaded");
        self.inner.load.send_replace(LoadState::Failed(e));
    }

    /// True until the store's contents are in (see [`Registry::start_loading`]).
    pub fn is_loading(&self) -> bool {
        !matches!(*self.inner.load.borrow(), LoadState::Loaded)
    }

    /// Resolves when the store's contents are in; errors when they could not be read (the
    /// registry then holds nothing and must not serve).
    pub async fn loaded(&self) -> Result<(), RegistryError> {
        let mut rx = self.inner.load.subscribe();
        let state = rx
            .wait_for(|s| !matches!(s, LoadState::Loading))
            .await
            .map_err(|_| RegistryError::Internal("the registry is gone".into()))?;
        match &*state {
            LoadState::Failed(e) => Err(e.clone()),
            _ => Ok(()),
        }
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

    /// One instance as stored. Errors: 404.
    pub fn instance(
        &self,
        service: &ServiceKey,
        key: &InstanceKey,
    ) -> Result<Instance, RegistryError> {
        Ok(self.lock().entry(service, key)?.instance.clone())
    }

    /// The principal that owns an instance ([`Entry::owner`]); `None` when nobody does or the
    /// instance is unknown.
    pub fn owner(&self, service: &ServiceKey, key: &InstanceKey) -> Option<String> {
        self.lock().entry(service, key).ok()?.owner.clone()
    }

    /// Settings of a service. Errors: 404 if the registry knows nothing of it.
    pub fn settings(&self, service: &ServiceKey) -> Result<ServiceSettings, RegistryError> {
        self.lock()
            .services
            .get(service)
            .map(|s| s.settings.clone())
            .ok_or_else(|| RegistryError::UnknownService(service.clone()))
    }

    /// The consumer view of a service, built now (revision 0 and empty if unknown). O(n) in
    /// the service's size; pushes share [`Registry::snapshot`] instead.
    pub fn view(&self, service: &ServiceKey) -> View {
        self.lock()
            .services
            .get(service)
            .map(service::ServiceEntry::view)
            .unwrap_or_else(|| View::build(0, [], 0.0))
    }

    /// The consumer view of a service at its current revision, built once per revision and
    /// shared (revision 0 and empty if unknown).
    pub fn snapshot(&self, service: &ServiceKey) -> Arc<Snapshot> {
        let mut state = self.lock();
        match state.services.get_mut(service) {
            Some(s) => s.snapshot(),
            None => Arc::new(Snapshot {
                service: service.clone(),
                view: View::build(0, [], 0.0),
            }),
        }
    }

    /// A service's current revision (0 if unknown). O(1).
    pub fn revision(&self, service: &ServiceKey) -> u64 {
        self.lock().services.get(service).map_or(0, |s| s.revision)
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
            .map(|(_, s)| summary(s))
            .filter(|s| {
                s.instances > 0 || s.settings != ServiceSettings::default() || s.subscribers > 0
            })
            .collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out
    }

    /// One service's summary, whatever it holds. Errors: 404 if the registry knows nothing of it.
    pub fn service(&self, service: &ServiceKey) -> Result<ServiceSummary, RegistryError> {
        self.lock()
            .services
            .get(service)
            .map(summary)
            .ok_or_else(|| RegistryError::UnknownService(service.clone()))
    }
}
