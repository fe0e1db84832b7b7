//! One Nacos gRPC connection (transport), by peer address, and its session state.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use gangway_core::model::ServiceKey;
use gangway_proto::nacos as pb;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::time::Instant;

use crate::nacos::Nacos;

/// Connections that never opened their stream are forgotten after this.
pub(super) const UNSET_CONN_EXPIRY: Duration = Duration::from_secs(60);

/// One Nacos gRPC connection (transport).
pub struct Conn {
    /// Nacos connection id: `<ms>_<ip>_<port>`.
    pub id: String,
    pub(super) created: Instant,
    /// Asks the connection's stream to end (failed client detection).
    pub(super) stop: Notify,
    pub(super) state: Mutex<ConnState>,
}

#[derive(Default)]
pub(super) struct ConnState {
    /// The gangway session, once `ConnectionSetupRequest` arrived.
    pub(super) session: Option<String>,
    pub(super) client_name: String,
    pub(super) tx: Option<mpsc::Sender<pb::Payload>>,
    pub(super) subs: HashMap<ServiceKey, Sub>,
    /// Push request id -> the push awaiting its `NotifySubscriberResponse` (at most one per
    /// subscription, see [`PendingPush`]).
    pub(super) pending: HashMap<String, PendingPush>,
    /// Last request or stream message from the client.
    pub(super) last_active: Option<Instant>,
    pub(super) detector: Option<tokio::task::AbortHandle>,
}

/// A `NotifySubscriberRequest` sent and not answered yet.
pub(super) struct PendingPush {
    /// The gangway subscriber it was pushed to.
    pub(super) subscriber: String,
    /// The revision pushed: what a successful answer acks.
    pub(super) revision: u64,
    /// Told when the answer comes (success or not): the subscription's next push may go.
    pub(super) answered: oneshot::Sender<()>,
}

pub(super) struct Sub {
    pub(super) id: String,
    pub(super) task: tokio::task::AbortHandle,
}

impl Conn {
    pub(super) fn lock(&self) -> MutexGuard<'_, ConnState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(super) fn touch(&self) {
        self.lock().last_active = Some(Instant::now());
    }
}

impl Nacos {
    pub(super) fn conn_or_new(&self, peer: SocketAddr) -> Arc<Conn> {
        let mut conns = self.conns();
        // Server checks whose stream never came (the client gave up) leave entries behind.
        conns.retain(|_, c| c.lock().session.is_some() || c.created.elapsed() < UNSET_CONN_EXPIRY);
        conns
            .entry(peer)
            .or_insert_with(|| {
                let ms = crate::nacos::now_ms();
                Arc::new(Conn {
                    id: format!("{ms}_{}_{}", peer.ip(), peer.port()),
                    created: Instant::now(),
                    stop: Notify::new(),
                    state: Mutex::new(ConnState::default()),
                })
            })
            .clone()
    }

    /// The connection of `peer` and its session, if set up.
    pub(super) fn registered(&self, peer: SocketAddr) -> Option<(Arc<Conn>, String)> {
        let conn = self.conns().get(&peer).cloned()?;
        let mut st = conn.lock();
        let session = st.session.clone()?;
        st.last_active = Some(Instant::now());
        drop(st);
        Some((conn, session))
    }

    /// Number of Nacos gRPC connections with a session.
    pub fn connection_count(&self) -> usize {
        self.conns()
            .values()
            .filter(|c| c.lock().session.is_some())
            .count()
    }
}
