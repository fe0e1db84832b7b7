//! Accepting connections: at most N per port, a clear refusal beyond that, and accept errors
//! that back off instead of spinning.
//!
//! An accept that fails for lack of resources (EMFILE, ENFILE, ENOBUFS, ENOMEM) leaves the
//! connection in the kernel's queue, so trying again at once fails again at once. The loop
//! waits [`BACKOFF_MIN`], doubling up to [`BACKOFF_MAX`], and tries again early when one of its
//! own connections closes (which frees a descriptor). It logs the first failure of such an
//! episode and its end, not every attempt.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::{AbortHandle, JoinSet};
use tokio::time::Instant;

use super::activity::Policy;
use super::connection::{self, Accepted, PortShared};
use super::{Phase, PortStop};
use crate::config::{Connections, DEFAULT_MAX_CONNECTIONS};

/// First wait after a failed accept.
pub const BACKOFF_MIN: Duration = Duration::from_millis(5);
/// Longest wait between two accepts that fail.
pub const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Refused connections being answered at once, per port (fewer under a low open-file limit:
/// a sixteenth of it); a new one beyond this closes the oldest (an idle flood cannot keep a
/// prompt client from its answer).
pub const REFUSALS: usize = 64;
/// A refused connection is closed this long after its accept at the latest.
pub const REFUSAL_TIME: Duration = Duration::from_secs(1);
/// Share of the file descriptor limit kept for everything but connections (the store, probes,
/// refusals, logs) when the maximum connection counts are derived from it: a quarter.
const FD_RESERVE_DIVISOR: u64 = 4;

/// Raises the soft limit on open files (`RLIMIT_NOFILE`) to the hard limit, as Go programs do
/// at start, since every connection holds a descriptor. Returns the soft limit in force
/// afterwards. Errors: the limit cannot be read (the soft limit stays as it was when only
/// raising fails).
pub fn raise_fd_limit() -> io::Result<u64> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(io::Error::from)?;
    if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        return Ok(hard);
    }
    Ok(soft)
}

fn fd_limit() -> Option<u64> {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .ok()
        .map(|(soft, _)| soft)
}

/// Refusals being answered at once per port are at most a sixteenth of the open-file limit
/// (and at most [`REFUSALS`]): both ports' refusals then take an eighth, half the reserve.
const REFUSAL_DIVISOR: u64 = 16;

/// The connection bounds of both ports, from the config and the open-file limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Caps {
    /// Most connections of the HTTP port.
    pub(crate) http: usize,
    /// Most connections of the gRPC port.
    pub(crate) grpc: usize,
    /// Most connections of both ports together: three quarters of the open-file limit, so
    /// that explicit maximums above it cannot run the process out of descriptors.
    pub(crate) budget: usize,
    /// Refused connections being answered at once, per port.
    pub(crate) refusals: usize,
    /// The open-file limit they were derived from, if known.
    pub(crate) fd_limit: Option<u64>,
}

/// The maximum connection counts of the HTTP and gRPC ports and their shared budget: as
/// configured, or derived from the file descriptor limit ([`Connections::fd_limit`], else the
/// process's soft limit) so that connections alone never exhaust it: three quarters of it,
/// split evenly, at most [`DEFAULT_MAX_CONNECTIONS`] each. Both ports together never hold more
/// than those three quarters (the budget), whatever their own maximums; beyond it a
/// connection gets the port's refusal. Warns when configured counts exceed the budget.
pub(crate) fn caps(config: &Connections) -> Caps {
    let limit = config.fd_limit.or_else(fd_limit);
    let share = limit.map(|l| l - l / FD_RESERVE_DIVISOR);
    let derived = share.map_or(DEFAULT_MAX_CONNECTIONS, |s| {
        usize::try_from(s / 2)
            .unwrap_or(usize::MAX)
            .clamp(1, DEFAULT_MAX_CONNECTIONS)
    });
    let http = config.http_max.unwrap_or(derived);
    let grpc = config.grpc_max.unwrap_or(derived);
    let budget = share.map_or(http + grpc, |s| {
        usize::try_from(s)
            .unwrap_or(usize::MAX)
            .clamp(1, http + grpc)
    });
    let refusals = limit.map_or(REFUSALS, |l| {
        usize::try_from(l / REFUSAL_DIVISOR)
            .unwrap_or(usize::MAX)
            .clamp(1, REFUSALS)
    });
    if let Some(limit) = limit.filter(|_| http + grpc > budget) {
        tracing::warn!(
            fd_limit = limit,
            http_max = http,
            grpc_max = grpc,
            budget,
            "the maximum connection counts exceed three quarters of the open-file limit: both \
             ports together hold at most {budget} connections, further ones are refused (raise \
             ulimit -n for more)"
        );
    }
    Caps {
        http,
        grpc,
        budget,
        refusals,
        fd_limit: limit,
    }
}

