//! Changes to instances and service settings: register, deregister, update (offline/online,
//! weight, metadata), heartbeats, health flags. Durable parts go through the group commit
//! ([`Registry::commit`]) before memory changes; the rules of `state` are checked and
//! reserved before.

use std::time::Duration;

use gangway_core::model::{
    Instance, InstanceKey, OfflineMark, ServiceKey, ServiceSettings, StoredInstance,
};
use gangway_core::validate;
use gangway_store::Write;
use tokio::time::Instant;

use super::RegistryError;
use super::service::Changed;
use super::state::{MarkEntry, State, kind_of, not_found};
use super::{Lease, Liveness, LivenessRequest, Patch, Registry, now_ms};
use crate::auth::Caller;

impl Registry {
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
    ) -> Result<(u64, Instance), RegistryError> {
        self.register_owned(service, instance, liveness, None).await
    }

    /// [`Registry::register`] on behalf of the principal `owner` ([`Entry::owner`]), with no
    /// authorisation decision (tests, embedding); transports use [`Registry::register_as`].
    pub async fn register_owned(
        &self,
        service: ServiceKey,
        instance: Instance,
        liveness: LivenessRequest,
        owner: Option<String>,
    ) -> Result<(u64, Instance), RegistryError> {
        self.register_guarded(service, instance, liveness, owner, Caller::Open)
            .await
    }

    /// [`Registry::register`] by `caller`, owned by its principal. The rule
    /// (`auth::Rule::Register`: `write`, `admin` to take over another principal's instance)
    /// is decided in the critical section that applies the registration, against the owner
    /// found there, so a delete and re-registration by someone else in between cannot be
    /// taken over. Errors: as [`Registry::register`], and [`RegistryError::Refused`].
    pub async fn register_as(
        &self,
        service: ServiceKey,
        instance: Instance,
        liveness: LivenessRequest,
        caller: Caller,
    ) -> Result<(u64, Instance), RegistryError> {
        let owner = caller.owner().map(str::to_owned);
        self.register_guarded(service, instance, liveness, owner, caller)
            .await
    }

    async fn register_guarded(
        &self,
        service: ServiceKey,
        instance: Instance,
        liveness: LivenessRequest,
        owner: Option<String>,
        caller: Caller,
    ) -> Result<(u64, Instance), RegistryError> {
        validate::service_key(&service)?;
        validate::instance_key(&instance.key)?;
        validate::weight(instance.weight)?;
        validate::metadata(&instance.metadata)?;
        let liveness = self.bind_liveness(liveness)?;
        // Cluster mode: the first registration of a service (no kind in this node's view yet)
        // takes the service's cluster-wide lock, so that two registrations of the two kinds
        // through two nodes cannot both fix it (docs/cluster.md).
        let lock = if self.kind_unset(&service) {
            self.lock_service(&service).await?
        } else {
            None
        };
        let key = instance.key.clone();
        let result = self
            .register_bound(service, instance, liveness, owner, caller)
            .await;
        if let (Some(lock), Ok((revision, _))) = (&lock, &result) {
            lock.wait_written(&key, *revision).await;
        }
        result
    }

    /// Cluster mode, and `service` has no kind in this node's view yet (nothing registered).
    fn kind_unset(&self, service: &ServiceKey) -> bool {
        let state = self.lock();
        state.cluster.is_some()
            && state.services.get(service).and_then(|s| s.kind()).is_none()
            && !state.pending_kinds.contains_key(service)
    }

    async fn register_bound(
        &self,
        service: ServiceKey,
        instance: Instance,
        liveness: Liveness,
        owner: Option<String>,
        caller: Caller,
    ) -> Result<(u64, Instance), RegistryError> {
        let mut instance = instance;
        instance.ephemeral = !matches!(liveness, Liveness::Probe(_));
        instance.healthy = true;
        let in_memory = instance.enabled && !matches!(liveness, Liveness::Probe(_));
        if in_memory {
            // Nothing to store (unless an offline mark must be written, found below): the
            // common case is one critical section, nothing to cancel halfway.
            if let Some(done) =
                self.register_in_memory(&service, &instance, &liveness, &owner, &caller)
            {
                return done;
            }
        }
        let registry = self.clone();
        tokio::spawn(async move {
            registry
                .register_durably(service, instance, liveness, owner, caller)
                .await
        })
        .await
        .map_err(|e| RegistryError::Internal(format!("register task failed: {e}")))?
    }

    /// A registration that writes nothing to the store, in one critical section. `None` when it
    /// turns out to need the store after all.
    fn register_in_memory(
        &self,
        service: &ServiceKey,
        instance: &Instance,
        liveness: &Liveness,
        owner: &Option<String>,
        caller: &Caller,
    ) -> Option<Result<(u64, Instance), RegistryError>> {
        let mut state = self.lock();
        if let Err(e) = state.check_register(service, instance, liveness) {
            return Some(Err(e));
        }
        if let Err(e) = state.check_owner(service, &instance.key, caller) {
            return Some(Err(e));
        }
        state.take_over_from_grace(service, &instance.key, liveness);
        let mut instance = instance.clone();
        if state
            .marks
            .contains_key(&(service.clone(), instance.key.clone()))
        {
            instance.enabled = false;
            // An offline mark re-registered: the rule of the last serving instance applies,
            // and a reservation must not drop under the lock: the durable path handles it.
            if state
                .services
                .get(service)
                .is_some_and(|s| s.in_view(&instance.key))
            {
                return None;
            }
        }
        let key = instance.key.clone();
        let revision = state.insert_and_publish(service, instance, liveness.clone(), owner.clone());
        let stored = state.entry(service, &key).map(|e| e.instance.clone());
        Some(stored.map(|i| (revision, i)))
    }

    async fn register_durably(
        &self,
        service: ServiceKey,
        mut instance: Instance,
        liveness: Liveness,
        owner: Option<String>,
        caller: Caller,
    ) -> Result<(u64, Instance), RegistryError> {
        let key = instance.key.clone();
        let mark_key = (service.clone(), key.clone());
        let offline = !instance.enabled;
        let probe = match &liveness {
            Liveness::Probe(p) => Some(p.clone()),
            _ => None,
        };
        let (batch, durably_marked, reservations) = {
            let mut state = self.lock();
            state.check_register(&service, &instance, &liveness)?;
            state.check_owner(&service, &instance.key, &caller)?;
            state.take_over_from_grace(&service, &key, &liveness);
            let marked = state.marks.get(&mark_key).map(|m| m.until_gone);
            if marked.is_some() {
                instance.enabled = false;
            }
            let durably_marked = marked == Some(false);
            let mut batch = Vec::new();
            if offline && !durably_marked {
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
                        owner: owner.clone(),
                    },
                ));
            }
            // Fallible first: a reservation must not drop while the state lock is held.
            let leaving = state.reserve_leaving(self, &service, &instance, false)?;
            let kind =
                (!batch.is_empty()).then(|| state.reserve_kind(self, &service, kind_of(&liveness)));
            (batch, durably_marked, (kind, leaving))
        };
        let apply = {
            let service = service.clone();
            move |state: &mut State| -> Result<u64, RegistryError> {
                // Checked again: a session may have ended (or taken the instance) meanwhile.
                state.check_register(&service, &instance, &liveness)?;
                state.check_owner(&service, &instance.key, &caller)?;
                if offline {
                    // Registered offline (Nacos enabled=false): the durable mark.
                    state
                        .marks
                        .entry(mark_key)
                        .or_insert_with(|| MarkEntry::new(false))
                        .until_gone = false;
                }
                Ok(state.insert_and_publish(&service, instance, liveness, owner))
            }
        };
        let applied = if batch.is_empty() {
            let mut state = self.lock();
            apply(&mut state)
        } else {
            self.commit(batch, apply).await
        };
        drop(reservations);
        let revision = match applied {
            Ok(revision) => revision,
            Err(e) => {
                if offline
                    && !durably_marked
                    && !matches!(
                        e,
                        RegistryError::Store(_) | RegistryError::ChangedElsewhere(_)
                    )
                {
                    // The mark was written but the registration refused: undo the mark.
                    let undo = vec![Write::DeleteOfflineMark(service.clone(), key.clone())];
                    if let Err(undo_err) = self.commit(undo, |_| Ok(())).await {
                        tracing::warn!(error = %undo_err, "could not undo an offline mark");
                    }
                }
                return Err(e);
            }
        };
        if let Some(probe) = probe {
            self.start_probe(service.clone(), key.clone(), probe);
        }
        Ok((revision, self.instance(&service, &key)?))
    }

    fn bind_liveness(&self, request: LivenessRequest) -> Result<Liveness, RegistryError> {
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
    ) -> Result<u64, RegistryError> {
        {
            let mut state = self.lock();
            if !deletable(&state, service, key, force)? {
                return Ok(remove_and_publish(&mut state, service, key));
            }
        }
        // Persistent: the store deletes it first.
        let (s, k) = (service.clone(), key.clone());
        let revision = self
            .commit(
                vec![Write::DeleteInstance(service.clone(), key.clone())],
                move |state| {
                    deletable(state, &s, &k, force)?;
                    Ok(remove_and_publish(state, &s, &k))
                },
            )
            .await?;
        self.stop_probe(service, key);
        Ok(revision)
    }

    /// Removes an instance if `session` still owns it (a session's own deregister).
    pub fn deregister_on_session(
        &self,
        session: &str,
        service: &ServiceKey,
        key: &InstanceKey,
    ) -> Result<u64, RegistryError> {
        let mut state = self.lock();
        match &state.entry(service, key)?.liveness {
            Liveness::Session(owner) if owner == session => {}
            _ => {
                return Err(RegistryError::NotOnThisSession {
                    service: service.clone(),
                    instance: key.clone(),
                });
            }
        }
        Ok(remove_and_publish(&mut state, service, key))
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
    ) -> Result<(u64, Instance), RegistryError> {
        if let Some(w) = patch.weight {
            validate::weight(w)?;
        }
        if let Some(m) = &patch.metadata {
            validate::metadata(m)?;
        }
        let registry = self.clone();
        let (service, key) = (service.clone(), key.clone());
        tokio::spawn(async move {
            // Cluster mode: the last-serving rule holds across nodes (docs/cluster.md).
            let lock = if super::cluster::may_take_out(&patch) {
                registry.lock_service(&service).await?
            } else {
                None
            };
            let result = registry.apply_update(service, key.clone(), patch).await;
            if let (Some(lock), Ok((revision, _))) = (&lock, &result) {
                lock.wait_written(&key, *revision).await;
            }
            drop(lock);
            result
        })
        .await
        .map_err(|e| RegistryError::Internal(format!("update task failed: {e}")))?
    }

    async fn apply_update(
        &self,
        service: ServiceKey,
        key: InstanceKey,
        patch: Patch,
    ) -> Result<(u64, Instance), RegistryError> {
        let mut batch = Vec::new();
        let (updated, leaving) = {
            let mut state = self.lock();
            let entry = state.entry(&service, &key)?;
            let mut instance = entry.instance.clone();
            if let Some(w) = patch.weight {
                instance.weight = w;
            }
            if let Some(m) = patch.metadata.clone() {
                instance.metadata = m;
            }
            if let Some(enabled) = patch.enabled {
                instance.enabled = enabled;
                let durable = state
                    .marks
                    .get(&(service.clone(), key.clone()))
                    .is_some_and(|m| !m.until_gone);
                match (enabled, durable) {
                    (false, false) if !patch.until_gone => batch.push(Write::PutOfflineMark(
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
                        owner: entry.owner.clone(),
                    },
                ));
            }
            let leaving = state.reserve_leaving(self, &service, &instance, patch.force)?;
            (instance, leaving)
        };
        let (enabled, until_gone) = (patch.enabled, patch.until_gone);
        let apply = move |state: &mut State| -> Result<(u64, Instance), RegistryError> {
            match enabled {
                Some(false) => {
                    let mark = state
                        .marks
                        .entry((service.clone(), key.clone()))
                        .or_insert_with(|| MarkEntry::new(until_gone));
                    // A durable offline over a drain's mark makes it durable; never the reverse.
                    mark.until_gone &= until_gone;
                }
                Some(true) => {
                    state.marks.remove(&(service.clone(), key.clone()));
                }
                None => {}
            }
            // The instance may have left while the store wrote: 404 then.
            let changed = state.modify(&service, &key, |i| {
                i.weight = updated.weight;
                i.metadata = updated.metadata;
                i.enabled = updated.enabled;
            })?;
            let instance = state.entry(&service, &key)?.instance.clone();
            if !changed {
                // Nothing changed: no new revision, no push.
                return Ok((state.services[&service].revision, instance));
            }
            let revision = state.publish(&service, Changed::Keys(vec![key]));
            Ok((revision, instance))
        };
        let result = if batch.is_empty() {
            let mut state = self.lock();
            apply(&mut state)
        } else {
            self.commit(batch, apply).await
        };
        drop(leaving);
        result
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
    ) -> Result<(u64, Instance), RegistryError> {
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
    /// 409 when the instance is not lease-kept. Returns the lease's TTL.
    pub fn heartbeat(
        &self,
        service: &ServiceKey,
        key: &InstanceKey,
    ) -> Result<Duration, RegistryError> {
        let mut state = self.lock();
        let entry = state
            .services
            .get_mut(service)
            .and_then(|s| s.instances.get_mut(key))
            .ok_or_else(|| not_found(service, key))?;
        let mut taken_over = false;
        if let Liveness::Remote(remote) = &entry.liveness
            && remote.keeper == gangway_store::cluster::Keeper::Lease
        {
            // Cluster mode: the client's heartbeats moved to this node, which keeps the lease
            // from now on (its record is written under this node's lease).
            entry.liveness = Liveness::Lease(Lease {
                last_heartbeat: Instant::now(),
                ttl: self.inner.config.liveness.lease_ttl,
                delete_timeout: self.inner.config.liveness.lease_delete_timeout,
            });
            taken_over = true;
        }
        let Liveness::Lease(lease) = &mut entry.liveness else {
            return Err(RegistryError::NotLeaseKept {
                service: service.clone(),
                instance: key.clone(),
                kept_by: entry.liveness.as_str(),
            });
        };
        lease.last_heartbeat = Instant::now();
        let ttl = lease.ttl;
        let deadline = lease.last_heartbeat + ttl;
        state.leases.push(deadline, service, key);
        super::cluster::heartbeat_seen(&mut state, service, key);
        if state.modify(service, key, |i| i.healthy = true)? || taken_over {
            state.publish(service, Changed::Keys(vec![key.clone()]));
        }
        Ok(ttl)
    }

    /// Sets an instance's health flag (probes); publishes only on a change.
    pub(crate) fn set_health(&self, service: &ServiceKey, key: &InstanceKey, healthy: bool) {
        let mut state = self.lock();
        if let Ok(true) = state.modify(service, key, |i| i.healthy = healthy) {
            state.publish(service, Changed::Keys(vec![key.clone()]));
        }
    }

    /// Replaces a service's settings, durably. Errors: 400.
    pub async fn put_settings(
        &self,
        service: &ServiceKey,
        settings: ServiceSettings,
    ) -> Result<u64, RegistryError> {
        validate::service_key(service)?;
        validate::protect_threshold(settings.protect_threshold)?;
        validate::metadata(&settings.metadata)?;
        // Settings as they are change nothing: no write, no new revision.
        {
            let state = self.lock();
            if let Some(entry) = state.services.get(service)
                && entry.settings == settings
            {
                return Ok(entry.revision);
            }
        }
        let key = service.clone();
        self.commit(
            vec![Write::PutService(service.clone(), settings.clone())],
            move |state| {
                state.service(&key).settings = settings;
                Ok(state.publish(&key, Changed::All))
            },
        )
        .await
    }
}

