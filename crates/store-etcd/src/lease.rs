//! The node lease (docs/cluster.md, "Per-node lease"): one etcd lease per gangway node, kept
//! alive by a task on the store's runtime. Ephemeral instances of the node's sessions will be
//! keys bound to it, so that they go when the node does.
//!
//! The task renews every TTL/3 over etcd's keep-alive stream (one stream, reopened on the next
//! endpoint when it breaks). The lease counts as [`LeaseState::Lost`] when etcd says it expired
//! (TTL 0, "lease not found") or when no renewal was answered within the TTL since the last
//! one: from then on the node must treat its keys as gone (etcd may already have deleted them),
//! even if etcd later answers again. The task then ends; a node grants a new lease.

use std::sync::Arc;
use std::time::Duration;

use gangway_store::StoreError;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::{EtcdStore, Shared, run_on};

/// TTL of a node lease by default: 5 s (a dead node's ephemeral instances go 5 s after its
/// last renewal).
pub const DEFAULT_TTL: Duration = Duration::from_secs(5);
/// Shortest TTL: 2 s (etcd's own minimum is about 1.5 x its election timeout).
pub const MIN_TTL: Duration = Duration::from_secs(2);
/// Longest TTL: 60 s.
pub const MAX_TTL: Duration = Duration::from_secs(60);

/// Where a node lease stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseState {
    /// Renewed; etcd's last answer gave it `ttl_s` seconds from then.
    Alive {
        /// The etcd lease id.
        id: i64,
        /// Seconds etcd granted at the last renewal.
        ttl_s: i64,
        /// Renewals answered so far (the grant counts as the first).
        renewals: u64,
    },
    /// Gone; the node must count every key bound to it as deleted.
    Lost {
        /// The etcd lease id.
        id: i64,
        /// Why: expired in etcd, or not renewed within the TTL.
        reason: String,
    },
}

/// One etcd lease kept alive. Dropping it stops the keep-alive and revokes the lease (best
/// effort, not waited for), so keys bound to it go at once.
pub struct NodeLease {
    id: i64,
    ttl: Duration,
    state: watch::Receiver<LeaseState>,
    task: tokio::task::JoinHandle<()>,
    shared: Arc<Shared>,
    handle: tokio::runtime::Handle,
}

impl EtcdStore {
    /// Grants a lease of `ttl` (whole seconds, [`MIN_TTL`]-[`MAX_TTL`]) and starts keeping it
    /// alive. Blocks for the grant (at most [`crate::EtcdConfig::request_timeout`]).
    ///
    /// Errors: a `ttl` out of bounds or not whole seconds ([`StoreError::Io`] naming it);
    /// etcd does not grant it in time.
    pub fn grant_node_lease(&self, ttl: Duration) -> Result<NodeLease, StoreError> {
        let shared = self.shared();
        run_on(&self.handle(), async move { grant(&shared, ttl).await }).map_err(StoreError::Io)?
    }
}

/// Grants a lease of `ttl` and starts keeping it alive on the current runtime (the store's).
///
/// Errors: as [`EtcdStore::grant_node_lease`].
pub(crate) async fn grant(shared: &Arc<Shared>, ttl: Duration) -> Result<NodeLease, StoreError> {
    if !(MIN_TTL..=MAX_TTL).contains(&ttl) || ttl.subsec_nanos() != 0 {
        return Err(StoreError::Io(format!(
            "node lease ttl must be whole seconds, 2s-60s, got {ttl:?}"
        )));
    }
    let grant = shared
        .call(shared.config.request_timeout, move |mut c| async move {
            c.lease_grant(ttl.as_secs() as i64, None).await
        })
        .await?;
    let id = grant.id();
    let (tx, state) = watch::channel(LeaseState::Alive {
        id,
        ttl_s: grant.ttl(),
        renewals: 1,
    });
    let handle = tokio::runtime::Handle::current();
    let task = handle.spawn(keep_alive(shared.clone(), id, ttl, tx));
    Ok(NodeLease {
        id,
        ttl,
        state,
        task,
        shared: shared.clone(),
        handle,
    })
}

impl std::fmt::Debug for NodeLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeLease")
            .field("id", &format_args!("{:016x}", self.id))
            .field("ttl", &self.ttl)
            .field("state", &self.state())
            .finish()
    }
}

