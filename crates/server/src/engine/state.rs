//! The registry's in-memory state behind its one lock, and the rules that must hold under
//! races, each checked and applied (or reserved) in one critical section: the kind of a
//! service, ownership of session instances, and the last serving instance.

use std::collections::{BTreeSet, HashMap, HashSet};

use gangway_core::model::{Instance, InstanceKey, Kind, OfflineMark, ServiceKey};
use tokio::time::Instant;

use super::RegistryError;
use super::leases::LeaseQueue;
use super::live_drains::LiveDrains;
use super::service::{Changed, ServiceEntry};
use super::subscribers::Subscriber;
use super::{Entry, Liveness, Registry};
use crate::auth::{Caller, Rule};
use crate::config::SessionLimits;

pub(crate) struct MarkEntry {
    /// The mark as stored (kept for listings and expiry decisions).
    #[allow(dead_code)]
    pub(crate) mark: OfflineMark,
    /// When the marked instance was last seen leaving (None: present).
    pub(crate) gone_since: Option<Instant>,
    /// A drain's mark: in memory only, dropped when the instance leaves (see
    /// [`Patch::until_gone`](super::Patch::until_gone)). False: durable, in the store.
    pub(crate) until_gone: bool,
}

impl MarkEntry {
    /// A new mark of an instance that is present.
    pub(crate) fn new(until_gone: bool) -> Self {
        MarkEntry {
            mark: OfflineMark {
                since_ms: super::now_ms(),
            },
            gone_since: None,
            until_gone,
        }
    }
}

pub(crate) struct SessionEntry {
    pub(crate) peer: String,
    pub(crate) client_name: String,
    /// The client process's own id, the same on each of its sessions (empty: none given).
    pub(crate) client_id: String,
    /// The instances this session keeps alive, so that closing it costs what it owns, not
    /// what the registry holds.
    pub(crate) instances: BTreeSet<(ServiceKey, InstanceKey)>,
    /// Its subscribers' ids.
    pub(crate) subscribers: BTreeSet<String>,
}

#[derive(Default)]
pub(crate) struct State {
    pub(crate) services: HashMap<ServiceKey, ServiceEntry>,
    pub(crate) sessions: HashMap<String, SessionEntry>,
    pub(crate) subscribers: HashMap<String, Subscriber>,
    pub(crate) marks: HashMap<(ServiceKey, InstanceKey), MarkEntry>,
    pub(crate) revision: u64,
    /// Instances an update is taking out of the consumer view (reserved under the lock before
    /// its store write, released when it is applied or failed): the last-serving rule counts
    /// them as gone.
    pub(crate) leaving: HashSet<(ServiceKey, InstanceKey)>,
    /// Kinds reserved by registrations that are writing to the store, with their count.
    pub(crate) pending_kinds: HashMap<ServiceKey, (Kind, usize)>,
    /// When each lease must be looked at next.
    pub(crate) leases: LeaseQueue,
    /// What one session may hold, checked with the change it limits.
    pub(crate) session_limits: SessionLimits,
    /// A task is waiting to remove instances whose grace ended (`Registry::expire_grace_at`):
    /// one for the whole registry, set and cleared under this lock.
    pub(crate) grace_timer: bool,
    /// Drains in progress and recently ended (`GET /v1/drains`).
    pub(crate) drains: LiveDrains,
    /// Acks and subscriber arrivals and departures seen (see [`Registry::activity`]).
    pub(crate) acks_seen: u64,
    /// Cluster mode's part (docs/cluster.md); `None` for a node alone.
    pub(crate) cluster: Option<super::cluster::ClusterState>,
}

/// What a [`Reservation`] holds.
enum Reserved {
    /// An instance an update is taking out of the consumer view ([`State::leaving`]).
    Leaving(ServiceKey, InstanceKey),
    /// A service's kind ([`State::pending_kinds`]).
    Kind(ServiceKey),
}

/// Releases a reservation made under the state lock when the change holding it ends, however
/// it ends (applied, failed, or its task dropped). Never drop one while holding the lock.
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
pub(crate) fn kind_of(liveness: &Liveness) -> Kind {
    if matches!(liveness, Liveness::Probe(_)) {
        Kind::Persistent
    } else {
        Kind::Ephemeral
    }
}

