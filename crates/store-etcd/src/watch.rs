//! The prefix watch (docs/cluster.md, "The prefix watch"): every change under `P/v1/` after
//! a revision, as a typed stream of [`WatchEvent`]s.
//!
//! - Changes come as the [`Write`]s that would have made them (a put of an instance is
//!   [`Write::PutInstance`], its deletion [`Write::DeleteInstance`], ...), grouped by etcd
//!   revision (one store batch is one revision), in revision order. Keys of other key spaces
//!   under `P/v1/` (later ones: nodes, ephemeral instances) are skipped for now.
//! - When the watch stream breaks (a member killed, frozen past the gRPC keepalive of 2 s + 2 s,
//!   restarted) the task watches again on the next endpoint **from the revision after the last
//!   one it delivered**: nothing lost, nothing twice.
//! - When etcd has compacted that revision, the task re-lists instead (a consistent load at one
//!   revision) and delivers [`WatchEvent::Relisted`] with everything there is: the consumer
//!   replaces its state (diffing it to publish what changed), then changes follow from there.
//! - The stream is bounded: [`WATCH_BUFFER`] events wait for the consumer at most; beyond that
//!   the task waits (etcd then holds the events for this watcher, and cancels it with a
//!   compaction if it falls behind one, which ends in a re-list).
//! - A value that does not decode is delivered as an `Err` item; the watch goes on.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use etcd_client::{EventType, WatchOptions};
use gangway_core::model::ServiceKey;
use gangway_store::cluster::{ClusterChange, ClusterEvent};
use gangway_store::{Contents, StoreError, Write};
use tokio::sync::mpsc;

use crate::keys::Space;
use crate::{EtcdStore, RETRY_FIRST, RETRY_MAX, Shared};

/// Most events waiting for the consumer of a [`PrefixWatch`]: 256.
pub const WATCH_BUFFER: usize = 256;

/// One item of a [`PrefixWatch`].
#[derive(Debug, Clone, PartialEq)]
pub enum WatchEvent {
    /// The changes of one etcd revision, in the order etcd reports them.
    Changes {
        /// The etcd revision of the transaction.
        revision: i64,
        /// What changed.
        changes: Vec<Write>,
    },
    /// The history was compacted past the point to resume from: this is everything under
    /// the prefix at `revision`, to replace what the consumer holds.
    Relisted {
        /// The revision the listing was read at; changes after it follow.
        revision: i64,
        /// Everything stored.
        contents: Contents,
    },
}

/// Counts of what a watch went through.
#[derive(Debug, Default)]
struct Counts {
    resumes: AtomicU64,
    relists: AtomicU64,
}

/// A running watch of the store's prefix; a `Stream` of `Result<WatchEvent, StoreError>`.
/// Dropping it stops the watch.
#[derive(Debug)]
pub struct PrefixWatch {
    events: mpsc::Receiver<Result<WatchEvent, StoreError>>,
    task: tokio::task::JoinHandle<()>,
    counts: Arc<Counts>,
}