impl NodeLease {
    /// The etcd lease id (shown as hex by etcdctl).
    pub fn id(&self) -> i64 {
        self.id
    }

    /// The TTL it was granted with.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Where it stands now.
    pub fn state(&self) -> LeaseState {
        self.state.borrow().clone()
    }

    /// A receiver of every change of [`state`](Self::state) (await `changed()`).
    pub fn subscribe(&self) -> watch::Receiver<LeaseState> {
        self.state.clone()
    }

    /// Stops the keep-alive and revokes the lease, waiting for etcd's answer (at most
    /// [`crate::EtcdConfig::request_timeout`]); keys bound to it are deleted by then.
    ///
    /// Errors: etcd did not answer in time (the lease then expires after its TTL).
    pub fn revoke(self) -> Result<(), StoreError> {
        self.task.abort();
        let (shared, id) = (self.shared.clone(), self.id);
        run_on(&self.handle, async move { revoke(&shared, id).await }).map_err(StoreError::Io)?
    }
}

impl NodeLease {
    /// Stops the keep-alive without revoking: keys bound to the lease stay until etcd expires
    /// it (at once if it did already). A lost lease is abandoned this way, so that a node can
    /// first bind its live keys to a new lease (a put rebinds a key; no deletion is seen).
    pub fn abandon(self) {
        self.task.abort();
        std::mem::forget(self);
    }
}

impl Drop for NodeLease {
    fn drop(&mut self) {
        // Also a lost one: etcd restores leases when it restarts, and this node no longer
        // counts on it.
        self.task.abort();
        let (shared, id) = (self.shared.clone(), self.id);
        // Revoked twice after `revoke` is harmless: the second answer is "not found".
        self.handle.spawn(async move {
            let _ = revoke(&shared, id).await;
        });
    }
}

async fn revoke(shared: &Shared, id: i64) -> Result<(), StoreError> {
    let revoked = shared
        .call(shared.config.request_timeout, move |mut c| async move {
            c.lease_revoke(id).await.map(|_| ())
        })
        .await;
    match revoked {
        Err(StoreError::Io(m)) if m.contains("not found") => Ok(()),
        other => other,
    }
}

/// Renews `id` every `ttl`/3 until it is lost (or the task is aborted).
async fn keep_alive(shared: Arc<Shared>, id: i64, ttl: Duration, tx: watch::Sender<LeaseState>) {
    let every = ttl / 3;
    let mut renewed = Instant::now();
    let mut renewals = 1;
    let mut stream = None;
    let lost = |reason: String| LeaseState::Lost { id, reason };
    loop {
        tokio::time::sleep_until(renewed + every).await;
        // One renewal, retried on the next endpoint, until the TTL since the last one ran out.
        loop {
            let deadline = renewed + ttl;
            if Instant::now() >= deadline {
                tx.send_replace(lost(format!(
                    "not renewed within its ttl of {ttl:?} (etcd unreachable)"
                )));
                return;
            }
            let (at, mut client) = shared.client();
            let attempt = tokio::time::timeout_at(deadline.min(Instant::now() + every), async {
                let (keeper, answers) = match stream.take() {
                    Some(open) => open,
                    None => client.lease_keep_alive(id).await?,
                };
                let mut open = (keeper, answers);
                open.0.keep_alive().await?;
                let answer = open.1.message().await?;
                Ok::<_, etcd_client::Error>((open, answer))
            })
            .await;
            match attempt {
                Ok(Ok((open, Some(answer)))) if answer.ttl() > 0 => {
                    stream = Some(open);
                    renewed = Instant::now();
                    renewals += 1;
                    tx.send_replace(LeaseState::Alive {
                        id,
                        ttl_s: answer.ttl(),
                        renewals,
                    });
                    break;
                }
                Ok(Ok((_, Some(_)))) => {
                    tx.send_replace(lost("expired in etcd (ttl 0)".into()));
                    return;
                }
                Ok(Err(e)) if e.to_string().contains("lease not found") => {
                    tx.send_replace(lost("expired in etcd (lease not found)".into()));
                    return;
                }
                // Stream ended, failed or timed out: reopen it on the next endpoint.
                _ => {
                    shared.failed(at);
                    tokio::time::sleep(crate::RETRY_FIRST).await;
                }
            }
        }
    }
}
