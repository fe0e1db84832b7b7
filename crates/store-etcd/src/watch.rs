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
use gangway_store::{Contents, StoreError, Write};
use tokio::sync::mpsc;

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
    /// store's runtime until the [`PrefixWatch`] or the store is dropped.
    pub fn watch(&self, from: i64) -> PrefixWatch {
        let (tx, events) = mpsc::channel(WATCH_BUFFER);
        let counts = Arc::new(Counts::default());
        let task = self
            .handle()
            .spawn(run(self.shared(), from.max(1), tx, counts.clone()));
        PrefixWatch {
            events,
            task,
            counts,
        }
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

/// Watches from `next` (the first revision not yet delivered) until the receiver is gone.
async fn run(
    shared: Arc<Shared>,
    mut next: i64,
    tx: mpsc::Sender<Result<WatchEvent, StoreError>>,
    counts: Arc<Counts>,
) {
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
            let answer = match stream.message().await {
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
                let item = shared.load_at().await.map(|(contents, revision)| {
                    next = revision + 1;
                    WatchEvent::Relisted { revision, contents }
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
                if let Ok(WatchEvent::Changes { revision, .. }) = &item {
                    next = revision + 1;
                }
                if tx.send(item).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// The events of one watch answer as one [`WatchEvent::Changes`] per revision.
fn changes(shared: &Shared, events: &[etcd_client::Event]) -> Vec<Result<WatchEvent, StoreError>> {
    let mut out: Vec<Result<WatchEvent, StoreError>> = Vec::new();
    let mut current: Option<(i64, Vec<Write>)> = None;
    for event in events {
        let Some(kv) = event.kv() else { continue };
        let revision = kv.mod_revision();
        if current.as_ref().is_some_and(|(r, _)| *r != revision) {
            let (revision, changes) = current.take().expect("checked");
            out.push(Ok(WatchEvent::Changes { revision, changes }));
        }
        let (_, changes) = current.get_or_insert_with(|| (revision, Vec::new()));
        let Some(space) = std::str::from_utf8(kv.key())
            .ok()
            .and_then(|k| shared.layout.space_of(k))
        else {
            continue;
        };
        let value = match event.event_type() {
            EventType::Put => Some(kv.value()),
            EventType::Delete => None,
        };
        match shared.decode(space, kv.key(), value) {
            Ok(write) => changes.push(write),
            Err(e) => out.push(Err(e)),
        }
    }
    if let Some((revision, changes)) = current {
        out.push(Ok(WatchEvent::Changes { revision, changes }));
    }
    out
}
