//! Sessions (DESIGN §3): one per connected client stream; the instances a session keeps alive
//! go when it ends (or wait in grace while the registry recovers from its own stall).

use std::collections::BTreeSet;

use gangway_core::model::{InstanceKey, ServiceKey};
use tokio::time::Instant;

use super::hold::ClockReading;
use super::service::Changed;
use super::state::SessionEntry;
use super::{Entry, Liveness, Registry};

/// An instance with the session that keeps it alive, if one does (`GET
/// /v1/services/{service}/liveness`).
#[derive(Debug, Clone)]
pub struct Kept {
    /// The instance, its liveness and owner.
    pub entry: Entry,
    /// For [`Liveness::Session`]: that session.
    pub session: Option<SessionInfo>,
}

/// A session as listings show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionInfo {
    /// Its id (`s<N>`).
    pub id: String,
    /// The client's own name (empty: none given).
    pub client_name: String,
    /// The client's `ip:port`.
    pub peer: String,
}

impl Registry {
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
                client_id: client_id.clone(),
                instances: BTreeSet::new(),
                subscribers: BTreeSet::new(),
            },
        );
        self.inner.metrics.sessions_opened.inc();
        self.adopt_on_reconnect(&id, &client_id);
        id
    }

    /// Ends a session: its instances go at once (one revision per service), its subscriptions
    /// leave every drain's wait. Costs what the session owns, not what the registry holds.
    /// While the registry recovers from its own stall the instances stay instead, in
    /// [`Liveness::Grace`], until their client registers them again on a new session or
    /// [`Config::stall_grace`](crate::Config::stall_grace) (60 s) passes (see `engine::hold`). While the registry stops they stay too: nothing is
    /// published any more, so removing them would only slow the stop.
    pub fn close_session(&self, id: &str) {
        let recovering = self.observe_clock(Instant::now()) == ClockReading::Recovering;
        let stopping = self.is_stopping();
        let mut state = self.lock();
        let Some(session) = state.sessions.remove(id) else {
            return;
        };
        let mut removed: Vec<(ServiceKey, Vec<InstanceKey>)> = Vec::new();
        let owned = if stopping {
            BTreeSet::new()
        } else {
            session.instances
        };
        let grace_until = Instant::now() + self.inner.config.stall_grace;
        let mut in_grace = false;
        for (svc, key) in &owned {
            let (svc, key) = (svc.clone(), key.clone());
            if recovering {
                if let Some(entry) = state
                    .services
                    .get_mut(&svc)
                    .and_then(|s| s.instances.get_mut(&key))
                {
                    entry.liveness = Liveness::Grace {
                        until: grace_until,
                        client_id: session.client_id.clone(),
                    };
                    in_grace = true;
                }
                continue;
            }
            state.remove(&svc, &key);
            match removed.last_mut() {
                Some((last, keys)) if last == &svc => keys.push(key),
                _ => removed.push((svc, vec![key])),
            }
        }
        for (svc, keys) in &removed {
            state.publish(svc, Changed::Keys(keys.clone()));
        }
        let mut left = Vec::new();
        for sub in &session.subscribers {
            if let Some(s) = state.remove_subscriber(sub) {
                left.push(s.service);
            }
        }
        state.notify_acks(left);
        // One grace timer for the registry: deadlines only grow (a stall moves them all), so
        // a running one reaches this one too.
        let start_timer = in_grace && !state.grace_timer;
        state.grace_timer |= start_timer;
        drop(state);
        if start_timer {
            self.expire_grace_at(grace_until);
        }
        tracing::debug!(
            session = id,
            services = removed.len(),
            recovering,
            "session closed"
        );
    }

    /// Every instance of a service, sorted by key, with the session keeping each alive, and
    /// the revision (0 and empty if unknown). O(n) in the service's size.
    pub fn kept(&self, service: &ServiceKey) -> (u64, Vec<Kept>) {
        let state = self.lock();
        let Some(s) = state.services.get(service) else {
            return (0, Vec::new());
        };
        let kept = s
            .instances
            .values()
            .map(|entry| Kept {
                session: match &entry.liveness {
                    Liveness::Session(id) => state.sessions.get(id).map(|s| SessionInfo {
                        id: id.clone(),
                        client_name: s.client_name.clone(),
                        peer: s.peer.clone(),
                    }),
                    _ => None,
                },
                entry: entry.clone(),
            })
            .collect();
        (s.revision, kept)
    }

    /// Number of live sessions.
    pub fn session_count(&self) -> usize {
        self.lock().sessions.len()
    }
}