impl State {
    /// Every instance whose liveness `keep` accepts, as (service, key). O(instances).
    pub(crate) fn instances_where(
        &self,
        keep: impl Fn(&Liveness) -> bool,
    ) -> Vec<(ServiceKey, InstanceKey)> {
        self.services
            .iter()
            .flat_map(|(s, e)| {
                e.instances
                    .iter()
                    .filter(|(_, i)| keep(&i.liveness))
                    .map(move |(k, _)| (s.clone(), k.clone()))
            })
            .collect()
    }

    pub(crate) fn service(&mut self, key: &ServiceKey) -> &mut ServiceEntry {
        self.services
            .entry(key.clone())
            .or_insert_with(|| ServiceEntry::new(key))
    }

    /// Gives the service a new revision for `changed` and wakes its subscribers. Returns the
    /// revision. O(1): the view is not rebuilt.
    ///
    /// Alone, the revision is one global counter's next value. In cluster mode it is the
    /// store's revision being applied (or one above the service's, if that is not higher:
    /// revisions only grow), and the changed instances are marked for the replicator.
    pub(crate) fn publish(&mut self, key: &ServiceKey, changed: Changed) -> u64 {
        let revision = match &self.cluster {
            None => {
                self.revision += 1;
                self.revision
            }
            Some(c) => {
                let current = self.services.get(key).map_or(0, |s| s.revision);
                (current + 1).max(c.seen.max(0) as u64)
            }
        };
        if let Some(c) = self.cluster.as_mut() {
            if c.applying {
                c.ahead.remove(key);
            } else {
                c.ahead.insert(key.clone());
                c.wake.notify_one();
            }
        }
        self.publish_at(key, changed, revision);
        revision
    }

    /// [`publish`](Self::publish) at a given revision (cluster mode's load).
    pub(crate) fn publish_at(&mut self, key: &ServiceKey, changed: Changed, revision: u64) {
        if self.cluster.is_some() {
            let keys: Vec<InstanceKey> = match &changed {
                Changed::Keys(keys) => keys.clone(),
                // The service's ephemeral instances (an instance that left was marked when it
                // left, with its key).
                Changed::All => self
                    .services
                    .get(key)
                    .map(|s| {
                        s.instances
                            .iter()
                            .filter(|(_, e)| !matches!(e.liveness, Liveness::Probe(_)))
                            .map(|(k, _)| k.clone())
                            .collect()
                    })
                    .unwrap_or_default(),
            };
            let c = self.cluster.as_mut().expect("checked");
            c.mark(key, keys);
        }
        self.revision = self.revision.max(revision);
        self.service(key).publish(revision, changed);
    }

    pub(crate) fn check_kind(&self, key: &ServiceKey, kind: Kind) -> Result<(), RegistryError> {
        let existing = self
            .services
            .get(key)
            .and_then(ServiceEntry::kind)
            .or_else(|| self.pending_kinds.get(key).map(|(k, _)| *k));
        match existing {
            Some(existing) if existing != kind => Err(RegistryError::KindConflict {
                service: key.clone(),
                existing,
                wanted: kind,
            }),
            _ => Ok(()),
        }
    }

