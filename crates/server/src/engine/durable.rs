//! Group commit (DESIGN §7): durable writes from any number of callers are applied in one
//! store transaction with one fsync per batch, and every caller is answered only after the
//! fsync of the batch that holds its writes. Then, still in queue order, each caller's
//! in-memory change runs under the state lock, so memory always follows the store's order.
//!
//! One committer task owns the store's write side: it takes every job waiting, applies their
//! writes in one blocking store call (`spawn_blocking`), and meanwhile the next batch gathers.
//! The queue is bounded ([`QUEUE`] jobs: a writer waits for room), and so is a batch
//! ([`MAX_BATCH`] jobs, and at most [`Store::max_batch`] writes when the store has such a
//! bound: etcd's transactions do; a job is never split, and one job above the bound goes
//! alone).

use std::sync::{Arc, Weak};

use gangway_store::{Store, Write};
use tokio::sync::{mpsc, oneshot, watch};

use super::RegistryError;
use super::state::State;
use super::{Inner, Registry};

/// Jobs waiting for the committer, at most; a writer beyond it waits.
pub const QUEUE: usize = 4096;
/// Jobs committed together, at most (one transaction, one fsync).
pub const MAX_BATCH: usize = 1024;

/// One caller's writes and what to do once they are durable.
struct Job {
    writes: Vec<Write>,
    /// Runs under the state lock after the batch's fsync, or with the error when the batch
    /// failed (nothing of it was applied).
    finish: Box<dyn for<'a> FnOnce(Result<&'a mut State, RegistryError>) + Send>,
}

/// The handle writers enqueue jobs on.
pub(crate) struct Committer {
    jobs: mpsc::Sender<Job>,
    /// Set by [`Committer::close`]: the committer finishes its batch and drops the store.
    closing: watch::Sender<bool>,
    /// Set by the committer once it dropped the store (its file lock is free then).
    released: watch::Receiver<bool>,
    /// The store's [`Store::max_batch`]: most writes per batch, `None` for no bound.
    pub(crate) max_writes: Option<usize>,
}

/// The committer's end of the queue, until [`Queue::start`] gives it its task.
pub(crate) struct Queue {
    rx: mpsc::Receiver<Job>,
    closing: watch::Receiver<bool>,
    released: watch::Sender<bool>,
    max_writes: Option<usize>,
}

impl Committer {
    /// A committer and its queue; a batch holds at most `max_writes` writes (the store's
    /// [`Store::max_batch`]) unless a single job has more.
    pub(crate) fn new(max_writes: Option<usize>) -> (Self, Queue) {
        let (jobs, rx) = mpsc::channel(QUEUE);
        let (closing_tx, closing) = watch::channel(false);
        let (released, released_rx) = watch::channel(false);
        (
            Self {
                jobs,
                closing: closing_tx,
                released: released_rx,
                max_writes,
            },
            Queue {
                rx,
                closing,
                released,
                max_writes,
            },
        )
    }