/// The connections both ports may hold together (one descriptor each). Cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct Budget {
    slots: Arc<Semaphore>,
}

impl Budget {
    /// A budget of `size` connections.
    pub(crate) fn new(size: usize) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(size)),
        }
    }
}

/// Only this connection failed; the next accept may well succeed.
fn connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// A connection's share of the port's maximum; frees it and wakes a backing-off accept loop
/// when dropped.
struct Slot {
    _permit: OwnedSemaphorePermit,
    _address: AddressSlot,
    _shared: OwnedSemaphorePermit,
    closed: Arc<Notify>,
    port: Arc<PortShared>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.port.metrics.open.get_or_create(&self.port.label).dec();
        self.closed.notify_one();
    }
}

/// Open connections per client IP address on one port.
#[derive(Default)]
pub(super) struct PerAddress {
    open: Mutex<HashMap<IpAddr, usize>>,
}

impl PerAddress {
    /// One more connection from `ip`, unless it holds `max` already.
    fn try_take(self: &Arc<Self>, ip: IpAddr, max: usize) -> Option<AddressSlot> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let n = open.entry(ip).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(AddressSlot {
            counts: self.clone(),
            ip,
        })
    }
}

/// One connection of an address, counted until dropped.
struct AddressSlot {
    counts: Arc<PerAddress>,
    ip: IpAddr,
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut open = self.counts.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// Retries of failing accepts. An episode of failures ends once accepts have not failed for
/// [`BACKOFF_MAX`]: a freed descriptor lets one accept through and the next one fail again,
/// which is the same episode, not a new one to log.
pub(super) struct Backoff {
    next: Duration,
    /// The current episode: when it began, its failures, its last failure.
    failing: Option<(Instant, u64, Instant)>,
}

impl Backoff {
    pub(super) fn new() -> Self {
        Self {
            next: BACKOFF_MIN,
            failing: None,
        }
    }

    /// A failed accept: how long to wait before the next one (unless a connection closes).
    pub(super) fn failed(&mut self, port: &str, error: &io::Error) -> Duration {
        let now = Instant::now();
        match &mut self.failing {
            Some((_, count, last)) => {
                *count += 1;
                *last = now;
            }
            None => {
                tracing::warn!(port, %error, "accept failing; retrying with backoff (at most {} ms apart) and whenever a connection closes", BACKOFF_MAX.as_millis());
                self.failing = Some((now, 1, now));
            }
        }
        let wait = self.next;
        self.next = (self.next * 2).min(BACKOFF_MAX);
        wait
    }