impl EtcdStore {
    /// Watches every change under the prefix from etcd revision `from` on (the revision of
    /// [`EtcdStore::load_at`] + 1 to follow a load). Returns at once; the watch runs on the
    /// store's runtime until the [`PrefixWatch`] or the store is dropped. Only durable state:
    /// revisions that change none of it are left out.
    pub fn watch(&self, from: i64) -> PrefixWatch {
        let (tx, events) = mpsc::channel(WATCH_BUFFER);
        let counts = Arc::new(Counts::default());
        let (cluster_tx, mut cluster) = mpsc::channel(WATCH_BUFFER);
        let (_, renewed) = tokio::sync::watch::channel((0, 0));
        let handle = self.handle();
        let watch = handle.spawn(run_with(
            self.shared(),
            from.max(1),
            cluster_tx,
            renewed,
            counts.clone(),
        ));
        let task = handle.spawn(async move {
            let _watch = AbortOnDrop(watch);
            while let Some(item) = cluster.recv().await {
                let item = match item {
                    Ok(ClusterEvent::Changes {
                        revision, changes, ..
                    }) => {
                        let changes: Vec<Write> = changes
                            .into_iter()
                            .filter_map(|c| match c {
                                ClusterChange::Durable(w) => Some(w),
                                _ => None,
                            })
                            .collect();
                        if changes.is_empty() {
                            continue;
                        }
                        Ok(WatchEvent::Changes { revision, changes })
                    }
                    Ok(ClusterEvent::Relisted(all)) => Ok(WatchEvent::Relisted {
                        revision: all.revision,
                        contents: all.durable,
                    }),
                    Ok(ClusterEvent::LeaseRenewed { .. }) => continue,
                    Err(e) => Err(e),
                };
                if tx.send(item).await.is_err() {
                    return;
                }
            }
        });
        PrefixWatch {
            events,
            task,
            counts,
        }
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl PrefixWatch {
    /// The next event; `None` once the store is gone. Cancel-safe.
    pub async fn next(&mut self) -> Option<Result<WatchEvent, StoreError>> {
        self.events.recv().await
    }

    /// How often the watch was opened again after its stream broke.
    pub fn resumes(&self) -> u64 {
        self.counts.resumes.load(Ordering::Relaxed)
    }

    /// How often it re-listed after a compaction.
    pub fn relists(&self) -> u64 {
        self.counts.relists.load(Ordering::Relaxed)
    }
}

impl futures::Stream for PrefixWatch {
    type Item = Result<WatchEvent, StoreError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.events.poll_recv(cx)
    }
}

impl Drop for PrefixWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The cluster watch of [`EtcdNode`](crate::EtcdNode): from `next` until the receiver is
/// gone, with [`ClusterEvent::LeaseRenewed`] when `renewed` changes.
pub(crate) async fn run_cluster(
    shared: Arc<Shared>,
    next: i64,
    tx: mpsc::Sender<Result<ClusterEvent, StoreError>>,
    renewed: tokio::sync::watch::Receiver<(i64, i64)>,
) {
    run_with(shared, next, tx, renewed, Arc::new(Counts::default())).await
}

/// Watches from `next` (the first revision not yet delivered) until the receiver is gone.
async fn run_with(
    shared: Arc<Shared>,
    mut next: i64,
    tx: mpsc::Sender<Result<ClusterEvent, StoreError>>,
    mut renewed: tokio::sync::watch::Receiver<(i64, i64)>,
    counts: Arc<Counts>,
) {
    renewed.borrow_and_update();
    // False once the lease keeper is gone (or for a watch of durable state only).
    let mut renewals = true;
    let root = shared.layout.root();
    let mut pause = RETRY_FIRST;
    let mut first = true;
    while !tx.is_closed() {
        if !first {
            counts.resumes.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(RETRY_MAX);
        }
        first = false;
        let (at, mut client) = shared.client();
        let options = WatchOptions::new().with_prefix().with_start_revision(next);
        let opened = tokio::time::timeout(
            shared.config.request_timeout,
            client.watch(root.as_bytes(), Some(options)),
        )
        .await;
        let mut stream = match opened {
            Ok(Ok(stream)) => stream,
            _ => {
                shared.failed(at);
                continue;
            }
        };
        loop {
            let answer = tokio::select! {
                answer = stream.message() => answer,
                changed = renewed.changed(), if renewals => {
                    if changed.is_err() {
                        // No lease keeper: no more renewals; keep watching.
                        renewals = false;
                        continue;
                    }
                    let (old, new) = *renewed.borrow_and_update();
                    if tx.send(Ok(ClusterEvent::LeaseRenewed { old, new })).await.is_err() {
                        return;
                    }
                    continue;
                }
            };
            let answer = match answer {
                Ok(Some(answer)) => answer,
                // Ended or broken: watch again from `next`, on the next endpoint.
                _ => {
                    shared.failed(at);
                    break;
                }
            };
            pause = RETRY_FIRST;
            if answer.compact_revision() > 0 {
                counts.relists.fetch_add(1, Ordering::Relaxed);
                let item = shared.load_cluster().await.map(|all| {
                    next = all.revision + 1;
                    ClusterEvent::Relisted(Box::new(all))
                });
                if tx.send(item).await.is_err() {
                    return;
                }
                break;
            }
            if answer.canceled() {
                break;
            }
            for item in changes(&shared, answer.events()) {
                if let Ok(ClusterEvent::Changes { revision, .. }) = &item {
                    next = revision + 1;
                }
                if tx.send(item).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// One revision's changes as they gather.
#[derive(Default)]
struct Gathering {
    revision: i64,
    writer: Option<String>,
    services: Vec<ServiceKey>,
    changes: Vec<ClusterChange>,
}

impl Gathering {
    fn event(self) -> ClusterEvent {
        ClusterEvent::Changes {
            revision: self.revision,
            writer: self.writer,
            services: self.services,
            changes: self.changes,
        }
    }
}

/// The events of one watch answer as one [`ClusterEvent::Changes`] per revision.
fn changes(
    shared: &Shared,
    events: &[etcd_client::Event],
) -> Vec<Result<ClusterEvent, StoreError>> {
    let mut out: Vec<Result<ClusterEvent, StoreError>> = Vec::new();
    let mut current: Option<Gathering> = None;
    for event in events {
        let Some(kv) = event.kv() else { continue };
        let revision = kv.mod_revision();
        if current.as_ref().is_some_and(|g| g.revision != revision) {
            out.push(Ok(current.take().expect("checked").event()));
        }
        let gathering = current.get_or_insert_with(|| Gathering {
            revision,
            ..Gathering::default()
        });
        let Some((space, key)) = std::str::from_utf8(kv.key())
            .ok()
            .and_then(|k| shared.layout.space_of(k).map(|s| (s, k)))
        else {
            continue;
        };
        let put = matches!(event.event_type(), EventType::Put);
        if let Some(service) = shared.service_of(space, key)
            && !gathering.services.contains(&service)
        {
            gathering.services.push(service);
        }
        if Space::DURABLE.contains(&space) {
            shared
                .seen
                .lock()
                .expect("seen lock")
                .observe(key, revision, put);
        }
        if space == Space::Revisions {
            if put {
                gathering.writer = Shared::writer_of(kv.value());
            }
            continue;
        }
        match shared.decode_change(space, kv, put) {
            Ok(Some(change)) => gathering.changes.push(change),
            Ok(None) => {}
            Err(e) => out.push(Err(e)),
        }
    }
    if let Some(g) = current {
        out.push(Ok(g.event()));
    }
    out
}