    /// Whether `liveness` may (re-)register `instance` in `service` now: the kind fits, the
    /// session exists, and no other client's session owns the instance.
    pub(crate) fn check_register(
        &self,
        service: &ServiceKey,
        instance: &Instance,
        liveness: &Liveness,
    ) -> Result<(), RegistryError> {
        self.check_kind(service, kind_of(liveness))?;
        if let Liveness::Session(id) = liveness {
            let Some(session) = self.sessions.get(id) else {
                return Err(RegistryError::UnknownSession(id.clone()));
            };
            let max = self.session_limits.instances;
            let key = (service.clone(), instance.key.clone());
            if session.instances.len() >= max && !session.instances.contains(&key) {
                return Err(RegistryError::LimitExceeded {
                    limit: "instances-per-session",
                    max,
                });
            }
        }
        let existing = self
            .services
            .get(service)
            .and_then(|s| s.instances.get(&instance.key));
        if let Some(Entry {
            liveness: Liveness::Remote(remote),
            ..
        }) = existing
            && remote.keeper == gangway_store::cluster::Keeper::Session
        {
            // Another node's session keeps it: the same client (a reconnect to this node) takes
            // it over; another client is refused while that node is in the cluster.
            let same_client = match liveness {
                Liveness::Session(id) => self
                    .sessions
                    .get(id)
                    .is_some_and(|s| !s.client_id.is_empty() && s.client_id == remote.client_id),
                _ => false,
            };
            let node_alive = self
                .cluster
                .as_ref()
                .is_some_and(|c| c.nodes.contains_key(&remote.node));
            if !same_client && node_alive {
                return Err(RegistryError::OwnedBySession {
                    service: service.clone(),
                    instance: instance.key.clone(),
                    owner: format!(
                        "a session on node {} (client id {:?})",
                        remote.node, remote.client_id
                    ),
                });
            }
        }
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

    /// A registration that takes over an instance left in grace by another client (a new
    /// process on the same address, not the old one reconnecting after the registry's stall):
    /// a drain's offline mark of the old process is dropped, as when an instance leaves (see
    /// [`Patch::until_gone`](super::Patch::until_gone)). An operator's durable offline stays.
    pub(crate) fn take_over_from_grace(
        &mut self,
        service: &ServiceKey,
        key: &InstanceKey,
        liveness: &Liveness,
    ) {
        let Some(Liveness::Grace { client_id, .. }) = self
            .services
            .get(service)
            .and_then(|s| s.instances.get(key))
            .map(|e| &e.liveness)
        else {
            return;
        };
        let same_process = match liveness {
            Liveness::Session(id) => self
                .sessions
                .get(id)
                .is_some_and(|s| !client_id.is_empty() && &s.client_id == client_id),
            _ => false,
        };
        let mark_key = (service.clone(), key.clone());
        if !same_process && self.marks.get(&mark_key).is_some_and(|m| m.until_gone) {
            self.marks.remove(&mark_key);
        }
    }

    /// Two sessions of one client process (a reconnect): both gave the same client id.
    fn same_client(&self, a: &str, b: &str) -> bool {
        match (self.sessions.get(a), self.sessions.get(b)) {
            (Some(a), Some(b)) => !a.client_id.is_empty() && a.client_id == b.client_id,
            _ => false,
        }
    }

    /// The 409 for touching an instance that `owner`'s session keeps alive.
    pub(crate) fn owned_error(
        &self,
        service: &ServiceKey,
        key: &InstanceKey,
        owner: &str,
    ) -> RegistryError {
        let who = match self.sessions.get(owner) {
            Some(s) if !s.client_name.is_empty() => {
                format!("session {owner} (client {} at {})", s.client_name, s.peer)
            }
            Some(s) => format!("session {owner} (at {})", s.peer),
            None => format!("session {owner}"),
        };
        RegistryError::OwnedBySession {
            service: service.clone(),
            instance: key.clone(),
            owner: who,
        }
    }

    /// Reserves `kind` for `service` while a registration writes to the store, so that a
    /// racing registration of the other kind is refused.
    pub(crate) fn reserve_kind(
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

    pub(crate) fn entry(
        &self,
        key: &ServiceKey,
        instance: &InstanceKey,
    ) -> Result<&Entry, RegistryError> {
        self.services
            .get(key)
            .and_then(|s| s.instances.get(instance))
            .ok_or_else(|| not_found(key, instance))
    }

    /// Changes one instance's fields (through the service, so its tally follows). Errors: 404.
    /// `Ok(true)` when something changed; does not publish.
    pub(crate) fn modify(
        &mut self,
        key: &ServiceKey,
        instance: &InstanceKey,
        change: impl FnOnce(&mut Instance),
    ) -> Result<bool, RegistryError> {
        self.entry(key, instance)?;
        Ok(self.service(key).modify(instance, change))
    }

    /// The last-serving rule, checked and reserved in one step: when `updated` (the new state
    /// of an instance of `service`) takes it out of the consumer view, and either it was serving
    /// and no other serving instance would be left, or no other instance would be left in the
    /// view at all (instances already reserved as leaving count as gone), refuses unless
    /// `force`. An unhealthy instance the protect threshold keeps in the view does not count
    /// as serving. Otherwise reserves it as leaving until the returned guard drops.
    /// O(instances reserved as leaving), from the service's tally.
    pub(crate) fn reserve_leaving(
        &mut self,
        registry: &Registry,
        service: &ServiceKey,
        updated: &Instance,
        force: bool,
    ) -> Result<Option<Reservation>, RegistryError> {
        let Some(entry) = self.services.get(service) else {
            return Ok(None);
        };
        if !entry.in_view(&updated.key) {
            return Ok(None);
        }
        // The tally once `updated` and every reserved leaver have their new state.
        let mut after = entry.tally();
        let mut leave = |current: &Instance, new: &Instance| {
            after.remove(current);
            after.add(new);
        };
        let mut updated_was_serving = false;
        if let Some(current) = entry.instances.get(&updated.key) {
            updated_was_serving = current.instance.is_serving();
            leave(&current.instance, updated);
        }
        for (svc, key) in &self.leaving {
            if svc != service || key == &updated.key {
                continue;
            }
            if let Some(e) = entry.instances.get(key) {
                let mut gone = e.instance.clone();
                gone.enabled = false;
                leave(&e.instance, &gone);
            }
        }
        let threshold = entry.threshold();
        let leaves_view = !after.in_view(updated, threshold);
        // Weight 0 while the protect threshold fires keeps it in the view, but not serving.
        let stops_serving = updated_was_serving && !updated.is_serving();
        if !leaves_view && !stops_serving {
            return Ok(None);
        }
        // Refused when the last serving instance would stop serving (even while the protect
        // threshold keeps unhealthy instances in the view: they are not serving), or when the
        // view would be left empty.
        let last_serving = stops_serving && after.serving == 0;
        if (last_serving || (leaves_view && after.view_len(threshold) == 0)) && !force {
            return Err(RegistryError::LastServingInstance {
                service: service.clone(),
                instance: updated.key.clone(),
            });
        }
        self.leaving.insert((service.clone(), updated.key.clone()));
        Ok(Some(Reservation {
            registry: registry.clone(),
            what: Reserved::Leaving(service.clone(), updated.key.clone()),
        }))
    }

    /// Wakes the drains and readiness waits of these services (an ack arrived or a subscriber
    /// left).
    pub(crate) fn notify_acks(&mut self, services: impl IntoIterator<Item = ServiceKey>) {
        self.acks_seen += 1;
        for key in services {
            if let Some(s) = self.services.get(&key) {
                s.acks.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
    }

    /// Removes an instance, noting when a marked instance left. Does not publish.
    pub(crate) fn remove(&mut self, key: &ServiceKey, instance: &InstanceKey) -> Option<Entry> {
        let removed = self.services.get_mut(key)?.remove(instance)?;
        if let Liveness::Session(owner) = &removed.liveness {
            self.unindex(owner, key, instance);
        }
        let mark_key = (key.clone(), instance.clone());
        match self.marks.get_mut(&mark_key) {
            Some(mark) if mark.until_gone => {
                self.marks.remove(&mark_key);
            }
            Some(mark) => mark.gone_since = Some(Instant::now()),
            None => {}
        }
        Some(removed)
    }

    /// Inserts (or replaces) an instance, applying its offline mark. Does not publish.
    pub(crate) fn insert(
        &mut self,
        key: &ServiceKey,
        mut instance: Instance,
        liveness: Liveness,
        owner: Option<String>,
    ) {
        if let Some(mark) = self.marks.get_mut(&(key.clone(), instance.key.clone())) {
            instance.enabled = false;
            mark.gone_since = None;
        }
        let instance_key = instance.key.clone();
        let since_ms = self
            .services
            .get(key)
            .and_then(|s| s.instances.get(&instance_key))
            .filter(|old| same_keeper(&old.liveness, &liveness))
            .map_or_else(super::now_ms, |old| old.since_ms);
        match &liveness {
            Liveness::Session(owner) => {
                if let Some(s) = self.sessions.get_mut(owner) {
                    s.instances.insert((key.clone(), instance_key.clone()));
                }
            }
            Liveness::Lease(lease) => {
                self.leases
                    .push(lease.last_heartbeat + lease.ttl, key, &instance_key);
            }
            Liveness::Probe(_) | Liveness::Grace { .. } | Liveness::Remote(_) => {}
        }
        let old = self.service(key).upsert(Entry {
            instance,
            liveness,
            owner,
            since_ms,
        });
        if let Some(Entry {
            liveness: Liveness::Session(old_owner),
            ..
        }) = old
        {
            let still = matches!(
                &self.services[key].instances[&instance_key].liveness,
                Liveness::Session(owner) if owner == &old_owner
            );
            if !still {
                self.unindex(&old_owner, key, &instance_key);
            }
        }
    }

    /// Inserts and publishes. Returns the revision.
    pub(crate) fn insert_and_publish(
        &mut self,
        key: &ServiceKey,
        instance: Instance,
        liveness: Liveness,
        owner: Option<String>,
    ) -> u64 {
        let changed = Changed::Keys(vec![instance.key.clone()]);
        self.insert(key, instance, liveness, owner);
        self.publish(key, changed)
    }

    /// Takes an instance out of its session's index (its liveness changes or it leaves).
    pub(crate) fn unindex(&mut self, session: &str, key: &ServiceKey, instance: &InstanceKey) {
        if let Some(s) = self.sessions.get_mut(session) {
            s.instances.remove(&(key.clone(), instance.clone()));
        }
    }
}

impl State {
    /// Adds a subscriber to the table and to its service's and session's indexes.
    /// `caller`'s registration of `key` by the rule `register`, against its owner now.
    pub(crate) fn check_owner(
        &self,
        service: &ServiceKey,
        key: &InstanceKey,
        caller: &Caller,
    ) -> Result<(), RegistryError> {
        let owner = self
            .entry(service, key)
            .ok()
            .and_then(|e| e.owner.as_deref());
        caller
            .allow(Rule::Register, &service.namespace, owner)
            .map_err(RegistryError::Refused)
    }

    /// Refuses one more subscriber of `session` beyond
    /// [`SessionLimits::subscriptions`].
    pub(crate) fn check_subscribe(&self, session: Option<&str>) -> Result<(), RegistryError> {
        let max = self.session_limits.subscriptions;
        match session.and_then(|s| self.sessions.get(s)) {
            Some(s) if s.subscribers.len() >= max => Err(RegistryError::LimitExceeded {
                limit: "subscriptions-per-session",
                max,
            }),
            _ => Ok(()),
        }
    }

    pub(crate) fn add_subscriber(&mut self, id: String, sub: Subscriber) {
        self.acks_seen += 1;
        self.service(&sub.service).subscribers.insert(id.clone());
        if let Some(session) = sub.session.as_ref().and_then(|s| self.sessions.get_mut(s)) {
            session.subscribers.insert(id.clone());
        }
        self.subscribers.insert(id, sub);
    }

    /// Removes a subscriber from the table and its indexes; the caller wakes its service's
    /// waits ([`notify_acks`](Self::notify_acks)).
    pub(crate) fn remove_subscriber(&mut self, id: &str) -> Option<Subscriber> {
        let sub = self.subscribers.remove(id)?;
        if let Some(s) = self.services.get_mut(&sub.service) {
            s.subscribers.remove(id);
        }
        if let Some(session) = sub.session.as_ref().and_then(|s| self.sessions.get_mut(s)) {
            session.subscribers.remove(id);
        }
        Some(sub)
    }
}

/// Whether a re-registration with `new` keeps the instance with the keeper `old` had (its
/// [`Entry::since_ms`] stays): the same session, or a lease or probe again.
fn same_keeper(old: &Liveness, new: &Liveness) -> bool {
    match (old, new) {
        (Liveness::Session(a), Liveness::Session(b)) => a == b,
        (Liveness::Lease(_), Liveness::Lease(_)) | (Liveness::Probe(_), Liveness::Probe(_)) => true,
        _ => false,
    }
}

pub(crate) fn not_found(service: &ServiceKey, instance: &InstanceKey) -> RegistryError {
    RegistryError::UnknownInstance {
        service: service.clone(),
        instance: instance.clone(),
    }
}