    /// An accept succeeded: ends the episode if none failed for [`BACKOFF_MAX`].
    pub(super) fn succeeded(&mut self, port: &str) {
        let Some((since, count, last)) = self.failing else {
            return;
        };
        if last.elapsed() >= BACKOFF_MAX {
            tracing::info!(
                port,
                failures = count,
                ms = last.duration_since(since).as_millis() as u64,
                "accepting again"
            );
            self.failing = None;
            self.next = BACKOFF_MIN;
        }
    }
}

/// The accept loop of one port and its connections.
pub(super) struct AcceptLoop {
    pub(super) listener: TcpListener,
    pub(super) port: Arc<PortShared>,
    pub(super) router: axum::Router,
    /// The answer of a connection beyond the port's maximum.
    pub(super) refusal: axum::Router,
    /// The answer of a connection beyond the budget of both ports.
    pub(super) over_budget: axum::Router,
    pub(super) policy: Policy,
    pub(super) max: usize,
    /// Most connections from one client IP address, and the answer beyond it.
    pub(super) per_address: (usize, axum::Router),
    pub(super) budget: Budget,
    /// Refused connections being answered at once.
    pub(super) refusals: usize,
    pub(super) phase: watch::Receiver<Phase>,
}

impl AcceptLoop {
    /// Accepts until the port drains, then waits for its connections until the drain's
    /// deadline and drops the rest.
    pub(super) async fn run(self) -> PortStop {
        let AcceptLoop {
            listener,
            port,
            router,
            refusal,
            over_budget,
            policy,
            max,
            per_address: (per_address_max, per_address_refusal),
            budget,
            refusals,
            mut phase,
        } = self;
        let per_address = Arc::new(PerAddress::default());
        let label = port.label.port;
        let mut listener = Some(listener);
        let slots = Arc::new(Semaphore::new(max));
        let mut refusing: VecDeque<AbortHandle> = VecDeque::with_capacity(refusals);
        let closed = Arc::new(Notify::new());
        let mut backoff = Backoff::new();
        let mut retry_at: Option<Instant> = None;
        let mut tasks = JoinSet::new();
        let deadline = loop {
            let accepting = listener.is_some() && retry_at.is_none();
            tokio::select! {
                changed = phase.changed() => {
                    let now = *phase.borrow_and_update();
                    match (changed, now) {
                        (Err(_), _) => break Instant::now(),
                        (_, Phase::Draining(deadline)) => break deadline,
                        (_, Phase::Closed) => listener = None,
                        (_, Phase::Serving) => {}
                    }
                }
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
                () = async { tokio::time::sleep_until(retry_at.unwrap_or_else(Instant::now)).await }, if retry_at.is_some() => retry_at = None,
                () = closed.notified(), if retry_at.is_some() => retry_at = None,
                accepted = async { listener.as_ref().expect("accepting").accept().await }, if accepting => match accepted {
                    Ok((stream, peer)) => {
                        backoff.succeeded(label);
                        let _ = stream.set_nodelay(true);
                        let local = stream.local_addr().unwrap_or(peer);
                        let conn = Accepted { stream, local, peer };
                        let own = slots.clone().try_acquire_owned().ok();
                        let address = own.as_ref().and_then(|_| per_address.try_take(peer.ip(), per_address_max));
                        let shared = address.as_ref().and_then(|_| budget.slots.clone().try_acquire_owned().ok());
                        // Which limit refuses: the port's, this address's, or both ports' budget.
                        let refused = match (&own, &address, &shared) {
                            (None, _, _) => Some((&refusal, "the port holds its maximum")),
                            (_, None, _) => Some((&per_address_refusal, "the client address holds its maximum")),
                            (_, _, None) => Some((&over_budget, "both ports hold their budget")),
                            _ => None,
                        };
                        if let (Some(permit), Some(address), Some(shared)) = (own, address, shared) {
                            port.metrics.open.get_or_create(&port.label).inc();
                            let slot = Slot { _permit: permit, _address: address, _shared: shared, closed: closed.clone(), port: port.clone() };
                            let task = connection::run(conn, port.clone(), router.clone(), policy, phase.clone());
                            tasks.spawn(async move {
                                task.await;
                                drop(slot);
                            });
                        } else if let Some((answer, why)) = refused {
                            port.metrics.refused.get_or_create(&port.label).inc();
                            tracing::debug!(port = label, %peer, max, per_address_max, "connection refused: {why}");
                            refusing.retain(|r| !r.is_finished());
                            if refusing.len() >= refusals {
                                refusing.pop_front().inspect(AbortHandle::abort);
                            }
                            let policy = Policy::Refusal { limit: REFUSAL_TIME };
                            let task = connection::run(conn, port.clone(), answer.clone(), policy, phase.clone());
                            refusing.push_back(tasks.spawn(task));
                        }
                    }
                    Err(e) if connection_error(&e) => {}
                    Err(e) => {
                        port.metrics.accept_errors.get_or_create(&port.label).inc();
                        retry_at = Some(Instant::now() + backoff.failed(label, &e));
                    }
                },
            }
        };
        drop(listener);
        let open = tasks.len();
        let _ = tokio::time::timeout_at(deadline, async {
            while tasks.join_next().await.is_some() {}
        })
        .await;
        let dropped = tasks.len();
        tasks.shutdown().await;
        PortStop {
            closed: open - dropped,
            dropped,
        }
    }
}