impl Registry {
    /// Deletes a service that holds no instance: its stored settings go. A service that has
    /// subscribers stays known (with default settings) for them. Errors: unknown service, or it
    /// still holds instances (Nacos: "service is not empty, can't be delete").
    pub async fn delete_service(&self, service: &ServiceKey) -> Result<(), RegistryError> {
        let deletable = |state: &State, service: &ServiceKey| match state.services.get(service) {
            None => Err(RegistryError::UnknownService(service.clone())),
            Some(s) if !s.instances.is_empty() => {
                Err(RegistryError::ServiceNotEmpty(service.clone()))
            }
            Some(s) => Ok(s.subscribers.is_empty()),
        };
        deletable(&self.lock(), service)?;
        let key = service.clone();
        self.commit(vec![Write::DeleteService(service.clone())], move |state| {
            if deletable(state, &key)? {
                state.services.remove(&key);
            } else {
                state.service(&key).settings = ServiceSettings::default();
                state.publish(&key, Changed::All);
            }
            Ok(())
        })
        .await
    }
}

/// Whether `key` may be deleted by someone other than its session: `Ok(true)` when it is
/// persistent (the store must delete it too), `Ok(false)` when ephemeral.
fn deletable(
    state: &State,
    service: &ServiceKey,
    key: &InstanceKey,
    force: bool,
) -> Result<bool, RegistryError> {
    let entry = state.entry(service, key)?;
    if let (Liveness::Session(owner), false) = (&entry.liveness, force) {
        return Err(state.owned_error(service, key, owner));
    }
    if let (Liveness::Remote(remote), false) = (&entry.liveness, force)
        && remote.keeper == gangway_store::cluster::Keeper::Session
    {
        return Err(RegistryError::OwnedBySession {
            service: service.clone(),
            instance: key.clone(),
            owner: format!("a session on node {}", remote.node),
        });
    }
    Ok(!entry.instance.ephemeral)
}

fn remove_and_publish(state: &mut State, service: &ServiceKey, key: &InstanceKey) -> u64 {
    state.remove(service, key);
    state.publish(service, Changed::Keys(vec![key.clone()]))
}