    /// Stops the committer: the batch in flight finishes (its writers are answered), writes
    /// queued or arriving later fail, and the store is dropped. Resolves once it is, or at
    /// `deadline`; `true` when the store was released by then. Idempotent.
    pub(crate) async fn close(&self, deadline: tokio::time::Instant) -> bool {
        self.closing.send_replace(true);
        let mut released = self.released.clone();
        tokio::time::timeout_at(deadline, released.wait_for(|r| *r))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// True once [`close`](Self::close) was asked for.
    pub(crate) fn is_closing(&self) -> bool {
        *self.closing.borrow()
    }
}

impl Queue {
    /// Starts the committer task over `store`; it applies in-memory changes to the state of
    /// `inner` (held weakly: the task ends once the registry is gone and the queue is drained,
    /// or on [`Committer::close`]). Must run inside a tokio runtime.
    pub(crate) fn start(self, store: Arc<dyn Store>, inner: Weak<Inner>) {
        tokio::spawn(run(store, inner, self));
    }
}

fn stopping() -> RegistryError {
    RegistryError::Internal("the registry is stopping: its store is closed".into())
}

async fn run(store: Arc<dyn Store>, inner: Weak<Inner>, queue: Queue) {
    let Queue {
        mut rx,
        mut closing,
        released,
        max_writes,
    } = queue;
    let max_writes = max_writes.unwrap_or(usize::MAX);
    // A job taken from the queue that would have made the last batch too large: it opens the
    // next one.
    let mut carried: Option<Job> = None;
    loop {
        let first = match carried.take() {
            Some(job) => job,
            None => tokio::select! {
                job = rx.recv() => match job {
                    Some(job) => job,
                    None => break,
                },
                _ = closing.wait_for(|c| *c) => break,
            },
        };
        let mut writes_in_batch = first.writes.len();
        let mut jobs = vec![first];
        while jobs.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(job) if writes_in_batch.saturating_add(job.writes.len()) > max_writes => {
                    carried = Some(job);
                    break;
                }
                Ok(job) => {
                    writes_in_batch += job.writes.len();
                    jobs.push(job);
                }
                Err(_) => break,
            }
        }
        let writes: Vec<Write> = jobs.iter().flat_map(|j| j.writes.iter().cloned()).collect();
        match apply(&store, writes).await {
            // Cluster mode: another node wrote a key of the batch. Each job alone again, so
            // that only the jobs whose keys moved on fail (they decide again on the newer view).
            Err(RegistryError::ChangedElsewhere(_)) if jobs.len() > 1 => {
                for job in jobs {
                    let result = apply(&store, job.writes.clone()).await;
                    finish(&inner, vec![job], result);
                }
            }
            result => finish(&inner, jobs, result),
        }
    }
    // Closed: refuse what still waits, then let go of the store (and its file lock).
    rx.close();
    while let Ok(job) = rx.try_recv() {
        (job.finish)(Err(stopping()));
    }
    drop(store);
    released.send_replace(true);
}

/// Applies one batch on a blocking thread; the store revision it was committed at, if any.
async fn apply(store: &Arc<dyn Store>, writes: Vec<Write>) -> Result<Option<i64>, RegistryError> {
    if writes.is_empty() {
        return Ok(None);
    }
    let store = store.clone();
    match tokio::task::spawn_blocking(move || store.apply_at(&writes)).await {
        Ok(result) => result.map_err(RegistryError::from),
        Err(e) => Err(RegistryError::Internal(format!("store task failed: {e}"))),
    }
}

/// Runs the jobs' in-memory changes after their batch, under one lock, in queue order (or
/// hands them the batch's error).
fn finish(inner: &Weak<Inner>, jobs: Vec<Job>, result: Result<Option<i64>, RegistryError>) {
    match (result, inner.upgrade()) {
        (Ok(revision), Some(inner)) => {
            let registry = Registry { inner };
            let mut state = registry.lock();
            // Cluster mode: the changes are published at the store's revision.
            if let (Some(revision), Some(c)) = (revision, state.cluster.as_mut()) {
                c.seen = c.seen.max(revision);
                c.applying = true;
            }
            for job in jobs {
                (job.finish)(Ok(&mut state));
            }
            if let Some(c) = state.cluster.as_mut() {
                c.applying = false;
            }
            drop(state);
            registry.inner.metrics.store_batches.inc();
        }
        (Ok(_), None) => {} // the registry is gone: nobody waits for memory
        (Err(e), _) => {
            for job in jobs {
                (job.finish)(Err(e.clone()));
            }
        }
    }
}

impl Registry {
    /// Makes `writes` durable with the next group commit, then runs `apply` under the state
    /// lock (in queue order) and returns what it returned. Cancel-safe: once enqueued, the job
    /// runs whether or not the caller still waits.
    ///
    /// Errors: the store failed (nothing of the batch was applied), or the committer is gone.
    pub(crate) async fn commit<T: Send + 'static>(
        &self,
        writes: Vec<Write>,
        apply: impl FnOnce(&mut State) -> Result<T, RegistryError> + Send + 'static,
    ) -> Result<T, RegistryError> {
        let (done, answer) = oneshot::channel::<Result<T, RegistryError>>();
        let job = Job {
            writes,
            finish: Box::new(move |state| {
                let _ = done.send(state.and_then(apply));
            }),
        };
        if self.inner.committer.is_closing() {
            return Err(stopping());
        }
        self.inner
            .committer
            .jobs
            .send(job)
            .await
            .map_err(|_| stopping())?;
        answer
            .await
            .map_err(|_| RegistryError::Internal("the store committer dropped a write".into()))?
    }
}
